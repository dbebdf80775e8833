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

void ToProto(const SparseTableSpec& s, proto::SparseTableSpec& p) {
  p.set_name(s.name);
  p.set_rows(s.rows);
  p.set_dim(s.dim);
  p.set_optimizer(s.optimizer);
  p.set_lr(s.lr);
  p.set_eps(s.eps);
  p.set_beta1(s.beta1);
  p.set_beta2(s.beta2);
  p.set_seed(s.seed);
}

}  // namespace

SparseService::SparseService(const ParameterShardOptions& shard) : shard_(shard) {}

absl::StatusOr<std::unique_ptr<SparseService>> SparseService::Create(
    const ParameterShardOptions& shard, MetricsRegistry* metrics) {
  std::unique_ptr<SparseService> service(new SparseService(shard));
  if (auto s = service->RestoreAll(); !s.ok()) return s;
  if (metrics == nullptr) return service;
  SparseService* self = service.get();
  metrics->AddCounterFunction("dptrain_ps_sparse_rows_pulled_total",
                              "Rows of sparse tables this shard served (all tables, workers).",
                              [self] { return static_cast<double>(self->rows_pulled()); });
  metrics->AddCounterFunction("dptrain_ps_sparse_rows_pushed_total",
                              "Row gradients of sparse tables this shard received.",
                              [self] { return static_cast<double>(self->rows_pushed()); });
  metrics->AddGaugeFunction("dptrain_ps_sparse_rows_held",
                            "Rows of sparse tables this shard holds (created on first touch).",
                            [self] { return static_cast<double>(self->rows_held()); });
  auto total = [self](auto of) {
    absl::MutexLock lock(&self->mu_);
    double sum = 0;
    for (const auto& [name, t] : self->tables_) sum += of(*t);
    return sum;
  };
  metrics->AddCounterFunction("dptrain_ps_sparse_bytes_pulled_total",
                              "Bytes of sparse-table rows this shard served.", [total] {
                                return total([](const Table& t) {
                                  return 4.0 * t.table->spec().dim * t.rows_pulled.load();
                                });
                              });
  metrics->AddCounterFunction("dptrain_ps_sparse_bytes_pushed_total",
                              "Bytes of sparse-table row gradients this shard received.", [total] {
                                return total([](const Table& t) {
                                  return 4.0 * t.table->spec().dim * t.rows_pushed.load();
                                });
                              });
  metrics->AddCounterFunction(
      "dptrain_ps_sparse_rows_applied_total",
      "Row updates the sparse tables' optimizers applied (BSP: one per distinct row a step).",
      [total] { return total([](const Table& t) { return 1.0 * t.table->rows_applied(); }); });
  metrics->AddCounterFunction(
      "dptrain_ps_sparse_apply_seconds_total",
      "Time the sparse tables' optimizers took (over rows_applied_total: the per-row cost).",
      [total] { return total([](const Table& t) { return t.table->apply_seconds(); }); });
  metrics->AddCounterFunction(
      "dptrain_ps_sparse_checkpoint_failures_total", "Sparse-table checkpoint writes that failed.",
      [self] { return static_cast<double>(self->checkpoint_failures_.load()); });
  self->apply_seconds_ = &metrics
                              ->AddHistogram("dptrain_ps_sparse_push_seconds",
                                             "A sparse push from its arrival to its answer (BSP: "
                                             "the wait for the other workers and the per-row "
                                             "updates).",
                                             {1e-4, 1e-3, 1e-2, 0.1, 1, 10})
                              .Get();
  return service;
}

std::unique_ptr<SparseService::Table> SparseService::NewTable(const SparseTableSpec& spec) const {
  SparseTableOptions options;
  options.shard = shard_.shard;
  options.num_shards = shard_.num_shards;
  options.num_workers = shard_.num_workers;
  options.bsp = shard_.policy == SyncPolicy::kBsp;
  options.staleness = shard_.policy == SyncPolicy::kSsp ? shard_.staleness : -1;
  auto table = std::make_unique<Table>();
  table->table = std::make_unique<SparseTable>(spec, options);
  return table;
}

