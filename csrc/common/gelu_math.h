// GeLU and its derivative, in float, for host and device: the CPU kernels, the CUDA
// elementwise kernels and the matmul epilogue all call these, so the three agree.
//   exact: gelu(x) = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))
//   tanh:  gelu(x) = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
#pragma once
#include <cmath>

#include "common/fast_math.cuh"

#if defined(__CUDACC__)
#define FUSED_HD __host__ __device__ __forceinline__
#else
#define FUSED_HD inline
#endif

namespace fused {

enum class GeluKind : int { kNone = 0, kTanh = 1 };

constexpr float kSqrt1_2 = 0.70710678118654752440f;      // 1/sqrt(2)
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;   // 1/sqrt(2 pi)
constexpr float kSqrt2OverPi = 0.79788456080286535588f;  // sqrt(2/pi)
constexpr float kGeluCoeff = 0.044715f;

// The exact form takes Phi(x) = erfc(-x / sqrt 2) / 2, not (1 + erf(x / sqrt 2)) / 2: for
// x << 0 the sum cancels (1 + erff(-3.5) keeps ~1 bit; 0 from x ~ -5.8 on), so float results
// were off by up to 100% of a tiny value there, ~1e-6 absolute once an operand multiplies it
// (the gated forms' up); erfcf keeps a few ulp in both tails.
template <GeluKind K>
FUSED_HD float gelu_fwd(float x) {
  if constexpr (K == GeluKind::kNone) {
    return 0.5f * x * erfcf(-x * kSqrt1_2);
  } else {
    // 0.5 (1 + tanh(u)) = sigmoid(2u): one exp, and no cancellation for negative x.
    float u = kSqrt2OverPi * (x + kGeluCoeff * x * x * x);
    return x / (1.0f + expf(-2.0f * u));
  }
}

// d gelu / dx
template <GeluKind K>
FUSED_HD float gelu_grad(float x) {
  if constexpr (K == GeluKind::kNone) {
    float cdf = 0.5f * erfcf(-x * kSqrt1_2);
    float pdf = kInvSqrt2Pi * expf(-0.5f * x * x);
    return cdf + x * pdf;
  } else {
    // With s = sigmoid(2u) = 0.5 (1 + tanh u):  1 - tanh^2 u = 4 s (1 - s).
    float x2 = x * x;
    float u = kSqrt2OverPi * (x + kGeluCoeff * x2 * x);
    float s = 1.0f / (1.0f + expf(-2.0f * u));
    float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * x2);
    return s + 2.0f * x * s * (1.0f - s) * du;
  }
}

#if defined(__CUDACC__)
// Fast forms for 16-bit outputs. A bf16/fp16 result carries 8/11 bits, so hardware
// exp/reciprocal (MUFU, ~2 ulp of float) lose nothing visible, and they cut the per-element
// instruction count enough that gelu on 16-bit data stays memory-bound (libdevice erff costs
// ~25 instructions per element; docs/design/gelu.md#tried-not-kept). exp2_approx / rcp_approx:
// common/fast_math.cuh.

constexpr float kHalfLog2e = 0.72134752044448170368f;  // log2(e) / 2
constexpr float kInv2Sqrt2 = 0.35355339059327376220f;  // 1 / (2 sqrt 2)

// 1 / d0 and 1 / d1 through one reciprocal (1/d0 = d1 / (d0 d1)): the paired GeLU forms of
// the GEMM epilogue, whose bound is the special-function unit (docs/design/matmul.md#design).
// The callers keep d0 d1 finite and above the flush-to-zero range, and NaN-free, so neither
// result depends on the other's input beyond rounding.
__device__ __forceinline__ void rcp_pair(float d0, float d1, float& inv0, float& inv1) {
  const float r = rcp_approx(d0 * d1);
  inv0 = r * d1;
  inv1 = r * d0;
}

