// --device parsing and the GPU each worker of a host takes: explicit cuda:N, the local rank
// mod the visible GPUs for auto and cuda, the CPU for auto without a GPU, and the messages
// of every refusal.
#include "worker/device_choice.h"

#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dptrain {
namespace {

// The GPU that `flag` and `local_rank` give with `gpus` visible; -1: the CPU. Fails the test
// when the flag does not parse or the choice fails.
int Gpu(const std::string& flag, std::optional<int> local_rank, int gpus) {
  absl::StatusOr<DeviceSpec> spec = ParseDeviceFlag(flag);
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (!spec.ok()) return -2;
  absl::StatusOr<DeviceChoice> choice = ChooseDevice(*spec, local_rank, gpus);
  EXPECT_TRUE(choice.ok()) << flag << ": " << choice.status();
  if (!choice.ok()) return -2;
  return choice->gpu.value_or(-1);
}

// The error of a choice that must fail.
absl::Status ChoiceError(const std::string& flag, std::optional<int> local_rank, int gpus) {
  absl::StatusOr<DeviceSpec> spec = ParseDeviceFlag(flag);
  if (!spec.ok()) return spec.status();
  absl::StatusOr<DeviceChoice> choice = ChooseDevice(*spec, local_rank, gpus);
  EXPECT_FALSE(choice.ok()) << flag << " chose " << choice->gpu.value_or(-1);
  return choice.status();
}

TEST(ParseDeviceFlagTest, TheFourForms) {
  absl::StatusOr<DeviceSpec> spec = ParseDeviceFlag("auto");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->kind, DeviceKind::kAuto);
  EXPECT_FALSE(spec->gpu.has_value());
  spec = ParseDeviceFlag("cpu");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->kind, DeviceKind::kCpu);
  spec = ParseDeviceFlag("cuda");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->kind, DeviceKind::kCuda);
  EXPECT_FALSE(spec->gpu.has_value());
  for (const auto& [flag, index] :
       std::vector<std::pair<std::string, int>>{{"cuda:0", 0},
                                                {"cuda:7", 7},
                                                {"cuda:15", 15},
                                                {"cuda:007", 7},
                                                {"cuda:123456789", 123456789}}) {
    spec = ParseDeviceFlag(flag);
    ASSERT_TRUE(spec.ok()) << flag << ": " << spec.status();
    EXPECT_EQ(spec->kind, DeviceKind::kCuda) << flag;
    EXPECT_EQ(spec->gpu, index) << flag;
    EXPECT_EQ(spec->flag, flag);
  }
}

TEST(ParseDeviceFlagTest, AnythingElseIsRefusedNamingTheFlag) {
  for (const std::string flag : {"",
                                 "gpu",
                                 "tpu",
                                 "CUDA",
                                 "Cuda:0",
                                 "cuda:",
                                 "cuda:x",
                                 "cuda:1x",
                                 "cuda:1.0",
                                 "cuda: 1",
                                 "cuda:1 ",
                                 "cuda:+1",
                                 "cuda:0x1",
                                 "cuda:1:2",
                                 "cuda0",
                                 "cuda 0",
                                 "auto:0",
                                 "cpu:0",
                                 " cpu",
                                 "cuda:-",
                                 "cuda:--1",
                                 "cuda:99999999999999999999",
                                 "cuda:1234567890"}) {
    absl::StatusOr<DeviceSpec> spec = ParseDeviceFlag(flag);
    ASSERT_FALSE(spec.ok()) << "'" << flag << "' parsed";
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(spec.status().message(), "--device=" + flag + ": expected auto, cpu, cuda or cuda:N");
  }
}

TEST(ParseDeviceFlagTest, NegativeIndexIsRefused) {
  for (const std::string flag : {"cuda:-1", "cuda:-12"}) {
    absl::StatusOr<DeviceSpec> spec = ParseDeviceFlag(flag);
    ASSERT_FALSE(spec.ok()) << flag;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(spec.status().message(), "--device=" + flag + ": N must be >= 0");
  }
}

TEST(ChooseDeviceTest, CpuIsTheCpuWhateverTheGpus) {
  EXPECT_EQ(Gpu("cpu", std::nullopt, 0), -1);
  EXPECT_EQ(Gpu("cpu", 3, 8), -1);
}

