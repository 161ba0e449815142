// The Hopper (sm_90a) GEMM's entry point, defined in matmul_sm90.cu.
#pragma once
#include <ATen/core/Tensor.h>
#include <cuda_runtime.h>

#include "cuda/matmul_common.cuh"

namespace fused {
namespace matmul {

enum class Sm90Result {
  kLaunched,       // ran on the Hopper kernel
  kNotApplicable,  // this problem's shape or layout is not for the Hopper kernel
  kUnavailable,    // no Hopper kernel here: not a CC 9.0 device, a build without sm_90a,
                   // or a device whose block shared memory cannot hold its pipeline
};

// Runs the problem on the Hopper kernel, or launches nothing and says why not (matmul_sm90.cu
// lists what applies).
Sm90Result launch_sm90_gemm(const GemmProblem& p, at::ScalarType dtype, cudaStream_t stream);

// The backward GEMM dZ = (A B) * act'(Z) with act' in the epilogue (matmul_sm90.cu:
// DactEpilogue): A K-major [M, K], B MN-major [K, N], p.z the saved Z and p.c dZ, [M, N] or
// for a gated p.act [M, 2N]; partials, when not null, receives dZ's column sums per 16-row
// block, [ceil(M / 16), dZ's width] floats. Launches nothing and says why otherwise.
Sm90Result launch_sm90_dact(const GemmProblem& p, float* partials, at::ScalarType dtype,
                            cudaStream_t stream);

}  // namespace matmul
}  // namespace fused
