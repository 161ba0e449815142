// Long-row bf16 softmax forward, y = softmax(scale x), rows of 32768 / 131072 / 262144:
// which design reaches >= 80% of the device copy? The library (csrc/cuda/softmax.cu, v5)
// holds one row per cluster of 512-thread blocks at a time and measures 61 / 54 / 44%:
// per row two block reductions and two cluster barriers with nothing else in flight.
// Variants (forward only, exact fits: len = C * BLOCK * 32):
//   a  base      one row per cluster of C blocks x 512 threads x 32 elements (the library's
//                structure): block max, block sum, (max, sum) pulled over DSMEM, 2 cluster syncs
//   b  base      the same with 1024-thread blocks (C halved; C = 1 for rows of 32768)
//   c  persist   persistent clusters (as many as fit at once) looping over rows; the next
//                row's loads are issued (raw bf16 bits) before this row's reductions, so two
//                rows are in flight per block; block max, block sum (one __syncthreads each),
//                each block pushes its (max, sum) into every peer's shared memory, then ONE
//                wait per row (exchange slots double-buffered by row parity)
//   d  online    as c, but one pass: each thread's (max, sum of exp relative to it), a warp
//                pair reduction, every warp pushes its pair to every block of the cluster
//                (C * W slots), one wait, each warp combines the C * W pairs: no
//                __syncthreads at all
// c and d come as "keep" (exps kept in 32 floats for the output pass; up to 128 registers,
// one 512-thread block per SM: at 64 they spill) or "recomp" (the row stays packed, exp
// recomputed from the raw bits in the output pass: 2 ex2 per element; 1024 threads per
// SM), each with two ways to wait for the peers' pushes:
//   bar   DSMEM stores + barrier.cluster.arrive.release / wait.acquire (as cg's
//         cluster.sync(), which the library uses): SASS puts MEMBAR.ALL.GPU before the
//         arrive, which may wait for this thread's outstanding global loads and stores (the
//         prefetched row among them): bar vs mbar measures whether it does
//   mbar  st.async to the peer's slot, completing bytes on the peer's mbarrier: no fence, no
//         cluster barrier; each block waits on its own mbarrier (parity per use)
//   f  fixed     the library's softmax_fwd_fixed (session 8 on): one row per cluster of C
//                blocks x 512 threads x 64 elements kept as raw bits, 2 blocks an SM,
//                block max, block sum, DSMEM store + cluster.sync, exps recomputed
//   e  bulk      (session 23) the block's 32768-element share brought into shared memory
//                by the copy engine (cp.async.bulk, CH chunks, one mbarrier each), so no
//                register holds the row and three blocks fit an SM (64 KB each); each
//                thread folds each chunk into a running (max, sum) as it lands, one block
//                pair reduction, the st.async + mbarrier exchange, the output pass from
//                shared memory. "e2": the same held to two blocks an SM (more shared
//                memory asked), to tell the third block's worth from the rest.
// exp = ex2.approx.ftz.f32 of x * scale * log2(e) (as the library for 16-bit rows); scale > 0
// is assumed (the max is taken on x, then scaled). Timing: median of 25 runs after an L2
// flush, against the run's device-to-device copy (as softmax_sweep.cu). Standalone:
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -I csrc \
//        benchmarks/dev/softmax_long_sweep.cu -o /tmp/lsweep && /tmp/lsweep [VARIANTS]
// VARIANTS: letters of the variants to run (default all: abcdef).
#include <cuda_bf16.h>
#include <cooperative_groups.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/cluster.cuh"
#include "common/stage.cuh"
namespace cg = cooperative_groups;

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) { printf("line %d %s: %s\n", __LINE__, #x, cudaGetErrorString(e_)); exit(1); } \
  } while (0)

constexpr int P = 4;        // 16-byte vectors per thread (as the library): 32 bf16
constexpr int EPT = P * 8;  // elements per thread
constexpr int kMaxC = 16;   // blocks per cluster (> 8: non-portable)

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// Element e of 8 packed bf16: one shift or mask (e is a constant after unrolling).
__device__ __forceinline__ float elem(const uint4& r, int e) {
  const uint32_t w = e < 2 ? r.x : e < 4 ? r.y : e < 6 ? r.z : r.w;
  return __uint_as_float((e & 1) ? (w & 0xffff0000u) : (w << 16));
}
// The same through PRMT, for a pass that must convert again: different instructions, so
// the compiler cannot merge the two conversions into 32 floats kept live between passes.
__device__ __forceinline__ float elem2(const uint4& r, int e) {
  const uint32_t w = e < 2 ? r.x : e < 4 ? r.y : e < 6 ? r.z : r.w;
  return __uint_as_float(__byte_perm(w, 0, (e & 1) ? 0x3244 : 0x1044));
}
// Max of 8 packed bf16 pairs-wise (HMNMX2: no conversion), as a float of the larger half.
__device__ __forceinline__ float max_packed(const uint4 (&r)[P]) {
  __nv_bfloat162 m = *reinterpret_cast<const __nv_bfloat162*>(&r[0].x);
#pragma unroll
  for (int i = 1; i < 4 * P; ++i)
    m = __hmax2(m, *reinterpret_cast<const __nv_bfloat162*>(reinterpret_cast<const uint32_t*>(r) + i));
  return fmaxf(__low2float(m), __high2float(m));
}
__device__ __forceinline__ uint32_t pack(float a, float b) {
  __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&h);
}
__device__ __forceinline__ uint4 pack8(const float* f, float s) {
  return make_uint4(pack(f[0] * s, f[1] * s), pack(f[2] * s, f[3] * s), pack(f[4] * s, f[5] * s),
                    pack(f[6] * s, f[7] * s));
}
// Cluster barrier: the release orders this thread's DSMEM stores (and its reads of the
// slots of the row before) before the peers' acquire.
__device__ __forceinline__ void cluster_barrier() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// A load that stays before the reductions: ptxas sank the .nc (__ldg) loads of the next row
// below the first __syncthreads and the exp pass (to save registers); a weak ld.global it
// may not move past bar.sync. asm volatile keeps the compiler from moving it either.
__device__ __forceinline__ uint4 ldg_pinned(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}
__device__ __forceinline__ uint32_t sa(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
// v into block `rank`'s copy of `slot`, counted on its copy of `bar` (8 bytes of tx).
__device__ __forceinline__ void push_async(float2* slot, uint64_t* bar, int rank, float2 v) {
  uint32_t a, b;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(sa(slot)), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(b) : "r"(sa(bar)), "r"(rank));
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];"
               :: "r"(a), "f"(v.x), "f"(v.y), "r"(b) : "memory");
}
// The same as a plain DSMEM store (32-bit shared::cluster address: cg's map_shared_rank
// gives 64-bit generic pointers, which spilled here).
__device__ __forceinline__ void push_plain(float2* slot, int rank, float2 v) {
  uint32_t a;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(sa(slot)), "r"(rank));
  asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};" :: "r"(a), "f"(v.x), "f"(v.y) : "memory");
}
__device__ __forceinline__ void mbar_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(sa(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile("{\n .reg .pred p;\n W:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
               " @!p bra W;\n}" :: "r"(sa(bar)), "r"(parity) : "memory");
}

template <bool MAX>
__device__ __forceinline__ float op(float a, float b) { return MAX ? fmaxf(a, b) : a + b; }
// Butterfly all-reduce over aligned groups of N lanes.
template <bool MAX, int N = 32>
__device__ __forceinline__ float warp_all(float v) {
#pragma unroll
  for (int o = N / 2; o > 0; o >>= 1) v = op<MAX>(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// The library's block all-reduce: shuffles, one value per warp in smem, every thread sums W.
template <bool MAX, int W>
__device__ __forceinline__ float block_all_lib(float v, float* buf) {
  v = warp_all<MAX>(v);
  if (threadIdx.x % 32 == 0) buf[threadIdx.x / 32] = v;
  __syncthreads();
  v = buf[0];
#pragma unroll
  for (int i = 1; i < W; ++i) v = op<MAX>(v, buf[i]);
  return v;
}
// Leaner: after the barrier each lane reads one warp value and the warp shuffles (W <= 32).
// Each call site has its own buf, so the next row can write it without a second barrier.
template <bool MAX, int W>
__device__ __forceinline__ float block_all(float v, float* buf) {
  v = warp_all<MAX>(v);
  if constexpr (W > 1) {
    if (threadIdx.x % 32 == 0) buf[threadIdx.x / 32] = v;
    __syncthreads();
    v = warp_all<MAX, W>(buf[threadIdx.x % W]);
  }
  return v;
}

// (a), (b): grid (C, rows), cluster (C, 1, 1); block `rank` owns columns
// [rank, rank + 1) * BLOCK * 32, thread t vector k at rank * BLOCK * P + k * BLOCK + t.
template <int BLOCK>
__global__ void __launch_bounds__(BLOCK) k_base(const uint4* __restrict__ x, uint4* __restrict__ y,
                                                int lenv, float kk) {
  constexpr int W = BLOCK / 32;
  __shared__ float bm[W], bs[W];
  __shared__ float2 slot, part[kMaxC];
  cg::cluster_group cl = cg::this_cluster();
  const int C = cl.num_blocks(), rank = cl.block_rank();
  const long o = (long)blockIdx.y * lenv + rank * BLOCK * P + threadIdx.x;
  uint4 raw[P];
#pragma unroll
  for (int k = 0; k < P; ++k) raw[k] = __ldg(x + o + k * BLOCK);  // all loads first
  float v[EPT], m = -INFINITY;
#pragma unroll
  for (int i = 0; i < EPT; ++i) { v[i] = elem(raw[i / 8], i % 8); m = fmaxf(m, v[i]); }
  const float mk = block_all_lib<true, W>(m, bm) * kk;  // block max, log2 units
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < EPT; ++i) { v[i] = ex2(fmaf(v[i], kk, -mk)); s += v[i]; }
  s = block_all_lib<false, W>(s, bs);
  if (threadIdx.x == 0) slot = make_float2(mk, s);
  cl.sync();
  if (threadIdx.x < C) part[threadIdx.x] = *cl.map_shared_rank(&slot, threadIdx.x);
  cl.sync();  // also keeps every slot alive until all peers have read it
  float M = -INFINITY, S = 0.f;
  for (int i = 0; i < C; ++i) M = fmaxf(M, part[i].x);
  for (int i = 0; i < C; ++i) S += part[i].y * ex2(part[i].x - M);
  const float f = ex2(mk - M) / S;
#pragma unroll
  for (int k = 0; k < P; ++k) y[o + k * BLOCK] = pack8(v + 8 * k, f);
}

// (c) ONLINE = false, (d) ONLINE = true; RECOMP: exps recomputed in the output pass; MB: the
// st.async + mbarrier exchange. grid = clusters that fit at once x C; cluster i handles rows
// i, i + ncl, ... recomp: 1024 threads per SM (64 registers), keep: 512 (128 registers).
template <int BLOCK, bool ONLINE, bool RECOMP, bool MB>
__global__ void __launch_bounds__(BLOCK, (RECOMP ? 1024 : 512) / BLOCK)
    k_persist(const uint4* __restrict__ x, uint4* __restrict__ y, int rows, int lenv, float kk) {
  static_assert(RECOMP || BLOCK == 512, "keep needs more than 64 registers");
  constexpr int W = BLOCK / 32;
  __shared__ float red[2][W];                            // block max, block sum (c)
  __shared__ float2 xch[2][ONLINE ? kMaxC * W : kMaxC];  // cluster exchange, by row parity
  __shared__ uint64_t bar[2];                            // MB: one mbarrier per parity
  cg::cluster_group cl = cg::this_cluster();
  const int C = cl.num_blocks(), rank = cl.block_rank();
  const int ncl = gridDim.x / C, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // 32-bit offsets (rows * lenv < 2^31 here): fewer registers than 64-bit index math.
  const int col = rank * BLOCK * P + threadIdx.x;
  const uint32_t xbytes = (ONLINE ? C * W : C) * sizeof(float2);  // pushed to each block per row
  int it = 0;                                                      // rows done by this block

  // Past the last row: zeros, not the old bits (else those stay live through the row).
  auto load = [&](uint4(&r)[P], int row) {
    const bool in = row < rows;
    const uint4* p = x + (row * lenv + col);  // one 32-bit offset (a hoisted x + col spilled)
#pragma unroll
    for (int k = 0; k < P; ++k) r[k] = in ? ldg_pinned(p + k * BLOCK) : uint4{};
  };
  auto step = [&](uint4(&cur)[P], uint4(&nxt)[P], int row) {
    load(nxt, row + ncl);  // in flight through this row's reductions, exchange and stores
    const int par = it & 1;
    const uint32_t phase = (it >> 1) & 1;  // of bar[par], used every second row
    ++it;
    float2* slots = xch[par];
    auto push = [&](int to, int idx, float2 v) {
      if constexpr (MB) push_async(slots + idx, &bar[par], to, v);
      else push_plain(slots + idx, to, v);  // push (not pull): the stores do not wait
    };
    auto wait = [&] {
      if constexpr (MB) {
        if (threadIdx.x == 0) mbar_expect(&bar[par], xbytes);  // the one arrival of the phase
        mbar_wait(&bar[par], phase);
      } else {
        cluster_barrier();
      }
    };
    float e[RECOMP ? 1 : EPT];
    const float m = max_packed(cur);  // pass 1 on the packed bits
    const float mk = (ONLINE ? m : block_all<true, W>(m, red[0])) * kk;  // thread / block max
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < EPT; ++i) {
      const float t = ex2(fmaf(elem(cur[i / 8], i % 8), kk, -mk));  // pass 2: convert
      if constexpr (!RECOMP) e[i] = t;
      s += t;
    }
    float M, S;  // the row's max (log2 units) and sum relative to it
    if constexpr (!ONLINE) {
      s = block_all<false, W>(s, red[1]);
      if (threadIdx.x < C) push(threadIdx.x, rank, make_float2(mk, s));
      wait();
      const float2 q = lane < C ? slots[lane] : make_float2(-INFINITY, 0.f);
      M = warp_all<true>(q.x);
      S = warp_all<false>(q.y * ex2(q.x - M));
    } else {
      // Warp pair (max, sum relative to it): 10 shuffles and one ex2, no block barrier.
      const float mw = warp_all<true>(mk);
      const float sw = warp_all<false>(s * ex2(mk - mw));
      if (lane < C) push(lane, rank * W + warp, make_float2(mw, sw));
      wait();
      // Every warp combines the C * W pairs (<= 8 per lane): max first, then one ex2 each.
      const int cw = C * W;
      float lm = -INFINITY, ls = 0.f;
      for (int j = lane; j < cw; j += 32) lm = fmaxf(lm, slots[j].x);
      M = warp_all<true>(lm);
      for (int j = lane; j < cw; j += 32) ls += slots[j].y * ex2(slots[j].x - M);
      S = warp_all<false>(ls);
    }
    // Reuse of slots[par] two rows later is safe without a barrier: a peer pushes row r + 2
    // only after it has every push of row r + 1, which each warp here (or, in c, the block
    // after its next __syncthreads) sends after reading these slots.
    uint4* out = y + row * lenv + col;
    if constexpr (RECOMP) {
      const float r = 1.f / S;
#pragma unroll
      for (int k = 0; k < P; ++k) {
        float f[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) f[j] = ex2(fmaf(elem2(cur[k], j), kk, -M));  // again
        out[k * BLOCK] = pack8(f, r);
      }
    } else {
      const float f = ex2(mk - M) / S;  // e is relative to mk (the block's or thread's max)
#pragma unroll
      for (int k = 0; k < P; ++k) out[k * BLOCK] = pack8(e + 8 * k, f);
    }
  };

  if (MB && threadIdx.x < 2) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(sa(&bar[threadIdx.x])) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  // Two register buffers used alternately (unrolled by hand: a copy nxt -> cur would wait
  // for the loads at the end of every row).
  uint4 a[P], b[P];
  const int r0 = blockIdx.x / C;
  load(a, r0);
  cl.sync();  // every peer has started (and set up its mbarriers) before any DSMEM store
  for (int row = r0; row < rows; row += 2 * ncl) {
    step(a, b, row);
    if (row + ncl >= rows) break;
    step(b, a, row + ncl);
  }
  cl.sync();  // no block leaves while its shared memory may still be a target
}


// A (max, sum relative to it) pair folded into another: the sum rescaled to the larger max.
__device__ __forceinline__ void fold(float& m, float& s, float m2, float s2) {
  const float M = fmaxf(m, m2);
  s = s * ex2(m - M) + s2 * ex2(m2 - M);
  m = M;
}
// Block all-reduce of (max, sum) pairs: shuffles, one pair per warp in smem, every warp
// folds the W pairs (W <= 32).
template <int W>
__device__ __forceinline__ float2 block_pair(float m, float s, float2* buf) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    fold(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  if (threadIdx.x % 32 == 0) buf[threadIdx.x / 32] = make_float2(m, s);
  __syncthreads();
  const float2 p = buf[threadIdx.x % W];
  m = p.x;
  s = p.y;
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1)
    fold(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  return make_float2(m, s);
}
// The row's (M, S) from the C pairs of the cluster in `slots` (every warp, lanes < C).
__device__ __forceinline__ float2 combine_slots(const float2* slots, int C) {
  const float2 q = threadIdx.x % 32 < C ? slots[threadIdx.x % 32] : make_float2(-INFINITY, 0.f);
  const float M = warp_all<true>(q.x);
  return make_float2(M, warp_all<false>(q.y * ex2(q.x - M)));
}
// Max of K vectors of packed bf16, as a float.
template <int K>
__device__ __forceinline__ float max_vecs(const uint4 (&r)[K]) {
  __nv_bfloat162 m = *reinterpret_cast<const __nv_bfloat162*>(&r[0].x);
#pragma unroll
  for (int i = 1; i < 4 * K; ++i)
    m = __hmax2(m, *reinterpret_cast<const __nv_bfloat162*>(reinterpret_cast<const uint32_t*>(r) + i));
  return fmaxf(__low2float(m), __high2float(m));
}

constexpr int kShare = 32768;          // elements of a row a block takes (f, e)
constexpr int kShareVec = kShare / 8;  // its 16-byte vectors

// (f): grid (C, rows), cluster (C, 1, 1).
__global__ void __launch_bounds__(512, 2) k_fixed(const uint4* __restrict__ x, uint4* __restrict__ y,
                                                  float kk) {
  constexpr int B = 512, K = kShareVec / B, W = B / 32;
  __shared__ float bm[W], bs[W];
  __shared__ float2 slots[kMaxC];
  cg::cluster_group cl = cg::this_cluster();
  const int C = cl.num_blocks(), rank = cl.block_rank();
  const long o = ((long)blockIdx.y * C + rank) * kShareVec + threadIdx.x;
  uint4 raw[K];
#pragma unroll
  for (int k = 0; k < K; ++k) raw[k] = x[o + k * B];
  fused::cluster_arrive_relaxed();
  const float mk = block_all_lib<true, W>(max_vecs<K>(raw), bm) * kk;
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 8 * K; ++i) s += ex2(fmaf(elem(raw[i / 8], i % 8), kk, -mk));
  s = block_all_lib<false, W>(s, bs);
  fused::cluster_wait();
  if (threadIdx.x < C) *cl.map_shared_rank(&slots[rank], threadIdx.x) = make_float2(mk, s);
  cl.sync();
  const float2 row = combine_slots(slots, C);
  const float r = 1.f / row.y;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    float f[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = ex2(fmaf(elem2(raw[k], j), kk, -row.x));
    y[o + k * B] = pack8(f, r);
  }
}

