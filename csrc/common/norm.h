// Host-side logic shared by the CPU and CUDA norm kernels (layer_norm, rms_norm and their
// fused residual forms add_layer_norm / add_rms_norm): argument checks, output allocation and
// the op entry points. A backend supplies two functions, run_forward(NormForward&) and
// run_backward(NormBackward&), and registers the entry points instantiated with them.
//
// Layer norm is rms norm plus a mean subtraction and a bias, so one problem description
// (and one kernel family per backend) serves both: `layer` says which.
//
// Dtypes: x (and grad_out) float32/float16/bfloat16 (float64 on CPU); weight and bias in
// x's dtype or float32 (the same one); the residual stream ("sum" = x + residual) in x's
// dtype, or float32 when residual_in_fp32; mean/rstd float32 (float64 for float64 x).
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <c10/util/accumulate.h>
#include <cmath>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "common/checks.h"
#include "common/dropout.h"

namespace fused {

// One forward problem: rows x cols, each row normalized on its own.
struct NormForward {
  bool layer = true;  // layer norm (subtract the mean, add bias) or rms norm
  int64_t rows = 0, cols = 0;
  double eps = 0;
  // Inputs, contiguous. residual is already in sum's dtype; undefined tensors are absent.
  at::Tensor x, residual, weight, bias;
  // Outputs: y in x's dtype; sum only with a residual; mean only for layer norm.
  at::Tensor y, sum, mean, rstd;
  // The dropout forms, when the kernels take them (dropout): x is replaced by
  // dropout(x + in_bias) before the residual add. in_bias: normalized_shape, x's dtype, or
  // undefined. The backend draws the generator state and returns it in seed_offset.
  bool dropout = false;
  at::Tensor in_bias;
  DropoutParams drop{};
  std::optional<at::Generator> generator;
  at::Tensor seed_offset;
};

// One backward problem. x holds the rows that were normalized: the input, or the sum of
// the add forms (then dx is the gradient reaching the sum, in its dtype, plus dsum).
struct NormBackward {
  bool layer = true;
  int64_t rows = 0, cols = 0;
  at::Tensor dy, x, dsum, mean, rstd, weight;  // inputs, contiguous; dsum/mean/weight optional
  at::Tensor dx, dweight, dbias;               // outputs; dweight/dbias undefined if not wanted
};

// rows and cols of x for normalized_shape, with the shape checks torch's norms make.
inline std::pair<int64_t, int64_t> norm_rows_cols(const at::Tensor& x, at::IntArrayRef ns,
                                                  const char* op) {
  TORCH_CHECK(!ns.empty(), op,
              ": expected normalized_shape to have at least one dimension, "
              "but got []");
  const int64_t k = static_cast<int64_t>(ns.size());
  TORCH_CHECK(x.dim() >= k && x.sizes().slice(x.dim() - k).equals(ns), op,
              ": expected x to end with normalized_shape=", ns, ", but got x of shape ", x.sizes());
  const int64_t cols = c10::multiply_integers(ns);
  const int64_t rows = c10::multiply_integers(x.sizes().slice(0, x.dim() - k));
  TORCH_CHECK(cols <= std::numeric_limits<int32_t>::max(), op, ": normalized_shape holds ", cols,
              " elements; at most 2^31 - 1 are supported");
  return {rows, cols};
}

// weight / bias: normalized_shape, on x's device, in x's dtype or float32.
inline void check_norm_param(const at::Tensor& p, const char* name, const at::Tensor& x,
                             at::IntArrayRef ns, const char* op) {
  TORCH_CHECK(p.sizes().equals(ns), op, ": expected ", name, " of shape ", ns,
              " (normalized_shape), but got ", p.sizes());
  check_same_device(p, x, op, name, "x");
  TORCH_CHECK(p.scalar_type() == x.scalar_type() || p.scalar_type() == at::kFloat, op,
              ": expected ", name, " to have x's dtype (", x.scalar_type(),
              ") or float32, but got ", p.scalar_type());
}

inline at::ScalarType norm_stat_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// F.rms_norm's default eps: the machine epsilon of x's dtype.
inline double rms_default_eps(at::ScalarType t) {
  switch (t) {
    case at::kDouble:
      return std::numeric_limits<double>::epsilon();
    case at::kHalf:
      return 0.0009765625;  // 2^-10
    case at::kBFloat16:
      return 0.0078125;  // 2^-7
    default:
      return std::numeric_limits<float>::epsilon();
  }
}

inline NormForward prepare_norm_forward(const char* op, bool layer, const at::Tensor& x,
                                        const std::optional<at::Tensor>& residual,
                                        at::IntArrayRef ns, const std::optional<at::Tensor>& weight,
                                        const std::optional<at::Tensor>& bias, double eps,
                                        bool residual_in_fp32, bool dropout = false) {
  check_float(x, op, "x");
  NormForward p;
  p.layer = layer;
  std::tie(p.rows, p.cols) = norm_rows_cols(x, ns, op);
  p.eps = eps;
  p.x = x.contiguous();
  if (weight.has_value() && weight->defined()) {
    check_norm_param(*weight, "weight", x, ns, op);
    p.weight = weight->contiguous();
  }
  if (bias.has_value() && bias->defined()) {
    check_norm_param(*bias, "bias", x, ns, op);
    if (p.weight.defined()) check_same_dtype(p.weight, *bias, op, "weight", "bias");
    p.bias = bias->contiguous();
  }
  at::ScalarType sum_dtype = x.scalar_type();
  if (residual.has_value()) {
    const at::Tensor& r = *residual;
    check_same_device(r, x, op, "residual", "x");
    check_same_shape(r, x, op, "residual", "x");
    TORCH_CHECK(r.scalar_type() == x.scalar_type() || r.scalar_type() == at::kFloat, op,
                ": expected residual to have x's dtype (", x.scalar_type(),
                ") or float32, but got ", r.scalar_type());
    if (residual_in_fp32 && x.scalar_type() != at::kDouble) sum_dtype = at::kFloat;
    if (r.scalar_type() == sum_dtype || r.scalar_type() != at::kFloat || sum_dtype == at::kDouble) {
      // The kernels read the residual in the sum's dtype (a 16-bit residual into a float32
      // sum, or a float32 one into a float64 sum, converts exactly).
      p.residual = r.to(sum_dtype).contiguous();
      p.sum = at::empty(x.sizes(), x.options().dtype(sum_dtype));
    } else if (dropout) {
      // The dropout forms drop x before the residual add: the caller composes the sum.
      p.residual = r.contiguous();
      p.sum = at::empty(x.sizes(), x.options().dtype(sum_dtype));
    } else {
      // A float32 residual into a 16-bit sum: add in float32 and round once, as
      // (x + residual).to(dtype) does; the kernels then normalize that sum.
      p.sum = at::add(x.to(at::kFloat), r).to(sum_dtype).contiguous();
      p.x = p.sum;
    }
  }
  p.y = at::empty(x.sizes(), x.options());
  std::vector<int64_t> stat_shape(x.sizes().begin(), x.sizes().end() - ns.size());
  at::TensorOptions stat_opts = x.options().dtype(norm_stat_dtype(x));
  if (layer) p.mean = at::empty(stat_shape, stat_opts);
  p.rstd = at::empty(stat_shape, stat_opts);
  if (p.cols == 0) {  // empty rows: mean 0, variance 0
    if (layer) p.mean.zero_();
    p.rstd.fill_(1.0 / std::sqrt(eps));
  }
  return p;
}

// grad_out, the normalized rows x (input or sum), saved stats and parameters.
inline NormBackward prepare_norm_backward(
    const char* op, bool layer, const at::Tensor& dy, const std::optional<at::Tensor>& dsum,
    const at::Tensor& x, at::IntArrayRef ns, const std::optional<at::Tensor>& mean,
    const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, bool want_dweight, bool want_dbias, bool add_form) {
  check_float(dy, op, "grad_out");
  check_float(x, op, add_form ? "sum" : "x");
  const char* xname = add_form ? "sum" : "x";
  check_same_device(dy, x, op, "grad_out", xname);
  check_same_shape(dy, x, op, "grad_out", xname);
  if (add_form) {
    TORCH_CHECK(x.scalar_type() == dy.scalar_type() || x.scalar_type() == at::kFloat, op,
                ": expected sum to have grad_out's dtype (", dy.scalar_type(),
                ") or float32, but got ", x.scalar_type());
  } else {
    check_same_dtype(dy, x, op, "grad_out", "x");
  }
  NormBackward p;
  p.layer = layer;
  std::tie(p.rows, p.cols) = norm_rows_cols(x, ns, op);
  auto check_stat = [&](const at::Tensor& s, const char* name) {
    check_same_device(s, x, op, name, xname);
    TORCH_CHECK(s.scalar_type() == norm_stat_dtype(x), op, ": expected ", name, " to be ",
                norm_stat_dtype(x), ", but got ", s.scalar_type());
    TORCH_CHECK(s.numel() == p.rows, op, ": expected ", name, " to hold one value per row (",
                p.rows, "), but got shape ", s.sizes());
  };
  // Stats are float32 also when the rows are a float32 sum of 16-bit inputs.
  check_stat(rstd, "rstd");
  p.rstd = rstd.contiguous();
  if (layer) {
    TORCH_CHECK(mean.has_value(), op, ": layer norm needs mean");
    check_stat(*mean, "mean");
    p.mean = mean->contiguous();
  }
  p.dy = dy.contiguous();
  p.x = x.contiguous();
  if (dsum.has_value() && dsum->defined()) {
    check_same_device(*dsum, x, op, "grad_sum", "sum");
    check_same_shape(*dsum, x, op, "grad_sum", "sum");
    check_same_dtype(*dsum, x, op, "grad_sum", "sum");
    p.dsum = dsum->contiguous();
  }
  at::ScalarType dw_dtype = dy.scalar_type();
  if (weight.has_value() && weight->defined()) {
    check_norm_param(*weight, "weight", dy, ns, op);
    p.weight = weight->contiguous();
    dw_dtype = weight->scalar_type();
  }
  at::ScalarType db_dtype = dy.scalar_type();
  if (bias.has_value() && bias->defined()) {
    check_norm_param(*bias, "bias", dy, ns, op);
    db_dtype = bias->scalar_type();
  }
  // A dweight / dbias is only computed for a parameter that exists.
  want_dweight = want_dweight && p.weight.defined();
  want_dbias = want_dbias && bias.has_value() && bias->defined();
  if (want_dweight && want_dbias) {
    TORCH_CHECK(dw_dtype == db_dtype, op,
                ": expected weight and bias to have the same dtype, "
                "but got ",
                dw_dtype, " and ", db_dtype);
  }
  p.dx = at::empty(x.sizes(), x.options());
  if (want_dweight) p.dweight = at::empty(ns, dy.options().dtype(dw_dtype));
  if (want_dbias) p.dbias = at::empty(ns, dy.options().dtype(db_dtype));
  if (p.rows == 0) {  // a sum over no rows
    if (p.dweight.defined()) p.dweight.zero_();
    if (p.dbias.defined()) p.dbias.zero_();
  }
  return p;
}

// What an unwanted dweight / dbias comes back as.
inline at::Tensor norm_grad_or_empty(const at::Tensor& g, const at::Tensor& like) {
  return g.defined() ? g : at::empty({0}, like.options());
}

using NormForwardFn = void (*)(NormForward&);
using NormBackwardFn = void (*)(NormBackward&);

inline void run_if_nonempty(NormForwardFn run, NormForward& p) {
  if (p.rows > 0 && p.cols > 0) run(p);
}
inline void run_if_nonempty(NormBackwardFn run, NormBackward& p) {
  if (p.rows > 0 && p.cols > 0) run(p);
}

// The op entry points, instantiated per backend with its run functions.
template <NormForwardFn run>
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_op(
    const at::Tensor& x, at::IntArrayRef ns, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, double eps) {
  NormForward p = prepare_norm_forward("fused::layer_norm", true, x, std::nullopt, ns, weight, bias,
                                       eps, false);
  run_if_nonempty(run, p);
  return {p.y, p.mean, p.rstd};
}

template <NormForwardFn run>
std::tuple<at::Tensor, at::Tensor> rms_norm_op(const at::Tensor& x, at::IntArrayRef ns,
                                               const std::optional<at::Tensor>& weight,
                                               std::optional<double> eps) {
  NormForward p =
      prepare_norm_forward("fused::rms_norm", false, x, std::nullopt, ns, weight, std::nullopt,
                           eps.value_or(rms_default_eps(x.scalar_type())), false);
  run_if_nonempty(run, p);
  return {p.y, p.rstd};
}

template <NormForwardFn run>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> add_layer_norm_op(
    const at::Tensor& x, const at::Tensor& residual, at::IntArrayRef ns,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps,
    bool residual_in_fp32) {
  NormForward p = prepare_norm_forward("fused::add_layer_norm", true, x, residual, ns, weight, bias,
                                       eps, residual_in_fp32);
  run_if_nonempty(run, p);
  return {p.y, p.sum, p.mean, p.rstd};
}

template <NormForwardFn run>
std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_op(
    const at::Tensor& x, const at::Tensor& residual, at::IntArrayRef ns,
    const std::optional<at::Tensor>& weight, std::optional<double> eps, bool residual_in_fp32) {
  NormForward p =
      prepare_norm_forward("fused::add_rms_norm", false, x, residual, ns, weight, std::nullopt,
                           eps.value_or(rms_default_eps(x.scalar_type())), residual_in_fp32);
  run_if_nonempty(run, p);
  return {p.y, p.sum, p.rstd};
}

template <NormBackwardFn run>
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_op(
    const at::Tensor& dy, const at::Tensor& x, at::IntArrayRef ns, const at::Tensor& mean,
    const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, std::array<bool, 2> mask) {
  NormBackward p = prepare_norm_backward("fused::layer_norm_backward", true, dy, std::nullopt, x,
                                         ns, mean, rstd, weight, bias, mask[0], mask[1], false);
  run_if_nonempty(run, p);
  return {p.dx, norm_grad_or_empty(p.dweight, dy), norm_grad_or_empty(p.dbias, dy)};
}

template <NormBackwardFn run>
std::tuple<at::Tensor, at::Tensor> rms_norm_backward_op(const at::Tensor& dy, const at::Tensor& x,
                                                        at::IntArrayRef ns, const at::Tensor& rstd,
                                                        const std::optional<at::Tensor>& weight,
                                                        bool weight_grad) {
  NormBackward p =
      prepare_norm_backward("fused::rms_norm_backward", false, dy, std::nullopt, x, ns,
                            std::nullopt, rstd, weight, std::nullopt, weight_grad, false, false);
  run_if_nonempty(run, p);
  return {p.dx, norm_grad_or_empty(p.dweight, dy)};
}

template <NormBackwardFn run>
std::tuple<at::Tensor, at::Tensor, at::Tensor> add_layer_norm_backward_op(
    const at::Tensor& dy, const std::optional<at::Tensor>& dsum, const at::Tensor& sum,
    at::IntArrayRef ns, const at::Tensor& mean, const at::Tensor& rstd,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    std::array<bool, 2> mask) {
  NormBackward p = prepare_norm_backward("fused::add_layer_norm_backward", true, dy, dsum, sum, ns,
                                         mean, rstd, weight, bias, mask[0], mask[1], true);
  run_if_nonempty(run, p);
  return {p.dx, norm_grad_or_empty(p.dweight, dy), norm_grad_or_empty(p.dbias, dy)};
}

template <NormBackwardFn run>
std::tuple<at::Tensor, at::Tensor> add_rms_norm_backward_op(
    const at::Tensor& dy, const std::optional<at::Tensor>& dsum, const at::Tensor& sum,
    at::IntArrayRef ns, const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
    bool weight_grad) {
  NormBackward p =
      prepare_norm_backward("fused::add_rms_norm_backward", false, dy, dsum, sum, ns, std::nullopt,
                            rstd, weight, std::nullopt, weight_grad, false, true);
  run_if_nonempty(run, p);
  return {p.dx, norm_grad_or_empty(p.dweight, dy)};
}

// ---- the dropout forms: s = residual + dropout(x + input_bias), y = norm(s) ------------------

// A backend's bias_dropout_add forward (common/dropout.h).
using BiasDropoutAddFn = std::tuple<at::Tensor, at::Tensor> (*)(const at::Tensor&,
                                                                const std::optional<at::Tensor>&,
                                                                const at::Tensor&, double, bool,
                                                                std::optional<at::Generator>);

// Checks, allocates and runs one dropout-form forward; the result's seed_offset regenerates
// the mask (bias_dropout_add_backward). Without a mask and without input_bias it is exactly
// the add form. The kernels take the dropout stage where `fused` and the residual is in the
// sum's dtype; otherwise the sum is composed by the backend's bias_dropout_add in float32
// (float64) and rounded once to the sum's dtype, the same arithmetic and the same mask.
template <NormForwardFn run, BiasDropoutAddFn compose, bool fused>
NormForward dropout_add_norm_forward(const char* op, bool layer, const at::Tensor& x,
                                     const at::Tensor& residual, at::IntArrayRef ns,
                                     const std::optional<at::Tensor>& weight,
                                     const std::optional<at::Tensor>& bias, double eps, double p,
                                     bool training, const std::optional<at::Tensor>& input_bias,
                                     bool residual_in_fp32, std::optional<at::Generator> gen) {
  const DropoutParams d = dropout_params(p, training, op);
  const bool has_ib = input_bias.has_value() && input_bias->defined();
  const bool plain = d.identity() && !has_ib;
  NormForward nf =
      prepare_norm_forward(op, layer, x, residual, ns, weight, bias, eps, residual_in_fp32, !plain);
  if (has_ib) {
    const at::Tensor& b = *input_bias;
    check_same_device(b, x, op, "input_bias", "x");
    check_same_dtype(b, x, op, "input_bias", "x");
    TORCH_CHECK(b.dim() == 1 && b.size(0) == x.size(-1), op, ": expected input_bias of shape [",
                x.size(-1), "] (the last dimension of x), but got ", b.sizes());
  }
  nf.seed_offset = at::zeros({2}, x.options().dtype(at::kLong));
  if (!plain && !(fused && nf.residual.scalar_type() == nf.sum.scalar_type())) {
    const at::ScalarType acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    const std::optional<at::Tensor> b =
        has_ib ? std::optional<at::Tensor>(input_bias->to(acc)) : std::nullopt;
    auto [s, so] = compose(nf.x.to(acc), b, nf.residual.to(acc), p, training, std::move(gen));
    nf.sum.copy_(s);
    nf.x = nf.sum;  // normalize the rounded sum, as the add forms' composition does
    nf.residual = at::Tensor();
    nf.seed_offset = so;
  } else if (!plain) {
    nf.dropout = true;
    nf.drop = d;
    nf.generator = std::move(gen);
    if (has_ib) nf.in_bias = input_bias->expand(ns).contiguous();
  }
  run_if_nonempty(run, nf);
  return nf;
}

template <NormForwardFn run, BiasDropoutAddFn compose, bool fused>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> dropout_add_layer_norm_op(
    const at::Tensor& x, const at::Tensor& residual, at::IntArrayRef ns,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps,
    double p, bool training, const std::optional<at::Tensor>& input_bias, bool residual_in_fp32,
    std::optional<at::Generator> generator) {
  NormForward nf = dropout_add_norm_forward<run, compose, fused>(
      "fused::dropout_add_layer_norm", true, x, residual, ns, weight, bias, eps, p, training,
      input_bias, residual_in_fp32, std::move(generator));
  return {nf.y, nf.sum, nf.mean, nf.rstd, nf.seed_offset};
}

template <NormForwardFn run, BiasDropoutAddFn compose, bool fused>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> dropout_add_rms_norm_op(
    const at::Tensor& x, const at::Tensor& residual, at::IntArrayRef ns,
    const std::optional<at::Tensor>& weight, std::optional<double> eps, double p, bool training,
    const std::optional<at::Tensor>& input_bias, bool residual_in_fp32,
    std::optional<at::Generator> generator) {
  NormForward nf = dropout_add_norm_forward<run, compose, fused>(
      "fused::dropout_add_rms_norm", false, x, residual, ns, weight, std::nullopt,
      eps.value_or(rms_default_eps(x.scalar_type())), p, training, input_bias, residual_in_fp32,
      std::move(generator));
  return {nf.y, nf.sum, nf.rstd, nf.seed_offset};
}

// Registers the dropout forms of one backend (FUSED: its kernels take the dropout stage).
#define FUSED_REGISTER_DROPOUT_NORM_OPS(m, RUN_FWD, COMPOSE, FUSED)                              \
  do {                                                                                           \
    m.impl("dropout_add_layer_norm",                                                             \
           &::fused::dropout_add_layer_norm_op<RUN_FWD, &COMPOSE, FUSED>);                       \
    m.impl("dropout_add_rms_norm", &::fused::dropout_add_rms_norm_op<RUN_FWD, &COMPOSE, FUSED>); \
  } while (0)

// Registers every norm op of one backend: m.impl for the eight entry points above.
#define FUSED_REGISTER_NORM_OPS(m, RUN_FWD, RUN_BWD)                                  \
  do {                                                                                \
    m.impl("layer_norm", &::fused::layer_norm_op<RUN_FWD>);                           \
    m.impl("rms_norm", &::fused::rms_norm_op<RUN_FWD>);                               \
    m.impl("add_layer_norm", &::fused::add_layer_norm_op<RUN_FWD>);                   \
    m.impl("add_rms_norm", &::fused::add_rms_norm_op<RUN_FWD>);                       \
    m.impl("layer_norm_backward", &::fused::layer_norm_backward_op<RUN_BWD>);         \
    m.impl("rms_norm_backward", &::fused::rms_norm_backward_op<RUN_BWD>);             \
    m.impl("add_layer_norm_backward", &::fused::add_layer_norm_backward_op<RUN_BWD>); \
    m.impl("add_rms_norm_backward", &::fused::add_rms_norm_backward_op<RUN_BWD>);     \
  } while (0)

}  // namespace fused
