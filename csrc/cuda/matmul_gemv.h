// The small-M GEMM's entry point (matmul_gemv.cu): a few rows of A against a K-major B (the
// forward of a linear layer at decode time), memory-bound on B.
#pragma once
#include <ATen/core/Tensor.h>
#include <cuda_runtime.h>

#include "cuda/matmul_common.cuh"

namespace fused {
namespace matmul {

// Runs p (1 <= M <= kGemvMaxM, both operands K-major with 16-byte aligned rows and batch
// strides, a non-gated activation, batch <= 65535) on the small-M kernel.
void launch_gemv(const GemmProblem& p, at::ScalarType dtype, cudaStream_t stream);

}  // namespace matmul
}  // namespace fused
