// What the standalone dev benchmarks (mma_peak.cu, ldsm_mma_peak.cu) share: a CUDA error
// check that returns 1 from main, and an event timer.
#pragma once
#include <cuda_runtime.h>

#include <cstdio>

#define CHECK(x)                                                             \
  do {                                                                       \
    cudaError_t e = (x);                                                     \
    if (e != cudaSuccess) {                                                  \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e));                    \
      return 1;                                                              \
    }                                                                        \
  } while (0)

// Milliseconds a call of f (enqueues GPU work), over reps calls after one warm-up.
template <typename F>
float time_ms(F&& f, int reps) {
  cudaEvent_t t0, t1;
  cudaEventCreate(&t0);
  cudaEventCreate(&t1);
  f();  // warm-up
  cudaEventRecord(t0);
  for (int r = 0; r < reps; ++r) f();
  cudaEventRecord(t1);
  cudaEventSynchronize(t1);
  float ms = 0.f;
  cudaEventElapsedTime(&ms, t0, t1);
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  return ms / reps;
}
