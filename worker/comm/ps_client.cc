#include "worker/comm/ps_client.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/net.h"
#include "common/wire_dtype.h"
#include "grpcpp/client_context.h"
#include "grpcpp/completion_queue.h"
#include "worker/comm/cancellation.h"
#include "worker/comm/shard_step_call.h"

namespace dptrain {
namespace {

// Sends requests[s] to every shard s at once (those with a request) and waits for all
// answers; returns the first failure (in the order they arrive), prefixed with `what`, the
// shard and its address. With `cancellation` (the calls of a step, which wait on the other
// ranks) a failure cancels the calls still running and the step's other calls, and theirs
// cancels these. Without, every call runs to its end: cancelling a healthy shard's
// GetShardInfo while another shard restarts was seen to keep gRPC from reconnecting to the
// restarted one for ~10 s (its connection attempts ended "tcp handshaker shutdown").
template <typename Request, typename Response, typename Start>
absl::Status CallAllShards(const std::vector<std::unique_ptr<proto::ParameterServer::Stub>>& stubs,
                           const std::vector<std::string>& addresses,
                           const std::vector<const Request*>& requests,
                           std::vector<Response>& responses, Start start, absl::Duration timeout,
                           const char* what, CancellationManager* cancellation = nullptr) {
  const size_t n = stubs.size();
  CancellationManager own;  // Records the first failure; cancels nothing.
  const bool cancellable = cancellation != nullptr;
  if (!cancellable) cancellation = &own;
  grpc::CompletionQueue cq;
  std::vector<grpc::ClientContext> contexts(n);
  std::vector<grpc::Status> statuses(n);
  std::vector<std::unique_ptr<grpc::ClientAsyncResponseReader<Response>>> calls(n);
  std::vector<CancellationManager::Token> tokens(n, -1);
  responses.resize(n);
  const auto deadline = absl::ToChronoTime(absl::Now() + timeout);
  size_t started = 0;
  for (size_t s = 0; s < n; ++s) {
    if (requests[s] == nullptr) continue;
    contexts[s].set_deadline(deadline);
    calls[s] = start(*stubs[s], &contexts[s], *requests[s], &cq);
    calls[s]->Finish(&responses[s], &statuses[s], reinterpret_cast<void*>(s + 1));
    if (cancellable)
      tokens[s] = cancellation->Register([&contexts, s] { contexts[s].TryCancel(); });
    ++started;
  }
  for (size_t i = 0; i < started; ++i) {
    void* tag;
    bool ok;
    if (!cq.Next(&tag, &ok)) {
      cancellation->Cancel(absl::InternalError("completion queue shut down"));
      break;
    }
    const size_t s = reinterpret_cast<size_t>(tag) - 1;
    cancellation->Deregister(tokens[s]);  // Ended: no TryCancel after that.
    tokens[s] = -1;
    if (!statuses[s].ok()) {
      cancellation->Cancel(
          FromGrpcStatus(statuses[s], absl::StrCat(what, " to shard ", s, " at ", addresses[s])));
    }
  }
  for (CancellationManager::Token token : tokens) {
    if (token >= 0) cancellation->Deregister(token);
  }
  return cancellation->why();
}

}  // namespace

PsClient::PsClient(const PsClientOptions& options, ShardMap map)
    : options_(options), map_(std::move(map)) {}

namespace {

// FailedPrecondition naming both when the shard's optimizer is not the one the worker was
// explicitly given (PsClientOptions::expected_optimizer...).
absl::Status CheckOptimizer(const PsClientOptions& options, const proto::ShardInfoResponse& info,
                            const std::string& address) {
  const std::string where = absl::StrCat("shard ", info.shard(), " at ", address);
  const char* const hint = " (in ps mode the servers' optimizer flags are the ones used)";
  if (!options.expected_optimizer.empty() && options.expected_optimizer != info.optimizer()) {
    return absl::FailedPreconditionError(
        absl::StrCat("optimizer mismatch: this worker has --optimizer=", options.expected_optimizer,
                     " but ", where, " applies ", info.optimizer(), hint));
  }
  if (!options.expected_lr_schedule.empty() && options.expected_lr_schedule != info.lr_schedule()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "optimizer mismatch: this worker has --lr_schedule=", options.expected_lr_schedule, " but ",
        where, " uses ", info.lr_schedule(), hint));
  }
  const std::map<std::string, double> theirs = {
      {"momentum", info.momentum()},
      {"weight_decay", info.weight_decay()},
      {"nesterov", info.nesterov() ? 1.0 : 0.0},
      {"beta1", info.beta1()},
      {"beta2", info.beta2()},
      {"eps", info.eps()},
      {"warmup_steps", static_cast<double>(info.warmup_steps())}};
  for (const auto& [name, mine] : options.expected_optimizer_values) {
    auto it = theirs.find(name);
    if (it == theirs.end()) continue;
    // The shard keeps momentum and weight decay as float32: compare at that precision.
    if (std::abs(it->second - mine) > 1e-6 * std::max(1.0, std::abs(mine))) {
      return absl::FailedPreconditionError(absl::StrCat("optimizer mismatch: this worker has --",
                                                        name, "=", mine, " but ", where,
                                                        " applies ", name, " ", it->second, hint));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Connect(const PsClientOptions& options) {
  const int num_shards = static_cast<int>(options.shard_addresses.size());
  if (num_shards == 0) return absl::InvalidArgumentError("no parameter-server address given");
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " is not in [0, ", options.world_size, ")"));
  }
  auto map = ShardMap::Build(options.tensors, {num_shards, options.max_chunk_elements});
  if (!map.ok()) return map.status();
  std::unique_ptr<PsClient> client(new PsClient(options, *std::move(map)));

