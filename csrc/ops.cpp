// The registry: every fused op's schema, in one TORCH_LIBRARY block. Kernels are
// registered per backend in cpu/<op>.cpp and cuda/<op>.cu (TORCH_LIBRARY_IMPL); the
// shape-only (fake) kernels live in fused_ops/_impl/<op>.py, autograd and autocast in
// csrc/autograd/.
//
// Adding an op: one schema line here (forward and backward), then one file per layer.
#include <Python.h>
#include <torch/library.h>

TORCH_LIBRARY(fused, m) {
  // gelu: y = x * Phi(x); approximate = "none" (erf) or "tanh", as torch.nn.functional.gelu.
  m.def("gelu(Tensor x, *, str approximate='none') -> Tensor");
  m.def("gelu_backward(Tensor grad_out, Tensor x, *, str approximate='none') -> Tensor");
  // layer_norm: as F.layer_norm over the trailing normalized_shape dims; returns (y, mean, rstd),
  // stats float32 (float64 for float64 x) of shape x.shape[:-len(normalized_shape)].
  m.def(
      "layer_norm(Tensor x, int[] normalized_shape, Tensor? weight=None, Tensor? bias=None, float "
      "eps=1e-05) -> (Tensor, Tensor, Tensor)");
  // layer_norm_backward: (dx, dweight, dbias) from saved mean/rstd; output_mask = [dweight, dbias]
  // wanted (an unwanted one comes back empty).
  m.def(
      "layer_norm_backward(Tensor grad_out, Tensor x, int[] normalized_shape, Tensor mean, Tensor "
      "rstd, Tensor? weight, Tensor? bias, bool[2] output_mask) -> (Tensor, Tensor, Tensor)");
  // rms_norm: as F.rms_norm (eps=None: the dtype's machine epsilon); returns (y, rstd).
  m.def(
      "rms_norm(Tensor x, int[] normalized_shape, Tensor? weight=None, float? eps=None) -> "
      "(Tensor, Tensor)");
  // rms_norm_backward: (dx, dweight); dweight is computed when weight_grad, else comes back empty.
  m.def(
      "rms_norm_backward(Tensor grad_out, Tensor x, int[] normalized_shape, Tensor rstd, Tensor? "
      "weight, bool weight_grad) -> (Tensor, Tensor)");
  // add_layer_norm: s = x + residual (float32 if residual_in_fp32, else x's dtype), y =
  // layer_norm(s) in x's dtype; returns (y, s, mean, rstd).
  m.def(
      "add_layer_norm(Tensor x, Tensor residual, int[] normalized_shape, Tensor? weight=None, "
      "Tensor? bias=None, float eps=1e-05, bool residual_in_fp32=False) -> (Tensor, Tensor, "
      "Tensor, Tensor)");
  // add_layer_norm_backward: (d_sum, dweight, dbias), d_sum = the gradient reaching s through y
  // plus grad_sum, in s's dtype (= dx = d_residual).
  m.def(
      "add_layer_norm_backward(Tensor grad_out, Tensor? grad_sum, Tensor sum, int[] "
      "normalized_shape, Tensor mean, Tensor rstd, Tensor? weight, Tensor? bias, bool[2] "
      "output_mask) -> (Tensor, Tensor, Tensor)");
  // add_rms_norm: s = x + residual, y = rms_norm(s); returns (y, s, rstd).
  m.def(
      "add_rms_norm(Tensor x, Tensor residual, int[] normalized_shape, Tensor? weight=None, float? "
      "eps=None, bool residual_in_fp32=False) -> (Tensor, Tensor, Tensor)");
  // add_rms_norm_backward: (d_sum, dweight), as add_layer_norm_backward.
  m.def(
      "add_rms_norm_backward(Tensor grad_out, Tensor? grad_sum, Tensor sum, int[] "
      "normalized_shape, Tensor rstd, Tensor? weight, bool weight_grad) -> (Tensor, Tensor)");
  // softmax: y = softmax(scale * x, dim); causal=True masks keys j > i over the last two dims
  // (query i, key j).
  m.def("softmax(Tensor x, int dim=-1, *, float scale=1.0, bool causal=False) -> Tensor");
  // softmax_backward: dx = scale * y * (dy - sum(dy * y, dim)), from the forward's output y;
  // causal: masked y are 0, not read.
  m.def(
      "softmax_backward(Tensor grad_out, Tensor y, int dim=-1, *, float scale=1.0, bool "
      "causal=False) -> Tensor");
  // log_softmax: y = x - max(x) - log(sum(exp(x - max(x)))) along dim.
  m.def("log_softmax(Tensor x, int dim=-1) -> Tensor");
  // log_softmax_backward: dx = dy - exp(y) * sum(dy, dim), from the forward's output y.
  m.def("log_softmax_backward(Tensor grad_out, Tensor y, int dim=-1) -> Tensor");
  // dropout: y = x * keep / (1 - p), keep ~ Bernoulli(1 - p) from Philox; seed_offset (int64[2])
  // regenerates the mask.
  m.def(
      "dropout(Tensor x, float p, bool training, *, Generator? generator=None) -> (Tensor y, "
      "Tensor seed_offset)",
      {at::Tag::nondeterministic_seeded});
  // dropout_: in place into x (no autograd; fused_ops.dropout(inplace=True) routes around it when
  // grads are needed).
  m.def(
      "dropout_(Tensor(a!) x, float p, bool training, *, Generator? generator=None) -> Tensor "
      "seed_offset",
      {at::Tag::nondeterministic_seeded});
  // dropout_backward: grad_x = keep * grad_out / (1 - p), the mask regenerated from seed_offset.
  m.def("dropout_backward(Tensor grad_out, Tensor seed_offset, float p) -> Tensor");
  // bias_dropout_add: out = residual + dropout(x + bias), bias of shape [x.size(-1)] or None.
  m.def(
      "bias_dropout_add(Tensor x, Tensor? bias, Tensor residual, float p, bool training, *, "
      "Generator? generator=None) -> (Tensor out, Tensor seed_offset)",
      {at::Tag::nondeterministic_seeded});
  // bias_dropout_add_backward: grad_x = keep * grad_out / (1 - p), grad_bias = grad_x summed over
  // rows.
  m.def(
      "bias_dropout_add_backward(Tensor grad_out, Tensor seed_offset, float p) -> (Tensor grad_x, "
      "Tensor grad_bias)");
  // dropout_add_layer_norm: s = residual + dropout(x + input_bias, p) (float32 if
  // residual_in_fp32, else x's dtype), y = layer_norm(s); returns (y, s, mean, rstd,
  // seed_offset). The backward composes add_layer_norm_backward and bias_dropout_add_backward.
  m.def(
      "dropout_add_layer_norm(Tensor x, Tensor residual, int[] normalized_shape, Tensor? "
      "weight=None, Tensor? bias=None, float eps=1e-05, *, float p=0., bool training=True, "
      "Tensor? input_bias=None, bool residual_in_fp32=False, Generator? generator=None) -> "
      "(Tensor, Tensor, Tensor, Tensor, Tensor)",
      {at::Tag::nondeterministic_seeded});
  // dropout_add_rms_norm: as dropout_add_layer_norm with rms_norm; returns (y, s, rstd,
  // seed_offset).
  m.def(
      "dropout_add_rms_norm(Tensor x, Tensor residual, int[] normalized_shape, Tensor? "
      "weight=None, float? eps=None, *, float p=0., bool training=True, Tensor? input_bias=None, "
      "bool residual_in_fp32=False, Generator? generator=None) -> (Tensor, Tensor, Tensor, "
      "Tensor)",
      {at::Tag::nondeterministic_seeded});
  // matmul: torch.matmul for 2-D and 3-D (batch-broadcast) operands, tensor-core kernel on CUDA.
  m.def("matmul(Tensor a, Tensor b) -> Tensor");
  // linear: act(x @ weight.T + bias) with activation None, 'gelu' or 'gelu_tanh' fused in the
  // epilogue.
  m.def("linear(Tensor x, Tensor weight, Tensor? bias=None, str? activation=None) -> Tensor");
  // Gated activations 'swiglu', 'geglu', 'geglu_tanh': weight [2N, in], y = act(z[..., :N]) *
  // z[..., N:] with z = x @ weight.T + bias, the gate and up products in one GEMM's epilogue.
  // linear_fwd: linear for training, returns (y, preact) where preact = x @ weight.T + bias.
  m.def("linear_fwd(Tensor x, Tensor weight, Tensor? bias, str activation) -> (Tensor, Tensor)");
  // linear_act_backward: (grad_preact = grad_out * act'(preact), its column sums (the bias grad, or
  // [0])).
  m.def(
      "linear_act_backward(Tensor grad_out, Tensor preact, str activation, bool bias_grad) -> "
      "(Tensor, Tensor)");
  // cross_entropy: (loss, lse) over the last dim of logits, float32 (float64 for float64 logits);
  // per row (of target's shape) loss = (1 - ls) (lse - x_t) + ls (lse - mean x) + z_loss lse^2, 0
  // (and lse 0) where target == ignore_index; reduction 'mean' (over the non-ignored rows) or 'sum'
  // makes loss 0-d (lse stays per row). inplace_backward: the backward writes the gradient into the
  // logits' storage.
  m.def(
      "cross_entropy(Tensor logits, Tensor target, int ignore_index=-100, float "
      "label_smoothing=0.0, float z_loss=0.0, bool inplace_backward=False, str reduction='none') "
      "-> (Tensor loss, Tensor lse)");
  // cross_entropy_backward: dlogits = g ((1 + 2 z_loss lse) softmax - ls / V - (1 - ls)
  // onehot(target)), 0 on ignored rows, in logits' dtype; g = grad_loss per row (reduction 'none'),
  // or the one grad_loss value ('sum'), divided by the count of non-ignored rows ('mean').
  m.def(
      "cross_entropy_backward(Tensor grad_loss, Tensor logits, Tensor target, Tensor lse, int "
      "ignore_index, float label_smoothing, float z_loss, str reduction='none') -> Tensor");
  // cross_entropy_backward_: the same gradient written over logits (which it consumes).
  m.def(
      "cross_entropy_backward_(Tensor grad_loss, Tensor(a!) logits, Tensor target, Tensor lse, int "
      "ignore_index, float label_smoothing, float z_loss, str reduction='none') -> ()");
  // cross_entropy_with_grad: (loss, dlogits) in one kernel for a reduced loss: loss = the sum of
  // the rows' losses (mean=True: over the non-ignored rows), dlogits = d loss / d logits (for a
  // loss gradient of 1), in logits' dtype.
  m.def(
      "cross_entropy_with_grad(Tensor logits, Tensor target, int ignore_index=-100, float "
      "label_smoothing=0.0, float z_loss=0.0, bool mean=True) -> (Tensor loss, Tensor grad)");
  // cross_entropy_scale_: grad *= scale (one value) in place; scale == 1 (checked on the device)
  // moves no data.
  m.def("cross_entropy_scale_(Tensor(a!) grad, Tensor scale) -> ()");
  // linear_cross_entropy: cross_entropy(hidden @ weight.T + bias, target) reduced (mean over
  // non-ignored rows, or sum), in chunks of chunk_size tokens (0: a default) so the full logits
  // never exist; with grad_mask = [hidden, weight, bias] it also returns those gradients (for a
  // loss gradient of 1; empty where not wanted).
  m.def(
      "linear_cross_entropy(Tensor hidden, Tensor weight, Tensor target, Tensor? bias=None, int "
      "ignore_index=-100, float label_smoothing=0.0, float z_loss=0.0, bool mean=True, int "
      "chunk_size=0, bool[3] grad_mask=[False, False, False]) -> (Tensor loss, Tensor grad_hidden, "
      "Tensor grad_weight, Tensor grad_bias)");
  // swiglu: y = silu(gate) * up (gate and up of one shape; e.g. the two halves of z.chunk(2, -1)).
  m.def("swiglu(Tensor gate, Tensor up) -> Tensor");
  // swiglu_backward: (dgate, dup) = (grad_out * up * silu'(gate), grad_out * silu(gate)).
  m.def("swiglu_backward(Tensor grad_out, Tensor gate, Tensor up) -> (Tensor, Tensor)");
  // geglu: y = gelu(gate, approximate) * up.
  m.def("geglu(Tensor gate, Tensor up, *, str approximate='none') -> Tensor");
  // geglu_backward: (dgate, dup) = (grad_out * up * gelu'(gate), grad_out * gelu(gate)).
  m.def(
      "geglu_backward(Tensor grad_out, Tensor gate, Tensor up, *, str approximate='none') -> "
      "(Tensor, Tensor)");
  // mlp: linear(act(linear(x, w1, b1)), w2, b2) with activation 'gelu', 'gelu_tanh' (w1 [H, C])
  // or 'swiglu', 'geglu', 'geglu_tanh' (w1 [2H, C], gate rows then up rows); w2 [C', H].
  // recompute=True: the backward recomputes the pre-activation instead of keeping it.
  m.def(
      "mlp(Tensor x, Tensor w1, Tensor? b1, Tensor w2, Tensor? b2, str activation='gelu', bool "
      "recompute=False) -> Tensor");
  // linear_dact: (dZ, its column sums (bias_grad) or [0]) with dZ = (grad_out @ weight) *
  // act'(preact), the act' in the GEMM's epilogue where the kernel has one; gated: preact [..., 2N]
  // and dZ = [dgate, dup] from dH [..., N].
  m.def(
      "linear_dact(Tensor grad_out, Tensor weight, Tensor preact, str activation, bool bias_grad) "
      "-> (Tensor, Tensor)");
}

namespace fused {
extern PyMethodDef fast_call_methods[];  // fast_calls.cpp
}

// Importing fused_ops._C runs the static registrations above and in every kernel file; the
// module's functions are the direct entry points of fast_calls.cpp.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1,
                                      fused::fast_call_methods};
  return PyModule_Create(&module);
}
