// softmax / log_softmax on CUDA, forward and backward, for any row length.
//
// Every kernel sees [rows, len] row-major with the softmax dim last (common/softmax.h moves
// another dim there). ONE kernel template, row_kernel, serves all four ops and all row
// lengths; what changes is the op (Fwd / Bwd, below; softmax or log_softmax is a runtime
// flag, uniform per launch, so each is one instantiation) and how many threads share a row,
// chosen by plan() from the row length:
//
//   len <= 32 * E          a (sub-)warp of g <= 32 threads per row, 128/g rows per block,
//                          shuffle reductions                       (E = elements/thread)
//   len <= 512 * E         a block per row, 128 or 512 threads (the smaller that holds it),
//                          CUB reduction
//   len <= 1024 * E        a block of 1024 threads per row
//   len <= 16 * 1024 * E   sm_90: the row split over the C <= 16 blocks (1024 threads) of
//                          a thread-block cluster, each block reducing its share and the C
//                          partial results combined through distributed shared memory
//                          — opt-in, FUSED_SOFTMAX_CLUSTER=1: measured slower than the
//                          tiled path below (H200 bf16 1024x131072 fwd 28% vs 46% of copy)
//   otherwise              (or no clusters) a block of 1024 threads per row walking the
//                          row in tiles twice: pass 1 an online max-and-sum, pass 2 reads
//                          again and writes
//
// E is 32 for the forward (x in registers as floats) and 16 for the backward (dy and y).
// In all but the last case each thread holds its whole share of the row in registers: the
// row is read once and written once. Forward: each thread reduces its share to a running
// (max, sum of exp(v - max)) pair with one exp per element and keeps exp(v - its max);
// one reduction of pairs gives the row's (M, S), and y = e * exp(its max - M) / S. So one
// exp per element and one reduction per row, fused with the scale and the causal mask:
// masked keys are never read, only written (y = 0). Backward: one sum per row,
// sum(dy * y) (softmax) or sum(dy) (log_softmax), then dx.
//
// Loads/stores are 16-byte vectors when the pointers and the row length allow (VEC = 16 /
// sizeof(T)), scalar otherwise (VEC = 1: odd lengths, offset views). Indices are int64.
// Bytes: forward reads x and writes y; backward reads dy and y and writes dx
// (benchmarks/KERNEL_LOG.md has the rooflines).
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cooperative_groups.h>
#include <cub/block/block_reduce.cuh>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "common/checks.h"
#include "common/dispatch.h"
#include "common/launch.cuh"
#include "common/softmax.h"
#include "common/vec.cuh"

namespace fused {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------------------
// Row statistics

// Max and sum of exp(v - max) over part of a row. If the part has no finite max (all -inf,
// or empty), s is taken relative to 0 instead: it is then 0, or NaN if a NaN was seen.
// So NaN and +inf propagate into s (and from there to the whole row), as in torch.
struct MaxSum {
  float m, s;
};

__device__ __forceinline__ float exp_offset(float m) { return m == kNegInf ? 0.f : m; }

// (M, S) of the union: the part with the larger max keeps its sum, the other one's is
// rescaled (one exp). Symmetric, so butterfly shuffles give every lane the same result.
// lo.m = -inf: lo.s is 0 or NaN, and exp(-inf - o) = 0 keeps it 0 or NaN; both +inf:
// exp(inf - inf) = NaN, as torch gives for a row holding +inf.
struct CombineMaxSum {
  __device__ __forceinline__ MaxSum operator()(const MaxSum& a, const MaxSum& b) const {
    // By value: a reference chosen by a condition needs the pair's address (a stack slot).
    const bool a_hi = a.m >= b.m;
    const MaxSum hi = a_hi ? a : b;
    const MaxSum lo = a_hi ? b : a;
    return {hi.m, hi.s + lo.s * expf(lo.m - exp_offset(hi.m))};
  }
};

struct CombineSum {
  template <typename F>
  __device__ __forceinline__ F operator()(F a, F b) const { return a + b; }
};

__device__ __forceinline__ float shfl_xor(float v, int o) {
  return __shfl_xor_sync(0xffffffffu, v, o);
}
__device__ __forceinline__ double shfl_xor(double v, int o) {
  return __shfl_xor_sync(0xffffffffu, v, o);
}
__device__ __forceinline__ MaxSum shfl_xor(MaxSum v, int o) {
  return {shfl_xor(v.m, o), shfl_xor(v.s, o)};
}

// ---------------------------------------------------------------------------------------
// The ops. Each one says how its inputs load, what a thread's part of a row reduces to
// (partial), how those parts combine, and how a thread turns its registers into outputs
// once the row's total is known (finish). v[i][k][e] is input i, vector k, element e.

// Forward: y = softmax(scale * x) (log: log_softmax). Masked / missing entries are -inf.
struct Fwd {
  static constexpr int kIn = 1;
  static constexpr int kMaxElems = 32;  // per thread: 32 float registers for x
  static constexpr float kFill = kNegInf;
  using State = MaxSum;
  using Combine = CombineMaxSum;
  float scale;
  bool log;

