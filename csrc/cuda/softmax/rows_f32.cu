// softmax_kernel's instances for float rows (rows.cuh).
#include "cuda/softmax/rows.cuh"

namespace fused {
namespace softmax {

#define FUSED_INSTANCE(OP, VEC)                                                         \
  template void launch_rows<float, OP, VEC>(Args<float, typename OP::State>, const OP&, \
                                            const Step&, const at::TensorOptions&);
FUSED_INSTANCE(Fwd, 1)
FUSED_INSTANCE(Fwd, kVecElems<float>)
FUSED_INSTANCE(BwdOf<float>, 1)
FUSED_INSTANCE(BwdOf<float>, kVecElems<float>)
#undef FUSED_INSTANCE

}  // namespace softmax
}  // namespace fused
