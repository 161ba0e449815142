// What every softmax kernel file shares (device): the ops (Fwd / Bwd: softmax or log_softmax
// is a runtime flag, uniform per launch), row groups and their reductions, the kernels'
// arguments, tile loads and stores; and the launchers' cluster query (host).
//
// Forward: v = scale * x (-inf past the causal limit), M = max v, S = sum exp(v - M) (two
// reductions), softmax y = exp(v - M) / S, log_softmax y = (v - M) - log S; masked keys
// are not read, only written (y = 0). Backward: one sum per row, sum(dy * y) (softmax) or
// sum(dy) (log_softmax), then dx = scale * y * (dy - sum) or dy - exp(y) * sum.
// Loads/stores are 16-byte vectors when the pointers and the row length allow (VEC =
// 16 / sizeof(T)), scalar otherwise (VEC = 1). Bytes: forward reads x and writes y; backward
// reads dy and y and writes dx. Which kernel takes which rows: plan.h.
#pragma once
#include <cooperative_groups.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "common/checks.h"
#include "common/cluster.cuh"
#include "common/fast_math.cuh"
#include "common/half_bits.cuh"
#include "common/launch.cuh"
#include "common/reduce.cuh"
#include "common/stage.cuh"
#include "common/vec.cuh"
#include "cuda/softmax/plan.h"

namespace fused {
namespace softmax {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

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
// an issue-bound kernel (measured: 70% of copy at 16384x4096) and a memory-bound one.
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
  __device__ __forceinline__ F operator()(F a, F b) const {
    return a + b;
  }
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
// only their stores (docs/design/softmax.md#tried-not-kept). When all P are live the loop has no
// test, and with live = P as a constant it is the plain loop.
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

