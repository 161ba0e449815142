// What every norm kernel file shares: the parameter blocks, register-resident vectors and
// the row-group reductions (device), and the small host helpers of the launchers.
//
// One kernel family serves both norms: layer norm is rms norm plus a mean subtraction and a
// bias (`layer`: a runtime flag, uniform across the grid, or a template flag). Types: T = x /
// y / grad_out, W = weight / bias (T or float32), R = the normalized rows (T, or float32 for a
// float32 residual stream). Math in float32. Which kernel takes which rows: plan.h.
#pragma once
#include <ATen/core/Tensor.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "common/checks.h"
#include "common/dropout_mask.cuh"
#include "common/half_bits.cuh"
#include "common/launch.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"
#include "cuda/norm/plan.h"

namespace fused {
namespace norm {

constexpr int kTileRows = 4;  // rows norm_bwd_tiles loads before using them

// Vectors per thread in norm_bwd_regs with prefetch (two row tiles live at once): 32 bytes
// of x per thread (16 elements of 16-bit rows, 8 of float32 ones), so that two tiles of x,
// dy and d_sum plus the dweight / dbias accumulators stay within 128 registers.
template <typename R, int VEC>
constexpr int bwd_pf_vpt() {
  return 32 / (VEC * static_cast<int>(sizeof(R)));
}
// norm_bwd_cluster's lag: rows a block runs ahead of the row whose dx it writes (1: 16-bit
// rows on the 16-byte path; three row tiles live at once would spill elsewhere).
template <typename R, int VEC>
constexpr int cluster_lag() {
  return sizeof(R) == 2 && VEC > 1 ? 1 : 0;
}

// The dropout forms' input stage (dropout_add_layer_norm / dropout_add_rms_norm): x is
// replaced by mask * scale * (x + in_bias) before the residual add, element i's mask drawn
// as bias_dropout_add draws it (common/dropout_mask.cuh; i = row * cols + column), so its
// backward (bias_dropout_add_backward) regenerates the same mask.
struct FwdDropout {
  RngArgs rng;         // the generator state; rng.record: seed_offset, filled by block 0
  uint32_t threshold;  // keep iff the element's draw < threshold (0: every element dropped)
  float scale;         // 1 / (1 - p)
  bool on;             // the stage runs (a bias, a mask or both); off: the plain add forms
  bool random;         // a mask is applied
  bool bits16;         // 16-bit draws (DropoutParams::bits16)
};

// This kernel's Philox seed and offset (drawn once a thread, before the row loop).
struct DropSeed {
  uint64_t seed = 0, offset = 0;
};

template <typename T, typename W, typename R>
struct FwdParams {
  const T* x;
  const R* residual;  // nullptr: plain norm (the rows are x)
  const W* weight;    // nullptr: no scale
  const W* bias;      // nullptr: no shift
  T* y;
  R* sum;       // x + residual, written when residual is given
  float* mean;  // nullptr for rms norm
  float* rstd;
  int64_t rows;
  int cols;
  float eps;
  bool layer;        // subtract the mean (layer norm) or not (rms norm)
  const T* in_bias;  // the dropout forms: [cols], added to x before the mask; or nullptr
  FwdDropout drop;   // the dropout forms' stage (drop.on), else off
  // The span path (SPAN): x's offset in its 16-byte chunk in elements (residual, y and sum
  // share it), and weight's and bias' (their own: they are indexed by column).
  int phase, wphase, bphase;
};

template <typename T, typename W, typename R>
struct BwdParams {
  const T* dy;
  const R* x;         // the normalized rows (x, or the sum of the add forms)
  const R* dsum;      // gradient of the sum output, added to dx; or nullptr
  const float* mean;  // nullptr for rms norm
  const float* rstd;
  const W* weight;  // nullptr: w = 1
  R* dx;
  float* dw_part;  // [parts, cols] partial sums of dy * xhat, or nullptr
  float* db_part;  // [parts, cols] partial sums of dy, or nullptr
  int64_t rows;
  int cols;
  // The span path (SPAN): x's offset in its 16-byte chunk in elements (dy, d_sum and dx share
  // it), and weight's.
  int phase, wphase;
};

// Register-resident vectors are kept as raw 32-bit words (Raw<T, N>: the bits of N
// elements of T, loaded and stored as one 16-byte access when N * sizeof(T) == 16) and
// converted to and from float vectors (FVec<N>). Plain integers, not c10::Half /
// c10::BFloat16 members: arrays of those end up in local memory once elements are
// assigned one at a time.
template <typename T, int N, int BYTES = static_cast<int>(sizeof(T)) * N>
struct alignas(BYTES) Raw {
  uint32_t w[BYTES / 4];
};
template <typename T, int N>
struct alignas(2) Raw<T, N, 2> {  // one 16-bit element (the scalar path)
  uint16_t h;
};

template <int N>
struct FVec {
  float v[N];
};

template <typename T, int N>
__device__ __forceinline__ Raw<T, N> load_raw(const T* p) {
  return *reinterpret_cast<const Raw<T, N>*>(p);
}

template <typename T, int N>
__device__ __forceinline__ void store_raw(T* p, const Raw<T, N>& r) {
  *reinterpret_cast<Raw<T, N>*>(p) = r;
}

// load_raw from shared memory: 16 / 8 bytes as one access (a Raw read there member by member
// became 4-byte loads).
template <typename T, int N>
__device__ __forceinline__ Raw<T, N> lds_raw(const T* p) {
  Raw<T, N> r;
  if constexpr (sizeof(r) == 16) {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    r.w[0] = v.x, r.w[1] = v.y, r.w[2] = v.z, r.w[3] = v.w;
  } else {
    static_assert(sizeof(r) == 8, "16 or 8 bytes");
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    r.w[0] = v.x, r.w[1] = v.y;
  }
  return r;
}

template <typename T, int N>
__device__ __forceinline__ FVec<N> to_float(const Raw<T, N>& r) {
  FVec<N> f;
  if constexpr (std::is_same_v<T, float>) {
#pragma unroll
    for (int j = 0; j < N; ++j) f.v[j] = __uint_as_float(r.w[j]);
  } else if constexpr (N == 1) {
    f.v[0] = half_bits_to_float<T>(r.h);
  } else {
#pragma unroll
    for (int k = 0; k < N / 2; ++k) {
      f.v[2 * k] = half_bits_to_float<T>(r.w[k] & 0xffffu);
      f.v[2 * k + 1] = half_bits_to_float<T>(r.w[k] >> 16);
    }
  }
  return f;
}

template <typename T, int N>
__device__ __forceinline__ Raw<T, N> from_float(const FVec<N>& f) {
  Raw<T, N> r;
  if constexpr (std::is_same_v<T, float>) {
#pragma unroll
    for (int j = 0; j < N; ++j) r.w[j] = __float_as_uint(f.v[j]);
  } else if constexpr (N == 1) {
    r.h = static_cast<uint16_t>(float_to_half_bits<T>(f.v[0]));
  } else {
#pragma unroll
    for (int k = 0; k < N / 2; ++k) {
      r.w[k] = float_to_half_bits<T>(f.v[2 * k]) | (float_to_half_bits<T>(f.v[2 * k + 1]) << 16);
    }
  }
  return r;
}

// Parameter vector i of a row as floats (1 when absent).
template <typename W, int VEC>
__device__ __forceinline__ FVec<VEC> param_or(const W* p, int c, float dflt) {
  if (p) return to_float(load_raw<W, VEC>(p + c * VEC));
  FVec<VEC> f;
#pragma unroll
  for (int j = 0; j < VEC; ++j) f.v[j] = dflt;
  return f;
}

// ---- rows read as the 16-byte vectors of their aligned span ---------------------------------
// A row that starts `head` elements past the 16-byte grid (an odd width, or a view at an odd
// offset) is read as the vectors of its span: the row's start rounded down to the grid, its
// end up. Tensors indexed like the row (x, residual, y, sum, dy, dx) share its offset, so the
// span is the same vectors in each; span vector k holds columns k * VEC - head ... + VEC - 1,
// some of them the neighbours' (masked in sums, never stored).

// The head of the row at flat element `off` of a tensor `phase` elements past the grid.
template <int VEC>
__device__ __forceinline__ int span_head(int phase, int64_t off) {
  return static_cast<int>((phase + off) & (VEC - 1));
}

// Whether span vector column c0 .. c0 + VEC - 1 lies inside the row, and element j of it.
template <int VEC>
__device__ __forceinline__ bool span_whole(int c0, int cols) {
  return c0 >= 0 && c0 + VEC <= cols;
}
__device__ __forceinline__ bool span_in(int c, int cols) {
  return static_cast<unsigned>(c) < static_cast<unsigned>(cols);
}

// Stores the vector of columns c0 .. c0 + VEC - 1 at p (on the grid): one 16-byte store where
// it lies inside the row, else its row's elements one by one.
template <typename T, int VEC>
__device__ __forceinline__ void store_span(T* p, const Raw<T, VEC>& r, int c0, int cols) {
  if (span_whole<VEC>(c0, cols)) {
    store_raw<T, VEC>(p, r);
    return;
  }
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    if (!span_in(c0 + j, cols)) continue;
    if constexpr (sizeof(T) == 4) {
      reinterpret_cast<uint32_t*>(p)[j] = r.w[j];
    } else {
      reinterpret_cast<uint16_t*>(p)[j] = static_cast<uint16_t>(r.w[j / 2] >> (16 * (j % 2)));
    }
  }
}

// Parameters c0 .. c0 + VEC - 1 as floats (dflt where absent) for a span vector: any c0 (the
// span's shift against the parameters' own grid, `ph` elements, varies by row), built from
// the 16-byte chunks that hold them, two or three aligned loads and a funnel shift (the
// parameters are small and L1-resident; a chunk with none of the row's columns is not read).
template <typename W, int VEC>
__device__ __forceinline__ FVec<VEC> param_span(const W* p, int ph, int c0, int cols, float dflt) {
  FVec<VEC> f;
  if (!p) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) f.v[j] = dflt;
    return f;
  }
  constexpr int kEpc = 16 / static_cast<int>(sizeof(W));       // elements a chunk
  constexpr int kNc = VEC * static_cast<int>(sizeof(W)) / 16;  // chunks a vector: 1 or 2
  constexpr int kN = 4 * (kNc + 1);                            // words loaded
  const uint4* base = reinterpret_cast<const uint4*>(p - ph);  // on the grid
  const int e = c0 + ph;                                       // >= -(VEC - 1)
  const int s = e & (kEpc - 1);
  const int k = (e - s) / kEpc;
  uint32_t w[kN];
