// layer_norm, rms_norm and their fused residual forms (add_layer_norm, add_rms_norm) on CUDA.
// Checks, output allocation and the op entry points are shared with the CPU kernels
// (common/norm.h); this file holds the kernels and picks one by row length.
//
// One kernel family serves both norms: layer norm is rms norm plus a mean subtraction and a
// bias (`layer`: a runtime flag, uniform across the grid, or a template flag). Types: T = x / y / grad_out,
// W = weight / bias (T or float32), R = the normalized rows (T, or float32 for a float32
// residual stream). Math in float32.
//
// Forward, by row length (nvec = 16-byte vectors per row, or elements on the scalar path):
//   * norm_fwd_fixed: 16-bit rows of 1024, 2048, 3072, 4096, 5120, 6144, 8192, 12288 or
//     16384 elements with parameters in x's dtype: norm_fwd_regs with the whole launch
//     shape a compile-time constant (faster: see its comment); 16-bit rows of 32768 take
//     norm_fwd_regs shaped at compile time (FIXED_TPR): its wide variant (512 threads)
//     for the plain norms, 1024 threads for the add forms. The wide variant is shaped at
//     compile time for other plain rows too, parameters in x's dtype (launch_wide_fixed):
//     16-bit 24576 / 65536, float32 12288 / 16384 / 32768 (384 / 512 / 1024 threads) and
//     float32 layer norm rows of 8192 (256); and for the add forms' float32 rows of 32768 and
//     16-bit rows of 65536 (1024 threads, the residual staged: below).
//     FUSED_NORM_FIXED=0 turns these off. Everything else:
//   * norm_fwd_regs: the row lives in registers (64 bytes of row per thread, or 8 elements
//     on the scalar path) and is read from memory once. A row group of `tpr` threads owns
//     a row: a power of two <= 32 (several rows per 128-thread block, warp-shuffle
//     reductions) for short rows, whole warps (one row per block) for long ones. Mean,
//     then the centered sum of squares over the registers (two passes, no E[x^2] - E[x]^2
//     cancellation). Layer norm sums x - x0 (x0 = the row's first element), so a constant
//     row gets mean = x0 and xhat = 0 exactly. At most 64 registers (launch bound 1024):
//     >= 32 warps per SM whatever the block size, so other blocks' loads cover a block's
//     reductions. Layer / residual are compile-time flags on the 16-byte path.
//     Rows in registers up to 32K elements for 16-bit x, 16K for float32 x or a float32
//     residual stream, 8K scalar; plain norms twice that (the wide variant, 8 vectors a
//     thread: 64K 16-bit, 32K float32).
//     The add forms' rows past 4 vectors a thread (float32 16K-32K, 16-bit sums in x's
//     dtype 32K-64K) take the wide variant too, the residual staged in shared memory
//     (RES = kStagedRes: x's 8 vectors and the residual's would not fit 64 registers; the
//     run-time-shaped layer variants still spill 8-48 bytes, the compile-time ones none).
//   * norm_fwd_long: longer rows: a block per row, Welford (of x - x0) over one read, then
//     a second read (mostly from L2) to write y.
// Backward, dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w (rms: no mean(g)):
//   * norm_bwd_regs: x and dy in registers, one read each, persistent grid (up to 4 blocks
//     per SM); each thread loads the next row's x / dy before reducing the current one (two
//     rows of loads in flight), keeps its columns of w in registers and accumulates their
//     dweight / dbias across the rows it visits, written as float32 partials [blocks, cols].
//     16 elements per thread for 16-bit rows (up to 8K), 8 for float32 ones (up to 4K;
//     then 16 without prefetch up to 8K); rows under 128 threads share a block. Float32
//     rows stage their tiles, mean / rstd and w in shared memory instead (per-thread
//     cp.async, two rows ahead instead of one; FUSED_NORM_STAGE=0: off).
//   * norm_bwd_warp, ahead of norm_bwd_regs for 16-bit rows of 256-512 columns (parameters
//     in x's dtype): a warp a row, no block barrier, the dweight / dbias terms in the
//     warp's own slice of shared memory instead of registers (FUSED_NORM_BWD_WARP=0: off).
//   * norm_bwd_bulk (sm_90), ahead of norm_bwd_regs for 16-bit rows of 520-1024 columns
//     (parameters in x's dtype): a row a pair of warps, brought into the pair's own ring of
//     shared-memory slots by the copy engine (cp.async.bulk), several rows a pair in flight
//     and none in registers; the dweight / dbias terms in registers
//     (FUSED_NORM_BWD_BULK=0: off).
//   * norm_bwd_fixed (sm_90), ahead of norm_bwd_regs: the launch shape a compile-time
//     constant for 16-bit rows of 4096, 5120, 8192, 12288, 16384 or 32768 columns and
//     float32 rows of 12288 or 16384, parameters (and the add forms' sum) in x's dtype: a
//     row spread over a cluster of 2-8 blocks exchanging their row sums as norm_bwd_cluster
//     does, the live row tiles in shared memory (per-thread cp.async), 576-768 threads an
//     SM (FUSED_NORM_FIXED=0 turns it off).
//   * other rows over 8K elements (one block has not enough registers for row +
//     accumulators): on sm_90, norm_bwd_cluster: the row spread over a thread-block
//     cluster of up to 16 blocks (8 elements per thread, up to 64K elements), one read of
//     x and dy, the next
//     row's loads in flight; the blocks' row sums exchanged through distributed shared
//     memory with no cluster barrier, dx written a row later on 16-bit rows (a block need
//     not wait for its slowest peer at every row). Elsewhere (older GPUs, longer rows)
//     norm_bwd_row_sums (the two row sums) then norm_bwd_tiles (column tiles x row chunks:
//     dx and partials); x and dy are read twice.
//   * column_sum: reduces the partials over blocks in a fixed order (deterministic, no
//     atomics) into dweight / dbias.
// The backward kernels and column_sum are launched early (programmatic dependent launch,
// common/launch.cuh), as are the forwards: each waits for its predecessor first.
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cooperative_groups.h>

#include <cstdlib>
#include <type_traits>
#include <utility>

#include "common/checks.h"
#include "common/cluster.cuh"
#include "common/dispatch.h"
#include "common/half_bits.cuh"
#include "common/launch.cuh"
#include "common/norm.h"
#include "common/reduce.cuh"
#include "common/stage.cuh"
#include "common/vec.cuh"

namespace fused {
namespace {

constexpr int kBwdMaxThreads = 512;   // norm_bwd_regs: more registers per thread
constexpr int kLongThreads = 512;     // the long-row kernels: a block per row
constexpr int kTileThreads = 256;     // norm_bwd_tiles: one vector column per thread
constexpr int kTileRows = 4;          // rows norm_bwd_tiles loads before using them
constexpr int kBwdElems = 16;         // elements per thread: norm_bwd_regs without prefetch,
                                      // the scalar path
constexpr int kBwdBlock = 128;        // norm_bwd_regs' smallest block (rows of < 128 threads share one)
constexpr int kBwdBlocksPerSm = 4;    // at most: each block adds a partial row to column_sum

// Vectors per thread in norm_bwd_regs with prefetch (two row tiles live at once): 32 bytes
// of x per thread (16 elements of 16-bit rows, 8 of float32 ones), so that two tiles of x,
// dy and d_sum plus the dweight / dbias accumulators stay within 128 registers.
template <typename R, int VEC>
constexpr int bwd_pf_vpt() {
  return 32 / (VEC * static_cast<int>(sizeof(R)));
}
constexpr int kClusterElems = 8;      // elements per thread in norm_bwd_cluster
constexpr int kMaxCluster = 16;       // blocks per cluster (over 8: a non-portable size, sm_90)
// norm_bwd_cluster's lag: rows a block runs ahead of the row whose dx it writes (1: 16-bit
// rows on the 16-byte path; three row tiles live at once would spill elsewhere).
template <typename R, int VEC>
constexpr int cluster_lag() {
  return sizeof(R) == 2 && VEC > 1 ? 1 : 0;
}

template <typename T, typename W, typename R>
struct FwdParams {
  const T* x;
  const R* residual;  // nullptr: plain norm (the rows are x)
  const W* weight;    // nullptr: no scale
  const W* bias;      // nullptr: no shift
  T* y;
  R* sum;             // x + residual, written when residual is given
  float* mean;        // nullptr for rms norm
  float* rstd;
  int64_t rows;
  int cols;
  float eps;
  bool layer;         // subtract the mean (layer norm) or not (rms norm)
};

template <typename T, typename W, typename R>
struct BwdParams {
  const T* dy;
  const R* x;          // the normalized rows (x, or the sum of the add forms)
  const R* dsum;       // gradient of the sum output, added to dx; or nullptr
  const float* mean;   // nullptr for rms norm
  const float* rstd;
  const W* weight;     // nullptr: w = 1
  R* dx;
  float* dw_part;      // [parts, cols] partial sums of dy * xhat, or nullptr
  float* db_part;      // [parts, cols] partial sums of dy, or nullptr
  int64_t rows;
  int cols;
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

// The first element of a row as normalized (x + residual rounded to R, or x): layer norm
// shifts the row by it before summing, mean = x0 + sum(x - x0) / n, so a constant row gets
// exactly mean = x0 and xhat = 0 (sum / n of the unshifted row can be 1 ulp off, which
// rstd = 1/sqrt(eps) would magnify into visible noise).
template <typename T, typename W, typename R>
__device__ __forceinline__ float row_first(const FwdParams<T, W, R>& p, int64_t off,
                                          bool res) {
  FVec<1> f = to_float(load_raw<T, 1>(p.x + off));
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

// ---- forward ------------------------------------------------------------------------------

// norm_fwd_regs' launch bound: any block size up to 1024 threads, hence at most 64
// registers per thread, so launch shapes whose blocks tile 1024 threads keep >= 32 warps
// resident per SM (enough loads in flight to cover the memory latency while other rows
// reduce); one-row blocks of 544-992 threads fit once an SM (17-31 warps).
constexpr int kFwdMaxThreads = 1024;
// Rows of up to 32 row-group threads share a block of this many threads.
constexpr int kFwdShortThreads = 128;

// A compile-time flag of norm_fwd_regs, or kRuntime: read it from the parameters (the
// scalar path, which is not worth 4 instantiations per dtype).
constexpr int kRuntime = -1;

// Vectors per thread in norm_fwd_regs: 64 bytes of row per thread on the
// 16-byte path (4 vectors of 16-bit or float32 rows, 2 of a float32 residual stream with
// 16-bit x), 8 elements on the scalar path.
template <typename R, int VEC>
constexpr int fwd_vpt() {
  return VEC == 1 ? 8 : 64 / (VEC * static_cast<int>(sizeof(R)));
}
// The wide variant for plain rows the default would give more than 512 threads (16-bit
// rows of 16K-32K, float32 rows of 8K-16K): 8 vectors per thread (still 64 registers), so
// blocks of up to 512 threads, two per SM, and one block's loads cover the other's
// reductions (one 1024-thread block per SM would idle in them). Up to 1024 threads (one
// block per SM) for the rows of up to twice that: float32 16K-32K, 16-bit 32K-64K, which
// would otherwise take norm_fwd_long's two reads. (Also float32 layer norm rows of 8192,
// at 256 threads, shaped at compile time: forward_with.)
constexpr int kFwdWideVpt = 8;
constexpr int kFwdWideThreads = 512;

// FIXED_TPR > 0: the row length is FIXED_TPR * VPT * VEC and tpr == FIXED_TPR, both known at
// compile time (no per-vector bounds checks, constant index math), as norm_fwd_fixed does
// for shorter rows; used for the wide variant's rows whose every vector is whole
// (launch_wide_fixed: VPT 8 at 256-1024 threads; forward_add_wide: VPT 8 at 1024 threads,
// the add forms' float32 32768 / 16-bit 65536) and for the add forms at 32768 16-bit
// elements (VPT 4, 1024 threads).
// RES == kStagedRes: the add forms on the wide variant (T == R, rows past what 4 vectors a
// thread hold): the residual is not held in registers (next to x's 8 vectors it would
// spill) but copied by each thread into its own slots of dynamic shared memory ([VPT][tpr]
// vectors, cp.async, in flight with x's loads) and read back by the same thread after
// stage_wait (no barrier).
constexpr int kStagedRes = 2;
template <typename T, typename W, typename R, int VEC, int VPT, int LAYER, int RES,
          int FIXED_TPR = 0>
__global__ void __launch_bounds__(kFwdMaxThreads, 1) norm_fwd_regs(FwdParams<T, W, R> p, int tpr) {
  grid_dependency_wait();  // launched early (launch_early): nothing global before this
  constexpr bool kFixed = FIXED_TPR > 0;
  constexpr int kFixedCols = FIXED_TPR * VPT * VEC;
  if constexpr (kFixed) tpr = FIXED_TPR;  // the launcher passes the same: a constant here
  // Two scratch slots, alternated by consecutive reductions (mean, variance, next row's
  // ...), so each reduction needs one barrier: a slot is written again only after the
  // other slot's barrier, which every thread reaches after reading this one.
  __shared__ float scratch[2][1][32];
  int slot = 0;
  const bool layer = LAYER == kRuntime ? p.layer : LAYER == 1;
  const bool res = RES == kRuntime ? p.residual != nullptr : RES >= 1;
  constexpr bool kStaged = RES == kStagedRes;
  static_assert(!kStaged || (std::is_same_v<T, R> && VEC > 1), "staged: rows in x's dtype");
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  auto* rstage = reinterpret_cast<Raw<R, VEC>*>(dyn_smem);  // [VPT][tpr] when kStaged
  const RowGroup g(tpr);
  const int64_t cols = kFixed ? kFixedCols : p.cols;
  const int nvec = static_cast<int>(cols / VEC);
  const float inv_n = 1.f / static_cast<float>(cols);
  const int64_t step = static_cast<int64_t>(gridDim.x) * g.groups;
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * g.groups; first < p.rows;
       first += step) {
    const int64_t row = first + g.group;
    const bool valid = row < p.rows;
    const int64_t off = row * cols;
    // Vector i of the row, if this thread holds it, sits at off + col(i) * VEC.
    auto col = [&](int i) { return i * tpr + g.lane; };
    auto live = [&](int i) { return valid && (kFixed || col(i) < nvec); };
    // All loads first (no store in between): VPT 16-byte loads per input in flight.
    const float shift = layer && valid ? row_first(p, off, res) : 0.f;
    // v: the row in the sum's dtype (exactly what the unfused x + residual holds), kept as
    // packed words. When T == R, x is loaded straight into v (no second copy of the row).
    constexpr bool kSame = std::is_same_v<T, R>;
    Raw<R, VEC> v[VPT], rv[kStaged ? 1 : VPT];
    Raw<T, VEC> xsep[kSame ? 1 : VPT];
    auto xv = [&](int i) -> Raw<T, VEC>& {
      if constexpr (kSame) {
        return v[i];
      } else {
        return xsep[i];
      }
    };
    // The residual's vector i: in registers, or in this thread's shared-memory slot.
    auto resv = [&](int i) -> Raw<R, VEC>& {
      if constexpr (kStaged) {
        return rstage[i * tpr + g.lane];
      } else {
        return rv[i];
      }
    };
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      if (live(i)) {
        xv(i) = load_raw<T, VEC>(p.x + off + col(i) * VEC);
        const R* r = p.residual + off + col(i) * VEC;
        if constexpr (kStaged) {
          stage_vec(&resv(i), reinterpret_cast<const Raw<R, VEC>*>(r));
        } else if (res) {
          resv(i) = load_raw<R, VEC>(r);
        }
      }
    }
    if constexpr (kStaged) {
      stage_commit();
      stage_wait<0>();
    }
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      if (live(i)) {
        FVec<VEC> f = to_float(xv(i));
        if (res || !kSame) {
          if (res) {
            const FVec<VEC> r = to_float(resv(i));
#pragma unroll
            for (int j = 0; j < VEC; ++j) f.v[j] += r.v[j];
          }
          v[i] = from_float<R, VEC>(f);
          f = to_float(v[i]);
        }
#pragma unroll
        for (int j = 0; j < VEC; ++j) sum += f.v[j] - shift;
      }
    }
    float mean = 0.f;
    if (layer) {
      float t[1] = {sum};
      group_sum<1>(t, tpr, scratch[slot], false);
      slot ^= 1;
      mean = shift + t[0] * inv_n;
    }
    float t[1] = {0.f};
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      if (live(i)) {
        const FVec<VEC> f = to_float(v[i]);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float d = f.v[j] - mean;
          t[0] += d * d;
        }
      }
    }
    group_sum<1>(t, tpr, scratch[slot], false);
    slot ^= 1;
    const float rstd = rsqrtf(t[0] * inv_n + p.eps);
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      if (live(i)) {
        const int64_t e = off + col(i) * VEC;
        if (res) store_raw<R, VEC>(p.sum + e, v[i]);
        const FVec<VEC> w = param_or<W, VEC>(p.weight, col(i), 1.f);
        FVec<VEC> o = to_float(v[i]);
        if (layer) {
          const FVec<VEC> b = param_or<W, VEC>(p.bias, col(i), 0.f);
#pragma unroll
          for (int j = 0; j < VEC; ++j) o.v[j] = (o.v[j] - mean) * rstd * w.v[j] + b.v[j];
        } else {
#pragma unroll
          for (int j = 0; j < VEC; ++j) o.v[j] = o.v[j] * rstd * w.v[j];
        }
        store_raw<T, VEC>(p.y + e, from_float<T, VEC>(o));
      }
    }
    if (valid && g.lane == 0) {
      if (layer) p.mean[row] = mean;
      p.rstd[row] = rstd;
    }
  }
}

