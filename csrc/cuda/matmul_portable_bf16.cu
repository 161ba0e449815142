// The portable GEMM for __nv_bfloat16 (see matmul_portable.h for why one unit per element type).
#include "cuda/matmul_portable_launch.cuh"

namespace fused {
namespace matmul {
template void launch_portable_gemm<__nv_bfloat16>(const GemmProblem&, cudaStream_t);
}  // namespace matmul
}  // namespace fused
