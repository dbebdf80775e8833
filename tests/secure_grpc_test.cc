// Mutual TLS and the job token over real gRPC (in-process servers, certificates from
// tools/make_certs.sh): a call with a wrong or missing token is UNAUTHENTICATED and changes
// nothing, whichever service it reaches (Init, the unary PushPull, the tensor stream,
// health); a client that cannot present a certificate from the job's CA, or speaks
// plaintext, gets no answer at all; the rendezvous and the ring of all-reduce mode work with
// the token and refuse a rank without it.
#include <thread>

#include "absl/strings/match.h"
#include "common/health_client.h"
#include "common/health_server.h"
#include "common/net.h"
#include "common/ring_allreduce.h"
#include "common/small_file.h"
#include "common/tensor_frame.h"
#include "common/test_certs.h"
#include "grpcpp/client_context.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "proto/ps.grpc.pb.h"
#include "proto/worker.grpc.pb.h"
#include "server/ps_server.h"
#include "tests/test_cluster.h"
#include "worker/comm/allreduce_group.h"

namespace dptrain {
namespace {

using grpc::StatusCode;

std::shared_ptr<const Credentials> Load(const SecurityOptions& o) {
  auto c = Credentials::Load(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : Credentials::Plaintext();
}

std::string WrongTokenFile() {
  return TestFile("wrong_token", "0123456789abcdef0123456789abcdef\n");
}

// Shard 0 of the tiny model (test_cluster.h: chunks (0,0) and (1,0)) with mutual TLS and
// the job token, for one worker, so that one push completes a step.
class SecureGrpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PsServerOptions o;
    o.listen_address = "127.0.0.1:0";
    o.shard.shard = 0;
    o.shard.num_shards = 2;
    o.shard.num_workers = 1;
    o.shard.optimizer.learning_rate = 1.0f;
    o.shard.step_timeout = absl::Seconds(5);
    o.credentials = Load(TestSecurity("ps-0"));
    auto server = PsServer::Start(o);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    address_ = absl::StrCat("127.0.0.1:", server_->port());
    const std::string wrong = WrongTokenFile(), none;
    right_ = Load(TestSecurity("worker-0"));
    wrong_token_ = Load(TestSecurity("worker-0", &wrong));
    no_token_ = Load(TestSecurity("worker-0", &none));
  }

  std::unique_ptr<proto::ParameterServer::Stub> Stub(const Credentials& c) {
    return proto::ParameterServer::NewStub(MakeChannel(address_, c));
  }

  static void AddChunk(google::protobuf::RepeatedPtrField<proto::Chunk>* chunks, int t,
                       std::vector<float> values) {
    proto::Chunk* chunk = chunks->Add();
    chunk->mutable_key()->set_tensor_id(t);
    chunk->mutable_key()->set_chunk_index(0);
    chunk->set_dtype(proto::FP32);
    chunk->set_data(reinterpret_cast<const char*>(values.data()), values.size() * 4);
  }

  grpc::Status Init(const Credentials& c, std::vector<float> w, std::vector<float> b) {
    proto::InitRequest r;
    DescribeTinyModel(r, 0);
    AddChunk(r.mutable_chunks(), 0, std::move(w));
    AddChunk(r.mutable_chunks(), 1, std::move(b));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    proto::InitResponse response;
    return Stub(c)->Init(&context, r, &response);
  }

  grpc::Status UnaryPush(const Credentials& c, int64_t step) {
    proto::PushPullRequest r;
    r.mutable_caller()->set_job_id("job");
    r.mutable_caller()->set_rank(0);
    r.set_step(step);
    AddChunk(r.mutable_chunks(), 0, {1, 1, 1});
    AddChunk(r.mutable_chunks(), 1, {1, 1});
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    proto::PullResponse response;
    return Stub(c)->PushPull(&context, r, &response);
  }

