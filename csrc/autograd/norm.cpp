// Autograd of the norm ops: layer_norm, rms_norm, add_layer_norm, add_rms_norm (see
// common.h for the scheme). mean / rstd are outputs for the backward only: they are marked
// non-differentiable, and an unused output's gradient arrives undefined rather than as a
// zero tensor (set_materialize_grads(false)), which saves a fill kernel per output.
#include <ATen/ops/ones.h>
#include <ATen/ops/rsqrt.h>
#include <torch/library.h>

#include "autograd/common.h"
#include "autograd/ops.h"
#include "common/norm.h"

namespace fused::autograd {
namespace {

at::ScalarType acc_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

std::vector<int64_t> dims_from(int64_t first, int64_t end) {
  std::vector<int64_t> d;
  for (int64_t i = first; i < end; ++i) d.push_back(i);
  return d;
}

// Sum over the leading (batch) dims; a tensor with none is already the parameter's shape.
at::Tensor sum_batch(const at::Tensor& t, int64_t batch_dims) {
  return batch_dims == 0 ? t : t.sum(dims_from(0, batch_dims));
}

// The statistics recomputed from x with differentiable ops: (x - mean or x, rstd).
std::pair<at::Tensor, at::Tensor> centered_and_rstd(const at::Tensor& xf, int64_t k, bool layer,
                                                    double eps) {
  const auto dims = dims_from(xf.dim() - k, xf.dim());
  at::Tensor xc = layer ? xf - xf.mean(dims, true) : xf;
  return {xc, at::rsqrt((xc * xc).mean(dims, true) + eps)};
}

// y = norm(x) * weight + bias in x's dtype, with differentiable ATen ops (forward-mode AD).
at::Tensor norm_forward_composite(const at::Tensor& x, int64_t k, const at::Tensor& w,
                                  const at::Tensor& b, bool layer, double eps,
                                  at::ScalarType out_dtype) {
  const at::ScalarType acc = acc_dtype(x);
  auto [xc, r] = centered_and_rstd(x.to(acc), k, layer, eps);
  at::Tensor y = xc * r;
  if (w.defined()) y = y * w.to(acc);
  if (b.defined()) y = y + b.to(acc);
  return y.to(out_dtype);
}

// (mean, rstd) as the op returns them, from the composition (no gradient: the op's are not
// differentiable either). rms norm has no mean (undefined).
std::pair<at::Tensor, at::Tensor> stats_composite(const at::Tensor& x, int64_t k, bool layer,
                                                  double eps) {
  at::NoGradGuard no_grad;
  const auto dims = dims_from(x.dim() - k, x.dim());
  const at::Tensor xf = x.detach().to(acc_dtype(x));
  const at::Tensor rstd = centered_and_rstd(xf, k, layer, eps).second.squeeze(dims);
  return {layer ? xf.mean(dims) : at::Tensor(), rstd};
}

// (dx, dweight, dbias) of y = norm(x) * weight + bias, with differentiable ATen ops that
// recompute the statistics from x, so the result differentiates again correctly.
Tensor3 norm_backward_composite(const at::Tensor& dy, const at::Tensor& x, int64_t k,
                                const at::Tensor& w, const at::Tensor& b, bool layer, double eps,
                                bool want_w, bool want_b) {
  const at::ScalarType acc = acc_dtype(x);
  const auto dims = dims_from(x.dim() - k, x.dim());
  auto [xc, r] = centered_and_rstd(x.to(acc), k, layer, eps);
  const at::Tensor xhat = xc * r;
  const at::Tensor g = dy.to(acc);
  const at::Tensor gw = w.defined() ? g * w.to(acc) : g;
  at::Tensor inner = gw - xhat * (gw * xhat).mean(dims, true);
  if (layer) inner = inner - gw.mean(dims, true);
  const at::Tensor dx = (r * inner).to(x.scalar_type());
  const int64_t batch = x.dim() - k;
  at::Tensor dw, db;
  if (want_w && w.defined()) dw = sum_batch(g * xhat, batch).to(w.scalar_type());
  if (want_b && b.defined()) db = sum_batch(g, batch).to(b.scalar_type());
  return {dx, dw, db};
}

// ---- layer_norm / rms_norm ---------------------------------------------------------------

// One Function for both norms: `layer` says which (rms_norm has no mean and no bias).
struct Norm : torch::autograd::Function<Norm> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, at::IntArrayRef ns,
                               const OptT& weight, const OptT& bias, double eps, bool layer) {
    at::AutoDispatchBelowADInplaceOrView below;
    at::Tensor y, mean, rstd;
    if (layer) {
      std::tie(y, mean, rstd) = layer_norm_op().call(x, ns, weight, bias, eps);
      ctx->mark_non_differentiable({mean, rstd});
    } else {
      std::tie(y, rstd) = rms_norm_op().call(x, ns, weight, eps);
      ctx->mark_non_differentiable({rstd});
    }
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({x, value_or_undefined(weight), value_or_undefined(bias), mean, rstd});
    EdgeIndex e;
    e.take(true);
    ctx->saved_data["w_edge"] = e.take(weight.has_value() && weight->defined());
    ctx->saved_data["b_edge"] = e.take(bias.has_value() && bias->defined());
    ctx->saved_data["ns"] = ns;
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["layer"] = layer;
    if (layer) return {y, mean, rstd};
    return {y, rstd};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor& dy = grads[0];
    variable_list out(6);
    if (!dy.defined()) return out;
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &b = saved[2], &mean = saved[3],
                     &rstd = saved[4];
    const bool layer = ctx->saved_data["layer"].toBool();
    const bool want_w = needs_grad(ctx, "w_edge"), want_b = needs_grad(ctx, "b_edge");
    const auto ns = ctx->saved_data["ns"].toIntVector();
    at::Tensor dx, dw, db;
    if (differentiable_backward()) {
      std::tie(dx, dw, db) =
          norm_backward_composite(dy, x, static_cast<int64_t>(ns.size()), w, b, layer,
                                  ctx->saved_data["eps"].toDouble(), want_w, want_b);
    } else {
      at::AutoDispatchBelowADInplaceOrView below;
      const OptT wo = w.defined() ? OptT(w) : std::nullopt;
      if (layer) {
        const OptT bo = b.defined() ? OptT(b) : std::nullopt;
        std::tie(dx, dw, db) =
            layer_norm_backward_op().call(dy, x, ns, mean, rstd, wo, bo, {want_w, want_b});
      } else {
        std::tie(dx, dw) = rms_norm_backward_op().call(dy, x, ns, rstd, wo, want_w);
      }
    }
    out[0] = dx;
    if (want_w) out[2] = dw;
    if (want_b) out[3] = db;
    return out;
  }
};