  const absl::Time deadline = absl::Now() + options.connect_timeout;
  for (int s = 0; s < num_shards; ++s) {
    const std::string& address = options.shard_addresses[s];
    auto channel = MakeChannel(address, *options.credentials);
    if (!channel->WaitForConnected(absl::ToChronoTime(deadline))) {
      return absl::UnavailableError(absl::StrCat("cannot reach parameter-server shard ", s, " at ",
                                                 address, " within ",
                                                 absl::FormatDuration(options.connect_timeout)));
    }
    client->stubs_.push_back(proto::ParameterServer::NewStub(channel));
    client->stream_stubs_.push_back(std::make_unique<grpc::GenericStub>(channel));
  }
  auto fetched = client->Infos(options.connect_timeout);
  if (!fetched.ok()) return fetched.status();
  const std::vector<proto::ShardInfoResponse>& infos = *fetched;
  for (int s = 0; s < num_shards; ++s) {
    const proto::ShardInfoResponse& info = infos[s];
    const std::string& address = options.shard_addresses[s];
    if (info.shard() != s || info.num_shards() != num_shards) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard mismatch: --ps lists ", num_shards, " shards with ", address, " at position ", s,
          ", but that server is shard ", info.shard(), " of ", info.num_shards()));
    }
    if (info.num_workers() != options.world_size) {
      return absl::FailedPreconditionError(absl::StrCat(
          "world size mismatch: this worker has world size ", options.world_size, " but shard ", s,
          " at ", address, " expects ", info.num_workers(), " workers"));
    }
    if (info.sync_policy() != infos[0].sync_policy()) {
      return absl::FailedPreconditionError(
          absl::StrCat("sync policy mismatch: shard 0 runs ", infos[0].sync_policy(), ", shard ", s,
                       " at ", address, " runs ", info.sync_policy()));
    }
    if (options.expected_learning_rate > 0 &&
        std::abs(info.learning_rate() - options.expected_learning_rate) >
            1e-6 * options.expected_learning_rate) {
      return absl::FailedPreconditionError(
          absl::StrCat("learning-rate mismatch: --lr=", options.expected_learning_rate,
                       " but shard ", s, " at ", address, " applies ", info.learning_rate(),
                       " (in ps mode the server's --lr is the one used)"));
    }
    if (auto s = CheckOptimizer(options, info, address); !s.ok()) return s;
  }

  client->bsp_ = infos[0].sync_policy() == "bsp";
  for (const proto::ShardInfoResponse& info : infos) {
    client->incarnation_ = std::max(client->incarnation_, info.incarnation());
  }
  // A rate that every step shares is known here too (the metrics report it).
  if (infos[0].lr_schedule() == "constant" && infos[0].warmup_steps() == 0) {
    client->constant_learning_rate_ = infos[0].current_learning_rate();
  }
  if (client->bsp_) {
    for (const proto::ShardInfoResponse& info : infos) {
      if (info.checkpoint_every() > 0) {
        client->rewind_interval_ = std::gcd(client->rewind_interval_, info.checkpoint_every());
      }
    }
    client->buffer_interval_ = infos[0].checkpoint_every();
  }
  if (options.trace != nullptr) {
    for (int s = 0; s < num_shards; ++s) {
      options.trace->NameTrack(1 + 2 * s, absl::StrCat("shard ", s, " push"));
      options.trace->NameTrack(2 + 2 * s, absl::StrCat("shard ", s, " wait, pull"));
    }
  }
  client->push_requests_.resize(num_shards);
  for (int s = 0; s < num_shards; ++s) {
    proto::PushPullRequest& request = client->push_requests_[s];
    request.mutable_caller()->set_job_id(options.job_id);
    request.mutable_caller()->set_rank(options.rank);
    for (int i : client->map_.ChunksOfShard(s)) {
      const ChunkSpec& spec = client->map_.chunks()[i];
      proto::Chunk* chunk = request.add_chunks();
      chunk->mutable_key()->set_tensor_id(spec.tensor_id);
      chunk->mutable_key()->set_chunk_index(spec.chunk_index);
      chunk->set_dtype(proto::FP32);
    }
  }
  return client;
}