// Welford's running (count, mean, sum of squared deviations), merged with Chan's formula.
struct Welford {
  float n, mean, m2;
};

__device__ __forceinline__ Welford welford_merge(Welford a, Welford b) {
  const float n = a.n + b.n;
  if (n == 0.f) return a;
  const float d = b.mean - a.mean, wb = b.n / n;
  return {n, a.mean + d * wb, a.m2 + b.m2 + d * d * a.n * wb};
}

__device__ __forceinline__ Welford warp_welford(Welford w) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Welford other{__shfl_down_sync(0xffffffffu, w.n, o), __shfl_down_sync(0xffffffffu, w.mean, o),
                  __shfl_down_sync(0xffffffffu, w.m2, o)};
    w = welford_merge(w, other);
  }
  return w;  // valid in lane 0
}

// Block-wide Welford merge in a fixed tree order; every thread receives the result.
__device__ Welford block_welford(Welford w, float (*smem)[32]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  w = warp_welford(w);
  if (lane == 0) {
    smem[0][warp] = w.n;
    smem[1][warp] = w.mean;
    smem[2][warp] = w.m2;
  }
  __syncthreads();
  if (warp == 0) {
    const bool have = lane < static_cast<int>(blockDim.x / 32);
    w = have ? Welford{smem[0][lane], smem[1][lane], smem[2][lane]} : Welford{0.f, 0.f, 0.f};
    w = warp_welford(w);
    if (lane == 0) {
      smem[0][0] = w.n;
      smem[1][0] = w.mean;
      smem[2][0] = w.m2;
    }
  }
  __syncthreads();
  w = Welford{smem[0][0], smem[1][0], smem[2][0]};
  __syncthreads();
  return w;
}

template <typename T, typename W, typename R, int VEC>
__global__ void __launch_bounds__(kLongThreads) norm_fwd_long(FwdParams<T, W, R> p) {
  grid_dependency_wait();  // launched early (launch_early): nothing global before this
  __shared__ float smem[3][32];
  const int nvec = p.cols / VEC;
  const float inv_n = 1.f / static_cast<float>(p.cols);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const int64_t off = row * p.cols;
    // Pass 1: read x (+ residual, writing the sum); Welford per vector of x - shift (see
    // row_first), merged per thread.
    const float shift = p.layer ? row_first(p, off, p.residual != nullptr) : 0.f;
    Welford acc{0.f, 0.f, 0.f};
    for (int c = threadIdx.x; c < nvec; c += blockDim.x) {
      const int64_t e = off + static_cast<int64_t>(c) * VEC;
      FVec<VEC> f = to_float(load_raw<T, VEC>(p.x + e));
      if (p.residual) {
        const FVec<VEC> r = to_float(load_raw<R, VEC>(p.residual + e));
#pragma unroll
        for (int j = 0; j < VEC; ++j) f.v[j] += r.v[j];
        const Raw<R, VEC> v = from_float<R, VEC>(f);
        store_raw<R, VEC>(p.sum + e, v);
        f = to_float(v);  // normalize the rounded sum
      }
      float m = 0.f, m2 = 0.f;
#pragma unroll
      for (int j = 0; j < VEC; ++j) f.v[j] -= shift;
#pragma unroll
      for (int j = 0; j < VEC; ++j) m += f.v[j];
      m *= 1.f / VEC;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float d = f.v[j] - m;
        m2 += d * d;
      }
      acc = welford_merge(acc, Welford{static_cast<float>(VEC), m, m2});
    }
    acc = block_welford(acc, smem);
    const float mean = p.layer ? shift + acc.mean : 0.f;
    // rms norm (shift 0): E[x^2] = var + mean^2 (non-negative terms, no cancellation)
    const float ms = acc.m2 * inv_n + (p.layer ? 0.f : acc.mean * acc.mean);
    const float rstd = rsqrtf(ms + p.eps);
    // Pass 2: read the rows again (this thread's own elements; mostly L2 hits), write y.
    for (int c = threadIdx.x; c < nvec; c += blockDim.x) {
      const int64_t e = off + static_cast<int64_t>(c) * VEC;
      FVec<VEC> o = p.residual ? to_float(load_raw<R, VEC>(p.sum + e))
                               : to_float(load_raw<T, VEC>(p.x + e));
      const FVec<VEC> w = param_or<W, VEC>(p.weight, c, 1.f);
      const FVec<VEC> b = param_or<W, VEC>(p.bias, c, 0.f);
#pragma unroll
      for (int j = 0; j < VEC; ++j) o.v[j] = (o.v[j] - mean) * rstd * w.v[j] + b.v[j];
      store_raw<T, VEC>(p.y + e, from_float<T, VEC>(o));
    }
    if (threadIdx.x == 0) {
      if (p.mean) p.mean[row] = mean;
      p.rstd[row] = rstd;
    }
  }
}

// ---- forward, compile-time row lengths -----------------------------------------------------
// norm_fwd_fixed: norm_fwd_regs for the common hidden sizes (16-bit rows whose length is
// kFixedVpt * 8 * TPR for a TPR in FixedTprs: 1024 to 16384 columns), with parameters in
// x's dtype. Everything about the launch shape is a constant: a block of TPR threads per
// row (also the 32- and 64-thread rows: a block retires as soon as its row is written,
// KERNEL_LOG norm v16; on GPUs that hold fewer than 32 blocks an SM, sm_86 / sm_89, the
// 32-thread rows then keep fewer than 32 warps resident), 4 vectors per thread, no
// per-vector bounds checks, no grid-stride loop, at most 64 registers (56 for 384-thread
// rows). w / b are loaded after the
// reductions (they are L1/L2 hits; loaded with the row they would need 32 more registers
// and spill 56-256 bytes). A standalone sweep (KERNEL_LOG, norm forward, session 3) put
// this shape at 93-97% of copy where the run-time-shaped kernel reaches 79-84%.
//
// Exact constant rows without norm_fwd_regs' x0 shift: every partial sum of a constant
// 16-bit row is k * x0 with k a product of two factors < 64 and a power of two, which
// float32 holds exactly (x0 has <= 11 significant bits; and the sum does not overflow, i.e.
// |x0| < FLT_MAX / cols), and the mean is a correctly rounded division by the length (not
// a multiplication by its inexact reciprocal), so mean == x0 and every x - mean is 0.
constexpr int kFixedVpt = 4;
// (tests/test_norm.py FIXED_COLS lists the same lengths.)
using FixedTprs = std::integer_sequence<int, 32, 64, 96, 128, 160, 192, 256, 384, 512>;

// Resident blocks the launch bound asks for: >= 1024 threads' worth (64 registers), or one
// block more where whole blocks would leave a quarter of that empty (384 threads: 3 blocks
// at 56 registers instead of 2 at up to 85).
constexpr int fixed_min_blocks(int block) {
  return kFwdMaxThreads / block * block <= 3 * kFwdMaxThreads / 4 ? kFwdMaxThreads / block + 1
                                                                   : kFwdMaxThreads / block;
}

template <typename T, int TPR, int LAYER, int RES>
__global__ void __launch_bounds__(TPR, fixed_min_blocks(TPR))
norm_fwd_fixed(FwdParams<T, T, T> p) {
  grid_dependency_wait();  // launched early (launch_early): nothing global before this
  constexpr int VEC = kVecElems<T>, VPT = kFixedVpt, COLS = TPR * VPT * VEC;
  static_assert(TPR % 32 == 0, "whole warps");
  __shared__ float scratch[2][1][32];
  const int lane = threadIdx.x;
  const int64_t row = blockIdx.x;
  const int64_t base = row * COLS + lane * VEC;
  auto at = [&](int i) { return base + i * TPR * VEC; };  // element offset of vector i
  // Every load of the row first; then the row as floats (the sum of the add forms is
  // stored as soon as it is formed: no load is left to overtake).
  Raw<T, VEC> in[VPT], res[RES ? VPT : 1];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    in[i] = load_raw<T, VEC>(p.x + at(i));
    if constexpr (RES) res[i] = load_raw<T, VEC>(p.residual + at(i));
  }
  FVec<VEC> v[VPT];
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    v[i] = to_float(in[i]);
    if constexpr (RES) {  // normalize the sum as stored (rounded to T)
      const FVec<VEC> fr = to_float(res[i]);
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[i].v[j] += fr.v[j];
      const Raw<T, VEC> rounded = from_float<T, VEC>(v[i]);
      store_raw<T, VEC>(p.sum + at(i), rounded);
      v[i] = to_float(rounded);
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) sum += v[i].v[j];
  }
  float mean = 0.f;
  if constexpr (LAYER) {
    float t[1] = {sum};
    group_sum<1>(t, TPR, scratch[0], false);
    mean = __fdiv_rn(t[0], static_cast<float>(COLS));
  }
  float q[1] = {0.f};
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float d = v[i].v[j] - mean;
      q[0] += d * d;
    }
  }
  group_sum<1>(q, TPR, scratch[1], false);  // the other slot: no barrier between the two
  const float rstd = rsqrtf(q[0] * (1.f / COLS) + p.eps);
  // w / b two vectors at a time: the empty asm keeps the compiler from hoisting all of
  // them above the stores (32 more live registers: spills at the 64-register bound).
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const FVec<VEC> w = param_or<T, VEC>(p.weight, lane + i * TPR, 1.f);
    const FVec<VEC> b = param_or<T, VEC>(LAYER ? p.bias : nullptr, lane + i * TPR, 0.f);
    FVec<VEC> o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) o.v[j] = (v[i].v[j] - mean) * rstd * w.v[j] + b.v[j];
    store_raw<T, VEC>(p.y + at(i), from_float<T, VEC>(o));
    if (i % 2 == 1) asm volatile("" ::: "memory");
  }
  if (lane == 0) {
    if constexpr (LAYER) p.mean[row] = mean;
    p.rstd[row] = rstd;
  }
}

// ---- backward -----------------------------------------------------------------------------

// One thread's share of one row of the register backward (vector i of the row at column
// i * tpr + lane): its vectors of x, dy (and d_sum) and the row's mean / rstd.
template <typename T, typename R, int VEC, int VPT>
struct BwdTile {
  Raw<R, VEC> x[VPT], s[VPT];
  Raw<T, VEC> g[VPT];
  float mean, rstd;
  __device__ __forceinline__ const Raw<R, VEC>& xv(int i) const { return x[i]; }
  __device__ __forceinline__ const Raw<T, VEC>& gv(int i) const { return g[i]; }
  __device__ __forceinline__ const Raw<R, VEC>& sv(int i) const { return s[i]; }
};

// The same share of a row staged in shared memory (norm_bwd_regs with STAGES): vector i of
// x / dy / d_sum at [i * stride] from the thread's first, mean and rstd read from the
// thread's own slots when the tile is made (after the copies have landed).
template <typename T, typename R, int VEC>
struct StagedBwdTile {
  const Raw<R, VEC>* x;
  const Raw<T, VEC>* g;
  const Raw<R, VEC>* s;
  int stride;
  float mean, rstd;
  __device__ __forceinline__ const Raw<R, VEC>& xv(int i) const { return x[i * stride]; }
  __device__ __forceinline__ const Raw<T, VEC>& gv(int i) const { return g[i * stride]; }
  __device__ __forceinline__ const Raw<R, VEC>& sv(int i) const { return s[i * stride]; }
};

