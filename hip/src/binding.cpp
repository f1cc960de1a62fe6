// Torch operators bakery::swiglu_clamp and bakery::top_k_top_p_ on LibTorch's stable ABI: one build serves
// any torch that keeps that ABI, without matching its private C++ ABI. Plain C++: torch's headers
// stay out of HIP translation units (in HIP mode they pull thrust/complex.h).
#include <dlfcn.h>
#include <stdint.h>

#include <optional>

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

extern "C" int bakery_swiglu_clamp_bf16(const void* x, void* out, int64_t rows, int64_t d, float limit,
                                        void* stream);
extern "C" int bakery_topk_topp_mask_f32(float* logits, int64_t rows, int64_t n, int64_t row_stride, const void* k,
                                         int k_is_int64, const float* p, void* stream);

namespace {

using torch::stable::Tensor;
using torch::headeronly::ScalarType;

// The caller's current GPU stream (CUDA graphs capture on it). Looked up at run time: a CPU-only
// torch does not export it, and the library must still load there. On the GPU it must be found:
// a launch on the null stream would race vLLM's stream and break a graph capture.
void* current_stream(const Tensor& t) {
  using Fn = AOTITorchError (*)(int32_t, void**);
  static Fn fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "aoti_torch_get_current_cuda_stream"));
  void* stream = nullptr;
  STD_TORCH_CHECK(fn != nullptr && fn(t.get_device_index(), &stream) == AOTI_TORCH_SUCCESS,
                  "bakery: this torch does not give the current GPU stream (aoti_torch_get_current_cuda_stream)");
  return stream;
}

Tensor swiglu_clamp(Tensor x, double limit) {
  STD_TORCH_CHECK(x.is_cuda(), "bakery::swiglu_clamp: x must be on the GPU");
  STD_TORCH_CHECK(x.scalar_type() == ScalarType::BFloat16, "bakery::swiglu_clamp: x must be bfloat16");
  STD_TORCH_CHECK(x.is_contiguous() && x.dim() >= 1 && x.size(x.dim() - 1) % 2 == 0,
                  "bakery::swiglu_clamp: x must be contiguous with an even last dimension [gate | up]");
  int64_t d = x.size(x.dim() - 1) / 2;
  int64_t rows = d == 0 ? 0 : x.numel() / (2 * d);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = d;
  Tensor out = torch::stable::new_empty(x, shape);
  int rc = bakery_swiglu_clamp_bf16(x.data_ptr(), out.data_ptr(), rows, d, static_cast<float>(limit),
                                    current_stream(x));
  STD_TORCH_CHECK(rc == 0, "bakery::swiglu_clamp: kernel launch failed");
  return out;
}

// vLLM's apply_top_k_top_p(logits, k, p): masks logits [B, V] (float32, unit stride along V) in
// place with -inf and returns them. k: int32 or int64 [B] (V or more: no top-k for that row); p:
// float32 [B] (1: no top-p); either may be None. Reads k and p on the device: no host sync.
Tensor top_k_top_p_(Tensor logits, std::optional<Tensor> k, std::optional<Tensor> p) {
  STD_TORCH_CHECK(logits.is_cuda(), "bakery::top_k_top_p_: logits must be on the GPU");
  STD_TORCH_CHECK(logits.scalar_type() == ScalarType::Float, "bakery::top_k_top_p_: logits must be float32");
  STD_TORCH_CHECK(logits.dim() == 2 && logits.stride(1) == 1,
                  "bakery::top_k_top_p_: logits must be [rows, n] with unit stride along n");
  int64_t rows = logits.size(0), n = logits.size(1);
  STD_TORCH_CHECK(rows <= 1 || logits.stride(0) >= n, "bakery::top_k_top_p_: rows must not overlap");
  const void* kp = nullptr;
  int k64 = 0;
  if (k.has_value()) {
    const Tensor& kt = *k;
    STD_TORCH_CHECK(kt.is_cuda() && kt.get_device_index() == logits.get_device_index(),
                    "bakery::top_k_top_p_: k must be on the logits' GPU");
    STD_TORCH_CHECK(kt.scalar_type() == ScalarType::Int || kt.scalar_type() == ScalarType::Long,
                    "bakery::top_k_top_p_: k must be int32 or int64");
    STD_TORCH_CHECK(kt.dim() == 1 && kt.size(0) == rows && kt.is_contiguous(),
                    "bakery::top_k_top_p_: k must be a contiguous [rows]");
    kp = kt.data_ptr();
    k64 = kt.scalar_type() == ScalarType::Long;
  }
  const float* pp = nullptr;
  if (p.has_value()) {
    const Tensor& pt = *p;
    STD_TORCH_CHECK(pt.is_cuda() && pt.get_device_index() == logits.get_device_index(),
                    "bakery::top_k_top_p_: p must be on the logits' GPU");
    STD_TORCH_CHECK(pt.scalar_type() == ScalarType::Float, "bakery::top_k_top_p_: p must be float32");
    STD_TORCH_CHECK(pt.dim() == 1 && pt.size(0) == rows && pt.is_contiguous(),
                    "bakery::top_k_top_p_: p must be a contiguous [rows]");
    pp = static_cast<const float*>(pt.data_ptr());
  }
  if (kp == nullptr && pp == nullptr) return logits;
  int rc = bakery_topk_topp_mask_f32(static_cast<float*>(logits.data_ptr()), rows, n, logits.stride(0), kp, k64, pp,
                                     current_stream(logits));
  STD_TORCH_CHECK(rc != 2, "bakery::top_k_top_p_: rows and n must be below 2^31");
  STD_TORCH_CHECK(rc == 0, "bakery::top_k_top_p_: kernel launch failed");
  return logits;
}

}  // namespace

STABLE_TORCH_LIBRARY(bakery, m) {
  m.def("swiglu_clamp(Tensor x, float limit) -> Tensor");
  m.def("top_k_top_p_(Tensor(a!) logits, Tensor? k, Tensor? p) -> Tensor(a!)");
}

// ROCm builds of torch dispatch HIP tensors under the CUDA key.
STABLE_TORCH_LIBRARY_IMPL(bakery, CUDA, m) {
  m.impl("swiglu_clamp", TORCH_BOX(&swiglu_clamp));
  m.impl("top_k_top_p_", TORCH_BOX(&top_k_top_p_));
}
