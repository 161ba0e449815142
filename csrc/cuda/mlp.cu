// fused::mlp and fused::linear_dact on CUDA. The forward is the linear ops' (common/mlp.h).
// linear_dact: dZ = (dY W) * act'(Z) in one Hopper GEMM with act' in its epilogue
// (matmul_sm90.cu, DactEpilogue: dH never reaches memory), the bias gradient from per-16-row
// column sums the epilogue writes (1/8 of dZ's bytes for 16-bit dZ, in float: no pass over
// dZ); where that kernel does not apply (another GPU or build, float32, a layout or
// alignment TMA cannot take, matmul.kernel=portable), a GEMM then linear_act_backward.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sum.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <limits>

#include "common/launch.cuh"
#include "common/mlp.h"
#include "common/overrides.h"
#include "common/vec.cuh"
#include "cuda/matmul_sm90.h"

namespace fused {
namespace {

// A 2-D operand with unit column stride, 16-byte aligned rows (TMA's rules).
bool tma_rows(const at::Tensor& t) {
  return t.stride(1) == 1 && t.stride(0) % 8 == 0 && t.stride(0) >= t.size(1) &&
         is_aligned(t.const_data_ptr());
}

// The Hopper dact GEMM; undefined tensors when it does not take the problem.
std::tuple<at::Tensor, at::Tensor> dact_hopper(const at::Tensor& g2, const at::Tensor& w,
                                               const at::Tensor& z2, LinearAct act,
                                               bool bias_grad) {
  if (overrides().matmul_kernel == Overrides::MatmulKernel::kPortable) return {};
  const auto dtype = g2.scalar_type();
  if (dtype != at::kBFloat16 && dtype != at::kHalf) return {};
  const int64_t M = g2.size(0), K = g2.size(1), N = w.size(1), width = z2.size(1);
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  if (M == 0 || N == 0 || K == 0 || M > kMax || width > kMax || K > kMax) return {};
  if (N % 8 != 0 || !tma_rows(g2) || !tma_rows(w) || !z2.is_contiguous() ||
      !is_aligned(z2.const_data_ptr())) {
    return {};
  }
  at::Tensor dz = at::empty({M, width}, z2.options());
  at::Tensor partial;
  if (bias_grad) partial = at::empty({(M + 15) / 16, width}, z2.options().dtype(at::kFloat));
  matmul::GemmProblem p{};
  p.a = g2.const_data_ptr();
  p.b = w.const_data_ptr();
  p.c = dz.mutable_data_ptr();
  p.z = const_cast<void*>(z2.const_data_ptr());  // read only: the dact epilogue's input
  p.bias = nullptr;
  p.lda = g2.stride(0);
  p.ldb = w.stride(0);
  p.M = static_cast<int>(M);
  p.N = static_cast<int>(N);
  p.K = static_cast<int>(K);
  p.batch = 1;
  p.act = static_cast<int>(act);
  p.group_m = overrides().matmul_group_m;
  p.a_kmajor = true;   // dY [M, K] row-major
  p.b_kmajor = false;  // W [K, N] row-major: N contiguous
  const auto r = matmul::launch_sm90_dact(
      p, bias_grad ? partial.mutable_data_ptr<float>() : nullptr, dtype, current_stream());
  if (r != matmul::Sm90Result::kLaunched) return {};
  // The partial rows summed in a fixed order (deterministic), then rounded once.
  at::Tensor db = bias_grad ? at::sum(partial, 0).to(dtype) : at::empty({0}, z2.options());
  return {dz, db};
}

std::tuple<at::Tensor, at::Tensor> dact_cuda(const at::Tensor& g2, const at::Tensor& w,
                                             const at::Tensor& z2, LinearAct act, bool bias_grad) {
  c10::cuda::CUDAGuard guard(g2.device());
  auto out = dact_hopper(g2, w, z2, act, bias_grad);
  if (std::get<0>(out).defined()) return out;
  return dact_composed(g2, w, z2, act, bias_grad);
}

}  // namespace

TORCH_LIBRARY_IMPL(fused, CUDA, m) { FUSED_REGISTER_MLP_OPS(m, dact_cuda); }

}  // namespace fused
