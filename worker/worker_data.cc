#include "worker/worker_data.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/data/data_source.h"
#include "worker/data/holdout.h"
#include "worker/data/transforms.h"

namespace dptrain {
namespace {

// OK if every target value of `data` is a probability, in [0, 1] (what bce takes); else
// InvalidArgument naming the first that is not.
absl::Status CheckProbabilities(const Dataset& data, const std::string& what) {
  for (size_t k = 0; k < data.targets.size(); ++k) {
    const float t = data.targets[k];
    if (t >= 0 && t <= 1) continue;
    return absl::InvalidArgumentError(
        absl::StrCat("--loss=bce takes target values in [0, 1] (probabilities: multi-label), and ",
                     what, " has ", t, " at sample ", k / data.targets_per_sample, ", index ",
                     k % data.targets_per_sample));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<graph::Loss> ChooseLoss(const WorkerConfig& config, const Dataset& train,
                                       const Dataset& test) {
  const graph::Loss chosen = config.loss == "mse"   ? graph::Loss::kMse
                             : config.loss == "l1"  ? graph::Loss::kL1
                             : config.loss == "bce" ? graph::Loss::kBce
                                                    : graph::Loss::kSoftmaxCrossEntropy;
  if (!train.regression()) return chosen;
  const std::string what = absl::StrCat(config.data.dir, " holds regression targets (",
                                        train.targets_per_sample, " float value(s) per sample)");
  if (!IsOnnxModel(config.model)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--model=", config.model, " is a built-in classifier, and ", what,
        ": train a model of yours (--model=FILE.onnx), or save class labels as integers"));
  }
  if (config.loss == "cross_entropy" || config.label_smoothing != 0 ||
      !config.class_weights.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(config.loss == "cross_entropy" ? "--loss=cross_entropy"
                     : config.label_smoothing != 0  ? "--label_smoothing"
                                                    : "--class_weights",
                     " is for class labels, and ", what,
                     ": --loss=mse, l1 or bce (or save class labels as integers)"));
  }
  if (chosen == graph::Loss::kBce) {
    DPTRAIN_RETURN_IF_ERROR(CheckProbabilities(train, "the training set"));
    DPTRAIN_RETURN_IF_ERROR(CheckProbabilities(test, "the test set"));
  }
  return chosen == graph::Loss::kSoftmaxCrossEntropy ? graph::Loss::kMse : chosen;
}

std::string Scores(const Dataset& data) {
  if (!data.regression()) return absl::StrCat(data.num_classes, " classes");
  return absl::StrCat(data.targets_per_sample, " target value(s) per sample (regression)");
}

absl::Status LoadWorkerData(const DataConfig& data, int threads, uint64_t seed,
                            const std::string& who, std::ostream& log, Dataset& train,
                            Dataset& test) {
  LoadOptions load;
  load.threads = threads;
  load.image_size = data.image_size;
  load.data_loading = data.data_loading;
  DPTRAIN_ASSIGN_OR_RETURN(const std::string missing, TestSplitFiles(data.dir, data.format));
  if (missing.empty() && data.test_fraction > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--test_fraction holds out a test set for data without one, and ", data.dir,
                     " has a test split: leave the flag out, or move the test files away"));
  }
  // (Under --data_loading=auto a set too large to hold is read as needed, and HoldOut refuses
  // it in one line.)
  if (!missing.empty() && data.test_fraction > 0 && data.data_loading == DataLoading::kStream) {
    return absl::InvalidArgumentError(
        "--test_fraction splits a training set held in memory, and --data_loading=stream "
        "reads it as needed: save a test split, or leave --data_loading out");
  }
  // The training set first: its reader names a missing or bad training file.
  DPTRAIN_ASSIGN_OR_RETURN(train, LoadDataset(data.dir, data.format, /*train=*/true, load));
  if (!missing.empty() && data.test_fraction == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        data.dir, " has no test split (", missing,
        "): save one, or hold out part of the training set with --test_fraction (e.g. 0.1)"));
  }
  if (!missing.empty()) {
    const int64_t all = train.size;
    absl::StatusOr<HeldOut> split = HoldOut(std::move(train), data.test_fraction, seed);
    if (!split.ok()) {
      return absl::Status(split.status().code(),
                          absl::StrCat("--test_fraction: ", split.status().message()));
    }
    train = std::move(split->train);
    test = std::move(split->test);
    log << who << ": the test set is " << test.size << " of the " << all
        << " training samples, held out (--test_fraction=" << data.test_fraction
        << ", --seed=" << seed << "; the same on every worker)" << std::endl;
  } else {
    // An image folder's test split all gray beside a training set in colour is loaded as RGB
    // (torchvision loads every image so).
    LoadOptions test_load = load;
    test_load.color = train.channels == 3;
    DPTRAIN_ASSIGN_OR_RETURN(test, LoadDataset(data.dir, data.format, /*train=*/false, test_load));
  }
  if (test.ids != train.ids || test.features() != train.features()) {
    return absl::InvalidArgumentError(absl::StrCat(data.dir, ": the training set holds ",
                                                   train.kind(), ", the test set ", test.kind()));
  }
  if ((train.ids || train.features()) && test.channels != train.channels) {
    return absl::InvalidArgumentError(absl::StrCat(data.dir, ": the training samples hold ",
                                                   train.channels, train.ids ? " ids" : " features",
                                                   " each, the test samples ", test.channels));
  }
  if (test.channels != train.channels || test.rows != train.rows || test.cols != train.cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        data.dir, ": the training images are ", train.channels, "x", train.rows, "x", train.cols,
        ", the test images ", test.channels, "x", test.rows, "x", test.cols));
  }
  if (test.regression() != train.regression() ||
      test.targets_per_sample != train.targets_per_sample) {
    return absl::InvalidArgumentError(absl::StrCat(
        data.dir, ": the training set has ", Scores(train), ", the test set has ", Scores(test)));
  }
  if (test.num_classes > train.num_classes) {
    return absl::InvalidArgumentError(absl::StrCat(data.dir, ": the test set has ",
                                                   test.num_classes, " classes, the training set ",
                                                   train.num_classes));
  }
  train.KeepFirst(data.train_subset);
  test.KeepFirst(data.test_subset);
  if (!data.mean.empty()) {
    if (train.ids) {
      return absl::InvalidArgumentError(
          "--data_mean/--data_std normalise images; the data set holds integer ids");
    }
    if (static_cast<int>(data.mean.size()) != train.channels) {  // Features: one per feature.
      return absl::InvalidArgumentError(absl::StrCat(
          "--data_mean: ", data.mean.size(), " values for ",
          train.features() ? absl::StrCat("feature vectors of ", train.channels, " features")
                           : absl::StrCat("images of ", train.channels, " channel(s)")));
    }
    DPTRAIN_RETURN_IF_ERROR(Normalize(train, data.mean, data.std));
    DPTRAIN_RETURN_IF_ERROR(Normalize(test, data.mean, data.std));
  }
  return absl::OkStatus();
}

}  // namespace dptrain
