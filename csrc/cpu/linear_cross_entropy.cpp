// fused::linear_cross_entropy's kernel, for CPU and CUDA alike: a loop over chunks of tokens
// that calls the other fused ops through the dispatcher (below autograd: the op's autograd,
// csrc/autograd/cross_entropy.cpp, calls it there), so the [tokens, V] logits never exist in
// full. Per chunk of c tokens (h: [c, H]):
//     logits = linear(h, W, b)                    fused::linear          [c, V]
//     loss, lse = cross_entropy(logits, t)        fused::cross_entropy   one read of logits
//     dlogits = over the logits, in place         fused::cross_entropy_backward_ (the one
//                                                 row gradient: 1 / count for 'mean', 1)
//     grad_h[chunk] = dlogits @ W                 fused::matmul
//     grad_W += dlogits^T @ h                     addmm_ (cuBLAS: beta = 1 accumulates in
//                                                 place; the fused GEMM has no accumulate)
//     grad_b += dlogits summed over the chunk
// The gradients are for a loss gradient of 1 (the loss is a 'mean' or 'sum', so the
// gradient reaching it is one scalar); the autograd's backward scales them. Only a chunk's
// logits are alive at a time: peak memory is grad_W plus one chunk. The weight gradient is
// accumulated in the weight's dtype (as the weight's .grad would be); each chunk's product
// is accumulated in float32 inside the GEMM. In C++ rather than Python: the loop's host
// time per chunk is a few dispatcher calls.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <array>
#include <optional>

#include "autograd/ops.h"
#include "common/checks.h"

