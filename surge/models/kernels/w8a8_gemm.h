// W8A8 GEMM on AVX-512 VNNI with weights packed once at load: y = x W^T for int8 weights with
// one scale per output channel and activations quantized per row on the fly (asymmetric, u8).
// Shared by the w8a8_linear op (w8a8_linear.cpp) and the fused decode stack (q4_decode.cpp).
//
// Packed weights [Np/16, Kp/4, 16, 4] int8 (Np, Kp: N and K rounded up to 16 and 4, zero-padded):
// one 64-byte load is 16 output channels x 4 consecutive k, the right operand of vpdpbusd as it
// is; the left operand is 4 bytes of one activation row broadcast to all lanes. So each
// instruction adds 4 products into 16 output channels of one row, and no sum is reduced across
// lanes. A tile is MR (<= 8) rows x NV (<= 3) blocks of 16 channels in 24 accumulators (fewer
// rows, more blocks: panel_blocks); the weights of a panel (48 channels x K) stay in L1/L2 while every row tile of the batch passes
// over them, so each weight is read from memory once per call.
//
// Activations: per row, x ~= s * (q - z) with q in 0..255 and the range [min(x, 0), max(x, 0)]
// mapped onto it (z = round(-lo / s)): the unsigned left operand VNNI takes, with a zero point.
//   y[m, n] = s[m] * sw[n] * (sum_k q[m, k] w[n, k] - z[m] * wsum[n])  (+ bias[n])
// which is quantize_rows + torch._int_mm + dequantize_int32 (int8_linear.cpp) with the zero
// point shifted by 128 (one quantizer for both: row_quant.h). Sums stay int32: |q w| <= 255 * 127, so K up to 66,000.
#pragma once
#include <torch/extension.h>
#include "avx512_common.h"
#include "cpu_common.h"
#include "cpu_features.h"
#include "row_quant.h"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

namespace surge::w8a8 {

constexpr int64_t kCols = 16;  // output channels per packed block
constexpr int64_t kRows = 8;   // activation rows per tile

inline int64_t padded_k(int64_t K) { return (K + 3) / 4 * 4; }

// Activation rows quantized to u8, each zero-padded to Kp.
struct QuantRows {
  int64_t M = 0, K = 0, Kp = 0;
  std::vector<uint8_t> q;  // [M, Kp]
  std::vector<float> s;    // [M]
  std::vector<int32_t> z;  // [M]
};

// x [M, K] -> `out`, already sized (resize; its vectors keep their capacity, so a reused buffer
// is not reallocated). Rows [m0, m1) only, so threads can split the rows of one call.
template <typename T>
void quantize_rows_u8(const T* x, int64_t m0, int64_t m1, int64_t K, QuantRows& out) {
  for (int64_t m = m0; m < m1; ++m)
    surge::quantize_row_asym(x + m * K, K, out.Kp, out.q.data() + m * out.Kp, &out.s[m], &out.z[m]);
}

inline void resize(QuantRows& out, int64_t M, int64_t K) {
  out.M = M;
  out.K = K;
  out.Kp = padded_k(K);
  // Rows padded to a multiple of 16: an AMX tile (amx_gemm.h) loads 16 rows at a time.
  out.q.resize((M + 15) / 16 * 16 * out.Kp);
  out.s.resize(M);
  out.z.resize(M);
}

// The weights and their per-channel terms, as the kernel reads them.
struct Weights {
  const int8_t* packed;  // [Np/16, Kp/4, 16, 4]
  const float* scale;    // [N]
  const int32_t* wsum;   // [N]: sum over k of each channel's int8 weights
  const float* bias;     // [N] or nullptr
  int64_t N, K;
  int64_t blocks() const { return (N + kCols - 1) / kCols; }
};

// Where the tile's results go: T rows of ld (ADD: added into float rows, a residual).
template <typename T, bool ADD>
struct Out {
  T* p;
  int64_t ld;
};

#if SURGE_TIER >= SURGE_TIER_AVX512_VNNI
// acc += 4 products of u8 x and s8 w per lane, in place. In asm: with the intrinsic GCC copies
// every accumulator to another register and back each iteration (twice the instructions).
// A macro, not a function: a reference to the accumulator would keep it in memory.
#define SURGE_DPBUSD(acc, x, w) asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(x), "v"(w))

template <typename T>
inline void store_masked(T* p, __m512 v, int64_t n) {
  if (n >= kCols) {
    surge::store16(p, v);
    return;
  }
  alignas(64) T t[kCols];
  surge::store16(t, v);
  std::memcpy(p, t, n * sizeof(T));
}

// One block's per-channel terms, loaded once for the rows that follow.
struct Channels {
  int64_t n, left;
  __mmask16 mask;
  __m512i ws;
  __m512 sw, bias;
  const float* has_bias;
  __attribute__((always_inline)) Channels(const Weights& w, int64_t block)
      : n(block * kCols), left(std::min(kCols, w.N - block * kCols)),
        mask(left >= kCols ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1)),
        ws(_mm512_maskz_loadu_epi32(mask, w.wsum + n)), sw(_mm512_maskz_loadu_ps(mask, w.scale + n)),
        bias(w.bias ? _mm512_maskz_loadu_ps(mask, w.bias + n) : _mm512_setzero_ps()),
        has_bias(w.bias) {}
};

