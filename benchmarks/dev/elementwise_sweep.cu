// Launch-shape sweep of the library's own elementwise kernel (common/elementwise.cuh) on
// gelu: threads per block x vectors per thread, fp32 and bf16, forward (1 input) and
// backward (2 inputs). Build and run on the GPU machine from the repo root:
//   T=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/include
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icsrc -I$T \
//        benchmarks/dev/elementwise_sweep.cu -o /tmp/sweep && /tmp/sweep
#include <cstdio>
#include <vector>
#include <algorithm>
#include <c10/util/BFloat16.h>
#include "common/gelu_math.h"
#include "common/elementwise.cuh"
using namespace fused;
template <typename T> struct Fw { __device__ float operator()(float x) const { return gelu_fwd_for<T, GeluKind::kNone>(x); } };
template <typename T> struct Bw { __device__ float operator()(float d, float x) const { return d * gelu_grad_for<T, GeluKind::kNone>(x); } };
__global__ void flush(int* p, long n) { long i = (long)blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] = i; }
int* fl; long fln = 64 << 20;
template <typename F> float timeit(F f) {
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b); std::vector<float> ts;
  for (int r = 0; r < 30; ++r) { flush<<<fln / 256, 256>>>(fl, fln); cudaEventRecord(a); f(); cudaEventRecord(b); cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms, a, b); ts.push_back(ms); }
  std::sort(ts.begin(), ts.end()); return ts[ts.size() / 2] * 1000;
}
template <typename T, int U, int NIN>
void run(const char* name, T* x, T* d, T* y, long n, int threads, float tc_per_byte) {
  constexpr int V = 16 / sizeof(T);
  long blocks = (n / V + threads * U - 1) / (threads * U);
  float t;
  if constexpr (NIN == 1) t = timeit([&] { elementwise_kernel<T, V, U, 1><<<blocks, threads>>>(Fw<T>{}, y, Ptrs<T, 1>{{x}}, n); });
  else t = timeit([&] { elementwise_kernel<T, V, U, 2><<<blocks, threads>>>(Bw<T>{}, y, Ptrs<T, 2>{{d, x}}, n); });
  double bytes = (double)(NIN + 1) * n * sizeof(T);
  printf("%-5s nin%d thr%4d unroll%d %7.1f us %5.0f GB/s %5.1f%%\n", name, NIN, threads, U, t, bytes / t / 1e3, 100 * tc_per_byte * bytes / t);
}
int main() {
  long nbytes = 256L << 20; char *x, *d, *y; cudaMalloc(&x, nbytes); cudaMalloc(&d, nbytes); cudaMalloc(&y, nbytes); cudaMalloc(&fl, fln * 4);
  std::vector<float> h(nbytes / 4); for (size_t i = 0; i < h.size(); ++i) h[i] = (float)((i * 2654435761u) % 10007) / 1000.f - 5.f;
  cudaMemcpy(x, h.data(), nbytes, cudaMemcpyHostToDevice); cudaMemcpy(d, h.data(), nbytes, cudaMemcpyHostToDevice);
  float tm = timeit([&] { cudaMemcpyAsync(y, x, nbytes, cudaMemcpyDeviceToDevice); });
  float inv = 1.0f / (2.0f * nbytes / tm);  // us per byte at copy speed
  printf("memcpy %.1f us %.0f GB/s\n", tm, 2.0 * nbytes / tm / 1e3);
  for (int thr : {128, 256, 512}) {
    run<float, 1, 1>("f32", (float*)x, (float*)d, (float*)y, nbytes / 4, thr, inv);
    run<float, 2, 1>("f32", (float*)x, (float*)d, (float*)y, nbytes / 4, thr, inv);
    run<float, 4, 1>("f32", (float*)x, (float*)d, (float*)y, nbytes / 4, thr, inv);
    run<float, 8, 1>("f32", (float*)x, (float*)d, (float*)y, nbytes / 4, thr, inv);
    run<float, 1, 2>("f32", (float*)x, (float*)d, (float*)y, nbytes / 4, thr, inv);
    run<float, 2, 2>("f32", (float*)x, (float*)d, (float*)y, nbytes / 4, thr, inv);
    run<float, 4, 2>("f32", (float*)x, (float*)d, (float*)y, nbytes / 4, thr, inv);
    run<c10::BFloat16, 1, 1>("bf16", (c10::BFloat16*)x, (c10::BFloat16*)d, (c10::BFloat16*)y, nbytes / 2, thr, inv);
    run<c10::BFloat16, 2, 1>("bf16", (c10::BFloat16*)x, (c10::BFloat16*)d, (c10::BFloat16*)y, nbytes / 2, thr, inv);
    run<c10::BFloat16, 4, 1>("bf16", (c10::BFloat16*)x, (c10::BFloat16*)d, (c10::BFloat16*)y, nbytes / 2, thr, inv);
    run<c10::BFloat16, 1, 2>("bf16", (c10::BFloat16*)x, (c10::BFloat16*)d, (c10::BFloat16*)y, nbytes / 2, thr, inv);
    run<c10::BFloat16, 2, 2>("bf16", (c10::BFloat16*)x, (c10::BFloat16*)d, (c10::BFloat16*)y, nbytes / 2, thr, inv);
    run<c10::BFloat16, 4, 2>("bf16", (c10::BFloat16*)x, (c10::BFloat16*)d, (c10::BFloat16*)y, nbytes / 2, thr, inv);
  }
  printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
