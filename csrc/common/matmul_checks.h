// Argument checks and the activation argument of the matmul / linear ops, shared by their
// CPU (cpu/matmul.cpp) and CUDA (cuda/matmul.cu) kernels so both reject the same inputs
// with the same messages.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <optional>
#include <string>
#include <string_view>

#include "common/checks.h"
#include "common/gated.h"

namespace fused {

// The epilogue activation: None, "gelu" (erf) or "gelu_tanh"; or a gated one, "swiglu",
// "geglu", "geglu_tanh": weight [2N, K], y = act(z[..., :N]) * z[..., N:]. Values match
// matmul::Act.
enum class LinearAct : int {
  kNone = 0,
  kGelu = 1,
  kGeluTanh = 2,
  kSwiglu = 3,
  kGeglu = 4,
  kGegluTanh = 5
};

inline bool is_gated(LinearAct a) { return static_cast<int>(a) >= 3; }

// The GatedKind (common/gated.h) of a gated activation.
inline GatedKind gated_kind(LinearAct a) {
  return a == LinearAct::kSwiglu  ? GatedKind::kSilu
         : a == LinearAct::kGeglu ? GatedKind::kGelu
                                  : GatedKind::kGeluTanh;
}

#define FUSED_LINEAR_ACTIVATIONS "'gelu', 'gelu_tanh', 'swiglu', 'geglu' or 'geglu_tanh'"

inline LinearAct parse_linear_activation(std::optional<c10::string_view> s, const char* op) {
  if (!s.has_value()) return LinearAct::kNone;
  std::string_view v(s->data(), s->size());
  if (v == "gelu") return LinearAct::kGelu;
  if (v == "gelu_tanh") return LinearAct::kGeluTanh;
  if (v == "swiglu") return LinearAct::kSwiglu;
  if (v == "geglu") return LinearAct::kGeglu;
  if (v == "geglu_tanh") return LinearAct::kGegluTanh;
  TORCH_CHECK(false, op,
              ": expected activation to be None, " FUSED_LINEAR_ACTIVATIONS ", but got '",
              std::string(v), "'");
}

// The activation argument's string for act (parse_linear_activation's inverse; "" for None).
inline c10::string_view linear_activation_name(LinearAct act) {
  switch (act) {
    case LinearAct::kGelu:
      return "gelu";
    case LinearAct::kGeluTanh:
      return "gelu_tanh";
    case LinearAct::kSwiglu:
      return "swiglu";
    case LinearAct::kGeglu:
      return "geglu";
    case LinearAct::kGegluTanh:
      return "geglu_tanh";
    default:
      return "";
  }
}

// The ops that exist for an activation (linear_fwd saves its input, linear_act_backward
// differentiates it): any but None.
inline LinearAct parse_required_activation(c10::string_view s, const char* op) {
  const LinearAct act = parse_linear_activation(s, op);
  TORCH_CHECK(act != LinearAct::kNone, op, ": expected activation " FUSED_LINEAR_ACTIVATIONS);
  return act;
}

// A gated activation splits the weight's rows in two halves: their count must be even.
inline void check_gated_weight(const at::Tensor& w, LinearAct act, const char* op) {
  if (!is_gated(act)) return;
  TORCH_CHECK(w.size(0) % 2 == 0, op,
              ": a gated activation needs weight of shape [2N, in_features] (gate rows, then up "
              "rows): expected an even number of rows, but got weight of shape ",
              w.sizes());
}

// matmul(a, b): torch.matmul semantics for 2-D and 3-D operands; 3-D batch sizes must match
// or one of them be 1 (broadcast).
inline void check_matmul_args(const at::Tensor& a, const at::Tensor& b, const char* op) {
  check_float(a, op, "a");
  check_same_dtype(a, b, op, "a", "b");
  check_same_device(a, b, op, "a", "b");
  TORCH_CHECK(a.dim() == 2 || a.dim() == 3, op, ": expected a to be 2-D or 3-D, but got ", a.dim(),
              "-D with shape ", a.sizes());
  TORCH_CHECK(b.dim() == 2 || b.dim() == 3, op, ": expected b to be 2-D or 3-D, but got ", b.dim(),
              "-D with shape ", b.sizes());
  TORCH_CHECK(a.size(-1) == b.size(-2), op, ": shapes ", a.sizes(), " and ", b.sizes(),
              " cannot be multiplied (a.size(-1) = ", a.size(-1),
              " must equal b.size(-2) = ", b.size(-2), ")");
  if (a.dim() == 3 && b.dim() == 3) {
    TORCH_CHECK(a.size(0) == b.size(0) || a.size(0) == 1 || b.size(0) == 1, op,
                ": batch sizes of a ", a.sizes(), " and b ", b.sizes(),
                " must match or one of them be 1");
  }
}

// linear(x, weight, bias): F.linear semantics, x [..., in], weight [out, in], bias [out].
inline void check_linear_args(const at::Tensor& x, const at::Tensor& w,
                              const std::optional<at::Tensor>& bias, const char* op) {
  check_float(x, op, "x");
  check_same_dtype(x, w, op, "x", "weight");
  check_same_device(x, w, op, "x", "weight");
  TORCH_CHECK(x.dim() >= 1, op, ": expected x to have at least 1 dimension, but got a scalar");
  TORCH_CHECK(w.dim() == 2, op,
              ": expected weight to be 2-D [out_features, in_features], "
              "but got shape ",
              w.sizes());
  TORCH_CHECK(x.size(-1) == w.size(1), op, ": x.size(-1) = ", x.size(-1),
              " must equal weight.size(1) (in_features) = ", w.size(1), " (x ", x.sizes(),
              ", weight ", w.sizes(), ")");
  if (bias.has_value()) {
    check_same_dtype(x, *bias, op, "x", "bias");
    check_same_device(x, *bias, op, "x", "bias");
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == w.size(0), op, ": expected bias of shape [",
                w.size(0), "] (out_features), but got ", bias->sizes());
  }
}

// linear_act_backward(grad_out, preact): same dtype, device; at least 1-D; the same shape, or
// for a gated activation preact [..., 2N] and grad_out [..., N].
inline void check_act_backward_args(const at::Tensor& g, const at::Tensor& z, LinearAct act,
                                    const char* op) {
  check_float(z, op, "preact");
  check_same_dtype(g, z, op, "grad_out", "preact");
  check_same_device(g, z, op, "grad_out", "preact");
  TORCH_CHECK(z.dim() >= 1, op, ": expected preact to have at least 1 dimension");
  if (!is_gated(act)) {
    check_same_shape(g, z, op, "grad_out", "preact");
    return;
  }
  const bool ok = g.dim() == z.dim() && z.size(-1) % 2 == 0 && g.size(-1) * 2 == z.size(-1) &&
                  g.sizes().slice(0, g.dim() - 1) == z.sizes().slice(0, z.dim() - 1);
  TORCH_CHECK(ok, op,
              ": a gated activation expects preact [..., 2N] and grad_out [..., N], but got ",
              "preact ", z.sizes(), " and grad_out ", g.sizes());
}

}  // namespace fused
