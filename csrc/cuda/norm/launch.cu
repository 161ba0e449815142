// layer_norm, rms_norm and their fused residual forms (add_layer_norm, add_rms_norm) on CUDA:
// the entry points. Checks, output allocation and the op entry points are shared with the CPU
// kernels (common/norm.h); here a problem's plan (plan.h) is made and walked, each step by its
// family's launcher (families.h). The backward kernels, column_sum and the forwards are
// launched early (programmatic dependent launch, common/launch.cuh): each waits for its
// predecessor first.
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAMacros.h>
#include <torch/library.h>

#include <mutex>

#include "common/dispatch.h"
#include "common/layout.h"
#include "cuda/norm/bwd_common.cuh"
#include "cuda/norm/families.h"

namespace fused {
namespace norm {

bool sm90_code_runs();  // partials.cu

namespace {

const GpuProps& gpu_props() { return current_gpu_props<sm90_code_runs>(); }

// A 16-byte-vector path is legal when every row starts aligned: cols a multiple of the
// vector width (the plan checks) and each base pointer aligned to its vector size, VEC
// elements of its type (nullptr: absent).
template <int VEC, typename P>
bool vec_ok(const P* p) {
  return p == nullptr || is_aligned(p, VEC * static_cast<int>(sizeof(P)));
}

template <typename T, typename W, typename R, int VEC>
bool forward_step(const FwdParams<T, W, R>& p, const Step& s) {
  switch (s.kernel) {
    case Kernel::kFwdFixed:
      if constexpr (VEC > 1 && sizeof(T) == 2 && std::is_same_v<T, W> && std::is_same_v<T, R>) {
        fwd_fixed<T>(p, s);
        return true;
      }
      break;
    case Kernel::kFwdWideFixed:
    case Kernel::kFwdRegs:
      return fwd_regs<T, W, R, VEC>(p, s);
    case Kernel::kFwdLong:
      fwd_long<T, W, R, VEC>(p, s);
      return true;
    default:
      break;
  }
  TORCH_INTERNAL_ASSERT(false, "norm plan: ", kernel_name(s.kernel), " in a forward plan for ",
                        "these dtypes");
}

template <typename T, typename W, typename R, int VEC>
bool backward_step(const BwdParams<T, W, R>& p, NormBackward& nb, const Step& s) {
  constexpr bool kSame = VEC > 1 && std::is_same_v<T, W> && std::is_same_v<T, R>;
  switch (s.kernel) {
    case Kernel::kBwdWarp:
      if constexpr (kSame && sizeof(T) == 2) return bwd_warp<T>(p, nb, s);
      break;
    case Kernel::kBwdBulk:
      if constexpr (kSame && sizeof(T) == 2) return bwd_bulk<T>(p, nb, s);
      break;
    case Kernel::kBwdFixed:
      if constexpr (kSame) return bwd_fixed<T>(p, nb, s);
      break;
    case Kernel::kBwdRegs:
      return bwd_regs<T, W, R, VEC>(p, nb, s);
    case Kernel::kBwdCluster:
      return bwd_cluster<T, W, R, VEC>(p, nb, s);
    case Kernel::kBwdTwoPass:
      bwd_two_pass<T, W, R, VEC>(p, nb, s);
      return true;
    default:
      break;
  }
  TORCH_INTERNAL_ASSERT(false, "norm plan: ", kernel_name(s.kernel), " in a backward plan for ",
                        "these dtypes");
}

// The plan's steps in order until one launches (each but the last may be refused by the
// device); each step at its own vector width.
template <typename T, typename W, typename R, typename Run>
void walk(const Plan& plan, Run&& run) {
  constexpr int V = kVecElems<T>;
  for (int i = 0; i < plan.n; ++i) {
    const bool launched = plan.steps[i].vec == V
                              ? run(std::integral_constant<int, V>{}, plan.steps[i])
                              : run(std::integral_constant<int, 1>{}, plan.steps[i]);
    if (launched) return;
  }
  TORCH_INTERNAL_ASSERT(false, "norm plan: every step refused:\n", describe(plan));
}

// Calls fn(Tag<T>, Tag<W>, Tag<R>) for x's dtype t, the parameters' dtype w and the rows'
// dtype r (each of w, r is t or float32).
template <typename Fn>
void dispatch_norm_types(at::ScalarType t, at::ScalarType w, at::ScalarType r, Fn&& fn) {
  FUSED_DISPATCH_CUDA(t, "fused::norm", [&] {
    using T = scalar_t;
    if constexpr (std::is_same_v<T, float>) {
      fn(Tag<T>{}, Tag<T>{}, Tag<T>{});
    } else {
      const bool wf = w == at::kFloat, rf = r == at::kFloat;
      if (!wf && !rf) fn(Tag<T>{}, Tag<T>{}, Tag<T>{});
      if (wf && !rf) fn(Tag<T>{}, Tag<float>{}, Tag<T>{});
      if (!wf && rf) fn(Tag<T>{}, Tag<T>{}, Tag<float>{});
      if (wf && rf) fn(Tag<T>{}, Tag<float>{}, Tag<float>{});
    }
  });
}

template <typename P>
const P* ptr_or_null(const at::Tensor& t) {
  return t.defined() ? t.const_data_ptr<P>() : nullptr;
}

// A pointer's offset in its 16-byte chunk in elements of P, or -1 off the element grid.
template <typename P>
int phase_elems(const P* p) {
  const int b = phase16(p);
  return b % static_cast<int>(sizeof(P)) == 0 ? b / static_cast<int>(sizeof(P)) : -1;
}

void forward_cuda(NormForward& nf) {
  c10::cuda::CUDAGuard guard(nf.x.device());
  // x at an odd offset: y (and the sum the kernel writes) at x's offset in its 16-byte chunk,
  // so that a row's span is the same vectors in each (plan.h: the span path).
  const int px = phase16(nf.x.const_data_ptr());
  if (px != 0 && !nf.dropout) {
    if (phase16(nf.y.const_data_ptr()) != px) nf.y = empty_at_phase(nf.y, nf.x);
    if (nf.residual.defined() && nf.sum.scalar_type() == nf.x.scalar_type() &&
        phase16(nf.sum.const_data_ptr()) != px) {
      nf.sum = empty_at_phase(nf.sum, nf.x);
    }
  }
  const at::ScalarType wt = nf.weight.defined() ? nf.weight.scalar_type()
                            : nf.bias.defined() ? nf.bias.scalar_type()
                                                : nf.x.scalar_type();
  const at::ScalarType rt = nf.sum.defined() ? nf.sum.scalar_type() : nf.x.scalar_type();
  dispatch_norm_types(nf.x.scalar_type(), wt, rt, [&](auto tt, auto tw, auto tr) {
    using T = typename decltype(tt)::type;
    using W = typename decltype(tw)::type;
    using R = typename decltype(tr)::type;
    FwdParams<T, W, R> p;
    p.x = nf.x.const_data_ptr<T>();
    p.residual = ptr_or_null<R>(nf.residual);
    p.weight = ptr_or_null<W>(nf.weight);
    p.bias = ptr_or_null<W>(nf.bias);
    p.y = nf.y.mutable_data_ptr<T>();
    p.sum = nf.sum.defined() ? nf.sum.mutable_data_ptr<R>() : nullptr;
    p.mean = nf.layer ? nf.mean.mutable_data_ptr<float>() : nullptr;
    p.rstd = nf.rstd.mutable_data_ptr<float>();
    p.rows = nf.rows;
    p.cols = static_cast<int>(nf.cols);
    p.eps = static_cast<float>(nf.eps);
    p.layer = nf.layer;
    p.in_bias = ptr_or_null<T>(nf.in_bias);
    p.phase = std::max(phase_elems(p.x), 0);
    p.wphase = p.weight ? phase_elems(p.weight) : 0;
    p.bphase = p.bias ? phase_elems(p.bias) : 0;
    p.drop = FwdDropout{};
    if (nf.dropout) {  // the generator state is drawn here, once a call
      p.drop.on = true;
      p.drop.random = !nf.drop.identity();  // p = 1: threshold 0 drops every element
      p.drop.threshold = nf.drop.threshold;
      p.drop.scale = static_cast<float>(nf.drop.scale);
      p.drop.bits16 = nf.drop.bits16;
      nf.seed_offset = forward_rng(nf.x, nf.drop, nf.generator, p.drop.rng);
    }
    Problem pr;
    pr.rows = nf.rows;
    pr.cols = nf.cols;
    pr.x = nf.x.scalar_type();
    pr.w = wt;
    pr.r = rt;
    pr.layer = nf.layer;
    pr.residual = p.residual != nullptr;
    pr.dropout = nf.dropout;
    constexpr int V = kVecElems<T>;
    pr.aligned = vec_ok<V>(p.x) && vec_ok<V>(p.residual) && vec_ok<V>(p.weight) &&
                 vec_ok<V>(p.bias) && vec_ok<V>(p.y) && vec_ok<V>(p.sum) && vec_ok<V>(p.in_bias);
    const int ph = phase16(p.x);
    const auto at_ph = [&](const void* q) { return q == nullptr || phase16(q) == ph; };
    pr.same_phase = std::is_same_v<T, R> && phase_elems(p.x) >= 0 && at_ph(p.residual) &&
                    at_ph(p.y) && at_ph(p.sum) && p.wphase >= 0 && p.bphase >= 0;
    walk<T, W, R>(plan_forward(pr, gpu_props(), overrides()), [&](auto vec, const Step& s) {
      return forward_step<T, W, R, decltype(vec)::value>(p, s);
    });
  });
}

void backward_cuda(NormBackward& nb) {
  c10::cuda::CUDAGuard guard(nb.x.device());
  const at::ScalarType wt = nb.weight.defined() ? nb.weight.scalar_type() : nb.dy.scalar_type();
  dispatch_norm_types(nb.dy.scalar_type(), wt, nb.x.scalar_type(), [&](auto tt, auto tw, auto tr) {
    using T = typename decltype(tt)::type;
    using W = typename decltype(tw)::type;
    using R = typename decltype(tr)::type;
    Problem pr;
    pr.rows = nb.rows;
    pr.cols = nb.cols;
    pr.x = nb.dy.scalar_type();
    pr.w = wt;
    pr.r = nb.x.scalar_type();
    pr.layer = nb.layer;
    pr.dsum = nb.dsum.defined();
    pr.grads = param_grads(nb);
    constexpr int V = kVecElems<T>;
    const auto aligned = [&] {
      return vec_ok<V>(nb.dy.const_data_ptr<T>()) && vec_ok<V>(nb.x.const_data_ptr<R>()) &&
             vec_ok<V>(ptr_or_null<R>(nb.dsum)) && vec_ok<V>(ptr_or_null<W>(nb.weight)) &&
             vec_ok<V>(nb.dx.const_data_ptr<R>());
    };
    pr.aligned = aligned();
    Plan plan = plan_backward(pr, gpu_props(), overrides());
    // Rows off the grid: the span path where dx (allocated here), dy and d_sum can sit at x's
    // offset in its 16-byte chunk; dy / d_sum are copied there where they are elsewhere (one
    // pass over them, where the scalar path would cost more).
    const int px = phase16(nb.x.const_data_ptr());
    if (std::is_same_v<T, R> && px % static_cast<int>(sizeof(R)) == 0) {
      pr.same_phase = true;
      const Plan span = plan_backward(pr, gpu_props(), overrides());
      if (span.steps[0].span) {
        plan = span;
        const auto at_x = [&](at::Tensor& t, bool copy) {
          if (t.defined() && phase16(t.const_data_ptr()) != px) {
            t = copy ? empty_at_phase(t, nb.x).copy_(t) : empty_at_phase(t, nb.x);
          }
        };
        at_x(nb.dx, false);
        at_x(nb.dy, true);
        at_x(nb.dsum, true);
      }
    }
    BwdParams<T, W, R> p;
    p.dy = nb.dy.const_data_ptr<T>();
    p.x = nb.x.const_data_ptr<R>();
    p.dsum = ptr_or_null<R>(nb.dsum);
    p.mean = nb.layer ? nb.mean.const_data_ptr<float>() : nullptr;
    p.rstd = nb.rstd.const_data_ptr<float>();
    p.weight = ptr_or_null<W>(nb.weight);
    p.dx = nb.dx.mutable_data_ptr<R>();
    p.dw_part = p.db_part = nullptr;
    p.rows = nb.rows;
    p.cols = static_cast<int>(nb.cols);
    p.phase = std::max(phase_elems(p.x), 0);
    p.wphase = p.weight ? std::max(phase_elems(p.weight), 0) : 0;
    walk<T, W, R>(plan, [&](auto vec, const Step& s) {
      return backward_step<T, W, R, decltype(vec)::value>(p, nb, s);
    });
  });
}

}  // namespace
}  // namespace norm

TORCH_LIBRARY_IMPL(fused, CUDA, m) {
  FUSED_REGISTER_NORM_OPS(m, norm::forward_cuda, norm::backward_cuda);
  FUSED_REGISTER_DROPOUT_NORM_OPS(m, norm::forward_cuda, bias_dropout_add_cuda, true);
}

}  // namespace fused
