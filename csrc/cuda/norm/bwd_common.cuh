// What the norm backward kernels share: a thread's tile of a row (in registers or staged in
// shared memory), its loads, the dweight / dbias partial rows (device); and the launch of a
// persistent backward with its partial rows summed by column_sum (host).
#pragma once
#include <ATen/ops/empty.h>

#include "common/cluster.cuh"
#include "common/norm.h"
#include "common/stage.cuh"
#include "cuda/norm/common.cuh"

namespace fused {
namespace norm {

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

// SPAN: rows off the 16-byte grid read as the vectors of their aligned span (common.cuh),
// `head` the row's offset in its chunk (the same in every row a thread visits: the launcher's
// grid makes it so); vector i then holds columns (i * tpr + lane) * VEC - head ...
template <int VEC, bool SPAN>
__device__ __forceinline__ int bwd_nvec(int cols, int head) {
  return SPAN ? (head + cols + VEC - 1) / VEC : cols / VEC;
}

// PIN: loads kept where they are issued (load_pinned), for the cluster kernel's prefetch.
template <bool PIN = false, bool SPAN = false, typename T, typename W, typename R, int VEC, int VPT>
__device__ __forceinline__ void bwd_load(const BwdParams<T, W, R>& p, int64_t row, bool valid,
                                         int lane, int tpr, BwdTile<T, R, VEC, VPT>& t,
                                         int head = 0) {
  auto load = [](const auto* q) {
    if constexpr (PIN)
      return load_pinned(q);
    else
      return *q;
  };
  const int nvec = bwd_nvec<VEC, SPAN>(p.cols, head);
  const int64_t off = row * p.cols - head;
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
// (SPAN: the neighbours' elements of a span vector are left out of the row sums; their
// dweight / dbias terms go to accumulators that are never stored.)
template <int VEC, int VPT, bool SPAN = false, typename T, typename W, typename R, typename Tile,
          typename Weight, typename Terms>
__device__ __forceinline__ void bwd_sums_to(const BwdParams<T, W, R>& p, const Tile& t, bool valid,
                                            int lane, int tpr, Weight&& weight, Terms&& terms,
                                            float (&s)[2], int head = 0) {
  const int nvec = bwd_nvec<VEC, SPAN>(p.cols, head);
  s[0] = s[1] = 0.f;  // sum of g, sum of g * xhat
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    if (valid && i * tpr + lane < nvec) {
      const FVec<VEC> w = weight(i);
      const FVec<VEC> xf = to_float(t.xv(i)), df = to_float(t.gv(i));
      const int c0 = (i * tpr + lane) * VEC - head;
      const bool whole = !SPAN || span_whole<VEC>(c0, p.cols);
      FVec<VEC> xhat;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        xhat.v[j] = (xf.v[j] - t.mean) * t.rstd;
        const bool in = whole || span_in(c0 + j, p.cols);
        const float gw = in ? df.v[j] * w.v[j] : 0.f;
        s[0] += gw;
        s[1] += in ? gw * xhat.v[j] : 0.f;
      }
      terms(i, df, xhat);
    }
  }
}

template <int VEC, int VPT, bool SPAN = false, typename T, typename W, typename R, typename Tile,
          typename Weight>
__device__ __forceinline__ void bwd_sums(const BwdParams<T, W, R>& p, const Tile& t, bool valid,
                                         int lane, int tpr, Weight&& weight, float (&dw)[VPT][VEC],
                                         float (&db)[VPT][VEC], float (&s)[2], int head = 0) {
  bwd_sums_to<VEC, VPT, SPAN>(
      p, t, valid, lane, tpr, weight,
      [&](int i, const FVec<VEC>& d, const FVec<VEC>& xhat) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          dw[i][j] += d.v[j] * xhat.v[j];
          db[i][j] += d.v[j];
        }
      },
      s, head);
}

template <int VEC, int VPT, bool SPAN = false, typename T, typename W, typename R, typename Tile,
          typename Weight>
