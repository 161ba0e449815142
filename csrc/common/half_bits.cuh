// 16-bit floats (c10::BFloat16 / c10::Half) as raw bits in 32-bit registers, converted with
// the hardware intrinsics. Kernels that keep a row in registers hold it as plain words:
// arrays of c10::Half / c10::BFloat16 members end up in local memory once elements are
// assigned one at a time, and c10's float -> bfloat16 is a software rounding.
#pragma once

#if defined(__CUDACC__)
#include <c10/util/BFloat16.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace fused {

// The float value of the 16-bit T in the low half of b (the high half must be zero).
template <typename T>
__device__ __forceinline__ float half_bits_to_float(uint32_t b) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    return __uint_as_float(b << 16);
  } else {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(b)));
  }
}

// The bits of f rounded to the 16-bit T (nearest even), in the low half.
template <typename T>
__device__ __forceinline__ uint32_t float_to_half_bits(float f) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
  } else {
    return __half_as_ushort(__float2half_rn(f));
  }
}

// Two floats rounded to the 16-bit T (nearest even) and packed, lo in the low half: one
// cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32 for the pair, where two float_to_half_bits and
// their merge take three or four instructions.
template <typename T>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    memcpy(&r, &h, 4);
  } else {
    const __half2 h = __floats2half2_rn(lo, hi);
    memcpy(&r, &h, 4);
  }
  return r;
}

}  // namespace fused
#endif
