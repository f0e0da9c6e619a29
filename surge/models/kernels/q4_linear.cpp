// 4-bit linear layers on the CPU, in GGUF's Q4_1 block format (32 weights per block along K,
// w = d * q + m with q in 0..15 and float16 d, m), repacked at load (surge/models/q4.py):
//   qs [N, K/2] uint8, per row first groups of 16 blocks (512 weights, 256 bytes), then pairs of
//      blocks (64 weights, 32 bytes) for what is left of K. In a group, 32 bytes unpack (mask,
//      shift) into one vpdpbusd operand: byte 4l + i of operand j is weight 4j + i of block l, so
//      8 accumulating vpdpbusd leave block l's whole dot product in int32 lane l, and one
//      convert + FMA per 16 blocks applies the scales. A pair unpacks to weights 0-63 in order.
//   dm [N, 2, K/32] float16: d then m of every block, in block order.
// K must be a multiple of 64.
//
// q4_gemv: each block of 32 activations is rounded to int8 with its own scale dx (llama.cpp's
// Q8 scheme; the activations are reordered like the weights), and
//   y = sum over blocks of d * dx * dot(q, xq) + m * dx * sum(xq),
// exactly the file's weights times the rounded activations. (The sum of the unrounded x in the
// m term measured about 2x the error: q in 0..15 is not centred, so the d term's rounding error
// only cancels against the same rounding in the m term.)
// Weight rows stream in order, each reused for up to 8 activation rows: one row reads 0.625
// bytes per weight, about half of int8's, and few enough instructions per byte that DRAM
// bandwidth stays the limit.
#include <torch/extension.h>
#include "cpu_common.h"
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__F16C__)
#include <immintrin.h>
#define SURGE_AVX512_VNNI 1
#endif

