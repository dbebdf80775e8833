#include "worker/worker_config.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <initializer_list>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/optimizer_flags.h"
#include "common/status_macros.h"
#include "common/wire_dtype.h"
#include "worker/data/data_source.h"

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
ABSL_FLAG(std::string, model, "mlp",
          "Model: mlp (Flatten, Linear(C*H*W, 256), ReLU, Linear(256, classes)), lenet or "
          "resnet18 (d2l's; built for the data's image shape and class count), or FILE.onnx "
          "(a network as torch.onnx.export writes it; its initializers are the initial "
          "weights and their names).");
ABSL_FLAG(std::string, loss, "auto",
          "The loss on an ONNX model's output: cross_entropy (softmax cross-entropy, as "
          "nn.CrossEntropyLoss), mse (as nn.MSELoss), l1 (as nn.L1Loss) or bce (as "
          "nn.BCEWithLogitsLoss: multi-label, targets in [0, 1]), the last three against the "
          "data's target values (float labels) or one-hot class labels; auto: "
          "cross_entropy for class labels, mse for regression targets. The built-in models "
          "train with cross_entropy.");
ABSL_FLAG(double, label_smoothing, 0,
          "cross_entropy's label smoothing in [0, 1), as nn.CrossEntropyLoss(label_smoothing=): "
          "the target is (1 - e) for the label plus e / classes for every class.");
ABSL_FLAG(std::vector<std::string>, onnx_buffers, {},
          "ONNX models: comma-separated initializers that are buffers of the PyTorch module "
          "(register_buffer) read by Add, Sub, Mul or Div, e.g. a normalisation's mean and std: "
          "kept fixed. Other initializers those ops read (nn.Parameter: a layer scale, a "
          "learned scalar) are learned; the file cannot tell the two apart, so the worker "
          "names the ones it learns.");
ABSL_FLAG(bool, onnx_padding_rows, true,
          "ONNX models: an embedding table's one row of zeros is nn.Embedding's padding_idx "
          "(which the export drops; PyTorch starts that row at zeros): it gets no gradient, as "
          "in PyTorch, and the worker names it. false: every row is learned.");
ABSL_FLAG(int, batch_size, 256, "Batch size per worker (the global batch is world_size times it).");
ABSL_FLAG(int, epochs, 5, "Epochs over the training set.");
ABSL_FLAG(double, lr, 0,
          "Learning rate. In ps mode the servers apply the optimizer: if set, it must match "
          "the servers' --lr.");
ABSL_FLAG(uint64_t, seed, 0, "Seed of the weight initialisation and of the shuffling.");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist",
          "Folder with the data (default: Fashion-MNIST's gzip IDX files of Debian's package "
          "dataset-fashion-mnist); its format is --data_format's.");
ABSL_FLAG(std::string, data_format, "",
          "idx (MNIST/Fashion-MNIST: train-images-idx3-ubyte(.gz), ...), cifar (CIFAR-10: "
          "data_batch_1..5.bin + test_batch.bin; CIFAR-100: train.bin + test.bin), imagefolder "
          "(train/<class>/*.png|jpg and test/<class>/...), npy (train_images.npy, "
          "train_labels.npy, test_images.npy, test_labels.npy: images, integer token ids "
          "N x L for a model whose input is ids (or train_ids.npy, test_ids.npy), or float "
          "feature vectors N x F (or train_features.npy, test_features.npy)); empty: detected "
          "from the files.");
ABSL_FLAG(std::string, image_size, "",
          "ImageFolder data: the size every image is brought to as it is decoded, as "
          "torchvision's transforms with Pillow's bilinear resampling: S = Resize(S) then "
          "CenterCrop(S); HxW = Resize((H, W)). Empty: kept (all images must then have one "
          "size).");
ABSL_FLAG(std::string, data_loading, "auto",
          "Image folders and uint8 .npy arrays: load (every image read, and decoded, once at "
          "load and held as bytes), stream (read as training reaches them: image files decoded "
          "on a pool of threads a window ahead of the steps, costing a decode per image and "
          "epoch; .npy images read from the file; for sets too large to hold) or auto (stream "
          "when the images would take more than a quarter of this machine's memory). float32 "
          ".npy arrays and the other formats are held.");
