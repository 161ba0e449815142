// The portable GEMM for __half (see matmul_portable.h for why one unit per element type).
#include "cuda/matmul_portable_launch.cuh"

namespace fused {
namespace matmul {
template void launch_portable_gemm<__half>(const GemmProblem&, cudaStream_t);
}  // namespace matmul
}  // namespace fused
