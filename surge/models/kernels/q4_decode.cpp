// The decoder layers of a decode step (one token per request) of a Llama-family model with
// 4-bit layers, in one call. Per layer: RMSNorm, the fused q/k/v projection, rotary
// embedding, the K/V cache write, paged attention, the output projection and residual add,
// RMSNorm, the fused gate/up projection, SiLU * up, the down projection and residual add.
//
// Why: at one request the layers' essential work (4-bit weights streamed at the memory
// roofline, attention) is ~4 ms of a ~7 ms step on 2 cores; the rest was per-op overhead spread
// over ~180 dispatcher calls, ~150 OpenMP fork/joins and the tensors allocated between them.
// Here all layers run inside one OpenMP parallel region: the threads split each projection's
// output channels (and the attention's heads) and meet at a barrier between phases; the short
// serial phases (a norm, quantizing a row) run on thread 0. Buffers live in the object and are
// reused, so a step allocates nothing but its output.
//
// Batches: up to `q4_max_rows` rows the projections read the 4-bit weights (q4_gemv.h: bound by
// memory, 0.625 bytes a weight); past that, when the layers' int8 copies are given, they run
// the packed W8A8 GEMM (w8a8_gemm.h), which is compute-bound there and faster. With many rows
// the per-row phases (norms, quantization, rotary + cache write, SiLU) are split by rows too.
// Without AVX-512 VNNI (AVX2: q4_gemv.h's vpmaddubsw path, the attention in plain loops) the
// caller gives no int8 copies and every step runs on the 4-bit weights, 8 rows a pass.
//
// LoRA (set_lora): rows with an adapter slot add B (A x) to each projection: A x per row in
// the phase that prepares the projection's input, B's rows on the channels each thread
// projects (surge/models/lora.py holds the slots; a step without adapters passes no slots).
//
// GGUF blocks (a Q4_K_M file's Q4_K and Q6_K layers, Q5_K, Q8_0...): a projection may instead
// be a GGUF matrix run on the file's own blocks (gguf_segments.h), a fused q/k/v or gate/up of
// several types as segments, each on its own blocks into its slice of the output. Its
// activations are rounded to int8 per block of 32 (gguf_blocks.h, as GGUFLinear rounds them)
// in the phase that prepares its input, and the threads split its output channels in whole
// tiles of 16 as for a 4-bit projection (a stack of several types by bytes: proj_channels), and
// add LoRA's rows on the same channels, so no barrier is added. A stack with GGUF projections
// has no int8 copies: every step runs on the blocks.
//
// Numerics: the residual stream and every intermediate stay float32 (the layer-by-layer path
// rounds them to the model dtype between ops); the KV cache is written in its own dtype. The
// projections are q4_gemv's or w8a8_linear's, the attention paged_decode's (decode_attention.h).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <omp.h>
#include <array>
#include <chrono>
#include <cmath>
#include <initializer_list>
#include <string>
#include <vector>
#include "q4_gemv.h"
#include "gguf_segments.h"
#include "amx_gemm.h"
#include "decode_attention.h"
#include "prefill_attention.h"
#include "prefill_attention_amx.h"
#include "lora_rows.h"
#include "cpu_features.h"

namespace {

#if SURGE_TIER >= SURGE_TIER_AVX2  // q4_gemv.h's vectorized GEMV
using namespace surge::q4;

constexpr int64_t kTensorsPerLayer = 11;
constexpr int64_t kInt8TensorsPerLayer = 12;  // packed, scale, wsum of qkv, o, gate_up, down

struct Q4Weight {
  torch::Tensor qs, dm;  // held: the pointers below stay valid
  int64_t N = 0;  // output channels
  const uint8_t* q() const { return qs.data_ptr<uint8_t>(); }
  const uint16_t* d() const { return reinterpret_cast<const uint16_t*>(dm.data_ptr<at::Half>()); }
};

// A projection's int8 copy, packed for the W8A8 GEMM (tensors held: the pointers stay valid).
struct Int8Weight {
  torch::Tensor packed, scale, wsum;
  surge::w8a8::Weights w{};
};

// A projection: the 4-bit layout (q4), or GGUF blocks as stored, in one or more segments.
struct Proj {
  bool gguf = false;
  Q4Weight q4;
  std::vector<surge::gguf::Segment> segs;
  std::vector<torch::Tensor> held;  // the segments' blocks: the pointers stay valid
  int64_t N = 0;  // output channels
};

struct Layer {
  torch::Tensor ln1, ln2, qkv_bias;  // float32; qkv_bias empty without one
  surge::LoraPair lqkv, lo, lgate_up, ldown;  // empty until set_lora
  Proj qkv, o, gate_up, down;
  Int8Weight qkv8, o8, gate_up8, down8;  // empty without int8 copies
  torch::Tensor k_cache, v_cache;  // [kv_heads, num_blocks, block_size, head_dim]
};

Q4Weight q4_weight(const torch::Tensor& qs, const torch::Tensor& dm, int64_t n, int64_t k,
                   const char* what) {
  TORCH_CHECK(qs.scalar_type() == at::kByte && dm.scalar_type() == at::kHalf, what, ": types");
  TORCH_CHECK(qs.is_contiguous() && dm.is_contiguous(), what, ": contiguous");
  TORCH_CHECK(qs.size(0) == n && qs.size(1) * 2 == k && k % 64 == 0, what, ": shape");
  TORCH_CHECK(dm.size(0) == n && dm.size(1) == 2 && dm.size(2) * 32 == k, what, ": scales");
  return Q4Weight{qs, dm, n};
}

// A GGUF projection [n, k] from its segments ((GGML type, blocks [rows, row_bytes] uint8), in
// output order).
using GgufParts = std::vector<std::pair<int64_t, torch::Tensor>>;

Proj gguf_proj(const GgufParts& parts, int64_t n, int64_t k, const char* what) {
  Proj p;
  p.gguf = true;
  p.N = n;
  TORCH_CHECK(k % surge::gguf::kBlock == 0, what, ": width not a multiple of 32");
  int64_t rows = 0;
  for (const auto& [type, blocks] : parts) {
    p.segs.push_back(surge::gguf::make_segment(blocks, type, rows, k, what));
    p.held.push_back(blocks);
    rows += blocks.size(0);
  }
  TORCH_CHECK(rows == n, what, ": GGUF segments have ", rows, " rows, expected ", n);
  return p;
}

Proj proj(const torch::Tensor& qs, const torch::Tensor& dm, const GgufParts& parts, int64_t n,
          int64_t k, const char* what) {
  if (!parts.empty()) return gguf_proj(parts, n, k, what);
  Proj p;
  p.q4 = q4_weight(qs, dm, n, k, what);
  p.N = n;
  return p;
}

Int8Weight int8_weight(const torch::Tensor* t, int64_t n, int64_t k, const float* bias,
                       const char* what) {
  Int8Weight r{t[0], t[1], t[2]};
  TORCH_CHECK(r.packed.scalar_type() == at::kChar && r.packed.is_contiguous() &&
              r.packed.dim() == 4 && r.packed.size(0) == (n + 15) / 16 &&
              r.packed.size(1) * 4 == surge::w8a8::padded_k(k), what, ": packed int8 shape");
  TORCH_CHECK(r.scale.scalar_type() == at::kFloat && r.scale.is_contiguous() && r.scale.size(0) == n,
              what, ": int8 scale");
  TORCH_CHECK(r.wsum.scalar_type() == at::kInt && r.wsum.is_contiguous() && r.wsum.size(0) == n,
              what, ": int8 row sums");
  r.w = {r.packed.data_ptr<int8_t>(), r.scale.data_ptr<float>(), r.wsum.data_ptr<int32_t>(), bias,
         n, k};
  return r;
}

torch::Tensor float_vector(const torch::Tensor& t, int64_t n, const char* what) {
  TORCH_CHECK(t.dim() == 1 && t.size(0) == n, what, ": shape");
  return t.to(at::kFloat).contiguous();
}

// The share [begin, end) of `n` items that thread `tid` of `nt` takes.
inline std::pair<int64_t, int64_t> share(int64_t n, int tid, int nt) {
  return {n * tid / nt, n * (tid + 1) / nt};
}

// y[m] = x[m] / rms(x[m]) * w, float32 rows of `n`.
void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps) {
  for (int64_t m = 0; m < rows; ++m) {
    const float* xm = x + m * n;
    float* ym = y + m * n;
    float ss = 0.f;
    for (int64_t i = 0; i < n; ++i) ss += xm[i] * xm[i];
    const float r = 1.f / std::sqrt(ss / static_cast<float>(n) + eps);
    for (int64_t i = 0; i < n; ++i) ym[i] = xm[i] * r * w[i];
  }
}

