// gpu_worker: one data-parallel worker. See --helpfull.
//
// This is the composition root: the worker's libraries never include server/, but in master
// mode rank 0 embeds the parameter-server library here, so that the reducer is the very same
// aggregation and optimizer code as a PS shard.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/file_system.h"
#include "common/health_server.h"
#include "common/malloc_tuning.h"
#include "common/net.h"
#include "common/optimizer_flags.h"
#include "common/security_flags.h"
#include "common/telemetry_flags.h"
#include "proto/worker.grpc.pb.h"
#include "server/ps_server.h"
#include "worker/comm/allreduce_group.h"
#include "worker/comm/allreduce_sync.h"
#include "worker/comm/ps_client.h"
#include "worker/comm/sharded_ring_store.h"
#include "worker/data/idx_reader.h"
#include "worker/gpu_backend.h"
#include "worker/nn/model.h"
#include "worker/nn/safetensors.h"
#include "worker/ring_checkpoints.h"
#include "worker/thread_plan.h"
#include "worker/trainer.h"
#include "worker/worker_telemetry.h"

ABSL_FLAG(std::string, mode, "ps",
          "How gradients are synchronised: ps (sharded parameter servers, --ps), master (rank 0 "
          "hosts one reducer, the DataParallel model) or allreduce (ring all-reduce between "
          "workers, the DDP model). master and allreduce meet at --master_addr:--master_port.");
ABSL_FLAG(std::string, ps, "", "Comma-separated parameter-server shard addresses, in shard order.");
ABSL_FLAG(std::string, master_addr, "",
          "Rank 0's host for master/allreduce modes; default: $MASTER_ADDR, else 127.0.0.1.");
ABSL_FLAG(int, master_port, -1,
          "Rank 0's port for master/allreduce modes; default: $MASTER_PORT, else 0 (rank 0 "
          "picks a free port and reports it; other ranks must be told it).");
ABSL_FLAG(std::string, port_file, "", "Rank 0 writes the master port it listens on here.");
ABSL_FLAG(int, health_port, -1,
          "If >= 0, serve grpc.health.v1.Health on this port (0: a free port, printed) for "
          "liveness probes.");
ABSL_FLAG(std::string, advertise_host, "",
          "allreduce: the address peers use to reach this worker; default: the local IP "
          "toward the master.");
ABSL_FLAG(double, momentum, 0, "SGD momentum (master and allreduce modes; ps: set on ps_server).");
ABSL_FLAG(double, weight_decay, 0, "L2 weight decay (master and allreduce modes).");
ABSL_FLAG(std::string, sync, "bsp", "master mode: the reducer's policy, bsp, ssp or async.");
ABSL_FLAG(int, staleness, 0, "master mode with --sync=ssp: the staleness bound.");
ABSL_FLAG(absl::Duration, step_timeout, absl::Seconds(60),
          "master/allreduce: longest wait for the other workers in one step.");
ABSL_FLAG(int, rank, -1, "This worker's rank; default: $RANK, else $JOB_COMPLETION_INDEX, else 0.");
ABSL_FLAG(int, world_size, -1, "Number of workers; default: $WORLD_SIZE, else 1.");
ABSL_FLAG(std::string, job_id, "dptrain", "Job name; every shard serves one job.");
ABSL_FLAG(std::string, model, "mlp", "Model: mlp (784-256-10 ReLU), lenet or resnet18 (d2l).");
ABSL_FLAG(int, batch_size, 256, "Batch size per worker (the global batch is world_size times it).");
ABSL_FLAG(int, epochs, 5, "Epochs over the training set.");
ABSL_FLAG(double, lr, 0,
          "Learning rate. In ps mode the servers apply the optimizer: if set, it must match "
          "the servers' --lr.");
ABSL_FLAG(uint64_t, seed, 0, "Seed of the weight initialisation and of the shuffling.");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist",
          "Folder with Fashion-MNIST's gzip IDX files (Debian package dataset-fashion-mnist).");
ABSL_FLAG(std::string, device, "auto",
          "auto (the GPU when one works, else the CPU; says which), cpu or cuda.");
ABSL_FLAG(bool, tf32, false,
          "CUDA: let cuBLAS and cuDNN round fp32 products through TF32 tensor cores "
          "(PyTorch's allow_tf32); off: strict fp32.");
ABSL_FLAG(std::string, precision, "fp32",
          "fp32, or fp16 / bf16: half-precision compute with fp32 master weights and dynamic "
          "loss scaling (CUDA backend only).");
