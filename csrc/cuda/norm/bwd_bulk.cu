
#include "cuda/norm/bwd_common.cuh"
#include "cuda/norm/families.h"

namespace fused {
namespace norm {
namespace {

// norm_bwd_bulk: 16-bit rows of 65-128 vectors (520-1024 columns), parameters and rows in
// x's dtype, sm_90 (docs/design/norm.md#tried-not-kept). norm_bwd_regs holds a row in 64 threads'
// registers next to their 32 dweight / dbias accumulators: 16 warps an SM with one row each
// in flight, where softmax's backward over the same bytes keeps ~4x the bytes in flight. Here
// a row has the same 64 threads (a pair of warps, 2 vectors a thread), but the copy engine
// brings it: each pair has its own ring of S one-row slots (x, dy, d_sum: a cp.async.bulk an
// input), so S - 1 rows a pair are in flight while one is used and no register holds them.
// A row is read from its slot once, into registers (x - mean and dy as floats); the pair adds
// its two warps' row sums through shared memory at a named barrier of its 64 threads (no
// block barrier in the row loop), after which the slot is refilled, and writes dx. The
// dweight / dbias terms stay in registers; at the end the block's 4 pairs add theirs in pair
// order: one partial row a block, deterministic.
// dx = rstd (g - c1 - xhat c2) (g = dy w, xhat = (x - mean) rstd, c1 = mean g, c2 = mean
// g xhat) as d w + (t kc + kb) with t = x - mean, d = dy rstd, kc = -rstd^2 c2,
// kb = -rstd c1: 2 operations an element; dweight += d t, dbias += dy.
constexpr int kBulkBwdPairs = kBulkBwdThreads / 64;  // rows in step in a block
constexpr int kBulkBwdPitch = 64 * kBulkBwdVpt * 8;  // a slot's row: 1024 elements

// A slot: one row of x, dy (and d_sum) at a fixed pitch; a pair's ring is S slots.
__host__ __device__ constexpr size_t bulk_bwd_slot(bool dsum) {
  return (2 + dsum) * size_t{kBulkBwdPitch} * 2;
}

// A barrier of `threads` threads (a multiple of 32) on hardware barrier `id` (0 is
// __syncthreads'): orders their shared-memory accesses like __syncthreads.
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Launch bound: two blocks an SM (<= 128 registers). LAYER: layer_norm's backward (mean, the
// g sum, dbias); otherwise rms_norm's (mean 0, no bias), which skips them: 3 of ~11
// operations an element.
template <typename T, bool DSUM, bool LAYER, int S>
__global__ void __launch_bounds__(kBulkBwdThreads, 2) norm_bwd_bulk(const BwdParams<T, T, T> p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static_assert(sizeof(T) == 2, "16-bit rows: 8 elements a 16-byte vector");
  constexpr int VEC = 8, VPT = kBulkBwdVpt, PITCH = kBulkBwdPitch, PAIRS = kBulkBwdPairs;
  constexpr int kInputs = 2 + DSUM;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  __shared__ uint64_t full[PAIRS][S];
  __shared__ float2 sums[PAIRS][2][2];  // [pair][row parity][warp]: (sum g, sum g t)
  const int cols = p.cols, nvec = cols / VEC;
  const int lane = threadIdx.x % 32, pair = threadIdx.x / 64, half = threadIdx.x / 32 % 2;
  const int u = threadIdx.x % 64;  // the thread in its pair: vectors u and u + 64 of a row
  // The pair's rows: first + j * pairs, j < mine.
  const int64_t pairs = static_cast<int64_t>(gridDim.x) * PAIRS;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * PAIRS + pair;
  const int64_t mine = first < p.rows ? (p.rows - first + pairs - 1) / pairs : 0;
  T* const ring = reinterpret_cast<T*>(dyn_smem) + pair * S * kInputs * PITCH;
  const uint32_t row_bytes = static_cast<uint32_t>(cols * sizeof(T));
  auto stage = [&](int64_t j, int s) {  // the pair's row j into slot s (thread u == 0)
    const int64_t off = (first + j * pairs) * cols;
    T* dst = ring + s * kInputs * PITCH;
    mbar_expect(&full[pair][s], kInputs * row_bytes);
    bulk_load(dst, p.x + off, row_bytes, &full[pair][s]);
    bulk_load(dst + PITCH, p.dy + off, row_bytes, &full[pair][s]);
    if constexpr (DSUM) bulk_load(dst + 2 * PITCH, p.dsum + off, row_bytes, &full[pair][s]);
  };
  // The slots past the row (never copied to) hold zeros: a row is read whole, without
  // bounds checks, and there dy = 0 adds nothing to the sums or the dweight / dbias terms.
  bool valid[VPT];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    valid[i] = u + 64 * i < nvec;
    if (!valid[i]) {
      for (int e = 0; e < S * kInputs; ++e) {
        *reinterpret_cast<uint4*>(ring + e * PITCH + (u + 64 * i) * VEC) = make_uint4(0, 0, 0, 0);
      }
    }
  }
  if (threadIdx.x < PAIRS * S) mbar_init(&full[0][0] + threadIdx.x);
  // Launched early (launch_early): shared memory only before this, nothing global.
  grid_dependency_wait();
  __syncthreads();  // the mbarriers exist before any copy or wait; the zeros are in
  // w as floats (1 where there is no weight or past the row).
  float w[VPT][VEC];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const FVec<VEC> f = param_or<T, VEC>(valid[i] ? p.weight : nullptr, u + 64 * i, 1.f);
#pragma unroll
    for (int k = 0; k < VEC; ++k) w[i][k] = f.v[k];
  }
  if (u == 0) {
    for (int j = 0; j < S && j < mine; ++j) stage(j, j);
  }
  // mean / rstd of the pair's rows 32 at a time, lane l holding row 32 b + l's; the next 32
  // loaded while these are used.
  float stat[2][2];  // [this batch, next][mean, rstd]
  auto load_stats = [&](int64_t b, float(&st)[2]) {
    const int64_t j = 32 * b + lane;
    const int64_t row = first + j * pairs;
    st[0] = (LAYER && j < mine) ? p.mean[row] : 0.f;
    st[1] = j < mine ? p.rstd[row] : 0.f;
  };
  load_stats(0, stat[0]);
  load_stats(1, stat[1]);

