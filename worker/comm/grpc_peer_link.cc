#include "worker/comm/grpc_peer_link.h"

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/net.h"
#include "grpcpp/client_context.h"

namespace dptrain {

struct GrpcPeerLink::Call {
  int peer = 0;
  grpc::ClientContext context;
  proto::PeerMessage request;
  proto::DeliverResponse response;
  grpc::Status status;
  std::unique_ptr<grpc::ClientAsyncResponseReader<proto::DeliverResponse>> reader;
};

GrpcPeerLink::GrpcPeerLink(const GrpcPeerLinkOptions& options, Mailbox* inbox)
    : options_(options), inbox_(inbox) {}

absl::StatusOr<std::unique_ptr<GrpcPeerLink>> GrpcPeerLink::Create(
    const GrpcPeerLinkOptions& options, Mailbox* inbox) {
  const int n = static_cast<int>(options.addresses.size());
  if (n < 1 || options.rank < 0 || options.rank >= n) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options.rank, " not in [0, ", n, ")"));
  }
  if (options.max_in_flight < 1) return absl::InvalidArgumentError("max_in_flight must be >= 1");
  std::unique_ptr<GrpcPeerLink> link(new GrpcPeerLink(options, inbox));
  for (const std::string& address : options.addresses) {
    link->stubs_.push_back(proto::Peer::NewStub(MakeChannel(address)));
  }
  link->poller_ = std::thread([l = link.get()] { l->Poll(); });
  return link;
}

GrpcPeerLink::~GrpcPeerLink() {
  {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_flight_ == 0; };
    mu_.AwaitWithTimeout(absl::Condition(&idle), absl::Seconds(5));
  }
  cq_.Shutdown();
  poller_.join();
}

void GrpcPeerLink::Poll() {
  void* tag;
  bool ok;
  while (cq_.Next(&tag, &ok)) {
    std::unique_ptr<Call> call(static_cast<Call*>(tag));
    absl::MutexLock lock(&mu_);
    if (!call->status.ok() && error_.ok()) {
      error_ = FromGrpcStatus(call->status, absl::StrCat("send to rank ", call->peer, " at ",
                                                         options_.addresses[call->peer]));
    }
    --in_flight_;
  }
}

absl::Status GrpcPeerLink::FirstError() {
  absl::MutexLock lock(&mu_);
  return error_;
}

absl::Status GrpcPeerLink::Send(int peer, uint64_t tag, absl::Span<const float> data) {
  if (peer < 0 || peer >= world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("no rank ", peer));
  }
  {
    absl::MutexLock lock(&mu_);
    auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return in_flight_ < options_.max_in_flight || !error_.ok();
    };
    mu_.Await(absl::Condition(&room));
    if (!error_.ok()) return error_;
    ++in_flight_;
  }
  auto call = std::make_unique<Call>();
  call->peer = peer;
  call->context.set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
  call->request.set_job_id(options_.job_id);
  call->request.set_from_rank(options_.rank);
  call->request.set_tag(tag);
  call->request.set_data(reinterpret_cast<const char*>(data.data()), data.size() * sizeof(float));
  sent_ += static_cast<int64_t>(call->request.ByteSizeLong());
  call->reader = stubs_[peer]->AsyncDeliver(&call->context, call->request, &cq_);
  Call* raw = call.release();
  raw->reader->Finish(&raw->response, &raw->status, raw);
  return absl::OkStatus();
}

absl::Status GrpcPeerLink::Recv(int peer, uint64_t tag, absl::Span<float> out) {
  if (auto s = FirstError(); !s.ok()) return s;
  absl::Status s = inbox_->Take(peer, tag, out, absl::Now() + options_.timeout);
  if (s.ok()) received_ += static_cast<int64_t>(out.size() * sizeof(float));
  if (absl::IsDeadlineExceeded(s)) {
    return absl::DeadlineExceededError(absl::StrCat("rank ", options_.rank, ": ", s.message(),
                                                    " within ",
                                                    absl::FormatDuration(options_.timeout)));
  }
  return s;
}

}  // namespace dptrain