  __device__ __forceinline__ float load(int /*input*/, float x) const { return x * scale; }

  // Softmax keeps e = exp(v - m) in v (m: this thread's max); log_softmax keeps v.
  template <int NV, int VEC>
  __device__ __forceinline__ MaxSum partial(float (&v)[kIn][NV][VEC], int nv) const {
    float m = kNegInf;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      if (k < nv) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) m = fmaxf(m, v[0][k][e]);
      }
    }
    const float o = exp_offset(m);
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      if (k < nv) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const float p = expf(v[0][k][e] - o);
          s += p;
          if (!log) v[0][k][e] = p;
        }
      }
    }
    return {m, s};
  }

  template <int NV, int VEC>
  __device__ __forceinline__ void finish(float (&v)[kIn][NV][VEC], int nv, MaxSum mine,
                                         MaxSum row) const {
    // softmax: exp(v - M) / S = e * exp(m - M) / S. A thread with m = -inf holds e = 0
    // and gets 0 (or NaN if the whole row is -inf, as torch gives).
    // log_softmax: (v - M) - log S, in that order: v - M is exact near the max.
    if (log) {
      const float f = logf(row.s);
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        if (k < nv) {
#pragma unroll
          for (int e = 0; e < VEC; ++e) v[0][k][e] = (v[0][k][e] - row.m) - f;
        }
      }
    } else {
      const float f = expf(mine.m - row.m) / row.s;
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        if (k < nv) {
#pragma unroll
          for (int e = 0; e < VEC; ++e) v[0][k][e] *= f;
        }
      }
    }
  }
};

// Backward from the forward's output y: softmax dx = scale * y * (dy - sum(dy * y)),
// log_softmax dx = dy - exp(y) * sum(dy). Missing entries, and causal-masked ones (y = 0
// there, so they are not read), are 0 and give dx = 0. v[0] = dy, v[1] = y.
//
// For float32 the row sum is accumulated in double (Acc). sum(dy) cancels (terms of both
// signs, |sum| ~ sqrt(len) while the partial sums run larger), and a float accumulation
// errs by ~1e-7 of the partial sums: after the multiplication by exp(y), up to ~1 that is
// ~1e-6 absolute in dx where dx itself is near 0, past float32 accuracy (GPU run 1 failed
// fp32 log_softmax backward at 1e-5 / 1e-6 for rows >= 255). sum(dy * y) is milder
// (y <= 1, sum y = 1) but cancels the same way for large dy of both signs. For 16-bit
// inputs float accumulation is ~1e4 times finer than the output's rounding, and the
// per-element double conversion cost the bf16 backward a third of its bandwidth (GPU run 3:
// 16384x4096 fwd+bwd 52% -> 37% of copy), so Acc is float there.
template <typename Acc>
struct Bwd {
  static constexpr int kIn = 2;
  static constexpr int kMaxElems = 16;  // per thread: 2 x 16 float registers
  static constexpr float kFill = 0.f;
  using State = Acc;
  using Combine = CombineSum;
  float scale;
  bool log;

