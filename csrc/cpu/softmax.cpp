// softmax / log_softmax on CPU, forward and backward: the fallback and what CI exercises.
// Plain loops over [rows, len] rows (see common/softmax.h), parallel over rows, math in
// float (double for float64; row sums in double). The formulas are the ones the CUDA kernels use:
//   forward   v = scale * x (causal: keys j > i are -inf), m = max v, s = sum exp(v - m)
//             softmax y = exp(v - m) / s,  log_softmax y = (v - m) - log s
//   backward  softmax dx = scale * y * (dy - sum(dy * y)),  log_softmax dx = dy - exp(y) * sum(dy)
// Special values follow torch: a row whose max is -inf (all -inf) or that holds +inf or NaN
// gives NaN everywhere, masked entries included (the unfused masked_fill + softmax does too).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cmath>
#include <limits>

#include "common/checks.h"
#include "common/dispatch.h"
#include "common/softmax.h"

namespace fused {
namespace {

template <typename T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <bool LOG, typename T>
void forward_rows(const T* x, T* y, int64_t rows, int64_t len, double scale_d, int64_t causal_q) {
  using A = acc_t<T>;
  const A scale = static_cast<A>(scale_d);
  const A neg_inf = -std::numeric_limits<A>::infinity();
  at::parallel_for(0, rows, std::max<int64_t>(1, 32768 / std::max<int64_t>(len, 1)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t r = begin; r < end; ++r) {
                       const T* xr = x + r * len;
                       T* yr = y + r * len;
                       // Keys at and past `limit` are masked (-inf).
                       const int64_t limit = causal_q > 0 ? std::min(len, r % causal_q + 1) : len;
                       A m = neg_inf;
                       for (int64_t j = 0; j < limit; ++j)
                         m = std::fmax(m, static_cast<A>(xr[j]) * scale);
                       double sum =
                           0;  // row sums in double: a serial float sum loses digits on long rows
                       for (int64_t j = 0; j < limit; ++j)
                         sum += std::exp(static_cast<A>(xr[j]) * scale - m);
                       const A s = static_cast<A>(sum);
                       const A log_s = std::log(s);
                       for (int64_t j = 0; j < len; ++j) {
                         const A v = j < limit ? static_cast<A>(xr[j]) * scale : neg_inf;
                         yr[j] = static_cast<T>(LOG ? (v - m) - log_s : std::exp(v - m) / s);
                       }
                     }
                   });
}

template <bool LOG, typename T>
void backward_rows(const T* dy, const T* y, T* dx, int64_t rows, int64_t len, double scale_d,
                   int64_t causal_q) {
  using A = acc_t<T>;
  const A scale = static_cast<A>(scale_d);
  at::parallel_for(0, rows, std::max<int64_t>(1, 32768 / std::max<int64_t>(len, 1)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t r = begin; r < end; ++r) {
                       const T* dyr = dy + r * len;
                       const T* yr = y + r * len;
                       T* dxr = dx + r * len;
                       // causal: y is 0 at masked keys (j >= limit); they are not read, and dx
                       // there is the formula at dy = y = 0 (so 0), as on CUDA.
                       const int64_t limit = causal_q > 0 ? std::min(len, r % causal_q + 1) : len;
                       double sum = 0;
                       for (int64_t j = 0; j < limit; ++j) {
                         sum += LOG ? static_cast<double>(dyr[j])
                                    : static_cast<double>(dyr[j]) * static_cast<double>(yr[j]);
                       }
                       const A dot = static_cast<A>(sum);
                       for (int64_t j = 0; j < len; ++j) {
                         const A g = j < limit ? static_cast<A>(dyr[j]) : A(0);
                         const A v = j < limit ? static_cast<A>(yr[j]) : A(0);
                         dxr[j] =
                             static_cast<T>(LOG ? g - std::exp(v) * dot : scale * v * (g - dot));
                       }
                     }
                   });
}

template <bool LOG>
at::Tensor forward_cpu(const at::Tensor& x, int64_t dim, double scale, bool causal,
                       const char* op) {
  return softmax_forward(
      x, dim, causal, op,
      [&](const at::Tensor& in, at::Tensor& out, int64_t rows, int64_t len, int64_t causal_q) {
        FUSED_DISPATCH_CPU(in.scalar_type(), "fused::softmax", [&] {
          forward_rows<LOG>(in.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(), rows,
                            len, scale, causal_q);
        });
      });
}

template <bool LOG>
at::Tensor backward_cpu(const at::Tensor& grad_out, const at::Tensor& y, int64_t dim, double scale,
                        bool causal, const char* op) {
  return softmax_backward(grad_out, y, dim, causal, op,
                          [&](const at::Tensor& g, const at::Tensor& yr, at::Tensor& dx,
                              int64_t rows, int64_t len, int64_t causal_q) {
                            FUSED_DISPATCH_CPU(yr.scalar_type(), "fused::softmax_backward", [&] {
                              backward_rows<LOG>(
                                  g.const_data_ptr<scalar_t>(), yr.const_data_ptr<scalar_t>(),
                                  dx.mutable_data_ptr<scalar_t>(), rows, len, scale, causal_q);
                            });
                          });
}

at::Tensor softmax_cpu(const at::Tensor& x, int64_t dim, double scale, bool causal) {
  return forward_cpu<false>(x, dim, scale, causal, "fused::softmax");
}

at::Tensor log_softmax_cpu(const at::Tensor& x, int64_t dim) {
  return forward_cpu<true>(x, dim, 1.0, false, "fused::log_softmax");
}

at::Tensor softmax_backward_cpu(const at::Tensor& grad_out, const at::Tensor& y, int64_t dim,
                                double scale, bool causal) {
  return backward_cpu<false>(grad_out, y, dim, scale, causal, "fused::softmax_backward");
}

at::Tensor log_softmax_backward_cpu(const at::Tensor& grad_out, const at::Tensor& y, int64_t dim) {
  return backward_cpu<true>(grad_out, y, dim, 1.0, false, "fused::log_softmax_backward");
}

}  // namespace

TORCH_LIBRARY_IMPL(fused, CPU, m) {
  m.impl("softmax", &softmax_cpu);
  m.impl("log_softmax", &log_softmax_cpu);
  m.impl("softmax_backward", &softmax_backward_cpu);
  m.impl("log_softmax_backward", &log_softmax_backward_cpu);
}

}  // namespace fused
