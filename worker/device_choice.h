// --device: which processor a worker trains on and, on a host with several GPUs, which GPU,
// so that the workers of one host spread over its GPUs (one worker per GPU) instead of all
// opening GPU 0. Pure functions, no CUDA and no environment: worker_config.cc parses the
// flag, main.cc asks the CUDA backend how many GPUs are visible and chooses with them.
#ifndef DPTRAIN_WORKER_DEVICE_CHOICE_H_
#define DPTRAIN_WORKER_DEVICE_CHOICE_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dptrain {

enum class DeviceKind { kAuto, kCpu, kCuda };

// --device's value, parsed.
struct DeviceSpec {
  DeviceKind kind = DeviceKind::kAuto;
  std::optional<int> gpu;     // cuda:N: N (>= 0); none for auto, cpu and cuda.
  std::string flag = "auto";  // As given, for messages: "auto", "cuda:1", ...
};

// "auto", "cpu", "cuda" or "cuda:N" (N decimal digits). InvalidArgument naming the flag
// otherwise: "--device=cuda:x: expected auto, cpu, cuda or cuda:N", "--device=cuda:-1: N
// must be >= 0".
absl::StatusOr<DeviceSpec> ParseDeviceFlag(absl::string_view flag);

// What a worker uses.
struct DeviceChoice {
  std::optional<int> gpu;  // CUDA's index among the visible GPUs; none: the CPU.
  // Why, for the startup line: "--device=cuda:1", "local rank 3, 2 GPUs visible",
  // "no GPU is visible".
  std::string reason;
};

// The device of a worker with `spec` and `local_rank` (none: not given, taken as 0) on a host
// where `visible_gpus` GPUs are visible (CUDA's numbering, after CUDA_VISIBLE_DEVICES):
//   cpu: the CPU.
//   cuda:N: GPU N.
//   auto, cuda: GPU local_rank % visible_gpus (round robin when a host has more workers than
//     GPUs); auto with no GPU: the CPU.
// FailedPrecondition when the GPU asked for is not there: "--device=cuda:3: only 2 GPUs are
// visible", "--device=cuda: no GPU is visible". InvalidArgument for a negative local rank or
// GPU count.
absl::StatusOr<DeviceChoice> ChooseDevice(const DeviceSpec& spec, std::optional<int> local_rank,
                                          int visible_gpus);

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_DEVICE_CHOICE_H_
