// The typed dispatcher handle of every fused op, one place for their C++ signatures: the
// autograd and autocast kernels (csrc/autograd/) and the direct Python entry points
// (csrc/fast_calls.cpp) call the ops through these. Each is looked up once (FUSED_OP).
#pragma once
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <array>
#include <optional>
#include <tuple>

#include "autograd/common.h"

namespace fused::autograd {

using OptT = std::optional<at::Tensor>;
using OptStr = std::optional<c10::string_view>;
using OptGen = std::optional<at::Generator>;
using Tensor2 = std::tuple<at::Tensor, at::Tensor>;
using Tensor3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using Tensor4 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

FUSED_OP(gelu_op, "fused::gelu", at::Tensor(const at::Tensor&, c10::string_view))
FUSED_OP(gelu_backward_op, "fused::gelu_backward",
         at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view))
FUSED_OP(layer_norm_op, "fused::layer_norm",
         Tensor3(const at::Tensor&, at::IntArrayRef, const OptT&, const OptT&, double))
FUSED_OP(layer_norm_backward_op, "fused::layer_norm_backward",
         Tensor3(const at::Tensor&, const at::Tensor&, at::IntArrayRef, const at::Tensor&,
                 const at::Tensor&, const OptT&, const OptT&, std::array<bool, 2>))
FUSED_OP(rms_norm_op, "fused::rms_norm",
         Tensor2(const at::Tensor&, at::IntArrayRef, const OptT&, std::optional<double>))
FUSED_OP(rms_norm_backward_op, "fused::rms_norm_backward",
         Tensor2(const at::Tensor&, const at::Tensor&, at::IntArrayRef, const at::Tensor&,
                 const OptT&, bool))
FUSED_OP(add_layer_norm_op, "fused::add_layer_norm",
         Tensor4(const at::Tensor&, const at::Tensor&, at::IntArrayRef, const OptT&, const OptT&,
                 double, bool))
FUSED_OP(add_layer_norm_backward_op, "fused::add_layer_norm_backward",
         Tensor3(const at::Tensor&, const OptT&, const at::Tensor&, at::IntArrayRef,
                 const at::Tensor&, const at::Tensor&, const OptT&, const OptT&,
                 std::array<bool, 2>))
FUSED_OP(add_rms_norm_op, "fused::add_rms_norm",
         Tensor3(const at::Tensor&, const at::Tensor&, at::IntArrayRef, const OptT&,
                 std::optional<double>, bool))
FUSED_OP(add_rms_norm_backward_op, "fused::add_rms_norm_backward",
         Tensor2(const at::Tensor&, const OptT&, const at::Tensor&, at::IntArrayRef,
                 const at::Tensor&, const OptT&, bool))
FUSED_OP(softmax_op, "fused::softmax", at::Tensor(const at::Tensor&, int64_t, double, bool))
FUSED_OP(softmax_backward_op, "fused::softmax_backward",
         at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, double, bool))
FUSED_OP(log_softmax_op, "fused::log_softmax", at::Tensor(const at::Tensor&, int64_t))
FUSED_OP(log_softmax_backward_op, "fused::log_softmax_backward",
         at::Tensor(const at::Tensor&, const at::Tensor&, int64_t))
FUSED_OP(dropout_op, "fused::dropout", Tensor2(const at::Tensor&, double, bool, OptGen))
FUSED_OP(dropout_backward_op, "fused::dropout_backward",
         at::Tensor(const at::Tensor&, const at::Tensor&, double))
FUSED_OP(bias_dropout_add_op, "fused::bias_dropout_add",
         Tensor2(const at::Tensor&, const OptT&, const at::Tensor&, double, bool, OptGen))
FUSED_OP(bias_dropout_add_backward_op, "fused::bias_dropout_add_backward",
         Tensor2(const at::Tensor&, const at::Tensor&, double))
using Tensor5 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
FUSED_OP(dropout_add_layer_norm_op, "fused::dropout_add_layer_norm",
         Tensor5(const at::Tensor&, const at::Tensor&, at::IntArrayRef, const OptT&, const OptT&,
                 double, double, bool, const OptT&, bool, OptGen))
FUSED_OP(dropout_add_rms_norm_op, "fused::dropout_add_rms_norm",
         Tensor4(const at::Tensor&, const at::Tensor&, at::IntArrayRef, const OptT&,
                 std::optional<double>, double, bool, const OptT&, bool, OptGen))
FUSED_OP(matmul_op, "fused::matmul", at::Tensor(const at::Tensor&, const at::Tensor&))
FUSED_OP(linear_op, "fused::linear",
         at::Tensor(const at::Tensor&, const at::Tensor&, const OptT&, OptStr))
FUSED_OP(linear_fwd_op, "fused::linear_fwd",
         Tensor2(const at::Tensor&, const at::Tensor&, const OptT&, c10::string_view))
FUSED_OP(linear_act_backward_op, "fused::linear_act_backward",
         Tensor2(const at::Tensor&, const at::Tensor&, c10::string_view, bool))
FUSED_OP(swiglu_op, "fused::swiglu", at::Tensor(const at::Tensor&, const at::Tensor&))
FUSED_OP(swiglu_backward_op, "fused::swiglu_backward",
         Tensor2(const at::Tensor&, const at::Tensor&, const at::Tensor&))
FUSED_OP(geglu_op, "fused::geglu",
         at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view))
FUSED_OP(geglu_backward_op, "fused::geglu_backward",
         Tensor2(const at::Tensor&, const at::Tensor&, const at::Tensor&, c10::string_view))

FUSED_OP(xent_op, "fused::cross_entropy",
         Tensor2(const at::Tensor&, const at::Tensor&, int64_t, double, double, bool,
                 c10::string_view))
FUSED_OP(xent_backward_op, "fused::cross_entropy_backward",
         at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                    int64_t, double, double, c10::string_view))
FUSED_OP(xent_backward_inplace_op, "fused::cross_entropy_backward_",
         void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
              double, double, c10::string_view))
FUSED_OP(xent_with_grad_op, "fused::cross_entropy_with_grad",
         Tensor2(const at::Tensor&, const at::Tensor&, int64_t, double, double, bool))
FUSED_OP(xent_scale_op, "fused::cross_entropy_scale_", void(const at::Tensor&, const at::Tensor&))
FUSED_OP(lce_op, "fused::linear_cross_entropy",
         Tensor4(const at::Tensor&, const at::Tensor&, const at::Tensor&, const OptT&, int64_t,
                 double, double, bool, int64_t, std::array<bool, 3>))
FUSED_OP(mlp_op, "fused::mlp",
         at::Tensor(const at::Tensor&, const at::Tensor&, const OptT&, const at::Tensor&,
                    const OptT&, c10::string_view, bool))
FUSED_OP(linear_dact_op, "fused::linear_dact",
         Tensor2(const at::Tensor&, const at::Tensor&, const at::Tensor&, c10::string_view, bool))

}  // namespace fused::autograd
