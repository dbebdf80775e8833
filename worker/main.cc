// gpu_worker: one data-parallel worker. See --helpfull.
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "worker/comm/ps_client.h"
#include "worker/data/idx_reader.h"
#include "worker/nn/model.h"
#include "worker/trainer.h"

ABSL_FLAG(std::string, ps, "", "Comma-separated parameter-server shard addresses, in shard order.");
ABSL_FLAG(int, rank, -1, "This worker's rank; default: $RANK, else $JOB_COMPLETION_INDEX, else 0.");
ABSL_FLAG(int, world_size, -1, "Number of workers; default: $WORLD_SIZE, else 1.");
ABSL_FLAG(std::string, job_id, "dptrain", "Job name; every shard serves one job.");
ABSL_FLAG(std::string, model, "mlp", "Model: mlp (784-256-10 ReLU) or lenet (d2l).");
ABSL_FLAG(int, batch_size, 256, "Batch size per worker (the global batch is world_size times it).");
ABSL_FLAG(int, epochs, 5, "Epochs over the training set.");
ABSL_FLAG(double, lr, 0,
          "Learning rate. In ps mode the servers apply the optimizer: if set, it must match "
          "the servers' --lr.");
ABSL_FLAG(uint64_t, seed, 0, "Seed of the weight initialisation and of the shuffling.");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist",
          "Folder with Fashion-MNIST's gzip IDX files (Debian package dataset-fashion-mnist).");
ABSL_FLAG(std::string, device, "auto", "auto, cpu or cuda.");
ABSL_FLAG(int, threads, 0, "Math threads of this worker (0: the BLAS default).");
ABSL_FLAG(std::string, metrics_out, "", "If set, JSON lines (one per epoch and a final one).");
ABSL_FLAG(int64_t, max_steps_per_epoch, 0, "If > 0, cut every epoch to this many steps.");
ABSL_FLAG(absl::Duration, connect_timeout, absl::Seconds(30),
          "How long to wait for the parameter servers to answer at start.");
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
      return absl::InvalidArgumentError(absl::StrCat("$", name, "='", value,
                                                     "' is not a non-negative integer"));
    }
    return parsed;
  }
  return fallback;
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
  const std::string device = absl::GetFlag(FLAGS_device);
  if (device == "cuda") {
    return absl::UnimplementedError(
        "--device=cuda: this build has no CUDA backend yet; use --device=cpu or auto");
  }
  if (device != "auto" && device != "cpu") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device must be auto, cpu or cuda, got '", device, "'"));
  }
  const std::string ps = absl::GetFlag(FLAGS_ps);
  if (ps.empty()) return absl::InvalidArgumentError("--ps is required (host:port,...)");

  const std::string who = absl::StrCat("rank ", *rank, "/", *world_size);
  std::cout << who << ": device cpu"
            << (device == "auto" ? " (auto: the CPU backend is the one in this build)" : "")
            << std::endl;

  const std::string data_dir = absl::GetFlag(FLAGS_data_dir);
  auto train = LoadFashionMnist(data_dir, /*train=*/true);
  if (!train.ok()) return train.status();
  auto test = LoadFashionMnist(data_dir, /*train=*/false);
  if (!test.ok()) return test.status();

  nn::ModelOptions model_options;
  model_options.name = absl::GetFlag(FLAGS_model);
  model_options.seed = absl::GetFlag(FLAGS_seed);
  model_options.threads = absl::GetFlag(FLAGS_threads);
  auto model = nn::CreateModel(model_options);
  if (!model.ok()) return model.status();

  PsClientOptions ps_options;
  ps_options.shard_addresses = absl::StrSplit(ps, ',', absl::SkipWhitespace());
  ps_options.job_id = absl::GetFlag(FLAGS_job_id);
  ps_options.rank = *rank;
  ps_options.world_size = *world_size;
  for (const nn::ParamInfo& p : (*model)->params()) ps_options.tensors.push_back({p.name, p.size});
  ps_options.connect_timeout = absl::GetFlag(FLAGS_connect_timeout);
  ps_options.rpc_timeout = absl::GetFlag(FLAGS_rpc_timeout);
  ps_options.expected_learning_rate = absl::GetFlag(FLAGS_lr);
  auto client = PsClient::Connect(ps_options);
  if (!client.ok()) return client.status();

  TrainerOptions options;
  options.rank = *rank;
  options.world_size = *world_size;
  options.batch_size = absl::GetFlag(FLAGS_batch_size);
  options.epochs = absl::GetFlag(FLAGS_epochs);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.max_steps_per_epoch = absl::GetFlag(FLAGS_max_steps_per_epoch);
  options.progress = &std::cout;
  std::ofstream metrics;
  const std::string metrics_path = absl::GetFlag(FLAGS_metrics_out);
  if (!metrics_path.empty()) {
    metrics.open(metrics_path, std::ios::trunc);
    if (!metrics.is_open()) {
      return absl::InvalidArgumentError(absl::StrCat("cannot write --metrics_out=", metrics_path));
    }
    options.metrics = &metrics;
  }
  std::cout << who << ": " << model_options.name << " with " << (*model)->weights().size()
            << " parameters, " << train->size << " training images, "
            << ps_options.shard_addresses.size() << " PS shard(s)" << std::endl;
  return Train(options, **model, **client, *train, &*test, nullptr);
}

}  // namespace
}  // namespace dptrain

int main(int argc, char** argv) {
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