absl::Status SparseService::RestoreAll() {
  const auto& c = shard_.checkpoints;
  if (c.dir.empty()) return absl::OkStatus();
  FileSystem* fs = c.fs;
  if (fs == nullptr) {
    own_fs_ = std::make_unique<PosixFileSystem>();
    fs = own_fs_.get();
  }
  auto dir = SparseCheckpointDir::Open(c.dir, shard_.shard, c.keep, fs, shard_.log);
  if (!dir.ok()) return dir.status();
  checkpoints_.emplace(*std::move(dir));
  auto tables = checkpoints_->Tables();
  if (!tables.ok()) return tables.status();
  absl::MutexLock lock(&mu_);
  for (const auto& [name, steps] : *tables) {
    auto cp = checkpoints_->LoadNewest(name);
    if (!cp.ok()) {
      shard_.log(absl::StrCat("ps shard ", shard_.shard, ": sparse table '", name,
                              "' starts afresh: ", cp.status().ToString()));
      continue;
    }
    if (cp->num_shards != shard_.num_shards) {
      return absl::FailedPreconditionError(
          absl::StrCat(checkpoints_->PathOf(name, cp->step), ": a checkpoint of ", cp->num_shards,
                       " shards, this job has ", shard_.num_shards));
    }
    if (!job_id_.empty() && cp->job_id != job_id_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "sparse checkpoints of two jobs ('", job_id_, "', '", cp->job_id, "') in ", c.dir));
    }
    job_id_ = cp->job_id;
    auto table = NewTable(cp->spec);
    if (auto s = table->table->Restore(&*cp); !s.ok()) return s;
    shard_.log(absl::StrCat("ps shard ", shard_.shard, ": sparse table '", name,
                            "' restored at step ", cp->step, " (", cp->ids.size(), " rows)"));
    tables_[name] = std::move(table);
  }
  return absl::OkStatus();
}

grpc::Status SparseService::Declare(grpc::ServerContext*,
                                    const proto::SparseDeclareRequest* request,
                                    proto::SparseDeclareResponse* response) {
  const SparseTableSpec spec = FromProto(request->table());
  if (auto s = ValidateSparseTableSpec(spec); !s.ok()) return ToGrpcStatus(s);
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
    it = tables_.emplace(spec.name, NewTable(spec)).first;
    if (stopping_) it->second->table->Shutdown();
  } else if (DescribeSparseTable(it->second->table->spec()) != DescribeSparseTable(spec)) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("sparse table '", spec.name, "' is declared as ",
                     DescribeSparseTable(it->second->table->spec()), " here; rank ",
                     request->caller().rank(), " declares ", DescribeSparseTable(spec)));
  }
  response->set_step(it->second->table->step());
  return grpc::Status::OK;
}

absl::StatusOr<SparseService::Table*> SparseService::Find(const std::string& job_id,
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

absl::Status SparseService::PullRows(
    const proto::Caller& caller, const std::string& name, absl::Span<const int64_t> ids,
    const std::function<absl::Span<float>(size_t values)>& out_for) {
  auto table = Find(caller.job_id(), name);
  if (!table.ok()) return table.status();
  const size_t values = ids.size() * (*table)->table->spec().dim;
  rows_pulled_ += static_cast<int64_t>(ids.size());
  (*table)->rows_pulled += static_cast<int64_t>(ids.size());
  return (*table)->table->Pull(ids, out_for(values), caller.rank());
}

absl::Status SparseService::PushRows(const proto::Caller& caller, const std::string& name,
                                     int64_t step, absl::Span<const int64_t> ids,
                                     absl::Span<const float> grads, absl::Time deadline) {
  auto table = Find(caller.job_id(), name);
  if (!table.ok()) return table.status();
  const absl::Time start = absl::Now();
  rows_pushed_ += static_cast<int64_t>(ids.size());
  (*table)->rows_pushed += static_cast<int64_t>(ids.size());
  const absl::Status pushed = (*table)->table->Push(caller.rank(), step, ids, grads, deadline);
  if (apply_seconds_ != nullptr) apply_seconds_->ObserveDuration(absl::Now() - start);
  if (pushed.ok() && caller.rank() == 0) MaybeCheckpoint(**table, step + 1);
  return pushed;
}

void SparseService::Shutdown() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  for (auto& [name, t] : tables_) t->table->Shutdown();
}

grpc::Status SparseService::Pull(grpc::ServerContext*, const proto::SparsePullRequest* request,
                                 proto::SparsePullResponse* response) {
  return ToGrpcStatus(
      PullRows(request->caller(), request->table(), request->ids(), [response](size_t values) {
        std::string* rows = response->mutable_rows();
        rows->resize(values * sizeof(float));
        return absl::MakeSpan(reinterpret_cast<float*>(rows->data()), values);
      }));
}

