// The 4-bit block GEMV's internals (the weight layout, activation quantization and the
// tile loops; see q4_linear.cpp for the format and the method), shared by the q4_gemv op and the
// fused decode stack (q4_decode.cpp).
#pragma once
#include <torch/extension.h>
// Paths by tier (cpu_features.h): AVX-512 VNNI, AVX2 (also on AVX-512 without VNNI), or plain
// loops. The fused decode stack is built from the AVX2 tier up (the portable path is for
// correctness, not speed).
#include "avx2_common.h"
#include "avx512_common.h"
#include "cpu_common.h"
#include "cpu_features.h"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

namespace surge::q4 {

constexpr int64_t kBlock = 32;
constexpr int64_t kGroup = 512;  // 16 blocks
constexpr int64_t kTile = 16;    // weight rows reduced together

// Where weight k's activation sits in the reordered row. In a group: the 64 activations facing
// one 64-byte load's low nibbles (operands 2u, 2u + 1, blocks 0-7) then its high nibbles
// (blocks 8-15); the pairs keep the natural order.
inline int64_t x_position(int64_t k, int64_t groups_end) {
  if (k >= groups_end) return k;
  const int64_t g = k / kGroup, r = k % kGroup;
  const int64_t l = r / kBlock, j = (r % kBlock) / 4, i = r % 4;
  return g * kGroup + (j / 2) * 128 + (l / 8) * 64 + (j % 2) * 32 + (l % 8) * 4 + i;
}

// Weight k's 4-bit value in a packed row (the scalar path's unpacking).
inline int32_t weight_nibble(const uint8_t* qs, int64_t k, int64_t groups_end) {
  int64_t byte;
  bool high;
  if (k >= groups_end) {
    const int64_t w = (k - groups_end) % 64;
    byte = groups_end / 2 + (k - groups_end) / 64 * 32 + w % 32;
    high = w >= 32;
  } else {
    const int64_t g = k / kGroup, r = k % kGroup;
    const int64_t l = r / kBlock, j = (r % kBlock) / 4, i = r % 4;
    byte = g * (kGroup / 2) + j * 32 + (4 * l + i) % 32;
    high = l >= 8;
  }
  return high ? qs[byte] >> 4 : qs[byte] & 0x0F;
}

// The activations, quantized per block of 32 and reordered (x_position).
struct QuantizedX {
  int64_t K = 0, blocks = 0;
  std::vector<int8_t, CacheLineAllocator<int8_t>> q;  // [M, K], reordered
  std::vector<float> dx;  // [M, K/32] block scales, block order
  std::vector<float> sx;  // [M, K/32] block sums of the rounded x (dx * sum of q), block order
};

// Size `xq` for M rows of K: its vectors keep their capacity, so a reused buffer is not
// reallocated.
inline void resize(QuantizedX& xq, int64_t M, int64_t K) {
  xq.K = K;
  xq.blocks = K / kBlock;
  xq.q.resize(M * K);
  xq.dx.resize(M * xq.blocks);
  xq.sx.resize(M * xq.blocks);
}

// Rows [m0, m1) of x [M, K] -> the same rows of `out`, already sized for K (threads may fill
// disjoint rows at once).
template <typename T>
void quantize_block_rows(const T* x, int64_t m0, int64_t m1, QuantizedX& out) {
  const int64_t K = out.K, B = K / kBlock, groups_end = K / kGroup * kGroup;
  for (int64_t m = m0; m < m1; ++m) {
    const T* xm = x + m * K;
    int8_t* qm = out.q.data() + m * K;
    for (int64_t b = 0; b < B; ++b) {
      alignas(64) float row[kBlock];
      to_float(xm + b * kBlock, row, kBlock);
      alignas(64) int8_t q[kBlock];
      float d;
      int32_t qsum = 0;
#if SURGE_TIER >= SURGE_TIER_AVX512_VNNI
      const __m512 v0 = _mm512_load_ps(row), v1 = _mm512_load_ps(row + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
      d = amax / 127.f;
      const __m512 inv = _mm512_set1_ps(d > 0.f ? 1.f / d : 0.f);
      // Round to nearest even (the default mode), like std::nearbyint.
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, inv));
      const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, inv));
      qsum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
      _mm_store_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(q0));
      _mm_store_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(q1));