// act[m, i] = silu(gu[m, i]) * gu[m, inter + i].
void silu_mul(const float* gu, float* act, int64_t rows, int64_t inter) {
  for (int64_t m = 0; m < rows; ++m) {
    const float* g = gu + m * 2 * inter;
    const float* u = g + inter;
    float* a = act + m * inter;
    int64_t i = 0;
#if SURGE_TIER >= SURGE_TIER_AVX512
    const __m512 one = _mm512_set1_ps(1.f);
    for (; i + 16 <= inter; i += 16) {
      // sigmoid(g) from e = exp(-|g|) <= 1 (exp16 takes x <= 0): 1 / (1 + e), or e / (1 + e).
      const __m512 gv = _mm512_loadu_ps(g + i);
      const __m512 e = surge::exp16(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(gv)));
      const __m512 inv = _mm512_div_ps(one, _mm512_add_ps(one, e));
      const __mmask16 neg = _mm512_cmp_ps_mask(gv, _mm512_setzero_ps(), _CMP_LT_OQ);
      const __m512 sig = _mm512_mask_mul_ps(inv, neg, inv, e);
      _mm512_storeu_ps(a + i, _mm512_mul_ps(_mm512_mul_ps(gv, sig), _mm512_loadu_ps(u + i)));
    }
#else
    for (; i < inter; ++i) {  // vectorized by the compiler: exp_nonpositive is plain arithmetic
      const float e = surge::exp_nonpositive(-std::fabs(g[i]));
      const float inv = 1.f / (1.f + e);
      a[i] = g[i] * (g[i] < 0.f ? inv * e : inv) * u[i];
    }
#endif
    for (; i < inter; ++i) a[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
  }
}

// Neox (rotate-half) rotary embedding of one head vector, in place.
inline void rope(float* v, const float* cos, const float* sin, int64_t hd) {
  const int64_t half = hd / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = v[i], b = v[i + half];
    v[i] = a * cos[i] - b * sin[i];
    v[i + half] = b * cos[i + half] + a * sin[i + half];
  }
}

// Query heads attended per pass over a KV head's rows: their registers fit beside the K rows.
template <int HD>
constexpr int64_t kChunk = 256 / HD;

// G (1..kChunk) consecutive query heads against one KV head's cache.
template <typename T, int HD>
void attend_heads(int64_t G, const float* q, const T* kh, const T* vh, const int64_t* table,
                  int64_t bs, int64_t len, float scale, float* scores, float* out) {
  switch (G) {
    case 1: surge::attend_chunk<T, HD, 1>(q, kh, vh, table, bs, len, scale, scores, out); break;
    case 2:
      if constexpr (kChunk<HD> >= 2)
        surge::attend_chunk<T, HD, 2>(q, kh, vh, table, bs, len, scale, scores, out);
      break;
    case 3:
      if constexpr (kChunk<HD> >= 3)
        surge::attend_chunk<T, HD, 3>(q, kh, vh, table, bs, len, scale, scores, out);
      break;
    case 4:
      if constexpr (kChunk<HD> >= 4)
        surge::attend_chunk<T, HD, 4>(q, kh, vh, table, bs, len, scale, scores, out);
      break;
  }
}