  float dw[VPT][VEC], db[VPT][VEC];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) dw[i][k] = db[i][k] = 0.f;
  }
  const float inv_n = 1.f / static_cast<float>(cols);
  T* dx = p.dx + first * cols + u * VEC;  // the pair's row j: dx + j * step
  const int64_t step = pairs * cols;
  int s = 0;
  uint32_t phase = 0;  // of slot s's barrier
  for (int64_t j = 0; j < mine; ++j, dx += step) {
    if (j % 32 == 0 && j > 0) {
      stat[0][0] = stat[1][0], stat[0][1] = stat[1][1];
      load_stats(j / 32 + 1, stat[1]);
    }
    const float mean = __shfl_sync(0xffffffffu, stat[0][0], static_cast<int>(j % 32));
    const float rstd = __shfl_sync(0xffffffffu, stat[0][1], static_cast<int>(j % 32));
    const T* src = ring + s * kInputs * PITCH + u * VEC;
    mbar_wait(&full[pair][s], phase);
    // The row into registers: t = x - mean, dy; the two sums over the thread's elements (a
    // pair of add chains a vector).
    float t[VPT][VEC], d[VPT][VEC], sg[VPT], sgt[VPT];
    Raw<T, VEC> ds[VPT];
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      sg[i] = sgt[i] = 0.f;
      const FVec<VEC> xf = to_float(lds_raw<T, VEC>(src + 64 * i * VEC));
      const FVec<VEC> df = to_float(lds_raw<T, VEC>(src + PITCH + 64 * i * VEC));
      if constexpr (DSUM) ds[i] = lds_raw<T, VEC>(src + 2 * PITCH + 64 * i * VEC);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        t[i][k] = LAYER ? xf.v[k] - mean : xf.v[k];
        d[i][k] = df.v[k];
        const float g = df.v[k] * w[i][k];
        if constexpr (LAYER) sg[i] += g;
        sgt[i] += g * t[i][k];
      }
    }
    static_assert(VPT == 2, "two add chains a sum");
    const float a = LAYER ? warp_sum(sg[0] + sg[1]) : 0.f, b = warp_sum(sgt[0] + sgt[1]);
    if (lane == 0) sums[pair][j & 1][half] = make_float2(a, b);
    // Both warps' sums are in, and both have read the slot: refill it.
    named_barrier(1 + pair, 64);
    if (u == 0 && j + S < mine) stage(j + S, s);
    if (++s == S) s = 0, phase ^= 1;
    const float2 s0 = sums[pair][j & 1][0], s1 = sums[pair][j & 1][1];  // one order for both
    const float c1 = LAYER ? (s0.x + s1.x) * inv_n : 0.f;
    const float c2 = (s0.y + s1.y) * rstd * inv_n;
    const float kb = -rstd * c1, kc = -rstd * rstd * c2;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      FVec<VEC> o;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float dr = d[i][k] * rstd;
        o.v[k] = fmaf(dr, w[i][k], LAYER ? fmaf(t[i][k], kc, kb) : t[i][k] * kc);
        dw[i][k] = fmaf(dr, t[i][k], dw[i][k]);
        if constexpr (LAYER) db[i][k] += d[i][k];
      }
      if constexpr (DSUM) {
        const FVec<VEC> sf = to_float(ds[i]);
#pragma unroll
        for (int k = 0; k < VEC; ++k) o.v[k] += sf.v[k];
      }
      if (valid[i]) store_raw<T, VEC>(dx + 64 * i * VEC, from_float<T, VEC>(o));
    }
  }
  if (!p.dw_part && !p.db_part) return;  // uniform across the grid
  // The pairs' partials through the (now idle) rings, added in pair order: [pair][term][PITCH]
  // floats, 32 KB (the rings hold >= 2 slots of 4 KB a pair).
  static_assert(S * bulk_bwd_slot(false) >= 2 * PITCH * sizeof(float), "the partials fit");
  __syncthreads();  // every pair's last slot read
  float* part = reinterpret_cast<float*>(dyn_smem);
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    if (valid[i]) {
      float* q = part + pair * 2 * PITCH + (u + 64 * i) * VEC;
      store_floats<VEC>(q, dw[i]);
      if constexpr (LAYER) store_floats<VEC>(q + PITCH, db[i]);  // rms: no dbias
    }
  }
  __syncthreads();
  constexpr int CPT = PITCH / kBulkBwdThreads;  // columns a thread in the sum: 4
  const int c0 = CPT * static_cast<int>(threadIdx.x);
  if (c0 < cols) {
    float sw[CPT], sb[CPT];
#pragma unroll
    for (int k = 0; k < CPT; ++k) sw[k] = sb[k] = 0.f;
    for (int q = 0; q < PAIRS; ++q) {
      const float* src = part + q * 2 * PITCH + c0;
#pragma unroll
      for (int k = 0; k < CPT; ++k) {
        sw[k] += src[k];
        if constexpr (LAYER) sb[k] += src[PITCH + k];
      }
    }
    const int64_t e = static_cast<int64_t>(blockIdx.x) * cols + c0;
    if (p.dw_part) store_floats<CPT>(p.dw_part + e, sw);
    if (p.db_part) store_floats<CPT>(p.db_part + e, sb);
  }
