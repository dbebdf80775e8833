#include "worker/sync_factory.h"

#include <algorithm>
#include <iostream>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/net.h"
#include "common/status_macros.h"
#include "worker/comm/allreduce_sync.h"
#include "worker/comm/ps_client.h"
#include "worker/comm/sharded_ring_store.h"

namespace dptrain {
namespace {

absl::Status WithFlag(absl::string_view flag, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("--", flag, ": ", status.message()));
}

absl::Status ReportMasterPort(const WorkerConfig& config, int port) {
  std::cout << "rank 0: master listening on port " << port << std::endl;
  return config.port_file.empty() ? absl::OkStatus() : WritePortFile(config.port_file, port);
}

// Where rank 0 keeps the checkpoints (--save_dir/`subdir`), none without --save_dir. On rank 0
// (`check_dir`), a directory that holds checkpoints is refused without --resume, one that
// holds none with it.
absl::StatusOr<std::optional<SaveConfig>> SavePlan(const WorkerConfig& config,
                                                   absl::string_view subdir, bool check_dir) {
  if (config.saves.dir.empty()) return std::nullopt;
  SaveConfig plan = config.saves;
  plan.dir = absl::StrCat(config.saves.dir, "/", subdir);
  if (!check_dir) return plan;
  PosixFileSystem fs;
  auto names = fs.ListDir(plan.dir);
  const bool used = names.ok() && std::any_of(names->begin(), names->end(), [](const auto& n) {
                      return absl::EndsWith(n, ".safetensors");
                    });
  if (used && !plan.resume) {
    return WithFlag("save_dir", absl::FailedPreconditionError(absl::StrCat(
                                    "'", plan.dir,
                                    "' holds checkpoints of an earlier run: pass --resume to "
                                    "continue it, or choose another --save_dir")));
  }
  if (!used && plan.resume) {
    return WithFlag("resume", absl::NotFoundError(absl::StrCat(
                                  "'", plan.dir, "' holds no checkpoint to resume from")));
  }
  return plan;
}

PsClientOptions ClientOptions(const WorkerConfig& config, const SyncSetup& setup,
                              std::vector<std::string> addresses) {
  PsClientOptions o;
  o.shard_addresses = std::move(addresses);
  o.job_id = config.job_id;
  o.rank = config.rank;
  o.world_size = config.world_size;
  o.tensors = setup.tensors;
  o.connect_timeout = config.connect_timeout;
  o.rpc_timeout = config.rpc_timeout;
  o.expected_learning_rate = config.lr;
  // The optimizer settings a user gave a ps-mode worker must be the shards' (they apply them).
  if (config.ps_expect.optimizer.has_value()) o.expected_optimizer = *config.ps_expect.optimizer;
  if (config.ps_expect.lr_schedule.has_value()) {
    o.expected_lr_schedule = *config.ps_expect.lr_schedule;
  }
  for (const auto& [name, value] : config.ps_expect.values) {
    o.expected_optimizer_values[name] = value;
  }
  o.trace = setup.trace;
  o.stream_min_bytes = config.stream_min_bytes;
  o.wire_dtype = config.wire_dtype;
  o.reconnect_timeout = config.reconnect_timeout;
  o.credentials = setup.credentials;
  return o;
}

absl::Status MakePsSync(const WorkerConfig& config, const SyncSetup& setup, Sync& out) {
  PsClientOptions options = ClientOptions(config, setup, config.ps);
  DPTRAIN_ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client, PsClient::Connect(options));
  out.description = absl::StrCat("ps mode, ", options.shard_addresses.size(), " shard(s)");
  out.shard_learning_rate = client->constant_learning_rate();
  out.sync = std::unique_ptr<ParameterStore>(std::move(client));
  return absl::OkStatus();
}

// The DataParallel model: one unsharded reducer inside rank 0, the PS code itself.
absl::Status MakeMasterSync(const WorkerConfig& config, const SyncSetup& setup, Sync& out) {
  int port = config.master_port;
  if (config.rank == 0) {
    PsServerOptions server;
    server.listen_address = absl::StrCat(config.bind_address, ":", port);
    server.credentials = setup.credentials;
    server.shard.num_shards = 1;
    server.shard.num_workers = config.world_size;
    server.shard.step_timeout = config.step_timeout;
    server.shard.optimizer = config.optimizer;
    server.shard.lr_schedule = config.lr_schedule;
    server.shard.policy = config.master_policy;
    server.shard.staleness = config.staleness;
    DPTRAIN_ASSIGN_OR_RETURN(std::optional<SaveConfig> plan,
                             SavePlan(config, "master", /*check_dir=*/true));
    if (plan.has_value()) {
      server.shard.checkpoints.dir = plan->dir;
      server.shard.checkpoints.every = plan->every;
    }
    server.metrics = setup.metrics;  // The reducer's dptrain_ps_* beside the worker's.
    DPTRAIN_ASSIGN_OR_RETURN(out.master, PsServer::Start(server));
    port = out.master->port();
    DPTRAIN_RETURN_IF_ERROR(ReportMasterPort(config, port));
  }
  // The master reducer lives in rank 0: it has nothing to come back from.
  PsClientOptions options =
      ClientOptions(config, setup, {absl::StrCat(config.master_addr, ":", port)});
  options.reconnect_timeout = absl::ZeroDuration();
  DPTRAIN_ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client, PsClient::Connect(options));
  out.description = absl::StrCat("master mode, reducer at ", config.master_addr, ":", port);
  out.sync = std::unique_ptr<ParameterStore>(std::move(client));
  return absl::OkStatus();
}

