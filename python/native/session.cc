#include "python/native/session.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/loss_scaler.h"
#include "common/ring_allreduce.h"
#include "common/wire_link.h"
#include "server/ps_server.h"
#include "worker/comm/allreduce_group.h"
#include "worker/comm/allreduce_sync.h"
#include "worker/comm/ps_client.h"
#include "worker/comm/sparse_client.h"

namespace dptrain {
namespace {

// Elements per ring message, and so the largest frame a peer may send.
constexpr int64_t kChunkElements = AllReduceSyncOptions().chunk_elements;

absl::Status Invalid(absl::string_view what) { return absl::InvalidArgumentError(what); }

// The averaging shards' answer to a DistributedOptimizer step: the mean copied over the
// gradient; whether the step is skipped.
absl::StatusOr<bool> AveragedInPlace(const StepOutcome& outcome, const std::vector<float>& mean,
                                     absl::Span<float> gradient_and_flag) {
  if (outcome.rewind_to >= 0) {
    return absl::AbortedError(absl::StrCat(
        "the parameter-server shards went back to step ", outcome.rewind_to,
        ": averaging shards (--optimizer=none) keep nothing worth going back to; restart the "
        "job"));
  }
  std::copy(mean.begin(), mean.end(), gradient_and_flag.begin());
  return outcome.skipped;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Session>> Session::Create(const SessionOptions& o) {
  if (o.mode != "allreduce" && o.mode != "ps" && o.mode != "master") {
    return Invalid(
        absl::StrCat("mode must be allreduce, ps or master (DPTRAIN_MODE), got '", o.mode, "'"));
  }
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return Invalid(absl::StrCat("rank ", o.rank, " is not in [0, world size ", o.world_size,
                                ") (RANK, WORLD_SIZE)"));
  }
  if (o.mode == "ps" && o.ps.empty()) {
    return Invalid("ps mode needs the shards' addresses (DPTRAIN_PS=host:port,...)");
  }
  if (o.master_port < 0 || o.master_port > 65534) {
    return Invalid(absl::StrCat("master port must be in [0, 65534], got ", o.master_port));
  }
  if (o.world_size > 1 && o.master_port == 0 && (o.rank != 0 || o.mode == "master")) {
    return Invalid(
        absl::StrCat("rank ", o.rank, " of ", o.world_size, " needs rank 0's port (MASTER_PORT)"));
  }
  if (o.timeout <= absl::ZeroDuration() || o.connect_timeout <= absl::ZeroDuration()) {
    return Invalid("timeouts must be > 0");
  }
  std::unique_ptr<Session> session(new Session(o));
  auto credentials = Credentials::Load(o.security);
  if (!credentials.ok()) return credentials.status();
  session->credentials_ = *std::move(credentials);
  if (o.mode == "master" && o.rank == 0 && o.world_size > 1) {
    // The DataParallel model: one unsharded reducer inside rank 0 that only averages.
    PsServerOptions server;
    server.listen_address = absl::StrCat(o.bind_address, ":", o.master_port + 1);
    server.credentials = session->credentials_;
    server.shard.num_shards = 1;
    server.shard.num_workers = o.world_size;
    server.shard.step_timeout = o.timeout;
    server.shard.optimizer.name = "none";
    auto reducer = PsServer::Start(server);
    if (!reducer.ok()) {
      return absl::Status(reducer.status().code(),
                          absl::StrCat("master mode: rank 0's reducer on port ", o.master_port + 1,
                                       " (MASTER_PORT + 1): ", reducer.status().message()));
    }
    session->reducer_ = *std::move(reducer);
  }
  if (o.mode == "allreduce") {
    if (auto s = session->EnsureRing(); !s.ok()) return s;
  }
  return session;
}

Session::Session(const SessionOptions& options) : options_(options) {}
Session::~Session() {
  if (reduce_thread_.joinable()) {
    readiness_->Cancel();
    reduce_thread_.join();
  }
}

absl::Status Session::EnsureRing() {
  if (ring_ != nullptr || options_.world_size == 1) return absl::OkStatus();
  AllReduceGroupOptions group;
  group.job_id = options_.job_id;
  group.rank = options_.rank;
  group.world_size = options_.world_size;
  group.master_addr = options_.master_addr;
  group.master_port = options_.master_port;
  group.advertise_host = options_.advertise_host;
  group.bind_address = options_.bind_address;
  group.connect_timeout = options_.connect_timeout;
  group.timeout = options_.timeout;
  group.max_message_bytes = kChunkElements * sizeof(float);
  group.credentials = credentials_;
  auto listening = AllReduceGroup::Listen(group);
  if (!listening.ok()) return listening.status();
  std::unique_ptr<AllReduceGroup> ring = *std::move(listening);
  if (options_.rank == 0) master_port_ = ring->master_port();
  if (auto s = ring->Join(); !s.ok()) return s;
  ring_ = std::move(ring);
  return absl::OkStatus();
}

uint64_t Session::NextTag() { return sequence_++ % (AllReduceSync::kMaxSteps - 1); }

absl::Status Session::Broadcast(absl::Span<float> data, int root) {
  if (root < 0 || root >= options_.world_size) {
    return Invalid(absl::StrCat("root rank ", root, " is not in [0, ", options_.world_size, ")"));
  }
  if (auto s = EnsureRing(); !s.ok() || ring_ == nullptr) return s;
  RingOptions ring;
  ring.chunk_elements = kChunkElements;
  ring.tag_base = 1 + NextTag();
  return RingBroadcast(ring_->link(), data, root, ring);
}

absl::Status Session::AllReduce(absl::Span<float> data, bool average, bool gradient) {
  if (auto s = EnsureRing(); !s.ok() || ring_ == nullptr) return s;
  RingOptions ring;
  ring.chunk_elements = kChunkElements;
  ring.average = average;
  ring.tag_base = 1 + NextTag();
  if (gradient && options_.wire_dtype != DType::kFp32) {
    NarrowingLink wire(ring_->link(), options_.wire_dtype);
    return RingAllReduce(wire, data, ring);
  }
  return RingAllReduce(ring_->link(), data, ring);
}

absl::Status Session::CheckSame(const std::string& what, const std::string& description) {
  if (options_.world_size == 1) return absl::OkStatus();
  // Rank 0's length, then its bytes (as fp32 words, moved bit for bit).
  int64_t length = static_cast<int64_t>(description.size());
  float header[2];
  std::memcpy(header, &length, sizeof(length));
  if (auto s = Broadcast(absl::MakeSpan(header), 0); !s.ok()) return s;
  std::memcpy(&length, header, sizeof(length));
  if (length < 0 || length > (int64_t{1} << 30)) {
    return absl::DataLossError(absl::StrCat("rank 0 described ", what, " in ", length, " bytes"));
  }
  std::vector<float> words((length + 3) / 4, 0.0f);
  if (options_.rank == 0) std::memcpy(words.data(), description.data(), description.size());
  if (auto s = Broadcast(absl::MakeSpan(words), 0); !s.ok()) return s;
  const std::string theirs(reinterpret_cast<const char*>(words.data()), length);
  // Which ranks differ: each marks its own slot.
  std::vector<float> differs(options_.world_size, 0.0f);
  differs[options_.rank] = theirs == description ? 0.0f : 1.0f;
  if (auto s = AllReduce(absl::MakeSpan(differs), /*average=*/false); !s.ok()) return s;
  std::vector<int> ranks;
  for (int r = 0; r < options_.world_size; ++r) {
    if (differs[r] != 0.0f) ranks.push_back(r);
  }
  if (ranks.empty()) return absl::OkStatus();
  if (theirs == description) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " of rank(s) ", absl::StrJoin(ranks, ", "),
                     " differ from rank 0's (their errors name the first difference)"));
  }
  const std::vector<std::string> mine = absl::StrSplit(description, '\n');
  const std::vector<std::string> zero = absl::StrSplit(theirs, '\n');
  size_t i = 0;
  while (i < mine.size() && i < zero.size() && mine[i] == zero[i]) ++i;
  const std::string here = i < mine.size() ? absl::StrCat("'", mine[i], "'") : "nothing";
  const std::string there = i < zero.size() ? absl::StrCat("'", zero[i], "'") : "nothing";
  return absl::FailedPreconditionError(absl::StrCat(what, " differ: at entry ", i, " rank ",
                                                    options_.rank, " has ", here, ", rank 0 has ",
                                                    there));
}

