// norm_fwd_fixed: the forward for the common 16-bit hidden sizes, its launch shape a
// compile-time constant (plan.h: the rows it takes).

#include "cuda/norm/families.h"

namespace fused {
namespace norm {
namespace {

// norm_fwd_fixed: norm_fwd_regs for the common hidden sizes (16-bit rows whose length is
// kFixedVpt * 8 * TPR for a TPR in FixedTprs: 1024 to 16384 columns), with parameters in
// x's dtype. Everything about the launch shape is a constant: a block of TPR threads per
// row (also the 32- and 64-thread rows: a block retires as soon as its row is written,
// docs/design/norm.md#tried-not-kept; on GPUs that hold fewer than 32 blocks an SM, sm_86 / sm_89,
// the 32-thread rows then keep fewer than 32 warps resident), 4 vectors per thread, no per-vector
// bounds checks, no grid-stride loop, at most 64 registers (56 for 384-thread rows). w / b are
// loaded after the reductions (they are L1/L2 hits; loaded with the row they would need 32 more
// registers and spill 56-256 bytes). A standalone sweep (docs/design/norm.md#roofline-and-standing)
// put this shape at 93-97% of copy where the run-time-shaped kernel reaches 79-84%.
//
// Exact constant rows without norm_fwd_regs' x0 shift: every partial sum of a constant
// 16-bit row is k * x0 with k a product of two factors < 64 and a power of two, which
// float32 holds exactly (x0 has <= 11 significant bits; and the sum does not overflow, i.e.
// |x0| < FLT_MAX / cols), and the mean is a correctly rounded division by the length (not
// a multiplication by its inexact reciprocal), so mean == x0 and every x - mean is 0.
// (kFixedVpt = 4 in plan.h.)
// (FixedTprs: plan.h.)

// Resident blocks the launch bound asks for: >= 1024 threads' worth (64 registers), or one
// block more where whole blocks would leave a quarter of that empty (384 threads: 3 blocks
// at 56 registers instead of 2 at up to 85).
constexpr int fixed_min_blocks(int block) {
  return kFwdMaxThreads / block * block <= 3 * kFwdMaxThreads / 4 ? kFwdMaxThreads / block + 1
                                                                  : kFwdMaxThreads / block;
}

// DROP: the dropout forms' input stage (drop_input) on x before the residual add; at the
// plain block count (the 384-thread rows' extra block would leave 56 registers: the Philox
// rounds spill 8-56 bytes there on sm_90a).
template <typename T, int TPR, int LAYER, int RES, int DROP = 0>
__global__ void __launch_bounds__(TPR, DROP ? kFwdMaxThreads / TPR : fixed_min_blocks(TPR))
    norm_fwd_fixed(FwdParams<T, T, T> p) {
  grid_dependency_wait();  // launched early (launch_early): nothing global before this
  static_assert(!DROP || RES, "the dropout forms add a residual");
  constexpr int VEC = kVecElems<T>, VPT = kFixedVpt, COLS = TPR * VPT * VEC;
  static_assert(TPR % 32 == 0, "whole warps");
  __shared__ float scratch[2][1][32];
  const int lane = threadIdx.x;
  const int64_t row = blockIdx.x;
  const int64_t base = row * COLS + lane * VEC;
  auto at = [&](int i) { return base + i * TPR * VEC; };  // element offset of vector i
  // Every load of the row first; then the row as floats (the sum of the add forms is
  // stored as soon as it is formed: no load is left to overtake).
  Raw<T, VEC> in[VPT], res[RES ? VPT : 1];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    in[i] = load_raw<T, VEC>(p.x + at(i));
    if constexpr (RES) res[i] = load_raw<T, VEC>(p.residual + at(i));
  }
  FVec<VEC> v[VPT];
  float sum = 0.f;
  const DropSeed dseed = DROP ? drop_seed(p) : DropSeed{};
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    v[i] = to_float(in[i]);
    if constexpr (DROP) drop_input(v[i], p, at(i), at(i) - row * COLS, dseed);
    if constexpr (RES) {  // normalize the sum as stored (rounded to T)
      const FVec<VEC> fr = to_float(res[i]);
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[i].v[j] += fr.v[j];
      const Raw<T, VEC> rounded = from_float<T, VEC>(v[i]);
      store_raw<T, VEC>(p.sum + at(i), rounded);
      v[i] = to_float(rounded);
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) sum += v[i].v[j];
  }
  float mean = 0.f;
  if constexpr (LAYER) {
    float t[1] = {sum};
    group_sum<1>(t, TPR, scratch[0], false);
    mean = __fdiv_rn(t[0], static_cast<float>(COLS));
  }
  float q[1] = {0.f};
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float d = v[i].v[j] - mean;
      q[0] += d * d;
    }
  }
  group_sum<1>(q, TPR, scratch[1], false);  // the other slot: no barrier between the two
  const float rstd = rsqrtf(q[0] * (1.f / COLS) + p.eps);
  // w / b two vectors at a time: the empty asm keeps the compiler from hoisting all of
  // them above the stores (32 more live registers: spills at the 64-register bound).
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const FVec<VEC> w = param_or<T, VEC>(p.weight, lane + i * TPR, 1.f);
    const FVec<VEC> b = param_or<T, VEC>(LAYER ? p.bias : nullptr, lane + i * TPR, 0.f);
    FVec<VEC> o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) o.v[j] = (v[i].v[j] - mean) * rstd * w.v[j] + b.v[j];
    store_raw<T, VEC>(p.y + at(i), from_float<T, VEC>(o));
    if (i % 2 == 1) asm volatile("" ::: "memory");
  }
  if (lane == 0) {
    if constexpr (LAYER) p.mean[row] = mean;
    p.rstd[row] = rstd;
  }
}

}  // namespace

// norm_fwd_fixed at the step's TPR (one of TPRS) for its norm and residual form.
template <typename T, int... TPRS>
auto fixed_kernel(const Step& s, std::integer_sequence<int, TPRS...>) {
  void (*kernel)(FwdParams<T, T, T>) = nullptr;
  auto pick = [&](auto tpr) {
    constexpr int TPR = decltype(tpr)::value;
    if (s.fixed != TPR) return;
    kernel = s.res ? (s.layer ? norm_fwd_fixed<T, TPR, 1, 1> : norm_fwd_fixed<T, TPR, 0, 1>)
                   : (s.layer ? norm_fwd_fixed<T, TPR, 1, 0> : norm_fwd_fixed<T, TPR, 0, 0>);
    if (s.drop)
      kernel = s.layer ? norm_fwd_fixed<T, TPR, 1, 1, 1> : norm_fwd_fixed<T, TPR, 0, 1, 1>;
  };
  (pick(std::integral_constant<int, TPRS>{}), ...);
  return kernel;
}

template <typename T>
void fwd_fixed(const FwdParams<T, T, T>& p, const Step& s) {
  const auto kernel = fixed_kernel<T>(s, FixedTprs{});
  TORCH_INTERNAL_ASSERT(kernel != nullptr, "norm plan: no norm_fwd_fixed for ", s.fixed,
                        " threads");
  launch_early(kernel, dim3(static_cast<unsigned>(s.blocks)), dim3(s.threads), 0,
               p);  // a block a row
}

template void fwd_fixed<c10::Half>(const FwdParams<c10::Half, c10::Half, c10::Half>&, const Step&);
template void fwd_fixed<c10::BFloat16>(
    const FwdParams<c10::BFloat16, c10::BFloat16, c10::BFloat16>&, const Step&);

}  // namespace norm
}  // namespace fused
