// softmax / log_softmax on CUDA, forward and backward, for any row length.
//
// Every kernel sees [rows, len] row-major with the softmax dim last (common/softmax.h moves
// another dim there). ONE kernel template, softmax_kernel, serves all four ops (Fwd / Bwd
// below; softmax or log_softmax is a runtime flag, uniform per launch) and all row lengths.
// Each thread holds P 16-byte vectors of its row in registers (P * VEC elements), loaded
// all at once before any use, so that P * 16 bytes per thread are in flight. A row belongs
// to a group of `tpr` threads, a power of two:
//
//   tpr <= 64              blocks of max(tpr, 32) threads: a 1-warp block holds one or
//                          more rows (shuffle reductions), a 64-thread row is a block of
//                          its own (one shared-memory step); float32 forward rows of up
//                          to 1024 columns take 8 vectors a thread (a warp a row)
//   tpr = BLOCK            one row per block of 128 / 256 / 512 / 1024 threads, shuffles
//                          then one shared-memory step
//   len > 512 * P * VEC    on sm_90, softmax_cluster_kernel: a thread-block cluster of up
//                          to 16 blocks of 512 threads per row, each block an even share
//                          of it (2P vectors per thread on the 16-byte path past 8
//                          blocks of P); clusters are persistent (as many as fit, walking
//                          rows) and load their next rows while this one is reduced and
//                          its block results exchanged (st.async into every peer's shared
//                          memory, one mbarrier wait): the row is read once. The next
//                          row is prefetched into registers; the wide shape's registers
//                          hold one row only, so there the copy engine stages the next
//                          rows in shared memory (up to 3 in flight).
//   otherwise              one 1024-thread block per row up to 1024 * P * VEC; past that
//                          the row split into chunks of 512 * P * VEC columns, one block
//                          each, in two launches: kPartial writes each chunk's reduction
//                          to a small workspace, kFinish reads the chunk again, combines
//                          the row's partials and writes. x is read twice (3 passes of the
//                          row instead of 2); no block ever waits for another.
//
// Plain forward rows (scale > 0, no mask, 16-byte vectors) of 16385 to 524288 16-bit or
// 8193 to 262144 float32 columns take softmax_fwd_staged instead: the row cut into up to 16
// even shares of at most 64 KB, a 256-thread block each (a cluster of them past one share),
// each share staged in shared memory (three blocks an SM).
//
// The shape is a compile-time choice per launch (P, BLOCK), with bounds checked at run time
// per vector, not per element: the lean code is what reaches the copy bandwidth. A generic
// kernel with runtime tile loops and cluster reductions, which this file held before,
// measured 48-59% of copy where this structure measures 79-93% (KERNEL_LOG.md, v5).
//
// Forward: v = scale * x (-inf past the causal limit), M = max v, S = sum exp(v - M) (two
// reductions), softmax y = exp(v - M) / S, log_softmax y = (v - M) - log S; masked keys
// are not read, only written (y = 0). Backward: one sum per row, sum(dy * y) (softmax) or
// sum(dy) (log_softmax), then dx = scale * y * (dy - sum) or dy - exp(y) * sum.
//
// Loads/stores are 16-byte vectors when the pointers and the row length allow (VEC =
// 16 / sizeof(T)), scalar otherwise (VEC = 1: odd lengths, offset views). Bytes: forward
// reads x and writes y; backward reads dy and y and writes dx (KERNEL_LOG.md has the
// rooflines).
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cooperative_groups.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>

#include "common/checks.h"
#include "common/cluster.cuh"
#include "common/dispatch.h"
#include "common/fast_math.cuh"
#include "common/half_bits.cuh"
#include "common/launch.cuh"
#include "common/reduce.cuh"
#include "common/softmax.h"
#include "common/stage.cuh"
#include "common/vec.cuh"

namespace fused {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kMaxCluster = 16;  // blocks per cluster (over 8: a non-portable size)

// exp(v - o) with o = the max, or 0 when the max is -inf (an all -inf or empty part):
// its sum is then 0 (or NaN if a NaN was seen) instead of exp(-inf + inf) = NaN, so a
// chunk that is all masked contributes nothing. A whole row of -inf still gives NaN, as
// in torch (0 / 0, or log 0 subtracted from -inf).
__device__ __forceinline__ float exp_offset(float m) { return m == kNegInf ? 0.f : m; }

// exp for the per-element work: float32 rows keep the accurate expf; 16-bit rows, whose
// outputs round to 2^-9 (2^-12 fp16) anyway, take ex2.approx.ftz of x log2(e) (2 + 1.2 |x|
// ulp, as __expf, relative < 2e-5 wherever the result is not tiny; results below 2^-126
// flush to 0). expf is ~8 instructions, this 2 (__expf without ftz 4):
// with the bf16 forward at ~4 elements per clock per SM, that is the difference between
// an issue-bound kernel (GPU run 4: 70% of copy at 16384x4096) and a memory-bound one.
template <typename T>
__device__ __forceinline__ float exp_elem(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return expf(x);
  } else {
    return exp2_approx(x * 1.4426950408889634f);  // log2(e)
  }
}

struct MaxSum {
  float m, s;
};

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  template <typename F>
  __device__ __forceinline__ F operator()(F a, F b) const { return a + b; }
};

// All-reduce over the tpr threads of a row group (every thread gets the result). tpr is a
// power of two: <= 32, shuffles within aligned lane groups; else whole warps, one value
// per warp through `buf` (BLOCK / 32 slots; each call site has its own buffer, so no
// second barrier is needed: a kernel reduces one row group once, or, walking rows, uses
// each buffer every second row).
template <int BLOCK>
struct Group {
  int tpr;