ABSL_FLAG(std::string, threads, "auto",
          "Math threads of this worker (CPU). auto: the cores this process may use (affinity "
          "mask, capped by a cgroup CPU quota) divided by the workers on this host "
          "(--local_world_size). N > 1: that many threads. With more than one, every layer "
          "splits its work over the model's pool (BLAS single-threaded inside), except the "
          "Linear layers of a model without convolutions, which run on BLAS's threads (the "
          "faster way, measured); 1: one thread; 0: no pool, OpenBLAS at its own default. "
          "The startup line says what was chosen.");
ABSL_FLAG(std::string, conv, "auto",
          "How the CPU convolutions compute: auto (oneDNN's convolution for the layers where "
          "it was measured faster, im2col + OpenBLAS elsewhere), im2col, or onednn (every "
          "convolution on oneDNN).");
ABSL_FLAG(int, local_world_size, -1,
          "Workers sharing this host's cores, for --threads=auto; default: $LOCAL_WORLD_SIZE "
          "(torchrun and deploy/local_cluster.sh set it), else 1 (one worker per container).");
ABSL_FLAG(std::string, metrics_out, "", "If set, JSON lines (one per epoch and a final one).");
ABSL_FLAG(int64_t, stream_min_bytes, int64_t{1} << 20,
          "ps mode: a shard holding at least this many bytes of the model gets each step over "
          "the tensor stream (chunk-pipelined), a smaller one in one unary call.");
ABSL_FLAG(absl::Duration, log_every, absl::Seconds(10),
          "A progress line (step, images/s, phase split, ETA) at most this often within an "
          "epoch; 0: one line per epoch only.");
ABSL_FLAG(int64_t, max_steps_per_epoch, 0, "If > 0, cut every epoch to this many steps.");
ABSL_FLAG(int64_t, train_subset, 0, "If > 0, train on the first N training images only.");
ABSL_FLAG(int64_t, test_subset, 0, "If > 0, evaluate on the first N test images only.");
ABSL_FLAG(std::string, load_model, "",
          "If set, a safetensors file (PyTorch state_dict names, e.g. from --save_model) to "
          "initialise the weights from. Every replica starts from rank 0's weights (in ps mode "
          "they seed the servers), so loading on rank 0 is enough.");
ABSL_FLAG(std::string, save_model, "",
          "If set, rank 0 writes the final weights there after training (safetensors, PyTorch "
          "state_dict names; load with safetensors.torch.load_file). Other ranks ignore it.");
ABSL_FLAG(std::string, bind_address, "0.0.0.0",
          "Where every listener of this worker accepts connections (the health service, the "
          "ring's data port, rank 0's rendezvous and master reducer): a numeric IPv4 "
          "address; 127.0.0.1 keeps a local job on loopback.");
ABSL_FLAG(bool, sharded_optimizer, true,
          "allreduce mode on the CPU: each rank applies the optimizer to 1/world_size of the "
          "weights and the ring all-gathers them (ZeRO stage 1: the same bytes, 1/N of the "
          "optimizer's work and state). false: every replica applies the whole averaged "
          "gradient. On a GPU every replica applies it on the device.");
ABSL_FLAG(absl::Duration, connect_timeout, absl::Seconds(30),
          "How long to wait for the parameter servers to answer at start.");
ABSL_FLAG(absl::Duration, reconnect_timeout, absl::Seconds(60),
          "ps mode: how long a step that lost a parameter-server shard keeps retrying (with "
          "backoff) for it to come back before the worker fails. A shard restarted from its "
          "checkpoint (ps_server --checkpoint_dir) is then rejoined: every worker goes back to "
          "the step it resumed at. 0: fail at once.");
ABSL_FLAG(std::string, save_dir, "",
          "master mode, and allreduce mode on the CPU (with or without --sharded_optimizer): "
          "rank 0 writes a checkpoint (weights, the whole optimizer state, step; batch-norm "
          "statistics of every rank in allreduce mode) to DIR/master or DIR/ring every "
          "--save_every steps; a job restarted with --resume continues from the newest one "
          "with the data order of the uninterrupted run. Pass the same --save_dir, "
          "--save_every and --resume to every rank. (ps mode: ps_server --checkpoint_dir.)");
ABSL_FLAG(int64_t, save_every, 0, "master/allreduce: steps between checkpoints in --save_dir.");
ABSL_FLAG(bool, resume, false,
          "master/allreduce: continue from the newest checkpoint in --save_dir (without it, a "
          "--save_dir that holds checkpoints is refused, so two jobs never mix; with it, one "
          "that holds none is refused).");
ABSL_FLAG(absl::Duration, rpc_timeout, absl::Minutes(10),
          "Client deadline of one push-pull; keep it above the servers' --step_timeout.");

