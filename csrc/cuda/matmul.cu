// matmul / linear on CUDA (checks and the op entry points shared with the CPU kernels:
// common/matmul.h).
//
// bf16/fp16: hand-written tensor-core GEMMs with the bias + GeLU epilogue fused:
//   - the small-M kernel (matmul_gemv.cu) for up to 32 rows against a K-major B (a linear
//     layer's forward at decode time), on any GPU, when the plan (matmul/plan.h: use_gemv)
//     takes it: memory-bound, it streams B once;
//   - the Hopper kernel (matmul_sm90.cu: wgmma + TMA, warp-specialised, persistent) on
//     compute capability 9.0 when the build has sm_90a code and the operands suit TMA;
//   - the portable kernel (matmul_portable.cuh: mma.sync + cp.async) everywhere else,
//     compiled in its own translation units, one per element type
//     (matmul_portable_{bf16,f16}.cu), which the build runs in parallel.
//   The override matmul.kernel=portable (common/overrides.h) forces the portable kernel
//   (benchmarks report its % of cuBLAS); "auto" (the default) takes the Hopper kernel where
//   it applies; "hopper" does the same but fails when no Hopper kernel is available at all
//   (the tests use it to make sure the Hopper kernel is what they check on an H100/H200).
// float32: cuBLAS through at::mm / at::matmul, which uses TF32 exactly when torch allows it
//   (torch.backends.cuda.matmul.allow_tf32), then one elementwise pass for bias + activation.
//   The hand kernels are 16-bit only.
//
// Operands are read in place when each matrix is row- or column-major with a 16-byte
// aligned base, leading dimension and batch stride (a transposed weight, dZ^T in the
// backward pass: no copies). Anything else (gaps in the contiguous dimension, odd leading
// dimensions such as K = 17, offset views, a last row that ends its storage mid-chunk) is
// copied once to a padded row-major buffer.
//
// Backward (linear_act_backward): dZ = dY * act'(Z) in one elementwise pass that also
// writes per-block column partial sums of dZ; a second small kernel adds the partials in a
// fixed order, so the bias gradient is deterministic. dX = dZ W and dW = dZ^T X are two
// calls of the GEMM above (autograd in fused_ops/_impl/matmul.py).
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/sum.h>
#include <torch/library.h>

#include "common/dispatch.h"
#include "common/launch.cuh"
#include "common/matmul.h"
#include "common/overrides.h"
#include "common/vec.cuh"
#include "cuda/matmul/plan.h"
#include "cuda/matmul_gemv.h"
#include "cuda/matmul_portable.h"
#include "cuda/matmul_sm90.h"

