// Autocast (torch.autocast) rules, matching each op's torch twin on each device:
//   matmul, linear, linear_fwd      cast floating inputs to the autocast dtype, as torch.mm /
//                                   F.linear (CPU and CUDA);
//   layer_norm, add_layer_norm, softmax, log_softmax
//                                   on CUDA: run in float32 (outputs float32), as
//                                   F.layer_norm / F.softmax do under CUDA autocast;
//                                   on CPU: untouched, as torch leaves them;
//   dropout_add_layer_norm          as add_layer_norm (float32 on CUDA, input_bias too);
//   rms_norm, add_rms_norm, dropout_add_rms_norm
//                                   untouched (F.rms_norm has no autocast rule);
//   bias_dropout_add                inputs promoted to their widest floating dtype (its
//                                   twin, residual + dropout(x + bias), promotes);
//   linear_cross_entropy            hidden, weight, bias cast to the autocast dtype, as the
//                                   F.linear of its twin; the loss stays float32 (CPU, CUDA);
//   cross_entropy (and _with_grad)  no rule: F.cross_entropy runs in float32 under autocast
//                                   (CPU and CUDA), and the op already reads 16-bit logits
//                                   into float32 math and returns a float32 loss;
//   gelu, dropout                   untouched (no rule: the fallthrough), as torch.
//   swiglu, geglu                   gate and up promoted to their widest floating dtype (their
//                                   twin, act(gate) * up, promotes).
//   mlp                             every input cast to the autocast dtype, as the F.linear
//                                   calls of its twin (CPU and CUDA).
// Each rule casts, then calls the op again with autocast excluded.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

#include "autograd/common.h"
#include "autograd/ops.h"