#else
      float amax = 0.f;
      for (int64_t i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(row[i]));
      d = amax / 127.f;
      const float inv = d > 0.f ? 1.f / d : 0.f;
      for (int64_t i = 0; i < kBlock; ++i) {
        const int32_t v = static_cast<int32_t>(std::nearbyint(row[i] * inv));
        q[i] = static_cast<int8_t>(v);
        qsum += v;
      }
#endif
      if (b * kBlock >= groups_end) {
        std::memcpy(qm + b * kBlock, q, kBlock);
      } else {
        // Four weights at a time: a block's 8 words land 32 or 128 bytes apart.
        for (int64_t j = 0; j < 8; ++j)
          std::memcpy(qm + x_position(b * kBlock + 4 * j, groups_end), q + 4 * j, 4);
      }
      out.dx[m * B + b] = d;
      out.sx[m * B + b] = d * static_cast<float>(qsum);
    }
  }
}

// x [M, K] -> `out`, resized.
template <typename T>
void quantize_blocks(const T* x, int64_t M, int64_t K, QuantizedX& out) {
  resize(out, M, K);
  quantize_block_rows(x, 0, M, out);
}

#if SURGE_TIER >= SURGE_TIER_AVX512_VNNI
// 16 outputs from one vector: rounded like c10's conversions.
template <typename T>
inline void store_tile(T* p, __m512 v) {
  alignas(64) float t[kTile];
  _mm512_store_ps(t, v);
  for (int64_t i = 0; i < kTile; ++i) p[i] = static_cast<T>(t[i]);
}
inline void store_tile(float* p, __m512 v) { surge::store16(p, v); }
inline void store_tile(at::BFloat16* p, __m512 v) { surge::store16(p, v); }
inline void store_tile(at::Half* p, __m512 v) { surge::store16(p, v); }

// sum[m]: 16 partial sums (unreduced) of weight row qs/dm times activation row m0 + m.
template <int MR>
inline void q4_row(const uint8_t* qs, const uint16_t* dm, const QuantizedX& xq, int64_t m0,
                   __m512* sum) {
  const int64_t K = xq.K, B = xq.blocks, groups = K / kGroup;
  const uint16_t* d16 = dm;
  const uint16_t* m16 = dm + B;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512 acc[MR], macc[MR];  // two chains: the d and m terms do not wait on each other
  for (int m = 0; m < MR; ++m) acc[m] = macc[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* qg = qs + g * (kGroup / 2);
    __m512i lo_sum[MR], hi_sum[MR];
    for (int m = 0; m < MR; ++m) lo_sum[m] = hi_sum[m] = _mm512_setzero_si512();
    for (int64_t u = 0; u < 4; ++u) {
      const __m512i packed = _mm512_loadu_si512(qg + u * 64);
      const __m512i lo = _mm512_and_si512(packed, low4);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low4);
      for (int m = 0; m < MR; ++m) {
        const int8_t* x = xq.q.data() + (m0 + m) * K + g * kGroup + u * 128;
        lo_sum[m] = _mm512_dpbusd_epi32(lo_sum[m], lo, _mm512_loadu_si512(x));
        hi_sum[m] = _mm512_dpbusd_epi32(hi_sum[m], hi, _mm512_loadu_si512(x + 64));
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(d16 + g * 16)));
    const __m512 mn = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(m16 + g * 16)));
    for (int m = 0; m < MR; ++m) {
      // Lanes 0-7 of the low sum and of the high sum, then lanes 8-15 of each: blocks 0-15.
      const __m512i blocks =
          _mm512_add_epi32(_mm512_shuffle_i64x2(lo_sum[m], hi_sum[m], _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm512_shuffle_i64x2(lo_sum[m], hi_sum[m], _MM_SHUFFLE(3, 2, 3, 2)));
      const float* dx = xq.dx.data() + (m0 + m) * B + g * 16;
      const float* sx = xq.sx.data() + (m0 + m) * B + g * 16;
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(blocks), _mm512_mul_ps(d, _mm512_loadu_ps(dx)), acc[m]);
      macc[m] = _mm512_fmadd_ps(mn, _mm512_loadu_ps(sx), macc[m]);
    }
  }
  // The pairs after the last group: lanes 0-7 of a dot product are block b's, 8-15 block b + 1's.
  const __m512i spread = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  for (int64_t b = groups * 16; b < B; b += 2) {
    const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + b * 16));
    const __m256i lo = _mm256_and_si256(packed, _mm512_castsi512_si256(low4));
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), _mm512_castsi512_si256(low4));
    const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    int32_t d_bits, m_bits;  // two float16 each
    std::memcpy(&d_bits, d16 + b, 4);
    std::memcpy(&m_bits, m16 + b, 4);
    const __m128 d2 = _mm_cvtph_ps(_mm_cvtsi32_si128(d_bits));  // d[b], d[b + 1], 0, 0
    const __m128 m2 = _mm_cvtph_ps(_mm_cvtsi32_si128(m_bits));
    for (int m = 0; m < MR; ++m) {
      const int64_t r = m0 + m;
      const __m512i dot = _mm512_dpbusd_epi32(
          _mm512_setzero_si512(), w, _mm512_loadu_si512(xq.q.data() + r * K + b * kBlock));
      const __m128 dx2 = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(xq.dx.data() + r * B + b)));
      const __m128 sx2 = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(xq.sx.data() + r * B + b)));
      const __m512 scale = _mm512_permutexvar_ps(spread, _mm512_zextps128_ps512(_mm_mul_ps(d2, dx2)));
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[m]);
      macc[m] = _mm512_add_ps(macc[m], _mm512_zextps128_ps512(_mm_mul_ps(m2, sx2)));
    }
  }
  for (int m = 0; m < MR; ++m) sum[m] = _mm512_add_ps(acc[m], macc[m]);
}

