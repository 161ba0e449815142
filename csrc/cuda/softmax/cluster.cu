
#include "cuda/softmax/families.h"

namespace fused {
namespace softmax {
namespace {

// Long rows on sm_90: grid (clusters, n), cluster (1, n): cluster blockIdx.x takes rows
// blockIdx.x, + gridDim.x, ...; its block blockIdx.y the columns [y * chunk, + chunk).
// Per row: the block's State (as softmax_kernel's), pushed into slot [rank] of every
// block of the cluster (itself included), one mbarrier wait for the n States, combined
// across the lanes of each warp (combine_lanes: identical bits in every block; a serial
// combine, n expf per thread, took ~25% of a 16-block row), the outputs written.
//
// The next rows are loaded while this one is reduced, exchanged and stored:
// - STAGES > 0 (the wide shape, 16-byte path): thread 0 has the copy engine bring the block's share
// of
//   each of the next STAGES rows into a ring of shared-memory slots (cp.async.bulk, one
//   instruction per input and row, completion counted on the slot's mbarrier `full`). A
//   row goes from its slot to registers; once every thread has its share (a block barrier),
//   the slot is refilled with the row STAGES further on. Up to STAGES rows in flight per
//   SM, no register held for them (docs/design/softmax.md#tried-not-kept).
// - STAGES = 0 (the P = kVectorsPerThread shape, and the scalar path, whose rows need not
//   be 16-byte aligned): the next row's loads issued into registers right after this row's
//   registers are filled (load_tile<kPinned>): one row in flight.
// Launch bound (BLOCK, 1): up to 128 registers; one 512-thread block per SM.
// Buffers alternate by row parity: a block pushes row r + 2 only after it has every
// push of row r + 1, which each block sends after its barrier of row r + 1, after it
// read row r's slots; likewise a reduction buffer is written again two rows later, past
// at least one barrier.
// SPAN (the plan's Step::span: rows off the grid or not whole vectors; never with STAGES):
// each row's head and masked, element-wise edges.
template <typename T, typename Op, int VEC, int P, int BLOCK, int STAGES, bool SPAN>
__global__ void __launch_bounds__(BLOCK, 1)
    softmax_cluster_kernel(Args<T, typename Op::State> a, Op op) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  grid_dependency_wait();  // launched early (early_start): nothing global before this
  using State = typename Op::State;
  using R = Raw<T, VEC>;
  static_assert(STAGES == 0 || sizeof(R) == 16, "staged rows: 16-byte vectors");
  static_assert(STAGES == 0 || !SPAN, "staged rows: whole vectors on the grid");
  constexpr int kShare = P * BLOCK;  // vectors of one input in a block's share of a row
  __shared__ double buf[2][2][BLOCK / 32];
  __shared__ State slots[2][kMaxCluster];
  __shared__ uint64_t bar[2];
  __shared__ uint64_t full[STAGES > 0 ? STAGES : 1];
  // [STAGES][kIn][kShare]; 128-byte aligned, the layout measured (it shared a translation
  // unit with softmax_fwd_staged's 128-byte aligned share, which aligned every kernel's).
  extern __shared__ __align__(128) uint4 staged[];

  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  const Group<BLOCK> g{BLOCK};
  const int n = a.nchunks;
  const int rank = static_cast<int>(cl.block_rank());
  // The block's columns of a row: [base, + chunk) of the row's span, which starts the row's
  // head before it (16-byte path, rows off the grid; the staged shape takes only rows of
  // whole vectors, head 0): begin_of(row).
  const int base = blockIdx.y * a.chunk;
  auto begin_of = [&](int64_t row) {
    return SPAN ? base - row_head<T, VEC>(a.in[0] + row * a.len) : base;
  };
  constexpr int stride = BLOCK * VEC;
  const int64_t step = gridDim.x;
  auto limit_of = [&](int64_t row, int begin) {
    return row < a.rows ? row_limit(a, row, std::min(a.len, begin + a.chunk)) : begin;
  };
  auto prefetch = [&](auto& regs_raw, int64_t row) {
    const int begin = begin_of(row);
    load_tile<kPinned>(regs_raw, a.in, a.len, row, begin + static_cast<int>(threadIdx.x) * VEC,
                       stride, limit_of(row, begin));
  };
  // Thread 0: the block's share of `row` (its vectors that start before the row's limit)
  // into slot s.
  auto stage = [&](int64_t row, int s) {
    const int begin = base;
    const int cols = std::max(limit_of(row, begin) - begin, 0);  // 0: a chunk wholly masked
    const uint32_t bytes = static_cast<uint32_t>((cols + VEC - 1) / VEC) * 16;
    mbar_expect(&full[s], Op::kIn * bytes);
    if (bytes == 0) return;
#pragma unroll
    for (int i = 0; i < Op::kIn; ++i) {
      bulk_load(staged + (s * Op::kIn + i) * kShare, a.in[i] + row * a.len + begin, bytes,
                &full[s]);
    }
  };

