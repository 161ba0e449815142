// 2^x and 1/x on the special-function unit (MUFU, ~2 ulp of float; results below 2^-126
// flush to zero): for kernels whose 16-bit outputs (8 / 11 bits) cannot show the
// difference from libdevice, and which the libdevice forms would make instruction-bound
// (gelu, softmax; docs/design/gelu.md#tried-not-kept).
#pragma once

#if defined(__CUDACC__)
namespace fused {

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace fused
#endif