  __device__ __forceinline__ float load(int /*input*/, float x) const { return x; }

  template <int NV, int VEC>
  __device__ __forceinline__ Acc partial(float (&v)[kIn][NV][VEC], int nv) const {
    Acc s = 0;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      if (k < nv) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          // dy * y rounded once in float (relative 6e-8 per term, no cancellation there)
          s += static_cast<Acc>(log ? v[0][k][e] : v[0][k][e] * v[1][k][e]);
        }
      }
    }
    return s;
  }

  template <int NV, int VEC>
  __device__ __forceinline__ void finish(float (&v)[kIn][NV][VEC], int nv, Acc /*mine*/,
                                         Acc row_sum) const {
    const float row = static_cast<float>(row_sum);
    if (log) {
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        if (k < nv) {
#pragma unroll
          for (int e = 0; e < VEC; ++e) v[0][k][e] -= expf(v[1][k][e]) * row;
        }
      }
    } else {
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        if (k < nv) {
#pragma unroll
          for (int e = 0; e < VEC; ++e) v[0][k][e] = scale * v[1][k][e] * (v[0][k][e] - row);
        }
      }
    }
  }
};

// ---------------------------------------------------------------------------------------
// The kernel

template <typename T>
struct RowArgs {
  const T* in[2];    // forward: x; backward: grad_out, y
  T* out;
  int64_t rows, len;
  int64_t chunk;     // columns per block: len, or one block's share of a cluster's row
  int64_t causal_q;  // 0: no mask; else Lq: row r is query r % Lq, keys j > r % Lq masked
  int group;         // threads per row: 1..32 (warp mode) or the block size
  int nv;            // vectors per thread per tile (<= NV)
  int ntiles;        // tiles per chunk; 1 keeps the chunk in registers
  int cluster;       // blocks per row (a cluster on sm_90), else 1
};

