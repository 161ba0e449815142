// softmax_kernel's instances for c10::BFloat16 rows (rows.cuh).
#include "cuda/softmax/rows.cuh"

namespace fused {
namespace softmax {

#define FUSED_INSTANCE(OP, VEC)                      \
  template void launch_rows<c10::BFloat16, OP, VEC>( \
      Args<c10::BFloat16, typename OP::State>, const OP&, const Step&, const at::TensorOptions&);
FUSED_INSTANCE(Fwd, 1)
FUSED_INSTANCE(Fwd, kVecElems<c10::BFloat16>)
FUSED_INSTANCE(BwdOf<c10::BFloat16>, 1)
FUSED_INSTANCE(BwdOf<c10::BFloat16>, kVecElems<c10::BFloat16>)
#undef FUSED_INSTANCE

}  // namespace softmax
}  // namespace fused