  template <typename F, typename Op>
  __device__ __forceinline__ F reduce(F v, F* buf, Op op) const {
    const int width = tpr < 32 ? tpr : 32;
    for (int o = width / 2; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    if constexpr (BLOCK > 32) {
      if (tpr > 32) {
        const int warp = threadIdx.x / 32;
        if (threadIdx.x % 32 == 0) buf[warp] = v;
        __syncthreads();
        // Each lane takes one warp's value and the warp shuffles (a butterfly over the
        // group's warps: identical bits in every lane), instead of a serial sum.
        const int warps = tpr / 32, first = warp & ~(warps - 1);
        v = buf[first + (threadIdx.x & (warps - 1))];
        for (int o = warps / 2; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
      }
    }
    return v;
  }
};

// ---------------------------------------------------------------------------------------
// The ops. The kernel loads a thread's vectors as raw bits, raw[i][k] (input i, vector
// k; zero where not loaded, and zero past the causal limit inside a vector that straddles
// it). An op keeps what it needs in Regs (init), reduces the group's part of the row to a
// State (partial), combines the chunk States of a split row (combine), and gives each
// output element once the row's State is known (coef, then out).

// VEC elements of T as loaded: a uint4 for a 16-byte vector, else T itself.
template <typename T, int VEC>
using Raw = std::conditional_t<VEC == 1, T, uint4>;

template <typename T, int VEC>
__device__ __forceinline__ float raw_elem(const Raw<T, VEC>& r, int e) {
  if constexpr (VEC == 1) {
    return static_cast<float>(r);
  } else {
    Vec<T, VEC> v;
    memcpy(&v, &r, sizeof(v));
    return static_cast<float>(v.v[e]);
  }
}

// Where a thread's vectors are: vector k starts at column c0 + k * stride; columns at and
// past `limit` are masked or missing. live: the vectors worked on (for_live); the kernel
// passes P (a constant: every vector, the ones past the limit masked element by element)
// except in its causal variant, where it passes the vectors that start before the limit.
struct Cols {
  int c0, stride, limit, live;
};

template <int P>
__device__ __forceinline__ int live_vectors(int c0, int stride, int limit) {
  return limit <= c0 ? 0 : std::min(P, (limit - c0 + stride - 1) / stride);
}

// f(k) for the vectors k < live of a thread's P: in the causal variant a row's vectors
// past its limit (half of them, on average) cost the forward no conversions, exps or sums,
// only their stores (KERNEL_LOG softmax v9). When all P are live the loop has no test, and
// with live = P as a constant it is the plain loop.
template <int P, typename F>
__device__ __forceinline__ void for_live(int live, F f) {
  if (live >= P) {
#pragma unroll
    for (int k = 0; k < P; ++k) f(k);
  } else {
#pragma unroll
    for (int k = 0; k < P; ++k) {
      if (k < live) f(k);
    }
  }
}

// Forward: y = softmax(scale * x) (log: log_softmax). Regs: v = scale * x as float, -inf
// where masked or missing (of the live vectors; the others are never touched); softmax
// overwrites v with exp(v - M) in partial.
struct Fwd {
  static constexpr int kIn = 1;
  using State = MaxSum;
  float scale;
  bool log;

  template <typename T, int VEC, int P>
  struct Regs {
    float v[P][VEC];
    int live;  // Cols::live
  };
  struct Coef {
    float o, f;
    bool have_exp;
  };

  template <typename T, int VEC, int P>
  __device__ __forceinline__ void init(Regs<T, VEC, P>& r, const Raw<T, VEC> (&raw)[1][P],
                                       Cols c) const {
    r.live = c.live;
    for_live<P>(r.live, [&](int k) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) r.v[k][e] = raw_elem<T, VEC>(raw[0][k], e) * scale;
    });
    // Vectors ascend in column: if the last one is whole, all are (the common case, no
    // per-element test). Else mask what lies past the limit.
    if (c.c0 + (P - 1) * c.stride + VEC > c.limit) {
      for_live<P>(r.live, [&](int k) {
        const int left = c.limit - (c.c0 + k * c.stride);  // valid elements of vector k
        if (left < VEC) {
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            if (e >= left) r.v[k][e] = kNegInf;
          }
        }
      });
    }
  }

  template <typename T, int VEC, int P, typename G>
  __device__ __forceinline__ MaxSum partial(Regs<T, VEC, P>& r, const G& g, double* buf0,
                                            double* buf1) const {
    float m = kNegInf;
    for_live<P>(r.live, [&](int k) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) m = fmaxf(m, r.v[k][e]);
    });
    m = g.reduce(m, reinterpret_cast<float*>(buf0), MaxOp{});
    const float o = exp_offset(m);
    float s = 0.f;
    if (log) {
      for_live<P>(r.live, [&](int k) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) s += exp_elem<T>(r.v[k][e] - o);
      });
    } else {
      for_live<P>(r.live, [&](int k) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          r.v[k][e] = exp_elem<T>(r.v[k][e] - o);
          s += r.v[k][e];
        }
      });
    }
    return {m, g.reduce(s, reinterpret_cast<float*>(buf1), SumOp{})};
  }

  // The row's (M, S) from its chunks' (m, s), each s relative to its own m.
  __device__ __forceinline__ MaxSum combine(const MaxSum* part, int n) const {
    float m = kNegInf;
    for (int i = 0; i < n; ++i) m = fmaxf(m, part[i].m);
    const float o = exp_offset(m);
    float s = 0.f;
    for (int i = 0; i < n; ++i) s += part[i].s * expf(part[i].m - o);
    return {m, s};
  }

  // The same for n <= 32 parts, lane i of each warp taking part i (all lanes call it):
  // one expf per lane instead of n per thread. Butterflies: every lane, and every block
  // reading the same parts, gets the same bits.
  __device__ __forceinline__ MaxSum combine_lanes(const MaxSum* part, int n) const {
    const int lane = threadIdx.x % 32;
    const MaxSum p = lane < n ? part[lane] : MaxSum{kNegInf, 0.f};
    const float m = warp_all(p.m, MaxOp{});
    const float o = exp_offset(m);
    // lanes past n: 0 * exp(-inf) = 0
    return {m, warp_all(p.s * expf(p.m - o), SumOp{})};
  }

  // have_exp: partial ran on these registers, so softmax's v holds exp(v - m) with m =
  // mine.m, the max partial saw (the row's, or in a cluster its block's share's):
  // y = v * exp(m - M) / S.
  __device__ __forceinline__ Coef coef(MaxSum row, MaxSum mine, bool have_exp) const {
    const float o = exp_offset(row.m);
    if (log) return {o, logf(row.s), false};
    // A share without a finite entry (mine.m = -inf) holds only zeros: 0, not exp(0 - M),
    // which overflows for M < -88 (and 0 * inf is NaN).
    const float rel = !have_exp ? 1.f : mine.m == kNegInf ? 0.f : exp_elem<float>(mine.m - o);
    return {o, rel / row.s, have_exp};
  }

  // coef(row, row, true) for a whole row in registers, without the expf of exp(M - M) = 1:
  // a row whose max is -inf or +inf gives NaN either way (S = 0 or NaN).
  __device__ __forceinline__ Coef coef_whole(MaxSum row) const {
    const float o = exp_offset(row.m);
    if (log) return {o, logf(row.s), false};
    return {o, 1.f / row.s, true};
  }

  // v becomes the output. The flags are uniform: each case is its own loop, so no element
  // pays for a branch (or for an exp it does not need).
  template <typename T, int VEC, int P>
  __device__ __forceinline__ void finish(Regs<T, VEC, P>& r, const Coef& c) const {
    if (log) {
      // (v - M) - log S, in that order: v - M is exact near the max.
      for_live<P>(r.live, [&](int k) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) r.v[k][e] = (r.v[k][e] - c.o) - c.f;
      });
    } else if (c.have_exp) {
      for_live<P>(r.live, [&](int k) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) r.v[k][e] *= c.f;
      });
    } else {
      for_live<P>(r.live, [&](int k) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) r.v[k][e] = exp_elem<T>(r.v[k][e] - c.o) * c.f;
      });
    }
  }

  template <typename T, int VEC, int P>
  __device__ __forceinline__ float out(const Regs<T, VEC, P>& r, const Coef& /*c*/, int k,
                                       int e) const {
    return r.v[k][e];
  }

  // out() of a masked key (v = -inf), from the row's coefficients alone: 0, or NaN where
  // the whole row is NaN (a NaN or +inf in it, or no finite entry), as torch's masked_fill
  // then softmax gives. The causal variant stores it for the vectors it skips.
  template <typename T>
  __device__ __forceinline__ float masked(const Coef& c) const {
    return log ? (kNegInf - c.o) - c.f : exp_elem<T>(kNegInf - c.o) * c.f;
  }
};

