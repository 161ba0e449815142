// Host-side argument handling shared by the CPU and CUDA softmax / log_softmax kernels
// (forward and backward): checks with the op's name, and the row view every kernel works on.
//
// Every kernel sees its input as [rows, len] row-major, the softmax dim last and contiguous.
// When dim is not the last one, the input is moved there and copied once (movedim +
// contiguous) and the result is copied back to x's contiguous layout: correct for every
// dim, but three passes over memory instead of one. The last dim is the fast path.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include "common/checks.h"

#include <algorithm>

namespace fused {

// dim in [-n, n) with n = max(x.dim(), 1) (a 0-d tensor is one row of one element, as in
// torch.softmax); returns it wrapped to [0, n).
inline int64_t softmax_wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t n = std::max<int64_t>(ndim, 1);
  // An IndexError in Python, as torch's "Dimension out of range".
  TORCH_CHECK_INDEX(dim >= -n && dim < n, op,
                    ": Dimension out of range (expected to be in "
                    "range of [",
                    -n, ", ", n - 1, "], but got ", dim, ")");
  return dim < 0 ? dim + n : dim;
}

// causal=True treats the last two dims as (query i, key j) and masks keys j > i, as
// scaled_dot_product_attention(is_causal=True) does (top-left aligned when Lq != Lk).
inline void softmax_check_causal(const at::Tensor& x, int64_t wrapped_dim, int64_t dim,
                                 const char* op) {
  TORCH_CHECK(x.dim() >= 2, op,
              ": causal=True needs an input with at least 2 dims "
              "(..., query, key), but got a ",
              x.dim(), "-d input of shape ", x.sizes());
  TORCH_CHECK(wrapped_dim == x.dim() - 1, op,
              ": causal=True takes the softmax over the last "
              "dim (keys); expected dim=-1 (or ",
              x.dim() - 1, "), but got dim=", dim);
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

// The host side of the forward ops, shared by the CPU and CUDA files: checks, the row
// view, the output, the layout back. rows(x, y, n_rows, len, causal_q) runs the backend's
// kernel on [n_rows, len] contiguous rows (causal_q: 0, or Lq when causal).
template <typename Rows>
at::Tensor softmax_forward(const at::Tensor& x, int64_t dim, bool causal, const char* op,
                           Rows rows) {
  check_float(x, op, "x");
  const int64_t d = softmax_wrap_dim(dim, x.dim(), op);
  if (causal) softmax_check_causal(x, d, dim, op);
  SoftmaxRows rv = softmax_rows(x, d);
  at::Tensor y = at::empty(rv.t.sizes(), rv.t.options());
  if (y.numel() > 0) rows(rv.t, y, rv.rows, rv.len, causal ? x.size(-2) : 0);
  return softmax_restore(y, x, d);
}

// The same for the backward ops: rows(grad_out, y, dx, n_rows, len, causal_q).
template <typename Rows>
at::Tensor softmax_backward(const at::Tensor& grad_out, const at::Tensor& y, int64_t dim,
                            bool causal, const char* op, Rows rows) {
  check_float(y, op, "y");
  check_same_device(grad_out, y, op, "grad_out", "y");
  check_same_dtype(grad_out, y, op, "grad_out", "y");
  check_same_shape(grad_out, y, op, "grad_out", "y");
  const int64_t d = softmax_wrap_dim(dim, y.dim(), op);
  if (causal) softmax_check_causal(y, d, dim, op);
  SoftmaxRows yv = softmax_rows(y, d);
  SoftmaxRows gv = softmax_rows(grad_out, d);
  at::Tensor dx = at::empty(yv.t.sizes(), yv.t.options());
  if (dx.numel() > 0) rows(gv.t, yv.t, dx, yv.rows, yv.len, causal ? y.size(-2) : 0);
  return softmax_restore(dx, y, d);
}

}  // namespace fused