ABSL_FLAG(std::vector<std::string>, class_weights, {},
          "cross_entropy's class weights, one per class (each >= 0, e.g. 1,9 for a rare class "
          "1), as nn.CrossEntropyLoss(weight=): the mean loss is weighted by each sample's "
          "class; empty: none.");
ABSL_FLAG(std::vector<std::string>, data_mean, {},
          "Per-channel means to subtract after scaling pixels to [0, 1] (with --data_std), "
          "e.g. 0.4914,0.4822,0.4465 (feature vectors: one per feature); empty: no "
          "normalisation.");
ABSL_FLAG(std::vector<std::string>, data_std, {},
          "Per-channel standard deviations to divide by (with --data_mean).");
ABSL_FLAG(double, random_resized_crop, 0,
          "Training augmentation: if > 0, torchvision's RandomResizedCrop with scale=(this, 1) "
          "and ratio=(3/4, 4/3): a random box of each image scaled back to the image's size "
          "(bilinear), before any padded crop and flip; 0.08 is the ImageNet recipe's. In (0, 1], "
          "or 0: off.");
ABSL_FLAG(int, random_crop_padding, 0,
          "Training augmentation: if > 0, each image is padded with this many zeros on every "
          "side and a random crop of its size taken (deterministic per seed, rank and step).");
ABSL_FLAG(bool, random_hflip, false,
          "Training augmentation: flip each image horizontally with probability 1/2.");
ABSL_FLAG(std::string, data_on_device, "off",
          "off (the host gathers each batch, which the model copies to its device), auto (a GPU "
          "model keeps the training set in its memory where it fits: images held as bytes, "
          "class labels, no --random_resized_crop; its kernel scales, normalises, crops and "
          "flips each step's samples, which are all a step sends) or on (the same, or fail "
          "saying why). Off by default until a GPU has run it (tools/gpu/check.sh).");
ABSL_FLAG(std::string, device, "auto",
          "auto (a GPU when one works, else the CPU; says which), cpu, cuda (a GPU, or fail) "
          "or cuda:N (GPU N of the visible ones, CUDA's numbering after "
          "CUDA_VISIBLE_DEVICES). auto and cuda take GPU local_rank mod the visible GPUs "
          "(--local_rank), so that the workers of a host get one GPU each.");
ABSL_FLAG(int, local_rank, -1,
          "This worker's index among the workers of its host, which picks its GPU under "
          "--device=auto|cuda; default: $LOCAL_RANK (torchrun and deploy/local_cluster.sh set "
          "it), else 0.");
ABSL_FLAG(bool, deterministic, false,
          "GPU only: only cuDNN algorithms that are deterministic (PyTorch's "
          "torch.backends.cudnn.deterministic), so that the same inputs give bitwise-"
          "reproducible gradients; maybe slower.");
ABSL_FLAG(bool, cuda_graphs, false,
          "GPU, fp32, with --data_on_device: a lone all-reduce worker captures its training "
          "step as a CUDA graph and replays it (one launch a step; dropout and embedding "
          "lookups keep the step eager). Off until a GPU run has verified it.");
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
ABSL_FLAG(std::string, wire_dtype, "fp32",
          "What the gradients travel as: fp32, or bf16 / fp16 (half the bytes; rounded to "
          "nearest even; the shards or the ring's ranks widen them and sum in fp32, weights "
          "stay fp32; fp16 turns values past 65504 into inf, and such a step is skipped).");
ABSL_FLAG(absl::Duration, log_every, absl::Seconds(10),
          "A progress line (step, images/s, phase split, ETA) at most this often within an "
          "epoch; 0: one line per epoch only.");
ABSL_FLAG(int64_t, max_steps_per_epoch, 0, "If > 0, cut every epoch to this many steps.");
ABSL_FLAG(int64_t, train_subset, 0, "If > 0, train on the first N training images only.");
ABSL_FLAG(int64_t, test_subset, 0, "If > 0, evaluate on the first N test images only.");
ABSL_FLAG(double, test_fraction, 0,
          "For data without a test split: hold out this fraction (in (0, 1)) of the training "
          "set as the test set, a random choice seeded by --seed (the same on every worker), as "
          "scikit-learn's train_test_split.");
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

absl::Status Bad(absl::string_view flag, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", what));
}

