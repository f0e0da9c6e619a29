// GGUF's own quantized blocks, read as the file stores them (no repacking): the formats, one
// 32-weight sub-block decoded to integers and scales (the dequantization and the plain-loop
// GEMV), and the activations rounded to int8 per block of 32 for the integer dot products.
//
// Every format is read as w[i] = a[i / 16] * q[i] - b per sub-block of 32 weights, q a small
// integer, a and b float32 computed exactly as the gguf package computes them (float16 scale
// times the integer scale, in float32, first):
//   Q4_0  18 B / 32:   float16 d, 16 B nibbles (low: weights 0-15, high: 16-31); a = d, q = n - 8
//   Q4_1  20 B / 32:   d, m, nibbles as Q4_0;                     a = d, q = n, b = -m
//   Q8_0  34 B / 32:   d, 32 int8;                                 a = d, q = int8
//   Q4_K  144 B / 256: d, dmin, 12 B of 6-bit (scale, min) pairs for the 8 sub-blocks, 128 B
//                      nibbles (32 B per 2 sub-blocks: low nibbles the first);
//                      a = d * sc, q = n, b = dmin * min
//   Q5_K  176 B / 256: as Q4_K, then 32 B of high bits (bit j of byte l: sub-block j, weight l)
//                      before the nibbles;                         q = n | bit << 4
//   Q6_K  210 B / 256: 128 B low nibbles, 64 B 2-bit highs, 16 int8 scales (one per 16), d;
//                      a = d * sc, q = 6-bit value - 32
#pragma once
#include <torch/extension.h>
#include "avx2_common.h"
#include "cpu_common.h"
#include "cpu_features.h"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

// Pins a value as computed: under -ffast-math GCC may fuse a * q - b into one FMA or regroup a
// product chain. For these formats every product is exact in float32 (a float16's 11 bits
// times integers of at most 8 and 6 bits), so neither could move a bit today
// (tests/models/test_gguf_linear.py checks it); pinned so that dequantization stays bit-exact
// against gguf whatever the compiler does.
#if defined(__x86_64__) || defined(__i386__)
#define SURGE_KEEP(v) asm("" : "+x"(v))
#elif defined(__aarch64__)
#define SURGE_KEEP(v) asm("" : "+w"(v))
#else
#define SURGE_KEEP(v) asm volatile("" : : "g"(&(v)) : "memory")
#endif

namespace surge::gguf {

// GGML's type ids (ggml.h, gguf.GGMLQuantizationType).
enum Type : int64_t { Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };

constexpr int64_t kBlock = 32;  // weights per sub-block; activations are rounded per block of 32

struct Format {
  int64_t weights;  // per block
  int64_t bytes;
};

inline Format format(int64_t type) {
  switch (type) {
    case Q4_0: return {32, 18};
    case Q4_1: return {32, 20};
    case Q8_0: return {32, 34};
    case Q4_K: return {256, 144};
    case Q5_K: return {256, 176};
    case Q6_K: return {256, 210};
    default: TORCH_CHECK(false, "gguf blocks: GGML type ", type, " is not supported");
  }
  return {0, 0};
}

inline float half_to_float(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#if SURGE_TIER >= SURGE_TIER_AVX2
  return _cvtsh_ss(h);
#else
  return static_cast<float>(c10::Half(h, c10::Half::from_bits()));
#endif
}

// Q4_K/Q5_K's 12 bytes -> the 8 sub-blocks' 6-bit scales (sm[0..7]) and mins (sm[8..15]):
// sub-blocks 0-3 in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); 4-7 in the nibbles of
// bytes 8-11 (scale low, min high), their top 2 bits in the top bits of bytes 0-3 and 4-7.
inline void k_scales(const uint8_t* s, uint8_t* sm) {
  for (int j = 0; j < 4; ++j) {
    sm[j] = s[j] & 63;
    sm[8 + j] = s[4 + j] & 63;
    sm[4 + j] = (s[8 + j] & 0x0F) | ((s[j] >> 6) << 4);
    sm[12 + j] = (s[8 + j] >> 4) | ((s[4 + j] >> 6) << 4);
  }
}

// Sub-block j of the block at `blk`: w[i] = a[i / 16] * q[i] - b.
struct Sub {
  alignas(32) int8_t q[kBlock];
  float a[2];
  float b;
};

inline void decode_sub(int64_t type, const uint8_t* blk, int64_t j, Sub& s) {
  s.b = 0.f;
  switch (type) {
    case Q4_0:
    case Q4_1: {
      const uint8_t* qs = blk + (type == Q4_0 ? 2 : 4);
      const int offset = type == Q4_0 ? 8 : 0;
      for (int i = 0; i < 16; ++i) {
        s.q[i] = static_cast<int8_t>((qs[i] & 0x0F) - offset);
        s.q[16 + i] = static_cast<int8_t>((qs[i] >> 4) - offset);
      }
      s.a[0] = s.a[1] = half_to_float(blk);
      if (type == Q4_1) s.b = -half_to_float(blk + 2);
      break;
    }
    case Q8_0:
      std::memcpy(s.q, blk + 2, kBlock);
      s.a[0] = s.a[1] = half_to_float(blk);
      break;
    case Q4_K:
    case Q5_K: {
      uint8_t sm[16];
      k_scales(blk + 4, sm);
      const uint8_t* qh = blk + 16;
      const uint8_t* qs = blk + (type == Q4_K ? 16 : 48) + (j / 2) * 32;
      const int shift = 4 * (j % 2);
      for (int i = 0; i < kBlock; ++i) {
        int v = (qs[i] >> shift) & 0x0F;
        if (type == Q5_K) v |= ((qh[i] >> j) & 1) << 4;
        s.q[i] = static_cast<int8_t>(v);
      }
      float a = half_to_float(blk) * static_cast<float>(sm[j]);
      float b = half_to_float(blk + 2) * static_cast<float>(sm[8 + j]);
      SURGE_KEEP(a);
      SURGE_KEEP(b);
      s.a[0] = s.a[1] = a;
      s.b = b;
      break;
    }
    case Q6_K: {
      const int64_t h = j / 4, t = j % 4;
      const uint8_t* ql = blk + h * 64 + (t % 2) * 32;
      const uint8_t* qh = blk + 128 + h * 32;
      const int lshift = 4 * static_cast<int>(t / 2), hshift = 2 * static_cast<int>(t);
      for (int i = 0; i < kBlock; ++i)
        s.q[i] = static_cast<int8_t>((((ql[i] >> lshift) & 0x0F) | (((qh[i] >> hshift) & 3) << 4)) - 32);
      const float d = half_to_float(blk + 208);
      const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
      for (int k = 0; k < 2; ++k) {
        float a = d * static_cast<float>(sc[2 * j + k]);
        SURGE_KEEP(a);
        s.a[k] = a;
      }
      break;
    }
    default: TORCH_CHECK(false, "gguf blocks: GGML type ", type, " is not supported");
  }
}

// One row of blocks -> K floats, bit-exact against gguf.quants.dequantize.
inline void dequantize_row(int64_t type, const uint8_t* row, int64_t K, float* out) {
  const Format f = format(type);
  const int64_t subs = f.weights / kBlock;
  Sub s;
  for (int64_t blk = 0; blk < K / f.weights; ++blk) {
    for (int64_t j = 0; j < subs; ++j) {
      decode_sub(type, row + blk * f.bytes, j, s);
      float* o = out + (blk * subs + j) * kBlock;
#if SURGE_TIER >= SURGE_TIER_AVX2
      const __m256 b = _mm256_set1_ps(s.b);
      for (int h = 0; h < 4; ++h) {
        const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(s.q + 8 * h));
        __m256 p = _mm256_mul_ps(_mm256_set1_ps(s.a[h / 2]), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8)));
        SURGE_KEEP(p);
        _mm256_storeu_ps(o + 8 * h, _mm256_sub_ps(p, b));
      }
#else
      for (int i = 0; i < kBlock; ++i) {
        float p = s.a[i / 16] * static_cast<float>(s.q[i]);
        SURGE_KEEP(p);
        o[i] = p - s.b;
      }
#endif
    }
  }
}

