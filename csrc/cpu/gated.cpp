// swiglu / geglu on CPU: the fallback and what CI exercises. Plain loops over the rows of
// the 2-D views (common/gated.h), parallel over rows, math in float (double for float64).
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "common/dispatch.h"
#include "common/gated.h"

namespace fused {

template <typename T>
using gated_acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Rows per parallel chunk: about 32k elements.
inline int64_t row_grain(int64_t cols) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(cols, 1));
}

void gated_forward_cpu(GatedKind k, const at::Tensor& gate, const at::Tensor& up, at::Tensor& out) {
  const int64_t rows = gate.size(0), cols = gate.size(1);
  FUSED_DISPATCH_CPU(gate.scalar_type(), "fused::gated", [&] {
    using A = gated_acc_t<scalar_t>;
    const scalar_t* g = gate.const_data_ptr<scalar_t>();
    const scalar_t* u = up.const_data_ptr<scalar_t>();
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    const int64_t lg = gate.stride(0), lu = up.stride(0), lo = out.stride(0);
    at::parallel_for(0, rows, row_grain(cols), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const A x = static_cast<A>(g[r * lg + c]);
          o[r * lo + c] = static_cast<scalar_t>(gated_act(x, k) * static_cast<A>(u[r * lu + c]));
        }
      }
    });
  });
}

void gated_backward_cpu(GatedKind k, const at::Tensor& dy, const at::Tensor& gate,
                        const at::Tensor& up, at::Tensor& dgate, at::Tensor& dup) {
  const int64_t rows = gate.size(0), cols = gate.size(1);
  FUSED_DISPATCH_CPU(gate.scalar_type(), "fused::gated_backward", [&] {
    using A = gated_acc_t<scalar_t>;
    const scalar_t* d = dy.const_data_ptr<scalar_t>();
    const scalar_t* g = gate.const_data_ptr<scalar_t>();
    const scalar_t* u = up.const_data_ptr<scalar_t>();
    scalar_t* dg = dgate.mutable_data_ptr<scalar_t>();
    scalar_t* du = dup.mutable_data_ptr<scalar_t>();
    const int64_t ld = dy.stride(0), lg = gate.stride(0), lu = up.stride(0);
    const int64_t ldg = dgate.stride(0), ldu = dup.stride(0);
    at::parallel_for(0, rows, row_grain(cols), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const A x = static_cast<A>(g[r * lg + c]);
          const A dyv = static_cast<A>(d[r * ld + c]);
          dg[r * ldg + c] =
              static_cast<scalar_t>(dyv * static_cast<A>(u[r * lu + c]) * gated_act_grad(x, k));
          du[r * ldu + c] = static_cast<scalar_t>(dyv * gated_act(x, k));
        }
      }
    });
  });
}

namespace {
TORCH_LIBRARY_IMPL(fused, CPU, m) {
  FUSED_REGISTER_GATED_OPS(m, gated_forward_cpu, gated_backward_cpu);
}
}  // namespace

}  // namespace fused
