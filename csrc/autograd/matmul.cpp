// Autograd of fused::matmul, fused::linear and fused::linear_fwd (see common.h for the
// scheme). Backward of y = act(x W^T + b), z = x W^T + b the pre-activation:
//   dZ = dY * act'(Z)    fused::linear_act_backward (one pass; with the bias gradient, the
//                        column sums of dZ in a fixed order: deterministic)
//   dX = dZ W            fused::matmul (W read in place)
//   dW = dZ^T X          fused::matmul (dZ^T is a transposed view, read in place)
// Gated activations (weight [2N, K], y = act(z[..., :N]) * z[..., N:]): the same with dZ =
// [dgate, dup] (the gated backward kernel, written into the two halves of one tensor).
// linear_fwd returns z beside y so training does not recompute it; linear (the inference
// op) recomputes z in its backward when it has an activation. The matmuls go through the
// dispatcher with autograd, so under create_graph they are differentiable as they stand.
#include <ATen/ops/cat.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/matmul.h>
#include <torch/library.h>

#include "autograd/common.h"
#include "autograd/gated.h"
#include "autograd/linear_act.h"
#include "autograd/ops.h"

namespace fused::autograd {
namespace {

// ---- matmul -------------------------------------------------------------------------------

// A batched gradient summed over the batch its operand broadcast over.
at::Tensor reduce_to_shape(const at::Tensor& g, at::IntArrayRef shape) {
  if (g.sizes() == shape) return g;
  if (shape.size() == 2) return g.sum(0);
  return g.sum(0, /*keepdim=*/true);
}

struct Matmul : torch::autograd::Function<Matmul> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b) {
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->save_for_backward({a, b});
    return matmul_op().call(a, b);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(2);
    const at::Tensor& g = grads[0];
    if (!g.defined()) return out;
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &a = saved[0], &b = saved[1];
    if (ctx->needs_input_grad(0))
      out[0] = reduce_to_shape(matmul_op().call(g, b.transpose(-1, -2)), a.sizes());
    if (ctx->needs_input_grad(1)) {
      if (a.dim() == 3 && b.dim() == 2) {  // one GEMM over all rows instead of a batch + sum
        out[1] = matmul_op().call(a.reshape({-1, a.size(-1)}).t(), g.reshape({-1, g.size(-1)}));
      } else {
        out[1] = reduce_to_shape(matmul_op().call(a.transpose(-1, -2), g), b.sizes());
      }
    }
    return out;
  }
};

at::Tensor matmul_autograd(const at::Tensor& a, const at::Tensor& b) {
  if (composite(a, b)) {
    if (!functorch_active()) {  // the kernel's checks (at::matmul accepts more shapes)
      at::AutoDispatchBelowADInplaceOrView below;
      matmul_op().call(a, b);
    }
    return at::matmul(a, b);
  }
  if (!must_record(a, b)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return matmul_op().call(a, b);
  }
  return Matmul::apply(a, b);
}

// ---- linear / linear_fwd ------------------------------------------------------------------

// (dX, dW, dbias) from dY; z is the saved pre-activation (undefined: recompute it).
variable_list linear_grads(AutogradContext* ctx, const at::Tensor& dy, const at::Tensor& x,
                           const at::Tensor& w, const at::Tensor& b, const at::Tensor& z,
                           size_t n_args) {
  variable_list out(n_args);
  const std::string act = ctx->saved_data["activation"].toStringRef();
  const bool want_x = needs_grad(ctx, "x_edge"), want_w = needs_grad(ctx, "w_edge"),
             want_b = needs_grad(ctx, "b_edge");
  const int64_t n = w.size(0), k = w.size(1);
  at::Tensor dz, db;
  if (act.empty()) {
    dz = dy;
    if (want_b) db = bias_grad_of(dy.reshape({-1, n}));
  } else if (differentiable_backward()) {
    // z as a function of x, W, b, so the second derivative reaches them.
    const OptT bo = b.defined() ? OptT(b) : std::nullopt;
    const at::Tensor zd = linear_op().call(x, w, bo, std::nullopt);
    dz = act_backward_composite(dy, zd, act);
    if (want_b) db = bias_grad_of(dz.reshape({-1, n}));
  } else {
    at::AutoDispatchBelowADInplaceOrView below;
    at::Tensor zz = z;
    if (!zz.defined()) {
      const OptT bo = b.defined() ? OptT(b) : std::nullopt;
      zz = std::get<1>(linear_fwd_op().call(x, w, bo, act));
    }
    std::tie(dz, db) = linear_act_backward_op().call(dy, zz, act, want_b);
  }
  const at::Tensor dz2 = dz.reshape({-1, n});
  if (want_x) out[0] = matmul_op().call(dz2, w).reshape(x.sizes());
  if (want_w) out[1] = matmul_op().call(dz2.t(), x.reshape({-1, k}));
  if (want_b) out[2] = db;
  return out;
}