// The activations rounded to int8 per block of 32 (llama.cpp's Q8_0 scheme, the scale kept in
// float32; llama.cpp rounds K-quants' activations per 256 (Q8_K): one rounding here serves every
// format, so a layer's q, k and v in different formats share it).
struct QuantizedX {
  int64_t K = 0, blocks = 0;
  std::vector<int8_t, CacheLineAllocator<int8_t>> q;  // [M, K]
  std::vector<float> dx;                              // [M, K/32] block scales
  std::vector<float> sx;                              // [M, K/32] dx * (sum of the block's q)
  std::vector<int32_t> qsum;                          // [M, K/32] sum of the block's q
  std::vector<int16_t> half_sum;                      // [M, K/16] sum of each 16 q (Q6_K)
};

inline void resize(QuantizedX& xq, int64_t M, int64_t K) {
  xq.K = K;
  xq.blocks = K / kBlock;
  xq.q.resize(M * K);
  xq.dx.resize(M * xq.blocks);
  xq.sx.resize(M * xq.blocks);
  xq.qsum.resize(M * xq.blocks);
  xq.half_sum.resize(M * xq.blocks * 2);
}

// Rows [m0, m1) of x [M, K] into `out` (already sized): threads may fill disjoint rows.
template <typename T>
void quantize_rows(const T* x, int64_t m0, int64_t m1, QuantizedX& out) {
  const int64_t K = out.K, B = out.blocks;
  for (int64_t m = m0; m < m1; ++m) {
    for (int64_t b = 0; b < B; ++b) {
      alignas(32) float row[kBlock];
      to_float(x + m * K + b * kBlock, row, kBlock);
      int8_t* q = out.q.data() + m * K + b * kBlock;
      float amax = 0.f;
#if SURGE_TIER >= SURGE_TIER_AVX2
      const __m256 sign = _mm256_set1_ps(-0.f);
      __m256 v[4], mx = _mm256_setzero_ps();
      for (int i = 0; i < 4; ++i) {
        v[i] = _mm256_load_ps(row + 8 * i);
        mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[i]));
      }
      amax = hmax(mx);
      const float d = amax / 127.f;
      const __m256 inv = _mm256_set1_ps(d > 0.f ? 1.f / d : 0.f);
      __m256i r[4];  // rounded to nearest even (the default mode), like std::nearbyint
      for (int i = 0; i < 4; ++i) r[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
      // packs work per 128-bit lane: the permute puts the four 8-lane groups back in order.
      const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                          _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
#else
      for (int i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(row[i]));
      const float d = amax / 127.f;
      const float inv = d > 0.f ? 1.f / d : 0.f;
      for (int i = 0; i < kBlock; ++i) q[i] = static_cast<int8_t>(std::nearbyint(row[i] * inv));
#endif
      int32_t lo = 0, hi = 0;
      for (int i = 0; i < 16; ++i) {
        lo += q[i];
        hi += q[16 + i];
      }
      out.dx[m * B + b] = d;
      out.qsum[m * B + b] = lo + hi;
      out.sx[m * B + b] = d * static_cast<float>(lo + hi);
      out.half_sum[(m * B + b) * 2] = static_cast<int16_t>(lo);
      out.half_sum[(m * B + b) * 2 + 1] = static_cast<int16_t>(hi);
    }
  }
}

}  // namespace surge::gguf
