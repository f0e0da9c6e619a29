// Prefill attention in tiles, for the fused stack's prefill-chunk rows on a bf16 KV cache with
// AVX-512 BF16 (vdpbf16ps): one request's chunk rows attend its cached keys as a small GEMM
// instead of one row at a time.
//
// Why: attending each chunk row alone (decode_attention.h's attend_chunk) costs ~13 vector ops
// per (query, key) pair: two bf16 dot products per key and a 16-lane horizontal sum for the
// scores, then each value row widened to float32 and four FMAs per query head. At a 1,024-token
// prompt on SmolLM2 that was 390 of the step's ~700 ms. Here, per (request, KV head):
//   1. pack (once per layer): the keys, 16 at a time, as [HD/2][16] 32-bit pairs of dimensions
//      (a key per lane), and the values as [key pair][HD] 32-bit pairs of keys (a dimension per
//      lane): the layouts vdpbf16ps multiplies against a broadcast query or probability pair.
//   2. a tile of rows: scores of 8 query vectors at once against 16 keys, HD/2 vdpbf16ps each
//      with the query pair broadcast (no horizontal sums); the softmax in float32; the
//      probabilities rounded to bf16 (as flash attention does) and accumulated against the
//      value pairs, HD/16 vdpbf16ps per query head and key pair.
// About 5 ops per pair instead of 13.
//
// Numerics: queries are rounded to bf16 as the decode kernel rounds them; scores and the
// softmax stay float32; the probabilities are rounded to bf16 for the value products, a change
// from the row-at-a-time path measured in BENCHMARKS.md. A row's result depends only on its own
// query, its length and the keys (16-key groups from key 0, key pairs from key 0), never on
// which other rows share its tile or chunk, so chunking and batching leave it unchanged
// (batch-invariant mode keeps its guarantee).
//
// Without AVX-512 BF16 (Skylake/Cascade Lake/Ice Lake Xeons, AVX2 CPUs, or the avx512 and avx2
// kernel tiers) the same tiles run in float32 with FMAs: keys packed as [HD][16] floats, values as [key][HD] floats,
// ~8 FMAs per pair where the row-at-a-time kernel there spends ~13 ops and horizontal sums;
// queries and probabilities stay float32 (as that kernel keeps them), so only the order of
// the sums differs from it.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>
#include "cpu_features.h"
#include "decode_attention.h"

#if SURGE_TIER >= SURGE_TIER_AVX2
#define SURGE_HAS_TILED_PREFILL 1

// What every tier's tiles share: the group size, the packed layouts' sizes, the scratch, the
// cache row lookup and the tile's sizes.
namespace surge::prefill {

constexpr int64_t kKeys = 16;  // keys per packed group

#if defined(SURGE_HAS_AVX512_BF16)
// 32-bit words a packed group takes, keys and values alike: 16 keys x HD/2 pairs of dimensions,
// or 8 key pairs x HD dimensions.
template <int HD>
constexpr int64_t kGroupWords = kKeys * HD / 2;
using Elem = uint16_t;  // queries and probabilities: bf16 bits
#else
// Float32 words: 16 keys x HD dimensions, keys and values alike.
template <int HD>
constexpr int64_t kGroupWords = kKeys * HD;
using Elem = float;
#endif

#if SURGE_TIER >= SURGE_TIER_AVX512
constexpr int64_t kQ = 8;  // query vectors scored at once (8 or 16 accumulators + key registers)
#else
constexpr int64_t kQ = 6;  // AVX2: 6 query vectors x 2 registers of keys = 12 accumulators
#endif

// Per-thread buffers of a tile, grown as needed.
struct TileScratch {
  std::vector<Elem> q;         // [vectors][HD] scaled (bf16 bits with AVX-512 BF16)
  std::vector<float> scores;   // [vectors][padded]
  std::vector<Elem> p;         // [vectors][padded]: exp(score - max), 0 past the row
  std::vector<float> inv;      // [vectors] 1 / sum of exp
};

// The cache rows of keys t0 .. t0 + n - 1 (null past n).
inline void group_rows(const uint16_t* kh, const uint16_t* vh, const int64_t* table, int64_t bs,
                       int64_t t0, int64_t n, int64_t hd, const uint16_t** krows,
                       const uint16_t** vrows) {
  for (int64_t j = 0; j < kKeys; ++j) {
    if (j < n) {
      const int64_t t = t0 + j, row = (table[t / bs] * bs + t % bs) * hd;
      krows[j] = kh + row;
      vrows[j] = vh + row;
    } else {
      krows[j] = vrows[j] = nullptr;
    }
  }
}

// A tile of R rows of G query heads: nv query vectors (nv_pad, a whole number of kQ), each
// row's scores `padded` long (its longest row's keys, whole groups); the scratch grown to them.
struct TileSize {
  int64_t nv, nv_pad, padded;
};
inline TileSize size_tile(const int64_t* lens, int64_t R, int64_t G, int64_t hd, TileScratch& s) {
  const int64_t nv = R * G, nv_pad = (nv + kQ - 1) / kQ * kQ;
  int64_t max_len = 0;
  for (int64_t r = 0; r < R; ++r) max_len = std::max(max_len, lens[r]);
  const int64_t padded = (max_len + kKeys - 1) / kKeys * kKeys;
  s.q.resize(nv_pad * hd);
  s.scores.resize(nv_pad * padded);
  s.p.resize(nv * padded);
  s.inv.resize(nv);
  return {nv, nv_pad, padded};
}

// The most keys any of query vectors [v0, min(nv, v0 + width)) sees (width: the vectors scored
// at once, kQ, or an AMX tile's 16).
inline int64_t longest(const int64_t* lens, int64_t G, int64_t nv, int64_t v0,
                       int64_t width = kQ) {
  int64_t len = 0;
  for (int64_t v = v0; v < std::min(nv, v0 + width); ++v) len = std::max(len, lens[v / G]);
  return len;
}

// Float32 tiles' queries: row r's head g at q + r * q_stride + g * hd, scaled, vector after
// vector; the padding vectors zero.
inline void scale_queries(const float* q, int64_t q_stride, int64_t G, const TileSize& t,
                          int64_t hd, float scale, float* dst) {
  for (int64_t v = 0; v < t.nv_pad; ++v) {
    const float* src = q + (v / G) * q_stride + (v % G) * hd;
    for (int64_t i = 0; i < hd; ++i) dst[v * hd + i] = v < t.nv ? src[i] * scale : 0.f;
  }
}

}  // namespace surge::prefill
#endif  // SURGE_TIER >= SURGE_TIER_AVX2

