// The GEMM of GGUF blocks as stored (gguf_blocks.h) with int8 activations per block of 32:
//   y[m, n] = sum over sub-blocks of a * dx * dot(q, xq) - b * dx * sum(xq)
// (Q6_K: a per 16 weights), the file's weights times the rounded activations.
//
// AVX2 (also the path on AVX-512 machines): weights as unsigned bytes, activations signed, by
// vpmaddubsw into 16-bit pair sums then vpmaddwd into 8 int32 lanes per sub-block, converted and
// FMA'd with the sub-block's float scale into 8 unreduced lanes per (weight row, activation row);
// 8 weight rows' lanes are reduced together (hsum8). Offsets are integer corrections from the
// activation block sums (Q4_0's -8, Q6_K's -32), or a float term (K-quants' mins, Q4_1's m).
// Q8_0's signed weights: |w| times x with w's sign (vpsignb), |w| <= 128 so no 16-bit overflow.
// Up to 4 activation rows go through a weight row together (16 ymm registers); the rows of x are
// taken in blocks of ~64 KB so that each tile of 8 weight rows is read from memory once per block.
#pragma once
#include <type_traits>
#include "gguf_blocks.h"

namespace surge::gguf {

constexpr int64_t kTile = 8;   // weight rows reduced together
constexpr int kRows = 4;       // activation rows per pass over a weight row

#if SURGE_TIER >= SURGE_TIER_AVX2
inline __m256i load32(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// 8 int32 lanes of a 32-weight dot product: unsigned weights q, signed activations x.
inline __m256i dot32(__m256i q, const int8_t* x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(q, load32(x)), _mm256_set1_epi16(1));
}

// Q4_K/Q5_K's 12 scale bytes -> [8 scales | 8 mins] as bytes, in registers (k_scales' bytes
// written and read back as a vector stalled on store forwarding: Q4_K ran at 1/5 the speed).
inline __m128i k_scales_vec(const uint8_t* s) {
  uint32_t u[3];
  std::memcpy(u, s, 12);
  const uint32_t m6 = 0x3f3f3f3f, m4 = 0x0f0f0f0f, m2 = 0x03030303;
  const uint32_t sc_hi = (u[2] & m4) | (((u[0] >> 6) & m2) << 4);
  const uint32_t mn_hi = ((u[2] >> 4) & m4) | (((u[1] >> 6) & m2) << 4);
  return _mm_setr_epi32(static_cast<int>(u[0] & m6), static_cast<int>(sc_hi),
                        static_cast<int>(u[1] & m6), static_cast<int>(mn_hi));
}

// Lane j of v in every lane (a register permute: no store and reload).
inline __m256 lane(__m256 v, int j) { return _mm256_permutevar8x32_ps(v, _mm256_set1_epi32(j)); }

template <int MR>
struct Rows {
  const int8_t* x[MR];
  const float* dx[MR];
  const float* sx[MR];
  const int32_t* qsum[MR];
  const int16_t* half_sum[MR];
  Rows(const QuantizedX& xq, int64_t m0) {
    for (int m = 0; m < MR; ++m) {
      x[m] = xq.q.data() + (m0 + m) * xq.K;
      dx[m] = xq.dx.data() + (m0 + m) * xq.blocks;
      sx[m] = xq.sx.data() + (m0 + m) * xq.blocks;
      qsum[m] = xq.qsum.data() + (m0 + m) * xq.blocks;
      half_sum[m] = xq.half_sum.data() + (m0 + m) * xq.blocks * 2;
    }
  }
};

// acc[m] += weight row `w` (K weights of `type`) times activation row m0 + m, 8 lanes.
template <int MR>
inline void row_q4_0(const uint8_t* w, int64_t K, const Rows<MR>& r, __m256* acc, bool q4_1) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const int64_t bytes = q4_1 ? 20 : 18;
  float mterm[MR] = {};
  for (int64_t b = 0; b < K / kBlock; ++b) {
    const uint8_t* blk = w + b * bytes;
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (q4_1 ? 4 : 2)));
    const __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), low4);
    const __m256 d = _mm256_set1_ps(half_to_float(blk));
    const float mn = q4_1 ? half_to_float(blk + 2) : 0.f;
    for (int m = 0; m < MR; ++m) {
      __m256i p = dot32(q, r.x[m] + b * kBlock);
      // Q4_0's q - 8: the 8 lanes' sum less 8 * sum(x), one sum(x) from each lane.
      if (!q4_1) p = _mm256_sub_epi32(p, _mm256_set1_epi32(r.qsum[m][b]));
      else mterm[m] += mn * r.sx[m][b];
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(d, _mm256_set1_ps(r.dx[m][b])), acc[m]);
    }
  }
  if (q4_1)
    for (int m = 0; m < MR; ++m) acc[m] = _mm256_add_ps(acc[m], _mm256_setr_ps(mterm[m], 0, 0, 0, 0, 0, 0, 0));
}