  if (threadIdx.x < 2) mbar_init(&bar[threadIdx.x]);
  R raw[Op::kIn][P];
  int64_t row = blockIdx.x;
  if constexpr (STAGES > 0) {
    if (threadIdx.x < STAGES) mbar_init(&full[threadIdx.x]);
  } else {
    prefetch(raw, row);
  }
  cl.sync();  // every block's mbarriers are set up before any push or copy
  if constexpr (STAGES > 0) {
    if (threadIdx.x == 0) {
      for (int s = 0; s < STAGES && row + s * step < a.rows; ++s) stage(row + s * step, s);
    }
  }
  for (int it = 0; row < a.rows; row += step, ++it) {
    // The limit is recomputed rather than carried from the prefetch: carrying it measured
    // +13 registers in ptxas for the same work.
    const int begin = begin_of(row);
    const int end = std::min(a.len, begin + a.chunk);
    const int c0 = begin + static_cast<int>(threadIdx.x) * VEC;
    const int limit = limit_of(row, begin);
    if constexpr (STAGES > 0) {
      const int s = it % STAGES;
      mbar_wait(&full[s], (it / STAGES) & 1);  // full[s]'s (it / STAGES)-th phase
#pragma unroll
      for (int i = 0; i < Op::kIn; ++i) {
#pragma unroll
        for (int k = 0; k < P; ++k) {
          const uint4* v = staged + (s * Op::kIn + i) * kShare + k * BLOCK + threadIdx.x;
          raw[i][k] = c0 + k * stride < limit ? *reinterpret_cast<const R*>(v) : R{};
        }
      }
      __syncthreads();  // slot s read by every thread: refill it
      if (threadIdx.x == 0 && row + STAGES * step < a.rows) stage(row + STAGES * step, s);
    }
    typename Op::template Regs<T, VEC, P> regs;
    op.template init<SPAN>(regs, raw, Cols{c0, stride, limit, P});
    if constexpr (STAGES == 0) prefetch(raw, row + step);
    const int par = it & 1;
    const State mine = op.partial(regs, g, buf[par][0], buf[par][1]);
    if (threadIdx.x < n) push_to_peer(&slots[par][rank], &bar[par], threadIdx.x, mine);
    if (threadIdx.x == 0) mbar_expect(&bar[par], n * static_cast<uint32_t>(sizeof(State)));
    mbar_wait(&bar[par], (it >> 1) & 1);  // bar[par]'s (it / 2)-th phase
    const auto coef = op.coef(op.combine_lanes(slots[par], n), mine, true);
    op.finish(regs, coef);
    store_tile<T, VEC, P, false, SPAN>(op, regs, coef, a.out + row * a.len, c0, stride, end, P);
  }
  cl.sync();  // no block leaves while a peer may still push into its shared memory
#else
  __trap();  // the host launches it only where sm_90 code runs (cluster_fit)
#endif
}

}  // namespace

// softmax_cluster_kernel's ring of staged rows: 0 (the next row prefetched into registers)
// for the P = vectors_per_thread shape, whose registers hold two rows; for the wide shape
// (2P, 16-byte path), whose registers hold one, as many row shares as fit in kStageBudget
// bytes of shared memory, at most 4 (forward 3 slots of 64 KB, bf16 backward 1 of 128 KB).
// Staging the P shape too measured slower than its register prefetch
// (docs/design/softmax.md#tried-not-kept).
constexpr int kStageBudget = 192 * 1024;
template <typename Op, int VEC, int P>
constexpr int kStages = VEC == 1 || P == vectors_per_thread(VEC)
                            ? 0
                            : std::min(4, kStageBudget / (Op::kIn * P * kSplitBlock * 16));

// Rows of a in persistent clusters of n blocks of softmax_cluster_kernel with P vectors
// per thread; false (nothing launched) where such clusters do not fit (cluster_fit).
template <typename T, typename Op, int VEC, int P, bool SPAN = false>
bool launch_cluster_at(Args<T, typename Op::State> a, const Op& op, int n) {
  constexpr int S = kStages<Op, VEC, P>;
  static_assert(S == 0 || !SPAN, "the staged shape takes rows of whole vectors");
  constexpr int smem = S * Op::kIn * P * kSplitBlock * 16;
  constexpr auto kernel = softmax_cluster_kernel<T, Op, VEC, P, kSplitBlock, S, SPAN>;
  const int fit = n <= kMaxCluster ? cluster_fit(kernel, kSplitBlock, n, smem) : 0;
  if (fit == 0) return false;
  a.tpr = kSplitBlock;
  a.nchunks = n;
  // Even shares of the row's span (plan.h span_vectors): the plan's n makes each fit a
  // block's P * BLOCK vectors.
  const int64_t span = SPAN ? a.len + VEC - 1 : a.len;
  a.chunk = static_cast<int>(ceil_div(ceil_div(span, n), VEC) * VEC);
  ClusterLaunch(dim3(1, n), kSplitBlock, smem)
      .early_start()
      .launch(dim3(static_cast<unsigned>(std::min<int64_t>(a.rows, fit)), static_cast<unsigned>(n)),
              kernel, a, op);
  return true;
}

template <typename T, typename Op, int VEC>
bool launch_cluster(Args<T, typename Op::State> a, const Op& op, const Step& s) {
  constexpr int P = vectors_per_thread(VEC);
  if constexpr (VEC > 1) {
    if (s.p == P && s.span) return launch_cluster_at<T, Op, VEC, P, true>(a, op, s.n);
    TORCH_INTERNAL_ASSERT(!s.span, "softmax plan: softmax_cluster_kernel p=", s.p, " span=1");
  }
  if (s.p == P) return launch_cluster_at<T, Op, VEC, P>(a, op, s.n);
  if constexpr (VEC > 1) {
    if (s.p == 2 * P) return launch_cluster_at<T, Op, VEC, 2 * P>(a, op, s.n);
  }
  TORCH_INTERNAL_ASSERT(false, "softmax plan: softmax_cluster_kernel p=", s.p);
}

bool sm90_code_runs() {
  return runs_sm90_code(softmax_cluster_kernel<float, Fwd, 4, 4, kSplitBlock, 0, false>);
}

#define FUSED_INSTANCE(T)                                                                          \
  template bool launch_cluster<T, Fwd, 1>(Args<T, MaxSum>, const Fwd&, const Step&);               \
  template bool launch_cluster<T, Fwd, kVecElems<T>>(Args<T, MaxSum>, const Fwd&, const Step&);    \
  template bool launch_cluster<T, BwdOf<T>, 1>(Args<T, typename BwdOf<T>::State>, const BwdOf<T>&, \
                                               const Step&);                                       \
  template bool launch_cluster<T, BwdOf<T>, kVecElems<T>>(Args<T, typename BwdOf<T>::State>,       \
                                                          const BwdOf<T>&, const Step&);
FUSED_INSTANCE(float)
FUSED_INSTANCE(c10::Half)
FUSED_INSTANCE(c10::BFloat16)
#undef FUSED_INSTANCE

}  // namespace softmax
}  // namespace fused