// Reduces a thread's State over the threads (and cluster blocks) of its row; every thread
// gets the total. Warp mode: xor shuffles within aligned groups of g lanes (all lanes give
// the same result). Block mode: CUB, broadcast through shared memory; in a cluster each
// block publishes its result in its shared memory and reads all C of them, in rank order,
// so every block gets the same total. The two slots alternate between rows (`parity`):
// a slot is rewritten only after the barrier of the next row, when every reader is done.
template <bool WARP, int BLOCK, typename State, typename Combine>
__device__ __forceinline__ State reduce_row(State v, int g, int cluster, int parity) {
  Combine op;
  if constexpr (WARP) {
    for (int o = g / 2; o > 0; o >>= 1) v = op(v, shfl_xor(v, o));
    return v;
  } else {
    using Reduce = cub::BlockReduce<State, BLOCK>;
    __shared__ typename Reduce::TempStorage tmp;
    __shared__ State slot[2];
    const State r = Reduce(tmp).Reduce(v, op);
    if (threadIdx.x == 0) slot[parity] = r;
    if (cluster == 1) {
      __syncthreads();
      return slot[parity];
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    cl.sync();
    State acc = *cl.map_shared_rank(&slot[parity], 0);
    for (int i = 1; i < cluster; ++i) acc = op(acc, *cl.map_shared_rank(&slot[parity], i));
    return acc;
#else
    __trap();  // the host launches clusters only on sm_90 code (cluster_ok)
    return r;
#endif
  }
}

// One row (or one block's share of it) per group of g threads. Thread `lane` of the group
// owns, in tile t, the vectors at columns begin + t * span + (k * g + lane) * VEC, k < nv.
// WARP: BLOCK = 128 threads, g = args.group <= 32, 128 / g rows per block.
// Otherwise: g = BLOCK threads per row, one row per block (per cluster when cluster > 1).
// Registers: 512-thread vector kernels are held to 64 so that two blocks share an SM (one
// block's reduction and stores overlap the other's loads); uncapped they take 80-83 and
// one fits. Capped, bf16 spills 0-8 bytes, float32 8-44. Elsewhere a cap spills more
// (scalar warp kernels: 100-370 bytes) than the occupancy it buys.
template <typename T, typename Op, int VEC, int NV, int BLOCK, bool WARP>
__global__ void __launch_bounds__(BLOCK, BLOCK == 512 && VEC > 1 ? 2 : 1)
    row_kernel(RowArgs<T> a, Op op) {
  using State = typename Op::State;
  using Combine = typename Op::Combine;
  constexpr int kIn = Op::kIn;

  const int g = WARP ? a.group : BLOCK;
  const int lane = threadIdx.x % g;
  const int rows_per_block = BLOCK / g;
  const int rank = blockIdx.x % a.cluster;  // = the cluster block rank (cluster dims (C,1,1))
  const int64_t begin = rank * a.chunk;
  const int64_t end = std::min(a.len, begin + a.chunk);
  const int64_t span = static_cast<int64_t>(g) * a.nv * VEC;  // columns per tile
  const int64_t row_blocks = (a.rows + rows_per_block - 1) / rows_per_block;
  const int64_t step = gridDim.x / a.cluster;

  int parity = 0;
  // Uniform trip count for all threads of a block and all blocks of a cluster: the
  // reductions inside are collective.
  for (int64_t rb = blockIdx.x / a.cluster; rb < row_blocks; rb += step, parity ^= 1) {
    const int64_t r = rb * rows_per_block + threadIdx.x / g;
    const bool active = r < a.rows;  // warp mode: idle groups still shuffle along
    const int64_t row = active ? r : 0;
    // Columns in [limit, end) are masked or idle: not read, filled with Op::kFill.
    const int64_t limit = !active ? begin
                          : a.causal_q > 0 ? std::min(end, row % a.causal_q + 1)
                                           : end;
    const T* in[kIn];
#pragma unroll
    for (int i = 0; i < kIn; ++i) in[i] = a.in[i] + row * a.len;
    T* out = a.out + row * a.len;

    float v[kIn][NV][VEC];
    // Thread columns in tile t: c0 + k * stride + [0, VEC), c0 = begin + t * span +
    // lane * VEC.
    // Bounds are compared in 32 bits against what is left of the row after c0 (clamped),
    // so no 64-bit index or pointer is kept per vector (registers).
    const int stride = g * VEC;
    auto left = [&](int64_t bound, int64_t c0) {
      return static_cast<int>(std::min<int64_t>(std::max<int64_t>(bound - c0, 0), 1 << 30));
    };
    // Two phases: first every load of the tile is issued (raw, predicated, no use in
    // between), then they are converted. A conversion next to its load would make the
    // thread wait for each 16-byte load before issuing the next: one load in flight per
    // thread, ~16 KB per SM, half of what the copy bandwidth needs (GPU run 2: 30-54%).
    auto load_tile = [&](int t) {
      const int64_t c0 = begin + t * span + static_cast<int64_t>(lane) * VEC;
      const int avail = left(limit, c0);  // columns of c0.. to read (causal limit, idle)
      const T* p[kIn];
#pragma unroll
      for (int i = 0; i < kIn; ++i) p[i] = in[i] + c0;
      // Raw bits (uint4 for a 16-byte vector), zeroed, then loaded under a predicate:
      // a vector of 16-bit T merged with "not loaded" would be unpacked at the load.
      // At most kGroup vectors (64 bytes of all inputs) per phase: enough in flight, and
      // float32 (8 vectors forward) keeps its registers.
      using Raw = std::conditional_t<sizeof(Vec<T, VEC>) == 16, uint4, Vec<T, VEC>>;
      constexpr int kBytes = static_cast<int>(kIn * sizeof(Raw));
      constexpr int kGroup = 64 / kBytes < 1 ? 1 : 64 / kBytes < NV ? 64 / kBytes : NV;
#pragma unroll
      for (int k0 = 0; k0 < NV; k0 += kGroup) {
        Raw raw_bits[kIn][kGroup];
#pragma unroll
        for (int j = 0; j < kGroup; ++j) {
          const int k = k0 + j;
#pragma unroll
          for (int i = 0; i < kIn; ++i) {
            raw_bits[i][j] = Raw{};
            // A vector straddling the causal limit is still inside the row: read it whole.
            if (k < NV && k < a.nv && k * stride < avail) {
              raw_bits[i][j] = *reinterpret_cast<const Raw*>(p[i] + k * stride);
            }
          }
        }
#pragma unroll
        for (int j = 0; j < kGroup; ++j) {
          const int k = k0 + j;
          if (k < NV && k < a.nv) {
            const int off = k * stride;
            Vec<T, VEC> raw[kIn];
#pragma unroll
            for (int i = 0; i < kIn; ++i) memcpy(&raw[i], &raw_bits[i][j], sizeof(Raw));
            if (off + VEC <= avail) {  // the common case: a whole vector
#pragma unroll
              for (int i = 0; i < kIn; ++i) {
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                  v[i][k][e] = op.load(i, static_cast<float>(raw[i].v[e]));
                }
              }
            } else {  // straddles the causal limit, or idle / masked: filled
#pragma unroll
              for (int i = 0; i < kIn; ++i) {
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                  v[i][k][e] = off + e < avail ? op.load(i, static_cast<float>(raw[i].v[e]))
                                               : Op::kFill;
                }
              }
            }
          }
        }
      }
    };
    auto store_tile = [&](int t) {
      const int64_t c0 = begin + t * span + static_cast<int64_t>(lane) * VEC;
      const int avail = active ? left(end, c0) : 0;
      T* p = out + c0;
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        if (k < a.nv && k * stride < avail) {
          Vec<T, VEC> r;
#pragma unroll
          for (int e = 0; e < VEC; ++e) r.v[e] = static_cast<T>(v[0][k][e]);
          store_vec<T, VEC>(p + k * stride, r);
        }
      }
    };

    // Pass 1: this thread's part of the row. With one tile the registers keep it.
    State mine{}, last{};
    for (int t = 0; t < a.ntiles; ++t) {
      load_tile(t);
      last = op.partial(v, a.nv);
      mine = t == 0 ? last : Combine()(mine, last);
    }
    const State total = reduce_row<WARP, BLOCK, State, Combine>(mine, g, a.cluster, parity);
    // Pass 2, last tile first: it is still in registers (and the next ones likely in L2).
    for (int t = a.ntiles - 1; t >= 0; --t) {
      if (t != a.ntiles - 1) {
        load_tile(t);
        last = op.partial(v, a.nv);
      }
      op.finish(v, a.nv, last, total);
      store_tile(t);
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // No block may exit while the others of its cluster still read its shared memory.
  if (a.cluster > 1) cooperative_groups::this_cluster().sync();
#endif
}

