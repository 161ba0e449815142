// Launch-shape sweep for bf16 softmax rows held in registers: threads per row (TPR) x 16-byte
// vectors per thread (VPT) x block size, forward y = softmax(s x) and backward
// dx = s y (dy - sum(dy y)), against the run's device-to-device copy. Standalone (no torch):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a \
//        benchmarks/dev/softmax_sweep.cu -o /tmp/smsweep && /tmp/smsweep
// Only exact fits (len = TPR * VPT * 8): a bound on what a register-row kernel reaches.
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>

#include "bf16_rows.cuh"

template <int TPR, int VPT, int BLOCK, bool FAST>
__global__ void __launch_bounds__(BLOCK) fwd(const uint4* x, uint4* y, float scale) {
  constexpr int RPB = BLOCK / TPR, LENV = TPR * VPT;
  __shared__ float bmax[BLOCK / 32], bsum[BLOCK / 32];
  const long row = blockIdx.x * (long)RPB + threadIdx.x / TPR;
  const int lane = threadIdx.x % TPR;
  const uint4* p = x + row * LENV + lane;
  uint4 raw[VPT];
#pragma unroll
  for (int k = 0; k < VPT; ++k) raw[k] = __ldg(p + k * TPR);
  float v[VPT * 8];
  const float s2 = FAST ? scale * 1.4426950408889634f : scale;
#pragma unroll
  for (int k = 0; k < VPT; ++k) unpack(raw[k], v + 8 * k);
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < VPT * 8; ++i) { v[i] *= s2; m = fmaxf(m, v[i]); }
  m = row_reduce<TPR, true>(m, bmax);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < VPT * 8; ++i) { v[i] = FAST ? exp2f(v[i] - m) : expf(v[i] - m); s += v[i]; }
  s = row_reduce<TPR, false>(s, bsum);
  const float r = 1.f / s;
  uint4* q = y + row * LENV + lane;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const float* f = v + 8 * k;
    q[k * TPR] = make_uint4(pack(f[0] * r, f[1] * r), pack(f[2] * r, f[3] * r),
                            pack(f[4] * r, f[5] * r), pack(f[6] * r, f[7] * r));
  }
}

template <int TPR, int VPT, int BLOCK, bool FAST>
__global__ void __launch_bounds__(BLOCK) bwd(const uint4* dy, const uint4* y, uint4* dx,
                                             float scale) {
  constexpr int RPB = BLOCK / TPR, LENV = TPR * VPT;
  __shared__ float bsum[BLOCK / 32];
  const long row = blockIdx.x * (long)RPB + threadIdx.x / TPR;
  const int lane = threadIdx.x % TPR;
  const long o = row * LENV + lane;
  uint4 rd[VPT], ry[VPT];
#pragma unroll
  for (int k = 0; k < VPT; ++k) { rd[k] = __ldg(dy + o + k * TPR); ry[k] = __ldg(y + o + k * TPR); }
  float d[VPT * 8], w[VPT * 8];
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < VPT; ++k) { unpack(rd[k], d + 8 * k); unpack(ry[k], w + 8 * k); }
#pragma unroll
  for (int i = 0; i < VPT * 8; ++i) s += d[i] * w[i];
  s = row_reduce<TPR, false>(s, bsum);
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    float f[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] = scale * w[8 * k + e] * (d[8 * k + e] - s);
    dx[o + k * TPR] = make_uint4(pack(f[0], f[1]), pack(f[2], f[3]), pack(f[4], f[5]), pack(f[6], f[7]));
  }
}

__global__ void flush(int* p, long n) { long i = (long)blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] = i; }
int* fl; long fln = 64 << 20;
template <typename F> float timeit(F f) {
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b); std::vector<float> ts;
  for (int r = 0; r < 25; ++r) { flush<<<fln / 256, 256>>>(fl, fln); cudaEventRecord(a); f(); cudaEventRecord(b); cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms, a, b); ts.push_back(ms); }
  std::sort(ts.begin(), ts.end()); return ts[ts.size() / 2] * 1000;
}

uint4 *X, *DY, *Y, *DX;
double copy_bps;  // bytes (read + written) per us of the device copy
template <int TPR, int VPT, int BLOCK, bool FAST>
void one(long rows) {
  constexpr long len = TPR * VPT * 8;
  const long grid = rows / (BLOCK / TPR);
  const float tf = timeit([&] { fwd<TPR, VPT, BLOCK, FAST><<<grid, BLOCK>>>(X, Y, 0.125f); });
  const float tb = timeit([&] { bwd<TPR, VPT, BLOCK, FAST><<<grid, BLOCK>>>(DY, Y, DX, 0.125f); });
  const double b = rows * len * 2.0;
  printf("%6ldx%-6ld tpr %4d vpt %2d block %4d %s | fwd %7.1f us %5.1f%% | bwd %7.1f us %5.1f%%\n",
         rows, len, TPR, VPT, BLOCK, FAST ? "exp2" : "expf", tf, 100 * 2 * b / tf / copy_bps, tb,
         100 * 3 * b / tb / copy_bps);
}

int main() {
  const long nbytes = 256L << 20;
  cudaMalloc(&X, nbytes); cudaMalloc(&DY, nbytes); cudaMalloc(&Y, nbytes); cudaMalloc(&DX, nbytes);
  cudaMalloc(&fl, fln * 4);
  std::vector<uint16_t> h(nbytes / 2);
  for (size_t i = 0; i < h.size(); ++i) {
    float f = (float)((i * 2654435761u) % 10007) / 1000.f - 5.f;
    uint32_t u; memcpy(&u, &f, 4); h[i] = u >> 16;
  }
  cudaMemcpy(X, h.data(), nbytes, cudaMemcpyHostToDevice);
  cudaMemcpy(DY, h.data(), nbytes, cudaMemcpyHostToDevice);
  cudaMemcpy(Y, h.data(), nbytes, cudaMemcpyHostToDevice);
  const float tm = timeit([&] { cudaMemcpyAsync(DX, X, nbytes, cudaMemcpyDeviceToDevice); });
  copy_bps = 2.0 * nbytes / tm;
  printf("copy %.1f us %.0f GB/s\n", tm, copy_bps / 1e3);
  // 16384 x 1024
  one<32, 4, 128, false>(16384); one<32, 4, 128, true>(16384);
  one<32, 4, 256, true>(16384); one<16, 8, 128, true>(16384);
  one<64, 2, 128, true>(16384); one<128, 1, 128, true>(16384); one<128, 1, 256, true>(16384);
  // 16384 x 4096
  one<128, 4, 128, false>(16384); one<128, 4, 128, true>(16384); one<128, 4, 256, true>(16384);
  one<256, 2, 256, true>(16384); one<512, 1, 512, true>(16384); one<64, 8, 128, true>(16384);
  one<32, 16, 128, true>(16384);
  // 4096 x 32768 (row in registers: 32 or 64 elements per thread)
  one<1024, 4, 1024, true>(4096); one<512, 8, 512, true>(4096);
  // 2048 x 65536 (64 per thread, one 1024-thread block per row)
  one<1024, 8, 1024, true>(2048);
  printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
