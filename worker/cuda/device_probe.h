// Is there a GPU this process can use? Answers without aborting on machines with no
// driver or no device, so that --device=auto can fall back to the CPU and say why.
#ifndef DPTRAIN_WORKER_CUDA_DEVICE_PROBE_H_
#define DPTRAIN_WORKER_CUDA_DEVICE_PROBE_H_

#include <string>

#include "absl/status/statusor.h"

namespace dptrain {

struct GpuInfo {
  int device = 0;
  std::string name;
  int compute_capability = 0;  // e.g. 90 for an H100.
  size_t memory_bytes = 0;
};

// How many GPUs this process sees (cudaGetDeviceCount, after CUDA_VISIBLE_DEVICES): 0 when
// the driver reports no device; Unavailable (naming the call) when CUDA cannot answer (no
// driver, too old a driver). Creates no context.
absl::StatusOr<int> VisibleGpuCount();

// GPU `device`'s description, after making it the calling thread's current device, running
// a small kernel on it and checking its result. Unavailable (naming the failing CUDA call)
// when there is no usable GPU; InvalidArgument when `device` is not in [0, VisibleGpuCount()).
absl::StatusOr<GpuInfo> ProbeGpu(int device);

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_CUDA_DEVICE_PROBE_H_
