// The instruction-set tier the kernels are compiled for, worked out once from the compiler's
// macros (which the build's -march flags set: surge/models/kernels/__init__.py builds for this
// CPU, or for a lower tier under SURGE_KERNEL_TIER so the lower paths run on an AVX-512 machine
// too). Every kernel picks its path with `#if SURGE_TIER >= SURGE_TIER_...`; the tiers are
// ordered, each including the ones below:
//   SURGE_TIER_AVX512_VNNI  AVX-512 F/BW/VL with VNNI: the int8 dot-product paths (q4 GEMV, int8
//                           GEMV, the packed W8A8 GEMM)
//   SURGE_TIER_AVX512       AVX-512 F/BW/VL: 16-lane attention and SiLU
//   SURGE_TIER_AVX2         AVX2 with FMA and F16C: 8-lane attention, the q4 and int8 GEMVs
//   SURGE_TIER_SCALAR       plain loops (the compiler vectorizes what it can)
// SURGE_HAS_AVX512_BF16 is a feature within the AVX-512 tiers (bf16 key dot products).
#pragma once

#define SURGE_TIER_SCALAR 0
#define SURGE_TIER_AVX2 1
#define SURGE_TIER_AVX512 2
#define SURGE_TIER_AVX512_VNNI 3

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#if defined(__AVX512VNNI__)
#define SURGE_TIER SURGE_TIER_AVX512_VNNI
#define SURGE_TIER_NAME "avx512_vnni"
#else
#define SURGE_TIER SURGE_TIER_AVX512
#define SURGE_TIER_NAME "avx512"
#endif
#if defined(__AVX512BF16__)
#define SURGE_HAS_AVX512_BF16 1
#endif
#else
#define SURGE_TIER SURGE_TIER_AVX2
#define SURGE_TIER_NAME "avx2"
#endif
#else
#define SURGE_TIER SURGE_TIER_SCALAR
#define SURGE_TIER_NAME "scalar"
#endif

#if SURGE_TIER >= SURGE_TIER_AVX2
#include <immintrin.h>
#endif
