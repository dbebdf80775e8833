// Process-wide allocator settings for the binaries that move tensors (ps_server,
// gpu_worker, the benchmarks). Call once at the start of main.
#ifndef DPTRAIN_COMMON_MALLOC_TUNING_H_
#define DPTRAIN_COMMON_MALLOC_TUNING_H_

namespace dptrain {

// Every step allocates and frees buffers of a few MiB (gRPC's socket reads, frames). By
// default glibc serves those with fresh mmap()s and returns freed heap tops to the kernel,
// so each step pays page faults and page zeroing again for the same bytes; measured on the
// PS path, that was ~40 % of the time of a 64 MiB push+pull. This keeps buffers up to
// 32 MiB (glibc's maximum mmap threshold) in the heap and freed memory in the process up
// to 256 MiB. Returns false if glibc refused a setting (the defaults then stay).
bool KeepTensorBuffersInHeap();

// Returns the free heap memory of every arena to the kernel (glibc malloc_trim). The heap
// settings above keep freed buffers for reuse; a burst that is not reused (e.g. a huge
// request that gRPC buffered and then rejected as over its message limit) would otherwise
// stay resident for the life of the process. Cheap when little is free.
void ReturnFreeMemoryToKernel();

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_MALLOC_TUNING_H_