#if SURGE_TIER >= SURGE_TIER_AVX512
namespace surge::prefill {

// A 16 x 16 transpose of 32-bit words: r[i] lane j -> r[j] lane i.
inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // Each 128-bit quarter of r[i] now holds a 4 x 4 block; move the blocks into place.
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 2; ++j) {
      const int a = i + 8 * j, b = i + 4 + 8 * j;  // rows 4 apart
      t[a] = _mm512_shuffle_i32x4(r[a], r[b], 0x88);  // quarters 0, 2 of each
      t[b] = _mm512_shuffle_i32x4(r[a], r[b], 0xdd);  // quarters 1, 3 of each
    }
  }
  for (int a = 0; a < 8; ++a) {  // with the row 8 apart
    r[a] = _mm512_shuffle_i32x4(t[a], t[a + 8], 0x88);
    r[a + 8] = _mm512_shuffle_i32x4(t[a], t[a + 8], 0xdd);
  }
}


// Softmax per query vector over its row's keys: float32, exp16 as the decode kernel's; the
// weights stored as Elem (rounded to bf16 for the bf16 value products), zero past the row's
// keys; inv[v] = 1 / their sum.
inline void softmax_rows(const int64_t* lens, int64_t nv, int64_t G, int64_t padded,
                         TileScratch& s) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t v = 0; v < nv; ++v) {
    const int64_t len = lens[v / G];
    const float* sc = s.scores.data() + v * padded;
    Elem* pv = s.p.data() + v * padded;
    __m512 mx = neg_inf;
    for (int64_t t0 = 0; t0 < len; t0 += kKeys) {
      const int64_t n = std::min<int64_t>(kKeys, len - t0);
      const __mmask16 m = static_cast<__mmask16>((1u << n) - 1u);
      mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(neg_inf, m, sc + t0));
    }
    const __m512 mv = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t t0 = 0; t0 < padded; t0 += kKeys) {
      const int64_t n = std::clamp<int64_t>(len - t0, 0, kKeys);
      const __mmask16 m = static_cast<__mmask16>((1u << n) - 1u);
      const __m512 e = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_loadu_ps(sc + t0), mv)));
      sum = _mm512_add_ps(sum, e);
#if defined(SURGE_HAS_AVX512_BF16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pv + t0), (__m256i)_mm512_cvtneps_pbh(e));
#else
      _mm512_storeu_ps(pv + t0, e);
#endif
    }
    s.inv[v] = 1.f / _mm512_reduce_add_ps(sum);
  }
}