// PIN: loads kept where they are issued (load_pinned), for the cluster kernel's prefetch.
template <bool PIN = false, typename T, typename W, typename R, int VEC, int VPT>
__device__ __forceinline__ void bwd_load(const BwdParams<T, W, R>& p, int64_t row, bool valid,
                                         int lane, int tpr, BwdTile<T, R, VEC, VPT>& t) {
  auto load = [](const auto* q) {
    if constexpr (PIN) return load_pinned(q);
    else return *q;
  };
  const int nvec = p.cols / VEC;
  const int64_t off = row * p.cols;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int c = i * tpr + lane;
    if (valid && c < nvec) {
      const int64_t e = off + static_cast<int64_t>(c) * VEC;
      t.x[i] = load(reinterpret_cast<const Raw<R, VEC>*>(p.x + e));
      t.g[i] = load(reinterpret_cast<const Raw<T, VEC>*>(p.dy + e));
      if (p.dsum) t.s[i] = load(reinterpret_cast<const Raw<R, VEC>*>(p.dsum + e));
    }
  }
  t.mean = valid && p.mean ? load(p.mean + row) : 0.f;
  t.rstd = valid ? load(p.rstd + row) : 0.f;
}

// The rest of a row once its tile is loaded, in two halves around the row reduction.
// bwd_sums_to hands this thread's dweight / dbias terms of vector i to terms(i, dy, xhat)
// and returns its shares of the two row sums; bwd_sums adds the terms to dw / db in
// registers. bwd_dx writes dx from the reduced sums. weight(i): w's vector i as floats.
template <int VEC, int VPT, typename T, typename W, typename R, typename Tile, typename Weight,
          typename Terms>
__device__ __forceinline__ void bwd_sums_to(const BwdParams<T, W, R>& p, const Tile& t,
                                            bool valid, int lane, int tpr, Weight&& weight,
                                            Terms&& terms, float (&s)[2]) {
  const int nvec = p.cols / VEC;
  s[0] = s[1] = 0.f;  // sum of g, sum of g * xhat
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    if (valid && i * tpr + lane < nvec) {
      const FVec<VEC> w = weight(i);
      const FVec<VEC> xf = to_float(t.xv(i)), df = to_float(t.gv(i));
      FVec<VEC> xhat;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        xhat.v[j] = (xf.v[j] - t.mean) * t.rstd;
        const float gw = df.v[j] * w.v[j];
        s[0] += gw;
        s[1] += gw * xhat.v[j];
      }
      terms(i, df, xhat);
    }
  }
}

template <int VEC, int VPT, typename T, typename W, typename R, typename Tile, typename Weight>
__device__ __forceinline__ void bwd_sums(const BwdParams<T, W, R>& p, const Tile& t, bool valid,
                                         int lane, int tpr, Weight&& weight,
                                         float (&dw)[VPT][VEC], float (&db)[VPT][VEC],
                                         float (&s)[2]) {
  bwd_sums_to<VEC, VPT>(p, t, valid, lane, tpr, weight,
                        [&](int i, const FVec<VEC>& d, const FVec<VEC>& xhat) {
#pragma unroll
                          for (int j = 0; j < VEC; ++j) {
                            dw[i][j] += d.v[j] * xhat.v[j];
                            db[i][j] += d.v[j];
                          }
                        },
                        s);
}

template <int VEC, int VPT, typename T, typename W, typename R, typename Tile, typename Weight>
__device__ __forceinline__ void bwd_dx(const BwdParams<T, W, R>& p, const Tile& t, int64_t row,
                                       bool valid, int lane, int tpr, Weight&& weight,
                                       const float (&s)[2]) {
  const int nvec = p.cols / VEC;
  const float inv_n = 1.f / static_cast<float>(p.cols);
  const float c1 = p.mean ? s[0] * inv_n : 0.f, c2 = s[1] * inv_n;
  const int64_t off = row * p.cols;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    if (valid && i * tpr + lane < nvec) {
      const FVec<VEC> w = weight(i);
      const FVec<VEC> xf = to_float(t.xv(i)), df = to_float(t.gv(i));
      FVec<VEC> o;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float xhat = (xf.v[j] - t.mean) * t.rstd;
        o.v[j] = t.rstd * (df.v[j] * w.v[j] - c1 - xhat * c2);
      }
      if (p.dsum) {
        const FVec<VEC> sf = to_float(t.sv(i));
#pragma unroll
        for (int j = 0; j < VEC; ++j) o.v[j] += sf.v[j];
      }
      const int64_t e = off + static_cast<int64_t>(i * tpr + lane) * VEC;
      store_raw<R, VEC>(p.dx + e, from_float<R, VEC>(o));
    }
  }
}

// VEC floats to q, 16 bytes a store where VEC allows (then q is 16-byte aligned: the
// partial rows' offsets are multiples of VEC floats). Every block of a persistent grid
// stores its partial row at the same moment, the kernel's end, so the store count there is
// kernel time: 4-byte stores made eight L2 sector writes per 32 bytes, ~15 us of the layer
// norm backward at 16384x4096 (KERNEL_LOG norm v18).
template <int VEC>
__device__ __forceinline__ void store_floats(float* q, const float (&v)[VEC]) {
  if constexpr (VEC % 4 == 0) {
#pragma unroll
    for (int j = 0; j < VEC; j += 4) {
      *reinterpret_cast<float4*>(q + j) = make_float4(v[j], v[j + 1], v[j + 2], v[j + 3]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) q[j] = v[j];
  }
}

// Writes a thread's dweight / dbias accumulators into partial row `part` when every column
// has exactly one owner thread (lane of tpr) in the block or cluster.
template <int VEC, int VPT>
__device__ __forceinline__ void store_partials(float* dw_part, float* db_part, int64_t part,
                                               int cols, int lane, int tpr,
                                               const float (&dw)[VPT][VEC],
                                               const float (&db)[VPT][VEC]) {
  float* dwp = dw_part ? dw_part + part * cols : nullptr;
  float* dbp = db_part ? db_part + part * cols : nullptr;
  const int nvec = cols / VEC;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int c = i * tpr + lane;
    if (c < nvec) {
      if (dwp) store_floats<VEC>(dwp + c * VEC, dw[i]);
      if (dbp) store_floats<VEC>(dbp + c * VEC, db[i]);
    }
  }
}

// norm_bwd_regs' shared memory with STAGES > 0, per thread t of the block (`threads`): the
// staging ring's x [STAGES][VPT][threads], dy the same, d_sum the same (when present), mean /
// rstd [STAGES][2][threads], then w [VPT][threads]; the groups' combine buffer follows. Every
// part is 16-byte aligned (threads is even).
template <typename T, typename W, typename R, int VEC, int VPT, int STAGES>
struct BwdStage {
  static constexpr size_t kX = STAGES * VPT * sizeof(Raw<R, VEC>);  // bytes a thread
  static constexpr size_t kG = STAGES * VPT * sizeof(Raw<T, VEC>);
  static constexpr size_t kM = STAGES * 2 * sizeof(float);
  static constexpr size_t kW = VPT * sizeof(Raw<W, VEC>);
  __host__ __device__ static constexpr size_t g_at(int threads) { return kX * threads; }
  __host__ __device__ static constexpr size_t s_at(int threads) { return (kX + kG) * threads; }
  __host__ __device__ static constexpr size_t m_at(int threads, bool dsum) {
    return (kX * (dsum ? 2 : 1) + kG) * threads;
  }
  __host__ __device__ static constexpr size_t w_at(int threads, bool dsum) {
    return m_at(threads, dsum) + kM * threads;
  }
  __host__ __device__ static constexpr size_t bytes(int threads, bool dsum) {
    return STAGES == 0 ? 0 : w_at(threads, dsum) + kW * threads;
  }
};

// PF: the next row's tile is loaded before this row's reduction, so two rows of loads are
// in flight per thread (the sweep's measured win: 16384x4096 bf16 79% -> 92% of copy).
// STAGES > 0 (with PF): the tiles are staged in shared memory instead of registers, each
// thread copying its own vectors (cp.async) STAGES - 1 rows ahead and reading them back
// itself: no registers hold a prefetch, so more warps fit an SM (KERNEL_LOG norm v22).
// Staged only for float32 rows (x, or the add forms' float32 sum): 8 elements a thread, up
// to 512 threads. The launch bound sizes registers for two blocks an SM, but at 512 threads
// the ring (248 bytes a thread, 124 KB) leaves room for one: what it buys there is the
// deeper prefetch (two rows in flight instead of one), as measured. 16-bit rows (16
// elements a thread, 32 accumulators) measured slower staged at the register counts that
// would fit more blocks (KERNEL_LOG norm v22).
template <typename R>
constexpr bool bwd_regs_staged() {
  return sizeof(R) == 4;
}

template <typename T, typename W, typename R, int VEC, int VPT, bool PF, int STAGES>
__global__ void __launch_bounds__(kBwdMaxThreads, STAGES > 0 ? 2 : 1)
norm_bwd_regs(BwdParams<T, W, R> p, int tpr) {
  static_assert(STAGES == 0 || (PF && STAGES >= 2 && bwd_regs_staged<R>()),
                "staging is a deeper prefetch, for float32 rows");
  grid_dependency_wait();  // launched early (launch_early): nothing global before this
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  using Stage = BwdStage<T, W, R, VEC, VPT, STAGES>;
  // [2][cols]: groups of one block merge their partials (after the staging ring).
  float* combine = reinterpret_cast<float*>(dyn_smem + Stage::bytes(blockDim.x, p.dsum));
  // Two scratch slots alternated by consecutive rows: one barrier per row (see
  // norm_fwd_regs).
  __shared__ float scratch[2][2][32];
  int slot = 0;
  const RowGroup g(tpr);
  const int nvec = p.cols / VEC;
  // A thread owns the same columns in every row it visits: w is loaded once.
  // Staged: in the thread's own shared-memory slots (no registers; read back by the thread).
  Raw<W, VEC> wv[STAGES > 0 ? 1 : VPT];
  auto* ws = STAGES > 0
                 ? reinterpret_cast<Raw<W, VEC>*>(dyn_smem + Stage::w_at(blockDim.x, p.dsum))
                 : nullptr;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int c = i * tpr + g.lane;
    if (p.weight && c < nvec) {
      const Raw<W, VEC> v = load_raw<W, VEC>(p.weight + c * VEC);
      if constexpr (STAGES > 0) ws[i * blockDim.x + threadIdx.x] = v;
      else wv[i] = v;
    }
  }
  auto weight = [&](int i) {
    if constexpr (STAGES > 0) {
      if (p.weight) return to_float(ws[i * blockDim.x + threadIdx.x]);
    } else {
      if (p.weight) return to_float(wv[i]);
    }
    FVec<VEC> f;
#pragma unroll
    for (int j = 0; j < VEC; ++j) f.v[j] = 1.f;
    return f;
  };
  float dw[VPT][VEC], db[VPT][VEC];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) dw[i][j] = db[i][j] = 0.f;
  }
  using Tile = BwdTile<T, R, VEC, VPT>;
  auto finish = [&](const auto& t, int64_t row) {
    float s[2];
    bwd_sums<VEC, VPT>(p, t, row < p.rows, g.lane, tpr, weight, dw, db, s);
    group_sum<2>(s, tpr, scratch[slot], false);
    slot ^= 1;
    bwd_dx<VEC, VPT>(p, t, row, row < p.rows, g.lane, tpr, weight, s);
  };
  // The groups of a block walk rows in step (first is uniform): barriers stay uniform.
  const int64_t step = static_cast<int64_t>(gridDim.x) * g.groups;
  const int64_t first0 = static_cast<int64_t>(blockIdx.x) * g.groups;
  if constexpr (STAGES > 0) {
    const int threads = blockDim.x, t = threadIdx.x;
    auto* xs = reinterpret_cast<Raw<R, VEC>*>(dyn_smem);
    auto* gs = reinterpret_cast<Raw<T, VEC>*>(dyn_smem + Stage::g_at(threads));
    auto* ss = reinterpret_cast<Raw<R, VEC>*>(dyn_smem + Stage::s_at(threads));
    auto* ms = reinterpret_cast<float*>(dyn_smem + Stage::m_at(threads, p.dsum));
    // Vector i of ring slot k at [(k * VPT + i) * threads + t]: 16 consecutive bytes a lane.
    auto at = [&](int k, int i) { return (k * VPT + i) * threads + t; };
    // One group a call (empty past the last row), so that stage_wait's count stays uniform.
    auto stage = [&](int k, int64_t row) {
      if (row < p.rows) {
        const int64_t off = row * p.cols;
#pragma unroll
        for (int i = 0; i < VPT; ++i) {
          const int c = i * tpr + g.lane;
          if (c < nvec) {
            const int64_t e = off + static_cast<int64_t>(c) * VEC;
            stage_vec(&xs[at(k, i)], reinterpret_cast<const Raw<R, VEC>*>(p.x + e));
            stage_vec(&gs[at(k, i)], reinterpret_cast<const Raw<T, VEC>*>(p.dy + e));
            if (p.dsum) {
              stage_vec(&ss[at(k, i)], reinterpret_cast<const Raw<R, VEC>*>(p.dsum + e));
            }
          }
        }
        if (p.mean) stage_copy4(&ms[(2 * k) * threads + t], p.mean + row);
        stage_copy4(&ms[(2 * k + 1) * threads + t], p.rstd + row);
      }
      stage_commit();
    };
#pragma unroll
    for (int k = 0; k < STAGES - 1; ++k) stage(k, first0 + k * step + g.group);
    int k = 0;  // the ring slot of this row; the row STAGES - 1 ahead goes to the one before
    for (int64_t first = first0; first < p.rows; first += step) {
      const int64_t row = first + g.group;
      stage(k == 0 ? STAGES - 1 : k - 1, row + (STAGES - 1) * step);
      stage_wait<STAGES - 1>();  // this row's copies have landed
      StagedBwdTile<T, R, VEC> tile{&xs[at(k, 0)], &gs[at(k, 0)], &ss[at(k, 0)],
                                    threads, 0.f, 0.f};
      if (row < p.rows) {
        tile.mean = p.mean ? ms[(2 * k) * threads + t] : 0.f;
        tile.rstd = ms[(2 * k + 1) * threads + t];
      }
      finish(tile, row);
      k = k == STAGES - 1 ? 0 : k + 1;
    }
  } else {
    Tile cur;
    if constexpr (PF) bwd_load(p, first0 + g.group, first0 + g.group < p.rows, g.lane, tpr, cur);
    for (int64_t first = first0; first < p.rows; first += step) {
      const int64_t row = first + g.group;
      if constexpr (PF) {
        Tile next;
        bwd_load(p, row + step, row + step < p.rows, g.lane, tpr, next);
        finish(cur, row);
        cur = next;
      } else {
        bwd_load(p, row, row < p.rows, g.lane, tpr, cur);
        finish(cur, row);
      }
    }
  }
  if (!p.dw_part && !p.db_part) return;  // uniform across the grid
  if (g.groups == 1) {  // each column has one owner in the block
    store_partials(p.dw_part, p.db_part, blockIdx.x, p.cols, g.lane, tpr, dw, db);
    return;
  }
  // Several groups own the same columns: add their partials in group order.
  for (int k = threadIdx.x; k < 2 * p.cols; k += blockDim.x) combine[k] = 0.f;
  __syncthreads();
  for (int q = 0; q < g.groups; ++q) {
    if (g.group == q) {
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        const int c = i * tpr + g.lane;
        if (c < nvec) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            combine[c * VEC + j] += dw[i][j];
            combine[p.cols + c * VEC + j] += db[i][j];
          }
        }
      }
    }
    __syncthreads();
  }
  float* dwp = p.dw_part ? p.dw_part + static_cast<int64_t>(blockIdx.x) * p.cols : nullptr;
  float* dbp = p.db_part ? p.db_part + static_cast<int64_t>(blockIdx.x) * p.cols : nullptr;
  for (int k = threadIdx.x; k < p.cols; k += blockDim.x) {
    if (dwp) dwp[k] = combine[k];
    if (dbp) dbp[k] = combine[p.cols + k];
  }
}