// Output channels [n0, n1) for activation rows m0 .. m0 + MR - 1; ADD (float output only):
// added to what `out` holds (a residual connection) instead of overwriting it.
template <int MR, bool ADD, typename T>
void q4_rows(const uint8_t* qs, const uint16_t* dm, const QuantizedX& xq, int64_t m0,
             const float* bias, int64_t n0, int64_t n1, int64_t N, T* out) {
  const int64_t K = xq.K, row_bytes = K / 2, row_scales = 2 * xq.blocks;
  __m512 part[MR][kTile];
  __m512 sum[MR];
  int64_t n = n0;
  for (; n + kTile <= n1; n += kTile) {
    for (int r = 0; r < kTile; ++r) {
      q4_row<MR>(qs + (n + r) * row_bytes, dm + (n + r) * row_scales, xq, m0, sum);
      for (int m = 0; m < MR; ++m) part[m][r] = sum[m];
    }
    const __m512 b = bias ? _mm512_loadu_ps(bias + n) : _mm512_setzero_ps();
    for (int m = 0; m < MR; ++m) {
      T* o = out + (m0 + m) * N + n;
      __m512 y = _mm512_add_ps(surge::hsum16(part[m]), b);
      if constexpr (ADD) y = _mm512_add_ps(y, surge::load16(o));
      store_tile(o, y);
    }
  }
  for (; n < n1; ++n) {
    q4_row<MR>(qs + n * row_bytes, dm + n * row_scales, xq, m0, sum);
    for (int m = 0; m < MR; ++m) {
      const float y = _mm512_reduce_add_ps(sum[m]) + (bias ? bias[n] : 0.f);
      T& o = out[(m0 + m) * N + n];
      if constexpr (ADD) o += y;
      else o = static_cast<T>(y);
    }
  }
}
#elif SURGE_TIER >= SURGE_TIER_AVX2
// AVX2 (no VNNI): the same layout read as two 32-byte halves of each 64-byte load. u8 weights
// times s8 activations by vpmaddubsw into 16-bit pair sums (|15 * 127 * 2| = 3810), eight of
// them added in 16 bits per group (30480 < 32767: no saturation), widened to 32 bits once per
// group by vpmaddwd; lane i of the low sum is block i, of the high sum block 8 + i.

