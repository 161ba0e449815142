// Host-side entry points of fused::mlp and fused::linear_dact, shared by the CPU (cpu/mlp.cpp)
// and CUDA (cuda/mlp.cu) kernels: argument checks and the forward, composed of the linear
// ops (whose GEMM epilogues already fuse bias + activation). A backend supplies
//   std::tuple<at::Tensor, at::Tensor> run_dact(grad_out2, weight, preact2, act, bias_grad)
//       grad_out2 [M, out], weight [out, in], preact2 [M, in] (gated: [M, 2 in]), checked;
//       returns (dZ = (grad_out2 weight) * act'(preact2), its column sums when bias_grad)
// and registers the entry points instantiated with it (FUSED_REGISTER_MLP_OPS).
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <optional>
#include <tuple>

#include "autograd/ops.h"
#include "common/matmul_checks.h"

namespace fused {

using DactRun = std::tuple<at::Tensor, at::Tensor> (*)(const at::Tensor&, const at::Tensor&,
                                                       const at::Tensor&, LinearAct, bool);

// mlp(x, w1, b1, w2, b2): x [..., C], w1 [H, C] (gated: [2H, C]), b1 [H] / [2H], w2 [C', H],
// b2 [C']; all one dtype and device.
inline void check_mlp_args(const at::Tensor& x, const at::Tensor& w1,
                           const std::optional<at::Tensor>& b1, const at::Tensor& w2,
                           const std::optional<at::Tensor>& b2, LinearAct act, const char* op) {
  check_linear_args(x, w1, b1, op);
  check_gated_weight(w1, act, op);
  check_same_dtype(x, w2, op, "x", "w2");
  check_same_device(x, w2, op, "x", "w2");
  TORCH_CHECK(w2.dim() == 2, op, ": expected w2 to be 2-D [out_features, hidden], but got shape ",
              w2.sizes());
  const int64_t hidden = is_gated(act) ? w1.size(0) / 2 : w1.size(0);
  TORCH_CHECK(w2.size(1) == hidden, op, ": w2.size(1) = ", w2.size(1),
              " must equal the hidden width ", hidden, " (w1 ", w1.sizes(),
              is_gated(act) ? ", gated: w1.size(0) / 2)" : ")");
  if (b2.has_value()) {
    check_same_dtype(x, *b2, op, "x", "b2");
    check_same_device(x, *b2, op, "x", "b2");
    TORCH_CHECK(b2->dim() == 1 && b2->size(0) == w2.size(0), op, ": expected b2 of shape [",
                w2.size(0), "] (w2.size(0)), but got ", b2->sizes());
  }
}

// run_dact composed of two ops: dH = grad_out2 weight (fused::matmul), then dZ and its column
// sums in one elementwise pass (fused::linear_act_backward). dH makes a round trip through
// memory that a GEMM epilogue computing act' saves.
inline std::tuple<at::Tensor, at::Tensor> dact_composed(const at::Tensor& g2, const at::Tensor& w,
                                                        const at::Tensor& z2, LinearAct act,
                                                        bool bias_grad) {
  const at::Tensor dh = autograd::matmul_op().call(g2, w);
  return autograd::linear_act_backward_op().call(dh, z2, linear_activation_name(act), bias_grad);
}

// The forward: two linear calls, bias + activation in the first GEMM's epilogue, bias in the
// second's. recompute only changes what autograd saves.
inline at::Tensor mlp_entry(const at::Tensor& x, const at::Tensor& w1,
                            const std::optional<at::Tensor>& b1, const at::Tensor& w2,
                            const std::optional<at::Tensor>& b2, c10::string_view activation,
                            bool /*recompute*/) {
  const char* op = "fused::mlp";
  const LinearAct act = parse_required_activation(activation, op);
  check_mlp_args(x, w1, b1, w2, b2, act, op);
  const at::Tensor h = autograd::linear_op().call(x, w1, b1, activation);
  return autograd::linear_op().call(h, w2, b2, std::nullopt);
}

// linear_dact(grad_out, weight, preact): grad_out [..., out], weight [out, in], preact
// [..., in] (gated: [..., 2 in]) with the same leading dims; one dtype and device.
inline void check_dact_args(const at::Tensor& g, const at::Tensor& w, const at::Tensor& z,
                            LinearAct act, const char* op) {
  check_float(g, op, "grad_out");
  check_same_dtype(g, w, op, "grad_out", "weight");
  check_same_dtype(g, z, op, "grad_out", "preact");
  check_same_device(g, w, op, "grad_out", "weight");
  check_same_device(g, z, op, "grad_out", "preact");
  TORCH_CHECK(w.dim() == 2, op, ": expected weight to be 2-D [out_features, in_features], but got ",
              w.sizes());
  TORCH_CHECK(g.dim() >= 1 && g.size(-1) == w.size(0), op,
              ": expected grad_out [..., out_features = ", w.size(0), "], but got ", g.sizes());
  const int64_t width = is_gated(act) ? 2 * w.size(1) : w.size(1);
  const bool ok = z.dim() == g.dim() && z.size(-1) == width &&
                  z.sizes().slice(0, z.dim() - 1) == g.sizes().slice(0, g.dim() - 1);
  TORCH_CHECK(ok, op, ": expected preact [..., ", width, "] with grad_out's leading dims ",
              g.sizes().slice(0, g.dim() - 1),
              is_gated(act) ? " (gated: 2 * weight.size(1))" : " (weight.size(1))", ", but got ",
              z.sizes());
}

template <DactRun RUN>
std::tuple<at::Tensor, at::Tensor> linear_dact_entry(const at::Tensor& grad_out,
                                                     const at::Tensor& weight,
                                                     const at::Tensor& preact,
                                                     c10::string_view activation, bool bias_grad) {
  const char* op = "fused::linear_dact";
  const LinearAct act = parse_required_activation(activation, op);
  check_dact_args(grad_out, weight, preact, act, op);
  const int64_t width = preact.size(-1);
  auto [dz, db] = RUN(grad_out.reshape({-1, weight.size(0)}), weight, preact.reshape({-1, width}),
                      act, bias_grad);
  return {dz.view(preact.sizes()), db};
}

#define FUSED_REGISTER_MLP_OPS(m, RUN_DACT)                       \
  do {                                                            \
    m.impl("mlp", &::fused::mlp_entry);                           \
    m.impl("linear_dact", &::fused::linear_dact_entry<RUN_DACT>); \
  } while (0)

}  // namespace fused
