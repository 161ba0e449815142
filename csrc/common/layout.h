// Elementwise kernels walk their tensors as flat buffers. That is right when every tensor
// shares one dense, non-overlapping layout (contiguous, or a permutation of it such as a
// transpose): then the storage span is exactly the elements, in the same order for all.
// The layout is the first tensor's as at::empty_like gives it (its strides when it is dense,
// else dense strides in its dims' order), which is also what torch's elementwise ops and
// the fake kernels (fused_ops/_impl) give the output; a tensor not in it is copied into it
// once. Outputs made with at::empty_like(result[0]) share the layout.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include <array>
#include <cstdint>

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

// A new contiguous tensor shaped as `like` whose data starts at the same offset in its
// 16-byte chunk as ref's: an output that a kernel reading rows as 16-byte vectors of their
// aligned span (softmax, norms) can share a row's span with an input that is a view at an
// odd offset. Costs 16 bytes; `like`'s own layout where ref's offset is not a whole number
// of elements (then no vector path shares it).
inline at::Tensor empty_at_phase(const at::Tensor& like, const at::Tensor& ref) {
  const int64_t es = like.element_size();
  const auto phase = [](const void* p) {
    return static_cast<int64_t>(reinterpret_cast<std::uintptr_t>(p) % 16);
  };
  const int64_t want = phase(ref.const_data_ptr());
  if (want % es != 0) return at::empty(like.sizes(), like.options());
  at::Tensor buf = at::empty({like.numel() + 16 / es}, like.options());
  const int64_t off = (want - phase(buf.const_data_ptr()) + 16) % 16;
  if (off % es != 0) return at::empty(like.sizes(), like.options());
  return buf.narrow(0, off / es, like.numel()).view(like.sizes());
}

// at::empty_like(t), at t's offset in its 16-byte chunk where t is contiguous (a view at
// an odd element): flat kernels then run t and the result on one 16-byte grid.
inline at::Tensor like_at_phase(const at::Tensor& t) {
  if (t.is_contiguous() && reinterpret_cast<std::uintptr_t>(t.const_data_ptr()) % 16 != 0) {
    return empty_at_phase(t, t);
  }
  return at::empty_like(t);
}

}  // namespace fused
