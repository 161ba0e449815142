// Autograd of fused::mlp (see common.h for the scheme). Forward: (H, Z) = linear_fwd(x, W1,
// b1, act) (bias + act in the GEMM epilogue; Z the pre-activation), y = linear(H, W2, b2).
// Backward, dY given:
//   dW2 = dY^T H              fused::matmul
//   db2 = column sums of dY
//   dZ  = (dY W2) * act'(Z)   fused::linear_dact (the act' in the GEMM's epilogue on Hopper:
//                             dH never reaches memory), with db1 = the column sums of dZ
//   dX  = dZ W1, dW1 = dZ^T x fused::matmul
// H and Z are kept in saved_data, not as saved variables, so that the backward can drop each
// as soon as its last use is done (H after dW2, Z after dZ): the peak then stays at eager's
// (F.linear -> act -> F.linear frees H before the activation's backward). recompute=True
// keeps neither: the backward recomputes (H, Z) with one GEMM. So does a second backward
// through a retained graph (the first one dropped them).
#include <torch/library.h>

#include "autograd/common.h"
#include "autograd/linear_act.h"
#include "autograd/ops.h"
#include "common/mlp.h"

namespace fused::autograd {
namespace {

at::Tensor take_saved(AutogradContext* ctx, const char* key) {
  auto it = ctx->saved_data.find(key);
  if (it == ctx->saved_data.end()) return at::Tensor();
  at::Tensor t = it->second.toTensor();
  ctx->saved_data.erase(key);
  return t;
}

struct Mlp : torch::autograd::Function<Mlp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w1,
                            const OptT& b1, const at::Tensor& w2, const OptT& b2,
                            c10::string_view activation, bool recompute) {
    at::AutoDispatchBelowADInplaceOrView below;
    EdgeIndex e;
    ctx->saved_data["x_edge"] = e.take(true);
    ctx->saved_data["w1_edge"] = e.take(true);
    ctx->saved_data["b1_edge"] = e.take(b1.has_value() && b1->defined());
    ctx->saved_data["w2_edge"] = e.take(true);
    ctx->saved_data["b2_edge"] = e.take(b2.has_value() && b2->defined());
    ctx->saved_data["activation"] = std::string(activation);
    ctx->save_for_backward({x, w1, value_or_undefined(b1), w2});
    if (recompute) {  // nothing kept: the inference op, which does not write Z
      return linear_op().call(linear_op().call(x, w1, b1, activation), w2, b2, std::nullopt);
    }
    auto [h, z] = linear_fwd_op().call(x, w1, b1, activation);
    ctx->saved_data["h"] = h;
    ctx->saved_data["z"] = z;
    return linear_op().call(h, w2, b2, std::nullopt);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(7);
    const at::Tensor& dy = grads[0];
    if (!dy.defined()) return out;
    const auto s = ctx->get_saved_variables();
    const at::Tensor &x = s[0], &w1 = s[1], &b1 = s[2], &w2 = s[3];
    const std::string act = ctx->saved_data["activation"].toStringRef();
    const bool want_x = needs_grad(ctx, "x_edge"), want_w1 = needs_grad(ctx, "w1_edge"),
               want_b1 = needs_grad(ctx, "b1_edge"), want_w2 = needs_grad(ctx, "w2_edge"),
               want_b2 = needs_grad(ctx, "b2_edge");
    const bool want_dz = want_x || want_w1 || want_b1;
    const int64_t c = x.size(-1), width = w1.size(0), hidden = w2.size(1);
    const at::Tensor dy2 = dy.reshape({-1, w2.size(0)});
    const at::Tensor x2 = x.reshape({-1, c});
    const OptT b1o = b1.defined() ? OptT(b1) : std::nullopt;
    at::Tensor dz, db1;
    if (want_b2) out[4] = bias_grad_of(dy2);
    if (differentiable_backward()) {
      // Z as a function of x, W1, b1, so that the second derivative reaches them.
      const at::Tensor z2 = linear_op().call(x2, w1, b1o, std::nullopt);
      if (want_w2) out[3] = matmul_op().call(dy2.t(), act_composite(z2, act));
      if (want_dz) {
        dz = act_backward_composite(matmul_op().call(dy2, w2), z2, act);
        if (want_b1) db1 = bias_grad_of(dz);
      }
    } else {
      at::AutoDispatchBelowADInplaceOrView below;
      at::Tensor h = take_saved(ctx, "h"), z = take_saved(ctx, "z");
      if (!z.defined() && (want_w2 || want_dz))
        std::tie(h, z) = linear_fwd_op().call(x2, w1, b1o, act);
      if (want_w2) out[3] = matmul_op().call(dy2.t(), h.reshape({-1, hidden}));
      h.reset();
      if (want_dz)
        std::tie(dz, db1) = linear_dact_op().call(dy2, w2, z.reshape({-1, width}), act, want_b1);
    }
    if (want_x) out[0] = matmul_op().call(dz, w1).reshape(x.sizes());
    if (want_w1) out[1] = matmul_op().call(dz.t(), x2);
    if (want_b1) out[2] = db1;
    return out;
  }
};

// The kernel's checks, for the paths that do not reach it with the whole call: the two linear
// calls alone would report a mismatch as linear's, or accept a gated w1 whose widths chain by
// accident.
void check(const at::Tensor& x, const at::Tensor& w1, const OptT& b1, const at::Tensor& w2,
           const OptT& b2, c10::string_view activation) {
  const LinearAct act = parse_required_activation(activation, "fused::mlp");
  check_mlp_args(x, w1, b1, w2, b2, act, "fused::mlp");
}

at::Tensor mlp_autograd(const at::Tensor& x, const at::Tensor& w1, const OptT& b1,
                        const at::Tensor& w2, const OptT& b2, c10::string_view activation,
                        bool recompute) {
  if (composite(x, w1, b1, w2, b2)) {
    check(x, w1, b1, w2, b2, activation);
    // The two linear ops, each on its own composite path.
    return linear_op().call(linear_op().call(x, w1, b1, activation), w2, b2, std::nullopt);
  }
  if (!must_record(x, w1, b1, w2, b2)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return mlp_op().call(x, w1, b1, w2, b2, activation, recompute);
  }
  check(x, w1, b1, w2, b2, activation);
  return Mlp::apply(x, w1, b1, w2, b2, activation, recompute);
}

}  // namespace

TORCH_LIBRARY_IMPL(fused, Autograd, m) {
  m.impl("mlp", &mlp_autograd);
  m.impl("linear_dact", torch::autograd::autogradNotImplementedFallback());
}

}  // namespace fused::autograd