namespace dptrain {
namespace {

// Explicit flag, else the first environment variable that is set, else `fallback`.
absl::StatusOr<int> FlagOrEnv(int flag, std::initializer_list<const char*> names, int fallback) {
  if (flag >= 0) return flag;
  for (const char* name : names) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') continue;
    int parsed;
    if (!absl::SimpleAtoi(value, &parsed) || parsed < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("$", name, "='", value, "' is not a non-negative integer"));
    }
    return parsed;
  }
  return fallback;
}

absl::Status WithFlag(absl::string_view flag, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("--", flag, ": ", status.message()));
}

// A peer that cannot be reached may be one whose TLS does not match this worker's: say so.
absl::Status WithTlsHint(const absl::Status& s, const Credentials& credentials) {
  if (!absl::IsUnavailable(s) || !absl::StrContains(s.message(), "cannot reach")) return s;
  return absl::Status(
      s.code(),
      absl::StrCat(s.message(),
                   credentials.tls()
                       ? " (or its TLS refused this worker: is it plaintext, or are both "
                         "certificates from the same --tls_ca, and does its certificate name "
                         "the address dialled?)"
                       : " (or it runs with TLS: then this worker needs --tls_cert, "
                         "--tls_key and --tls_ca too)"));
}

// What looking for a GPU found: the CUDA backend (loaded, and a kernel ran on the GPU), or
// why not.
struct GpuProbe {
  std::unique_ptr<cuda::Backend> backend;  // Null without a usable GPU.
  std::string description;
};

GpuProbe ProbeForTraining() {
#ifdef DPTRAIN_HAVE_CUDA
  auto backend = LoadCudaBackend();
  if (!backend.ok()) return {nullptr, absl::StrCat("no usable GPU: ", backend.status().message())};
  auto gpu = (*backend)->Probe();
  if (!gpu.ok()) return {nullptr, absl::StrCat("no usable GPU: ", gpu.status().message())};
  return {*std::move(backend), *gpu};
#else
  return {nullptr, "built without CUDA"};
#endif
}

absl::StatusOr<std::unique_ptr<nn::Model>> CreateModelOn(cuda::Backend* gpu,
                                                         const nn::ModelOptions& options) {
  if (gpu == nullptr) return nn::CreateModel(options);
  cuda::BackendOptions backend;
  backend.tf32 = absl::GetFlag(FLAGS_tf32);
  backend.precision = absl::GetFlag(FLAGS_precision);
  return gpu->CreateModel(options, backend);
}

// Answers Worker.GetStatus (served with the health service).
class StatusService final : public proto::Worker::Service {
 public:
  StatusService(int rank, int world_size, std::string mode, std::string model) {
    status_.set_rank(rank);
    status_.set_world_size(world_size);
    status_.set_mode(std::move(mode));
    status_.set_model(std::move(model));
  }
  grpc::Status GetStatus(grpc::ServerContext*, const proto::WorkerStatusRequest*,
                         proto::WorkerStatus* response) override {
    *response = status_;
    return grpc::Status::OK;
  }

 private:
  proto::WorkerStatus status_;
};

// What a worker needs to synchronise, and what keeps it alive.
struct SyncSetup {
  std::string mode;
  // allreduce mode: the replicas apply the averaged gradient themselves (a GradientReducer
  // and Model::ApplyUpdate), else the ring shards the optimizer (ShardedRingStore).
  bool replicas_apply = false;
  bool on_gpu = false;                           // The model's weights are on a GPU.
  OptimizerOptions optimizer;                    // Where the workers apply it.
  std::optional<LrScheduleOptions> lr_schedule;  // None: optimizer.learning_rate.
  int rank = 0;
  int world_size = 1;
  std::vector<TensorInfo> tensors;
  std::shared_ptr<const Credentials> credentials;  // Of every server and channel.
  TraceRecorder* trace = nullptr;                  // --trace_out; not owned.
  MetricsRegistry* metrics = nullptr;              // The worker's; not owned.
};

struct Sync {
  std::unique_ptr<PsServer> master;       // master mode, rank 0: the reducer.
  std::unique_ptr<AllReduceGroup> group;  // allreduce mode: peers and rendezvous.
  OwnedStepSync sync;
  std::string description;
  PosixFileSystem fs;                       // Of `saves`.
  std::unique_ptr<RingCheckpointer> saves;  // allreduce mode with --save_dir.
  bool resume = false;                      // --resume, with `saves`.
};

