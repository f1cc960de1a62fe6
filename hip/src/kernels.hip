// Kernels of this project for DeepSeek-V4-Flash on MI300X (gfx942), with plain extern "C" launchers
// so that the torch binding (binding.cpp) needs no GPU headers and an NVIDIA build can be driven
// from ctypes. Both are bit-reproducible and deterministic by construction.
#include <float.h>
#include <math.h>
#include "gpu_compat.h"

namespace {

__device__ inline float bf16_to_float(uint16_t v) { return __uint_as_float(uint32_t(v) << 16); }

// Round to nearest even, NaN to the canonical quiet NaN: what c10::BFloat16 does.
__device__ inline uint16_t float_to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if (f != f) return 0x7FC0;
  return uint16_t((u + ((u >> 16) & 1u) + 0x7FFFu) >> 16);
}

// double -> bf16 rounded once: to float rounding to odd (truncate, then set the last bit if
// inexact), then to bf16 to nearest even. float keeps 16 more significand bits than bf16, so the
// odd bit tells the second rounding which side of a midpoint the double lay.
__device__ inline uint16_t double_to_bf16(double y) {
  if (y != y) return 0x7FC0;
  float t = float(y);
  uint32_t u = __float_as_uint(t);
  if (fabs(double(t)) > fabs(y)) u -= 1;  // rounded away from zero (or overflowed): step back
  if (double(__uint_as_float(u)) != y) u |= 1u;
  return float_to_bf16(__uint_as_float(u));
}

// a + b rounded to odd (|a| >= |b|): the rounding error of the sum survives as a sticky bit.
__device__ inline double sum_to_odd(double a, double b) {
  double s = a + b;
  double err = (a - s) + b;
  if (err == 0.0) return s;
  unsigned long long bits = __double_as_longlong(s);
  if ((err > 0.0) != (s > 0.0)) bits -= 1;
  return __longlong_as_double(bits | 1ull);
}

// out = silu(min(gate, limit)) * clamp(up, -limit, limit), in double and rounded once to bf16;
// silu(-inf) is its limit, -0. For |g| < 1, silu(g)*u = h*u + h*tanh(h)*u with h = g/2: h*u is
// exact, the correction smaller, so a tiny gate's g^2 term still decides the rounding.
}  // namespace

extern "C" __global__ void swiglu_clamp_bf16_kernel(const uint16_t* __restrict__ x, uint16_t* __restrict__ out,
                                         int64_t rows, int64_t d, float limit) {
  int64_t total = rows * d;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t r = i / d, c = i % d;
    double g = bf16_to_float(x[r * 2 * d + c]);
    double u = bf16_to_float(x[r * 2 * d + d + c]);
    double lim = limit;
    g = (g != g) ? g : (g < lim ? g : lim);  // NaN propagates as torch.clamp propagates it
    u = (u != u) ? u : (u < -lim ? -lim : (u > lim ? lim : u));
    double y;
    if (g == -INFINITY) {
      y = -0.0 * u;
    } else if (fabs(g) < 1.0) {
      double h = g * 0.5, exact = h * u;
      y = sum_to_odd(exact, h * tanh(h) * u);
      if (y == 0.0) y = exact;
    } else {
      y = g / (1.0 + exp(-g)) * u;
    }
    out[i] = double_to_bf16(y);
  }
}

namespace {

// Order-preserving map of a float to uint32 (larger float, larger key), after sanitizing:
// NaN and -inf rank as the lowest finite value, +inf as the highest.
__device__ inline uint32_t ordered(float v) {
  if (v != v || v == -INFINITY) v = -FLT_MAX;
  if (v == INFINITY) v = FLT_MAX;
  uint32_t u = __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

constexpr int kTopkThreads = 256;

}  // namespace

// Deterministic top-k of one row per block: k rounds of a block-wide max over unique 64-bit keys
// (value in the high half, inverted index in the low half): equal values go to the lower index,
// and the result never depends on thread timing or on what else is in the batch.
extern "C" __global__ void topk_f32_kernel(const float* __restrict__ logits, int64_t n, int64_t k,
                                int64_t* __restrict__ indices) {
  __shared__ unsigned long long best[kTopkThreads];
  const float* row = logits + int64_t(blockIdx.x) * n;
  unsigned long long below = ~0ull;
  for (int64_t j = 0; j < k; ++j) {
    unsigned long long mine = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      unsigned long long key = (static_cast<unsigned long long>(ordered(row[i])) << 32) |
                               (0xFFFFFFFFull - static_cast<unsigned long long>(i));
      if (key < below && key > mine) mine = key;
    }
    best[threadIdx.x] = mine;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
      if (threadIdx.x < s && best[threadIdx.x + s] > best[threadIdx.x]) best[threadIdx.x] = best[threadIdx.x + s];
      __syncthreads();
    }
    below = best[0];
    if (threadIdx.x == 0) indices[int64_t(blockIdx.x) * k + j] = int64_t(0xFFFFFFFFull - (below & 0xFFFFFFFFull));
    __syncthreads();
  }
}

extern "C" int bakery_swiglu_clamp_bf16(const void* x, void* out, int64_t rows, int64_t d, float limit,
                                        void* stream) {
  int64_t total = rows * d;
  if (total == 0) return 0;
  int64_t blocks = (total + 255) / 256;
  swiglu_clamp_bf16_kernel<<<unsigned(blocks < 65535 ? blocks : 65535), 256, 0, (gpu_stream_t)stream>>>(
      static_cast<const uint16_t*>(x), static_cast<uint16_t*>(out), rows, d, limit);
  return gpu_get_last_error() == gpu_success ? 0 : 1;
}

extern "C" int bakery_topk_f32(const float* logits, int64_t rows, int64_t n, int64_t k, int64_t* indices,
                               void* stream) {
  if (rows == 0 || k == 0) return 0;
  if (k > n || n > 0xFFFFFFFFll) return 2;
  topk_f32_kernel<<<unsigned(rows), kTopkThreads, 0, (gpu_stream_t)stream>>>(logits, n, k, indices);
  return gpu_get_last_error() == gpu_success ? 0 : 1;
}