// Pins a value: -ffast-math may otherwise reassociate or fuse (FMA) the epilogue's float ops
// differently in each place it is inlined, and the VNNI and AMX paths must round alike.
#define SURGE_PIN(v) asm("" : "+v"(v))

// Row r's 16 int32 sums of block c into the output: the zero point, both scales, the bias.
// Shared by the VNNI tiles and the AMX ones (amx_gemm.h): each float op pinned in order, so
// both give the same bits wherever the compiler inlines it.
// Always inlined: called once per row and block from unrolled loops, GCC otherwise keeps one
// out-of-line copy, and the call with its arguments through memory cost a quarter of a
// 64-row decode step.
template <typename T, bool ADD>
__attribute__((always_inline)) inline void epilogue(const QuantRows& a, int64_t r,
                                                    const Channels& c, const int32_t* sums,
                                                    Out<T, ADD> out) {
  const __m512i zw = _mm512_mullo_epi32(_mm512_set1_epi32(a.z[r]), c.ws);
  // y = v * (s * sw): the association dequantize_int32 (int8_linear.cpp) compiles to, so the
  // packed GEMM and quantize_rows + _int_mm + dequantize_int32 agree bit for bit too.
  __m512 rs = _mm512_mul_ps(_mm512_set1_ps(a.s[r]), c.sw);
  SURGE_PIN(rs);
  __m512 y = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_load_si512(sums), zw));
  SURGE_PIN(y);
  y = _mm512_mul_ps(y, rs);
  SURGE_PIN(y);
  if (c.has_bias) {
    y = _mm512_add_ps(y, c.bias);
    SURGE_PIN(y);
  }
  T* o = out.p + r * out.ld + c.n;
  if constexpr (ADD) {
    y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(c.mask, o));
    _mm512_mask_storeu_ps(o, c.mask, y);
  } else {
    store_masked(o, y, c.left);
  }
}

// Rows m0 .. m0 + MR - 1 against blocks b0 .. b0 + NV - 1. Never inlined: inlined into
// gemm_panels, GCC kept some instances' accumulators on the stack (a load and a store around
// every vpdpbusd: 3 rows x 4 blocks took 1.5x the time of 4 x 4).
template <int MR, int NV, typename T, bool ADD>
__attribute__((noinline)) void tile(const QuantRows& a, int64_t m0, const Weights& w, int64_t b0,
                                    Out<T, ADD> out) {
  const int64_t K4 = a.Kp / 4;
  const int8_t* wb = w.packed + b0 * K4 * 64;
  const uint8_t* am = a.q.data() + m0 * a.Kp;
  // Every loop over m and j unrolled: with constant indices the accumulators stay in registers
  // (GCC otherwise keeps them on the stack).
  __m512i acc[MR][NV];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) acc[m][j] = _mm512_setzero_si512();
  const int64_t lda = a.Kp;
  for (int64_t k4 = 0; k4 < K4; ++k4) {
    __m512i wv[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) wv[j] = _mm512_loadu_si512(wb + (j * K4 + k4) * 64);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      int32_t four;
      std::memcpy(&four, am + m * lda + k4 * 4, 4);
      const __m512i x = _mm512_set1_epi32(four);
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) SURGE_DPBUSD(acc[m][j], x, wv[j]);
    }
  }
  // Through memory into the epilogue: with its registers live beside the accumulators GCC
  // would keep them all on the stack in the loop above.
  alignas(64) int32_t sums[MR][NV][kCols];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) _mm512_store_si512(sums[m][j], acc[m][j]);
  for (int j = 0; j < NV; ++j) {
    const Channels c(w, b0 + j);
    for (int m = 0; m < MR; ++m) epilogue(a, m0 + m, c, sums[m][j], out);
  }
}
#else
// Portable path: the same sums, one product at a time.
template <int MR, int NV, typename T, bool ADD>
inline void tile(const QuantRows& a, int64_t m0, const Weights& w, int64_t b0, Out<T, ADD> out) {
  const int64_t K4 = a.Kp / 4;
  for (int j = 0; j < NV; ++j) {
    const int8_t* wb = w.packed + (b0 + j) * K4 * 64;
    for (int64_t c = 0; c < kCols; ++c) {
      const int64_t n = (b0 + j) * kCols + c;
      if (n >= w.N) break;
      for (int m = 0; m < MR; ++m) {
        const int64_t r = m0 + m;
        const uint8_t* am = a.q.data() + r * a.Kp;
        int32_t dot = 0;
        for (int64_t k = 0; k < a.Kp; ++k)
          dot += static_cast<int32_t>(am[k]) * wb[(k / 4 * kCols + c) * 4 + k % 4];
        float y = static_cast<float>(dot - a.z[r] * w.wsum[n]) * a.s[r] * w.scale[n];
        if (w.bias) y += w.bias[n];
        T& o = out.p[r * out.ld + n];
        if constexpr (ADD) o += y;
        else o = static_cast<T>(y);
      }
    }
  }
}
#endif

