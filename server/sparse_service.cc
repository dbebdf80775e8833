#include "server/sparse_service.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace dptrain {
namespace {

SparseTableSpec FromProto(const proto::SparseTableSpec& p) {
  SparseTableSpec s;
  s.name = p.name();
  s.rows = p.rows();
  s.dim = p.dim();
  s.optimizer = p.optimizer();
  s.lr = p.lr();
  s.eps = p.eps();
  s.beta1 = p.beta1();
  s.beta2 = p.beta2();
  s.seed = p.seed();
  return s;
}

absl::Time Deadline(const grpc::ServerContext& context, absl::Duration step_timeout) {
  return std::min(absl::Now() + step_timeout, absl::FromChrono(context.deadline()));
}

}  // namespace

SparseService::SparseService(const ParameterShardOptions& shard, MetricsRegistry* metrics)
    : shard_(shard) {
  if (metrics == nullptr) return;
  metrics->AddCounterFunction("dptrain_ps_sparse_rows_pulled_total",
                              "Rows of sparse tables this shard served (all tables, workers).",
                              [this] { return static_cast<double>(rows_pulled()); });
  metrics->AddCounterFunction("dptrain_ps_sparse_rows_pushed_total",
                              "Row gradients of sparse tables this shard received.",
                              [this] { return static_cast<double>(rows_pushed()); });
  metrics->AddGaugeFunction("dptrain_ps_sparse_rows_held",
                            "Rows of sparse tables this shard holds (created on first touch).",
                            [this] { return static_cast<double>(rows_held()); });
  apply_seconds_ = &metrics
                        ->AddHistogram("dptrain_ps_sparse_push_seconds",
                                       "A sparse push from its arrival to its answer (BSP: the "
                                       "wait for the other workers and the per-row updates).",
                                       {1e-4, 1e-3, 1e-2, 0.1, 1, 10})
                        .Get();
}

grpc::Status SparseService::Declare(grpc::ServerContext*,
                                    const proto::SparseDeclareRequest* request,
                                    proto::SparseDeclareResponse* response) {
  const SparseTableSpec spec = FromProto(request->table());
  if (auto s = ValidateSparseTableSpec(spec); !s.ok()) return ToGrpcStatus(s);
  if (shard_.policy == SyncPolicy::kSsp) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        "sparse tables under --sync=ssp are not implemented (bsp or async)");
  }
  absl::MutexLock lock(&mu_);
  if (tables_.empty() && job_id_.empty()) job_id_ = request->caller().job_id();
  if (request->caller().job_id() != job_id_) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("sparse table '", spec.name, "': job '", request->caller().job_id(),
                     "' is not this shard's job '", job_id_, "'"));
  }
  auto it = tables_.find(spec.name);
  if (it == tables_.end()) {
    SparseTableOptions options;
    options.shard = shard_.shard;
    options.num_shards = shard_.num_shards;
    options.num_workers = shard_.num_workers;
    options.bsp = shard_.policy == SyncPolicy::kBsp;
    it = tables_.emplace(spec.name, std::make_unique<SparseTable>(spec, options)).first;
  } else if (DescribeSparseTable(it->second->spec()) != DescribeSparseTable(spec)) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("sparse table '", spec.name, "' is declared as ",
                     DescribeSparseTable(it->second->spec()), " here; rank ",
                     request->caller().rank(), " declares ", DescribeSparseTable(spec)));
  }
  response->set_step(it->second->step());
  return grpc::Status::OK;
}

absl::StatusOr<SparseTable*> SparseService::Find(const std::string& job_id,
                                                 const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = tables_.find(name);
  if (it == tables_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no sparse table '", name, "' on this shard (declare it first)"));
  }
  if (job_id != job_id_) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", job_id, "' is not this shard's job '", job_id_, "'"));
  }
  return it->second.get();
}

grpc::Status SparseService::Pull(grpc::ServerContext*, const proto::SparsePullRequest* request,
                                 proto::SparsePullResponse* response) {
  auto table = Find(request->caller().job_id(), request->table());
  if (!table.ok()) return ToGrpcStatus(table.status());
  const int dim = (*table)->spec().dim;
  rows_pulled_ += request->ids_size();
  std::string* rows = response->mutable_rows();
  rows->resize(static_cast<size_t>(request->ids_size()) * dim * sizeof(float));
  return ToGrpcStatus((*table)->Pull(
      request->ids(), absl::MakeSpan(reinterpret_cast<float*>(rows->data()),
                                     static_cast<size_t>(request->ids_size()) * dim)));
}

grpc::Status SparseService::Push(grpc::ServerContext* context,
                                 const proto::SparsePushRequest* request,
                                 proto::SparsePushResponse*) {
  auto table = Find(request->caller().job_id(), request->table());
  if (!table.ok()) return ToGrpcStatus(table.status());
  const std::string& grads = request->grads();
  if (grads.size() % sizeof(float) != 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "sparse push: grads are not a whole number of fp32");
  }
  const absl::Time start = absl::Now();
  rows_pushed_ += request->ids_size();
  // The bytes of a protobuf string carry no alignment promise: copy them.
  std::vector<float> values(grads.size() / sizeof(float));
  if (!grads.empty()) std::memcpy(values.data(), grads.data(), grads.size());
  const absl::Status pushed =
      (*table)->Push(request->caller().rank(), request->step(), request->ids(), values,
                     Deadline(*context, shard_.step_timeout));
  if (apply_seconds_ != nullptr) apply_seconds_->ObserveDuration(absl::Now() - start);
  return ToGrpcStatus(pushed);
}

int64_t SparseService::rows_held() const {
  absl::MutexLock lock(&mu_);
  int64_t total = 0;
  for (const auto& [name, table] : tables_) total += table->rows_held();
  return total;
}

}  // namespace dptrain
