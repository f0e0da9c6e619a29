// Paged decode attention on the CPU: one query token per request, keys and values read straight
// from the KV blocks (no gather copy), float32 accumulation, parallel over (request, kv head).
#include <torch/extension.h>
#include "cpu_features.h"
#include <ATen/Parallel.h>
#include <cmath>
#include <cstring>
#include <limits>
#include <algorithm>
#include <type_traits>
#include <vector>
#include "decode_attention.h"

namespace {

inline void load_row(const float* __restrict__ src, float* __restrict__ dst, int64_t n) {
  std::memcpy(dst, src, n * sizeof(float));
}

// bf16 is the top half of a float32: widen by a shift (vectorizes, unlike c10's conversion).
inline void load_row(const at::BFloat16* __restrict__ src, float* __restrict__ dst, int64_t n) {
  const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
  uint32_t* d = reinterpret_cast<uint32_t*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = static_cast<uint32_t>(s[i]) << 16;
}

inline void load_row(const double* __restrict__ src, float* __restrict__ dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

inline void load_row(const at::Half* __restrict__ src, float* __restrict__ dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

template <typename T, int64_t HD>
void decode_kernel(
    const T* q,            // [D, H, hd]
    const T* k_cache,      // [kvh, num_blocks, bs, hd]
    const T* v_cache,
    const int64_t* tables, // [D, max_blocks]
    const int64_t* lens,   // [D]
    T* out,                // [D, H, hd]
    int64_t D, int64_t H, int64_t kvh, int64_t hd_arg, int64_t num_blocks, int64_t bs,
    int64_t max_blocks, float scale) {
  // A compile-time head size lets the compiler unroll and vectorize the row loops.
  const int64_t hd = HD > 0 ? HD : hd_arg;
  const int64_t group = H / kvh;
  at::parallel_for(0, D * kvh, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qbuf(group * hd), accbuf(group * hd), rowbuf(hd), sbuf;
    float* __restrict__ qf = qbuf.data();
    float* __restrict__ acc = accbuf.data();
    float* __restrict__ row = rowbuf.data();
    for (int64_t idx = begin; idx < end; ++idx) {
      const int64_t d = idx / kvh;
      const int64_t h = idx % kvh;
      const int64_t len = lens[d];
      if (static_cast<int64_t>(sbuf.size()) < group * len) sbuf.resize(group * len);
      float* __restrict__ scores = sbuf.data();
      for (int64_t g = 0; g < group; ++g) {
        load_row(q + (d * H + h * group + g) * hd, qf + g * hd, hd);
        for (int64_t i = 0; i < hd; ++i) qf[g * hd + i] *= scale;
      }
      const int64_t* table = tables + d * max_blocks;
      const T* kh = k_cache + h * num_blocks * bs * hd;
      const T* vh = v_cache + h * num_blocks * bs * hd;
      for (int64_t t = 0; t < len; ++t) {
        load_row(kh + (table[t / bs] * bs + t % bs) * hd, row, hd);
        for (int64_t g = 0; g < group; ++g) {
          const float* __restrict__ qg = qf + g * hd;
          float s = 0.f;
          for (int64_t i = 0; i < hd; ++i) s += qg[i] * row[i];
          scores[g * len + t] = s;
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        float* __restrict__ sg = scores + g * len;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t t = 0; t < len; ++t) mx = std::max(mx, sg[t]);
        float sum = 0.f;
        for (int64_t t = 0; t < len; ++t) {
          sg[t] = surge::exp_nonpositive(sg[t] - mx);
          sum += sg[t];
        }
        const float inv = 1.f / sum;
        for (int64_t t = 0; t < len; ++t) sg[t] *= inv;
      }
      for (int64_t i = 0; i < group * hd; ++i) acc[i] = 0.f;
      for (int64_t t = 0; t < len; ++t) {
        load_row(vh + (table[t / bs] * bs + t % bs) * hd, row, hd);
        for (int64_t g = 0; g < group; ++g) {
          const float p = scores[g * len + t];
          float* __restrict__ ag = acc + g * hd;
          for (int64_t i = 0; i < hd; ++i) ag[i] += p * row[i];
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        T* op = out + (d * H + h * group + g) * hd;
        for (int64_t i = 0; i < hd; ++i) op[i] = static_cast<T>(acc[g * hd + i]);
      }
    }
  });
}

// The same computation in AVX-512 or AVX2 registers (decode_attention.h; elsewhere its plain
// loops), for head sizes that are a multiple of 16, parallel over (request, kv head). Queries
// and output of type Q: the cache's, or float32 against an int8 cache.
using surge::attend_chunk;

template <typename T, int HD, typename Q = T>
void decode_kernel_simd(const Q* q, const T* k_cache, const T* v_cache, const int64_t* tables,
                        const int64_t* lens, Q* out, int64_t D, int64_t H, int64_t kvh,
                        int64_t /*hd: HD*/, int64_t num_blocks, int64_t bs, int64_t max_blocks,
                        float scale) {
  constexpr int kChunk = 256 / HD;  // queries per pass: their registers fit beside the K rows
  const int64_t group = H / kvh;
  at::parallel_for(0, D * kvh, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> sbuf;
    for (int64_t idx = begin; idx < end; ++idx) {
      const int64_t d = idx / kvh, h = idx % kvh;
      const int64_t len = lens[d];
      const int64_t padded = (len + 15) & ~int64_t(15);
      if (static_cast<int64_t>(sbuf.size()) < kChunk * padded) sbuf.resize(kChunk * padded);
      const int64_t* table = tables + d * max_blocks;
      const T* kh = k_cache + h * num_blocks * bs * surge::kRowStride<T, HD>;
      const T* vh = v_cache + h * num_blocks * bs * surge::kRowStride<T, HD>;
      for (int64_t g0 = 0; g0 < group; g0 += kChunk) {
        const int64_t row = d * H + h * group + g0;
        const Q* qg = q + row * HD;
        Q* og = out + row * HD;
        switch (std::min<int64_t>(kChunk, group - g0)) {
          case 1: attend_chunk<T, HD, 1>(qg, kh, vh, table, bs, len, scale, sbuf.data(), og); break;
          case 2: if constexpr (kChunk >= 2) attend_chunk<T, HD, 2>(qg, kh, vh, table, bs, len, scale, sbuf.data(), og); break;
          case 3: if constexpr (kChunk >= 3) attend_chunk<T, HD, 3>(qg, kh, vh, table, bs, len, scale, sbuf.data(), og); break;
          case 4: if constexpr (kChunk >= 4) attend_chunk<T, HD, 4>(qg, kh, vh, table, bs, len, scale, sbuf.data(), og); break;
        }
      }
    }
  });
}

}  // namespace

// Against an int8 cache ([kv_heads, num_blocks, block_size, head_dim + 4]: each row's values,
// then its float32 scale): float32 queries and output.
torch::Tensor paged_decode_int8(
    const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
    const torch::Tensor& block_tables, const torch::Tensor& seq_lens, double scale) {
  TORCH_CHECK(q.scalar_type() == at::kFloat, "paged_decode: an int8 cache takes float32 queries");
  const int64_t D = q.size(0), H = q.size(1), hd = q.size(2);
  const int64_t kvh = k_cache.size(0), num_blocks = k_cache.size(1), bs = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == hd + 4 && v_cache.sizes() == k_cache.sizes(),
              "paged_decode: int8 cache rows are head_dim values and a float32 scale");
  TORCH_CHECK(hd == 64 || hd == 128 || hd == 256,
              "paged_decode: an int8 cache takes head size 64, 128 or 256");
  auto out = torch::empty_like(q);
  auto run = [&](auto kernel) {
    kernel(q.data_ptr<float>(), k_cache.data_ptr<int8_t>(), v_cache.data_ptr<int8_t>(),
           block_tables.data_ptr<int64_t>(), seq_lens.data_ptr<int64_t>(), out.data_ptr<float>(),
           D, H, kvh, hd, num_blocks, bs, block_tables.size(1), static_cast<float>(scale));
  };
  if (hd == 64) run(decode_kernel_simd<int8_t, 64, float>);
  else if (hd == 128) run(decode_kernel_simd<int8_t, 128, float>);
  else run(decode_kernel_simd<int8_t, 256, float>);  // Gemma 3
  return out;
}

