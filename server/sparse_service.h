// gRPC adapter of the row-sparse embedding tables (proto/ps.proto, SparseTables) of one
// shard: decodes, calls the SparseTable, encodes. Tables are declared by the workers.
#ifndef DPTRAIN_SERVER_SPARSE_SERVICE_H_
#define DPTRAIN_SERVER_SPARSE_SERVICE_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "proto/ps.grpc.pb.h"
#include "server/parameter_shard.h"
#include "server/sparse_table.h"

namespace dptrain {

class SparseService final : public proto::SparseTables::Service {
 public:
  // The shard's options say which shard this is, of how many, for how many workers, its
  // policy (BSP; SSP is refused at Declare, async applies each push) and the step timeout.
  // `metrics` (may be null; must outlive the service) gets the dptrain_ps_sparse_* series.
  explicit SparseService(const ParameterShardOptions& shard, MetricsRegistry* metrics = nullptr);

  grpc::Status Declare(grpc::ServerContext* context, const proto::SparseDeclareRequest* request,
                       proto::SparseDeclareResponse* response) override;
  grpc::Status Pull(grpc::ServerContext* context, const proto::SparsePullRequest* request,
                    proto::SparsePullResponse* response) override;
  grpc::Status Push(grpc::ServerContext* context, const proto::SparsePushRequest* request,
                    proto::SparsePushResponse* response) override;

  // Rows held over all tables (for status and tests).
  int64_t rows_held() const;
  // Rows pulled and pushed, over all tables and workers.
  int64_t rows_pulled() const { return rows_pulled_.load(); }
  int64_t rows_pushed() const { return rows_pushed_.load(); }

 private:
  // The table `name` of job `job_id`, or NotFound / FailedPrecondition saying why not.
  absl::StatusOr<SparseTable*> Find(const std::string& job_id, const std::string& name);

  const ParameterShardOptions shard_;
  std::atomic<int64_t> rows_pulled_{0}, rows_pushed_{0};
  Histogram* apply_seconds_ = nullptr;  // Of a push (BSP: its wait included).
  mutable absl::Mutex mu_;
  std::string job_id_ ABSL_GUARDED_BY(mu_);  // Of the first declaration.
  std::map<std::string, std::unique_ptr<SparseTable>> tables_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dptrain

#endif  // DPTRAIN_SERVER_SPARSE_SERVICE_H_
