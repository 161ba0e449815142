// fused::mlp and fused::linear_dact on CPU: the forward composed of the linear ops
// (common/mlp.h), and linear_dact as a matmul then linear_act_backward.
#include <torch/library.h>

#include "common/mlp.h"

TORCH_LIBRARY_IMPL(fused, CPU, m) { FUSED_REGISTER_MLP_OPS(m, ::fused::dact_composed); }
