"""What the AMX int8 tiles can do on this CPU, against what the GEMM gets: the bare TDPBUSD
rate (four accumulators, operands held in tiles), then the packed GEMM's inner loop
(amx_gemm.h's 2 x 2 tiles: two A and two B tile loads for four products, K = 576) with A
from L2 (512 rows), from L1 (the same 32 rows again), or from L2 with its lines prefetched
into L1 one or two steps ahead; no epilogue. Built on the fly from
kernels/amx_tiles.h; needs a CPU with AMX-INT8 and Linux's permission for the tile state.

    python benchmarks/amx_peak.py [--threads 1,2]

Prints TOP/s (int8 multiply-adds count 2).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from torch.utils.cpp_extension import load_inline

KERNELS = Path(__file__).resolve().parent.parent / "surge" / "models" / "kernels"

SOURCE = r"""
#include <torch/extension.h>
#include <omp.h>
#include <vector>
#include "amx_tiles.h"
using surge::amx::HwTiles;

// Seconds for `iters` x 4 TDPBUSD on each of `threads` threads, operands loaded once.
double bare(int64_t iters, int64_t threads) {
  double t0 = omp_get_wtime();
#pragma omp parallel num_threads(threads)
  {
    alignas(64) uint8_t a[16 * 64] = {};
    alignas(64) int8_t b[16 * 64] = {};
    alignas(64) int32_t c[16][16];
    HwTiles::configure();
    HwTiles::zero<0>(); HwTiles::zero<1>(); HwTiles::zero<2>(); HwTiles::zero<3>();
    HwTiles::load<4>(a, 64); HwTiles::load<5>(a, 64);
    HwTiles::load<6>(b, 64); HwTiles::load<7>(b, 64);
    for (int64_t i = 0; i < iters; ++i) {
      HwTiles::dpbusd<0, 4, 6>(); HwTiles::dpbusd<1, 4, 7>();
      HwTiles::dpbusd<2, 5, 6>(); HwTiles::dpbusd<3, 5, 7>();
    }
    HwTiles::store<0>(c, 64);
    HwTiles::release();
  }
  return omp_get_wtime() - t0;
}

// Seconds for `reps` passes of the GEMM's inner loop over `rows` rows and one panel pair
// (K = 576) on each of `threads` threads; same_rows: every row tile reads rows 0..31 (L1).
double loop(int64_t rows, int64_t reps, bool same_rows, int64_t threads, int64_t ahead) {
  const int64_t K = 576, steps = K / 64, lda = K;
  double t0 = omp_get_wtime();
#pragma omp parallel num_threads(threads)
  {
    std::vector<uint8_t> A(rows * K, 1);
    std::vector<int8_t> B(2 * K * 16, 1);
    alignas(64) int32_t c[16][16];
    HwTiles::configure();
    for (int64_t rep = 0; rep < reps; ++rep)
      for (int64_t m0 = 0; m0 < rows; m0 += 32) {
        HwTiles::zero<0>(); HwTiles::zero<1>(); HwTiles::zero<2>(); HwTiles::zero<3>();
        const uint8_t* a = A.data() + (same_rows ? 0 : m0 * lda);
        for (int64_t s = 0; s < steps; ++s) {
          if (ahead) {  // A's lines `ahead` steps on (the next row tile's past the end), into L1
            const int64_t t = s + ahead;
            const uint8_t* p = t < steps ? a + t * 64 : a + 32 * lda + (t - steps) * 64;
            if (p + 31 * lda < A.data() + A.size())
              for (int r = 0; r < 32; ++r)
                _mm_prefetch(reinterpret_cast<const char*>(p + r * lda), _MM_HINT_T0);
          }
          HwTiles::load<4>(a + s * 64, lda);
          HwTiles::load<6>(B.data() + s * 1024, 64);
          HwTiles::dpbusd<0, 4, 6>();
          HwTiles::load<7>(B.data() + K * 16 + s * 1024, 64);
          HwTiles::dpbusd<1, 4, 7>();
          HwTiles::load<5>(a + 16 * lda + s * 64, lda);
          HwTiles::dpbusd<2, 5, 6>();
          HwTiles::dpbusd<3, 5, 7>();
        }
        HwTiles::store<0>(c, 64); HwTiles::store<1>(c, 64);
        HwTiles::store<2>(c, 64); HwTiles::store<3>(c, 64);
      }
    HwTiles::release();
  }
  return omp_get_wtime() - t0;
}

bool usable() {
  return surge::amx::cpu_has(surge::amx::kAmxInt8) && surge::amx::tile_permission();
}
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    args = ap.parse_args()
    m = load_inline(
        "surge_amx_peak",
        cpp_sources=[SOURCE],
        functions=["bare", "loop", "usable"],
        extra_include_paths=[str(KERNELS)],
        extra_cflags=["-O3", "-march=native", "-fopenmp"],
        extra_ldflags=["-fopenmp"],
        build_directory=tempfile.mkdtemp(prefix="surge-amx-peak-"),
    )
    if not m.usable():
        raise SystemExit("no usable AMX-INT8 here")
    tile_ops = 16 * 16 * 64 * 2  # one TDPBUSD's multiply-adds, x 2
    for threads in (int(t) for t in args.threads.split(",")):
        iters = 2_000_000
        m.bare(iters // 10, threads)  # warm-up
        s = m.bare(iters, threads)
        print(f"{threads} thread(s): bare TDPBUSD {iters * 4 * tile_ops * threads / s / 1e12:.2f} "
              f"TOP/s ({s / (iters * 4) * 1e9:.2f} ns each)")  # fmt: skip
        for rows, same, ahead, what in (
            (512, False, 0, "A from L2"),
            (512, True, 0, "A from L1"),
            (512, False, 1, "A from L2, prefetched 1 step ahead"),
            (512, False, 2, "A from L2, prefetched 2 steps ahead"),
        ):
            reps = 250
            m.loop(rows, reps // 10, same, threads, ahead)
            s = m.loop(rows, reps, same, threads, ahead)
            ops = reps * rows * 32 * 576 * 2 * threads
            print(f"  GEMM inner loop, 2 x 2 tiles, K 576, {what}: {ops / s / 1e12:.2f} TOP/s")


if __name__ == "__main__":
    main()