namespace fused {
namespace {

using matmul::GemmProblem;

// The Hopper kernel where it applies (every operand layout; matmul_sm90.cu); true when it ran.
bool run_hopper_gemm(const GemmProblem& p, at::ScalarType dtype) {
  using Choice = Overrides::MatmulKernel;
  const Choice choice = overrides().matmul_kernel;
  if (choice == Choice::kPortable) return false;
  const auto r = matmul::launch_sm90_gemm(p, dtype, current_stream());
  TORCH_CHECK(
      r != matmul::Sm90Result::kUnavailable || choice != Choice::kHopper,
      "fused::matmul: the override matmul.kernel=hopper is set, but the Hopper kernel is not "
      "available here (it needs a compute capability 9.0 GPU with room for its shared "
      "memory pipeline and a build with sm_90a, e.g. TORCH_CUDA_ARCH_LIST=\"9.0a\")");
  return r == matmul::Sm90Result::kLaunched;
}

// Whether the plan gives p (non-gated) to the small-M kernel.
bool gemv_applies(const GemmProblem& p) {
  return p.act < matmul::kActSwiglu &&
         matmul::use_gemv(p.M, p.N, p.K, p.batch, p.a_kmajor && p.b_kmajor, num_sms(), overrides());
}

void run_portable_gemm(const GemmProblem& p, at::ScalarType dtype) {
  cudaStream_t stream = current_stream();
  if (dtype == at::kBFloat16) {
    matmul::launch_portable_gemm<__nv_bfloat16>(p, stream);
  } else {
    matmul::launch_portable_gemm<__half>(p, stream);
  }
}

// ---------------------------------------------------------------------------------------
// Operands.

int64_t round_up8(int64_t v) { return (v + 7) / 8 * 8; }

// A 3-D operand [batch, rows, cols] as the kernels read it: each matrix row-major
// (cols contiguous) or column-major (rows contiguous), with a 16-byte aligned base, leading
// dimension and batch stride (16-bit elements: multiples of 8).
struct MatView {
  at::Tensor keep;  // owns a copy when one was made
  const void* ptr;
  int64_t ld, batch_stride;
  bool row_major;
};

// Whether every 16-byte chunk the portable kernel copies from t, read in place as `lines`
// lines of `len` contiguous elements `ld` apart, lies inside t's storage. The kernel copies
// whole chunks (at a K edge it asks cp.async for fewer bytes, but compute-sanitizer counts
// the whole chunk), so the last line of the last matrix is read up to a multiple of 8
// elements: past the storage's end when that line ends it mid-chunk (a single row of
// K = 17 elements, say), a read outside the allocation once the caching allocator no
// longer rounds it up (tests/run_parallel.py --memcheck).
bool chunks_inside_storage(const at::Tensor& t, int64_t sb, int64_t ld, int64_t lines,
                           int64_t len) {
  const int64_t avail =
      static_cast<int64_t>(t.storage().nbytes()) / t.element_size() - t.storage_offset();
  return (t.size(0) - 1) * sb + (lines - 1) * ld + round_up8(len) <= avail;
}

MatView prepare_operand(const at::Tensor& t, bool allow_col_major = true) {
  const int64_t R = t.size(1), C = t.size(2);
  const int64_t sb = t.size(0) == 1 ? 0 : t.stride(0);
  if (t.numel() == 0) return {t, t.const_data_ptr(), 8, 0, true};  // nothing is read
  const bool aligned = is_aligned(t.const_data_ptr()) && sb % 8 == 0;
  if (aligned && (t.stride(2) == 1 || C == 1)) {
    const int64_t ld = R == 1 ? round_up8(C) : t.stride(1);
    if (ld % 8 == 0 && chunks_inside_storage(t, sb, ld, R, C)) {
      return {t, t.const_data_ptr(), ld, sb, true};
    }
  }
  if (allow_col_major && aligned && (t.stride(1) == 1 || R == 1)) {
    const int64_t ld = C == 1 ? round_up8(R) : t.stride(2);
    if (ld % 8 == 0 && chunks_inside_storage(t, sb, ld, C, R)) {
      return {t, t.const_data_ptr(), ld, sb, false};
    }
  }
  // Copy to rows padded to a multiple of 8 elements, keeping the source's contiguous dimension
  // (a column-major source stays column-major: a linear's weight with an odd K stays K-major,
  // which the small-M kernel needs). The padding is zeroed: the portable kernel copies a
  // 16-byte chunk that straddles the end of an MN-major row whole (what lies past N only
  // feeds outputs that are never stored, but it should be defined).
  if (allow_col_major && t.stride(1) == 1 && t.stride(2) != 1 && R > 1) {
    const int64_t Rp = round_up8(R);
    at::Tensor buf = at::empty({t.size(0), C, Rp}, t.options());
    buf.narrow(2, 0, R).copy_(t.transpose(1, 2));
    if (Rp > R) buf.narrow(2, R, Rp - R).zero_();
    return {buf, buf.const_data_ptr(), Rp, t.size(0) == 1 ? 0 : C * Rp, false};
  }
  const int64_t Cp = round_up8(C);
  at::Tensor buf = at::empty({t.size(0), R, Cp}, t.options());
  buf.narrow(2, 0, C).copy_(t);
  if (Cp > C) buf.narrow(2, C, Cp - C).zero_();
  return {buf, buf.const_data_ptr(), Cp, t.size(0) == 1 ? 0 : R * Cp, true};
}

// The problem out[batch, M, N] = act(a[batch?, M, K] b[batch?, K, N] + bias), z = the
// pre-activation; `keep` holds the operand copies and the bias the problem points to.
struct GemmOperands {
  MatView A, B;
  at::Tensor bias;
};

GemmProblem problem_16bit(const at::Tensor& a3, const at::Tensor& b3, at::Tensor& out,
                          const at::Tensor* bias, at::Tensor* z, LinearAct act,
                          GemmOperands& keep) {
  const int64_t batch = std::max(a3.size(0), b3.size(0));
  const int64_t M = a3.size(1), K = a3.size(2), N = b3.size(2);
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  TORCH_CHECK(M <= kMax && N <= kMax && K <= kMax && batch <= kMax,
              "fused::matmul: dimensions must be below 2^31, got batch ", batch, ", M ", M, ", N ",
              N, ", K ", K);
  keep.A = prepare_operand(a3);
  keep.B = prepare_operand(b3);
  const MatView &A = keep.A, &B = keep.B;
  if (bias != nullptr) keep.bias = bias->contiguous();
  const at::Tensor& bias_c = keep.bias;
  GemmProblem p;
  p.a = A.ptr;
  p.b = B.ptr;
  p.c = out.mutable_data_ptr();
  p.z = z != nullptr ? z->mutable_data_ptr() : nullptr;
  p.bias = bias != nullptr ? bias_c.const_data_ptr() : nullptr;
  p.lda = A.ld;
  p.ldb = B.ld;
  p.batch_stride_a = A.batch_stride;
  p.batch_stride_b = B.batch_stride;
  p.M = static_cast<int>(M);
  p.N = static_cast<int>(N);
  p.K = static_cast<int>(K);
  p.batch = static_cast<int>(batch);
  p.act = static_cast<int>(act);
  p.group_m = overrides().matmul_group_m;
  p.a_kmajor = A.row_major;   // A [M, K] row-major: K contiguous
  p.b_kmajor = !B.row_major;  // B [K, N] column-major: K contiguous
  return p;
}

void gemm_16bit(const at::Tensor& a3, const at::Tensor& b3, at::Tensor& out, const at::Tensor* bias,
                at::Tensor* z, LinearAct act) {
  GemmOperands keep;
  GemmProblem p = problem_16bit(a3, b3, out, bias, z, act, keep);
  if (p.M == 0 || p.N == 0 || p.batch == 0) return;
  if (gemv_applies(p)) {
    matmul::launch_gemv(p, a3.scalar_type(), current_stream());
    return;
  }
  if (run_hopper_gemm(p, a3.scalar_type())) return;
  if (!p.a_kmajor && p.b_kmajor) {
    // The portable kernel has no MN-major A with K-major B (matmul_portable_launch.cuh):
    // A is copied to row-major for it.
    keep.A = prepare_operand(a3, false);
    p.a = keep.A.ptr;
    p.lda = keep.A.ld;
    p.batch_stride_a = keep.A.batch_stride;
    p.a_kmajor = true;
  }
  run_portable_gemm(p, a3.scalar_type());
}

// The gated linear in the Hopper kernel's epilogue (matmul_sm90.cu: each tile loads the
// gate and up rows of its output columns and pairs them in registers): y [M, N] =
// act(z[:, :N]) * z[:, N:] and, when z is given, z [M, 2N] = x W^T + bias. False when the
// Hopper kernel does not take the problem (another GPU or build, an operand read through a
// copy in the MN-major layout, outputs TMA cannot store): the caller composes it instead.
bool gated_gemm_hopper(const at::Tensor& x2, const at::Tensor& w, const at::Tensor* bias,
                       at::Tensor& y, at::Tensor* z, LinearAct act) {
  if (overrides().matmul_kernel == Overrides::MatmulKernel::kPortable) return false;
  const int64_t M = x2.size(0), K = x2.size(1), N2 = w.size(0);
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  if (M > kMax || N2 > kMax || K > kMax || K == 0) return false;
  GemmOperands keep;
  GemmProblem p = problem_16bit(x2.unsqueeze(0), w.t().unsqueeze(0), y, bias, z, act, keep);
  if (!p.a_kmajor || !p.b_kmajor) return false;
  // Few rows: the small-M kernel writes z and the gated kernel pairs its halves (both
  // memory-bound passes; the weight's read dominates).
  if (matmul::use_gemv(M, N2, K, 1, true, num_sms(), overrides())) return false;
  p.N = static_cast<int>(N2 / 2);  // the output's width; B has 2N rows
  return matmul::launch_sm90_gemm(p, x2.scalar_type(), current_stream()) ==
         matmul::Sm90Result::kLaunched;
}

// ---------------------------------------------------------------------------------------
// float32: bias + activation over the cuBLAS result, one elementwise pass.
template <typename T>
__global__ void bias_act_kernel(const T* __restrict__ zin, T* zout, T* y,
                                const T* __restrict__ bias, int64_t numel, int64_t N, int act) {
  grid_dependency_wait();  // launched early (launch_early): nothing global before this
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < numel;
       i += int64_t(gridDim.x) * blockDim.x) {
    float v = static_cast<float>(zin[i]);
    if (bias != nullptr) v += static_cast<float>(bias[i % N]);
    if (zout != nullptr) zout[i] = static_cast<T>(v);
    y[i] = static_cast<T>(matmul::apply_act(v, act));
  }
}

// ---------------------------------------------------------------------------------------
// Backward of the activation: dZ = dY * act'(Z), plus the column sums of dZ.
// Block (32, 8): each lane owns VEC consecutive columns (one 16-byte load of dY and of Z
// when rows allow it, VEC = 1 otherwise), so a block covers 32 VEC columns and
// kRowsPerBlock rows; the 8 row groups' sums are combined in shared memory in a fixed order
// and written as one partial row per block; act_bias_finish_kernel adds the partial rows in
// order, so the bias gradient is deterministic.
constexpr int kRowsPerBlock = 128;

template <typename T, GeluKind K, int VEC>
__global__ void act_backward_kernel(const T* __restrict__ g, const T* __restrict__ z,
                                    T* __restrict__ dz, float* __restrict__ partial, int64_t M,
                                    int64_t N) {
  grid_dependency_wait();  // launched early (launch_early): nothing global before this
  __shared__ float sums[8][32 * VEC];
  const int64_t col0 = (blockIdx.x * 32 + threadIdx.x) * int64_t(VEC);
  const int64_t row0 = blockIdx.y * int64_t(kRowsPerBlock);
  float s[VEC];
#pragma unroll
  for (int e = 0; e < VEC; ++e) s[e] = 0.f;
    // Unrolled, and guarded rather than left by a break, so that the loads of four rows are
    // in flight together (one row at a time left the pass latency-bound:
    // docs/design/matmul.md#tried-not-kept).
#pragma unroll 4
  for (int r = threadIdx.y; r < kRowsPerBlock; r += 8) {
    const int64_t row = row0 + r;
    if (row >= M) continue;
    const int64_t i = row * N + col0;
    if constexpr (VEC > 1) {
      if (col0 < N) {  // N % VEC == 0: the whole vector is inside the row
        const Vec<T, VEC> gv = load_vec<T, VEC>(g + i), zv = load_vec<T, VEC>(z + i);
        Vec<T, VEC> out;
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const float d =
              static_cast<float>(gv.v[e]) * gelu_grad_for<T, K>(static_cast<float>(zv.v[e]));
          out.v[e] = static_cast<T>(d);
          s[e] += d;
        }
        store_vec<T, VEC>(dz + i, out);
      }
    } else if (col0 < N) {
      const float d = static_cast<float>(g[i]) * gelu_grad_for<T, K>(static_cast<float>(z[i]));
      dz[i] = static_cast<T>(d);
      s[0] += d;
    }
  }
  if (partial == nullptr) return;
#pragma unroll
  for (int e = 0; e < VEC; ++e) sums[threadIdx.y][threadIdx.x * VEC + e] = s[e];
  __syncthreads();
  for (int c = threadIdx.y * 32 + threadIdx.x; c < 32 * VEC; c += 256) {
    float t = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k) t += sums[k][c];
    const int64_t col = blockIdx.x * int64_t(32 * VEC) + c;
    if (col < N) partial[blockIdx.y * N + col] = t;
  }
}

