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

extern "C" int bakery_swiglu_clamp_bf16(const void* x, void* out, int64_t rows, int64_t d, float limit,
                                        void* stream) {
  int64_t total = rows * d;
  if (total == 0) return 0;
  int64_t blocks = (total + 255) / 256;
  swiglu_clamp_bf16_kernel<<<unsigned(blocks < 65535 ? blocks : 65535), 256, 0, (gpu_stream_t)stream>>>(
      static_cast<const uint16_t*>(x), static_cast<uint16_t*>(out), rows, d, limit);
  return gpu_get_last_error() == gpu_success ? 0 : 1;
}

// ---- top-k / top-p masking of sampler logits (vLLM's apply_top_k_top_p), one block per row --------
//
// Rank: +inf, then finite values by value (-0 equals +0), then -inf and NaN (equal); ties to the lower
// index. Each element gets a unique 64-bit key: rank32(value) << 32 | (0xFFFFFFFF - index).
// top-k keeps the k best keys. top-p weighs each survivor by q = an integer in units of 2^-32:
//   u = rint((x_max - x) * 65536) in float32; q = 0 if u > 23 * 65536, else
//   q = rint(A[u >> 14] * B[(u >> 7) & 127] * C[u & 127] * 2^32), float32 products, where
//   A[i] = exp(-i/4), B[j] = exp(-j/512), C[l] = exp(-l/65536) are float32 tables built from a fixed
//   float64 polynomial (exp_det), identically here and in Python;
// so q is exp(x - x_max) to about 2e-5 relative above 1e5 units (half a unit below), non-decreasing
// in x, and every sum of q is an exact integer (no rounding, no dependence on order). With a +inf
// survivor each +inf weighs 2^32 and the rest 0. The survivor at rank position j is kept iff (sum of q ranked before it) < ceil(p * W), W the
// sum over all survivors, p taken exactly; position 0 always. Thresholds are found by counting
// passes (coarse value bins, then 8-bit key digits), in global memory or, once at most kListCap
// candidates remain, in a shared-memory list. Integer atomics only: no result depends on timing.
namespace {

// Threads per row (and coarse bins, one per thread). gfx942 runs a 1024-thread block only at 4
// waves per SIMD (128 VGPRs), which this kernel does not fit, so HIP builds use 512.
#ifndef BAKERY_TK_THREADS
#if defined(__HIP__) || defined(__HIPCC__)
#define BAKERY_TK_THREADS 512
#else
#define BAKERY_TK_THREADS 1024
#endif
#endif
constexpr int kTkThreads = BAKERY_TK_THREADS;
constexpr int kCoarseBins = BAKERY_TK_THREADS;
constexpr int kListCap = 3072;
constexpr uint32_t kRankPosInf = 0xFF800000u;
constexpr uint32_t kRankNegInf = 0x007FFFFFu;
constexpr float kUMax = 23.0f * 65536.0f;
constexpr float kWeightSpan = 24.0f;  // coarse bins of top-p span [x_max - 24, x_max]

struct TkShared {
  unsigned int cnt[kCoarseBins];
  unsigned long long wt[kCoarseBins];
  unsigned long long list[kListCap];
  float ta[93], tb[128], tc[128];
  unsigned int list_n;
  int chosen;
  unsigned int chosen_cnt;
  unsigned long long chosen_w, total_w, target, lmin, lmax;
};

// keep iff cbin(v) > bin || (cbin(v) == bin && key >= key_min); bin = -1 keeps everything. A top-p
// cut also drops what weighs 0 (never kept but at position 0: the survivors above it weigh all of W),
// which a threshold on keys alone could let through within its last bin.
struct Cut {
  float lo, scale;
  int bin;
  unsigned long long key_min;
};

__device__ inline float tk_sanitize(float v) { return v != v ? -INFINITY : v; }

__device__ inline uint32_t rank32(float v) {  // v sanitized
  uint32_t u = __float_as_uint(v);
  if (u == 0x80000000u) u = 0u;  // -0 ranks with +0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ inline float unrank32(uint32_t r) { return __uint_as_float((r & 0x80000000u) ? (r & 0x7FFFFFFFu) : ~r); }

__device__ inline unsigned long long key64(float v, int64_t i) {
  return (static_cast<unsigned long long>(rank32(v)) << 32) | (0xFFFFFFFFull - static_cast<unsigned long long>(i));
}

__device__ inline int cbin(float v, float lo, float scale) {
  float t = (v - lo) * scale;  // monotone in v; NaN (0 * inf) lands in bin 0
  if (!(t > 0.0f)) return 0;
  if (t >= float(kCoarseBins - 1)) return kCoarseBins - 1;
  return int(t);
}

__device__ inline bool keeps(const Cut& c, float v, unsigned long long key) {
  if (c.bin < 0) return true;
  int b = cbin(v, c.lo, c.scale);
  return b > c.bin || (b == c.bin && key >= c.key_min);
}

// exp(d) for d in [-24, 0] by a fixed sequence of float64 operations, each rounded once (no FMA):
// the Python side repeats it operation for operation and gets the same bits.
__device__ inline double exp_det(double d) {
  const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
  double kf = rint(gpu_dmul_rn(d, 1.4426950408889634));
  double r = gpu_dadd_rn(gpu_dadd_rn(d, -gpu_dmul_rn(kf, ln2_hi)), -gpu_dmul_rn(kf, ln2_lo));
  // Horner on the Taylor coefficients 1/i!, i = 12 down to 0
  double p = 1.0 / 479001600.0;
  p = gpu_dadd_rn(1.0 / 39916800.0, gpu_dmul_rn(r, p));
  p = gpu_dadd_rn(1.0 / 3628800.0, gpu_dmul_rn(r, p));
  p = gpu_dadd_rn(1.0 / 362880.0, gpu_dmul_rn(r, p));
  p = gpu_dadd_rn(1.0 / 40320.0, gpu_dmul_rn(r, p));
  p = gpu_dadd_rn(1.0 / 5040.0, gpu_dmul_rn(r, p));
  p = gpu_dadd_rn(1.0 / 720.0, gpu_dmul_rn(r, p));
  p = gpu_dadd_rn(1.0 / 120.0, gpu_dmul_rn(r, p));
  p = gpu_dadd_rn(1.0 / 24.0, gpu_dmul_rn(r, p));
  p = gpu_dadd_rn(1.0 / 6.0, gpu_dmul_rn(r, p));
  p = gpu_dadd_rn(1.0 / 2.0, gpu_dmul_rn(r, p));
  p = gpu_dadd_rn(1.0, gpu_dmul_rn(r, p));
  p = gpu_dadd_rn(1.0, gpu_dmul_rn(r, p));
  return ldexp(p, int(kf));
}

__device__ inline unsigned long long weight_q(const TkShared& sh, float v, float xmax) {
  float d = v - xmax;
  float u = rintf(-d * 65536.0f);
  if (!(u <= kUMax)) return 0;
  uint32_t iu = uint32_t(u);
  float w = (sh.ta[iu >> 14] * sh.tb[(iu >> 7) & 127u]) * sh.tc[iu & 127u];
  return static_cast<unsigned long long>(rintf(w * 4294967296.0f));
}

// ceil(p * w) exactly, for p in (0, 1) a float32 (p <= 0 gives 0) and w < 2^63.
__device__ inline unsigned long long ceil_p_times(float p, unsigned long long w) {
  if (!(p > 0.0f)) return 0;
  uint32_t bits = __float_as_uint(p), e = bits >> 23;
  unsigned long long m = bits & 0x7FFFFFu;
  int s;
  if (e == 0) {
    s = 149;
  } else {
    m |= 0x800000u;
    s = 150 - int(e);
  }
  unsigned long long lo = m * w, hi = __umul64hi(m, w), q;
  bool rem;
  if (s < 64) {
    q = (hi << (64 - s)) | (lo >> s);
    rem = (lo << (64 - s)) != 0;
  } else if (s == 64) {
    q = hi;
    rem = lo != 0;
  } else if (s < 128) {
    q = hi >> (s - 64);
    rem = lo != 0 || (hi << (128 - s)) != 0;
  } else {
    q = 0;
    rem = (lo | hi) != 0;
  }
  return q + (rem ? 1 : 0);
}

// f(index, value) over a row, four floats per load where the row is 16-byte aligned.
template <class F>
__device__ inline void for_row(const float* row, int64_t n, F f) {
  int64_t head = int64_t((16 - (reinterpret_cast<uintptr_t>(row) & 15)) & 15) / 4;
  if (head > n) head = n;
  for (int64_t i = threadIdx.x; i < head; i += blockDim.x) f(i, row[i]);
  int64_t nv = (n - head) / 4;
  const float4* v4 = reinterpret_cast<const float4*>(row + head);
  const int64_t bd = blockDim.x;
  int64_t j = threadIdx.x;
  if (j + bd < nv) {
    float4 a = v4[j], b = v4[j + bd];
    for (;;) {
      const int64_t i = head + 4 * j, st = 4 * bd;
      const bool more = j + 3 * bd < nv;
      float4 a2 = a, b2 = b;
      if (more) {
        a2 = v4[j + 2 * bd];
        b2 = v4[j + 3 * bd];
      }
      f(i, a.x); f(i + 1, a.y); f(i + 2, a.z); f(i + 3, a.w);
      f(i + st, b.x); f(i + st + 1, b.y); f(i + st + 2, b.z); f(i + st + 3, b.w);
      j += 2 * bd;
      if (!more) break;
      a = a2;
      b = b2;
    }
  }
  for (; j < nv; j += bd) {
    float4 a = v4[j];
    int64_t i = head + 4 * j;
    f(i, a.x); f(i + 1, a.y); f(i + 2, a.z); f(i + 3, a.w);
  }
  for (int64_t i = head + 4 * nv + threadIdx.x; i < n; i += blockDim.x) f(i, row[i]);
}

// w += q exactly with two 32-bit shared atomics (the low word's carry goes to the high word): a
// 64-bit shared atomic add is a compare-and-swap loop on NVIDIA GPUs.
__device__ inline void add_u64(unsigned long long* w, unsigned long long q) {
  unsigned int* half = reinterpret_cast<unsigned int*>(w);  // little-endian: [0] low, [1] high
  unsigned int lo = unsigned(q), hi = unsigned(q >> 32);
  if (lo != 0 && atomicAdd(&half[0], lo) > 0xFFFFFFFFu - lo) ++hi;
  if (hi != 0) atomicAdd(&half[1], hi);
}

// sh.lmin/lmax = the block's min and max of each thread's mn/mx (sh.wt is the scratch); every thread.
__device__ inline void block_min_max(TkShared& sh, unsigned long long mn, unsigned long long mx) {
  const int t = threadIdx.x;
  for (int pass = 0; pass < 2; ++pass) {
    unsigned long long v = pass == 0 ? ~mn : mx;  // both as a max
    sh.wt[t] = v;
    __syncthreads();
    if (t < 32) {
      for (int j = t + 32; j < int(blockDim.x); j += 32) v = sh.wt[j] > v ? sh.wt[j] : v;
      sh.wt[t] = v;
    }
    __syncthreads();
    if (t == 0) {
      for (int j = 1; j < 32; ++j) v = sh.wt[j] > v ? sh.wt[j] : v;
      if (pass == 0) sh.lmin = ~v; else sh.lmax = v;
    }
    __syncthreads();
  }
}

__device__ inline void zero_hist(TkShared& sh, int nb) {
  for (int t = threadIdx.x; t < nb; t += blockDim.x) {
    sh.cnt[t] = 0;
    sh.wt[t] = 0;
  }
}

// Called by every thread after a histogram of nb bins (nb <= blockDim.x) is complete and visible.
// Count mode: picks the bin holding the need-th best element; need becomes the rank inside it.
// Weight mode: picks the lowest non-empty bin whose first element is kept (above + weight of the
// bins over it < target); above grows by that weight. Returns the bin; sh.chosen_cnt/_w describe it.
// On the first weight pass (set_target) the target is ceil(p * total) first.
template <bool kWeight>
__device__ int choose_bin(TkShared& sh, int nb, unsigned long long& need, unsigned long long& above,
                          bool set_target, float p) {
  const int t = threadIdx.x;
  for (int off = 1; off < nb; off <<= 1) {  // inclusive suffix sums
    unsigned int c = 0;
    unsigned long long w = 0;
    if (t + off < nb) {
      c = sh.cnt[t + off];
      if (kWeight) w = sh.wt[t + off];
    }
    __syncthreads();
    if (t < nb) {
      sh.cnt[t] += c;
      if (kWeight) sh.wt[t] += w;
    }
    __syncthreads();
  }
  if (t == 0) {
    sh.chosen = nb;
    if (kWeight && set_target) {
      sh.total_w = sh.wt[0];
      sh.target = ceil_p_times(p, sh.wt[0]);
    }
  }
  __syncthreads();
  if (kWeight && set_target) need = sh.target;
  if (t < nb) {
    unsigned int incl = sh.cnt[t], excl = t + 1 < nb ? sh.cnt[t + 1] : 0;
    if (kWeight) {
      unsigned long long wexcl = t + 1 < nb ? sh.wt[t + 1] : 0;
      if (incl > excl && above + wexcl < need) atomicMin(&sh.chosen, t);
    } else if (incl >= need && excl < need) {
      sh.chosen = t;
    }
  }
  __syncthreads();
  int b = sh.chosen;
  unsigned int incl = sh.cnt[b], excl = b + 1 < nb ? sh.cnt[b + 1] : 0;
  if (kWeight) {
    unsigned long long wincl = sh.wt[b], wexcl = b + 1 < nb ? sh.wt[b + 1] : 0;
    above += wexcl;
    if (t == 0) sh.chosen_w = wincl - wexcl;
  } else {
    need -= excl;
  }
  if (t == 0) sh.chosen_cnt = incl - excl;
  __syncthreads();
  return b;
}

// The threshold over the elements kept by surv: count mode, the need-th best; weight mode, the last
// element kept by top-p (need is then unused on entry). from_list: the candidates (all survivors,
// q > 0 or not) are already in sh.list with sh.lmin/lmax set; otherwise the row is read.
template <bool kWeight>
__device__ Cut select_cut(TkShared& sh, const float* row, int64_t n, const Cut& surv, float lo, float scale,
                          unsigned long long need, float p, float xmax, bool from_list) {
  unsigned long long above = 0;
  bool first = true;
  Cut res{lo, scale, 0, 0};
  unsigned int cand;
  if (!from_list) {  // coarse pass over value bins
    zero_hist(sh, kCoarseBins);
    __syncthreads();
    for_row(row, n, [&](int64_t i, float x) {
      float v = tk_sanitize(x);
      unsigned long long key = key64(v, i);
      if (!keeps(surv, v, key)) return;
      unsigned long long q = 1;
      if (kWeight) {
        q = weight_q(sh, v, xmax);
        if (q == 0) return;
      }
      int b = cbin(v, lo, scale);
      atomicAdd(&sh.cnt[b], 1u);
      if (kWeight) add_u64(&sh.wt[b], q);
    });
    __syncthreads();
    res.bin = choose_bin<kWeight>(sh, kCoarseBins, need, above, true, p);
    first = false;
    cand = sh.chosen_cnt;
    if (kWeight ? (cand == 1 || above + sh.chosen_w <= need) : cand == need) return res;
  } else {
    res.scale = 0.0f;  // one coarse bin: keys alone decide
    cand = sh.list_n;
  }
  // key digits, most significant first; bits at and above s are fixed (prefix)
  unsigned long long prefix = 0;
  int s = 64;
  bool in_list = from_list;
  const int cb = res.bin;
  auto in_coarse = [&](float v, unsigned long long key) {
    return keeps(surv, v, key) && (from_list || cbin(v, lo, scale) == cb);
  };
  for (;;) {
    if (!in_list && cand <= unsigned(kListCap)) {  // gather the candidates into shared memory
      if (threadIdx.x == 0) sh.list_n = 0;
      __syncthreads();
      unsigned long long mn = ~0ull, mx = 0;
      for_row(row, n, [&](int64_t i, float x) {
        float v = tk_sanitize(x);
        unsigned long long key = key64(v, i);
        if (!in_coarse(v, key) || (s < 64 && (key >> s) != (prefix >> s))) return;
        if (kWeight && weight_q(sh, v, xmax) == 0) return;
        sh.list[atomicAdd(&sh.list_n, 1u)] = key;
        mn = key < mn ? key : mn;
        mx = key > mx ? key : mx;
      });
      __syncthreads();
      block_min_max(sh, mn, mx);
      in_list = true;
    }
    if (in_list && s == 64) {
      // skip the bits all candidates share
      unsigned long long diff = sh.lmin ^ sh.lmax;
      if (diff != 0) {
        int h = 63;
        while (!((diff >> h) & 1ull)) --h;
        s = h + 1;
        prefix = s < 64 ? (sh.lmax >> s) << s : 0;
      }
    }
    int shift = s > 8 ? s - 8 : 0, width = s - shift, nb = 1 << width;
    unsigned long long mask = (1ull << width) - 1;
    zero_hist(sh, nb);
    __syncthreads();
    auto add = [&](float v, unsigned long long key) {
      if (s < 64 && (key >> s) != (prefix >> s)) return;
      unsigned long long q = 1;
      if (kWeight) {
        q = weight_q(sh, v, xmax);
        if (q == 0) return;
      }
      int d = int((key >> shift) & mask);
      atomicAdd(&sh.cnt[d], 1u);
      if (kWeight) add_u64(&sh.wt[d], q);
    };
    if (in_list) {
      for (unsigned int i = threadIdx.x; i < sh.list_n; i += blockDim.x) {
        unsigned long long key = sh.list[i];
        add(unrank32(uint32_t(key >> 32)), key);
      }
    } else {
      for_row(row, n, [&](int64_t i, float x) {
        float v = tk_sanitize(x);
        unsigned long long key = key64(v, i);
        if (in_coarse(v, key)) add(v, key);
      });
    }
    __syncthreads();
    int d = choose_bin<kWeight>(sh, nb, need, above, first, p);
    first = false;
    prefix |= static_cast<unsigned long long>(d) << shift;
    s = shift;
    cand = sh.chosen_cnt;
    bool done = kWeight ? (cand == 1 || above + sh.chosen_w <= need) : cand == need;
    if (done || s == 0) break;
  }
  res.key_min = prefix;
  return res;
}

}  // namespace

// One block per row: masks logits in place (see above). k: per-row top-k (int32, or int64 when
// k_is_int64), or null; p: per-row top-p (float32), or null. A row's result depends on that row alone.
extern "C" __global__ void __launch_bounds__(kTkThreads)
topk_topp_mask_f32_kernel(float* __restrict__ logits, int64_t n, int64_t row_stride, const void* __restrict__ k,
                          int k_is_int64, const float* __restrict__ p) {
  __shared__ TkShared sh;
  const int64_t r = blockIdx.x;
  float* row = logits + r * row_stride;
  int64_t kr = n;
  if (k != nullptr) {
    int64_t kv = k_is_int64 ? static_cast<const int64_t*>(k)[r] : int64_t(static_cast<const int32_t*>(k)[r]);
    kr = kv < 1 ? 1 : (kv > n ? n : kv);
  }
  const float pr = p != nullptr ? p[r] : 1.0f;
  const bool use_k = kr < n, use_p = pr < 1.0f;
  Cut ck{0.0f, 0.0f, -1, 0}, cp{0.0f, 0.0f, -1, 0};
  bool p_positive = false;
  unsigned long long best = 0;
  float xmax = 0.0f;
  if (use_k || use_p) {
    const int t = threadIdx.x;
    if (use_p) {
      for (int i = t; i < 93 + 128 + 128; i += blockDim.x) {
        if (i < 93) sh.ta[i] = float(exp_det(-double(i) * 0.25));
        else if (i < 221) sh.tb[i - 93] = float(exp_det(-double(i - 93) / 512.0));
        else sh.tc[i - 221] = float(exp_det(-double(i - 221) / 65536.0));
      }
    }
    // the best key, the finite range, the number of +inf
    uint32_t fmax = 0, fmin_inv = 0, ninf = 0;
    for_row(row, n, [&](int64_t i, float x) {
      float v = tk_sanitize(x);
      unsigned long long key = key64(v, i);
      best = key > best ? key : best;
      uint32_t rk = uint32_t(key >> 32);
      if (rk == kRankPosInf) {
        ++ninf;
      } else if (rk != kRankNegInf) {
        fmax = rk > fmax ? rk : fmax;
        fmin_inv = ~rk > fmin_inv ? ~rk : fmin_inv;
      }
    });
    unsigned int* s32 = reinterpret_cast<unsigned int*>(sh.list);
    sh.wt[t] = best;
    sh.cnt[t] = fmax;
    s32[t] = fmin_inv;
    s32[kTkThreads + t] = ninf;
    __syncthreads();
    if (t < 32) {
      for (int j = t + 32; j < int(blockDim.x); j += 32) {
        best = sh.wt[j] > best ? sh.wt[j] : best;
        fmax = sh.cnt[j] > fmax ? sh.cnt[j] : fmax;
        fmin_inv = s32[j] > fmin_inv ? s32[j] : fmin_inv;
        ninf += s32[kTkThreads + j];
      }
      sh.wt[t] = best;
      sh.cnt[t] = fmax;
      s32[t] = fmin_inv;
      s32[kTkThreads + t] = ninf;
    }
    __syncthreads();
    best = 0;
    fmax = 0;
    fmin_inv = 0;
    ninf = 0;
    for (int j = 0; j < 32; ++j) {  // every thread, same order: the same result everywhere
      best = sh.wt[j] > best ? sh.wt[j] : best;
      fmax = sh.cnt[j] > fmax ? sh.cnt[j] : fmax;
      fmin_inv = s32[j] > fmin_inv ? s32[j] : fmin_inv;
      ninf += s32[kTkThreads + j];
    }
    __syncthreads();
    xmax = unrank32(uint32_t(best >> 32));
    const Cut all{0.0f, 0.0f, -1, 0};
    if (use_k) {
      float lo = unrank32(~fmin_inv), hi = unrank32(fmax);
      float scale = fmax != 0 && hi > lo ? float(kCoarseBins) / (hi - lo) : 0.0f;
      if (!(scale < INFINITY)) scale = 0.0f;
      ck = select_cut<false>(sh, row, n, all, lo, scale, static_cast<unsigned long long>(kr), 1.0f, 0.0f, false);
    }
    if (use_p) {
      if (xmax == INFINITY) {  // each +inf survivor weighs 1, the rest 0
        unsigned long long ninf_kept = ninf < unsigned(kr) ? ninf : unsigned(kr);
        unsigned long long tgt = ceil_p_times(pr, ninf_kept << 32);
        unsigned long long m = (tgt + 0xFFFFFFFFull) >> 32;
        if (m == 0) m = 1;
        cp = select_cut<false>(sh, row, n, ck, 0.0f, 0.0f, m, 1.0f, 0.0f, false);
      } else if (xmax == -INFINITY || !(pr > 0.0f)) {  // nothing weighs anything: the best alone
        cp = Cut{0.0f, 0.0f, 0, best};
      } else {
        bool from_list = use_k && kr <= kListCap;
        if (from_list) {  // the survivors fit in shared memory: gather them once
          if (t == 0) sh.list_n = 0;
          __syncthreads();
          unsigned long long mn = ~0ull, mx = 0;
          for_row(row, n, [&](int64_t i, float x) {
            float v = tk_sanitize(x);
            unsigned long long key = key64(v, i);
            if (!keeps(ck, v, key)) return;
            sh.list[atomicAdd(&sh.list_n, 1u)] = key;
            mn = key < mn ? key : mn;
            mx = key > mx ? key : mx;
          });
          __syncthreads();
          block_min_max(sh, mn, mx);
        }
        cp = select_cut<true>(sh, row, n, from_list ? all : ck, xmax - kWeightSpan,
                              float(kCoarseBins) / kWeightSpan, 0, pr, xmax, from_list);
        p_positive = true;
      }
    }
  }
  const Cut k_cut = ck, p_cut = cp;
  auto out = [&](int64_t i, float x) {
    float v = tk_sanitize(x);
    if (k_cut.bin < 0 && p_cut.bin < 0) return v;
    unsigned long long key = key64(v, i);
    bool keep = keeps(k_cut, v, key) && keeps(p_cut, v, key) &&
                (!p_positive || key == best || weight_q(sh, v, xmax) != 0);
    return keep ? v : -INFINITY;
  };
  int64_t head = int64_t((16 - (reinterpret_cast<uintptr_t>(row) & 15)) & 15) / 4;
  if (head > n) head = n;
  for (int64_t i = threadIdx.x; i < head; i += blockDim.x) row[i] = out(i, row[i]);
  int64_t nv = (n - head) / 4;
  float4* v4 = reinterpret_cast<float4*>(row + head);
  auto out4 = [&](int64_t i, float4 a) {
    a.x = out(i, a.x);
    a.y = out(i + 1, a.y);
    a.z = out(i + 2, a.z);
    a.w = out(i + 3, a.w);
    return a;
  };
  const int64_t bd = blockDim.x;
  int64_t j = threadIdx.x;
  for (; j + 3 * bd < nv; j += 4 * bd) {
    float4 a = v4[j], b = v4[j + bd], c = v4[j + 2 * bd], d = v4[j + 3 * bd];
    int64_t i = head + 4 * j;
    v4[j] = out4(i, a);
    v4[j + bd] = out4(i + 4 * bd, b);
    v4[j + 2 * bd] = out4(i + 8 * bd, c);
    v4[j + 3 * bd] = out4(i + 12 * bd, d);
  }
  for (; j < nv; j += bd) v4[j] = out4(head + 4 * j, v4[j]);
  for (int64_t i = head + 4 * nv + threadIdx.x; i < n; i += blockDim.x) row[i] = out(i, row[i]);
}

extern "C" int bakery_topk_topp_mask_f32(float* logits, int64_t rows, int64_t n, int64_t row_stride, const void* k,
                                         int k_is_int64, const float* p, void* stream) {
  if (rows == 0 || n == 0) return 0;
  if (n >= 0x7FFFFFFFll || rows > 0x7FFFFFFFll) return 2;
  topk_topp_mask_f32_kernel<<<unsigned(rows), kTkThreads, 0, (gpu_stream_t)stream>>>(logits, n, row_stride, k,
                                                                                      k_is_int64, p);
  return gpu_get_last_error() == gpu_success ? 0 : 1;
}
