// Room for a data set held in memory (the .npy, CIFAR and ID readers): a file larger than the
// machine's memory is refused in one line instead of the process dying (an allocation that
// throws, or the kernel's OOM killer as the pages are touched).
#ifndef DPTRAIN_WORKER_DATA_HELD_MEMORY_H_
#define DPTRAIN_WORKER_DATA_HELD_MEMORY_H_

#include <cstdint>
#include <new>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dptrain {

// The machine's memory in bytes: physical memory, or the container's limit (cgroup v2's
// memory.max) where lower.
int64_t MachineMemoryBytes();

// Grows `v` to `n` elements for `what` (a file, named in the error). ResourceExhausted, "WHAT:
// its N MiB of samples are more than this machine's M MiB of memory<hint>", when the vector
// would take more than the machine's memory or the allocation fails; `hint` follows the message
// (e.g. how to stream the data instead).
template <typename T>
absl::Status HoldInMemory(std::vector<T>& v, size_t n, const std::string& what,
                          const std::string& hint = "") {
  const int64_t memory = MachineMemoryBytes();
  const double bytes = static_cast<double>(n) * sizeof(T);
  auto exhausted = [&] {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": its ", static_cast<int64_t>(bytes / (1 << 20)),
        " MiB of samples are more than this machine's ", memory >> 20, " MiB of memory", hint));
  };
  if (bytes > static_cast<double>(memory)) return exhausted();
  try {
    v.resize(n);
  } catch (const std::bad_alloc&) {
    return exhausted();
  } catch (const std::length_error&) {
    return exhausted();
  }
  return absl::OkStatus();
}

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_DATA_HELD_MEMORY_H_
