#include "worker/comm/allreduce_sync.h"

#include "absl/strings/str_cat.h"
#include "common/loss_scaler.h"
#include "common/ring_allreduce.h"

namespace dptrain {

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
  if (auto s = RingAllReduce(*link_, gradient_and_flag, ring); !s.ok()) return s;
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

CommStats AllReduceSync::stats() const {
  CommStats s;
  s.bytes_pushed = link_->bytes_sent();
  s.bytes_pulled = link_->bytes_received();
  return s;
}

}  // namespace dptrain