class Q4DecodeStack {
 public:
  // int8: per layer kInt8TensorsPerLayer tensors (the projections' packed int8 copies), or none.
  // gguf: per layer 4 lists (qkv, o, gate_up, down) of a GGUF projection's segments, or empty
  // (all 4-bit); a projection with segments gives empty tensors for its qs and dm in `weights`.
  Q4DecodeStack(const std::vector<torch::Tensor>& weights, const std::vector<torch::Tensor>& int8,
                const std::vector<torch::Tensor>& k_caches,
                const std::vector<torch::Tensor>& v_caches, const torch::Tensor& cos,
                const torch::Tensor& sin, int64_t num_heads, int64_t num_kv_heads, double eps,
                int64_t q4_max_rows, const std::vector<GgufParts>& gguf)
      : heads_(num_heads), kv_heads_(num_kv_heads), eps_(static_cast<float>(eps)),
        q4_max_rows_(q4_max_rows) {
    TORCH_CHECK(weights.size() % kTensorsPerLayer == 0, "q4_decode: weights per layer");
    const int64_t layers = weights.size() / kTensorsPerLayer;
    TORCH_CHECK(gguf.empty() || gguf.size() == static_cast<size_t>(4 * layers),
                "q4_decode: GGUF segments: 4 lists per layer");
    static const GgufParts kNone;
    auto parts = [&](int64_t l, int i) -> const GgufParts& {
      return gguf.empty() ? kNone : gguf[4 * l + i];
    };
    for (const GgufParts& g : gguf) has_gguf_ = has_gguf_ || !g.empty();
    TORCH_CHECK(!has_gguf_ || int8.empty(), "q4_decode: no int8 copies with GGUF projections");
    TORCH_CHECK(int8.empty() || int8.size() == static_cast<size_t>(layers * kInt8TensorsPerLayer),
                "q4_decode: int8 copies per layer");
    has_int8_ = !int8.empty();
    // 0: every step on the int8 copies (batch-invariant mode: one kernel for 1 and N rows).
    TORCH_CHECK(q4_max_rows >= (has_int8_ ? 0 : 1), "q4_decode: q4_max_rows >= 1 (0 with int8)");
    TORCH_CHECK(layers > 0 && k_caches.size() == static_cast<size_t>(layers) &&
                v_caches.size() == static_cast<size_t>(layers), "q4_decode: one cache per layer");
    TORCH_CHECK(num_heads % num_kv_heads == 0, "q4_decode: heads");
    const torch::Tensor& kc0 = k_caches[0];
    TORCH_CHECK(kc0.dim() == 4 && kc0.size(0) == num_kv_heads, "q4_decode: cache shape");
    cache_dtype_ = kc0.scalar_type();
    TORCH_CHECK(cache_dtype_ == at::kFloat || cache_dtype_ == at::kBFloat16 ||
                cache_dtype_ == at::kHalf || cache_dtype_ == at::kChar, "q4_decode: cache dtype");
    hd_ = kc0.size(3) - (cache_dtype_ == at::kChar ? 4 : 0);  // an int8 row ends in its scale
    TORCH_CHECK(hd_ == 64 || hd_ == 128, "q4_decode: head size 64 or 128");
    hidden_ = weights[0].size(0);
    const int64_t q_size = heads_ * hd_, kv_size = kv_heads_ * hd_;
    qkv_n_ = q_size + 2 * kv_size;
    if (parts(0, 2).empty()) {
      inter_ = weights[7].size(0) / 2;
    } else {
      for (const auto& seg : parts(0, 2)) inter_ += seg.second.size(0);
      inter_ /= 2;
    }
    for (int64_t l = 0; l < layers; ++l) {
      const torch::Tensor* w = weights.data() + l * kTensorsPerLayer;
      Layer L;
      L.ln1 = float_vector(w[0], hidden_, "ln1");
      L.qkv = proj(w[1], w[2], parts(l, 0), qkv_n_, hidden_, "qkv");
      if (w[3].numel()) L.qkv_bias = float_vector(w[3], qkv_n_, "qkv bias");
      L.o = proj(w[4], w[5], parts(l, 1), hidden_, q_size, "o");
      L.ln2 = float_vector(w[6], hidden_, "ln2");
      L.gate_up = proj(w[7], w[8], parts(l, 2), 2 * inter_, hidden_, "gate_up");
      L.down = proj(w[9], w[10], parts(l, 3), hidden_, inter_, "down");
      if (has_int8_) {
        const torch::Tensor* t = int8.data() + l * kInt8TensorsPerLayer;
        const float* bias = L.qkv_bias.defined() ? L.qkv_bias.data_ptr<float>() : nullptr;
        L.qkv8 = int8_weight(t, qkv_n_, hidden_, bias, "qkv");
        L.o8 = int8_weight(t + 3, hidden_, q_size, nullptr, "o");
        L.gate_up8 = int8_weight(t + 6, 2 * inter_, hidden_, nullptr, "gate_up");
        L.down8 = int8_weight(t + 9, hidden_, inter_, nullptr, "down");
      }
      for (const torch::Tensor* c : {&k_caches[l], &v_caches[l]}) {
        TORCH_CHECK(c->is_contiguous() && c->sizes() == kc0.sizes() &&
                    c->scalar_type() == cache_dtype_, "q4_decode: caches alike and contiguous");
      }
      L.k_cache = k_caches[l];
      L.v_cache = v_caches[l];
      layers_.push_back(std::move(L));
    }
    TORCH_CHECK(cos.dim() == 2 && cos.size(1) == hd_ && sin.sizes() == cos.sizes(),
                "q4_decode: rotary tables");
    cos_ = cos.to(at::kFloat).contiguous();
    sin_ = sin.to(at::kFloat).contiguous();
  }

  // LoRA slots of every layer's qkv, o, gate_up, down, in that order (8 tensors a layer:
  // A, B of each), the rank R of each part; steps then take a row_slots vector.
  void set_lora(const std::vector<torch::Tensor>& ab, int64_t rank) {
    TORCH_CHECK(ab.size() == layers_.size() * 8, "q4_decode: 8 LoRA tensors per layer");
    TORCH_CHECK(rank >= 1, "q4_decode: LoRA rank");
    const int64_t q_size = heads_ * hd_;
    const int64_t ks[4] = {hidden_, q_size, hidden_, inter_};
    const int64_t ns[4] = {qkv_n_, hidden_, 2 * inter_, hidden_};
    const int64_t ps[4] = {3, 1, 2, 1};
    for (size_t l = 0; l < layers_.size(); ++l) {
      surge::LoraPair* pairs[4] = {&layers_[l].lqkv, &layers_[l].lo, &layers_[l].lgate_up,
                            &layers_[l].ldown};
      for (int i = 0; i < 4; ++i) {
        const torch::Tensor& a = ab[l * 8 + 2 * i];
        const torch::Tensor& b = ab[l * 8 + 2 * i + 1];
        const int64_t W = ps[i] * rank;
        TORCH_CHECK(a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat &&
                    a.is_contiguous() && b.is_contiguous(), "q4_decode: LoRA float32, contiguous");
        TORCH_CHECK(a.dim() == 3 && a.size(1) == W && a.size(2) == ks[i] && b.dim() == 3 &&
                    b.size(0) == a.size(0) && b.size(1) == W && b.size(2) == ns[i],
                    "q4_decode: LoRA shapes");
        *pairs[i] = surge::LoraPair{a, b, ks[i], ns[i], W};
      }
    }
    lora_rank_ = rank;
    lora_slots_ = ab[0].size(0);
  }

