// The registry: every fused op's schema, in one TORCH_LIBRARY block. Kernels are
// registered per backend in cpu/<op>.cpp and cuda/<op>.cu (TORCH_LIBRARY_IMPL); the
// shape-only (fake) kernels and autograd live in fused_ops/_impl/<op>.py.
//
// Adding an op: one schema line here (forward and backward), then one file per layer.
#include <Python.h>
#include <torch/library.h>

TORCH_LIBRARY(fused, m) {
  // gelu: y = x * Phi(x); approximate = "none" (erf) or "tanh", as torch.nn.functional.gelu.
  m.def("gelu(Tensor x, *, str approximate='none') -> Tensor");
  m.def("gelu_backward(Tensor grad_out, Tensor x, *, str approximate='none') -> Tensor");
  // dropout: y = x * keep / (1 - p), keep ~ Bernoulli(1 - p) from Philox; seed_offset (int64[2]) regenerates the mask.
  m.def("dropout(Tensor x, float p, bool training, *, Generator? generator=None) -> (Tensor y, Tensor seed_offset)", {at::Tag::nondeterministic_seeded});
  // dropout_: in place into x (no autograd; fused_ops.dropout(inplace=True) routes around it when grads are needed).
  m.def("dropout_(Tensor(a!) x, float p, bool training, *, Generator? generator=None) -> Tensor seed_offset", {at::Tag::nondeterministic_seeded});
  // dropout_backward: grad_x = keep * grad_out / (1 - p), the mask regenerated from seed_offset.
  m.def("dropout_backward(Tensor grad_out, Tensor seed_offset, float p) -> Tensor");
  // bias_dropout_add: out = residual + dropout(x + bias), bias of shape [x.size(-1)] or None.
  m.def("bias_dropout_add(Tensor x, Tensor? bias, Tensor residual, float p, bool training, *, Generator? generator=None) -> (Tensor out, Tensor seed_offset)", {at::Tag::nondeterministic_seeded});
  // bias_dropout_add_backward: grad_x = keep * grad_out / (1 - p), grad_bias = grad_x summed over rows.
  m.def("bias_dropout_add_backward(Tensor grad_out, Tensor seed_offset, float p) -> (Tensor grad_x, Tensor grad_bias)");
}

// A Python module with no functions: importing fused_ops._C runs the static registrations
// above and in every kernel file.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module);
}
