// Causal softmax forward on bf16 attention scores (8 x 16 heads x 2048 queries x 2048 keys,
// key j > query i masked): kernel forms and launch shapes against the run's copy rate, for
// KERNEL_LOG softmax v9's next step (the library's causal variant reads 79-81% of copy and
// ncu has it near issue-bound: 0.70 warp instructions per scheduler per cycle, 64 registers,
// 50% occupancy). Standalone (no torch):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a \
//        benchmarks/dev/softmax_causal_sweep.cu -o /tmp/causal && /tmp/causal
// Forms, each with the library's thread layout (lane's vector k at column (k * TPR + lane) * 8):
//   ALL   floats held, every vector worked on, masked elements -inf (the library before v9)
//   LIVE  floats held, vectors past the query's limit skipped, stored as 0 * (1 / S) (v9d)
//   (LIVE, weak loads: plain ld.global as the library's softmax_kernel, not ld.global.nc)
//   RAW   raw bf16 words held (4 registers a vector, not 8), the max on packed pairs, the exps
//         recomputed in the output pass as fma(x, scale, -M) * log2(e) (softmax_fwd_fixed's
//         math, scale > 0), vectors past the limit skipped
// TPR 32 rows take warp shuffles only (no block barrier); TPR 64 / 128 a barrier per reduction.
// Bytes as the harness counts them: the unmasked keys read, every output written.
// Each form is checked against a double-precision host reference on 2 heads' rows.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "bf16_rows.cuh"

#define CK(x)                                                               \
  do {                                                                      \
    cudaError_t e_ = (x);                                                   \
    if (e_ != cudaSuccess) {                                                \
      printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      return 1;                                                             \
    }                                                                       \
  } while (0)

constexpr int kL = 2048, kHeads = 8 * 16, kVec = 8;
constexpr float kLog2e = 1.4426950408889634f;
enum Form { ALL = 0, LIVE = 1, RAW = 2 };

__device__ __forceinline__ float elem(const uint4& r, int e) {
  const uint32_t w = e < 2 ? r.x : e < 4 ? r.y : e < 6 ? r.z : r.w;
  return e % 2 ? hi(w) : lo(w);
}
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ uint32_t hmax2(uint32_t a, uint32_t b) {
  __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162*>(&a), y = *reinterpret_cast<__nv_bfloat162*>(&b);
  __nv_bfloat162 m = __hmax2(x, y);
  return *reinterpret_cast<uint32_t*>(&m);
}

// A plain (weak) ld.global, not the read-only path (ld.global.nc) that a const __restrict__
// pointer gets: what the library's softmax_kernel issues.
__device__ __forceinline__ uint4 weak_load(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

// A thread's outputs: value(k, e) for its live vectors, `dead` (0, or NaN in a NaN row)
// for the others.
template <int TPR, int VPT, typename Value>
__device__ __forceinline__ void store_row(uint4* py, int live, float dead, Value value) {
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    uint4 out;
    if (k < live) {
      float f[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) f[e] = value(k, e);
      out = make_uint4(pack(f[0], f[1]), pack(f[2], f[3]), pack(f[4], f[5]), pack(f[6], f[7]));
    } else {
      const uint32_t d = pack(dead, dead);
      out = make_uint4(d, d, d, d);
    }
    py[k * TPR] = out;
  }
}

