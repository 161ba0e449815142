// swiglu / geglu on CUDA: one pass over memory, forward and backward.
// Bytes: forward reads gate and up and writes y (3 * numel * sizeof(T)); backward reads dy,
// gate and up and writes dgate and dup (5 * numel * sizeof(T)). Roofline:
// docs/design/gated.md#roofline.
//
// Operands are 2-D row views (common/gated.h): gate and up may be the two halves of one
// [rows, 2N] tensor, each row a contiguous run of cols elements ld apart. Each thread moves
// kUnroll 16-byte vectors of every operand (all loads issued before the math), a vector
// never crossing a row: vectors when cols and every row stride are multiples of the vector
// width and every base is 16-byte aligned, single elements otherwise. Operands whose rows
// are back to back (ld == cols) are walked as one long row.
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <limits>

#include "common/dispatch.h"
#include "common/gated.h"
#include "common/launch.cuh"
#include "common/vec.cuh"

namespace fused {
namespace {

template <typename T>
struct GatedArgs {
  const T* dy;  // backward only
  const T* gate;
  const T* up;
  T* out0;  // y, or dgate
  T* out1;  // dup (backward only)
  int64_t ld_dy, ld_gate, ld_up, ld_out0, ld_out1;
};

constexpr int kThreads = 128;
constexpr int kUnroll = 2;  // the shape of the shared elementwise kernel (gelu.md#design)

// Vector i of the grid: row i / vpr, vector (i % vpr) of that row. Idx is uint32 when the
// vector count allows (a 32-bit division a vector), int64 otherwise.
template <typename T, int V, GatedKind K, bool BWD, typename Idx>
__global__ void __launch_bounds__(kThreads)
    gated_kernel(const GatedArgs<T> a, const Idx vpr, const Idx total) {
  grid_dependency_wait();  // launched early (launch_early): nothing global before this
  const Idx first = static_cast<Idx>(blockIdx.x) * (kThreads * kUnroll) + threadIdx.x;
  Vec<T, V> g[kUnroll], u[kUnroll], d[kUnroll];
  int64_t row[kUnroll], col[kUnroll];
#pragma unroll
  for (int k = 0; k < kUnroll; ++k) {
    const Idx i = first + static_cast<Idx>(k) * kThreads;
    if (i < total) {
      const Idx r = i / vpr;
      row[k] = static_cast<int64_t>(r);
      col[k] = static_cast<int64_t>(i - r * vpr) * V;
      g[k] = load_vec<T, V>(a.gate + row[k] * a.ld_gate + col[k]);
      u[k] = load_vec<T, V>(a.up + row[k] * a.ld_up + col[k]);
      if constexpr (BWD) d[k] = load_vec<T, V>(a.dy + row[k] * a.ld_dy + col[k]);
    }
  }
#pragma unroll
  for (int k = 0; k < kUnroll; ++k) {
    const Idx i = first + static_cast<Idx>(k) * kThreads;
    if (i >= total) continue;
    Vec<T, V> o0, o1;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float x = static_cast<float>(g[k].v[e]), up = static_cast<float>(u[k].v[e]);
      if constexpr (BWD) {
        float act, dact;
        gated_act_and_grad_for<T, K>(x, act, dact);
        const float dy = static_cast<float>(d[k].v[e]);
        o0.v[e] = static_cast<T>(dy * up * dact);
        o1.v[e] = static_cast<T>(dy * act);
      } else {
        o0.v[e] = static_cast<T>(gated_act_for<T, K>(x) * up);
      }
    }
    store_vec<T, V>(a.out0 + row[k] * a.ld_out0 + col[k], o0);
    if constexpr (BWD) store_vec<T, V>(a.out1 + row[k] * a.ld_out1 + col[k], o1);
  }
}

template <typename T, GatedKind K, bool BWD>
void launch_gated(const GatedArgs<T>& a_in, int64_t rows, int64_t cols) {
  GatedArgs<T> a = a_in;
  const bool dense = a.ld_gate == cols && a.ld_up == cols && a.ld_out0 == cols &&
                     (!BWD || (a.ld_dy == cols && a.ld_out1 == cols));
  if (dense || rows == 1) {  // one long row
    cols *= rows;
    rows = 1;
  }
  constexpr int W = kVecElems<T>;
  bool vec = cols % W == 0 && is_aligned(a.gate) && is_aligned(a.up) && is_aligned(a.out0);
  if (rows > 1) vec = vec && a.ld_gate % W == 0 && a.ld_up % W == 0 && a.ld_out0 % W == 0;
  if constexpr (BWD) {
    vec = vec && is_aligned(a.dy) && is_aligned(a.out1);
    if (rows > 1) vec = vec && a.ld_dy % W == 0 && a.ld_out1 % W == 0;
  }
  auto go = [&](auto width) {
    constexpr int V = decltype(width)::value;
    const int64_t vpr = cols / V, total = rows * vpr;
    const dim3 grid(static_cast<unsigned>(ceil_div(total, kThreads * kUnroll)));
    if (total <= std::numeric_limits<uint32_t>::max() - kThreads * kUnroll) {
      launch_early(gated_kernel<T, V, K, BWD, uint32_t>, grid, dim3(kThreads), 0, a,
                   static_cast<uint32_t>(vpr), static_cast<uint32_t>(total));
    } else {
      launch_early(gated_kernel<T, V, K, BWD, int64_t>, grid, dim3(kThreads), 0, a, vpr, total);
    }
  };
  if (vec) {
    go(std::integral_constant<int, W>{});
  } else {
    go(std::integral_constant<int, 1>{});
  }
}

template <bool BWD, typename F>
void dispatch_kind(GatedKind k, F f) {
  if (k == GatedKind::kSilu) {
    f(std::integral_constant<GatedKind, GatedKind::kSilu>{});
  } else if (k == GatedKind::kGelu) {
    f(std::integral_constant<GatedKind, GatedKind::kGelu>{});
  } else {
    f(std::integral_constant<GatedKind, GatedKind::kGeluTanh>{});
  }
}

}  // namespace