// (e): grid (C, rows), cluster (C, 1, 1); dynamic shared memory >= 64 KB (the share).
// Every cp.async group of this thread but the newest n (a constant once unrolled) landed.
template <int MAX>
__device__ __forceinline__ void stage_wait_upto(int n) {
  if constexpr (MAX > 0) {
    if (n >= MAX) return fused::stage_wait<MAX>();
    stage_wait_upto<MAX - 1>(n);
  } else {
    fused::stage_wait<0>();
  }
}

// SH: elements a block (its share; kShare, or half of it on twice the blocks). CP: each
// thread copies its own vectors with cp.async (one group a chunk) instead of one bulk copy
// a chunk: no chunk mbarriers, no block barrier (a thread reads back only its own copies).
template <int B, int CH, int SH = kShare, bool CP = false>
__global__ void __launch_bounds__(B) k_bulk(const uint4* __restrict__ x, uint4* __restrict__ y,
                                            float kk) {
  constexpr int kShareVec = SH / 8;
  constexpr int W = B / 32, CV = kShareVec / CH, V = CV / B;  // V: vectors a thread a chunk
  static_assert(V >= 1 && CV % B == 0, "chunks of whole vectors per thread");
  extern __shared__ __align__(128) uint4 sh[];
  __shared__ __align__(8) uint64_t bar[CH + 1];  // [CH]: the exchange
  __shared__ float2 wp[W], slots[kMaxC];
  cg::cluster_group cl = cg::this_cluster();
  const int C = cl.num_blocks(), rank = cl.block_rank();
  const long share = ((long)blockIdx.y * C + rank) * kShareVec;
  if (CP) {
#pragma unroll
    for (int c = 0; c < CH; ++c) {
#pragma unroll
      for (int v = 0; v < V; ++v) {
        const int i = c * CV + v * B + threadIdx.x;
        fused::stage_copy(sh + i, x + share + i);
      }
      fused::stage_commit();
    }
  }
  if (threadIdx.x == 0) {
#pragma unroll
    for (int c = 0; c <= CH; ++c) fused::mbar_init(&bar[c]);
#pragma unroll
    for (int c = 0; c < CH && !CP; ++c) {
      fused::mbar_expect(&bar[c], CV * 16);
      fused::bulk_load(sh + c * CV, x + share + c * CV, CV * 16, &bar[c]);
    }
  }
  __syncthreads();                   // the mbarriers are initialised
  fused::cluster_arrive_relaxed();   // ... and may be pushed to once the peers have waited
  float m = -INFINITY, s = 0.f;      // this thread's running max (log2 units), sum under it
#pragma unroll
  for (int c = 0; c < CH; ++c) {
    if (CP) stage_wait_upto<CH - 1>(CH - 1 - c);
    else fused::mbar_wait(&bar[c], 0);
    uint4 r[V];
#pragma unroll
    for (int v = 0; v < V; ++v) r[v] = sh[c * CV + v * B + threadIdx.x];
    const float mn = fmaxf(m, max_vecs<V>(r) * kk);
    s *= ex2(m - mn);  // 0 for the first chunk
#pragma unroll
    for (int i = 0; i < 8 * V; ++i) s += ex2(fmaf(elem(r[i / 8], i % 8), kk, -mn));
    m = mn;
  }
  const float2 b = block_pair<W>(m, s, wp);
  fused::cluster_wait();
  if (threadIdx.x < C) push_async(&slots[rank], &bar[CH], threadIdx.x, b);
  if (threadIdx.x == 0) fused::mbar_expect(&bar[CH], C * sizeof(float2));
  fused::mbar_wait(&bar[CH], 0);
  const float2 row = combine_slots(slots, C);
  const float rs = 1.f / row.y;
#pragma unroll 4
  for (int k = 0; k < kShareVec / B; ++k) {
    const uint4 r = sh[k * B + threadIdx.x];
    float f[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = ex2(fmaf(elem(r, j), kk, -row.x));
    y[share + k * B + threadIdx.x] = pack8(f, rs);
  }
}

// ------------------------------------------------------------------------------- host
__global__ void flush(int* p, long n) {
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = i;
}
int* fl;
const long fln = 64 << 20;  // 256 MiB: more than the L2
template <typename F>
float timeit(F f) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> ts;
  for (int r = 0; r < 25; ++r) {
    flush<<<fln / 256, 256>>>(fl, fln);
    cudaEventRecord(a);
    f();
    cudaEventRecord(b);
    CK(cudaEventSynchronize(b));
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    ts.push_back(ms);
  }
  CK(cudaGetLastError());
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2] * 1000;
}