// Backward from the forward's output y: softmax dx = scale * y * (dy - sum(dy * y)),
// log_softmax dx = dy - exp(y) * sum(dy). Missing entries, and causal-masked ones (y = 0
// there, so they are not read), are 0 and give dx = 0. Regs: the raw bits of dy and y,
// converted where used (twice): 16-bit rows in floats would not fit 1024-thread blocks.
//
// For float32 the row sum is accumulated in double (Acc). sum(dy) cancels (terms of both
// signs, |sum| ~ sqrt(len) while the partial sums run larger), and a float accumulation
// errs by ~1e-7 of the partial sums: after the multiplication by exp(y), up to ~1 that is
// ~1e-6 absolute in dx where dx itself is near 0, past float32 accuracy (GPU run 1 failed
// fp32 log_softmax backward at 1e-5 / 1e-6 for rows >= 255). For 16-bit inputs float
// accumulation is ~1e4 times finer than the output's rounding.
template <typename Acc>
struct Bwd {
  static constexpr int kIn = 2;
  using State = Acc;
  float scale;
  bool log;

  template <typename T, int VEC, int P>
  struct Regs {
    Raw<T, VEC> raw[2][P];
    __device__ __forceinline__ float dy(int k, int e) const { return raw_elem<T, VEC>(raw[0][k], e); }
    __device__ __forceinline__ float y(int k, int e) const { return raw_elem<T, VEC>(raw[1][k], e); }
  };
  using Coef = float;

  template <typename T, int VEC, int P>
  __device__ __forceinline__ void init(Regs<T, VEC, P>& r, const Raw<T, VEC> (&raw)[2][P],
                                       Cols c) const {
#pragma unroll
    for (int k = 0; k < P; ++k) {
      r.raw[0][k] = raw[0][k];
      r.raw[1][k] = raw[1][k];
    }
    // Vectors not loaded are zero. One that straddles the causal limit is zeroed past it,
    // word by word (bit masks: element-wise stores into 16-bit halves would make the
    // compiler split every vector at its load). Rare: vectors ascend in column, so only
    // a thread whose last vector is not whole has one.
    if constexpr (VEC > 1) {
      if (c.c0 + (P - 1) * c.stride + VEC > c.limit) {
        constexpr int kPerWord = 4 / static_cast<int>(sizeof(T));
#pragma unroll
        for (int k = 0; k < P; ++k) {
          const int col = c.c0 + k * c.stride;
          uint32_t keep[4];
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            keep[w] = 0;
#pragma unroll
            for (int h = 0; h < kPerWord; ++h) {
              const uint32_t bits = kPerWord == 1 ? 0xffffffffu : 0xffffu << (16 * h);
              if (col + w * kPerWord + h < c.limit) keep[w] |= bits;
            }
          }
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            r.raw[i][k].x &= keep[0];
            r.raw[i][k].y &= keep[1];
            r.raw[i][k].z &= keep[2];
            r.raw[i][k].w &= keep[3];
          }
        }
      }
    }
  }

  template <typename T, int VEC, int P, typename G>
  __device__ __forceinline__ Acc partial(const Regs<T, VEC, P>& r, const G& g, double* buf0,
                                         double* /*buf1*/) const {
    Acc s = 0;
#pragma unroll
    for (int k = 0; k < P; ++k) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        // dy * y rounded once in float (relative 6e-8 per term, no cancellation there)
        s += static_cast<Acc>(log ? r.dy(k, e) : r.dy(k, e) * r.y(k, e));
      }
    }
    return g.reduce(s, reinterpret_cast<Acc*>(buf0), SumOp{});
  }

  __device__ __forceinline__ Acc combine(const Acc* part, int n) const {
    Acc s = 0;
    for (int i = 0; i < n; ++i) s += part[i];
    return s;
  }

  __device__ __forceinline__ Acc combine_lanes(const Acc* part, int n) const {
    const int lane = threadIdx.x % 32;
    return warp_all(lane < n ? part[lane] : Acc(0), SumOp{});
  }

  __device__ __forceinline__ Coef coef(Acc row_sum, Acc /*mine*/, bool /*have_exp*/) const {
    return static_cast<float>(row_sum);
  }

  template <typename T, int VEC, int P>
  __device__ __forceinline__ void finish(Regs<T, VEC, P>& /*r*/, Coef /*c*/) const {}

  template <typename T, int VEC, int P>
  __device__ __forceinline__ float out(const Regs<T, VEC, P>& r, float row, int k, int e) const {
    return log ? r.dy(k, e) - exp_elem<T>(r.y(k, e)) * row
               : scale * r.y(k, e) * (r.dy(k, e) - row);
  }

  // out() of an entry not read (dy = y = 0): 0, or NaN where the row's sum is not finite.
  template <typename T>
  __device__ __forceinline__ float masked(float row) const {
    return log ? 0.f - exp_elem<T>(0.f) * row : scale * 0.f * (0.f - row);
  }
};

// ---------------------------------------------------------------------------------------
// The kernel

enum Phase : int {
  kWhole = 0,    // the row (or rows) of this block: reduce, write the outputs
  kPartial = 1,  // one chunk of a split row: reduce, write the chunk's State
  kFinish = 2,   // one chunk of a split row: combine the row's States, write the outputs
};

template <typename T, typename State>
struct Args {
  const T* in[2];  // forward: x; backward: grad_out, y
  T* out;
  State* partials;  // [rows, nchunks], split rows only
  int64_t rows;
  int len;         // < 2^31 (checked on the host): column offsets are 32-bit
  int chunk;       // columns per block: len, or a split row's chunk (a multiple of VEC)
  int nchunks;     // chunks per row (1 unless split): blockIdx.y
  int tpr;         // threads per row: a power of two <= 32, or BLOCK
  int tpr_shift;   // log2(tpr): no integer division in the kernel
  int64_t causal_q;  // 0: no mask; else Lq: row r is query r % Lq, keys j > r % Lq masked
  Phase phase;
};

template <int N>
constexpr int kLog2 = N <= 1 ? 0 : 1 + kLog2<N / 2>;