void gated_forward_cuda(GatedKind k, const at::Tensor& gate, const at::Tensor& up,
                        at::Tensor& out) {
  const int64_t rows = gate.size(0), cols = gate.size(1);
  if (rows * cols == 0) return;
  c10::cuda::CUDAGuard guard(gate.device());
  FUSED_DISPATCH_CUDA(gate.scalar_type(), "fused::gated", [&] {
    GatedArgs<scalar_t> a{nullptr,
                          gate.const_data_ptr<scalar_t>(),
                          up.const_data_ptr<scalar_t>(),
                          out.mutable_data_ptr<scalar_t>(),
                          nullptr,
                          0,
                          gate.stride(0),
                          up.stride(0),
                          out.stride(0),
                          0};
    dispatch_kind<false>(
        k, [&](auto kind) { launch_gated<scalar_t, decltype(kind)::value, false>(a, rows, cols); });
  });
}

void gated_backward_cuda(GatedKind k, const at::Tensor& dy, const at::Tensor& gate,
                         const at::Tensor& up, at::Tensor& dgate, at::Tensor& dup) {
  const int64_t rows = gate.size(0), cols = gate.size(1);
  if (rows * cols == 0) return;
  c10::cuda::CUDAGuard guard(gate.device());
  FUSED_DISPATCH_CUDA(gate.scalar_type(), "fused::gated_backward", [&] {
    GatedArgs<scalar_t> a{dy.const_data_ptr<scalar_t>(),
                          gate.const_data_ptr<scalar_t>(),
                          up.const_data_ptr<scalar_t>(),
                          dgate.mutable_data_ptr<scalar_t>(),
                          dup.mutable_data_ptr<scalar_t>(),
                          dy.stride(0),
                          gate.stride(0),
                          up.stride(0),
                          dgate.stride(0),
                          dup.stride(0)};
    dispatch_kind<true>(
        k, [&](auto kind) { launch_gated<scalar_t, decltype(kind)::value, true>(a, rows, cols); });
  });
}

namespace {
TORCH_LIBRARY_IMPL(fused, CUDA, m) {
  FUSED_REGISTER_GATED_OPS(m, gated_forward_cuda, gated_backward_cuda);
}
}  // namespace

}  // namespace fused