Tensor3 layer_norm_autograd(const at::Tensor& x, at::IntArrayRef ns, const OptT& weight,
                            const OptT& bias, double eps) {
  if (composite(x, weight, bias)) {
    auto [mean, rstd] = stats_composite(x, static_cast<int64_t>(ns.size()), true, eps);
    at::Tensor y =
        norm_forward_composite(x, static_cast<int64_t>(ns.size()), value_or_undefined(weight),
                               value_or_undefined(bias), true, eps, x.scalar_type());
    return {y, mean, rstd};
  }
  if (!must_record(x, weight, bias)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return layer_norm_op().call(x, ns, weight, bias, eps);
  }
  auto out = Norm::apply(x, ns, weight, bias, eps, true);
  return {out[0], out[1], out[2]};
}

Tensor2 rms_norm_autograd(const at::Tensor& x, at::IntArrayRef ns, const OptT& weight,
                          std::optional<double> eps) {
  if (composite(x, weight)) {
    const double e = eps.value_or(rms_default_eps(x.scalar_type()));
    const int64_t k = static_cast<int64_t>(ns.size());
    at::Tensor y = norm_forward_composite(x, k, value_or_undefined(weight), at::Tensor(), false, e,
                                          x.scalar_type());
    return {y, stats_composite(x, k, false, e).second};
  }
  if (!must_record(x, weight)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return rms_norm_op().call(x, ns, weight, eps);
  }
  auto out =
      Norm::apply(x, ns, weight, OptT(), eps.value_or(rms_default_eps(x.scalar_type())), false);
  return {out[0], out[1]};
}

