// surge::w8a8_linear: an int8 linear layer on prepacked weights, activations quantized inside
// (w8a8_gemm.h has the format and the method). One call replaces quantize_rows, torch._int_mm
// and dequantize_int32: no int32 [M, N] intermediate, no reorder of the weights per call.
#include <torch/extension.h>
#include "cpu_features.h"
#include <ATen/Parallel.h>
#include "amx_gemm.h"

using namespace surge::w8a8;

// f(T{}) for the float types the kernel reads and writes: float32, bfloat16, float16.
template <typename F>
void dispatch(at::ScalarType t, const char* what, F&& f) {
  switch (t) {
    case at::kFloat: f(float{}); break;
    case at::kBFloat16: f(at::BFloat16{}); break;
    case at::kHalf: f(at::Half{}); break;
    default: TORCH_CHECK(false, what, ": float32, bfloat16 or float16, got ", t);
  }
}

// x [M, K] float32/bf16/fp16, packed [Np/16, Kp/4, 16, 4] int8, scale [N] float32, wsum [N] int32,
// bias [N] or None -> [M, N] in out_dtype (default: x's dtype).
torch::Tensor w8a8_linear(const torch::Tensor& x_in, const torch::Tensor& packed,
                          const torch::Tensor& scale, const torch::Tensor& wsum,
                          const std::optional<torch::Tensor>& bias,
                          std::optional<at::ScalarType> out_dtype) {
  TORCH_CHECK(x_in.dim() == 2 && packed.dim() == 4, "w8a8_linear: ranks");
  const int64_t M = x_in.size(0), K = x_in.size(1), N = scale.size(0);
  TORCH_CHECK(packed.scalar_type() == at::kChar && packed.is_contiguous(), "w8a8_linear: packed");
  TORCH_CHECK(packed.size(0) == (N + kCols - 1) / kCols && packed.size(1) * 4 == padded_k(K) &&
              packed.size(2) == kCols && packed.size(3) == 4, "w8a8_linear: packed shape");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous(), "w8a8_linear: scale");
  TORCH_CHECK(wsum.scalar_type() == at::kInt && wsum.is_contiguous() && wsum.size(0) == N,
              "w8a8_linear: wsum");
  const torch::Tensor x = x_in.contiguous();
  auto out = torch::empty({M, N}, x.options().dtype(out_dtype.value_or(x.scalar_type())));
  if (M == 0 || N == 0) return out;
  torch::Tensor bias_f;
  const Weights w{packed.data_ptr<int8_t>(), scale.data_ptr<float>(), wsum.data_ptr<int32_t>(),
                  surge::float_bias(bias, bias_f), N, K};
  // Reused by the calling thread: no allocation per call. Named through a local reference: the
  // workers below must read the caller's buffer, not a thread_local of their own.
  thread_local QuantRows buffer;
  QuantRows& a = buffer;
  resize(a, M, K);
  dispatch(x.scalar_type(), "w8a8_linear: x", [&](auto t) {
    using scalar_t = decltype(t);
    const scalar_t* xp = x.data_ptr<scalar_t>();
    at::parallel_for(0, M, 16, [&](int64_t b, int64_t e) { quantize_rows_u8(xp, b, e, K, a); });
  });
  // Whole panels per thread, in order: each thread streams its share of the weights once.
  const int64_t per = panel_blocks(M), panels = (w.blocks() + per - 1) / per;
  dispatch(out.scalar_type(), "w8a8_linear: out_dtype", [&](auto t) {
    using scalar_t = decltype(t);
    const Out<scalar_t, false> o{out.data_ptr<scalar_t>(), N};
    at::parallel_for(0, panels, 1, [&](int64_t b, int64_t e) {
      gemm_range(a, w, b * per, std::min(w.blocks(), e * per), o);
    });
  });
  return out;
}

TORCH_LIBRARY_FRAGMENT(surge, m) {
  m.def("w8a8_linear(Tensor x, Tensor packed, Tensor scale, Tensor wsum, Tensor? bias, "
        "ScalarType? out_dtype=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(surge, CPU, m) { m.impl("w8a8_linear", &w8a8_linear); }

// `supported`: the VNNI tiles were compiled in. Without them the op still runs (one product at a
// time, for correctness), but Int8Linear keeps the row-major layout and its faster paths.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("tier") = SURGE_TIER_NAME;  // the tier it was built for (cpu_features.h)
  // The int8 GEMM's engine for this module's op (amx_gemm.h; surge/models/amx.py sets it).
  m.def("amx_hardware_ok", &surge::w8a8::hardware_ok);
  m.def("set_amx", &surge::w8a8::set_amx);
  m.def("amx_calls", &surge::w8a8::amx_calls);
#if SURGE_TIER >= SURGE_TIER_AVX512_VNNI
  m.attr("supported") = true;
#else
  m.attr("supported") = false;
#endif
}