// The end of the columns of `row` a block reads: `end` (its chunk's), or with a causal
// mask the query's last key + 1 if that comes first. The query index is a 32-bit remainder
// when the row count allows (a 64-bit one is a ~100-instruction call).
template <typename T, typename State>
__device__ __forceinline__ int row_limit(const Args<T, State>& a, int64_t row, int end) {
  if (a.causal_q <= 0) return end;
  const int64_t q = a.rows <= 0xffffffffLL
                        ? static_cast<uint32_t>(row) % static_cast<uint32_t>(a.causal_q)
                        : row % a.causal_q;
  return static_cast<int>(std::min<int64_t>(end, q + 1));
}

// A thread's vectors of `row` (vector k at column c0 + k * stride), every load issued
// before any use; zero bits where the column is at or past `limit` (masked or idle: not
// read). A vector straddling the causal limit is still inside the row: read whole.
// How load_tile reads: plain loads; kPinned, loads that stay where they are written
// (load_pinned), for a prefetch; kReadOnly, through the read-only path (ld.global.nc).
enum LoadKind { kPlain, kPinned, kReadOnly };

template <LoadKind KIND, typename T, typename R, int kIn, int P>
__device__ __forceinline__ void load_tile(R (&raw)[kIn][P], const T* const (&in)[2], int len,
                                          int64_t row, int c0, int stride, int limit) {
#pragma unroll
  for (int i = 0; i < kIn; ++i) {
    const T* p = in[i] + row * len;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const int col = c0 + k * stride;
      raw[i][k] = R{};
      if (col < limit) {
        const R* q = reinterpret_cast<const R*>(p + col);
        if constexpr (KIND == kPinned) {
          raw[i][k] = load_pinned(q);
        } else if constexpr (KIND == kReadOnly) {
          raw[i][k] = __ldg(q);
        } else {
          raw[i][k] = *q;
        }
      }
    }
  }
}

// The outputs of a thread's vectors of `row` that lie before `end`; for the vectors past
// the live ones (Cols::live), the op's output for a masked entry (Op::masked: 0, or NaN in a
// NaN row), once per thread.
// PACK (16-bit T, 16-byte vectors): the outputs rounded a pair at a time (pack_pair) and
// the masked value packed once per thread (softmax_causal_fwd; the other kernels keep
// the per-element form they were measured with).
template <typename T, int VEC, int P, bool PACK = false, typename Op, typename Regs,
          typename Coef>
__device__ __forceinline__ void store_tile(const Op& op, const Regs& regs, const Coef& coef,
                                          T* out, int c0, int stride, int end, int live) {
  if constexpr (PACK) {
    static_assert(VEC == 8 && sizeof(T) == 2, "packed stores: 16-bit T, 16-byte vectors");
    const float m = op.template masked<T>(coef);
    const uint32_t dead = pack_pair<T>(m, m);
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const int col = c0 + k * stride;
      if (col < end) {
        uint32_t w[4] = {dead, dead, dead, dead};
        if (k < live) {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            w[j] = pack_pair<T>(op.out(regs, coef, k, 2 * j), op.out(regs, coef, k, 2 * j + 1));
          }
        }
        *reinterpret_cast<uint4*>(out + col) = make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
    return;
  }
  const T dead = static_cast<T>(op.template masked<T>(coef));
#pragma unroll
  for (int k = 0; k < P; ++k) {
    const int col = c0 + k * stride;
    if (col < end) {
      Vec<T, VEC> o;
      if (k < live) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) o.v[e] = static_cast<T>(op.out(regs, coef, k, e));
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) o.v[e] = dead;
      }
      store_vec<T, VEC>(out + col, o);
    }
  }
}

// Thread `lane` of a row group owns vectors k < P at columns
// begin + (k * tpr + lane) * VEC, begin = the chunk's first column.
// CAUSAL (a launch with a causal mask): the vectors past a row's limit (Cols::live) skip the
// forward's conversions, exps and sums and, both ways, their outputs' math (store_tile);
// otherwise every vector takes it, as a compile-time constant.
template <typename T, typename Op, int VEC, int P, int BLOCK, bool CAUSAL>
__global__ void __launch_bounds__(BLOCK, BLOCK < 128 ? 1024 / BLOCK : 1)
    softmax_kernel(Args<T, typename Op::State> a, Op op) {
  grid_dependency_wait();  // launched early (launch_early): nothing global before this
  using State = typename Op::State;
  static_assert(VEC == 1 || sizeof(Vec<T, VEC>) == 16, "vectors are 16 bytes");
  // Two reduction buffers (the ops' two reductions), a float or a double per warp.
  __shared__ double buf[2][BLOCK / 32 > 0 ? BLOCK / 32 : 1];

  const Group<BLOCK> g{a.tpr};
  const int lane = threadIdx.x & (a.tpr - 1);
  const int c = blockIdx.y;
  const int64_t r = (static_cast<int64_t>(blockIdx.x) << (kLog2<BLOCK> - a.tpr_shift)) +
                    (threadIdx.x >> a.tpr_shift);
  const bool active = r < a.rows;  // idle groups of the last block still shuffle along
  const int64_t row = active ? r : 0;
  const int begin = c * a.chunk;
  const int end = std::min(a.len, begin + a.chunk);
  const int limit = active ? row_limit(a, row, end) : begin;
  const int c0 = begin + lane * VEC;
  const int stride = a.tpr * VEC;

  // Every load first, then the conversions: a conversion next to its load would make the
  // thread wait for each load.
  Raw<T, VEC> raw[Op::kIn][P];
  load_tile<kPlain>(raw, a.in, a.len, row, c0, stride, limit);
  typename Op::template Regs<T, VEC, P> regs;
  const int live = CAUSAL ? live_vectors<P>(c0, stride, limit) : P;
  op.init(regs, raw, Cols{c0, stride, limit, live});

  State total, mine;
  if (a.phase == kFinish) {
    total = mine = op.combine(a.partials + row * a.nchunks, a.nchunks);
  } else {
    total = mine = op.partial(regs, g, buf[0], buf[1]);
    if (a.phase == kPartial) {
      if (threadIdx.x == 0) a.partials[row * a.nchunks + c] = total;
      return;
    }
  }
  if (!active) return;
  const auto coef = op.coef(total, mine, a.phase != kFinish);
  op.finish(regs, coef);
  store_tile<T, VEC, P>(op, regs, coef, a.out + row * a.len, c0, stride, end, live);
}

// softmax_causal_fwd: the causal forward of 16-bit rows on the 16-byte path, up to
// 1024 * kCausalVectors * 8 = 16384 columns, whole rows of a TPR-thread group shaped at
// compile time (TPR = 32 .. 1024, kCausalVectors vectors a thread, max(128, TPR)-thread
// blocks). The same ops and helpers as softmax_kernel, without what its runtime shape costs
// (the group size, the chunk and phase, a division by the stride): on 8x16x2048² bf16
// scores softmax_kernel's causal variant executed ~690 instructions a warp and read 74-79%
// of copy where this form (128 threads a row, 2 vectors each, 32 registers: 16 blocks an
// SM) reads 96% in benchmarks/dev/softmax_causal_sweep.cu (KERNEL_LOG softmax v10).
constexpr int kCausalVectors = 2, kCausalMaxTpr = 1024;