template <typename Request>
void PsClient::Describe(Request& request) const {
  request.mutable_caller()->set_job_id(options_.job_id);
  request.mutable_caller()->set_rank(options_.rank);
  request.set_num_shards(static_cast<int>(stubs_.size()));
  request.set_max_chunk_elements(options_.max_chunk_elements);
  for (const TensorInfo& t : options_.tensors) {
    proto::TensorSpec* spec = request.add_tensors();
    spec->set_name(t.name);
    spec->set_num_elements(t.num_elements);
  }
}

absl::Status PsClient::Unpack(int s, const proto::PullResponse& response,
                              absl::Span<float> weights) {
  const std::vector<int>& mine = map_.ChunksOfShard(s);
  if (response.chunks_size() != static_cast<int>(mine.size())) {
    return absl::DataLossError(absl::StrCat("shard ", s, " answered with ", response.chunks_size(),
                                            " chunks, expected ", mine.size()));
  }
  for (int i = 0; i < response.chunks_size(); ++i) {
    const proto::Chunk& chunk = response.chunks(i);
    const ChunkSpec& spec = map_.chunks()[mine[i]];
    if (chunk.key().tensor_id() != spec.tensor_id ||
        chunk.key().chunk_index() != spec.chunk_index || chunk.dtype() != proto::FP32 ||
        chunk.data().size() != static_cast<size_t>(spec.count) * sizeof(float)) {
      return absl::DataLossError(absl::StrCat("shard ", s, " answered with an unexpected chunk ", i,
                                              " (tensor ", chunk.key().tensor_id(), ", chunk ",
                                              chunk.key().chunk_index(), ")"));
    }
    std::memcpy(weights.data() + spec.flat_offset, chunk.data().data(), chunk.data().size());
  }
  stats_.bytes_pulled += static_cast<int64_t>(response.ByteSizeLong());
  return absl::OkStatus();
}