TEST(ChooseDeviceTest, ExplicitIndexIsThatGpu) {
  EXPECT_EQ(Gpu("cuda:0", std::nullopt, 1), 0);
  EXPECT_EQ(Gpu("cuda:1", std::nullopt, 2), 1);
  EXPECT_EQ(Gpu("cuda:7", std::nullopt, 8), 7);
  // The local rank does not move an explicit choice.
  EXPECT_EQ(Gpu("cuda:1", 0, 4), 1);
  EXPECT_EQ(Gpu("cuda:0", 3, 4), 0);
}

TEST(ChooseDeviceTest, ExplicitIndexBeyondTheVisibleGpusFails) {
  absl::Status s = ChoiceError("cuda:3", std::nullopt, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "--device=cuda:3: only 2 GPUs are visible");
  EXPECT_EQ(ChoiceError("cuda:2", 0, 2).message(), "--device=cuda:2: only 2 GPUs are visible");
  EXPECT_EQ(ChoiceError("cuda:1", 0, 1).message(), "--device=cuda:1: only 1 GPU is visible");
  EXPECT_EQ(ChoiceError("cuda:0", 0, 0).message(), "--device=cuda:0: no GPU is visible");
  EXPECT_EQ(ChoiceError("cuda:0", std::nullopt, 0).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ChooseDeviceTest, AutoAndCudaTakeTheLocalRankModTheGpus) {
  for (const std::string flag : {"auto", "cuda"}) {
    // One worker per GPU.
    for (int r = 0; r < 4; ++r) EXPECT_EQ(Gpu(flag, r, 4), r) << flag;
    // More workers than GPUs: round robin.
    EXPECT_EQ(Gpu(flag, 2, 2), 0) << flag;
    EXPECT_EQ(Gpu(flag, 3, 2), 1) << flag;
    EXPECT_EQ(Gpu(flag, 7, 3), 1) << flag;
    EXPECT_EQ(Gpu(flag, 5, 1), 0) << flag;
    // Fewer workers than GPUs: the first ones.
    EXPECT_EQ(Gpu(flag, 1, 8), 1) << flag;
    // No local rank: GPU 0, as before.
    EXPECT_EQ(Gpu(flag, std::nullopt, 1), 0) << flag;
    EXPECT_EQ(Gpu(flag, std::nullopt, 4), 0) << flag;
  }
}

TEST(ChooseDeviceTest, EveryGpuOfAHostIsUsedOnceWithOneWorkerEach) {
  for (int gpus = 1; gpus <= 8; ++gpus) {
    std::vector<int> used(gpus, 0);
    for (int r = 0; r < gpus; ++r) ++used[Gpu("auto", r, gpus)];
    EXPECT_EQ(used, std::vector<int>(gpus, 1)) << gpus << " GPUs";
  }
}

TEST(ChooseDeviceTest, AutoWithoutAGpuIsTheCpuAndCudaFails) {
  absl::StatusOr<DeviceChoice> choice = ChooseDevice(*ParseDeviceFlag("auto"), 1, 0);
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_FALSE(choice->gpu.has_value());
  EXPECT_EQ(choice->reason, "no GPU is visible");
  EXPECT_EQ(Gpu("auto", std::nullopt, 0), -1);
  absl::Status s = ChoiceError("cuda", 1, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "--device=cuda: no GPU is visible");
}

TEST(ChooseDeviceTest, ReasonsSayWhy) {
  EXPECT_EQ(ChooseDevice(*ParseDeviceFlag("cuda:1"), 0, 2)->reason, "--device=cuda:1");
  EXPECT_EQ(ChooseDevice(*ParseDeviceFlag("auto"), 3, 2)->reason, "local rank 3, 2 GPUs visible");
  EXPECT_EQ(ChooseDevice(*ParseDeviceFlag("cuda"), 0, 1)->reason, "local rank 0, 1 GPU visible");
  EXPECT_EQ(ChooseDevice(*ParseDeviceFlag("auto"), std::nullopt, 2)->reason,
            "no local rank, 2 GPUs visible");
  EXPECT_EQ(ChooseDevice(*ParseDeviceFlag("cpu"), 0, 2)->reason, "--device=cpu");
}

TEST(ChooseDeviceTest, NegativeInputsAreRefused) {
  absl::StatusOr<DeviceChoice> choice = ChooseDevice(*ParseDeviceFlag("auto"), -1, 2);
  ASSERT_FALSE(choice.ok());
  EXPECT_EQ(choice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(choice.status().message(), "local rank -1: must be >= 0");
  choice = ChooseDevice(*ParseDeviceFlag("auto"), 0, -1);
  ASSERT_FALSE(choice.ok());
  EXPECT_EQ(choice.status().message(), "-1 visible GPUs: must be >= 0");
}

}  // namespace
}  // namespace dptrain