const float kScale = 0.5f;
uint16_t *X, *Y;
std::vector<uint16_t> hx;
double copy_bps;  // bytes (read + written) per us of the device copy

float bf2f(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }

// Max abs and relative error of a few rows (first, second round, middle, last) against a
// float64 softmax of the same bf16 inputs. NaN counts as infinite.
void check(long rows, long len, double* abs_err, double* rel_err) {
  const long pick[] = {0, 1, 137 % rows, rows / 2 + 1, rows - 2, rows - 1};
  std::vector<uint16_t> hy(len);
  std::vector<double> v(len);
  *abs_err = *rel_err = 0;
  for (long r : pick) {
    CK(cudaMemcpy(hy.data(), Y + r * len, len * 2, cudaMemcpyDeviceToHost));
    double M = -INFINITY, S = 0;
    for (long j = 0; j < len; ++j) { v[j] = kScale * (double)bf2f(hx[r * len + j]); M = std::max(M, v[j]); }
    for (long j = 0; j < len; ++j) S += exp(v[j] - M);
    for (long j = 0; j < len; ++j) {
      const double ref = exp(v[j] - M) / S;
      double e = fabs(bf2f(hy[j]) - ref);
      if (std::isnan(e)) e = INFINITY;
      *abs_err = std::max(*abs_err, e);
      *rel_err = std::max(*rel_err, e / ref);
    }
  }
}

