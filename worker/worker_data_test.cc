// The worker's data from its config: a test set held out where the data has none (or the one
// line that says it has none), the refusals around it, and the loss the data calls for.
#include "worker/worker_data.h"

#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "worker/data/test_files.h"

namespace dptrain {
namespace {

#define EXPECT_PREFIX(text, prefix) EXPECT_TRUE(absl::StartsWith(text, prefix)) << (text)

using testing_files::FreshDir;
using testing_files::NpyFile;
using testing_files::RawBytes;
using testing_files::WriteFile;

// DIR/train_features.npy of 8 samples of 2 features (sample i: {i, -i}) and labels i % 3, or
// float targets i / 2 (regression).
std::string EightSamples(const std::string& name, bool targets = false) {
  const std::string dir = FreshDir(name);
  std::vector<float> features;
  std::vector<int64_t> labels;
  std::vector<float> values;
  for (int i = 0; i < 8; ++i) {
    features.insert(features.end(), {static_cast<float>(i), static_cast<float>(-i)});
    labels.push_back(i % 3);
    values.push_back(i / 2.0f);
  }
  WriteFile(dir + "/train_features.npy", NpyFile("<f4", {8, 2}, RawBytes(features)));
  WriteFile(dir + "/train_labels.npy", targets ? NpyFile("<f4", {8}, RawBytes(values))
                                               : NpyFile("<i8", {8}, RawBytes(labels)));
  return dir;
}

TEST(WorkerDataTest, DataWithoutATestSplitIsRefusedOrSplit) {
  DataConfig data;
  data.dir = EightSamples("worker_data_split");
  data.data_loading = DataLoading::kLoad;
  Dataset train, test;
  std::ostringstream log;
  absl::Status s = LoadWorkerData(data, 1, 7, "rank 0/1", log, train, test);
  EXPECT_EQ(s.message(), data.dir +
                             " has no test split (test_images.npy (or test_ids.npy, "
                             "test_features.npy) and test_labels.npy): save one, or hold out part "
                             "of the training set with --test_fraction (e.g. 0.1)");
  data.test_fraction = 0.25;
  ASSERT_TRUE(LoadWorkerData(data, 1, 7, "rank 0/1", log, train, test).ok());
  EXPECT_EQ(train.size, 6);
  EXPECT_EQ(test.size, 2);
  EXPECT_EQ(train.num_classes, 3);
  EXPECT_EQ(test.num_classes, 3);
  EXPECT_EQ(log.str(),
            "rank 0/1: the test set is 2 of the 8 training samples, held out "
            "(--test_fraction=0.25, --seed=7; the same on every worker)\n");
  // The subsets cut the split, and the counts said are the split's.
  data.train_subset = 3;
  std::ostringstream again;
  ASSERT_TRUE(LoadWorkerData(data, 1, 7, "w", again, train, test).ok());
  EXPECT_EQ(train.size, 3);
  EXPECT_EQ(again.str().rfind("w: the test set is 2 of the 8 training samples", 0), 0u);

  data.data_loading = DataLoading::kStream;
  EXPECT_EQ(LoadWorkerData(data, 1, 7, "w", log, train, test).message(),
            "--test_fraction splits a training set held in memory, and --data_loading=stream "
            "reads it as needed: save a test split, or leave --data_loading out");
  data.data_loading = DataLoading::kLoad;
  data.test_fraction = 0.99;
  EXPECT_EQ(LoadWorkerData(data, 1, 7, "w", log, train, test).message(),
            "--test_fraction: holding out 8 of 8 sample(s) (ceil of 0.99 of them) leaves none to "
            "train on");
  WriteFile(data.dir + "/test_labels.npy", NpyFile("<i8", {1}, RawBytes<int64_t>({0})));
  EXPECT_EQ(LoadWorkerData(data, 1, 7, "w", log, train, test).message(),
            "--test_fraction holds out a test set for data without one, and " + data.dir +
                " has a test split: leave the flag out, or move the test files away");
}

TEST(WorkerDataTest, TheLossTheDataCallsFor) {
  WorkerConfig config;
  config.model = "net.onnx";
  DataConfig data;
  data.dir = EightSamples("worker_data_targets", /*targets=*/true);
  data.test_fraction = 0.25;
  data.data_loading = DataLoading::kLoad;
  config.data = data;
  Dataset train, test;
  std::ostringstream log;
  ASSERT_TRUE(LoadWorkerData(data, 1, 1, "w", log, train, test).ok());
  ASSERT_TRUE(train.regression() && test.regression());
  EXPECT_EQ(Scores(train), "1 target value(s) per sample (regression)");
  EXPECT_EQ(ChooseLoss(config, train, test).value(), graph::Loss::kMse);  // auto
  config.loss = "l1";
  EXPECT_EQ(ChooseLoss(config, train, test).value(), graph::Loss::kL1);
  config.loss = "bce";  // Targets up to 3.5: not probabilities.
  EXPECT_PREFIX(ChooseLoss(config, train, test).status().message(),
                "--loss=bce takes target values in [0, 1] (probabilities: multi-label), and the "
                "training set has ");
  config.loss = "cross_entropy";
  EXPECT_EQ(ChooseLoss(config, train, test).status().message(),
            "--loss=cross_entropy is for class labels, and " + data.dir +
                " holds regression targets (1 float value(s) per sample): --loss=mse, l1 or bce "
                "(or save class labels as integers)");
  config.loss = "auto";
  config.class_weights = {1, 2};
  EXPECT_PREFIX(ChooseLoss(config, train, test).status().message(),
                "--class_weights is for class labels, a");
  config.class_weights.clear();
  config.model = "mlp";
  EXPECT_PREFIX(ChooseLoss(config, train, test).status().message(),
                "--model=mlp is a built-in classifier, and " + data.dir);

  // Class labels: cross-entropy by default, or the loss named.
  config.data.dir = data.dir = EightSamples("worker_data_labels");
  ASSERT_TRUE(LoadWorkerData(data, 1, 1, "w", log, train, test).ok());
  EXPECT_EQ(Scores(train), "3 classes");
  EXPECT_EQ(ChooseLoss(config, train, test).value(), graph::Loss::kSoftmaxCrossEntropy);
  config.model = "net.onnx";
  config.loss = "bce";
  EXPECT_EQ(ChooseLoss(config, train, test).value(), graph::Loss::kBce);
}

}  // namespace
}  // namespace dptrain
