// int8 linear layers on the CPU: weights int8 [N, K] with one float32 scale per output channel.
//
// - int8_gemv, for a few rows (decodes): each activation row is rounded to int16 with its own
//   scale (15 bits: finer than the bf16 it came from), then int8 x int16 dot products
//   (AVX512-VNNI vpdpwssd, 32 per instruction) accumulate in int32. Weight rows are streamed in
//   order, one at a time, each reused for every activation row: DRAM bandwidth is the limit.
//   (Interleaving several weight rows, or widening to float32, measured 2-3x slower here.)
// - quantize_rows + dequantize_int32: the two ends of W8A8 around torch._int_mm (VNNI GEMM),
//   one pass each instead of the ~8 elementwise torch ops the Python spelling takes.
#include <torch/extension.h>
#include "cpu_common.h"
#include "cpu_features.h"
#include "row_quant.h"
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

using surge::kMaxRows;
using surge::to_float;

inline void from_float(const float* s, float* d, int64_t n) { std::memcpy(d, s, n * sizeof(float)); }
// Round to nearest even, as c10::BFloat16 does (finite inputs); written out so it vectorizes.
inline void from_float(const float* s, at::BFloat16* d, int64_t n) {
  const uint32_t* u = reinterpret_cast<const uint32_t*>(s);
  uint16_t* o = reinterpret_cast<uint16_t*>(d);
  for (int64_t i = 0; i < n; ++i) o[i] = static_cast<uint16_t>((u[i] + 0x7FFFu + ((u[i] >> 16) & 1u)) >> 16);
}
template <typename T>
inline void from_float(const float* s, T* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = static_cast<T>(s[i]);
}

// k per int32 accumulation, so no sum can overflow: the vector path spreads a chunk over 32
// lanes (|127 * 32767 * 4096 / 32| < 2^31), the scalar path keeps one sum (127 * 32767 * 256).
constexpr int64_t kChunk = 4096;
constexpr int64_t kScalarChunk = 256;

// Activations [M, K] -> int16 [M, Kp] (zero-padded to a multiple of 64) and scales [M].
template <typename T>
void quantize_int16(const T* x, int64_t M, int64_t K, int64_t Kp, int16_t* q, float* scale) {
  std::vector<float> row(K);
  for (int64_t m = 0; m < M; ++m) {
    to_float(x + m * K, row.data(), K);
    float mx = 0.f;
    for (int64_t k = 0; k < K; ++k) mx = std::max(mx, std::fabs(row[k]));
    const float s = mx > 0.f ? mx / 32767.f : 1.f;
    const float inv = 1.f / s;
    int16_t* qm = q + m * Kp;
    for (int64_t k = 0; k < K; ++k) qm[k] = static_cast<int16_t>(std::nearbyint(row[k] * inv));
    for (int64_t k = K; k < Kp; ++k) qm[k] = 0;
    scale[m] = s;
  }
}

// dot[m] = sum_k xq[m, k] * w[k] for one weight row w [K] and MR activation rows.
template <int MR>
inline void dot_row(const int16_t* xq, int64_t Kp, const int8_t* w, int64_t K, float* dot) {
#if SURGE_TIER >= SURGE_TIER_AVX512_VNNI
  {
    __m512 total[MR];
    for (int m = 0; m < MR; ++m) total[m] = _mm512_setzero_ps();
    for (int64_t c = 0; c < K; c += kChunk) {
      const int64_t ce = std::min(K, c + kChunk);
      __m512i acc[MR][2];
      for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_si512();
      for (int64_t k = c; k < ce; k += 64) {
        // The row's tail is loaded under a mask (x is zero-padded to Kp, so it needs none).
        const int64_t left = ce - k;
        const __mmask32 m0 = left >= 32 ? ~0u : (1u << left) - 1;
        const __mmask32 m1 = left >= 64 ? ~0u : left <= 32 ? 0u : (1u << (left - 32)) - 1;
        const __m512i w0 = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(m0, w + k));
        const __m512i w1 = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(m1, w + k + 32));
        for (int m = 0; m < MR; ++m) {
          const int16_t* xm = xq + m * Kp + k;
          acc[m][0] = _mm512_dpwssd_epi32(acc[m][0], _mm512_loadu_si512(xm), w0);
          acc[m][1] = _mm512_dpwssd_epi32(acc[m][1], _mm512_loadu_si512(xm + 32), w1);
        }
      }
      for (int m = 0; m < MR; ++m)
        total[m] = _mm512_add_ps(
            total[m], _mm512_add_ps(_mm512_cvtepi32_ps(acc[m][0]), _mm512_cvtepi32_ps(acc[m][1])));
    }
    for (int m = 0; m < MR; ++m) dot[m] = _mm512_reduce_add_ps(total[m]);
    return;
  }