template <int MR>
inline void row_q8_0(const uint8_t* w, int64_t K, const Rows<MR>& r, __m256* acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < K / kBlock; ++b) {
    const uint8_t* blk = w + b * 34;
    const __m256i q = load32(blk + 2);
    const __m256i aq = _mm256_abs_epi8(q);
    const __m256 d = _mm256_set1_ps(half_to_float(blk));
    for (int m = 0; m < MR; ++m) {
      const __m256i x = _mm256_sign_epi8(load32(r.x[m] + b * kBlock), q);
      const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aq, x), ones);
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(d, _mm256_set1_ps(r.dx[m][b])), acc[m]);
    }
  }
}

// Q4_K (Q5 false) and Q5_K: per super-block of 256, the mins' term as one 8-lane FMA, then the
// 8 sub-blocks, each pair from one 32-byte load of nibbles.
template <int MR, bool Q5>
inline void row_k4(const uint8_t* w, int64_t K, const Rows<MR>& r, __m256* acc) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(16);
  constexpr int64_t bytes = Q5 ? 176 : 144;
  for (int64_t sb = 0; sb < K / 256; ++sb) {
    const uint8_t* blk = w + sb * bytes;
    const __m128i sm16 = k_scales_vec(blk + 4);
    const __m256 sc = _mm256_mul_ps(_mm256_set1_ps(half_to_float(blk)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sm16)));
    const __m256 mins = _mm256_mul_ps(_mm256_set1_ps(half_to_float(blk + 2)),
                                      _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm16, 8))));
    __m256 scale[MR];  // a * dx of each sub-block, per activation row
    for (int m = 0; m < MR; ++m) {
      acc[m] = _mm256_fnmadd_ps(mins, _mm256_loadu_ps(r.sx[m] + sb * 8), acc[m]);
      scale[m] = _mm256_mul_ps(sc, _mm256_loadu_ps(r.dx[m] + sb * 8));
    }
    const uint8_t* qs = blk + (Q5 ? 48 : 16);
    [[maybe_unused]] const __m256i qh = Q5 ? load32(blk + 16) : _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m256i packed = load32(qs + 32 * c);
      __m256i lo = _mm256_and_si256(packed, low4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4);
      if constexpr (Q5) {  // bit 2c (2c + 1) of each high-bit byte -> bit 4 of the weight
        const __m256i b0 = _mm256_set1_epi8(static_cast<char>(1 << (2 * c)));
        const __m256i b1 = _mm256_set1_epi8(static_cast<char>(1 << (2 * c + 1)));
        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b0), b0), bit4));
        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b1), b1), bit4));
      }
      for (int m = 0; m < MR; ++m) {
        const int8_t* x = r.x[m] + sb * 256 + 64 * c;
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot32(lo, x)), lane(scale[m], 2 * c), acc[m]);
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot32(hi, x + 32)), lane(scale[m], 2 * c + 1), acc[m]);
      }
    }
  }
}

