// One kernel source for AMD and NVIDIA: HIP when compiled as HIP (clang -x hip, hipcc, amdclang++),
// CUDA when compiled by nvcc (used only to check numerics on an NVIDIA GPU; production is gfx942).
#pragma once
#include <stdint.h>

#if defined(__HIP__) || defined(__HIPCC__)
#include <hip/hip_runtime.h>
typedef hipStream_t gpu_stream_t;
#define gpu_get_last_error hipGetLastError
#define gpu_success hipSuccess
#else
#include <cuda_runtime.h>
typedef cudaStream_t gpu_stream_t;
#define gpu_get_last_error cudaGetLastError
#define gpu_success cudaSuccess
#endif
