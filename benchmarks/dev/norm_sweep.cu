// Launch-shape sweep for bf16 LayerNorm / RMSNorm with the row held in registers (fp32 math):
// forward y = (x - mean) * rstd * w + b (+ mean, rstd), backward dx plus deterministic dweight /
// dbias through a persistent grid (per-thread column partials in registers -> [blocks, cols]
// float partials -> fixed-order column sum). Timed against the run's device-to-device copy.
// Standalone (no torch):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v \
//        benchmarks/dev/norm_sweep.cu -o /tmp/nsweep && /tmp/nsweep
// Only exact fits (cols = TPR * VPT * 8): a bound on what a register-row kernel reaches.
// Bytes counted: fwd x + y, bwd x + dy + dx (w, b, mean / rstd and partials left out).
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <vector>
#include <algorithm>

constexpr float EPS = 1e-5f;
__device__ __forceinline__ float lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ uint32_t pack(float a, float b) {
  __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&h);
}
__device__ __forceinline__ uint4 pack8(const float* f) {
  return make_uint4(pack(f[0], f[1]), pack(f[2], f[3]), pack(f[4], f[5]), pack(f[6], f[7]));
}
__device__ __forceinline__ void unpack(uint4 r, float* f) {
  f[0] = lo(r.x); f[1] = hi(r.x); f[2] = lo(r.y); f[3] = hi(r.y);
  f[4] = lo(r.z); f[5] = hi(r.z); f[6] = lo(r.w); f[7] = hi(r.w);
}

// XOR with a runtime zero that ptxas cannot fold: each unpack becomes a fresh value, so ptxas
// neither keeps the phase-1 fp32 copies of x / dy live across the reduction (CSE) nor hoists w's
// unpack out of the row loop; only the packed bf16x2 words (half the registers) stay live.
__device__ __forceinline__ uint4 fresh(uint4 r, uint32_t z) { return make_uint4(r.x ^ z, r.y ^ z, r.z ^ z, r.w ^ z); }

// Sum N values at once over the TPR threads of a row (interleaved shuffles give ILP, and one
// __syncthreads serves all N when TPR > 32). buf: [N][NW] floats, NW = BLOCK / 32.
template <int TPR, int N, int NW>
__device__ __forceinline__ void row_sum(float (&v)[N], float (*buf)[NW]) {
  constexpr int W = TPR < 32 ? TPR : 32;
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1)
#pragma unroll
    for (int n = 0; n < N; ++n) v[n] += __shfl_xor_sync(0xffffffffu, v[n], o);
  if constexpr (TPR > 32) {
    const int warp = threadIdx.x / 32, first = warp / (TPR / 32) * (TPR / 32);
    if (threadIdx.x % 32 == 0)
#pragma unroll
      for (int n = 0; n < N; ++n) buf[n][warp] = v[n];
    __syncthreads();
#pragma unroll
    for (int n = 0; n < N; ++n) {
      float t = buf[n][first];  // same fixed order in every thread: bitwise identical row sums
#pragma unroll
      for (int i = 1; i < TPR / 32; ++i) t += buf[n][first + i];
      v[n] = t;
    }
  }
}

// Runtime-shaped reduction as in the library (csrc/cuda/norm.cu group_sum): tpr a runtime
// power of two <= 32 or multiple of 32, shuffles then one barrier and a warp_sum of the slots.
template <int N>
__device__ __forceinline__ void group_sum_rt(float (&v)[N], int tpr, float (*buf)[32]) {
  if (tpr <= 32) {
    for (int o = tpr / 2; o > 0; o >>= 1)
#pragma unroll
      for (int n = 0; n < N; ++n) v[n] += __shfl_xor_sync(0xffffffffu, v[n], o);
    return;
  }
  const int warp = threadIdx.x / 32, l = threadIdx.x % 32, wpg = tpr / 32, first = warp - warp % wpg;
#pragma unroll
  for (int n = 0; n < N; ++n) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v[n] += __shfl_xor_sync(0xffffffffu, v[n], o);
    if (l == 0) buf[n][warp] = v[n];
  }
  __syncthreads();
#pragma unroll
  for (int n = 0; n < N; ++n) {
    v[n] = l < wpg ? buf[n][first + l] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v[n] += __shfl_xor_sync(0xffffffffu, v[n], o);
  }
}