// Q6_K: weights 0..63 unsigned; the 16-weight scales applied in the 16-bit -> 32-bit step
// (vpmaddwd by [s0 x 8 | s1 x 8]); the -32 as one correction per super-block from the 16-weight
// activation sums.
template <int MR>
inline void row_q6_k(const uint8_t* w, int64_t K, const Rows<MR>& r, __m256* acc) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), high2 = _mm256_set1_epi8(0x30);
  // Per 128-bit lane: int16 0 (low lane) or 1 (high lane) of a 32-bit pair, repeated.
  const __m256i spread = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                          2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
  for (int64_t sb = 0; sb < K / 256; ++sb) {
    const uint8_t* blk = w + sb * 210;
    const __m256 d = _mm256_set1_ps(half_to_float(blk + 208));
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)));
    __m256 scale[MR];  // d * dx of each 32-block
    for (int m = 0; m < MR; ++m) {
      const __m256 s = _mm256_mul_ps(d, _mm256_loadu_ps(r.dx[m] + sb * 8));
      scale[m] = s;
      const __m256i corr = _mm256_madd_epi16(sc16, load32(r.half_sum[m] + sb * 16));
      acc[m] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(_mm256_slli_epi32(corr, 5)), s, acc[m]);
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = load32(blk + 64 * h), ql1 = load32(blk + 64 * h + 32);
      const __m256i qh = load32(blk + 128 + 32 * h);
      const __m256i q[4] = {
          _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), high2)),
          _mm256_or_si256(_mm256_and_si256(ql1, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), high2)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4), _mm256_and_si256(qh, high2)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                          _mm256_and_si256(_mm256_srli_epi16(qh, 2), high2)),
      };
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) {
        const int j = 4 * h + t;
        // Scales 2j, 2j + 1 (one int32 of sc16) in every lane, then spread per 128-bit half.
        const __m256i pair = _mm256_permutevar8x32_epi32(sc16, _mm256_set1_epi32(j));
        const __m256i s = _mm256_shuffle_epi8(pair, spread);
        for (int m = 0; m < MR; ++m) {
          const __m256i p16 = _mm256_maddubs_epi16(q[t], load32(r.x[m] + sb * 256 + 32 * j));
          acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(p16, s)),
                                   lane(scale[m], j), acc[m]);
        }
      }
    }
  }
}

template <int TYPE, int MR>
inline void row_dot(const uint8_t* w, const QuantizedX& xq, int64_t m0, __m256* acc) {
  const Rows<MR> r(xq, m0);
  for (int m = 0; m < MR; ++m) acc[m] = _mm256_setzero_ps();
  if constexpr (TYPE == Q4_0 || TYPE == Q4_1) row_q4_0<MR>(w, xq.K, r, acc, TYPE == Q4_1);
  else if constexpr (TYPE == Q8_0) row_q8_0<MR>(w, xq.K, r, acc);
  else if constexpr (TYPE == Q4_K || TYPE == Q5_K) row_k4<MR, TYPE == Q5_K>(w, xq.K, r, acc);
  else row_q6_k<MR>(w, xq.K, r, acc);
}

// Weight rows [n0, n1) for activation rows [m0, m0 + MR); ADD: added into `out` (float32).
template <int TYPE, int MR, bool ADD, typename T>
void gemm_rows(const uint8_t* w, int64_t row_bytes, const QuantizedX& xq, int64_t m0,
               const float* bias, int64_t n0, int64_t n1, int64_t N, T* out) {
  __m256 part[MR][kTile];
  __m256 sum[MR];
  int64_t n = n0;
  for (; n + kTile <= n1; n += kTile) {
    for (int i = 0; i < kTile; ++i) {
      row_dot<TYPE, MR>(w + (n + i) * row_bytes, xq, m0, sum);
      for (int m = 0; m < MR; ++m) part[m][i] = sum[m];
    }
    for (int m = 0; m < MR; ++m) {
      __m256 y = hsum8(part[m]);
      if (bias) y = _mm256_add_ps(y, _mm256_loadu_ps(bias + n));
      if constexpr (ADD) y = _mm256_add_ps(y, _mm256_loadu_ps(out + (m0 + m) * N + n));
      store8(out + (m0 + m) * N + n, y);
    }
  }
  for (; n < n1; ++n) {
    row_dot<TYPE, MR>(w + n * row_bytes, xq, m0, sum);
    for (int m = 0; m < MR; ++m) {
      const float y = hsum(sum[m]) + (bias ? bias[n] : 0.f);
      T& o = out[(m0 + m) * N + n];
      if constexpr (ADD) o += y;
      else o = static_cast<T>(y);
    }
  }
}

