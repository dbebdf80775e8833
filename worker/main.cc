// gpu_worker: one data-parallel worker. See --helpfull.
//
// This is the composition root: the flags are read once into a WorkerConfig
// (worker_config.h), the synchroniser comes from the mode's factory (sync_factory.h), and
// this file wires them to the data, the model and the trainer. The worker's libraries never
// include server/, but in master mode rank 0 embeds the parameter-server library (through
// sync_factory.h), so that the reducer is the very same aggregation and optimizer code as a
// PS shard.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/health_server.h"
#include "common/malloc_tuning.h"
#include "common/security_flags.h"
#include "common/status_macros.h"
#include "common/telemetry_flags.h"
#include "proto/worker.grpc.pb.h"
#include "worker/data/data_source.h"
#include "worker/data/transforms.h"
#include "worker/device_choice.h"
#include "worker/gpu_backend.h"
#include "worker/graph/builtin_models.h"
#include "worker/graph/graph_model.h"
#include "worker/graph/onnx_import.h"
#include "worker/graph/op_registry.h"
#include "worker/nn/model.h"
#include "worker/nn/safetensors.h"
#include "worker/sync_factory.h"
#include "worker/thread_plan.h"
#include "worker/trainer.h"
#include "worker/worker_config.h"
#include "worker/worker_data.h"
#include "worker/worker_telemetry.h"