// sum[m]: 8 partial sums (unreduced) of weight row qs/dm times activation row m0 + m.
template <int MR>
inline void q4_row(const uint8_t* qs, const uint16_t* dm, const QuantizedX& xq, int64_t m0,
                   __m256* sum) {
  const int64_t K = xq.K, B = xq.blocks, groups = K / kGroup;
  const uint16_t* d16 = dm;
  const uint16_t* m16 = dm + B;
  const __m256i low4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  // One accumulator per row (the d and m terms in one chain): MR = 4 keeps 4 of the 16 ymm
  // registers, the group's 8 sums 8 more.
  __m256 acc[MR];
  const int8_t* xr[MR];
  for (int m = 0; m < MR; ++m) {
    acc[m] = _mm256_setzero_ps();
    xr[m] = xq.q.data() + (m0 + m) * K;
  }
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* qg = qs + g * (kGroup / 2);
    __m256i lo_sum[MR], hi_sum[MR];
    for (int m = 0; m < MR; ++m) lo_sum[m] = hi_sum[m] = _mm256_setzero_si256();
    // Unrolled, every address a constant offset. The empty asm after each load's products
    // pins the sums in registers there: without it GCC hoisted all the products of the group
    // ahead of their adds and spilled them (standalone, one thread, L1: 4 rows 62 -> 82
    // GMAC/s, 2 rows 42 -> 59-72, 1 row 48 -> 53).
#pragma GCC unroll 8
    for (int u = 0; u < 8; ++u) {  // 32-byte halves of the 4 loads of the group
      const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qg + u * 32));
      const __m256i lo = _mm256_and_si256(packed, low4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4);
      const int64_t off = g * kGroup + (u / 2) * 128 + (u % 2) * 32;
      for (int m = 0; m < MR; ++m) {
        const int8_t* x = xr[m] + off;
        lo_sum[m] = _mm256_add_epi16(
            lo_sum[m], _mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x))));
        hi_sum[m] = _mm256_add_epi16(
            hi_sum[m],
            _mm256_maddubs_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 64))));
      }
      for (int m = 0; m < MR; ++m) asm("" : "+x"(lo_sum[m]), "+x"(hi_sum[m]));
    }
    const __m256 d_lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d16 + g * 16)));
    const __m256 d_hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d16 + g * 16 + 8)));
    const __m256 m_lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(m16 + g * 16)));
    const __m256 m_hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(m16 + g * 16 + 8)));
    for (int m = 0; m < MR; ++m) {
      const float* dx = xq.dx.data() + (m0 + m) * B + g * 16;
      const float* sx = xq.sx.data() + (m0 + m) * B + g * 16;
      const __m256 lo = _mm256_cvtepi32_ps(_mm256_madd_epi16(lo_sum[m], ones));
      const __m256 hi = _mm256_cvtepi32_ps(_mm256_madd_epi16(hi_sum[m], ones));
      acc[m] = _mm256_fmadd_ps(lo, _mm256_mul_ps(d_lo, _mm256_loadu_ps(dx)), acc[m]);
      acc[m] = _mm256_fmadd_ps(hi, _mm256_mul_ps(d_hi, _mm256_loadu_ps(dx + 8)), acc[m]);
      acc[m] = _mm256_fmadd_ps(m_lo, _mm256_loadu_ps(sx), acc[m]);
      acc[m] = _mm256_fmadd_ps(m_hi, _mm256_loadu_ps(sx + 8), acc[m]);
    }
  }
  // The pairs after the last group: 32 bytes, block b in the low nibbles, b + 1 in the high.
  for (int64_t b = groups * 16; b < B; b += 2) {
    const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + b * 16));
    const __m256i lo = _mm256_and_si256(packed, low4);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4);
    const float d0 = _cvtsh_ss(d16[b]), d1 = _cvtsh_ss(d16[b + 1]);
    const float n0 = _cvtsh_ss(m16[b]), n1 = _cvtsh_ss(m16[b + 1]);
    for (int m = 0; m < MR; ++m) {
      const int64_t r = m0 + m;
      const int8_t* x = xq.q.data() + r * K + b * kBlock;
      const __m256i dot0 = _mm256_madd_epi16(
          _mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x))), ones);
      const __m256i dot1 = _mm256_madd_epi16(
          _mm256_maddubs_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32))), ones);
      const float* dx = xq.dx.data() + r * B + b;
      const float* sx = xq.sx.data() + r * B + b;
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot0), _mm256_set1_ps(d0 * dx[0]), acc[m]);
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot1), _mm256_set1_ps(d1 * dx[1]), acc[m]);
      acc[m] = _mm256_add_ps(acc[m], _mm256_setr_ps(n0 * sx[0] + n1 * sx[1], 0, 0, 0, 0, 0, 0, 0));
    }
  }
  for (int m = 0; m < MR; ++m) sum[m] = acc[m];
}

