// The portable (sm_80+) GEMM's entry point. Defined in matmul_portable_launch.cuh and
// instantiated once per element type in its own translation unit (matmul_portable_bf16.cu,
// matmul_portable_f16.cu): the kernels are the slowest code of the build to compile, and
// separate units let ninja compile them in parallel with each other and with matmul.cu.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/matmul_common.cuh"

namespace fused {
namespace matmul {

// Runs the problem (16-bit T, any M, N, K, operand layouts as GemmProblem describes; the
// caller makes sure A is not MN-major while B is K-major) on the portable kernel.
template <typename T>
void launch_portable_gemm(const GemmProblem& p, cudaStream_t stream);

extern template void launch_portable_gemm<__nv_bfloat16>(const GemmProblem&, cudaStream_t);
extern template void launch_portable_gemm<__half>(const GemmProblem&, cudaStream_t);

}  // namespace matmul
}  // namespace fused
