// Autograd of fused::softmax and fused::log_softmax (see common.h for the scheme). Both
// backwards need only the forward's output y: dx = scale * y * (dy - sum(dy * y)) and
// dx = dy - exp(y) * sum(dy), so x is not saved. With causal, the masked y are 0.
#include <ATen/ops/_log_softmax_backward_data.h>
#include <ATen/ops/_softmax_backward_data.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/triu.h>
#include <torch/library.h>

#include "autograd/common.h"
#include "autograd/ops.h"

namespace fused::autograd {
namespace {

struct Softmax : torch::autograd::Function<Softmax> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t dim, double scale,
                            bool causal) {
    at::AutoDispatchBelowADInplaceOrView below;
    at::Tensor y = softmax_op().call(x, dim, scale, causal);
    ctx->save_for_backward({y});
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["causal"] = causal;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(4);
    const at::Tensor& dy = grads[0];
    if (!dy.defined()) return out;
    const at::Tensor y = ctx->get_saved_variables()[0];
    const int64_t dim = ctx->saved_data["dim"].toInt();
    const double scale = ctx->saved_data["scale"].toDouble();
    if (differentiable_backward()) {
      // Masked entries have y = 0, so the formula gives 0 there with or without causal.
      out[0] = at::_softmax_backward_data(dy, y, dim, y.scalar_type()) * scale;
    } else {
      at::AutoDispatchBelowADInplaceOrView below;
      out[0] = softmax_backward_op().call(dy, y, dim, scale, ctx->saved_data["causal"].toBool());
    }
    return out;
  }
};

struct LogSoftmax : torch::autograd::Function<LogSoftmax> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t dim) {
    at::AutoDispatchBelowADInplaceOrView below;
    at::Tensor y = log_softmax_op().call(x, dim);
    ctx->save_for_backward({y});
    ctx->saved_data["dim"] = dim;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(2);
    const at::Tensor& dy = grads[0];
    if (!dy.defined()) return out;
    const at::Tensor y = ctx->get_saved_variables()[0];
    const int64_t dim = ctx->saved_data["dim"].toInt();
    if (differentiable_backward()) {
      out[0] = at::_log_softmax_backward_data(dy, y, dim, y.scalar_type());
    } else {
      at::AutoDispatchBelowADInplaceOrView below;
      out[0] = log_softmax_backward_op().call(dy, y, dim);
    }
    return out;
  }
};

// softmax(scale * x) with keys j > i masked over the last two dims, in ATen ops.
at::Tensor softmax_composite(const at::Tensor& x, int64_t dim, double scale, bool causal) {
  at::Tensor z = x * scale;
  if (causal) {
    const int64_t q = x.size(-2), k = x.size(-1);
    const at::Tensor masked = at::ones({q, k}, x.options().dtype(at::kBool)).triu(1);
    z = z.masked_fill(masked, -std::numeric_limits<double>::infinity());
  }
  return at::softmax(z, dim);
}

at::Tensor softmax_autograd(const at::Tensor& x, int64_t dim, double scale, bool causal) {
  if (composite(x)) {
    if (!functorch_active()) {  // the kernel's argument checks: a bad call fails as usual
      at::AutoDispatchBelowADInplaceOrView below;
      softmax_op().call(x, dim, scale, causal);
    }
    return softmax_composite(x, dim, scale, causal);
  }
  if (!must_record(x)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return softmax_op().call(x, dim, scale, causal);
  }
  return Softmax::apply(x, dim, scale, causal);
}

at::Tensor log_softmax_autograd(const at::Tensor& x, int64_t dim) {
  if (composite(x)) {
    if (!functorch_active()) {
      at::AutoDispatchBelowADInplaceOrView below;
      log_softmax_op().call(x, dim);
    }
    return at::log_softmax(x, dim);
  }
  if (!must_record(x)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return log_softmax_op().call(x, dim);
  }
  return LogSoftmax::apply(x, dim);
}

}  // namespace

TORCH_LIBRARY_IMPL(fused, Autograd, m) {
  m.impl("softmax", &softmax_autograd);
  m.impl("log_softmax", &log_softmax_autograd);
  m.impl("softmax_backward", torch::autograd::autogradNotImplementedFallback());
  m.impl("log_softmax_backward", torch::autograd::autogradNotImplementedFallback());
}

}  // namespace fused::autograd
