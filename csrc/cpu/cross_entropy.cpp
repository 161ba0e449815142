// cross_entropy on CPU, forward and backward: the fallback and what CI exercises. Plain loops
// over the rows of the logits (see common/cross_entropy.h), parallel over rows, math in
// float (double for float64 logits) with row sums in double. The formulas are the CUDA
// kernels' (eps = label_smoothing, z = z_loss, t = the row's target):
//   forward   lse = log sum_j exp(x_j),
//             loss = (1 - eps) (lse - x_t) + eps (lse - mean_j x_j) + z lse^2
//             (F.cross_entropy's label smoothing; the z-loss of PaLM), 0 where t = ignore_index
//   backward  dx_j = g ((1 + 2 z lse) softmax_j - eps / V - (1 - eps) [j = t]), 0 where ignored
// A target outside [0, V) that is not ignore_index is an error here (checked before any
// kernel runs), as in F.cross_entropy.
#include <ATen/Dispatch.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <torch/library.h>

#include <cmath>
#include <limits>

#include "common/checks.h"
#include "common/cross_entropy.h"
#include "common/dispatch.h"

namespace fused {
namespace {

template <typename T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Every target in [0, V) or ignore_index, else a TORCH_CHECK naming the first bad one.
void check_targets(const at::Tensor& target, int64_t V, int64_t ignore_index, const char* op) {
  const at::Tensor t = target.contiguous().to(at::kLong);
  const int64_t* p = t.const_data_ptr<int64_t>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    TORCH_CHECK(p[i] == ignore_index || (p[i] >= 0 && p[i] < V), op, ": target ", p[i],
                " at (flat) position ", i, " is out of bounds: expected a class in [0, ", V,
                ") or ignore_index (", ignore_index, ")");
  }
}

template <typename T, typename R>
void forward_rows(const T* x, const XentRows& l, const int64_t* target, R* loss, R* lse,
                  int64_t ignore_index, double eps_d, double z_d) {
  using A = acc_t<T>;
  const int64_t V = l.len;
  at::parallel_for(0, l.rows, std::max<int64_t>(1, 32768 / std::max<int64_t>(V, 1)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t r = begin; r < end; ++r) {
                       const int64_t t = target[r];
                       if (t == ignore_index) {
                         loss[r] = R(0);
                         lse[r] = R(0);
                         continue;
                       }
                       const T* xr = x + xent_row_offset(l, r);
                       A m = -std::numeric_limits<A>::infinity();
                       for (int64_t j = 0; j < V; ++j) m = std::fmax(m, static_cast<A>(xr[j]));
                       // An all -inf row: subtract 0 instead of -inf (sum 0, lse -inf, as torch).
                       const A off = std::isinf(m) && m < 0 ? A(0) : m;
                       double s = 0, sx = 0;
                       for (int64_t j = 0; j < V; ++j) {
                         const A v = static_cast<A>(xr[j]);
                         s += std::exp(v - off);
                         sx += v;
                       }
                       const double L = static_cast<double>(off) + std::log(s);
                       const double eps = eps_d;
                       double out = (1.0 - eps) * (L - static_cast<double>(static_cast<A>(xr[t])));
                       if (eps != 0.0) out += eps * (L - sx / static_cast<double>(V));
                       if (z_d != 0.0) out += z_d * L * L;
                       loss[r] = static_cast<R>(out);
                       lse[r] = static_cast<R>(L);
                     }
                   });
}

template <typename T, typename R>
void backward_rows(const R* grad, int64_t grad_stride, const T* x, const XentRows& lx, T* dx,
                   const XentRows& ld, const int64_t* target, const R* lse, int64_t ignore_index,
                   double eps_d, double z_d) {
  using A = acc_t<T>;
  const int64_t V = lx.len;
  at::parallel_for(0, lx.rows, std::max<int64_t>(1, 32768 / std::max<int64_t>(V, 1)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t r = begin; r < end; ++r) {
                       const T* xr = x + xent_row_offset(lx, r);
                       T* dr = dx + xent_row_offset(ld, r);
                       const int64_t t = target[r];
                       if (t == ignore_index) {
                         for (int64_t j = 0; j < V; ++j) dr[j] = T(0);
                         continue;
                       }
                       const A g = static_cast<A>(grad[r * grad_stride]);
                       const A L = static_cast<A>(lse[r]);
                       const A a = g * (A(1) + A(2) * static_cast<A>(z_d) * L);
                       const A b = g * static_cast<A>(eps_d / static_cast<double>(V));
                       const A c = g * static_cast<A>(1.0 - eps_d);
                       for (int64_t j = 0; j < V; ++j) {
                         const A v = a * std::exp(static_cast<A>(xr[j]) - L) - b;
                         dr[j] = static_cast<T>(j == t ? v - c : v);
                       }
                     }
                   });
}

