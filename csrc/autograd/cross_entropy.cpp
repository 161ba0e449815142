// Autograd of fused::cross_entropy, fused::cross_entropy_with_grad and
// fused::linear_cross_entropy (see common.h for the scheme).
//
// cross_entropy saves the logits, the target and the per-row lse (a non-differentiable
// output): the backward kernel needs no reduction of its own,
//     dx = g ((1 + 2 z lse) softmax(x) - eps / V - (1 - eps) onehot(t)), 0 on ignored rows,
// with g the row's loss gradient: the incoming one per row ('none'), or one value for every
// row ('sum'; 'mean' divides it by the count of non-ignored rows), which the backward
// kernels take as it is (their `reduction` argument). inplace_backward writes
// that gradient over the saved logits and returns them as their own gradient; the write is
// below autograd, so the logits' version is bumped by hand: a backward that saved them and
// runs later reports the in-place write instead of reading the gradient.
//
// cross_entropy_with_grad and linear_cross_entropy compute their gradients in the forward
// (for a loss gradient of 1); the backward scales them by the loss gradient.
#include <ATen/ops/linear.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/one_hot.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/where.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include "autograd/ops.h"
#include "common/cross_entropy.h"

namespace fused::autograd {
namespace {

at::ScalarType row_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

const char* reduction_name(XentReduction r) {
  return r == XentReduction::Mean ? "mean" : r == XentReduction::Sum ? "sum" : "none";
}

// The target in the logits' leading shape (a flat target is accepted for any leading shape).
at::Tensor lead_target(const at::Tensor& x, const at::Tensor& target) {
  return target.reshape(x.sizes().slice(0, x.dim() - 1));
}

// ---- the ATen compositions ---------------------------------------------------------------

// Per-row (loss, lse) in the logits' leading shape, with differentiable ATen ops.
Tensor2 rows_composite(const at::Tensor& x, const at::Tensor& target, int64_t ignore_index,
                       double eps, double z) {
  const at::Tensor t = lead_target(x, target);
  const at::Tensor xf = x.to(row_dtype(x));
  const at::Tensor lse = at::logsumexp(xf, {-1});
  const at::Tensor valid = t.ne(ignore_index);
  const at::Tensor index = t.masked_fill(valid.logical_not(), 0).to(at::kLong).unsqueeze(-1);
  at::Tensor loss = (lse - xf.gather(-1, index).squeeze(-1)) * (1.0 - eps);
  if (eps != 0.0) loss = loss + (lse - xf.mean(-1)) * eps;
  if (z != 0.0) loss = loss + lse * lse * z;
  return {at::where(valid, loss, 0), at::where(valid, lse, 0)};
}

// The reduced loss from per-row losses (lead-shaped) as the op's kernels reduce them.
at::Tensor reduce_composite(const at::Tensor& rows, const at::Tensor& target, int64_t ignore_index,
                            XentReduction red) {
  if (red == XentReduction::None) return rows.reshape(target.sizes());
  at::Tensor total = rows.sum();
  if (red == XentReduction::Sum) return total;
  return total / target.ne(ignore_index).sum();
}

// The loss gradient each row receives, from the gradient g of the op's loss output.
at::Tensor row_grad(const at::Tensor& g, const at::Tensor& target, int64_t ignore_index,
                    XentReduction red) {
  return red == XentReduction::Mean ? g / target.ne(ignore_index).sum() : g;
}

// dlogits for the row gradients g (per row, or one value for all rows), with
// differentiable ATen ops that recompute lse from x: differentiable again (create_graph),
// in x and in g. Ignored rows get 0 whatever g is (g may be inf or NaN there: a 'mean'
// over no rows divides by 0).
at::Tensor grad_composite(const at::Tensor& g, const at::Tensor& x, const at::Tensor& target,
                          int64_t ignore_index, double eps, double z) {
  const at::Tensor t = lead_target(x, target);
  const at::ScalarType acc = row_dtype(x);
  const at::Tensor xf = x.to(acc);
  const at::Tensor lse = at::logsumexp(xf, {-1}, /*keepdim=*/true);
  const at::Tensor valid = t.ne(ignore_index);
  const at::Tensor index = t.masked_fill(valid.logical_not(), 0).to(at::kLong);
  const int64_t V = x.size(-1);
  const at::Tensor onehot = at::one_hot(index, V).to(acc);
  at::Tensor d = (xf - lse).exp() * (lse * (2.0 * z) + 1.0) - onehot * (1.0 - eps);
  if (eps != 0.0) d = d - eps / static_cast<double>(V);
  const at::Tensor gr = g.dim() == 0 ? g : g.reshape(t.sizes());
  return (at::where(valid, gr.to(acc), 0).unsqueeze(-1) * d).to(x.scalar_type());
}

// ---- cross_entropy -------------------------------------------------------------------------

struct CrossEntropy : torch::autograd::Function<CrossEntropy> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& target,
                               int64_t ignore_index, double eps, double z, bool inplace,
                               int64_t reduction) {
    at::AutoDispatchBelowADInplaceOrView below;
    const auto red = static_cast<XentReduction>(reduction);
    auto [loss, lse] =
        xent_op().call(x, target, ignore_index, eps, z, inplace, reduction_name(red));
    ctx->mark_non_differentiable({lse});
    ctx->set_materialize_grads(false);  // lse receives no gradient: no zero fill for it
    ctx->save_for_backward({x, target, lse});
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["z"] = z;
    ctx->saved_data["inplace"] = inplace;
    ctx->saved_data["reduction"] = reduction;
    return {loss, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(7);
    const at::Tensor& g = grads[0];
    if (!g.defined()) return out;
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &target = saved[1], &lse = saved[2];
    const int64_t ii = ctx->saved_data["ignore_index"].toInt();
    const double eps = ctx->saved_data["eps"].toDouble();
    const double z = ctx->saved_data["z"].toDouble();
    const auto red = static_cast<XentReduction>(ctx->saved_data["reduction"].toInt());
    if (differentiable_backward()) {
      out[0] = grad_composite(row_grad(g, target, ii, red), x, target, ii, eps, z);
      return out;
    }
    at::AutoDispatchBelowADInplaceOrView below;
    // The kernels take the reduced loss's gradient as it is ('mean' divides it by the count
    // of non-ignored rows on the device): no ATen op before them.
    const at::Tensor gr = g.to(lse.scalar_type());
    const char* rn = reduction_name(red);
    if (ctx->saved_data["inplace"].toBool()) {
      xent_backward_inplace_op().call(gr, x, target, lse, ii, eps, z, rn);
      torch::autograd::impl::bump_version(x);
      out[0] = x;
    } else {
      out[0] = xent_backward_op().call(gr, x, target, lse, ii, eps, z, rn);
    }
    return out;
  }
};

Tensor2 cross_entropy_autograd(const at::Tensor& x, const at::Tensor& target, int64_t ignore_index,
                               double eps, double z, bool inplace, c10::string_view reduction) {
  const XentReduction red = xent_reduction(reduction, "fused::cross_entropy");
  if (composite(x)) {
    if (!functorch_active()) {  // the kernel's argument checks: a bad call fails as usual
      at::AutoDispatchBelowADInplaceOrView below;
      xent_op().call(x, target, ignore_index, eps, z, inplace, reduction);
    }
    auto [rows, lse] = rows_composite(x, target, ignore_index, eps, z);
    return {reduce_composite(rows, target, ignore_index, red), lse.reshape(target.sizes())};
  }
  if (!must_record(x)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return xent_op().call(x, target, ignore_index, eps, z, inplace, reduction);
  }
  auto out =
      CrossEntropy::apply(x, target, ignore_index, eps, z, inplace, static_cast<int64_t>(red));
  return {out[0], out[1]};
}

// ---- cross_entropy_with_grad ---------------------------------------------------------------
// The saved gradient is scaled in place, so a second backward through the same graph
// (retain_graph=True) raises autograd's "modified by an inplace operation" error rather
// than scaling twice. Nothing to differentiate it again from is saved (the logits are not,
// which is the point of the op): create_graph is refused with a message.

struct CrossEntropyWithGrad : torch::autograd::Function<CrossEntropyWithGrad> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& target,
                               int64_t ignore_index, double eps, double z, bool mean) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [loss, dx] = xent_with_grad_op().call(x, target, ignore_index, eps, z, mean);
    ctx->mark_non_differentiable({dx});
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({dx});
    return {loss, dx};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(6);
    const at::Tensor& g = grads[0];
    if (!g.defined()) return out;
    TORCH_CHECK(!differentiable_backward(),
                "fused::cross_entropy_with_grad: the gradient "
                "precomputed by the forward cannot be differentiated again (create_graph=True); "
                "use fused_ops.cross_entropy without precompute_grad");
    at::Tensor dx = ctx->get_saved_variables()[0];
    at::AutoDispatchBelowADInplaceOrView below;
    xent_scale_op().call(dx, g.to(row_dtype(dx)));
    torch::autograd::impl::bump_version(dx);  // as in CrossEntropy: report a reuse
    out[0] = dx;
    return out;
  }
};