torch::Tensor paged_decode(
    const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
    const torch::Tensor& block_tables, const torch::Tensor& seq_lens, double scale) {
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous());
  TORCH_CHECK(block_tables.is_contiguous() && seq_lens.is_contiguous());
  if (k_cache.scalar_type() == at::kChar)
    return paged_decode_int8(q, k_cache, v_cache, block_tables, seq_lens, scale);
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type(), "q and cache dtypes differ");
  const int64_t D = q.size(0), H = q.size(1), hd = q.size(2);
  const int64_t kvh = k_cache.size(0), num_blocks = k_cache.size(1), bs = k_cache.size(2);
  auto out = torch::empty_like(q);
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16 ||
              q.scalar_type() == at::kHalf, "paged_decode: float32, bfloat16 or float16");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_decode", [&] {
    auto run = [&](auto kernel) {
      kernel(q.data_ptr<scalar_t>(), k_cache.data_ptr<scalar_t>(), v_cache.data_ptr<scalar_t>(),
             block_tables.data_ptr<int64_t>(), seq_lens.data_ptr<int64_t>(),
             out.data_ptr<scalar_t>(), D, H, kvh, hd, num_blocks, bs, block_tables.size(1),
             static_cast<float>(scale));
    };
#if SURGE_TIER >= SURGE_TIER_AVX2  // attend_chunk in registers (decode_attention.h)
    if constexpr (!std::is_same_v<scalar_t, double>) {
      if (hd == 64) return run(decode_kernel_simd<scalar_t, 64>);
      if (hd == 128) return run(decode_kernel_simd<scalar_t, 128>);
    }