// ---------------------------------------------------------------------------------------
// Host: choosing the strategy and launching

// kWarpSmall / kWarp: 128-thread blocks, `group` (<= 32) threads per row, NV = 1 or E/VEC.
// kBlock: one row (share) per block of `group` threads (128, 512 or 1024).
enum class Mode { kWarpSmall, kWarp, kBlock };

struct Plan {
  Mode mode;
  int group, nv, ntiles, cluster;
  int64_t chunk;
};

int next_pow2(int64_t n) {
  int p = 1;
  while (p < n) p <<= 1;
  return p;
}

cudaLaunchAttribute cluster_attr(int cluster) {
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = cluster;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  return attr;
}

// Whether `kernel` can run here as clusters of `cluster` blocks of `block` threads: the
// GPU is sm_90+, the kernel's code was compiled for sm_90 (not the 8.0 pass or its PTX
// JIT-compiled for a newer GPU), and enough such clusters fit at once to cover half the
// SMs (a 16-block cluster needs 16 free SMs of one GPC). Cached per device, kernel and
// cluster size. Clusters are off unless FUSED_SOFTMAX_CLUSTER=1: on an H200 the tiled
// one-block-per-row path measured faster at every length that would use them (bf16,
// % of copy, fwd / fwd+bwd: 4096x32768 42 / 38 with clusters, 42 / 47 without;
// 1024x131072 28 / 29 vs 46 / 45; 256x262144 26 / 24 vs 44 / 42; KERNEL_LOG.md).
template <typename Kernel>
bool cluster_ok(Kernel kernel, int block, int cluster) {
  static const bool disabled = [] {
    const char* e = std::getenv("FUSED_SOFTMAX_CLUSTER");
    return e == nullptr || e[0] != '1';
  }();
  if (disabled) return false;
  static std::mutex mutex;
  static std::map<std::tuple<int, const void*, int>, bool> cache;
  const auto key = std::make_tuple(static_cast<int>(c10::cuda::current_device()),
                                   reinterpret_cast<const void*>(kernel), cluster);
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;

  bool ok = at::cuda::getCurrentDeviceProperties()->major >= 9;
  cudaFuncAttributes fattr;
  if (ok) ok = cudaFuncGetAttributes(&fattr, kernel) == cudaSuccess;
  if (ok) {
    // The virtual arch the running code was compiled for: PTX JIT-compiled here reports
    // its PTX version; a SASS-only build may report 0, and then its SASS arch is it.
    const int arch = fattr.ptxVersion > 0 ? fattr.ptxVersion : fattr.binaryVersion;
    ok = arch >= 90;
  }
  if (ok && cluster > 8) {
    ok = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) ==
         cudaSuccess;
  }
  if (ok) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(cluster);
    cfg.blockDim = dim3(block);
    cudaLaunchAttribute attr = cluster_attr(cluster);
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int active = 0;
    ok = cudaOccupancyMaxActiveClusters(&active, kernel, &cfg) == cudaSuccess &&
         active * cluster >= num_sms() / 2;
  }
  (void)cudaGetLastError();  // a failed query above is an answer, not an error to keep
  cache.emplace(key, ok);
  return ok;
}

