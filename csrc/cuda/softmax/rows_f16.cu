// softmax_kernel's instances for c10::Half rows (rows.cuh).
#include "cuda/softmax/rows.cuh"

namespace fused {
namespace softmax {

#define FUSED_INSTANCE(OP, VEC)                                                                 \
  template void launch_rows<c10::Half, OP, VEC>(Args<c10::Half, typename OP::State>, const OP&, \
                                                const Step&, const at::TensorOptions&);
FUSED_INSTANCE(Fwd, 1)
FUSED_INSTANCE(Fwd, kVecElems<c10::Half>)
FUSED_INSTANCE(BwdOf<c10::Half>, 1)
FUSED_INSTANCE(BwdOf<c10::Half>, kVecElems<c10::Half>)
#undef FUSED_INSTANCE

}  // namespace softmax
}  // namespace fused
