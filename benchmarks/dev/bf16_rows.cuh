// Helpers shared by the standalone bf16 softmax sweeps (softmax_sweep.cu,
// softmax_causal_sweep.cu): bf16 pairs in 32-bit words, and an all-reduce over a row's
// threads.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

__device__ __forceinline__ float lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ uint32_t pack(float a, float b) {
  __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&h);
}
__device__ __forceinline__ void unpack(uint4 r, float* f) {
  f[0] = lo(r.x); f[1] = hi(r.x); f[2] = lo(r.y); f[3] = hi(r.y);
  f[4] = lo(r.z); f[5] = hi(r.z); f[6] = lo(r.w); f[7] = hi(r.w);
}

// All-reduce over the TPR threads of a row; `buf` holds BLOCK / 32 floats (each call of a
// row its own buffer: one barrier per reduction).
template <int TPR, bool MAX>
__device__ __forceinline__ float row_reduce(float v, float* buf) {
  auto op = [](float a, float b) { return MAX ? fmaxf(a, b) : a + b; };
  constexpr int W = TPR < 32 ? TPR : 32;
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  if constexpr (TPR > 32) {
    const int warp = threadIdx.x / 32, first = warp / (TPR / 32) * (TPR / 32);
    if (threadIdx.x % 32 == 0) buf[warp] = v;
    __syncthreads();
    v = buf[first];
#pragma unroll
    for (int i = 1; i < TPR / 32; ++i) v = op(v, buf[first + i]);
  }
  return v;
}
