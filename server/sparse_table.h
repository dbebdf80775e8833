// One row-sparse embedding table's rows on one parameter-server shard: the rows this shard
// owns (common/sparse_rows.h: row mod num_shards), created on first touch from the table's
// seed, with their optimizer state, so that a table may be far larger than any worker and is
// never sent whole. Workers pull the rows of their batch's unique ids and push only those
// rows' gradients; the table applies its optimizer per row:
//   sgd      w -= lr * g
//   adagrad  s += g * g;  w -= lr * g / (sqrt(s) + eps)          (torch.optim.Adagrad's)
//   adam     lazy Adam with per-row step counts t: m, v and the bias corrections move
//            only when the row is touched
// where g is the mean of the workers' gradients of the step (BSP) or one worker's (async).
// Plain C++, thread-safe; no network.
#ifndef DPTRAIN_SERVER_SPARSE_TABLE_H_
#define DPTRAIN_SERVER_SPARSE_TABLE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/row_index.h"

namespace dptrain {

struct SparseTableSpec {
  std::string name;
  int64_t rows = 0;  // Ids are in [0, rows).
  int dim = 0;
  std::string optimizer = "adagrad";  // sgd | adagrad | adam
  float lr = 0.01f;
  double eps = 1e-10;                 // adagrad, adam
  double beta1 = 0.9, beta2 = 0.999;  // adam
  uint64_t seed = 0;                  // Of the initial rows (common/sparse_rows.h).
};

// InvalidArgument naming the field for a spec no table can have. Names are 1 to 128 of
// [A-Za-z0-9_.-] (they are part of checkpoint file names).
absl::Status ValidateSparseTableSpec(const SparseTableSpec& spec);
// One line with every field, to compare two declarations and to print them.
std::string DescribeSparseTable(const SparseTableSpec& spec);

// What a checkpoint holds of a table on one shard (written by sparse_checkpoint.h).
struct SparseTableCheckpoint {
  std::string job_id;
  int shard = 0;
  int num_shards = 1;
  int64_t step = 0;  // The table's next step when it was taken.
  SparseTableSpec spec;
  std::vector<int64_t> ids;          // The rows held, ascending.
  std::vector<float> weights;        // ids.size() x dim.
  std::vector<float> state_a;        // adagrad's sums, adam's exp_avg; else empty.
  std::vector<float> state_b;        // adam's exp_avg_sq; else empty.
  std::vector<int64_t> state_steps;  // adam's per-row step counts; else empty.
};

struct SparseTableOptions {
  int shard = 0;
  int num_shards = 1;
  int num_workers = 1;
  // BSP: a step's rows are applied once every worker pushed it (the mean, summed in rank
  // order, so runs are bit-reproducible); otherwise each push is applied as it comes, scaled
  // by 1/num_workers (one push from every worker moves the rows as far as one BSP step), as
  // the dense shards' SSP and async policies do.
  bool bsp = true;
  // Not BSP and staleness >= 0: SSP, a push of step t waits until every worker pushed step
  // t - staleness (or the deadline); -1: async, no wait.
  int staleness = -1;
};

class SparseTable {
 public:
  // `spec` must be valid (ValidateSparseTableSpec).
  SparseTable(const SparseTableSpec& spec, const SparseTableOptions& options);

  const SparseTableSpec& spec() const { return spec_; }
  // BSP: the steps applied so far (the next push is of this step).
  int64_t step() const;
  int64_t rows_held() const;
  // Row updates applied so far and the time the optimizer took for them (per-row cost).
  int64_t rows_applied() const;
  double apply_seconds() const;

  // A copy of every row held with its optimizer state, if the table's next step is `step`
  // (what a BSP push of step - 1 that returned OK leaves; another step: nullopt). Rows in
  // ascending id order; the shard fields are the table's options'.
  std::optional<SparseTableCheckpoint> Snapshot(int64_t step) const;
  // Replaces every row and the step with `checkpoint`'s (its spec must equal this table's;
  // FailedPrecondition otherwise), or with none at step 0 when `checkpoint` is null (the
  // table's start). Pushes waiting for the old step end with Aborted.
  absl::Status Restore(const SparseTableCheckpoint* checkpoint);

  // The current values of rows `ids` (each in [0, rows) and owned by this shard), back to
  // back in `out` (ids.size() x dim). InvalidArgument naming the table and the first bad id
  // (nothing is created then).
  // `rank` (optional): the worker pulling; its push of the same ids (in the same order) then
  // reuses this pull's row lookups.
  absl::Status Pull(absl::Span<const int64_t> ids, absl::Span<float> out, int rank = -1);

  // `rank`'s gradients of rows `ids` (ids.size() x dim in `grads`) for `step`. BSP: `step`
  // must be the current step (or the one before: a retry, answered at once); returns once
  // every worker pushed it and the rows were updated, DeadlineExceeded naming the missing
  // ranks at `deadline` (later if the step's apply is already running: a call never leaves
  // while its gradients may be read), OutOfRange for another step. Async: applied at once.
  // Bad ids or sizes are InvalidArgument and change nothing; after Shutdown, Unavailable and
  // nothing is registered.
  absl::Status Push(int rank, int64_t step, absl::Span<const int64_t> ids,
                    absl::Span<const float> grads, absl::Time deadline);

  // Ends every wait of a push now and of every later one with Unavailable: the shard is
  // stopping.
  void Shutdown();