namespace fused {
namespace {

using autograd::linear_op;
using autograd::matmul_op;
using autograd::OptT;
using autograd::Tensor2;
using autograd::xent_backward_inplace_op;
using autograd::xent_op;

// Tokens per chunk: the weight-gradient GEMM has K = chunk, and below ~1024 it is bound by
// reading and writing grad_W (V x H) once per chunk rather than by its FLOPs.
constexpr int64_t kDefaultChunk = 1024;

void check_args(const at::Tensor& h, const at::Tensor& w, const at::Tensor& target,
                const OptT& bias, int64_t chunk_size, const char* op) {
  TORCH_CHECK(w.dim() == 2, op, ": expected weight of shape [V, H], but got ", w.sizes());
  TORCH_CHECK(h.dim() >= 1 && h.size(-1) == w.size(1), op, ": expected hidden of shape [..., ",
              w.size(1), "] (weight is ", w.sizes(), "), but got ", h.sizes());
  TORCH_CHECK(h.scalar_type() == w.scalar_type(), op,
              ": expected hidden and weight of the "
              "same dtype, but got ",
              h.scalar_type(), " and ", w.scalar_type());
  check_same_device(h, w, op, "hidden", "weight");
  check_same_device(h, target, op, "hidden", "target");
  if (bias.has_value() && bias->defined()) {
    check_same_device(h, *bias, op, "hidden", "bias");
    TORCH_CHECK(
        bias->dim() == 1 && bias->size(0) == w.size(0) && bias->scalar_type() == w.scalar_type(),
        op, ": expected bias of shape [", w.size(0), "] and dtype ", w.scalar_type(), ", but got ",
        bias->sizes(), " ", bias->scalar_type());
  }
  TORCH_CHECK(target.scalar_type() == at::kLong || target.scalar_type() == at::kInt, op,
              ": expected target to be int64 (or int32) class indices, but got ",
              target.scalar_type());
  const auto lead = h.sizes().slice(0, h.dim() - 1);
  const int64_t rows = h.size(-1) ? h.numel() / h.size(-1) : 0;
  TORCH_CHECK(target.sizes() == lead || (target.dim() == 1 && target.numel() == rows), op,
              ": expected target of shape ", lead, " or [", rows, "], but got ", target.sizes());
  TORCH_CHECK(chunk_size >= 0, op, ": expected chunk_size >= 0, but got ", chunk_size);
}

// The vocabulary rounded up to a multiple of 8 on CUDA. With V % 8 != 0 every logits row
// would start 16-byte misaligned: the GEMM writing the logits could not store them by TMA,
// and the GEMM reading them back (grad_h) would copy them to an aligned buffer every chunk.
// The weight (and bias) get zero rows up to that multiple once per call (one V x H copy):
// the extra logits are exact zeros, the loss reads only the first V columns, their gradient
// stays zero, and they add nothing to grad_h; grad_W's extra rows are dropped.
struct PaddedHead {
  at::Tensor w;
  OptT b;
  int64_t V;
};

PaddedHead pad_head(const at::Tensor& weight, const OptT& bias, bool has_b) {
  const int64_t V = weight.size(0);
  if (!weight.is_cuda() || V % 8 == 0) return {weight, has_b ? bias : OptT(), V};
  const int64_t Vp = (V + 7) / 8 * 8;
  at::Tensor w = at::empty({Vp, weight.size(1)}, weight.options());
  w.narrow(0, 0, V).copy_(weight);
  w.narrow(0, V, Vp - V).zero_();
  OptT b;
  if (has_b) {
    b = at::zeros({Vp}, bias->options());
    b->narrow(0, 0, V).copy_(*bias);
  }
  return {w, b, V};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> linear_cross_entropy_kernel(
    const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& target, const OptT& bias,
    int64_t ignore_index, double label_smoothing, double z_loss, bool mean, int64_t chunk_size,
    std::array<bool, 3> grad_mask) {
  const char* op = "fused::linear_cross_entropy";
  check_args(hidden, weight, target, bias, chunk_size, op);
  const bool has_b = bias.has_value() && bias->defined();
  const bool want_h = grad_mask[0], want_w = grad_mask[1], want_b = grad_mask[2] && has_b;
  const int64_t H = weight.size(1);
  const at::Tensor h2 = hidden.reshape({-1, H});
  const at::Tensor t = target.reshape({-1});
  const int64_t n = h2.size(0);
  const auto dt = hidden.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const auto row_opts = hidden.options().dtype(dt);
  const int64_t chunk = chunk_size > 0 ? chunk_size : kDefaultChunk;
  const char* reduction = mean ? "mean" : "sum";
  const PaddedHead head = pad_head(weight, bias, has_b);
  if (n > 0 && n <= chunk) {
    // One chunk (a small batch, decoding): the ops reduce themselves, 'mean' counting the
    // rows on the device; no count or row buffer here.
    const at::Tensor padded = linear_op().call(h2, head.w, head.b, std::nullopt);
    const at::Tensor logits = padded.narrow(1, 0, head.V);
    auto [loss, lse] =
        xent_op().call(logits, t, ignore_index, label_smoothing, z_loss, false, reduction);
    if (want_h || want_w || want_b) {
      xent_backward_inplace_op().call(at::ones({}, row_opts), logits, t, lse, ignore_index,
                                      label_smoothing, z_loss, reduction);
    }
    return {loss,
            want_h ? matmul_op().call(padded, head.w).view(hidden.sizes()) : hidden.new_empty({0}),
            want_w ? matmul_op().call(padded.t(), h2).narrow(0, 0, head.V) : hidden.new_empty({0}),
            want_b ? logits.sum(0, false, dt).to(bias->scalar_type()) : hidden.new_empty({0})};
  }
  at::Tensor grad_h = want_h ? at::empty(hidden.sizes(), hidden.options()) : hidden.new_empty({0});
  at::Tensor grad_w = want_w ? at::zeros(head.w.sizes(), weight.options()) : hidden.new_empty({0});
  at::Tensor grad_b = want_b ? at::zeros(bias->sizes(), bias->options()) : hidden.new_empty({0});
  const at::Tensor grad_h2 = want_h ? grad_h.view({-1, H}) : grad_h;
  // The gradient each row's loss gets: 1 / (rows not ignored) for 'mean', 1 for 'sum'.
  const at::Tensor count = t.ne(ignore_index).sum().to(dt);
  const at::Tensor row_grad = mean ? count.reciprocal() : at::ones({}, row_opts);
  at::Tensor rows = at::empty({n}, row_opts);
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t len = std::min(chunk, n - start);
    const at::Tensor h = h2.narrow(0, start, len);
    const at::Tensor tc = t.narrow(0, start, len);
    const at::Tensor padded = linear_op().call(h, head.w, head.b, std::nullopt);
    const at::Tensor logits = padded.narrow(1, 0, head.V);
    auto [loss_c, lse_c] =
        xent_op().call(logits, tc, ignore_index, label_smoothing, z_loss, false, "none");
    rows.narrow(0, start, len).copy_(loss_c);
    if (!(want_h || want_w || want_b)) continue;
    xent_backward_inplace_op().call(row_grad, logits, tc, lse_c, ignore_index, label_smoothing,
                                    z_loss, "sum");
    if (want_h) grad_h2.narrow(0, start, len).copy_(matmul_op().call(padded, head.w));
    if (want_w) grad_w.addmm_(padded.t(), h);
    if (want_b) grad_b.add_(logits.sum(0, false, dt).to(grad_b.scalar_type()));
  }
  at::Tensor total = rows.sum();
  return {mean ? total.div(count) : total, grad_h, want_w ? grad_w.narrow(0, 0, head.V) : grad_w,
          grad_b};
}

}  // namespace

TORCH_LIBRARY_IMPL(fused, CPU, m) { m.impl("linear_cross_entropy", &linear_cross_entropy_kernel); }

TORCH_LIBRARY_IMPL(fused, CUDA, m) { m.impl("linear_cross_entropy", &linear_cross_entropy_kernel); }

}  // namespace fused