// ---- forward: one row per TPR threads, BLOCK / TPR rows per block ----
// F: what the library's runtime-shaped v3 kernel does differently, one bit each, to find
// which of them costs the 10-15 points between it (79-84% layer) and this kernel (93-97%):
//   kLate    w / b loaded in the epilogue, after the reductions (the library's v3)
//   kRt      threads per row, row length and rows at run time, i.e. all three of:
//   kTprRt   threads per row at run time (strides, lane, runtime-width row_sum)
//   kMask    per-vector bounds checks against a runtime row length
//   kLoop    a grid-stride row loop with a row-validity check
//   kShift   layer norm sums x - x0 (x0 loaded per row) so a constant row is exact
//   kCap64   launch bound (BLOCK, 1024 / BLOCK): <= 64 registers, as the library's
//   kCorr    instead of kShift: mean, then sum(d) and sum(d^2) in ONE reduction of two
//            values; mean += sum(d) / n (exact for a constant row: x - mean is exact),
//            var = sum(d^2) / n - (sum(d) / n)^2
enum : int { kLate = 1, kTprRt = 2, kShift = 4, kCap64 = 8, kCorr = 16, kMask = 32, kLoop = 64,
             kRt = kTprRt | kMask | kLoop };
template <int TPR, int VPT, int BLOCK, bool RMS, int F = 0>
__global__ void __launch_bounds__(BLOCK, (F & kCap64) ? 1024 / BLOCK : 1)
    norm_fwd(const uint4* __restrict__ x, const uint4* __restrict__ w, const uint4* __restrict__ b,
             uint4* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd, int tpr_rt,
             int nvec_rt, long rows) {
  constexpr bool TR = F & kTprRt, MK = F & kMask, LP = F & kLoop;
  constexpr int N = VPT * 8;
  __shared__ float buf[2][2][32];
  const int tpr = TR ? tpr_rt : TPR, nvec = MK ? nvec_rt : TPR * VPT;
  const int rpb = TR ? blockDim.x / tpr : BLOCK / TPR;
  const float inv = MK ? 1.f / (nvec * 8) : 1.f / (TPR * VPT * 8);
  const int lane = threadIdx.x % tpr;
  const long step = LP ? (long)gridDim.x * rpb : rows;
  for (long first = blockIdx.x * (long)rpb; first < rows; first += step) {
    const long row = first + threadIdx.x / tpr;
    const bool valid = !LP || row < rows;
    auto live = [&](int k) { return (!LP || valid) && (!MK || k * tpr + lane < nvec); };
    const uint4* p = x + row * nvec + lane;
    uint4 rx[VPT], rw[VPT], rb[VPT];
    float shift = 0.f;
    if constexpr ((F & kShift) && !RMS)
      if (valid) shift = __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(x + row * nvec));
#pragma unroll
    for (int k = 0; k < VPT; ++k) if (live(k)) rx[k] = __ldg(p + k * tpr);
    auto load_wb = [&] {
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        if (live(k)) {
          rw[k] = __ldg(w + lane + k * tpr);
          if constexpr (!RMS) rb[k] = __ldg(b + lane + k * tpr);
        }
      }
    };
    if constexpr (!(F & kLate)) load_wb();
    float v[N];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      if (live(k)) unpack(rx[k], v + 8 * k);
      else for (int e = 0; e < 8; ++e) v[8 * k + e] = 0.f;
    }
    auto reduce = [&](auto& a, float (*bf)[32]) {
      if constexpr (TR) group_sum_rt(a, tpr, bf);
      else row_sum<TPR, sizeof(a) / sizeof(float), 32>(a, bf);
    };
    float m[1] = {0.f};
    if constexpr (!RMS) {
#pragma unroll
      for (int k = 0; k < VPT; ++k)
        if (live(k))
#pragma unroll
          for (int e = 0; e < 8; ++e) m[0] += v[8 * k + e] - shift;
      reduce(m, buf[0]);
      m[0] = shift + m[0] * inv;
    }
    float rs;
    if constexpr ((F & kCorr) && !RMS) {
      float q[2] = {0.f, 0.f};
#pragma unroll
      for (int k = 0; k < VPT; ++k)
        if (live(k))
#pragma unroll
          for (int e = 0; e < 8; ++e) { const float d = v[8 * k + e] - m[0]; q[0] += d; q[1] += d * d; }
      reduce(q, buf[1]);
      const float dm = q[0] * inv;
      m[0] += dm;
      rs = rsqrtf(fmaxf(q[1] * inv - dm * dm, 0.f) + EPS);
    } else {
      float q[1] = {0.f};
#pragma unroll
      for (int k = 0; k < VPT; ++k)
        if (live(k))
#pragma unroll
          for (int e = 0; e < 8; ++e) { const float d = v[8 * k + e] - m[0]; q[0] += d * d; }
      reduce(q, buf[1]);
      rs = rsqrtf(q[0] * inv + EPS);
    }
    if (valid && lane == 0) { if (!RMS) mean[row] = m[0]; rstd[row] = rs; }
    if constexpr (F & kLate) load_wb();
    uint4* o = y + row * nvec + lane;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      if (!live(k)) continue;
      float fw[8], fb[8] = {}, f[8];
      unpack(rw[k], fw);
      if constexpr (!RMS) unpack(rb[k], fb);