#if defined(SURGE_HAS_AVX512_BF16)
// Keys and values t0 .. t0 + n - 1 (n <= 16) of one KV head, from the paged cache (rows of HD
// bf16) into the packed layouts; keys and values past n are zero.
template <int HD>
inline void pack_group(const uint16_t* kh, const uint16_t* vh, const int64_t* table, int64_t bs,
                       int64_t t0, int64_t n, uint32_t* kp, uint32_t* vp) {
  const uint16_t* krows[kKeys];
  const uint16_t* vrows[kKeys];
  group_rows(kh, vh, table, bs, t0, n, HD, krows, vrows);
  // Keys: 16 words (32 dimensions) of each of the 16 rows, transposed to a key per lane.
  for (int64_t w0 = 0; w0 < HD / 2; w0 += 16) {
    __m512i r[16];
    for (int j = 0; j < 16; ++j)
      r[j] = krows[j] ? _mm512_loadu_si512(krows[j] + 2 * w0) : _mm512_setzero_si512();
    transpose16(r);
    for (int i = 0; i < 16; ++i) _mm512_storeu_si512(kp + (w0 + i) * kKeys, r[i]);
  }
  // Values: each pair of keys' dimensions side by side, the first key in the low half (as
  // vdpbf16ps pairs them with a probability pair).
  for (int64_t p = 0; p < kKeys / 2; ++p) {
    const uint16_t* a = vrows[2 * p];
    const uint16_t* b = vrows[2 * p + 1];
    for (int64_t d = 0; d < HD; d += 16) {
      const __m512i lo = a ? _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + d)))
                           : _mm512_setzero_si512();
      const __m512i hi = b ? _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + d)))
                           : _mm512_setzero_si512();
      _mm512_storeu_si512(vp + p * HD + d, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
  }
}

// RC rows x GC heads (their accumulators in registers) against the first `len` keys' values,
// a key pair at a time; p: bf16 weights, a head `padded` and a row `row` apart. Each key
// pair's value vectors are loaded once for all RC x GC uses (pinned: without the empty asm GCC
// reloaded them from memory for every head, 12 loads a pair where 4 do at GC = 3); two rows a
// pass halve the reads from L2. With two rows the pairs run to the longer row's length: the
// shorter row's weights are zero past its own keys, and a zero product leaves a float32 sum as
// it was, so a row's result has the same bits alone or paired.
template <int HD, int RC, int GC>
inline void values_bf16(const uint16_t* p, int64_t row, int64_t padded, int64_t len,
                        const uint32_t* vp, const float* inv, int64_t inv_row, float* out,
                        int64_t out_row) {
  constexpr int V = HD / 16;
  static_assert(RC * GC * V + V + 1 <= 32, "accumulators, values and a broadcast in registers");
  __m512 acc[RC][GC][V];
  for (int r = 0; r < RC; ++r)
    for (int g = 0; g < GC; ++g)
      for (int i = 0; i < V; ++i) acc[r][g][i] = _mm512_setzero_ps();
  const int64_t pairs = (len + 1) / 2;
  for (int64_t kp = 0; kp < pairs; ++kp) {
    __m512i v[V];
    for (int i = 0; i < V; ++i) {
      __m512i x = _mm512_loadu_si512(vp + kp * HD + i * 16);
      asm("" : "+v"(x));
      v[i] = x;
    }
    for (int r = 0; r < RC; ++r)
      for (int g = 0; g < GC; ++g) {
        uint32_t pair;
        std::memcpy(&pair, p + r * row + g * padded + 2 * kp, sizeof(pair));
        const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(pair));
        for (int i = 0; i < V; ++i) acc[r][g][i] = _mm512_dpbf16_ps(acc[r][g][i], a, (__m512bh)v[i]);
      }
  }
  for (int r = 0; r < RC; ++r)
    for (int g = 0; g < GC; ++g) {
      const __m512 w = _mm512_set1_ps(inv[r * inv_row + g]);
      for (int i = 0; i < V; ++i)
        _mm512_storeu_ps(out + r * out_row + g * HD + i * 16, _mm512_mul_ps(acc[r][g][i], w));
    }
}

