#include "worker/cuda/device_probe.h"

#include <iostream>

#include "gtest/gtest.h"

namespace dptrain {
namespace {

// On a GPU machine: a description of device 0 after a kernel ran correctly. Without one:
// a clean Unavailable naming the CUDA call (never a crash), and the test says it skipped.
TEST(DeviceProbeTest, DescribesTheGpuOrFailsCleanly) {
  auto info = ProbeGpu();
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
}

}  // namespace
}  // namespace dptrain
