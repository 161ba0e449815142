
#include "cuda/softmax/families.h"

namespace fused {
namespace softmax {
namespace {

// softmax_causal_fwd: the causal forward of 16-bit rows on the 16-byte path, up to
// 1024 * kCausalVectors * 8 = 16384 columns, whole rows of a TPR-thread group shaped at
// compile time (TPR = 32 .. 1024, kCausalVectors vectors a thread, max(128, TPR)-thread
// blocks). The same ops and helpers as softmax_kernel, without what its runtime shape costs
// (the group size, the chunk and phase, a division by the stride): on 8x16x2048² bf16
// scores softmax_kernel's causal variant executed ~690 instructions a warp and read 74-79%
// of copy where this form (128 threads a row, 2 vectors each, 32 registers: 16 blocks an
// SM) reads 96% in a standalone sweep (docs/design/softmax.md#tried-not-kept).
// (kCausalVectors = 2, kCausalMaxTpr = 1024: plan.h.)

template <typename T, int TPR>
__global__ void __launch_bounds__(TPR < 128 ? 128 : TPR, 2048 / (TPR < 128 ? 128 : TPR))
    softmax_causal_fwd(Args<T, MaxSum> a, Fwd op, Div31 lq) {
  grid_dependency_wait();  // launched early (launch_early): nothing global before this
  constexpr int BLOCK = TPR < 128 ? 128 : TPR, P = kCausalVectors, VEC = kVecElems<T>;
  constexpr int stride = TPR * VEC;
  static_assert(sizeof(T) == 2 && VEC == 8, "16-bit rows, 16-byte vectors");
  __shared__ double buf[2][BLOCK / 32];

  const Group<BLOCK> g{TPR};
  const int lane = threadIdx.x % TPR;
  // rows < 2^31 (the host checks): the query r % Lq through lq's multiply-high
  const uint32_t r = blockIdx.x * (BLOCK / TPR) + threadIdx.x / TPR;
  const bool active = r < a.rows;  // idle groups of the last block still shuffle along
  const int64_t row = active ? r : 0;
  const int limit = active ? static_cast<int>(std::min<uint32_t>(lq.mod(r) + 1, a.len)) : 0;
  const int c0 = lane * VEC;

  uint4 raw[1][P];
  load_tile<kReadOnly>(raw, a.in, a.len, row, c0, stride, limit);
  Fwd::Regs<T, VEC, P> regs;
  const int live = live_vectors<P>(c0, stride, limit);
  op.template init<false>(regs, raw, Cols{c0, stride, limit, live});  // whole rows only
  const MaxSum total = op.partial(regs, g, buf[0], buf[1]);
  if (!active) return;
  const Fwd::Coef coef = op.coef_whole(total);
  op.finish(regs, coef);
  store_tile<T, VEC, P, true>(op, regs, coef, a.out + row * a.len, c0, stride, a.len, live);
}

}  // namespace

template <typename T>
void launch_causal(const Args<T, MaxSum>& a, const Fwd& op, const Step& s) {
  const Div31 lq = Div31::make(static_cast<uint32_t>(a.causal_q));
  const bool launched = with_pow2<32, kCausalMaxTpr>(s.tpr, [&](auto kt) {
    constexpr int TPR = decltype(kt)::value;
    launch_early(softmax_causal_fwd<T, TPR>, dim3(static_cast<unsigned>(s.blocks)),
                 dim3(std::max(128, TPR)), 0, a, op, lq);
    return true;
  });
  TORCH_INTERNAL_ASSERT(launched, "softmax plan: softmax_causal_fwd tpr=", s.tpr);
}

template void launch_causal<c10::Half>(const Args<c10::Half, MaxSum>&, const Fwd&, const Step&);
template void launch_causal<c10::BFloat16>(const Args<c10::BFloat16, MaxSum>&, const Fwd&,
                                           const Step&);

}  // namespace softmax
}  // namespace fused