template <typename T>
__global__ void act_bias_finish_kernel(const float* __restrict__ partial, T* __restrict__ db,
                                       int64_t rows, int64_t N) {
  grid_dependency_wait();  // launched early (launch_early): nothing global before this
  const int64_t col = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (col >= N) return;
  float t = 0.f;
  for (int64_t r = 0; r < rows; ++r) t += partial[r * N + col];
  db[col] = static_cast<T>(t);
}

// ---------------------------------------------------------------------------------------
// Ops.

at::Tensor matmul_cuda(const at::Tensor& a, const at::Tensor& b) {
  c10::cuda::CUDAGuard guard(a.device());
  if (a.scalar_type() == at::kFloat) return at::matmul(a, b).contiguous();
  at::Tensor a3 = a.dim() == 2 ? a.unsqueeze(0) : a;
  at::Tensor b3 = b.dim() == 2 ? b.unsqueeze(0) : b;
  const int64_t batch = std::max(a3.size(0), b3.size(0));
  const int64_t M = a3.size(1), N = b3.size(2);
  at::Tensor out = at::empty({batch, M, N}, a.options());
  if (a.dim() == 3 && b.dim() == 2 && a.is_contiguous()) {
    // One tall GEMM instead of a batch of short ones.
    at::Tensor out2 = out.view({1, batch * M, N});
    gemm_16bit(a.reshape({1, batch * M, a.size(2)}), b3, out2, nullptr, nullptr, LinearAct::kNone);
  } else {
    gemm_16bit(a3, b3, out, nullptr, nullptr, LinearAct::kNone);
  }
  return (a.dim() == 2 && b.dim() == 2) ? out.squeeze(0) : out;
}

