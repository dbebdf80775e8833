// The CUDA backend's training step time, the figure compared with PyTorch eager on the same
// GPU (tools/gpu/torch_resnet.py; tools/gpu/check.sh runs both). One step = TrainStep
// (batch copied in, forward, loss, backward, loss read back) + ApplySgd on the device,
// synchronised; median over --steps after --warmup, in strict fp32, with TF32, and in
// mixed precision (bf16 / fp16 convolutions and products, loss scaling; a step skipped for
// overflow still counts). With --held, also the mean step of a lone replica whose data is
// held on the device and whose results are deferred (gpu_worker --data_on_device).
//
//   gpu_benchmark --models=resnet18 --math=fp32,tf32,bf16,fp16 --batch_size=256
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "worker/cuda/cuda_model.h"

ABSL_FLAG(std::string, models, "mlp,lenet,resnet18", "Models to time.");
ABSL_FLAG(std::string, math, "fp32,tf32,bf16,fp16",
          "Any of fp32 (strict), fp32det (strict, deterministic cuDNN algorithms), tf32, bf16, "
          "fp16.");
ABSL_FLAG(int, batch_size, 256, "Images per step.");
ABSL_FLAG(bool, builtin_graph, false,
          "Time the built-ins as graphs (CudaModel::CreateBuiltinFromGraph: the graph executor's "
          "twins) instead of their Sequential (CudaModel::Create), to compare the two paths.");
ABSL_FLAG(int, warmup, 10, "Untimed steps (the first finds the convolution algorithms).");
ABSL_FLAG(int, steps, 50, "Timed steps.");
ABSL_FLAG(double, lr, 0.01, "SGD learning rate.");
ABSL_FLAG(bool, held, false,
          "Also time each model as gpu_worker --data_on_device runs a lone replica: the images "
          "held on the device as bytes (HoldTrainingData), each step sending its samples "
          "(TrainStepHeld), the results deferred (DeferResults) and read every 64 steps: the "
          "mean step over --steps, no synchronisation per step.");
ABSL_FLAG(bool, cuda_graphs, false,
          "With --held: also the same held step on a second model that replays it as a CUDA "
          "graph (DeviceOptions::cuda_graphs), timed right after the eager one.");

