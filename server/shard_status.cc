#include "server/shard_status.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"

namespace dptrain {

void FillShardInfo(const ParameterShard& shard, proto::ShardInfoResponse* response) {
  const ParameterShardOptions& o = shard.options();
  const ParameterShard::Info info = shard.GetInfo();
  response->set_shard(o.shard);
  response->set_num_shards(o.num_shards);
  response->set_num_workers(o.num_workers);
  response->set_job_id(info.job_id);
  response->set_initialized(info.initialized);
  response->set_version(info.version);
  response->set_optimizer(o.optimizer.name);
  response->set_learning_rate(o.optimizer.learning_rate);
  response->set_momentum(o.optimizer.momentum);
  response->set_nesterov(o.optimizer.nesterov);
  response->set_weight_decay(o.optimizer.weight_decay);
  response->set_beta1(o.optimizer.beta1);
  response->set_beta2(o.optimizer.beta2);
  response->set_eps(o.optimizer.eps);
  if (o.lr_schedule.has_value()) {
    response->set_lr_schedule(o.lr_schedule->name);
    response->set_warmup_steps(o.lr_schedule->warmup_steps);
    response->set_lr_scale(o.lr_schedule->scale);
  } else {
    response->set_lr_schedule("constant");
    response->set_lr_scale(1.0);
  }
  response->set_current_learning_rate(info.learning_rate);
  response->set_sync_policy(SyncPolicyName(o.policy));
  response->set_staleness_bound(o.staleness);
  response->set_pushes(info.pushes);
  response->set_max_staleness(info.max_staleness);
  response->set_mean_staleness(info.mean_staleness);
  response->set_nonfinite_steps(info.nonfinite_steps);
  response->set_nonfinite_pushes(info.nonfinite_pushes);
  response->set_checkpoint_every(o.checkpoints.every);
  response->set_restored_step(info.restored_step);
  response->set_checkpoint_step(info.checkpoint_step);
  response->set_checkpoints_written(info.checkpoints_written);
  response->set_checkpoint_failures(info.checkpoint_failures);
  response->set_checkpoint_seconds(info.checkpoint_seconds);
  response->set_checkpoint_bytes(info.checkpoint_bytes);
  response->set_rollbacks(info.rollbacks);
  response->set_incarnation(info.incarnation);
  response->set_incarnation_step(info.incarnation_step);
  for (int64_t i : info.rank_incarnations) response->add_rank_incarnations(i);
  const absl::Time now = absl::Now();
  int slowest = -1;
  for (size_t r = 0; r < info.rank_steps.size(); ++r) {
    response->add_rank_steps(info.rank_steps[r]);
    response->add_rank_idle_seconds(info.rank_seen[r] == absl::InfinitePast()
                                        ? -1.0
                                        : absl::ToDoubleSeconds(now - info.rank_seen[r]));
    if (slowest < 0 || info.rank_steps[r] < info.rank_steps[slowest]) slowest = r;
  }
  const bool any_push =
      std::any_of(info.rank_steps.begin(), info.rank_steps.end(), [](int64_t s) { return s >= 0; });
  response->set_slowest_rank(any_push ? slowest : -1);
}

std::string ShardInfoJson(const proto::ShardInfoResponse& i) {
  nlohmann::json ranks = nlohmann::json::array();
  for (int r = 0; r < i.rank_steps_size(); ++r) {
    ranks.push_back(
        {{"rank", r},
         {"step", i.rank_steps(r)},
         {"idle_seconds", r < i.rank_idle_seconds_size() ? i.rank_idle_seconds(r) : -1}});
  }
  nlohmann::json doc = {
      {"shard", i.shard()},
      {"num_shards", i.num_shards()},
      {"num_workers", i.num_workers()},
      {"job_id", i.job_id()},
      {"initialized", i.initialized()},
      {"version", i.version()},
      {"sync_policy", i.sync_policy()},
      {"staleness_bound", i.staleness_bound()},
      {"ranks", ranks},
      {"slowest_rank", i.slowest_rank()},
      {"pushes", i.pushes()},
      {"max_staleness", i.max_staleness()},
      {"mean_staleness", i.mean_staleness()},
      {"nonfinite_steps", i.nonfinite_steps()},
      {"nonfinite_pushes", i.nonfinite_pushes()},
      {"optimizer",
       {{"name", i.optimizer()},
        {"learning_rate", i.learning_rate()},
        {"current_learning_rate", i.current_learning_rate()},
        {"momentum", i.momentum()},
        {"nesterov", i.nesterov()},
        {"weight_decay", i.weight_decay()},
        {"beta1", i.beta1()},
        {"beta2", i.beta2()},
        {"eps", i.eps()},
        {"lr_schedule", i.lr_schedule()},
        {"warmup_steps", i.warmup_steps()},
        {"lr_scale", i.lr_scale()}}},
      {"checkpoints",
       {{"every", i.checkpoint_every()},
        {"restored_step", i.restored_step()},
        {"newest_step", i.checkpoint_step()},
        {"written", i.checkpoints_written()},
        {"failures", i.checkpoint_failures()},
        {"seconds", i.checkpoint_seconds()},
        {"bytes", i.checkpoint_bytes()},
        {"rollbacks", i.rollbacks()},
        {"incarnation", i.incarnation()},
        {"incarnation_step", i.incarnation_step()}}},
  };
  return doc.dump();
}

std::string ShardStatusLine(const proto::ShardInfoResponse& i) {
  std::vector<std::string> ranks;
  for (int r = 0; r < i.rank_steps_size(); ++r) {
    ranks.push_back(i.rank_steps(r) < 0 ? absl::StrCat(r, ":-")
                                        : absl::StrCat(r, ":", i.rank_steps(r)));
  }
  std::string line = absl::StrFormat(
      "shard %d/%d  job %s  %s  version %d  rank:step %s  slowest %s  staleness max %d mean "
      "%.2f  %s lr %.4g",
      i.shard(), i.num_shards(), i.job_id().empty() ? "-" : i.job_id(),
      i.initialized() ? i.sync_policy() : "not initialised", i.version(), absl::StrJoin(ranks, " "),
      i.slowest_rank() < 0 ? "-" : absl::StrCat("rank ", i.slowest_rank()), i.max_staleness(),
      i.mean_staleness(), i.optimizer(), i.current_learning_rate());
  if (i.checkpoint_every() > 0 || i.restored_step() >= 0) {
    absl::StrAppend(&line, "  checkpoint step ", i.checkpoint_step());
  }
  if (i.incarnation() > 0) {  // The job went back (RollbackRequest): how many times, from where.
    absl::StrAppend(&line, "  incarnation ", i.incarnation(), " from step ", i.incarnation_step());
  }
  return line;
}

std::string SparseTableLine(const proto::SparseTableStatus& t) {
  return absl::StrCat("  sparse table '", t.table().name(), "' (", t.table().rows(), " x ",
                      t.table().dim(), ", ", t.table().optimizer(), "): next step ", t.step(),
                      ", rows held ", t.rows_held(), ", rows pulled ", t.rows_pulled(), ", pushed ",
                      t.rows_pushed(), ", checkpoints ", t.checkpoints_written());
}

std::string SparseTablesJson(const proto::SparseStatusResponse& r) {
  nlohmann::json tables = nlohmann::json::array();
  for (const proto::SparseTableStatus& t : r.tables()) {
    tables.push_back({{"name", t.table().name()},
                      {"rows", t.table().rows()},
                      {"dim", t.table().dim()},
                      {"optimizer", t.table().optimizer()},
                      {"step", t.step()},
                      {"rows_held", t.rows_held()},
                      {"rows_pulled", t.rows_pulled()},
                      {"rows_pushed", t.rows_pushed()},
                      {"checkpoints_written", t.checkpoints_written()}});
  }
  return tables.dump();
}

}  // namespace dptrain