// Whether the user set flag `name` to something other than its default.
bool IsSet(const char* name) {
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  return flag != nullptr && flag->CurrentValue() != flag->DefaultValue();
}

absl::StatusOr<std::vector<float>> Floats(absl::string_view flag,
                                          const std::vector<std::string>& values) {
  std::vector<float> out;
  for (const std::string& v : values) {
    float x;
    if (!absl::SimpleAtof(v, &x) || !std::isfinite(x)) {
      return Bad(flag, absl::StrCat("'", v, "' is not a finite float32 number"));
    }
    out.push_back(x);
  }
  return out;
}

absl::Status ReadIdentity(WorkerConfig& c) {
  DPTRAIN_ASSIGN_OR_RETURN(
      c.rank, FlagOrEnv(absl::GetFlag(FLAGS_rank), {"RANK", "JOB_COMPLETION_INDEX"}, 0));
  DPTRAIN_ASSIGN_OR_RETURN(c.world_size,
                           FlagOrEnv(absl::GetFlag(FLAGS_world_size), {"WORLD_SIZE"}, 1));
  if (c.world_size < 1 || c.rank >= c.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", c.rank, " is not in [0, world_size=", c.world_size, ")"));
  }
  const int local_rank = absl::GetFlag(FLAGS_local_rank);
  if (local_rank >= 0) {
    c.local_rank = local_rank;
  } else if (const char* env = std::getenv("LOCAL_RANK"); env != nullptr && *env != '\0') {
    int parsed;
    if (!absl::SimpleAtoi(env, &parsed) || parsed < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("$LOCAL_RANK='", env, "' is not a non-negative integer"));
    }
    c.local_rank = parsed;
  }
  const int local = absl::GetFlag(FLAGS_local_world_size);
  if (local >= 0) {
    c.local_world_size = local;
  } else if (const char* env = std::getenv("LOCAL_WORLD_SIZE"); env != nullptr) {
    if (!absl::SimpleAtoi(env, &c.local_world_size)) {
      return absl::InvalidArgumentError(
          absl::StrCat("LOCAL_WORLD_SIZE must be an integer, got '", env, "'"));
    }
  }
  if (c.local_rank.has_value() && c.local_world_size > 0 && *c.local_rank >= c.local_world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "local rank ", *c.local_rank, " is not in [0, local_world_size=", c.local_world_size, ")"));
  }
  c.job_id = absl::GetFlag(FLAGS_job_id);
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode == "ps") {
    c.mode = SyncMode::kPs;
  } else if (mode == "master") {
    c.mode = SyncMode::kMaster;
  } else if (mode == "allreduce") {
    c.mode = SyncMode::kAllReduce;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--mode must be ps, master or allreduce, got '", mode, "'"));
  }
  c.ps = absl::StrSplit(absl::GetFlag(FLAGS_ps), ',', absl::SkipWhitespace());
  if (c.mode == SyncMode::kPs && c.ps.empty()) {
    return absl::InvalidArgumentError("--ps is required in ps mode (host:port,...)");
  }
  c.master_addr = absl::GetFlag(FLAGS_master_addr);
  if (c.master_addr.empty()) {
    const char* env = std::getenv("MASTER_ADDR");
    c.master_addr = env != nullptr && *env != '\0' ? env : "127.0.0.1";
  }
  DPTRAIN_ASSIGN_OR_RETURN(c.master_port,
                           FlagOrEnv(absl::GetFlag(FLAGS_master_port), {"MASTER_PORT"}, 0));
  if (c.master_port > 65535) return absl::InvalidArgumentError("--master_port must be <= 65535");
  if (c.mode != SyncMode::kPs && c.rank != 0 && c.master_port == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", c.rank, " needs rank 0's port: --master_port or $MASTER_PORT"));
  }
  c.port_file = absl::GetFlag(FLAGS_port_file);
  c.bind_address = absl::GetFlag(FLAGS_bind_address);
  c.advertise_host = absl::GetFlag(FLAGS_advertise_host);
  c.health_port = absl::GetFlag(FLAGS_health_port);
  return absl::OkStatus();
}

