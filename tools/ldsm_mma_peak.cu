// Where the portable GEMM's time goes, built up from its inner loop: the
// shipped Big tile's warp work (8 warps an SM, each a 64 x 64 warp tile of a 128 x 256 x 64
// block tile: per k16 step 4 + 4 ldmatrix.x4 and 32 mma.sync.m16n8k16, fragments double
// buffered across steps) from shared memory that is never refilled, then with the
// k-tile's __syncthreads, then with the k-tile's 48 KB refill by cp.async from an
// L2-resident buffer (into a second region, as the pipeline's next stage). What is left
// between the last figure and the kernel's own is DRAM and the edges.
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -Icsrc tools/ldsm_mma_peak.cu -o /tmp/ldsm_mma
//   /tmp/ldsm_mma
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "cuda/matmul_portable.cuh"  // the portable kernel's ldmatrix / mma / cp.async waits
#include "dev_cuda.cuh"

constexpr int kPitch = 72;                       // bf16 a smem row: 64 + 8 (conflict-free)
constexpr int kReadBytes = (128 + 256) * kPitch * 2;  // one stage, A then B, K-major
constexpr int kFillBytes = (128 + 256) * 64 * 2;      // a k-tile's operands: 48 KB

using fused::matmul::cp_async_commit;
using fused::matmul::cp_async_wait;

__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], uint32_t addr) {
  fused::matmul::ldmatrix_x4<false>(r, addr);
}
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  fused::matmul::mma_16816<__nv_bfloat16>(c, a, b0, b1);
}

