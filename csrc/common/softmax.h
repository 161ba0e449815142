// Host-side argument handling shared by the CPU and CUDA softmax / log_softmax kernels
// (forward and backward): checks with the op's name, and the row view every kernel works on.
//
// Every kernel sees its input as [rows, len] row-major, the softmax dim last and contiguous.
// When dim is not the last one, the input is moved there and copied once (movedim +
// contiguous) and the result is copied back to x's contiguous layout: correct for every
// dim, but three passes over memory instead of one. The last dim is the fast path.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>

namespace fused {

// dim in [-n, n) with n = max(x.dim(), 1) (a 0-d tensor is one row of one element, as in
// torch.softmax); returns it wrapped to [0, n).
inline int64_t softmax_wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t n = std::max<int64_t>(ndim, 1);
  TORCH_CHECK(dim >= -n && dim < n, op, ": expected dim in [", -n, ", ", n - 1, "] for a ",
              ndim, "-d input, but got dim=", dim);
  return dim < 0 ? dim + n : dim;
}

// causal=True treats the last two dims as (query i, key j) and masks keys j > i, as
// scaled_dot_product_attention(is_causal=True) does (top-left aligned when Lq != Lk).
inline void softmax_check_causal(const at::Tensor& x, int64_t wrapped_dim, int64_t dim,
                                 const char* op) {
  TORCH_CHECK(x.dim() >= 2, op, ": causal=True needs an input with at least 2 dims "
              "(..., query, key), but got a ", x.dim(), "-d input of shape ", x.sizes());
  TORCH_CHECK(wrapped_dim == x.dim() - 1, op, ": causal=True takes the softmax over the last "
              "dim (keys); expected dim=-1 (or ", x.dim() - 1, "), but got dim=", dim);
}

// The [rows, len] view of a tensor for a softmax over `dim` (already wrapped).
struct SoftmaxRows {
  at::Tensor t;  // contiguous, softmax dim last
  int64_t rows;
  int64_t len;
};

inline SoftmaxRows softmax_rows(const at::Tensor& x, int64_t dim) {
  at::Tensor t;
  if (x.dim() == 0) {
    t = x.reshape({1});
  } else if (dim == x.dim() - 1) {
    t = x.contiguous();
  } else {
    t = x.movedim(dim, -1).contiguous();
  }
  const int64_t len = t.size(-1);
  return {t, len == 0 ? 0 : t.numel() / len, len};
}

// The result, computed in the layout of softmax_rows(x, dim).t, back in x's shape
// (contiguous).
inline at::Tensor softmax_restore(const at::Tensor& y, const at::Tensor& x, int64_t dim) {
  if (x.dim() == 0) return y.reshape({});
  if (dim == x.dim() - 1) return y;
  return y.movedim(-1, dim).contiguous();
}

}  // namespace fused