namespace dptrain {
namespace cuda {
namespace {

// The mean step of `model` as a lone replica with its data held and its results deferred
// (--held): the batch's images quantised to bytes and held, each step one TrainStepHeld of the
// whole held set and ApplySgd, the results taken every 64 steps (*deferred: where the model
// defers them; mixed precision reads each step's), timed over --steps after --warmup steps.
absl::StatusOr<double> HeldStepMs(CudaModel& model, const std::vector<float>& images,
                                  const std::vector<nn::Label>& labels, int batch, bool* deferred) {
  std::vector<uint8_t> bytes(images.size());
  for (size_t i = 0; i < images.size(); ++i) bytes[i] = static_cast<uint8_t>(images[i] * 255.0f);
  nn::HeldData data;
  data.size = batch;
  data.channels = 1;
  data.rows = data.cols = 28;
  data.bytes = bytes;
  data.labels = labels;
  if (absl::Status s = model.HoldTrainingData(data); !s.ok()) return s;
  *deferred = model.DeferResults(true);  // Not in bf16/fp16: each step's overflow is read.
  std::vector<nn::HeldSample> samples(batch);
  for (int i = 0; i < batch; ++i) samples[i].index = (i * 7919) % batch;
  const float lr = static_cast<float>(absl::GetFlag(FLAGS_lr));
  auto run = [&](int n) -> absl::Status {
    for (int i = 0; i < n; ++i) {
      absl::StatusOr<nn::BatchResult> r = model.TrainStepHeld(samples);
      if (!r.ok()) return r.status();
      if (absl::Status s = model.ApplySgd(lr); !s.ok()) return s;
      if ((i + 1) % 64 == 0 || i + 1 == n) {
        if (absl::Status s = model.TakeResults().status(); !s.ok()) return s;
      }
    }
    return absl::OkStatus();
  };
  if (absl::Status s = run(absl::GetFlag(FLAGS_warmup)); !s.ok()) return s;
  const int steps = std::max(1, absl::GetFlag(FLAGS_steps));
  const auto t0 = std::chrono::steady_clock::now();
  if (absl::Status s = run(steps); !s.ok()) return s;
  if (absl::Status s = model.Synchronize(); !s.ok()) return s;
  const auto t1 = std::chrono::steady_clock::now();
  model.DeferResults(false);
  return std::chrono::duration<double, std::milli>(t1 - t0).count() / steps;
}

int Run() {
  const int batch = absl::GetFlag(FLAGS_batch_size);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const int steps = std::max(1, absl::GetFlag(FLAGS_steps));
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  std::vector<float> images(static_cast<size_t>(batch) * 28 * 28);
  for (float& x : images) x = pixel(rng);
  std::vector<nn::Label> labels(batch);
  for (nn::Label& y : labels) y = static_cast<nn::Label>(rng() % 10);

  std::string device;
  std::vector<std::string> rows;
  int failures = 0;
  const std::vector<std::string> models = absl::StrSplit(absl::GetFlag(FLAGS_models), ',');
  const std::vector<std::string> maths = absl::StrSplit(absl::GetFlag(FLAGS_math), ',');
  for (const std::string& name : models) {
    for (const std::string& math : maths) {
      if (math != "fp32" && math != "fp32det" && math != "tf32" && math != "bf16" &&
          math != "fp16") {
        std::cerr << "gpu_benchmark: --math takes fp32, fp32det, tf32, bf16, fp16; got '" << math
                  << "'\n";
        return 2;
      }
      nn::ModelOptions options;
      options.name = name;
      options.seed = 1;
      DeviceOptions dev;
      dev.tf32 = math == "tf32";
      dev.deterministic = math == "fp32det";
      dev.precision = math == "bf16"   ? Precision::kBf16
                      : math == "fp16" ? Precision::kFp16
                                       : Precision::kFp32;
      auto model = absl::GetFlag(FLAGS_builtin_graph)
                       ? CudaModel::CreateBuiltinFromGraph(options, dev)
                       : CudaModel::Create(options, dev);
      if (!model.ok()) {
        std::cerr << "gpu_benchmark: " << name << " " << math << ": " << model.status() << "\n";
        ++failures;
        continue;
      }
      (*model)->set_copy_grads_during_backward(false);  // ApplySgd reads them on the device.
      device = (*model)->device_name();
      std::vector<double> ms;
      double loss = 0;
      absl::Status failed;
      for (int i = 0; i < warmup + steps && failed.ok(); ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        auto r = (*model)->TrainStep(images.data(), labels.data(), batch);
        if (!r.ok()) {
          failed = r.status();
          break;
        }
        loss = r->loss;
        failed = (*model)->ApplySgd(static_cast<float>(absl::GetFlag(FLAGS_lr)));
        if (failed.ok()) failed = (*model)->Synchronize();
        const auto t1 = std::chrono::steady_clock::now();
        if (i >= warmup) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      }
      if (!failed.ok()) {
        std::cerr << "gpu_benchmark: " << name << " " << math << ": " << failed << "\n";
        ++failures;
        continue;
      }
      std::sort(ms.begin(), ms.end());
      const double median = ms[ms.size() / 2];
      char row[256];
      std::snprintf(row, sizeof(row), "| %s | %s | %.2f | %.0f | %.2f | %.4f |", name.c_str(),
                    math.c_str(), median, batch / median * 1e3, ms.front(), loss);
      rows.push_back(row);
      std::cout << "result model=" << name << " math=" << math << " step_ms=" << median
                << " best_ms=" << ms.front() << " last_loss=" << loss << std::endl;
      if (absl::GetFlag(FLAGS_held)) {
        bool deferred = false;
        absl::StatusOr<double> held_ms = HeldStepMs(**model, images, labels, batch, &deferred);
        if (!held_ms.ok()) {
          std::cerr << "gpu_benchmark: " << name << " " << math << " held: " << held_ms.status()
                    << "\n";
          ++failures;
          continue;
        }
        std::snprintf(row, sizeof(row), "| %s | %s %s | %.2f | %.0f | | |", name.c_str(),
                      math.c_str(), deferred ? "held+deferred" : "held", *held_ms,
                      batch / *held_ms * 1e3);
        rows.push_back(row);
        std::cout << "result model=" << name << " math=" << math << " held_step_ms=" << *held_ms
                  << std::endl;
        if (!absl::GetFlag(FLAGS_cuda_graphs)) continue;
        dev.cuda_graphs = true;
        auto graphed = absl::GetFlag(FLAGS_builtin_graph)
                           ? CudaModel::CreateBuiltinFromGraph(options, dev)
                           : CudaModel::Create(options, dev);
        absl::StatusOr<double> graph_ms =
            graphed.ok() ? HeldStepMs(**graphed, images, labels, batch, &deferred)
                         : absl::StatusOr<double>(graphed.status());
        if (!graph_ms.ok()) {
          std::cerr << "gpu_benchmark: " << name << " " << math
                    << " held, CUDA graph: " << graph_ms.status() << "\n";
          ++failures;
          continue;
        }
        const int64_t replays = (*graphed)->graph_replays();
        std::snprintf(row, sizeof(row),
                      "| %s | %s held, CUDA graph (%lld replays%s) | %.2f | %.0f | | |",
                      name.c_str(), math.c_str(), static_cast<long long>(replays),
                      (*graphed)->graph_refusal().ok() ? "" : ", refused: see the log", *graph_ms,
                      batch / *graph_ms * 1e3);
        rows.push_back(row);
        if (!(*graphed)->graph_refusal().ok()) {
          std::cerr << "gpu_benchmark: " << (*graphed)->graph_refusal() << "\n";
        }
        std::cout << "result model=" << name << " math=" << math << " graph_step_ms=" << *graph_ms
                  << " graph_replays=" << replays << std::endl;
      }
    }
  }
  std::cout << "\nOurs (CUDA backend) on " << device << ": batch " << batch
            << ", step = TrainStep + ApplySgd + synchronise, median of " << steps << "\n\n"
            << "| model | math | step ms | images/s | best ms | last loss |\n"
            << "|---|---|---|---|---|---|\n";
  for (const std::string& r : rows) std::cout << r << "\n";
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace cuda
}  // namespace dptrain

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return dptrain::cuda::Run();
}