absl::StatusOr<std::unique_ptr<PsClient>> Session::ConnectStore(
    const std::vector<TensorInfo>& tensors, bool server_optimizer) {
  PsClientOptions o;
  o.shard_addresses = options_.ps;
  if (options_.mode == "master") {
    o.shard_addresses = {absl::StrCat(options_.master_addr, ":", options_.master_port + 1)};
    o.reconnect_timeout = absl::ZeroDuration();  // The reducer lives and dies with rank 0.
  } else {
    o.reconnect_timeout = options_.reconnect_timeout;
  }
  o.job_id = options_.job_id;
  o.rank = options_.rank;
  o.world_size = options_.world_size;
  o.tensors = tensors;
  o.connect_timeout = options_.connect_timeout;
  o.rpc_timeout = options_.timeout + absl::Seconds(30);  // The shards' step timeout first.
  o.wire_dtype = options_.wire_dtype;
  // DistributedOptimizer's shards must only average (ps_server --optimizer=none).
  if (!server_optimizer) o.expected_optimizer = "none";
  o.credentials = credentials_;
  return PsClient::Connect(o);
}

absl::Status Session::RegisterGradients(const std::vector<TensorInfo>& tensors) {
  if (gradient_step_ >= 0 || store_ != nullptr) {
    return absl::FailedPreconditionError(
        "this process already registered its gradients (one DistributedOptimizer or "
        "ServerOptimizer per process)");
  }
  int64_t size = 0;
  for (const TensorInfo& t : tensors) {
    if (t.num_elements < 0) return Invalid(absl::StrCat("tensor '", t.name, "' has < 0 elements"));
    size += t.num_elements;
  }
  if (options_.world_size > 1) {
    if (options_.mode == "allreduce") {
      if (auto s = EnsureRing(); !s.ok()) return s;
      AllReduceSyncOptions reduce;
      reduce.wire_dtype = options_.wire_dtype;
      gradient_ring_ = std::make_unique<AllReduceSync>(&ring_->link(), reduce);
    } else {
      auto store = ConnectStore(tensors, /*server_optimizer=*/false);
      if (!store.ok()) return store.status();
      std::vector<float> zeros(size, 0.0f);
      if (auto s = (*store)->Start(absl::MakeSpan(zeros)); !s.ok()) return s;
      store_ = *std::move(store);
    }
  }
  size_ = size;
  gradient_step_ = store_ != nullptr ? store_->resume_step() : 0;
  return absl::OkStatus();
}