#pragma unroll
      for (int e = 0; e < 8; ++e) f[e] = (v[8 * k + e] - m[0]) * rs * fw[e] + fb[e];
      o[k * tpr] = pack8(f);
    }
    if constexpr (!LP) break;
  }
}

// ---- backward: persistent grid of K blocks per SM. A block iteration takes R * (BLOCK / TPR)
// consecutive rows (R rows per thread, all loads issued together). Each thread keeps dw / db for
// its 8 * VPT columns in registers over all rows it visits; at the end the BLOCK / TPR sub-rows
// combine in a fixed order through shared memory and the block writes one [NS * cols] float
// partial row. PF: the next iteration's x / dy / mean / rstd are loaded before this one reduces.
template <int TPR, int VPT, int BLOCK, int K, int R, bool PF, bool RMS>
__global__ void __launch_bounds__(BLOCK, K) norm_bwd(const uint4* __restrict__ x, const uint4* __restrict__ dy,
                                                     const uint4* __restrict__ w, const float* __restrict__ mean,
                                                     const float* __restrict__ rstd, uint4* __restrict__ dx,
                                                     float* __restrict__ part, long rows, uint32_t zero) {
  constexpr int RPB = BLOCK / TPR, LENV = TPR * VPT, N = VPT * 8, NW = BLOCK / 32, COLS = LENV * 8;
  constexpr int NS = RMS ? 1 : 2;  // per-row sums: [sum g,] sum g * xhat; partials: dw[, db]
  constexpr float INV = 1.f / COLS;
  __shared__ float buf[2][R * NS][NW];  // double-buffered: iteration i+1 writes while i may still read
  __shared__ __align__(16) float comb[RPB > 1 ? NS * COLS : 4];
  const int sub = threadIdx.x / TPR, lane = threadIdx.x % TPR;
  uint4 rw[VPT];
#pragma unroll
  for (int k = 0; k < VPT; ++k) rw[k] = __ldg(w + lane + k * TPR);  // w stays in registers
  float dw[N] = {}, db[N] = {};
  struct Tile { uint4 x[R][VPT], d[R][VPT]; float m[R], rs[R]; };
  auto load = [&](Tile& t, long g) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const long row = (g * R + r) * RPB + sub, o = row * LENV + lane;
#pragma unroll
      for (int k = 0; k < VPT; ++k) { t.x[r][k] = __ldg(x + o + k * TPR); t.d[r][k] = __ldg(dy + o + k * TPR); }
      t.m[r] = RMS ? 0.f : __ldg(mean + row);
      t.rs[r] = __ldg(rstd + row);
    }
  };
  auto compute = [&](const Tile& t, long g, int it) {
    const uint32_t z1 = zero & it, z2 = zero & ~it;  // both 0 at run time
    float s[R * NS];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float a = 0.f, c = 0.f;
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        float fx[8], fd[8], fw[8];
        unpack(fresh(t.x[r][k], z1), fx); unpack(fresh(t.d[r][k], z1), fd); unpack(fresh(rw[k], z1), fw);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float xh = (fx[e] - t.m[r]) * t.rs[r], gg = fd[e] * fw[e];
          a += gg; c += gg * xh;
        }
      }
      if constexpr (!RMS) s[r * NS] = a;
      s[r * NS + NS - 1] = c;
    }
    row_sum<TPR, R * NS, NW>(s, buf[it & 1]);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float a = RMS ? 0.f : s[r * NS] * INV, c = s[r * NS + NS - 1] * INV;
      uint4* o = dx + ((g * R + r) * RPB + sub) * LENV + lane;
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        float fx[8], fd[8], fw[8], f[8];  // re-unpacked: keeps x / dy packed (bf16x2) across the reduce
        unpack(fresh(t.x[r][k], z2), fx); unpack(fresh(t.d[r][k], z2), fd); unpack(fresh(rw[k], z2), fw);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float xh = (fx[e] - t.m[r]) * t.rs[r];
          f[e] = t.rs[r] * (fd[e] * fw[e] - a - xh * c);
          dw[8 * k + e] += fd[e] * xh;
          if constexpr (!RMS) db[8 * k + e] += fd[e];
        }
        o[k * TPR] = pack8(f);
      }
    }
  };
  const long groups = rows / (RPB * R);
  int it = 0;
  if constexpr (PF) {
    Tile cur, nxt;
    if (blockIdx.x < groups) load(cur, blockIdx.x);
    for (long g = blockIdx.x; g < groups; g += gridDim.x, ++it) {
      if (g + gridDim.x < groups) load(nxt, g + gridDim.x);
      compute(cur, g, it);
      cur = nxt;
    }
  } else {
    for (long g = blockIdx.x; g < groups; g += gridDim.x, ++it) { Tile t; load(t, g); compute(t, g, it); }
  }
  // Fixed-order combine of the sub-rows (sub 0 + 1 + ...); the last one writes the block's partial row.
  float* out = part + (long)blockIdx.x * NS * COLS;
