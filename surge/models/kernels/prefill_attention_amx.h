// The prefill attention's tiles (prefill_attention.h) with their two products on the AMX matrix
// engine (TDPBF16PS), for CPUs with AMX-BF16 (Intel Xeon 4th generation and later).
//
// The packed layouts are already AMX's right operands:
//   - scores = Q . K^T: a packed key group is [HD/2][16] pairs of dimensions, a key per column,
//     so its 16 rows of pairs 16 i .. 16 i + 15 are one B tile (32 dimensions x 16 keys); the
//     A tile is 16 query vectors x 32 dimensions of the bf16 queries, and TDPBF16PS adds a
//     16 x 16 block of float32 scores;
//   - out = P . V: packed values are [key pair][HD] pairs of keys, a dimension per column, so
//     16 key pairs x 16 dimensions (rows HD words apart) are one B tile; the A tile is 16
//     vectors x 32 keys of the bf16 softmax weights.
// The softmax between them is prefill_attention.h's (float32, weights rounded to bf16).
//
// Numerics: the same bf16 inputs and float32 sums as the AVX-512 BF16 tiles, but TDPBF16PS
// rounds its sum of 32 products its own way (not vdpbf16ps's pair after pair), so a score can
// differ in its last bits. A row's result still depends only on
// its own query, its length and the keys (a vector's scores and weights are its own row of
// the tiles; the padding vectors and keys give zero products), so chunking and batching leave
// it unchanged; the engine is chosen once per process (surge/models/amx.py), never per step.
//
// Blocking, per 16 query vectors: scores four key groups a pass (accumulators tmm0-3, the
// queries' A tiles resident in tmm4-5, the keys' B tiles through tmm6-7); values four 16-wide
// column blocks of the output at once (tmm0-3), the weights' A tile in tmm4, the values' B
// tiles through tmm5-7. Head sizes in steps of 64: larger heads take their dimensions 64 at a
// time (the scores' partial sums reloaded into the accumulators between halves).
#pragma once
#include "amx_tiles.h"
#include "prefill_attention.h"

namespace surge::prefill {
// Packed groups a run needs on AMX: a whole number of key pairs' B tiles (two groups).
inline int64_t amx_groups(int64_t groups) { return (groups + 1) & ~int64_t(1); }

// Rows per tile on AMX: about 48 query vectors (three A tiles), a whole number of them.
inline int64_t amx_rows_per_tile(int64_t group) { return std::max<int64_t>(1, 48 / group); }
}  // namespace surge::prefill

#if defined(SURGE_HAS_AMX_PATH) && defined(SURGE_HAS_AVX512_BF16) && defined(SURGE_HAS_TILED_PREFILL)
#define SURGE_HAS_AMX_ATTENTION 1
#include <atomic>
#include <random>