// A launch of `grid` blocks as clusters of C (attr: the caller's, outlives cfg).
cudaLaunchConfig_t config(dim3 grid, int block, int C, cudaLaunchAttribute* attr, int smem = 0) {
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = C;
  attr->val.clusterDim.y = attr->val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(block);
  cfg.dynamicSmemBytes = smem;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

// Clear y, run once and check, then time. ncl > 0: a persistent launch of ncl clusters.
template <typename... K, typename... A>
void run(const char* name, long rows, long len, void (*kern)(K...), dim3 grid, int block, int C,
         int ncl, int smem, A... args) {
  cudaFuncAttributes fa;
  CK(cudaFuncGetAttributes(&fa, kern));
  int bps = 0;  // blocks per SM
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, kern, block, smem));
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = config(grid, block, C, &attr, smem);
  CK(cudaMemset(Y, 0xff, rows * len * 2));  // bf16 NaN: a row not written fails the check
  CK(cudaLaunchKernelEx(&cfg, kern, args...));
  CK(cudaDeviceSynchronize());
  double ea, er;
  check(rows, len, &ea, &er);
  const float t = timeit([&] { cudaLaunchKernelEx(&cfg, kern, args...); });
  printf("%5ldx%-6ld %-12s C %2d block %4d regs %3d lmem %2d blk/SM %d | %7.1f us %5.1f%% | "
         "err abs %.1e rel %.1e %s",
         rows, len, name, C, block, fa.numRegs, (int)fa.localSizeBytes, bps, t,
         100 * rows * len * 4.0 / t / copy_bps, ea, er, er < 1e-2 ? "ok" : "FAIL");
  if (ncl > 0) {
    const long rounds = (rows + ncl - 1) / ncl;
    printf(" | %d clusters, %ld rounds, %.0f%% filled", ncl, rounds, 100.0 * rows / (rounds * ncl));
  }
  printf("\n");
}

