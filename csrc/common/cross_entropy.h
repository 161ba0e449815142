// Host-side argument handling shared by the CPU and CUDA cross-entropy kernels (forward and
// backward): the checks, with the op's name, and the row layout every kernel reads.
//
// The class (vocabulary) dim is the LAST dim of the logits: [V], [N, V] or [B, T, V], with a
// target of the leading shape ([], [N], [B, T]) or flat ([B * T]). (F.cross_entropy takes
// the classes from dim 1 of a 3-d input; language models keep them last, and so does this op.)
//
// Rows are addressed as (r / inner) * outer_stride + (r % inner) * inner_stride, so the
// views a training step makes of 3-d logits (logits[:, :-1, :], the vocabulary contiguous)
// are read where they lie, never copied. Other layouts (a strided vocabulary dim, 4+ dims
// that do not flatten) are made contiguous once.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <c10/util/accumulate.h>
#include <c10/util/string_view.h>

#include "common/checks.h"

namespace fused {

// Where row r of a [rows, V] view starts: (r / inner) * outer + (r % inner) * inner_stride
// elements from the data pointer (the class dim has stride 1).
struct XentRows {
  int64_t rows = 0;
  int64_t len = 0;  // V
  int64_t inner = 1;
  int64_t outer_stride = 0;
  int64_t inner_stride = 0;
};

// The row layout of `x` as it lies; false when the kernels cannot address it directly.
inline bool xent_layout(const at::Tensor& x, XentRows& l) {
  l.len = x.size(-1);
  l.rows = c10::multiply_integers(x.sizes().slice(0, x.dim() - 1));
  if (x.dim() == 1) {
    l.rows = 1;
    l.inner = 1;
    l.inner_stride = 0;
    l.outer_stride = 0;
    return x.stride(0) == 1 || x.size(0) <= 1;
  }
  if (x.size(-1) > 1 && x.stride(-1) != 1) return false;
  // Leading dims: flatten all but the last two when they are contiguous among themselves.
  l.inner = x.size(-2);
  l.inner_stride = x.stride(-2);
  if (x.dim() == 2) {
    l.outer_stride = 0;
    return true;
  }
  if (x.dim() == 3) {
    l.outer_stride = x.stride(0);
    return true;
  }
  return false;
}

inline int64_t xent_row_offset(const XentRows& l, int64_t r) {
  return (r / l.inner) * l.outer_stride + (r % l.inner) * l.inner_stride;
}

// The logits as the kernels read them (as they lie, or contiguous), with their row layout.
struct XentInput {
  at::Tensor x;
  XentRows layout;
};

inline XentInput xent_input(const at::Tensor& logits) {
  XentInput in{logits, {}};
  if (!xent_layout(logits, in.layout)) {
    in.x = logits.contiguous().reshape({-1, logits.size(-1)});
    TORCH_INTERNAL_ASSERT(xent_layout(in.x, in.layout));
  }
  return in;
}

// Checks shared by forward and backward: logits float with a non-empty class dim, target
// integer, of the logits' leading shape or flat, on the same device.
inline void xent_check(const at::Tensor& logits, const at::Tensor& target, double label_smoothing,
                       const char* op) {
  check_float(logits, op, "logits");
  TORCH_CHECK(logits.dim() >= 1, op,
              ": expected logits of shape [..., V] with at least 1 dim, "
              "but got a 0-d tensor");
  TORCH_CHECK(target.scalar_type() == at::kLong || target.scalar_type() == at::kInt, op,
              ": expected target to be int64 (or int32) class indices, but got ",
              target.scalar_type());
  check_same_device(logits, target, op, "logits", "target");
  const auto lead = logits.sizes().slice(0, logits.dim() - 1);
  const int64_t rows = c10::multiply_integers(lead);
  const bool same = target.sizes() == lead;
  const bool flat = target.dim() == 1 && target.size(0) == rows;
  TORCH_CHECK(same || flat, op, ": expected target of shape ", lead,
              " (the logits' shape "
              "without the class dim) or [",
              rows, "], but got ", target.sizes(), " for logits of shape ", logits.sizes());
  TORCH_CHECK(logits.size(-1) > 0 || rows == 0, op,
              ": expected at least one class, but got "
              "logits of shape ",
              logits.sizes());
  TORCH_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, op,
              ": expected label_smoothing "
              "in [0, 1], but got ",
              label_smoothing);
}

// The per-row outputs (loss, lse): float32, float64 for float64 logits, of target's shape.
inline at::Tensor xent_row_output(const at::Tensor& logits, const at::Tensor& target) {
  const auto dt = logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  return at::empty(target.sizes(), logits.options().dtype(dt));
}

// The checks of the backward's extra arguments: grad_loss and lse, per row, of the forward's
// row dtype.
inline void xent_check_backward(const at::Tensor& grad_loss, const at::Tensor& logits,
                                const at::Tensor& target, const at::Tensor& lse, const char* op,
                                bool reduced = false) {
  const auto dt = logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  check_same_device(logits, grad_loss, op, "logits", "grad_loss");
  check_same_device(logits, lse, op, "logits", "lse");
  TORCH_CHECK(lse.scalar_type() == dt && grad_loss.scalar_type() == dt, op,
              ": expected "
              "grad_loss and lse to be ",
              dt, " (the forward's per-row dtype for ", logits.scalar_type(), " logits), but got ",
              grad_loss.scalar_type(), " and ", lse.scalar_type());
  TORCH_CHECK(lse.numel() == target.numel() &&
                  (reduced ? grad_loss.numel() == 1 : grad_loss.numel() == target.numel()),
              op, ": expected ",
              reduced ? "one grad_loss value (the reduced loss's gradient)"
                      : "grad_loss with one value per row",
              " and lse with one value per row (", target.numel(), "), but got ", grad_loss.sizes(),
              " and ", lse.sizes());
}

// The op's `reduction`: 'none' (the per-row losses), 'mean' (their sum over the rows whose
// target is not ignore_index, divided by the count of those rows: NaN when all are ignored,
// as F.cross_entropy) or 'sum'. Carried as an int through autograd.
enum class XentReduction : int64_t { None = 0, Mean = 1, Sum = 2 };

inline XentReduction xent_reduction(c10::string_view r, const char* op) {
  if (r == "none") return XentReduction::None;
  if (r == "mean") return XentReduction::Mean;
  if (r == "sum") return XentReduction::Sum;
  TORCH_CHECK(false, op, ": expected reduction 'none', 'mean' or 'sum', but got '", std::string(r),
              "'");
}

// The loss as `reduction` asks, from the per-row losses (0 on ignored rows). Ops on the
// device: no host sync.
inline at::Tensor xent_reduce(const at::Tensor& rows, const at::Tensor& target,
                              int64_t ignore_index, XentReduction red) {
  if (red == XentReduction::None) return rows;
  at::Tensor total = rows.sum();
  if (red == XentReduction::Sum) return total;
  return total.div_(target.ne(ignore_index).sum());
}

}  // namespace fused
