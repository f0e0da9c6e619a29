// Decode attention of a few query heads against one KV head's paged cache, in AVX-512 or AVX2
// registers (elsewhere in plain loops the compiler vectorizes); shared by the paged_decode op
// and the fused decode stack (q4_decode.cpp). From SURGE_TIER_AVX2 up attend_chunk is one of the
// register paths, which take head sizes that are a multiple of 16.
//
// An int8 cache (T = int8_t) holds each row as HD int8 values followed by the row's float32
// scale (4 bytes; value = int8 * scale): a key's dot product is scaled once, and a value row's
// softmax weight takes its scale, so the rows are never widened to a float copy.
#pragma once
#include <torch/extension.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include "avx2_common.h"
#include "avx512_common.h"
#include "cpu_features.h"

namespace surge {

// Elements from one cache row to the next: an int8 row carries its scale after its values.
template <typename T, int HD>
constexpr int64_t kRowStride = std::is_same_v<T, int8_t> ? HD + 4 : HD;

// The scale of an int8 row (1 for a float cache, whose rows hold their values as they are).
template <typename T, int HD>
inline float row_scale(const T* row) {
  if constexpr (std::is_same_v<T, int8_t>) {
    float s;
    std::memcpy(&s, row + HD, sizeof(s));
    return s;
  } else {
    return 1.f;
  }
}

// One row into an int8 cache: the values times 127 / max |value| rounded to nearest even (as
// torch.round of the same float32 product: a row written here or by the Python path is the
// same), then the float32 scale max / 127 (0 for a zero row).
template <int HD>
inline void quantize_kv_row(const float* x, int8_t* dst) {
  float amax = 0.f;
  for (int i = 0; i < HD; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float mult = amax > 0.f ? 127.f / amax : 0.f;
  for (int i = 0; i < HD; ++i)
    dst[i] = static_cast<int8_t>(std::max(-127.f, std::min(127.f, std::nearbyint(x[i] * mult))));
  const float scale = amax / 127.f;
  std::memcpy(dst + HD, &scale, sizeof(scale));
}

// exp(x) for x <= 0, one lane: range reduction to 2^f, f in [0, 1), and a degree-6 polynomial
// (relative error ~1e-7, like expf; exp16 below is the same); unlike std::exp it vectorizes.
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);
  const float t = x * 1.44269504088896341f;
  const float fi = std::floor(t);
  const float f = t - fi;
  const float p = 1.0f + f * (0.693147182f + f * (0.240226507f + f * (0.0555041087f +
                  f * (0.00961812911f + f * (0.00133335581f + f * 0.000154035304f)))));
  const int32_t bits = (static_cast<int32_t>(fi) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

}  // namespace surge

#if SURGE_TIER >= SURGE_TIER_AVX512

namespace surge {

// Per (request, kv head): the group's queries stay in registers (float32, pre-scaled; rounded to
// bf16 against a bf16 cache, whose key rows vdpbf16ps reads as stored); each key row is dotted
// with every query of the chunk; 16 keys' dot-product vectors are
// summed across lanes together (hsum16), not one by one; then the softmax; then each value row is
// widened once and accumulated into register-resident outputs. Memory traffic is one read of the
// request's K and V rows per chunk of queries (one chunk when group <= 256 / head size).

// exp(x) for x <= 0, 16 lanes: range reduction to 2^f, f in [0, 1), and a degree-6 polynomial
// (relative error ~1e-7; exp_nonpositive above is the same, one lane at a time).
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  const __m512 fi = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, fi);
  __m512 p = _mm512_set1_ps(0.000154035304f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.00133335581f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.00961812911f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.0555041087f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.240226507f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.693147182f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  const __m512i bits = _mm512_slli_epi32(
      _mm512_add_epi32(_mm512_cvtps_epi32(fi), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

// Hint the cache lines of one K or V row into L1.
template <typename T, int HD, int Hint = _MM_HINT_T0>
inline void prefetch_row(const T* row) {
  constexpr int kLines = (HD * static_cast<int>(sizeof(T)) + 63) / 64;
  for (int l = 0; l < kLines; ++l)
    _mm_prefetch(reinterpret_cast<const char*>(row) + l * 64, static_cast<_mm_hint>(Hint));
}

// Hint every cache line of `bytes` bytes from p, which starts anywhere in a line.
template <int Hint>
inline void prefetch_span(const int8_t* p, int64_t bytes) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(63);
  const uintptr_t last = (reinterpret_cast<uintptr_t>(p) + bytes - 1) & ~uintptr_t(63);
  for (uintptr_t line = first; line <= last; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(line), static_cast<_mm_hint>(Hint));
}

// The same for one int8 row (HD values, then a 4-byte scale).
template <int HD, int Hint = _MM_HINT_T0>
inline void prefetch_int8_row(const int8_t* row) {
  prefetch_span<Hint>(row, HD + 4);
}

// The cache rows of keys t0 .. t0 + n - 1 (t0 a multiple of 16, n <= 16): one block's
// consecutive rows when the block size is a multiple of 16 (the engine's is 16), so one
// division by the runtime block size per 16 keys, not two per key.
inline void rows16(const int64_t* table, int64_t bs, int64_t t0, int64_t n, int64_t* rows) {
  if (bs % 16 == 0) {
    const int64_t r = table[t0 / bs] * bs + t0 % bs;
    for (int64_t j = 0; j < n; ++j) rows[j] = r + j;
  } else {
    for (int64_t j = 0; j < n; ++j) rows[j] = table[(t0 + j) / bs] * bs + (t0 + j) % bs;
  }
}

// The cache row of key t0 + j: from `tile` (rows16) for an int8 cache, whose passes fetch rows
// ahead; looked up for a float one, which was 8% slower through the array at 64 requests.
template <typename T>
inline int64_t row_of(const int64_t* tile, const int64_t* table, int64_t bs, int64_t t0, int64_t j) {
  if constexpr (std::is_same_v<T, int8_t>) {
    return tile[j];
  } else {
    const int64_t t = t0 + j;
    return table[t / bs] * bs + t % bs;
  }
}

// Scores, softmax and weighted values of G queries (G * HD / 16 <= 16 registers) against one
// request's keys and values for one kv head; q rows are consecutive, `out` rows too.
// BS: the block size when known at compile time (0: block_size at run time). The engine's 16
// makes each key's row lookup a shift and a mask instead of 64-bit divisions (five a key).
template <typename T, int HD, int G, int BS, typename Q, typename O>
void attend_chunk_bs(const Q* q, const T* kh, const T* vh, const int64_t* table,
                     int64_t block_size, int64_t len, float scale, float* scores, O* out) {
  const int64_t bs = BS ? BS : block_size;
  constexpr int V = HD / 16;
  __m512 qr[G][V];
  for (int g = 0; g < G; ++g)
    for (int i = 0; i < V; ++i)
      qr[g][i] = _mm512_mul_ps(load16(q + g * HD + i * 16), _mm512_set1_ps(scale));
  const int64_t padded = (len + 15) & ~int64_t(15);
  constexpr int64_t S = kRowStride<T, HD>;  // elements from one cache row to the next
  int64_t tile[16];  // the cache rows of 16 keys (rows16; int8 only)
  __m512 mx[G], part[G][16];
  for (int g = 0; g < G; ++g) mx[g] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
#ifdef SURGE_HAS_AVX512_BF16
  if constexpr (std::is_same_v<T, at::BFloat16>) {
    // bf16 keys: vdpbf16ps multiplies the key row as stored (no widening) with the query rounded
    // to bf16, 32 products a instruction summed in float32. One query at a time over the 16
    // keys (re-read from L1 for the next query): 16 partial sums fit in registers, G x 16 not.
    __m512bh qb[G][V / 2];
    for (int g = 0; g < G; ++g)
      for (int h = 0; h < V / 2; ++h) qb[g][h] = _mm512_cvtne2ps_pbh(qr[g][2 * h + 1], qr[g][2 * h]);
    for (int64_t t0 = 0; t0 < padded; t0 += 16) {
      // The next 16 keys, fetched while these are scored: a request's blocks lie anywhere in
      // the pool, so the hardware prefetcher finds each only after its first misses.
      for (int64_t t = t0 + 16; t < std::min(len, t0 + 32); ++t)
        prefetch_row<T, HD>(kh + (table[t / bs] * bs + t % bs) * HD);
      // These keys' values, into L2 for the value pass (which pulls them on into L1 ahead).
      for (int64_t t = t0; t < std::min(len, t0 + 16); ++t)
        prefetch_row<T, HD, _MM_HINT_T1>(vh + (table[t / bs] * bs + t % bs) * HD);
      const int64_t n = std::min<int64_t>(16, len - t0);
      const T* rows[16];
      for (int64_t j = 0; j < n; ++j) rows[j] = kh + (table[(t0 + j) / bs] * bs + (t0 + j) % bs) * HD;
      for (int g = 0; g < G; ++g) {
        __m512 part[16];
        for (int64_t j = 0; j < 16; ++j) {
          if (j >= n) {
            part[j] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
            continue;
          }
          __m512 s = _mm512_setzero_ps();
          for (int h = 0; h < V / 2; ++h)
            s = _mm512_dpbf16_ps(s, qb[g][h], (__m512bh)_mm512_loadu_si512(rows[j] + h * 32));
          part[j] = s;
        }
        const __m512 s = hsum16(part);
        store16(scores + g * padded + t0, s);
        mx[g] = _mm512_max_ps(mx[g], s);
      }
    }
  } else
#endif
  for (int64_t t0 = 0; t0 < padded; t0 += 16) {
    const int64_t n = std::min<int64_t>(16, len - t0);  // >= 1
    if constexpr (std::is_same_v<T, int8_t>) {
      rows16(table, bs, t0, n, tile);
      // int8: the next 16 keys into L1 and these keys' values into L2 while these are scored,
      // as the bf16 pass above does. Without that the loop waited on memory: a request's
      // 68-byte rows lie anywhere in the pool, and the hardware prefetcher finds each block
      // only after its first misses: the kernel took 1.4x bf16's time at 64 requests, and half
      // as long now (benchmarks/bench_paged_decode.py --dtype int8).
      int64_t next[16];
      const int64_t m = std::min<int64_t>(16, len - t0 - 16);
      if (m > 0) rows16(table, bs, t0 + 16, m, next);
      if (bs % 16 == 0) {
        // A tile's rows are consecutive (rows16): its lines once each, not two per row.
        if (m > 0) prefetch_span<_MM_HINT_T0>(kh + next[0] * S, m * S);
        prefetch_span<_MM_HINT_T1>(vh + tile[0] * S, n * S);
      } else {
        for (int64_t j = 0; j < m; ++j) prefetch_int8_row<HD>(kh + next[j] * S);
        for (int64_t j = 0; j < n; ++j) prefetch_int8_row<HD, _MM_HINT_T1>(vh + tile[j] * S);
      }
    }
    for (int j = 0; j < 16; ++j) {
      if (j >= n) {
        for (int g = 0; g < G; ++g) part[g][j] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
        continue;
      }
      const T* kr = kh + row_of<T>(tile, table, bs, t0, j) * S;
      __m512 k[V];
      for (int i = 0; i < V; ++i) k[i] = load16(kr + i * 16);
      for (int g = 0; g < G; ++g) {
        __m512 s = _mm512_mul_ps(qr[g][0], k[0]);
        for (int i = 1; i < V; ++i) s = _mm512_fmadd_ps(qr[g][i], k[i], s);
        if constexpr (std::is_same_v<T, int8_t>) s = _mm512_mul_ps(s, _mm512_set1_ps(row_scale<T, HD>(kr)));
        part[g][j] = s;
      }
    }
    for (int g = 0; g < G; ++g) {
      // A -inf lane sums to -inf: the padding keys past len score -inf, as masking wants.
      const __m512 s = hsum16(part[g]);
      store16(scores + g * padded + t0, s);
      mx[g] = _mm512_max_ps(mx[g], s);
    }
  }
  float inv[G];
  for (int g = 0; g < G; ++g) {
    const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx[g]));
    __m512 sum = _mm512_setzero_ps();
    float* sg = scores + g * padded;
    for (int64_t t0 = 0; t0 < padded; t0 += 16) {
      const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(sg + t0), m));
      _mm512_storeu_ps(sg + t0, e);
      sum = _mm512_add_ps(sum, e);
    }
    inv[g] = 1.f / _mm512_reduce_add_ps(sum);
  }
  __m512 acc[G][V];
  for (int g = 0; g < G; ++g)
    for (int i = 0; i < V; ++i) acc[g][i] = _mm512_setzero_ps();
  if constexpr (std::is_same_v<T, at::BFloat16>) {
    // bf16 values widened two vectors per 32 with a shift and a mask: acc[g][2h] holds the even
    // dimensions of 32h .. 32h + 31, acc[g][2h + 1] the odd ones, interleaved back at the end.
    const __m512i high = _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
    for (int64_t t = 0; t < len; ++t) {
      if (t + 16 < len) prefetch_row<T, HD>(vh + (table[(t + 16) / bs] * bs + (t + 16) % bs) * HD);
      const T* vr = vh + (table[t / bs] * bs + t % bs) * HD;
      __m512 v[V];
      for (int h = 0; h < V / 2; ++h) {
        const __m512i x = _mm512_loadu_si512(vr + h * 32);
        v[2 * h] = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
        v[2 * h + 1] = _mm512_castsi512_ps(_mm512_and_si512(x, high));
      }
      for (int g = 0; g < G; ++g) {
        const __m512 p = _mm512_set1_ps(scores[g * padded + t]);
        for (int i = 0; i < V; ++i) acc[g][i] = _mm512_fmadd_ps(p, v[i], acc[g][i]);
      }
    }
    alignas(64) int32_t lo_idx[16], hi_idx[16];
    for (int i = 0; i < 8; ++i) {
      lo_idx[2 * i] = i, lo_idx[2 * i + 1] = 16 + i;
      hi_idx[2 * i] = 8 + i, hi_idx[2 * i + 1] = 24 + i;
    }
    const __m512i lo = _mm512_load_si512(lo_idx), hi = _mm512_load_si512(hi_idx);
    for (int g = 0; g < G; ++g) {
      const __m512 w = _mm512_set1_ps(inv[g]);
      for (int h = 0; h < V / 2; ++h) {
        const __m512 even = acc[g][2 * h], odd = acc[g][2 * h + 1];
        store16(out + g * HD + h * 32, _mm512_mul_ps(_mm512_permutex2var_ps(even, lo, odd), w));
        store16(out + g * HD + h * 32 + 16, _mm512_mul_ps(_mm512_permutex2var_ps(even, hi, odd), w));
      }
    }
    return;
  }
  for (int64_t t0 = 0; t0 < len; t0 += 16) {  // int8 values: in L2 from the key pass
    const int64_t n = std::min<int64_t>(16, len - t0);
    if constexpr (std::is_same_v<T, int8_t>) rows16(table, bs, t0, n, tile);
    for (int64_t j = 0; j < n; ++j) {
      const T* vr = vh + row_of<T>(tile, table, bs, t0, j) * S;
      const float vs = row_scale<T, HD>(vr);
      __m512 v[V];
      for (int i = 0; i < V; ++i) v[i] = load16(vr + i * 16);
      for (int g = 0; g < G; ++g) {
        const __m512 p = _mm512_set1_ps(scores[g * padded + t0 + j] * vs);
        for (int i = 0; i < V; ++i) acc[g][i] = _mm512_fmadd_ps(p, v[i], acc[g][i]);
      }
    }
  }
  for (int g = 0; g < G; ++g)
    for (int i = 0; i < V; ++i)
      store16(out + g * HD + i * 16, _mm512_mul_ps(acc[g][i], _mm512_set1_ps(inv[g])));
}