absl::Status ReadCompute(WorkerConfig& c) {
  DPTRAIN_ASSIGN_OR_RETURN(c.device, ParseDeviceFlag(absl::GetFlag(FLAGS_device)));
  c.precision = absl::GetFlag(FLAGS_precision);
  if (c.precision != "fp32" && c.precision != "fp16" && c.precision != "bf16") {
    return absl::InvalidArgumentError(
        absl::StrCat("--precision must be fp32, fp16 or bf16, got '", c.precision, "'"));
  }
  c.tf32 = absl::GetFlag(FLAGS_tf32);
  if (c.precision != "fp32" && c.tf32) {
    return absl::InvalidArgumentError("--tf32 applies to --precision=fp32 only");
  }
  c.deterministic = absl::GetFlag(FLAGS_deterministic);
  c.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  c.threads = absl::GetFlag(FLAGS_threads);
  c.conv_name = absl::GetFlag(FLAGS_conv);
  if (c.conv_name == "im2col") {
    c.conv = nn::ConvAlgorithm::kIm2col;
  } else if (c.conv_name == "onednn") {
    c.conv = nn::ConvAlgorithm::kOneDnn;
  } else if (c.conv_name != "auto") {
    return Bad("conv", absl::StrCat("must be auto, im2col or onednn, got '", c.conv_name, "'"));
  }
  return absl::OkStatus();
}

absl::Status ReadData(WorkerConfig& c) {
  DataConfig& d = c.data;
  d.dir = absl::GetFlag(FLAGS_data_dir);
  d.format = absl::GetFlag(FLAGS_data_format);
  if (!d.format.empty() && d.format != "idx" && d.format != "cifar" && d.format != "imagefolder" &&
      d.format != "npy") {
    return Bad("data_format",
               absl::StrCat("must be idx, cifar, imagefolder or npy (or empty: detected), got '",
                            d.format, "'"));
  }
  absl::StatusOr<ImageSize> size = ParseImageSize(absl::GetFlag(FLAGS_image_size));
  if (!size.ok()) return Bad("image_size", size.status().message());
  d.image_size = *size;
  if (!d.image_size.keep() && !d.format.empty() && d.format != "imagefolder") {
    return Bad("image_size", absl::StrCat("applies to image folders (--data_format=imagefolder), "
                                          "not to ",
                                          d.format));
  }
  absl::StatusOr<DataLoading> loading = ParseDataLoading(absl::GetFlag(FLAGS_data_loading));
  if (!loading.ok()) return Bad("data_loading", loading.status().message());
  d.data_loading = *loading;
  if (d.data_loading == DataLoading::kStream && !d.format.empty() && d.format != "imagefolder" &&
      d.format != "npy") {
    return Bad("data_loading", absl::StrCat("stream applies to image folders and .npy arrays "
                                            "(--data_format=imagefolder or npy), not to ",
                                            d.format));
  }
  d.train_subset = absl::GetFlag(FLAGS_train_subset);
  d.test_subset = absl::GetFlag(FLAGS_test_subset);
  d.test_fraction = absl::GetFlag(FLAGS_test_fraction);
  if (d.test_fraction != 0 && !(d.test_fraction > 0 && d.test_fraction < 1)) {
    return Bad(
        "test_fraction",
        absl::StrCat("must be in (0, 1) (or 0: the data's test split), got ", d.test_fraction));
  }
  DPTRAIN_ASSIGN_OR_RETURN(d.mean, Floats("data_mean", absl::GetFlag(FLAGS_data_mean)));
  DPTRAIN_ASSIGN_OR_RETURN(d.std, Floats("data_std", absl::GetFlag(FLAGS_data_std)));
  if (d.mean.size() != d.std.size()) {
    return Bad("data_mean", absl::StrCat("and --data_std need one value per channel each; got ",
                                         d.mean.size(), " and ", d.std.size()));
  }
  for (float s : d.std) {
    if (!(s > 0)) return Bad("data_std", "every value must be > 0");
  }
  d.crop_padding = absl::GetFlag(FLAGS_random_crop_padding);
  if (d.crop_padding < 0 || d.crop_padding > 1024) {
    return Bad("random_crop_padding", "must be in [0, 1024]");
  }
  d.hflip = absl::GetFlag(FLAGS_random_hflip);
  DPTRAIN_ASSIGN_OR_RETURN(d.on_device, ParseDataOnDevice(absl::GetFlag(FLAGS_data_on_device)));
  d.resized_crop_min_scale = absl::GetFlag(FLAGS_random_resized_crop);
  if (d.resized_crop_min_scale != 0 &&
      !(d.resized_crop_min_scale > 0 && d.resized_crop_min_scale <= 1)) {
    return Bad("random_resized_crop",
               "must be in (0, 1] (the smallest box's share of the image), "
               "or 0: off");
  }
  return absl::OkStatus();
}