template <int NV, typename T, bool ADD>
inline void tile_rows(const QuantRows& a, int64_t m0, int64_t rows, const Weights& w, int64_t b0,
                      Out<T, ADD> out) {
  surge::with_rows(rows, [&](auto r) { tile<decltype(r)::value, NV, T, ADD>(a, m0, w, b0, out); });
}

// Blocks [b0, b1) of the output channels for all rows of `a`: panels of NV blocks, each passed
// over by every row tile while its weights are in cache.
template <int NV, typename T, bool ADD>
void gemm_panels(const QuantRows& a, const Weights& w, int64_t b0, int64_t b1, Out<T, ADD> out) {
  const int64_t tiles = (a.M + kRows - 1) / kRows;
  for (int64_t b = b0; b < b1; b += NV) {
    const int64_t nv = std::min<int64_t>(NV, b1 - b);
    // The next panel's weights come from memory: each row tile asks for its share of them
    // into L2 while it computes, so the next panel's first tile does not wait on DRAM.
    const int64_t next = tiles > 1 ? std::min<int64_t>(NV, b1 - b - nv) * (a.Kp / 4) * 64 : 0;
    const char* ahead = reinterpret_cast<const char*>(w.packed + (b + nv) * (a.Kp / 4) * 64);
    const int64_t share = (next / tiles + 63) & ~int64_t(63);
    // Rows in `tiles` near-equal tiles (9 rows: 5 + 4, not 8 + 1): a tile of a row or two has
    // too few accumulator chains to hide the dot product's latency, and cost more than half
    // a full tile (one 3072 x 576 layer, in L2: 46 us at 8 rows, 72 at 9 as 8 + 1).
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t m0 = a.M * t / tiles, rows = a.M * (t + 1) / tiles - m0;
      for (int64_t off = t * share; off < std::min(next, (t + 1) * share); off += 64)
        __builtin_prefetch(ahead + off, 0, 2);  // read, into L2
      if (nv == NV) {
        tile_rows<NV>(a, m0, rows, w, b, out);
        continue;
      }
      for (int64_t j = 0; j < nv; ++j) tile_rows<1>(a, m0, rows, w, b + j, out);
    }
  }
}

// Blocks per panel for M rows: 1 row 1 (one weight stream per thread, read in order, as the
// GEMV does: measured faster at one row than 6), 2 rows 6 (6 independent accumulator chains per
// row, where 3 leave a row waiting on the instruction's latency), up to 4 rows 4, else 3 (24
// accumulators for 8 rows). Split work between threads in whole panels.
inline int64_t panel_blocks(int64_t M) { return M <= 1 ? 1 : M <= 2 ? 6 : M <= 4 ? 4 : 3; }

template <typename T, bool ADD>
void gemm_blocks(const QuantRows& a, const Weights& w, int64_t b0, int64_t b1, Out<T, ADD> out) {
  static_assert(!ADD || std::is_same_v<T, float>, "w8a8: ADD needs float32 output");
  switch (panel_blocks(a.M)) {
    case 1: gemm_panels<1>(a, w, b0, b1, out); break;
    case 6: gemm_panels<6>(a, w, b0, b1, out); break;
    case 4: gemm_panels<4>(a, w, b0, b1, out); break;
    default: gemm_panels<3>(a, w, b0, b1, out); break;
  }
}

}  // namespace surge::w8a8
