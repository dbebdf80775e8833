// Finds and loads the CUDA backend (libdptrain_cuda.so, worker/cuda/backend.h) at run time,
// so that gpu_worker itself links no CUDA library: where the plugin or CUDA's libraries are
// missing, loading fails with a message that says why and the worker trains on the CPU.
#ifndef DPTRAIN_WORKER_GPU_BACKEND_H_
#define DPTRAIN_WORKER_GPU_BACKEND_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/cuda/backend.h"

namespace dptrain {

// Where the plugin is looked for, in order: $DPTRAIN_CUDA_BACKEND if set (then only
// there), else libdptrain_cuda.so beside the executable, in its cuda/ folder (Bazel's
// bazel-bin/worker layout) and in ../lib.
std::vector<std::string> CudaBackendCandidates();

// The backend from the first candidate that exists. Unavailable naming the file and
// dlopen's error (e.g. "libcudnn.so.9: cannot open shared object file") when it cannot be
// loaded, or listing where it looked when none exists. The library stays loaded for the
// life of the process (models it made may outlive the backend object).
absl::StatusOr<std::unique_ptr<cuda::Backend>> LoadCudaBackend();

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_GPU_BACKEND_H_
