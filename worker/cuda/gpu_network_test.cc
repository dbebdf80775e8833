// The CUDA network made from each CPU model has the CPU layout, name for name: what the
// parameter server, the all-reduce and the safetensors files see does not depend on the
// device. Needs no GPU (building GPU layers touches none), so it runs in CI.
#include "worker/cuda/gpu_network.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/nn/architectures.h"
#include "worker/nn/model.h"
#include "worker/nn/sequential_block.h"

namespace dptrain {
namespace cuda {
namespace {

void ExpectSameLayout(const std::vector<nn::ParamInfo>& cpu,
                      const std::vector<nn::TensorSpec>& gpu) {
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_EQ(cpu[i].name, gpu[i].name) << i;
    EXPECT_EQ(cpu[i].shape, gpu[i].shape) << cpu[i].name;
  }
}

class GpuNetworkTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuNetworkTest, SameParametersAndBuffersAsTheCpuNetwork) {
  absl::StatusOr<nn::Sequential<float>> cpu = nn::BuildNetwork<float>(GetParam());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  absl::StatusOr<std::unique_ptr<GpuSequentialBlock>> gpu = ToGpu(*cpu);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ExpectSameLayout(nn::DescribeParams(*cpu), (*gpu)->ParamSpecs());
  ExpectSameLayout(nn::DescribeBuffers(*cpu), (*gpu)->BufferSpecs());
  EXPECT_EQ(nn::SpecsSize((*gpu)->ParamSpecs()), cpu->num_params());
}

INSTANTIATE_TEST_SUITE_P(Models, GpuNetworkTest,
                         ::testing::Values("mlp", "lenet", "resnet18"));

TEST(GpuNetworkTest, SmallResNetWithStridedShortcuts) {
  absl::StatusOr<nn::Sequential<float>> cpu =
      nn::BuildResNet<float>({{3, 9, 9}, {4, 6}, 1, 5});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  absl::StatusOr<std::unique_ptr<GpuSequentialBlock>> gpu = ToGpu(*cpu);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ExpectSameLayout(nn::DescribeParams(*cpu), (*gpu)->ParamSpecs());
  ExpectSameLayout(nn::DescribeBuffers(*cpu), (*gpu)->BufferSpecs());
}

// A layer the CUDA backend does not know.
class Identity final : public nn::Layer<float> {
 public:
  std::string ToString() const override { return "Identity()"; }
  absl::StatusOr<nn::Dims> OutputDims(const nn::Dims& input) const override { return input; }
  nn::TensorRef<float> Forward(const nn::LayerContext<float>&, nn::TensorRef<float> input,
                               bool) override {
    return input;
  }
  nn::TensorRef<float> Backward(const nn::LayerContext<float>&, nn::TensorRef<float> grad,
                                bool) override {
    return grad;
  }
};

TEST(GpuNetworkTest, UnknownLayerIsUnimplementedAndNamed) {
  absl::StatusOr<std::unique_ptr<GpuLayer>> gpu = ToGpu(Identity(), {3, 4, 4});
  ASSERT_FALSE(gpu.ok());
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(gpu.status().message().find("Identity()"), std::string::npos) << gpu.status();
}

}  // namespace
}  // namespace cuda
}  // namespace dptrain
