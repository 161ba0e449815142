// gelu on CPU: the fallback and what CI exercises. Plain loops, parallel over chunks,
// math in float (double for float64).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include "common/checks.h"
#include "common/dispatch.h"
#include "common/layout.h"

namespace fused {
namespace {

template <typename T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

at::Tensor gelu_cpu(const at::Tensor& x, c10::string_view approximate) {
  check_float(x, "fused::gelu", "x");
  GeluKind kind = parse_gelu_approximate(approximate, "fused::gelu");
  const at::Tensor xc = flat_compatible<1>({x})[0];
  at::Tensor y = at::empty_like(xc);
  FUSED_DISPATCH_CPU(x.scalar_type(), "fused::gelu", [&] {
    const scalar_t* in = xc.const_data_ptr<scalar_t>();
    scalar_t* out = y.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, xc.numel(), 32768, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        acc_t<scalar_t> v = static_cast<acc_t<scalar_t>>(in[i]);
        out[i] = static_cast<scalar_t>(kind == GeluKind::kNone ? gelu_fwd<GeluKind::kNone>(v)
                                                               : gelu_fwd<GeluKind::kTanh>(v));
      }
    });
  });
  return y;
}

at::Tensor gelu_backward_cpu(const at::Tensor& grad_out, const at::Tensor& x,
                             c10::string_view approximate) {
  const char* op = "fused::gelu_backward";
  check_float(x, op, "x");
  check_same_dtype(grad_out, x, op, "grad_out", "x");
  check_same_device(grad_out, x, op, "grad_out", "x");
  check_same_shape(grad_out, x, op, "grad_out", "x");
  GeluKind kind = parse_gelu_approximate(approximate, op);
  const auto flat = flat_compatible<2>({x, grad_out});
  const at::Tensor& xc = flat[0];
  const at::Tensor& gc = flat[1];
  at::Tensor dx = at::empty_like(xc);
  FUSED_DISPATCH_CPU(x.scalar_type(), "fused::gelu_backward", [&] {
    const scalar_t* in = xc.const_data_ptr<scalar_t>();
    const scalar_t* g = gc.const_data_ptr<scalar_t>();
    scalar_t* out = dx.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, xc.numel(), 32768, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        acc_t<scalar_t> v = static_cast<acc_t<scalar_t>>(in[i]);
        acc_t<scalar_t> d =
            kind == GeluKind::kNone ? gelu_grad<GeluKind::kNone>(v) : gelu_grad<GeluKind::kTanh>(v);
        out[i] = static_cast<scalar_t>(static_cast<acc_t<scalar_t>>(g[i]) * d);
      }
    });
  });
  return dx;
}

}  // namespace

TORCH_LIBRARY_IMPL(fused, CPU, m) {
  m.impl("gelu", &gelu_cpu);
  m.impl("gelu_backward", &gelu_backward_cpu);
}

}  // namespace fused