#elif SURGE_TIER >= SURGE_TIER_AVX2
  {
    // 16 weights widened to int16 once, then one vpmaddwd per activation row (the compiler's
    // vectorization of the loop below widened them again for every row). A chunk puts K / 8
    // products in a lane: |127 * 32767 * 4096 / 8| < 2^31.
    __m256 total[MR];
    for (int m = 0; m < MR; ++m) total[m] = _mm256_setzero_ps();
    alignas(32) int8_t tail[16];
    for (int64_t c = 0; c < K; c += kChunk) {
      const int64_t ce = std::min(K, c + kChunk);
      __m256i acc[MR];
      for (int m = 0; m < MR; ++m) acc[m] = _mm256_setzero_si256();
      for (int64_t k = c; k < ce; k += 16) {
        const int8_t* wk = w + k;
        if (ce - k < 16) {  // the row's tail, zero-padded (x is zero-padded to Kp)
          std::memset(tail, 0, sizeof(tail));
          std::memcpy(tail, wk, ce - k);
          wk = tail;
        }
        const __m256i w16 =
            _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wk)));
        for (int m = 0; m < MR; ++m) {
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + m * Kp + k));
          acc[m] = _mm256_add_epi32(acc[m], _mm256_madd_epi16(xv, w16));
        }
      }
      for (int m = 0; m < MR; ++m) total[m] = _mm256_add_ps(total[m], _mm256_cvtepi32_ps(acc[m]));
    }
    for (int m = 0; m < MR; ++m) {
      const __m128 h = _mm_add_ps(_mm256_castps256_ps128(total[m]), _mm256_extractf128_ps(total[m], 1));
      const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
      dot[m] = _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
    }
    return;
  }
#endif
  for (int m = 0; m < MR; ++m) {
    const int16_t* xm = xq + m * Kp;
    float total = 0.f;
    for (int64_t c = 0; c < K; c += kScalarChunk) {
      int32_t acc = 0;  // vectorizes to pmaddwd on AVX2
      for (int64_t k = c; k < std::min(K, c + kScalarChunk); ++k)
        acc += static_cast<int32_t>(xm[k]) * static_cast<int32_t>(w[k]);
      total += static_cast<float>(acc);
    }
    dot[m] = total;
  }
}

template <int MR, typename T>
void gemv_rows(const int16_t* xq, const float* sx, int64_t Kp, const int8_t* w, int64_t K,
               const float* sw, const float* bias, int64_t n0, int64_t n1, int64_t N, T* out) {
  float dot[MR];
  for (int64_t n = n0; n < n1; ++n) {
    dot_row<MR>(xq, Kp, w + n * K, K, dot);
    for (int m = 0; m < MR; ++m) {
      float v = dot[m] * sx[m] * sw[n];
      if (bias) v += bias[n];
      out[m * N + n] = static_cast<T>(v);
    }
  }
}

}  // namespace

// x [M, K] float32/bf16/fp16, w [N, K] int8, sw [N] float32, bias [N] float32 or None -> [M, N]
torch::Tensor int8_gemv(const torch::Tensor& x_in, const torch::Tensor& w, const torch::Tensor& sw,
                        const std::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x_in.dim() == 2 && w.dim() == 2 && x_in.size(1) == w.size(1), "int8_gemv: shapes");
  TORCH_CHECK(w.scalar_type() == at::kChar && sw.scalar_type() == at::kFloat, "int8_gemv: types");
  TORCH_CHECK(w.is_contiguous() && sw.is_contiguous(), "int8_gemv: contiguous weights");
  const torch::Tensor x = x_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  const int64_t Kp = (K + 63) / 64 * 64;
  auto out = torch::empty({M, N}, x.options());
  if (M == 0 || N == 0) return out;
  torch::Tensor bias_f;
  const float* bp = surge::float_bias(bias, bias_f);
  std::vector<int16_t> xq(M * Kp);
  std::vector<float> sx(M);
  const int8_t* wp = w.data_ptr<int8_t>();
  const float* sp = sw.data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "int8_gemv", [&] {
    quantize_int16(x.data_ptr<scalar_t>(), M, K, Kp, xq.data(), sx.data());
    scalar_t* op = out.data_ptr<scalar_t>();
    // Contiguous ranges of output channels per thread: each thread streams its part in order.
    // Grain 64 rows (>= 36 KB at K=576) keeps tiny layers from paying a fork/join.
    at::parallel_for(0, N, 64, [&](int64_t b, int64_t e) {
      for (int64_t m0 = 0; m0 < M; m0 += kMaxRows) {
        surge::with_rows(std::min(kMaxRows, M - m0), [&](auto rows) {
          gemv_rows<decltype(rows)::value, scalar_t>(xq.data() + m0 * Kp, sx.data() + m0, Kp, wp,
                                                     K, sp, bp, b, e, N, op + m0 * N);
        });
      }
    });
  });
  return out;
}

