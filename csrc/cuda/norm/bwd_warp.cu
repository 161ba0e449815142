
#include "cuda/norm/bwd_common.cuh"
#include "cuda/norm/families.h"

namespace fused {
namespace norm {
namespace {

// norm_bwd_warp: 16-bit rows of 256 to 512 columns (parameters and rows in x's dtype), a
// warp a row and no block barrier in the row loop, as softmax's backward runs them. The
// dweight / dbias terms go to the warp's own slice of shared memory (float32,
// read-modify-write by the lane that owns them) instead of registers, so that the registers
// hold the row: 24 warps an SM, or 16 with PF (the next row's tile loaded before this row's
// sums, 128 registers). The block's warps add their slices in warp order at the end: one
// partial row a block, deterministic. Against norm_bwd_regs (docs/design/norm.md#tried-not-kept,
// H200): 4-10% faster at 512 columns, 4-16% at 256; at 1024 (4 vectors a lane) from 5% faster (rms,
// PF) to 22% slower (the add forms), the slices' shared-memory traffic (16 KB a row at 1024 columns
// for both terms) costing more than the warps gain, so those rows stay on norm_bwd_regs. Slice
// layout: float4 ((term * VPT + i) * 2 + h) * 32 + lane holds elements 4h..4h+3 of the lane's
// vector i (consecutive lanes, consecutive 16 bytes: no bank conflicts).
constexpr int kWarpBwdVec = 8;  // 16-bit elements in a 16-byte vector
template <bool PF>
constexpr int warp_bwd_threads() {
  return PF ? 512 : 768;  // the launch bound: 128 / 80 registers a thread (allocated by 8s)
}

template <int VPT>
__host__ __device__ constexpr int warp_bwd_slice() {  // float4s a warp holds per term
  return VPT * (kWarpBwdVec / 4) * 32;
}

template <typename T, int VPT, bool DSUM, bool PF>
__global__ void __launch_bounds__(warp_bwd_threads<PF>(), 1) norm_bwd_warp(BwdParams<T, T, T> p) {
  static_assert(sizeof(T) == 2, "16-bit rows: 8 elements a 16-byte vector");
  constexpr int VEC = kWarpBwdVec, Q = VEC / 4;
  grid_dependency_wait();  // launched early (launch_early): nothing global before this
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  if constexpr (!DSUM) p.dsum = nullptr;  // known at compile time: its loads and adds go
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int terms = (p.dw_part != nullptr) + (p.db_part != nullptr);
  float4* acc_w = reinterpret_cast<float4*>(dyn_smem) + warp * terms * warp_bwd_slice<VPT>();
  float4* acc_b = acc_w + (p.dw_part ? warp_bwd_slice<VPT>() : 0);
  for (int k = lane; k < terms * warp_bwd_slice<VPT>(); k += 32) {
    acc_w[k] = make_float4(0.f, 0.f, 0.f, 0.f);  // the lane's own float4s only: no barrier
  }
  // w read where it is used (L1 hits after the first row): held in registers across the
  // row loop it spilled at 4 vectors a lane (the loop's stores to dx keep the compiler from
  // hoisting the loads).
  auto weight = [&](int i) { return param_or<T, VEC>(p.weight, i * 32 + lane, 1.f); };
  auto add_terms = [&](int i, const FVec<VEC>& d, const FVec<VEC>& xhat) {
#pragma unroll
    for (int h = 0; h < Q; ++h) {
      const int k = (i * Q + h) * 32 + lane;
      const float* dh = d.v + 4 * h;
      const float* xh = xhat.v + 4 * h;
      if (p.dw_part) {
        float4 a = acc_w[k];
        a.x += dh[0] * xh[0];
        a.y += dh[1] * xh[1];
        a.z += dh[2] * xh[2];
        a.w += dh[3] * xh[3];
        acc_w[k] = a;
      }
      if (p.db_part) {
        float4 a = acc_b[k];
        a.x += dh[0];
        a.y += dh[1];
        a.z += dh[2];
        a.w += dh[3];
        acc_b[k] = a;
      }
    }
  };
  using Tile = BwdTile<T, T, VEC, VPT>;
  auto finish = [&](const Tile& t, int64_t row) {
    float s[2];
    bwd_sums_to<VEC, VPT>(p, t, true, lane, 32, weight, add_terms, s);
    s[0] = warp_sum(s[0]);
    s[1] = warp_sum(s[1]);
    bwd_dx<VEC, VPT>(p, t, row, true, lane, 32, weight, s);
  };
  const int64_t step = static_cast<int64_t>(gridDim.x) * warps;
  int64_t row = static_cast<int64_t>(blockIdx.x) * warps + warp;
  Tile cur;
  if constexpr (PF) bwd_load(p, row, row < p.rows, lane, 32, cur);
  for (; row < p.rows; row += step) {
    if constexpr (PF) {
      Tile next;
      bwd_load(p, row + step, row + step < p.rows, lane, 32, next);
      finish(cur, row);
      cur = next;
    } else {
      bwd_load(p, row, true, lane, 32, cur);
      finish(cur, row);
    }
  }
  if (terms == 0) return;  // uniform across the grid
  __syncthreads();
  // Column col is element j of vector c = i * 32 + l: float (((i * Q + j / 4) * 32 + l) * 4
  // + j % 4) of a term's slice.
  const float* slices = reinterpret_cast<const float*>(dyn_smem);
  const int slice = 4 * warp_bwd_slice<VPT>(), stride = terms * slice;
  for (int col = threadIdx.x; col < p.cols; col += blockDim.x) {
    const int c = col / VEC, j = col % VEC;
    const int at = (((c / 32) * Q + j / 4) * 32 + c % 32) * 4 + j % 4;
    float sw = 0.f, sb = 0.f;
    for (int w = 0; w < warps; ++w) {
      const float* q = slices + w * stride + at;
      if (p.dw_part) sw += q[0];
      if (p.db_part) sb += q[p.dw_part ? slice : 0];
    }
    const int64_t e = static_cast<int64_t>(blockIdx.x) * p.cols + col;
    if (p.dw_part) p.dw_part[e] = sw;
    if (p.db_part) p.db_part[e] = sb;
  }
}

}  // namespace

// norm_bwd_warp with the step's shape: blocks of threads / 32 warps, the step's shared memory
// (a warp's slice a parameter gradient); refused where not one block fits an SM.
template <typename T>
bool bwd_warp(const BwdParams<T, T, T>& p, NormBackward& nb, const Step& s) {
  TORCH_INTERNAL_ASSERT(s.smem == static_cast<int>(sizeof(float4)) *
                                      (s.vpt == 1 ? warp_bwd_slice<1>() : warp_bwd_slice<2>()) *
                                      param_grads(nb) * (s.threads / 32),
                        "norm plan: norm_bwd_warp's slices take other shared memory than ", s.smem);
  auto run = [&](auto kernel) {
    return launch_resident_with_partials(kernel, s.blocks, s.threads, static_cast<size_t>(s.smem),
                                         p, nb);
  };
  auto with_vpt = [&](auto vpt_tag) {
    constexpr int VPT = decltype(vpt_tag)::value;
    if (s.pf) {
      return s.res ? run(norm_bwd_warp<T, VPT, true, true>)
                   : run(norm_bwd_warp<T, VPT, false, true>);
    }
    return s.res ? run(norm_bwd_warp<T, VPT, true, false>)
                 : run(norm_bwd_warp<T, VPT, false, false>);
  };
  TORCH_INTERNAL_ASSERT(s.vpt == 1 || s.vpt == 2, "norm plan: norm_bwd_warp vpt=", s.vpt);
  if (s.vpt == 1) return with_vpt(std::integral_constant<int, 1>{});
  return with_vpt(std::integral_constant<int, 2>{});
}

template bool bwd_warp<c10::Half>(const BwdParams<c10::Half, c10::Half, c10::Half>&, NormBackward&,
                                  const Step&);
template bool bwd_warp<c10::BFloat16>(const BwdParams<c10::BFloat16, c10::BFloat16, c10::BFloat16>&,
                                      NormBackward&, const Step&);

}  // namespace norm
}  // namespace fused