  // The same step as frames on the tensor stream: writes both, half-closes, reads until
  // the end; the call's status.
  grpc::Status StreamPush(const Credentials& c, int64_t step) {
    grpc::GenericStub stub(MakeChannel(address_, c));
    grpc::CompletionQueue cq;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto call = stub.PrepareCall(&context, kTensorStreamMethod, &cq);
    void* tag;
    bool ok;
    call->StartCall(reinterpret_cast<void*>(1));
    cq.Next(&tag, &ok);
    for (int t = 0; t < 2 && ok; ++t) {
      proto::FrameHeader h;
      h.mutable_caller()->set_job_id("job");
      h.mutable_caller()->set_rank(0);
      h.set_step(step);
      h.mutable_key()->set_tensor_id(t);
      h.mutable_key()->set_chunk_index(0);
      h.set_dtype(proto::FP32);
      const std::vector<float> ones(t == 0 ? 3 : 2, 1.0f);
      grpc::Slice payload = NewPayload(ones.size() * 4);
      std::memcpy(MutableData(payload), ones.data(), payload.size());
      call->Write(FrameOwning(h, std::move(payload)), reinterpret_cast<void*>(2));
      cq.Next(&tag, &ok);
    }
    call->WritesDone(reinterpret_cast<void*>(3));
    cq.Next(&tag, &ok);
    for (ok = true; ok;) {
      grpc::ByteBuffer in;
      call->Read(&in, reinterpret_cast<void*>(4));
      cq.Next(&tag, &ok);
    }
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(5));
    cq.Next(&tag, &ok);
    return status;
  }

  // The weights, as rank 0 pulls them with the token.
  std::vector<float> Weights() {
    proto::PullRequest r;
    DescribeTinyModel(r, 0);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    proto::PullResponse response;
    const grpc::Status s = Stub(*right_)->Pull(&context, r, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    std::vector<float> out;
    for (const auto& c : response.chunks()) {
      const float* f = reinterpret_cast<const float*>(c.data().data());
      out.insert(out.end(), f, f + c.data().size() / 4);
    }
    return out;
  }

  proto::ShardInfoResponse Info() {
    grpc::ClientContext context;
    proto::ShardInfoResponse info;
    EXPECT_TRUE(Stub(*right_)->GetShardInfo(&context, {}, &info).ok());
    return info;
  }

  static void ExpectUnauthenticated(const grpc::Status& s, const char* what) {
    EXPECT_EQ(s.error_code(), StatusCode::UNAUTHENTICATED) << what << ": " << s.error_message();
    EXPECT_TRUE(absl::StrContains(s.error_message(), "missing or wrong job token")) << what;
  }

  std::unique_ptr<PsServer> server_;
  std::string address_;
  std::shared_ptr<const Credentials> right_, wrong_token_, no_token_;
};

TEST_F(SecureGrpcTest, InitWithAWrongOrMissingTokenInitialisesNothing) {
  ExpectUnauthenticated(Init(*wrong_token_, {9, 9, 9}, {9, 9}), "wrong token");
  ExpectUnauthenticated(Init(*no_token_, {9, 9, 9}, {9, 9}), "no token");
  EXPECT_FALSE(Info().initialized());
  // Had either initialised the shard, a different init would be ALREADY_EXISTS.
  ASSERT_TRUE(Init(*right_, {1, 2, 3}, {10, 20}).ok());
  EXPECT_EQ(Weights(), (std::vector<float>{1, 2, 3, 10, 20}));
}

TEST_F(SecureGrpcTest, APushWithAWrongOrMissingTokenLeavesTheWeightsUnchanged) {
  ASSERT_TRUE(Init(*right_, {1, 2, 3}, {10, 20}).ok());
  ExpectUnauthenticated(UnaryPush(*wrong_token_, 0), "unary, wrong token");
  ExpectUnauthenticated(UnaryPush(*no_token_, 0), "unary, no token");
  ExpectUnauthenticated(StreamPush(*wrong_token_, 0), "stream, wrong token");
  ExpectUnauthenticated(StreamPush(*no_token_, 0), "stream, no token");
  const proto::ShardInfoResponse info = Info();
  EXPECT_EQ(info.version(), 0);
  EXPECT_EQ(Weights(), (std::vector<float>{1, 2, 3, 10, 20}));

  // With the token both paths apply (lr 1: w - 1).
  ASSERT_TRUE(UnaryPush(*right_, 0).ok());
  EXPECT_EQ(Weights(), (std::vector<float>{0, 1, 2, 9, 19}));
  const grpc::Status streamed = StreamPush(*right_, 1);
  ASSERT_TRUE(streamed.ok()) << streamed.error_message();
  EXPECT_EQ(Weights(), (std::vector<float>{-1, 0, 1, 8, 18}));
}

TEST_F(SecureGrpcTest, HealthNeedsTheTokenToo) {
  auto serving = CheckHealth(address_, absl::Seconds(5), *right_);
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_EQ(*serving, ServingStatus::kServing);
  auto refused = CheckHealth(address_, absl::Seconds(5), *wrong_token_);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated) << refused.status();
}