template <typename T, int HD, int G, typename Q, typename O>
void attend_chunk(const Q* q, const T* kh, const T* vh, const int64_t* table, int64_t bs,
                  int64_t len, float scale, float* scores, O* out) {
  if (bs == 16) attend_chunk_bs<T, HD, G, 16>(q, kh, vh, table, bs, len, scale, scores, out);
  else attend_chunk_bs<T, HD, G, 0>(q, kh, vh, table, bs, len, scale, scores, out);
}

}  // namespace surge
#elif SURGE_TIER >= SURGE_TIER_AVX2

namespace surge {

// The AVX-512 path's computation in 8-lane registers, 16 of them: the queries stay in L1 (G
// queries of HD floats do not fit in registers) and each key row, read once, is dotted with all
// of them; 8 keys' dot-product vectors are summed across lanes together (hsum8). The values are
// accumulated a slice of the head at a time, so that G x slice accumulators fit in registers.
// Rows are walked block by block (no division per row: the block size is a runtime value).
// No software prefetch: with float32 K/V the loop runs at memory bandwidth in the engine's
// layout, where prefetching each next block cost 5-10% (and gained 0-7% with blocks scattered).
template <typename T, int HD, int G, typename Q, typename O>
void attend_chunk(const Q* q, const T* kh, const T* vh, const int64_t* table, int64_t bs,
                  int64_t len, float scale, float* scores, O* out) {
  static_assert(HD % 16 == 0, "head size: a multiple of 16");
  constexpr int V = HD / 8;
  constexpr int KC = V < 8 ? V : 8;        // key vectors held at once (the dot in slices of 64)
  constexpr int DC = G >= 3 ? 2 : 4;       // value vectors per pass: G * DC accumulators
  const int64_t padded = (len + 15) & ~int64_t(15);
  alignas(32) float qf[G][HD];
  for (int g = 0; g < G; ++g)
    for (int i = 0; i < HD; ++i) qf[g][i] = static_cast<float>(q[g * HD + i]) * scale;
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 mx[G];
  for (int g = 0; g < G; ++g) mx[g] = neg_inf;
  alignas(32) float part[G][8][8];
  int64_t blk = 0, off = 0;
  for (int64_t t0 = 0; t0 < padded; t0 += 8) {
    const int64_t n = std::min<int64_t>(8, len - t0);  // <= 0: padding only
    for (int j = 0; j < 8; ++j) {
      if (j >= n) {  // -inf lanes sum to -inf: padding scores -inf, as masking wants
        for (int g = 0; g < G; ++g) _mm256_store_ps(part[g][j], neg_inf);
        continue;
      }
      const T* kr = kh + (table[blk] * bs + off) * kRowStride<T, HD>;
      if (++off == bs) off = 0, ++blk;
      __m256 s[G];
      for (int g = 0; g < G; ++g) s[g] = _mm256_setzero_ps();
      for (int c = 0; c < V; c += KC) {
        __m256 k[KC];
        for (int i = 0; i < KC; ++i) k[i] = load8(kr + (c + i) * 8);
        for (int g = 0; g < G; ++g)
          for (int i = 0; i < KC; ++i)
            s[g] = _mm256_fmadd_ps(_mm256_load_ps(&qf[g][(c + i) * 8]), k[i], s[g]);
      }
      if constexpr (std::is_same_v<T, int8_t>) {
        const __m256 ks = _mm256_set1_ps(row_scale<T, HD>(kr));
        for (int g = 0; g < G; ++g) s[g] = _mm256_mul_ps(s[g], ks);
      }
      for (int g = 0; g < G; ++g) _mm256_store_ps(part[g][j], s[g]);
    }
    for (int g = 0; g < G; ++g) {
      __m256 v[8];
      for (int j = 0; j < 8; ++j) v[j] = _mm256_load_ps(part[g][j]);
      const __m256 s = hsum8(v);
      _mm256_storeu_ps(scores + g * padded + t0, s);
      mx[g] = _mm256_max_ps(mx[g], s);
    }
  }
  float inv[G];
  for (int g = 0; g < G; ++g) {
    const __m256 m = _mm256_set1_ps(hmax(mx[g]));
    float* sg = scores + g * padded;
    __m256 sum = _mm256_setzero_ps();
    for (int64_t t0 = 0; t0 < padded; t0 += 8) {
      const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sg + t0), m));
      _mm256_storeu_ps(sg + t0, e);
      sum = _mm256_add_ps(sum, e);
    }
    inv[g] = 1.f / hsum(sum);
  }
  for (int c = 0; c < V; c += DC) {
    __m256 acc[G][DC];
    for (int g = 0; g < G; ++g)
      for (int i = 0; i < DC; ++i) acc[g][i] = _mm256_setzero_ps();
    blk = 0, off = 0;
    for (int64_t t = 0; t < len; ++t) {
      const T* row = vh + (table[blk] * bs + off) * kRowStride<T, HD>;
      if (++off == bs) off = 0, ++blk;
      const T* vr = row + c * 8;
      __m256 v[DC];
      for (int i = 0; i < DC; ++i) v[i] = load8(vr + i * 8);
      __m256 vs = _mm256_set1_ps(1.f);
      if constexpr (std::is_same_v<T, int8_t>) vs = _mm256_set1_ps(row_scale<T, HD>(row));
      for (int g = 0; g < G; ++g) {
        __m256 p = _mm256_broadcast_ss(scores + g * padded + t);
        if constexpr (std::is_same_v<T, int8_t>) p = _mm256_mul_ps(p, vs);
        for (int i = 0; i < DC; ++i) acc[g][i] = _mm256_fmadd_ps(p, v[i], acc[g][i]);
      }
    }
    for (int g = 0; g < G; ++g) {
      const __m256 w = _mm256_set1_ps(inv[g]);
      for (int i = 0; i < DC; ++i) store8(out + g * HD + (c + i) * 8, _mm256_mul_ps(acc[g][i], w));
    }
  }
}

}  // namespace surge
#else  // neither: the same computation in plain loops, which the compiler vectorizes