Tensor2 cross_entropy_with_grad_autograd(const at::Tensor& x, const at::Tensor& target,
                                         int64_t ignore_index, double eps, double z, bool mean) {
  if (composite(x)) {
    if (!functorch_active()) {
      at::AutoDispatchBelowADInplaceOrView below;
      xent_with_grad_op().call(x, target, ignore_index, eps, z, mean);
    }
    const XentReduction red = mean ? XentReduction::Mean : XentReduction::Sum;
    const at::Tensor loss = reduce_composite(
        std::get<0>(rows_composite(x, target, ignore_index, eps, z)), target, ignore_index, red);
    const at::Tensor one = at::ones({}, x.options().dtype(row_dtype(x)));
    const at::Tensor dx =
        grad_composite(row_grad(one, target, ignore_index, red), x, target, ignore_index, eps, z)
            .detach();
    return {loss, dx};
  }
  if (!must_record(x)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return xent_with_grad_op().call(x, target, ignore_index, eps, z, mean);
  }
  auto out = CrossEntropyWithGrad::apply(x, target, ignore_index, eps, z, mean);
  return {out[0], out[1]};
}

// ---- linear_cross_entropy ------------------------------------------------------------------
// The forward op computes the gradients of hidden, weight and bias (grad_mask) for a loss
// gradient of 1; the backward multiplies them by the loss gradient. hidden, weight, bias
// and target are saved as well (references, no copies: the caller holds them anyway) for
// the differentiable path, which recomputes the logits.