  // x [M, hidden] (embedded tokens), positions / slot_mapping / seq_lens [M] int64,
  // block_tables [M, max_blocks] int64, row_slots [M] int64 (each row's LoRA slot, -1: none) or
  // empty -> the residual stream after the last layer, float32. num_decodes: the rows before it
  // are decodes, the rows from it prefill chunks' tokens (a request's rows consecutive, with
  // one block table), which attend in tiles where the CPU and cache allow
  // (prefill_attention.h); -1: every row is attended alone.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& positions,
                        const torch::Tensor& slot_mapping, const torch::Tensor& block_tables,
                        const torch::Tensor& seq_lens, const torch::Tensor& row_slots,
                        int64_t num_decodes) {
    const int64_t M = x.size(0);
    TORCH_CHECK(x.dim() == 2 && x.size(1) == hidden_, "q4_decode: x shape");
    TORCH_CHECK(M >= 1 && M <= max_rows(), "q4_decode: 1 to ", max_rows(), " rows");
    for (const torch::Tensor* t : {&positions, &slot_mapping, &seq_lens})
      TORCH_CHECK(t->dim() == 1 && t->size(0) == M && t->scalar_type() == at::kLong &&
                  t->is_contiguous(), "q4_decode: per-row int64 vectors");
    TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == M &&
                block_tables.scalar_type() == at::kLong && block_tables.is_contiguous(),
                "q4_decode: block tables");
    const torch::Tensor& kc = layers_[0].k_cache;
    const int64_t num_blocks = kc.size(1), bs = kc.size(2), slots = num_blocks * bs;
    const int64_t max_blocks = block_tables.size(1);
    const int64_t* pos = positions.data_ptr<int64_t>();
    const int64_t* slot = slot_mapping.data_ptr<int64_t>();
    const int64_t* lens = seq_lens.data_ptr<int64_t>();
    const int64_t* tables = block_tables.data_ptr<int64_t>();
    int64_t max_len = 1;
    for (int64_t m = 0; m < M; ++m) {
      // Checked here: nothing may throw inside the parallel region.
      TORCH_CHECK(pos[m] >= 0 && pos[m] < cos_.size(0), "q4_decode: position out of range");
      TORCH_CHECK(slot[m] >= 0 && slot[m] < slots, "q4_decode: slot out of range");
      TORCH_CHECK(lens[m] >= 1 && lens[m] <= max_blocks * bs, "q4_decode: length out of range");
      for (int64_t b = 0; b < (lens[m] + bs - 1) / bs; ++b) {
        const int64_t blk = tables[m * max_blocks + b];
        TORCH_CHECK(blk >= 0 && blk < num_blocks, "q4_decode: block out of range");
      }
      max_len = std::max(max_len, lens[m]);
    }
    TORCH_CHECK(num_decodes >= -1 && num_decodes <= M, "q4_decode: num_decodes");
    plan_runs(num_decodes < 0 ? M : num_decodes, M, lens, tables, max_blocks);
    const int64_t* lora = nullptr;
    if (row_slots.numel()) {
      TORCH_CHECK(row_slots.dim() == 1 && row_slots.size(0) == M &&
                  row_slots.scalar_type() == at::kLong && row_slots.is_contiguous(),
                  "q4_decode: row_slots");
      const int64_t* rs = row_slots.data_ptr<int64_t>();
      for (int64_t m = 0; m < M; ++m) {
        TORCH_CHECK(rs[m] >= -1 && rs[m] < lora_slots_, "q4_decode: LoRA slot out of range");
        if (rs[m] >= 0) lora = rs;
      }
      lora_t_.resize(M * 3 * lora_rank_);
    }
    torch::Tensor out = x.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true).contiguous();
    norm_.resize(M * hidden_);
    qkv_.resize(M * qkv_n_);
    attn_.resize(M * heads_ * hd_);
    gu_.resize(M * 2 * inter_);
    act_.resize(M * inter_);
    surge::w8a8::resize(x8_hidden_, M, hidden_);
    surge::w8a8::resize(x8_attn_, M, heads_ * hd_);
    surge::w8a8::resize(x8_inter_, M, inter_);
    if (M <= q4_max_rows_) {
      resize(xq_hidden_, M, hidden_);
      resize(xq_attn_, M, heads_ * hd_);
      resize(xq_inter_, M, inter_);
      if (has_gguf_) {
        surge::gguf::resize(xg_hidden_, M, hidden_);
        surge::gguf::resize(xg_attn_, M, heads_ * hd_);
        surge::gguf::resize(xg_inter_, M, inter_);
      }
    }
    Step s{M, bs, slots, max_blocks, (max_len + 15) & ~int64_t(15), pos, slot, lens, tables,
           out.data_ptr<float>(), lora};
    switch (cache_dtype_) {
      case at::kFloat: hd_ == 64 ? run<float, 64>(s) : run<float, 128>(s); break;
      case at::kBFloat16: hd_ == 64 ? run<at::BFloat16, 64>(s) : run<at::BFloat16, 128>(s); break;
      case at::kChar: hd_ == 64 ? run<int8_t, 64>(s) : run<int8_t, 128>(s); break;
      default: hd_ == 64 ? run<at::Half, 64>(s) : run<at::Half, 128>(s); break;
    }
    return out;
  }

  // Seconds thread 0 spent in each phase (up to and including the barrier that ends it, so the
  // slowest thread's time) since the last call, summed over layers and steps; then reset.
  // "attention_pack": the decode rows' attention and the packing of the prefill rows' keys
  // and values (0 when no row attends in tiles); "attention": the rest of the attention.
  std::vector<std::pair<std::string, double>> phase_seconds() {
    static const char* names[] = {"norm1", "qkv", "rope", "attention_pack", "attention", "quant_attn", "o", "norm2", "gate_up", "silu", "down"};
    std::vector<std::pair<std::string, double>> r;
    for (int i = 0; i < kPhases; ++i) r.emplace_back(names[i], phase_s_[i]);
    phase_s_.fill(0.0);
    return r;
  }

  // Whether this build attends prefill rows in tiles (AVX-512 or AVX2, on a bf16 cache).
  bool tiled_prefill() const {
#ifdef SURGE_HAS_TILED_PREFILL
    return cache_dtype_ == at::kBFloat16;
#else
    return false;
#endif
  }

  // The most rows a step may have: past q4_max_rows only with the int8 copies.
  int64_t max_rows() const { return has_int8_ ? kMaxStackRows : q4_max_rows_; }

 private:
  static constexpr int64_t kMaxStackRows = 1024;
  static constexpr int64_t kSplitRows = 8;  // 4-bit path: per-row phases split from here
  using Clock = std::chrono::steady_clock;
  enum Phase { kPhaseNorm1, kPhaseQkv, kPhaseRope, kPhaseAttnPack, kPhaseAttention, kPhaseQuantAttn, kPhaseO, kPhaseNorm2, kPhaseGateUp, kPhaseSilu, kPhaseDown, kPhases };

  // Adds the time since `t` to phase p and moves `t` on (thread 0 only).
  void mark(Phase p, Clock::time_point& t) {
    const Clock::time_point now = Clock::now();
    phase_s_[p] += std::chrono::duration<double>(now - t).count();
    t = now;
  }

  struct Step {
    int64_t M, bs, slots, max_blocks, padded_len;
    const int64_t *pos, *slot, *lens, *tables;
    float* x;  // [M, hidden], the residual stream
    const int64_t* lora;  // each row's LoRA slot (-1: none), or null: no adapter in the step
  };

  // A request's prefill rows in a step: rows [row0, row0 + rows), one block table (row0's),
  // row r seeing its first lens[r] keys, `keys` the most of them; groups of 16 keys packed at
  // kv_off (K) and kv_off + groups * words (V) of each KV head's share of packed_.
  struct Run {
    int64_t row0, rows, keys, groups, kv_off;
  };
  // A unit of the tiled attention: rows [r0, r1) of run `run` against KV head `kvh`.
  struct Tile {
    int64_t run, kvh, r0, r1;
  };
  // A unit of the packing: groups [g0, g1) of run `run`'s keys and values for KV head `kvh`.
  // Split finer than (run, KV head) so that one request's 3 KV heads still share out evenly
  // over the threads (a cached prefix's step is mostly packing).
  struct Pack {
    int64_t run, kvh, g0, g1;
  };
  static constexpr int64_t kPackGroups = 8;

  // The runs of rows [first, M) (consecutive rows with the same block table) and their tiles,
  // the longest rows first (they cost most: the dynamic schedule then ends level).
  void plan_runs(int64_t first, int64_t M, const int64_t* lens, const int64_t* tables,
                 int64_t max_blocks) {
    runs_.clear();
    tiles_.clear();
    packs_.clear();
    tiled_from_ = M;
    if (!tiled_prefill() || first >= M) return;
    tiled_from_ = first;
#ifdef SURGE_HAS_TILED_PREFILL
#ifdef SURGE_HAS_AMX_ATTENTION
    // The engine for this step's tiles, read once: the packing and the tiles' sizes follow it.
    amx_attention_ = surge::prefill::g_amx_attention.load(std::memory_order_relaxed);
#endif
    const int64_t words = hd_ == 64 ? surge::prefill::kGroupWords<64> : surge::prefill::kGroupWords<128>;
    int64_t off = 0;
    for (int64_t m = first; m < M;) {
      int64_t end = m + 1, len = lens[m];
      while (end < M && std::equal(tables + end * max_blocks, tables + (end + 1) * max_blocks,
                                   tables + m * max_blocks)) {
        len = std::max(len, lens[end]);
        ++end;
      }
      int64_t groups = (len + surge::prefill::kKeys - 1) / surge::prefill::kKeys;
      if (amx_attention_) groups = surge::prefill::amx_groups(groups);  // the extra one zero
      for (int64_t h = 0; h < kv_heads_; ++h)
        for (int64_t g = 0; g < groups; g += kPackGroups)
          packs_.push_back(Pack{static_cast<int64_t>(runs_.size()), h, g,
                                std::min(groups, g + kPackGroups)});
      runs_.push_back(Run{m, end - m, len, groups, off});
      off += 2 * groups * words;
      m = end;
    }
    packed_.resize(off * kv_heads_);
    packed_head_stride_ = off;
    // Rows per tile: about 24 query vectors (three batches of 8 scored at once); on AMX, 48
    // (three A tiles of 16).
    const int64_t group = heads_ / kv_heads_;
    const int64_t rows_per_tile = amx_attention_ ? surge::prefill::amx_rows_per_tile(group)
                                                 : std::max<int64_t>(1, 24 / group);
    for (int64_t i = static_cast<int64_t>(runs_.size()) - 1; i >= 0; --i) {
      const Run& r = runs_[i];
      for (int64_t e = r.rows; e > 0; e -= rows_per_tile)
        for (int64_t h = 0; h < kv_heads_; ++h)
          tiles_.push_back(Tile{i, h, std::max<int64_t>(0, e - rows_per_tile), e});
    }
#endif
  }