// y = act(x W^T + bias) (and z = x W^T + bias when want_preact), shaped [..., out].
// Gated (weight [2N, K]): y [..., N] = act(z[..., :N]) * z[..., N:], z = x W^T + bias
// [..., 2N] (returned when want_preact). In the Hopper kernel's epilogue where it applies;
// otherwise the GEMM writes z and the gated kernel (cuda/gated.cu) reads its halves in place.
std::tuple<at::Tensor, at::Tensor> gated_linear(const at::Tensor& x, const at::Tensor& w,
                                                const std::optional<at::Tensor>& bias,
                                                LinearAct act, bool want_preact) {
  const int64_t K = w.size(1), N2 = w.size(0), N = N2 / 2;
  std::vector<int64_t> y_shape(x.sizes().begin(), x.sizes().end() - 1);
  std::vector<int64_t> z_shape = y_shape;
  y_shape.push_back(N);
  z_shape.push_back(N2);
  const at::Tensor x2 = x.dim() == 2 ? x : x.reshape({-1, K});
  const int64_t M = x2.size(0);
  const at::Tensor* bias_p = bias.has_value() ? &*bias : nullptr;
  at::Tensor y = at::empty({M, N}, x.options());
  at::Tensor z;
  const bool half = x.scalar_type() != at::kFloat;
  if (half && M * N > 0) {
    if (want_preact) z = at::empty({M, N2}, x.options());
    if (gated_gemm_hopper(x2, w, bias_p, y, want_preact ? &z : nullptr, act)) {
      return {y.view(y_shape), want_preact ? z.view(z_shape) : at::Tensor()};
    }
  }
  if (half) {
    if (!z.defined()) z = at::empty({M, N2}, x.options());
    gemm_16bit(x2.unsqueeze(0), w.t().unsqueeze(0), z, bias_p, nullptr, LinearAct::kNone);
  } else {
    z = at::mm(x2, w.t());  // cuBLAS; TF32 exactly when torch allows it
    if (bias_p != nullptr) z.add_(*bias_p);
  }
  if (M * N > 0) gated_forward_cuda(gated_kind(act), z.narrow(1, 0, N), z.narrow(1, N, N), y);
  return {y.view(y_shape), want_preact ? z.view(z_shape) : at::Tensor()};
}

