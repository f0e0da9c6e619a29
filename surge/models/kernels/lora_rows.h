// LoRA rows of the fused decode stack (q4_decode.cpp): each row with an adapter slot adds
// B (A x) to a projection's output, in two halves that fit the stack's phases.
#pragma once

#include <torch/extension.h>
#include <algorithm>
#include <cstdint>
#include <initializer_list>

namespace surge {

// A projection's LoRA slots (surge/models/lora.py): A [slots, P*R, K] and B transposed,
// BT [slots, P*R, N], float32, where the projection's P parts (q/k/v, gate/up) each have R rank
// columns: channel n of part p reads BT's rows [p*R, (p+1)*R) (the rest are zeros there).
struct LoraPair {
  torch::Tensor a, bt;  // held: written in place by the wrapper's set_slot
  int64_t K = 0, N = 0, W = 0;  // input and output widths, P*R
};

inline float lora_dot(const float* a, const float* b, int64_t n) {
  float acc = 0.f;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];  // vectorized: built with -ffast-math
  return acc;
}

// The first half for rows [r0, r1) of x [M, K] (rows with a slot): t[m, :W] = A[slot] x[m],
// into t [M, tw].
inline void lora_down(const LoraPair& p, const float* x, const int64_t* slots, int64_t r0,
                      int64_t r1, float* t, int64_t tw) {
  if (!slots) return;
  const float* A = p.a.data_ptr<float>();
  // Rows inner: an A row is read from memory once for all the rows of its adapter.
  for (int64_t j = 0; j < p.W; ++j) {
    for (int64_t m = r0; m < r1; ++m) {
      if (slots[m] < 0) continue;
      t[m * tw + j] = lora_dot(A + (slots[m] * p.W + j) * p.K, x + m * p.K, p.K);
    }
  }
}

// The second half into out [M, N] for channels [n0, n1) (those this thread also projected, or
// after a barrier): out[m, n] += sum_r t[m, part(n) R + r] BT[slot][part(n) R + r, n], as R
// scaled adds of contiguous BT rows (vectorized; no short dot products to reduce). part_ends:
// where each part's channels end; t [M, 3 R].
inline void lora_up(const LoraPair& p, std::initializer_list<int64_t> part_ends,
                    const int64_t* slots, int64_t M, float* out, int64_t n0, int64_t n1,
                    const float* t_all, int64_t R) {
  if (!slots) return;
  const float* BT = p.bt.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) {
    if (slots[m] < 0) continue;
    const float* t = t_all + m * 3 * R;
    float* o = out + m * p.N;
    int64_t start = 0, part = 0;
    for (const int64_t end : part_ends) {
      const int64_t b0 = std::max(start, n0), b1 = std::min(end, n1);
      for (int64_t r = part * R; b0 < b1 && r < (part + 1) * R; ++r) {
        const float tv = t[r];
        const float* row = BT + (slots[m] * p.W + r) * p.N;
        for (int64_t n = b0; n < b1; ++n) o[n] += tv * row[n];
      }
      start = end;
      ++part;
    }
  }
}

}  // namespace surge
