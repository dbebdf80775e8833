// What every layer of the CUDA backend computes with: one device, one stream, the cuBLAS and
// cuDNN handles bound to that stream, the caching allocator (no cudaMalloc per step) and
// one workspace shared by all cuDNN calls (they run one after the other on the stream).
// Owned by the model; not thread-safe.
#ifndef DPTRAIN_WORKER_CUDA_DEVICE_CONTEXT_H_
#define DPTRAIN_WORKER_CUDA_DEVICE_CONTEXT_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/cuda/caching_allocator.h"

namespace dptrain {
namespace cuda {

// What convolutions and dense products compute in. fp16/bf16: mixed precision as PyTorch's
// autocast does it for them: inputs and weights cast to 16 bits, fp32 accumulation, fp32
// results, fp32 master weights and gradients; the loss is scaled (CudaModel).
enum class Precision { kFp32, kFp16, kBf16 };

// "fp32", "fp16", "bf16".
const char* PrecisionName(Precision p);

struct DeviceOptions {
  // CUDA's index of the GPU among the visible ones. Create makes it the calling thread's
  // current device; every later call on the context must come from that thread.
  int device = 0;
  Precision precision = Precision::kFp32;
  // Loss scale of the first fp16/bf16 step (GradScaler's 2^16); the scaler adapts it.
  float initial_loss_scale = 65536.0f;
  // fp32 only: lets cuBLAS and cuDNN round fp32 inputs to TF32 on tensor cores (PyTorch's
  // allow_tf32): ~1e-3 relative error instead of ~1e-6, several times the speed.
  bool tf32 = false;
  // Only cuDNN algorithms that cuDNN reports deterministic (PyTorch's
  // torch.backends.cudnn.deterministic): bitwise the same results for the same inputs.
  bool deterministic = false;
  // Largest cuDNN workspace an algorithm may ask for; faster ones needing more are skipped.
  size_t max_workspace_bytes = size_t{1} << 30;
  // A held-data step with deferred results (fp32) is captured once as a CUDA graph and then
  // replayed (CudaModel::TrainStepHeld, step_graph.h). Off until a GPU run verifies it.
  bool cuda_graphs = false;
};

class DeviceContext {
 public:
  // Selects the device and creates the stream and handles. Unavailable (naming the call)
  // without a working GPU.
  static absl::StatusOr<std::unique_ptr<DeviceContext>> Create(const DeviceOptions& options);
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  const DeviceOptions& options() const { return options_; }
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }
  cudnnHandle_t cudnn() const { return cudnn_; }
  CachingAllocator& allocator() { return *allocator_; }
  // "NVIDIA H100 80GB HBM3 (sm_90)".
  const std::string& device_name() const { return device_name_; }

  // A scratch area of at least `bytes` for the call being enqueued; grows, never shrinks.
  absl::StatusOr<void*> Workspace(size_t bytes);

  // Waits for everything enqueued on the stream.
  absl::Status Synchronize();

 private:
  explicit DeviceContext(const DeviceOptions& options) : options_(options) {}

  const DeviceOptions options_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  std::unique_ptr<CachingAllocator> allocator_;
  std::string device_name_;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

// Device memory of T from the context's caching allocator, grown on demand and returned to
// the cache when destroyed. Growing loses the contents. Move-only.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { Reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    Reset();
    data_ = o.data_;
    size_ = o.size_;
    allocator_ = o.allocator_;
    o.data_ = nullptr;
    o.size_ = 0;
    return *this;
  }

  // At least `n` > 0 elements.
  absl::StatusOr<T*> Ensure(DeviceContext& ctx, int64_t n) {
    if (n <= size_) return data_;
    Reset();
    absl::StatusOr<void*> p = ctx.allocator().Allocate(static_cast<size_t>(n) * sizeof(T));
    if (!p.ok()) return p.status();
    data_ = static_cast<T*>(*p);
    size_ = n;
    allocator_ = &ctx.allocator();
    return data_;
  }
  T* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  void Reset() {
    if (data_ != nullptr) (void)allocator_->Free(data_);
    data_ = nullptr;
    size_ = 0;
  }

  T* data_ = nullptr;
  int64_t size_ = 0;
  CachingAllocator* allocator_ = nullptr;
};

// Copies `count` floats between device addresses on ctx's stream (nothing for count <= 0 or
// the same address).
absl::Status CopyOnDevice(DeviceContext& ctx, float* to, const float* from, int64_t count);

}  // namespace cuda
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_CUDA_DEVICE_CONTEXT_H_
