
#include <cooperative_groups.h>

#include "cuda/norm/bwd_common.cuh"
#include "cuda/norm/families.h"

namespace fused {
namespace norm {
namespace {

// fixed_row_walk: norm_bwd_fixed's row walk (sm_90 code only), cluster_row_walk's protocol
// with two changes that cut its instructions a row (docs/design/norm.md#tried-not-kept): each warp
// reduces its two sums and its lanes 0..csize-1 push them (st.async) into entry [rank * warps +
// warp] of the row's slot in every block, so a block's warps meet only at the slot's mbarrier (no
// block barrier per row); and the three tiles (next, this row's, the row LAG behind) rotate
// through t[0..2] by unrolling the walk three times (no copies; tile i keeps its
// shared-memory staging slot i, where norm_bwd_fixed stages the rows). The slot
// reuse argument of norm_bwd_cluster holds per warp: a warp pushes row r only after its wait
// for row r - 1 - LAG, i.e. after every warp's push of that row, each sent after that warp's
// own reads of the slots of rows up to r - 2 - 2 * LAG >= r - 4. norm_bwd_cluster keeps
// cluster_row_walk: its runtime-shaped float32 rows measured 20-25% slower on this walk
// (docs/design/norm.md#tried-not-kept; cause not found).
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
// (docs/design/norm.md#roofline-and-standing) put these shapes at 68-74% (layer) and
// 81-85% (rms) of copy, partials' column sum included, where norm_bwd_cluster's runtime
// shape reaches 43-50%. Exchange, lag and buffer rotation: fixed_row_walk.
// (kFixedBwdVpt = 2 in plan.h.)

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
// of 153-167 / 128: 18 / 24 warps an SM instead of 12 / 16; docs/design/norm.md#tried-not-kept).
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
  // a cluster of one does not have (compute-sanitizer: invalid __shared__ write).
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
  auto stage = reinterpret_cast<V(*)[2 * VPT][TPB]>(dyn_smem);
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
    wv[k] =
        p.weight ? load_raw<T, VEC>(p.weight + (lane + k * TPR) * VEC) : from_float<T, VEC>(one);
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
  auto sums = [&](Tile& t, float(&s)[2]) {
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
  fixed_row_walk<LAG, Tile>(p.rows, cid, clusters, CS, rank, TPB, slots, bar, load, sums, finish);
  store_partials(p.dw_part, LAYER ? p.db_part : nullptr, cid, COLS, lane, TPR, dw, db);
#endif
}

}  // namespace

// norm_bwd_fixed at one shape (TPB threads x CS blocks, LAG) for p's norm and d_sum.
template <typename T, int TPB, int CS, int LAG>
bool bwd_fixed_at(const BwdParams<T, T, T>& p, NormBackward& nb, const Step& s) {
  TORCH_INTERNAL_ASSERT(TPB * CS * kFixedBwdVpt * kVecElems<T> == p.cols);
  auto kernel =
      s.layer
          ? (s.res ? norm_bwd_fixed<T, TPB, CS, 1, LAG, 1> : norm_bwd_fixed<T, TPB, CS, 1, LAG, 0>)
          : (s.res ? norm_bwd_fixed<T, TPB, CS, 0, LAG, 1> : norm_bwd_fixed<T, TPB, CS, 0, LAG, 0>);
  return launch_cluster_backward(kernel, CS, TPB, p, nb, fixed_bwd_smem<T, TPB>());
}

// The shapes plan.cpp names (the sweep's best per row length): one table per element width
// (a row's threads differ); refused where the cluster does not fit here.
template <typename T>
bool bwd_fixed(const BwdParams<T, T, T>& p, NormBackward& nb, const Step& s) {
  TORCH_INTERNAL_ASSERT(s.lag == 1, "norm plan: norm_bwd_fixed lag=", s.lag);
  const int shape = s.fixed * 100 + s.cluster;  // TPB, CS
  if constexpr (sizeof(T) == 4) {               // 8 elements a thread
    switch (shape) {
      case 19208:
        return bwd_fixed_at<T, 192, 8, 1>(p, nb, s);
      case 25608:
        return bwd_fixed_at<T, 256, 8, 1>(p, nb, s);
    }
  } else {
    switch (shape) {
      case 12802:
        return bwd_fixed_at<T, 128, 2, 1>(p, nb, s);
      case 16002:
        return bwd_fixed_at<T, 160, 2, 1>(p, nb, s);
      case 25602:
        return bwd_fixed_at<T, 256, 2, 1>(p, nb, s);
      case 19204:
        return bwd_fixed_at<T, 192, 4, 1>(p, nb, s);
      case 25604:
        return bwd_fixed_at<T, 256, 4, 1>(p, nb, s);
      case 25608:
        return bwd_fixed_at<T, 256, 8, 1>(p, nb, s);
    }
  }
  TORCH_INTERNAL_ASSERT(false, "norm plan: no norm_bwd_fixed of ", s.fixed, " x ", s.cluster);
}

template bool bwd_fixed<float>(const BwdParams<float, float, float>&, NormBackward&, const Step&);
template bool bwd_fixed<c10::Half>(const BwdParams<c10::Half, c10::Half, c10::Half>&, NormBackward&,
                                   const Step&);
template bool bwd_fixed<c10::BFloat16>(
    const BwdParams<c10::BFloat16, c10::BFloat16, c10::BFloat16>&, NormBackward&, const Step&);

}  // namespace norm
}  // namespace fused