namespace {

using surge::kMaxRows;
using surge::to_float;

constexpr int64_t kBlock = 32;
constexpr int64_t kGroup = 512;  // 16 blocks: one int32 lane each

// Position in the packed (and reordered) row of weight k, for the scalar path and the
// activation reorder. Groups: byte 4l + i of operand j <- weight 32l + 4j + i; operand j's 64
// weights are bytes j*32..j*32+31, low nibbles first (0-31), then high nibbles (32-63).
inline int64_t operand_index(int64_t k, int64_t groups_end) {
  if (k >= groups_end) return k;  // pairs keep the natural order
  const int64_t g = k / kGroup, r = k % kGroup;
  const int64_t l = r / kBlock, j = (r % kBlock) / 4, i = r % 4;
  return g * kGroup + j * 64 + 4 * l + i;
}

// The activations, quantized per block of 32 and reordered to the weights' operand layout.
struct QuantizedX {
  int64_t K = 0, blocks = 0;
  std::vector<int8_t> q;  // [M, K], operand order
  std::vector<float> dx;  // [M, K/32] block scales, block order
  std::vector<float> sx;  // [M, K/32] block sums of the rounded x (dx * sum of q), block order
};

template <typename T>
QuantizedX quantize_blocks(const T* x, int64_t M, int64_t K) {
  const int64_t B = K / kBlock, groups_end = K / kGroup * kGroup;
  QuantizedX out{K, B, std::vector<int8_t>(M * K), std::vector<float>(M * B),
                 std::vector<float>(M * B)};
  std::vector<float> row(K);
  for (int64_t m = 0; m < M; ++m) {
    to_float(x + m * K, row.data(), K);
    for (int64_t b = 0; b < B; ++b) {
      const float* xb = row.data() + b * kBlock;
      float amax = 0.f;
      for (int64_t i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(xb[i]));
      const float d = amax / 127.f;
      const float inv = d > 0.f ? 1.f / d : 0.f;
      int8_t* qm = out.q.data() + m * K;
      int32_t qsum = 0;
      for (int64_t i = 0; i < kBlock; ++i) {
        const int32_t q = static_cast<int32_t>(std::nearbyint(xb[i] * inv));
        qm[operand_index(b * kBlock + i, groups_end)] = static_cast<int8_t>(q);
        qsum += q;
      }
      out.dx[m * B + b] = d;
      out.sx[m * B + b] = d * static_cast<float>(qsum);
    }
  }
  return out;
}

inline float half_to_float(uint16_t h) {
  return static_cast<float>(c10::Half(h, c10::Half::from_bits()));
}

// y[m] = weight row n times activation row m0 + m, for MR rows; qs/dm point at row n.
template <int MR>
inline void q4_dot(const uint8_t* qs, const uint16_t* dm, const QuantizedX& xq, int64_t m0,
                   float* y) {
  const int64_t K = xq.K, B = xq.blocks, groups = K / kGroup;
  const uint16_t* d16 = dm;
  const uint16_t* m16 = dm + B;
#ifdef SURGE_AVX512_VNNI
  {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m512i low4x2 = _mm512_set1_epi8(0x0F);
    __m512 acc[MR], macc[MR];  // two chains: the d and m terms do not wait on each other
    for (int m = 0; m < MR; ++m) acc[m] = macc[m] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* qg = qs + g * (kGroup / 2);
      // Two sums per row, even and odd operands: half the chain of dependent vpdpbusd.
      __m512i dot[MR], dot2[MR];
      for (int m = 0; m < MR; ++m) dot[m] = dot2[m] = _mm512_setzero_si512();
      for (int64_t j = 0; j < 8; j += 2) {
        const __m512i packed = _mm512_loadu_si512(qg + j * 32);  // operands j and j + 1
        const __m512i lo = _mm512_and_si512(packed, low4x2);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low4x2);
        // Operand j: low then high nibbles of its 32 bytes; the same for j + 1.
        const __m512i w0 = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(1, 0, 1, 0));
        const __m512i w1 = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(3, 2, 3, 2));
        for (int m = 0; m < MR; ++m) {
          const int8_t* x = xq.q.data() + (m0 + m) * K + g * kGroup + j * 64;
          dot[m] = _mm512_dpbusd_epi32(dot[m], w0, _mm512_loadu_si512(x));
          dot2[m] = _mm512_dpbusd_epi32(dot2[m], w1, _mm512_loadu_si512(x + 64));
        }
      }
      for (int m = 0; m < MR; ++m) dot[m] = _mm512_add_epi32(dot[m], dot2[m]);
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(d16 + g * 16)));
      const __m512 mn = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(m16 + g * 16)));
      for (int m = 0; m < MR; ++m) {
        const float* dx = xq.dx.data() + (m0 + m) * B + g * 16;
        const float* sx = xq.sx.data() + (m0 + m) * B + g * 16;
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[m]), _mm512_mul_ps(d, _mm512_loadu_ps(dx)), acc[m]);
        macc[m] = _mm512_fmadd_ps(mn, _mm512_loadu_ps(sx), macc[m]);
      }
    }
    float tail[MR] = {};
    for (int64_t b = groups * 16; b < B; b += 2) {  // the pairs after the last group
      const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + b * 16));
      const __m256i lo = _mm256_and_si256(packed, low4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4);
      const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
      const float d0 = half_to_float(d16[b]), d1 = half_to_float(d16[b + 1]);
      const float n0 = half_to_float(m16[b]), n1 = half_to_float(m16[b + 1]);
      for (int m = 0; m < MR; ++m) {
        const int64_t r = m0 + m;
        const __m512i dot = _mm512_dpbusd_epi32(
            _mm512_setzero_si512(), w, _mm512_loadu_si512(xq.q.data() + r * K + b * kBlock));
        const float* dx = xq.dx.data() + r * B + b;
        const float* sx = xq.sx.data() + r * B + b;
        const __m512 scale = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(d0 * dx[0]),
                                                  _mm512_set1_ps(d1 * dx[1]));
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[m]);
        tail[m] += n0 * sx[0] + n1 * sx[1];
      }
    }
    for (int m = 0; m < MR; ++m)
      y[m] = _mm512_reduce_add_ps(_mm512_add_ps(acc[m], macc[m])) + tail[m];
    return;
  }