// Whoever cannot prove a certificate from the job's CA gets no answer: the TLS handshake
// fails, so no call (and no token check) ever starts.
TEST_F(SecureGrpcTest, TlsTurnsAwayPlaintextAndForeignCertificates) {
  std::vector<std::pair<std::string, std::shared_ptr<grpc::ChannelCredentials>>> strangers;
  strangers.emplace_back("plaintext", grpc::InsecureChannelCredentials());
  strangers.emplace_back("a certificate of another CA",
                         Load(TestSecurity("other/worker-0"))->ChannelCredentials());
  grpc::SslCredentialsOptions no_cert;  // Trusts the CA, presents no certificate.
  no_cert.pem_root_certs = *ReadSmallFile(TestCertPath("ca.crt"), 1 << 20);
  strangers.emplace_back("no client certificate", grpc::SslCredentials(no_cert));
  for (const auto& [what, credentials] : strangers) {
    auto channel = grpc::CreateChannel(address_, credentials);
    auto stub = proto::ParameterServer::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    proto::ShardInfoResponse info;
    const grpc::Status s = stub->GetShardInfo(&context, {}, &info);
    EXPECT_TRUE(s.error_code() == StatusCode::UNAVAILABLE ||
                s.error_code() == StatusCode::DEADLINE_EXCEEDED)
        << what << ": " << s.error_code() << " " << s.error_message();
  }
  // The worker's side: a server is trusted under the names its certificate gives
  // (127.0.0.1, localhost, ...), not under another address of the same machine, and not
  // at all when another CA signed its certificate.
  const auto connects = [&](const std::string& host, const PsServer& server) {
    return MakeChannel(absl::StrCat(host, ":", server.port()), *right_)
        ->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(2));
  };
  const auto start = [](const std::string& address, const std::string& process) {
    PsServerOptions o;
    o.listen_address = address;
    o.shard.num_shards = 1;
    o.credentials = Load(TestSecurity(process));
    auto server = PsServer::Start(o);
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  };
  std::unique_ptr<PsServer> named = start("0.0.0.0:0", "ps-1");
  ASSERT_NE(named, nullptr);
  EXPECT_TRUE(connects("127.0.0.1", *named));
  EXPECT_TRUE(connects("localhost", *named));
  EXPECT_FALSE(connects("127.0.0.2", *named));
  std::unique_ptr<PsServer> impostor = start("127.0.0.1:0", "other/ps-0");
  ASSERT_NE(impostor, nullptr);
  EXPECT_FALSE(connects("127.0.0.1", *impostor));
}

