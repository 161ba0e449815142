// norm_bwd_regs: the backward with x and dy in registers, one read each, on a persistent grid
// (up to 4 blocks an SM, plan.h: the rows it takes). Each thread loads the next row's x / dy
// before reducing the current one (two rows of loads in flight), keeps its columns of w in
// registers and accumulates their dweight / dbias across the rows it visits, written as
// float32 partial rows [blocks, cols]. Float32 rows stage their tiles, mean / rstd and w in
// shared memory instead (per-thread cp.async, two rows ahead instead of one).

#include "cuda/norm/bwd_common.cuh"
#include "cuda/norm/families.h"

#include <numeric>

namespace fused {
namespace norm {
namespace {

// SPAN: rows off the 16-byte grid, each read as the 16-byte vectors of its aligned span
// (bwd_common.cuh); the grid's row step keeps a thread's head the same in all its rows
// (bwd_regs_at), so its w and dweight / dbias accumulators stay in one column order, w
// loaded at that shift (param_span) and the partials stored at it.
template <typename T, typename W, typename R, int VEC, int VPT, bool PF, int STAGES,
          bool SPAN = false>
__global__ void __launch_bounds__(kBwdMaxThreads, STAGES > 0 ? 2 : 1)
    norm_bwd_regs(BwdParams<T, W, R> p, int tpr) {
  static_assert(STAGES == 0 || (PF && STAGES >= 2 && bwd_regs_staged<R>()),
                "staging is a deeper prefetch, for float32 rows");
  static_assert(!SPAN || (STAGES == 0 && VEC > 1), "span: the 16-byte path, in registers");
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
  const int64_t first0 = static_cast<int64_t>(blockIdx.x) * g.groups;
  const int head = SPAN ? span_head<VEC>(p.phase, (first0 + g.group) * p.cols) : 0;
  const int nvec = bwd_nvec<VEC, SPAN>(p.cols, head);
  // A thread owns the same columns in every row it visits: w is loaded once.
  // Staged: in the thread's own shared-memory slots (no registers; read back by the thread).
  Raw<W, VEC> wv[STAGES > 0 ? 1 : VPT];
  auto* ws = STAGES > 0 ? reinterpret_cast<Raw<W, VEC>*>(dyn_smem + Stage::w_at(blockDim.x, p.dsum))
                        : nullptr;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int c = i * tpr + g.lane;
    if (p.weight && c < nvec) {
      Raw<W, VEC> v;
      if constexpr (SPAN) {
        v = from_float<W, VEC>(param_span<W, VEC>(p.weight, p.wphase, c * VEC - head, p.cols, 1.f));
      } else {
        v = load_raw<W, VEC>(p.weight + c * VEC);
      }
      if constexpr (STAGES > 0)
        ws[i * blockDim.x + threadIdx.x] = v;
      else
        wv[i] = v;
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
    bwd_sums<VEC, VPT, SPAN>(p, t, row < p.rows, g.lane, tpr, weight, dw, db, s, head);
    group_sum<2>(s, tpr, scratch[slot], false);
    slot ^= 1;
    bwd_dx<VEC, VPT, SPAN>(p, t, row, row < p.rows, g.lane, tpr, weight, s, head);
  };
  // The groups of a block walk rows in step (first is uniform): barriers stay uniform.
  const int64_t step = static_cast<int64_t>(gridDim.x) * g.groups;
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
      StagedBwdTile<T, R, VEC> tile{&xs[at(k, 0)], &gs[at(k, 0)], &ss[at(k, 0)], threads, 0.f, 0.f};
      if (row < p.rows) {
        tile.mean = p.mean ? ms[(2 * k) * threads + t] : 0.f;
        tile.rstd = ms[(2 * k + 1) * threads + t];
      }
      finish(tile, row);
      k = k == STAGES - 1 ? 0 : k + 1;
    }
  } else {
    Tile cur;
    if constexpr (PF) {
      bwd_load<false, SPAN>(p, first0 + g.group, first0 + g.group < p.rows, g.lane, tpr, cur, head);
    }
    for (int64_t first = first0; first < p.rows; first += step) {
      const int64_t row = first + g.group;
      if constexpr (PF) {
        Tile next;
        bwd_load<false, SPAN>(p, row + step, row + step < p.rows, g.lane, tpr, next, head);
        finish(cur, row);
        cur = next;
      } else {
        bwd_load<false, SPAN>(p, row, row < p.rows, g.lane, tpr, cur, head);
        finish(cur, row);
      }
    }
  }
  if (!p.dw_part && !p.db_part) return;  // uniform across the grid
  if (g.groups == 1) {                   // each column has one owner in the block
    store_partials<VEC, VPT, SPAN>(p.dw_part, p.db_part, blockIdx.x, p.cols, g.lane, tpr, dw, db,
                                   head);
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
          const int c0 = c * VEC - head;
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            if (SPAN && !span_in(c0 + j, p.cols)) continue;
            combine[c0 + j] += dw[i][j];
            combine[p.cols + c0 + j] += db[i][j];
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

}  // namespace

// Rows in registers, the step's vectors a thread and tpr threads a row group; a block is one
// row group, or several of under kBwdBlock threads; a persistent grid of up to
// kBwdBlocksPerSm blocks an SM (the sweep's best: 128 x 4, 256 x 2, 512 x 1 an SM). The
// staged variant (stages > 0) is refused where its ring does not fit a block's shared memory.
template <typename T, typename W, typename R, int VEC, int VPT, bool PF, int STAGES,
          bool SPAN = false>
bool bwd_regs_at(const BwdParams<T, W, R>& p, NormBackward& nb, const Step& s) {
  // Groups share a block only for rows of under kBwdBlock threads (at most 2K columns), so
  // their combine buffer is a few KB; allow_dynamic_smem opts in past 48 KB in any case.
  const int groups = s.threads / s.tpr;
  const size_t combine_bytes = 2 * sizeof(float) * p.cols;
  const size_t smem = BwdStage<T, W, R, VEC, VPT, STAGES>::bytes(s.threads, p.dsum != nullptr) +
                      (groups > 1 ? combine_bytes : 0);
  auto kernel = norm_bwd_regs<T, W, R, VEC, VPT, PF, STAGES, SPAN>;
  int per_sm = resident_blocks(kernel, s.threads, smem);
  if (STAGES > 0 && per_sm < 1) return false;
  per_sm = std::clamp(per_sm, 1, kBwdBlocksPerSm);
  // The span path: a grid row step (blocks x groups) whose rows start at one offset in their
  // 16-byte chunk, a multiple of VEC / gcd(groups x cols, VEC) blocks.
  int multiple = 1;
  if constexpr (SPAN)
    multiple = VEC / std::gcd(static_cast<int>(int64_t{groups} * p.cols % VEC), VEC);
  launch_with_partials(kernel, s.blocks, per_sm, s.threads, smem, p, nb, multiple, s.tpr);
  return true;
}

// The variants a plan can name: on the 16-byte path the prefetching one (32 bytes of x a
// thread), staged for float32 rows; 16 elements a thread without prefetch where that differs
// (the scalar path, float32 rows of 4K-8K).
template <typename T, typename W, typename R, int VEC>
bool bwd_regs(const BwdParams<T, W, R>& p, NormBackward& nb, const Step& s) {
  constexpr int VPT = kBwdElems / VEC;
  if constexpr (VEC > 1) {
    constexpr int kPfVpt = bwd_pf_vpt<R, VEC>();
    if constexpr (std::is_same_v<T, R>) {
      if (s.span && s.pf && s.vpt == kPfVpt && s.stages == 0) {
        return bwd_regs_at<T, W, R, VEC, kPfVpt, true, 0, true>(p, nb, s);
      }
    }
    if (s.pf && s.vpt == kPfVpt) {
      if constexpr (bwd_regs_staged<R>()) {
        if (s.stages == kBwdStages)
          return bwd_regs_at<T, W, R, VEC, kPfVpt, true, kBwdStages>(p, nb, s);
      }
      if (s.stages == 0) return bwd_regs_at<T, W, R, VEC, kPfVpt, true, 0>(p, nb, s);
    }
  }
  if constexpr (VEC == 1 || bwd_pf_vpt<R, VEC>() != VPT) {
    if (!s.pf && s.vpt == VPT && s.stages == 0)
      return bwd_regs_at<T, W, R, VEC, VPT, false, 0>(p, nb, s);
  }
  TORCH_INTERNAL_ASSERT(false, "norm plan: no norm_bwd_regs variant for vpt=", s.vpt, " pf=", s.pf,
                        " stages=", s.stages);
}

#define FUSED_INSTANCE(T, W, R, VEC) \
  template bool bwd_regs<T, W, R, VEC>(const BwdParams<T, W, R>&, NormBackward&, const Step&);
FUSED_NORM_FOR_TYPES(FUSED_INSTANCE)
#undef FUSED_INSTANCE

}  // namespace norm
}  // namespace fused
