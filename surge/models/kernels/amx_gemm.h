// The packed W8A8 GEMM (w8a8_gemm.h) on AMX tiles, for CPUs with the matrix engine (Intel Xeon
// 4th generation and later: AMX-TILE and AMX-INT8).
//
// The packed weights are already AMX's right operand: a panel of 16 output channels is K/4
// rows of 64 bytes (16 channels x 4 consecutive k), and 16 of those rows are one B tile
// (64 k x 16 channels). The left operand is 16 activation rows x 64 bytes of the u8 rows
// (QuantRows, padded to a multiple of 16 rows), and TDPBUSD (u8 x s8 -> int32) adds a 16 x 16
// block of sums: the very sums the VNNI tiles make, exact integers, so the shared epilogue
// (zero point, scales, bias) gives the same bits whichever runs. A step's numbers do not
// depend on which engine ran its projections (batch invariance holds across the switch).
//
// Blocking: 2 row tiles x 2 panels in the four accumulator tiles (tmm0-3), A in tmm4-5, B in
// tmm6-7; a panel pair's weights (2 x K x 16 bytes: 18 KB at K = 576) stay in L1 while every
// row tile passes over them.
//
// The hardware path runs only where `hardware_ok()` found the instructions, the kernel's
// permission to use the tile state (Linux: arch_prctl ARCH_REQ_XCOMP_PERM) and a self-check
// equal to the VNNI tiles; `EmuTiles` runs the same kernel with the tile operations in plain
// C++, so the kernel's indexing is tested on CPUs without AMX (SURGE_AMX=emulate).
#pragma once
#include "amx_tiles.h"
#include "w8a8_gemm.h"

#ifdef SURGE_HAS_AMX_PATH
#include <atomic>
#include <random>
#endif

namespace surge::w8a8 {

// The engine the int8 GEMM takes from `amx_min_rows` rows on: 0 the VNNI tiles only, 1 AMX
// tiles, 2 AMX's kernel with emulated tiles (tests). Process-wide: set by set_amx.
enum AmxMode : int { kAmxOff = 0, kAmxHardware = 1, kAmxEmulated = 2 };

#ifdef SURGE_HAS_AMX_PATH
using surge::amx::EmuTiles;
using surge::amx::HwTiles;
inline std::atomic<int> g_amx_mode{kAmxOff};
inline std::atomic<int64_t> g_amx_min_rows{16};
inline std::atomic<int64_t> g_amx_calls{0};  // thread-calls of the AMX kernel, for tests and checks

constexpr int64_t kTileK = 64;  // bytes of k per tile row

// Accumulator tile C (rows m0.., block b) through memory into the shared epilogue.
template <class Tiles, int C, typename T, bool ADD>
inline void emit(const QuantRows& a, const Weights& w, int64_t m0, int64_t b, Out<T, ADD> out) {
  alignas(64) int32_t sums[16][16];
  Tiles::template store<C>(sums, 64);
  const Channels c(w, b);
  const int64_t rows = std::min<int64_t>(16, a.M - m0);
  for (int64_t r = 0; r < rows; ++r) epilogue(a, m0 + r, c, sums[r], out);
}

// Blocks [b0, b1) of the output channels for all rows of `a` (a.Kp a multiple of 64).
template <class Tiles, typename T, bool ADD>
void amx_gemm(const QuantRows& a, const Weights& w, int64_t b0, int64_t b1, Out<T, ADD> out) {
  const int64_t K4 = a.Kp / 4, steps = a.Kp / kTileK, lda = a.Kp;
  const uint8_t* A = a.q.data();
  g_amx_calls.fetch_add(1, std::memory_order_relaxed);
  Tiles::configure();
  for (int64_t b = b0; b < b1; b += 2) {
    const bool two = b + 1 < b1;
    const int8_t* B0 = w.packed + b * K4 * 64;
    const int8_t* B1 = B0 + K4 * 64;
    // The next panel pair's weights (2 x K x 16 bytes, from memory: a step's 30 layers of them
    // do not stay in cache), into L2 a share per row tile, so that its first tile loads do
    // not wait on memory.
    const char* next = reinterpret_cast<const char*>(B0 + 2 * K4 * 64);
    // Only over 8+ row tiles: with fewer, the fetch comes in bursts too large to hide (16 and
    // 64 rows ran 0.86-0.92x with it), and the hardware prefetcher keeps up.
    const int64_t next_lines =
        b + 2 < b1 && a.M >= 256 ? std::min<int64_t>(b1 - b - 2, 2) * K4 : 0;
    const int64_t row_tiles = (a.M + 31) / 32;
    const int64_t per_tile = (next_lines + row_tiles - 1) / row_tiles;
    int64_t fetched = 0;
    for (int64_t m0 = 0; m0 < a.M; m0 += 32) {
      for (int64_t i = 0; i < per_tile && fetched < next_lines; ++i, ++fetched)
        _mm_prefetch(next + fetched * 64, _MM_HINT_T1);
      const bool rows2 = m0 + 16 < a.M;  // the second row tile (rows past M are padding)
      Tiles::template zero<0>();
      Tiles::template zero<1>();
      Tiles::template zero<2>();
      Tiles::template zero<3>();
      for (int64_t s = 0; s < steps; ++s) {
        // B tile: 16 consecutive 64-byte rows of the panel (k = 64 s .. 64 s + 63).
        Tiles::template load<4>(A + m0 * lda + s * kTileK, lda);
        Tiles::template load<6>(B0 + s * 16 * 64, 64);
        Tiles::template dpbusd<0, 4, 6>();
        if (two) {
          Tiles::template load<7>(B1 + s * 16 * 64, 64);
          Tiles::template dpbusd<1, 4, 7>();
        }
        if (rows2) {
          Tiles::template load<5>(A + (m0 + 16) * lda + s * kTileK, lda);
          Tiles::template dpbusd<2, 5, 6>();
          if (two) Tiles::template dpbusd<3, 5, 7>();
        }
      }
      emit<Tiles, 0>(a, w, m0, b, out);
      if (two) emit<Tiles, 1>(a, w, m0, b + 1, out);
      if (rows2) {
        emit<Tiles, 2>(a, w, m0 + 16, b, out);
        if (two) emit<Tiles, 3>(a, w, m0 + 16, b + 1, out);
      }
    }
  }
  Tiles::release();
}

// Runs the AMX kernel on a small problem against the VNNI tiles, with SIGILL caught (a
// hypervisor may report AMX and still fault on it): true only when both give the same bits.
inline bool self_check() {
  const int64_t M = 40, N = 48, K = 128;
  std::mt19937 rng(7);
  std::vector<int8_t> packed(N * K);
  for (auto& v : packed) v = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
  std::vector<float> scale(N), bias(N);
  std::vector<int32_t> wsum(N, 0);
  for (int64_t n = 0; n < N; ++n) {
    scale[n] = 0.001f * static_cast<float>(1 + rng() % 100);
    bias[n] = 0.01f * static_cast<float>(rng() % 100);
    for (int64_t k = 0; k < K; ++k)  // packed [N/16, K/4, 16, 4]
      wsum[n] += packed[((n / 16) * (K / 4) + k / 4) * 64 + (n % 16) * 4 + k % 4];
  }
  const Weights w{packed.data(), scale.data(), wsum.data(), bias.data(), N, K};
  std::vector<float> x(M * K);
  for (auto& v : x) v = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) * 0.003f;
  QuantRows a;
  resize(a, M, K);
  quantize_rows_u8(x.data(), 0, M, K, a);
  std::vector<float> want(M * N), got(M * N, -1.f);
  gemm_blocks(a, w, 0, w.blocks(), Out<float, false>{want.data(), N});
  const bool ran = surge::amx::runs_without_sigill(
      [&] { amx_gemm<HwTiles>(a, w, 0, w.blocks(), Out<float, false>{got.data(), N}); });
  return ran && std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0;
}