namespace fused::autograd {
namespace {

template <c10::DeviceType D>
struct Cast {
  // Excludes this device's autocast key for the nested call.
  c10::impl::ExcludeDispatchKeyGuard no_autocast{
      c10::DispatchKeySet(at::autocast::get_autocast_dispatch_key_from_device_type(D))};
  static at::ScalarType lower() { return at::autocast::get_autocast_dtype(D); }
  template <class T>
  static T to(at::ScalarType t, const T& v) {
    return at::autocast::cached_cast(t, v, D);
  }
};

// ---- lower precision: the GEMMs -------------------------------------------------------------

template <c10::DeviceType D>
at::Tensor matmul_autocast(const at::Tensor& a, const at::Tensor& b) {
  Cast<D> c;
  const auto t = Cast<D>::lower();
  return matmul_op().call(Cast<D>::to(t, a), Cast<D>::to(t, b));
}

template <c10::DeviceType D>
at::Tensor linear_autocast(const at::Tensor& x, const at::Tensor& w, const OptT& b, OptStr act) {
  Cast<D> c;
  const auto t = Cast<D>::lower();
  return linear_op().call(Cast<D>::to(t, x), Cast<D>::to(t, w), Cast<D>::to(t, b), act);
}

template <c10::DeviceType D>
Tensor2 linear_fwd_autocast(const at::Tensor& x, const at::Tensor& w, const OptT& b,
                            c10::string_view act) {
  Cast<D> c;
  const auto t = Cast<D>::lower();
  return linear_fwd_op().call(Cast<D>::to(t, x), Cast<D>::to(t, w), Cast<D>::to(t, b), act);
}

template <c10::DeviceType D>
Tensor4 linear_cross_entropy_autocast(const at::Tensor& h, const at::Tensor& w,
                                      const at::Tensor& target, const OptT& b, int64_t ignore_index,
                                      double ls, double z, bool mean, int64_t chunk,
                                      std::array<bool, 3> grad_mask) {
  Cast<D> c;
  const auto t = Cast<D>::lower();
  return lce_op().call(Cast<D>::to(t, h), Cast<D>::to(t, w), target, Cast<D>::to(t, b),
                       ignore_index, ls, z, mean, chunk, grad_mask);
}

// ---- float32 on CUDA: the norms and softmax ---------------------------------------------------

constexpr auto kCUDA = c10::DeviceType::CUDA;
using F32 = Cast<kCUDA>;

Tensor3 layer_norm_autocast(const at::Tensor& x, at::IntArrayRef ns, const OptT& w, const OptT& b,
                            double eps) {
  F32 c;
  return layer_norm_op().call(F32::to(at::kFloat, x), ns, F32::to(at::kFloat, w),
                              F32::to(at::kFloat, b), eps);
}

Tensor4 add_layer_norm_autocast(const at::Tensor& x, const at::Tensor& r, at::IntArrayRef ns,
                                const OptT& w, const OptT& b, double eps, bool in_fp32) {
  F32 c;
  return add_layer_norm_op().call(F32::to(at::kFloat, x), F32::to(at::kFloat, r), ns,
                                  F32::to(at::kFloat, w), F32::to(at::kFloat, b), eps, in_fp32);
}

Tensor5 dropout_add_layer_norm_autocast(const at::Tensor& x, const at::Tensor& r,
                                        at::IntArrayRef ns, const OptT& w, const OptT& b,
                                        double eps, double p, bool training, const OptT& ib,
                                        bool in_fp32, OptGen gen) {
  F32 c;
  return dropout_add_layer_norm_op().call(
      F32::to(at::kFloat, x), F32::to(at::kFloat, r), ns, F32::to(at::kFloat, w),
      F32::to(at::kFloat, b), eps, p, training, F32::to(at::kFloat, ib), in_fp32, std::move(gen));
}

at::Tensor softmax_autocast(const at::Tensor& x, int64_t dim, double scale, bool causal) {
  F32 c;
  return softmax_op().call(F32::to(at::kFloat, x), dim, scale, causal);
}

at::Tensor log_softmax_autocast(const at::Tensor& x, int64_t dim) {
  F32 c;
  return log_softmax_op().call(F32::to(at::kFloat, x), dim);
}

// ---- promote: bias_dropout_add --------------------------------------------------------------

template <c10::DeviceType D>
Tensor2 bias_dropout_add_autocast(const at::Tensor& x, const OptT& bias, const at::Tensor& r,
                                  double p, bool training, OptGen gen) {
  Cast<D> c;
  at::ScalarType t = at::promote_types(x.scalar_type(), r.scalar_type());
  if (bias.has_value() && bias->defined()) t = at::promote_types(t, bias->scalar_type());
  auto promote = [&](const at::Tensor& v) { return v.scalar_type() == t ? v : v.to(t); };
  const OptT b = bias.has_value() && bias->defined() ? OptT(promote(*bias)) : bias;
  return bias_dropout_add_op().call(promote(x), b, promote(r), p, training, std::move(gen));
}

// ---- promote: swiglu, geglu -------------------------------------------------------------------

std::pair<at::Tensor, at::Tensor> promote_pair(const at::Tensor& a, const at::Tensor& b) {
  const at::ScalarType t = at::promote_types(a.scalar_type(), b.scalar_type());
  return {a.scalar_type() == t ? a : a.to(t), b.scalar_type() == t ? b : b.to(t)};
}

template <c10::DeviceType D>
at::Tensor swiglu_autocast(const at::Tensor& gate, const at::Tensor& up) {
  Cast<D> c;
  auto [g, u] = promote_pair(gate, up);
  return swiglu_op().call(g, u);
}

template <c10::DeviceType D>
at::Tensor geglu_autocast(const at::Tensor& gate, const at::Tensor& up,
                          c10::string_view approximate) {
  Cast<D> c;
  auto [g, u] = promote_pair(gate, up);
  return geglu_op().call(g, u, approximate);
}

template <c10::DeviceType D>
at::Tensor mlp_autocast(const at::Tensor& x, const at::Tensor& w1, const OptT& b1,
                        const at::Tensor& w2, const OptT& b2, c10::string_view act,
                        bool recompute) {
  Cast<D> c;
  const auto t = Cast<D>::lower();
  return mlp_op().call(Cast<D>::to(t, x), Cast<D>::to(t, w1), Cast<D>::to(t, b1),
                       Cast<D>::to(t, w2), Cast<D>::to(t, b2), act, recompute);
}

}  // namespace

TORCH_LIBRARY_IMPL(fused, AutocastCUDA, m) {
  m.impl("matmul", &matmul_autocast<kCUDA>);
  m.impl("linear", &linear_autocast<kCUDA>);
  m.impl("linear_fwd", &linear_fwd_autocast<kCUDA>);
  m.impl("linear_cross_entropy", &linear_cross_entropy_autocast<kCUDA>);
  m.impl("layer_norm", &layer_norm_autocast);
  m.impl("add_layer_norm", &add_layer_norm_autocast);
  m.impl("softmax", &softmax_autocast);
  m.impl("log_softmax", &log_softmax_autocast);
  m.impl("bias_dropout_add", &bias_dropout_add_autocast<kCUDA>);
  m.impl("dropout_add_layer_norm", &dropout_add_layer_norm_autocast);
  m.impl("swiglu", &swiglu_autocast<kCUDA>);
  m.impl("geglu", &geglu_autocast<kCUDA>);
  m.impl("mlp", &mlp_autocast<kCUDA>);
}

TORCH_LIBRARY_IMPL(fused, AutocastCPU, m) {
  constexpr auto kCPU = c10::DeviceType::CPU;
  m.impl("matmul", &matmul_autocast<kCPU>);
  m.impl("linear", &linear_autocast<kCPU>);
  m.impl("linear_fwd", &linear_fwd_autocast<kCPU>);
  m.impl("linear_cross_entropy", &linear_cross_entropy_autocast<kCPU>);
  m.impl("bias_dropout_add", &bias_dropout_add_autocast<kCPU>);
  m.impl("swiglu", &swiglu_autocast<kCPU>);
  m.impl("geglu", &geglu_autocast<kCPU>);
  m.impl("mlp", &mlp_autocast<kCPU>);
}

}  // namespace fused::autograd