template <typename T, int TPR>
__global__ void __launch_bounds__(TPR < 128 ? 128 : TPR, 2048 / (TPR < 128 ? 128 : TPR))
    softmax_causal_fwd(Args<T, MaxSum> a, Fwd op, Div31 lq) {
  grid_dependency_wait();  // launched early (launch_early): nothing global before this
  constexpr int BLOCK = TPR < 128 ? 128 : TPR, P = kCausalVectors, VEC = kVecElems<T>;
  constexpr int stride = TPR * VEC;
  static_assert(sizeof(T) == 2 && VEC == 8, "16-bit rows, 16-byte vectors");
  __shared__ double buf[2][BLOCK / 32];

  const Group<BLOCK> g{TPR};
  const int lane = threadIdx.x % TPR;
  // rows < 2^31 (the host checks): the query r % Lq through lq's multiply-high
  const uint32_t r = blockIdx.x * (BLOCK / TPR) + threadIdx.x / TPR;
  const bool active = r < a.rows;  // idle groups of the last block still shuffle along
  const int64_t row = active ? r : 0;
  const int limit = active ? static_cast<int>(std::min<uint32_t>(lq.mod(r) + 1, a.len)) : 0;
  const int c0 = lane * VEC;

  uint4 raw[1][P];
  load_tile<kReadOnly>(raw, a.in, a.len, row, c0, stride, limit);
  Fwd::Regs<T, VEC, P> regs;
  const int live = live_vectors<P>(c0, stride, limit);
  op.init(regs, raw, Cols{c0, stride, limit, live});
  const MaxSum total = op.partial(regs, g, buf[0], buf[1]);
  if (!active) return;
  const Fwd::Coef coef = op.coef_whole(total);
  op.finish(regs, coef);
  store_tile<T, VEC, P, true>(op, regs, coef, a.out + row * a.len, c0, stride, a.len, live);
}

// Long rows on sm_90: grid (clusters, n), cluster (1, n): cluster blockIdx.x takes rows
// blockIdx.x, + gridDim.x, ...; its block blockIdx.y the columns [y * chunk, + chunk).
// Per row: the block's State (as softmax_kernel's), pushed into slot [rank] of every
// block of the cluster (itself included), one mbarrier wait for the n States, combined
// across the lanes of each warp (combine_lanes: identical bits in every block; a serial
// combine, n expf per thread, took ~25% of a 16-block row), the outputs written.
//
// The next rows are loaded while this one is reduced, exchanged and stored:
// - STAGES > 0 (the wide shape, 16-byte path): thread 0 has the copy engine bring the block's share of
//   each of the next STAGES rows into a ring of shared-memory slots (cp.async.bulk, one
//   instruction per input and row, completion counted on the slot's mbarrier `full`). A
//   row goes from its slot to registers; once every thread has its share (a block barrier),
//   the slot is refilled with the row STAGES further on. Up to STAGES rows in flight per
//   SM, no register held for them (KERNEL_LOG softmax v7).
// - STAGES = 0 (the P = kVectorsPerThread shape, and the scalar path, whose rows need not
//   be 16-byte aligned): the next row's loads issued into registers right after this row's
//   registers are filled (load_tile<kPinned>): one row in flight.
// Launch bound (BLOCK, 1): up to 128 registers; one 512-thread block per SM.
// Buffers alternate by row parity: a block pushes row r + 2 only after it has every
// push of row r + 1, which each block sends after its barrier of row r + 1, after it
// read row r's slots; likewise a reduction buffer is written again two rows later, past
// at least one barrier.
template <typename T, typename Op, int VEC, int P, int BLOCK, int STAGES>
__global__ void __launch_bounds__(BLOCK, 1)
    softmax_cluster_kernel(Args<T, typename Op::State> a, Op op) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  grid_dependency_wait();  // launched early (early_start): nothing global before this
  using State = typename Op::State;
  using R = Raw<T, VEC>;
  static_assert(STAGES == 0 || sizeof(R) == 16, "staged rows: 16-byte vectors");
  constexpr int kShare = P * BLOCK;  // vectors of one input in a block's share of a row
  __shared__ double buf[2][2][BLOCK / 32];
  __shared__ State slots[2][kMaxCluster];
  __shared__ uint64_t bar[2];
  __shared__ uint64_t full[STAGES > 0 ? STAGES : 1];
  extern __shared__ uint4 staged[];  // [STAGES][kIn][kShare]

  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  const Group<BLOCK> g{BLOCK};
  const int n = a.nchunks;
  const int rank = static_cast<int>(cl.block_rank());
  const int begin = blockIdx.y * a.chunk;
  const int end = std::min(a.len, begin + a.chunk);
  const int c0 = begin + static_cast<int>(threadIdx.x) * VEC;
  constexpr int stride = BLOCK * VEC;
  const int64_t step = gridDim.x;
  auto limit_of = [&](int64_t row) { return row < a.rows ? row_limit(a, row, end) : begin; };
  // Thread 0: the block's share of `row` (its vectors that start before the row's limit)
  // into slot s.
  auto stage = [&](int64_t row, int s) {
    const int cols = std::max(limit_of(row) - begin, 0);  // 0: a chunk wholly masked
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
    load_tile<kPinned>(raw, a.in, a.len, row, c0, stride, limit_of(row));
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
    const int limit = limit_of(row);
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
    op.init(regs, raw, Cols{c0, stride, limit, P});
    if constexpr (STAGES == 0) {
      load_tile<kPinned>(raw, a.in, a.len, row + step, c0, stride, limit_of(row + step));
    }
    const int par = it & 1;
    const State mine = op.partial(regs, g, buf[par][0], buf[par][1]);
    if (threadIdx.x < n) push_to_peer(&slots[par][rank], &bar[par], threadIdx.x, mine);
    if (threadIdx.x == 0) mbar_expect(&bar[par], n * static_cast<uint32_t>(sizeof(State)));
    mbar_wait(&bar[par], (it >> 1) & 1);  // bar[par]'s (it / 2)-th phase
    const auto coef = op.coef(op.combine_lanes(slots[par], n), mine, true);
    op.finish(regs, coef);
    store_tile<T, VEC, P>(op, regs, coef, a.out + row * a.len, c0, stride, end, P);
  }
  cl.sync();  // no block leaves while a peer may still push into its shared memory
#else
  __trap();  // the host launches it only where sm_90 code runs (cluster_fit)
#endif
}