// bf16 tiles' queries: row r's head g at q + r * q_stride + g * hd, scaled and rounded to bf16
// (as the decode kernel rounds them), vector after vector; the padding vectors zero. The AMX
// tiles' too (prefill_attention_amx.h).
inline void scale_queries(const float* q, int64_t q_stride, int64_t G, const TileSize& t,
                          int64_t hd, float scale, uint16_t* dst) {
  for (int64_t v = 0; v < t.nv_pad; ++v, dst += hd) {
    if (v >= t.nv) {
      std::memset(dst, 0, hd * sizeof(uint16_t));
      continue;
    }
    const float* src = q + (v / G) * q_stride + (v % G) * hd;
    for (int64_t i = 0; i < hd; i += 32) {
      const __m512 lo = _mm512_mul_ps(_mm512_loadu_ps(src + i), _mm512_set1_ps(scale));
      const __m512 hi = _mm512_mul_ps(_mm512_loadu_ps(src + i + 16), _mm512_set1_ps(scale));
      _mm512_storeu_si512(dst + i, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
  }
}

// One tile: R rows of a request, row r with G query heads at q + r * q_stride (float32, head
// after head) attending its first lens[r] keys; kp / vp: the request's packed groups for this
// KV head (covering every row's keys); the output rows at out + r * out_stride.
template <int HD>
void attend_tile(const float* q, int64_t q_stride, const int64_t* lens, int64_t R, int64_t G,
                 const uint32_t* kp, const uint32_t* vp, float scale, TileScratch& s, float* out,
                 int64_t out_stride) {
  const TileSize t = size_tile(lens, R, G, HD, s);
  const int64_t nv = t.nv, nv_pad = t.nv_pad, padded = t.padded;
  scale_queries(q, q_stride, G, t, HD, scale, s.q.data());
  // Scores, 8 query vectors against 16 keys at a time, up to the longest of the 8 rows' keys.
  for (int64_t v0 = 0; v0 < nv_pad; v0 += kQ) {
    const int64_t len = longest(lens, G, nv, v0);
    const uint32_t* qw = reinterpret_cast<const uint32_t*>(s.q.data() + v0 * HD);
    int64_t t0 = 0;
    // Two key groups at a time: each broadcast query pair feeds two vdpbf16ps, not one
    // (16 accumulators, 2 key registers, 1 broadcast). Per score the same products in the same
    // order as the one-group loop below, so the same bits.
    for (; t0 + kKeys < len; t0 += 2 * kKeys) {
      const uint32_t* kg = kp + (t0 / kKeys) * kGroupWords<HD>;
      __m512 acc[kQ], acc2[kQ];
      for (int b = 0; b < kQ; ++b) acc[b] = acc2[b] = _mm512_setzero_ps();
      for (int64_t dp = 0; dp < HD / 2; ++dp) {
        const __m512bh k = (__m512bh)_mm512_loadu_si512(kg + dp * kKeys);
        const __m512bh k2 = (__m512bh)_mm512_loadu_si512(kg + kGroupWords<HD> + dp * kKeys);
        for (int b = 0; b < kQ; ++b) {
          const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(qw[b * HD / 2 + dp]));
          acc[b] = _mm512_dpbf16_ps(acc[b], a, k);
          acc2[b] = _mm512_dpbf16_ps(acc2[b], a, k2);
        }
      }
      for (int b = 0; b < kQ; ++b) {
        _mm512_storeu_ps(s.scores.data() + (v0 + b) * padded + t0, acc[b]);
        _mm512_storeu_ps(s.scores.data() + (v0 + b) * padded + t0 + kKeys, acc2[b]);
      }
    }
    for (; t0 < len; t0 += kKeys) {
      const uint32_t* kg = kp + (t0 / kKeys) * kGroupWords<HD>;
      __m512 acc[kQ];
      for (int b = 0; b < kQ; ++b) acc[b] = _mm512_setzero_ps();
      for (int64_t dp = 0; dp < HD / 2; ++dp) {
        const __m512bh k = (__m512bh)_mm512_loadu_si512(kg + dp * kKeys);
        for (int b = 0; b < kQ; ++b) {
          const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(qw[b * HD / 2 + dp]));
          acc[b] = _mm512_dpbf16_ps(acc[b], a, k);
        }
      }
      for (int b = 0; b < kQ; ++b) _mm512_storeu_ps(s.scores.data() + (v0 + b) * padded + t0, acc[b]);
    }
  }
  softmax_rows(lens, nv, G, padded, s);
  // Values: two rows' heads a pass where they fit in registers (head size 64, up to 3 heads a
  // KV head: SmolLM2's 3), else one row's, kGC heads at a time.
  constexpr int64_t kGC = HD == 64 ? 4 : 2;
  const int64_t row = G * padded;
  int64_t r = 0;
  if constexpr (HD == 64) {
    for (; r + 1 < R && G <= 3; r += 2) {
      const int64_t len = std::max(lens[r], lens[r + 1]);
      const uint16_t* p = s.p.data() + r * row;
      const float* inv = s.inv.data() + r * G;
      float* o = out + r * out_stride;
      switch (G) {
        case 1: values_bf16<HD, 2, 1>(p, row, padded, len, vp, inv, G, o, out_stride); break;
        case 2: values_bf16<HD, 2, 2>(p, row, padded, len, vp, inv, G, o, out_stride); break;
        case 3: values_bf16<HD, 2, 3>(p, row, padded, len, vp, inv, G, o, out_stride); break;
      }
    }
  }
  for (; r < R; ++r) {
    for (int64_t g0 = 0; g0 < G; g0 += kGC) {
      const int64_t v = r * G + g0, gc = std::min(kGC, G - g0);
      const uint16_t* p = s.p.data() + v * padded;
      const float* inv = s.inv.data() + v;
      float* o = out + r * out_stride + g0 * HD;
      switch (gc) {
        case 1: values_bf16<HD, 1, 1>(p, row, padded, lens[r], vp, inv, G, o, out_stride); break;
        case 2: values_bf16<HD, 1, 2>(p, row, padded, lens[r], vp, inv, G, o, out_stride); break;
        case 3: if constexpr (kGC >= 3) values_bf16<HD, 1, 3>(p, row, padded, lens[r], vp, inv, G, o, out_stride); break;
        case 4: if constexpr (kGC >= 4) values_bf16<HD, 1, 4>(p, row, padded, lens[r], vp, inv, G, o, out_stride); break;
      }
    }
  }
}