// Output channels [n0, n1) for activation rows m0 .. m0 + MR - 1; ADD (float output only):
// added to what `out` holds (a residual connection) instead of overwriting it.
template <int MR, bool ADD, typename T>
void q4_rows(const uint8_t* qs, const uint16_t* dm, const QuantizedX& xq, int64_t m0,
             const float* bias, int64_t n0, int64_t n1, int64_t N, T* out) {
  const int64_t K = xq.K, row_bytes = K / 2, row_scales = 2 * xq.blocks;
  __m256 part[MR][kTile];
  __m256 sum[MR];
  int64_t n = n0;
  // 16 ymm registers: a row's two 16-bit sums are updated every load, so at most 4 rows go
  // through the weight row together; the rest read it again from L1.
  constexpr int MR1 = MR > 4 ? 4 : MR, MR2 = MR - MR1;
  const auto row_sums = [&](int64_t c) {
    q4_row<MR1>(qs + c * row_bytes, dm + c * row_scales, xq, m0, sum);
    if constexpr (MR2 > 0) q4_row<MR2>(qs + c * row_bytes, dm + c * row_scales, xq, m0 + MR1, sum + MR1);
  };
  for (; n + kTile <= n1; n += kTile) {
    for (int r = 0; r < kTile; ++r) {
      row_sums(n + r);
      for (int m = 0; m < MR; ++m) part[m][r] = sum[m];
    }
    for (int m = 0; m < MR; ++m) {
      for (int h = 0; h < kTile; h += 8) {
        T* o = out + (m0 + m) * N + n + h;
        __m256 y = hsum8(part[m] + h);
        if (bias) y = _mm256_add_ps(y, _mm256_loadu_ps(bias + n + h));
        if constexpr (ADD) y = _mm256_add_ps(y, _mm256_loadu_ps(o));
        store8(o, y);
      }
    }
  }
  for (; n < n1; ++n) {
    row_sums(n);
    for (int m = 0; m < MR; ++m) {
      const float y = hsum(sum[m]) + (bias ? bias[n] : 0.f);
      T& o = out[(m0 + m) * N + n];
      if constexpr (ADD) o += y;
      else o = static_cast<T>(y);
    }
  }
}
#else
inline float half_to_float(uint16_t h) {
  return static_cast<float>(c10::Half(h, c10::Half::from_bits()));
}

// Portable path: the same sums, one weight at a time.
template <int MR, bool ADD, typename T>
void q4_rows(const uint8_t* qs, const uint16_t* dm, const QuantizedX& xq, int64_t m0,
             const float* bias, int64_t n0, int64_t n1, int64_t N, T* out) {
  const int64_t K = xq.K, B = xq.blocks, groups_end = K / kGroup * kGroup;
  std::vector<int32_t> q(K);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = qs + n * (K / 2);
    const uint16_t* d16 = dm + n * 2 * B;
    const uint16_t* m16 = d16 + B;
    for (int64_t k = 0; k < K; ++k) q[k] = weight_nibble(row, k, groups_end);
    for (int m = 0; m < MR; ++m) {
      const int64_t r = m0 + m;
      const int8_t* x = xq.q.data() + r * K;
      float total = 0.f;
      for (int64_t b = 0; b < B; ++b) {
        int32_t dot = 0;
        for (int64_t k = b * kBlock; k < (b + 1) * kBlock; ++k)
          dot += q[k] * static_cast<int32_t>(x[x_position(k, groups_end)]);
        total += half_to_float(d16[b]) * xq.dx[r * B + b] * static_cast<float>(dot) +
                 half_to_float(m16[b]) * xq.sx[r * B + b];
      }
      if (bias) total += bias[n];
      if constexpr (ADD) out[r * N + n] += total;
      else out[r * N + n] = static_cast<T>(total);
    }
  }
}
#endif

// Output channels [n0, n1) of all M rows of `xq` (in passes of up to kMaxRows rows).
template <bool ADD, typename T>
void q4_range(const uint8_t* qs, const uint16_t* dm, const QuantizedX& xq, int64_t M,
              const float* bias, int64_t n0, int64_t n1, int64_t N, T* out) {
  static_assert(!ADD || std::is_same_v<T, float>, "q4_range: ADD needs float32 output");
  if (n0 >= n1) return;
  for (int64_t m0 = 0; m0 < M; m0 += kMaxRows)
    surge::with_rows(std::min(kMaxRows, M - m0), [&](auto rows) {
      q4_rows<decltype(rows)::value, ADD, T>(qs, dm, xq, m0, bias, n0, n1, N, out);
    });
}

}  // namespace surge::q4