  // SPAN = false: rows of whole vectors on the grid (no head to mask).
  template <bool SPAN = true, typename T, int VEC, int P>
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
    // The span's head: vector 0 of the thread whose first vector starts before the row
    // (c0 < 0, a row off the 16-byte grid) holds -c0 elements of the previous row.
    if (SPAN && c.c0 < 0) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        if (e < -c.c0) r.v[0][e] = kNegInf;
      }
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
// ~1e-6 absolute in dx where dx itself is near 0, past float32 accuracy (float accumulation failed
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
    __device__ __forceinline__ float dy(int k, int e) const {
      return raw_elem<T, VEC>(raw[0][k], e);
    }
    __device__ __forceinline__ float y(int k, int e) const {
      return raw_elem<T, VEC>(raw[1][k], e);
    }
  };
  using Coef = float;

  template <bool SPAN = true, typename T, int VEC, int P>
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
      // ... and the span's head (c0 < 0: elements of the previous row) zeroed likewise.
      if (c.c0 + (P - 1) * c.stride + VEC > c.limit || (SPAN && c.c0 < 0)) {
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
              const int e = col + w * kPerWord + h;
              if (e >= 0 && e < c.limit) keep[w] |= bits;
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
    return log ? r.dy(k, e) - exp_elem<T>(r.y(k, e)) * row : scale * r.y(k, e) * (r.dy(k, e) - row);
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
  int len;           // < 2^31 (checked on the host): column offsets are 32-bit
  int chunk;         // span columns per block (the row's span: len + VEC - 1 on the
                     // 16-byte path, len on the scalar one), or a split row's chunk (a
                     // multiple of VEC); a block's columns start chunk * blockIdx.y - head
  int nchunks;       // chunks per row (1 unless split): blockIdx.y
  int tpr;           // threads per row: a power of two <= 32, or BLOCK
  int tpr_shift;     // log2(tpr): no integer division in the kernel
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

// The head of a row that starts at p: how many elements of T precede it in its 16-byte
// chunk (0 on the scalar path). The 16-byte path reads a row as the vectors of its span,
// p - head rounded to the 16-byte grid, so a thread's columns start at lane * VEC - head.
template <typename T, int VEC>
__device__ __forceinline__ int row_head(const T* p) {
  if constexpr (VEC == 1) {
    return 0;
  } else {
    return static_cast<int>(reinterpret_cast<uintptr_t>(p) % 16 / sizeof(T));
  }
}

// A 16-byte vector of T with its elements outside [from, to) replaced by `fill`'s (a word
// of two 16-bit or one 32-bit element): a row's first or last vector of its span.
template <typename T>
__device__ __forceinline__ uint4 keep_elems(uint4 v, int from, int to, uint32_t fill) {
  constexpr int kPerWord = 4 / static_cast<int>(sizeof(T));
  uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t keep = 0;
#pragma unroll
    for (int h = 0; h < kPerWord; ++h) {
      const int e = j * kPerWord + h;
      if (e >= from && e < to) keep |= kPerWord == 1 ? 0xffffffffu : 0xffffu << (16 * h);
    }
    w[j] = (w[j] & keep) | (fill & ~keep);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Stores the elements in [from, to) of the 16-byte vector `w` (words as above) at p, one at
// a time: the others are not the row's.
template <typename T>
__device__ __forceinline__ void store_elems(T* p, const uint32_t (&w)[4], int from, int to) {
  constexpr int kPerWord = 4 / static_cast<int>(sizeof(T));
#pragma unroll
  for (int e = 0; e < 4 * kPerWord; ++e) {
    if (e >= from && e < to) {
      if constexpr (kPerWord == 1) {
        reinterpret_cast<uint32_t*>(p)[e] = w[e];
      } else {
        reinterpret_cast<uint16_t*>(p)[e] = static_cast<uint16_t>(w[e / 2] >> (16 * (e % 2)));
      }
    }
  }
}

// A thread's vectors of `row` (vector k at column c0 + k * stride), every load issued
// before any use; zero bits where the column is at or past `limit` (masked or idle: not
// read). A vector straddling the causal limit is still inside the row: read whole.
// A row off the 16-byte grid: c0 and a vector's column may be negative (down to
// -(VEC - 1)), and its last vector may run past the row's end. Every vector read is a
// 16-byte-aligned chunk (p + col is on the grid: the host runs the 16-byte path only where
// every pointer has the row's offset in its chunk) that holds at least one element of the
// row (col + VEC > 0 and col < limit <= len), so it never leaves the memory the tensor's
// bytes lie in: the caching allocator hands out blocks of whole 512 bytes at 512-byte-aligned
// addresses, cudaMalloc at >= 256-byte-aligned ones in whole pages, and a 16-byte chunk
// neither crosses such a boundary nor starts outside the block that holds its row element.
// The bytes outside the row are masked by the op's init and never stored (store_tile).
// (compute-sanitizer memcheck with the caching allocator off checks the requested size
// instead: the last row's final chunk past a tensor that does not end on the 16-byte grid
// reads as out of bounds there, though it is inside the allocation's page.)
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
// Vectors that straddle the row's start (col < 0) or `end` are stored element by element.
// PACK (16-bit T, 16-byte vectors, rows of whole vectors only: softmax_causal_fwd, which
// the plan gives only such rows): the outputs rounded a pair at a time (pack_pair) and
// the masked value packed once per thread (softmax_causal_fwd; the other kernels keep
// the per-element form they were measured with).
// SPAN = false: rows of whole vectors on the 16-byte grid only (no edge to test).
template <typename T, int VEC, int P, bool PACK = false, bool SPAN = true, typename Op,
          typename Regs, typename Coef>
__device__ __forceinline__ void store_tile(const Op& op, const Regs& regs, const Coef& coef, T* out,
                                           int c0, int stride, int end, int live) {
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
      if constexpr (VEC == 1 || !SPAN) {
        store_vec<T, VEC>(out + col, o);
      } else if (col >= 0 && col + VEC <= end) {
        // One 16-byte store of the vector's bits, as an instruction the compiler keeps whole.
        // Stored as a Vec (or a uint4 of its bits), the compiler merges it with the edge
        // branch's element stores below into predicated 2- and 4-byte stores (the span form's
        // ptx had no st.global.v4): every vector of a span row written piecewise.
        static_assert(sizeof(Vec<T, VEC>) == sizeof(uint4), "16-byte vectors");
        uint4 w;
        memcpy(&w, &o, sizeof(w));
        asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(out + col), "r"(w.x),
                     "r"(w.y), "r"(w.z), "r"(w.w)
                     : "memory");
      } else {
        // The span's first or last vector of a row off the 16-byte grid: only the row's
        // own elements, one at a time (the others belong to the neighbouring rows).
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          if (col + e >= 0 && col + e < end) out[col + e] = o.v[e];
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Host

// How many clusters of n blocks of `block` threads of `kernel`, each with `smem` bytes of
// dynamic shared memory, run at once here; 0 when it cannot run as clusters: the kernel's
// code was not compiled for sm_90 (the 8.0 pass, or its PTX JIT-compiled for a newer GPU),
// or fewer than half the SMs would be busy. Cached per device, kernel and n. (The plan
// names no cluster where the override softmax.cluster=0 or the GPU has no sm_90 code.)
template <typename Kernel>
int cluster_fit(Kernel kernel, int block, int n, int smem) {
  if (!runs_sm90_code(kernel)) return 0;
  return cached_launch_query(reinterpret_cast<const void*>(kernel), block, n, [&] {
    if (!allow_dynamic_smem(kernel, smem)) return 0;  // no room here
    ClusterLaunch cl(dim3(1, n), block, smem);        // the chunks of one row: blockIdx.y = rank
    const int active = cl.max_active(kernel);
    return active * n >= num_sms() / 2 ? active : 0;
  });
}

}  // namespace softmax
}  // namespace fused
