
#include <cooperative_groups.h>

#include "cuda/norm/bwd_common.cuh"
#include "cuda/norm/families.h"

namespace fused {
namespace norm {
namespace {

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
// run a row ahead of its slowest peer instead of waiting at every row
// (docs/design/norm.md#tried-not-kept). Buffers: slots / bar by iteration mod 4, group_sum's
// scratch by parity. Safe because a block pushes row r only after its wait for row r - 1 - LAG,
// which needs every peer's push of that row, which each peer sends after its block barrier of that
// iteration, past its reads of the slots of rows up to r - 2 - 2 * LAG >= r - 4 (and its wait on
// that phase). Compiled to a no-op below sm_90; the launcher only picks it where the sm_90 code
// runs.
template <typename T, typename W, typename R, int VEC, int VPT, int LAG>
__global__ void __launch_bounds__(kBwdMaxThreads) norm_bwd_cluster(BwdParams<T, W, R> p) {
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
      [&](const Tile& t, int /*it*/, float(&s)[2]) {
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

}  // namespace

// Rows too long for one block (sm_90): norm_bwd_cluster on clusters of the step's blocks of
// its threads, kClusterElems elements a thread; refused where no such cluster fits here.
template <typename T, typename W, typename R, int VEC>
bool bwd_cluster(const BwdParams<T, W, R>& p, NormBackward& nb, const Step& s) {
  constexpr int VPT = std::max(1, kClusterElems / VEC);
  return launch_cluster_backward(norm_bwd_cluster<T, W, R, VEC, VPT, cluster_lag<R, VEC>()>,
                                 s.cluster, s.threads, p, nb);
}

#define FUSED_INSTANCE(T, W, R, VEC) \
  template bool bwd_cluster<T, W, R, VEC>(const BwdParams<T, W, R>&, NormBackward&, const Step&);
FUSED_NORM_FOR_TYPES(FUSED_INSTANCE)
#undef FUSED_INSTANCE

}  // namespace norm
}  // namespace fused