// norm_bwd_warp: 16-bit rows of 256 to 512 columns (parameters and rows in x's dtype), a
// warp a row and no block barrier in the row loop, as softmax's backward runs them. The
// dweight / dbias terms go to the warp's own slice of shared memory (float32,
// read-modify-write by the lane that owns them) instead of registers, so that the registers
// hold the row: 24 warps an SM, or 16 with PF (the next row's tile loaded before this row's
// sums, 128 registers). The block's warps add their slices in warp order at the end: one
// partial row a block, deterministic. Against norm_bwd_regs (KERNEL_LOG norm v34, H200):
// 4-10% faster at 512 columns, 4-16% at 256; at 1024 (4 vectors a lane) from 5% faster
// (rms, PF) to 22% slower (the add forms), the slices' shared-memory traffic (16 KB a row at
// 1024 columns for both terms) costing more than the warps gain, so those rows stay on
// norm_bwd_regs.
// Slice layout: float4 ((term * VPT + i) * 2 + h) * 32 + lane holds elements 4h..4h+3 of
// the lane's vector i (consecutive lanes, consecutive 16 bytes: no bank conflicts).
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
__global__ void __launch_bounds__(warp_bwd_threads<PF>(), 1)
norm_bwd_warp(BwdParams<T, T, T> p) {
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

// norm_bwd_bulk: 16-bit rows of 65-128 vectors (520-1024 columns), parameters and rows in
// x's dtype, sm_90 (KERNEL_LOG norm v36, v37). norm_bwd_regs holds a row in 64 threads'
// registers next to their 32 dweight / dbias accumulators: 16 warps an SM with one row each
// in flight, where softmax's backward over the same bytes keeps ~4x the bytes in flight. Here
// a row has the same 64 threads (a pair of warps, 2 vectors a thread), but the copy engine
// brings it: each pair has its own ring of S one-row slots (x, dy, d_sum: a cp.async.bulk an
// input), so S - 1 rows a pair are in flight while one is used and no register holds them.
// A row is read from its slot once, into registers (x - mean and dy as floats); the pair adds
// its two warps' row sums through shared memory at a named barrier of its 64 threads (no
// block barrier in the row loop), after which the slot is refilled, and writes dx. The
// dweight / dbias terms stay in registers; at the end the block's 4 pairs add theirs in pair
// order: one partial row a block, deterministic.
// dx = rstd (g - c1 - xhat c2) (g = dy w, xhat = (x - mean) rstd, c1 = mean g, c2 = mean
// g xhat) as d w + (t kc + kb) with t = x - mean, d = dy rstd, kc = -rstd^2 c2,
// kb = -rstd c1: 2 operations an element; dweight += d t, dbias += dy.
constexpr int kBulkBwdThreads = 256;
constexpr int kBulkBwdPairs = kBulkBwdThreads / 64;  // rows in step in a block
constexpr int kBulkBwdVpt = 2;                       // 16-byte vectors a thread
constexpr int kBulkBwdPitch = 64 * kBulkBwdVpt * 8;  // a slot's row: 1024 elements

// A slot: one row of x, dy (and d_sum) at a fixed pitch; a pair's ring is S slots.
__host__ __device__ constexpr size_t bulk_bwd_slot(bool dsum) {
  return (2 + dsum) * size_t{kBulkBwdPitch} * 2;
}

// A barrier of `threads` threads (a multiple of 32) on hardware barrier `id` (0 is
// __syncthreads'): orders their shared-memory accesses like __syncthreads.
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Launch bound: two blocks an SM (<= 128 registers). LAYER: layer_norm's backward (mean, the
// g sum, dbias); otherwise rms_norm's (mean 0, no bias), which skips them: 3 of ~11
// operations an element.
template <typename T, bool DSUM, bool LAYER, int S>
__global__ void __launch_bounds__(kBulkBwdThreads, 2) norm_bwd_bulk(const BwdParams<T, T, T> p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static_assert(sizeof(T) == 2, "16-bit rows: 8 elements a 16-byte vector");
  constexpr int VEC = 8, VPT = kBulkBwdVpt, PITCH = kBulkBwdPitch, PAIRS = kBulkBwdPairs;
  constexpr int kInputs = 2 + DSUM;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  __shared__ uint64_t full[PAIRS][S];
  __shared__ float2 sums[PAIRS][2][2];  // [pair][row parity][warp]: (sum g, sum g t)
  const int cols = p.cols, nvec = cols / VEC;
  const int lane = threadIdx.x % 32, pair = threadIdx.x / 64, half = threadIdx.x / 32 % 2;
  const int u = threadIdx.x % 64;  // the thread in its pair: vectors u and u + 64 of a row
  // The pair's rows: first + j * pairs, j < mine.
  const int64_t pairs = static_cast<int64_t>(gridDim.x) * PAIRS;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * PAIRS + pair;
  const int64_t mine = first < p.rows ? (p.rows - first + pairs - 1) / pairs : 0;
  T* const ring = reinterpret_cast<T*>(dyn_smem) + pair * S * kInputs * PITCH;
  const uint32_t row_bytes = static_cast<uint32_t>(cols * sizeof(T));
  auto stage = [&](int64_t j, int s) {  // the pair's row j into slot s (thread u == 0)
    const int64_t off = (first + j * pairs) * cols;
    T* dst = ring + s * kInputs * PITCH;
    mbar_expect(&full[pair][s], kInputs * row_bytes);
    bulk_load(dst, p.x + off, row_bytes, &full[pair][s]);
    bulk_load(dst + PITCH, p.dy + off, row_bytes, &full[pair][s]);
    if constexpr (DSUM) bulk_load(dst + 2 * PITCH, p.dsum + off, row_bytes, &full[pair][s]);
  };
  // The slots past the row (never copied to) hold zeros: a row is read whole, without
  // bounds checks, and there dy = 0 adds nothing to the sums or the dweight / dbias terms.
  bool valid[VPT];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    valid[i] = u + 64 * i < nvec;
    if (!valid[i]) {
      for (int e = 0; e < S * kInputs; ++e) {
        *reinterpret_cast<uint4*>(ring + e * PITCH + (u + 64 * i) * VEC) = make_uint4(0, 0, 0, 0);
      }
    }
  }
  if (threadIdx.x < PAIRS * S) mbar_init(&full[0][0] + threadIdx.x);
  // Launched early (launch_early): shared memory only before this, nothing global.
  grid_dependency_wait();
  __syncthreads();  // the mbarriers exist before any copy or wait; the zeros are in
  // w as floats (1 where there is no weight or past the row).
  float w[VPT][VEC];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const FVec<VEC> f = param_or<T, VEC>(valid[i] ? p.weight : nullptr, u + 64 * i, 1.f);
#pragma unroll
    for (int k = 0; k < VEC; ++k) w[i][k] = f.v[k];
  }
  if (u == 0) {
    for (int j = 0; j < S && j < mine; ++j) stage(j, j);
  }
  // mean / rstd of the pair's rows 32 at a time, lane l holding row 32 b + l's; the next 32
  // loaded while these are used.
  float stat[2][2];  // [this batch, next][mean, rstd]
  auto load_stats = [&](int64_t b, float (&st)[2]) {
    const int64_t j = 32 * b + lane;
    const int64_t row = first + j * pairs;
    st[0] = (LAYER && j < mine) ? p.mean[row] : 0.f;
    st[1] = j < mine ? p.rstd[row] : 0.f;
  };
  load_stats(0, stat[0]);
  load_stats(1, stat[1]);

  float dw[VPT][VEC], db[VPT][VEC];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) dw[i][k] = db[i][k] = 0.f;
  }
  const float inv_n = 1.f / static_cast<float>(cols);
  T* dx = p.dx + first * cols + u * VEC;  // the pair's row j: dx + j * step
  const int64_t step = pairs * cols;
  int s = 0;
  uint32_t phase = 0;  // of slot s's barrier
  for (int64_t j = 0; j < mine; ++j, dx += step) {
    if (j % 32 == 0 && j > 0) {
      stat[0][0] = stat[1][0], stat[0][1] = stat[1][1];
      load_stats(j / 32 + 1, stat[1]);
    }
    const float mean = __shfl_sync(0xffffffffu, stat[0][0], static_cast<int>(j % 32));
    const float rstd = __shfl_sync(0xffffffffu, stat[0][1], static_cast<int>(j % 32));
    const T* src = ring + s * kInputs * PITCH + u * VEC;
    mbar_wait(&full[pair][s], phase);
    // The row into registers: t = x - mean, dy; the two sums over the thread's elements (a
    // pair of add chains a vector).
    float t[VPT][VEC], d[VPT][VEC], sg[VPT], sgt[VPT];
    Raw<T, VEC> ds[VPT];
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      sg[i] = sgt[i] = 0.f;
      const FVec<VEC> xf = to_float(lds_raw<T, VEC>(src + 64 * i * VEC));
      const FVec<VEC> df = to_float(lds_raw<T, VEC>(src + PITCH + 64 * i * VEC));
      if constexpr (DSUM) ds[i] = lds_raw<T, VEC>(src + 2 * PITCH + 64 * i * VEC);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        t[i][k] = LAYER ? xf.v[k] - mean : xf.v[k];
        d[i][k] = df.v[k];
        const float g = df.v[k] * w[i][k];
        if constexpr (LAYER) sg[i] += g;
        sgt[i] += g * t[i][k];
      }
    }
    static_assert(VPT == 2, "two add chains a sum");
    const float a = LAYER ? warp_sum(sg[0] + sg[1]) : 0.f, b = warp_sum(sgt[0] + sgt[1]);
    if (lane == 0) sums[pair][j & 1][half] = make_float2(a, b);
    // Both warps' sums are in, and both have read the slot: refill it.
    named_barrier(1 + pair, 64);
    if (u == 0 && j + S < mine) stage(j + S, s);
    if (++s == S) s = 0, phase ^= 1;
    const float2 s0 = sums[pair][j & 1][0], s1 = sums[pair][j & 1][1];  // one order for both
    const float c1 = LAYER ? (s0.x + s1.x) * inv_n : 0.f;
    const float c2 = (s0.y + s1.y) * rstd * inv_n;
    const float kb = -rstd * c1, kc = -rstd * rstd * c2;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      FVec<VEC> o;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float dr = d[i][k] * rstd;
        o.v[k] = fmaf(dr, w[i][k], LAYER ? fmaf(t[i][k], kc, kb) : t[i][k] * kc);
        dw[i][k] = fmaf(dr, t[i][k], dw[i][k]);
        if constexpr (LAYER) db[i][k] += d[i][k];
      }
      if constexpr (DSUM) {
        const FVec<VEC> sf = to_float(ds[i]);
#pragma unroll
        for (int k = 0; k < VEC; ++k) o.v[k] += sf.v[k];
      }
      if (valid[i]) store_raw<T, VEC>(dx + 64 * i * VEC, from_float<T, VEC>(o));
    }
  }
  if (!p.dw_part && !p.db_part) return;  // uniform across the grid
  // The pairs' partials through the (now idle) rings, added in pair order: [pair][term][PITCH]
  // floats, 32 KB (the rings hold >= 2 slots of 4 KB a pair).
  static_assert(S * bulk_bwd_slot(false) >= 2 * PITCH * sizeof(float), "the partials fit");
  __syncthreads();  // every pair's last slot read
  float* part = reinterpret_cast<float*>(dyn_smem);
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    if (valid[i]) {
      float* q = part + pair * 2 * PITCH + (u + 64 * i) * VEC;
      store_floats<VEC>(q, dw[i]);
      if constexpr (LAYER) store_floats<VEC>(q + PITCH, db[i]);  // rms: no dbias
    }
  }
  __syncthreads();
  constexpr int CPT = PITCH / kBulkBwdThreads;  // columns a thread in the sum: 4
  const int c0 = CPT * static_cast<int>(threadIdx.x);
  if (c0 < cols) {
    float sw[CPT], sb[CPT];
#pragma unroll
    for (int k = 0; k < CPT; ++k) sw[k] = sb[k] = 0.f;
    for (int q = 0; q < PAIRS; ++q) {
      const float* src = part + q * 2 * PITCH + c0;
#pragma unroll
      for (int k = 0; k < CPT; ++k) {
        sw[k] += src[k];
        if constexpr (LAYER) sb[k] += src[PITCH + k];
      }
    }
    const int64_t e = static_cast<int64_t>(blockIdx.x) * cols + c0;
    if (p.dw_part) store_floats<CPT>(p.dw_part + e, sw);
    if (p.db_part) store_floats<CPT>(p.db_part + e, sb);
  }