// Launches kernel over `row_blocks` groups of a.cluster blocks of `block` threads (as
// thread-block clusters when a.cluster > 1). Returns false, launching nothing, if that
// cluster cannot run here.
template <typename Kernel, typename Args, typename Op>
bool launch(Kernel kernel, int64_t row_blocks, int block, const Args& a, const Op& op) {
  const int64_t max_groups = std::numeric_limits<int>::max() / a.cluster;
  const unsigned grid =
      static_cast<unsigned>(std::min<int64_t>(row_blocks, max_groups) * a.cluster);
  if (a.cluster == 1) {
    kernel<<<grid, block, 0, current_stream()>>>(a, op);
    FUSED_LAUNCH_CHECK();
    return true;
  }
  if (!cluster_ok(kernel, block, a.cluster)) return false;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(block);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = current_stream();
  cudaLaunchAttribute attr = cluster_attr(a.cluster);
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, a, op));
  return true;
}

// Threads per row and elements per thread for a row of `len`, E = Op::kMaxElems per thread.
Plan plan(int64_t len, int E, int VEC) {
  auto vectors = [&](int64_t cols, int threads) {
    return static_cast<int>((cols + static_cast<int64_t>(threads) * VEC - 1) /
                            (static_cast<int64_t>(threads) * VEC));
  };
  if (len <= 32 * VEC) {
    // At most one vector per thread: the smallest power-of-two group that covers the row.
    return {Mode::kWarpSmall, next_pow2((len + VEC - 1) / VEC), 1, 1, 1, len};
  }
  if (len <= 32 * E) return {Mode::kWarp, 32, vectors(len, 32), 1, 1, len};
  // The smaller of two blocks that holds the row: 128 threads up to 128 * E, else 512
  // (at least a quarter of the registers used). Each block size is one more kernel per
  // dtype, op and vector width, so build time keeps the list short.
  for (int block : {128, 512}) {
    if (len <= block * E) return {Mode::kBlock, block, vectors(len, block), 1, 1, len};
  }
  // Longer rows: 1024-thread blocks, one per row up to 1024 * E, else a cluster of C <= 16
  // of them (C > 8 is a non-portable size, used only if enough such clusters fit). Not
  // 512-thread cluster blocks: with every load of a thread in flight they take 80-83
  // registers, one block per SM (32 KB in flight, a cluster barrier per row), where a
  // 1024-thread block at 64 registers keeps 64 KB in flight. launch_rows falls back to
  // fallback_plan when the cluster cannot run.
  {
    const int64_t per_block = 1024 * static_cast<int64_t>(E);
    const int64_t c = (len + per_block - 1) / per_block;
    if (c <= 16) {
      // Even shares, a whole number of vectors each.
      int64_t chunk = (len + c - 1) / c;
      chunk = (chunk + VEC - 1) / VEC * VEC;
      return {Mode::kBlock, 1024, vectors(chunk, 1024), 1, static_cast<int>(c), chunk};
    }
  }
  return {Mode::kBlock, 1024, E / VEC, 1, 0, len};  // cluster 0: no cluster plan
}