#ifdef SURGE_HAS_TILED_PREFILL
  // The prefill rows' attention for one layer: pack every run's keys and values per KV head,
  // then the tiles, dynamically scheduled (each thread's share of the work, whatever its
  // rows' lengths). Called by every thread of the region; ends at a barrier.
  template <int HD>
  void attend_runs(const Layer& L, const Step& s, int64_t q_size, float scale, int tid,
                   Clock::time_point& t) {
    using surge::prefill::kGroupWords;
    const int64_t group = heads_ / kv_heads_;
    const auto* kc = reinterpret_cast<const uint16_t*>(L.k_cache.data_ptr<at::BFloat16>());
    const auto* vc = reinterpret_cast<const uint16_t*>(L.v_cache.data_ptr<at::BFloat16>());
    const int64_t head_stride = L.k_cache.size(1) * s.bs * HD;
    const int64_t n_packs = static_cast<int64_t>(packs_.size());
#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < n_packs; ++u) {
      const Pack& pk = packs_[u];
      const Run& r = runs_[pk.run];
      const int64_t h = pk.kvh;
      const int64_t* table = s.tables + r.row0 * s.max_blocks;
      uint32_t* kp = packed_.data() + h * packed_head_stride_ + r.kv_off;
      uint32_t* vp = kp + r.groups * kGroupWords<HD>;
      for (int64_t g = pk.g0; g < pk.g1; ++g) {
        const int64_t t0 = g * surge::prefill::kKeys;
        surge::prefill::pack_group<HD>(kc + h * head_stride, vc + h * head_stride, table, s.bs,
                                       t0, std::min(surge::prefill::kKeys, r.keys - t0),
                                       kp + g * kGroupWords<HD>, vp + g * kGroupWords<HD>);
      }
    }  // implicit barrier: every run packed before any tile reads it
    if (tid == 0) mark(kPhaseAttnPack, t);
    thread_local surge::prefill::TileScratch scratch;
    const int64_t n_tiles = static_cast<int64_t>(tiles_.size());
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n_tiles; ++i) {
      const Tile& t = tiles_[i];
      const Run& r = runs_[t.run];
      const uint32_t* kp = packed_.data() + t.kvh * packed_head_stride_ + r.kv_off;
      const uint32_t* vp = kp + r.groups * kGroupWords<HD>;
      const int64_t m0 = r.row0 + t.r0, h0 = t.kvh * group;
      const float* q = qkv_.data() + m0 * qkv_n_ + h0 * HD;
      float* o = attn_.data() + m0 * q_size + h0 * HD;
#ifdef SURGE_HAS_AMX_ATTENTION
      if (amx_attention_ == 1) {
        surge::prefill::attend_tile_amx<surge::amx::HwTiles, HD>(
            q, qkv_n_, s.lens + m0, t.r1 - t.r0, group, kp, vp, scale, scratch, o, q_size);
        continue;
      }
      if (amx_attention_ == 2) {
        surge::prefill::attend_tile_amx<surge::amx::EmuTiles, HD>(
            q, qkv_n_, s.lens + m0, t.r1 - t.r0, group, kp, vp, scale, scratch, o, q_size);
        continue;
      }
#endif
      surge::prefill::attend_tile<HD>(q, qkv_n_, s.lens + m0, t.r1 - t.r0, group, kp, vp, scale,
                                      scratch, o, q_size);
    }
  }