#else
  __trap();  // the host launches it only where sm_90 code runs (backward_bulk)
#endif
}

// The row walk of the cluster backwards (norm_bwd_cluster, norm_bwd_fixed), sm_90 code only,
// the whole exchange protocol: the mbarriers set up, the first row's tile loaded, a cluster
// barrier (every block's mbarriers exist before any push); then clusters take rows cid,
// cid + clusters, ... (every block of a cluster visits the same rows, so the exchanges stay
// matched). Per row: the next row's tile loaded (load(tile, row), a no-op or unused past the
// last row), this row's two sums formed (sums(tile, it, s)), reduced over the block's `block`
// threads and pushed into slot [it % kSlots][rank] of every block of the cluster; then, LAG
// rows later, finish(tile, row, it), which takes the row's sums from cluster_row_sums and
// writes dx. A last cluster barrier: no block leaves while a peer may still push into its
// shared memory.
template <int LAG, typename Tile, int kSlots, int NSLOT, typename Load, typename Sums,
          typename Finish>
__device__ __forceinline__ void cluster_row_walk(int64_t rows, int64_t cid, int64_t clusters,
                                                 int csize, int rank, int block,
                                                 float2 (&slots)[kSlots][NSLOT],
                                                 uint64_t (&bar)[kSlots],
                                                 float (&scratch)[2][2][32], Load&& load,
                                                 Sums&& sums, Finish&& finish) {
  // norm_bwd_cluster's comment has the argument for kSlots >= 2 + 2 * LAG.
  static_assert(kSlots >= 2 + 2 * LAG, "slot ring too short for the lag");
  const cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  if (threadIdx.x < kSlots) mbar_init(&bar[threadIdx.x]);
  Tile cur, prev;
  load(cur, cid);
  cluster.sync();
  int it = 0;
  for (int64_t row = cid;; row += clusters, ++it) {
    const bool have = row < rows;  // uniform across the cluster
    Tile next;
    if (have) {
      load(next, row + clusters);
      float s[2];
      sums(cur, it, s);
      group_sum<2>(s, block, scratch[it & 1], false);
      const int k = it % kSlots;
      if (static_cast<int>(threadIdx.x) < csize) {
        push_to_peer(&slots[k][rank], &bar[k], threadIdx.x, make_float2(s[0], s[1]));
      }
      if (threadIdx.x == 0) mbar_expect(&bar[k], csize * static_cast<uint32_t>(sizeof(float2)));
    }
    if constexpr (LAG == 0) {
      if (have) finish(cur, row, it);
    } else {
      if (it > 0) finish(prev, row - clusters, it - 1);
    }
    if (!have) break;
    if constexpr (LAG > 0) prev = cur;
    cur = next;
  }
  cluster.sync();
}

// The two sums of iteration `it`'s row: one wait on its slot's mbarrier (phase it / kSlots),
// then the csize blocks' values added in rank order (the same bits in every block).
template <int kSlots, int NSLOT>
__device__ __forceinline__ float2 cluster_row_sums(float2 (&slots)[kSlots][NSLOT],
                                                   uint64_t (&bar)[kSlots], int it, int csize) {
  const int k = it % kSlots;
  mbar_wait(&bar[k], (it / kSlots) & 1);
  float2 r = make_float2(0.f, 0.f);
  for (int b = 0; b < csize; ++b) {
    r.x += slots[k][b].x;
    r.y += slots[k][b].y;
  }
  return r;
}

// Rows over 8K elements, sm_90: a thread-block cluster owns a row, each block a slice of its
// columns (kClusterElems elements per thread), so x and dy are read once and the dweight /
// dbias accumulators of a 64K-column row fit in the cluster's registers. Clusters walk rows
// (persistent grid; partial row = cluster index); the next row's tile is loaded before this
// one is used (pinned loads), so it stays in flight through the reductions and exchange.
// Per row: the block's two row sums (a block reduction), pushed into slot [rank] of every
// block of the cluster (itself included: st.async counted on an mbarrier, common/cluster.cuh;
// no cluster barrier, whose release would wait for the prefetch), then, LAG rows later, one
// mbarrier wait, the n slots added in rank order (the same bits in every block), dx written.
// LAG = 1 (16-bit rows on the 16-byte path: three tiles live, ~100 registers) lets a block
// run a row ahead of its slowest peer instead of waiting at every row (KERNEL_LOG norm v7).
// Buffers: slots / bar by iteration mod 4, group_sum's scratch by parity. Safe because a
// block pushes row r only after its wait for row r - 1 - LAG, which needs every peer's push
// of that row, which each peer sends after its block barrier of that iteration, past its
// reads of the slots of rows up to r - 2 - 2 * LAG >= r - 4 (and its wait on that phase).
// Compiled to a no-op below sm_90; the launcher only picks it where the sm_90 code runs.
template <typename T, typename W, typename R, int VEC, int VPT, int LAG>
__global__ void __launch_bounds__(kBwdMaxThreads)
norm_bwd_cluster(BwdParams<T, W, R> p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  grid_dependency_wait();  // launched early (early_start): nothing global before this
  namespace cg = cooperative_groups;
  constexpr int kSlots = 4;            // exchange buffers, by iteration mod 4
  __shared__ float scratch[2][2][32];  // group_sum's buffers, by iteration parity
  __shared__ float2 slots[kSlots][kMaxCluster];
  __shared__ uint64_t bar[kSlots];
  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int csize = static_cast<int>(cluster.num_blocks());
  const int tpr = csize * blockDim.x, lane = rank * blockDim.x + threadIdx.x;
  const int64_t cid = blockIdx.x / csize, clusters = gridDim.x / csize;
  auto weight = [&](int i) { return param_or<W, VEC>(p.weight, i * tpr + lane, 1.f); };
  float dw[VPT][VEC], db[VPT][VEC];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) dw[i][j] = db[i][j] = 0.f;
  }
  using Tile = BwdTile<T, R, VEC, VPT>;
  cluster_row_walk<LAG, Tile>(
      p.rows, cid, clusters, csize, rank, blockDim.x, slots, bar, scratch,
      [&](Tile& t, int64_t row) { bwd_load<true>(p, row, row < p.rows, lane, tpr, t); },
      [&](const Tile& t, int /*it*/, float (&s)[2]) {
        bwd_sums<VEC, VPT>(p, t, true, lane, tpr, weight, dw, db, s);
      },
      [&](const Tile& t, int64_t row, int it) {
        const float2 r = cluster_row_sums(slots, bar, it, csize);
        const float sr[2] = {r.x, r.y};
        bwd_dx<VEC, VPT>(p, t, row, true, lane, tpr, weight, sr);
      });
  store_partials(p.dw_part, p.db_part, cid, p.cols, lane, tpr, dw, db);
#endif
}

// ---- backward, compile-time row lengths ---------------------------------------------------
// fixed_row_walk: norm_bwd_fixed's row walk (sm_90 code only), cluster_row_walk's protocol
// with two changes that cut its instructions a row (KERNEL_LOG norm v13): each warp reduces
// its two sums and its lanes 0..csize-1 push them (st.async) into entry [rank * warps + warp]
// of the row's slot in every block, so a block's warps meet only at the slot's mbarrier (no
// block barrier per row); and the three tiles (next, this row's, the row LAG behind) rotate
// through t[0..2] by unrolling the walk three times (no copies; tile i keeps its
// shared-memory staging slot i, where norm_bwd_fixed stages the rows). The slot
// reuse argument of norm_bwd_cluster holds per warp: a warp pushes row r only after its wait
// for row r - 1 - LAG, i.e. after every warp's push of that row, each sent after that warp's
// own reads of the slots of rows up to r - 2 - 2 * LAG >= r - 4. norm_bwd_cluster keeps
// cluster_row_walk: its runtime-shaped float32 rows measured 20-25% slower on this walk
// (KERNEL_LOG norm v13; cause not found).
template <int LAG, typename Tile, int kSlots, int NSLOT, typename Load, typename Sums,
          typename Finish>
__device__ __forceinline__ void fixed_row_walk(int64_t rows, int64_t cid, int64_t clusters,
                                               int csize, int rank, int block,
                                               float2 (&slots)[kSlots][NSLOT],
                                               uint64_t (&bar)[kSlots], Load&& load, Sums&& sums,
                                               Finish&& finish) {
  // norm_bwd_cluster's comment has the argument for kSlots >= 2 + 2 * LAG.
  static_assert(kSlots >= 2 + 2 * LAG, "slot ring too short for the lag");
  const cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  const int warps = block / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t bytes = static_cast<uint32_t>(csize * warps * sizeof(float2));
  if (threadIdx.x < kSlots) mbar_init(&bar[threadIdx.x]);
  Tile t[3];
#pragma unroll
  for (int i = 0; i < 3; ++i) t[i].slot = i;  // a tile's staging slot (norm_bwd_fixed)
  load(t[0], cid);
  cluster.sync();
  int it = 0;
  int64_t row = cid;
  // One row: `cur` summed and pushed, `next` loaded, `prev` (LAG rows back) finished.
  auto step = [&](Tile& cur, Tile& next, Tile& prev) {
    const bool have = row < rows;  // uniform across the cluster
    if (have) {
      load(next, row + clusters);
      float s[2];
      sums(cur, s);
      s[0] = warp_sum(s[0]);
      s[1] = warp_sum(s[1]);
      const int k = it % kSlots;
      if (lane < csize) {
        push_to_peer(&slots[k][rank * warps + warp], &bar[k], lane, make_float2(s[0], s[1]));
      }
      if (threadIdx.x == 0) mbar_expect(&bar[k], bytes);
    }
    if constexpr (LAG == 0) {
      if (have) finish(cur, row, it);
    } else {
      if (it > 0) finish(prev, row - clusters, it - 1);
    }
    row += clusters;
    ++it;
    return have;
  };
  while (step(t[0], t[1], t[2]) && step(t[1], t[2], t[0]) && step(t[2], t[0], t[1])) {
  }
  cluster.sync();
}

// The two sums of iteration `it`'s row: one wait on its slot's mbarrier (phase it / kSlots),
// then the n = csize * warps pushed warp sums added, entry e by lane e % 32, then across the
// lanes: a fixed order, so the same bits in every thread of every block.
template <int kSlots, int NSLOT>
__device__ __forceinline__ float2 fixed_row_sums(float2 (&slots)[kSlots][NSLOT],
                                                 uint64_t (&bar)[kSlots], int it, int n) {
  const int k = it % kSlots, lane = threadIdx.x % 32;
  mbar_wait(&bar[k], (it / kSlots) & 1);
  float2 r = make_float2(0.f, 0.f);
  for (int e = lane; e < n; e += 32) {
    const float2 v = slots[k][e];
    r.x += v.x;
    r.y += v.y;
  }
  return make_float2(warp_sum(r.x), warp_sum(r.y));
}

// norm_bwd_fixed: norm_bwd_cluster for the common hidden sizes (parameters, and the add
// forms' sum and its gradient d_sum, in x's dtype): 16-bit rows of 4096-32768 columns and
// float32 rows of 12288 / 16384 (backward_fixed), the whole launch shape a constant. CS
// blocks of TPB threads per row, 2 16-byte vectors per thread (16 elements of 16-bit rows, 8
// of float32 ones), no bounds checks, the thread's columns of w held in registers
// for every row, w unpacked afresh in each half (opaque(): its floats are not kept live
// across the row exchange), the row tiles staged in shared memory. The standalone sweep
// (benchmarks/dev/norm_bwd_cluster_sweep.cu, KERNEL_LOG norm v8) put these shapes at 68-74%
// (layer) and 81-85% (rms) of copy, partials' column sum included, where v7's runtime
// shape reaches 43-50%. Exchange, lag and buffer rotation: fixed_row_walk.
constexpr int kFixedBwdVpt = 2;

// Marks r's words as changed (an empty asm, no instruction): the floats unpacked from them
// before cannot be reused after, so each half of a row unpacks afresh instead of keeping 8
// floats a vector alive across the row exchange.
template <typename T, int N>
__device__ __forceinline__ void opaque(Raw<T, N>& r) {
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(r.w) / 4); ++i) asm volatile("" : "+r"(r.w[i]));
}

// The three live row tiles' x / dy sit in shared memory (dynamic: fixed_bwd_smem bytes), not
// in registers: each thread's own vectors copied there by cp.async and read back by that
// thread, so that more blocks fit an SM (e.g. 96 / 80 registers at 192 / 256 threads instead
// of 153-167 / 128: 18 / 24 warps an SM instead of 12 / 16; KERNEL_LOG norm v21-v23).
template <typename T, int TPB>
constexpr int fixed_bwd_smem() {
  return 3 * 2 * kFixedBwdVpt * TPB * static_cast<int>(sizeof(Raw<T, kVecElems<T>>));
}

// Blocks an SM the register budget is sized for: 640 threads (20 warps) at 128 / 160 threads
// a block, three blocks (576 / 768 threads) at 192 / 256.
constexpr int fixed_bwd_min_blocks(int tpb) { return std::max(3, 640 / tpb); }

