
#include "cuda/softmax/families.h"

namespace fused {
namespace softmax {
namespace {

// softmax_fwd_staged: the forward of plain long rows (scale > 0, no mask) of 16-byte vectors:
// over 16384 16-bit / 8192 float32 columns, up to 16 shares of 64 KB (4096 vectors: 524288
// / 262144 columns). A row is cut into N even shares, a block of 256 threads each (N > 1,
// sm_90: the row's N blocks form a cluster, grid (rows, N), cluster (1, N)); vectors past
// the last share's end are not read and count as -inf. The share goes to shared memory by
// cp.async, each thread
// copying, and later reading back, only its own 16-byte vectors (so no block barrier guards
// them), in four groups; each thread folds a group into its running (max, sum relative to
// that max) as soon as the group has landed, so the exps of one group overlap the loads of
// the next. No register holds the row: three blocks share an SM (64 KB of shared memory
// each), where the register kernel this replaced held two, idle together at their
// reductions and exchanges (docs/design/softmax.md#tried-not-kept). Then one block reduction of
// (max, sum) pairs; for N > 1 each block pushes its pair into every peer's shared memory (st.async,
// one mbarrier wait, common/cluster.cuh) and combines the N pairs lane-wise (the same bits
// in every block); then the output pass from shared memory, the exps recomputed.
// (It replaced a register kernel for rows of exactly 1, 2, 4 or 8 x 32768 16-bit columns;
// float32 rows of N x 16384 on that kernel were measured and dropped:
// docs/design/softmax.md#tried-not-kept.)
constexpr int kStagedGroups = 4;  // (kStagedBlock, kStagedShareVecs, kStagedSmem: plan.h)
constexpr int kStagedVecs = kStagedShareVecs / kStagedBlock / kStagedGroups;  // a thread's a group

// max of two packed pairs of 16-bit T (max.bf16x2 / max.f16x2; NaN ignored, as fmaxf)
template <typename T>
__device__ __forceinline__ uint32_t max_pair(uint32_t a, uint32_t b) {
  using T2 = std::conditional_t<std::is_same_v<T, c10::BFloat16>, __nv_bfloat162, __half2>;
  T2 x, y;
  memcpy(&x, &a, 4);
  memcpy(&y, &b, 4);
  const T2 m = __hmax2(x, y);
  uint32_t r;
  memcpy(&r, &m, 4);
  return r;
}

// Element e (a constant once unrolled) of a 16-byte vector of T, as float.
template <typename T>
__device__ __forceinline__ float vec_elem(const uint4& v, int e) {
  if constexpr (std::is_same_v<T, float>) {
    return __uint_as_float(e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w);
  } else {
    const uint32_t w = e < 2 ? v.x : e < 4 ? v.y : e < 6 ? v.z : v.w;
    return half_bits_to_float<T>(e % 2 ? w >> 16 : w & 0xffffu);
  }
}

// The max of a thread's vectors of T, as float (NaN ignored, as fmaxf); 16-bit T on packed
// pairs (max.bf16x2 / max.f16x2, 3-input in SASS: ~14 instructions for 64 elements).
template <typename T, int K>
__device__ __forceinline__ float vec_max(const uint4 (&raw)[K]) {
  if constexpr (std::is_same_v<T, float>) {
    float m = kNegInf;
#pragma unroll
    for (int k = 0; k < K; ++k) {
#pragma unroll
      for (int e = 0; e < 4; ++e) m = fmaxf(m, vec_elem<float>(raw[k], e));
    }
    return m;
  }
  uint4 m4 = raw[0];
#pragma unroll
  for (int k = 1; k < K; ++k) {
    m4.x = max_pair<T>(m4.x, raw[k].x);
    m4.y = max_pair<T>(m4.y, raw[k].y);
    m4.z = max_pair<T>(m4.z, raw[k].z);
    m4.w = max_pair<T>(m4.w, raw[k].w);
  }
  m4.x = max_pair<T>(max_pair<T>(m4.x, m4.y), max_pair<T>(m4.z, m4.w));
  return fmaxf(vec_elem<T>(m4, 0), vec_elem<T>(m4, 1));
}

// (max, sum relative to it) of two parts of a row, each sum rescaled to the larger max
// (exp_offset: two empty parts give (-inf, 0)). Commutative to the bit, so a butterfly
// leaves the same bits in every lane.
template <typename T>
__device__ __forceinline__ MaxSum fold(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m), o = exp_offset(m);
  return {m, a.s * exp_elem<T>(a.m - o) + b.s * exp_elem<T>(b.m - o)};
}

template <typename T>
__device__ __forceinline__ MaxSum fold_lanes(MaxSum p, int width) {
  for (int o = width / 2; o > 0; o >>= 1) {
    p = fold<T>(p, {__shfl_xor_sync(0xffffffffu, p.m, o), __shfl_xor_sync(0xffffffffu, p.s, o)});
  }
  return p;
}

// A 16-byte word of -inf elements of T: the vectors past a share's end, which add nothing
// to the max (fmax) or to the sum (exp(-inf) = 0).
template <typename T>
constexpr uint32_t kNegInfWord = std::is_same_v<T, float>           ? 0xff800000u
                                 : std::is_same_v<T, c10::BFloat16> ? 0xff80ff80u
                                                                    : 0xfc00fc00u;

// grid (rows, n), n = gridDim.y blocks a row of len elements, `share` 16-byte vectors of
// its span a block (the last block's share may be shorter). N > 0: n = N, rows of whole
// vectors on the 16-byte grid, every share kStagedShareVecs long, so no vector is tested
// (this kernel shaped at compile time for those rows: a runtime n with the tests, or
// without them, cost 262144-column rows 5-6 points of copy:
// docs/design/softmax.md#tried-not-kept); N = 0: any n and share, and any row: its span
// (the row's start rounded down to the 16-byte grid, its end up; x and y at the same offset
// in their 16-byte chunks) is what is copied, the elements outside the row count as -inf
// and are not stored (the first and last vectors stored element by element). Every vector
// read is an aligned 16-byte chunk holding an element of the row: inside the allocation
// (load_tile in common.cuh says why).
template <typename T, int N>
__global__ void __launch_bounds__(kStagedBlock)
    softmax_fwd_staged(const T* __restrict__ x, T* __restrict__ y, int len, int share, float scale,
                       bool log) {
  constexpr int G = kStagedGroups, V = kStagedVecs, W = kStagedBlock / 32;
  // [G][V][kStagedBlock] vectors of x, 128-byte aligned: cp.async into a share at 80 bytes
  // past a 128-byte line read 262144-column rows 5-7 points slower
  extern __shared__ __align__(128) uint4 share_smem[];
  constexpr bool FULL = N > 0;
  // The warps' pairs, then (n > 1, sm_90) the cluster's: one array.
  __shared__ MaxSum slots[FULL ? (N > W ? N : W) : kMaxCluster];
  __shared__ __align__(8) uint64_t landed;  // their arrival, n > 1 on sm_90 only
  (void)slots;
  (void)landed;
  grid_dependency_wait();  // launched early (launch_early / early_start): nothing global before
  // Block (row, rank): the rank-th share of the row. Vector i of the share: thread i % 256.
  const int n = FULL ? N : static_cast<int>(gridDim.y), rank = static_cast<int>(blockIdx.y);
  constexpr int VE = kVecElems<T>;
  const int64_t row_start = static_cast<int64_t>(blockIdx.x) * len;
  const int head = FULL ? 0 : row_head<T, VE>(x + row_start);
  const int nvec = FULL ? N * kStagedShareVecs : (head + len + VE - 1) / VE;    // the row's span
  const int limit = FULL ? kStagedShareVecs : min(share, nvec - rank * share);  // its vectors
  const uint4* src = reinterpret_cast<const uint4*>(x + (row_start - head)) + rank * share;
  uint4* dst = reinterpret_cast<uint4*>(y + (row_start - head)) + rank * share;
  // Vector j of the share holds the row's elements e in [from(j), from(j) + len) of its VE.
  // The span's first vector (share index e0) is part neighbour where the row is off the
  // grid, its last (e1) where the row ends inside a vector: these edges are not copied but
  // loaded, masked (-inf) and stored into shared memory by their thread, after the loop, and
  // written back element by element; the loops over the other vectors test only j.
  const int from0 = head - rank * share * VE;
  auto from = [&](int j) { return from0 - j * VE; };
  const int e0 = FULL || head == 0 ? -1 : -rank * share;
  const int e1 = FULL || (head + len) % VE == 0 ? -1 : nvec - 1 - rank * share;
  auto edge = [&](int j) { return j == e0 || j == e1; };
  auto at = [](int k) { return k * kStagedBlock + static_cast<int>(threadIdx.x); };  // k-th own
  auto mine_edge = [&](int j) {
    return j >= 0 && j < limit && j % kStagedBlock == static_cast<int>(threadIdx.x);
  };
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int v = 0; v < V; ++v) {
      if (FULL || (at(g * V + v) < limit && !edge(at(g * V + v)))) {
        stage_copy(&share_smem[at(g * V + v)], src + at(g * V + v));
      }
    }
    stage_commit();
  }
  if constexpr (!FULL) {
    // Read by this thread alone, after its own store (program order): no barrier.
#pragma unroll 1
    for (int i = 0; i < 2; ++i) {
      const int j = i ? e1 : e0;
      if (mine_edge(j)) {
        share_smem[j] = keep_elems<T>(src[j], from(j), from(j) + len, kNegInfWord<T>);
      }
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (n > 1 && threadIdx.x == 0) mbar_init(&landed);
#endif
  // This thread's (max of scale x, sum of exp(scale x - offset(max))), group by group.
  MaxSum mine{kNegInf, 0.f};
#pragma unroll
  for (int g = 0; g < G; ++g) {
    stage_wait_n<G - 1>(G - 1 - g);
    uint4 raw[V];
#pragma unroll
    for (int v = 0; v < V; ++v) {
      constexpr uint32_t ni = kNegInfWord<T>;
      raw[v] =
          FULL || at(g * V + v) < limit ? share_smem[at(g * V + v)] : make_uint4(ni, ni, ni, ni);
    }
    // max(scale x) = scale max(x) for scale > 0 (rounding is monotonic)
    const float m = fmaxf(mine.m, vec_max<T>(raw) * scale), o = exp_offset(m);
    // v - M = fma(x, scale, -M): one rounding (the general path's scale * x, then - M: two)
    float s = mine.s * exp_elem<T>(mine.m - o);
#pragma unroll
    for (int v = 0; v < V; ++v) {
#pragma unroll
      for (int e = 0; e < kVecElems<T>; ++e) {
        s += exp_elem<T>(fmaf(vec_elem<T>(raw[v], e), scale, -o));
      }
    }
    mine = {m, s};
  }
  mine = fold_lanes<T>(mine, 32);
  if (threadIdx.x % 32 == 0) slots[threadIdx.x / 32] = mine;
  __syncthreads();
  MaxSum row = fold_lanes<T>(slots[threadIdx.x % W], W);  // the share's, in every thread
  if (n > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // The warps' pairs are read and the mbarrier set up (release): peers may push once
    // every block of the cluster has arrived.
    cluster_arrive();
    cluster_wait();
    if (threadIdx.x < n) push_to_peer(&slots[rank], &landed, threadIdx.x, row);
    if (threadIdx.x == 0) mbar_expect(&landed, n * sizeof(MaxSum));
    mbar_wait(&landed, 0);  // no block leaves before every peer's push into it has landed
    row = Fwd{}.combine_lanes(slots, n);
#else
    __trap();  // the host launches clusters only where sm_90 code runs (cluster_fit)
#endif
  }
  const float o = exp_offset(row.m);
  // elem(x): the output of the element x. The flag is uniform: each case its own loop (no
  // element pays for the other's work).
  auto write = [&](auto elem) {
    auto outputs = [&](int j, uint32_t(&w)[4]) {
      const uint4 raw = share_smem[j];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        if constexpr (std::is_same_v<T, float>) {
          w[q] = __float_as_uint(elem(vec_elem<T>(raw, q)));
        } else {
          const float lo = elem(vec_elem<T>(raw, 2 * q));
          const float hi = elem(vec_elem<T>(raw, 2 * q + 1));
          w[q] = float_to_half_bits<T>(lo) | float_to_half_bits<T>(hi) << 16;
        }
      }
    };
#pragma unroll
    for (int k = 0; k < G * V; ++k) {
      if (!FULL && (at(k) >= limit || edge(at(k)))) continue;
      uint32_t w[4];
      outputs(at(k), w);
      dst[at(k)] = make_uint4(w[0], w[1], w[2], w[3]);
    }
    if constexpr (!FULL) {
#pragma unroll 1
      for (int i = 0; i < 2; ++i) {
        const int j = i ? e1 : e0;
        if (mine_edge(j)) {
          uint32_t w[4];
          outputs(j, w);
          store_elems<T>(reinterpret_cast<T*>(dst + j), w, from(j), from(j) + len);
        }
      }
    }
  };
  if (log) {
    const float f = logf(row.s);
    write([&](float v) { return fmaf(v, scale, -o) - f; });
  } else {
    const float f = 1.f / row.s;
    write([&](float v) { return exp_elem<T>(fmaf(v, scale, -o)) * f; });
  }
}

}  // namespace

