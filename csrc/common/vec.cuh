// 16-byte vectors for memory-bound kernels: one LDG.128 / STG.128 per thread moves
// 4 floats or 8 halves. Use them only when every pointer involved is 16-byte aligned
// (can_vectorize); otherwise take the scalar path.
#pragma once
#include <cuda_runtime.h>
#include <cstdint>

namespace fused {

template <typename T>
constexpr int kVecElems = 16 / sizeof(T);

template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

template <typename T, int N = kVecElems<T>>
__device__ __forceinline__ Vec<T, N> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T, N>*>(p);
}

template <typename T, int N = kVecElems<T>>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, N>& v) {
  *reinterpret_cast<Vec<T, N>*>(p) = v;
}

// Streaming variants for data touched once (evict-first: keeps L2 for the rest).
template <typename T, int N = kVecElems<T>>
__device__ __forceinline__ Vec<T, N> load_vec_stream(const T* p) {
  static_assert(sizeof(Vec<T, N>) == 16, "streaming loads are 16-byte");
  int4 r = __ldcs(reinterpret_cast<const int4*>(p));
  return *reinterpret_cast<Vec<T, N>*>(&r);
}

template <typename T, int N = kVecElems<T>>
__device__ __forceinline__ void store_vec_stream(T* p, const Vec<T, N>& v) {
  static_assert(sizeof(Vec<T, N>) == 16, "streaming stores are 16-byte");
  __stcs(reinterpret_cast<int4*>(p), *reinterpret_cast<const int4*>(&v));
}

inline bool is_aligned(const void* p, int bytes = 16) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

// A pointer's offset in its 16-byte chunk. Kernels that read a row as the 16-byte vectors
// of its span (its start rounded down to the grid, its end up) need every tensor of the
// op at the same offset, so that a row's span is the same vectors in each.
inline int phase16(const void* p) {
  return static_cast<int>(reinterpret_cast<std::uintptr_t>(p) % 16);
}

}  // namespace fused