std::tuple<at::Tensor, at::Tensor> linear_impl(const at::Tensor& x, const at::Tensor& w,
                                               const std::optional<at::Tensor>& bias, LinearAct act,
                                               bool want_preact) {
  c10::cuda::CUDAGuard guard(x.device());
  if (is_gated(act)) return gated_linear(x, w, bias, act, want_preact);
  const int64_t K = w.size(1), N = w.size(0);
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end() - 1);
  out_shape.push_back(N);
  const at::Tensor x2 = x.dim() == 2 ? x : x.reshape({-1, K});
  const int64_t M = x2.size(0);
  const at::Tensor* bias_p = bias.has_value() ? &*bias : nullptr;
  at::Tensor y, z;
  if (x.scalar_type() == at::kFloat) {
    at::Tensor mm = at::mm(x2, w.t());  // cuBLAS; TF32 exactly when torch allows it
    if (bias_p == nullptr && act == LinearAct::kNone) {
      y = mm;
    } else if (M * N > 0) {
      at::Tensor bias_c = bias_p ? bias_p->contiguous() : at::Tensor();
      y = want_preact ? at::empty_like(mm) : mm;  // in place unless both are needed
      const int threads = 256;
      launch_early(bias_act_kernel<float>, dim3(elementwise_grid(M * N, threads)), dim3(threads), 0,
                   mm.const_data_ptr<float>(), want_preact ? mm.mutable_data_ptr<float>() : nullptr,
                   y.mutable_data_ptr<float>(), bias_p ? bias_c.const_data_ptr<float>() : nullptr,
                   M * N, N, static_cast<int>(act));
    } else {
      y = want_preact ? at::empty_like(mm) : mm;
    }
    if (want_preact) z = mm;
  } else {
    y = at::empty({M, N}, x.options());
    if (want_preact) z = at::empty({M, N}, x.options());
    gemm_16bit(x2.unsqueeze(0), w.t().unsqueeze(0), y, bias_p, want_preact ? &z : nullptr, act);
  }
  y = y.view(out_shape);
  if (want_preact) z = z.view(out_shape);
  return {y, z};
}

