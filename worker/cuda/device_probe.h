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

// Device 0's description, after running a small kernel on it and checking its result.
// Unavailable (naming the failing CUDA call) when there is no usable GPU.
absl::StatusOr<GpuInfo> ProbeGpu();

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_CUDA_DEVICE_PROBE_H_
