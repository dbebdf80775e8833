#include "worker/comm/sharded_ring_store.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/loss_scaler.h"
#include "common/ring_allreduce.h"

namespace dptrain {
namespace {

// Checkpoint collectives use tag bases [kSaveTagBase, 2^24), above AllReduceSync's: 8 per
// step (wrapping; two of them are never in flight 2^19 steps apart). Resume uses step 0's,
// which no Snapshot does (it follows a step).
constexpr uint64_t kSaveTagBase = AllReduceSync::kBufferTagBase + (uint64_t{1} << 22);
RingOptions SaveRing(int64_t chunk_elements, int64_t step, int i) {
  RingOptions o;
  o.chunk_elements = chunk_elements;
  o.average = false;
  o.tag_base = kSaveTagBase + (8 * static_cast<uint64_t>(step) + i) % (uint64_t{1} << 22);
  return o;
}

// An integer below 2^44 as two floats, each exact (< 2^24), for a broadcast header.
void PutInt(std::vector<float>& header, int64_t v) {
  header.push_back(static_cast<float>(v >> 20));
  header.push_back(static_cast<float>(v & 0xFFFFF));
}
int64_t GetInt(const std::vector<float>& header, int field) {
  return (static_cast<int64_t>(header[2 * field]) << 20) +
         static_cast<int64_t>(header[2 * field + 1]);
}

}  // namespace

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
    return absl::InvalidArgumentError(absl::StrCat("PushPull: ", gradient_and_flag.size(),
                                                   " gradient values and flag for ", n,
                                                   " weights"));
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
  if (auto s = RingReduceScatter(*link_, grads, ring); !s.ok()) return s;
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
  const float rate = options_.lr_schedule.has_value()
                         ? LearningRateAt(*options_.lr_schedule, step)
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
  const int64_t c = options_.chunk_elements;
  if (auto s = RingAllReduce(*link_, absl::MakeSpan(present), SaveRing(c, step, 0)); !s.ok()) {
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
    auto s = RingAllGather(*link_, absl::MakeSpan(*full[i]), SaveRing(c, step, 1 + i));
    if (!s.ok()) return s;
  }
  if (!buffers.empty()) {
    const int64_t b = static_cast<int64_t>(buffers.size());
    snapshot.rank_buffers.assign(b * world, 0.0f);
    std::copy(buffers.begin(), buffers.end(),
              snapshot.rank_buffers.begin() + b * RingOwnedSegment(link_->rank(), world));
    auto s = RingAllGather(*link_, absl::MakeSpan(snapshot.rank_buffers), SaveRing(c, step, 4));
    if (!s.ok()) return s;
  }
  return snapshot;
}

absl::Status ShardedRingStore::Resume(const RingSnapshot& snapshot, int64_t model_size,
                                      absl::Span<float> buffers) {
  const int world = link_->world_size();
  const bool root = link_->rank() == 0;
  RingSnapshot got = root ? snapshot : RingSnapshot{};
  const auto vectors = got.optimizer.vectors();
  std::vector<float> header;
  PutInt(header, got.step);
  PutInt(header, got.optimizer.steps);
  PutInt(header, model_size);
  PutInt(header, static_cast<int64_t>(got.rank_buffers.size()));
  for (const std::vector<float>* v : vectors) PutInt(header, v->empty() ? 0 : 1);
  const int64_t c = options_.chunk_elements;
  if (auto s = RingBroadcast(*link_, absl::MakeSpan(header), 0, SaveRing(c, 0, 0)); !s.ok()) {
    return s;
  }
  const int64_t rank_buffers = GetInt(header, 3);
  if (GetInt(header, 2) != model_size ||
      rank_buffers != static_cast<int64_t>(buffers.size()) * world) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", link_->rank(), " has ", model_size, " weights and ", buffers.size(),
        " buffer values; rank 0 resumes ", GetInt(header, 2), " and ", rank_buffers, " for ",
        world, " ranks"));
  }
  got.step = GetInt(header, 0);
  got.optimizer.steps = GetInt(header, 1);
  if (got.step < 0 || got.step >= AllReduceSync::kMaxSteps) {
    return absl::OutOfRangeError(absl::StrCat("resume step ", got.step));
  }
  const Range mine = SegmentRange(model_size, world, RingOwnedSegment(link_->rank(), world));
  state_ = OptimizerState{};
  state_.steps = got.optimizer.steps;
  const auto own = state_.vectors();
  for (size_t i = 0; i < vectors.size(); ++i) {
    if (GetInt(header, 4 + static_cast<int>(i)) == 0) continue;
    if (!root) vectors[i]->assign(model_size, 0.0f);
    if (static_cast<int64_t>(vectors[i]->size()) != model_size) {
      return absl::InvalidArgumentError("optimizer state of the wrong size");
    }
    auto s = RingBroadcast(*link_, absl::MakeSpan(*vectors[i]), 0, SaveRing(c, 0, 1 + i));
    if (!s.ok()) return s;
    if (mine.size() > 0) {
      own[i]->assign(vectors[i]->begin() + mine.begin, vectors[i]->begin() + mine.end);
    }
  }
  if (rank_buffers > 0) {
    if (!root) got.rank_buffers.assign(rank_buffers, 0.0f);
    auto s = RingBroadcast(*link_, absl::MakeSpan(got.rank_buffers), 0, SaveRing(c, 0, 4));
    if (!s.ok()) return s;
    const int64_t b = static_cast<int64_t>(buffers.size());
    const auto part = got.rank_buffers.begin() + b * RingOwnedSegment(link_->rank(), world);
    std::copy(part, part + b, buffers.begin());
  }
  model_size_ = model_size;
  resume_step_ = got.step;
  return absl::OkStatus();
}

}  // namespace dptrain
