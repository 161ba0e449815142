// The portable GEMM's launcher and tile-shape choice, included by matmul_portable_bf16.cu
// and matmul_portable_f16.cu (one explicit instantiation each; see matmul_portable.h).
#pragma once
#include <ATen/cuda/CUDAContext.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "common/launch.cuh"
#include "cuda/matmul_portable.cuh"
#include "cuda/matmul_portable.h"

namespace fused {
namespace matmul {
namespace portable_detail {

// ---------------------------------------------------------------------------------------
// Portable kernel launch and tile-shape choice.
//
// Two tile shapes, chosen by how many tiles the problem makes:
//   Big   128 x 256 x 64, 8 warps of 64 x 64, 3 stages (162 KB smem, inside sm_80's 163):
//         the throughput shape; each k16 step a warp issues 32 mma for 8 ldmatrix.x4 (a 2:1
//         math to smem ratio). BK = 64 rather than 32 (4 stages): half the barriers per mma
//         and whole 128-byte lines per K-major row copy; +4-9% at 8192^3 on an H200
//         (docs/design/matmul.md#tried-not-kept) despite ptxas spilling at 255 registers
//         (688-1304 bytes of spill loads, nearly all in the prologue and epilogue).
//   Small  64 x 128 x 32, 4 warps of 32 x 64, 4 stages (60 KB smem): for problems that make
//         fewer Big tiles than there are SMs (e.g. 1000 x 1000), where filling the GPU
//         matters more than per-tile efficiency, and for GPUs whose per-block shared
//         memory (99 KB on sm_86/89) cannot hold the Big pipeline.
using BigCfg = PortableConfig<128, 256, 64, 2, 4, 3, 1>;
using SmallCfg = PortableConfig<64, 128, 32, 2, 2, 4, 1>;

template <typename T, typename Cfg, bool AK, bool BK>
void launch_portable_layout(const GemmProblem& p, cudaStream_t stream) {
  auto kernel = portable_gemm_kernel<T, Cfg, AK, BK>;
  constexpr int smem = Cfg::template smem_bytes<AK, BK>();
  TORCH_CHECK(allow_dynamic_smem_once(kernel, smem), "fused::matmul: the portable kernel's ", smem,
              " bytes of shared memory a block are more than this GPU allows");
  const int64_t tiles = ceil_div(p.M, Cfg::BM) * ceil_div(p.N, Cfg::BN);
  TORCH_CHECK(tiles < (int64_t(1) << 31), "fused::matmul: problem too large (", tiles, " tiles)");
  dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(std::min(p.batch, 65535)));
  kernel<<<grid, Cfg::THREADS, smem, stream>>>(p);
  FUSED_LAUNCH_CHECK();
}

// Three operand layouts are compiled: A K-major with B either way (forward, dX = dZ W, plain
// row-major matmul) and both MN-major (dW = dZ^T X). gemm_16bit copies A to row-major for
// the fourth (A MN-major, B K-major), which no layer produces.
template <typename T, typename Cfg>
void launch_portable_cfg(const GemmProblem& p, cudaStream_t stream) {
  if (p.a_kmajor && p.b_kmajor) {
    launch_portable_layout<T, Cfg, true, true>(p, stream);
  } else if (p.a_kmajor) {
    launch_portable_layout<T, Cfg, true, false>(p, stream);
  } else {
    TORCH_CHECK(!p.b_kmajor, "fused::matmul: internal error: unsupported operand layout");
    launch_portable_layout<T, Cfg, false, false>(p, stream);
  }
}

}  // namespace portable_detail

template <typename T>
void launch_portable_gemm(const GemmProblem& p, cudaStream_t stream) {
  using namespace portable_detail;
  const int64_t big_tiles = ceil_div(p.M, BigCfg::BM) * ceil_div(p.N, BigCfg::BN) * p.batch;
  const auto* prop = at::cuda::getCurrentDeviceProperties();
  // The largest of the three compiled layouts' pipelines (launch_portable_cfg).
  constexpr size_t big_smem =
      std::max({BigCfg::smem_bytes<true, true>(), BigCfg::smem_bytes<true, false>(),
                BigCfg::smem_bytes<false, false>()});
  const bool big_fits = big_smem <= prop->sharedMemPerBlockOptin;
  if (big_fits && big_tiles >= prop->multiProcessorCount) {
    launch_portable_cfg<T, BigCfg>(p, stream);
  } else {
    launch_portable_cfg<T, SmallCfg>(p, stream);
  }
}

}  // namespace matmul
}  // namespace fused