// A worker's health server (gpu_worker --health_port) takes the same credentials.
TEST(SecureHealthServerTest, AnswersOnlyTheJobsProcesses) {
  proto::Worker::Service service;  // Any service: gRPC needs one besides health.
  auto server = StartHealthServer(0, &service, "127.0.0.1", *Load(TestSecurity("worker-1")));
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = absl::StrCat("127.0.0.1:", server->port);
  auto serving = CheckHealth(address, absl::Seconds(5), *Load(TestSecurity("ps-0")));
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_EQ(*serving, ServingStatus::kServing);
  const std::string wrong = WrongTokenFile();
  EXPECT_EQ(
      CheckHealth(address, absl::Seconds(5), *Load(TestSecurity("ps-0", &wrong))).status().code(),
      absl::StatusCode::kUnauthenticated);
  EXPECT_FALSE(CheckHealth(address, absl::Seconds(2)).ok());  // Plaintext.
}

// All-reduce mode: rank 0's rendezvous (gRPC) and the ring (TCP, keyed handshake) with the
// token; a rank with another token is UNAUTHENTICATED at the rendezvous.
TEST(SecureAllReduceTest, RendezvousAndRingWorkWithTheTokenAndRefuseAWrongOne) {
  AllReduceGroupOptions base;
  base.world_size = 2;
  base.advertise_host = "127.0.0.1";
  base.bind_address = "127.0.0.1";
  base.connect_timeout = absl::Seconds(20);
  base.timeout = absl::Seconds(20);
  AllReduceGroupOptions o0 = base;
  o0.credentials = Load(TestSecurity("worker-0"));
  auto group0 = AllReduceGroup::Listen(o0);
  ASSERT_TRUE(group0.ok()) << group0.status();
  AllReduceGroupOptions o1 = base;
  o1.rank = 1;
  o1.master_port = (*group0)->master_port();
  o1.credentials = Load(TestSecurity("worker-1"));

  // A plaintext rank 1 cannot reach rank 0's TLS rendezvous.
  AllReduceGroupOptions plaintext = o1;
  plaintext.credentials = Credentials::Plaintext();
  plaintext.connect_timeout = absl::Seconds(2);
  auto unreachable = AllReduceGroup::Listen(plaintext);
  ASSERT_TRUE(unreachable.ok()) << unreachable.status();
  const absl::Status plain_join = (*unreachable)->Join();
  EXPECT_EQ(plain_join.code(), absl::StatusCode::kUnavailable) << plain_join;

  // A rank 1 with the wrong token: refused, and it takes no place in the rendezvous.
  const std::string wrong = WrongTokenFile();
  AllReduceGroupOptions stranger = o1;
  stranger.credentials = Load(TestSecurity("worker-1", &wrong));
  auto refused = AllReduceGroup::Listen(stranger);
  ASSERT_TRUE(refused.ok()) << refused.status();
  const absl::Status join = (*refused)->Join();
  EXPECT_EQ(join.code(), absl::StatusCode::kUnauthenticated) << join;

  auto group1 = AllReduceGroup::Listen(o1);
  ASSERT_TRUE(group1.ok()) << group1.status();
  std::vector<float> data0(1000, 1.0f), data1(1000, 3.0f);
  absl::Status s0, s1;
  std::thread t0([&] {
    s0 = (*group0)->Join();
    if (s0.ok()) s0 = RingAllReduce((*group0)->link(), absl::MakeSpan(data0), RingOptions());
  });
  std::thread t1([&] {
    s1 = (*group1)->Join();
    if (s1.ok()) s1 = RingAllReduce((*group1)->link(), absl::MakeSpan(data1), RingOptions());
  });
  t0.join();
  t1.join();
  ASSERT_TRUE(s0.ok()) << s0;
  ASSERT_TRUE(s1.ok()) << s1;
  EXPECT_EQ(data0, std::vector<float>(1000, 2.0f));
  EXPECT_EQ(data1, data0);
}

}  // namespace
}  // namespace dptrain