// h(x) = 0.5 erfc(|x| / sqrt 2), so that Phi(x) = x < 0 ? h : 1 - h. Written as
// h = t 2^(Q(t) - x^2 log2(e) / 2) with t = 1 / (1 + |x| / (2 sqrt 2)): the classic erfc form
// erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z/2), with P a degree-5 minimax fit made for this
// library (benchmarks/fit_gelu_erfc.py) and log2(e) and the 1/2 folded into Q.
// Relative error of h below 2e-5 for every x (float32 arithmetic), so the tail x << 0 keeps
// its digits where 1 + erf(x) would cancel: about 1/25 of an fp16 ulp, 1/200 of a bf16 ulp.
__device__ __forceinline__ float phi_from_half_erfc(float x, float h) {
  return x < 0.0f ? h : 1.0f - h;
}

// half_erfc_fast given t = 1 / (1 + |x| / (2 sqrt 2)) (the reciprocal is the caller's: the
// paired form below shares one between two elements).
__device__ __forceinline__ float half_erfc_from_t(float x, float t) {
  float q = 0.330073649f;
  q = fmaf(q, t, -1.02314228f);
  q = fmaf(q, t, 0.684542718f);
  q = fmaf(q, t, 0.36708897f);
  q = fmaf(q, t, 1.46868115f);
  q = fmaf(q, t, -2.82723324f);
  return t * exp2_approx(fmaf(-x * x, kHalfLog2e, q));
}

__device__ __forceinline__ float half_erfc_fast(float x) {
  return half_erfc_from_t(x, rcp_approx(fmaf(fabsf(x), kInv2Sqrt2, 1.0f)));
}

// The erf GeLU for two elements at once, for the GEMM epilogue (docs/design/matmul.md#design): one
// reciprocal for the pair, 1.5 MUFU an element instead of 2. |x| is clamped to 64 inside
// a = 1 + |x| / (2 sqrt 2): h has underflowed to 0 long before (2^(-x^2 log2(e) / 2)), a0 a1
// stays below 600, and a NaN x (fminf gives 64) stays out of its partner's reciprocal.
__device__ __forceinline__ void gelu_erf_fast_pair(float& x0, float& x1) {
  float t0, t1;
  rcp_pair(fmaf(fminf(fabsf(x0), 64.0f), kInv2Sqrt2, 1.0f),
           fmaf(fminf(fabsf(x1), 64.0f), kInv2Sqrt2, 1.0f), t0, t1);
  x0 = x0 * phi_from_half_erfc(x0, half_erfc_from_t(x0, t0));
  x1 = x1 * phi_from_half_erfc(x1, half_erfc_from_t(x1, t1));
}

// The tanh form's constants: 2^(x (kTanhE0 + kTanhE1 x^2)) = exp(-2u), u = sqrt(2/pi) (x +
// 0.044715 x^3); 2 du/dx = kTanhD0 + kTanhD1 x^2.
constexpr float kTanhE0 = -2.0f * kSqrt2OverPi * 1.44269504088896340736f;
constexpr float kTanhE1 = kTanhE0 * kGeluCoeff;
constexpr float kTanhD0 = 2.0f * kSqrt2OverPi;
constexpr float kTanhD1 = kTanhD0 * 3.0f * kGeluCoeff;

// sigmoid(2u) = 1 / (1 + 2^(x (kTanhE0 + kTanhE1 x^2))) (x2 = x^2): 3 multiply-adds, ex2,
// add, rcp. The constants are folded by hand (nvcc keeps the source's order of float
// operations), and ex2 / rcp are the .ftz forms, whose non-ftz library forms wrap each MUFU
// in range fix-ups: ~9 instructions an element for the forward instead of ~20, leaving the
// two MUFU as the bound. x << 0: 2^(...) overflows to inf and s is 0.
__device__ __forceinline__ float tanh_sigmoid_2u(float x, float x2) {
  return rcp_approx(1.0f + exp2_approx(x * fmaf(x2, kTanhE1, kTanhE0)));
}