template <int FORM, int TPR, int VPT, int BLOCK, bool WEAK = false>
__global__ void __launch_bounds__(BLOCK) causal_fwd(const uint4* __restrict__ x,
                                                    uint4* __restrict__ y, float scale) {
  static_assert(TPR * VPT * kVec == kL, "exact rows");
  constexpr int RPB = BLOCK / TPR;
  __shared__ float buf[2][BLOCK / 32 > 0 ? BLOCK / 32 : 1];
  const uint32_t row = blockIdx.x * RPB + threadIdx.x / TPR;
  const int lane = threadIdx.x % TPR;
  const int limit = static_cast<int>(row % kL) + 1;  // keys 0 .. query
  const int c0 = lane * kVec, stride = TPR * kVec;
  // Vectors that start before the limit are read; ALL works on every vector (those not
  // read hold zeros, masked to -inf), the others on the read ones only.
  const int loaded = limit <= c0 ? 0 : min(VPT, (limit - c0 + stride - 1) / stride);
  const int live = FORM == ALL ? VPT : loaded;
  const uint4* px = x + static_cast<size_t>(row) * (kL / kVec) + lane;
  uint4* py = y + static_cast<size_t>(row) * (kL / kVec) + lane;
  uint4 raw[VPT];
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    raw[k] = make_uint4(0, 0, 0, 0);
    if (k < loaded) raw[k] = WEAK ? weak_load(px + k * TPR) : px[k * TPR];
  }

  float m, s = 0.f;
  if constexpr (FORM == RAW) {
    // Elements past the limit in the one straddling vector: -inf bits (0xff80), so the
    // packed max and the exps ignore them.
    uint4 mx = make_uint4(0xff80ff80u, 0xff80ff80u, 0xff80ff80u, 0xff80ff80u);
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      if (k < live) {
        const int left = limit - (c0 + k * stride);
        if (left < kVec) {
          auto mask = [left](uint32_t& w, int e) {  // elements e (low half), e + 1 (high)
            if (e >= left) w = (w & 0xffff0000u) | 0x0000ff80u;
            if (e + 1 >= left) w = (w & 0x0000ffffu) | 0xff800000u;
          };
          mask(raw[k].x, 0);
          mask(raw[k].y, 2);
          mask(raw[k].z, 4);
          mask(raw[k].w, 6);
        }
        mx.x = hmax2(mx.x, raw[k].x);
        mx.y = hmax2(mx.y, raw[k].y);
        mx.z = hmax2(mx.z, raw[k].z);
        mx.w = hmax2(mx.w, raw[k].w);
      }
    }
    mx.x = hmax2(hmax2(mx.x, mx.y), hmax2(mx.z, mx.w));
    m = row_reduce<TPR, true>(fmaxf(lo(mx.x), hi(mx.x)), buf[0]) * scale;
    const float o = m == -INFINITY ? 0.f : m;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      if (k < live) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) s += ex2(fmaf(elem(raw[k], e), scale, -o) * kLog2e);
      }
    }
    s = row_reduce<TPR, false>(s, buf[1]);
    const float inv = 1.f / s;
    store_row<TPR, VPT>(py, live, 0.f * inv, [&](int k, int e) {
      return ex2(fmaf(elem(raw[k], e), scale, -o) * kLog2e) * inv;
    });
  } else {
    float v[VPT][kVec];
    m = -INFINITY;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      if (k < live) {
        const int left = limit - (c0 + k * stride);
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          v[k][e] = e < left ? elem(raw[k], e) * scale : -INFINITY;
          m = fmaxf(m, v[k][e]);
        }
      }
    }
    m = row_reduce<TPR, true>(m, buf[0]);
    const float o = m == -INFINITY ? 0.f : m;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      if (k < live) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          v[k][e] = ex2((v[k][e] - o) * kLog2e);
          s += v[k][e];
        }
      }
    }
    s = row_reduce<TPR, false>(s, buf[1]);
    const float inv = 1.f / s;
    store_row<TPR, VPT>(py, live, 0.f * inv, [&](int k, int e) { return v[k][e] * inv; });
  }
}