namespace surge {

template <typename T, int HD>
inline void widen_row(const T* src, float* dst) {
  if constexpr (std::is_same_v<T, int8_t>) {
    const float scale = row_scale<T, HD>(src);
    for (int i = 0; i < HD; ++i) dst[i] = static_cast<float>(src[i]) * scale;
  } else if constexpr (std::is_same_v<T, at::BFloat16>) {
    const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
    uint32_t* d = reinterpret_cast<uint32_t*>(dst);
    for (int i = 0; i < HD; ++i) d[i] = static_cast<uint32_t>(s[i]) << 16;
  } else {
    for (int i = 0; i < HD; ++i) dst[i] = static_cast<float>(src[i]);
  }
}

// As the AVX-512 attend_chunk: G queries against one request's keys and values of one kv head.
template <typename T, int HD, int G, typename Q, typename O>
void attend_chunk(const Q* q, const T* kh, const T* vh, const int64_t* table, int64_t bs,
                  int64_t len, float scale, float* scores, O* out) {
  const int64_t padded = (len + 15) & ~int64_t(15);
  alignas(64) float qf[G][HD];
  for (int g = 0; g < G; ++g)
    for (int i = 0; i < HD; ++i) qf[g][i] = static_cast<float>(q[g * HD + i]) * scale;
  float mx[G];
  for (int g = 0; g < G; ++g) mx[g] = -std::numeric_limits<float>::infinity();
  alignas(64) float row[HD];
  for (int64_t t = 0; t < len; ++t) {
    widen_row<T, HD>(kh + (table[t / bs] * bs + t % bs) * kRowStride<T, HD>, row);
    for (int g = 0; g < G; ++g) {
      float s = 0.f;
      for (int i = 0; i < HD; ++i) s += qf[g][i] * row[i];
      scores[g * padded + t] = s;
      mx[g] = std::max(mx[g], s);
    }
  }
  float inv[G];
  for (int g = 0; g < G; ++g) {
    float* sg = scores + g * padded;
    float sum = 0.f;
    for (int64_t t = 0; t < len; ++t) {
      const float e = exp_nonpositive(sg[t] - mx[g]);
      sg[t] = e;
      sum += e;
    }
    inv[g] = 1.f / sum;
  }
  alignas(64) float acc[G][HD] = {};
  for (int64_t t = 0; t < len; ++t) {
    widen_row<T, HD>(vh + (table[t / bs] * bs + t % bs) * kRowStride<T, HD>, row);
    for (int g = 0; g < G; ++g) {
      const float p = scores[g * padded + t];
      for (int i = 0; i < HD; ++i) acc[g][i] += p * row[i];
    }
  }
  for (int g = 0; g < G; ++g)
    for (int i = 0; i < HD; ++i) out[g * HD + i] = static_cast<O>(acc[g][i] * inv[g]);
}

}  // namespace surge
#endif  // SURGE_TIER_AVX512 / SURGE_TIER_AVX2 / plain loops