#else  // float32 tiles: AVX-512 without BF16

// 16 bf16 values widened to float32 (a bf16 is a float32's upper half).
inline __m512 widen16(const uint16_t* x) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x))), 16));
}

// Keys and values t0 .. t0 + n - 1 (n <= 16) of one KV head, from the paged cache (rows of HD
// bf16) into float32: keys as [HD][16] (a key per lane), values as [16][HD] (the rows widened);
// past n zero.
template <int HD>
inline void pack_group(const uint16_t* kh, const uint16_t* vh, const int64_t* table, int64_t bs,
                       int64_t t0, int64_t n, uint32_t* kp, uint32_t* vp) {
  const uint16_t* krows[kKeys];
  const uint16_t* vrows[kKeys];
  group_rows(kh, vh, table, bs, t0, n, HD, krows, vrows);
  for (int64_t d0 = 0; d0 < HD; d0 += 16) {
    __m512i r[16];
    for (int j = 0; j < 16; ++j)
      r[j] = krows[j] ? _mm512_castps_si512(widen16(krows[j] + d0)) : _mm512_setzero_si512();
    transpose16(r);
    for (int i = 0; i < 16; ++i) _mm512_storeu_si512(kp + (d0 + i) * kKeys, r[i]);
  }
  float* vf = reinterpret_cast<float*>(vp);
  for (int64_t j = 0; j < kKeys; ++j)
    for (int64_t d = 0; d < HD; d += 16)
      _mm512_storeu_ps(vf + j * HD + d, vrows[j] ? widen16(vrows[j] + d) : _mm512_setzero_ps());
}

// RC rows x GC heads against the first `len` keys' values (float32 weights p, rows `row`
// floats apart; past a row's own keys its weights are zero, which leaves its sums as they
// were, as in values_bf16), key after key with each value row in registers.
template <int HD, int RC, int GC>
inline void values_f32(const float* p, int64_t row, int64_t padded, int64_t len, const float* vp,
                       const float* inv, int64_t inv_row, float* out, int64_t out_row) {
  constexpr int V = HD / 16;
  static_assert(RC * GC * V + V + 1 <= 32, "accumulators, values and a broadcast in registers");
  __m512 acc[RC][GC][V];
  for (int r = 0; r < RC; ++r)
    for (int g = 0; g < GC; ++g)
      for (int i = 0; i < V; ++i) acc[r][g][i] = _mm512_setzero_ps();
  for (int64_t t = 0; t < len; ++t) {
    __m512 v[V];
    for (int i = 0; i < V; ++i) {
      __m512 x = _mm512_loadu_ps(vp + t * HD + i * 16);
      asm("" : "+v"(x));  // in a register for all its uses (GCC reloaded it per head)
      v[i] = x;
    }
    for (int r = 0; r < RC; ++r)
      for (int g = 0; g < GC; ++g) {
        const __m512 a = _mm512_set1_ps(p[r * row + g * padded + t]);
        for (int i = 0; i < V; ++i) acc[r][g][i] = _mm512_fmadd_ps(a, v[i], acc[r][g][i]);
      }
  }
  for (int r = 0; r < RC; ++r)
    for (int g = 0; g < GC; ++g) {
      const __m512 w = _mm512_set1_ps(inv[r * inv_row + g]);
      for (int i = 0; i < V; ++i)
        _mm512_storeu_ps(out + r * out_row + g * HD + i * 16, _mm512_mul_ps(acc[r][g][i], w));
    }
}

