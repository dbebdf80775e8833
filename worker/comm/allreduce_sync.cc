#include "worker/comm/allreduce_sync.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/loss_scaler.h"
#include "common/wire_link.h"

namespace dptrain {
namespace {

// Checkpoint collectives use tag bases [kSaveTagBase, 2^24), above AllReduceSync's: 8 per
// step (wrapping; two of them are never in flight 2^19 steps apart). Resume uses step 0's,
// which no Snapshot does (it follows a step).
constexpr uint64_t kSaveTagBase = AllReduceSync::kBufferTagBase + (uint64_t{1} << 22);
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

absl::Status AllReduceSync::Start(absl::Span<float> weights) {
  RingOptions ring;
  ring.chunk_elements = options_.chunk_elements;
  ring.tag_base = 0;
  return RingBroadcast(*link_, weights, /*root=*/0, ring);
}

absl::StatusOr<StepOutcome> AllReduceSync::Reduce(int64_t step,
                                                  absl::Span<float> gradient_and_flag) {
  if (step < 0 || step >= kMaxSteps) {
    return absl::OutOfRangeError(absl::StrCat("step ", step, " outside [0, ", kMaxSteps, ")"));
  }
  if (gradient_and_flag.empty()) {
    return absl::InvalidArgumentError("the gradient exchange buffer has no flag slot");
  }
  RingOptions ring;
  ring.chunk_elements = options_.chunk_elements;
  ring.average = true;
  ring.tag_base = static_cast<uint64_t>(step) + 1;
  if (options_.wire_dtype != DType::kFp32) {
    NarrowingLink wire(*link_, options_.wire_dtype);
    if (auto s = RingAllReduce(wire, gradient_and_flag, ring); !s.ok()) return s;
  } else if (auto s = RingAllReduce(*link_, gradient_and_flag, ring); !s.ok()) {
    return s;
  }
  StepOutcome outcome;
  outcome.skipped = gradient_and_flag.back() != 0.0f || HasNonFinite(gradient_and_flag);
  return outcome;
}

absl::Status AllReduceSync::AverageBuffers(int64_t round, absl::Span<float> buffers) {
  if (round < 0) return absl::OutOfRangeError(absl::StrCat("buffer round ", round, " < 0"));
  RingOptions ring;
  ring.chunk_elements = options_.chunk_elements;
  ring.average = true;
  ring.tag_base = kBufferTagBase + static_cast<uint64_t>(round);
  return RingAllReduce(*link_, buffers, ring);
}

RingOptions AllReduceSync::SaveRing(int64_t step, int i) const {
  RingOptions o;
  o.chunk_elements = options_.chunk_elements;
  o.average = false;
  o.tag_base = kSaveTagBase + (8 * static_cast<uint64_t>(step) + i) % (uint64_t{1} << 22);
  return o;
}

absl::StatusOr<std::vector<float>> AllReduceSync::GatherRankBuffers(
    int64_t step, absl::Span<const float> buffers) {
  std::vector<float> all;
  if (buffers.empty()) return all;
  const int world = link_->world_size();
  const int64_t b = static_cast<int64_t>(buffers.size());
  all.assign(b * world, 0.0f);
  std::copy(buffers.begin(), buffers.end(),
            all.begin() + b * RingOwnedSegment(link_->rank(), world));
  if (auto s = RingAllGather(*link_, absl::MakeSpan(all), SaveRing(step, 4)); !s.ok()) return s;
  return all;
}

absl::Status AllReduceSync::BroadcastSnapshot(RingSnapshot& snapshot, int64_t model_size,
                                              absl::Span<float> buffers) {
  const int world = link_->world_size();
  const int64_t buffers_per_rank = static_cast<int64_t>(buffers.size());
  if (link_->rank() != 0) snapshot = RingSnapshot{};
  const auto vectors = snapshot.optimizer.vectors();
  std::vector<float> header;
  PutInt(header, snapshot.step);
  PutInt(header, snapshot.optimizer.steps);
  PutInt(header, model_size);
  PutInt(header, static_cast<int64_t>(snapshot.rank_buffers.size()));
  for (const std::vector<float>* v : vectors) PutInt(header, v->empty() ? 0 : 1);
  if (auto s = RingBroadcast(*link_, absl::MakeSpan(header), 0, SaveRing(0, 0)); !s.ok()) {
    return s;
  }
  const int64_t rank_buffers = GetInt(header, 3);
  if (GetInt(header, 2) != model_size || rank_buffers != buffers_per_rank * world) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", link_->rank(), " has ", model_size, " weights and ", buffers_per_rank,
                     " buffer values; rank 0 resumes ", GetInt(header, 2), " and ", rank_buffers,
                     " for ", world, " ranks"));
  }
  snapshot.step = GetInt(header, 0);
  snapshot.optimizer.steps = GetInt(header, 1);
  if (snapshot.step < 0 || snapshot.step >= kMaxSteps) {
    return absl::OutOfRangeError(absl::StrCat("resume step ", snapshot.step));
  }
  for (size_t i = 0; i < vectors.size(); ++i) {
    if (GetInt(header, 4 + static_cast<int>(i)) == 0) continue;
    if (link_->rank() != 0) vectors[i]->assign(model_size, 0.0f);
    if (static_cast<int64_t>(vectors[i]->size()) != model_size) {
      return absl::InvalidArgumentError("optimizer state of the wrong size");
    }
    auto s = RingBroadcast(*link_, absl::MakeSpan(*vectors[i]), 0, SaveRing(0, 1 + i));
    if (!s.ok()) return s;
  }
  if (rank_buffers > 0) {
    if (link_->rank() != 0) snapshot.rank_buffers.assign(rank_buffers, 0.0f);
    auto s = RingBroadcast(*link_, absl::MakeSpan(snapshot.rank_buffers), 0, SaveRing(0, 4));
    if (!s.ok()) return s;
    const auto part =
        snapshot.rank_buffers.begin() + buffers_per_rank * RingOwnedSegment(link_->rank(), world);
    std::copy(part, part + buffers_per_rank, buffers.begin());
  }
  resume_step_ = snapshot.step;
  return absl::OkStatus();
}

CommStats AllReduceSync::stats() const {
  CommStats s;
  s.bytes_pushed = link_->bytes_sent();
  s.bytes_pulled = link_->bytes_received();
  return s;
}

}  // namespace dptrain
