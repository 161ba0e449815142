// gelu on CUDA: one pass over memory, forward and backward.
// Bytes: forward reads x and writes y (2 * numel * sizeof(T)); backward reads dy and x and
// writes dx (3 * numel * sizeof(T)). Roofline: docs/design/gelu.md#roofline-and-standing.
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/dispatch.h"
#include "common/elementwise.cuh"
#include "common/gelu_math.h"
#include "common/layout.h"

namespace fused {
namespace {

template <typename T, GeluKind K>
struct GeluFwd {
  __device__ float operator()(float x) const { return gelu_fwd_for<T, K>(x); }
};

template <typename T, GeluKind K>
struct GeluBwd {
  __device__ float operator()(float dy, float x) const { return dy * gelu_grad_for<T, K>(x); }
};

// Calls fn(std::integral_constant<GeluKind, K>{}) for the runtime kind.
template <typename Fn>
void dispatch_gelu_kind(GeluKind kind, Fn fn) {
  if (kind == GeluKind::kNone) {
    fn(std::integral_constant<GeluKind, GeluKind::kNone>{});
  } else {
    fn(std::integral_constant<GeluKind, GeluKind::kTanh>{});
  }
}

at::Tensor gelu_cuda(const at::Tensor& x_in, c10::string_view approximate) {
  const char* op = "fused::gelu";
  check_float(x_in, op, "x");
  GeluKind kind = parse_gelu_approximate(approximate, op);
  c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = flat_compatible<1>({x_in})[0];
  at::Tensor y = like_at_phase(x);
  FUSED_DISPATCH_CUDA(x.scalar_type(), "fused::gelu", [&] {
    dispatch_gelu_kind(kind, [&](auto k) {
      launch_elementwise<scalar_t, 1>(GeluFwd<scalar_t, decltype(k)::value>{},
                                      y.mutable_data_ptr<scalar_t>(),
                                      Ptrs<scalar_t, 1>{{x.const_data_ptr<scalar_t>()}}, x.numel());
    });
  });
  return y;
}

at::Tensor gelu_backward_cuda(const at::Tensor& grad_out, const at::Tensor& x_in,
                              c10::string_view approximate) {
  const char* op = "fused::gelu_backward";
  check_float(x_in, op, "x");
  check_same_device(grad_out, x_in, op, "grad_out", "x");
  check_same_dtype(grad_out, x_in, op, "grad_out", "x");
  check_same_shape(grad_out, x_in, op, "grad_out", "x");
  GeluKind kind = parse_gelu_approximate(approximate, op);
  c10::cuda::CUDAGuard guard(x_in.device());
  const auto flat = flat_compatible<2>({x_in, grad_out});
  const at::Tensor& x = flat[0];
  const at::Tensor& dy = flat[1];
  at::Tensor dx = like_at_phase(x);
  FUSED_DISPATCH_CUDA(x.scalar_type(), "fused::gelu_backward", [&] {
    dispatch_gelu_kind(kind, [&](auto k) {
      launch_elementwise<scalar_t, 2>(
          GeluBwd<scalar_t, decltype(k)::value>{}, dx.mutable_data_ptr<scalar_t>(),
          Ptrs<scalar_t, 2>{{dy.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>()}},
          x.numel());
    });
  });
  return dx;
}

}  // namespace

TORCH_LIBRARY_IMPL(fused, CUDA, m) {
  m.impl("gelu", &gelu_cuda);
  m.impl("gelu_backward", &gelu_backward_cuda);
}

}  // namespace fused
