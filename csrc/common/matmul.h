// Host-side entry points of the matmul / linear ops, shared by the CPU (cpu/matmul.cpp) and
// CUDA (cuda/matmul.cu) kernels: argument checks (common/matmul_checks.h), the activation
// argument, and the registration. A backend supplies three functions, called with checked
// arguments:
//   at::Tensor run_matmul(a, b)                                   torch.matmul of 2-D / 3-D
//   std::tuple<at::Tensor, at::Tensor> run_linear(x, w, bias, act, want_preact)
//       (act(x W^T + bias), and x W^T + bias when want_preact), shaped [..., out]; for a
//       gated act (weight [2N, K]) the output is [..., N] and the pre-activation [..., 2N]
//   std::tuple<at::Tensor, at::Tensor> run_act_backward(grad_out, preact, act, bias_grad)
//       (dZ = grad_out * act'(preact), and its column sums when bias_grad; gated: dZ =
//       [dgate, dup] of the gated backward, [..., 2N])
// and registers the entry points instantiated with them (FUSED_REGISTER_MATMUL_OPS).
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <optional>
#include <tuple>

#include "common/matmul_checks.h"

namespace fused {

using MatmulRun = at::Tensor (*)(const at::Tensor&, const at::Tensor&);
using LinearRun = std::tuple<at::Tensor, at::Tensor> (*)(const at::Tensor&, const at::Tensor&,
                                                         const std::optional<at::Tensor>&,
                                                         LinearAct, bool);
using ActBackwardRun = std::tuple<at::Tensor, at::Tensor> (*)(const at::Tensor&, const at::Tensor&,
                                                              LinearAct, bool);

template <MatmulRun RUN>
at::Tensor matmul_op(const at::Tensor& a, const at::Tensor& b) {
  check_matmul_args(a, b, "fused::matmul");
  return RUN(a, b);
}

template <LinearRun RUN>
at::Tensor linear_op(const at::Tensor& x, const at::Tensor& w,
                     const std::optional<at::Tensor>& bias,
                     std::optional<c10::string_view> activation) {
  const char* op = "fused::linear";
  check_linear_args(x, w, bias, op);
  const LinearAct act = parse_linear_activation(activation, op);
  check_gated_weight(w, act, op);
  return std::get<0>(RUN(x, w, bias, act, false));
}

template <LinearRun RUN>
std::tuple<at::Tensor, at::Tensor> linear_fwd_op(const at::Tensor& x, const at::Tensor& w,
                                                 const std::optional<at::Tensor>& bias,
                                                 c10::string_view activation) {
  const char* op = "fused::linear_fwd";
  check_linear_args(x, w, bias, op);
  const LinearAct act = parse_required_activation(activation, op);
  check_gated_weight(w, act, op);
  return RUN(x, w, bias, act, true);
}

template <ActBackwardRun RUN>
std::tuple<at::Tensor, at::Tensor> linear_act_backward_op(const at::Tensor& grad_out,
                                                          const at::Tensor& preact,
                                                          c10::string_view activation,
                                                          bool bias_grad) {
  const char* op = "fused::linear_act_backward";
  const LinearAct act = parse_required_activation(activation, op);
  check_act_backward_args(grad_out, preact, act, op);
  return RUN(grad_out, preact, act, bias_grad);
}

// Registers the four matmul ops of one backend: m.impl for the entry points above.
#define FUSED_REGISTER_MATMUL_OPS(m, RUN_MATMUL, RUN_LINEAR, RUN_ACT_BACKWARD)         \
  do {                                                                                 \
    m.impl("matmul", &::fused::matmul_op<RUN_MATMUL>);                                 \
    m.impl("linear", &::fused::linear_op<RUN_LINEAR>);                                 \
    m.impl("linear_fwd", &::fused::linear_fwd_op<RUN_LINEAR>);                         \
    m.impl("linear_act_backward", &::fused::linear_act_backward_op<RUN_ACT_BACKWARD>); \
  } while (0)

}  // namespace fused
