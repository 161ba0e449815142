// The linear activations' math in differentiable ATen ops, for the create_graph and torch.func
// paths of linear (autograd/matmul.cpp) and mlp (autograd/mlp.cpp).
#pragma once
#include <ATen/ops/cat.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/sum.h>

#include <string>

#include "autograd/gated.h"

namespace fused::autograd {

// torch.nn.functional.gelu's `approximate` for an activation name.
inline c10::string_view gelu_approximate(const std::string& activation) {
  return activation == "gelu_tanh" || activation == "geglu_tanh" ? "tanh" : "none";
}

inline bool gated(const std::string& act) {
  return act == "swiglu" || act == "geglu" || act == "geglu_tanh";
}

// gate_act's `approximate` (autograd/gated.h) for a gated activation name: empty for silu.
inline std::string gate_approximate(const std::string& act) {
  return act == "swiglu" ? std::string() : std::string(gelu_approximate(act));
}

// act(z) in ATen ops (forward-mode AD, torch.func, create_graph): a gated form takes
// z = [gate, up] and gives act(gate) * up.
inline at::Tensor act_composite(const at::Tensor& z, const std::string& act) {
  if (act.empty()) return z;
  if (!gated(act)) return at::gelu(z, gelu_approximate(act));
  const auto h = z.chunk(2, -1);
  return gate_act(h[0], gate_approximate(act)) * h[1];
}

// dZ = dY act'(Z) in differentiable ATen ops (create_graph); gated: [dgate, dup].
inline at::Tensor act_backward_composite(const at::Tensor& dy, const at::Tensor& z,
                                         const std::string& act) {
  if (!gated(act)) return at::gelu_backward(dy, z, gelu_approximate(act));
  const auto h = z.chunk(2, -1);
  const at::Tensor dyu = dy * h[1];
  const std::string approx = gate_approximate(act);
  return at::cat({gate_act_backward(dyu, h[0], approx), dy * gate_act(h[0], approx)}, -1);
}

inline at::Tensor bias_grad_of(const at::Tensor& dz2) {
  const auto acc = dz2.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  return dz2.sum(0, false, acc).to(dz2.scalar_type());
}

}  // namespace fused::autograd
