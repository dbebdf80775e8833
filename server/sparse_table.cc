#include "server/sparse_table.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/sparse_rows.h"

namespace dptrain {

absl::Status ValidateSparseTableSpec(const SparseTableSpec& s) {
  auto bad = [&s](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("sparse table '", s.name, "': ", what));
  };
  if (s.name.empty() || s.name.size() > 128 ||
      !std::all_of(s.name.begin(), s.name.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
      })) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sparse table name '", s.name, "': 1 to 128 of letters, digits, '_', '.', '-'"));
  }
  if (s.rows < 1) return bad(absl::StrCat("rows must be >= 1, got ", s.rows));
  if (s.dim < 1 || s.dim > (1 << 20))
    return bad(absl::StrCat("dim must be in [1, 2^20], got ", s.dim));
  if (s.optimizer != "sgd" && s.optimizer != "adagrad" && s.optimizer != "adam") {
    return bad(absl::StrCat("optimizer must be sgd, adagrad or adam, got '", s.optimizer, "'"));
  }
  if (!(s.lr >= 0) || !std::isfinite(s.lr)) return bad(absl::StrCat("lr must be >= 0, got ", s.lr));
  if (!(s.eps > 0) || !std::isfinite(s.eps))
    return bad(absl::StrCat("eps must be > 0, got ", s.eps));
  if (!(s.beta1 >= 0 && s.beta1 < 1) || !(s.beta2 >= 0 && s.beta2 < 1)) {
    return bad("beta1 and beta2 must be in [0, 1)");
  }
  return absl::OkStatus();
}

std::string DescribeSparseTable(const SparseTableSpec& s) {
  return absl::StrCat(s.rows, " rows x ", s.dim, ", ", s.optimizer, " lr ", s.lr, " eps ", s.eps,
                      " betas ", s.beta1, "/", s.beta2, ", seed ", s.seed);
}

SparseTable::SparseTable(const SparseTableSpec& spec, const SparseTableOptions& options)
    : spec_(spec),
      options_(options),
      rule_(spec.optimizer == "sgd"       ? Rule::kSgd
            : spec.optimizer == "adagrad" ? Rule::kAdagrad
                                          : Rule::kAdam),
      pending_slots_(options.num_workers),
      pending_grads_(options.num_workers, nullptr),
      pending_owned_(options.num_workers),
      pushed_(options.num_workers, false),
      last_pull_(options.num_workers),
      newest_(options.num_workers, -1) {}

int64_t SparseTable::step() const {
  absl::MutexLock lock(&mu_);
  return step_;
}

int64_t SparseTable::rows_held() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(rows_.slot.size());
}

int64_t SparseTable::rows_applied() const {
  absl::MutexLock lock(&mu_);
  return rows_applied_;
}

double SparseTable::apply_seconds() const {
  absl::MutexLock lock(&mu_);
  return absl::ToDoubleSeconds(apply_time_);
}

absl::Status SparseTable::CheckIds(absl::Span<const int64_t> ids) const {
  for (int64_t id : ids) {
    if (id < 0 || id >= spec_.rows) {
      return absl::InvalidArgumentError(absl::StrCat("sparse table '", spec_.name, "': id ", id,
                                                     " is not in [0, ", spec_.rows, ")"));
    }
    if (RowShard(id, options_.num_shards) != options_.shard) {
      return absl::InvalidArgumentError(
          absl::StrCat("sparse table '", spec_.name, "': row ", id, " belongs to shard ",
                       RowShard(id, options_.num_shards), ", not to shard ", options_.shard));
    }
  }
  return absl::OkStatus();
}