__device__ __forceinline__ void bwd_dx(const BwdParams<T, W, R>& p, const Tile& t, int64_t row,
                                       bool valid, int lane, int tpr, Weight&& weight,
                                       const float (&s)[2], int head = 0) {
  const int nvec = bwd_nvec<VEC, SPAN>(p.cols, head);
  const float inv_n = 1.f / static_cast<float>(p.cols);
  const float c1 = p.mean ? s[0] * inv_n : 0.f, c2 = s[1] * inv_n;
  const int64_t off = row * p.cols - head;
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
      if constexpr (SPAN) {
        store_span<R, VEC>(p.dx + e, from_float<R, VEC>(o), (i * tpr + lane) * VEC - head, p.cols);
      } else {
        store_raw<R, VEC>(p.dx + e, from_float<R, VEC>(o));
      }
    }
  }
}

// VEC floats to q, 16 bytes a store where VEC allows (then q is 16-byte aligned: the
// partial rows' offsets are multiples of VEC floats). Every block of a persistent grid
// stores its partial row at the same moment, the kernel's end, so the store count there is
// kernel time: 4-byte stores made eight L2 sector writes per 32 bytes, ~15 us of the layer
// norm backward at 16384x4096 (docs/design/norm.md#tried-not-kept).
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
// (SPAN: the accumulators' columns shifted by the thread's head, stored element by element.)
template <int VEC, int VPT, bool SPAN = false>
__device__ __forceinline__ void store_partials(float* dw_part, float* db_part, int64_t part,
                                               int cols, int lane, int tpr,
                                               const float (&dw)[VPT][VEC],
                                               const float (&db)[VPT][VEC], int head = 0) {
  float* dwp = dw_part ? dw_part + part * cols : nullptr;
  float* dbp = db_part ? db_part + part * cols : nullptr;
  const int nvec = bwd_nvec<VEC, SPAN>(cols, head);
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int c = i * tpr + lane;
    if constexpr (SPAN) {
      if (c < nvec) {
        const int c0 = c * VEC - head;
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          if (!span_in(c0 + j, cols)) continue;
          if (dwp) dwp[c0 + j] = dw[i][j];
          if (dbp) dbp[c0 + j] = db[i][j];
        }
      }
    } else if (c < nvec) {
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
// itself: no registers hold a prefetch, so more warps fit an SM
// (docs/design/norm.md#tried-not-kept). Staged only for float32 rows (x, or the add forms' float32
// sum): 8 elements a thread, up to 512 threads. The launch bound sizes registers for two blocks an
// SM, but at 512 threads the ring (248 bytes a thread, 124 KB) leaves room for one: what it buys
// there is the deeper prefetch (two rows in flight instead of one), as measured. 16-bit rows (16
// elements a thread, 32 accumulators) measured slower staged at the register counts that
// would fit more blocks (docs/design/norm.md#tried-not-kept).
template <typename R>
constexpr bool bwd_regs_staged() {
  return sizeof(R) == 4;
}

// ---- host: the dweight / dbias partial rows ------------------------------------------------

// Parameter gradients asked for (dweight, dbias): the partial rows' terms.
inline int param_grads(const NormBackward& nb) { return nb.dweight.defined() + nb.dbias.defined(); }

// dweight / dbias from the [outs, parts, cols] partials (dweight first when both): column_sum,
// partials.cu.
template <typename T>
void reduce_partials(const at::Tensor& part, int64_t parts, int cols, NormBackward& nb);

// Partial-sum buffers for dweight / dbias: [outs, parts, cols] float32, or undefined.
inline at::Tensor alloc_partials(const NormBackward& nb, int64_t parts) {
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

// A persistent backward: as many blocks of `kernel` as are resident at once (per_sm an SM),
// but no more than `units` (the least a block takes: a row, a row group, a tile), each
// writing one partial row of dweight / dbias; then column_sum over the partial rows. args:
// the kernel's parameters after p.
// grid_multiple: a grid smaller than `units` is a multiple of it (the span path: a thread's
// rows then share their head).
template <typename Kernel, typename T, typename W, typename R, typename... Args>
void launch_with_partials(Kernel kernel, int64_t units, int per_sm, int threads, size_t smem,
                          BwdParams<T, W, R> p, NormBackward& nb, int grid_multiple, Args... args) {
  int64_t blocks = std::min<int64_t>(units, per_sm * int64_t{num_sms()});
  if (blocks < units && blocks > grid_multiple) blocks -= blocks % grid_multiple;
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
  launch_with_partials(kernel, units, per_sm, threads, smem, p, nb, 1);
  return true;
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

}  // namespace norm
}  // namespace fused