#pragma unroll
  for (int c = 0; c <= kNc; ++c) {
    const int kk = k + c;
    uint4 u = make_uint4(0u, 0u, 0u, 0u);
    if (kk >= 0 && kk * kEpc < ph + cols) u = __ldg(base + kk);
    w[4 * c] = u.x, w[4 * c + 1] = u.y, w[4 * c + 2] = u.z, w[4 * c + 3] = u.w;
  }
  const int sb = s * static_cast<int>(sizeof(W));  // the byte shift: words q, then bytes
  const int q = sb >> 2, rbits = (sb & 3) * 8;
  uint32_t t[kN];
#pragma unroll
  for (int j = 0; j < kN; ++j) t[j] = (q & 2) ? (j + 2 < kN ? w[j + 2] : 0u) : w[j];
#pragma unroll
  for (int j = 0; j < kN; ++j) w[j] = (q & 1) ? (j + 1 < kN ? t[j + 1] : 0u) : t[j];
  Raw<W, VEC> r;
#pragma unroll
  for (int m = 0; m < 4 * kNc; ++m) r.w[m] = __funnelshift_r(w[m], w[m + 1], rbits);
  return to_float(r);
}

// The seed and offset a dropout-form kernel draws with (nothing drawn without a mask).
template <typename T, typename W, typename R>
__device__ __forceinline__ DropSeed drop_seed(const FwdParams<T, W, R>& p) {
  DropSeed d;
  if (p.drop.random) rng_seed_offset(p.drop.rng, d.seed, d.offset);
  return d;
}