 private:
  // SSP and async: applies the push at once; SSP then waits for the slowest rank.
  absl::Status PushNowLocked(int rank, int64_t step, absl::Span<const int64_t> ids,
                             absl::Span<const float> grads, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  enum class Rule { kSgd, kAdagrad, kAdam };
  // The rows held, each in a slot of the flat arrays (dim values per slot; the state arrays
  // only for the rules that keep them), so that a step touches contiguous memory.
  struct Rows {
    RowIndex slot;               // Row id -> slot.
    std::vector<float> w, a, b;  // a: adagrad's sums or adam's m; b: adam's v.
    std::vector<int64_t> t;      // adam: each row's steps.
  };
  absl::Status CheckIds(absl::Span<const int64_t> ids) const;
  absl::Status StoppingError() const;
  // The slot of row `id`, created from the table's seed on first touch.
  int64_t SlotLocked(int64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The slots of rows `ids` if every one is held (a reader lock is enough); else false.
  bool HeldSlotsLocked(absl::Span<const int64_t> ids, std::vector<int64_t>& slots) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Copies rows `ids` to `out` (their slots to `slots`) if every one is held (a reader lock is
  // enough); false, with `out` partly written, if one is not.
  bool CopyHeldRowsLocked(absl::Span<const int64_t> ids, float* out,
                          std::vector<int64_t>& slots) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // One optimizer step on the row in `slot` with gradient `g` (dim values) times `scale`;
  // `from_zero`: the gradient as a sum from zero gives it, 0 + g (-0 becomes +0), the bits of
  // a mean of one contribution.
  void ApplyLocked(int64_t slot, const float* g, float scale, bool from_zero = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // BSP, once every rank pushed the step: the mean of their pushes is applied in parts
  // (rows by blocks of 64 slots, so that two parts never share a cache line of the per-slot
  // arrays; as many parts as workers, at most the cores), each run WITHOUT mu_ by a pushing
  // thread that claims it
  // (the step's pushers are otherwise idle), so that two cores update rows at once. While
  // applying_, nothing else reads or writes the rows: every other entry point waits for it.
  void StartApplyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Claims and runs parts while any are left (unlocking mu_ around each), finishing the step
  // after the last one. Returns with mu_ held.
  void HelpApplyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Part `part`: its rows' sums in rank order (bit-reproducible; a row one rank pushed is
  // applied from that push, with no sum), then their updates.
  void ApplyMeanPart(int part) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // No step is being applied (absl::Condition of every entry point that touches rows).
  bool NotApplying() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !applying_; }
  // Applies `ids` (unique) with their gradients (ids.size() x dim) times `scale`.
  void ApplyAllLocked(absl::Span<const int64_t> ids, const float* grads, float scale)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The same for rows already resolved to their slots.
  void ApplySlotsLocked(absl::Span<const int64_t> slots, const float* grads, float scale)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SparseTableSpec spec_;
  const SparseTableOptions options_;
  mutable absl::Mutex mu_;
  const Rule rule_;
  Rows rows_ ABSL_GUARDED_BY(mu_);
  int64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  // BSP: this step's pushes by rank: the slots of their rows (resolved, and the rows created,
  // when the push arrives) and their gradients, read in place from the pushing call's buffer
  // while it waits for the step (no copy); a call that stops waiting first copies its
  // gradients to `pending_owned_`. `arrived_` counts the pushes.
  std::vector<std::vector<int64_t>> pending_slots_ ABSL_GUARDED_BY(mu_);
  std::vector<const float*> pending_grads_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<float>> pending_owned_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> pushed_ ABSL_GUARDED_BY(mu_);
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  // The step's parallel apply: parts to run, claimed, done. While applying_, a part's
  // thread owns its rows (slot mod parts), its entries of mean_at_ and its own part_slots_,
  // part_sums_, part_single_ and part_sum_at_ (kept from step to step: no fresh pages).
  bool applying_ ABSL_GUARDED_BY(mu_) = false;
  int apply_parts_ ABSL_GUARDED_BY(mu_) = 0;
  int next_part_ ABSL_GUARDED_BY(mu_) = 0;
  int parts_done_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::vector<int64_t>> part_slots_;
  std::vector<std::vector<float>> part_sums_;
  // Per part and row of part_slots_: its gradient if one rank pushed it (else null: its sum's
  // index in part_sums_ is in part_sum_at_).
  std::vector<std::vector<const float*>> part_single_;
  std::vector<std::vector<int64_t>> part_sum_at_;
  // Each slot's place in its part's sums (-1: not in this step; reset after each step).
  std::vector<int64_t> mean_at_;
  int64_t restores_ ABSL_GUARDED_BY(mu_) = 0;  // Restore calls: ends the waits they cut off.
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Per rank, the ids and slots of its last pull of held rows (taken under the reader lock,
  // so guarded by a lock of their own) and the restores_ they were valid for.
  struct LastPull {
    std::vector<int64_t> ids, slots;
    int64_t restores = -1;
  };
  mutable absl::Mutex last_pull_mu_;
  std::vector<LastPull> last_pull_ ABSL_GUARDED_BY(last_pull_mu_);
  // SSP/async: each rank's newest pushed step (-1: none yet).
  std::vector<int64_t> newest_ ABSL_GUARDED_BY(mu_);
  int64_t rows_applied_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration apply_time_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dptrain

#endif  // DPTRAIN_SERVER_SPARSE_TABLE_H_