absl::Status PsClient::Start(absl::Span<float> weights) {
  if (weights.size() != static_cast<size_t>(map_.total_elements())) {
    return absl::InvalidArgumentError("Start: weights do not match the model");
  }
  const int num_shards = static_cast<int>(stubs_.size());
  if (options_.rank == 0) {
    std::vector<proto::InitRequest> requests(num_shards);
    std::vector<const proto::InitRequest*> pointers;
    for (int s = 0; s < num_shards; ++s) {
      Describe(requests[s]);
      for (int i : map_.ChunksOfShard(s)) {
        const ChunkSpec& spec = map_.chunks()[i];
        proto::Chunk* chunk = requests[s].add_chunks();
        chunk->mutable_key()->set_tensor_id(spec.tensor_id);
        chunk->mutable_key()->set_chunk_index(spec.chunk_index);
        chunk->set_dtype(proto::FP32);
        chunk->set_data(reinterpret_cast<const char*>(weights.data() + spec.flat_offset),
                        spec.count * sizeof(float));
      }
      stats_.bytes_pushed += static_cast<int64_t>(requests[s].ByteSizeLong());
      pointers.push_back(&requests[s]);
    }
    std::vector<proto::InitResponse> ignored;
    if (auto s = CallAllShards(stubs_, options_.shard_addresses, pointers, ignored,
                               std::mem_fn(&proto::ParameterServer::Stub::AsyncInit),
                               options_.rpc_timeout, "Init");
        !s.ok()) {
      return s;
    }
  }
  // Every rank (rank 0 too, which then also checks the round trip) pulls the weights.
  auto version = PullAll(weights, options_.rpc_timeout);
  if (!version.ok()) return version.status();
  resume_step_ = bsp_ ? *version : 0;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> PsClient::PullAll(absl::Span<float> weights, absl::Duration timeout) {
  const int num_shards = static_cast<int>(stubs_.size());
  std::vector<proto::PullRequest> requests(num_shards);
  std::vector<const proto::PullRequest*> pointers;
  for (auto& r : requests) {
    Describe(r);
    pointers.push_back(&r);
  }
  if (auto s =
          CallAllShards(stubs_, options_.shard_addresses, pointers, responses_,
                        std::mem_fn(&proto::ParameterServer::Stub::AsyncPull), timeout, "Pull");
      !s.ok()) {
    return s;
  }
  int64_t version = 0;
  for (int s = 0; s < num_shards; ++s) {
    if (auto st = Unpack(s, responses_[s], weights); !st.ok()) return st;
    version = s == 0 ? responses_[s].version() : std::min(version, responses_[s].version());
  }
  return version;
}

absl::StatusOr<std::vector<proto::ShardInfoResponse>> PsClient::Infos(absl::Duration timeout) {
  proto::ShardInfoRequest request;
  std::vector<const proto::ShardInfoRequest*> requests(stubs_.size(), &request);
  std::vector<proto::ShardInfoResponse> infos;
  if (auto s = CallAllShards(stubs_, options_.shard_addresses, requests, infos,
                             std::mem_fn(&proto::ParameterServer::Stub::AsyncGetShardInfo), timeout,
                             "GetShardInfo");
      !s.ok()) {
    return s;
  }
  return infos;
}

bool PsClient::Admitted(const proto::ShardInfoResponse& info) const {
  return options_.rank >= info.rank_incarnations_size() ||
         info.rank_incarnations(options_.rank) == info.incarnation();
}

PsClient::RewindTarget PsClient::ChooseRewind(const std::vector<proto::ShardInfoResponse>& infos,
                                              int64_t step) const {
  int64_t newest = 0;
  for (const proto::ShardInfoResponse& info : infos) newest = std::max(newest, info.incarnation());
  // Join the newest incarnation while no step of it has completed (so that this rank, not in
  // it everywhere, cannot have taken part) and every shard not in it yet can go back to its
  // first step: another rank went back first, or this rank's own going back did not reach
  // every shard (one restarted since, at incarnation 0, or this worker restarted midway).
  int64_t from = -1;
  bool joinable = newest > 0;
  for (const proto::ShardInfoResponse& info : infos) {
    if (info.incarnation() != newest) continue;
    joinable = joinable && (from < 0 || from == info.incarnation_step()) &&
               info.version() == info.incarnation_step();
    from = info.incarnation_step();
  }
  for (const proto::ShardInfoResponse& info : infos) {
    if (info.incarnation() < newest) joinable = joinable && info.version() >= from;
  }
  if (joinable) return {newest, from};
  return {std::max(newest, incarnation_) + 1, step};
}

absl::Status PsClient::RewindTo(const RewindTarget& target, absl::Span<float> weights,
                                absl::Duration timeout) {
  proto::RollbackRequest request;
  request.mutable_caller()->set_job_id(options_.job_id);
  request.mutable_caller()->set_rank(options_.rank);
  request.set_step(target.step);
  request.set_incarnation(target.incarnation);
  std::vector<const proto::RollbackRequest*> requests(stubs_.size(), &request);
  std::vector<proto::RollbackResponse> ignored;
  if (auto s = CallAllShards(stubs_, options_.shard_addresses, requests, ignored,
                             std::mem_fn(&proto::ParameterServer::Stub::AsyncRollback), timeout,
                             absl::StrCat("Rollback to step ", target.step).c_str());
      !s.ok()) {
    return s;
  }
  auto version = PullAll(weights, timeout);
  if (!version.ok()) return version.status();
  if (*version != target.step) {
    return absl::AbortedError(
        absl::StrCat("after going back to step ", target.step, " a shard is at step ", *version));
  }
  incarnation_ = target.incarnation;
  return absl::OkStatus();
}

absl::Status PsClient::Rewind(int64_t step, absl::Span<float> weights, absl::Duration timeout) {
  auto infos = Infos(timeout);
  if (!infos.ok()) return infos.status();
  RewindTarget target = ChooseRewind(*infos, step);
  // Joining is right only where the other rank went back to this same step.
  if (target.step != step) target = {target.incarnation + 1, step};
  return RewindTo(target, weights, timeout);
}

namespace {

// A failure that recovery may get past: a shard away (restarting), or gone back under us.
bool Recoverable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsAborted(s) || absl::IsOutOfRange(s);
}

}  // namespace

