#include "server/aggregation_policy.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace dptrain {

bool AllFinite(const void* data, int64_t n) {
  // An exponent of all ones is inf or NaN. Integer-only, so the loop vectorises at -O3
  // without fast-math.
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, p + i * sizeof(float), sizeof(bits));
    bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

absl::StatusOr<SyncPolicy> ParseSyncPolicy(absl::string_view name) {
  if (name == "bsp") return SyncPolicy::kBsp;
  if (name == "ssp") return SyncPolicy::kSsp;
  if (name == "async") return SyncPolicy::kAsync;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown sync policy '", name, "' (expected bsp, ssp or async)"));
}

const char* SyncPolicyName(SyncPolicy policy) {
  switch (policy) {
    case SyncPolicy::kBsp:
      return "bsp";
    case SyncPolicy::kSsp:
      return "ssp";
    case SyncPolicy::kAsync:
      return "async";
  }
  return "?";
}

void AggregationPolicy::NoteNonFinite(int64_t step, const ChunkSpec& spec, bool dropped_push) {
  ShardStats& s = *c_.stats;
  int64_t& count = dropped_push ? s.nonfinite_pushes : s.nonfinite_steps;
  if (!dropped_push) {
    if (step == s.nonfinite_step) return;  // This step is counted already.
    s.nonfinite_step = step;
  }
  if (++count > 1) return;  // Logged once per kind; later ones are only counted.
  c_.log(absl::StrCat("ps shard ", c_.shard, ": step ", step, " chunk ",
                      ChunkKeyString(spec.tensor_id, spec.chunk_index),
                      ": gradient has inf/NaN but no overflow flag; ",
                      dropped_push ? "push dropped" : "step skipped",
                      " (further occurrences only counted: GetShardInfo ",
                      dropped_push ? "nonfinite_pushes" : "nonfinite_steps", ")"));
}

void AggregationPolicy::CountStaleness(int64_t s) {
  ++c_.stats->pushes;
  c_.stats->sum_staleness += s;
  c_.stats->max_staleness = std::max(c_.stats->max_staleness, s);
  c_.observer->OnPush(s);
}

namespace {

class BspPolicy final : public AggregationPolicy {
 public:
  explicit BspPolicy(const PolicyContext& c) : AggregationPolicy(c) {}
  SyncPolicy kind() const override { return SyncPolicy::kBsp; }

  void Reset(bool) override {
    const int n = c_.num_workers;
    pending_.assign(c_.store->num_chunks(), Pending{});
    for (Pending& p : pending_) {
      p.grads.assign(n, nullptr);
      p.holds.resize(n);
    }
    sum_.assign(c_.store->largest_chunk(), 0.0f);
  }

  absl::Status CheckStep(int slot, int, int64_t step) const override {
    // Step `version` is open; step `version - 1` completed (a retry gets its result).
    const StoredChunk& o = c_.store->chunk(slot);
    if (step == o.version || step == o.version - 1) return absl::OkStatus();
    return absl::OutOfRangeError(absl::StrCat(
        "step ", step, " is outside the window [", o.version - 1, ", ", o.version, "] of shard ",
        c_.shard, " (chunk ", ChunkKeyString(o.spec.tensor_id, o.spec.chunk_index),
        " is at version ", o.version, ")"));
  }

  bool IsRetry(int slot, int rank, int64_t step) const override {
    return step != c_.store->chunk(slot).version || pending_[slot].grads[rank] != nullptr;
  }

  void Push(int slot, int rank, int64_t step, absl::string_view data,
            std::shared_ptr<const void> hold, bool overflow) override {
    if (IsRetry(slot, rank, step)) return;  // A retry (step open or completed): no change.
    Pending& p = pending_[slot];
    const int64_t n = c_.store->chunk(slot).spec.count;
    if (hold == nullptr || reinterpret_cast<uintptr_t>(data.data()) % alignof(float) != 0) {
      auto copy = std::make_shared<std::vector<float>>(n);
      std::memcpy(copy->data(), data.data(), n * sizeof(float));
      p.grads[rank] = copy->data();
      p.holds[rank] = std::move(copy);
    } else {
      p.grads[rank] = reinterpret_cast<const float*>(data.data());
      p.holds[rank] = std::move(hold);
    }
    ++p.num_pushed;
    p.overflow = p.overflow || overflow;
    CountStaleness(0);
    if (p.num_pushed == c_.num_workers) ApplyStep(slot);
  }

  absl::Status CheckPull(int, int, int64_t) const override { return absl::OkStatus(); }

  bool Ready(int slot, int, int64_t step) const override {
    return c_.store->chunk(slot).version > step;
  }

