// Host-side pieces the CPU and CUDA dropout kernels share: argument checks, the keep
// threshold and scale, and the [rows, cols] view bias_dropout_add works on.
//
// The mask is a function of (seed, offset, i) only, where i is the element's index in the
// tensor's logical row-major order (philox.cuh): the kernels work on contiguous tensors, so
// forward and backward agree whatever the layouts of x and grad_out.
#pragma once
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <cmath>
#include <optional>
#include <tuple>

#include "common/checks.h"
#include "common/philox.cuh"

namespace fused {

inline void check_dropout_p(double p, const char* op) {
  // Written so that NaN fails too.
  TORCH_CHECK(p >= 0.0 && p <= 1.0, op, ": dropout probability has to be between 0 and 1, but got ",
              p);
}

// What a kernel needs to apply the mask: an element is kept when its Philox word is below
// `threshold`, and kept values are multiplied by `scale` = 1 / (1 - p).
// With 16-bit draws (bits16, chosen from p alone: dropout_keep_threshold16) element i's draw
// is philox_uint16(i) and threshold < 2^16; otherwise it is philox_uint32(i).
struct DropoutParams {
  double p;            // effective drop probability (0 when not training)
  uint32_t threshold;  // keep iff draw < threshold (valid for 0 < p < 1)
  double scale;        // 1 / (1 - p); kernels round it to their math type once
  bool bits16;         // 16-bit draws (8 elements per Philox call) instead of 32-bit

  bool identity() const { return p == 0.0; }  // nothing dropped: no randomness drawn
  bool drop_all() const { return p == 1.0; }  // everything dropped: no randomness drawn
  bool random() const { return !identity() && !drop_all(); }
};

inline DropoutParams dropout_params(double p, bool training, const char* op) {
  check_dropout_p(p, op);
  const double pe = training ? p : 0.0;
  DropoutParams d{pe, 0u, 1.0, false};
  if (d.random()) {
    const uint32_t t16 = dropout_keep_threshold16(pe);
    d.bits16 = t16 != 0;
    d.threshold = d.bits16 ? t16 : dropout_keep_threshold(pe);
    d.scale = 1.0 / (1.0 - pe);
  }
  return d;
}

// seed_offset, as returned by the forward ops: int64[2] = {seed, offset} on x's device.
inline void check_seed_offset(const at::Tensor& so, const at::Tensor& like, const char* op) {
  TORCH_CHECK(so.scalar_type() == at::kLong && so.dim() == 1 && so.numel() == 2, op,
              ": expected seed_offset to be the int64 tensor of 2 elements returned by the "
              "forward op, but got ",
              so.scalar_type(), " of shape ", so.sizes());
  check_same_device(like, so, op, "grad_out", "seed_offset");
}

// The arguments of the backward ops (dropout_backward; bias_dropout_add_backward, whose
// grad_out needs a last dim: its columns are the bias gradient's), and the mask parameters
// (a backward only exists after a training forward).
inline DropoutParams dropout_backward_params(const at::Tensor& grad_out,
                                             const at::Tensor& seed_offset, double p,
                                             bool needs_dim, const char* op) {
  check_float(grad_out, op, "grad_out");
  TORCH_CHECK(!needs_dim || grad_out.dim() >= 1, op,
              ": expected grad_out to have at least 1 dimension, but got a 0-d tensor");
  check_seed_offset(seed_offset, grad_out, op);
  return dropout_params(p, true, op);
}

// bias_dropout_add's operands: x [..., H]; bias [H] or None; residual shaped as x; one
// dtype and one device.
inline void check_bias_dropout_add(const at::Tensor& x, const std::optional<at::Tensor>& bias,
                                   const at::Tensor& residual, const char* op) {
  check_float(x, op, "x");
  TORCH_CHECK(x.dim() >= 1, op, ": expected x to have at least 1 dimension, but got a 0-d tensor");
  check_same_device(x, residual, op, "x", "residual");
  check_same_dtype(x, residual, op, "x", "residual");
  check_same_shape(x, residual, op, "x", "residual");
  if (bias.has_value()) {
    check_same_device(x, *bias, op, "x", "bias");
    check_same_dtype(x, *bias, op, "x", "bias");
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == x.size(-1), op, ": expected bias of shape [",
                x.size(-1), "] (the last dimension of x), but got ", bias->sizes());
  }
}

// The bias_dropout_add forward of each backend (cpu/dropout.cpp, cuda/dropout.cu): the
// dropout forms of the norms compose it where their kernels do not take the operands.
std::tuple<at::Tensor, at::Tensor> bias_dropout_add_cpu(const at::Tensor& x,
                                                        const std::optional<at::Tensor>& bias,
                                                        const at::Tensor& residual, double p,
                                                        bool training,
                                                        std::optional<at::Generator> generator);
std::tuple<at::Tensor, at::Tensor> bias_dropout_add_cuda(const at::Tensor& x,
                                                         const std::optional<at::Tensor>& bias,
                                                         const at::Tensor& residual, double p,
                                                         bool training,
                                                         std::optional<at::Generator> generator);

}  // namespace fused