grpc::Status SparseService::Push(grpc::ServerContext* context,
                                 const proto::SparsePushRequest* request,
                                 proto::SparsePushResponse*) {
  const std::string& grads = request->grads();
  if (grads.size() % sizeof(float) != 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "sparse push: grads are not a whole number of fp32");
  }
  // The bytes of a protobuf string carry no alignment promise: read them in place when they
  // are aligned (a heap string's are), else from a copy.
  std::vector<float> copy;
  absl::Span<const float> values;
  if (reinterpret_cast<uintptr_t>(grads.data()) % alignof(float) == 0) {
    values = absl::MakeConstSpan(reinterpret_cast<const float*>(grads.data()),
                                 grads.size() / sizeof(float));
  } else {
    copy.resize(grads.size() / sizeof(float));
    if (!grads.empty()) std::memcpy(copy.data(), grads.data(), grads.size());
    values = copy;
  }
  return ToGrpcStatus(PushRows(request->caller(), request->table(), request->step(), request->ids(),
                               values, PushDeadline(absl::FromChrono(context->deadline()))));
}

void SparseService::MaybeCheckpoint(Table& table, int64_t step) {
  const int64_t every = shard_.checkpoints.every;
  if (!checkpoints_.has_value() || every <= 0 || step % every != 0 ||
      shard_.policy != SyncPolicy::kBsp) {
    return;
  }
  std::optional<SparseTableCheckpoint> cp = table.table->Snapshot(step);
  if (!cp.has_value()) return;  // A retry after the table moved on (or went back).
  {
    absl::MutexLock lock(&mu_);
    cp->job_id = job_id_;
  }
  absl::MutexLock lock(&write_mu_);
  if (auto s = checkpoints_->Write(*cp); !s.ok()) {
    if (checkpoint_failures_++ % 100 == 0) {
      shard_.log(absl::StrCat("ps shard ", shard_.shard, ": sparse table '", cp->spec.name,
                              "' checkpoint of step ", step, " failed: ", s.ToString()));
    }
    return;
  }
  ++table.checkpoints_written;
}

grpc::Status SparseService::Rollback(grpc::ServerContext*,
                                     const proto::SparseRollbackRequest* request,
                                     proto::SparseRollbackResponse*) {
  auto table = Find(request->caller().job_id(), request->table());
  if (!table.ok()) return ToGrpcStatus(table.status());
  SparseTable& t = *(*table)->table;
  const int64_t step = request->step(), at = t.step();
  if (step == at) return grpc::Status::OK;
  if (step > at || step < 0) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("sparse table '", t.spec().name, "' is at step ", at,
                                     ", it cannot go to step ", step));
  }
  if (step == 0) return ToGrpcStatus(t.Restore(nullptr));
  if (!checkpoints_.has_value()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("sparse table '", t.spec().name, "' cannot go back to step ",
                                     step, ": this shard has no --checkpoint_dir"));
  }
  absl::StatusOr<SparseTableCheckpoint> cp;
  {
    absl::MutexLock lock(&write_mu_);
    cp = checkpoints_->Load(t.spec().name, step);
  }
  if (!cp.ok()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, std::string(cp.status().message()));
  }
  shard_.log(absl::StrCat("ps shard ", shard_.shard, ": sparse table '", t.spec().name,
                          "' goes back from step ", at, " to ", step));
  return ToGrpcStatus(t.Restore(&*cp));
}

grpc::Status SparseService::Status(grpc::ServerContext*, const proto::SparseStatusRequest*,
                                   proto::SparseStatusResponse* response) {
  absl::MutexLock lock(&mu_);
  for (const auto& [name, t] : tables_) {
    proto::SparseTableStatus* status = response->add_tables();
    ToProto(t->table->spec(), *status->mutable_table());
    status->set_step(t->table->step());
    status->set_rows_held(t->table->rows_held());
    status->set_rows_pulled(t->rows_pulled.load());
    status->set_rows_pushed(t->rows_pushed.load());
    status->set_checkpoints_written(t->checkpoints_written.load());
  }
  return grpc::Status::OK;
}

int64_t SparseService::rows_held() const {
  absl::MutexLock lock(&mu_);
  int64_t total = 0;
  for (const auto& [name, t] : tables_) total += t->table->rows_held();
  return total;
}

}  // namespace dptrain