// As the bf16 attend_tile, in float32.
template <int HD>
void attend_tile(const float* q, int64_t q_stride, const int64_t* lens, int64_t R, int64_t G,
                 const uint32_t* kp_words, const uint32_t* vp_words, float scale, TileScratch& s,
                 float* out, int64_t out_stride) {
  const float* kp = reinterpret_cast<const float*>(kp_words);
  const float* vp = reinterpret_cast<const float*>(vp_words);
  const TileSize t = size_tile(lens, R, G, HD, s);
  const int64_t nv = t.nv, nv_pad = t.nv_pad, padded = t.padded;
  scale_queries(q, q_stride, G, t, HD, scale, s.q.data());
  // Scores: 8 query vectors against 32 keys (two groups) a pass, then a last group alone; a
  // score is the same FMA chain over the dimensions either way.
  for (int64_t v0 = 0; v0 < nv_pad; v0 += kQ) {
    const int64_t len = longest(lens, G, nv, v0);
    const float* qv = s.q.data() + v0 * HD;
    float* sc = s.scores.data() + v0 * padded;
    int64_t t0 = 0;
    for (; t0 + kKeys < len; t0 += 2 * kKeys) {
      const float* kg = kp + (t0 / kKeys) * kGroupWords<HD>;
      __m512 acc[kQ], acc2[kQ];
      for (int b = 0; b < kQ; ++b) acc[b] = acc2[b] = _mm512_setzero_ps();
      for (int64_t d = 0; d < HD; ++d) {
        const __m512 k = _mm512_loadu_ps(kg + d * kKeys);
        const __m512 k2 = _mm512_loadu_ps(kg + kGroupWords<HD> + d * kKeys);
        for (int b = 0; b < kQ; ++b) {
          const __m512 a = _mm512_set1_ps(qv[b * HD + d]);
          acc[b] = _mm512_fmadd_ps(a, k, acc[b]);
          acc2[b] = _mm512_fmadd_ps(a, k2, acc2[b]);
        }
      }
      for (int b = 0; b < kQ; ++b) {
        _mm512_storeu_ps(sc + b * padded + t0, acc[b]);
        _mm512_storeu_ps(sc + b * padded + t0 + kKeys, acc2[b]);
      }
    }
    for (; t0 < len; t0 += kKeys) {
      const float* kg = kp + (t0 / kKeys) * kGroupWords<HD>;
      __m512 acc[kQ];
      for (int b = 0; b < kQ; ++b) acc[b] = _mm512_setzero_ps();
      for (int64_t d = 0; d < HD; ++d) {
        const __m512 k = _mm512_loadu_ps(kg + d * kKeys);
        for (int b = 0; b < kQ; ++b) acc[b] = _mm512_fmadd_ps(_mm512_set1_ps(qv[b * HD + d]), k, acc[b]);
      }
      for (int b = 0; b < kQ; ++b) _mm512_storeu_ps(sc + b * padded + t0, acc[b]);
    }
  }
  softmax_rows(lens, nv, G, padded, s);
  // Values: two rows' heads at a time where they fit in registers, else one row's, in chunks.
  constexpr int V = HD / 16;
  constexpr int64_t kGC = (32 - V - 1) / V;  // one row's heads a pass
  const int64_t row = G * padded;
  int64_t r = 0;
  if constexpr (V == 4) {  // head size 64: up to 3 heads of two rows in registers
    for (; r + 1 < R && G <= 3; r += 2) {
      const int64_t len = std::max(lens[r], lens[r + 1]);
      const float* p = s.p.data() + r * row;
      const float* inv = s.inv.data() + r * G;
      float* o = out + r * out_stride;
      switch (G) {
        case 1: values_f32<HD, 2, 1>(p, row, padded, len, vp, inv, G, o, out_stride); break;
        case 2: values_f32<HD, 2, 2>(p, row, padded, len, vp, inv, G, o, out_stride); break;
        case 3: values_f32<HD, 2, 3>(p, row, padded, len, vp, inv, G, o, out_stride); break;
      }
    }
  }
  for (; r < R; ++r) {
    for (int64_t g0 = 0; g0 < G; g0 += kGC) {
      const int64_t v = r * G + g0, gc = std::min(kGC, G - g0);
      const float* p = s.p.data() + v * padded;
      const float* inv = s.inv.data() + v;
      float* o = out + r * out_stride + g0 * HD;
      switch (gc) {
        case 1: values_f32<HD, 1, 1>(p, row, padded, lens[r], vp, inv, G, o, out_stride); break;
        case 2: if constexpr (kGC >= 2) values_f32<HD, 1, 2>(p, row, padded, lens[r], vp, inv, G, o, out_stride); break;
        case 3: if constexpr (kGC >= 3) values_f32<HD, 1, 3>(p, row, padded, lens[r], vp, inv, G, o, out_stride); break;
        case 4: if constexpr (kGC >= 4) values_f32<HD, 1, 4>(p, row, padded, lens[r], vp, inv, G, o, out_stride); break;
        case 5: if constexpr (kGC >= 5) values_f32<HD, 1, 5>(p, row, padded, lens[r], vp, inv, G, o, out_stride); break;
        case 6: if constexpr (kGC >= 6) values_f32<HD, 1, 6>(p, row, padded, lens[r], vp, inv, G, o, out_stride); break;
      }
    }
  }
}