// The dropout forms' input stage on the VEC elements of x from flat index e (column c of
// its row): f = mask * scale * (f + in_bias), in float32 as bias_dropout_add computes it.
template <typename T, typename W, typename R, int VEC>
__device__ __forceinline__ void drop_input(FVec<VEC>& f, const FwdParams<T, W, R>& p, int64_t e,
                                           int64_t c, const DropSeed& d) {
  if (p.in_bias) {
    const FVec<VEC> b = to_float(load_raw<T, VEC>(p.in_bias + c));
#pragma unroll
    for (int j = 0; j < VEC; ++j) f.v[j] += b.v[j];
  }
  if (p.drop.random) {
    if (p.drop.bits16) {
      apply_mask<VEC, true>(f.v, e, philox_key(d.seed), d.offset, p.drop.threshold, p.drop.scale);
    } else {
      apply_mask<VEC, false>(f.v, e, philox_key(d.seed), d.offset, p.drop.threshold, p.drop.scale);
    }
  }
}

// The first element of a row as normalized (x + residual rounded to R, or x): layer norm
// shifts the row by it before summing, mean = x0 + sum(x - x0) / n, so a constant row gets
// exactly mean = x0 and xhat = 0 (sum / n of the unshifted row can be 1 ulp off, which
// rstd = 1/sqrt(eps) would magnify into visible noise).
// (The dropout forms: drop, with the kernel's DropSeed.)
template <typename T, typename W, typename R>
__device__ __forceinline__ float row_first(const FwdParams<T, W, R>& p, int64_t off, bool res,
                                           bool drop = false, const DropSeed& d = DropSeed{}) {
  FVec<1> f = to_float(load_raw<T, 1>(p.x + off));
  if (drop) drop_input(f, p, off, 0, d);
  if (res) {
    f.v[0] += to_float(load_raw<R, 1>(p.residual + off)).v[0];
    f = to_float(from_float<R, 1>(f));
  }
  return f.v[0];
}