absl::StatusOr<bool> Session::ReduceGradients(absl::Span<float> gradient_and_flag) {
  if (gradient_step_ < 0) {
    return absl::FailedPreconditionError("ReduceGradients before RegisterGradients");
  }
  if (static_cast<int64_t>(gradient_and_flag.size()) != size_ + 1) {
    return Invalid(absl::StrCat("the gradient buffer holds ", gradient_and_flag.size(),
                                " values, the registered tensors ", size_, " + the flag"));
  }
  ++gradient_step_;
  if (gradient_ring_ != nullptr) {
    auto outcome = gradient_ring_->Reduce(static_cast<int64_t>(NextTag()), gradient_and_flag);
    if (!outcome.ok()) return outcome.status();
    return outcome->skipped;
  }
  if (store_ == nullptr) {  // A lone process: its own flag decides.
    return gradient_and_flag.back() != 0.0f || HasNonFinite(gradient_and_flag.first(size_));
  }
  std::vector<float> mean(size_);
  auto outcome = store_->PushPull(gradient_step_ - 1, gradient_and_flag, absl::MakeSpan(mean));
  if (!outcome.ok()) return outcome.status();
  return AveragedInPlace(*outcome, mean, gradient_and_flag);
}

absl::Status Session::BeginReduce(absl::Span<float> gradient_and_flag) {
  if (gradient_step_ < 0)
    return absl::FailedPreconditionError("BeginReduce before RegisterGradients");
  if (store_ == nullptr) {
    return absl::FailedPreconditionError(
        "BeginReduce is for ps and master mode with more than one process (use ReduceGradients)");
  }
  if (reduce_thread_.joinable()) {
    return absl::FailedPreconditionError("BeginReduce twice without EndReduce");
  }
  if (static_cast<int64_t>(gradient_and_flag.size()) != size_ + 1) {
    return Invalid(absl::StrCat("the gradient buffer holds ", gradient_and_flag.size(),
                                " values, the registered tensors ", size_, " + the flag"));
  }
  const int64_t step = gradient_step_++;
  readiness_ = std::make_unique<GradientReadiness>();
  mean_.resize(size_);
  reducing_ = gradient_and_flag;
  reduced_ = absl::UnknownError("not run");
  reduce_thread_ = std::thread([this, step] {
    reduced_ = store_->PushPull(step, reducing_, absl::MakeSpan(mean_), readiness_.get());
  });
  return absl::OkStatus();
}

