// Helpers shared by the compiled CPU linear kernels (int8_linear.cpp, q4_linear.cpp).
#pragma once
#include <torch/extension.h>
#include <cstdint>
#include <cstring>
#include <new>
#include <optional>
#include <type_traits>

namespace surge {

// Activation rows handled per pass over a weight row (the kernels' register blocking).
constexpr int64_t kMaxRows = 8;

inline void to_float(const float* s, float* d, int64_t n) { std::memcpy(d, s, n * sizeof(float)); }
inline void to_float(const at::BFloat16* s, float* d, int64_t n) {
  const uint16_t* u = reinterpret_cast<const uint16_t*>(s);
  uint32_t* o = reinterpret_cast<uint32_t*>(d);
  for (int64_t i = 0; i < n; ++i) o[i] = static_cast<uint32_t>(u[i]) << 16;
}
template <typename T>
inline void to_float(const T* s, float* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = static_cast<float>(s[i]);
}

// The bias as contiguous float32 (kept alive in `holder`), or nullptr without one.
inline const float* float_bias(const std::optional<torch::Tensor>& bias, torch::Tensor& holder) {
  if (!bias.has_value()) return nullptr;
  holder = bias->to(at::kFloat).contiguous();
  return holder.data_ptr<float>();
}

// For std::vector: storage on a 64-byte boundary (a cache line), so that rows whose length is
// a multiple of 64 bytes start on one and the kernels' 32-byte loads never straddle two lines
// (malloc promises 16 bytes: in a standalone copy of the 4-bit GEMV the buffer sat 48 bytes
// past a line and half its activation loads were split).
template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64)));
  }
  void deallocate(T* p, std::size_t) { ::operator delete(p, std::align_val_t(64)); }
  template <typename U>
  bool operator==(const CacheLineAllocator<U>&) const { return true; }
  template <typename U>
  bool operator!=(const CacheLineAllocator<U>&) const { return false; }
};

// f(std::integral_constant<int, R>{}) for R = rows in 1..kMaxRows: a compile-time row count.
template <typename F>
inline void with_rows(int64_t rows, F&& f) {
  switch (rows) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 7: f(std::integral_constant<int, 7>{}); break;
    case 8: f(std::integral_constant<int, 8>{}); break;
    default: TORCH_CHECK(false, "rows per pass must be 1..8, got ", rows);
  }
}

}  // namespace surge