// ---- add_layer_norm / add_rms_norm -------------------------------------------------------
// s = x + residual is an output and what the backward reads; its gradient (from y through
// the norm, plus s's own) is also dx and d_residual, each in its input's dtype.

at::ScalarType sum_dtype(const at::Tensor& x, bool residual_in_fp32) {
  return residual_in_fp32 && x.scalar_type() != at::kDouble ? at::kFloat : x.scalar_type();
}

// The add forms' backward below the sum: (ds, dweight, dbias), ds = the gradient reaching
// s through y plus dsum, in s's dtype. ctx holds s, weight, bias, mean, rstd and the norm's
// settings (AddNorm, DropoutAddNorm).
Tensor3 add_norm_sum_grads(AutogradContext* ctx, const at::Tensor& dy, const at::Tensor& dsum) {
  const auto saved = ctx->get_saved_variables();
  const at::Tensor &s = saved[0], &w = saved[1], &b = saved[2], &mean = saved[3], &rstd = saved[4];
  const bool layer = ctx->saved_data["layer"].toBool();
  const bool want_w = needs_grad(ctx, "w_edge"), want_b = needs_grad(ctx, "b_edge");
  const auto ns = ctx->saved_data["ns"].toIntVector();
  at::Tensor ds, dw, db;
  if (differentiable_backward()) {
    std::tie(ds, dw, db) =
        norm_backward_composite(dy, s, static_cast<int64_t>(ns.size()), w, b, layer,
                                ctx->saved_data["eps"].toDouble(), want_w, want_b);
    if (dsum.defined()) ds = ds + dsum;
  } else {
    at::AutoDispatchBelowADInplaceOrView below;
    const OptT wo = w.defined() ? OptT(w) : std::nullopt;
    const OptT dso = dsum.defined() ? OptT(dsum) : std::nullopt;
    if (layer) {
      const OptT bo = b.defined() ? OptT(b) : std::nullopt;
      std::tie(ds, dw, db) =
          add_layer_norm_backward_op().call(dy, dso, s, ns, mean, rstd, wo, bo, {want_w, want_b});
    } else {
      std::tie(ds, dw) = add_rms_norm_backward_op().call(dy, dso, s, ns, rstd, wo, want_w);
    }
  }
  return {ds, dw, db};
}

struct AddNorm : torch::autograd::Function<AddNorm> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x,
                               const at::Tensor& residual, at::IntArrayRef ns, const OptT& weight,
                               const OptT& bias, std::optional<double> eps, bool residual_in_fp32,
                               bool layer) {
    at::AutoDispatchBelowADInplaceOrView below;
    at::Tensor y, s, mean, rstd;
    if (layer) {
      std::tie(y, s, mean, rstd) =
          add_layer_norm_op().call(x, residual, ns, weight, bias, *eps, residual_in_fp32);
      ctx->mark_non_differentiable({mean, rstd});
    } else {
      std::tie(y, s, rstd) = add_rms_norm_op().call(x, residual, ns, weight, eps, residual_in_fp32);
      ctx->mark_non_differentiable({rstd});
    }
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({s, value_or_undefined(weight), value_or_undefined(bias), mean, rstd});
    EdgeIndex e;
    e.take(true);
    e.take(true);
    ctx->saved_data["w_edge"] = e.take(weight.has_value() && weight->defined());
    ctx->saved_data["b_edge"] = e.take(bias.has_value() && bias->defined());
    ctx->saved_data["ns"] = ns;
    ctx->saved_data["eps"] = eps.value_or(rms_default_eps(x.scalar_type()));
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["x_dtype"] = x.scalar_type();
    ctx->saved_data["r_dtype"] = residual.scalar_type();
    if (layer) return {y, s, mean, rstd};
    return {y, s, rstd};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor &dy = grads[0], &dsum = grads[1];
    variable_list out(8);
    const auto x_dtype = ctx->saved_data["x_dtype"].toScalarType();
    const auto r_dtype = ctx->saved_data["r_dtype"].toScalarType();
    if (!dy.defined()) {  // only s was used: its gradient passes straight through
      if (dsum.defined()) {
        out[0] = dsum.to(x_dtype);
        out[1] = dsum.to(r_dtype);
      }
      return out;
    }
    at::Tensor ds, dw, db;
    std::tie(ds, dw, db) = add_norm_sum_grads(ctx, dy, dsum);
    out[0] = ds.to(x_dtype);
    out[1] = ds.to(r_dtype);
    if (needs_grad(ctx, "w_edge")) out[3] = dw;
    if (needs_grad(ctx, "b_edge")) out[4] = db;
    return out;
  }
};