void save_linear(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const OptT& b,
                 const std::string& activation) {
  EdgeIndex e;
  ctx->saved_data["x_edge"] = e.take(true);
  ctx->saved_data["w_edge"] = e.take(true);
  ctx->saved_data["b_edge"] = e.take(b.has_value() && b->defined());
  ctx->saved_data["activation"] = activation;
}

struct Linear : torch::autograd::Function<Linear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const OptT& b, OptStr activation) {
    at::AutoDispatchBelowADInplaceOrView below;
    save_linear(ctx, x, w, b, activation ? std::string(*activation) : std::string());
    ctx->save_for_backward({x, w, value_or_undefined(b)});
    return linear_op().call(x, w, b, activation);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return variable_list(4);
    const auto s = ctx->get_saved_variables();
    return linear_grads(ctx, grads[0], s[0], s[1], s[2], at::Tensor(), 4);
  }
};

struct LinearFwd : torch::autograd::Function<LinearFwd> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                               const OptT& b, c10::string_view activation) {
    at::AutoDispatchBelowADInplaceOrView below;
    save_linear(ctx, x, w, b, std::string(activation));
    auto [y, z] = linear_fwd_op().call(x, w, b, activation);
    ctx->mark_non_differentiable({z});
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({x, w, value_or_undefined(b), z});
    return {y, z};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return variable_list(4);
    const auto s = ctx->get_saved_variables();
    return linear_grads(ctx, grads[0], s[0], s[1], s[2], s[3], 4);
  }
};

// act(x W^T + b) in ATen ops (forward-mode AD).
at::Tensor linear_composite(const at::Tensor& x, const at::Tensor& w, const OptT& b,
                            const std::string& act) {
  return act_composite(at::linear(x, w, b), act);
}

at::Tensor linear_autograd(const at::Tensor& x, const at::Tensor& w, const OptT& b,
                           OptStr activation) {
  if (composite(x, w, b)) {
    if (!functorch_active()) {
      at::AutoDispatchBelowADInplaceOrView below;
      linear_op().call(x, w, b, activation);
    }
    return linear_composite(x, w, b, activation ? std::string(*activation) : std::string());
  }
  if (!must_record(x, w, b)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return linear_op().call(x, w, b, activation);
  }
  return Linear::apply(x, w, b, activation);
}

Tensor2 linear_fwd_autograd(const at::Tensor& x, const at::Tensor& w, const OptT& b,
                            c10::string_view activation) {
  if (composite(x, w, b)) {
    const at::Tensor z = at::linear(x, w, b);
    return {act_composite(z, std::string(activation)), z.detach()};
  }
  if (!must_record(x, w, b)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return linear_fwd_op().call(x, w, b, activation);
  }
  auto out = LinearFwd::apply(x, w, b, activation);
  return {out[0], out[1]};
}

}  // namespace

TORCH_LIBRARY_IMPL(fused, Autograd, m) {
  m.impl("matmul", &matmul_autograd);
  m.impl("linear", &linear_autograd);
  m.impl("linear_fwd", &linear_fwd_autograd);
  m.impl("linear_act_backward", torch::autograd::autogradNotImplementedFallback());
}

}  // namespace fused::autograd
