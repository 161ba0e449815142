// Elementwise kernels walk their tensors as flat buffers. That is right when every tensor
// shares one dense, non-overlapping layout (contiguous, or a permutation of it such as a
// transpose): then the storage span is exactly the elements, in the same order for all.
// The layout is the first tensor's as at::empty_like gives it (its strides when it is dense,
// else dense strides in its dims' order), which is also what torch's elementwise ops and
// the fake kernels (fused_ops/_impl) give the output; a tensor not in it is copied into it
// once. Outputs made with at::empty_like(result[0]) share the layout.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <array>

namespace fused {

template <size_t N>
std::array<at::Tensor, N> flat_compatible(std::array<at::Tensor, N> ts) {
  bool ok = ts[0].is_non_overlapping_and_dense();
  for (size_t k = 1; k < N && ok; ++k) ok = ts[k].strides() == ts[0].strides();
  if (!ok) {
    const at::Tensor like = at::empty_like(ts[0]);
    for (auto& t : ts) {
      if (t.strides() != like.strides() || !t.is_non_overlapping_and_dense()) {
        t = at::empty_like(like).copy_(t);
      }
    }
  }
  return ts;
}

}  // namespace fused