#else
  template <int HD>
  void attend_runs(const Layer&, const Step&, int64_t, float, int, Clock::time_point&) {}
#endif

  // The channels [n0, n1) of a projection of N that thread tid projects on the 4-bit path
  // (whole tiles of 16; the last thread also takes the rows after the last tile): `project`'s
  // share, and LoRA's second half on the same channels without a barrier between.
  static std::pair<int64_t, int64_t> channels(int64_t N, int tid, int nt) {
    const auto [b, e] = share(N / kTile, tid, nt);
    return {b * kTile, tid == nt - 1 ? N : e * kTile};
  }

  // Where thread i of nt starts in a GGUF stack of several types: at i / nt of its bytes (a
  // Q6_K row reads 1.46x a Q4_K row's bytes), rounded to a whole tile of 16 rows.
  static int64_t bytes_boundary(const Proj& p, int i, int nt) {
    if (i <= 0) return 0;
    if (i >= nt) return p.N;
    int64_t total = 0;
    for (const auto& seg : p.segs) total += seg.n * seg.row_bytes;
    const int64_t target = total * i / nt;
    int64_t acc = 0;
    for (const auto& seg : p.segs) {
      if (acc + seg.n * seg.row_bytes >= target) {
        const int64_t row = seg.n0 + (target - acc) / seg.row_bytes;
        return std::min(p.N, (row + kTile / 2) / kTile * kTile);
      }
      acc += seg.n * seg.row_bytes;
    }
    return p.N;
  }

  // The channels of projection p that thread tid projects (and adds LoRA's rows to): `channels`,
  // or for a GGUF stack of several types an equal share of its bytes.
  static std::pair<int64_t, int64_t> proj_channels(const Proj& p, int tid, int nt) {
    if (p.segs.size() < 2) return channels(p.N, tid, nt);
    return {bytes_boundary(p, tid, nt), bytes_boundary(p, tid + 1, nt)};
  }

  // Thread tid's share of a projection's output channels (proj_channels); ADD: added into
  // `out`. A GGUF projection reads xg, a 4-bit one xq.
  template <bool ADD>
  static void project(const Proj& p, const QuantizedX& xq, const surge::gguf::QuantizedX& xg,
                      const float* bias, int64_t M, float* out, int tid, int nt) {
    const auto [n0, n1] = proj_channels(p, tid, nt);
    if (p.gguf) surge::gguf::segments_range<ADD>(p.segs, xg, M, bias, n0, n1, p.N, out);
    else q4_range<ADD>(p.q4.q(), p.q4.d(), xq, M, bias, n0, n1, p.N, out);
  }

  // The activations for projection p from float32 rows x [M, K], rows [r0, r1) of them (each
  // thread its rows): u8 rows into `a` (int8 path), else GGUF's int8 blocks into `xg` for a
  // GGUF projection, 4-bit blocks into `xq` for a 4-bit one. Callers barrier after.
  static void quantize(const float* x, int64_t K, bool int8, const Proj& p, int64_t r0,
                       int64_t r1, surge::w8a8::QuantRows& a, QuantizedX& xq,
                       surge::gguf::QuantizedX& xg) {
    if (int8) surge::w8a8::quantize_rows_u8(x, r0, r1, K, a);
    else if (p.gguf) surge::gguf::quantize_rows(x, r0, r1, xg);
    else quantize_block_rows(x, r0, r1, xq);
  }

  // Thread tid's share of an int8 projection of `a`, in whole panels.
  template <bool ADD>
  static void project8(const Int8Weight& w, const surge::w8a8::QuantRows& a, float* out, int tid,
                       int nt) {
    const int64_t per = surge::w8a8::panel_blocks(a.M), blocks = w.w.blocks();
    const auto [b, e] = share((blocks + per - 1) / per, tid, nt);
    surge::w8a8::gemm_range(a, w.w, b * per, std::min(blocks, e * per),
                            surge::w8a8::Out<float, ADD>{out, w.w.N});
  }

  template <typename T, int HD>
  void run(const Step& s) {
    const int64_t M = s.M, H = hidden_, q_size = heads_ * HD, kv_size = kv_heads_ * HD;
    const int64_t group = heads_ / kv_heads_;
    const float scale = 1.f / std::sqrt(static_cast<float>(HD));
    const float* cos = cos_.data_ptr<float>();
    const float* sin = sin_.data_ptr<float>();
    float* x = s.x;
    const bool int8 = M > q4_max_rows_;
    const int nt = std::max(1, at::get_num_threads());
#pragma omp parallel num_threads(nt)
    {
      const int tid = omp_get_thread_num(), n = omp_get_num_threads();
      std::vector<float> scores(kChunk<HD> * s.padded_len);
      Clock::time_point t = Clock::now();  // thread 0's last phase boundary
      // LoRA's second half, on the channels this thread projected on the 4-bit path; the int8
      // path splits channels by panels, so there it waits for the projection to end first.
      auto lora_add = [&](const surge::LoraPair& p, const Proj& w,
                          std::initializer_list<int64_t> ends, float* out) {
        if (!s.lora) return;
        if (int8) {
#pragma omp barrier
        }
        const auto [n0, n1] = proj_channels(w, tid, n);
        surge::lora_up(p, ends, s.lora, M, out, n0, n1, lora_t_.data(), lora_rank_);
      };
      // LoRA's first half, A x of this thread's rows [r0, r1) of the projection's input.
      auto lora_in = [&](const surge::LoraPair& p, const float* in, int64_t r0, int64_t r1) {
        surge::lora_down(p, in, s.lora, r0, r1, lora_t_.data(), 3 * lora_rank_);
      };
      for (const Layer& L : layers_) {
        // Per-row phases (norms, activation quantization, rope, SiLU): by rows between the
        // threads on the int8 path or past a few rows, else on thread 0 (a split of a few rows
        // costs more than it saves).
        const auto [r0, r1] = int8 || M >= kSplitRows
                                  ? share(M, tid, n)
                                  : std::pair<int64_t, int64_t>{0, tid ? 0 : M};
        rms_norm(x + r0 * H, L.ln1.data_ptr<float>(), norm_.data() + r0 * H, r1 - r0, H, eps_);
        quantize(norm_.data(), H, int8, L.qkv, r0, r1, x8_hidden_, xq_hidden_, xg_hidden_);
        lora_in(L.lqkv, norm_.data(), r0, r1);
#pragma omp barrier
        if (tid == 0) mark(kPhaseNorm1, t);
        if (int8) {
          project8<false>(L.qkv8, x8_hidden_, qkv_.data(), tid, n);
        } else {
          const float* qkv_bias = L.qkv_bias.defined() ? L.qkv_bias.data_ptr<float>() : nullptr;
          project<false>(L.qkv, xq_hidden_, xg_hidden_, qkv_bias, M, qkv_.data(), tid, n);
        }
        lora_add(L.lqkv, L.qkv, {q_size, q_size + kv_size, qkv_n_}, qkv_.data());
#pragma omp barrier
        if (tid == 0) mark(kPhaseQkv, t);
        T* kc = L.k_cache.data_ptr<T>();
        T* vc = L.v_cache.data_ptr<T>();
        for (int64_t m = r0; m < r1; ++m) {
          float* row = qkv_.data() + m * qkv_n_;
          const float* c = cos + s.pos[m] * HD;
          const float* sn = sin + s.pos[m] * HD;
          for (int64_t h = 0; h < heads_ + kv_heads_; ++h) rope(row + h * HD, c, sn, HD);
          for (int64_t h = 0; h < kv_heads_; ++h) {
            const int64_t dst = (h * s.slots + s.slot[m]) * surge::kRowStride<T, HD>;
            const float* k = row + q_size + h * HD;
            const float* v = row + q_size + kv_size + h * HD;
            if constexpr (std::is_same_v<T, int8_t>) {
              surge::quantize_kv_row<HD>(k, kc + dst);
              surge::quantize_kv_row<HD>(v, vc + dst);
              continue;
            }
            for (int64_t i = 0; i < HD; ++i) {
              kc[dst + i] = static_cast<T>(k[i]);
              vc[dst + i] = static_cast<T>(v[i]);
            }
          }
        }
#pragma omp barrier
        if (tid == 0) mark(kPhaseRope, t);
        {
          // Units of work: with few rows one query head each (SmolLM2's 9 heads balance over
          // 2 threads where its 3 KV heads do not); with enough rows a KV head's whole group,
          // its K/V rows read once for all of the group's queries.
          // Rows from tiled_from_ on attend in tiles below (prefill chunks' rows, where the
          // CPU and cache dtype have the tiled kernel; else tiled_from_ is M).
          const int64_t alone = tiled_from_;
          const int64_t per = alone * kv_heads_ >= 4 * n ? group : 1;  // query heads per unit
          const int64_t units_per_row = heads_ / per;
          const auto [b, e] = share(alone * units_per_row, tid, n);
          const int64_t head_stride = L.k_cache.size(1) * s.bs * surge::kRowStride<T, HD>;
          for (int64_t u = b; u < e; ++u) {
            const int64_t m = u / units_per_row, h0 = (u % units_per_row) * per;
            const int64_t kvh = h0 / group;
            for (int64_t g0 = 0; g0 < per; g0 += kChunk<HD>) {
              const int64_t h = h0 + g0;
              attend_heads<T, HD>(std::min<int64_t>(kChunk<HD>, per - g0),
                                  qkv_.data() + m * qkv_n_ + h * HD, kc + kvh * head_stride,
                                  vc + kvh * head_stride, s.tables + m * s.max_blocks, s.bs,
                                  s.lens[m], scale, scores.data(),
                                  attn_.data() + m * q_size + h * HD);
            }
          }
          if (!runs_.empty()) attend_runs<HD>(L, s, q_size, scale, tid, t);
        }
#pragma omp barrier
        if (tid == 0) mark(kPhaseAttention, t);
        quantize(attn_.data(), q_size, int8, L.o, r0, r1, x8_attn_, xq_attn_, xg_attn_);
        lora_in(L.lo, attn_.data(), r0, r1);
#pragma omp barrier
        if (tid == 0) mark(kPhaseQuantAttn, t);
        if (int8) project8<true>(L.o8, x8_attn_, x, tid, n);
        else project<true>(L.o, xq_attn_, xg_attn_, nullptr, M, x, tid, n);
        lora_add(L.lo, L.o, {H}, x);
#pragma omp barrier
        if (tid == 0) mark(kPhaseO, t);
        rms_norm(x + r0 * H, L.ln2.data_ptr<float>(), norm_.data() + r0 * H, r1 - r0, H, eps_);
        quantize(norm_.data(), H, int8, L.gate_up, r0, r1, x8_hidden_, xq_hidden_, xg_hidden_);
        lora_in(L.lgate_up, norm_.data(), r0, r1);
#pragma omp barrier
        if (tid == 0) mark(kPhaseNorm2, t);
        if (int8) project8<false>(L.gate_up8, x8_hidden_, gu_.data(), tid, n);
        else project<false>(L.gate_up, xq_hidden_, xg_hidden_, nullptr, M, gu_.data(), tid, n);
        lora_add(L.lgate_up, L.gate_up, {inter_, 2 * inter_}, gu_.data());
#pragma omp barrier
        if (tid == 0) mark(kPhaseGateUp, t);
        silu_mul(gu_.data() + r0 * 2 * inter_, act_.data() + r0 * inter_, r1 - r0, inter_);
        quantize(act_.data(), inter_, int8, L.down, r0, r1, x8_inter_, xq_inter_, xg_inter_);
        lora_in(L.ldown, act_.data(), r0, r1);
#pragma omp barrier
        if (tid == 0) mark(kPhaseSilu, t);
        if (int8) project8<true>(L.down8, x8_inter_, x, tid, n);
        else project<true>(L.down, xq_inter_, xg_inter_, nullptr, M, x, tid, n);
        lora_add(L.ldown, L.down, {H}, x);
#pragma omp barrier
        if (tid == 0) mark(kPhaseDown, t);
      }
    }
  }

  int64_t heads_, kv_heads_, hd_ = 0, hidden_ = 0, qkv_n_ = 0, inter_ = 0;
  float eps_;
  int64_t q4_max_rows_;
  bool has_int8_ = false;
  bool has_gguf_ = false;  // some projection on GGUF blocks
  int64_t lora_rank_ = 0, lora_slots_ = 0;  // set_lora's
  std::vector<float> lora_t_;  // [M, 3 * rank]: A x of the projection at hand, per row
  std::array<double, kPhases> phase_s_{};
  at::ScalarType cache_dtype_ = at::kFloat;
  std::vector<Layer> layers_;
  torch::Tensor cos_, sin_;
  std::vector<float> norm_, qkv_, attn_, gu_, act_;  // step buffers, reused
  // The step's prefill runs and tiles (plan_runs), the rows from tiled_from_ on in them, and
  // their packed keys and values (each KV head's share packed_head_stride_ words).
  std::vector<Run> runs_;
  std::vector<Tile> tiles_;
  std::vector<Pack> packs_;
  int64_t tiled_from_ = 0;
  int amx_attention_ = 0;  // the step's engine for the tiles' products (prefill_attention_amx.h)
  std::vector<uint32_t> packed_;
  int64_t packed_head_stride_ = 0;
  // The activations the next 4-bit / int8 projection reads, by input width (sized before the
  // parallel region, so that threads fill their rows of them at once).
  QuantizedX xq_hidden_, xq_attn_, xq_inter_;
  surge::w8a8::QuantRows x8_hidden_, x8_attn_, x8_inter_;
  surge::gguf::QuantizedX xg_hidden_, xg_attn_, xg_inter_;  // for GGUF projections
};
#endif  // SURGE_TIER_AVX2

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("tier") = SURGE_TIER_NAME;  // the tier it was built for (cpu_features.h)
#ifdef SURGE_HAS_TILED_PREFILL  // prefill_attention.h: bf16 tiles with AVX-512 BF16, else float32 (AVX-512, AVX2)
  m.attr("tiled_prefill") = true;