// The add forms' composite forward (forward-mode AD): s rounded as the kernels round it.
std::pair<at::Tensor, at::Tensor> add_norm_forward_composite(const at::Tensor& x,
                                                             const at::Tensor& residual, int64_t k,
                                                             const OptT& weight, const OptT& bias,
                                                             bool layer, double eps,
                                                             bool residual_in_fp32) {
  const at::ScalarType acc = acc_dtype(x);
  const at::Tensor s = (x.to(acc) + residual.to(acc)).to(sum_dtype(x, residual_in_fp32));
  const at::Tensor y = norm_forward_composite(
      s, k, value_or_undefined(weight), value_or_undefined(bias), layer, eps, x.scalar_type());
  return {y, s};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> add_layer_norm_autograd(
    const at::Tensor& x, const at::Tensor& residual, at::IntArrayRef ns, const OptT& weight,
    const OptT& bias, double eps, bool residual_in_fp32) {
  if (composite(x, residual, weight, bias)) {
    const int64_t k = static_cast<int64_t>(ns.size());
    auto [y, s] =
        add_norm_forward_composite(x, residual, k, weight, bias, true, eps, residual_in_fp32);
    auto [mean, rstd] = stats_composite(s, k, true, eps);
    return {y, s, mean, rstd};
  }
  if (!must_record(x, residual, weight, bias)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return add_layer_norm_op().call(x, residual, ns, weight, bias, eps, residual_in_fp32);
  }
  auto out = AddNorm::apply(x, residual, ns, weight, bias, std::optional<double>(eps),
                            residual_in_fp32, true);
  return {out[0], out[1], out[2], out[3]};
}

Tensor3 add_rms_norm_autograd(const at::Tensor& x, const at::Tensor& residual, at::IntArrayRef ns,
                              const OptT& weight, std::optional<double> eps,
                              bool residual_in_fp32) {
  if (composite(x, residual, weight)) {
    const double e = eps.value_or(rms_default_eps(x.scalar_type()));
    const int64_t k = static_cast<int64_t>(ns.size());
    auto [y, s] = add_norm_forward_composite(x, residual, k, weight, std::nullopt, false, e,
                                             residual_in_fp32);
    return {y, s, stats_composite(s, k, false, e).second};
  }
  if (!must_record(x, residual, weight)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return add_rms_norm_op().call(x, residual, ns, weight, eps, residual_in_fp32);
  }
  auto out = AddNorm::apply(x, residual, ns, weight, OptT(), eps, residual_in_fp32, false);
  return {out[0], out[1], out[2]};
}

// ---- dropout_add_layer_norm / dropout_add_rms_norm ---------------------------------------
// s = residual + dropout(x + input_bias), y = norm(s). The backward is the add forms' (ds,
// the gradient reaching s, is d_residual) followed by dropout's: d_x = mask * ds / (1 - p)
// and d_input_bias = its column sums, the mask regenerated from seed_offset
// (bias_dropout_add_backward).

struct DropoutAddNorm : torch::autograd::Function<DropoutAddNorm> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x,
                               const at::Tensor& residual, at::IntArrayRef ns, const OptT& weight,
                               const OptT& bias, const OptT& input_bias, std::optional<double> eps,
                               double p, bool training, bool residual_in_fp32, OptGen generator,
                               bool layer) {
    at::AutoDispatchBelowADInplaceOrView below;
    at::Tensor y, s, mean, rstd, so;
    if (layer) {
      std::tie(y, s, mean, rstd, so) =
          dropout_add_layer_norm_op().call(x, residual, ns, weight, bias, *eps, p, training,
                                           input_bias, residual_in_fp32, std::move(generator));
      ctx->mark_non_differentiable({mean, rstd, so});
    } else {
      std::tie(y, s, rstd, so) =
          dropout_add_rms_norm_op().call(x, residual, ns, weight, eps, p, training, input_bias,
                                         residual_in_fp32, std::move(generator));
      ctx->mark_non_differentiable({rstd, so});
    }
    ctx->set_materialize_grads(false);
    // As AddNorm's (add_norm_sum_grads reads them), then seed_offset.
    ctx->save_for_backward(
        {s, value_or_undefined(weight), value_or_undefined(bias), mean, rstd, so});
    EdgeIndex e;
    e.take(true);
    e.take(true);
    ctx->saved_data["w_edge"] = e.take(weight.has_value() && weight->defined());
    ctx->saved_data["b_edge"] = e.take(bias.has_value() && bias->defined());
    const bool has_ib = input_bias.has_value() && input_bias->defined();
    ctx->saved_data["ib_edge"] = e.take(has_ib);
    if (has_ib) ctx->saved_data["ib_dtype"] = input_bias->scalar_type();
    ctx->saved_data["ns"] = ns;
    ctx->saved_data["eps"] = eps.value_or(rms_default_eps(x.scalar_type()));
    ctx->saved_data["p"] = training ? p : 0.0;
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["x_dtype"] = x.scalar_type();
    ctx->saved_data["r_dtype"] = residual.scalar_type();
    if (layer) return {y, s, mean, rstd, so};
    return {y, s, rstd, so};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor &dy = grads[0], &dsum = grads[1];
    variable_list out(12);
    at::Tensor ds, dw, db;
    if (dy.defined()) {
      std::tie(ds, dw, db) = add_norm_sum_grads(ctx, dy, dsum);
      if (needs_grad(ctx, "w_edge")) out[3] = dw;
      if (needs_grad(ctx, "b_edge")) out[4] = db;
    } else if (dsum.defined()) {  // only s was used: its gradient is ds
      ds = dsum;
    } else {
      return out;
    }
    out[1] = ds.to(ctx->saved_data["r_dtype"].toScalarType());
    const bool want_x = ctx->needs_input_grad(0), want_ib = needs_grad(ctx, "ib_edge");
    if (!want_x && !want_ib) return out;
    const at::Tensor so = ctx->get_saved_variables()[5];
    const double p = ctx->saved_data["p"].toDouble();
    at::Tensor dx, dib;
    if (want_ib && !differentiable_backward()) {
      at::AutoDispatchBelowADInplaceOrView below;
      std::tie(dx, dib) = bias_dropout_add_backward_op().call(ds, so, p);
    } else {
      if (differentiable_backward()) {  // through dropout_backward's autograd: differentiable
        dx = dropout_backward_op().call(ds, so, p);
      } else {
        at::AutoDispatchBelowADInplaceOrView below;
        dx = dropout_backward_op().call(ds, so, p);
      }
      if (want_ib) dib = dx.reshape({-1, dx.size(-1)}).sum(0, false, acc_dtype(dx));
    }
    if (want_x) out[0] = dx.to(ctx->saved_data["x_dtype"].toScalarType());
    if (want_ib) out[5] = dib.to(ctx->saved_data["ib_dtype"].toScalarType());
    return out;
  }
};