namespace dptrain {
namespace {

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

// What looking for a GPU found: the CUDA backend (loaded, and a kernel ran on the chosen
// GPU) and which GPU, or why there is none.
struct GpuProbe {
  std::unique_ptr<cuda::Backend> backend;  // Null without a usable GPU.
  int device = 0;                          // With a backend: the GPU, CUDA's index.
  std::string description;                 // "GPU 1 is a ...", or why there is no GPU.
  std::string reason;                      // Why that GPU (DeviceChoice::reason).
};

GpuProbe NoGpu(absl::string_view why) {
  return GpuProbe{nullptr, 0, absl::StrCat("no usable GPU: ", why), ""};
}

// Loads the backend, counts the GPUs this process sees and probes the one that --device and
// the local rank pick (worker/device_choice.h). An error when the GPU asked for is not
// there (--device=cuda:3 with two GPUs); a probe without a backend that says why when
// there is no usable GPU at all.
absl::StatusOr<GpuProbe> ProbeForTraining(const WorkerConfig& config) {
#ifdef DPTRAIN_HAVE_CUDA
  auto backend = LoadCudaBackend();
  if (!backend.ok()) return NoGpu(backend.status().message());
  absl::StatusOr<int> count = (*backend)->DeviceCount();
  if (!count.ok()) return NoGpu(count.status().message());
  absl::StatusOr<DeviceChoice> choice = ChooseDevice(config.device, config.local_rank, *count);
  if (!choice.ok()) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    if (visible == nullptr) return choice.status();
    return absl::Status(
        choice.status().code(),
        absl::StrCat(choice.status().message(), " (CUDA_VISIBLE_DEVICES='", visible, "')"));
  }
  if (!choice->gpu.has_value()) return NoGpu(choice->reason);
  auto gpu = (*backend)->Probe(*choice->gpu);
  if (!gpu.ok()) return NoGpu(gpu.status().message());
  return GpuProbe{*std::move(backend), *choice->gpu, *gpu, choice->reason};
#else
  (void)config;
  return GpuProbe{nullptr, 0, "built without CUDA", ""};
#endif
}

absl::StatusOr<std::unique_ptr<nn::Model>> CreateModelOn(cuda::Backend* gpu,
                                                         const nn::ModelOptions& options,
                                                         const cuda::BackendOptions& backend) {
  if (gpu == nullptr) return graph::CreateBuiltinModel(options);
  return gpu->CreateModel(options, backend);
}

// --model=FILE.onnx: the graph of the file (worker/graph/onnx_import.h), on the CPU, or on the
// GPU through `gpu` when not null. Says which initializers it learns beyond its layers' weights
// (the file cannot tell a parameter from a buffer: --onnx_buffers).
absl::StatusOr<std::unique_ptr<nn::Model>> CreateOnnxModel(
    const WorkerConfig& config, graph::Loss loss, const nn::ModelOptions& options,
    cuda::Backend* gpu, const cuda::BackendOptions& backend, const std::string& who) {
  const graph::OpRegistry registry = graph::BuiltinOps();
  DPTRAIN_ASSIGN_OR_RETURN(graph::Graph graph, graph::ReadOnnxGraph(config.model, registry));
  if (absl::Status s = graph::MarkBuffers(graph, config.onnx_buffers); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(config.model, ": --onnx_buffers: ", s.message()));
  }
  if (const std::vector<std::string> learned = graph::LearnedOperands(graph); !learned.empty()) {
    // The first few by name (a ConvNeXt has dozens: its layer norms' weights).
    constexpr size_t kShown = 8;
    const std::vector<std::string> shown(learned.begin(),
                                         learned.begin() + std::min(kShown, learned.size()));
    std::cout << who << ": " << config.model << ": learning " << learned.size()
              << " initializers read by Add, Sub, Mul or Div as parameters ("
              << absl::StrJoin(shown, ", ")
              << (learned.size() > kShown ? absl::StrCat(" and ", learned.size() - kShown, " more")
                                          : "")
              << "); name the buffers among them with --onnx_buffers to keep them fixed"
              << std::endl;
  }
  if (const std::vector<graph::InputColumns> parts = graph::ConcatenatedInputs(graph);
      !parts.empty()) {
    std::vector<std::string> described;
    for (const graph::InputColumns& p : parts) {
      described.push_back(absl::StrCat(p.name, " = columns [", p.begin, ", ", p.end, ")"));
    }
    std::cout << who << ": " << config.model << ": " << parts.size()
              << " inputs, read side by side from one array of " << graph.input_dims.c
              << (graph.input_ids ? " integer" : "")
              << " columns per sample: " << absl::StrJoin(described, ", ") << std::endl;
  }
  if (!config.onnx_padding_rows) graph::ClearPaddingRows(graph);
  if (const std::vector<std::string> padding = graph::PaddingRows(graph); !padding.empty()) {
    std::cout << who << ": " << config.model << ": embedding tables with one row of zeros, "
              << "taken as nn.Embedding's padding_idx (no gradient to that row, as in PyTorch; "
              << "--onnx_padding_rows=false learns it): " << absl::StrJoin(padding, ", ")
              << std::endl;
  }
  graph::GraphModelOptions model;
  model.name = graph.name;
  model.loss = loss;
  model.label_smoothing = options.label_smoothing;
  model.class_weights = options.class_weights;
  model.optimizer = options.optimizer;
  model.seed = config.seed;
  absl::StatusOr<std::unique_ptr<nn::Model>> made;
  if (gpu != nullptr) {
    made = gpu->CreateGraphModel(graph, model, backend);
  } else {
    model.threads = options.threads;
    model.dense_gemm = options.dense_gemm;
    model.conv_algorithm = options.conv_algorithm;
    made = graph::CreateGraphModel(graph, registry, model);
  }
  if (!made.ok()) {
    return absl::Status(made.status().code(),
                        absl::StrCat(config.model, gpu != nullptr ? " on the GPU: " : ": ",
                                     made.status().message()));
  }
  return made;
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

// This worker's share of the CPU (--threads, the cores this process may use, the workers per
// host): the CPU model's math threads, and the image decoding threads of a streamed data set.
absl::StatusOr<ThreadPlan> PlanCpuThreads(const WorkerConfig& config) {
  ThreadPlanInputs inputs;
  inputs.flag = config.threads;
  inputs.affinity_cores = AffinityCores();
  inputs.cgroup_cores = CgroupCpuLimit();
  inputs.local_workers = config.local_world_size;
  return PlanThreads(inputs);
}

// The CPU model's threads and algorithms from the plan, said on the startup line.
void PlanCpu(const WorkerConfig& config, const std::string& who, const ThreadPlan& plan,
             nn::ModelOptions& options) {
  options.threads = plan.threads;
  options.dense_gemm = plan.dense_gemm;
  options.conv_algorithm = config.conv;
  std::cout << who << ": " << plan.description << "; convolutions: "
            << (config.conv_name == "auto" ? "oneDNN where measured faster, else im2col"
                                           : config.conv_name)
            << std::endl;
}

absl::Status Run(const WorkerConfig& config) {
  DPTRAIN_ASSIGN_OR_RETURN(std::shared_ptr<const Credentials> credentials, CredentialsFromFlags());
  if (const std::string warning = credentials->Warning(); !warning.empty()) {
    std::cerr << "gpu_worker: warning: " << warning << std::endl;
  }
  for (const std::string& warning : credentials->FileWarnings()) {
    std::cerr << "gpu_worker: warning: " << warning << std::endl;
  }
  DPTRAIN_ASSIGN_OR_RETURN(auto telemetry,
                           TelemetryFromFlags(absl::StrCat("gpu_worker rank ", config.rank)));
  const DeviceKind device = config.device.kind;
  // An ONNX model runs on the GPU when asked for (--device=cuda, worker/cuda/gpu_graph.h);
  // --device=auto keeps it on the CPU until that path has been checked on a GPU.
  GpuProbe gpu{nullptr, 0, "ONNX models train on the GPU with --device=cuda only", ""};
  if (device == DeviceKind::kCuda || (device != DeviceKind::kCpu && !IsOnnxModel(config.model))) {
    DPTRAIN_ASSIGN_OR_RETURN(gpu, ProbeForTraining(config));
  }
  if (device == DeviceKind::kCuda && gpu.backend == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--device=", config.device.flag, ": ", gpu.description, "; use --device=cpu or auto"));
  }
  const bool on_gpu = gpu.backend != nullptr;
  if (config.precision != "fp32" && !on_gpu) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--precision=", config.precision, " computes on the GPU, and this worker runs on the CPU (",
        device == DeviceKind::kCpu ? "--device=cpu" : gpu.description, "): use --precision=fp32"));
  }

  const std::string who = absl::StrCat("rank ", config.rank, "/", config.world_size);
  std::string where;  // The startup line's device.
  if (on_gpu) {
    where = absl::StrCat("cuda (", gpu.description, ", ",
                         config.precision != "fp32" ? config.precision
                         : config.tf32              ? "TF32"
                                                    : "strict fp32",
                         config.deterministic ? ", deterministic" : "", "; ", gpu.reason, ")");
  } else if (device == DeviceKind::kCpu) {
    where = "cpu";
  } else {
    where = absl::StrCat("cpu (auto: ", gpu.description, "; training runs on the CPU)");
  }
  std::cout << who << ": device " << where << std::endl;

  std::optional<HealthServer> health;
  StatusService status_service(config.rank, config.world_size,
                               std::string(SyncModeName(config.mode)), config.model);
  if (config.health_port >= 0) {
    DPTRAIN_ASSIGN_OR_RETURN(health, StartHealthServer(config.health_port, &status_service,
                                                       config.bind_address, *credentials));
    std::cout << who << ": health service on port " << health->port << std::endl;
  }
  DPTRAIN_RETURN_IF_ERROR(ServeMetrics(*telemetry, who, credentials->tls()));
  Dataset train, test;
  DPTRAIN_ASSIGN_OR_RETURN(const ThreadPlan cpu_plan, PlanCpuThreads(config));
  // Decoding threads: this worker's share of the cores (also with --threads=0, which leaves the
  // math threads to BLAS).
  int decode_threads = cpu_plan.threads;
  if (decode_threads < 1) {
    WorkerConfig share = config;
    share.threads = "auto";
    DPTRAIN_ASSIGN_OR_RETURN(const ThreadPlan auto_plan, PlanCpuThreads(share));
    decode_threads = auto_plan.threads;
  }
  DPTRAIN_RETURN_IF_ERROR(
      LoadWorkerData(config.data, decode_threads, config.seed, who, std::cout, train, test));
  if (config.data.resized_crop_min_scale > 0 && (train.ids || train.features())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--random_resized_crop applies to images; the training set holds ", train.kind()));
  }
  if (config.data.resized_crop_min_scale > 0 && (train.rows < 2 || train.cols < 2)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--random_resized_crop: the training samples are ", train.channels, "x", train.rows, "x",
        train.cols, "; a resized crop is for images of at least 2x2"));
  }
  auto held = [](const Dataset& d) { return d.source != nullptr ? "read as needed" : "held"; };
  const bool vectors = train.ids || train.features();
  const std::string samples = vectors ? "samples" : "images";
  const std::string shape =
      vectors ? absl::StrCat(train.channels, train.ids ? " ids each" : " features each")
              : absl::StrCat(train.channels, "x", train.rows, "x", train.cols);
  std::cout << who << ": data " << config.data.dir << ": " << train.size << " training " << samples
            << " (" << held(train) << "), " << test.size << " test " << samples << " ("
            << held(test) << "), " << shape << ", " << Scores(train) << std::endl;
  DPTRAIN_ASSIGN_OR_RETURN(const graph::Loss loss, ChooseLoss(config, train, test));

  nn::ModelOptions model_options;
  model_options.name = config.model;
  model_options.seed = config.seed;
  model_options.label_smoothing = config.label_smoothing;
  model_options.class_weights = config.class_weights;
  model_options.shape = {{train.channels, train.rows, train.cols}, train.num_classes};
  if (!on_gpu) PlanCpu(config, who, cpu_plan, model_options);
  // All-reduce mode on a GPU: every replica applies the averaged gradient itself, where its
  // weights are; on the CPU the ring shards the optimizer unless told otherwise. ps and
  // master: the server applies it.
  const bool replicas_apply =
      config.mode == SyncMode::kAllReduce && (on_gpu || !config.sharded_optimizer);
  if (replicas_apply) model_options.optimizer = config.optimizer;
  cuda::BackendOptions backend;
  backend.tf32 = config.tf32;
  backend.deterministic = config.deterministic;
  backend.cuda_graphs = config.cuda_graphs;
  backend.device = gpu.device;
  backend.precision = config.precision;
  std::unique_ptr<nn::Model> model;
  if (IsOnnxModel(config.model)) {
    DPTRAIN_ASSIGN_OR_RETURN(
        model, CreateOnnxModel(config, loss, model_options, gpu.backend.get(), backend, who));
    if (train.regression() && model->num_classes() != train.targets_per_sample) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--model=", config.model, " has ", model->num_classes(), " output(s), and the data in ",
          config.data.dir, " has ", train.targets_per_sample, " target value(s) per sample"));
    }
    if (model->num_classes() < train.num_classes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--model=", config.model, " has ", model->num_classes(), " outputs, and the data in ",
          config.data.dir, " has ", train.num_classes, " classes",
          config.loss == "auto" || config.loss == "cross_entropy"
              ? ""
              : absl::StrCat(" (integer labels are classes; targets for --loss=", config.loss,
                             ", one per output: save the labels as float32)")));
    }
  } else {
    if (!config.class_weights.empty() &&
        static_cast<int>(config.class_weights.size()) != train.num_classes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--class_weights: ", config.class_weights.size(), " weights, and the data in ",
          config.data.dir, " has ", train.num_classes, " classes (one weight per class)"));
    }
    DPTRAIN_ASSIGN_OR_RETURN(model, CreateModelOn(gpu.backend.get(), model_options, backend));
  }
  if (!config.load_model.empty()) {
    if (absl::Status s = nn::LoadModel(config.load_model, *model); !s.ok()) {
      return WithFlag("load_model", s);
    }
    std::cout << who << ": loaded the weights from " << config.load_model << std::endl;
  }
  if (!config.save_model.empty()) {  // Fail now rather than after training.
    const std::string probe = absl::StrCat(config.save_model, ".probe");
    if (!std::ofstream(probe).is_open()) {
      return WithFlag(
          "save_model",
          absl::ErrnoToStatus(errno, absl::StrCat("cannot write '", config.save_model, "'")));
    }
    std::remove(probe.c_str());
  }

  SyncSetup setup;
  setup.replicas_apply = replicas_apply;
  setup.on_gpu = on_gpu;
  for (const nn::ParamInfo& p : model->params()) setup.tensors.push_back({p.name, p.size});
  setup.credentials = credentials;
  setup.trace = telemetry->trace.get();
  setup.metrics = &telemetry->registry;
  Sync sync;
  if (auto s = MakeSync(config, setup, sync); !s.ok()) return WithTlsHint(s, *credentials);
  std::cout << who << ": " << sync.description << std::endl;
  if (sync.saves != nullptr && sync.resume) {
    std::string restored;
    if (auto s = sync.saves->Resume(*model, &restored); !s.ok()) return WithFlag("resume", s);
    std::cout << who << ": " << restored << std::endl;
  }

  TrainerOptions options;
  options.rank = config.rank;
  options.world_size = config.world_size;
  options.batch_size = config.batch_size;
  options.epochs = config.epochs;
  options.seed = config.seed;
  options.max_steps_per_epoch = config.max_steps_per_epoch;
  options.progress = &std::cout;
  options.log_every = config.log_every;
  WorkerTelemetry observer(&telemetry->registry, telemetry->trace.get());
  options.observer = &observer;
  options.checkpointer = sync.saves.get();
  options.lr_schedule.base_lr = config.lr;
  if (config.lr_schedule.has_value()) options.lr_schedule = *config.lr_schedule;
  if (config.lr <= 0 && sync.shard_learning_rate > 0) {
    options.lr_schedule.base_lr = sync.shard_learning_rate;  // ps mode: the shards' constant rate.
  }
  options.augment.crop_padding = config.data.crop_padding;
  options.augment.horizontal_flip = config.data.hflip;
  options.augment.resized_crop_min_scale = config.data.resized_crop_min_scale;
  options.data_on_device = config.data.on_device;
  if (!config.data.mean.empty()) {  // Padding is black, as torchvision pads before Normalize.
    for (size_t c = 0; c < config.data.mean.size(); ++c) {
      options.augment.fill.push_back(-config.data.mean[c] / config.data.std[c]);
    }
  }
  std::ofstream metrics;
  if (!config.metrics_out.empty()) {
    metrics.open(config.metrics_out, std::ios::trunc);
    if (!metrics.is_open()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot write --metrics_out=", config.metrics_out));
    }
    options.metrics = &metrics;
  }
  if (replicas_apply && on_gpu) {
    std::cout << who << ": the optimizer runs on the GPU" << std::endl;
  }
  std::cout << who << ": " << config.model << " with " << model->weights().size() << " parameters, "
            << train.size << " training " << samples << ", " << test.size << " test " << samples
            << " (" << shape << ", " << Scores(train) << ")" << std::endl;
  DPTRAIN_RETURN_IF_ERROR(Train(options, *model, Borrow(sync.sync), train, &test, nullptr));
  DPTRAIN_RETURN_IF_ERROR(DrainMaster(config, sync));
  if (!config.save_model.empty()) {
    if (absl::Status s = nn::SaveModel(*model, config.save_model); !s.ok()) {
      return WithFlag("save_model", s);
    }
    std::cout << who << ": saved the final weights to " << config.save_model << std::endl;
  }
  if (telemetry->trace != nullptr) {
    if (auto s = telemetry->trace->Flush(); !s.ok()) return WithFlag("trace_out", s);
    std::cout << who << ": trace of " << telemetry->trace->num_spans() << " spans in "
              << telemetry->trace->path() << std::endl;
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
  absl::StatusOr<dptrain::WorkerConfig> config = dptrain::WorkerConfigFromFlags();
  absl::Status status = config.ok() ? dptrain::Run(*config) : config.status();
  if (!status.ok()) {
    std::cerr << "gpu_worker: error: " << status.message() << std::endl;
    return 1;
  }
  return 0;
}