std::optional<SparseTableCheckpoint> SparseTable::Snapshot(int64_t step) const {
  absl::MutexLock lock(&mu_, absl::Condition(this, &SparseTable::NotApplying));
  if (step != step_) return std::nullopt;
  SparseTableCheckpoint cp;
  cp.shard = options_.shard;
  cp.num_shards = options_.num_shards;
  cp.step = step_;
  cp.spec = spec_;
  cp.ids.reserve(rows_.slot.size());
  rows_.slot.ForEach([&cp](int64_t id, int64_t) { cp.ids.push_back(id); });
  std::sort(cp.ids.begin(), cp.ids.end());
  const size_t d = spec_.dim, n = cp.ids.size();
  cp.weights.resize(n * d);
  if (!rows_.a.empty()) cp.state_a.resize(n * d);
  if (!rows_.b.empty()) cp.state_b.resize(n * d);
  if (!rows_.t.empty()) cp.state_steps.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t at = static_cast<size_t>(rows_.slot.Find(cp.ids[i])) * d;
    std::copy_n(rows_.w.begin() + at, d, cp.weights.begin() + i * d);
    if (!rows_.a.empty()) std::copy_n(rows_.a.begin() + at, d, cp.state_a.begin() + i * d);
    if (!rows_.b.empty()) std::copy_n(rows_.b.begin() + at, d, cp.state_b.begin() + i * d);
    if (!rows_.t.empty()) cp.state_steps[i] = rows_.t[at / d];
  }
  return cp;
}

absl::Status SparseTable::Restore(const SparseTableCheckpoint* cp) {
  if (cp != nullptr && DescribeSparseTable(cp->spec) != DescribeSparseTable(spec_)) {
    return absl::FailedPreconditionError(
        absl::StrCat("sparse table '", spec_.name, "' is ", DescribeSparseTable(spec_),
                     "; its checkpoint holds ", DescribeSparseTable(cp->spec)));
  }
  Rows rows;
  if (cp != nullptr) {
    const size_t n = cp->ids.size(), d = spec_.dim;
    rows.slot.Reserve(static_cast<int64_t>(n));
    for (size_t i = 0; i < n; ++i) {
      if (cp->ids[i] < 0 || cp->ids[i] >= spec_.rows) {
        return absl::DataLossError(absl::StrCat("sparse table '", spec_.name,
                                                "': its checkpoint holds row ", cp->ids[i],
                                                ", outside [0, ", spec_.rows, ")"));
      }
      bool created = false;
      if (rows.slot.FindOrAdd(cp->ids[i], created) != static_cast<int64_t>(i)) {
        return absl::DataLossError(absl::StrCat(
            "sparse table '", spec_.name, "': its checkpoint holds row ", cp->ids[i], " twice"));
      }
    }
    rows.w = cp->weights;
    // A checkpoint holds the state of its optimizer for every row (zeros for rows only pulled).
    if (rule_ != Rule::kSgd) rows.a = cp->state_a.empty() ? std::vector<float>(n * d) : cp->state_a;
    if (rule_ == Rule::kAdam) {
      rows.b = cp->state_b.empty() ? std::vector<float>(n * d) : cp->state_b;
      rows.t = cp->state_steps.empty() ? std::vector<int64_t>(n) : cp->state_steps;
    }
  }
  absl::MutexLock lock(&mu_, absl::Condition(this, &SparseTable::NotApplying));
  rows_ = std::move(rows);
  step_ = cp != nullptr ? cp->step : 0;
  for (int r = 0; r < options_.num_workers; ++r) {
    pending_slots_[r].clear();
    pending_grads_[r] = nullptr;
    pending_owned_[r].clear();
  }
  mean_at_.clear();
  pushed_.assign(options_.num_workers, false);
  arrived_ = 0;
  ++restores_;
  return absl::OkStatus();
}

int64_t SparseTable::SlotLocked(int64_t id) {
  bool created = false;
  const int64_t next = rows_.slot.FindOrAdd(id, created);
  if (created) {
    const size_t d = spec_.dim;
    rows_.w.resize((next + 1) * d);
    InitialRow(spec_.seed, spec_.name, id, absl::MakeSpan(rows_.w.data() + next * d, d));
    if (rule_ != Rule::kSgd) rows_.a.resize((next + 1) * d, 0.0f);
    if (rule_ == Rule::kAdam) rows_.b.resize((next + 1) * d, 0.0f), rows_.t.push_back(0);
  }
  return next;
}

