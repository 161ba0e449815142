// The issue rate ceiling of the portable GEMM's tensor-core instruction on this GPU:
// mma.sync.m16n8k16 (bf16 in, float32 accumulate) issued back to back from registers, no
// memory traffic, against cuBLAS's bf16 GEMM (what torch.mm runs) in the same process.
// The portable kernel cannot run faster than the first figure (its operands here are
// constant per thread, which draws less power than a GEMM's: an upper bound).
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -Icsrc tools/mma_peak.cu -lcublas -o /tmp/mma_peak
//   /tmp/mma_peak
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "cuda/matmul_portable.cuh"  // mma_16816: the portable kernel's own mma
#include "dev_cuda.cuh"

// NACC independent accumulator chains a warp (the mma's latency is covered by the other
// chains and the other warps); each mma is 2 * 16 * 8 * 16 = 4096 FLOPs.
template <int NACC>
__global__ void __launch_bounds__(256) mma_chain(float* out, int iters) {
  uint32_t a[4], b[2];
#pragma unroll
  for (int i = 0; i < 4; ++i) a[i] = 0x3f803f80u ^ (threadIdx.x * (i + 1));  // bf16 pairs, 2^-7..1
  b[0] = 0x3f803f80u ^ threadIdx.x;
  b[1] = 0x3f803f80u ^ (threadIdx.x << 1);
  float acc[NACC][4] = {};
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int j = 0; j < NACC; ++j) {
      fused::matmul::mma_16816<__nv_bfloat16>(acc[j], a, b[0], b[1]);
    }
  }
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < NACC; ++j) s += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;  // keeps the chains alive
}

// Pseudo-random bf16 in [-1, 1) (the harness times torch.mm on random data, which draws
// more power than constant data).
__global__ void fill_random(__nv_bfloat16* p, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = __float2bfloat16(static_cast<float>(h & 0xffffff) / 8388608.f - 1.f);
  }
}

int main() {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  std::printf("%s, %d SMs\n", prop.name, sms);
  float* out;
  CHECK(cudaMalloc(&out, sizeof(float) * sms * 8 * 256));
  const int iters = 4096;
  // 8 warps an SM (2 a scheduler) is the portable kernel's Big tile.
  for (int per_sm : {1, 2, 4, 8}) {  // 256-thread blocks an SM: 8, 16, 32, 64 warps
    const int blocks = sms * per_sm;
    const float ms = time_ms([&] { mma_chain<8><<<blocks, 256>>>(out, iters); }, 5);
    CHECK(cudaGetLastError());
    const double flops = double(blocks) * 8 * iters * 8 * 4096.0;
    std::printf("mma.sync m16n8k16 bf16, %2d warps/SM, 8 chains: %.1f TFLOP/s\n", per_sm * 8,
                flops / (ms * 1e-3) / 1e12);
  }
  {  // 8 warps an SM with the Big tile's 32 accumulators a warp
    const int blocks = sms;
    const float ms = time_ms([&] { mma_chain<32><<<blocks, 256>>>(out, iters / 4); }, 5);
    CHECK(cudaGetLastError());
    const double flops = double(blocks) * 8 * (iters / 4) * 32 * 4096.0;
    std::printf("mma.sync m16n8k16 bf16,  8 warps/SM, 32 chains: %.1f TFLOP/s\n",
                flops / (ms * 1e-3) / 1e12);
  }
  // cuBLAS bf16 GEMM, 8192^3 (torch.mm's kernel family), float32 accumulate.
  const int n = 8192;
  __nv_bfloat16 *A, *B, *C;
  CHECK(cudaMalloc(&A, sizeof(__nv_bfloat16) * n * n));
  CHECK(cudaMalloc(&B, sizeof(__nv_bfloat16) * n * n));
  CHECK(cudaMalloc(&C, sizeof(__nv_bfloat16) * n * n));
  fill_random<<<1024, 256>>>(A, size_t(n) * n);
  fill_random<<<1024, 256>>>(B, size_t(n) * n);
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
    std::printf("cublasCreate failed\n");
    return 1;
  }
  const float one = 1.f, zero = 0.f;
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  auto gemm = [&] {
    const cublasStatus_t st =
        cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, A, CUDA_R_16BF, n, B,
                     CUDA_R_16BF, n, &zero, C, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) status = st;
  };
  const float ms = time_ms(gemm, 10);
  CHECK(cudaGetLastError());
  if (status != CUBLAS_STATUS_SUCCESS) {
    std::printf("cublasGemmEx failed: %d\n", static_cast<int>(status));
    return 1;
  }
  std::printf("cuBLAS bf16 GEMM 8192^3: %.1f TFLOP/s\n", 2.0 * n * n * n / (ms * 1e-3) / 1e12);
  return 0;
}