// The tanh form for two elements at once, for the GEMM epilogue, where the special-function
// unit bounds the epilogue (docs/design/matmul.md#design): 1.5 MUFU an element instead of 2, by one
// reciprocal shared between the pair (1/d0 = d1 / (d0 d1)). With t = x (kTanhE0 + kTanhE1 x^2)
// (= -2u log2 e) and e = 2^-|t| in (0, 1]: sigmoid(2u) = 1 / (1 + 2^t) = (t > 0 ? e : 1) / d,
// d = 1 + e in (1, 2], so d0 d1 lies in (1, 4]: no overflow, no flushed reciprocal, and the
// negative tail keeps its digits (e carries them, d ~ 1). A NaN x makes its own e NaN;
// fminf turns that into 1, so only its own output is NaN, never its partner's.
__device__ __forceinline__ void gelu_tanh_fast_pair(float& x0, float& x1) {
  const float t0 = x0 * fmaf(x0 * x0, kTanhE1, kTanhE0);
  const float t1 = x1 * fmaf(x1 * x1, kTanhE1, kTanhE0);
  const float e0 = fminf(exp2_approx(-fabsf(t0)), 1.0f);
  const float e1 = fminf(exp2_approx(-fabsf(t1)), 1.0f);
  float inv0, inv1;
  rcp_pair(1.0f + e0, 1.0f + e1, inv0, inv1);
  x0 = x0 * (t0 > 0.0f ? e0 : 1.0f) * inv0;
  x1 = x1 * (t1 > 0.0f ? e1 : 1.0f) * inv1;
}

template <GeluKind K>
__device__ __forceinline__ float gelu_fwd_fast(float x) {
  if constexpr (K == GeluKind::kNone) {
    return x * phi_from_half_erfc(x, half_erfc_fast(x));
  } else {
    // x sigmoid(2u); x << 0 gives -0, as torch's float tanh form rounds it.
    return x * tanh_sigmoid_2u(x, x * x);
  }
}

template <GeluKind K>
__device__ __forceinline__ float gelu_grad_fast(float x) {
  if constexpr (K == GeluKind::kNone) {
    const float h = half_erfc_fast(x);
    const float pdf = kInvSqrt2Pi * exp2_approx(-x * x * kHalfLog2e);
    return phi_from_half_erfc(x, h) + x * pdf;
  } else {
    // s = sigmoid(2u) and 2 du/dx = kTanhD0 + kTanhD1 x^2: gelu' = s + x s (1 - s) 2 du/dx.
    const float x2 = x * x;
    const float s = tanh_sigmoid_2u(x, x2);
    return fmaf(x * s * (1.0f - s), fmaf(x2, kTanhD1, kTanhD0), s);
  }
}

// What a kernel storing T should call: fast forms for 16-bit T, accurate ones for float.
template <typename T, GeluKind K>
__device__ __forceinline__ float gelu_fwd_for(float x) {
  if constexpr (sizeof(T) == 2)
    return gelu_fwd_fast<K>(x);
  else
    return gelu_fwd<K>(x);
}

template <typename T, GeluKind K>
__device__ __forceinline__ float gelu_grad_for(float x) {
  if constexpr (sizeof(T) == 2)
    return gelu_grad_fast<K>(x);
  else
    return gelu_grad<K>(x);
}
#endif  // __CUDACC__

// float64 versions for the CPU kernels' double path (gradcheck needs double accuracy).
template <GeluKind K>
inline double gelu_fwd(double x) {
  if constexpr (K == GeluKind::kNone) {
    return 0.5 * x * (1.0 + std::erf(x * 0.70710678118654752440));
  } else {
    double u = 0.79788456080286535588 * (x + 0.044715 * x * x * x);
    return 0.5 * x * (1.0 + std::tanh(u));
  }
}

template <GeluKind K>
inline double gelu_grad(double x) {
  if constexpr (K == GeluKind::kNone) {
    double cdf = 0.5 * (1.0 + std::erf(x * 0.70710678118654752440));
    double pdf = 0.39894228040143267794 * std::exp(-0.5 * x * x);
    return cdf + x * pdf;
  } else {
    double x2 = x * x;
    double u = 0.79788456080286535588 * (x + 0.044715 * x2 * x);
    double t = std::tanh(u);
    double du = 0.79788456080286535588 * (1.0 + 3.0 * 0.044715 * x2);
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du;
  }
}

}  // namespace fused