template <int BLOCK, bool ONLINE, bool RECOMP, bool MB>
void persist(const char* name, long rows, long len) {
  auto kern = k_persist<BLOCK, ONLINE, RECOMP, MB>;
  const int C = (int)(len / (BLOCK * EPT));
  CK(cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = config(dim3(C), BLOCK, C, &attr);
  int n = 0;  // clusters that fit at once
  CK(cudaOccupancyMaxActiveClusters(&n, kern, &cfg));
  if (n == 0) { printf("%5ldx%-6ld %-12s C %2d: no cluster fits\n", rows, len, name, C); return; }
  n = (int)std::min<long>(n, rows);
  run(name, rows, len, kern, dim3(n * C), BLOCK, C, n, 0, (const uint4*)X, (uint4*)Y, (int)rows,
      (int)(len / 8), kScale * 1.4426950408889634f);
}

template <int BLOCK>
void base(const char* name, long rows, long len) {
  const int C = (int)(len / (BLOCK * EPT));
  CK(cudaFuncSetAttribute(k_base<BLOCK>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  run(name, rows, len, k_base<BLOCK>, dim3(C, rows), BLOCK, C, 0, 0, (const uint4*)X, (uint4*)Y,
      (int)(len / 8), kScale * 1.4426950408889634f);
}

void fixed(const char* name, long rows, long len) {
  const int C = (int)(len / kShare);
  run(name, rows, len, k_fixed, dim3(C, rows), 512, C, 0, 0, (const uint4*)X, (uint4*)Y,
      kScale * 1.4426950408889634f);
}

// smem: the share (64 KB), or more to hold the kernel to fewer blocks an SM.
template <int B, int CH, int SH = kShare, bool CP = false>
void bulk(const char* name, long rows, long len, int smem = SH * 2) {
  auto kern = k_bulk<B, CH, SH, CP>;
  const int C = (int)(len / SH);
  if (C > kMaxC) return;
  CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CK(cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  run(name, rows, len, kern, dim3(C, rows), B, C, 0, smem, (const uint4*)X, (uint4*)Y,
      kScale * 1.4426950408889634f);
}

int main(int argc, char** argv) {
  const char* want = argc > 1 ? argv[1] : "abcdef";
  auto on = [&](char v) { return strchr(want, v) != nullptr; };
  const long nel = 128L << 20, nbytes = nel * 2;  // 256 MiB: the largest shape
  CK(cudaMalloc(&X, nbytes));
  CK(cudaMalloc(&Y, nbytes));
  CK(cudaMalloc(&fl, fln * 4));
  // x: multiples of 1/1024 in [-8, 8), and one element in 65536 set to 16 so that the
  // blocks of a row see different maxima (the cross-block rescaling is exercised).
  hx.resize(nel);
  for (long i = 0; i < nel; ++i) {
    uint64_t z = (uint64_t)i * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float f = (z & 0xffff) == 0 ? 16.f : (float)((z >> 16) % 16384) / 1024.f - 8.f;
    uint32_t u;
    memcpy(&u, &f, 4);
    hx[i] = u >> 16;  // truncated to bf16: the reference reads these same bits
  }
  CK(cudaMemcpy(X, hx.data(), nbytes, cudaMemcpyHostToDevice));
  const float tm = timeit([&] { cudaMemcpyAsync(Y, X, nbytes, cudaMemcpyDeviceToDevice); });
  copy_bps = 2.0 * nbytes / tm;
  printf("copy %.1f us %.0f GB/s\n", tm, copy_bps / 1e3);

  const long shapes[][2] = {{4096, 32768}, {2048, 65536}, {1024, 131072}, {256, 262144}};
  for (auto& s : shapes) {
    const long rows = s[0], len = s[1];
    if (on('f')) fixed("f fixed", rows, len);
    if (on('g')) {  // session 23 call 3: the library's candidates
      bulk<256, 4>("e bulk 4", rows, len);
      bulk<256, 4, kShare, true>("g cp 4", rows, len);
      bulk<256, 2, kShare / 2>("e half 2", rows, len);
      bulk<256, 2, kShare / 2, true>("g half cp 2", rows, len);
    }
    if (on('e')) {
      bulk<256, 1>("e bulk 1", rows, len);
      bulk<256, 4>("e bulk 4", rows, len);
      bulk<256, 8>("e bulk 8", rows, len);
      bulk<512, 4>("e bulk 4", rows, len);
      bulk<256, 4>("e2 bulk 4", rows, len, 100 << 10);
      bulk<256, 2, kShare / 2>("e half 2", rows, len);
      bulk<128, 2, kShare / 2>("e half 2", rows, len);
    }
    if (on('f')) fixed("f fixed", rows, len);  // again: the order's effect
    if (len == 65536) continue;  // a-d: the session-5 shapes
    if (on('a')) base<512>("a base", rows, len);
    if (on('b')) base<1024>("b base", rows, len);
    if (!on('c') && !on('d')) continue;
    persist<512, false, false, false>("c keep bar", rows, len);
    persist<512, false, false, true>("c keep mbar", rows, len);
    persist<512, false, true, false>("c recmp bar", rows, len);
    persist<512, false, true, true>("c recmp mbar", rows, len);
    persist<1024, false, true, false>("c recmp bar", rows, len);
    persist<1024, false, true, true>("c recmp mbar", rows, len);
    persist<512, true, false, false>("d keep bar", rows, len);
    persist<512, true, false, true>("d keep mbar", rows, len);
    persist<512, true, true, false>("d recmp bar", rows, len);
    persist<512, true, true, true>("d recmp mbar", rows, len);
    persist<1024, true, true, false>("d recmp bar", rows, len);
    persist<1024, true, true, true>("d recmp mbar", rows, len);
  }
  CK(cudaGetLastError());
}
