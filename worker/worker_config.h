// gpu_worker's configuration: every flag read once, validated in one place, into one value
// (WorkerConfigFromFlags), so that the rest of the worker takes plain options and a bad flag
// stops the binary before any work with one line naming it. The flags themselves are defined
// in worker_config.cc (and common/'s optimizer, security and telemetry flag files).
#ifndef DPTRAIN_WORKER_WORKER_CONFIG_H_
#define DPTRAIN_WORKER_WORKER_CONFIG_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "common/lr_schedule.h"
#include "common/optimizer.h"
#include "server/aggregation_policy.h"
#include "worker/data/image_folder.h"
#include "worker/data/image_resize.h"
#include "worker/device_choice.h"
#include "worker/held_batches.h"
#include "worker/nn/layer.h"

namespace dptrain {

enum class SyncMode { kPs, kMaster, kAllReduce };
absl::string_view SyncModeName(SyncMode mode);  // "ps", "master", "allreduce".

// Where the data come from and what is done to them (worker/data/).
struct DataConfig {
  std::string dir;
  std::string format;  // idx | cifar | imagefolder | npy; empty: detected from the files.
  ImageSize image_size;  // ImageFolder images brought to one size (default: kept).
  DataLoading data_loading = DataLoading::kAuto;  // ImageFolder, uint8 .npy: held or streamed.
  int64_t train_subset = 0;
  int64_t test_subset = 0;
  // > 0: data without a test split holds this fraction of its training set out as the test
  // set (worker/data/holdout.h), seeded by WorkerConfig::seed.
  double test_fraction = 0;
  // Per-channel normalisation after scaling to [0, 1]; empty: none.
  std::vector<float> mean, std;
  // Training-time augmentation, deterministic per seed, rank and step.
  int crop_padding = 0;  // > 0: random crop of the image padded by this many zeros.
  bool hflip = false;    // Random horizontal flip.
  double resized_crop_min_scale = 0;  // > 0: random resized crop, scale in [this, 1].
  // The training set on the model's device (worker/held_batches.h).
  DataOnDevice on_device = DataOnDevice::kOff;
};

// master mode's checkpoints and all-reduce mode's (--save_dir); ps mode: ps_server's.
struct SaveConfig {
  std::string dir;  // Empty: none.
  int64_t every = 0;
  bool resume = false;
};

// The optimizer settings a ps-mode worker was given explicitly: the shards apply the
// optimizer, so these must equal theirs (checked at connect).
struct PsExpectations {
  std::optional<std::string> optimizer;
  std::optional<std::string> lr_schedule;
  std::map<std::string, double> values;  // momentum, weight_decay, beta1, beta2, eps, ...
};

struct WorkerConfig {
  // Who and where.
  int rank = 0;
  int world_size = 1;
  int local_world_size = 0;  // 0: not given (one worker per host).
  // This worker's index among the workers of its host (--local_rank, $LOCAL_RANK); none: not
  // given. Picks its GPU (device_choice.h).
  std::optional<int> local_rank;
  std::string job_id = "dptrain";
  SyncMode mode = SyncMode::kPs;
  std::vector<std::string> ps;  // Shard addresses, ps mode.
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: rank 0 picks one (the others must be told it).
  std::string port_file;
  std::string bind_address = "0.0.0.0";
  std::string advertise_host;
  int health_port = -1;  // -1: no health service.

  // Compute.
  DeviceSpec device;  // auto | cpu | cuda | cuda:N; the GPU is chosen at start (ChooseDevice).
  std::string precision = "fp32";
  bool tf32 = false;
  bool deterministic = false;    // GPU: deterministic cuDNN algorithms only.
  bool cuda_graphs = false;      // GPU: held-data steps replayed as a CUDA graph.
  std::string threads = "auto";  // worker/thread_plan.h's flag.
  nn::ConvAlgorithm conv = nn::ConvAlgorithm::kAuto;
  std::string conv_name = "auto";

  // The model: a built-in name (mlp, lenet, resnet18) or an ONNX file.
  std::string model = "mlp";
  // ONNX models: auto (from the data: cross_entropy for class labels, mse for regression
  // targets) | cross_entropy | mse | l1 | bce.
  std::string loss = "auto";
  double label_smoothing = 0;          // cross_entropy's, in [0, 1).
  std::vector<double> class_weights;   // cross_entropy's, one per class, >= 0; empty: none.
  std::vector<std::string> onnx_buffers;  // ONNX models: initializers kept fixed (MarkBuffers).
  bool onnx_padding_rows = true;          // ONNX models: a table's row of zeros is padding_idx.
  uint64_t seed = 0;
  std::string load_model, save_model;  // save_model: rank 0 only (empty elsewhere).

  DataConfig data;

  // Training.
  int batch_size = 256;
  int epochs = 5;
  int64_t max_steps_per_epoch = 0;
  absl::Duration log_every = absl::Seconds(10);
  std::string metrics_out;
  double lr = 0;                                 // 0: not given (ps mode: the shards' rate).
  OptimizerOptions optimizer;                    // Where the workers apply it.
  std::optional<LrScheduleOptions> lr_schedule;  // None: optimizer.learning_rate.
  PsExpectations ps_expect;

  // Synchronisation.
  SyncPolicy master_policy = SyncPolicy::kBsp;
  int staleness = 0;
  absl::Duration step_timeout = absl::Seconds(60);
  absl::Duration connect_timeout = absl::Seconds(30);
  absl::Duration reconnect_timeout = absl::Seconds(60);
  absl::Duration rpc_timeout = absl::Minutes(10);
  int64_t stream_min_bytes = int64_t{1} << 20;
  DType wire_dtype = DType::kFp32;  // --wire_dtype: what the gradients travel as.
  bool sharded_optimizer = true;
  SaveConfig saves;
};

// Reads every gpu_worker flag (and $RANK, $WORLD_SIZE, $JOB_COMPLETION_INDEX, $MASTER_ADDR,
// $MASTER_PORT, $LOCAL_WORLD_SIZE, $LOCAL_RANK where the flags leave them open) and validates
// them: InvalidArgument (or FailedPrecondition) naming the flag for a bad value or combination.
// Checks that need the machine (a GPU, the data, the save directory's contents) come later.
absl::StatusOr<WorkerConfig> WorkerConfigFromFlags();

// Whether `model` names an ONNX file rather than a built-in network.
bool IsOnnxModel(absl::string_view model);

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_WORKER_CONFIG_H_