// --lr, --momentum, --weight_decay and common/optimizer_flags.h's flags, validated.
absl::StatusOr<OptimizerOptions> WorkerOptimizer() {
  OptimizerOptions o;
  o.learning_rate = static_cast<float>(absl::GetFlag(FLAGS_lr));
  o.momentum = static_cast<float>(absl::GetFlag(FLAGS_momentum));
  o.weight_decay = static_cast<float>(absl::GetFlag(FLAGS_weight_decay));
  absl::StatusOr<OptimizerOptions> made = OptimizerFromFlags(o);
  if (made.ok() && made->name == "none") {
    return WithFlag("optimizer", absl::InvalidArgumentError(
                                     "none is for ps_server (shards that only average, for "
                                     "dptrain.torch); gpu_worker needs sgd, adam or adamw"));
  }
  return made;
}

absl::Status ReportMasterPort(int port) {
  std::cout << "rank 0: master listening on port " << port << std::endl;
  const std::string path = absl::GetFlag(FLAGS_port_file);
  return path.empty() ? absl::OkStatus() : WritePortFile(path, port);
}

// --save_dir, --save_every and --resume, validated: where rank 0 keeps the checkpoints
// (--save_dir/`subdir`) and how often; none without --save_dir. On rank 0 (`check_dir`), a
// directory that holds checkpoints is refused without --resume, one that holds none with it.
struct SavePlan {
  std::string dir;
  int64_t every = 0;
  bool resume = false;
};
absl::StatusOr<std::optional<SavePlan>> SavesFromFlags(absl::string_view subdir, bool check_dir) {
  const std::string dir = absl::GetFlag(FLAGS_save_dir);
  SavePlan plan;
  plan.every = absl::GetFlag(FLAGS_save_every);
  plan.resume = absl::GetFlag(FLAGS_resume);
  if (dir.empty()) {
    if (plan.every != 0 || plan.resume) {
      return WithFlag("save_dir",
                      absl::InvalidArgumentError("--save_every and --resume need a --save_dir"));
    }
    return std::nullopt;
  }
  if (plan.every < 0) return WithFlag("save_every", absl::InvalidArgumentError("must be >= 0"));
  plan.dir = absl::StrCat(dir, "/", subdir);
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

// master mode: the reducer's checkpoints.
absl::Status ConfigureSaves(ParameterShardOptions& shard) {
  auto plan = SavesFromFlags("master", /*check_dir=*/true);
  if (!plan.ok()) return plan.status();
  if (!plan->has_value()) return absl::OkStatus();
  shard.checkpoints.dir = (*plan)->dir;
  shard.checkpoints.every = (*plan)->every;
  return absl::OkStatus();
}

PsClientOptions ClientOptions(const SyncSetup& setup, std::vector<std::string> addresses) {
  PsClientOptions o;
  o.shard_addresses = std::move(addresses);
  o.job_id = absl::GetFlag(FLAGS_job_id);
  o.rank = setup.rank;
  o.world_size = setup.world_size;
  o.tensors = setup.tensors;
  o.connect_timeout = absl::GetFlag(FLAGS_connect_timeout);
  o.rpc_timeout = absl::GetFlag(FLAGS_rpc_timeout);
  o.expected_learning_rate = absl::GetFlag(FLAGS_lr);
  // The optimizer flags a user set on a ps-mode worker must be the shards' (the shards apply
  // them): those whose value is not the default are checked at Connect.
  auto set = [](const char* name) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    return flag != nullptr && flag->CurrentValue() != flag->DefaultValue();
  };
  if (set("optimizer")) o.expected_optimizer = setup.optimizer.name;
  if (set("lr_schedule")) {
    o.expected_lr_schedule = absl::FindCommandLineFlag("lr_schedule")->CurrentValue();
  }
  if (set("momentum")) o.expected_optimizer_values["momentum"] = setup.optimizer.momentum;
  if (set("weight_decay")) {
    o.expected_optimizer_values["weight_decay"] = setup.optimizer.weight_decay;
  }
  if (set("beta1")) o.expected_optimizer_values["beta1"] = setup.optimizer.beta1;
  if (set("beta2")) o.expected_optimizer_values["beta2"] = setup.optimizer.beta2;
  if (set("eps")) o.expected_optimizer_values["eps"] = setup.optimizer.eps;
  if (set("warmup_steps") && setup.lr_schedule.has_value()) {
    o.expected_optimizer_values["warmup_steps"] =
        static_cast<double>(setup.lr_schedule->warmup_steps);
  }
  o.trace = setup.trace;
  o.stream_min_bytes = absl::GetFlag(FLAGS_stream_min_bytes);
  o.reconnect_timeout = absl::GetFlag(FLAGS_reconnect_timeout);
  o.credentials = setup.credentials;
  return o;
}

