// matmul / linear on CPU: the fallback and what CI exercises. The products go through
// at::matmul in float (double for float64), so half types accumulate in float as on the GPU;
// bias and activation are plain loops over the result. Checks and the op entry points are
// shared with the CUDA kernels (common/matmul.h).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/sum.h>
#include <torch/library.h>

#include "common/dispatch.h"
#include "common/matmul.h"

namespace fused {
namespace {

template <typename T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

at::ScalarType acc_dtype(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

template <typename A>
A apply_act(A z, LinearAct act) {
  if (act == LinearAct::kGelu) return gelu_fwd<GeluKind::kNone>(z);
  if (act == LinearAct::kGeluTanh) return gelu_fwd<GeluKind::kTanh>(z);
  return z;
}

template <typename A>
A act_grad(A z, LinearAct act) {
  return act == LinearAct::kGelu ? gelu_grad<GeluKind::kNone>(z) : gelu_grad<GeluKind::kTanh>(z);
}

at::Tensor matmul_cpu(const at::Tensor& a, const at::Tensor& b) {
  const auto acc = acc_dtype(a.scalar_type());
  return at::matmul(a.to(acc), b.to(acc)).to(a.scalar_type()).contiguous();
}

// Gated: z = x W^T + bias [..., 2N] rounded to x's dtype (as the GPU stores it), then the
// gated kernel over its two halves (read in place); returns (y [..., N], z when want_preact).
std::tuple<at::Tensor, at::Tensor> gated_linear_impl(const at::Tensor& x, const at::Tensor& w,
                                                     const std::optional<at::Tensor>& bias,
                                                     LinearAct act, bool want_preact) {
  const auto acc = acc_dtype(x.scalar_type());
  at::Tensor z = at::matmul(x.to(acc), w.to(acc).t());
  if (bias.has_value()) z.add_(bias->to(acc));
  z = z.to(x.scalar_type()).contiguous();
  const int64_t n = w.size(0) / 2;
  std::vector<int64_t> shape(z.sizes().begin(), z.sizes().end() - 1);
  shape.push_back(n);
  at::Tensor y = at::empty(shape, x.options());
  if (y.numel() > 0) {
    at::Tensor y2 = y.view({-1, n});
    const at::Tensor z2 = z.view({-1, 2 * n});
    gated_forward_cpu(gated_kind(act), z2.narrow(1, 0, n), z2.narrow(1, n, n), y2);
  }
  return {y, want_preact ? z : at::Tensor()};
}

// z = x W^T + bias in the accumulation type; returns (act(z), z) in x's dtype, the second
// only when want_preact.
std::tuple<at::Tensor, at::Tensor> linear_impl(const at::Tensor& x, const at::Tensor& w,
                                               const std::optional<at::Tensor>& bias, LinearAct act,
                                               bool want_preact) {
  const auto acc = acc_dtype(x.scalar_type());
  if (is_gated(act)) return gated_linear_impl(x, w, bias, act, want_preact);
  at::Tensor z = at::matmul(x.to(acc), w.to(acc).t()).contiguous();
  at::Tensor y = at::empty(z.sizes(), x.options());
  at::Tensor zo = want_preact ? at::empty(z.sizes(), x.options()) : at::Tensor();
  at::Tensor bc = bias.has_value() ? bias->to(acc).contiguous() : at::Tensor();
  const int64_t N = w.size(0);
  FUSED_DISPATCH_CPU(x.scalar_type(), "fused::linear", [&] {
    using A = acc_t<scalar_t>;
    const A* zp = z.const_data_ptr<A>();
    const A* bp = bc.defined() ? bc.const_data_ptr<A>() : nullptr;
    scalar_t* yp = y.mutable_data_ptr<scalar_t>();
    scalar_t* zop = want_preact ? zo.mutable_data_ptr<scalar_t>() : nullptr;
    at::parallel_for(0, z.numel(), 16384, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        A v = zp[i] + (bp ? bp[i % N] : A(0));
        if (zop) zop[i] = static_cast<scalar_t>(v);
        yp[i] = static_cast<scalar_t>(apply_act(v, act));
      }
    });
  });
  return {y, zo};
}

std::tuple<at::Tensor, at::Tensor> act_backward_cpu(const at::Tensor& grad_out,
                                                    const at::Tensor& preact, LinearAct act,
                                                    bool bias_grad) {
  if (is_gated(act))
    return gated_linear_act_backward<gated_backward_cpu>(grad_out, preact, gated_kind(act),
                                                         bias_grad);
  const at::Tensor z = preact.contiguous();
  const at::Tensor g = grad_out.contiguous();
  const int64_t N = z.size(-1);
  const int64_t M = N == 0 ? 0 : z.numel() / N;
  at::Tensor dz = at::empty_like(z);
  at::Tensor db = at::empty({bias_grad ? N : 0}, z.options());
  FUSED_DISPATCH_CPU(z.scalar_type(), "fused::linear_act_backward", [&] {
    using A = acc_t<scalar_t>;
    const scalar_t* zp = z.const_data_ptr<scalar_t>();
    const scalar_t* gp = g.const_data_ptr<scalar_t>();
    scalar_t* dzp = dz.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, z.numel(), 16384, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        dzp[i] =
            static_cast<scalar_t>(static_cast<A>(gp[i]) * act_grad(static_cast<A>(zp[i]), act));
      }
    });
    if (bias_grad) {
      // Column sums in a fixed order (deterministic), accumulated in A.
      scalar_t* dbp = db.mutable_data_ptr<scalar_t>();
      at::parallel_for(0, N, 64, [&](int64_t begin, int64_t end) {
        for (int64_t n = begin; n < end; ++n) {
          A s = 0;
          for (int64_t m = 0; m < M; ++m) {
            s += static_cast<A>(gp[m * N + n]) * act_grad(static_cast<A>(zp[m * N + n]), act);
          }
          dbp[n] = static_cast<scalar_t>(s);
        }
      });
    }
  });
  return {dz, db};
}

}  // namespace

TORCH_LIBRARY_IMPL(fused, CPU, m) {
  FUSED_REGISTER_MATMUL_OPS(m, matmul_cpu, linear_impl, act_backward_cpu);
}

}  // namespace fused