// Asymmetric per-row quantization (row_quant.h): x [M, K] -> (int8 q [M, K], float32 scale [M],
// int32 zero [M]) with x ~= scale * (q - zero); zero is in [-128, 127].
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> quantize_rows(const torch::Tensor& x_in) {
  TORCH_CHECK(x_in.dim() == 2, "quantize_rows: 2-D input");
  const torch::Tensor x = x_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  auto q = torch::empty({M, K}, x.options().dtype(at::kChar));
  auto s = torch::empty({M}, x.options().dtype(at::kFloat));
  auto z = torch::empty({M}, x.options().dtype(at::kInt));
  int8_t* qp = q.data_ptr<int8_t>();
  float* sp = s.data_ptr<float>();
  int32_t* zp = z.data_ptr<int32_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "quantize_rows", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    at::parallel_for(0, M, 16, [&](int64_t b, int64_t e) {
      for (int64_t m = b; m < e; ++m)
        surge::quantize_row_asym(xp + m * K, K, K, qp + m * K, sp + m, zp + m);
    });
  });
  return {q, s, z};
}

// acc [M, N] int32 from torch._int_mm(q, w.t()) -> sx[m] * sw[n] * (acc - zx[m] * wsum[n])
// (+ bias[n]) in `dtype`; wsum[n] = sum_k w[n, k] takes the activations' zero point back out.
// int32 throughout: |zx * wsum| <= 128 * 127 * K and |acc| <= 128 * 127 * K fit for K < 66k.
torch::Tensor dequantize_int32(const torch::Tensor& acc, const torch::Tensor& sx,
                               const torch::Tensor& zx, const torch::Tensor& sw,
                               const torch::Tensor& wsum, const std::optional<torch::Tensor>& bias,
                               at::ScalarType dtype) {
  TORCH_CHECK(acc.scalar_type() == at::kInt && acc.is_contiguous(), "dequantize_int32: acc");
  TORCH_CHECK(sx.scalar_type() == at::kFloat && sw.scalar_type() == at::kFloat, "scales");
  TORCH_CHECK(zx.scalar_type() == at::kInt && wsum.scalar_type() == at::kInt, "zero points");
  const int64_t M = acc.size(0), N = acc.size(1);
  auto out = torch::empty({M, N}, acc.options().dtype(dtype));
  torch::Tensor bias_f;
  const float* bp = surge::float_bias(bias, bias_f);
  const int32_t* ap = acc.data_ptr<int32_t>();
  const float* xs = sx.data_ptr<float>();
  const int32_t* xz = zx.data_ptr<int32_t>();
  const float* ws = sw.data_ptr<float>();
  const int32_t* wz = wsum.data_ptr<int32_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, dtype, "dequant", [&] {
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, M, 4, [&](int64_t b, int64_t e) {
      std::vector<float> row(N);
      for (int64_t m = b; m < e; ++m) {
        const float s = xs[m];
        const int32_t z = xz[m];
        const int32_t* am = ap + m * N;
        for (int64_t n = 0; n < N; ++n) row[n] = static_cast<float>(am[n] - z * wz[n]) * s * ws[n];
        if (bp)
          for (int64_t n = 0; n < N; ++n) row[n] += bp[n];
        from_float(row.data(), op + m * N, N);
      }
    });
  });
  return out;
}

// Registered as dispatcher ops (torch.ops.surge.*) so torch.compile can trace through them.
TORCH_LIBRARY_FRAGMENT(surge, m) {
  m.def("int8_gemv(Tensor x, Tensor w, Tensor sw, Tensor? bias) -> Tensor");
  m.def("quantize_rows(Tensor x) -> (Tensor, Tensor, Tensor)");
  m.def("dequantize_int32(Tensor acc, Tensor sx, Tensor zx, Tensor sw, Tensor wsum, Tensor? bias, "
        "ScalarType dtype) -> Tensor");
}

TORCH_LIBRARY_IMPL(surge, CPU, m) {
  m.impl("int8_gemv", &int8_gemv);
  m.impl("quantize_rows", &quantize_rows);
  m.impl("dequantize_int32", &dequantize_int32);
}

// The loader imports the library as a Python module; the ops live in torch.ops.surge.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("tier") = SURGE_TIER_NAME;  // the tier it was built for (cpu_features.h)
}
