#include "worker/worker_config.h"

#include <cstdlib>
#include <string>

#include "absl/flags/reflection.h"
#include "gtest/gtest.h"

namespace dptrain {
namespace {

// Sets gpu_worker flag `name` as the command line would.
void Set(const char* name, const std::string& value) {
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  ASSERT_NE(flag, nullptr) << name;
  std::string error;
  ASSERT_TRUE(flag->ParseFrom(value, &error)) << name << ": " << error;
}

class WorkerConfigTest : public testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"RANK", "WORLD_SIZE", "JOB_COMPLETION_INDEX", "MASTER_ADDR",
                             "MASTER_PORT", "LOCAL_WORLD_SIZE", "LOCAL_RANK"}) {
      unsetenv(name);
    }
  }
  absl::FlagSaver saver_;  // Every test starts from the defaults.
};

TEST_F(WorkerConfigTest, ReadsEveryGroupOnceWithTheEnvironmentWhereFlagsAreOpen) {
  Set("mode", "allreduce");
  Set("lr", "0.1");
  Set("momentum", "0.9");
  Set("data_format", "cifar");
  Set("data_mean", "0.5,0.25,0.125");
  Set("data_std", "1,2,4");
  Set("random_crop_padding", "4");
  Set("random_hflip", "true");
  Set("data_on_device", "auto");
  Set("model", "net.ONNX");
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "3", 1);
  setenv("MASTER_PORT", "29500", 1);
  setenv("LOCAL_WORLD_SIZE", "3", 1);
  absl::StatusOr<WorkerConfig> c = WorkerConfigFromFlags();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mode, SyncMode::kAllReduce);
  EXPECT_EQ(c->rank, 1);
  EXPECT_EQ(c->world_size, 3);
  EXPECT_EQ(c->local_world_size, 3);
  EXPECT_EQ(c->master_port, 29500);
  EXPECT_EQ(c->master_addr, "127.0.0.1");
  EXPECT_FLOAT_EQ(c->optimizer.learning_rate, 0.1f);
  EXPECT_FLOAT_EQ(c->optimizer.momentum, 0.9f);
  EXPECT_EQ(c->ps_expect.values.at("momentum"), c->optimizer.momentum);
  EXPECT_EQ(c->data.format, "cifar");
  EXPECT_EQ(c->data.mean, (std::vector<float>{0.5f, 0.25f, 0.125f}));
  EXPECT_EQ(c->data.std, (std::vector<float>{1, 2, 4}));
  EXPECT_EQ(c->data.crop_padding, 4);
  EXPECT_TRUE(c->data.hflip);
  EXPECT_EQ(c->data.on_device, DataOnDevice::kAuto);
  EXPECT_TRUE(IsOnnxModel(c->model));
  EXPECT_FALSE(IsOnnxModel("resnet18"));
  EXPECT_TRUE(c->save_model.empty());  // Rank 0's only.
}