// (dhidden, dweight, dbias) of the reduced loss for a loss gradient g, in ATen ops.
std::tuple<at::Tensor, at::Tensor, at::Tensor> lce_grads_composite(
    const at::Tensor& g, const at::Tensor& h, const at::Tensor& w, const at::Tensor& b,
    const at::Tensor& target, int64_t ignore_index, double eps, double z, XentReduction red) {
  const int64_t H = w.size(1);
  const at::Tensor h2 = h.reshape({-1, H});
  const at::Tensor t = target.reshape({-1});
  const at::Tensor logits = at::linear(h2, w, b);
  const at::Tensor dl =
      grad_composite(row_grad(g, t, ignore_index, red), logits, t, ignore_index, eps, z);
  return {dl.matmul(w).reshape(h.sizes()), dl.t().matmul(h2),
          b.defined() ? dl.sum(0) : at::Tensor()};
}

struct LinearCrossEntropy : torch::autograd::Function<LinearCrossEntropy> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& w,
                               const at::Tensor& target, const OptT& bias, int64_t ignore_index,
                               double eps, double z, bool mean, int64_t chunk,
                               std::array<bool, 3> user_mask) {
    at::AutoDispatchBelowADInplaceOrView below;
    const bool has_b = bias.has_value() && bias->defined();
    const std::array<bool, 3> mask = {user_mask[0] || h.requires_grad(),
                                      user_mask[1] || w.requires_grad(),
                                      user_mask[2] || (has_b && bias->requires_grad())};
    auto [loss, gh, gw, gb] =
        lce_op().call(h, w, target, bias, ignore_index, eps, z, mean, chunk, mask);
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({gh, gw, gb, h, w, value_or_undefined(bias), target});
    EdgeIndex e;
    ctx->saved_data["h_edge"] = e.take(true);
    ctx->saved_data["w_edge"] = e.take(true);
    e.take(true);  // target: an edge of its own, never differentiated
    ctx->saved_data["b_edge"] = e.take(has_b);
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["z"] = z;
    ctx->saved_data["mean"] = mean;
    // The gradient outputs as the caller asked for them (empty where not asked).
    auto empty = [&] { return h.new_empty({0}); };
    variable_list outs = {loss, user_mask[0] ? gh : empty(), user_mask[1] ? gw : empty(),
                          user_mask[2] && has_b ? gb : empty()};
    ctx->mark_non_differentiable({outs[1], outs[2], outs[3]});
    return outs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(10);
    const at::Tensor& g = grads[0];
    if (!g.defined()) return out;
    const auto saved = ctx->get_saved_variables();
    const bool want_h = needs_grad(ctx, "h_edge"), want_w = needs_grad(ctx, "w_edge"),
               want_b = needs_grad(ctx, "b_edge");
    if (differentiable_backward()) {
      const auto red = ctx->saved_data["mean"].toBool() ? XentReduction::Mean : XentReduction::Sum;
      auto [dh, dw, db] = lce_grads_composite(
          g, saved[3], saved[4], saved[5], saved[6], ctx->saved_data["ignore_index"].toInt(),
          ctx->saved_data["eps"].toDouble(), ctx->saved_data["z"].toDouble(), red);
      if (want_h) out[0] = dh.to(saved[3].scalar_type());
      if (want_w) out[1] = dw.to(saved[4].scalar_type());
      if (want_b) out[3] = db.to(saved[5].scalar_type());
      return out;
    }
    // A multiply, no host sync to test the loss gradient for 1.
    at::AutoDispatchBelowADInplaceOrView below;
    if (want_h) out[0] = saved[0] * g.to(saved[0].scalar_type());
    if (want_w) out[1] = saved[1] * g.to(saved[1].scalar_type());
    if (want_b) out[3] = saved[2] * g.to(saved[2].scalar_type());
    return out;
  }
};