// Whether the AMX tiles can run here: the CPU has them, Linux lets this process use the tile
// state, and the self-check passes. Worked out once.
inline bool hardware_ok() {
  static const bool ok = [] {
    return surge::amx::cpu_has(surge::amx::kAmxInt8) && surge::amx::tile_permission() &&
           self_check();
  }();
  return ok;
}

// Sets the process's int8 GEMM engine (AmxMode) and the fewest rows that take it; false (and
// unchanged) when the hardware mode is asked for where hardware_ok() is false.
inline bool set_amx(int64_t mode, int64_t min_rows) {
  TORCH_CHECK(mode >= kAmxOff && mode <= kAmxEmulated, "set_amx: mode 0, 1 or 2");
  TORCH_CHECK(min_rows >= 1, "set_amx: min_rows >= 1");
  if (mode == kAmxHardware && !hardware_ok()) return false;
  g_amx_min_rows = min_rows;
  g_amx_mode = static_cast<int>(mode);
  return true;
}

inline int64_t amx_calls() { return g_amx_calls.load(); }

// Blocks [b0, b1) of the output channels for all rows: on AMX tiles where set_amx chose them
// for this many rows (and K suits the tiles), else the VNNI tiles. Same bits either way.
template <typename T, bool ADD>
void gemm_range(const QuantRows& a, const Weights& w, int64_t b0, int64_t b1, Out<T, ADD> out) {
  const int mode = g_amx_mode.load(std::memory_order_relaxed);
  if (mode != kAmxOff && a.M >= g_amx_min_rows.load(std::memory_order_relaxed) &&
      a.Kp % kTileK == 0) {
    if (mode == kAmxHardware) amx_gemm<HwTiles>(a, w, b0, b1, out);
    else amx_gemm<EmuTiles>(a, w, b0, b1, out);
    return;
  }
  gemm_blocks(a, w, b0, b1, out);
}

#else  // no VNNI tier: no AMX path either
inline bool hardware_ok() { return false; }
inline bool set_amx(int64_t mode, int64_t) { return mode == kAmxOff; }
inline int64_t amx_calls() { return 0; }
template <typename T, bool ADD>
void gemm_range(const QuantRows& a, const Weights& w, int64_t b0, int64_t b1, Out<T, ADD> out) {
  gemm_blocks(a, w, b0, b1, out);
}
#endif

}  // namespace surge::w8a8
