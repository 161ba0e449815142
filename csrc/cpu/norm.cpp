// layer_norm, rms_norm and their fused residual forms on CPU: the fallback and what CI
// exercises. Plain loops, parallel over rows (forward, dx) or column blocks (dweight,
// dbias), accumulation in double. Shared checks and entry points: common/norm.h.
//
// All tensors of a row are brought to the rows' dtype S (x, or the sum of the add forms)
// once, so one template per S serves every dtype mix; y is computed in S and rounded to
// x's dtype once.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <cmath>

#include "common/dispatch.h"
#include "common/norm.h"

namespace fused {
namespace {

// Parameter values as doubles (or nullptr when absent).
struct ParamData {
  at::Tensor t;
  const double* p = nullptr;
  explicit ParamData(const at::Tensor& w) {
    if (w.defined()) {
      t = w.to(at::kDouble).contiguous();
      p = t.const_data_ptr<double>();
    }
  }
};

void forward_cpu(NormForward& p) {
  // The rows being normalized: x, or x + residual rounded to the sum's dtype (the output
  // `sum` is exactly what gets normalized, as in the unfused composition).
  at::Tensor rows_t = p.x;
  if (p.residual.defined()) {
    p.sum.copy_(at::add(p.x.to(p.sum.scalar_type()), p.residual));
    rows_t = p.sum;
  }
  const bool direct = rows_t.scalar_type() == p.y.scalar_type();
  at::Tensor out = direct ? p.y : at::empty_like(rows_t);
  ParamData w(p.weight), b(p.bias);
  const int64_t n = p.cols;
  FUSED_DISPATCH_CPU(rows_t.scalar_type(), "fused::norm_forward", [&] {
    using S = scalar_t;
    const S* xs = rows_t.const_data_ptr<S>();
    S* ys = out.mutable_data_ptr<S>();
    at::parallel_for(0, p.rows, std::max<int64_t>(1, 16384 / n), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const S* xr = xs + r * n;
        S* yr = ys + r * n;
        double mean = 0, sq = 0;
        if (p.layer) {
          // Welford: no cancellation for rows far from zero, and a constant row has a mean
          // equal to its value and a variance of exactly 0 (with eps = 0, torch's NaN).
          for (int64_t j = 0; j < n; ++j) {
            const double v = static_cast<double>(xr[j]);
            const double d = v - mean;
            mean += d / static_cast<double>(j + 1);
            sq += d * (v - mean);
          }
        } else {
          for (int64_t j = 0; j < n; ++j) sq += static_cast<double>(xr[j]) * xr[j];
        }
        const double rstd = 1.0 / std::sqrt(sq / n + p.eps);
        for (int64_t j = 0; j < n; ++j) {
          double v = (static_cast<double>(xr[j]) - mean) * rstd;
          if (w.p) v *= w.p[j];
          if (b.p) v += b.p[j];
          yr[j] = static_cast<S>(v);
        }
        if (p.rstd.scalar_type() == at::kDouble) {
          if (p.layer) p.mean.mutable_data_ptr<double>()[r] = mean;
          p.rstd.mutable_data_ptr<double>()[r] = rstd;
        } else {
          if (p.layer) p.mean.mutable_data_ptr<float>()[r] = static_cast<float>(mean);
          p.rstd.mutable_data_ptr<float>()[r] = static_cast<float>(rstd);
        }
      }
    });
  });
  if (!direct) p.y.copy_(out);
}

// Stats as doubles.
at::Tensor stat_double(const at::Tensor& s) { return s.to(at::kDouble).contiguous(); }

void backward_cpu(NormBackward& p) {
  const int64_t n = p.cols;
  const at::ScalarType st = p.x.scalar_type();
  // grad_out in the rows' dtype (exact: it is never wider than them).
  at::Tensor dy = p.dy.to(st).contiguous();
  at::Tensor mean_t = p.layer ? stat_double(p.mean) : at::Tensor();
  at::Tensor rstd_t = stat_double(p.rstd);
  const double* mean = p.layer ? mean_t.const_data_ptr<double>() : nullptr;
  const double* rstd = rstd_t.const_data_ptr<double>();
  ParamData w(p.weight);
  FUSED_DISPATCH_CPU(st, "fused::norm_backward", [&] {
    using S = scalar_t;
    const S* xs = p.x.const_data_ptr<S>();
    const S* gs = dy.const_data_ptr<S>();
    const S* ds = p.dsum.defined() ? p.dsum.const_data_ptr<S>() : nullptr;
    S* dxs = p.dx.mutable_data_ptr<S>();
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * w  (rms: no mean(g) term)
    at::parallel_for(0, p.rows, std::max<int64_t>(1, 16384 / n), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t off = r * n;
        const double mu = mean ? mean[r] : 0.0, rs = rstd[r];
        double c1 = 0, c2 = 0;
        for (int64_t j = 0; j < n; ++j) {
          double xhat = (static_cast<double>(xs[off + j]) - mu) * rs;
          double g = static_cast<double>(gs[off + j]) * (w.p ? w.p[j] : 1.0);
          c1 += g;
          c2 += g * xhat;
        }
        c1 = p.layer ? c1 / n : 0.0;
        c2 /= n;
        for (int64_t j = 0; j < n; ++j) {
          double xhat = (static_cast<double>(xs[off + j]) - mu) * rs;
          double g = static_cast<double>(gs[off + j]) * (w.p ? w.p[j] : 1.0);
          double v = rs * (g - c1 - xhat * c2);
          if (ds) v += static_cast<double>(ds[off + j]);
          dxs[off + j] = static_cast<S>(v);
        }
      }
    });
    // dweight = sum over rows of dy * xhat, dbias = sum over rows of dy: column blocks in
    // parallel, rows in order (deterministic).
    if (!p.dweight.defined() && !p.dbias.defined()) return;
    at::Tensor dw = at::zeros({n}, p.x.options().dtype(at::kDouble));
    at::Tensor db = at::zeros({n}, p.x.options().dtype(at::kDouble));
    double* dwp = dw.mutable_data_ptr<double>();
    double* dbp = db.mutable_data_ptr<double>();
    at::parallel_for(0, n, 256, [&](int64_t c0, int64_t c1) {
      for (int64_t r = 0; r < p.rows; ++r) {
        const double mu = mean ? mean[r] : 0.0, rs = rstd[r];
        for (int64_t j = c0; j < c1; ++j) {
          double g = static_cast<double>(gs[r * n + j]);
          dwp[j] += g * (static_cast<double>(xs[r * n + j]) - mu) * rs;
          dbp[j] += g;
        }
      }
    });
    if (p.dweight.defined()) p.dweight.copy_(dw.view(p.dweight.sizes()));
    if (p.dbias.defined()) p.dbias.copy_(db.view(p.dbias.sizes()));
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(fused, CPU, m) {
  FUSED_REGISTER_NORM_OPS(m, forward_cpu, backward_cpu);
  // The dropout forms: the sum composed by bias_dropout_add (cpu/dropout.cpp), then normalized.
  FUSED_REGISTER_DROPOUT_NORM_OPS(m, forward_cpu, bias_dropout_add_cpu, false);
}

}  // namespace fused
