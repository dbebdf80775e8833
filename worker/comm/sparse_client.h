// The worker's side of the row-sparse embedding tables (proto/ps.proto, SparseTables): rows
// are split over the shards by row id (common/sparse_rows.h), so a pull or push of some ids
// is one call to each shard that owns any of them (a push goes to every shard: each counts
// every worker's push of a step), all shards at once.
#ifndef DPTRAIN_WORKER_COMM_SPARSE_CLIENT_H_
#define DPTRAIN_WORKER_COMM_SPARSE_CLIENT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/credentials.h"
#include "proto/ps.grpc.pb.h"

namespace dptrain {

struct SparseClientOptions {
  std::vector<std::string> shard_addresses;  // In shard order.
  std::string job_id = "dptrain";
  int rank = 0;
  std::shared_ptr<const Credentials> credentials = Credentials::Plaintext();
  absl::Duration rpc_timeout = absl::Seconds(90);  // Per call (longer than a BSP step's wait).
};

class SparseClient {
 public:
  // InvalidArgument without shards. Channels connect on first use.
  static absl::StatusOr<std::unique_ptr<SparseClient>> Create(const SparseClientOptions& o);

  // Declares `table` on every shard; returns its next step (the same on every shard, else
  // FailedPrecondition). A shard's refusal (another declaration, SSP) comes back naming it.
  absl::StatusOr<int64_t> Declare(const proto::SparseTableSpec& table);
  // The rows `ids` (any order, duplicates allowed) of `table` (of `dim` values each) into
  // `out` (ids.size() x dim).
  absl::Status Pull(const std::string& table, int dim, absl::Span<const int64_t> ids,
                    absl::Span<float> out);
  // This worker's gradients of rows `ids` (unique) for `step`; under BSP returns once the
  // step was applied on every shard.
  absl::Status Push(const std::string& table, int dim, int64_t step, absl::Span<const int64_t> ids,
                    absl::Span<const float> grads);

 private:
  explicit SparseClient(const SparseClientOptions& o) : options_(o) {}
  // Runs call(s) for every shard s with work[s] at once; the first error by shard order,
  // prefixed with `what`, the shard and its address.
  absl::Status ForShards(const std::vector<bool>& work, const std::string& what,
                         const std::function<grpc::Status(int, grpc::ClientContext&)>& call);

  const SparseClientOptions options_;
  std::vector<std::unique_ptr<proto::SparseTables::Stub>> stubs_;
};

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_COMM_SPARSE_CLIENT_H_