#pragma unroll 1
  for (int s = 0; s < RPB; ++s) {
    if (sub == s) {
      float* dst = s == RPB - 1 ? out : comb;
#pragma unroll
      for (int k = 0; k < VPT; ++k)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int j = 0; j < NS; ++j) {
            const float* a = (j ? db : dw) + 8 * k + 4 * h;
            const int c = j * COLS + (lane + k * TPR) * 8 + 4 * h;
            float4 v = make_float4(a[0], a[1], a[2], a[3]);
            if (s > 0) { const float4 p = *reinterpret_cast<float4*>(comb + c); v.x += p.x; v.y += p.y; v.z += p.z; v.w += p.w; }
            *reinterpret_cast<float4*>(dst + c) = v;
          }
    }
    if (RPB > 1) __syncthreads();
  }
}

// Column sums of partials [P, NC] in a fixed order (bitwise reproducible): 32 columns x 16
// row slices per block, slice i sums rows i, i + 16, ... (4 accumulators for load ILP).
__global__ void __launch_bounds__(512) colsum(const float* __restrict__ part, float* __restrict__ out, int P, int NC) {
  __shared__ float s[16][33];
  const int c = blockIdx.x * 32 + threadIdx.x % 32, sl = threadIdx.x / 32;
  float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
  int p = sl;
  for (; p + 48 < P; p += 64) {
    a0 += part[(long)p * NC + c]; a1 += part[(long)(p + 16) * NC + c];
    a2 += part[(long)(p + 32) * NC + c]; a3 += part[(long)(p + 48) * NC + c];
  }
  for (; p < P; p += 16) a0 += part[(long)p * NC + c];
  s[sl][threadIdx.x % 32] = (a0 + a1) + (a2 + a3);
  __syncthreads();
  if (sl == 0) { float t = 0.f; for (int i = 0; i < 16; ++i) t += s[i][threadIdx.x]; out[c] = t; }
}

__global__ void flush(int* p, long n) { long i = (long)blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] = i; }
int* fl; long fln = 64 << 20;
template <typename F> float timeit(F f) {
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b); std::vector<float> ts;
  for (int r = 0; r < 25; ++r) { flush<<<fln / 256, 256>>>(fl, fln); cudaEventRecord(a); f(); cudaEventRecord(b); cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms, a, b); ts.push_back(ms); }
  std::sort(ts.begin(), ts.end()); cudaEventDestroy(a); cudaEventDestroy(b); return ts[ts.size() / 2] * 1000;
}