// MODE 0: ldmatrix + mma only; 1: + __syncthreads a k-tile; 2: + a refill of FILL bytes a
// k-tile by cp.async, INFLIGHT k-tiles' refills in flight (each into its own region), the
// oldest waited for before the k-tile's barrier (the shipped 3-stage pipeline: 2).
// Refill alone, no ldmatrix / mma: 3: MODE 2's cp.async refill and barrier;
// 4: the same bytes through registers (every 16-byte ld.global of the k-tile in flight,
// then st.shared), one k-tile at a time.
// The refill spread over the k-tile's four k16 steps (a quarter of the copies a step, the
// group committed at the last; a k-tile's copies waited for one k-tile later, as MODE 2
// with 2 in flight): 5: each quarter after the step's mma; 6: before it.
// HALF: ldmatrix at every other k16 step only (the fragments reused: a timing, not a
// product), half the shared-memory reads, to see whether the refill competes with them.
template <int MODE, int FILL = kFillBytes, int INFLIGHT = 1, bool HALF = false>
__global__ void __launch_bounds__(256, 1)
    ldsm_mma(const uint4* __restrict__ src, int src_tiles, float* out, int iters) {
  constexpr int kChunks = FILL / 16 / 256;  // 16-byte copies a thread (48 KB: 12)
  extern __shared__ __align__(128) unsigned char smem[];
  for (int i = threadIdx.x; i < kReadBytes / 4; i += 256) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u;
    h ^= h >> 15;
    reinterpret_cast<uint32_t*>(smem)[i] = 0x3f003f00u | (h & 0x007f007fu);  // bf16 in [0.5, 1)
  }
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, wm = warp / 4, wn = warp % 4;
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t a_off = base + ((wm * 64 + lane % 16) * kPitch + (lane / 16) * 8) * 2;
  const uint32_t b_off =
      base + ((128 + wn * 64 + lane % 8 + (lane / 16) * 8) * kPitch + (lane / 8 % 2) * 8) * 2;
  const uint32_t fill = base + kReadBytes;
  float acc[4][8][4] = {};
  uint32_t af[2][4][4], bf[2][4][4];
  auto load = [&](int buf, int ks) {
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) ldsm4(af[buf][mi], a_off + (mi * 16 * kPitch + ks * 16) * 2);
#pragma unroll
    for (int nj = 0; nj < 4; ++nj) ldsm4(bf[buf][nj], b_off + (nj * 16 * kPitch + ks * 16) * 2);
  };
  // k-tile it's refill, copies [c0, c1) of each thread, into `region`: plain cp.async.cg (as
  // first measured; the kernel's cp_async_16 adds an L2::128B hint and a source size).
  auto tile_src = [&](int it) {
    return src + (static_cast<int64_t>(blockIdx.x + it) % src_tiles) * (kFillBytes / 16);
  };
  auto copy = [&](int it, int region, int c0, int c1) {
    const uint4* g = tile_src(it);
    const uint32_t dst = fill + region * FILL;
#pragma unroll
    for (int c = c0; c < c1; ++c) {
      const int e = c * 256 + threadIdx.x;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst + e * 16), "l"(g + e));
    }
  };
  if constexpr (MODE == 3 || MODE == 4) {  // the refill alone
    for (int it = 0; it < iters; ++it) {
      if constexpr (MODE == 3) {
        copy(it, it % INFLIGHT, 0, kChunks);
        cp_async_commit();
        cp_async_wait<INFLIGHT - 1>();
      } else {
        const uint4* g = tile_src(it);
        const uint32_t dst = fill + (it % INFLIGHT) * FILL;
        uint4 v[kChunks];
#pragma unroll
        for (int c = 0; c < kChunks; ++c) v[c] = __ldcg(g + c * 256 + threadIdx.x);
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(
                           dst + (c * 256 + threadIdx.x) * 16),
                       "r"(v[c].x), "r"(v[c].y), "r"(v[c].z), "r"(v[c].w));
        }
      }
      __syncthreads();
    }
    out[blockIdx.x * 256 + threadIdx.x] = 0.f;
    return;
  }
  load(0, 0);
  for (int it = 0; it < iters; ++it) {
    if constexpr (MODE == 2) {  // the next stage's copies, issued at the k-tile's start
      copy(it, it % INFLIGHT, 0, kChunks);
      cp_async_commit();
    }
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      if (ks == 3) {
        if constexpr (MODE == 2) cp_async_wait<INFLIGHT - 1>();
        if constexpr (MODE >= 5) cp_async_wait<0>();  // the previous k-tile's group
        if constexpr (MODE >= 1) __syncthreads();
      }
      if (!HALF || ks % 2 == 1) load((ks + 1) & 1, (ks + 1) % 4);
      auto quarter = [&] {  // MODE 5 / 6: a quarter of this k-tile's copies
        copy(it, it % 2, ks * kChunks / 4, (ks + 1) * kChunks / 4);
        if (ks == 3) cp_async_commit();
      };
      if constexpr (MODE == 6) quarter();
#pragma unroll
      for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
        for (int nj = 0; nj < 4; ++nj) {
          mma(acc[mi][2 * nj], af[ks & 1][mi], bf[ks & 1][nj][0], bf[ks & 1][nj][1]);
          mma(acc[mi][2 * nj + 1], af[ks & 1][mi], bf[ks & 1][nj][2], bf[ks & 1][nj][3]);
        }
      }
      if constexpr (MODE == 5) quarter();
    }
  }
  float s = 0.f;
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int n = 0; n < 8; ++n) s += acc[mi][n][0] + acc[mi][n][1] + acc[mi][n][2] + acc[mi][n][3];
  out[blockIdx.x * 256 + threadIdx.x] = s;
}


// Launches timed a figure: 5, or argv[1] (long enough to read the clock beside it, as
// `nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw -lms 100` does; each line is
// stamped with the wall-clock time then).
int g_reps = 5;

