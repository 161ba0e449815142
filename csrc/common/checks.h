// Input checks shared by every op. Each failure is a TORCH_CHECK that names the op, the
// argument, what was expected and what was given.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

namespace fused {

// CPU kernels take float64 as well (gradcheck runs there); CUDA kernels take the three
// training dtypes.
inline bool is_float_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16 || t == at::kDouble;
}

inline void check_float(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(is_float_dtype(t.scalar_type()), op, ": expected ", name,
              " to be float32, float16, bfloat16 (or float64 on CPU), but got ", t.scalar_type());
  TORCH_CHECK(t.device().is_cpu() || t.scalar_type() != at::kDouble, op, ": ", name,
              " is float64 on ", t.device(),
              "; the CUDA kernels take float32, float16 "
              "and bfloat16");
}

inline void check_same_device(const at::Tensor& a, const at::Tensor& b, const char* op,
                              const char* name_a, const char* name_b) {
  TORCH_CHECK(a.device() == b.device(), op, ": expected ", name_a, " and ", name_b,
              " on the same device, but got ", a.device(), " and ", b.device());
}

inline void check_same_dtype(const at::Tensor& a, const at::Tensor& b, const char* op,
                             const char* name_a, const char* name_b) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), op, ": expected ", name_a, " and ", name_b,
              " to have the same dtype, but got ", a.scalar_type(), " and ", b.scalar_type());
}

inline void check_same_shape(const at::Tensor& a, const at::Tensor& b, const char* op,
                             const char* name_a, const char* name_b) {
  TORCH_CHECK(a.sizes() == b.sizes(), op, ": expected ", name_a, " and ", name_b,
              " to have the same shape, but got ", a.sizes(), " and ", b.sizes());
}

}  // namespace fused

#include <string_view>
#include "common/gelu_math.h"

namespace fused {

// The `approximate` argument of gelu-like ops, as in torch.nn.functional.gelu.
inline GeluKind parse_gelu_approximate(std::string_view s, const char* op) {
  if (s == "none") return GeluKind::kNone;
  if (s == "tanh") return GeluKind::kTanh;
  TORCH_CHECK(false, op, ": expected approximate to be 'none' or 'tanh', but got '", std::string(s),
              "'");
}

}  // namespace fused
