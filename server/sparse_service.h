// gRPC adapter of the row-sparse embedding tables (proto/ps.proto, SparseTables) of one
// shard: decodes, calls the SparseTable, encodes. Tables are declared by the workers.
// With the shard's checkpoint directory (ParameterShardOptions::checkpoints), every table is
// checkpointed under BSP when its step reaches a multiple of `every` (by the thread of rank
// 0's push, after the step was applied; sparse_checkpoint.h), and a shard that starts
// restores every table it finds there at its newest valid checkpoint.
#ifndef DPTRAIN_SERVER_SPARSE_SERVICE_H_
#define DPTRAIN_SERVER_SPARSE_SERVICE_H_

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/synchronization/mutex.h"
#include "common/file_system.h"
#include "common/metrics.h"
#include "proto/ps.grpc.pb.h"
#include "server/parameter_shard.h"
#include "server/sparse_checkpoint.h"
#include "server/sparse_table.h"

namespace dptrain {

class SparseService final : public proto::SparseTables::Service {
 public:
  // The shard's options say which shard this is, of how many, for how many workers, its
  // policy (BSP; SSP is refused at Declare, async applies each push), the step timeout and
  // the checkpoints. Restores the tables of the checkpoint directory (an invalid file is
  // skipped with a log line; an unreadable directory is the error). `metrics` (may be null;
  // must outlive the service) gets the dptrain_ps_sparse_* series.
  static absl::StatusOr<std::unique_ptr<SparseService>> Create(const ParameterShardOptions& shard,
                                                               MetricsRegistry* metrics = nullptr);

  grpc::Status Declare(grpc::ServerContext* context, const proto::SparseDeclareRequest* request,
                       proto::SparseDeclareResponse* response) override;
  grpc::Status Pull(grpc::ServerContext* context, const proto::SparsePullRequest* request,
                    proto::SparsePullResponse* response) override;
  grpc::Status Push(grpc::ServerContext* context, const proto::SparsePushRequest* request,
                    proto::SparsePushResponse* response) override;
  grpc::Status Rollback(grpc::ServerContext* context, const proto::SparseRollbackRequest* request,
                        proto::SparseRollbackResponse* response) override;
  grpc::Status Status(grpc::ServerContext* context, const proto::SparseStatusRequest* request,
                      proto::SparseStatusResponse* response) override;

  // The row path, shared by Pull and Push above and the raw frames (sparse_rows_methods.h).
  // Pull: once the table is found, `out_for(values)` says where its ids.size() x dim values
  // go.
  absl::Status PullRows(const proto::Caller& caller, const std::string& table,
                        absl::Span<const int64_t> ids,
                        const std::function<absl::Span<float>(size_t values)>& out_for);
  // Push: waits (BSP, SSP) until `deadline` at most.
  absl::Status PushRows(const proto::Caller& caller, const std::string& table, int64_t step,
                        absl::Span<const int64_t> ids, absl::Span<const float> grads,
                        absl::Time deadline);
  // A push's deadline: the call's, or the shard's step timeout if that comes first.
  absl::Time PushDeadline(absl::Time call_deadline) const {
    return std::min(call_deadline, absl::Now() + shard_.step_timeout);
  }
  // Ends the waits of pushes now and later (Unavailable): the server is stopping.
  void Shutdown();

  // Rows held over all tables (for status and tests).
  int64_t rows_held() const;
  // Rows pulled and pushed, over all tables and workers.
  int64_t rows_pulled() const { return rows_pulled_.load(); }
  int64_t rows_pushed() const { return rows_pushed_.load(); }

 private:
  struct Table {
    std::unique_ptr<SparseTable> table;
    std::atomic<int64_t> rows_pulled{0}, rows_pushed{0}, checkpoints_written{0};
  };
  explicit SparseService(const ParameterShardOptions& shard);
  absl::Status RestoreAll();
  std::unique_ptr<Table> NewTable(const SparseTableSpec& spec) const;
  // The table `name` of job `job_id`, or NotFound / FailedPrecondition saying why not.
  absl::StatusOr<Table*> Find(const std::string& job_id, const std::string& name);
  // Writes `table`'s checkpoint of `step` if it is due and the table is there (rank 0's push
  // of step - 1 returned); a failure is logged and counted, training goes on.
  void MaybeCheckpoint(Table& table, int64_t step);

  const ParameterShardOptions shard_;
  std::unique_ptr<FileSystem> own_fs_;
  std::optional<SparseCheckpointDir> checkpoints_;  // With a checkpoint directory.
  absl::Mutex write_mu_;                            // One checkpoint write at a time.
  std::atomic<int64_t> rows_pulled_{0}, rows_pushed_{0}, checkpoint_failures_{0};
  Histogram* apply_seconds_ = nullptr;  // Of a push (BSP: its wait included).
  mutable absl::Mutex mu_;
  std::string job_id_ ABSL_GUARDED_BY(mu_);  // Of the first declaration (or the checkpoints).
  std::map<std::string, std::unique_ptr<Table>> tables_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace dptrain

#endif  // DPTRAIN_SERVER_SPARSE_SERVICE_H_
