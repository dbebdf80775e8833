// libdptrain_cuda.so: the Backend of backend.h over CudaModel and the device probe.
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/cuda/backend.h"
#include "worker/cuda/cuda_model.h"
#include "worker/cuda/device_probe.h"
#include "worker/graph/op_registry.h"

namespace dptrain {
namespace cuda {
namespace {

class CudaBackend final : public Backend {
 public:
  absl::StatusOr<int> DeviceCount() override { return VisibleGpuCount(); }

  absl::StatusOr<std::string> Probe(int device) override {
    absl::StatusOr<GpuInfo> gpu = ProbeGpu(device);
    if (!gpu.ok()) return gpu.status();
    return absl::StrCat("GPU ", gpu->device, " is a ", gpu->name, " (sm_", gpu->compute_capability,
                        ")");
  }

  absl::StatusOr<std::unique_ptr<nn::Model>> CreateModel(const nn::ModelOptions& model,
                                                         const BackendOptions& options) override {
    DPTRAIN_ASSIGN_OR_RETURN(const DeviceOptions device, ToDeviceOptions(options));
    absl::StatusOr<std::unique_ptr<CudaModel>> made = CudaModel::Create(model, device);
    if (!made.ok()) return made.status();
    return std::unique_ptr<nn::Model>(*std::move(made));
  }

  absl::StatusOr<std::unique_ptr<nn::Model>> CreateGraphModel(
      const graph::Graph& graph, const graph::GraphModelOptions& model,
      const BackendOptions& options) override {
    DPTRAIN_ASSIGN_OR_RETURN(const DeviceOptions device, ToDeviceOptions(options));
    absl::StatusOr<std::unique_ptr<CudaModel>> made =
        CudaModel::CreateFromGraph(graph, graph::BuiltinOps(), model, device);
    if (!made.ok()) return made.status();
    return std::unique_ptr<nn::Model>(*std::move(made));
  }

 private:
  static absl::StatusOr<DeviceOptions> ToDeviceOptions(const BackendOptions& options) {
    DeviceOptions device;
    device.device = options.device;
    device.tf32 = options.tf32;
    device.deterministic = options.deterministic;
    device.cuda_graphs = options.cuda_graphs;
    if (options.precision == "fp16") {
      device.precision = Precision::kFp16;
    } else if (options.precision == "bf16") {
      device.precision = Precision::kBf16;
    } else if (options.precision != "fp32") {
      return absl::InvalidArgumentError(
          absl::StrCat("precision must be fp32, fp16 or bf16, got '", options.precision, "'"));
    }
    return device;
  }
};

}  // namespace
}  // namespace cuda
}  // namespace dptrain

extern "C" __attribute__((visibility("default"))) dptrain::cuda::Backend*
DptrainCreateCudaBackend() {
  return new dptrain::cuda::CudaBackend();
}