namespace surge::prefill {

// The engine the tiles' products take: 0 AVX-512 BF16, 1 AMX tiles, 2 AMX's kernel with
// emulated tiles (tests). Process-wide: set by set_amx_attention.
inline std::atomic<int> g_amx_attention{0};
inline std::atomic<int64_t> g_amx_attention_calls{0};  // tiles attended on AMX, for tests

constexpr int64_t kAmxVectors = 16;  // query vectors per A tile
constexpr int64_t kAmxKeys = 32;     // keys per A tile of weights (a row's weights padded to it)

// Scores of 16 query vectors (their dimensions [d0, d0 + 64) in tmm4-5) against key groups
// [g, g + NG) (NG <= 4): into sc (float32 rows `padded` apart), added to what sc holds where
// d0 > 0.
template <class Tiles, int HD, int NG>
inline void score_groups(const uint32_t* kp, int64_t g, int64_t d0, float* sc, int64_t padded) {
  const int64_t ld = padded * sizeof(float);
  const uint32_t* kg = kp + g * kGroupWords<HD> + (d0 / 2) * kKeys;  // pair d0/2 of group g
  auto one = [&](auto c) {
    constexpr int C = decltype(c)::value;
    float* dst = sc + (g + C) * kKeys;
    if (d0 == 0) Tiles::template zero<C>();
    else Tiles::template load<C>(dst, ld);
    const uint32_t* b = kg + C * kGroupWords<HD>;
    Tiles::template load<6>(b, kKeys * 4);  // pairs d0/2 .. +15: 32 dimensions x 16 keys
    Tiles::template dpbf16ps<C, 4, 6>();
    Tiles::template load<7>(b + 16 * kKeys, kKeys * 4);  // the next 32 dimensions
    Tiles::template dpbf16ps<C, 5, 7>();
  };
  one(std::integral_constant<int, 0>{});
  if constexpr (NG > 1) one(std::integral_constant<int, 1>{});
  if constexpr (NG > 2) one(std::integral_constant<int, 2>{});
  if constexpr (NG > 3) one(std::integral_constant<int, 3>{});
  Tiles::template store<0>(sc + g * kKeys, ld);
  if constexpr (NG > 1) Tiles::template store<1>(sc + (g + 1) * kKeys, ld);
  if constexpr (NG > 2) Tiles::template store<2>(sc + (g + 2) * kKeys, ld);
  if constexpr (NG > 3) Tiles::template store<3>(sc + (g + 3) * kKeys, ld);
}

// 16 vectors' weights (bf16 rows `padded` apart, zero past each row's keys) against the
// values of the first `keys` keys (a multiple of 32), output dimensions [d0, d0 + 64): into o
// (float32 rows HD apart).
template <class Tiles, int HD>
inline void value_block(const uint16_t* p, int64_t padded, int64_t keys, const uint32_t* vp,
                        int64_t d0, float* o) {
  Tiles::template zero<0>();
  Tiles::template zero<1>();
  Tiles::template zero<2>();
  Tiles::template zero<3>();
  const int64_t ldv = HD * 4;  // a key pair's row of the packed values, in bytes
  for (int64_t k0 = 0; k0 < keys; k0 += kAmxKeys) {
    const uint32_t* b = vp + (k0 / 2) * HD + d0;  // key pairs k0/2 .. +15, 16 dimensions each
    Tiles::template load<4>(p + k0, padded * 2);
    Tiles::template load<5>(b, ldv);
    Tiles::template dpbf16ps<0, 4, 5>();
    Tiles::template load<6>(b + 16, ldv);
    Tiles::template dpbf16ps<1, 4, 6>();
    Tiles::template load<7>(b + 32, ldv);
    Tiles::template dpbf16ps<2, 4, 7>();
    Tiles::template load<5>(b + 48, ldv);
    Tiles::template dpbf16ps<3, 4, 5>();
  }
  Tiles::template store<0>(o + d0, HD * 4);
  Tiles::template store<1>(o + d0 + 16, HD * 4);
  Tiles::template store<2>(o + d0 + 32, HD * 4);
  Tiles::template store<3>(o + d0 + 48, HD * 4);
}

// As attend_tile (prefill_attention.h), with the products on AMX tiles. kp / vp: the run's
// packed groups, amx_groups() of them (zero past its keys).
template <class Tiles, int HD>
void attend_tile_amx(const float* q, int64_t q_stride, const int64_t* lens, int64_t R, int64_t G,
                     const uint32_t* kp, const uint32_t* vp, float scale, TileScratch& s,
                     float* out, int64_t out_stride) {
  static_assert(HD % 64 == 0, "AMX tiles take head sizes in steps of 64");
  const int64_t nv = R * G, nv_pad = (nv + kAmxVectors - 1) / kAmxVectors * kAmxVectors;
  int64_t max_len = 0;
  for (int64_t r = 0; r < R; ++r) max_len = std::max(max_len, lens[r]);
  const int64_t padded = (max_len + kAmxKeys - 1) / kAmxKeys * kAmxKeys;
  s.q.resize(nv_pad * HD);
  s.scores.resize(nv_pad * padded);
  s.p.resize(nv_pad * padded);
  s.inv.resize(nv_pad);
  scale_queries(q, q_stride, G, TileSize{nv, nv_pad, padded}, HD, scale, s.q.data());
  g_amx_attention_calls.fetch_add(1, std::memory_order_relaxed);
  Tiles::configure();
  // Scores: each block of 16 vectors against its longest row's key groups, four at a time.
  for (int64_t v0 = 0; v0 < nv_pad; v0 += kAmxVectors) {
    const int64_t groups = (longest(lens, G, nv, v0, kAmxVectors) + kKeys - 1) / kKeys;
    float* sc = s.scores.data() + v0 * padded;
    for (int64_t d0 = 0; d0 < HD; d0 += 64) {
      Tiles::template load<4>(s.q.data() + v0 * HD + d0, HD * 2);
      Tiles::template load<5>(s.q.data() + v0 * HD + d0 + 32, HD * 2);
      int64_t g = 0;
      for (; g + 4 <= groups; g += 4) score_groups<Tiles, HD, 4>(kp, g, d0, sc, padded);
      switch (groups - g) {
        case 1: score_groups<Tiles, HD, 1>(kp, g, d0, sc, padded); break;
        case 2: score_groups<Tiles, HD, 2>(kp, g, d0, sc, padded); break;
        case 3: score_groups<Tiles, HD, 3>(kp, g, d0, sc, padded); break;
        default: break;
      }
    }
  }
  softmax_rows(lens, nv, G, padded, s);
  std::memset(s.p.data() + nv * padded, 0, (nv_pad - nv) * padded * sizeof(uint16_t));
  // Values, 16 vectors at a time up to their longest row's keys (whole A tiles of 32 keys:
  // the weights are zero past each row's keys, the packed values zero past the run's).
  alignas(64) float o[kAmxVectors * HD];
  for (int64_t v0 = 0; v0 < nv_pad; v0 += kAmxVectors) {
    const int64_t len = longest(lens, G, nv, v0, kAmxVectors);
    const int64_t keys = (len + kAmxKeys - 1) / kAmxKeys * kAmxKeys;
    for (int64_t d0 = 0; d0 < HD; d0 += 64)
      value_block<Tiles, HD>(s.p.data() + v0 * padded, padded, keys, vp, d0, o);
    for (int64_t v = v0; v < std::min(nv, v0 + kAmxVectors); ++v) {
      const __m512 w = _mm512_set1_ps(s.inv[v]);
      float* dst = out + (v / G) * out_stride + (v % G) * HD;
      for (int64_t i = 0; i < HD; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_mul_ps(_mm512_load_ps(o + (v - v0) * HD + i), w));
    }
  }
  Tiles::release();
}

// The kernel on hardware against the same kernel with emulated tiles, on a tile of random
// rows (a cached prefix, rows of different lengths, a run of an odd number of groups), with
// SIGILL caught: true only where they agree to float32 rounding. Not bit for bit: the
// hardware rounds a TDPBF16PS's sums its own way (not the reference's pair after pair, nor any
// simple order tried; measured up to 2 ulp on a score), where a wrong index or a fault would
// be off by the outputs' own size.
inline bool amx_attention_self_check() {
  constexpr int HD = 64;
  const int64_t R = 7, G = 3, groups = amx_groups(5);  // up to 70 keys
  const int64_t lens[R] = {64, 65, 66, 67, 68, 69, 70};
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<uint32_t> packed(2 * groups * kGroupWords<HD>, 0);
  for (int64_t i = 0; i < 2 * 5 * kGroupWords<HD>; ++i) {  // keys, then values, of 5 groups
    const int64_t at = i < 5 * kGroupWords<HD> ? i : i + (groups - 5) * kGroupWords<HD>;
    const float a = u(rng), b = u(rng);
    uint32_t ua, ub;
    std::memcpy(&ua, &a, 4);
    std::memcpy(&ub, &b, 4);
    packed[at] = (ua >> 16) | (ub & 0xFFFF0000u);
  }
  std::vector<float> q(R * G * HD);
  for (auto& x : q) x = u(rng);
  const uint32_t* kp = packed.data();
  const uint32_t* vp = kp + groups * kGroupWords<HD>;
  std::vector<float> want(R * G * HD), got(R * G * HD, -1.f);
  TileScratch s;
  attend_tile_amx<surge::amx::EmuTiles, HD>(q.data(), G * HD, lens, R, G, kp, vp, 0.125f, s,
                                             want.data(), G * HD);
  const bool ran = surge::amx::runs_without_sigill([&] {
    attend_tile_amx<surge::amx::HwTiles, HD>(q.data(), G * HD, lens, R, G, kp, vp, 0.125f, s,
                                              got.data(), G * HD);
  });
  if (!ran) return false;
  float err = 0.f, size = 0.f;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::abs(want[i] - got[i]));
    size = std::max(size, std::abs(want[i]));
  }
  return size > 0.f && err <= 1e-5f * size;
}

// Whether the attention's AMX tiles can run here: the CPU has AMX-BF16, Linux lets this
// process use the tile state, and the self-check passes. Worked out once.
inline bool amx_attention_ok() {
  static const bool ok = surge::amx::cpu_has(surge::amx::kAmxBf16) &&
                         surge::amx::tile_permission() && amx_attention_self_check();
  return ok;
}

// Sets the process's engine for the tiles' products (0, 1 or 2, as g_amx_attention); false
// (and unchanged) when the hardware is asked for where amx_attention_ok() is false.
inline bool set_amx_attention(int64_t mode) {
  TORCH_CHECK(mode >= 0 && mode <= 2, "set_amx_attention: mode 0, 1 or 2");
  if (mode == 1 && !amx_attention_ok()) return false;
  g_amx_attention = static_cast<int>(mode);
  return true;
}

}  // namespace surge::prefill
#else
namespace surge::prefill {
inline bool amx_attention_ok() { return false; }
inline bool set_amx_attention(int64_t mode) { return mode == 0; }
}  // namespace surge::prefill
#endif
