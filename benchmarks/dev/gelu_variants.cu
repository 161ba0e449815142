// GeLU forward variants on bf16 (standalone): accurate vs SFU math, unrolling, streaming
// stores, grid-stride (MODE 0: accurate float math; MODE 1: the library's 16-bit forms,
// gelu_fwd_fast). Run on the GPU machine from the repo root:
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icsrc benchmarks/dev/gelu_variants.cu -o /tmp/gv && /tmp/gv
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cuda_bf16.h>
#include "common/gelu_math.h"
using namespace fused;
typedef __nv_bfloat16 bf16;
struct alignas(16) V8 { bf16 v[8]; };

template <int MODE> __device__ __forceinline__ float f_none(float x) {
  if (MODE == 0) return gelu_fwd<GeluKind::kNone>(x);
  return gelu_fwd_fast<GeluKind::kNone>(x);
}
template <int MODE> __device__ __forceinline__ float f_tanh(float x) {
  if (MODE == 0) return gelu_fwd<GeluKind::kTanh>(x);
  float u = kSqrt2OverPi * (x + kGeluCoeff * x * x * x);
  return gelu_fwd_fast<GeluKind::kTanh>(x);
}
template <int MODE, bool TANH, int UNROLL, bool STREAM>
__global__ void __launch_bounds__(256) k(const bf16* __restrict__ in, bf16* __restrict__ out, long n) {
  long nv = n / 8;
  long first = (long)blockIdx.x * blockDim.x * UNROLL + threadIdx.x;
  V8 a[UNROLL];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) { long i = first + (long)u * blockDim.x; if (i < nv) {
    if (STREAM) { int4 r = __ldcs((const int4*)(in) + i); a[u] = *(V8*)&r; } else a[u] = ((const V8*)in)[i]; } }
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) { long i = first + (long)u * blockDim.x; if (i < nv) {
    V8 r;
#pragma unroll
    for (int j = 0; j < 8; ++j) { float x = __bfloat162float(a[u].v[j]); r.v[j] = __float2bfloat16(TANH ? f_tanh<MODE>(x) : f_none<MODE>(x)); }
    if (STREAM) __stcs((int4*)out + i, *(int4*)&r); else ((V8*)out)[i] = r; } }
}
template <int MODE, bool TANH, int UNROLL, bool STREAM>
__global__ void __launch_bounds__(256) kgs(const bf16* __restrict__ in, bf16* __restrict__ out, long n) {
  long nv = n / 8; long stride = (long)gridDim.x * blockDim.x;
  for (long base = (long)blockIdx.x * blockDim.x + threadIdx.x; base < nv; base += stride * UNROLL) {
    V8 a[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) { long i = base + u * stride; if (i < nv) a[u] = ((const V8*)in)[i]; }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) { long i = base + u * stride; if (i < nv) { V8 r;
#pragma unroll
      for (int j = 0; j < 8; ++j) { float x = __bfloat162float(a[u].v[j]); r.v[j] = __float2bfloat16(TANH ? f_tanh<MODE>(x) : f_none<MODE>(x)); }
      ((V8*)out)[i] = r; } }
  }
}
__global__ void copyk(const int4* in, int4* out, long n) { long i = (long)blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i] = in[i]; }
__global__ void flush(int* p, long n) { long i = (long)blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] = i; }

int* fl; long fln = 64 << 20;
template <typename F> float timeit(F f) {
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b); std::vector<float> ts;
  for (int r = 0; r < 40; ++r) { flush<<<fln / 256, 256>>>(fl, fln); cudaEventRecord(a); f(); cudaEventRecord(b); cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms, a, b); ts.push_back(ms); }
  std::sort(ts.begin(), ts.end()); return ts[ts.size() / 2] * 1000;
}
int main() {
  long n = 16384L * 4096; bf16 *x, *y; cudaMalloc(&x, n * 2); cudaMalloc(&y, n * 2); cudaMalloc(&fl, fln * 4);
  std::vector<bf16> h(n); for (long i = 0; i < n; ++i) h[i] = __float2bfloat16((float)((i * 2654435761u) % 10007) / 1000.f - 5.f);
  cudaMemcpy(x, h.data(), n * 2, cudaMemcpyHostToDevice);
  double bytes = 2.0 * n * 2;
  float tc = timeit([&] { copyk<<<n * 2 / 16 / 256, 256>>>((int4*)x, (int4*)y, n * 2 / 16); });
  printf("copy kernel %.1f us %.0f GB/s\n", tc, bytes / tc / 1e3);
  float tm = timeit([&] { cudaMemcpyAsync(y, x, n * 2, cudaMemcpyDeviceToDevice); });
  printf("memcpy %.1f us %.0f GB/s\n", tm, bytes / tm / 1e3);
#define RUN(MODE, TANH, U, S) { float t = timeit([&] { k<MODE, TANH, U, S><<<(n / 8 + 256 * U - 1) / (256 * U), 256>>>(x, y, n); }); \
  printf("mode%d tanh%d unroll%d stream%d  %.1f us %.0f GB/s %.1f%%\n", MODE, TANH, U, S, t, bytes / t / 1e3, 100 * tc / t); }
  RUN(0, 0, 4, 0) RUN(1, 0, 4, 0) RUN(0, 1, 4, 0) RUN(1, 1, 4, 0)
  RUN(1, 0, 4, 1) RUN(1, 1, 4, 1) RUN(1, 0, 2, 0) RUN(1, 1, 2, 0) RUN(1, 0, 8, 0) RUN(1, 1, 8, 0) RUN(1,0,1,0) RUN(1,1,1,0)
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  for (int bps : {4, 8, 16}) for (int tanh = 0; tanh < 2; ++tanh) {
    float t = timeit([&] { if (tanh) kgs<1, true, 2, false><<<sms * bps, 256>>>(x, y, n); else kgs<1, false, 2, false><<<sms * bps, 256>>>(x, y, n); });
    printf("gridstride bps%d tanh%d %.1f us %.0f GB/s %.1f%%\n", bps, tanh, t, bytes / t / 1e3, 100 * tc / t); }
  printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
