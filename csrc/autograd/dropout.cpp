// Autograd of fused::dropout, fused::bias_dropout_add and fused::dropout_backward (see
// common.h for the scheme). Nothing of x's size is saved: the forward ops return
// seed_offset = {Philox seed, offset} (non-differentiable) and the backward regenerates the
// mask from it. dropout_backward is linear in grad_out with the same mask, so it is its own
// derivative: double backward goes through it again.
#include <ATen/ops/ones_like.h>
#include <torch/library.h>

#include "autograd/common.h"
#include "autograd/ops.h"

namespace fused::autograd {
namespace {

// What the backward applies: nothing is dropped outside training.
double effective_p(double p, bool training) { return training ? p : 0.0; }

struct DropoutBackward : torch::autograd::Function<DropoutBackward> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& grad,
                            const at::Tensor& seed_offset, double p) {
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->save_for_backward({seed_offset});
    ctx->saved_data["p"] = p;
    return dropout_backward_op().call(grad, seed_offset, p);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(3);
    if (!grads[0].defined()) return out;
    const at::Tensor so = ctx->get_saved_variables()[0];
    // Through the dispatcher with autograd: differentiable again under create_graph.
    out[0] = dropout_backward_op().call(grads[0], so, ctx->saved_data["p"].toDouble());
    return out;
  }
};

at::Tensor dropout_backward_autograd(const at::Tensor& grad, const at::Tensor& seed_offset,
                                     double p) {
  if (composite(grad)) {  // linear in grad: grad * (the mask applied to ones)
    at::Tensor mask;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      mask = dropout_backward_op().call(at::ones_like(grad), seed_offset, p);
    }
    return grad * mask;
  }
  if (must_record(grad)) return DropoutBackward::apply(grad, seed_offset, p);
  at::AutoDispatchBelowADInplaceOrView below;
  return dropout_backward_op().call(grad, seed_offset, p);
}

// grad_x of either forward op; differentiable under create_graph.
at::Tensor dropout_grad(const at::Tensor& dy, const at::Tensor& so, double p) {
  if (differentiable_backward()) return dropout_backward_autograd(dy, so, p);
  at::AutoDispatchBelowADInplaceOrView below;
  return dropout_backward_op().call(dy, so, p);
}

struct Dropout : torch::autograd::Function<Dropout> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, double p, bool training,
                               OptGen generator) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [y, so] = dropout_op().call(x, p, training, std::move(generator));
    ctx->mark_non_differentiable({so});
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({so});
    ctx->saved_data["p"] = effective_p(p, training);
    return {y, so};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(4);
    if (!grads[0].defined()) return out;
    out[0] = dropout_grad(grads[0], ctx->get_saved_variables()[0], ctx->saved_data["p"].toDouble());
    return out;
  }
};

// The composition (see common.h): the mask drawn as dropout of ones (kept: 1 / (1 - p),
// dropped: 0), then applied with differentiable ops. Under vmap that call meets the op's
// vmap rule (fused_ops/_impl/vmap.py), which honours vmap's `randomness`.
Tensor2 mask_composite(const at::Tensor& like, double p, bool training, OptGen generator) {
  at::AutoDispatchBelowADInplaceOrView below;
  return dropout_op().call(at::ones_like(like, at::MemoryFormat::Contiguous), p, training,
                           std::move(generator));
}

Tensor2 dropout_autograd(const at::Tensor& x, double p, bool training, OptGen generator) {
  if (composite(x)) {
    auto [mask, so] = mask_composite(x, p, training, std::move(generator));
    return {x * mask, so};
  }
  if (!must_record(x)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return dropout_op().call(x, p, training, std::move(generator));
  }
  auto out = Dropout::apply(x, p, training, std::move(generator));
  return {out[0], out[1]};
}

struct BiasDropoutAdd : torch::autograd::Function<BiasDropoutAdd> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const OptT& bias,
                               const at::Tensor& residual, double p, bool training,
                               OptGen generator) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [out, so] =
        bias_dropout_add_op().call(x, bias, residual, p, training, std::move(generator));
    ctx->mark_non_differentiable({so});
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({so});
    ctx->saved_data["p"] = effective_p(p, training);
    EdgeIndex e;
    ctx->saved_data["x_edge"] = e.take(true);
    ctx->saved_data["b_edge"] = e.take(bias.has_value() && bias->defined());
    return {out, so};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(6);
    const at::Tensor& dy = grads[0];
    if (!dy.defined()) return out;
    const at::Tensor so = ctx->get_saved_variables()[0];
    const double p = ctx->saved_data["p"].toDouble();
    const bool want_x = needs_grad(ctx, "x_edge"), want_b = needs_grad(ctx, "b_edge");
    if (want_b && !differentiable_backward()) {
      at::AutoDispatchBelowADInplaceOrView below;
      std::tie(out[0], out[1]) = bias_dropout_add_backward_op().call(dy, so, p);
    } else if (want_x || want_b) {
      out[0] = dropout_grad(dy, so, p);
      if (want_b) {  // the column sums of grad_x, accumulated in float32 (float64)
        const at::Tensor g2 = out[0].reshape({-1, out[0].size(-1)});
        const auto acc = g2.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
        out[1] = g2.sum(0, false, acc).to(g2.scalar_type());
      }
    }
    if (!want_x) out[0] = at::Tensor();
    out[2] = dy;  // d out / d residual is the identity
    return out;
  }
};

Tensor2 bias_dropout_add_autograd(const at::Tensor& x, const OptT& bias, const at::Tensor& residual,
                                  double p, bool training, OptGen generator) {
  if (composite(x, bias, residual)) {
    auto [mask, so] = mask_composite(x, p, training, std::move(generator));
    const at::Tensor xb = bias.has_value() && bias->defined() ? x + *bias : x;
    return {residual + xb * mask, so};
  }
  if (!must_record(x, bias, residual)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return bias_dropout_add_op().call(x, bias, residual, p, training, std::move(generator));
  }
  auto out = BiasDropoutAdd::apply(x, bias, residual, p, training, std::move(generator));
  return {out[0], out[1]};
}

}  // namespace

TORCH_LIBRARY_IMPL(fused, Autograd, m) {
  m.impl("dropout", &dropout_autograd);
  m.impl("bias_dropout_add", &bias_dropout_add_autograd);
  m.impl("dropout_backward", &dropout_backward_autograd);
  m.impl("bias_dropout_add_backward", torch::autograd::autogradNotImplementedFallback());
}

}  // namespace fused::autograd