absl::StatusOr<StepOutcome> PsClient::PushPull(int64_t step, absl::Span<float> gradient_and_flag,
                                               absl::Span<float> weights) {
  return PushPull(step, gradient_and_flag, weights, nullptr);
}

absl::StatusOr<StepOutcome> PsClient::PushPull(int64_t step, absl::Span<float> gradient_and_flag,
                                               absl::Span<float> weights,
                                               GradientReadiness* ready) {
  absl::StatusOr<StepOutcome> result = PushPullOnce(step, gradient_and_flag, ready, weights);
  if (result.ok() || !Recoverable(result.status()) ||
      options_.reconnect_timeout <= absl::ZeroDuration()) {
    return result;
  }
  const absl::Time start = absl::Now(), give_up = start + options_.reconnect_timeout;
  options_.log(absl::StrCat("rank ", options_.rank, ": step ", step, " failed (",
                            result.status().message(), "); recovering for up to ",
                            absl::FormatDuration(options_.reconnect_timeout)));
  absl::Status last = result.status();
  absl::Duration backoff = absl::Milliseconds(50);
  while (true) {
    const absl::Duration left = give_up - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::UnavailableError(absl::StrCat("step ", step, ": no recovery within ",
                                                 absl::FormatDuration(options_.reconnect_timeout),
                                                 "; last error: ", last.message()));
    }
    absl::Status attempt;
    auto infos = Infos(std::min(left, absl::Seconds(5)));
    if (!infos.ok()) {
      attempt = infos.status();
    } else {
      int64_t oldest = 0, newest_incarnation = 0;
      bool admitted = true;  // Every shard counts this rank's pushes.
      for (size_t s = 0; s < infos->size(); ++s) {
        const proto::ShardInfoResponse& info = (*infos)[s];
        if (!info.initialized()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "parameter-server shard ", s, " at ", options_.shard_addresses[s],
              " came back without the model: it has no checkpoint to restore (run every "
              "ps_server with --checkpoint_dir and --checkpoint_every)"));
        }
        oldest = s == 0 ? info.version() : std::min(oldest, info.version());
        newest_incarnation = std::max(newest_incarnation, info.incarnation());
        admitted = admitted && Admitted(info);
      }
      if (!bsp_ || (oldest >= step && admitted && newest_incarnation <= incarnation_)) {
        // Nobody went back past this step: the same push again.
        result = PushPullOnce(step, gradient_and_flag, ready, weights);
        if (result.ok()) {
          options_.log(absl::StrCat("rank ", options_.rank, ": step ", step, " recovered after ",
                                    absl::FormatDuration(absl::Now() - start)));
          return result;
        }
        attempt = result.status();
      } else {
        // Every shard back to the oldest step, or into the incarnation another rank opened.
        const RewindTarget target = ChooseRewind(*infos, oldest);
        attempt = RewindTo(target, weights, std::min(left, options_.rpc_timeout));
        if (attempt.ok()) {
          options_.log(absl::StrCat("rank ", options_.rank, ": step ", step,
                                    " recovered by going back to step ", target.step,
                                    " (incarnation ", target.incarnation, ") after ",
                                    absl::FormatDuration(absl::Now() - start)));
          StepOutcome outcome;
          outcome.rewind_to = target.step;
          return outcome;
        }
      }
    }
    if (!Recoverable(attempt)) return attempt;
    last = attempt;
    absl::SleepFor(std::min(backoff, std::max(give_up - absl::Now(), absl::ZeroDuration())));
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
}