  absl::Status TimedOut(int slot, int, int64_t step) const override {
    const Pending& p = pending_[slot];
    std::vector<int> missing;
    for (int r = 0; r < c_.num_workers; ++r) {
      if (p.grads[r] == nullptr) missing.push_back(r);
    }
    return absl::DeadlineExceededError(
        absl::StrCat("step ", step, " on shard ", c_.shard, " timed out waiting for rank(s) ",
                     absl::StrJoin(missing, ","), " (", p.num_pushed, " of ", c_.num_workers,
                     " workers pushed)"));
  }

  PulledChunk Pulled(int slot, int) override {
    PulledChunk result;
    result.version = c_.store->chunk(slot).version;
    result.skipped = pending_[slot].last_skipped;
    return result;
  }

  int64_t CompletedStep() const override { return c_.store->MinVersion(); }

 private:
  // The open step of one chunk.
  struct Pending {
    // The gradients of step `version`, per rank (null = not pushed yet), each kept alive by
    // its hold until the step completes.
    std::vector<const float*> grads;
    std::vector<std::shared_ptr<const void>> holds;
    int num_pushed = 0;
    bool overflow = false;      // Some push of the open step had inf/NaN.
    bool last_skipped = false;  // The last completed step was skipped.
  };

  void ApplyStep(int slot) {
    StoredChunk& o = c_.store->chunk(slot);
    Pending& p = pending_[slot];
    // Mixed precision: some worker's gradient had inf/NaN (flagged, or found in another
    // chunk of this step); nobody's counts.
    bool skip = p.overflow || o.version == c_.stats->nonfinite_step;
    const float* g = nullptr;
    const absl::Time sum_start = absl::Now();
    absl::Time apply_start = sum_start;
    if (!skip) {
      g = AverageGradients(slot);
      apply_start = absl::Now();
      if (!AllFinite(g, o.spec.count)) {
        NoteNonFinite(o.version, o.spec, /*dropped_push=*/false);
        skip = true;
      }
    }
    // Under BSP a chunk's version is the step it completes (skipped steps count too).
    if (!skip) c_.store->Apply(slot, g, c_.rate_at(o.version));
    c_.observer->OnApply(o.version, sum_start, apply_start, absl::Now());
    p.last_skipped = skip;
    p.overflow = false;
    std::fill(p.grads.begin(), p.grads.end(), nullptr);
    for (auto& h : p.holds) h.reset();
    p.num_pushed = 0;
    ++o.version;
  }

  // The rank-order average of the open step's gradients (in sum_, or a push's own data).
  const float* AverageGradients(int slot) {
    const Pending& p = pending_[slot];
    const int workers = c_.num_workers;
    if (workers == 1) return p.grads[0];
    // Fixed-order summation (rank 0, 1, ...) makes runs bit-reproducible.
    const int64_t n = c_.store->chunk(slot).spec.count;
    float* sum = sum_.data();
    std::memcpy(sum, p.grads[0], n * sizeof(float));
    for (int r = 1; r < workers; ++r) {
      const float* x = p.grads[r];
      for (int64_t i = 0; i < n; ++i) sum[i] += x[i];
    }
    const float scale = 1.0f / static_cast<float>(workers);
    for (int64_t i = 0; i < n; ++i) sum[i] *= scale;
    return sum;
  }

  std::vector<Pending> pending_;
  std::vector<float> sum_;  // Scratch of the largest chunk's size.
};

class SspPolicy : public AggregationPolicy {
 public:
  explicit SspPolicy(const PolicyContext& c) : AggregationPolicy(c) {}
  SyncPolicy kind() const override { return SyncPolicy::kSsp; }

  void Reset(bool restored) override {
    const int n = c_.num_workers;
    ranks_.assign(c_.store->num_chunks(), PerRank{});
    for (int slot = 0; slot < c_.store->num_chunks(); ++slot) {
      PerRank& r = ranks_[slot];
      r.clock.assign(n, restored ? kUnknown : 0);
      r.base_version.assign(n, c_.store->chunk(slot).version);
      r.observed.assign(n, 0);
      r.skipped.assign(n, false);
    }
    scaled_.assign(c_.store->largest_chunk(), 0.0f);
  }

  absl::Status CheckStep(int slot, int rank, int64_t step) const override {
    // The rank's next push, or a retry of its last one; after a restore, any step.
    const int64_t clock = ranks_[slot].clock[rank];
    if (clock == kUnknown || step == clock || step == clock - 1) return absl::OkStatus();
    return absl::OutOfRangeError(absl::StrCat("rank ", rank, " pushed step ", step,
                                              ", expected step ", clock, " on shard ", c_.shard));
  }

  bool IsRetry(int slot, int rank, int64_t step) const override {
    const int64_t clock = ranks_[slot].clock[rank];
    return clock != kUnknown && step != clock;
  }

