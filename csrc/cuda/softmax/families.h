// The softmax kernels' launchers, one translation unit each (softmax/<kernel>.cu; softmax_kernel
// one per dtype, rows_<dtype>.cu), which softmax/launch.cu calls for the steps of a plan
// (plan.h). A launcher returning bool may refuse its step (false, nothing launched) where a
// launch-time query says it cannot run here; the plan's next step then runs.
#pragma once
#include <ATen/core/TensorBody.h>

#include "cuda/softmax/common.cuh"

namespace fused {
namespace softmax {

// The backward op of T: float32 row sums in double (see Bwd).
template <typename T>
using BwdOf = Bwd<std::conditional_t<std::is_same_v<T, float>, double, float>>;

// softmax_kernel for kRows and kSplit steps (opts: the workspace of a split row's partials).
template <typename T, typename Op, int VEC>
void launch_rows(Args<T, typename Op::State> a, const Op& op, const Step& s,
                 const at::TensorOptions& opts);
template <typename T, typename Op, int VEC>
bool launch_cluster(Args<T, typename Op::State> a, const Op& op, const Step& s);
template <typename T>
bool launch_staged(const Args<T, MaxSum>& a, const Fwd& op, const Step& s);
template <typename T>  // 16-bit T
void launch_causal(const Args<T, MaxSum>& a, const Fwd& op, const Step& s);

// Whether the softmax kernels' sm_90 code runs on the current device (GpuProps::sm90_code;
// cluster.cu): every kernel of the build is compiled for the same architectures, so one
// kernel answers for all.
bool sm90_code_runs();

}  // namespace softmax
}  // namespace fused