#endif
  const int64_t groups_end = groups * kGroup;
  std::vector<int32_t> q(K);  // this row's weights, unpacked into the operand order
  for (int64_t p = 0; p < K / 64; ++p)
    for (int64_t j = 0; j < 32; ++j) {
      q[p * 64 + j] = qs[p * 32 + j] & 0x0F;
      q[p * 64 + 32 + j] = qs[p * 32 + j] >> 4;
    }
  for (int m = 0; m < MR; ++m) {
    const int64_t r = m0 + m;
    const int8_t* x = xq.q.data() + r * K;
    float total = 0.f;
    for (int64_t b = 0; b < B; ++b) {
      int32_t dot = 0;
      for (int64_t i = 0; i < kBlock; ++i) {
        const int64_t at = operand_index(b * kBlock + i, groups_end);
        dot += q[at] * static_cast<int32_t>(x[at]);
      }
      total += half_to_float(d16[b]) * xq.dx[r * B + b] * static_cast<float>(dot) +
               half_to_float(m16[b]) * xq.sx[r * B + b];
    }
    y[m] = total;
  }
}

template <int MR, typename T>
void q4_rows(const uint8_t* qs, const uint16_t* dm, const QuantizedX& xq, int64_t m0,
             const float* bias, int64_t n0, int64_t n1, int64_t N, T* out) {
  float y[MR];
  const int64_t K = xq.K;
  for (int64_t n = n0; n < n1; ++n) {
    q4_dot<MR>(qs + n * (K / 2), dm + n * 2 * xq.blocks, xq, m0, y);
    for (int m = 0; m < MR; ++m)
      out[(m0 + m) * N + n] = static_cast<T>(bias ? y[m] + bias[n] : y[m]);
  }
}

}  // namespace

// x [M, K] float32/bf16/fp16, qs [N, K/2] uint8, dm [N, 2, K/32] float16, bias [N] or None
// -> [M, N] in x's dtype.
torch::Tensor q4_gemv(const torch::Tensor& x_in, const torch::Tensor& qs, const torch::Tensor& dm,
                      const std::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x_in.dim() == 2 && qs.dim() == 2 && dm.dim() == 3, "q4_gemv: ranks");
  const int64_t M = x_in.size(0), K = x_in.size(1), N = qs.size(0);
  TORCH_CHECK(K % 64 == 0 && qs.size(1) * 2 == K, "q4_gemv: K must be a multiple of 64");
  TORCH_CHECK(dm.size(0) == N && dm.size(1) == 2 && dm.size(2) * 32 == K, "q4_gemv: dm shape");
  TORCH_CHECK(qs.scalar_type() == at::kByte && dm.scalar_type() == at::kHalf, "q4_gemv: types");
  TORCH_CHECK(qs.is_contiguous() && dm.is_contiguous(), "q4_gemv: contiguous weights");
  const torch::Tensor x = x_in.contiguous();
  auto out = torch::empty({M, N}, x.options());
  if (M == 0 || N == 0) return out;
  torch::Tensor bias_f;
  const float* bp = surge::float_bias(bias, bias_f);
  const uint8_t* qp = qs.data_ptr<uint8_t>();
  const uint16_t* dp = reinterpret_cast<const uint16_t*>(dm.data_ptr<at::Half>());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "q4_gemv", [&] {
    const QuantizedX xq = quantize_blocks(x.data_ptr<scalar_t>(), M, K);
    scalar_t* op = out.data_ptr<scalar_t>();
    // Contiguous ranges of output channels per thread, streamed in order; grain 64 rows keeps
    // tiny layers from paying a fork/join.
    at::parallel_for(0, N, 64, [&](int64_t b, int64_t e) {
      for (int64_t m0 = 0; m0 < M; m0 += kMaxRows)
        surge::with_rows(std::min(kMaxRows, M - m0), [&](auto rows) {
          q4_rows<decltype(rows)::value, scalar_t>(qp, dp, xq, m0, bp, b, e, N, op);
        });
    });
  });
  return out;
}

TORCH_LIBRARY_FRAGMENT(surge, m) {
  m.def("q4_gemv(Tensor x, Tensor qs, Tensor dm, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(surge, CPU, m) { m.impl("q4_gemv", &q4_gemv); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}