absl::Status ReadTraining(WorkerConfig& c) {
  c.model = absl::GetFlag(FLAGS_model);
  c.loss = absl::GetFlag(FLAGS_loss);
  if (c.loss != "auto" && c.loss != "cross_entropy" && c.loss != "mse" && c.loss != "l1" &&
      c.loss != "bce") {
    return Bad("loss",
               absl::StrCat("must be auto, cross_entropy, mse, l1 or bce, got '", c.loss, "'"));
  }
  c.onnx_buffers = absl::GetFlag(FLAGS_onnx_buffers);
  c.onnx_padding_rows = absl::GetFlag(FLAGS_onnx_padding_rows);
  if (!c.onnx_buffers.empty() && !IsOnnxModel(c.model)) {
    return Bad("onnx_buffers", "names initializers of an ONNX model (--model=FILE.onnx)");
  }
  const bool other_loss = c.loss != "auto" && c.loss != "cross_entropy";
  if (other_loss && !IsOnnxModel(c.model)) {
    return Bad("loss", absl::StrCat("the built-in model ", c.model, " trains with cross_entropy"));
  }
  c.label_smoothing = absl::GetFlag(FLAGS_label_smoothing);
  if (!(c.label_smoothing >= 0 && c.label_smoothing < 1)) {
    return Bad("label_smoothing", absl::StrCat("must be in [0, 1), got ", c.label_smoothing));
  }
  if (c.label_smoothing != 0 && other_loss) {
    return Bad("label_smoothing", "applies to --loss=cross_entropy only");
  }
  DPTRAIN_ASSIGN_OR_RETURN(const std::vector<float> weights,
                           Floats("class_weights", absl::GetFlag(FLAGS_class_weights)));
  c.class_weights.assign(weights.begin(), weights.end());
  if (!c.class_weights.empty() && other_loss) {
    return Bad("class_weights", "apply to --loss=cross_entropy only");
  }
  if (!c.class_weights.empty() &&
      (*std::min_element(c.class_weights.begin(), c.class_weights.end()) < 0 ||
       *std::max_element(c.class_weights.begin(), c.class_weights.end()) <= 0)) {
    return Bad("class_weights", "every weight must be >= 0, and one > 0");
  }
  c.seed = absl::GetFlag(FLAGS_seed);
  c.load_model = absl::GetFlag(FLAGS_load_model);
  c.save_model = c.rank == 0 ? absl::GetFlag(FLAGS_save_model) : "";
  c.batch_size = absl::GetFlag(FLAGS_batch_size);
  if (c.batch_size < 1) return Bad("batch_size", "must be >= 1");
  c.epochs = absl::GetFlag(FLAGS_epochs);
  if (c.epochs < 0) return Bad("epochs", "must be >= 0");
  c.max_steps_per_epoch = absl::GetFlag(FLAGS_max_steps_per_epoch);
  c.log_every = absl::GetFlag(FLAGS_log_every);
  if (c.log_every < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--log_every must be >= 0");
  }
  c.metrics_out = absl::GetFlag(FLAGS_metrics_out);
  c.lr = absl::GetFlag(FLAGS_lr);
  if (c.mode != SyncMode::kPs && !(c.lr > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("--lr must be > 0 in ", SyncModeName(c.mode),
                                                   " mode (the workers apply the optimizer)"));
  }
  OptimizerOptions o;
  o.learning_rate = static_cast<float>(c.lr);
  o.momentum = static_cast<float>(absl::GetFlag(FLAGS_momentum));
  o.weight_decay = static_cast<float>(absl::GetFlag(FLAGS_weight_decay));
  DPTRAIN_ASSIGN_OR_RETURN(c.optimizer, OptimizerFromFlags(o));
  if (c.optimizer.name == "none") {
    return Bad("optimizer",
               "none is for ps_server (shards that only average, for dptrain.torch); gpu_worker "
               "needs sgd, adam or adamw");
  }
  if (c.lr > 0) {
    DPTRAIN_ASSIGN_OR_RETURN(c.lr_schedule, LrScheduleFromFlags(c.lr, c.world_size));
  }
  // What a ps-mode worker was told explicitly must be what the shards apply.
  if (IsSet("optimizer")) c.ps_expect.optimizer = c.optimizer.name;
  if (IsSet("lr_schedule")) {
    c.ps_expect.lr_schedule = absl::FindCommandLineFlag("lr_schedule")->CurrentValue();
  }
  if (IsSet("momentum")) c.ps_expect.values["momentum"] = c.optimizer.momentum;
  if (IsSet("nesterov")) c.ps_expect.values["nesterov"] = c.optimizer.nesterov ? 1 : 0;
  if (IsSet("weight_decay")) c.ps_expect.values["weight_decay"] = c.optimizer.weight_decay;
  if (IsSet("beta1")) c.ps_expect.values["beta1"] = c.optimizer.beta1;
  if (IsSet("beta2")) c.ps_expect.values["beta2"] = c.optimizer.beta2;
  if (IsSet("eps")) c.ps_expect.values["eps"] = c.optimizer.eps;
  if (IsSet("warmup_steps") && c.lr_schedule.has_value()) {
    c.ps_expect.values["warmup_steps"] = static_cast<double>(c.lr_schedule->warmup_steps);
  }
  return absl::OkStatus();
}