#endif  // SURGE_HAS_AVX512_BF16
}  // namespace surge::prefill
#elif SURGE_TIER >= SURGE_TIER_AVX2

// The float32 tiles in AVX2's sixteen 8-lane registers: 6 query vectors against a group of 16
// keys a pass (12 accumulators, 2 key registers, a broadcast), the values a slice of the head at
// a time so that two rows' heads fit in registers. Same layouts and numerics as the AVX-512
// float32 tiles.
namespace surge::prefill {

// 8 bf16 values widened to float32.
inline __m256 widen8(const uint16_t* x) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(
      _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x))), 16));
}

// As the AVX-512 float32 pack_group: keys [HD][16] floats, values [16][HD] floats, zero past n.
template <int HD>
inline void pack_group(const uint16_t* kh, const uint16_t* vh, const int64_t* table, int64_t bs,
                       int64_t t0, int64_t n, uint32_t* kp, uint32_t* vp) {
  const uint16_t* krows[kKeys];
  const uint16_t* vrows[kKeys];
  group_rows(kh, vh, table, bs, t0, n, HD, krows, vrows);
  float* kf = reinterpret_cast<float*>(kp);
  float* vf = reinterpret_cast<float*>(vp);
  for (int64_t j = 0; j < kKeys; ++j) {
    alignas(32) float k[HD];
    for (int64_t d = 0; d < HD; d += 8) {
      _mm256_store_ps(k + d, krows[j] ? widen8(krows[j] + d) : _mm256_setzero_ps());
      _mm256_storeu_ps(vf + j * HD + d, vrows[j] ? widen8(vrows[j] + d) : _mm256_setzero_ps());
    }
    for (int64_t d = 0; d < HD; ++d) kf[d * kKeys + j] = k[d];
  }
}

// RC rows x GC heads of the values, DC 8-lane slices of the head a pass (RC * GC * DC + DC + 1
// registers); weights zero past a row's keys leave its sums as they were.
template <int HD, int RC, int GC, int DC>
inline void values_avx2(const float* p, int64_t row, int64_t padded, int64_t len, const float* vp,
                        const float* inv, int64_t inv_row, float* out, int64_t out_row) {
  constexpr int V = HD / 8;
  static_assert(V % DC == 0 && RC * GC * DC + DC + 1 <= 16, "registers");
  for (int c = 0; c < V; c += DC) {
    __m256 acc[RC][GC][DC];
    for (int r = 0; r < RC; ++r)
      for (int g = 0; g < GC; ++g)
        for (int i = 0; i < DC; ++i) acc[r][g][i] = _mm256_setzero_ps();
    for (int64_t t = 0; t < len; ++t) {
      __m256 v[DC];
      for (int i = 0; i < DC; ++i) {
        __m256 x = _mm256_loadu_ps(vp + t * HD + (c + i) * 8);
        asm("" : "+x"(x));  // in a register for all its uses
        v[i] = x;
      }
      for (int r = 0; r < RC; ++r)
        for (int g = 0; g < GC; ++g) {
          const __m256 a = _mm256_broadcast_ss(p + r * row + g * padded + t);
          for (int i = 0; i < DC; ++i) acc[r][g][i] = _mm256_fmadd_ps(a, v[i], acc[r][g][i]);
        }
    }
    for (int r = 0; r < RC; ++r)
      for (int g = 0; g < GC; ++g) {
        const __m256 w = _mm256_set1_ps(inv[r * inv_row + g]);
        for (int i = 0; i < DC; ++i)
          _mm256_storeu_ps(out + r * out_row + g * HD + (c + i) * 8, _mm256_mul_ps(acc[r][g][i], w));
      }
  }
}

