// The worker's side of the row-sparse embedding tables (proto/ps.proto, SparseTables): rows
// are split over the shards by row id (common/sparse_rows.h), so a pull or push of some ids
// is one call to each shard that owns any of them (a push goes to every shard: each counts
// every worker's push of a step), all shards at once. Rows and gradients travel as raw
// frames (proto/ps.proto, SparseRows): one copy on each side, no protobuf in their way.
#ifndef DPTRAIN_WORKER_COMM_SPARSE_CLIENT_H_
#define DPTRAIN_WORKER_COMM_SPARSE_CLIENT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/credentials.h"
#include "grpcpp/generic/generic_stub.h"
#include "proto/ps.grpc.pb.h"

namespace dptrain {

struct SparseClientOptions {
  std::vector<std::string> shard_addresses;  // In shard order.
  std::string job_id = "dptrain";
  int rank = 0;
  std::shared_ptr<const Credentials> credentials = Credentials::Plaintext();
  absl::Duration rpc_timeout = absl::Seconds(90);  // Per call (longer than a BSP step's wait).
  // A call that finds its shard away (UNAVAILABLE: a shard restarting) is retried with
  // backoff (50 ms doubling to 1 s) for this long; zero: not retried.
  absl::Duration reconnect_timeout = absl::Seconds(60);
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
  // step was applied on every shard. A shard that went back (restarted from an older
  // checkpoint) answers OutOfRange (it is behind) or Aborted (it went back while the push
  // waited): Steps() and Rollback() recover.
  absl::Status Push(const std::string& table, int dim, int64_t step, absl::Span<const int64_t> ids,
                    absl::Span<const float> grads);
  // The table's next step on every shard, in shard order; FailedPrecondition naming a shard
  // that does not hold it (restarted without a checkpoint of it).
  absl::StatusOr<std::vector<int64_t>> Steps(const std::string& table);
  // Every shard's table back to `step` (proto/ps.proto, SparseRollbackRequest).
  absl::Status Rollback(const std::string& table, int64_t step);

 private:
  explicit SparseClient(const SparseClientOptions& o) : options_(o) {}
  // Runs call(s) for every shard s with work[s] at once; the first error by shard order,
  // prefixed with `what`, the shard and its address.
  absl::Status ForShards(const std::vector<bool>& work, const std::string& what,
                         const std::function<grpc::Status(int, grpc::ClientContext&)>& call);

  // One unary call of the sparse rows' raw frames (proto/ps.proto, SparseRows), waited for.
  grpc::Status RawCall(int shard, grpc::ClientContext& context, const char* method,
                       const grpc::ByteBuffer& request, grpc::ByteBuffer* response);
  proto::SparseFrameHeader Header(const std::string& table) const;

  const SparseClientOptions options_;
  std::vector<std::unique_ptr<proto::SparseTables::Stub>> stubs_;
  // The same channels: Pull and Push as raw frames.
  std::vector<std::unique_ptr<grpc::GenericStub>> raw_stubs_;
};

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_COMM_SPARSE_CLIENT_H_
