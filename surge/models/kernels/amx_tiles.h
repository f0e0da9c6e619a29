// The AMX matrix engine's tile operations (Intel Xeon 4th generation and later), for the kernels
// that run on it: the int8 GEMM (amx_gemm.h, TDPBUSD) and the prefill attention's products
// (prefill_attention.h, TDPBF16PS).
//
// Every kernel here uses one tile configuration: the eight tiles of 16 rows x 64 bytes (an
// int32/float32 accumulator of 16 x 16, or an operand of 16 rows of 64 int8 or 32 bf16).
// `HwTiles` issues the instructions; `EmuTiles` runs the same operations in plain C++ on a
// thread's array of tiles, as the instruction set reference defines them, so a kernel's
// indexing is tested on CPUs without AMX (SURGE_AMX=emulate).
//
// Hardware use needs the CPU's CPUID bits, Linux's permission for this process to use the tile
// state (arch_prctl ARCH_REQ_XCOMP_PERM) and, per kernel, a self-check under a SIGILL guard (a
// hypervisor may report AMX and still fault on it).
#pragma once
#include "cpu_features.h"

#if SURGE_TIER >= SURGE_TIER_AVX512_VNNI && defined(__x86_64__)
#define SURGE_HAS_AMX_PATH 1
#include <cpuid.h>
#include <csetjmp>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <sys/syscall.h>
#include <unistd.h>

namespace surge::amx {

// The 64-byte tile configuration LDTILECFG reads (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// The instructions, in inline asm with the tile numbers as constants ("i"), so a kernel names
// its tiles as template parameters. Loads and stores clobber memory: the compiler must not
// move the plain stores that fill an operand past the load that reads it, nor the plain loads
// of a result before the store that writes it.
struct HwTiles {
  static void configure() {
    TileConfig cfg;
    for (int i = 0; i < 8; ++i) {
      cfg.colsb[i] = 64;
      cfg.rows[i] = 16;
    }
    asm volatile("ldtilecfg %0" ::"m"(cfg));
  }
  static void release() { asm volatile("tilerelease" ::: "memory"); }
  template <int T>
  static void zero() {
    asm volatile("tilezero %%tmm%c0" ::"i"(T));
  }
  template <int T>
  static void load(const void* p, int64_t stride) {
    asm volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(p), "r"(stride), "i"(T) : "memory");
  }
  template <int T>
  static void store(void* p, int64_t stride) {
    asm volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(p), "r"(stride), "i"(T) : "memory");
  }
  // C += A (u8, 16 x 64) . B (s8, 16 rows of 16 channels x 4): int32 sums.
  template <int C, int A, int B>
  static void dpbusd() {
    asm volatile("tdpbusd %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"i"(C), "i"(A), "i"(B));
  }
  // C += A (bf16, 16 x 32) . B (bf16, 16 rows of 16 columns x 2): float32 sums.
  template <int C, int A, int B>
  static void dpbf16ps() {
    asm volatile("tdpbf16ps %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"i"(C), "i"(A), "i"(B));
  }
};

// The same operations on a thread's eight 16 x 64-byte tiles.
struct EmuTiles {
  static inline thread_local uint8_t t[8][16][64];
  static void configure() {}
  static void release() {}
  template <int T>
  static void zero() { std::memset(t[T], 0, sizeof(t[T])); }
  template <int T>
  static void load(const void* p, int64_t stride) {
    for (int r = 0; r < 16; ++r)
      std::memcpy(t[T][r], static_cast<const uint8_t*>(p) + r * stride, 64);
  }
  template <int T>
  static void store(void* p, int64_t stride) {
    for (int r = 0; r < 16; ++r) std::memcpy(static_cast<uint8_t*>(p) + r * stride, t[T][r], 64);
  }
  // TDPBUSD: C[m][n] += sum over i < 64 of u8 A[m][i] * s8 B[i/4][4n + i%4].
  template <int C, int A, int B>
  static void dpbusd() {
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 16; ++n) {
        int32_t acc;
        std::memcpy(&acc, t[C][m] + 4 * n, 4);
        for (int i = 0; i < 64; ++i)
          acc += static_cast<int32_t>(t[A][m][i]) *
                 static_cast<int32_t>(static_cast<int8_t>(t[B][i / 4][4 * n + i % 4]));
        std::memcpy(t[C][m] + 4 * n, &acc, 4);
      }
  }
  // TDPBF16PS as the reference's pseudocode: for each pair k < 16, C[m][n] += A[m][2k] B[k][2n],
  // then += A[m][2k+1] B[k][2n+1], each add rounded to float32 (to nearest even), denormal
  // inputs and results flushed to zero. The hardware rounds the sum its own way (a score off
  // by up to 2 ulp), so emulated tiles test a kernel's indexing, not its last bits.
  template <int C, int A, int B>
  static void dpbf16ps() {
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 16; ++n) {
        float acc;
        std::memcpy(&acc, t[C][m] + 4 * n, 4);
        for (int k = 0; k < 16; ++k)
          for (int e = 0; e < 2; ++e) {
            uint16_t a, b;
            std::memcpy(&a, t[A][m] + 4 * k + 2 * e, 2);
            std::memcpy(&b, t[B][k] + 4 * n + 2 * e, 2);
            float prod = bf16(a) * bf16(b);  // exact: 8-bit significands
            asm("" : "+x"(prod));  // no fused multiply-add with the sum (-ffast-math)
            acc = flush(acc + prod);
            asm("" : "+x"(acc));
          }
        std::memcpy(t[C][m] + 4 * n, &acc, 4);
      }
  }

 private:
  static float flush(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    if ((u & 0x7F800000u) == 0) u &= 0x80000000u;  // denormal -> signed zero
    std::memcpy(&x, &u, 4);
    return x;
  }
  static float bf16(uint16_t h) {
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    float x;
    std::memcpy(&x, &u, 4);
    return flush(x);
  }
};

// CPUID leaf 7, EDX: AMX-BF16 bit 22, AMX-TILE bit 24, AMX-INT8 bit 25.
enum CpuBit : unsigned { kAmxBf16 = 22, kAmxTile = 24, kAmxInt8 = 25 };
inline bool cpu_has(unsigned bit) {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  return ((edx >> kAmxTile) & 1) && ((edx >> bit) & 1);
}

// Linux's permission for this process to use the tile data state; asked once.
inline bool tile_permission() {
  static const bool ok = [] {
    constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;  // asm/prctl.h, XFEATURE_XTILEDATA
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
  }();
  return ok;
}

inline sigjmp_buf& probe_jump() {
  static sigjmp_buf jump;
  return jump;
}

// Runs f() with SIGILL caught: false where the CPU faulted on an instruction in it.
template <class F>
bool runs_without_sigill(F&& f) {
  struct sigaction on_ill {}, before {};
  on_ill.sa_handler = [](int) { siglongjmp(probe_jump(), 1); };
  sigemptyset(&on_ill.sa_mask);
  sigaction(SIGILL, &on_ill, &before);
  bool ran = false;
  if (sigsetjmp(probe_jump(), 1) == 0) {
    f();
    ran = true;
  }
  sigaction(SIGILL, &before, nullptr);
  return ran;
}

}  // namespace surge::amx
#endif
