#include "server/sparse_table.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>

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
      pending_ids_(options.num_workers),
      pending_grads_(options.num_workers),
      pushed_(options.num_workers, false) {}

int64_t SparseTable::step() const {
  absl::MutexLock lock(&mu_);
  return step_;
}

int64_t SparseTable::rows_held() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(rows_.size());
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
  absl::MutexLock lock(&mu_);
  if (step != step_) return std::nullopt;
  SparseTableCheckpoint cp;
  cp.shard = options_.shard;
  cp.num_shards = options_.num_shards;
  cp.step = step_;
  cp.spec = spec_;
  cp.ids.reserve(rows_.size());
  for (const auto& [id, row] : rows_) cp.ids.push_back(id);
  std::sort(cp.ids.begin(), cp.ids.end());
  const size_t d = spec_.dim, n = cp.ids.size();
  const bool adagrad = spec_.optimizer == "adagrad", adam = spec_.optimizer == "adam";
  cp.weights.resize(n * d);
  if (adagrad || adam) cp.state_a.assign(n * d, 0.0f);
  if (adam) cp.state_b.assign(n * d, 0.0f), cp.state_steps.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const Row& row = rows_.at(cp.ids[i]);
    std::copy(row.w.begin(), row.w.end(), cp.weights.begin() + i * d);
    // A row only pulled has no state yet: zeros, what its first update starts from.
    if (!row.a.empty()) std::copy(row.a.begin(), row.a.end(), cp.state_a.begin() + i * d);
    if (!row.b.empty()) std::copy(row.b.begin(), row.b.end(), cp.state_b.begin() + i * d);
    if (adam) cp.state_steps[i] = row.t;
  }
  return cp;
}

absl::Status SparseTable::Restore(const SparseTableCheckpoint* cp) {
  if (cp != nullptr && DescribeSparseTable(cp->spec) != DescribeSparseTable(spec_)) {
    return absl::FailedPreconditionError(
        absl::StrCat("sparse table '", spec_.name, "' is ", DescribeSparseTable(spec_),
                     "; its checkpoint holds ", DescribeSparseTable(cp->spec)));
  }
  std::unordered_map<int64_t, Row> rows;
  if (cp != nullptr) {
    const size_t d = spec_.dim;
    rows.reserve(cp->ids.size());
    for (size_t i = 0; i < cp->ids.size(); ++i) {
      Row& row = rows[cp->ids[i]];
      row.w.assign(cp->weights.begin() + i * d, cp->weights.begin() + (i + 1) * d);
      if (!cp->state_a.empty()) {
        row.a.assign(cp->state_a.begin() + i * d, cp->state_a.begin() + (i + 1) * d);
      }
      if (!cp->state_b.empty()) {
        row.b.assign(cp->state_b.begin() + i * d, cp->state_b.begin() + (i + 1) * d);
      }
      if (!cp->state_steps.empty()) row.t = cp->state_steps[i];
    }
  }
  absl::MutexLock lock(&mu_);
  rows_ = std::move(rows);
  step_ = cp != nullptr ? cp->step : 0;
  for (int r = 0; r < options_.num_workers; ++r) {
    pending_ids_[r].clear();
    pending_grads_[r].clear();
  }
  pushed_.assign(options_.num_workers, false);
  arrived_ = 0;
  ++restores_;
  return absl::OkStatus();
}

SparseTable::Row& SparseTable::RowLocked(int64_t id) {
  auto [it, created] = rows_.try_emplace(id);
  if (created) {
    it->second.w.resize(spec_.dim);
    InitialRow(spec_.seed, spec_.name, id, absl::MakeSpan(it->second.w));
  }
  return it->second;
}

absl::Status SparseTable::Pull(absl::Span<const int64_t> ids, absl::Span<float> out) {
  if (out.size() != ids.size() * spec_.dim) {
    return absl::InvalidArgumentError("sparse pull: the output does not hold ids x dim values");
  }
  if (auto s = CheckIds(ids); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < ids.size(); ++i) {
    const Row& row = RowLocked(ids[i]);
    std::copy(row.w.begin(), row.w.end(), out.begin() + i * spec_.dim);
  }
  return absl::OkStatus();
}