// ---- host: data, float64 reference, configurations ----
uint4 *X, *DY, *Y, *DX, *W, *B;
float *MEAN, *RSTD, *PART, *OUT;
const long NB = 128L << 20, PART_BYTES = 64L << 20, MAXC = 32768;
double copy_bps;  // bytes (read + written) per us of the device copy
int nsm;
std::vector<uint16_t> hx, hdy;
std::vector<float> hw, hb;
static float bf(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static uint16_t tobf(float f) { uint32_t u; memcpy(&u, &f, 4); return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16; }

struct Ref { std::vector<double> mean, rstd, dw, db; } ref[2];  // [layer, rms] for the current shape
long rrows = 0, rcols = 0;
void setup(long rows, long cols) {
  if (rows == rrows && cols == rcols) return;
  rrows = rows; rcols = cols;
  for (int rms = 0; rms < 2; ++rms) {
    Ref& R = ref[rms];
    R.mean.assign(rows, 0); R.rstd.assign(rows, 0); R.dw.assign(cols, 0); R.db.assign(cols, 0);
    std::vector<double> xr(cols);
    for (long r = 0; r < rows; ++r) {
      double m = 0, q = 0;
      for (long c = 0; c < cols; ++c) { xr[c] = bf(hx[r * cols + c]); m += xr[c]; }
      m = rms ? 0 : m / cols;
      for (long c = 0; c < cols; ++c) q += (xr[c] - m) * (xr[c] - m);
      const double rs = 1 / sqrt(q / cols + EPS);
      R.mean[r] = m; R.rstd[r] = rs;
      for (long c = 0; c < cols; ++c) { const double d = bf(hdy[r * cols + c]); R.dw[c] += d * (xr[c] - m) * rs; R.db[c] += d; }
    }
  }
}
long chk_rows(long rows, int i) { const long c[4] = {0, 1, rows / 2 + 1, rows - 1}; return c[i]; }

template <int TPR, int VPT, int BLOCK, bool RMS, int F = 0> void fwd1(long rows) {
  constexpr long cols = TPR * VPT * 8;
  setup(rows, cols);
  const Ref& R = ref[RMS];
  const float t = timeit([&] { norm_fwd<TPR, VPT, BLOCK, RMS, F><<<rows / (BLOCK / TPR), BLOCK>>>(X, W, B, Y, MEAN, RSTD, TPR, TPR * VPT, rows); });
  std::vector<float> hm(rows), hr(rows);
  std::vector<uint16_t> hy(cols);
  cudaMemcpy(hm.data(), MEAN, rows * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(hr.data(), RSTD, rows * 4, cudaMemcpyDeviceToHost);
  double ey = 0, em = 0, er = 0;
  for (long r = 0; r < rows; ++r) { if (!RMS) em = std::max(em, fabs(hm[r] - R.mean[r])); er = std::max(er, fabs(hr[r] / R.rstd[r] - 1)); }
  for (int i = 0; i < 4; ++i) {
    const long r = chk_rows(rows, i);
    cudaMemcpy(hy.data(), reinterpret_cast<uint16_t*>(Y) + r * cols, cols * 2, cudaMemcpyDeviceToHost);
    for (long c = 0; c < cols; ++c)
      ey = std::max(ey, fabs(bf(hy[c]) - ((bf(hx[r * cols + c]) - R.mean[r]) * R.rstd[r] * hw[c] + (RMS ? 0 : hb[c]))));
  }
  cudaFuncAttributes fa;
  cudaFuncGetAttributes(&fa, norm_fwd<TPR, VPT, BLOCK, RMS, F>);
  printf("%5ldx%-5ld %s fwd tpr %4d vpt %d block %4d F %s%s%s%s%s%s%s regs %3d lmem %2d | %7.1f us %5.1f%% "
         "| err y %.1e mean %.1e rstd(rel) %.1e\n", rows, cols, RMS ? "rms  " : "layer", TPR, VPT, BLOCK,
         F & kLate ? "L" : "-", F & kTprRt ? "T" : "-", F & kMask ? "M" : "-", F & kLoop ? "O" : "-",
         F & kShift ? "S" : "-", F & kCap64 ? "C" : "-",
         F & kCorr ? "X" : "-", fa.numRegs, (int)fa.localSizeBytes, t,
         100 * 2 * rows * cols * 2.0 / t / copy_bps, ey, em, er);
}

// The reference mean / rstd (float32) into MEAN / RSTD: the backward's inputs.
void upload_stats(long rows, bool RMS) {
  std::vector<float> tmp(rows);
  for (long r = 0; r < rows; ++r) tmp[r] = (float)ref[RMS].mean[r];
  cudaMemcpy(MEAN, tmp.data(), rows * 4, cudaMemcpyHostToDevice);
  for (long r = 0; r < rows; ++r) tmp[r] = (float)ref[RMS].rstd[r];
  cudaMemcpy(RSTD, tmp.data(), rows * 4, cudaMemcpyHostToDevice);
}

// The backward's errors against the float64 reference: dx on 4 rows (DX), dw / db (OUT, the
// column sums: [dw, db] of cols each) on every column, with the largest |dw|, |db|.
void check_bwd(long rows, long cols, bool RMS, long NC, double& edx, double& edw, double& edb,
               double& mdw, double& mdb) {
  const Ref& F = ref[RMS];
  std::vector<uint16_t> hd(cols);
  std::vector<float> ho(NC);
  cudaMemcpy(ho.data(), OUT, NC * 4, cudaMemcpyDeviceToHost);
  edx = edw = edb = mdw = mdb = 0;
  for (int i = 0; i < 4; ++i) {
    const long r = chk_rows(rows, i);
    cudaMemcpy(hd.data(), reinterpret_cast<uint16_t*>(DX) + r * cols, cols * 2, cudaMemcpyDeviceToHost);
    double a = 0, b = 0;
    for (long c = 0; c < cols; ++c) {
      const double g = bf(hdy[r * cols + c]) * hw[c], xh = (bf(hx[r * cols + c]) - F.mean[r]) * F.rstd[r];
      a += g; b += g * xh;
    }
    a = RMS ? 0 : a / cols; b /= cols;
    for (long c = 0; c < cols; ++c) {
      const double g = bf(hdy[r * cols + c]) * hw[c], xh = (bf(hx[r * cols + c]) - F.mean[r]) * F.rstd[r];
      edx = std::max(edx, fabs(bf(hd[c]) - F.rstd[r] * (g - a - xh * b)));
    }
  }
  for (long c = 0; c < cols; ++c) {
    edw = std::max(edw, fabs(ho[c] - F.dw[c])); mdw = std::max(mdw, fabs(F.dw[c]));
    if (!RMS) { edb = std::max(edb, fabs(ho[cols + c] - F.db[c])); mdb = std::max(mdb, fabs(F.db[c])); }
  }
}

template <int TPR, int VPT, int BLOCK, int K, int R, bool PF, bool RMS> void bwd1(long rows) {
  constexpr long cols = TPR * VPT * 8, NC = (RMS ? 1 : 2) * cols;
  setup(rows, cols);
  const int grid = K * nsm;
  if (grid * NC * 4 > PART_BYTES) { printf("skip: partials too large\n"); return; }
  upload_stats(rows, RMS);
  auto kern = norm_bwd<TPR, VPT, BLOCK, K, R, PF, RMS>;
  int occ = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, BLOCK, 0);
  auto main_k = [&] { kern<<<grid, BLOCK>>>(X, DY, W, MEAN, RSTD, DX, PART, rows, 0u); };
  const float tm = timeit(main_k);
  const float tt = timeit([&] { main_k(); colsum<<<NC / 32, 512>>>(PART, OUT, grid, NC); });
  double edx, edw, edb, mdw, mdb;
  check_bwd(rows, cols, RMS, NC, edx, edw, edb, mdw, mdb);
  const double bytes = 3 * rows * cols * 2.0;
  printf("%5ldx%-5ld %s bwd tpr %4d vpt %d block %4d k %d r %d pf %d occ %d | %7.1f us %5.1f%% +colsum %7.1f us %5.1f%% "
         "| err dx %.1e dw(rel) %.1e db(rel) %.1e\n", rows, cols, RMS ? "rms  " : "layer", TPR, VPT, BLOCK, K, R, PF, occ,
         tm, 100 * bytes / tm / copy_bps, tt, 100 * bytes / tt / copy_bps, edx, edw / mdw, RMS ? 0 : edb / mdb);
}
template <int TPR, int VPT, int BLOCK, int F = 0> void fwd(long rows) {
  fwd1<TPR, VPT, BLOCK, false, F>(rows); fwd1<TPR, VPT, BLOCK, true, F>(rows);
}
// The library-difference matrix (see norm_fwd's F) at one launch shape.
// Which part of kRt costs, each under the 64-register cap (the sweep's best at >= 8K).
template <int TPR, int VPT, int BLOCK> void fwd_matrix2(long rows) {
  fwd<TPR, VPT, BLOCK, kCap64>(rows); fwd<TPR, VPT, BLOCK, kCap64 | kTprRt>(rows);
  fwd<TPR, VPT, BLOCK, kCap64 | kMask>(rows); fwd<TPR, VPT, BLOCK, kCap64 | kLoop>(rows);
  fwd1<TPR, VPT, BLOCK, false, kCap64 | kShift>(rows); fwd1<TPR, VPT, BLOCK, false, kCap64 | kCorr>(rows);
  fwd<TPR, VPT, BLOCK, kCap64 | kMask | kLate>(rows); fwd1<TPR, VPT, BLOCK, false, kCap64 | kMask | kShift>(rows);
  fwd<TPR, VPT, BLOCK>(rows); fwd<TPR, VPT, BLOCK, kMask>(rows);
}
template <int TPR, int VPT, int BLOCK> void fwd_matrix(long rows) {
  fwd<TPR, VPT, BLOCK>(rows); fwd<TPR, VPT, BLOCK, kLate>(rows); fwd<TPR, VPT, BLOCK, kRt>(rows);
  fwd1<TPR, VPT, BLOCK, false, kShift>(rows); fwd<TPR, VPT, BLOCK, kCap64>(rows);
  fwd<TPR, VPT, BLOCK, kLate | kRt | kShift | kCap64>(rows);  // the library's v3 as a whole
  fwd1<TPR, VPT, BLOCK, false, kCorr>(rows); fwd1<TPR, VPT, BLOCK, false, kCorr | kRt>(rows);
  fwd<TPR, VPT, BLOCK, kRt | kCap64>(rows); fwd1<TPR, VPT, BLOCK, false, kCorr | kRt | kCap64>(rows);
}
template <int TPR, int VPT, int BLOCK, int K, int R = 1, bool PF = false> void bwd(long rows) {
  bwd1<TPR, VPT, BLOCK, K, R, PF, false>(rows); bwd1<TPR, VPT, BLOCK, K, R, PF, true>(rows);
}

// Buffers, host copies of x / dy / w / b, the copy ceiling (shared with norm_bwd_cluster_sweep.cu).
void init_data() {
  cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0);
  cudaMalloc(&X, NB); cudaMalloc(&DY, NB); cudaMalloc(&Y, NB); cudaMalloc(&DX, NB);
  cudaMalloc(&W, MAXC * 2); cudaMalloc(&B, MAXC * 2); cudaMalloc(&MEAN, 65536 * 4); cudaMalloc(&RSTD, 65536 * 4);
  cudaMalloc(&PART, PART_BYTES); cudaMalloc(&OUT, 2 * MAXC * 4); cudaMalloc(&fl, fln * 4);
  hx.resize(NB / 2); hdy.resize(NB / 2);
  for (size_t i = 0; i < hx.size(); ++i) {  // x in [-3, 7]: row mean ~2, tests the centred variance
    hx[i] = tobf((float)((i * 2654435761u) % 10007) / 1000.f - 3.f);
    hdy[i] = tobf((float)((i * 40503u + 7) % 8191) / 4096.f - 1.f);
  }
  std::vector<uint16_t> wb(MAXC), bb(MAXC);
  for (long c = 0; c < MAXC; ++c) {
    wb[c] = tobf(0.5f + (c % 97) / 97.f); bb[c] = tobf((c % 13) / 13.f - 0.5f);
    hw.push_back(bf(wb[c])); hb.push_back(bf(bb[c]));
  }
  cudaMemcpy(X, hx.data(), NB, cudaMemcpyHostToDevice);
  cudaMemcpy(DY, hdy.data(), NB, cudaMemcpyHostToDevice);
  cudaMemcpy(W, wb.data(), MAXC * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(B, bb.data(), MAXC * 2, cudaMemcpyHostToDevice);
  const float tc = timeit([&] { cudaMemcpyAsync(DX, X, NB, cudaMemcpyDeviceToDevice); });
  copy_bps = 2.0 * NB / tc;
  printf("copy %.1f us %.0f GB/s, %d SMs (k = persistent blocks per SM, occ = resident blocks per SM)\n",
         tc, copy_bps / 1e3, nsm);
}

#ifndef NORM_SWEEP_NO_MAIN  // norm_bwd_cluster_sweep.cu includes this file for its helpers
int main(int argc, char** argv) {
  const bool only_fwd = argc > 1 && !strcmp(argv[1], "fwd");  // just the forward matrix
  const bool only_fwd2 = argc > 1 && !strcmp(argv[1], "fwd2");  // which part of kRt costs
  init_data();
  if (only_fwd2) {
    fwd_matrix2<32, 4, 128>(16384);
    fwd_matrix2<128, 4, 128>(16384);
    fwd_matrix2<160, 4, 160>(16384);  // 5120 columns
    fwd_matrix2<256, 4, 256>(8192);
    fwd_matrix2<384, 4, 384>(4096);   // 12288
    fwd_matrix2<512, 4, 512>(4096);
    printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
    return 0;
  }
  if (only_fwd) {
    fwd_matrix<32, 4, 128>(16384);    // the library's launch shape at 1024 columns
    fwd_matrix<128, 4, 128>(16384);   // 4096
    fwd_matrix<256, 4, 256>(8192);    // 8192
    fwd_matrix<512, 4, 512>(4096);    // 16384 (the library: 8 vectors x 256 threads)
    fwd_matrix<256, 8, 256>(4096);
    printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
    return 0;
  }
  // 16384 x 1024: 8 .. 64 elements per thread, several rows per block
  fwd<32, 4, 128>(16384); fwd<32, 4, 256>(16384); fwd<16, 8, 128>(16384); fwd<64, 2, 128>(16384); fwd<128, 1, 128>(16384);
  bwd<32, 4, 128, 2>(16384); bwd<32, 4, 256, 1>(16384); bwd<64, 2, 256, 2>(16384);
  bwd<128, 1, 256, 4>(16384); bwd<128, 1, 512, 2, 2>(16384); bwd<64, 2, 128, 4, 1, true>(16384);
  // 16384 x 4096
  fwd<128, 4, 128>(16384); fwd<256, 2, 256>(16384); fwd<512, 1, 512>(16384); fwd<64, 8, 128>(16384);
  bwd<128, 4, 128, 2>(16384); bwd<256, 2, 256, 2>(16384); bwd<256, 2, 256, 2, 2>(16384);
  bwd<512, 1, 512, 2>(16384); bwd<256, 2, 256, 2, 1, true>(16384);
  // 8192 x 8192
  fwd<1024, 1, 1024>(8192); fwd<512, 2, 512>(8192); fwd<256, 4, 256>(8192); fwd<128, 8, 128>(8192);
  bwd<1024, 1, 1024, 1>(8192); bwd<512, 2, 512, 1>(8192); bwd<256, 4, 256, 1>(8192);
  bwd<256, 4, 256, 2>(8192) /* capped at 128 registers: layer spills a little */; bwd<512, 2, 512, 1, 1, true>(8192);
  // 4096 x 16384: 16 .. 64 elements per thread, one row per block. The layer-norm backward is at
  // its register cap here (dw + db alone are 4 * VPT * 8 fp32): 1024x2 and 512x4 spill a little.
  fwd<1024, 2, 1024>(4096); fwd<512, 4, 512>(4096); fwd<256, 8, 256>(4096);
  bwd<1024, 2, 1024, 1>(4096); bwd<512, 4, 512, 1>(4096); bwd<256, 8, 256, 1>(4096);
  printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
#endif