// The dropout forms' composition (forward-mode AD, torch.func): the mask drawn as dropout of
// float32 ones (the draws fused::dropout makes from the same generator state: the kernels'
// mask), applied with differentiable ops; s rounded as the kernels round it.
Tensor5 dropout_add_norm_composite(const at::Tensor& x, const at::Tensor& residual,
                                   at::IntArrayRef ns, const OptT& weight, const OptT& bias,
                                   const OptT& input_bias, double eps, double p, bool training,
                                   bool residual_in_fp32, OptGen generator, bool layer) {
  const at::ScalarType acc = acc_dtype(x);
  at::Tensor mask, so;
  {
    at::AutoDispatchBelowADInplaceOrView below;
    std::tie(mask, so) = dropout_op().call(at::ones(x.sizes(), x.options().dtype(acc)), p, training,
                                           std::move(generator));
  }
  at::Tensor xb = x.to(acc);
  if (input_bias.has_value() && input_bias->defined()) xb = xb + input_bias->to(acc);
  const at::Tensor s = (residual.to(acc) + xb * mask).to(sum_dtype(x, residual_in_fp32));
  const int64_t k = static_cast<int64_t>(ns.size());
  const at::Tensor y = norm_forward_composite(
      s, k, value_or_undefined(weight), value_or_undefined(bias), layer, eps, x.scalar_type());
  auto [mean, rstd] = stats_composite(s, k, layer, eps);
  return {y, s, mean, rstd, so};
}