std::tuple<at::Tensor, at::Tensor> act_backward_cuda(const at::Tensor& grad_out,
                                                     const at::Tensor& preact, LinearAct act,
                                                     bool bias_grad) {
  const char* op = "fused::linear_act_backward";
  c10::cuda::CUDAGuard guard(preact.device());
  if (is_gated(act))
    return gated_linear_act_backward<gated_backward_cuda>(grad_out, preact, gated_kind(act),
                                                          bias_grad);
  const at::Tensor z = preact.contiguous();
  const at::Tensor g = grad_out.contiguous();
  const int64_t N = z.size(-1);
  const int64_t M = N == 0 ? 0 : z.numel() / N;
  at::Tensor dz = at::empty_like(z);
  at::Tensor db = at::empty({bias_grad ? N : 0}, z.options());
  if (N == 0) return {dz, db};
  if (M == 0) {
    if (bias_grad) db.zero_();
    return {dz, db};
  }
  const int64_t row_blocks = ceil_div(M, kRowsPerBlock);
  TORCH_CHECK(row_blocks < 65536, op, ": too many rows (", M, ")");
  at::Tensor partial;
  if (bias_grad) partial = at::empty({row_blocks, N}, z.options().dtype(at::kFloat));
  FUSED_DISPATCH_CUDA(z.scalar_type(), "fused::linear_act_backward", [&] {
    constexpr int kVec = 16 / sizeof(scalar_t);
    const bool vec = N % kVec == 0 && is_aligned(g.const_data_ptr()) &&
                     is_aligned(z.const_data_ptr()) && is_aligned(dz.const_data_ptr());
    float* part = bias_grad ? partial.mutable_data_ptr<float>() : nullptr;
    auto launch = [&](auto kind, auto vec_width) {
      constexpr int V = decltype(vec_width)::value;
      dim3 grid(static_cast<unsigned>(ceil_div(N, 32 * V)), static_cast<unsigned>(row_blocks));
      launch_early(act_backward_kernel<scalar_t, decltype(kind)::value, V>, grid, dim3(32, 8), 0,
                   g.const_data_ptr<scalar_t>(), z.const_data_ptr<scalar_t>(),
                   dz.mutable_data_ptr<scalar_t>(), part, M, N);
    };
    using One = std::integral_constant<int, 1>;
    using Wide = std::integral_constant<int, kVec>;
    using Exact = std::integral_constant<GeluKind, GeluKind::kNone>;
    using Tanh = std::integral_constant<GeluKind, GeluKind::kTanh>;
    if (act == LinearAct::kGelu) {
      vec ? launch(Exact{}, Wide{}) : launch(Exact{}, One{});
    } else {
      vec ? launch(Tanh{}, Wide{}) : launch(Tanh{}, One{});
    }
    if (bias_grad) {
      launch_early(act_bias_finish_kernel<scalar_t>, dim3(static_cast<unsigned>(ceil_div(N, 256))),
                   dim3(256), 0, part, db.mutable_data_ptr<scalar_t>(), row_blocks, N);
    }
  });
  return {dz, db};
}

}  // namespace

TORCH_LIBRARY_IMPL(fused, CUDA, m) {
  FUSED_REGISTER_MATMUL_OPS(m, matmul_cuda, linear_impl, act_backward_cuda);
}

}  // namespace fused
