// AVX2 helpers shared by the compiled CPU kernels (the paths for CPUs without AVX-512, or
// without its VNNI): 8-lane loads and stores of float32, bfloat16 and float16 rows, the sum
// across lanes of 8 vectors at once, and exp of non-positive lanes.
#pragma once
#include <torch/extension.h>
#include "cpu_features.h"
#if SURGE_TIER >= SURGE_TIER_AVX2
#include <cstdint>

namespace surge {

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
// int8 KV rows: 8 values widened to float32 (the row's scale is applied by the caller).
inline __m256 load8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline __m256 load8(const at::BFloat16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 load8(const at::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
inline void store8(at::BFloat16* p, __m256 v) {
  // Round to nearest even, like c10's float -> bfloat16 (NaN is not expected here).
  __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  u = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  // Pack the 8 low halves: packus works per 128-bit lane, then the lanes' quads are joined.
  const __m256i packed = _mm256_packus_epi32(u, u);
  const __m128i lo = _mm256_castsi256_si128(packed), hi = _mm256_extracti128_si256(packed, 1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_unpacklo_epi64(lo, hi));
}
inline void store8(at::Half* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

template <typename T>  // any other type (double): lane by lane
inline void store8(T* p, __m256 v) {
  alignas(32) float t[8];
  _mm256_store_ps(t, v);
  for (int i = 0; i < 8; ++i) p[i] = static_cast<T>(t[i]);
}

// r[j] = sum of the 8 lanes of v[j], for j < 8: a tree of horizontal adds (9 ops for 8 sums).
inline __m256 hsum8(const __m256* v) {
  const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  // a = [v0..v3 sums of the low 128 bits | v0..v3 sums of the high 128 bits], b likewise.
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

inline float hmax(__m256 v) {
  const __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(t, _mm_movehdup_ps(t)));
}

// exp(x) for x <= 0, 8 lanes: the same range reduction and polynomial as exp_nonpositive.
inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f));
  const __m256 fi = _mm256_floor_ps(t);
  const __m256 f = _mm256_sub_ps(t, fi);
  __m256 p = _mm256_set1_ps(0.000154035304f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.00133335581f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.00961812911f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.0555041087f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.240226507f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.693147182f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(fi), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

}  // namespace surge
#endif  // SURGE_TIER_AVX2