static float bf2f(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

struct Config {
  const char* name;
  void (*launch)(const uint4*, uint4*, float, size_t);
  const void* fn;
  int block;
};

template <int FORM, int TPR, int VPT, int BLOCK, bool WEAK = false>
Config make(const char* name) {
  auto launch = [](const uint4* x, uint4* y, float s, size_t rows) {
    causal_fwd<FORM, TPR, VPT, BLOCK, WEAK><<<rows / (BLOCK / TPR), BLOCK>>>(x, y, s);
  };
  return {name, launch, reinterpret_cast<const void*>(causal_fwd<FORM, TPR, VPT, BLOCK, WEAK>),
          BLOCK};
}

int main() {
  const size_t rows = static_cast<size_t>(kHeads) * kL, n = rows * kL;
  const float scale = 0.125f;
  std::vector<uint16_t> hx(n);
  uint64_t st = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < n; ++i) {  // std 3 (a sum of two uniforms), rounded to bf16
    float a = 0.f;
    for (int j = 0; j < 2; ++j) {
      st ^= st << 13; st ^= st >> 7; st ^= st << 17;
      a += static_cast<float>(st >> 40) / static_cast<float>(1 << 24) - 0.5f;
    }
    a *= 3.f * 2.4494897f;  // sqrt(6): the sum's std is 1 / sqrt(6)
    uint32_t u;
    memcpy(&u, &a, 4);
    hx[i] = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
  }
  uint4 *x, *y, *c;
  CK(cudaMalloc(&x, n * 2));
  CK(cudaMalloc(&y, n * 2));
  CK(cudaMalloc(&c, n * 2));
  CK(cudaMemcpy(x, hx.data(), n * 2, cudaMemcpyHostToDevice));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  auto time_us = [&](auto&& fn) {
    for (int i = 0; i < 3; ++i) fn();
    cudaEventRecord(e0);
    const int reps = 20;
    for (int i = 0; i < reps; ++i) fn();
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    return ms * 1000.f / reps;
  };
  const float copy_us = time_us([&] { cudaMemcpyAsync(c, x, n * 2, cudaMemcpyDeviceToDevice); });
  const double copy_rate = 2.0 * n * 2 / copy_us / 1e3;  // GB/s
  const double f = (kL + 1) / (2.0 * kL);                 // unmasked share of the keys
  const double bytes = (f + 1.0) * n * 2;
  printf("copy %.1f GB/s; causal bytes %.1f MB (%.0f us at the copy rate)\n", copy_rate,
         bytes / 1e6, bytes / copy_rate / 1e3);

  std::vector<Config> configs = {
      make<ALL, 64, 4, 128>("ALL  tpr 64 vpt 4 block 128 (library before v9)"),
      make<LIVE, 64, 4, 128>("LIVE tpr 64 vpt 4 block 128 (library v9d)"),
      make<LIVE, 32, 8, 128>("LIVE tpr 32 vpt 8 block 128"),
      make<LIVE, 128, 2, 128>("LIVE tpr 128 vpt 2 block 128"),
      make<LIVE, 64, 4, 128, true>("LIVE tpr 64 vpt 4 block 128, weak loads"),
      make<LIVE, 128, 2, 128, true>("LIVE tpr 128 vpt 2 block 128, weak loads"),
      make<RAW, 64, 4, 128>("RAW  tpr 64 vpt 4 block 128"),
      make<RAW, 32, 8, 128>("RAW  tpr 32 vpt 8 block 128"),
      make<RAW, 32, 8, 256>("RAW  tpr 32 vpt 8 block 256"),
      make<RAW, 128, 2, 128>("RAW  tpr 128 vpt 2 block 128"),
      make<RAW, 128, 2, 256>("RAW  tpr 128 vpt 2 block 256"),
  };
  std::vector<uint16_t> hy(static_cast<size_t>(2) * kL * kL);
  for (const Config& cf : configs) {
    cudaFuncAttributes at;
    CK(cudaFuncGetAttributes(&at, cf.fn));
    int blocks = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, cf.fn, cf.block, 0));
    CK(cudaMemset(y, 0xff, n * 2));  // poisoned: NaN bits
    cf.launch(x, y, scale, rows);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    // Check heads 0 and 77 against double precision (bf16 output: 2^-8 relative + 1e-6).
    double worst = 0.0;
    for (int h : {0, 77}) {
      const size_t base = static_cast<size_t>(h) * kL * kL;
      CK(cudaMemcpy(hy.data(), reinterpret_cast<uint16_t*>(y) + base,
                    static_cast<size_t>(kL) * kL * 2, cudaMemcpyDeviceToHost));
      for (int q = 0; q < kL; ++q) {
        const uint16_t* xr = hx.data() + base + static_cast<size_t>(q) * kL;
        double mx = -INFINITY, sum = 0.0;
        for (int j = 0; j <= q; ++j) mx = std::max(mx, static_cast<double>(bf2f(xr[j])) * scale);
        for (int j = 0; j <= q; ++j) sum += std::exp(bf2f(xr[j]) * static_cast<double>(scale) - mx);
        for (int j = 0; j < kL; ++j) {
          const double want = j <= q ? std::exp(bf2f(xr[j]) * static_cast<double>(scale) - mx) / sum : 0.0;
          const double got = bf2f(hy[static_cast<size_t>(q) * kL + j]);
          const double err = std::fabs(got - want) / (std::fabs(want) * 0x1p-8 + 1e-6);
          if (!(err <= worst)) worst = std::isnan(err) ? INFINITY : std::max(worst, err);
        }
      }
    }
    const float us = time_us([&] { cf.launch(x, y, scale, rows); });
    printf("%-48s %3d regs %2d blocks/SM  %7.1f us  %5.1f%% of copy  check %s (worst %.2f of tol)\n",
           cf.name, at.numRegs, blocks, us, 100.0 * bytes / us / 1e3 / copy_rate,
           worst <= 1.0 ? "ok" : "FAIL", worst);
  }
  return 0;
}
