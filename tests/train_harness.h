// Runs N workers as threads of the test process, each with its own model and its own
// synchroniser (step_sync.h), for `steps` steps of one epoch; returns every replica's final weights.
#ifndef DPTRAIN_TESTS_TRAIN_HARNESS_H_
#define DPTRAIN_TESTS_TRAIN_HARNESS_H_

#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "worker/comm/step_sync.h"
#include "worker/data/dataset.h"
#include "worker/graph/builtin_models.h"
#include "worker/nn/model.h"
#include "worker/trainer.h"

namespace dptrain {

struct HarnessConfig {
  std::string model = "mlp";
  int workers = 2;
  int batch_size = 32;
  int64_t steps = 5;
  uint64_t model_seed = 7;
  uint64_t data_seed = 3;
  // The replicas' own update rule (all-reduce mode); none where a server applies it.
  std::optional<OptimizerOptions> optimizer;
  // The rate of each step, for replicas that apply it (else the optimizer's rate).
  std::optional<LrScheduleOptions> lr_schedule;
};

// Makes rank r's sync for a model with these tensors. Called on rank r's thread.
using SyncFactory = std::function<absl::StatusOr<OwnedStepSync>(
    int rank, const std::vector<TensorInfo>& tensors)>;

// `buffers`, if not null, receives every replica's final buffer values (batch norm).
inline std::vector<std::vector<float>> RunWorkers(
    const HarnessConfig& c, const Dataset& data, const SyncFactory& make_sync,
    std::vector<std::vector<float>>* buffers = nullptr) {
  std::vector<std::vector<float>> finals(c.workers);
  if (buffers != nullptr) buffers->assign(c.workers, {});
  std::vector<absl::Status> statuses(c.workers);
  std::vector<std::thread> threads;
  for (int r = 0; r < c.workers; ++r) {
    threads.emplace_back([&, r] {
      nn::ModelOptions mo;
      mo.name = c.model;
      mo.seed = c.model_seed;
      mo.threads = 1;
      mo.optimizer = c.optimizer;
      auto model = graph::CreateBuiltinModel(mo);
      if (!model.ok()) {
        statuses[r] = model.status();
        return;
      }
      std::vector<TensorInfo> tensors;
      for (const auto& p : (*model)->params()) tensors.push_back({p.name, p.size});
      auto sync = make_sync(r, tensors);
      if (!sync.ok()) {
        statuses[r] = sync.status();
        return;
      }
      TrainerOptions to;
      to.rank = r;
      to.world_size = c.workers;
      to.batch_size = c.batch_size;
      to.epochs = 1;
      to.seed = c.data_seed;
      to.max_steps_per_epoch = c.steps;
      to.evaluate = false;
      if (c.optimizer.has_value()) to.lr_schedule.base_lr = c.optimizer->learning_rate;
      if (c.lr_schedule.has_value()) to.lr_schedule = *c.lr_schedule;
      statuses[r] = Train(to, **model, Borrow(*sync), data, nullptr, nullptr);
      finals[r] = (*model)->weights();
      if (buffers != nullptr) (*buffers)[r] = (*model)->buffer_values();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < c.workers; ++r) {
    EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
  }
  return finals;
}

// ||a - b|| / ||b|| in double.
inline double RelativeDifference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    diff += d * d;
    norm += static_cast<double>(b[i]) * b[i];
  }
  return a.size() == b.size() ? std::sqrt(diff) / std::sqrt(norm) : INFINITY;
}

}  // namespace dptrain

#endif  // DPTRAIN_TESTS_TRAIN_HARNESS_H_
