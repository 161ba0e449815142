// softmax / log_softmax on CUDA, forward and backward, for any row length: the entry points.
// common/softmax.h moves the softmax dim last and allocates; here a problem's plan (plan.h)
// is made and walked, each step by its kernel's launcher (families.h).
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAMacros.h>
#include <torch/library.h>

#include <mutex>

#include "common/dispatch.h"
#include "common/layout.h"
#include "common/softmax.h"
#include "cuda/softmax/families.h"

namespace fused {
namespace softmax {
namespace {

const GpuProps& gpu_props() { return current_gpu_props<sm90_code_runs>(); }

template <typename T, typename Op, int VEC>
bool run_step(const Args<T, typename Op::State>& a, const Op& op, const Step& s,
              const at::TensorOptions& opts) {
  switch (s.kernel) {
    case Kernel::kStaged:
      if constexpr (std::is_same_v<Op, Fwd> && VEC > 1) return launch_staged<T>(a, op, s);
      break;
    case Kernel::kCausal:
      if constexpr (std::is_same_v<Op, Fwd> && VEC > 1 && sizeof(T) == 2) {
        launch_causal<T>(a, op, s);
        return true;
      }
      break;
    case Kernel::kCluster:
      return launch_cluster<T, Op, VEC>(a, op, s);
    case Kernel::kRows:
    case Kernel::kSplit:
      launch_rows<T, Op, VEC>(a, op, s, opts);
      return true;
  }
  TORCH_INTERNAL_ASSERT(false, "softmax plan: ", kernel_name(s.kernel), " for this op");
}

template <typename T, typename Op>
void run(const T* in0, const T* in1, T* out, int64_t rows, int64_t len, int64_t causal_q,
         const Op& op, const at::TensorOptions& opts) {
  TORCH_CHECK(len <= std::numeric_limits<int>::max() / 2,
              "fused softmax: rows of up to 2^30 elements are supported, but got ", len);
  Args<T, typename Op::State> a{
      {in0, in1}, out, nullptr,  rows,  static_cast<int>(len), static_cast<int>(len), 1,
      1,          0,   causal_q, kWhole};
  Problem pr;
  pr.rows = rows;
  pr.len = len;
  pr.dtype = c10::CppTypeToScalarType<T>::value;
  pr.forward = std::is_same_v<Op, Fwd>;
  if constexpr (std::is_same_v<Op, Fwd>) pr.scale = op.scale;
  pr.causal_q = causal_q;
  pr.aligned = is_aligned(in0) && (in1 == nullptr || is_aligned(in1)) && is_aligned(out);
  pr.same_phase = phase16(in0) == phase16(out) && (in1 == nullptr || phase16(in1) == phase16(out));
  const Plan plan = softmax::plan(pr, gpu_props(), overrides());
  constexpr int V = kVecElems<T>;
  for (int i = 0; i < plan.n; ++i) {
    const Step& s = plan.steps[i];
    const bool launched =
        s.vec == V ? run_step<T, Op, V>(a, op, s, opts) : run_step<T, Op, 1>(a, op, s, opts);
    if (launched) return;
  }
  TORCH_INTERNAL_ASSERT(false, "softmax plan: every step refused:\n", describe(plan));
}

template <bool LOG>
at::Tensor forward_cuda(const at::Tensor& x, int64_t dim, double scale, bool causal,
                        const char* op) {
  return softmax_forward(
      x, dim, causal, op,
      [&](const at::Tensor& in, at::Tensor& out, int64_t rows, int64_t len, int64_t causal_q) {
        c10::cuda::CUDAGuard guard(in.device());
        // A view at an odd offset: y at x's offset in its 16-byte chunk, so that both read
        // and write as 16-byte vectors of the rows' spans (plan.h).
        if (phase16(in.const_data_ptr()) != phase16(out.const_data_ptr())) {
          out = empty_at_phase(out, in);
        }
        FUSED_DISPATCH_CUDA(in.scalar_type(), "fused::softmax", [&] {
          run<scalar_t>(in.const_data_ptr<scalar_t>(), nullptr, out.mutable_data_ptr<scalar_t>(),
                        rows, len, causal_q, Fwd{static_cast<float>(scale), LOG}, in.options());
        });
      });
}

template <bool LOG>
at::Tensor backward_cuda(const at::Tensor& grad_out, const at::Tensor& y, int64_t dim, double scale,
                         bool causal, const char* op) {
  return softmax_backward(grad_out, y, dim, causal, op,
                          [&](const at::Tensor& g, const at::Tensor& yr, at::Tensor& dx,
                              int64_t rows, int64_t len, int64_t causal_q) {
                            c10::cuda::CUDAGuard guard(yr.device());
                            // dx at y's offset in its 16-byte chunk, and grad_out copied there
                            // where it is elsewhere (one extra pass over it, where the scalar
                            // path would cost more): the 16-byte path for every offset.
                            const int py = phase16(yr.const_data_ptr());
                            if (phase16(dx.const_data_ptr()) != py) dx = empty_at_phase(dx, yr);
                            at::Tensor gr = g;
                            if (phase16(g.const_data_ptr()) != py) {
                              gr = empty_at_phase(g, yr).copy_(g);
                            }
                            FUSED_DISPATCH_CUDA(yr.scalar_type(), "fused::softmax_backward", [&] {
                              run<scalar_t>(
                                  gr.const_data_ptr<scalar_t>(), yr.const_data_ptr<scalar_t>(),
                                  dx.mutable_data_ptr<scalar_t>(), rows, len, causal_q,
                                  BwdOf<scalar_t>{static_cast<float>(scale), LOG}, yr.options());
                            });
                          });
}

at::Tensor softmax_cuda(const at::Tensor& x, int64_t dim, double scale, bool causal) {
  return forward_cuda<false>(x, dim, scale, causal, "fused::softmax");
}

at::Tensor log_softmax_cuda(const at::Tensor& x, int64_t dim) {
  return forward_cuda<true>(x, dim, 1.0, false, "fused::log_softmax");
}

at::Tensor softmax_backward_cuda(const at::Tensor& grad_out, const at::Tensor& y, int64_t dim,
                                 double scale, bool causal) {
  return backward_cuda<false>(grad_out, y, dim, scale, causal, "fused::softmax_backward");
}

at::Tensor log_softmax_backward_cuda(const at::Tensor& grad_out, const at::Tensor& y, int64_t dim) {
  return backward_cuda<true>(grad_out, y, dim, 1.0, false, "fused::log_softmax_backward");
}

}  // namespace
}  // namespace softmax

TORCH_LIBRARY_IMPL(fused, CUDA, m) {
  m.impl("softmax", &softmax::softmax_cuda);
  m.impl("log_softmax", &softmax::log_softmax_cuda);
  m.impl("softmax_backward", &softmax::softmax_backward_cuda);
  m.impl("log_softmax_backward", &softmax::log_softmax_backward_cuda);
}

}  // namespace fused
