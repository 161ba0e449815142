// Autograd of fused::swiglu and fused::geglu (see common.h for the scheme). Backward of
// y = act(gate) * up: dgate = dy * up * act'(gate), dup = dy * act(gate), one fused kernel
// (swiglu_backward / geglu_backward); under create_graph the same in ATen ops
// (autograd/gated.h).
#include <torch/library.h>

#include "autograd/common.h"
#include "autograd/gated.h"
#include "autograd/ops.h"

namespace fused::autograd {
namespace {

// The activation of one call: silu (swiglu), or gelu with its `approximate` (geglu).
struct GatedAct {
  bool silu;
  std::string approximate;  // geglu's; empty for swiglu

  at::Tensor act(const at::Tensor& x) const { return gate_act(x, approximate); }
  // dy * act'(x), differentiable.
  at::Tensor grad(const at::Tensor& dy, const at::Tensor& x) const {
    return gate_act_backward(dy, x, approximate);
  }
  at::Tensor call(const at::Tensor& gate, const at::Tensor& up) const {
    return silu ? swiglu_op().call(gate, up) : geglu_op().call(gate, up, approximate);
  }
  Tensor2 call_backward(const at::Tensor& dy, const at::Tensor& gate, const at::Tensor& up) const {
    return silu ? swiglu_backward_op().call(dy, gate, up)
                : geglu_backward_op().call(dy, gate, up, approximate);
  }
};

struct Gated : torch::autograd::Function<Gated> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up,
                            c10::string_view kind) {
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->saved_data["kind"] = std::string(kind);
    ctx->save_for_backward({gate, up});
    return act_of(std::string(kind)).call(gate, up);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor& dy = grads[0];
    if (!dy.defined()) return variable_list(3);
    const auto s = ctx->get_saved_variables();
    const at::Tensor &gate = s[0], &up = s[1];
    const GatedAct a = act_of(ctx->saved_data["kind"].toStringRef());
    if (differentiable_backward()) return {a.grad(dy * up, gate), dy * a.act(gate), at::Tensor()};
    at::AutoDispatchBelowADInplaceOrView below;
    auto [dgate, dup] = a.call_backward(dy, gate, up);
    return {dgate, dup, at::Tensor()};
  }

  // kind: "silu", or the geglu's approximate ("none" / "tanh").
  static GatedAct act_of(const std::string& kind) {
    return kind == "silu" ? GatedAct{true, ""} : GatedAct{false, kind};
  }
};

at::Tensor gated_autograd(const at::Tensor& gate, const at::Tensor& up, const std::string& kind) {
  const GatedAct a = Gated::act_of(kind);
  if (composite(gate, up)) return a.act(gate) * up;
  if (must_record(gate, up)) return Gated::apply(gate, up, kind);
  at::AutoDispatchBelowADInplaceOrView below;
  return a.call(gate, up);
}

at::Tensor swiglu_autograd(const at::Tensor& gate, const at::Tensor& up) {
  return gated_autograd(gate, up, "silu");
}

at::Tensor geglu_autograd(const at::Tensor& gate, const at::Tensor& up,
                          c10::string_view approximate) {
  // The kernels check the value too; checked here first so that the composite path (which
  // at::gelu would reject with its own message) fails the same way.
  TORCH_CHECK(approximate == "none" || approximate == "tanh",
              "fused::geglu: expected approximate to be 'none' or 'tanh', but got '",
              std::string(approximate), "'");
  return gated_autograd(gate, up, std::string(approximate));
}

}  // namespace

TORCH_LIBRARY_IMPL(fused, Autograd, m) {
  m.impl("swiglu", &swiglu_autograd);
  m.impl("geglu", &geglu_autograd);
  m.impl("swiglu_backward", torch::autograd::autogradNotImplementedFallback());
  m.impl("geglu_backward", torch::autograd::autogradNotImplementedFallback());
}

}  // namespace fused::autograd
