// Autograd of fused::gelu (see common.h for the scheme).
#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>
#include <torch/library.h>

#include "autograd/common.h"
#include "autograd/ops.h"

namespace fused::autograd {
namespace {

struct Gelu : torch::autograd::Function<Gelu> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            c10::string_view approximate) {
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->saved_data["approximate"] = std::string(approximate);
    ctx->save_for_backward({x});
    return gelu_op().call(x, approximate);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor& dy = grads[0];
    if (!dy.defined()) return {at::Tensor(), at::Tensor()};
    const at::Tensor x = ctx->get_saved_variables()[0];
    const std::string approximate = ctx->saved_data["approximate"].toStringRef();
    if (differentiable_backward()) return {at::gelu_backward(dy, x, approximate), at::Tensor()};
    at::AutoDispatchBelowADInplaceOrView below;
    return {gelu_backward_op().call(dy, x, approximate), at::Tensor()};
  }
};

at::Tensor gelu_autograd(const at::Tensor& x, c10::string_view approximate) {
  if (composite(x)) return at::gelu(x, approximate);
  if (must_record(x)) return Gelu::apply(x, approximate);
  at::AutoDispatchBelowADInplaceOrView below;
  return gelu_op().call(x, approximate);
}

}  // namespace

TORCH_LIBRARY_IMPL(fused, Autograd, m) {
  m.impl("gelu", &gelu_autograd);
  m.impl("gelu_backward", torch::autograd::autogradNotImplementedFallback());
}

}  // namespace fused::autograd