// As the AVX-512 attend_tile, in float32 with AVX2.
template <int HD>
void attend_tile(const float* q, int64_t q_stride, const int64_t* lens, int64_t R, int64_t G,
                 const uint32_t* kp_words, const uint32_t* vp_words, float scale, TileScratch& s,
                 float* out, int64_t out_stride) {
  static_assert(HD % 16 == 0, "head size: a multiple of 16");
  const float* kp = reinterpret_cast<const float*>(kp_words);
  const float* vp = reinterpret_cast<const float*>(vp_words);
  const TileSize t = size_tile(lens, R, G, HD, s);
  const int64_t nv = t.nv, nv_pad = t.nv_pad, padded = t.padded;
  scale_queries(q, q_stride, G, t, HD, scale, s.q.data());
  // Scores: kQ query vectors against a group of 16 keys (two registers) a pass.
  for (int64_t v0 = 0; v0 < nv_pad; v0 += kQ) {
    const int64_t len = longest(lens, G, nv, v0);
    const float* qv = s.q.data() + v0 * HD;
    float* sc = s.scores.data() + v0 * padded;
    for (int64_t t0 = 0; t0 < len; t0 += kKeys) {
      const float* kg = kp + (t0 / kKeys) * kGroupWords<HD>;
      __m256 acc[kQ][2];
      for (int b = 0; b < kQ; ++b) acc[b][0] = acc[b][1] = _mm256_setzero_ps();
      for (int64_t d = 0; d < HD; ++d) {
        const __m256 k0 = _mm256_loadu_ps(kg + d * kKeys);
        const __m256 k1 = _mm256_loadu_ps(kg + d * kKeys + 8);
        for (int b = 0; b < kQ; ++b) {
          const __m256 a = _mm256_broadcast_ss(qv + b * HD + d);
          acc[b][0] = _mm256_fmadd_ps(a, k0, acc[b][0]);
          acc[b][1] = _mm256_fmadd_ps(a, k1, acc[b][1]);
        }
      }
      for (int b = 0; b < kQ; ++b) {
        _mm256_storeu_ps(sc + b * padded + t0, acc[b][0]);
        _mm256_storeu_ps(sc + b * padded + t0 + 8, acc[b][1]);
      }
    }
  }
  // Softmax per query vector over its row's keys (exp8, as the AVX2 row kernel's), float32
  // weights, zero past the row's keys.
  const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t v = 0; v < nv; ++v) {
    const int64_t len = lens[v / G];
    const float* sc = s.scores.data() + v * padded;
    float* pv = s.p.data() + v * padded;
    __m256 mx = neg_inf;
    for (int64_t t0 = 0; t0 < len; t0 += 8) {
      const __m256 in = _mm256_cmp_ps(lane, _mm256_set1_ps(static_cast<float>(len - t0)), _CMP_LT_OQ);
      mx = _mm256_max_ps(mx, _mm256_blendv_ps(neg_inf, _mm256_loadu_ps(sc + t0), in));
    }
    const __m256 mv = _mm256_set1_ps(hmax(mx));
    __m256 sum = _mm256_setzero_ps();
    for (int64_t t0 = 0; t0 < padded; t0 += 8) {
      const __m256 in = _mm256_cmp_ps(lane, _mm256_set1_ps(static_cast<float>(len - t0)), _CMP_LT_OQ);
      const __m256 e = _mm256_and_ps(in, exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + t0), mv)));
      sum = _mm256_add_ps(sum, e);
      _mm256_storeu_ps(pv + t0, e);
    }
    s.inv[v] = 1.f / hsum(sum);
  }
  // Values: two rows' heads a pass where they fit (up to 3 heads), else one row's, 6 at a time.
  const int64_t row = G * padded;
  int64_t r = 0;
  for (; r + 1 < R && G <= 3; r += 2) {
    const int64_t len = std::max(lens[r], lens[r + 1]);
    const float* p = s.p.data() + r * row;
    const float* inv = s.inv.data() + r * G;
    float* o = out + r * out_stride;
    switch (G) {
      case 1: values_avx2<HD, 2, 1, 4>(p, row, padded, len, vp, inv, G, o, out_stride); break;
      case 2: values_avx2<HD, 2, 2, 2>(p, row, padded, len, vp, inv, G, o, out_stride); break;
      case 3: values_avx2<HD, 2, 3, 2>(p, row, padded, len, vp, inv, G, o, out_stride); break;
    }
  }
  for (; r < R; ++r) {
    for (int64_t g0 = 0; g0 < G; g0 += 6) {
      const int64_t v = r * G + g0, gc = std::min<int64_t>(6, G - g0);
      const float* p = s.p.data() + v * padded;
      const float* inv = s.inv.data() + v;
      float* o = out + r * out_stride + g0 * HD;
      switch (gc) {
        case 1: values_avx2<HD, 1, 1, 4>(p, row, padded, lens[r], vp, inv, G, o, out_stride); break;
        case 2: values_avx2<HD, 1, 2, 4>(p, row, padded, lens[r], vp, inv, G, o, out_stride); break;
        case 3: values_avx2<HD, 1, 3, 2>(p, row, padded, lens[r], vp, inv, G, o, out_stride); break;
        case 4: values_avx2<HD, 1, 4, 2>(p, row, padded, lens[r], vp, inv, G, o, out_stride); break;
        case 5: values_avx2<HD, 1, 5, 2>(p, row, padded, lens[r], vp, inv, G, o, out_stride); break;
        case 6: values_avx2<HD, 1, 6, 2>(p, row, padded, lens[r], vp, inv, G, o, out_stride); break;
      }
    }
  }
}

}  // namespace surge::prefill
#endif  // SURGE_TIER