void SparseTable::ApplyLocked(int64_t id, const float* g, float scale) {
  Row& row = RowLocked(id);
  const int d = spec_.dim;
  const float lr = spec_.lr;
  if (spec_.optimizer == "sgd") {
    for (int i = 0; i < d; ++i) row.w[i] -= lr * (g[i] * scale);
    return;
  }
  if (spec_.optimizer == "adagrad") {
    if (row.a.empty()) row.a.assign(d, 0.0f);
    const float eps = static_cast<float>(spec_.eps);
    for (int i = 0; i < d; ++i) {
      const float gi = g[i] * scale;
      row.a[i] += gi * gi;
      row.w[i] -= lr * (gi / (std::sqrt(row.a[i]) + eps));  // torch's addcdiv order.
    }
    return;
  }
  // Lazy Adam: this row's own step count.
  if (row.a.empty()) row.a.assign(d, 0.0f), row.b.assign(d, 0.0f);
  ++row.t;
  const double c1 = 1.0 - std::pow(spec_.beta1, static_cast<double>(row.t));
  const double c2 = 1.0 - std::pow(spec_.beta2, static_cast<double>(row.t));
  const float b1 = static_cast<float>(spec_.beta1), b2 = static_cast<float>(spec_.beta2);
  const float step_size = static_cast<float>(lr / c1);
  const float c2_sqrt = static_cast<float>(std::sqrt(c2)), eps = static_cast<float>(spec_.eps);
  for (int i = 0; i < d; ++i) {
    const float gi = g[i] * scale;
    row.a[i] = b1 * row.a[i] + (1.0f - b1) * gi;
    row.b[i] = b2 * row.b[i] + (1.0f - b2) * (gi * gi);
    row.w[i] -= step_size * (row.a[i] / (std::sqrt(row.b[i]) / c2_sqrt + eps));
  }
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
  absl::MutexLock lock(&mu_);
  if (!options_.bsp) {
    const absl::Time start = absl::Now();
    for (size_t i = 0; i < ids.size(); ++i) ApplyLocked(ids[i], &grads[i * spec_.dim], 1.0f);
    apply_time_ += absl::Now() - start;
    rows_applied_ += static_cast<int64_t>(ids.size());
    ++step_;
    return absl::OkStatus();
  }
  if (step == step_ - 1) return absl::OkStatus();  // A retry of a step already applied.
  if (step != step_) {
    return absl::OutOfRangeError(absl::StrCat("sparse table '", spec_.name, "': step ", step,
                                              " is not the current step ", step_));
  }
  if (!pushed_[rank]) {
    pushed_[rank] = true;
    pending_ids_[rank].assign(ids.begin(), ids.end());
    pending_grads_[rank].assign(grads.begin(), grads.end());
    if (++arrived_ == options_.num_workers) {
      // The mean of the workers' gradients, summed in rank order, applied in row order.
      std::map<int64_t, std::vector<float>> sums;
      for (int r = 0; r < options_.num_workers; ++r) {
        for (size_t i = 0; i < pending_ids_[r].size(); ++i) {
          std::vector<float>& sum = sums[pending_ids_[r][i]];
          if (sum.empty()) sum.assign(spec_.dim, 0.0f);
          for (int k = 0; k < spec_.dim; ++k) sum[k] += pending_grads_[r][i * spec_.dim + k];
        }
        pending_ids_[r].clear();
        pending_grads_[r].clear();
      }
      const float scale = 1.0f / static_cast<float>(options_.num_workers);
      const absl::Time start = absl::Now();
      for (const auto& [id, sum] : sums) ApplyLocked(id, sum.data(), scale);
      apply_time_ += absl::Now() - start;
      rows_applied_ += static_cast<int64_t>(sums.size());
      pushed_.assign(options_.num_workers, false);
      arrived_ = 0;
      ++step_;
    }
  }
  const int64_t restores = restores_;
  auto applied = [this, step, restores]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return step_ > step || restores_ != restores;
  };
  const bool done = mu_.AwaitWithDeadline(absl::Condition(&applied), deadline);
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
