// norm_fwd_long: rows too long for registers (plan.h), a block per row: Welford (of x - x0)
// over one read, then a second read (mostly from L2) to write y.

#include "cuda/norm/families.h"

namespace fused {
namespace norm {
namespace {

// Welford's running (count, mean, sum of squared deviations), merged with Chan's formula.
struct Welford {
  float n, mean, m2;
};

__device__ __forceinline__ Welford welford_merge(Welford a, Welford b) {
  const float n = a.n + b.n;
  if (n == 0.f) return a;
  const float d = b.mean - a.mean, wb = b.n / n;
  return {n, a.mean + d * wb, a.m2 + b.m2 + d * d * a.n * wb};
}

__device__ __forceinline__ Welford warp_welford(Welford w) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Welford other{__shfl_down_sync(0xffffffffu, w.n, o), __shfl_down_sync(0xffffffffu, w.mean, o),
                  __shfl_down_sync(0xffffffffu, w.m2, o)};
    w = welford_merge(w, other);
  }
  return w;  // valid in lane 0
}

// Block-wide Welford merge in a fixed tree order; every thread receives the result.
__device__ Welford block_welford(Welford w, float (*smem)[32]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  w = warp_welford(w);
  if (lane == 0) {
    smem[0][warp] = w.n;
    smem[1][warp] = w.mean;
    smem[2][warp] = w.m2;
  }
  __syncthreads();
  if (warp == 0) {
    const bool have = lane < static_cast<int>(blockDim.x / 32);
    w = have ? Welford{smem[0][lane], smem[1][lane], smem[2][lane]} : Welford{0.f, 0.f, 0.f};
    w = warp_welford(w);
    if (lane == 0) {
      smem[0][0] = w.n;
      smem[1][0] = w.mean;
      smem[2][0] = w.m2;
    }
  }
  __syncthreads();
  w = Welford{smem[0][0], smem[1][0], smem[2][0]};
  __syncthreads();
  return w;
}

template <typename T, typename W, typename R, int VEC>
__global__ void __launch_bounds__(kLongThreads) norm_fwd_long(FwdParams<T, W, R> p) {
  grid_dependency_wait();  // launched early (launch_early): nothing global before this
  __shared__ float smem[3][32];
  const int nvec = p.cols / VEC;
  const float inv_n = 1.f / static_cast<float>(p.cols);
  const DropSeed dseed = p.drop.on ? drop_seed(p) : DropSeed{};
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const int64_t off = row * p.cols;
    // Pass 1: read x (+ residual, writing the sum); Welford per vector of x - shift (see
    // row_first), merged per thread.
    const float shift = p.layer ? row_first(p, off, p.residual != nullptr, p.drop.on, dseed) : 0.f;
    Welford acc{0.f, 0.f, 0.f};
    for (int c = threadIdx.x; c < nvec; c += blockDim.x) {
      const int64_t e = off + static_cast<int64_t>(c) * VEC;
      FVec<VEC> f = to_float(load_raw<T, VEC>(p.x + e));
      if (p.drop.on) drop_input(f, p, e, static_cast<int64_t>(c) * VEC, dseed);
      if (p.residual) {
        const FVec<VEC> r = to_float(load_raw<R, VEC>(p.residual + e));
#pragma unroll
        for (int j = 0; j < VEC; ++j) f.v[j] += r.v[j];
        const Raw<R, VEC> v = from_float<R, VEC>(f);
        store_raw<R, VEC>(p.sum + e, v);
        f = to_float(v);  // normalize the rounded sum
      }
      float m = 0.f, m2 = 0.f;
#pragma unroll
      for (int j = 0; j < VEC; ++j) f.v[j] -= shift;
#pragma unroll
      for (int j = 0; j < VEC; ++j) m += f.v[j];
      m *= 1.f / VEC;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float d = f.v[j] - m;
        m2 += d * d;
      }
      acc = welford_merge(acc, Welford{static_cast<float>(VEC), m, m2});
    }
    acc = block_welford(acc, smem);
    const float mean = p.layer ? shift + acc.mean : 0.f;
    // rms norm (shift 0): E[x^2] = var + mean^2 (non-negative terms, no cancellation)
    const float ms = acc.m2 * inv_n + (p.layer ? 0.f : acc.mean * acc.mean);
    const float rstd = rsqrtf(ms + p.eps);
    // Pass 2: read the rows again (this thread's own elements; mostly L2 hits), write y.
    for (int c = threadIdx.x; c < nvec; c += blockDim.x) {
      const int64_t e = off + static_cast<int64_t>(c) * VEC;
      FVec<VEC> o =
          p.residual ? to_float(load_raw<R, VEC>(p.sum + e)) : to_float(load_raw<T, VEC>(p.x + e));
      const FVec<VEC> w = param_or<W, VEC>(p.weight, c, 1.f);
      const FVec<VEC> b = param_or<W, VEC>(p.bias, c, 0.f);
#pragma unroll
      for (int j = 0; j < VEC; ++j) o.v[j] = (o.v[j] - mean) * rstd * w.v[j] + b.v[j];
      store_raw<T, VEC>(p.y + e, from_float<T, VEC>(o));
    }
    if (threadIdx.x == 0) {
      if (p.mean) p.mean[row] = mean;
      p.rstd[row] = rstd;
    }
  }
}

}  // namespace

template <typename T, typename W, typename R, int VEC>
void fwd_long(const FwdParams<T, W, R>& p, const Step& s) {
  launch_early(norm_fwd_long<T, W, R, VEC>, dim3(grid_for(s.blocks)), dim3(kLongThreads), 0, p);
}

#define FUSED_INSTANCE(T, W, R, VEC) \
  template void fwd_long<T, W, R, VEC>(const FwdParams<T, W, R>&, const Step&);
FUSED_NORM_FOR_TYPES(FUSED_INSTANCE)
#undef FUSED_INSTANCE

}  // namespace norm
}  // namespace fused