// ---------------------------------------------------------------------------------------
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
// reductions and exchanges (KERNEL_LOG softmax v13). Then one block reduction of (max, sum)
// pairs; for N > 1 each block pushes its pair into every peer's shared memory (st.async,
// one mbarrier wait, common/cluster.cuh) and combines the N pairs lane-wise (the same bits
// in every block); then the output pass from shared memory, the exps recomputed.
// (This kernel took rows of exactly 1, 2, 4 or 8 x 32768 16-bit columns in registers until
// v13; float32 rows of N x 16384 on that register kernel were measured and dropped, v8d.)
constexpr int kStagedBlock = 256, kStagedGroups = 4;
constexpr int kStagedShareVecs = 4096;                                     // 16-byte vectors
constexpr int kStagedVecs = kStagedShareVecs / kStagedBlock / kStagedGroups;  // a thread's a group
constexpr int kStagedSmem = kStagedShareVecs * 16;                          // bytes of a share
constexpr int kStagedMinVecs = 2048;  // shorter rows: a block per row (launch_rows)

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
constexpr uint32_t kNegInfWord = std::is_same_v<T, float>            ? 0xff800000u
                                 : std::is_same_v<T, c10::BFloat16> ? 0xff80ff80u
                                                                     : 0xfc00fc00u;

// grid (rows, n), n = gridDim.y blocks a row of nvec 16-byte vectors, `share` of them a
// block (the last block's share may be shorter). N > 0: n = N, every share kStagedShareVecs
// long, so no vector is tested (the v13 kernel, shaped at compile time for those rows: a
// runtime n with the tests, or without them, cost 262144-column rows 5-6 points of copy,
// session 23 calls 6-7); N = 0: any n and share.
template <typename T, int N>
__global__ void __launch_bounds__(kStagedBlock)
    softmax_fwd_staged(const T* __restrict__ x, T* __restrict__ y, int nvec, int share,
                      float scale, bool log) {
  constexpr int G = kStagedGroups, V = kStagedVecs, W = kStagedBlock / 32;
  // [G][V][kStagedBlock] vectors of x, 128-byte aligned: cp.async into a share at 80 bytes
  // past a 128-byte line read 262144-column rows 5-7 points slower (session 23 calls 6-10)
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
  const int64_t first =
      static_cast<int64_t>(blockIdx.x) * nvec + static_cast<int64_t>(rank) * share;
  const int limit = FULL ? kStagedShareVecs : min(share, nvec - rank * share);  // its vectors
  const uint4* src = reinterpret_cast<const uint4*>(x) + first;
  uint4* dst = reinterpret_cast<uint4*>(y) + first;
  auto at = [](int k) { return k * kStagedBlock + static_cast<int>(threadIdx.x); };  // k-th own
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int v = 0; v < V; ++v) {
      if (FULL || at(g * V + v) < limit) {
        stage_copy(&share_smem[at(g * V + v)], src + at(g * V + v));
      }
    }
    stage_commit();
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
      raw[v] = FULL || at(g * V + v) < limit ? share_smem[at(g * V + v)]
                                             : make_uint4(ni, ni, ni, ni);
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
#pragma unroll
    for (int k = 0; k < G * V; ++k) {
      if (!FULL && at(k) >= limit) continue;
      const uint4 raw = share_smem[at(k)];
      uint32_t w[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if constexpr (std::is_same_v<T, float>) {
          w[j] = __float_as_uint(elem(vec_elem<T>(raw, j)));
        } else {
          const float lo = elem(vec_elem<T>(raw, 2 * j));
          const float hi = elem(vec_elem<T>(raw, 2 * j + 1));
          w[j] = float_to_half_bits<T>(lo) | float_to_half_bits<T>(hi) << 16;
        }
      }
      dst[at(k)] = make_uint4(w[0], w[1], w[2], w[3]);
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

// ---------------------------------------------------------------------------------------
// Host: choosing the shape and launching

// Vectors per thread: 4 x 16 bytes in flight per input (bf16: 32 elements), 8 scalar
// elements on the scalar path.
template <int VEC>
constexpr int kVectorsPerThread = VEC == 1 ? 8 : 4;
constexpr int kSplitBlock = 512;  // block size for the chunks of a split (or clustered) row

int next_pow2(int64_t n) {
  int p = 1;
  while (p < n) p <<= 1;
  return p;
}

// How many clusters of n blocks of `block` threads of `kernel`, each with `smem` bytes of
// dynamic shared memory, run at once here; 0 when it cannot run as clusters: the GPU is
// older than sm_90, the kernel's code was not compiled for sm_90 (the 8.0 pass, or its PTX
// JIT-compiled for a newer GPU), or fewer than half the SMs would be busy. Cached per
// device, kernel and n.
// FUSED_SOFTMAX_CLUSTER=0 turns clusters off (the 1024-thread and split paths then take
// those rows: for comparisons).
template <typename Kernel>
int cluster_fit(Kernel kernel, int block, int n, int smem) {
  static const bool disabled = env_switched_off("FUSED_SOFTMAX_CLUSTER");
  if (disabled || !runs_sm90_code(kernel)) return 0;
  return cached_launch_query(reinterpret_cast<const void*>(kernel), block, n, [&] {
    if (!allow_dynamic_smem(kernel, smem)) return 0;  // no room here
    ClusterLaunch cl(dim3(1, n), block, smem);  // the chunks of one row: blockIdx.y = rank
    const int active = cl.max_active(kernel);
    return active * n >= num_sms() / 2 ? active : 0;
  });
}

// softmax_cluster_kernel's ring of staged rows: 0 (the next row prefetched into registers)
// for the P = kVectorsPerThread shape, whose registers hold two rows; for the wide shape
// (2P, 16-byte path), whose registers hold one, as many row shares as fit in kStageBudget
// bytes of shared memory, at most 4 (forward 3 slots of 64 KB, bf16 backward 1 of 128 KB).
// Staging the P shape too measured 4-6 points of copy slower than its register prefetch
// (KERNEL_LOG softmax v7).
constexpr int kStageBudget = 192 * 1024;
template <typename Op, int VEC, int P>
constexpr int kStages = VEC == 1 || P == kVectorsPerThread<VEC>
                            ? 0
                            : std::min(4, kStageBudget / (Op::kIn * P * kSplitBlock * 16));

// The largest cluster a row is spread over before each thread takes twice the vectors
// (the wide shape, 16-byte path): 8, or FUSED_SOFTMAX_MAX_CLUSTER (2-16) for comparisons.
// 8: bf16 rows of 262144 in 16 clusters of 8 blocks (128 SMs busy) instead of 7 of 16
// (112): 68.2 against 65.8% of copy; float32 131072 the same either way (KERNEL_LOG v7).
constexpr int kWideAfter = 8;
int max_cluster() {
  static const int n = [] {
    const int v = env_int("FUSED_SOFTMAX_MAX_CLUSTER", kWideAfter);
    return v >= 2 && v <= kMaxCluster ? v : kWideAfter;
  }();
  return n;
}

// Rows of a in persistent clusters of n blocks of softmax_cluster_kernel with P vectors
// per thread; false (nothing launched) where such clusters do not fit (cluster_fit).
template <typename T, typename Op, int VEC, int P>
bool launch_cluster(Args<T, typename Op::State> a, const Op& op, int n) {
  constexpr int S = kStages<Op, VEC, P>;
  constexpr int smem = S * Op::kIn * P * kSplitBlock * 16;
  constexpr auto kernel = softmax_cluster_kernel<T, Op, VEC, P, kSplitBlock, S>;
  const int fit = n <= kMaxCluster ? cluster_fit(kernel, kSplitBlock, n, smem) : 0;
  if (fit == 0) return false;
  a.tpr = kSplitBlock;
  a.nchunks = n;
  a.chunk = static_cast<int>(ceil_div(ceil_div(a.len, n), VEC) * VEC);
  ClusterLaunch(dim3(1, n), kSplitBlock, smem)
      .early_start()
      .launch(dim3(static_cast<unsigned>(std::min<int64_t>(a.rows, fit)),
                   static_cast<unsigned>(n)),
              kernel, a, op);
  return true;
}

// Launches row blocks x a.nchunks blocks of BLOCK threads, a.tpr threads per row. With a
// causal mask, 16-bit rows in blocks of up to 512 threads take the causal variant (rows of
// up to 16384 columns on the 16-byte path, 4096 on the scalar one, and split rows'
// chunks). The others take the plain kernel, which masks element by element: float32 causal
// rows of 2048 measured 90.2% of copy with it, 86.8% with the variant (KERNEL_LOG softmax
// v9).
template <typename T, typename Op, int VEC, int BLOCK, int P = kVectorsPerThread<VEC>>
void launch(Args<T, typename Op::State> a, const Op& op) {
  a.tpr_shift = 0;
  while ((1 << a.tpr_shift) < a.tpr) ++a.tpr_shift;
  const int64_t row_blocks = ceil_div(a.rows, BLOCK / a.tpr);
  TORCH_CHECK(row_blocks <= std::numeric_limits<int>::max() && a.nchunks <= 65535,
              "fused softmax: ", a.rows, " rows of ", a.len, " columns need ", row_blocks,
              " x ", a.nchunks, " blocks, more than one launch holds (2^31 - 1 x 65535)");
  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(a.nchunks));
  auto kernel = softmax_kernel<T, Op, VEC, P, BLOCK, false>;
  if constexpr (BLOCK <= 512 && sizeof(T) == 2) {
    if (a.causal_q != 0) kernel = softmax_kernel<T, Op, VEC, P, BLOCK, true>;
  }
  launch_early(kernel, grid, dim3(BLOCK), 0, a, op);
}

