// GGUF's quantized blocks run as the file stores them (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K; the
// formats in gguf_blocks.h, the method in gguf_gemm.h): no repacking, so the weights in memory
// are the file's bytes (a mapped file's pages, or a copy of them).
//   gguf_dequantize(blocks [N, row_bytes] uint8, type) -> [N, K] float32, bit-exact against the
//     gguf package's dequantize.
//   gguf_linear(x [M, K] float32/bf16/fp16, blocks, type, bias [N] or None) -> [M, N] in x's
//     dtype: x rounded to int8 per block of 32, integer dot products with the blocks.
//   gguf_linear_parts(x, [blocks...], [type...], bias [sum of N] or None) -> [M, sum of N]: a
//     stacked matrix whose parts have different types (a fused q/k/v or gate/up), each part on
//     its own blocks into its slice of the output, from one rounding of x (gguf_segments.h).
#include <torch/extension.h>
#include "cpu_features.h"
#include <ATen/Parallel.h>
#include "gguf_segments.h"

using namespace surge::gguf;

namespace {

int64_t in_features(const torch::Tensor& blocks, int64_t type) {
  const Format f = format(type);
  TORCH_CHECK(blocks.dim() == 2 && blocks.scalar_type() == at::kByte, "gguf blocks: uint8 [N, row_bytes] expected");
  TORCH_CHECK(blocks.is_contiguous(), "gguf blocks: contiguous blocks expected");
  TORCH_CHECK(blocks.size(1) % f.bytes == 0, "gguf blocks: ", blocks.size(1),
              " bytes a row is not a whole number of ", f.bytes, "-byte blocks");
  return blocks.size(1) / f.bytes * f.weights;
}

}  // namespace

torch::Tensor gguf_dequantize(const torch::Tensor& blocks, int64_t type) {
  const int64_t K = in_features(blocks, type), N = blocks.size(0), row_bytes = blocks.size(1);
  auto out = torch::empty({N, K}, blocks.options().dtype(at::kFloat));
  const uint8_t* w = blocks.data_ptr<uint8_t>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, N, std::max<int64_t>(1, 65536 / std::max<int64_t>(K, 1)), [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) dequantize_row(type, w + n * row_bytes, K, o + n * K);
  });
  return out;
}

torch::Tensor gguf_linear(const torch::Tensor& x_in, const torch::Tensor& blocks, int64_t type,
                          const std::optional<torch::Tensor>& bias) {
  const int64_t K = in_features(blocks, type), N = blocks.size(0), row_bytes = blocks.size(1);
  TORCH_CHECK(x_in.dim() == 2 && x_in.size(1) == K, "gguf_linear: x must be [M, ", K, "]");
  TORCH_CHECK(x_in.scalar_type() == at::kFloat || x_in.scalar_type() == at::kBFloat16 ||
                  x_in.scalar_type() == at::kHalf,
              "gguf_linear: x must be float32, bfloat16 or float16");
  TORCH_CHECK(!bias.has_value() || bias->numel() == N, "gguf_linear: bias must have ", N, " values");
  const torch::Tensor x = x_in.contiguous();
  const int64_t M = x.size(0);
  auto out = torch::empty({M, N}, x.options());
  if (M == 0 || N == 0) return out;
  torch::Tensor bias_f;
  const float* bp = surge::float_bias(bias, bias_f);
  const uint8_t* w = blocks.data_ptr<uint8_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "gguf_linear", [&] {
    // Reused by the calling thread (no allocation per call); the workers read the caller's.
    thread_local QuantizedX buffer;
    QuantizedX& xq = buffer;
    resize(xq, M, K);
    const scalar_t* xp = x.data_ptr<scalar_t>();
    at::parallel_for(0, M, std::max<int64_t>(1, 16384 / K), [&](int64_t b, int64_t e) {
      quantize_rows(xp, b, e, xq);
    });
    scalar_t* op = out.data_ptr<scalar_t>();
    // Contiguous ranges of whole tiles of output rows per thread, streamed in order; at least
    // 8 tiles a thread so that small layers do not pay a fork/join per few rows.
    const int64_t tiles = (N + kTile - 1) / kTile;
    with_type(type, [&](auto t) {
      at::parallel_for(0, tiles, 8, [&](int64_t b, int64_t e) {
        gemm_range<decltype(t)::value>(w, row_bytes, xq, M, bp, b * kTile, std::min(N, e * kTile), N, op);
      });
    });
  });
  return out;
}

torch::Tensor gguf_linear_parts(const torch::Tensor& x_in, const std::vector<torch::Tensor>& parts,
                                const std::vector<int64_t>& types,
                                const std::optional<torch::Tensor>& bias) {
  TORCH_CHECK(!parts.empty() && parts.size() == types.size(), "gguf_linear_parts: one type a part");
  TORCH_CHECK(x_in.dim() == 2, "gguf_linear_parts: x must be [M, K]");
  const int64_t K = x_in.size(1);
  std::vector<Segment> segs;
  int64_t N = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    TORCH_CHECK(in_features(parts[i], types[i]) == K, "gguf_linear_parts: x must be [M, ",
                in_features(parts[i], types[i]), "]");
    segs.push_back(make_segment(parts[i], types[i], N, K, "gguf_linear_parts"));
    N += parts[i].size(0);
  }
  TORCH_CHECK(x_in.scalar_type() == at::kFloat || x_in.scalar_type() == at::kBFloat16 ||
                  x_in.scalar_type() == at::kHalf,
              "gguf_linear_parts: x must be float32, bfloat16 or float16");
  TORCH_CHECK(!bias.has_value() || bias->numel() == N, "gguf_linear_parts: bias must have ", N,
              " values");
  const torch::Tensor x = x_in.contiguous();
  const int64_t M = x.size(0);
  auto out = torch::empty({M, N}, x.options());
  if (M == 0 || N == 0) return out;
  torch::Tensor bias_f;
  const float* bp = surge::float_bias(bias, bias_f);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "gguf_linear_parts", [&] {
    thread_local QuantizedX buffer;  // as gguf_linear's
    QuantizedX& xq = buffer;
    resize(xq, M, K);
    const scalar_t* xp = x.data_ptr<scalar_t>();
    at::parallel_for(0, M, std::max<int64_t>(1, 16384 / K), [&](int64_t b, int64_t e) {
      quantize_rows(xp, b, e, xq);
    });
    scalar_t* op = out.data_ptr<scalar_t>();
    // Tiles of the whole stack, each thread a contiguous range of them across the parts.
    const int64_t tiles = (N + kTile - 1) / kTile;
    at::parallel_for(0, tiles, 8, [&](int64_t b, int64_t e) {
      segments_range<false>(segs, xq, M, bp, b * kTile, std::min(N, e * kTile), N, op);
    });
  });
  return out;
}

TORCH_LIBRARY_FRAGMENT(surge, m) {
  m.def("gguf_dequantize(Tensor blocks, int type) -> Tensor");
  m.def("gguf_linear(Tensor x, Tensor blocks, int type, Tensor? bias) -> Tensor");
  m.def("gguf_linear_parts(Tensor x, Tensor[] parts, int[] types, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(surge, CPU, m) {
  m.impl("gguf_dequantize", &gguf_dequantize);
  m.impl("gguf_linear", &gguf_linear);
  m.impl("gguf_linear_parts", &gguf_linear_parts);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("tier") = SURGE_TIER_NAME;  // the tier it was built for (cpu_features.h)
}
