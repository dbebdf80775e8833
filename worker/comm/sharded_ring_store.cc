#include "worker/comm/sharded_ring_store.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/loss_scaler.h"
#include "common/ring_allreduce.h"
#include "common/wire_link.h"

namespace dptrain {

absl::StatusOr<std::unique_ptr<ShardedRingStore>> ShardedRingStore::Create(
    PeerLink* link, const ShardedRingStoreOptions& options) {
  if (options.lr_schedule.has_value()) {
    if (absl::Status s = ValidateLrSchedule(*options.lr_schedule); !s.ok()) return s;
  }
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer = CreateOptimizer(options.optimizer);
  if (!optimizer.ok()) return optimizer.status();
  return std::unique_ptr<ShardedRingStore>(
      new ShardedRingStore(link, options, *std::move(optimizer)));
}

ShardedRingStore::ShardedRingStore(PeerLink* link, const ShardedRingStoreOptions& options,
                                   std::unique_ptr<Optimizer> optimizer)
    : link_(link),
      options_(options),
      optimizer_(std::move(optimizer)),
      ring_(link, AllReduceSyncOptions{options.chunk_elements}) {}

absl::Status ShardedRingStore::Start(absl::Span<float> weights) { return ring_.Start(weights); }

absl::Status ShardedRingStore::AverageBuffers(int64_t round, absl::Span<float> buffers) {
  return ring_.AverageBuffers(round, buffers);
}

absl::StatusOr<StepOutcome> ShardedRingStore::PushPull(int64_t step,
                                                       absl::Span<float> gradient_and_flag,
                                                       absl::Span<float> weights) {
  if (step < 0 || step >= AllReduceSync::kMaxSteps) {
    return absl::OutOfRangeError(
        absl::StrCat("step ", step, " outside [0, ", AllReduceSync::kMaxSteps, ")"));
  }
  const int64_t n = static_cast<int64_t>(weights.size());
  if (static_cast<int64_t>(gradient_and_flag.size()) != n + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PushPull: ", gradient_and_flag.size(), " gradient values and flag for ", n, " weights"));
  }
  if (model_size_ >= 0 && model_size_ != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("PushPull: the model had ", model_size_, " weights, now ", n));
  }
  model_size_ = n;
  const absl::Span<float> grads = gradient_and_flag.first(n);
  RingOptions ring;
  ring.chunk_elements = options_.chunk_elements;
  ring.average = true;
  ring.tag_base = static_cast<uint64_t>(step) + 1;
  if (options_.wire_dtype != DType::kFp32) {
    NarrowingLink wire(*link_, options_.wire_dtype);
    if (auto s = RingReduceScatter(wire, grads, ring); !s.ok()) return s;
  } else if (auto s = RingReduceScatter(*link_, grads, ring); !s.ok()) {
    return s;
  }
  const int world = link_->world_size();
  const Range mine = SegmentRange(n, world, RingOwnedSegment(link_->rank(), world));
  const absl::Span<float> my_grads = grads.subspan(mine.begin, mine.size());
  // Every rank votes on its own flag and its averaged segment; one sum decides for all.
  float vote = gradient_and_flag.back() != 0.0f || HasNonFinite(my_grads) ? 1.0f : 0.0f;
  RingOptions flags;
  flags.average = false;
  flags.tag_base = AllReduceSync::kFlagTagBase + static_cast<uint64_t>(step);
  if (auto s = RingAllReduce(*link_, absl::MakeSpan(&vote, 1), flags); !s.ok()) return s;
  StepOutcome outcome;
  outcome.skipped = vote != 0.0f;
  if (outcome.skipped) return outcome;  // Nobody applies anything: the weights stay.
  const float rate = options_.lr_schedule.has_value() ? LearningRateAt(*options_.lr_schedule, step)
                                                      : options_.optimizer.learning_rate;
  optimizer_->Apply(weights.subspan(mine.begin, mine.size()), my_grads, state_, rate);
  if (auto s = RingAllGather(*link_, weights, ring); !s.ok()) return s;
  return outcome;
}

absl::StatusOr<RingSnapshot> ShardedRingStore::Snapshot(int64_t step,
                                                        absl::Span<const float> buffers) {
  if (model_size_ < 0) return absl::FailedPreconditionError("Snapshot before the first step");
  const int world = link_->world_size();
  const Range mine = SegmentRange(model_size_, world, RingOwnedSegment(link_->rank(), world));
  // A rank whose segment is empty has no state vectors: the ranks agree on which exist.
  const auto own = state_.vectors();
  std::vector<float> present;
  for (const std::vector<float>* v : own) present.push_back(v->empty() ? 0.0f : 1.0f);
  if (auto s = RingAllReduce(*link_, absl::MakeSpan(present), ring_.SaveRing(step, 0)); !s.ok()) {
    return s;
  }
  RingSnapshot snapshot;
  snapshot.step = step;
  snapshot.optimizer.steps = state_.steps;
  const auto full = snapshot.optimizer.vectors();
  for (size_t i = 0; i < own.size(); ++i) {
    if (present[i] == 0.0f) continue;
    if (!own[i]->empty() && static_cast<int64_t>(own[i]->size()) != mine.size()) {
      return absl::InternalError("optimizer state of the wrong size");
    }
    full[i]->assign(model_size_, 0.0f);
    std::copy(own[i]->begin(), own[i]->end(), full[i]->begin() + mine.begin);
    auto s = RingAllGather(*link_, absl::MakeSpan(*full[i]), ring_.SaveRing(step, 1 + i));
    if (!s.ok()) return s;
  }
  auto rank_buffers = ring_.GatherRankBuffers(step, buffers);
  if (!rank_buffers.ok()) return rank_buffers.status();
  snapshot.rank_buffers = *std::move(rank_buffers);
  return snapshot;
}

absl::Status ShardedRingStore::Resume(const RingSnapshot& snapshot, int64_t model_size,
                                      absl::Span<float> buffers) {
  const int world = link_->world_size();
  RingSnapshot got = snapshot;
  if (auto s = ring_.BroadcastSnapshot(got, model_size, buffers); !s.ok()) return s;
  const Range mine = SegmentRange(model_size, world, RingOwnedSegment(link_->rank(), world));
  state_ = OptimizerState{};
  state_.steps = got.optimizer.steps;
  const auto full = got.optimizer.vectors();
  const auto own = state_.vectors();
  for (size_t i = 0; i < full.size(); ++i) {
    if (!full[i]->empty() && mine.size() > 0) {
      own[i]->assign(full[i]->begin() + mine.begin, full[i]->begin() + mine.end);
    }
  }
  model_size_ = model_size;
  resume_step_ = got.step;
  return absl::OkStatus();
}

}  // namespace dptrain