namespace {

// Asks for every cache line of a row ahead of its use: a row of 64 fp32 spans 4 or 5 lines
// and one __builtin_prefetch brings only the first (the rows of a large table are far beyond
// the caches, so each line not asked for is a miss of its own).
template <int kForWrite>
inline void PrefetchRow(const float* row, size_t d) {
  const char* p = reinterpret_cast<const char*>(row);
  const size_t bytes = d * sizeof(float);
  for (size_t at = 0; at < bytes; at += 64) __builtin_prefetch(p + at, kForWrite);
  __builtin_prefetch(p + bytes - 1, kForWrite);  // The line the row ends in, if not yet asked.
}

}  // namespace

bool SparseTable::HeldSlotsLocked(absl::Span<const int64_t> ids,
                                  std::vector<int64_t>& slots) const {
  // Each id's place in the map fetched a few ids ahead: the cache misses of the lookups (the
  // map of a large table is far beyond the caches) overlap instead of queueing.
  constexpr size_t kAhead = 16;
  slots.resize(ids.size());
  for (size_t i = 0; i < std::min(kAhead, ids.size()); ++i) rows_.slot.Prefetch(ids[i]);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i + kAhead < ids.size()) rows_.slot.Prefetch(ids[i + kAhead]);
    slots[i] = rows_.slot.Find(ids[i]);
    if (slots[i] < 0) return false;
  }
  return true;
}

bool SparseTable::CopyHeldRowsLocked(absl::Span<const int64_t> ids, float* out,
                                     std::vector<int64_t>& slots) const {
  const size_t d = spec_.dim;
  // Every slot first, then the rows, each fetched a few rows ahead: the lookups' cache misses
  // overlap instead of queueing behind the copies.
  constexpr size_t kAhead = 8;
  if (!HeldSlotsLocked(ids, slots)) return false;
  const float* w = rows_.w.data();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i + kAhead < ids.size()) PrefetchRow<0>(w + slots[i + kAhead] * d, d);
    std::copy_n(w + slots[i] * d, d, out + i * d);
  }
  return true;
}

absl::Status SparseTable::Pull(absl::Span<const int64_t> ids, absl::Span<float> out, int rank) {
  if (out.size() != ids.size() * spec_.dim) {
    return absl::InvalidArgumentError("sparse pull: the output does not hold ids x dim values");
  }
  if (auto s = CheckIds(ids); !s.ok()) return s;
  {
    // Rows already held (after a job's first steps, nearly all): workers pull at once.
    absl::ReaderMutexLock lock(&mu_, absl::Condition(this, &SparseTable::NotApplying));
    std::vector<int64_t> slots;
    if (CopyHeldRowsLocked(ids, out.data(), slots)) {
      if (rank >= 0 && rank < options_.num_workers) {
        absl::MutexLock cache(&last_pull_mu_);
        LastPull& last = last_pull_[rank];
        last.ids.assign(ids.begin(), ids.end());
        last.slots = std::move(slots);
        last.restores = restores_;
      }
      return absl::OkStatus();
    }
  }
  absl::MutexLock lock(&mu_, absl::Condition(this, &SparseTable::NotApplying));
  const size_t d = spec_.dim;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t slot = SlotLocked(ids[i]);
    std::copy_n(rows_.w.data() + slot * d, d, out.data() + i * d);
  }
  return absl::OkStatus();
}

