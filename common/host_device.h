// DPTRAIN_HOST_DEVICE marks a function that the host compiler and nvcc both compile: the
// per-element arithmetic that a CPU path and a CUDA kernel share (worker/graph's element
// headers, worker/nn/held_data.h), so that host tests check what the kernels run.
#ifndef DPTRAIN_COMMON_HOST_DEVICE_H_
#define DPTRAIN_COMMON_HOST_DEVICE_H_

#ifdef __CUDACC__
#define DPTRAIN_HOST_DEVICE __host__ __device__
#else
#define DPTRAIN_HOST_DEVICE
#endif

#endif  // DPTRAIN_COMMON_HOST_DEVICE_H_