// Rows of up to 128 threads go to blocks of max(tpr, min_block()) threads: 32 by default, so
// a 32-thread row is a 1-warp block (its resources freed when its row is done, not with three
// other rows'), which took the 16384x1024 bf16 forward from 69.0 to 72.1% of copy and its
// backward from 78.5 to 80.1% (H200, KERNEL_LOG softmax v14). FUSED_SOFTMAX_MIN_BLOCK = 64
// or 128 (the old shape) for comparisons (read on every call, so a test can switch it).
int min_block() {
  const int b = env_int("FUSED_SOFTMAX_MIN_BLOCK", 32);
  return b == 64 || b == 128 ? b : 32;
}

template <typename T, typename Op, int VEC>
void launch_rows(Args<T, typename Op::State> a, const Op& op, const at::TensorOptions& opts) {
  constexpr int P = kVectorsPerThread<VEC>;
  const int64_t nvec = (a.len + VEC - 1) / VEC;
  const int64_t tpr = next_pow2((nvec + P - 1) / P);
  a.chunk = a.len;
  a.nchunks = 1;
  a.phase = kWhole;
  if (tpr <= 128) {
    // Rows of tpr threads in blocks of max(tpr, min_block()).
    const int mb = min_block();
    if constexpr (VEC == 4 && std::is_same_v<Op, Fwd>) {
      // float32 forward rows of up to 1024 columns: 8 vectors a thread, so that a warp holds
      // a row (shuffles only; 4 vectors would make 1024 a 64-thread row with a block barrier
      // per reduction): 16384x1024 37.6 -> 37.2 us (H200, KERNEL_LOG softmax v14). Not the
      // backward: its double sums spill at 8 vectors.
      const int64_t tpr8 = next_pow2((nvec + 7) / 8);
      if (tpr8 <= 32 && mb == 32) {
        a.tpr = static_cast<int>(tpr8);
        return launch<T, Op, VEC, 32, 8>(a, op);
      }
    }
    a.tpr = static_cast<int>(tpr);
    switch (std::max<int>(a.tpr, mb)) {
      case 32: return launch<T, Op, VEC, 32>(a, op);
      case 64: return launch<T, Op, VEC, 64>(a, op);
      default: return launch<T, Op, VEC, 128>(a, op);
    }
  }
  a.tpr = static_cast<int>(tpr);
  switch (tpr) {
    case 256: return launch<T, Op, VEC, 256>(a, op);
    case 512: return launch<T, Op, VEC, 512>(a, op);
  }
  // Longer rows, on sm_90: persistent clusters of n <= 16 blocks of 512 threads, even
  // shares of the row (whole vectors), the row read once, the next rows' loads in flight
  // (softmax_cluster_kernel). A single 1024-thread block per row (next) would idle at its
  // barriers with nothing else in flight. Past max_cluster() blocks of P vectors per thread,
  // 2P on the 16-byte path (bf16 rows over 131072 columns, float32 over 65536).
  {
    constexpr int kPerBlock = kSplitBlock * P * VEC;
    const int n = static_cast<int>(ceil_div(a.len, kPerBlock));
    if (VEC == 1 || n <= max_cluster()) {
      if (launch_cluster<T, Op, VEC, P>(a, op, n)) return;
    } else if constexpr (VEC > 1) {
      if (launch_cluster<T, Op, VEC, 2 * P>(a, op, static_cast<int>(ceil_div(a.len, 2 * kPerBlock))))
        return;
    }
  }
  if (tpr == 1024) return launch<T, Op, VEC, 1024>(a, op);
  // Split: chunks of kSplitBlock * P vectors, reductions written to a workspace, then
  // combined by each chunk's block in a second launch.
  a.tpr = kSplitBlock;
  a.chunk = kSplitBlock * P * VEC;
  a.nchunks = static_cast<int>(ceil_div(a.len, a.chunk));
  const int64_t blocks = a.rows * a.nchunks;
  at::Tensor ws = at::empty({static_cast<int64_t>(blocks * sizeof(typename Op::State))},
                            opts.dtype(at::kByte));
  a.partials = reinterpret_cast<typename Op::State*>(ws.mutable_data_ptr());
  a.phase = kPartial;
  launch<T, Op, VEC, kSplitBlock>(a, op);
  a.phase = kFinish;
  launch<T, Op, VEC, kSplitBlock>(a, op);
}