// Without clusters: a 1024-thread block per row, the row in registers if it fits, else
// streamed in tiles of 1024 * E (two passes).
Plan fallback_plan(int64_t len, int E, int VEC) {
  const int64_t tile = 1024 * static_cast<int64_t>(E);
  if (len <= tile) {
    return {Mode::kBlock, 1024, static_cast<int>((len + 1024 * VEC - 1) / (1024 * VEC)), 1, 1,
            len};
  }
  return {Mode::kBlock, 1024, E / VEC, static_cast<int>((len + tile - 1) / tile), 1, len};
}

template <typename T, typename Op, int VEC>
void launch_rows(RowArgs<T> a, const Op& op) {
  constexpr int E = Op::kMaxElems;
  constexpr int NV = E / VEC;
  Plan p = plan(a.len, E, VEC);
  if (p.cluster == 0) p = fallback_plan(a.len, E, VEC);
  for (int attempt = 0; attempt < 2; ++attempt) {
    a.group = p.group;
    a.nv = p.nv;
    a.ntiles = p.ntiles;
    a.cluster = p.cluster;
    a.chunk = p.chunk;
    const int rows_per_block = p.mode == Mode::kBlock ? 1 : 128 / p.group;
    const int64_t row_blocks = (a.rows + rows_per_block - 1) / rows_per_block;
    bool ok = false;
    // -1: warp-small, 0: warp, else the block size.
    switch (p.mode == Mode::kWarpSmall ? -1 : p.mode == Mode::kWarp ? 0 : p.group) {
      case -1: ok = launch(row_kernel<T, Op, VEC, 1, 128, true>, row_blocks, 128, a, op); break;
      case 0: ok = launch(row_kernel<T, Op, VEC, NV, 128, true>, row_blocks, 128, a, op); break;
      case 128: ok = launch(row_kernel<T, Op, VEC, NV, 128, false>, row_blocks, 128, a, op); break;
      case 512: ok = launch(row_kernel<T, Op, VEC, NV, 512, false>, row_blocks, 512, a, op); break;
      case 1024:
        ok = launch(row_kernel<T, Op, VEC, NV, 1024, false>, row_blocks, 1024, a, op);
        break;
    }
    if (ok) return;
    p = fallback_plan(a.len, E, VEC);  // the cluster cannot run here
  }
  TORCH_CHECK(false, "fused softmax: internal error, no launch configuration for a row of ",
              a.len);
}

template <typename T, typename Op>
void run(const T* in0, const T* in1, T* out, int64_t rows, int64_t len, int64_t causal_q,
         const Op& op) {
  RowArgs<T> a{{in0, in1}, out, rows, len, len, causal_q, 1, 1, 1, 1};
  constexpr int V = kVecElems<T>;
  const bool vec = len % V == 0 && is_aligned(in0) && (in1 == nullptr || is_aligned(in1)) &&
                   is_aligned(out);
  if (vec) {
    launch_rows<T, Op, V>(a, op);
  } else {
    launch_rows<T, Op, 1>(a, op);
  }
}