// softmax_fwd_staged with the step's shares (n, share; shaped at compile time for n = fixed),
// a cluster of them past one share; refused where the share's shared memory or the cluster
// does not fit here.
template <typename T>
bool launch_staged(const Args<T, MaxSum>& a, const Fwd& op, const Step& s) {
  const int n = s.n;
  const dim3 grid(static_cast<unsigned>(s.blocks), static_cast<unsigned>(n));
  auto go = [&](auto kernel) {
    if (n == 1) {
      if (!allow_dynamic_smem_once(kernel, kStagedSmem)) return false;
      launch_early(kernel, grid, dim3(kStagedBlock), kStagedSmem, a.in[0], a.out, a.len, s.share,
                   op.scale, op.log);
      return true;
    }
    if (cluster_fit(kernel, kStagedBlock, n, kStagedSmem) == 0) return false;
    ClusterLaunch(dim3(1, n), kStagedBlock, kStagedSmem)
        .early_start()
        .launch(grid, kernel, a.in[0], a.out, a.len, s.share, op.scale, op.log);
    return true;
  };
  if (s.fixed > 0) {
    bool launched = false;
    const bool known = with_pow2<1, kMaxCluster>(s.fixed, [&](auto kn) {
      launched = go(softmax_fwd_staged<T, decltype(kn)::value>);
      return true;
    });
    TORCH_INTERNAL_ASSERT(known, "softmax plan: softmax_fwd_staged N=", s.fixed);
    return launched;
  }
  return go(softmax_fwd_staged<T, 0>);
}

template bool launch_staged<float>(const Args<float, MaxSum>&, const Fwd&, const Step&);
template bool launch_staged<c10::Half>(const Args<c10::Half, MaxSum>&, const Fwd&, const Step&);
template bool launch_staged<c10::BFloat16>(const Args<c10::BFloat16, MaxSum>&, const Fwd&,
                                           const Step&);

}  // namespace softmax
}  // namespace fused