absl::StatusOr<StepOutcome> PsClient::PushPullOnce(int64_t step,
                                                   absl::Span<const float> gradient_and_flag,
                                                   GradientReadiness* ready,
                                                   absl::Span<float> weights) {
  const size_t total = static_cast<size_t>(map_.total_elements());
  if (gradient_and_flag.size() != total + 1 || weights.size() != total) {
    return absl::InvalidArgumentError("PushPull: gradient or weights do not match the model");
  }
  const absl::Span<const float> grads = gradient_and_flag.first(total);
  const bool overflow = gradient_and_flag.back() != 0.0f;
  const bool narrow = options_.wire_dtype != DType::kFp32;
  if (narrow) narrowed_.resize(total);  // Each chunk is narrowed as it leaves.
  const proto::DType wire = static_cast<proto::DType>(options_.wire_dtype);
  const size_t element = ElementSize(options_.wire_dtype);
  const int num_shards = static_cast<int>(stubs_.size());
  const absl::Time push_start = absl::Now();
  const absl::Time deadline = push_start + options_.rpc_timeout;
  CancellationManager cancellation;  // Outlives the calls.
  std::vector<std::unique_ptr<ShardStepCall>> calls;
  std::vector<const proto::PushPullRequest*> unary(num_shards, nullptr);
  std::vector<int> small;  // Shards that get one unary call, once the whole gradient is ready.
  for (int s = 0; s < num_shards; ++s) {
    const std::vector<int>& mine = map_.ChunksOfShard(s);
    if (mine.empty()) continue;  // A shard that owns nothing takes no part.
    int64_t bytes = 0;
    for (int i : mine) bytes += map_.chunks()[i].count * static_cast<int64_t>(element);
    if (bytes < options_.stream_min_bytes) {
      small.push_back(s);
      continue;
    }
    ShardStep args;
    args.stub = stream_stubs_[s].get();
    args.map = &map_;
    args.shard = s;
    args.job_id = options_.job_id;
    args.rank = options_.rank;
    args.step = step;
    args.grads = grads;
    args.wire_dtype = options_.wire_dtype;
    if (narrow) args.narrow_scratch = absl::MakeSpan(narrowed_);
    args.ready = ready;
    args.weights = weights;
    args.deadline = deadline;
    args.context = absl::StrCat("PushPull of step ", step, " to shard ", s, " at ",
                                options_.shard_addresses[s]);
    args.overflow = overflow;
    args.cancellation = &cancellation;
    calls.push_back(std::make_unique<ShardStepCall>(args));
    calls.back()->Start();
  }
  if (ready != nullptr && !ready->WaitFor(static_cast<int64_t>(total), deadline)) {
    // Backward failed or never ended: no shard may count a partial push.
    for (auto& call : calls) call->Cancel();
    for (auto& call : calls) (void)call->Wait();
    return ready->cancelled() ? absl::CancelledError(absl::StrCat("step ", step,
                                                                  ": the gradient was not "
                                                                  "completed (backward failed)"))
                              : absl::DeadlineExceededError(absl::StrCat(
                                    "step ", step, ": the gradient was not completed within ",
                                    absl::FormatDuration(options_.rpc_timeout)));
  }
  for (int s : small) {
    const std::vector<int>& mine = map_.ChunksOfShard(s);
    proto::PushPullRequest& request = push_requests_[s];
    request.set_step(step);
    request.set_overflow(overflow);
    for (size_t i = 0; i < mine.size(); ++i) {
      const ChunkSpec& spec = map_.chunks()[mine[i]];
      proto::Chunk* chunk = request.mutable_chunks(static_cast<int>(i));
      chunk->set_dtype(wire);
      const absl::Span<const float> values = grads.subspan(spec.flat_offset, spec.count);
      const char* from = reinterpret_cast<const char*>(values.data());
      if (narrow) {
        const absl::Span<uint16_t> to =
            absl::MakeSpan(narrowed_).subspan(spec.flat_offset, spec.count);
        Narrow(options_.wire_dtype, values, to);
        from = reinterpret_cast<const char*>(to.data());
      }
      chunk->mutable_data()->assign(from, spec.count * element);
    }
    stats_.bytes_pushed += static_cast<int64_t>(request.ByteSizeLong());
    unary[s] = &request;
  }
  StepOutcome outcome;
  // The unary calls run while the streams (started above) do.
  absl::Status first =
      CallAllShards(stubs_, options_.shard_addresses, unary, responses_,
                    std::mem_fn(&proto::ParameterServer::Stub::AsyncPushPull), options_.rpc_timeout,
                    absl::StrCat("PushPull of step ", step).c_str(), &cancellation);
  for (int s = 0; s < num_shards && first.ok(); ++s) {
    if (unary[s] == nullptr) continue;
    const int64_t staleness = responses_[s].staleness();
    stats_.max_staleness = std::max(stats_.max_staleness, staleness);
    stats_.staleness_sum += staleness;
    ++stats_.staleness_count;
    outcome.skipped = outcome.skipped || responses_[s].skipped();
    first = Unpack(s, responses_[s], weights);
  }
  if (!first.ok()) cancellation.Cancel(first);  // The streams still running end too.
  const absl::Time unary_end = absl::Now();
  TraceRecorder* trace = options_.trace;
  if (trace != nullptr && trace->Recording(step)) {
    for (int s = 0; s < num_shards; ++s) {
      if (unary[s] != nullptr)
        trace->Span(1 + 2 * s, "push_pull (unary)", step, push_start, unary_end);
    }
  }
  for (auto& call : calls) {  // Every call must end before `grads` may change.
    absl::Status s = call->Wait();
    // A shard that still counted this rank's earlier streams as open (their ends not yet
    // through under load) refused this one before counting any of it: send it again, backing
    // off, within the step's deadline.
    for (absl::Duration backoff = call->busy_retry_after();
         backoff > absl::ZeroDuration() && absl::Now() + backoff < deadline &&
         !cancellation.cancelled();
         backoff = std::min(std::max(backoff, call->busy_retry_after()) * 2, absl::Seconds(1))) {
      ++stats_.busy_retries;
      absl::SleepFor(backoff);
      call = std::make_unique<ShardStepCall>(call->args());
      call->Start();
      s = call->Wait();
      if (call->busy_retry_after() == absl::ZeroDuration()) break;
    }
    if (trace != nullptr && trace->Recording(step)) {
      const ShardStepCall::Timeline& t = call->timeline();
      const int track = 1 + 2 * call->shard();
      if (t.pushed != absl::InfinitePast()) trace->Span(track, "push", step, t.start, t.pushed);
      if (t.first_answer != absl::InfinitePast()) {
        trace->Span(track + 1, "wait", step, t.start, t.first_answer);
        trace->Span(track + 1, "pull", step, t.first_answer, t.done);
      }
    }
    if (!s.ok()) cancellation.Cancel(s);  // Also a bad answer on an OK status.
    if (first.ok()) first = s;
    stats_.bytes_pushed += call->bytes_sent();
    stats_.bytes_pulled += call->bytes_received();
    stats_.max_staleness = std::max(stats_.max_staleness, call->staleness());
    stats_.staleness_sum += call->staleness();
    outcome.skipped = outcome.skipped || call->skipped();
    ++stats_.staleness_count;
  }
  // The failure that ended the step rather than the calls it cancelled.
  if (cancellation.cancelled()) return cancellation.why();
  if (!first.ok()) return first;
  return outcome;
}

