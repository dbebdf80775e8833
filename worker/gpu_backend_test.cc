// Loading the CUDA backend plugin: where it is looked for, a missing file, a library that
// is not the plugin, and (where this build has CUDA) the real plugin, whose probe then
// says why there is no usable GPU here. Runs without a GPU.
#include "worker/gpu_backend.h"

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace dptrain {
namespace {

class GpuBackendTest : public ::testing::Test {
 protected:
  void TearDown() override { unsetenv("DPTRAIN_CUDA_BACKEND"); }
};

TEST_F(GpuBackendTest, LooksBesideTheExecutableUnlessTold) {
  unsetenv("DPTRAIN_CUDA_BACKEND");
  const std::vector<std::string> where = CudaBackendCandidates();
  ASSERT_EQ(where.size(), 3u);
  EXPECT_NE(where[0].find("/libdptrain_cuda.so"), std::string::npos) << where[0];
  EXPECT_NE(where[1].find("/cuda/libdptrain_cuda.so"), std::string::npos) << where[1];
  EXPECT_NE(where[2].find("/../lib/libdptrain_cuda.so"), std::string::npos) << where[2];
  setenv("DPTRAIN_CUDA_BACKEND", "/some/where.so", 1);
  EXPECT_EQ(CudaBackendCandidates(), std::vector<std::string>{"/some/where.so"});
}

TEST_F(GpuBackendTest, MissingFileIsUnavailableAndNamed) {
  setenv("DPTRAIN_CUDA_BACKEND", "/nonexistent/libdptrain_cuda.so", 1);
  auto backend = LoadCudaBackend();
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(backend.status().message().find("/nonexistent/libdptrain_cuda.so"), std::string::npos)
      << backend.status();
}

TEST_F(GpuBackendTest, ALibraryThatIsNotThePluginIsRefused) {
  setenv("DPTRAIN_CUDA_BACKEND", "libz.so.1", 1);  // zlib: loads, has no entry point.
  auto backend = LoadCudaBackend();
  ASSERT_FALSE(backend.ok());
  EXPECT_NE(backend.status().message().find("DptrainCreateCudaBackend"), std::string::npos)
      << backend.status();
}

TEST_F(GpuBackendTest, TheRealPluginLoadsAndProbes) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const std::string plugin =
      std::string(srcdir != nullptr ? srcdir : ".") + "/dptrain/worker/cuda/libdptrain_cuda.so";
  if (FILE* f = fopen(plugin.c_str(), "r"); f != nullptr) {
    fclose(f);
  } else {
    GTEST_SKIP() << "this build has no CUDA backend (" << plugin << ")";
  }
  setenv("DPTRAIN_CUDA_BACKEND", plugin.c_str(), 1);
  auto backend = LoadCudaBackend();
  ASSERT_TRUE(backend.ok()) << backend.status();
  absl::StatusOr<int> count = (*backend)->DeviceCount();
  if (count.ok()) {
    EXPECT_GE(*count, 0);
    for (int device = 0; device < *count; ++device) {
      auto gpu = (*backend)->Probe(device);
      ASSERT_TRUE(gpu.ok()) << gpu.status();
      EXPECT_EQ(gpu->rfind(absl::StrCat("GPU ", device, " is a "), 0), 0u) << *gpu;
    }
    EXPECT_FALSE((*backend)->Probe(*count).ok());  // One past the last.
  } else {
    // This machine: no driver.
    EXPECT_EQ(count.status().code(), absl::StatusCode::kUnavailable) << count.status();
  }
  auto gpu = (*backend)->Probe(0);
  if (!gpu.ok()) {  // No driver, or no device.
    EXPECT_EQ(gpu.status().code(), absl::StatusCode::kUnavailable) << gpu.status();
  }
  nn::ModelOptions model;
  model.name = "mlp";
  cuda::BackendOptions options;
  options.precision = "fp8";
  EXPECT_EQ((*backend)->CreateModel(model, options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dptrain