template <bool LOG>
at::Tensor forward_cuda(const at::Tensor& x, int64_t dim, double scale, bool causal,
                        const char* op) {
  check_float(x, op, "x");
  const int64_t d = softmax_wrap_dim(dim, x.dim(), op);
  if (causal) softmax_check_causal(x, d, dim, op);
  c10::cuda::CUDAGuard guard(x.device());
  SoftmaxRows rv = softmax_rows(x, d);
  at::Tensor y = at::empty(rv.t.sizes(), rv.t.options());
  const int64_t causal_q = causal ? x.size(-2) : 0;
  if (y.numel() > 0) {
    FUSED_DISPATCH_CUDA(x.scalar_type(), "fused::softmax", [&] {
      run<scalar_t>(rv.t.const_data_ptr<scalar_t>(), nullptr, y.mutable_data_ptr<scalar_t>(),
                    rv.rows, rv.len, causal_q, Fwd{static_cast<float>(scale), LOG});
    });
  }
  return softmax_restore(y, x, d);
}

template <bool LOG>
at::Tensor backward_cuda(const at::Tensor& grad_out, const at::Tensor& y, int64_t dim,
                         double scale, bool causal, const char* op) {
  check_float(y, op, "y");
  check_same_device(grad_out, y, op, "grad_out", "y");
  check_same_dtype(grad_out, y, op, "grad_out", "y");
  check_same_shape(grad_out, y, op, "grad_out", "y");
  const int64_t d = softmax_wrap_dim(dim, y.dim(), op);
  if (causal) softmax_check_causal(y, d, dim, op);
  c10::cuda::CUDAGuard guard(y.device());
  SoftmaxRows yv = softmax_rows(y, d);
  SoftmaxRows gv = softmax_rows(grad_out, d);
  at::Tensor dx = at::empty(yv.t.sizes(), yv.t.options());
  if (dx.numel() > 0) {
    FUSED_DISPATCH_CUDA(y.scalar_type(), "fused::softmax_backward", [&] {
      run<scalar_t>(gv.t.const_data_ptr<scalar_t>(), yv.t.const_data_ptr<scalar_t>(),
                    dx.mutable_data_ptr<scalar_t>(), yv.rows, yv.len,
                    causal ? y.size(-2) : 0,
                    Bwd<std::conditional_t<std::is_same_v<scalar_t, float>, double, float>>{
                        static_cast<float>(scale), LOG});
    });
  }
  return softmax_restore(dx, y, d);
}

at::Tensor softmax_cuda(const at::Tensor& x, int64_t dim, double scale, bool causal) {
  return forward_cuda<false>(x, dim, scale, causal, "fused::softmax");
}

at::Tensor log_softmax_cuda(const at::Tensor& x, int64_t dim) {
  return forward_cuda<true>(x, dim, 1.0, false, "fused::log_softmax");
}

at::Tensor softmax_backward_cuda(const at::Tensor& grad_out, const at::Tensor& y, int64_t dim,
                                 double scale, bool causal) {
  return backward_cuda<false>(grad_out, y, dim, scale, causal, "fused::softmax_backward");
}

at::Tensor log_softmax_backward_cuda(const at::Tensor& grad_out, const at::Tensor& y,
                                     int64_t dim) {
  return backward_cuda<true>(grad_out, y, dim, 1.0, false, "fused::log_softmax_backward");
}

}  // namespace

TORCH_LIBRARY_IMPL(fused, CUDA, m) {
  m.impl("softmax", &softmax_cuda);
  m.impl("log_softmax", &log_softmax_cuda);
  m.impl("softmax_backward", &softmax_backward_cuda);
  m.impl("log_softmax_backward", &log_softmax_backward_cuda);
}

}  // namespace fused