template <typename T, int TPB, int CS, int LAYER, int LAG, int DSUM>
__global__ void __launch_bounds__(TPB, fixed_bwd_min_blocks(TPB))
    norm_bwd_fixed(BwdParams<T, T, T> p) {
  // The row sums go to every block of the cluster by st.async into peer shared memory, which
  // a cluster of one does not have (compute-sanitizer: invalid __shared__ write; norm v24).
  static_assert(CS >= 2, "norm_bwd_fixed needs clusters of two or more blocks");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  grid_dependency_wait();  // launched early (early_start): nothing global before this
  namespace cg = cooperative_groups;
  constexpr int VEC = kVecElems<T>, VPT = kFixedBwdVpt, TPR = CS * TPB, COLS = TPR * VPT * VEC;
  constexpr int kSlots = 4, kWarps = TPB / 32;
  constexpr float kInv = 1.f / COLS;
  using V = Raw<T, VEC>;
  __shared__ float2 slots[kSlots][CS * kWarps];  // [rank][warp]
  __shared__ uint64_t bar[kSlots];
  // [tile][x vectors, then dy vectors][thread]: 16 consecutive bytes a lane, no conflicts.
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  auto stage = reinterpret_cast<V (*)[2 * VPT][TPB]>(dyn_smem);
  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int lane = rank * TPB + threadIdx.x;
  const int64_t cid = blockIdx.x / CS, clusters = gridDim.x / CS;
  V wv[VPT];
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    FVec<VEC> one;
#pragma unroll
    for (int j = 0; j < VEC; ++j) one.v[j] = 1.f;
    wv[k] = p.weight ? load_raw<T, VEC>(p.weight + (lane + k * TPR) * VEC) : from_float<T, VEC>(one);
  }
  float dw[VPT][VEC], db[VPT][VEC];
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) dw[k][j] = db[k][j] = 0.f;
  }
  struct Tile {  // x / dy in stage[slot]
    float mean, rstd;
    int slot;
  };
  auto xv = [&](const Tile& t, int k) -> V { return stage[t.slot][k][threadIdx.x]; };
  auto gv = [&](const Tile& t, int k) -> V { return stage[t.slot][VPT + k][threadIdx.x]; };
  auto load = [&](Tile& t, int64_t row) {
    if (row < p.rows) {
      const int64_t off = row * COLS + lane * VEC;
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const T* xs = p.x + off + k * TPR * VEC;
        const T* gs = p.dy + off + k * TPR * VEC;
        stage_copy(&stage[t.slot][k][threadIdx.x], xs);
        stage_copy(&stage[t.slot][VPT + k][threadIdx.x], gs);
      }
      t.mean = LAYER ? load_pinned(p.mean + row) : 0.f;
      t.rstd = load_pinned(p.rstd + row);
    }
    // One group a call, empty past the last row, so that stage_wait's count stays uniform.
    stage_commit();
  };
  // x - mean (layer norm) or x.
  auto centered = [&](float x, const Tile& t) { return LAYER ? x - t.mean : x; };
  // This thread's dweight / dbias terms and its shares of the two row sums.
  auto sums = [&](Tile& t, float (&s)[2]) {
    // The walk loads the next row first: every copy group but that newest one has landed.
    stage_wait<1>();
    s[0] = s[1] = 0.f;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const FVec<VEC> xf = to_float(xv(t, k)), df = to_float(gv(t, k)), w = to_float(wv[k]);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float xhat = centered(xf.v[j], t) * t.rstd, gw = df.v[j] * w.v[j];
        s[0] += gw;
        s[1] += gw * xhat;
        dw[k][j] += df.v[j] * xhat;
        if constexpr (LAYER) db[k][j] += df.v[j];
      }
      opaque(wv[k]);
    }
  };
  // The row of iteration `it`: its sums, then dx = rstd (g w - c1 - xhat c2), as
  // (x - mean) qc + (g w rstd + pc): two fmas an element.
  // The add forms' d_sum (DSUM) is added to dx; its loads are issued before the wait, so
  // they travel while the row's sums arrive (no prefetch: a third tile of registers).
  auto finish = [&](Tile& t, int64_t row, int it) {
    const int64_t off = row * COLS + lane * VEC;
    V sv[DSUM ? VPT : 1];
    if constexpr (DSUM) {
#pragma unroll
      for (int k = 0; k < VPT; ++k) sv[k] = load_raw<T, VEC>(p.dsum + off + k * TPR * VEC);
    }
    const float2 r = fixed_row_sums(slots, bar, it, CS * kWarps);
    const float c1 = LAYER ? r.x * kInv : 0.f, c2 = r.y * kInv;
    const float pc = -t.rstd * c1, qc = -(t.rstd * c2) * t.rstd;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const FVec<VEC> xf = to_float(xv(t, k)), df = to_float(gv(t, k)), w = to_float(wv[k]);
      FVec<VEC> o;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        o.v[j] = fmaf(centered(xf.v[j], t), qc, fmaf(df.v[j] * w.v[j], t.rstd, pc));
      }
      if constexpr (DSUM) {
        const FVec<VEC> sf = to_float(sv[k]);
#pragma unroll
        for (int j = 0; j < VEC; ++j) o.v[j] += sf.v[j];
      }
      store_raw<T, VEC>(p.dx + off + k * TPR * VEC, from_float<T, VEC>(o));
      opaque(wv[k]);
    }
  };
  fixed_row_walk<LAG, Tile>(p.rows, cid, clusters, CS, rank, TPB, slots, bar, load, sums,
                              finish);
  store_partials(p.dw_part, LAYER ? p.db_part : nullptr, cid, COLS, lane, TPR, dw, db);
#endif
}

// Long rows, step 1: per row, c = (mean(g), mean(g * xhat)) (mean(g) = 0 for rms norm).
template <typename T, typename W, typename R, int VEC>
__global__ void __launch_bounds__(kLongThreads)
norm_bwd_row_sums(BwdParams<T, W, R> p, float2* __restrict__ c_out) {
  grid_dependency_wait();  // launched early (launch_early): nothing global before this
  __shared__ float scratch[2][32];
  const int nvec = p.cols / VEC;
  const float inv_n = 1.f / static_cast<float>(p.cols);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const int64_t off = row * p.cols;
    const float mean = p.mean ? p.mean[row] : 0.f, rstd = p.rstd[row];
    float s[2] = {0.f, 0.f};
#pragma unroll 4
    for (int c = threadIdx.x; c < nvec; c += blockDim.x) {
      const int64_t e = off + static_cast<int64_t>(c) * VEC;
      const FVec<VEC> xf = to_float(load_raw<R, VEC>(p.x + e));
      const FVec<VEC> df = to_float(load_raw<T, VEC>(p.dy + e));
      const FVec<VEC> w = param_or<W, VEC>(p.weight, c, 1.f);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float xhat = (xf.v[j] - mean) * rstd;
        const float gw = df.v[j] * w.v[j];
        s[0] += gw;
        s[1] += gw * xhat;
      }
    }
    group_sum<2>(s, blockDim.x, scratch);
    if (threadIdx.x == 0) c_out[row] = make_float2(p.mean ? s[0] * inv_n : 0.f, s[1] * inv_n);
  }
}

// Long rows, step 2: a block owns a tile of kTileThreads vector columns and a chunk of rows;
// it writes dx there and the dweight / dbias partials of its columns (partial row blockIdx.y).
template <typename T, typename W, typename R, int VEC>
__global__ void __launch_bounds__(kTileThreads)
norm_bwd_tiles(BwdParams<T, W, R> p, const float2* __restrict__ c_in, int64_t rows_per_chunk) {
  grid_dependency_wait();  // launched early (launch_early): nothing global before this
  const int nvec = p.cols / VEC;
  const int cv = blockIdx.x * blockDim.x + threadIdx.x;
  if (cv >= nvec) return;  // no barriers in this kernel
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = std::min<int64_t>(p.rows, r0 + rows_per_chunk);
  const FVec<VEC> w = param_or<W, VEC>(p.weight, cv, 1.f);
  float dw[VEC], db[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) dw[j] = db[j] = 0.f;
  for (int64_t r = r0; r < r1; r += kTileRows) {
    Raw<R, VEC> xv[kTileRows], sv[kTileRows];
    Raw<T, VEC> gv[kTileRows];
#pragma unroll
    for (int k = 0; k < kTileRows; ++k) {
      if (r + k < r1) {
        const int64_t e = (r + k) * p.cols + static_cast<int64_t>(cv) * VEC;
        xv[k] = load_raw<R, VEC>(p.x + e);
        gv[k] = load_raw<T, VEC>(p.dy + e);
        if (p.dsum) sv[k] = load_raw<R, VEC>(p.dsum + e);
      }
    }
#pragma unroll
    for (int k = 0; k < kTileRows; ++k) {
      if (r + k < r1) {
        const int64_t row = r + k;
        const float mean = p.mean ? p.mean[row] : 0.f, rstd = p.rstd[row];
        const float2 c = c_in[row];
        const FVec<VEC> xf = to_float(xv[k]), df = to_float(gv[k]);
        FVec<VEC> o;
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float xhat = (xf.v[j] - mean) * rstd;
          o.v[j] = rstd * (df.v[j] * w.v[j] - c.x - xhat * c.y);
          dw[j] += df.v[j] * xhat;
          db[j] += df.v[j];
        }
        if (p.dsum) {
          const FVec<VEC> sf = to_float(sv[k]);
#pragma unroll
          for (int j = 0; j < VEC; ++j) o.v[j] += sf.v[j];
        }
        store_raw<R, VEC>(p.dx + row * p.cols + static_cast<int64_t>(cv) * VEC, from_float<R, VEC>(o));
      }
    }
  }
  const int64_t prow = static_cast<int64_t>(blockIdx.y) * p.cols + static_cast<int64_t>(cv) * VEC;
  if (p.dw_part) store_floats<VEC>(p.dw_part + prow, dw);
  if (p.db_part) store_floats<VEC>(p.db_part + prow, db);
}

// out_k[col] = sum over parts of part_k[part, col], k = blockIdx.y: 32 columns x 8 part
// lanes per block, combined in a fixed order.
template <typename O>
__global__ void __launch_bounds__(256)
column_sum(const float* __restrict__ part0, const float* __restrict__ part1, int64_t parts,
           int cols, O* __restrict__ out0, O* __restrict__ out1) {
  grid_dependency_wait();  // launched early (launch_early): the partials are complete after
  __shared__ float tile[8][33];
  const float* part = blockIdx.y == 0 ? part0 : part1;
  O* out = blockIdx.y == 0 ? out0 : out1;
  const int col = blockIdx.x * 32 + threadIdx.x;
  float s = 0.f;
  if (col < cols) {
    for (int64_t q = threadIdx.y; q < parts; q += 8) s += part[q * cols + col];
  }
  tile[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float t = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k) t += tile[k][threadIdx.x];
    out[col] = static_cast<O>(t);  // one scalar store: no register array involved
  }
}

// ---- launchers ----------------------------------------------------------------------------

int next_pow2(int v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

int round_up(int v, int m) { return (v + m - 1) / m * m; }

unsigned grid_for(int64_t blocks) {
  return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(blocks, 1), 1 << 30));
}

// A 16-byte-vector path is legal when every row starts aligned: cols a multiple of the
// vector width and each base pointer aligned to its vector size (nullptr: absent).
template <int VEC, typename P>
bool vec_ok(const P* p) {
  return p == nullptr || is_aligned(p, VEC * static_cast<int>(sizeof(P)));
}

// norm_fwd_regs with the layer / residual flags as compile-time constants on the 16-byte
// path (the scalar path reads them at run time). A float32 row type with 16-bit x only
// arises with a residual, so only that variant is instantiated for it.
template <typename T, typename W, typename R, int VEC, typename Launch>
void with_fwd_kernel(const FwdParams<T, W, R>& p, Launch&& launch) {
  constexpr int VPT = fwd_vpt<R, VEC>();
  if constexpr (VEC == 1) {
    launch(norm_fwd_regs<T, W, R, VEC, VPT, kRuntime, kRuntime>);
  } else {
    const bool res = p.residual != nullptr;
    if (res && p.layer) launch(norm_fwd_regs<T, W, R, VEC, VPT, 1, 1>);
    if (res && !p.layer) launch(norm_fwd_regs<T, W, R, VEC, VPT, 0, 1>);
    if constexpr (std::is_same_v<T, R>) {
      if (!res && p.layer) launch(norm_fwd_regs<T, W, R, VEC, VPT, 1, 0>);
      if (!res && !p.layer) launch(norm_fwd_regs<T, W, R, VEC, VPT, 0, 0>);
    }
  }
}

// Whether the wide variant (kFwdWideVpt vectors per thread) exists for these types: rows in
// x's dtype (16-bit or float32) on the 16-byte path; plain norms, and the add forms with the
// residual staged in shared memory (held in registers next to x it would spill ~200 bytes).
template <typename T, typename R, int VEC>
constexpr bool kFwdHasWide = VEC > 1 && std::is_same_v<T, R>;

// The compile-time-shaped forwards take 16-bit rows with parameters (and the add forms'
// sum) in x's dtype, on the 16-byte path.
template <typename T, typename W, typename R, int VEC>
constexpr bool kFixedTypes =
    VEC > 1 && sizeof(T) == 2 && std::is_same_v<T, W> && std::is_same_v<T, R>;

// The compile-time-shaped wide forward (norm_fwd_regs with FIXED_TPR) takes 16-bit and
// float32 rows with parameters in x's dtype (kFwdHasWide: T == R).
template <typename T, typename W, typename R, int VEC>
constexpr bool kFixedWideTypes = kFwdHasWide<T, R, VEC> && std::is_same_v<T, W>;

// The compile-time-shaped backward also takes float32 rows (parameters float32 too).
template <typename T, typename W, typename R, int VEC>
constexpr bool kFixedBwdTypes = VEC > 1 && std::is_same_v<T, W> && std::is_same_v<T, R> &&
                                (sizeof(T) == 2 || std::is_same_v<T, float>);

// FUSED_NORM_FIXED=0 turns the fixed kernels off, forward and backward (norm_fwd_regs /
// norm_bwd_regs or norm_bwd_cluster then take those rows: for comparisons and tests; read
// on every call, so a test can switch it).
bool fixed_enabled() { return !env_switched_off("FUSED_NORM_FIXED"); }

// norm_bwd_regs' staging depth on the prefetching path: each thread's copies run two rows
// ahead of the row it reduces. FUSED_NORM_STAGE=0: the tiles in registers (one row ahead).
constexpr int kBwdStages = 3;
bool bwd_stage_enabled() { return !env_switched_off("FUSED_NORM_STAGE"); }

// norm_fwd_fixed for p if its row length is one of the fixed ones; false otherwise.
template <typename T, int... TPRS>
bool launch_fixed(const FwdParams<T, T, T>& p, std::integer_sequence<int, TPRS...>) {
  auto launch = [&](auto tpr) {
    constexpr int TPR = decltype(tpr)::value;
    if (p.cols != TPR * kFixedVpt * kVecElems<T> || p.rows > (1 << 30)) return false;
    const bool res = p.residual != nullptr;
    auto kernel = res ? (p.layer ? norm_fwd_fixed<T, TPR, 1, 1> : norm_fwd_fixed<T, TPR, 0, 1>)
                      : (p.layer ? norm_fwd_fixed<T, TPR, 1, 0> : norm_fwd_fixed<T, TPR, 0, 0>);
    launch_early(kernel, dim3(static_cast<unsigned>(p.rows)), dim3(TPR), 0, p);  // a block a row
    return true;
  };
  return (launch(std::integral_constant<int, TPRS>{}) || ...);
}

