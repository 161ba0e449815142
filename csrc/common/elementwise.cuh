// A memory-bound elementwise kernel: out[i] = f(in0[i], ..., in{N-1}[i]) in float.
// Each thread moves UNROLL 16-byte vectors per input (several loads in flight before the
// first use). The buffers are one flat array: where every pointer sits at the same offset in
// its 16-byte chunk (any offset: a view at an odd element), the first `head` (< V) elements
// up to the 16-byte grid and the last (n - head) % V are done one at a time, the rest as
// 16-byte vectors; the scalar instantiation (V = 1) serves pointers at different offsets.
// Indices are int64: tensors may exceed 2^31 elements.
#pragma once
#include <cstdint>

#include "common/launch.cuh"
#include "common/vec.cuh"

namespace fused {

template <typename T, int N>
struct Ptrs {
  const T* p[N];
  __host__ __device__ void shift(int64_t d) {
    for (int k = 0; k < N; ++k) p[k] += d;
  }
};

template <typename T, int V, int UNROLL, int NIN, typename F>
__global__ void __launch_bounds__(128)
    elementwise_kernel(F f, T* __restrict__ out, Ptrs<T, NIN> in, int64_t n, int head) {
  grid_dependency_wait();  // launched early (launch_early): nothing global before this
  // The body: whole vectors from element `head` on the 16-byte grid; the tail (< V) after.
  const int64_t n_vec = (n - head) / V;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * blockDim.x * UNROLL) + threadIdx.x;
  Vec<T, V> a[NIN][UNROLL];
  Ptrs<T, NIN> src = in;
  src.shift(head);  // the body's base: on the 16-byte grid
  T* const body = out + head;
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    int64_t i = first + static_cast<int64_t>(u) * blockDim.x;
    if (i < n_vec) {
#pragma unroll
      for (int k = 0; k < NIN; ++k) a[k][u] = load_vec<T, V>(src.p[k] + i * V);
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
      store_vec<T, V>(body + i * V, r);
    }
  }
  if constexpr (V > 1) {
    // The head (threads 0 .. head - 1 of the first block) and the tail, the last
    // (n - head) % V elements (its threads V ..), one element a thread (blocks >= 2V threads).
    const int t = threadIdx.x;
    const int64_t tail = n - head - n_vec * V;
    if (blockIdx.x == 0 && (t < head || (t >= V && t - V < tail))) {
      const int64_t i = t < head ? t : head + n_vec * V + (t - V);
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
  static_assert(kThreads >= 2 * V, "the head and tail threads of the first block");
  // Every pointer at the same offset in its 16-byte chunk (a whole number of elements): the
  // 16-byte body from the first element on the grid.
  const int phase = phase16(out);
  bool same = phase % static_cast<int>(sizeof(T)) == 0;
  for (int k = 0; k < NIN; ++k) same = same && phase16(in.p[k]) == phase;
  if (same) {
    const int head = static_cast<int>(std::min<int64_t>(n, (16 - phase) % 16 / sizeof(T)));
    int64_t blocks = std::max<int64_t>(1, ceil_div((n - head) / V, kThreads * kUnroll));
    launch_early(elementwise_kernel<T, V, kUnroll, NIN, F>, dim3(static_cast<unsigned>(blocks)),
                 dim3(kThreads), 0, f, out, in, n, head);
  } else {
    int64_t blocks = ceil_div(n, kThreads * kUnroll);
    launch_early(elementwise_kernel<T, 1, kUnroll, NIN, F>, dim3(static_cast<unsigned>(blocks)),
                 dim3(kThreads), 0, f, out, in, n, 0);
  }
}

}  // namespace fused
