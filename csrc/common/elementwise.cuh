// A memory-bound elementwise kernel: out[i] = f(in0[i], ..., in{N-1}[i]) in float.
// Each thread moves UNROLL 16-byte vectors per input (several loads in flight before the
// first use); the scalar instantiation (V = 1) serves pointers that are not 16-byte
// aligned. Indices are int64: tensors may exceed 2^31 elements.
#pragma once
#include <cstdint>

#include "common/launch.cuh"
#include "common/vec.cuh"

namespace fused {

template <typename T, int N>
struct Ptrs {
  const T* p[N];
};

template <typename T, int V, int UNROLL, int NIN, typename F>
__global__ void __launch_bounds__(128)
    elementwise_kernel(F f, T* __restrict__ out, Ptrs<T, NIN> in, int64_t n) {
  grid_dependency_wait();       // launched early (launch_early): nothing global before this
  const int64_t n_vec = n / V;  // whole vectors; the remainder (< V) is the tail
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * blockDim.x * UNROLL) + threadIdx.x;
  Vec<T, V> a[NIN][UNROLL];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    int64_t i = first + static_cast<int64_t>(u) * blockDim.x;
    if (i < n_vec) {
#pragma unroll
      for (int k = 0; k < NIN; ++k) a[k][u] = load_vec<T, V>(in.p[k] + i * V);
    }
  }
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    int64_t i = first + static_cast<int64_t>(u) * blockDim.x;
    if (i < n_vec) {
      Vec<T, V> r;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        if constexpr (NIN == 1) {
          r.v[j] = static_cast<T>(f(static_cast<float>(a[0][u].v[j])));
        } else {
          r.v[j] =
              static_cast<T>(f(static_cast<float>(a[0][u].v[j]), static_cast<float>(a[1][u].v[j])));
        }
      }
      store_vec<T, V>(out + i * V, r);
    }
  }
  if constexpr (V > 1) {
    // Tail: the last n % V elements, one per thread of the first block.
    if (blockIdx.x == 0 && threadIdx.x < n - n_vec * V) {
      int64_t i = n_vec * V + threadIdx.x;
      if constexpr (NIN == 1) {
        out[i] = static_cast<T>(f(static_cast<float>(in.p[0][i])));
      } else {
        out[i] = static_cast<T>(f(static_cast<float>(in.p[0][i]), static_cast<float>(in.p[1][i])));
      }
    }
  }
}

// Launches f over n elements of flat, equally laid out buffers on the current stream.
template <typename T, int NIN, typename F>
void launch_elementwise(F f, T* out, Ptrs<T, NIN> in, int64_t n) {
  if (n == 0) return;
  // 128 threads x 2 vectors per input: the best of an H200 sweep over 128-512 threads and
  // 1-8 vectors (98.6% of copy bandwidth for 1 input, 101.7% for 2; docs/design/gelu.md#design).
  constexpr int kThreads = 128;
  constexpr int kUnroll = 2;
  constexpr int V = kVecElems<T>;
  bool aligned = is_aligned(out);
  for (int k = 0; k < NIN; ++k) aligned = aligned && is_aligned(in.p[k]);
  if (aligned) {
    int64_t blocks = std::max<int64_t>(1, ceil_div(n / V, kThreads * kUnroll));
    launch_early(elementwise_kernel<T, V, kUnroll, NIN, F>, dim3(static_cast<unsigned>(blocks)),
                 dim3(kThreads), 0, f, out, in, n);
  } else {
    int64_t blocks = ceil_div(n, kThreads * kUnroll);
    launch_early(elementwise_kernel<T, 1, kUnroll, NIN, F>, dim3(static_cast<unsigned>(blocks)),
                 dim3(kThreads), 0, f, out, in, n);
  }
}

}  // namespace fused