absl::Status ReadSync(WorkerConfig& c) {
  DPTRAIN_ASSIGN_OR_RETURN(c.master_policy, ParseSyncPolicy(absl::GetFlag(FLAGS_sync)));
  c.staleness = absl::GetFlag(FLAGS_staleness);
  c.step_timeout = absl::GetFlag(FLAGS_step_timeout);
  c.connect_timeout = absl::GetFlag(FLAGS_connect_timeout);
  c.reconnect_timeout = absl::GetFlag(FLAGS_reconnect_timeout);
  c.rpc_timeout = absl::GetFlag(FLAGS_rpc_timeout);
  c.stream_min_bytes = absl::GetFlag(FLAGS_stream_min_bytes);
  absl::StatusOr<DType> wire = ParseWireDtype(absl::GetFlag(FLAGS_wire_dtype));
  if (!wire.ok()) return Bad("wire_dtype", "must be fp32, bf16 or fp16");
  c.wire_dtype = *wire;
  c.sharded_optimizer = absl::GetFlag(FLAGS_sharded_optimizer);
  SaveConfig& s = c.saves;
  s.dir = absl::GetFlag(FLAGS_save_dir);
  s.every = absl::GetFlag(FLAGS_save_every);
  s.resume = absl::GetFlag(FLAGS_resume);
  if (s.dir.empty() && (s.every != 0 || s.resume)) {
    return Bad("save_dir", "--save_every and --resume need a --save_dir");
  }
  if (s.every < 0) return Bad("save_every", "must be >= 0");
  if (c.mode == SyncMode::kPs && !s.dir.empty()) {
    return Bad("save_dir",
               "is for master and allreduce mode (ps mode: ps_server --checkpoint_dir)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view SyncModeName(SyncMode mode) {
  switch (mode) {
    case SyncMode::kPs:
      return "ps";
    case SyncMode::kMaster:
      return "master";
    case SyncMode::kAllReduce:
      return "allreduce";
  }
  return "?";
}

bool IsOnnxModel(absl::string_view model) { return absl::EndsWithIgnoreCase(model, ".onnx"); }

absl::StatusOr<WorkerConfig> WorkerConfigFromFlags() {
  WorkerConfig c;
  DPTRAIN_RETURN_IF_ERROR(ReadIdentity(c));
  DPTRAIN_RETURN_IF_ERROR(ReadCompute(c));
  DPTRAIN_RETURN_IF_ERROR(ReadData(c));
  DPTRAIN_RETURN_IF_ERROR(ReadTraining(c));
  DPTRAIN_RETURN_IF_ERROR(ReadSync(c));
  return c;
}

}  // namespace dptrain