// norm_fwd_regs' wide variant (8 vectors a thread) shaped at compile time for a plain row of
// exactly TPR * 8 vectors, for a TPR of TPRS; false otherwise. One row a block. LAYER_ONLY:
// the caller sends layer norm rows only (no rms kernel is built for those shapes).
template <typename T, typename W, typename R, int VEC, bool LAYER_ONLY = false, int... TPRS>
bool launch_wide_fixed(const FwdParams<T, W, R>& p, std::integer_sequence<int, TPRS...>) {
  auto launch = [&](auto tpr) {
    constexpr int TPR = decltype(tpr)::value;
    if (p.cols != TPR * kFwdWideVpt * VEC) return false;
    auto kernel = norm_fwd_regs<T, W, R, VEC, kFwdWideVpt, 1, 0, TPR>;
    if constexpr (!LAYER_ONLY) {
      if (!p.layer) kernel = norm_fwd_regs<T, W, R, VEC, kFwdWideVpt, 0, 0, TPR>;
    }
    launch_early(kernel, dim3(grid_for(p.rows)), dim3(TPR), 0, p, TPR);
    return true;
  };
  return (launch(std::integral_constant<int, TPRS>{}) || ...);
}
// The rows the wide variant takes anyway (over 512 threads at 4 vectors): 16-bit 24576 /
// 32768 / 65536, float32 12288 / 16384 / 32768 (norm v10, v25).
using WideTprs = std::integer_sequence<int, 384, kFwdWideThreads, kFwdMaxThreads>;

// The add forms' rows past 4 vectors a thread on the wide variant with the residual staged
// (RES = kStagedRes): float32 rows of 16K-32K, 16-bit rows in x's dtype of 32K-64K, which
// norm_fwd_long would read twice. Shaped at compile time where every thread's 8 vectors are
// whole at 1024 threads (float32 32768, 16-bit 65536; parameters in x's dtype). False
// (nothing launched) for other types, or where the block's shared memory cannot hold the
// residual's slots (128 KB at 1024 threads; sm_86 / sm_89 hold ~100 KB).
template <typename T, typename W, typename R, int VEC>
bool forward_add_wide(const FwdParams<T, W, R>& p, int need_wide, bool fixed_on) {
  if constexpr (kFwdHasWide<T, R, VEC>) {
    const int tpr = round_up(need_wide, 32);
    auto kernel = p.layer ? norm_fwd_regs<T, W, R, VEC, kFwdWideVpt, 1, kStagedRes>
                          : norm_fwd_regs<T, W, R, VEC, kFwdWideVpt, 0, kStagedRes>;
    if constexpr (kFixedWideTypes<T, W, R, VEC>) {
      constexpr int kM = kFwdMaxThreads;
      if (fixed_on && p.cols == kM * kFwdWideVpt * VEC) {
        kernel = p.layer ? norm_fwd_regs<T, W, R, VEC, kFwdWideVpt, 1, kStagedRes, kM>
                         : norm_fwd_regs<T, W, R, VEC, kFwdWideVpt, 0, kStagedRes, kM>;
      }
    }
    const int smem = kFwdWideVpt * tpr * static_cast<int>(sizeof(Raw<R, VEC>));
    if (!allow_dynamic_smem_once(kernel, smem)) return false;
    launch_early(kernel, dim3(grid_for(p.rows)), dim3(tpr), smem, p, tpr);
    return true;
  }
  return false;
}

template <typename T, typename W, typename R, int VEC>
void forward_with(const FwdParams<T, W, R>& p) {
  constexpr bool kFixed = kFixedTypes<T, W, R, VEC>;
  const bool fixed_on = fixed_enabled();
  const bool fixed = kFixed && fixed_on;
  // float32 layer_norm rows of 8192 too (256 threads), which would take norm_fwd_regs at 4
  // vectors: +2 points of copy; not rms_norm (-0.7) nor 16-bit rows of 4096-16384 (-1 to -5.5
  // against norm_fwd_fixed) (KERNEL_LOG norm v26).
  if constexpr (kFixedWideTypes<T, W, R, VEC> && sizeof(T) == 4) {
    if (fixed_on && p.layer && p.residual == nullptr &&
        launch_wide_fixed<T, W, R, VEC, true>(p, std::integer_sequence<int, 256>{})) {
      return;
    }
  }
  if constexpr (kFixed) {
    if (fixed && launch_fixed(p, FixedTprs{})) return;
  }
  constexpr int VPT = fwd_vpt<R, VEC>();
  const int nvec = p.cols / VEC;
  const int need = static_cast<int>(ceil_div(nvec, VPT));  // threads per row
  const int need_wide = static_cast<int>(ceil_div(nvec, kFwdWideVpt));
  if (kFwdHasWide<T, R, VEC> && p.residual == nullptr && need > kFwdWideThreads &&
      need_wide <= kFwdMaxThreads) {
    if constexpr (kFwdHasWide<T, R, VEC>) {  // one row per block
      // Every thread's 8 vectors whole: the compile-time-shaped variant.
      if constexpr (kFixedWideTypes<T, W, R, VEC>) {
        if (fixed_on && launch_wide_fixed<T, W, R, VEC>(p, WideTprs{})) return;
      }
      const int tpr = round_up(need_wide, 32);
      auto kernel = p.layer ? norm_fwd_regs<T, W, R, VEC, kFwdWideVpt, 1, 0>
                            : norm_fwd_regs<T, W, R, VEC, kFwdWideVpt, 0, 0>;
      launch_early(kernel, dim3(grid_for(p.rows)), dim3(tpr), 0, p, tpr);
    }
  } else if (fixed && p.residual != nullptr && nvec == kFwdMaxThreads * VPT) {
    if constexpr (kFixed) {
      // The add forms at 32768 16-bit elements: one row per 1024-thread block, the
      // compile-time-shaped variant (the wide one would spill with the residual).
      constexpr int kM = kFwdMaxThreads;
      auto kernel = p.layer ? norm_fwd_regs<T, W, R, VEC, VPT, 1, 1, kM>
                            : norm_fwd_regs<T, W, R, VEC, VPT, 0, 1, kM>;
      launch_early(kernel, dim3(grid_for(p.rows)), dim3(kM), 0, p, kM);
    }
  } else if (p.residual != nullptr && need > kFwdMaxThreads && need_wide <= kFwdMaxThreads &&
             forward_add_wide<T, W, R, VEC>(p, need_wide, fixed_on)) {
    // launched: the add forms' long rows on the wide variant, residual staged
  } else if (need <= kFwdMaxThreads) {
    // A power-of-two group of <= 32 threads per row, several rows per 128-thread block; or
    // whole warps, one row per block. Small blocks, one per row group (no grid-stride
    // loop in practice): the SM overlaps many blocks, one's reductions with another's loads.
    const int tpr = need <= 32 ? next_pow2(need) : round_up(need, 32);
    const int threads = tpr <= 32 ? kFwdShortThreads : tpr;
    const int groups = threads / tpr;
    with_fwd_kernel<T, W, R, VEC>(p, [&](auto kernel) {
      launch_early(kernel, dim3(grid_for(ceil_div(p.rows, groups))), dim3(threads), 0, p, tpr);
    });
  } else {
    launch_early(norm_fwd_long<T, W, R, VEC>,
                 dim3(grid_for(std::min<int64_t>(p.rows, 4 * num_sms()))), dim3(kLongThreads), 0,
                 p);
  }
}

template <typename T, typename W, typename R>
void launch_forward(const FwdParams<T, W, R>& p) {
  constexpr int V = kVecElems<T>;
  const bool vec = p.cols % V == 0 && vec_ok<V>(p.x) && vec_ok<V>(p.residual) &&
                   vec_ok<V>(p.weight) && vec_ok<V>(p.bias) && vec_ok<V>(p.y) &&
                   vec_ok<V>(p.sum);
  if (vec) {
    forward_with<T, W, R, V>(p);
  } else {
    forward_with<T, W, R, 1>(p);
  }
}

template <typename X>
struct Tag {
  using type = X;
};

// Parameter gradients asked for (dweight, dbias): the partial rows' terms.
int param_grads(const NormBackward& nb) { return nb.dweight.defined() + nb.dbias.defined(); }

// dweight / dbias from the [outs, parts, cols] partials (dweight first when both).
template <typename T>
void reduce_partials(const at::Tensor& part, int64_t parts, int cols, NormBackward& nb) {
  const at::Tensor& first = nb.dweight.defined() ? nb.dweight : nb.dbias;
  const int outs = param_grads(nb);  // >= 1 where there are partials
  const float* p0 = part.const_data_ptr<float>();
  const float* p1 = outs == 2 ? p0 + parts * cols : nullptr;
  const dim3 grid(static_cast<unsigned>(ceil_div(cols, 32)), outs), block(32, 8);
  auto run = [&](auto tag) {
    using O = typename decltype(tag)::type;
    O* o0 = first.mutable_data_ptr<O>();
    O* o1 = outs == 2 ? nb.dbias.mutable_data_ptr<O>() : nullptr;
    launch_early(column_sum<O>, grid, block, 0, p0, p1, parts, cols, o0, o1);
  };
  if (first.scalar_type() == at::kFloat) {
    run(Tag<float>{});
  } else {
    if constexpr (!std::is_same_v<T, float>) run(Tag<T>{});
  }
}

// Partial-sum buffers for dweight / dbias: [outs, parts, cols] float32, or undefined.
at::Tensor alloc_partials(const NormBackward& nb, int64_t parts) {
  const int outs = param_grads(nb);
  if (outs == 0) return at::Tensor();
  return at::empty({outs, parts, nb.cols}, nb.dy.options().dtype(at::kFloat));
}

template <typename T, typename W, typename R>
void point_partials(BwdParams<T, W, R>& p, const at::Tensor& part, int64_t parts,
                    const NormBackward& nb) {
  float* base = part.defined() ? part.mutable_data_ptr<float>() : nullptr;
  p.dw_part = nb.dweight.defined() ? base : nullptr;
  p.db_part = nb.dbias.defined() ? base + (nb.dweight.defined() ? parts * nb.cols : 0) : nullptr;
}

// A persistent cluster backward (norm_bwd_cluster, norm_bwd_fixed): `kernel` on clusters of
// csize blocks of `threads`, as many clusters as fit at once (cluster index = partial row),
// then the dweight / dbias partials summed. False (nothing launched) where no such cluster
// fits or the kernel has no sm_90 code in this build (its no-op body).
template <typename Kernel, typename T, typename W, typename R>
bool launch_cluster_backward(Kernel kernel, int csize, int threads, BwdParams<T, W, R> p,
                             NormBackward& nb, int smem = 0) {
  if (!runs_sm90_code(kernel)) return false;
  ClusterLaunch cl(dim3(static_cast<unsigned>(csize)), threads, smem);
  // Clusters resident at once on the whole GPU: the persistent grid. (A kernel's smem is
  // the same at every launch: its opt-in happens once, before the query.)
  const void* key = reinterpret_cast<const void*>(kernel);
  const int active = cached_launch_query(key, csize, threads, [&] {
    return allow_dynamic_smem(kernel, smem) ? cl.max_active(kernel) : 0;
  });
  if (active < 1) return false;
  // No more clusters than rows: an idle cluster would still add a partial row.
  const int64_t clusters = std::min<int64_t>(p.rows, active);
  at::Tensor part = alloc_partials(nb, clusters);
  point_partials(p, part, clusters, nb);
  cl.early_start().launch(dim3(static_cast<unsigned>(clusters * csize)), kernel, p);
  if (part.defined()) reduce_partials<T>(part, clusters, p.cols, nb);
  return true;
}

// Rows too long for one block (need > kBwdMaxThreads threads at kBwdElems elements each) on
// sm_90: norm_bwd_cluster, a cluster of up to kMaxCluster blocks per row, kClusterElems
// elements per thread. Returns false where it cannot run (GPU older than sm_90, no sm_90
// code for it in this build, rows over kMaxCluster * kBwdMaxThreads * kClusterElems
// elements): the caller takes the two-pass path.
template <typename T, typename W, typename R, int VEC>
bool backward_cluster(BwdParams<T, W, R> p, NormBackward& nb) {
  constexpr int VPT = std::max(1, kClusterElems / VEC);
  const int need = static_cast<int>(ceil_div(p.cols / VEC, VPT));
  if (need > kMaxCluster * kBwdMaxThreads) return false;
  // Smallest power-of-two cluster of up to 8 blocks of 256 threads (several blocks per SM:
  // some stream while others wait for their row sums), then of 512, then 16 blocks.
  int per_block = 256, csize = 1;
  if (need > 8 * 256) per_block = kBwdMaxThreads;
  while (csize * per_block < need) csize *= 2;
  const int threads = round_up(static_cast<int>(ceil_div(need, csize)), 32);
  return launch_cluster_backward(norm_bwd_cluster<T, W, R, VEC, VPT, cluster_lag<R, VEC>()>,
                                 csize, threads, p, nb);
}

// norm_bwd_fixed at one shape (TPB threads x CS blocks, LAG) for p's norm and d_sum.
template <typename T, int TPB, int CS, int LAG>
bool backward_fixed_at(const BwdParams<T, T, T>& p, NormBackward& nb) {
  TORCH_INTERNAL_ASSERT(TPB * CS * kFixedBwdVpt * kVecElems<T> == p.cols);
  const bool layer = p.mean != nullptr, dsum = p.dsum != nullptr;
  auto kernel = layer ? (dsum ? norm_bwd_fixed<T, TPB, CS, 1, LAG, 1>
                              : norm_bwd_fixed<T, TPB, CS, 1, LAG, 0>)
                      : (dsum ? norm_bwd_fixed<T, TPB, CS, 0, LAG, 1>
                              : norm_bwd_fixed<T, TPB, CS, 0, LAG, 0>);
  return launch_cluster_backward(kernel, CS, TPB, p, nb, fixed_bwd_smem<T, TPB>());
}

