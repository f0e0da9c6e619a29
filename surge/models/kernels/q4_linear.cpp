// 4-bit linear layers on the CPU, in GGUF's Q4_1 block format (32 weights per block along K,
// w = d * q + m with q in 0..15 and float16 d, m), repacked at load (surge/models/q4.py):
//   qs [N, K/2] uint8, per row first groups of 16 blocks (512 weights, 256 bytes), then pairs of
//      blocks (64 weights, 32 bytes) for what is left of K. A group is 8 operands of 64 weights,
//      32 bytes each: byte p holds operand byte p (low nibble) and p + 32 (high nibble), and
//      byte 4l + i of operand j is weight 4j + i of block l. A pair unpacks to weights 0-63 in
//      order (low nibbles block b, high nibbles block b + 1).
//   dm [N, 2, K/32] float16: d then m of every block, in block order.
// K must be a multiple of 64.
//
// q4_gemv: each block of 32 activations is rounded to int8 with its own scale dx (llama.cpp's
// Q8 scheme), and
//   y = sum over blocks of d * dx * dot(q, xq) + m * dx * sum(xq),
// exactly the file's weights times the rounded activations. (The sum of the unrounded x in the
// m term measured about 2x the error: q in 0..15 is not centred, so the d term's rounding error
// only cancels against the same rounding in the m term.)
//
// The AVX-512 path: 64 packed bytes (operands j, j + 1) split by mask and shift into a low and a
// high vector, each the left operand of one vpdpbusd as it is. The activations are reordered at
// quantization so that the bytes facing each nibble are its weights' (see x_position): after a
// group, int32 lane l of the low sum holds part of block l's dot product and lane l + 8 the rest,
// likewise the high sum for blocks 8-15, and two shuffles and an add put the 16 block sums in
// order for one convert + FMA with the scales. Weight rows go 16 at a time, their 16 unreduced
// sums added across lanes together (hsum16) and stored as one vector. One activation row reads
// 0.625 bytes per weight, about half of int8's, with few enough instructions per byte that the
// small layers of a decode step are not bound by them.
#include <torch/extension.h>
#include "cpu_features.h"
#include <ATen/Parallel.h>
#include "q4_gemv.h"

using namespace surge::q4;

// x [M, K] float32/bf16/fp16, qs [N, K/2] uint8, dm [N, 2, K/32] float16, bias [N] or None
// -> [M, N] in x's dtype.
torch::Tensor q4_gemv(const torch::Tensor& x_in, const torch::Tensor& qs, const torch::Tensor& dm,
                      const std::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x_in.dim() == 2 && qs.dim() == 2 && dm.dim() == 3, "q4_gemv: ranks");
  const int64_t M = x_in.size(0), K = x_in.size(1), N = qs.size(0);
  TORCH_CHECK(K % 64 == 0 && qs.size(1) * 2 == K, "q4_gemv: K must be a multiple of 64");
  TORCH_CHECK(dm.size(0) == N && dm.size(1) == 2 && dm.size(2) * 32 == K, "q4_gemv: dm shape");
  TORCH_CHECK(qs.scalar_type() == at::kByte && dm.scalar_type() == at::kHalf, "q4_gemv: types");
  TORCH_CHECK(qs.is_contiguous() && dm.is_contiguous(), "q4_gemv: contiguous weights");
  const torch::Tensor x = x_in.contiguous();
  auto out = torch::empty({M, N}, x.options());
  if (M == 0 || N == 0) return out;
  torch::Tensor bias_f;
  const float* bp = surge::float_bias(bias, bias_f);
  const uint8_t* qp = qs.data_ptr<uint8_t>();
  const uint16_t* dp = reinterpret_cast<const uint16_t*>(dm.data_ptr<at::Half>());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "q4_gemv", [&] {
    // Reused by the calling thread: no allocation per call. Named through a local reference:
    // the workers below must read the caller's buffer, not a thread_local of their own.
    thread_local QuantizedX buffer;
    QuantizedX& xq = buffer;
    quantize_blocks(x.data_ptr<scalar_t>(), M, K, xq);
    scalar_t* op = out.data_ptr<scalar_t>();
    // Contiguous ranges of whole tiles of output channels per thread (the last range also takes
    // the rows after the last tile), streamed in order; grain 4 tiles (64 rows) keeps tiny
    // layers from paying a fork/join.
    const int64_t tiles = N / kTile;
    at::parallel_for(0, std::max<int64_t>(tiles, 1), 4, [&](int64_t b, int64_t e) {
      const int64_t n0 = b * kTile, n1 = e >= tiles ? N : e * kTile;
      q4_range<false>(qp, dp, xq, M, bp, n0, n1, N, op);
    });
  });
  return out;
}

TORCH_LIBRARY_FRAGMENT(surge, m) {
  m.def("q4_gemv(Tensor x, Tensor qs, Tensor dm, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(surge, CPU, m) { m.impl("q4_gemv", &q4_gemv); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("tier") = SURGE_TIER_NAME;  // the tier it was built for (cpu_features.h)
}