TEST_F(WorkerConfigTest, BadFlagsNameTheFlag) {
  struct Case {
    std::vector<std::pair<const char*, std::string>> flags;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{}, "--ps is required in ps mode (host:port,...)"},
      {{{"mode", "mesh"}}, "--mode must be ps, master or allreduce, got 'mesh'"},
      {{{"ps", "a:1"}, {"data_on_device", "gpu"}},
       "--data_on_device=gpu: expected auto, on or off"},
      {{{"mode", "master"}}, "--lr must be > 0 in master mode (the workers apply the optimizer)"},
      {{{"ps", "a:1"}, {"data_format", "csv"}},
       "--data_format: must be idx, cifar, imagefolder or npy (or empty: detected), got 'csv'"},
      {{{"ps", "a:1"}, {"image_size", "32x"}},
       "--image_size: image size '32x': expected S (Resize(S) + CenterCrop(S)) or HxW "
       "(Resize((H, W))), sides in [1, 4096]"},
      {{{"ps", "a:1"}, {"data_format", "cifar"}, {"image_size", "32"}},
       "--image_size: applies to image folders (--data_format=imagefolder), not to cifar"},
      {{{"ps", "a:1"}, {"data_mean", "0.5"}},
       "--data_mean: and --data_std need one value per channel each; got 1 and 0"},
      {{{"ps", "a:1"}, {"data_mean", "0.5"}, {"data_std", "0"}},
       "--data_std: every value must be > 0"},
      {{{"ps", "a:1"}, {"data_mean", "x"}, {"data_std", "1"}},
       "--data_mean: 'x' is not a finite float32 number"},
      {{{"ps", "a:1"}, {"save_dir", "/tmp/x"}},
       "--save_dir: is for master and allreduce mode (ps mode: ps_server --checkpoint_dir)"},
      {{{"ps", "a:1"}, {"save_every", "5"}},
       "--save_dir: --save_every and --resume need a --save_dir"},
      {{{"ps", "a:1"}, {"rank", "2"}, {"world_size", "2"}}, "rank 2 is not in [0, world_size=2)"},
      {{{"mode", "allreduce"}, {"lr", "0.1"}, {"rank", "1"}, {"world_size", "2"}},
       "rank 1 needs rank 0's port: --master_port or $MASTER_PORT"},
      {{{"ps", "a:1"}, {"precision", "bf16"}, {"tf32", "true"}},
       "--tf32 applies to --precision=fp32 only"},
      {{{"ps", "a:1"}, {"conv", "fft"}}, "--conv: must be auto, im2col or onednn, got 'fft'"},
      {{{"ps", "a:1"}, {"wire_dtype", "fp8"}}, "--wire_dtype: must be fp32, bf16 or fp16"},
      {{{"ps", "a:1"}, {"onnx_buffers", "mean"}},
       "--onnx_buffers: names initializers of an ONNX model (--model=FILE.onnx)"},
      {{{"ps", "a:1"}, {"label_smoothing", "1"}}, "--label_smoothing: must be in [0, 1), got 1"},
      {{{"ps", "a:1"}, {"nesterov", "true"}},
       "--optimizer: nesterov needs sgd with a momentum > 0 (as torch.optim.SGD)"},
      {{{"ps", "a:1"}, {"label_smoothing", "-0.1"}},
       "--label_smoothing: must be in [0, 1), got -0.1"},
      {{{"ps", "a:1"}, {"model", "m.onnx"}, {"loss", "mse"}, {"label_smoothing", "0.1"}},
       "--label_smoothing: applies to --loss=cross_entropy only"},
      {{{"ps", "a:1"}, {"model", "m.onnx"}, {"loss", "l1"}, {"label_smoothing", "0.1"}},
       "--label_smoothing: applies to --loss=cross_entropy only"},
      {{{"ps", "a:1"}, {"model", "m.onnx"}, {"loss", "huber"}},
       "--loss: must be auto, cross_entropy, mse, l1 or bce, got 'huber'"},
      {{{"ps", "a:1"}, {"loss", "l1"}}, "--loss: the built-in model mlp trains with cross_entropy"},

      {{{"ps", "a:1"}, {"class_weights", "1,x"}},
       "--class_weights: 'x' is not a finite float32 number"},
      {{{"ps", "a:1"}, {"class_weights", "0,0"}},
       "--class_weights: every weight must be >= 0, and one > 0"},
      {{{"ps", "a:1"}, {"model", "m.onnx"}, {"loss", "bce"}, {"class_weights", "1,2"}},
       "--class_weights: apply to --loss=cross_entropy only"},
      {{{"ps", "a:1"}, {"test_fraction", "1"}},
       "--test_fraction: must be in (0, 1) (or 0: the data's test split), got 1"},
      {{{"ps", "a:1"}, {"test_fraction", "-0.1"}},
       "--test_fraction: must be in (0, 1) (or 0: the data's test split), got -0.1"},
      {{{"ps", "a:1"}, {"batch_size", "0"}}, "--batch_size: must be >= 1"},
      {{{"ps", "a:1"}, {"device", "tpu"}}, "--device=tpu: expected auto, cpu, cuda or cuda:N"},
      {{{"ps", "a:1"}, {"device", "cuda:x"}},
       "--device=cuda:x: expected auto, cpu, cuda or cuda:N"},
      {{{"ps", "a:1"}, {"device", "cuda:"}}, "--device=cuda:: expected auto, cpu, cuda or cuda:N"},
      {{{"ps", "a:1"}, {"device", "cuda:-1"}}, "--device=cuda:-1: N must be >= 0"},
      {{{"ps", "a:1"}, {"local_rank", "2"}, {"local_world_size", "2"}},
       "local rank 2 is not in [0, local_world_size=2)"},
  };
  for (const Case& c : cases) {
    absl::FlagSaver saver;
    for (const auto& [name, value] : c.flags) Set(name, value);
    absl::StatusOr<WorkerConfig> config = WorkerConfigFromFlags();
    ASSERT_FALSE(config.ok()) << c.message;
    EXPECT_EQ(config.status().message(), c.message);
  }
}

TEST_F(WorkerConfigTest, DeviceAndLocalRank) {
  Set("ps", "a:1");
  absl::StatusOr<WorkerConfig> c = WorkerConfigFromFlags();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->device.kind, DeviceKind::kAuto);
  EXPECT_FALSE(c->local_rank.has_value());  // Neither flag nor environment: not given.
  EXPECT_FALSE(c->deterministic);

  setenv("LOCAL_RANK", "3", 1);  // As torchrun and deploy/local_cluster.sh set it.
  Set("device", "cuda");
  Set("deterministic", "true");
  c = WorkerConfigFromFlags();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->device.kind, DeviceKind::kCuda);
  EXPECT_FALSE(c->device.gpu.has_value());
  EXPECT_EQ(c->local_rank, 3);
  EXPECT_TRUE(c->deterministic);

  Set("local_rank", "1");  // The flag wins over the environment.
  Set("device", "cuda:2");
  c = WorkerConfigFromFlags();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->local_rank, 1);
  EXPECT_EQ(c->device.gpu, 2);
  EXPECT_EQ(c->device.flag, "cuda:2");

  Set("device", "cpu");
  c = WorkerConfigFromFlags();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->device.kind, DeviceKind::kCpu);

  setenv("LOCAL_WORLD_SIZE", "4", 1);  // Within the host's workers.
  setenv("LOCAL_RANK", "", 1);         // Empty: not given.
  Set("local_rank", "-1");
  c = WorkerConfigFromFlags();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->local_rank.has_value());
}

TEST_F(WorkerConfigTest, LocalRankGarbageIsRefusedNamingTheVariable) {
  Set("ps", "a:1");
  for (const std::string value : {"x", "1x", "-1", "1.5", " ", "0x1", "99999999999"}) {
    setenv("LOCAL_RANK", value.c_str(), 1);
    absl::StatusOr<WorkerConfig> c = WorkerConfigFromFlags();
    ASSERT_FALSE(c.ok()) << "LOCAL_RANK='" << value << "' accepted";
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.status().message(), "$LOCAL_RANK='" + value + "' is not a non-negative integer");
  }
  setenv("LOCAL_RANK", "5", 1);
  setenv("LOCAL_WORLD_SIZE", "4", 1);
  absl::StatusOr<WorkerConfig> c = WorkerConfigFromFlags();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "local rank 5 is not in [0, local_world_size=4)");
}

}  // namespace
}  // namespace dptrain