void Session::ReadyUpTo(int64_t n) {
  if (readiness_ != nullptr) readiness_->Advance(n);
}

void Session::CancelReduce() {
  if (readiness_ != nullptr) readiness_->Cancel();
}

absl::StatusOr<bool> Session::EndReduce() {
  if (!reduce_thread_.joinable()) {
    return absl::FailedPreconditionError("EndReduce without BeginReduce");
  }
  reduce_thread_.join();
  readiness_.reset();
  if (!reduced_.ok()) return reduced_.status();
  return AveragedInPlace(*reduced_, mean_, reducing_);
}

absl::StatusOr<int64_t> Session::StartServer(const std::vector<TensorInfo>& tensors,
                                             absl::Span<float> weights) {
  if (options_.mode != "ps") {
    return absl::FailedPreconditionError(absl::StrCat(
        "ServerOptimizer needs ps mode (DPTRAIN_MODE=ps), this job runs ", options_.mode));
  }
  if (gradient_step_ >= 0 || store_ != nullptr) {
    return absl::FailedPreconditionError(
        "this process already registered its gradients (one DistributedOptimizer or "
        "ServerOptimizer per process)");
  }
  auto store = ConnectStore(tensors, /*server_optimizer=*/true);
  if (!store.ok()) return store.status();
  if (auto s = (*store)->Start(weights); !s.ok()) return s;
  store_ = *std::move(store);
  return store_->resume_step();
}

absl::StatusOr<StepOutcome> Session::PushPull(int64_t step, absl::Span<float> gradient_and_flag,
                                              absl::Span<float> weights) {
  if (store_ == nullptr || gradient_step_ >= 0) {
    return absl::FailedPreconditionError("PushPull before StartServer");
  }
  return store_->PushPull(step, gradient_and_flag, weights);
}

absl::StatusOr<int64_t> Session::SparseDeclare(const proto::SparseTableSpec& table) {
  if (sparse_ == nullptr) {
    if (options_.ps.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "sparse table '", table.name(),
          "' lives on parameter-server shards: start them and set DPTRAIN_PS=host:port,..."));
    }
    SparseClientOptions o;
    o.shard_addresses = options_.ps;
    o.job_id = options_.job_id;
    o.rank = options_.rank;
    o.credentials = credentials_;
    o.rpc_timeout = options_.timeout + absl::Seconds(30);
    o.reconnect_timeout = options_.reconnect_timeout;
    auto client = SparseClient::Create(o);
    if (!client.ok()) return client.status();
    sparse_ = *std::move(client);
  }
  return sparse_->Declare(table);
}

absl::Status Session::SparsePull(const std::string& table, int dim, absl::Span<const int64_t> ids,
                                 absl::Span<float> out) {
  if (sparse_ == nullptr) return absl::FailedPreconditionError("no sparse table declared");
  return sparse_->Pull(table, dim, ids, out);
}

absl::Status Session::SparsePush(const std::string& table, int dim, int64_t step,
                                 absl::Span<const int64_t> ids, absl::Span<const float> grads) {
  if (sparse_ == nullptr) return absl::FailedPreconditionError("no sparse table declared");
  return sparse_->Push(table, dim, step, ids, grads);
}

absl::StatusOr<int64_t> Session::SparseStep(const std::string& table) {
  if (sparse_ == nullptr) return absl::FailedPreconditionError("no sparse table declared");
  auto steps = sparse_->Steps(table);
  if (!steps.ok()) return steps.status();
  return *std::min_element(steps->begin(), steps->end());
}

absl::Status Session::SparseRollback(const std::string& table, int64_t step) {
  if (sparse_ == nullptr) return absl::FailedPreconditionError("no sparse table declared");
  return sparse_->Rollback(table, step);
}

absl::Status Session::Rewind(int64_t step, absl::Span<float> weights) {
  if (store_ == nullptr || gradient_step_ >= 0) {
    return absl::FailedPreconditionError("Rewind before StartServer");
  }
  return store_->Rewind(step, weights, options_.reconnect_timeout);
}

}  // namespace dptrain