absl::Status MakeSync(const SyncSetup& setup, Sync& out) {
  if (setup.mode == "ps" && !absl::GetFlag(FLAGS_save_dir).empty()) {
    return WithFlag("save_dir", absl::InvalidArgumentError(
                                    "is for master and allreduce mode (ps mode: ps_server "
                                    "--checkpoint_dir)"));
  }
  std::string master_addr = absl::GetFlag(FLAGS_master_addr);
  if (master_addr.empty()) {
    const char* env = std::getenv("MASTER_ADDR");
    master_addr = env != nullptr && *env != '\0' ? env : "127.0.0.1";
  }
  auto master_port = FlagOrEnv(absl::GetFlag(FLAGS_master_port), {"MASTER_PORT"}, 0);
  if (!master_port.ok()) return master_port.status();
  if (*master_port > 65535) return absl::InvalidArgumentError("--master_port must be <= 65535");
  if (setup.mode != "ps" && setup.rank != 0 && *master_port == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", setup.rank, " needs rank 0's port: --master_port or $MASTER_PORT"));
  }

  if (setup.mode == "ps") {
    auto options =
        ClientOptions(setup, absl::StrSplit(absl::GetFlag(FLAGS_ps), ',', absl::SkipWhitespace()));
    auto client = PsClient::Connect(options);
    if (!client.ok()) return client.status();
    out.description = absl::StrCat("ps mode, ", options.shard_addresses.size(), " shard(s)");
    out.sync = std::unique_ptr<ParameterStore>(*std::move(client));
    return absl::OkStatus();
  }
  if (setup.mode == "master") {
    int port = *master_port;
    if (setup.rank == 0) {
      // The DataParallel model: one unsharded reducer inside rank 0, the PS code itself.
      PsServerOptions server;
      server.listen_address = absl::StrCat(absl::GetFlag(FLAGS_bind_address), ":", port);
      server.credentials = setup.credentials;
      server.shard.num_shards = 1;
      server.shard.num_workers = setup.world_size;
      server.shard.step_timeout = absl::GetFlag(FLAGS_step_timeout);
      server.shard.optimizer = setup.optimizer;
      server.shard.lr_schedule = setup.lr_schedule;
      auto policy = ParseSyncPolicy(absl::GetFlag(FLAGS_sync));
      if (!policy.ok()) return policy.status();
      server.shard.policy = *policy;
      server.shard.staleness = absl::GetFlag(FLAGS_staleness);
      if (auto s = ConfigureSaves(server.shard); !s.ok()) return s;
      server.metrics = setup.metrics;  // The reducer's dptrain_ps_* beside the worker's.
      auto reducer = PsServer::Start(server);
      if (!reducer.ok()) return reducer.status();
      out.master = *std::move(reducer);
      port = out.master->port();
      if (auto s = ReportMasterPort(port); !s.ok()) return s;
    }
    // The master reducer lives in rank 0: it has nothing to come back from.
    PsClientOptions options = ClientOptions(setup, {absl::StrCat(master_addr, ":", port)});
    options.reconnect_timeout = absl::ZeroDuration();
    auto client = PsClient::Connect(options);
    if (!client.ok()) return client.status();
    out.description = absl::StrCat("master mode, reducer at ", master_addr, ":", port);
    out.sync = std::unique_ptr<ParameterStore>(*std::move(client));
    return absl::OkStatus();
  }
  // Before the ring forms, so that bad flags fail at once.
  auto plan = SavesFromFlags("ring", /*check_dir=*/setup.rank == 0);
  if (!plan.ok()) return plan.status();
  if (setup.on_gpu && plan->has_value()) {
    return WithFlag("save_dir", absl::UnimplementedError(
                                    "in allreduce mode is not available on the GPU yet: "
                                    "saving the optimizer state from the device has not run "
                                    "on a GPU; use --device=cpu"));
  }
  AllReduceGroupOptions group;
  group.job_id = absl::GetFlag(FLAGS_job_id);
  group.rank = setup.rank;
  group.world_size = setup.world_size;
  group.master_addr = master_addr;
  group.master_port = *master_port;
  group.advertise_host = absl::GetFlag(FLAGS_advertise_host);
  group.bind_address = absl::GetFlag(FLAGS_bind_address);
  group.connect_timeout = absl::GetFlag(FLAGS_connect_timeout);
  group.timeout = absl::GetFlag(FLAGS_step_timeout);
  // Every ring message is at most one chunk of the ring.
  group.max_message_bytes = AllReduceSyncOptions().chunk_elements * sizeof(float);
  group.credentials = setup.credentials;
  auto listening = AllReduceGroup::Listen(group);
  if (!listening.ok()) return listening.status();
  out.group = *std::move(listening);
  if (setup.rank == 0) {
    if (auto s = ReportMasterPort(out.group->master_port()); !s.ok()) return s;
  }
  if (auto s = out.group->Join(); !s.ok()) return s;
  RingCheckpointOptions saves;
  if (plan->has_value()) {
    saves.dir = (*plan)->dir;
    saves.every = (*plan)->every;
    saves.job_id = absl::GetFlag(FLAGS_job_id);
    saves.rank = setup.rank;
    saves.world_size = setup.world_size;
    saves.tensors = setup.tensors;
    saves.optimizer = setup.optimizer.name;
    saves.fs = &out.fs;
    out.resume = (*plan)->resume;
  }
  // The checkpointer of `ring` (a ShardedRingStore or an AllReduceSync), with --save_dir.
  auto save_with = [&](auto* ring) -> absl::Status {
    if (!plan->has_value()) return absl::OkStatus();
    auto checkpointer = RingCheckpointer::Create(saves, ring);
    if (!checkpointer.ok()) return WithFlag("save_dir", checkpointer.status());
    out.saves = *std::move(checkpointer);
    return absl::OkStatus();
  };
  if (setup.replicas_apply) {
    auto reducer = std::make_unique<AllReduceSync>(&out.group->link(), AllReduceSyncOptions{});
    if (auto s = save_with(reducer.get()); !s.ok()) return s;
    out.sync = std::unique_ptr<GradientReducer>(std::move(reducer));
    out.description = absl::StrCat("allreduce mode, ring of ", setup.world_size,
                                   ", every replica applies the averaged gradient");
    return absl::OkStatus();
  }
  ShardedRingStoreOptions store;
  store.optimizer = setup.optimizer;
  store.lr_schedule = setup.lr_schedule;
  auto sharded = ShardedRingStore::Create(&out.group->link(), store);
  if (!sharded.ok()) return sharded.status();
  if (auto s = save_with(sharded->get()); !s.ok()) return s;
  out.sync = std::unique_ptr<ParameterStore>(*std::move(sharded));
  out.description = absl::StrCat("allreduce mode, ring of ", setup.world_size,
                                 ", optimizer sharded over the ring (each rank updates 1/",
                                 setup.world_size, " of the weights)");
  return absl::OkStatus();
}