absl::Status PsClient::CallShard0(absl::string_view method,
                                  const std::function<grpc::Status(grpc::ClientContext&)>& call) {
  const absl::Time give_up = absl::Now() + options_.reconnect_timeout;
  for (absl::Duration backoff = absl::Milliseconds(50);;
       backoff = std::min(backoff * 2, absl::Seconds(1))) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
    const grpc::Status status = call(context);
    if (status.ok()) return absl::OkStatus();
    const absl::Status failed = FromGrpcStatus(
        status, absl::StrCat(method, " to shard 0 at ", options_.shard_addresses[0]));
    // Shard 0 away (restarting): wait for it like a step does.
    if (!absl::IsUnavailable(failed) || absl::Now() + backoff > give_up) return failed;
    absl::SleepFor(backoff);
  }
}

absl::Status PsClient::AverageBuffers(int64_t round, absl::Span<float> buffers) {
  if (round < 0) return absl::OutOfRangeError(absl::StrCat("buffer round ", round, " < 0"));
  proto::AverageBuffersRequest request;
  request.mutable_caller()->set_job_id(options_.job_id);
  request.mutable_caller()->set_rank(options_.rank);
  request.set_round(round);
  request.set_data(reinterpret_cast<const char*>(buffers.data()), buffers.size() * sizeof(float));
  proto::AverageBuffersResponse response;
  if (auto s = CallShard0("AverageBuffers",
                          [&](grpc::ClientContext& context) {
                            stats_.bytes_pushed += static_cast<int64_t>(request.ByteSizeLong());
                            return stubs_[0]->AverageBuffers(&context, request, &response);
                          });
      !s.ok()) {
    return s;
  }
  stats_.bytes_pulled += static_cast<int64_t>(response.ByteSizeLong());
  if (response.data().size() != buffers.size() * sizeof(float)) {
    return absl::DataLossError("AverageBuffers: shard 0 answered with a different size");
  }
  std::memcpy(buffers.data(), response.data().data(), response.data().size());
  return absl::OkStatus();
}

