// Structured output: set the logits of the tokens a grammar forbids to -inf, in place.
//
// `bits` holds one int32 word per 32 tokens and row, bit j of word w standing for token
// 32 * w + j (llguidance's layout). A word of all ones, the common case inside a JSON string,
// is skipped whole; torch's masked_fill on an unpacked bool mask took ~4 ms for 32 rows of a
// 49,152-token vocabulary on 2 cores, this takes a pass over the words.
#include <torch/extension.h>
#include "cpu_features.h"
#include <ATen/Parallel.h>
#include <limits>

namespace {

template <typename T>
void mask_rows(T* logits, int64_t vocab, const int32_t* bits, int64_t words, const int64_t* rows,
               int64_t num_rows) {
  const T ninf = static_cast<T>(-std::numeric_limits<float>::infinity());
  at::parallel_for(0, num_rows, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      T* row = logits + rows[i] * vocab;
      const int32_t* w = bits + i * words;
      for (int64_t k = 0; k < words; ++k) {
        const uint32_t word = static_cast<uint32_t>(w[k]);
        if (word == 0xFFFFFFFFu) continue;
        const int64_t base = k * 32;
        const int64_t n = std::min<int64_t>(32, vocab - base);
        for (int64_t j = 0; j < n; ++j)
          if (!((word >> j) & 1u)) row[base + j] = ninf;
      }
      for (int64_t t = words * 32; t < vocab; ++t) row[t] = ninf;  // beyond the mask's tokens
    }
  });
}

// logits [R, V] (float32, bfloat16 or float16, contiguous); bits [N, W] int32; rows [N] int64:
// bits row i masks logits row rows[i].
void apply_token_bitmask_(torch::Tensor logits, torch::Tensor bits, torch::Tensor rows) {
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous(), "logits must be 2-D and contiguous");
  TORCH_CHECK(bits.dim() == 2 && bits.scalar_type() == torch::kInt32 && bits.is_contiguous(),
              "bits must be a contiguous int32 [rows, words] tensor");
  TORCH_CHECK(rows.dim() == 1 && rows.scalar_type() == torch::kInt64 && rows.size(0) == bits.size(0),
              "rows must be int64 with one entry per bits row");
  const int64_t vocab = logits.size(1);
  const int64_t* r = rows.data_ptr<int64_t>();
  for (int64_t i = 0; i < rows.size(0); ++i)
    TORCH_CHECK(r[i] >= 0 && r[i] < logits.size(0), "row index out of range");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, logits.scalar_type(), "token_mask", [&] {
    mask_rows<scalar_t>(logits.data_ptr<scalar_t>(), vocab, bits.data_ptr<int32_t>(), bits.size(1),
                        r, rows.size(0));
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(surge, m) {
  m.def("apply_token_bitmask_(Tensor(a!) logits, Tensor bits, Tensor rows) -> ()");
}

TORCH_LIBRARY_IMPL(surge, CPU, m) { m.impl("apply_token_bitmask_", &apply_token_bitmask_); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("tier") = SURGE_TIER_NAME;  // the tier it was built for (cpu_features.h)
}
