#include "common/malloc_tuning.h"

#include <malloc.h>

namespace dptrain {

bool KeepTensorBuffersInHeap() {
  // Setting either value also turns off glibc's dynamic adjustment of both.
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, 256 << 20) == 1;
  return mmap_ok && trim_ok;
}

void ReturnFreeMemoryToKernel() { malloc_trim(0); }

}  // namespace dptrain