// Weight rows [n0, n1) of all M activation rows into out [M, N] (N: its row stride); ADD: added
// into it (float32 only: the fused stack's residual adds).
template <int TYPE, typename T, bool ADD = false>
void gemm_range(const uint8_t* w, int64_t row_bytes, const QuantizedX& xq, int64_t M,
                const float* bias, int64_t n0, int64_t n1, int64_t N, T* out) {
  static_assert(!ADD || std::is_same_v<T, float>, "gguf gemm_range: ADD needs float32 output");
  // Rows of x per block: ~64 KB of int8, so a tile of weight rows stays in L1/L2 while the
  // block's rows go through it, and the weights are read from memory once per block.
  const int64_t block = std::max<int64_t>(kRows, (65536 / xq.K) / kRows * kRows);
  for (int64_t b0 = 0; b0 < M; b0 += block) {
    const int64_t b1 = std::min(M, b0 + block);
    for (int64_t t0 = n0; t0 < n1; t0 += 4 * kTile) {  // 32 weight rows, all rows of the block
      const int64_t t1 = std::min(n1, t0 + 4 * kTile);
      for (int64_t m0 = b0; m0 < b1; m0 += kRows) {
        switch (std::min<int64_t>(kRows, b1 - m0)) {
          case 1: gemm_rows<TYPE, 1, ADD>(w, row_bytes, xq, m0, bias, t0, t1, N, out); break;
          case 2: gemm_rows<TYPE, 2, ADD>(w, row_bytes, xq, m0, bias, t0, t1, N, out); break;
          case 3: gemm_rows<TYPE, 3, ADD>(w, row_bytes, xq, m0, bias, t0, t1, N, out); break;
          default: gemm_rows<TYPE, 4, ADD>(w, row_bytes, xq, m0, bias, t0, t1, N, out); break;
        }
      }
    }
  }
}
#else
// Plain loops: each weight row decoded once per call, then its dot with every activation row.
template <int TYPE, typename T, bool ADD = false>
void gemm_range(const uint8_t* w, int64_t row_bytes, const QuantizedX& xq, int64_t M,
                const float* bias, int64_t n0, int64_t n1, int64_t N, T* out) {
  static_assert(!ADD || std::is_same_v<T, float>, "gguf gemm_range: ADD needs float32 output");
  const int64_t K = xq.K, B = xq.blocks;
  const Format f = format(TYPE);
  const int64_t subs = f.weights / kBlock;
  std::vector<Sub> row(B);
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t b = 0; b < B; ++b)
      decode_sub(TYPE, w + n * row_bytes + (b / subs) * f.bytes, b % subs, row[b]);
    for (int64_t m = 0; m < M; ++m) {
      const int8_t* x = xq.q.data() + m * K;
      float total = 0.f;
      for (int64_t b = 0; b < B; ++b) {
        int32_t lo = 0, hi = 0;
        for (int i = 0; i < 16; ++i) {
          lo += row[b].q[i] * x[b * kBlock + i];
          hi += row[b].q[16 + i] * x[b * kBlock + 16 + i];
        }
        const float dx = xq.dx[m * B + b];
        total += dx * (row[b].a[0] * static_cast<float>(lo) + row[b].a[1] * static_cast<float>(hi)) -
                 row[b].b * xq.sx[m * B + b];
      }
      const float y = total + (bias ? bias[n] : 0.f);
      if constexpr (ADD) out[m * N + n] += y;
      else out[m * N + n] = static_cast<T>(y);
    }
  }
}
#endif

}  // namespace surge::gguf
