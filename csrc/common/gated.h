// Gated activations (SwiGLU / GeGLU), shared by the standalone ops (cpu/gated.cpp,
// cuda/gated.cu) and the gated linear (cpu/matmul.cpp, cuda/matmul.cu):
//   y = act(gate) * up,  act = silu, gelu (erf) or gelu (tanh)
//   dgate = dy * up * act'(gate),  dup = dy * act(gate)
// Operands are 2-D row views [rows, cols]: unit column stride, any row stride (ld), so that
// gate and up may be the two halves of one [.., 2N] tensor (z.chunk(2, -1)) without a copy.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sum.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <string_view>
#include <tuple>

#include "common/checks.h"
#include "common/gelu_math.h"

namespace fused {

enum class GatedKind : int { kSilu = 0, kGelu = 1, kGeluTanh = 2 };

constexpr float kLog2e = 1.44269504088896340736f;

// silu(x) = x sigmoid(x) and its derivative sigmoid(x) (1 + x (1 - sigmoid(x))), in float
// (libdevice / libm accuracy) and double (the CPU kernels' float64 path).
FUSED_HD float silu_fwd(float x) { return x / (1.0f + expf(-x)); }
FUSED_HD float silu_grad(float x) {
  const float s = 1.0f / (1.0f + expf(-x));
  return s * (1.0f + x * (1.0f - s));
}
inline double silu_fwd(double x) { return x / (1.0 + std::exp(-x)); }
inline double silu_grad(double x) {
  const double s = 1.0 / (1.0 + std::exp(-x));
  return s * (1.0 + x * (1.0 - s));
}

// act(x) and act'(x) for a run-time kind, in float or double (CPU kernels).
template <typename A>
inline A gated_act(A x, GatedKind k) {
  if (k == GatedKind::kSilu) return silu_fwd(x);
  if (k == GatedKind::kGelu) return gelu_fwd<GeluKind::kNone>(x);
  return gelu_fwd<GeluKind::kTanh>(x);
}
template <typename A>
inline A gated_act_grad(A x, GatedKind k) {
  if (k == GatedKind::kSilu) return silu_grad(x);
  if (k == GatedKind::kGelu) return gelu_grad<GeluKind::kNone>(x);
  return gelu_grad<GeluKind::kTanh>(x);
}

#if defined(__CUDACC__)
// silu for 16-bit outputs: sigmoid through the special-function unit (ex2, rcp: ~2 ulp of
// float, invisible in 8 / 11 bits), as the GeLU forms of gelu_math.h. x << 0: 2^(...) is inf,
// the reciprocal 0, the result -0 (as torch's float form rounds it).
__device__ __forceinline__ float silu_sigmoid_fast(float x) {
  return rcp_approx(1.0f + exp2_approx(-x * kLog2e));
}

// What a kernel storing T calls: fast forms for 16-bit T, accurate ones for float.
template <typename T, GatedKind K>
__device__ __forceinline__ float gated_act_for(float x) {
  if constexpr (K == GatedKind::kSilu) {
    if constexpr (sizeof(T) == 2)
      return x * silu_sigmoid_fast(x);
    else
      return silu_fwd(x);
  } else {
    return gelu_fwd_for < T, K == GatedKind::kGelu ? GeluKind::kNone : GeluKind::kTanh > (x);
  }
}

// act(x) and act'(x) together (the backward needs both; silu shares its sigmoid).
template <typename T, GatedKind K>
__device__ __forceinline__ void gated_act_and_grad_for(float x, float& a, float& da) {
  if constexpr (K == GatedKind::kSilu) {
    const float s = sizeof(T) == 2 ? silu_sigmoid_fast(x) : 1.0f / (1.0f + expf(-x));
    a = x * s;
    da = fmaf(a, 1.0f - s, s);  // s (1 + x (1 - s))
  } else if constexpr (K == GatedKind::kGelu && sizeof(T) == 2) {
    // gelu' = Phi + x pdf cancels near its zero (x ~ -0.75, Phi ~ 0.23): the fast erfc's 2e-5
    // relative error left ~5e-6 there, times |dy up| in dgate (beyond fp16's 1e-5 + 1e-3 |ref|
    // once |dy up| > 2); libdevice erfcf (a few ulp of float) keeps dgate at 16-bit accuracy,
    // and the backward reads and writes 10 bytes an element, so it stays memory-bound.
    const float phi = 0.5f * erfcf(-x * kSqrt1_2);
    a = x * phi;
    da = phi + x * (kInvSqrt2Pi * exp2_approx(-x * x * kHalfLog2e));
  } else {
    constexpr GeluKind G = K == GatedKind::kGelu ? GeluKind::kNone : GeluKind::kTanh;
    a = gelu_fwd_for<T, G>(x);
    da = gelu_grad_for<T, G>(x);
  }
}
#endif  // __CUDACC__

// The `approximate` argument of geglu (as F.gelu's) as a GatedKind.
inline GatedKind parse_geglu_approximate(std::string_view s, const char* op) {
  if (s == "none") return GatedKind::kGelu;
  if (s == "tanh") return GatedKind::kGeluTanh;
  TORCH_CHECK(false, op, ": expected approximate to be 'none' or 'tanh', but got '", std::string(s),
              "'");
}

// The backend kernels over 2-D row views (gated_rows below): out = act(gate) * up;
// (dgate, dup) from dy. Every operand [rows, cols] with unit column stride; outputs may be
// views into a larger tensor (the gated linear's [M, 2N] dz). Defined in cpu/gated.cpp and
// cuda/gated.cu.
void gated_forward_cpu(GatedKind k, const at::Tensor& gate, const at::Tensor& up, at::Tensor& out);
void gated_backward_cpu(GatedKind k, const at::Tensor& dy, const at::Tensor& gate,
                        const at::Tensor& up, at::Tensor& dgate, at::Tensor& dup);
void gated_forward_cuda(GatedKind k, const at::Tensor& gate, const at::Tensor& up, at::Tensor& out);
void gated_backward_cuda(GatedKind k, const at::Tensor& dy, const at::Tensor& gate,
                         const at::Tensor& up, at::Tensor& dgate, at::Tensor& dup);

// t [..., cols] as a 2-D view [rows, cols] with unit column stride and one row stride, in
// place when its leading dims collapse to one uniformly strided dim (a contiguous tensor, a
// chunk of a wider last dim, an expanded row); otherwise a contiguous copy.
inline at::Tensor gated_rows(const at::Tensor& t) {
  const int64_t d = t.dim();
  const int64_t cols = t.size(d - 1);
  const int64_t rows = cols == 0 ? 0 : t.numel() / cols;
  bool ok = cols <= 1 || t.stride(d - 1) == 1;
  int64_t ld = cols, span = -1;
  for (int64_t i = d - 2; i >= 0 && ok; --i) {
    if (t.size(i) == 1) continue;
    if (span < 0) {
      ld = t.stride(i);
      span = ld * t.size(i);
    } else {
      ok = t.stride(i) == span;
      span *= t.size(i);
    }
  }
  if (!ok) return t.contiguous().view({rows, cols});
  return t.as_strided({rows, cols}, {ld, 1});
}

// Checks shared by both backends: floating gate and up of one shape, dtype and device.
inline void check_gated_args(const at::Tensor& gate, const at::Tensor& up, const char* op) {
  check_float(gate, op, "gate");
  check_same_dtype(gate, up, op, "gate", "up");
  check_same_device(gate, up, op, "gate", "up");
  check_same_shape(gate, up, op, "gate", "up");
  TORCH_CHECK(gate.dim() >= 1, op, ": expected gate and up to have at least 1 dimension, but got ",
              "scalars");
}

using GatedForwardRun = void (*)(GatedKind, const at::Tensor&, const at::Tensor&, at::Tensor&);
using GatedBackwardRun = void (*)(GatedKind, const at::Tensor&, const at::Tensor&,
                                  const at::Tensor&, at::Tensor&, at::Tensor&);

// The op entry points of one backend (RUN_FWD / RUN_BWD: its kernels above). Outputs are
// contiguous, of gate's shape (as torch's elementwise ops give for the chunked halves).
template <GatedForwardRun RUN>
at::Tensor gated_forward_entry(const at::Tensor& gate, const at::Tensor& up, GatedKind k,
                               const char* op) {
  check_gated_args(gate, up, op);
  at::Tensor out = at::empty(gate.sizes(), gate.options());
  if (out.numel() > 0) {
    at::Tensor o = out.view({-1, gate.size(-1)});
    RUN(k, gated_rows(gate), gated_rows(up), o);
  }
  return out;
}

template <GatedBackwardRun RUN>
std::tuple<at::Tensor, at::Tensor> gated_backward_entry(const at::Tensor& dy,
                                                        const at::Tensor& gate,
                                                        const at::Tensor& up, GatedKind k,
                                                        const char* op) {
  check_gated_args(gate, up, op);
  check_same_dtype(dy, gate, op, "grad_out", "gate");
  check_same_device(dy, gate, op, "grad_out", "gate");
  check_same_shape(dy, gate, op, "grad_out", "gate");
  at::Tensor dgate = at::empty(gate.sizes(), gate.options());
  at::Tensor dup = at::empty(gate.sizes(), gate.options());
  if (dgate.numel() > 0) {
    at::Tensor dg = dgate.view({-1, gate.size(-1)}), du = dup.view({-1, gate.size(-1)});
    RUN(k, gated_rows(dy), gated_rows(gate), gated_rows(up), dg, du);
  }
  return {dgate, dup};
}

// The gated linear's activation backward (linear_act_backward): dZ = [dgate, dup]
// [..., 2N] from grad_out [..., N] and preact [..., 2N], the kernel writing the two halves
// of one tensor (read in place); the bias gradient the column sums of dZ (torch's sum over
// rows, float32 accumulation (float64 for float64), deterministic) when bias_grad, else [0].
template <GatedBackwardRun RUN>
std::tuple<at::Tensor, at::Tensor> gated_linear_act_backward(const at::Tensor& grad_out,
                                                             const at::Tensor& preact, GatedKind k,
                                                             bool bias_grad) {
  const int64_t n = grad_out.size(-1);
  at::Tensor dz = at::empty(preact.sizes(), preact.options());
  // [rows, 2N]; a view of -1 rows is ambiguous when N is 0.
  at::Tensor dz2 = dz.view({n == 0 ? 0 : dz.numel() / (2 * n), 2 * n});
  if (dz.numel() > 0) {
    const at::Tensor z2 = gated_rows(preact);
    at::Tensor dg = dz2.narrow(1, 0, n), du = dz2.narrow(1, n, n);
    RUN(k, gated_rows(grad_out), z2.narrow(1, 0, n), z2.narrow(1, n, n), dg, du);
  }
  const auto acc = dz.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor db =
      bias_grad ? dz2.sum(0, false, acc).to(dz.scalar_type()) : at::empty({0}, dz.options());
  return {dz, db};
}

template <GatedForwardRun RUN>
at::Tensor swiglu_entry(const at::Tensor& gate, const at::Tensor& up) {
  return gated_forward_entry<RUN>(gate, up, GatedKind::kSilu, "fused::swiglu");
}
template <GatedBackwardRun RUN>
std::tuple<at::Tensor, at::Tensor> swiglu_backward_entry(const at::Tensor& dy,
                                                         const at::Tensor& gate,
                                                         const at::Tensor& up) {
  return gated_backward_entry<RUN>(dy, gate, up, GatedKind::kSilu, "fused::swiglu_backward");
}
template <GatedForwardRun RUN>
at::Tensor geglu_entry(const at::Tensor& gate, const at::Tensor& up, c10::string_view approximate) {
  const char* op = "fused::geglu";
  const GatedKind k = parse_geglu_approximate({approximate.data(), approximate.size()}, op);
  return gated_forward_entry<RUN>(gate, up, k, op);
}
template <GatedBackwardRun RUN>
std::tuple<at::Tensor, at::Tensor> geglu_backward_entry(const at::Tensor& dy,
                                                        const at::Tensor& gate,
                                                        const at::Tensor& up,
                                                        c10::string_view approximate) {
  const char* op = "fused::geglu_backward";
  const GatedKind k = parse_geglu_approximate({approximate.data(), approximate.size()}, op);
  return gated_backward_entry<RUN>(dy, gate, up, k, op);
}

// Registers the four gated ops of one backend.
#define FUSED_REGISTER_GATED_OPS(m, RUN_FWD, RUN_BWD)                    \
  do {                                                                   \
    m.impl("swiglu", &::fused::swiglu_entry<RUN_FWD>);                   \
    m.impl("swiglu_backward", &::fused::swiglu_backward_entry<RUN_BWD>); \
    m.impl("geglu", &::fused::geglu_entry<RUN_FWD>);                     \
    m.impl("geglu_backward", &::fused::geglu_backward_entry<RUN_BWD>);   \
  } while (0)

}  // namespace fused