// target as int64, contiguous (int32 targets are widened once).
at::Tensor long_target(const at::Tensor& target) {
  return target.to(at::kLong).contiguous().reshape({-1});
}

std::tuple<at::Tensor, at::Tensor> cross_entropy_cpu(const at::Tensor& logits,
                                                     const at::Tensor& target, int64_t ignore_index,
                                                     double label_smoothing, double z_loss,
                                                     bool /*inplace_backward*/,
                                                     c10::string_view reduction) {
  const char* op = "fused::cross_entropy";
  const XentReduction red = xent_reduction(reduction, op);
  xent_check(logits, target, label_smoothing, op);
  at::Tensor loss = xent_row_output(logits, target);
  at::Tensor lse = xent_row_output(logits, target);
  const at::Tensor t = long_target(target);
  if (loss.numel() > 0) {
    check_targets(t, logits.size(-1), ignore_index, op);
    const XentInput in = xent_input(logits);
    FUSED_DISPATCH_CPU(logits.scalar_type(), "fused::cross_entropy", [&] {
      using R = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
      forward_rows<scalar_t, R>(in.x.const_data_ptr<scalar_t>(), in.layout,
                                t.const_data_ptr<int64_t>(), loss.mutable_data_ptr<R>(),
                                lse.mutable_data_ptr<R>(), ignore_index, label_smoothing, z_loss);
    });
  }
  if (red == XentReduction::None) return {loss, lse};
  // The reduction here rather than in ATen ops (a sum, a count, a division: three more
  // calls): the rows in order, in double.
  at::Tensor out = at::empty({}, loss.options());
  const int64_t* tp = t.const_data_ptr<int64_t>();
  double total = 0.0;
  int64_t count = 0;
  AT_DISPATCH_FLOATING_TYPES(loss.scalar_type(), "fused::cross_entropy", [&] {
    const scalar_t* lp = loss.const_data_ptr<scalar_t>();
    for (int64_t r = 0; r < loss.numel(); ++r) {
      total += static_cast<double>(lp[r]);
      count += tp[r] != ignore_index;
    }
    // 'mean' over no rows is 0 / 0: NaN, as torch.
    *out.mutable_data_ptr<scalar_t>() = static_cast<scalar_t>(
        red == XentReduction::Mean ? total / static_cast<double>(count) : total);
  });
  return {out, lse};
}

// dx written into `out` (laid out as `lout`), read from `in`. red != None: grad_loss is one
// value for every row (divided by the count of non-ignored rows for 'mean').
void backward_into(const at::Tensor& grad_loss, const XentInput& in, at::Tensor& out,
                   const XentRows& lout, const at::Tensor& target, const at::Tensor& lse,
                   int64_t ignore_index, double label_smoothing, double z_loss,
                   XentReduction red = XentReduction::None) {
  const at::Tensor t = long_target(target);
  const at::Tensor s = lse.contiguous();
  FUSED_DISPATCH_CPU(in.x.scalar_type(), "fused::cross_entropy_backward", [&] {
    using R = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
    at::Tensor g;
    R one = 0;
    const R* gp = nullptr;
    int64_t g_stride = 1;
    if (red == XentReduction::None) {
      g = grad_loss.contiguous();
      gp = g.const_data_ptr<R>();
    } else {
      double v = grad_loss.item<double>();
      if (red == XentReduction::Mean) {
        const int64_t* tp = t.const_data_ptr<int64_t>();
        int64_t count = 0;
        for (int64_t r = 0; r < t.numel(); ++r) count += tp[r] != ignore_index;
        v /= static_cast<double>(count);
      }
      one = static_cast<R>(v);
      gp = &one;
      g_stride = 0;
    }
    backward_rows<scalar_t, R>(gp, g_stride, in.x.const_data_ptr<scalar_t>(), in.layout,
                               out.mutable_data_ptr<scalar_t>(), lout, t.const_data_ptr<int64_t>(),
                               s.const_data_ptr<R>(), ignore_index, label_smoothing, z_loss);
  });
}