#endif
    if (hd == 64) run(decode_kernel<scalar_t, 64>);
    else if (hd == 128) run(decode_kernel<scalar_t, 128>);
    else run(decode_kernel<scalar_t, 0>);
  });
  return out;
}

// Write this step's K/V [num_tokens, kv_heads, head_dim] into their slots of the caches
// [kv_heads, num_blocks, block_size, head_dim]: one op that declares the mutation, so a compiled
// graph updates the caches in place rather than copying them.
void write_kv(const torch::Tensor& k, const torch::Tensor& v, torch::Tensor k_cache,
              torch::Tensor v_cache, const torch::Tensor& slot_mapping) {
  const int64_t kvh = k_cache.size(0), hd = k_cache.size(3);
  const int64_t slots = k_cache.size(1) * k_cache.size(2);
  k_cache.view({kvh, slots, hd}).index_copy_(1, slot_mapping, k.transpose(0, 1).to(k_cache.scalar_type()));
  v_cache.view({kvh, slots, hd}).index_copy_(1, slot_mapping, v.transpose(0, 1).to(v_cache.scalar_type()));
}

// The same on the CPU as plain row copies: index_copy_ costs ~25 us a call for a decode's single
// token, which is 30 layers x 2 caches of overhead per step.
void write_kv_cpu(const torch::Tensor& k, const torch::Tensor& v, torch::Tensor k_cache,
                  torch::Tensor v_cache, const torch::Tensor& slot_mapping) {
  if (k.scalar_type() != k_cache.scalar_type() || !k_cache.is_contiguous() ||
      !v_cache.is_contiguous() || k.stride(2) != 1 || v.stride(2) != 1) {
    write_kv(k, v, k_cache, v_cache, slot_mapping);  // a KV dtype of its own, or odd strides
    return;
  }
  const int64_t n = k.size(0), kvh = k.size(1), hd = k.size(2);
  const int64_t slots = k_cache.size(1) * k_cache.size(2);
  const torch::Tensor idx = slot_mapping.to(at::kLong).contiguous();
  const int64_t* sp = idx.data_ptr<int64_t>();
  const int64_t elem = k.element_size();
  const char* kp = static_cast<const char*>(k.data_ptr());
  const char* vp = static_cast<const char*>(v.data_ptr());
  char* kc = static_cast<char*>(k_cache.data_ptr());
  char* vc = static_cast<char*>(v_cache.data_ptr());
  for (int64_t t = 0; t < n; ++t) {
    TORCH_CHECK(sp[t] >= 0 && sp[t] < slots, "write_kv: slot out of range");
    for (int64_t h = 0; h < kvh; ++h) {
      const int64_t dst = (h * slots + sp[t]) * hd * elem;
      std::memcpy(kc + dst, kp + (t * k.stride(0) + h * k.stride(1)) * elem, hd * elem);
      std::memcpy(vc + dst, vp + (t * v.stride(0) + h * v.stride(1)) * elem, hd * elem);
    }
  }
}

TORCH_LIBRARY_FRAGMENT(surge, m) {
  m.def("paged_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor seq_lens, float scale) -> Tensor");
  m.def("write_kv(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping) -> ()");
}

TORCH_LIBRARY_IMPL(surge, CPU, m) {
  m.impl("paged_decode", &paged_decode);
  m.impl("write_kv", &write_kv_cpu);
}

// ATen ops only: the same implementation serves every other device.
TORCH_LIBRARY_IMPL(surge, CompositeExplicitAutograd, m) { m.impl("write_kv", &write_kv); }

// The loader imports the library as a Python module; the ops live in torch.ops.surge.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("tier") = SURGE_TIER_NAME;  // the tier it was built for (cpu_features.h)
}
