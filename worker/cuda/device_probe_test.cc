#include "worker/cuda/device_probe.h"

#include <iostream>

#include "gtest/gtest.h"

namespace dptrain {
namespace {

// On a GPU machine: a description of each visible GPU after a kernel ran correctly on it,
// and InvalidArgument for one past the last. Without one: a clean Unavailable naming the
// CUDA call (never a crash), and the test says it skipped.
TEST(DeviceProbeTest, DescribesEveryGpuOrFailsCleanly) {
  absl::StatusOr<int> count = VisibleGpuCount();
  if (count.ok()) {
    EXPECT_GE(*count, 0);
    EXPECT_EQ(ProbeGpu(*count).status().code(),
              *count == 0 ? absl::StatusCode::kUnavailable : absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(ProbeGpu(-1).status().code(),
              *count == 0 ? absl::StatusCode::kUnavailable : absl::StatusCode::kInvalidArgument);
  } else {
    EXPECT_EQ(count.status().code(), absl::StatusCode::kUnavailable) << count.status();
  }
  auto info = ProbeGpu(0);
  if (!info.ok()) {
    EXPECT_EQ(info.status().code(), absl::StatusCode::kUnavailable) << info.status();
    EXPECT_NE(info.status().message().find("cuda"), std::string::npos) << info.status();
    GTEST_SKIP() << "no usable GPU here (" << info.status().message()
                 << "); the GPU path was not exercised";
  }
  std::cout << "GPU 0: " << info->name << ", sm_" << info->compute_capability << ", "
            << info->memory_bytes / (1 << 20) << " MiB" << std::endl;
  EXPECT_GE(info->compute_capability, 80);
  EXPECT_GT(info->memory_bytes, 0u);
  EXPECT_EQ(info->device, 0);
  for (int device = 1; device < *count; ++device) {
    auto other = ProbeGpu(device);
    ASSERT_TRUE(other.ok()) << "GPU " << device << ": " << other.status();
    EXPECT_EQ(other->device, device);
    std::cout << "GPU " << device << ": " << other->name << std::endl;
  }
}

}  // namespace
}  // namespace dptrain