// The DDP model: a ring of the workers.
absl::Status MakeRingSync(const WorkerConfig& config, const SyncSetup& setup, Sync& out) {
  // Before the ring forms, so that bad flags fail at once.
  DPTRAIN_ASSIGN_OR_RETURN(std::optional<SaveConfig> plan,
                           SavePlan(config, "ring", /*check_dir=*/config.rank == 0));
  AllReduceGroupOptions group;
  group.job_id = config.job_id;
  group.rank = config.rank;
  group.world_size = config.world_size;
  group.master_addr = config.master_addr;
  group.master_port = config.master_port;
  group.advertise_host = config.advertise_host;
  group.bind_address = config.bind_address;
  group.connect_timeout = config.connect_timeout;
  group.timeout = config.step_timeout;
  // Every ring message is at most one chunk of the ring.
  group.max_message_bytes = AllReduceSyncOptions().chunk_elements * sizeof(float);
  group.credentials = setup.credentials;
  DPTRAIN_ASSIGN_OR_RETURN(out.group, AllReduceGroup::Listen(group));
  if (config.rank == 0) {
    DPTRAIN_RETURN_IF_ERROR(ReportMasterPort(config, out.group->master_port()));
  }
  DPTRAIN_RETURN_IF_ERROR(out.group->Join());
  RingCheckpointOptions saves;
  if (plan.has_value()) {
    saves.dir = plan->dir;
    saves.every = plan->every;
    saves.job_id = config.job_id;
    saves.rank = config.rank;
    saves.world_size = config.world_size;
    saves.tensors = setup.tensors;
    saves.optimizer = config.optimizer.name;
    saves.fs = &out.fs;
    out.resume = plan->resume;
  }
  // The checkpointer of `ring` (a ShardedRingStore or an AllReduceSync), with --save_dir.
  auto save_with = [&](auto* ring) -> absl::Status {
    if (!plan.has_value()) return absl::OkStatus();
    auto checkpointer = RingCheckpointer::Create(saves, ring);
    if (!checkpointer.ok()) return WithFlag("save_dir", checkpointer.status());
    out.saves = *std::move(checkpointer);
    return absl::OkStatus();
  };
  if (setup.replicas_apply) {
    AllReduceSyncOptions reduce;
    reduce.wire_dtype = config.wire_dtype;
    auto reducer = std::make_unique<AllReduceSync>(&out.group->link(), reduce);
    DPTRAIN_RETURN_IF_ERROR(save_with(reducer.get()));
    out.sync = std::unique_ptr<GradientReducer>(std::move(reducer));
    out.description = absl::StrCat("allreduce mode, ring of ", config.world_size,
                                   ", every replica applies the averaged gradient");
    return absl::OkStatus();
  }
  ShardedRingStoreOptions store;
  store.optimizer = config.optimizer;
  store.lr_schedule = config.lr_schedule;
  store.wire_dtype = config.wire_dtype;
  DPTRAIN_ASSIGN_OR_RETURN(std::unique_ptr<ShardedRingStore> sharded,
                           ShardedRingStore::Create(&out.group->link(), store));
  DPTRAIN_RETURN_IF_ERROR(save_with(sharded.get()));
  out.sync = std::unique_ptr<ParameterStore>(std::move(sharded));
  out.description = absl::StrCat("allreduce mode, ring of ", config.world_size,
                                 ", optimizer sharded over the ring (each rank updates 1/",
                                 config.world_size, " of the weights)");
  return absl::OkStatus();
}

}  // namespace

absl::Status DrainMaster(const WorkerConfig& config, Sync& sync) {
  if (sync.master == nullptr) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + config.step_timeout;
  while (true) {
    const ParameterShard::Info info = sync.master->shard().GetInfo();
    if (info.rank_steps.empty()) return absl::OkStatus();
    const int64_t last = info.rank_steps[0];
    std::vector<int> behind;
    for (int r = 0; r < static_cast<int>(info.rank_steps.size()); ++r) {
      if (info.rank_steps[r] < last) behind.push_back(r);
    }
    if (behind.empty()) return absl::OkStatus();
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("master reducer: rank(s) ", absl::StrJoin(behind, ","),
                       " did not reach step ", last, " within --step_timeout"));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

absl::Status MakeSync(const WorkerConfig& config, const SyncSetup& setup, Sync& out) {
  switch (config.mode) {
    case SyncMode::kPs:
      return MakePsSync(config, setup, out);
    case SyncMode::kMaster:
      return MakeMasterSync(config, setup, out);
    case SyncMode::kAllReduce:
      return MakeRingSync(config, setup, out);
  }
  return absl::InternalError("unknown sync mode");
}

}  // namespace dptrain