absl::Status Run() {
  auto rank = FlagOrEnv(absl::GetFlag(FLAGS_rank), {"RANK", "JOB_COMPLETION_INDEX"}, 0);
  if (!rank.ok()) return rank.status();
  auto world_size = FlagOrEnv(absl::GetFlag(FLAGS_world_size), {"WORLD_SIZE"}, 1);
  if (!world_size.ok()) return world_size.status();
  if (*world_size < 1 || *rank >= *world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", *rank, " is not in [0, world_size=", *world_size, ")"));
  }
  auto credentials = CredentialsFromFlags();
  if (!credentials.ok()) return credentials.status();
  if (const std::string warning = (*credentials)->Warning(); !warning.empty()) {
    std::cerr << "gpu_worker: warning: " << warning << std::endl;
  }
  for (const std::string& warning : (*credentials)->FileWarnings()) {
    std::cerr << "gpu_worker: warning: " << warning << std::endl;
  }
  auto telemetry = TelemetryFromFlags(absl::StrCat("gpu_worker rank ", *rank));
  if (!telemetry.ok()) return telemetry.status();
  if (absl::GetFlag(FLAGS_log_every) < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--log_every must be >= 0");
  }
  const std::string device = absl::GetFlag(FLAGS_device);
  if (device != "auto" && device != "cpu" && device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device must be auto, cpu or cuda, got '", device, "'"));
  }
  const GpuProbe gpu = device == "cpu" ? GpuProbe{} : ProbeForTraining();
  if (device == "cuda" && gpu.backend == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("--device=cuda: ", gpu.description, "; use --device=cpu or auto"));
  }
  const bool on_gpu = gpu.backend != nullptr;
  const std::string precision = absl::GetFlag(FLAGS_precision);
  if (precision != "fp32" && precision != "fp16" && precision != "bf16") {
    return absl::InvalidArgumentError(
        absl::StrCat("--precision must be fp32, fp16 or bf16, got '", precision, "'"));
  }
  if (precision != "fp32" && !on_gpu) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--precision=", precision, " computes on the GPU, and this worker runs on the CPU (",
        device == "cpu" ? "--device=cpu" : gpu.description, "): use --precision=fp32"));
  }
  if (precision != "fp32" && absl::GetFlag(FLAGS_tf32)) {
    return absl::InvalidArgumentError("--tf32 applies to --precision=fp32 only");
  }
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode != "ps" && mode != "master" && mode != "allreduce") {
    return absl::InvalidArgumentError(
        absl::StrCat("--mode must be ps, master or allreduce, got '", mode, "'"));
  }
  if (mode == "ps" && absl::GetFlag(FLAGS_ps).empty()) {
    return absl::InvalidArgumentError("--ps is required in ps mode (host:port,...)");
  }
  if (mode != "ps" && !(absl::GetFlag(FLAGS_lr) > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--lr must be > 0 in ", mode, " mode (the workers apply the optimizer)"));
  }
  auto optimizer = WorkerOptimizer();
  if (!optimizer.ok()) return optimizer.status();
  std::optional<LrScheduleOptions> lr_schedule;
  if (absl::GetFlag(FLAGS_lr) > 0) {
    auto made = LrScheduleFromFlags(absl::GetFlag(FLAGS_lr), *world_size);
    if (!made.ok()) return made.status();
    lr_schedule = *made;
  }

  const std::string who = absl::StrCat("rank ", *rank, "/", *world_size);
  std::cout << who << ": device " << (on_gpu ? "cuda" : "cpu")
            << (device == "cpu" ? ""
                : on_gpu        ? absl::StrCat(" (", gpu.description, ", ",
                                        precision != "fp32"         ? precision
                                               : absl::GetFlag(FLAGS_tf32) ? "TF32"
                                                                           : "strict fp32",
                                               ")")
                         : absl::StrCat(" (auto: ", gpu.description, "; training runs on the CPU)"))
            << std::endl;

  std::optional<HealthServer> health;
  StatusService status_service(*rank, *world_size, mode, absl::GetFlag(FLAGS_model));
  if (const int port = absl::GetFlag(FLAGS_health_port); port >= 0) {
    auto started =
        StartHealthServer(port, &status_service, absl::GetFlag(FLAGS_bind_address), **credentials);
    if (!started.ok()) return started.status();
    health = *std::move(started);
    std::cout << who << ": health service on port " << health->port << std::endl;
  }
  if (auto s = ServeMetrics(**telemetry, who, (*credentials)->tls()); !s.ok()) return s;
  Sync sync;
  const std::string data_dir = absl::GetFlag(FLAGS_data_dir);
  auto train = LoadFashionMnist(data_dir, /*train=*/true);
  if (!train.ok()) return train.status();
  auto test = LoadFashionMnist(data_dir, /*train=*/false);
  if (!test.ok()) return test.status();
  train->KeepFirst(absl::GetFlag(FLAGS_train_subset));
  test->KeepFirst(absl::GetFlag(FLAGS_test_subset));

  nn::ModelOptions model_options;
  model_options.name = absl::GetFlag(FLAGS_model);
  model_options.seed = absl::GetFlag(FLAGS_seed);
  if (!on_gpu) {
    ThreadPlanInputs plan_inputs;
    plan_inputs.flag = absl::GetFlag(FLAGS_threads);
    plan_inputs.affinity_cores = AffinityCores();
    plan_inputs.cgroup_cores = CgroupCpuLimit();
    plan_inputs.local_workers = absl::GetFlag(FLAGS_local_world_size);
    if (plan_inputs.local_workers < 0) {
      const char* env = std::getenv("LOCAL_WORLD_SIZE");
      plan_inputs.local_workers = 0;
      if (env != nullptr && !absl::SimpleAtoi(env, &plan_inputs.local_workers)) {
        return absl::InvalidArgumentError(
            absl::StrCat("LOCAL_WORLD_SIZE must be an integer, got '", env, "'"));
      }
    }
    absl::StatusOr<ThreadPlan> plan = PlanThreads(plan_inputs);
    if (!plan.ok()) return plan.status();
    model_options.threads = plan->threads;
    model_options.dense_gemm = plan->dense_gemm;
    const std::string conv = absl::GetFlag(FLAGS_conv);
    if (conv == "im2col") {
      model_options.conv_algorithm = nn::ConvAlgorithm::kIm2col;
    } else if (conv == "onednn") {
      model_options.conv_algorithm = nn::ConvAlgorithm::kOneDnn;
    } else if (conv != "auto") {
      return WithFlag("conv", absl::InvalidArgumentError(absl::StrCat(
                                  "must be auto, im2col or onednn, got '", conv, "'")));
    }
    std::cout << who << ": " << plan->description << "; convolutions: "
              << (conv == "auto" ? "oneDNN where measured faster, else im2col" : conv) << std::endl;
  }
  // All-reduce mode on a GPU: every replica applies the averaged gradient itself, where its
  // weights are; on the CPU the ring shards the optimizer unless told otherwise. ps and
  // master: the server applies it.
  const bool replicas_apply =
      mode == "allreduce" && (on_gpu || !absl::GetFlag(FLAGS_sharded_optimizer));
  if (replicas_apply) model_options.optimizer = *optimizer;
  auto model = CreateModelOn(gpu.backend.get(), model_options);
  if (!model.ok()) return model.status();
  const std::string load_path = absl::GetFlag(FLAGS_load_model);
  if (!load_path.empty()) {
    if (absl::Status s = nn::LoadModel(load_path, **model); !s.ok()) {
      return WithFlag("load_model", s);
    }
    std::cout << who << ": loaded the weights from " << load_path << std::endl;
  }
  const std::string save_path = *rank == 0 ? absl::GetFlag(FLAGS_save_model) : "";
  if (!save_path.empty()) {  // Fail now rather than after training.
    const std::string probe = absl::StrCat(save_path, ".probe");
    if (!std::ofstream(probe).is_open()) {
      return WithFlag("save_model",
                      absl::ErrnoToStatus(errno, absl::StrCat("cannot write '", save_path, "'")));
    }
    std::remove(probe.c_str());
  }

  std::vector<TensorInfo> tensors;
  for (const nn::ParamInfo& p : (*model)->params()) tensors.push_back({p.name, p.size});
  SyncSetup setup;
  setup.mode = mode;
  setup.replicas_apply = replicas_apply;
  setup.on_gpu = on_gpu;
  setup.optimizer = *optimizer;
  setup.lr_schedule = lr_schedule;
  setup.rank = *rank;
  setup.world_size = *world_size;
  setup.tensors = std::move(tensors);
  setup.credentials = *credentials;
  setup.trace = (*telemetry)->trace.get();
  setup.metrics = &(*telemetry)->registry;
  if (auto s = MakeSync(setup, sync); !s.ok()) return WithTlsHint(s, **credentials);
  std::cout << who << ": " << sync.description << std::endl;
  if (sync.saves != nullptr && sync.resume) {
    std::string restored;
    if (auto s = sync.saves->Resume(**model, &restored); !s.ok()) return WithFlag("resume", s);
    std::cout << who << ": " << restored << std::endl;
  }

  TrainerOptions options;
  options.rank = *rank;
  options.world_size = *world_size;
  options.batch_size = absl::GetFlag(FLAGS_batch_size);
  options.epochs = absl::GetFlag(FLAGS_epochs);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.max_steps_per_epoch = absl::GetFlag(FLAGS_max_steps_per_epoch);
  options.progress = &std::cout;
  options.log_every = absl::GetFlag(FLAGS_log_every);
  WorkerTelemetry observer(&(*telemetry)->registry, (*telemetry)->trace.get());
  options.observer = &observer;
  options.checkpointer = sync.saves.get();
  options.lr_schedule.base_lr = absl::GetFlag(FLAGS_lr);
  if (lr_schedule.has_value()) options.lr_schedule = *lr_schedule;
  std::ofstream metrics;
  const std::string metrics_path = absl::GetFlag(FLAGS_metrics_out);
  if (!metrics_path.empty()) {
    metrics.open(metrics_path, std::ios::trunc);
    if (!metrics.is_open()) {
      return absl::InvalidArgumentError(absl::StrCat("cannot write --metrics_out=", metrics_path));
    }
    options.metrics = &metrics;
  }
  if (replicas_apply && on_gpu) {
    std::cout << who << ": the optimizer runs on the GPU" << std::endl;
  }
  std::cout << who << ": " << model_options.name << " with " << (*model)->weights().size()
            << " parameters, " << train->size << " training images, " << test->size
            << " test images" << std::endl;
  if (absl::Status s = Train(options, **model, Borrow(sync.sync), *train, &*test, nullptr);
      !s.ok()) {
    return s;
  }
  if (!save_path.empty()) {
    if (absl::Status s = nn::SaveModel(**model, save_path); !s.ok()) {
      return WithFlag("save_model", s);
    }
    std::cout << who << ": saved the final weights to " << save_path << std::endl;
  }
  if ((*telemetry)->trace != nullptr) {
    if (auto s = (*telemetry)->trace->Flush(); !s.ok()) return WithFlag("trace_out", s);
    std::cout << who << ": trace of " << (*telemetry)->trace->num_spans() << " spans in "
              << (*telemetry)->trace->path() << std::endl;
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace dptrain

int main(int argc, char** argv) {
  dptrain::KeepTensorBuffersInHeap();
  absl::SetProgramUsageMessage("A data-parallel training worker of dptrain.");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::cerr << "gpu_worker: unexpected argument '" << rest[1] << "' (flags are --name=value)\n";
    return 2;
  }
  absl::Status status = dptrain::Run();
  if (!status.ok()) {
    std::cerr << "gpu_worker: error: " << status.message() << std::endl;
    return 1;
  }
  return 0;
}
