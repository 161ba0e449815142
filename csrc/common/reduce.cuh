// Row reductions for the norm and softmax kernels, built on CUB.
#pragma once
#include <cub/block/block_reduce.cuh>
#include <cub/warp/warp_reduce.cuh>
#include <cuda/functional>

namespace fused {

// All-reduce across the 32 lanes of a warp with a binary op (a butterfly: every lane gets
// the same bits). F: any type __shfl_xor_sync moves (float, double).
template <typename F, typename Op>
__device__ __forceinline__ F warp_all(F v, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  return warp_all(v, ::cuda::std::plus<float>{});
}

__device__ __forceinline__ float warp_max(float v) {
  return warp_all(v, [](float a, float b) { return fmaxf(a, b); });
}

// Block-wide reduction whose result every thread receives. `Op` is a CUB/::cuda
// functor (::cuda::std::plus<float>{}, ::cuda::maximum<float>{}). Calls in sequence reuse
// the storage; the trailing __syncthreads makes that safe.
template <int BLOCK, typename Op>
__device__ __forceinline__ float block_all_reduce(float v, Op op) {
  using Reduce = cub::BlockReduce<float, BLOCK>;
  __shared__ typename Reduce::TempStorage storage;
  __shared__ float result;
  float r = Reduce(storage).Reduce(v, op);
  if (threadIdx.x == 0) result = r;
  __syncthreads();
  r = result;
  __syncthreads();
  return r;
}

template <int BLOCK>
__device__ __forceinline__ float block_sum(float v) {
  return block_all_reduce<BLOCK>(v, ::cuda::std::plus<float>{});
}

template <int BLOCK>
__device__ __forceinline__ float block_max(float v) {
  return block_all_reduce<BLOCK>(v, ::cuda::maximum<float>{});
}

}  // namespace fused