// A row group: `tpr` consecutive threads of a block own one row. tpr is a power of two
// <= 32 or a multiple of 32; a block holds blockDim.x / tpr groups, which walk rows in
// step so that block-wide barriers stay uniform.
struct RowGroup {
  int lane, group, groups;
  __device__ explicit RowGroup(int tpr)
      : lane(threadIdx.x % tpr), group(threadIdx.x / tpr), groups(blockDim.x / tpr) {}
};

// Sums K values over each row group; every thread receives its group's sums. Every thread
// of the block calls it. Hand-rolled on warp_sum instead of cub::BlockReduce because the
// group width is a runtime value and several groups may share a block; the order is fixed,
// so results are deterministic (and identical across the group's threads).
// sync_after = false skips the trailing barrier that lets the caller reuse `scratch` at
// once; the caller then alternates scratch buffers (see norm_fwd_regs).
template <int K>
__device__ __forceinline__ void group_sum(float (&v)[K], int tpr, float (*scratch)[32],
                                          bool sync_after = true) {
  if (tpr <= 32) {
    for (int o = tpr / 2; o > 0; o >>= 1) {
#pragma unroll
      for (int k = 0; k < K; ++k) v[k] += __shfl_xor_sync(0xffffffffu, v[k], o);
    }
    return;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wpg = tpr / 32, first = warp - warp % wpg;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    v[k] = warp_sum(v[k]);
    if (lane == 0) scratch[k][warp] = v[k];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = warp_sum(lane < wpg ? scratch[k][first + lane] : 0.f);
  if (sync_after) __syncthreads();
}

// ---- host helpers of the launchers ---------------------------------------------------------

inline unsigned grid_for(int64_t blocks) {
  return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(blocks, 1), 1 << 30));
}

template <typename X>
struct Tag {
  using type = X;
};

}  // namespace norm
}  // namespace fused
