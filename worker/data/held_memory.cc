#include "worker/data/held_memory.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>

namespace dptrain {

int64_t MachineMemoryBytes() {
  int64_t memory = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  // A container's limit (cgroup v2; "max" when none, which does not parse as a number).
  std::ifstream limit("/sys/fs/cgroup/memory.max");
  int64_t cgroup = 0;
  if (limit >> cgroup && cgroup > 0) memory = std::min(memory, cgroup);
  return std::max<int64_t>(memory, 1);
}

}  // namespace dptrain