Tensor5 dropout_add_layer_norm_autograd(const at::Tensor& x, const at::Tensor& residual,
                                        at::IntArrayRef ns, const OptT& weight, const OptT& bias,
                                        double eps, double p, bool training, const OptT& input_bias,
                                        bool residual_in_fp32, OptGen generator) {
  if (composite(x, residual, weight, bias, input_bias)) {
    return dropout_add_norm_composite(x, residual, ns, weight, bias, input_bias, eps, p, training,
                                      residual_in_fp32, std::move(generator), true);
  }
  if (!must_record(x, residual, weight, bias, input_bias)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return dropout_add_layer_norm_op().call(x, residual, ns, weight, bias, eps, p, training,
                                            input_bias, residual_in_fp32, std::move(generator));
  }
  auto out =
      DropoutAddNorm::apply(x, residual, ns, weight, bias, input_bias, std::optional<double>(eps),
                            p, training, residual_in_fp32, std::move(generator), true);
  return {out[0], out[1], out[2], out[3], out[4]};
}

Tensor4 dropout_add_rms_norm_autograd(const at::Tensor& x, const at::Tensor& residual,
                                      at::IntArrayRef ns, const OptT& weight,
                                      std::optional<double> eps, double p, bool training,
                                      const OptT& input_bias, bool residual_in_fp32,
                                      OptGen generator) {
  if (composite(x, residual, weight, input_bias)) {
    auto [y, s, mean, rstd, so] =
        dropout_add_norm_composite(x, residual, ns, weight, std::nullopt, input_bias,
                                   eps.value_or(rms_default_eps(x.scalar_type())), p, training,
                                   residual_in_fp32, std::move(generator), false);
    return {y, s, rstd, so};
  }
  if (!must_record(x, residual, weight, input_bias)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return dropout_add_rms_norm_op().call(x, residual, ns, weight, eps, p, training, input_bias,
                                          residual_in_fp32, std::move(generator));
  }
  auto out = DropoutAddNorm::apply(x, residual, ns, weight, OptT(), input_bias, eps, p, training,
                                   residual_in_fp32, std::move(generator), false);
  return {out[0], out[1], out[2], out[3]};
}

}  // namespace

TORCH_LIBRARY_IMPL(fused, Autograd, m) {
  m.impl("dropout_add_layer_norm", &dropout_add_layer_norm_autograd);
  m.impl("dropout_add_rms_norm", &dropout_add_rms_norm_autograd);
  m.impl("layer_norm", &layer_norm_autograd);
  m.impl("rms_norm", &rms_norm_autograd);
  m.impl("add_layer_norm", &add_layer_norm_autograd);
  m.impl("add_rms_norm", &add_rms_norm_autograd);
  for (const char* op : {"layer_norm_backward", "rms_norm_backward", "add_layer_norm_backward",
                         "add_rms_norm_backward"}) {
    m.impl(op, torch::autograd::autogradNotImplementedFallback());
  }
}

}  // namespace fused::autograd
