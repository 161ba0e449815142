// Elementwise kernels walk their tensors as flat buffers. That is right when every tensor
// shares one dense, non-overlapping layout (contiguous, or a permutation of it such as a
// transpose): then the storage span is exactly the elements, in the same order for all.
// Anything else (slices with gaps, broadcast views, mixed layouts) is copied to contiguous
// once. Outputs made with at::empty_like(result[0]) share the layout.
#pragma once
#include <ATen/core/Tensor.h>
#include <array>

namespace fused {

template <size_t N>
std::array<at::Tensor, N> flat_compatible(std::array<at::Tensor, N> ts) {
  bool ok = ts[0].is_non_overlapping_and_dense();
  for (size_t k = 1; k < N && ok; ++k) ok = ts[k].strides() == ts[0].strides();
  if (!ok) {
    for (auto& t : ts) t = t.contiguous();
  }
  return ts;
}

}  // namespace fused