// softmax_fwd_staged for the rows it takes (16-byte vectors, checked by the caller): more
// than kStagedMinVecs vectors (the block-per-row kernels' limit), at most kMaxCluster shares
// of kStagedShareVecs, cut evenly; past one share only where such clusters run
// (cluster_fit, so FUSED_SOFTMAX_CLUSTER=0 turns those off too). False otherwise.
// FUSED_SOFTMAX_STAGED=0 turns it off (read on every call, so a test or a comparison can
// switch it).
template <typename T, typename Op>
bool launch_staged(const Args<T, typename Op::State>& a, const Op& op) {
  if constexpr (std::is_same_v<Op, Fwd>) {
    const int64_t nvec = a.len / kVecElems<T>;
    const int n = static_cast<int>(ceil_div(nvec, kStagedShareVecs));
    if (env_switched_off("FUSED_SOFTMAX_STAGED") || nvec <= kStagedMinVecs || n > kMaxCluster ||
        a.causal_q != 0 || !(op.scale > 0.f && op.scale <= std::numeric_limits<float>::max()) ||
        a.rows <= 0 || a.rows > std::numeric_limits<int>::max()) {
      return false;
    }
    const int share = static_cast<int>(ceil_div(nvec, n));
    const dim3 grid(static_cast<unsigned>(a.rows), static_cast<unsigned>(n));
    auto go = [&](auto kernel) {
      if (n == 1) {
        if (!allow_dynamic_smem_once(kernel, kStagedSmem)) return false;
        launch_early(kernel, grid, dim3(kStagedBlock), kStagedSmem, a.in[0], a.out,
                     static_cast<int>(nvec), share, op.scale, op.log);
        return true;
      }
      if (cluster_fit(kernel, kStagedBlock, n, kStagedSmem) == 0) return false;
      ClusterLaunch(dim3(1, n), kStagedBlock, kStagedSmem)
          .early_start()
          .launch(grid, kernel, a.in[0], a.out, static_cast<int>(nvec), share, op.scale, op.log);
      return true;
    };
    if (share == kStagedShareVecs && nvec == int64_t{n} * share && (n & (n - 1)) == 0) {
      return with_pow2<1, kMaxCluster>(n, [&](auto kn) {
        return go(softmax_fwd_staged<T, decltype(kn)::value>);
      });
    }
    return go(softmax_fwd_staged<T, 0>);
  }
  return false;
}

// softmax_causal_fwd for the causal forward rows it is shaped for (16-bit, 16-byte aligned
// and a multiple of 8 columns, checked by the caller; 257 .. 16384 columns; fewer than
// 2^31 rows); false otherwise. FUSED_SOFTMAX_CAUSAL=0 turns it off (read on every call,
// for comparisons and the dispatch test): softmax_kernel's causal variant then takes
// these rows.
template <typename T, typename Op>
bool launch_causal(const Args<T, typename Op::State>& a, const Op& op) {
  if constexpr (std::is_same_v<Op, Fwd> && sizeof(T) == 2) {
    constexpr int kVec = kVecElems<T>;
    const int64_t tpr = next_pow2(ceil_div(a.len / kVec, kCausalVectors));
    constexpr int64_t kMax = std::numeric_limits<int32_t>::max();  // Div31's range
    if (a.causal_q == 0 || tpr < 32 || tpr > kCausalMaxTpr || a.rows > kMax ||
        a.causal_q > kMax || env_switched_off("FUSED_SOFTMAX_CAUSAL")) {
      return false;
    }
    const int rows_per_block = std::max<int>(1, 128 / static_cast<int>(tpr));
    const auto blocks = static_cast<unsigned>(ceil_div(a.rows, rows_per_block));
    const Div31 lq = Div31::make(static_cast<uint32_t>(a.causal_q));
    auto go = [&](auto kt) {
      constexpr int TPR = decltype(kt)::value;
      launch_early(softmax_causal_fwd<T, TPR>, dim3(blocks), dim3(std::max(128, TPR)), 0, a, op,
                   lq);
      return true;
    };
    return with_pow2<32, kCausalMaxTpr>(tpr, go);
  }
  return false;
}

template <typename T, typename Op>
void run(const T* in0, const T* in1, T* out, int64_t rows, int64_t len, int64_t causal_q,
         const Op& op, const at::TensorOptions& opts) {
  TORCH_CHECK(len <= std::numeric_limits<int>::max() / 2,
              "fused softmax: rows of up to 2^30 elements are supported, but got ", len);
  Args<T, typename Op::State> a{{in0, in1}, out, nullptr, rows, static_cast<int>(len),
                                static_cast<int>(len), 1, 1, 0, causal_q, kWhole};
  constexpr int V = kVecElems<T>;
  const bool vec = len % V == 0 && is_aligned(in0) && (in1 == nullptr || is_aligned(in1)) &&
                   is_aligned(out);
  if (vec) {
    if (launch_staged(a, op) || launch_causal(a, op)) return;
    launch_rows<T, Op, V>(a, op, opts);
  } else {
    launch_rows<T, Op, 1>(a, op, opts);
  }
}

template <bool LOG>
at::Tensor forward_cuda(const at::Tensor& x, int64_t dim, double scale, bool causal,
                        const char* op) {
  return softmax_forward(x, dim, causal, op, [&](const at::Tensor& in, at::Tensor& out,
                                                 int64_t rows, int64_t len, int64_t causal_q) {
    c10::cuda::CUDAGuard guard(in.device());
    FUSED_DISPATCH_CUDA(in.scalar_type(), "fused::softmax", [&] {
      run<scalar_t>(in.const_data_ptr<scalar_t>(), nullptr, out.mutable_data_ptr<scalar_t>(),
                    rows, len, causal_q, Fwd{static_cast<float>(scale), LOG}, in.options());
    });
  });
}

template <bool LOG>
at::Tensor backward_cuda(const at::Tensor& grad_out, const at::Tensor& y, int64_t dim,
                         double scale, bool causal, const char* op) {
  return softmax_backward(grad_out, y, dim, causal, op,
                          [&](const at::Tensor& g, const at::Tensor& yr, at::Tensor& dx,
                              int64_t rows, int64_t len, int64_t causal_q) {
    c10::cuda::CUDAGuard guard(yr.device());
    FUSED_DISPATCH_CUDA(yr.scalar_type(), "fused::softmax_backward", [&] {
      // float32 row sums in double (see Bwd)
      using Acc = std::conditional_t<std::is_same_v<scalar_t, float>, double, float>;
      run<scalar_t>(g.const_data_ptr<scalar_t>(), yr.const_data_ptr<scalar_t>(),
                    dx.mutable_data_ptr<scalar_t>(), rows, len, causal_q,
                    Bwd<Acc>{static_cast<float>(scale), LOG}, yr.options());
    });
  });
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
