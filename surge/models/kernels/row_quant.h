// Asymmetric per-row quantization of activations, shared by the int8 linear op's quantize_rows
// (int8_linear.cpp: int8, the operand torch._int_mm takes) and the packed W8A8 GEMM
// (w8a8_gemm.h: uint8, the left operand of VNNI's vpdpbusd). Per row, x ~= scale * (q - zero)
// with the range [min(x, 0), max(x, 0)] mapped onto Q's 256 levels (the range always includes 0,
// so zero is one of them). The two differ by an offset only: int8's q and zero are uint8's
// minus 128, bit for bit. Rows of hidden states are skewed (SiLU outputs, outlier channels): a
// zero point halves the perplexity cost of W8A8 on SmolLM2 against symmetric scaling.
#pragma once
#include <torch/extension.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include "avx512_common.h"
#include "cpu_features.h"

namespace surge {

// Row x [K] -> q [Kp] (zero-padded past K), its scale and zero point.
template <typename Q, typename T>
inline void quantize_row_asym(const T* x, int64_t K, int64_t Kp, Q* q, float* scale,
                              int32_t* zero_point) {
  static_assert(std::is_same_v<Q, uint8_t> || std::is_same_v<Q, int8_t>, "int8 or uint8 rows");
  constexpr float kLow = std::is_same_v<Q, int8_t> ? -128.f : 0.f;  // Q's lowest level
  constexpr float kHigh = kLow + 255.f;
  constexpr bool kVector = !std::is_same_v<T, double>;  // load16 reads 16 floats' worth
  float lo = 0.f, hi = 0.f;
  int64_t k = 0;
#if SURGE_TIER >= SURGE_TIER_AVX512
  if constexpr (kVector) {
    __m512 vlo = _mm512_setzero_ps(), vhi = _mm512_setzero_ps();
    for (; k + 16 <= K; k += 16) {
      const __m512 v = load16(x + k);
      vlo = _mm512_min_ps(vlo, v);
      vhi = _mm512_max_ps(vhi, v);
    }
    lo = _mm512_reduce_min_ps(vlo);
    hi = _mm512_reduce_max_ps(vhi);
  }
#endif
  for (; k < K; ++k) {
    const float v = static_cast<float>(x[k]);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  const float s = hi > lo ? (hi - lo) / 255.f : 1.f;
  const float inv = 1.f / s;
  const float zero = std::nearbyint(-lo * inv) + kLow;
  k = 0;
#if SURGE_TIER >= SURGE_TIER_AVX512
  if constexpr (kVector) {
    const __m512 vinv = _mm512_set1_ps(inv), vzero = _mm512_set1_ps(zero);
    const __m512 vmax = _mm512_set1_ps(kHigh), vmin = _mm512_set1_ps(kLow);
    for (; k + 16 <= K; k += 16) {
      // Round to nearest even (the default mode), like std::nearbyint.
      const __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(load16(x + k), vinv),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m512 v = _mm512_min_ps(vmax, _mm512_max_ps(vmin, _mm512_add_ps(r, vzero)));
      // In Q's range already: the low byte of each int32 is the level, signed or not.
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + k),
                       _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)));
    }
  }
#endif
  for (; k < K; ++k) {
    const float v = std::nearbyint(static_cast<float>(x[k]) * inv) + zero;
    q[k] = static_cast<Q>(std::min(kHigh, std::max(kLow, v)));
  }
  for (; k < Kp; ++k) q[k] = 0;
  *scale = s;
  *zero_point = static_cast<int32_t>(zero);
}

}  // namespace surge