template <int MODE, int FILL = kFillBytes, int INFLIGHT = 1, bool HALF = false>
int run(int sms, const uint4* src, int src_tiles, float* out, const char* what) {
  const int smem = kReadBytes + (MODE >= 2 ? FILL * INFLIGHT : 0);
  auto kernel = ldsm_mma<MODE, FILL, INFLIGHT, HALF>;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int iters = 2048;
  for (int round = 0; round < 2; ++round) {
    const float ms =
        time_ms([&] { kernel<<<sms, 256, smem>>>(src, src_tiles, out, iters); }, g_reps);
    CHECK(cudaGetLastError());
    const double flops = double(sms) * 8 * iters * 128 * 4096.0;
    const double l2 = MODE >= 2 ? double(sms) * iters * FILL / (ms * 1e-3) / 1e12 : 0.0;
    timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    char stamp[16];
    strftime(stamp, sizeof stamp, "%H:%M:%S", gmtime(&now.tv_sec));
    std::printf("%s.%03ld ", stamp, now.tv_nsec / 1000000);
    if (MODE == 3 || MODE == 4) {
      std::printf("%-52s L2 -> smem %.2f TB/s\n", what, l2);
    } else {
      std::printf("%-52s %.1f TFLOP/s, L2 -> smem %.2f TB/s\n", what, flops / (ms * 1e-3) / 1e12, l2);
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1) g_reps = std::atoi(argv[1]);
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  std::printf("%s, %d SMs; one 256-thread block an SM (8 warps, 2 a scheduler)\n", prop.name, sms);
  float* out;
  CHECK(cudaMalloc(&out, sizeof(float) * sms * 256));
  const int src_tiles = 256;  // 12 MB of k-tiles, L2-resident after the first pass
  uint4* src;
  CHECK(cudaMalloc(&src, size_t(src_tiles) * kFillBytes));
  CHECK(cudaMemset(src, 0x3c, size_t(src_tiles) * kFillBytes));
  if (run<0>(sms, src, src_tiles, out, "ldmatrix + mma (warp tile 64x64)")) return 1;
  if (run<1>(sms, src, src_tiles, out, "  + __syncthreads a k-tile")) return 1;
  if (run<2>(sms, src, src_tiles, out, "  + 48 KB cp.async refill a k-tile (L2), 1 in flight")) return 1;
  if (run<2, kFillBytes, 2>(sms, src, src_tiles, out, "  + 48 KB refill, 2 in flight")) return 1;
  if (run<2, kFillBytes, 3>(sms, src, src_tiles, out, "  + 48 KB refill, 3 in flight")) return 1;
  if (run<2, kFillBytes / 2, 2>(sms, src, src_tiles, out, "  + 24 KB refill, 2 in flight")) return 1;
  if (run<2, kFillBytes / 4, 2>(sms, src, src_tiles, out, "  + 12 KB refill, 2 in flight")) return 1;
  if (run<3, kFillBytes, 1>(sms, src, src_tiles, out, "48 KB cp.async refill alone, 1 in flight")) return 1;
  if (run<3, kFillBytes, 2>(sms, src, src_tiles, out, "48 KB cp.async refill alone, 2 in flight")) return 1;
  if (run<3, kFillBytes, 3>(sms, src, src_tiles, out, "48 KB cp.async refill alone, 3 in flight")) return 1;
  if (run<4, kFillBytes, 1>(sms, src, src_tiles, out, "48 KB ld.global + st.shared refill alone")) return 1;
  if (run<5, kFillBytes, 2>(sms, src, src_tiles, out, "ldmatrix + mma + 48 KB refill spread, after mma")) return 1;
  if (run<6, kFillBytes, 2>(sms, src, src_tiles, out, "ldmatrix + mma + 48 KB refill spread, before mma")) return 1;
  if (run<5, kFillBytes / 2, 2>(sms, src, src_tiles, out, "  24 KB refill spread, after mma")) return 1;
  if (run<0, kFillBytes, 1, true>(sms, src, src_tiles, out, "half the ldmatrix + mma")) return 1;
  if (run<2, kFillBytes, 2, true>(sms, src, src_tiles, out, "  + 48 KB refill, 2 in flight")) return 1;
  return 0;
}
