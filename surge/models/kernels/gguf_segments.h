// A projection whose output channels are several GGUF matrices stacked, each in its own type
// (a fused q/k/v with q and k in Q4_K and v in Q6_K, a gate/up pair): each segment's rows run
// on its own blocks (gguf_gemm.h) into its slice of the output, from one rounding of the
// activations (gguf_blocks.h's QuantizedX serves every type). A single-type matrix is one
// segment. Used by gguf_linear_parts (gguf_blocks.cpp) and the fused stack (q4_decode.cpp).
#pragma once
#include <algorithm>
#include <type_traits>
#include <vector>
#include "gguf_gemm.h"

namespace surge::gguf {

// f(std::integral_constant<int, TYPE>{}) for the runtime type (checked when a segment is made).
template <typename F>
void with_type(int64_t type, F&& f) {
  switch (type) {
    case Q4_0: f(std::integral_constant<int, Q4_0>{}); break;
    case Q4_1: f(std::integral_constant<int, Q4_1>{}); break;
    case Q8_0: f(std::integral_constant<int, Q8_0>{}); break;
    case Q4_K: f(std::integral_constant<int, Q4_K>{}); break;
    case Q5_K: f(std::integral_constant<int, Q5_K>{}); break;
    case Q6_K: f(std::integral_constant<int, Q6_K>{}); break;
    default: break;  // unreachable: types are checked before any kernel runs
  }
}

// Rows [n0, n0 + n) of the stacked matrix: `n` rows of `row_bytes` bytes of GGML type `type`.
struct Segment {
  int64_t type = 0;
  const uint8_t* w = nullptr;
  int64_t row_bytes = 0, n0 = 0, n = 0;
};

// The segment of `blocks` [n, row_bytes] uint8 (contiguous) of `type` at output row n0, K wide.
inline Segment make_segment(const torch::Tensor& blocks, int64_t type, int64_t n0, int64_t K,
                            const char* what) {
  const Format f = format(type);  // checks the type
  TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.dim() == 2 && blocks.is_contiguous(),
              what, ": GGUF blocks must be contiguous uint8 [rows, row_bytes]");
  TORCH_CHECK(K % f.weights == 0 && blocks.size(1) == K / f.weights * f.bytes, what,
              ": GGUF blocks of type ", type, " are ", blocks.size(1), " bytes a row, expected ",
              K / f.weights * f.bytes, " for ", K, " inputs");
  return Segment{type, blocks.data_ptr<uint8_t>(), blocks.size(1), n0, blocks.size(0)};
}

// Output channels [n0, n1) of the stacked matrix for all M rows of `xq`, into out [M, N] (N the
// row stride); bias indexed by output channel. Each segment's part of the range runs on its
// own kernel; the split of channels between threads is the caller's.
template <bool ADD, typename T>
void segments_range(const std::vector<Segment>& segs, const QuantizedX& xq, int64_t M,
                    const float* bias, int64_t n0, int64_t n1, int64_t N, T* out) {
  for (const Segment& s : segs) {
    const int64_t a = std::max(n0, s.n0), b = std::min(n1, s.n0 + s.n);
    if (a >= b) continue;
    with_type(s.type, [&](auto t) {
      gemm_range<decltype(t)::value, T, ADD>(s.w, s.row_bytes, xq, M,
                                             bias ? bias + s.n0 : nullptr, a - s.n0, b - s.n0,
                                             N, out + s.n0);
    });
  }
}

}  // namespace surge::gguf