#else
  m.attr("tiled_prefill") = false;
#endif
  // The int8 GEMM's engine for this module's stacks (amx_gemm.h; surge/models/amx.py sets it).
  m.def("amx_hardware_ok", &surge::w8a8::hardware_ok);
  m.def("set_amx", &surge::w8a8::set_amx);
  m.def("amx_calls", &surge::w8a8::amx_calls);
  // The prefill attention tiles' engine (prefill_attention_amx.h; surge/models/amx.py sets it).
#ifdef SURGE_HAS_AMX_ATTENTION
  m.attr("amx_attention_kernel") = true;  // built with the kernel (AVX-512 BF16 builds)
#else
  m.attr("amx_attention_kernel") = false;
#endif
  m.def("amx_attention_ok", &surge::prefill::amx_attention_ok);
  m.def("set_amx_attention", &surge::prefill::set_amx_attention);
  m.def("amx_attention_calls", [] {
#ifdef SURGE_HAS_AMX_ATTENTION
    return surge::prefill::g_amx_attention_calls.load();
#else
    return int64_t{0};
#endif
  });
#if SURGE_TIER >= SURGE_TIER_AVX2  // q4_gemv.h's vectorized GEMV
  m.attr("supported") = true;
  pybind11::class_<Q4DecodeStack>(m, "Q4DecodeStack")
      .def(pybind11::init<const std::vector<torch::Tensor>&, const std::vector<torch::Tensor>&,
                          const std::vector<torch::Tensor>&, const std::vector<torch::Tensor>&,
                          const torch::Tensor&, const torch::Tensor&, int64_t, int64_t, double,
                          int64_t, const std::vector<GgufParts>&>())
      .def("forward", &Q4DecodeStack::forward, pybind11::arg("x"), pybind11::arg("positions"),
           pybind11::arg("slot_mapping"), pybind11::arg("block_tables"),
           pybind11::arg("seq_lens"), pybind11::arg("row_slots"),
           pybind11::arg("num_decodes") = -1)
      .def_property_readonly("tiled_prefill", &Q4DecodeStack::tiled_prefill)
      .def("set_lora", &Q4DecodeStack::set_lora)
      .def_property_readonly("max_rows", &Q4DecodeStack::max_rows)
      .def("phase_seconds", &Q4DecodeStack::phase_seconds);
#else
  m.attr("supported") = false;  // needs AVX-512 VNNI or AVX2: the layer-by-layer path runs instead
#endif
}