absl::Status PsClient::KeepBuffers(int64_t step, absl::Span<const float> buffers, bool epoch_end) {
  if (buffer_interval_ <= 0 || step <= 0 || step % buffer_interval_ != 0) return absl::OkStatus();
  proto::KeepBuffersRequest request;
  request.mutable_caller()->set_job_id(options_.job_id);
  request.mutable_caller()->set_rank(options_.rank);
  request.set_step(step);
  request.set_data(reinterpret_cast<const char*>(buffers.data()), buffers.size() * sizeof(float));
  request.set_epoch_end(epoch_end);
  proto::KeepBuffersResponse response;
  stats_.bytes_pushed += static_cast<int64_t>(request.ByteSizeLong());
  return CallShard0("KeepBuffers", [&](grpc::ClientContext& context) {
    return stubs_[0]->KeepBuffers(&context, request, &response);
  });
}

absl::Status PsClient::RestoreBuffers(int64_t step, absl::Span<float> buffers) {
  if (buffer_interval_ <= 0) {
    return absl::NotFoundError(
        "shard 0 keeps no batch-norm statistics (no --checkpoint_every, or not bsp)");
  }
  proto::GetBuffersRequest request;
  request.mutable_caller()->set_job_id(options_.job_id);
  request.mutable_caller()->set_rank(options_.rank);
  request.set_step(step);
  proto::GetBuffersResponse response;
  if (auto s = CallShard0("GetBuffers",
                          [&](grpc::ClientContext& context) {
                            return stubs_[0]->GetBuffers(&context, request, &response);
                          });
      !s.ok()) {
    return s;
  }
  stats_.bytes_pulled += static_cast<int64_t>(response.ByteSizeLong());
  if (response.data().size() != buffers.size() * sizeof(float)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard 0 holds ", response.data().size() / sizeof(float), " batch-norm statistics of step ",
        step, " for rank ", options_.rank, ", the model has ", buffers.size()));
  }
  std::memcpy(buffers.data(), response.data().data(), response.data().size());
  return absl::OkStatus();
}

}  // namespace dptrain