Tensor4 linear_cross_entropy_autograd(const at::Tensor& h, const at::Tensor& w,
                                      const at::Tensor& target, const OptT& bias,
                                      int64_t ignore_index, double eps, double z, bool mean,
                                      int64_t chunk, std::array<bool, 3> grad_mask) {
  if (composite(h, w, bias)) {
    if (!functorch_active()) {
      at::AutoDispatchBelowADInplaceOrView below;
      lce_op().call(h, w, target, bias, ignore_index, eps, z, mean, chunk, {false, false, false});
    }
    const XentReduction red = mean ? XentReduction::Mean : XentReduction::Sum;
    const at::Tensor b = value_or_undefined(bias);
    const at::Tensor t = target.reshape({-1});
    const at::Tensor logits = at::linear(h.reshape({-1, w.size(1)}), w, b);
    const at::Tensor loss = reduce_composite(
        std::get<0>(rows_composite(logits, t, ignore_index, eps, z)), t, ignore_index, red);
    std::array<at::Tensor, 3> g = {h.new_empty({0}), h.new_empty({0}), h.new_empty({0})};
    if (grad_mask[0] || grad_mask[1] || grad_mask[2]) {
      const at::Tensor one = at::ones({}, h.options().dtype(row_dtype(h)));
      auto [dh, dw, db] = lce_grads_composite(one, h, w, b, target, ignore_index, eps, z, red);
      if (grad_mask[0]) g[0] = dh.to(h.scalar_type()).detach();
      if (grad_mask[1]) g[1] = dw.to(w.scalar_type()).detach();
      if (grad_mask[2] && b.defined()) g[2] = db.to(b.scalar_type()).detach();
    }
    return {loss, g[0], g[1], g[2]};
  }
  if (!must_record(h, w, bias)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return lce_op().call(h, w, target, bias, ignore_index, eps, z, mean, chunk, grad_mask);
  }
  auto out =
      LinearCrossEntropy::apply(h, w, target, bias, ignore_index, eps, z, mean, chunk, grad_mask);
  return {out[0], out[1], out[2], out[3]};
}

}  // namespace

TORCH_LIBRARY_IMPL(fused, Autograd, m) {
  m.impl("cross_entropy", &cross_entropy_autograd);
  m.impl("cross_entropy_with_grad", &cross_entropy_with_grad_autograd);
  m.impl("linear_cross_entropy", &linear_cross_entropy_autograd);
  for (const char* op :
       {"cross_entropy_backward", "cross_entropy_backward_", "cross_entropy_scale_"}) {
    m.impl(op, torch::autograd::autogradNotImplementedFallback());
  }
}

}  // namespace fused::autograd
