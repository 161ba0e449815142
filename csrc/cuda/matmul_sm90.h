// The Hopper (sm_90a) GEMM's entry point, defined in matmul_sm90.cu.
#pragma once
#include <ATen/core/Tensor.h>
#include <cuda_runtime.h>

#include "cuda/matmul_common.cuh"

namespace fused {
namespace matmul {

// Runs the problem on the Hopper kernel and returns true, or returns false (launching
// nothing) when it does not apply: not a compute capability 9.0 device, a build without
// sm_90a code, or operands TMA cannot describe (see matmul_sm90.cu).
bool launch_sm90_gemm(const GemmProblem& p, at::ScalarType dtype, cudaStream_t stream);

}  // namespace matmul
}  // namespace fused