void SparseTable::ApplyLocked(int64_t slot, const float* g, float scale, bool from_zero) {
  const int d = spec_.dim;
  const float lr = spec_.lr;
  float* w = rows_.w.data() + slot * d;
  // g[i] times scale; from zero, (0 + g[i]) times scale, as a sum of one term gives it.
  auto grad = [g, scale, from_zero](int i) { return (from_zero ? 0.0f + g[i] : g[i]) * scale; };
  if (rule_ == Rule::kSgd) {
    for (int i = 0; i < d; ++i) w[i] -= lr * grad(i);
    return;
  }
  float* a = rows_.a.data() + slot * d;
  if (rule_ == Rule::kAdagrad) {
    const float eps = static_cast<float>(spec_.eps);
    for (int i = 0; i < d; ++i) {
      const float gi = grad(i);
      a[i] += gi * gi;
      w[i] -= lr * (gi / (std::sqrt(a[i]) + eps));  // torch's addcdiv order.
    }
    return;
  }
  // Lazy Adam: this row's own step count.
  float* v = rows_.b.data() + slot * d;
  const int64_t t = ++rows_.t[slot];
  const double c1 = 1.0 - std::pow(spec_.beta1, static_cast<double>(t));
  const double c2 = 1.0 - std::pow(spec_.beta2, static_cast<double>(t));
  const float b1 = static_cast<float>(spec_.beta1), b2 = static_cast<float>(spec_.beta2);
  const float step_size = static_cast<float>(lr / c1);
  const float c2_sqrt = static_cast<float>(std::sqrt(c2)), eps = static_cast<float>(spec_.eps);
  for (int i = 0; i < d; ++i) {
    const float gi = grad(i);
    a[i] = b1 * a[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * (gi * gi);
    w[i] -= step_size * (a[i] / (std::sqrt(v[i]) / c2_sqrt + eps));
  }
}

void SparseTable::ApplyAllLocked(absl::Span<const int64_t> ids, const float* grads, float scale) {
  // Slots first: creating a row may move the arrays.
  std::vector<int64_t> slots(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) slots[i] = SlotLocked(ids[i]);
  ApplySlotsLocked(slots, grads, scale);
}

void SparseTable::ApplySlotsLocked(absl::Span<const int64_t> slots, const float* grads,
                                   float scale) {
  const absl::Time start = absl::Now();
  constexpr size_t kAhead = 4;  // Rows fetched ahead of the one updated.
  const size_t d = spec_.dim;
  for (size_t i = 0; i < slots.size(); ++i) {
    if (i + kAhead < slots.size()) {
      PrefetchRow<1>(rows_.w.data() + slots[i + kAhead] * d, d);
      if (!rows_.a.empty()) PrefetchRow<1>(rows_.a.data() + slots[i + kAhead] * d, d);
      if (!rows_.b.empty()) PrefetchRow<1>(rows_.b.data() + slots[i + kAhead] * d, d);
    }
    ApplyLocked(slots[i], grads + i * d, scale);
  }
  apply_time_ += absl::Now() - start;
  rows_applied_ += static_cast<int64_t>(slots.size());
}

void SparseTable::StartApplyLocked() {
  const size_t held = static_cast<size_t>(rows_.slot.size());
  if (mean_at_.size() < held) mean_at_.resize(held, -1);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  apply_parts_ = std::min(options_.num_workers, cores);
  next_part_ = 0;
  parts_done_ = 0;
  if (part_slots_.size() < static_cast<size_t>(apply_parts_)) {
    part_slots_.resize(apply_parts_);
    part_sums_.resize(apply_parts_);
    part_single_.resize(apply_parts_);
    part_sum_at_.resize(apply_parts_);
  }
  applying_ = true;
}

void SparseTable::HelpApplyLocked() {
  while (applying_ && next_part_ < apply_parts_) {
    const int part = next_part_++;
    const absl::Time start = absl::Now();
    mu_.Unlock();
    ApplyMeanPart(part);
    mu_.Lock();
    apply_time_ += absl::Now() - start;
    rows_applied_ += static_cast<int64_t>(part_slots_[part].size());
    if (++parts_done_ < apply_parts_) continue;
    for (int r = 0; r < options_.num_workers; ++r) {
      pending_slots_[r].clear();
      pending_grads_[r] = nullptr;
      pending_owned_[r].clear();
    }
    applying_ = false;
    pushed_.assign(options_.num_workers, false);
    arrived_ = 0;
    ++step_;
  }
}

void SparseTable::ApplyMeanPart(int part) {
  // The mean of the workers' gradients of this part's rows, each row's summed in rank order.
  // A row's place in the sums is found through its slot (mean_at_), not a hash of its id.
  const size_t d = spec_.dim;
  const int64_t parts = apply_parts_;  // Constant while applying.
  constexpr int kBlockShift = 6;       // Blocks of 64 slots: no cache line shared by parts.
  std::vector<int64_t>& order = part_slots_[part];
  std::vector<float>& sums = part_sums_[part];
  std::vector<const float*>& single = part_single_[part];
  std::vector<int64_t>& sum_at = part_sum_at_[part];
  order.clear();
  single.clear();
  sum_at.clear();
  // Each row of the part once, in the order first pushed, with its first push's gradient; a
  // row pushed again gets a sum (most rows of a large table are pushed by one rank a step:
  // they are applied from that push, no sum written and read back).
  int64_t summed = 0;
  for (int r = 0; r < options_.num_workers; ++r) {
    const std::vector<int64_t>& slots = pending_slots_[r];
    const float* g = pending_grads_[r];
    for (size_t i = 0; i < slots.size(); ++i) {
      if ((slots[i] >> kBlockShift) % parts != part) continue;
      int64_t& at = mean_at_[slots[i]];
      if (at < 0) {
        at = static_cast<int64_t>(order.size());
        order.push_back(slots[i]);
        single.push_back(g + i * d);
        sum_at.push_back(-1);
        continue;
      }
      float* sum;
      if (sum_at[at] < 0) {  // The second push of the row: its sum starts from the first.
        sum_at[at] = summed++;
        if (sums.size() < static_cast<size_t>(summed) * d) {
          sums.resize(std::max(2 * sums.size(), static_cast<size_t>(summed) * d));
        }
        sum = sums.data() + sum_at[at] * d;
        // 0 + g, as a sum from zero gives (-0 becomes +0): the serial apply's bits.
        for (size_t k = 0; k < d; ++k) sum[k] = 0.0f + single[at][k];
        single[at] = nullptr;
      } else {
        sum = sums.data() + sum_at[at] * d;
      }
      for (size_t k = 0; k < d; ++k) sum[k] += g[i * d + k];
    }
  }
  for (int64_t slot : order) mean_at_[slot] = -1;
  // The rows of this part, fetched a few ahead (ApplySlotsLocked's loop, without the lock:
  // this thread owns them while applying_).
  constexpr size_t kAhead = 4;
  const float scale = 1.0f / static_cast<float>(options_.num_workers);
  for (size_t i = 0; i < order.size(); ++i) {
    if (i + kAhead < order.size()) {
      PrefetchRow<1>(rows_.w.data() + order[i + kAhead] * d, d);
      if (!rows_.a.empty()) PrefetchRow<1>(rows_.a.data() + order[i + kAhead] * d, d);
      if (!rows_.b.empty()) PrefetchRow<1>(rows_.b.data() + order[i + kAhead] * d, d);
    }
    if (single[i] != nullptr) {
      ApplyLocked(order[i], single[i], scale, /*from_zero=*/true);
    } else {
      ApplyLocked(order[i], sums.data() + sum_at[i] * d, scale);
    }
  }
}

absl::Status SparseTable::PushNowLocked(int rank, int64_t step, absl::Span<const int64_t> ids,
                                        absl::Span<const float> grads, absl::Time deadline) {
  ApplyAllLocked(ids, grads.data(), 1.0f / static_cast<float>(options_.num_workers));
  ++step_;  // Pushes applied.
  newest_[rank] = std::max(newest_[rank], step);
  if (options_.staleness < 0) return absl::OkStatus();  // Async.
  const int64_t restores = restores_;
  auto caught_up = [this, step, restores]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return restores_ != restores || stopping_ ||
           *std::min_element(newest_.begin(), newest_.end()) >= step - options_.staleness;
  };
  const bool caught = mu_.AwaitWithDeadline(absl::Condition(&caught_up), deadline);
  if (stopping_) return StoppingError();
  if (!caught) {
    std::vector<int> slow;
    for (int r = 0; r < options_.num_workers; ++r) {
      if (newest_[r] < step - options_.staleness) slow.push_back(r);
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "sparse table '", spec_.name, "': step ", step, " (staleness ", options_.staleness,
        ") timed out waiting for rank(s) ", absl::StrJoin(slow, ",")));
  }
  return absl::OkStatus();
}

