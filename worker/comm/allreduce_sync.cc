#include "worker/comm/allreduce_sync.h"

#include <algorithm>

#include "common/loss_scaler.h"

namespace dptrain {

AllReduceSync::AllReduceSync(PeerLink* link, const AllReduceSyncOptions& options,
                             std::unique_ptr<Optimizer> optimizer)
    : link_(link), options_(options), optimizer_(std::move(optimizer)) {}

absl::StatusOr<std::unique_ptr<AllReduceSync>> AllReduceSync::Create(
    PeerLink* link, const AllReduceSyncOptions& options) {
  auto optimizer = CreateOptimizer(options.optimizer);
  if (!optimizer.ok()) return optimizer.status();
  return std::unique_ptr<AllReduceSync>(new AllReduceSync(link, options, *std::move(optimizer)));
}

absl::Status AllReduceSync::Start(absl::Span<float> weights) {
  RingOptions ring;
  ring.chunk_elements = options_.chunk_elements;
  ring.tag_base = 0;
  return RingBroadcast(*link_, weights, /*root=*/0, ring);
}

absl::Status AllReduceSync::Step(int64_t step, absl::Span<const float> grads,
                                 absl::Span<float> weights) {
  if (!apply_ && grads.size() != weights.size()) {
    return absl::InvalidArgumentError("gradient and weights differ in size");
  }
  buffer_.resize(grads.size() + 1);
  std::copy(grads.begin(), grads.end(), buffer_.begin());
  buffer_.back() = overflow_ ? 1.0f : 0.0f;
  overflow_ = false;
  RingOptions ring;
  ring.chunk_elements = options_.chunk_elements;
  ring.average = true;
  // 0 is the initial broadcast; steps stay below kBufferTagBase.
  ring.tag_base = static_cast<uint64_t>(step) + 1;
  if (auto s = RingAllReduce(*link_, absl::MakeSpan(buffer_), ring); !s.ok()) return s;
  // Every rank sees the same reduced bits, so every rank decides the same.
  last_step_skipped_ = buffer_.back() != 0.0f || HasNonFinite(buffer_);
  if (last_step_skipped_) return absl::OkStatus();
  const absl::Span<const float> averaged = absl::MakeConstSpan(buffer_.data(), grads.size());
  if (apply_) return apply_(averaged);
  optimizer_->Apply(weights, averaged, state_);
  return absl::OkStatus();
}

absl::Status AllReduceSync::AverageBuffers(int64_t round, absl::Span<float> buffers) {
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
