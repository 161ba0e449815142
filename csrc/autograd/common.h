// Shared by the C++ autograd of every op (csrc/autograd/<op>.cpp).
//
// Each forward op has a torch::autograd::Function registered on the Autograd dispatch key:
// recording the graph costs a few C++ allocations instead of a Python autograd.Function.
// The Function's forward calls the op again below autograd (the CPU / CUDA / Meta kernel),
// and its backward has two paths:
//   - the usual one (create_graph=False): the op's fused backward kernel, also below autograd;
//   - create_graph=True (double backward, gradient penalties, torch.func.grad / jacrev /
//     hessian): the same gradient written with differentiable ATen ops, so that the
//     gradient has a graph of its own. Never a silent zero.
// Two things a C++ custom Function cannot carry: forward-mode AD (torch.func.jvp / jacfwd,
// torch.autograd.forward_ad) and the torch.func transforms (grad, vjp, jacrev, vmap,
// hessian: torch refuses C++ Functions under them). In both cases the op's differentiable
// ATen composition runs instead (composite()), which carries them; its values agree with
// the kernels' within rounding. Ordinary training never takes that path.
#pragma once
#include <ATen/FuncTorchTLS.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>

namespace fused::autograd {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The typed dispatcher handle of a fused op; callers keep it in a function-local static
// (FUSED_OP below) so the schema lookup happens once.
template <class Sig>
c10::TypedOperatorHandle<Sig> lookup_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").template typed<Sig>();
}

// Defines `FN()`, the typed handle of the op NAME whose C++ signature is the rest.
#define FUSED_OP(FN, NAME, ...)                                                 \
  inline const c10::TypedOperatorHandle<__VA_ARGS__>& FN() {                    \
    static const auto handle = ::fused::autograd::lookup_op<__VA_ARGS__>(NAME); \
    return handle;                                                              \
  }

inline bool has_tangent(const at::Tensor& t) {
  return t.defined() && t._fw_grad(/*level=*/0).defined();
}
inline bool has_tangent(const std::optional<at::Tensor>& t) {
  return t.has_value() && has_tangent(*t);
}
// A torch.func transform is running. Its TLS outlives the transforms that made it, so the
// test is the one torch::autograd::Function::apply itself makes (it throws while a
// transform's layer is active); the exception costs only under a transform.
inline bool functorch_active() {
  const auto& tls = at::functorch::functorchTLSAccessor();
  if (!tls) return false;
  try {
    tls->checkSupportsCppAutogradFunction();
    return false;
  } catch (const c10::Error&) {
    return true;
  }
}

// Whether the call must take the op's ATen composition (see above).
template <class... Ts>
bool composite(const Ts&... ts) {
  return functorch_active() || (has_tangent(ts) || ...);
}

inline bool requires_grad(const at::Tensor& t) { return t.defined() && t.requires_grad(); }
inline bool requires_grad(const std::optional<at::Tensor>& t) {
  return t.has_value() && requires_grad(*t);
}
// Whether this call must be recorded: grad mode on and some input requires grad. When not
// (inference, torch.no_grad, frozen parameters), the op is called straight below autograd:
// no graph node, no saved tensors.
template <class... Ts>
bool must_record(const Ts&... ts) {
  return c10::GradMode::is_enabled() && (requires_grad(ts) || ...);
}

// create_graph=True: the backward must itself be differentiable.
inline bool differentiable_backward() { return c10::GradMode::is_enabled(); }

inline at::Tensor value_or_undefined(const std::optional<at::Tensor>& t) {
  return t.has_value() ? *t : at::Tensor();
}

// The autograd edge index of each tensor argument: Functions number edges over the defined
// tensor arguments only (an absent optional weight takes no edge).
struct EdgeIndex {
  int64_t next = 0;
  int64_t take(bool defined) { return defined ? next++ : -1; }
};

inline bool needs_grad(AutogradContext* ctx, const char* key) {
  const int64_t i = ctx->saved_data[key].toInt();
  return i >= 0 && ctx->needs_input_grad(static_cast<size_t>(i));
}

}  // namespace fused::autograd