absl::Status SparseTable::StoppingError() const {
  return absl::UnavailableError(
      absl::StrCat("sparse table '", spec_.name, "': the shard is shutting down"));
}

void SparseTable::Shutdown() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
}

absl::Status SparseTable::Push(int rank, int64_t step, absl::Span<const int64_t> ids,
                               absl::Span<const float> grads, absl::Time deadline) {
  if (rank < 0 || rank >= options_.num_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is not in [0, ", options_.num_workers, ")"));
  }
  if (grads.size() != ids.size() * spec_.dim) {
    return absl::InvalidArgumentError(absl::StrCat("sparse table '", spec_.name,
                                                   "': ", grads.size(), " gradient values for ",
                                                   ids.size(), " rows of ", spec_.dim));
  }
  if (auto s = CheckIds(ids); !s.ok()) return s;
  // The rows' slots under a reader lock when all are held (pushes look up at once); they stay
  // valid while the table is not restored (rows are only ever appended).
  std::vector<int64_t> slots;
  int64_t slots_restores = -1;
  if (options_.bsp) {
    {  // The same ids as this rank's last pull (the usual step): its lookups.
      absl::MutexLock cache(&last_pull_mu_);
      LastPull& last = last_pull_[rank];
      if (last.ids.size() == ids.size() && std::equal(ids.begin(), ids.end(), last.ids.begin())) {
        slots = std::move(last.slots);
        slots_restores = last.restores;
        last.ids.clear();
      }
    }
    if (slots_restores < 0) {
      absl::ReaderMutexLock lock(&mu_);
      if (HeldSlotsLocked(ids, slots)) slots_restores = restores_;
    }
  }
  absl::MutexLock lock(&mu_, absl::Condition(this, &SparseTable::NotApplying));
  if (stopping_) return StoppingError();  // Nothing registered, nothing applied.
  if (!options_.bsp) return PushNowLocked(rank, step, ids, grads, deadline);
  if (step == step_ - 1) return absl::OkStatus();  // A retry of a step already applied.
  if (step != step_) {
    return absl::OutOfRangeError(absl::StrCat("sparse table '", spec_.name, "': step ", step,
                                              " is not the current step ", step_));
  }
  if (!pushed_[rank]) {
    pushed_[rank] = true;
    if (slots_restores != restores_) {
      slots.resize(ids.size());
      for (size_t i = 0; i < ids.size(); ++i) slots[i] = SlotLocked(ids[i]);
    }
    if (options_.num_workers == 1) {
      ApplySlotsLocked(slots, grads.data(), 1.0f);  // The mean of one: the gradient itself.
    } else {
      pending_slots_[rank] = std::move(slots);
      pending_grads_[rank] = grads.data();  // Read in place until this call stops waiting.
    }
    if (++arrived_ == options_.num_workers) {
      if (options_.num_workers > 1) {
        StartApplyLocked();
      } else {
        pushed_.assign(options_.num_workers, false);
        arrived_ = 0;
        ++step_;
      }
    }
  }
  const int64_t restores = restores_;
  // Wait for the step, helping with its apply when there is a part left to take.
  auto applied_or_work = [this, step, restores]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return step_ > step || restores_ != restores || stopping_ ||
           (applying_ && step_ == step && next_part_ < apply_parts_);
  };
  bool done = false;
  while (true) {
    done = mu_.AwaitWithDeadline(absl::Condition(&applied_or_work), deadline);
    if (step_ == step) HelpApplyLocked();  // Not a later step's: this call is done with.
    if (!done || step_ > step || restores_ != restores || stopping_) break;
  }
  // Never leave while a part of this step may still read this call's gradients in place.
  if (step_ == step) mu_.Await(absl::Condition(this, &SparseTable::NotApplying));
  done = step_ > step || restores_ != restores || stopping_;
  if (pushed_[rank] && pending_grads_[rank] == grads.data() && !grads.empty()) {
    // Leaving before the step was applied: the gradients stay pending, in the table's copy.
    pending_owned_[rank].assign(grads.begin(), grads.end());
    pending_grads_[rank] = pending_owned_[rank].data();
  }
  if (stopping_ && step_ <= step) return StoppingError();
  if (restores_ != restores) {
    return absl::AbortedError(absl::StrCat("sparse table '", spec_.name, "': went back to step ",
                                           step_, " while step ", step, " waited"));
  }
  if (!done) {
    std::vector<int> missing;
    for (int r = 0; r < options_.num_workers; ++r) {
      if (!pushed_[r]) missing.push_back(r);
    }
    return absl::DeadlineExceededError(absl::StrCat("sparse table '", spec_.name, "': step ", step,
                                                    " timed out waiting for rank(s) ",
                                                    absl::StrJoin(missing, ",")));
  }
  return absl::OkStatus();
}

}  // namespace dptrain