at::Tensor cross_entropy_backward_cpu(const at::Tensor& grad_loss, const at::Tensor& logits,
                                      const at::Tensor& target, const at::Tensor& lse,
                                      int64_t ignore_index, double label_smoothing, double z_loss,
                                      c10::string_view reduction) {
  const char* op = "fused::cross_entropy_backward";
  const XentReduction red = xent_reduction(reduction, op);
  xent_check(logits, target, label_smoothing, op);
  xent_check_backward(grad_loss, logits, target, lse, op, red != XentReduction::None);
  at::Tensor dx = at::empty(logits.sizes(), logits.options());
  if (dx.numel() == 0) return dx;
  check_targets(target, logits.size(-1), ignore_index, op);
  const XentInput in = xent_input(logits);
  XentRows lout;
  TORCH_INTERNAL_ASSERT(xent_layout(dx.dim() <= 3 ? dx : dx.view({-1, dx.size(-1)}), lout));
  backward_into(grad_loss, in, dx, lout, target, lse, ignore_index, label_smoothing, z_loss, red);
  return dx;
}

void cross_entropy_backward_inplace_cpu(const at::Tensor& grad_loss, const at::Tensor& logits,
                                        const at::Tensor& target, const at::Tensor& lse,
                                        int64_t ignore_index, double label_smoothing, double z_loss,
                                        c10::string_view reduction) {
  const char* op = "fused::cross_entropy_backward_";
  const XentReduction red = xent_reduction(reduction, op);
  xent_check(logits, target, label_smoothing, op);
  xent_check_backward(grad_loss, logits, target, lse, op, red != XentReduction::None);
  // Rows that share memory (an expanded tensor) cannot each take their own gradient.
  at::assert_no_internal_overlap(logits);
  if (logits.numel() == 0) return;
  check_targets(target, logits.size(-1), ignore_index, op);
  XentInput in = xent_input(logits);
  // Rows read and written in place (each element is read before it is written); a layout
  // the kernel cannot address is computed in a contiguous copy and copied back.
  backward_into(grad_loss, in, in.x, in.layout, target, lse, ignore_index, label_smoothing, z_loss,
                red);
  if (!in.x.is_same(logits)) logits.copy_(in.x.view(logits.sizes()));
}

std::tuple<at::Tensor, at::Tensor> cross_entropy_with_grad_cpu(const at::Tensor& logits,
                                                               const at::Tensor& target,
                                                               int64_t ignore_index,
                                                               double label_smoothing,
                                                               double z_loss, bool mean) {
  const char* op = "fused::cross_entropy_with_grad";
  xent_check(logits, target, label_smoothing, op);
  auto [rows, lse] =
      cross_entropy_cpu(logits, target, ignore_index, label_smoothing, z_loss, false, "none");
  const at::Tensor count = target.ne(ignore_index).sum().to(rows.scalar_type());
  at::Tensor dx = at::empty(logits.sizes(), logits.options());
  if (dx.numel() > 0) {
    // Every row's loss gradient: 1 / (rows not ignored) for 'mean', 1 for 'sum'.
    const at::Tensor scale = mean ? count.reciprocal() : at::ones({}, rows.options());
    const XentInput in = xent_input(logits);
    XentRows lout;
    TORCH_INTERNAL_ASSERT(xent_layout(dx.dim() <= 3 ? dx : dx.view({-1, dx.size(-1)}), lout));
    backward_into(scale.expand({rows.numel()}), in, dx, lout, target, lse, ignore_index,
                  label_smoothing, z_loss);
  }
  at::Tensor total = rows.sum();
  return {mean ? total.div(count) : total, dx};
}

void cross_entropy_scale_inplace_cpu(const at::Tensor& grad, const at::Tensor& scale) {
  const char* op = "fused::cross_entropy_scale_";
  check_float(grad, op, "grad");
  check_same_device(grad, scale, op, "grad", "scale");
  TORCH_CHECK(scale.numel() == 1 && scale.is_floating_point(), op,
              ": expected scale to be "
              "one floating-point value, but got ",
              scale.scalar_type(), " of shape ", scale.sizes());
  if (scale.item<double>() != 1.0) grad.mul_(scale.reshape({}));
}

}  // namespace

TORCH_LIBRARY_IMPL(fused, CPU, m) {
  m.impl("cross_entropy_with_grad", &cross_entropy_with_grad_cpu);
  m.impl("cross_entropy_scale_", &cross_entropy_scale_inplace_cpu);
  m.impl("cross_entropy", &cross_entropy_cpu);
  m.impl("cross_entropy_backward", &cross_entropy_backward_cpu);
  m.impl("cross_entropy_backward_", &cross_entropy_backward_inplace_cpu);
}

}  // namespace fused