// norm_bwd_fixed for p if its row length is one of the fixed ones (16-bit or float32 rows,
// parameters and the add forms' sum in x's dtype); false otherwise. One table per element
// width (a row's threads differ). The shapes are the sweep's best per row length (KERNEL_LOG norm v8): TPB threads x CS blocks, LAG. At 12288 the sweep's
// best for layer norm (2 x 384, lag 0) measured no better than norm_bwd_cluster in the
// library (GPU call 3): both norms take rms norm's 4 x 192. 4096 / 5120 / 8192 (norm v23):
// two blocks a row, against norm_bwd_regs +1-2 points at 4096 / 8192 and +14 at 5120.
template <typename T>
bool backward_fixed(const BwdParams<T, T, T>& p, NormBackward& nb) {
  if (!fixed_enabled()) return false;
  if constexpr (sizeof(T) == 4) {  // 8 elements a thread (norm v24)
    switch (p.cols) {
      case 12288:
        return backward_fixed_at<T, 192, 8, 1>(p, nb);
      case 16384:
        return backward_fixed_at<T, 256, 8, 1>(p, nb);
    }
    return false;
  } else {
    switch (p.cols) {
      case 4096:
        return backward_fixed_at<T, 128, 2, 1>(p, nb);
      case 5120:
        return backward_fixed_at<T, 160, 2, 1>(p, nb);
      case 8192:
        return backward_fixed_at<T, 256, 2, 1>(p, nb);
      case 12288:
        return backward_fixed_at<T, 192, 4, 1>(p, nb);
      case 16384:
        return backward_fixed_at<T, 256, 4, 1>(p, nb);
      case 32768:
        return backward_fixed_at<T, 256, 8, 1>(p, nb);
    }
    return false;
  }
}

// A persistent backward: as many blocks of `kernel` as are resident at once (per_sm an SM),
// but no more than `units` (the least a block takes: a row, a row group, a tile), each
// writing one partial row of dweight / dbias; then column_sum over the partial rows. args:
// the kernel's parameters after p.
template <typename Kernel, typename T, typename W, typename R, typename... Args>
void launch_with_partials(Kernel kernel, int64_t units, int per_sm, int threads, size_t smem,
                          BwdParams<T, W, R> p, NormBackward& nb, Args... args) {
  const int64_t blocks = std::min<int64_t>(units, per_sm * int64_t{num_sms()});
  at::Tensor part = alloc_partials(nb, blocks);
  point_partials(p, part, blocks, nb);
  launch_early(kernel, dim3(grid_for(blocks)), dim3(threads), smem, p, args...);
  if (part.defined()) reduce_partials<T>(part, blocks, p.cols, nb);
}

// launch_with_partials with as many blocks an SM as fit; false (nothing launched) where not
// even one does.
template <typename Kernel, typename T, typename W, typename R>
bool launch_resident_with_partials(Kernel kernel, int64_t units, int threads, size_t smem,
                                   BwdParams<T, W, R> p, NormBackward& nb) {
  const int per_sm = resident_blocks(kernel, threads, smem);
  if (per_sm < 1) return false;
  launch_with_partials(kernel, units, per_sm, threads, smem, p, nb);
  return true;
}

// Rows in registers, VPT vectors per thread, `need` threads per row (<= kBwdMaxThreads).
// A block is one row group, or several of under kBwdBlock threads; a persistent grid of up
// to kBwdBlocksPerSm blocks per SM (the sweep's best: 128 x 4, 256 x 2, 512 x 1 per SM).
// STAGES > 0: the staged variant; false (nothing launched) where its ring does not fit a
// block's shared memory.
template <typename T, typename W, typename R, int VEC, int VPT, bool PF, int STAGES = 0>
bool backward_regs(BwdParams<T, W, R> p, NormBackward& nb, int need) {
  const int tpr = need <= 32 ? next_pow2(need) : round_up(need, 32);
  // Groups share a block only for rows of under kBwdBlock threads (at most 2K columns), so
  // their combine buffer is a few KB; allow_dynamic_smem opts in past 48 KB in any case.
  const int groups = std::max(1, kBwdBlock / tpr);
  const size_t combine_bytes = 2 * sizeof(float) * p.cols;
  const int threads = tpr * groups;
  const size_t smem = BwdStage<T, W, R, VEC, VPT, STAGES>::bytes(threads, p.dsum != nullptr) +
                      (groups > 1 ? combine_bytes : 0);
  auto kernel = norm_bwd_regs<T, W, R, VEC, VPT, PF, STAGES>;
  int per_sm = resident_blocks(kernel, threads, smem);
  if (STAGES > 0 && per_sm < 1) return false;
  per_sm = std::clamp(per_sm, 1, kBwdBlocksPerSm);
  launch_with_partials(kernel, ceil_div(p.rows, groups), per_sm, threads, smem, p, nb, tpr);
  return true;
}

// norm_bwd_warp for 16-bit rows of 32-64 vectors (256-512 columns; shorter rows would leave
// lanes idle, longer ones lose, norm v34) with parameters and rows in x's dtype; false where
// it does not apply. PF (the prefetching variant) for the plain norms; the add forms' third
// stream (d_sum) does better at 24 warps without it (norm v34). Knobs for comparisons:
// FUSED_NORM_BWD_WARP=0 turns it off (norm_bwd_regs then), FUSED_NORM_BWD_PF=0|1 forces PF
// off / on, FUSED_NORM_BWD_WARPS=n takes blocks of n warps (default: as many as fit an SM,
// so that the fewest partial rows go to column_sum).
template <typename T, typename W, typename R, int VEC>
bool backward_warp(BwdParams<T, W, R> p, NormBackward& nb) {
  if constexpr (!kFixedTypes<T, W, R, VEC>) {  // 16-bit x, parameters and rows, 16-byte path
    return false;
  } else {
    static_assert(VEC == kWarpBwdVec, "8 elements a 16-byte vector");
    const int nvec = p.cols / VEC;
    if (nvec < 32 || nvec > 64 || env_switched_off("FUSED_NORM_BWD_WARP")) return false;
    const bool dsum = p.dsum != nullptr;
    const bool pf = env_switched_off("FUSED_NORM_BWD_PF")    ? false
                    : env_int("FUSED_NORM_BWD_PF", 0) == 1 ? true
                                                           : !dsum;
    // slice: a warp's bytes a term (2 KB at 512 columns), limit: the kernel's launch bound.
    auto run = [&](auto kernel, size_t slice, int limit) {
      int warps = env_int("FUSED_NORM_BWD_WARPS", limit / 32);
      if (warps < 1 || warps > limit / 32) warps = limit / 32;  // out of range: the default
      const int threads = 32 * warps;
      const size_t smem = slice * param_grads(nb) * warps;
      return launch_resident_with_partials(kernel, ceil_div(p.rows, warps), threads, smem, p, nb);
    };
    auto with_vpt = [&](auto vpt_tag) {
      constexpr int VPT = decltype(vpt_tag)::value;
      constexpr size_t slice = sizeof(float4) * warp_bwd_slice<VPT>();
      if (pf) {
        return dsum ? run(norm_bwd_warp<T, VPT, true, true>, slice, warp_bwd_threads<true>())
                    : run(norm_bwd_warp<T, VPT, false, true>, slice, warp_bwd_threads<true>());
      }
      return dsum ? run(norm_bwd_warp<T, VPT, true, false>, slice, warp_bwd_threads<false>())
                  : run(norm_bwd_warp<T, VPT, false, false>, slice, warp_bwd_threads<false>());
    };
    if (nvec <= 32) return with_vpt(std::integral_constant<int, 1>{});
    return with_vpt(std::integral_constant<int, 2>{});
  }
}

// norm_bwd_bulk for 16-bit rows of 65-128 vectors (520-1024 columns) with parameters and rows
// in x's dtype, where its sm_90 code runs; false where it does not apply.
// FUSED_NORM_BWD_BULK=0 turns it off (for comparisons: norm_bwd_regs then),
// FUSED_NORM_BWD_BULK_STAGES=2|3|4 sets a pair's slots (6, five rows in flight, lost 2-5%:
// norm v37).
template <typename T, typename W, typename R, int VEC>
bool backward_bulk(BwdParams<T, W, R> p, NormBackward& nb) {
  if constexpr (!kFixedTypes<T, W, R, VEC>) {  // 16-bit x, parameters and rows, 16-byte path
    return false;
  } else {
    static_assert(VEC == 8, "8 elements a 16-byte vector");
    const int nvec = p.cols / VEC;
    if (nvec <= 64 || nvec > 64 * kBulkBwdVpt || env_switched_off("FUSED_NORM_BWD_BULK")) {
      return false;
    }
    // A pair's slots (each choice fits two blocks an SM): 4 (three rows in flight) at 776-1024
    // columns; shorter rows measured best with fewer, 3 for the plain norms, 2 for the add
    // forms (norm v37).
    const int fit = nvec > 96 ? 4 : p.dsum ? 2 : 3;
    int stages = env_int("FUSED_NORM_BWD_BULK_STAGES", fit);
    if (stages < 2 || stages > 4) stages = fit;  // out of range: the default
    auto run = [&](auto kernel) {
      if (!runs_sm90_code(kernel)) return false;
      const size_t smem = kBulkBwdPairs * stages * bulk_bwd_slot(p.dsum != nullptr);
      return launch_resident_with_partials(kernel, ceil_div(p.rows, kBulkBwdPairs),
                                           kBulkBwdThreads, smem, p, nb);
    };
    // layer_norm's rows (which keep a mean) on the kernel's layer form; rms_norm's (no mean,
    // never a bias) on its rms form.
    const bool layer = p.mean != nullptr;
    auto with_stages = [&](auto s_tag) {
      constexpr int S = decltype(s_tag)::value;
      if (layer) {
        return p.dsum ? run(norm_bwd_bulk<T, true, true, S>)
                      : run(norm_bwd_bulk<T, false, true, S>);
      }
      return p.dsum ? run(norm_bwd_bulk<T, true, false, S>)
                    : run(norm_bwd_bulk<T, false, false, S>);
    };
    switch (stages) {
      case 2: return with_stages(std::integral_constant<int, 2>{});
      case 3: return with_stages(std::integral_constant<int, 3>{});
    }
    return with_stages(std::integral_constant<int, 4>{});
  }
}

template <typename T, typename W, typename R, int VEC>
void backward_with(BwdParams<T, W, R> p, NormBackward& nb) {
  constexpr int VPT = kBwdElems / VEC;
  const int nvec = p.cols / VEC;
  const int need = static_cast<int>(ceil_div(nvec, VPT));
  if (backward_warp<T, W, R, VEC>(p, nb)) return;
  if (backward_bulk<T, W, R, VEC>(p, nb)) return;
  if constexpr (kFixedBwdTypes<T, W, R, VEC>) {
    if (backward_fixed(p, nb)) return;
  }
  // The 16-byte path: the prefetching variant while a row fits 512 threads at its width
  // (16-bit rows: 8K columns; float32 x or a float32 residual stream: 4K), then (float32
  // 4K-8K) the same 16 elements per thread as the cluster kernel, without prefetch.
  if constexpr (VEC > 1) {
    constexpr int kPfVpt = bwd_pf_vpt<R, VEC>();
    const int need_pf = static_cast<int>(ceil_div(nvec, kPfVpt));
    if (need_pf <= kBwdMaxThreads) {
      if constexpr (bwd_regs_staged<R>()) {
        if (bwd_stage_enabled() &&
            backward_regs<T, W, R, VEC, kPfVpt, true, kBwdStages>(p, nb, need_pf)) {
          return;
        }
      }
      backward_regs<T, W, R, VEC, kPfVpt, true>(p, nb, need_pf);
      return;
    }
  }
  if constexpr (VEC == 1 || bwd_pf_vpt<R, VEC>() != VPT) {
    if (need <= kBwdMaxThreads) {
      backward_regs<T, W, R, VEC, VPT, false>(p, nb, need);
      return;
    }
  }
  if (backward_cluster<T, W, R, VEC>(p, nb)) return;
  // Longer rows, or no clusters: the two row sums first, then column tiles x row chunks.
  at::Tensor c = at::empty({p.rows, 2}, nb.dy.options().dtype(at::kFloat));
  float2* cp = reinterpret_cast<float2*>(c.mutable_data_ptr<float>());
  launch_early(norm_bwd_row_sums<T, W, R, VEC>,
               dim3(grid_for(std::min<int64_t>(p.rows, 4 * num_sms()))), dim3(kLongThreads), 0,
               p, cp);
  const int64_t col_tiles = ceil_div(nvec, kTileThreads);
  int64_t chunks = std::clamp<int64_t>(8 * num_sms() / col_tiles, 1, p.rows);
  const int64_t rows_per_chunk = ceil_div(p.rows, chunks);
  chunks = ceil_div(p.rows, rows_per_chunk);
  at::Tensor part = alloc_partials(nb, chunks);
  point_partials(p, part, chunks, nb);
  const dim3 grid(static_cast<unsigned>(col_tiles), static_cast<unsigned>(chunks));
  launch_early(norm_bwd_tiles<T, W, R, VEC>, grid, dim3(kTileThreads), 0, p, cp,
               rows_per_chunk);
  if (part.defined()) reduce_partials<T>(part, chunks, p.cols, nb);
}

template <typename T, typename W, typename R>
void launch_backward(const BwdParams<T, W, R>& p, NormBackward& nb) {
  constexpr int V = kVecElems<T>;
  const bool vec = p.cols % V == 0 && vec_ok<V>(p.dy) && vec_ok<V>(p.x) && vec_ok<V>(p.dsum) &&
                   vec_ok<V>(p.weight) && vec_ok<V>(p.dx);
  if (vec) {
    backward_with<T, W, R, V>(p, nb);
  } else {
    backward_with<T, W, R, 1>(p, nb);
  }
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

void forward_cuda(NormForward& nf) {
  c10::cuda::CUDAGuard guard(nf.x.device());
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
    launch_forward(p);
  });
}

void backward_cuda(NormBackward& nb) {
  c10::cuda::CUDAGuard guard(nb.x.device());
  const at::ScalarType wt = nb.weight.defined() ? nb.weight.scalar_type() : nb.dy.scalar_type();
  dispatch_norm_types(nb.dy.scalar_type(), wt, nb.x.scalar_type(), [&](auto tt, auto tw, auto tr) {
    using T = typename decltype(tt)::type;
    using W = typename decltype(tw)::type;
    using R = typename decltype(tr)::type;
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
    launch_backward(p, nb);
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(fused, CUDA, m) {
  FUSED_REGISTER_NORM_OPS(m, forward_cuda, backward_cuda);
}

}  // namespace fused