#else
  __trap();  // the host launches it only where sm_90 code runs (backward_bulk)
#endif
}

}  // namespace

// norm_bwd_bulk with the step's slots a pair (stages) for its norm and d_sum; refused where
// its sm_90 code does not run here or not one block fits an SM.
template <typename T>
bool bwd_bulk(const BwdParams<T, T, T>& p, NormBackward& nb, const Step& s) {
  TORCH_INTERNAL_ASSERT(
      s.smem == static_cast<int>(kBulkBwdPairs * s.stages * bulk_bwd_slot(s.res != 0)),
      "norm plan: norm_bwd_bulk's slots take other shared memory than ", s.smem);
  auto run = [&](auto kernel) {
    if (!runs_sm90_code(kernel)) return false;
    return launch_resident_with_partials(kernel, s.blocks, kBulkBwdThreads,
                                         static_cast<size_t>(s.smem), p, nb);
  };
  // layer_norm's rows (which keep a mean) on the kernel's layer form; rms_norm's (no mean,
  // never a bias) on its rms form.
  auto with_stages = [&](auto s_tag) {
    constexpr int S = decltype(s_tag)::value;
    if (s.layer) {
      return s.res ? run(norm_bwd_bulk<T, true, true, S>) : run(norm_bwd_bulk<T, false, true, S>);
    }
    return s.res ? run(norm_bwd_bulk<T, true, false, S>) : run(norm_bwd_bulk<T, false, false, S>);
  };
  switch (s.stages) {
    case 2:
      return with_stages(std::integral_constant<int, 2>{});
    case 3:
      return with_stages(std::integral_constant<int, 3>{});
    case 4:
      return with_stages(std::integral_constant<int, 4>{});
  }
  TORCH_INTERNAL_ASSERT(false, "norm plan: norm_bwd_bulk stages=", s.stages);
}

template bool bwd_bulk<c10::Half>(const BwdParams<c10::Half, c10::Half, c10::Half>&, NormBackward&,
                                  const Step&);
template bool bwd_bulk<c10::BFloat16>(const BwdParams<c10::BFloat16, c10::BFloat16, c10::BFloat16>&,
                                      NormBackward&, const Step&);

}  // namespace norm
}  // namespace fused