  void Push(int slot, int rank, int64_t step, absl::string_view data, std::shared_ptr<const void>,
            bool overflow) override {
    if (IsRetry(slot, rank, step)) return;  // A retry of the last push: not applied again.
    StoredChunk& o = c_.store->chunk(slot);
    PerRank& r = ranks_[slot];
    r.clock[rank] = step;  // Adopted after a restore; unchanged otherwise.
    r.observed[rank] = o.version - r.base_version[rank];
    r.skipped[rank] = overflow;
    CountStaleness(r.observed[rank]);
    ++r.clock[rank];
    if (overflow) return;  // Dropped: the worker moves on (its clock), the weights do not.
    const int64_t n = o.spec.count;
    const float scale = 1.0f / static_cast<float>(c_.num_workers);
    float* scaled = scaled_.data();
    const absl::Time sum_start = absl::Now();
    for (int64_t i = 0; i < n; ++i) {
      float g;
      std::memcpy(&g, data.data() + i * sizeof(float), sizeof(float));
      scaled[i] = g * scale;
    }
    if (!AllFinite(scaled, n)) {  // Dropped like a flagged overflow.
      NoteNonFinite(step, o.spec, /*dropped_push=*/true);
      r.skipped[rank] = true;
      return;
    }
    const absl::Time apply_start = absl::Now();
    c_.store->Apply(slot, scaled, c_.rate_at(step));
    c_.observer->OnApply(step, sum_start, apply_start, absl::Now());
    ++o.version;
  }

  absl::Status CheckPull(int slot, int rank, int64_t step) const override {
    const int64_t clock = ranks_[slot].clock[rank];
    if (clock == kUnknown || clock <= step) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", rank, " pulls step ", step, " of a chunk it has not pushed"));
    }
    return absl::OkStatus();
  }

  bool Ready(int slot, int, int64_t step) const override {
    // Having pushed `step`, the worker may compute step + 1 once the slowest has pushed
    // step + 1 - staleness (clock >= step + 1 - staleness).
    return MinClock(slot) >= step + 1 - c_.staleness;
  }

  absl::Status TimedOut(int slot, int, int64_t step) const override {
    const int64_t needed = step + 1 - c_.staleness;
    std::vector<int> slow;
    for (int r = 0; r < c_.num_workers; ++r) {
      if (ranks_[slot].clock[r] < needed) slow.push_back(r);
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "step ", step, " on shard ", c_.shard, " timed out waiting for rank(s) ",
        absl::StrJoin(slow, ","), " to reach step ", needed - 1, " (staleness bound ",
        c_.staleness, ")"));
  }

  PulledChunk Pulled(int slot, int rank) override {
    PerRank& r = ranks_[slot];
    PulledChunk result;
    result.version = c_.store->chunk(slot).version;
    r.base_version[rank] = result.version;
    result.staleness = r.observed[rank];
    result.skipped = r.skipped[rank];
    return result;
  }

  void Rejoin(int rank) override {
    for (PerRank& r : ranks_) r.clock[rank] = kUnknown;
  }

  int64_t CompletedStep() const override {
    int64_t completed = -1;
    for (int slot = 0; slot < c_.store->num_chunks(); ++slot) {
      const int64_t m = MinClock(slot);
      if (m == kUnknown) return -1;
      completed = slot == 0 ? m : std::min(completed, m);
    }
    return completed;
  }

 private:
  static constexpr int64_t kUnknown = -1;
  struct PerRank {
    // Pushes applied per rank (its next step), the version each rank last received and the
    // staleness its last push observed; whether its last push was dropped.
    std::vector<int64_t> clock;
    std::vector<int64_t> base_version;
    std::vector<int64_t> observed;
    std::vector<bool> skipped;
  };

  int64_t MinClock(int slot) const {
    const std::vector<int64_t>& clock = ranks_[slot].clock;
    return *std::min_element(clock.begin(), clock.end());
  }

  std::vector<PerRank> ranks_;
  std::vector<float> scaled_;  // Scratch of the largest chunk's size.
};

class AsyncPolicy final : public SspPolicy {
 public:
  explicit AsyncPolicy(const PolicyContext& c) : SspPolicy(c) {}
  SyncPolicy kind() const override { return SyncPolicy::kAsync; }
  bool Ready(int, int, int64_t) const override { return true; }
};

}  // namespace

std::unique_ptr<AggregationPolicy> AggregationPolicy::Create(SyncPolicy policy,
                                                             const PolicyContext& context) {
  switch (policy) {
    case SyncPolicy::kBsp:
      return std::make_unique<BspPolicy>(context);
    case SyncPolicy::kSsp:
      return std::make_unique<SspPolicy>(context);
    case SyncPolicy::kAsync:
      return std::make_unique<AsyncPolicy>(context);
  }
  return nullptr;
}

}  // namespace dptrain
