// The gated activations' math in differentiable ATen ops, for the create_graph and torch.func
// paths of swiglu / geglu (autograd/gated.cpp) and the gated linear (autograd/matmul.cpp).
#pragma once
#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/silu.h>

#include <string>

namespace fused::autograd {

// act(x): silu when approximate is empty, else gelu with that approximate ("none" / "tanh").
inline at::Tensor gate_act(const at::Tensor& x, const std::string& approximate) {
  return approximate.empty() ? at::silu(x) : at::gelu(x, approximate);
}

// dy * act'(x), differentiable again: gelu_backward has a derivative in ATen, silu_backward
// has none, so silu's is written out, s (1 + x (1 - s)) with s = sigmoid(x).
inline at::Tensor gate_act_backward(const at::Tensor& dy, const at::Tensor& x,
                                    const std::string& approximate) {
  if (!approximate.empty()) return at::gelu_backward(dy, x, approximate);
  const at::Tensor s = at::sigmoid(x);
  return dy * s * (1 + x * (1 - s));
}

}  // namespace fused::autograd
