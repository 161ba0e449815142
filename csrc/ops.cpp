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
  // softmax: y = softmax(scale * x, dim); causal=True masks keys j > i over the last two dims (query i, key j).
  m.def("softmax(Tensor x, int dim=-1, *, float scale=1.0, bool causal=False) -> Tensor");
  // softmax_backward: dx = scale * y * (dy - sum(dy * y, dim)), from the forward's output y; causal: masked y are 0, not read.
  m.def("softmax_backward(Tensor grad_out, Tensor y, int dim=-1, *, float scale=1.0, bool causal=False) -> Tensor");
  // log_softmax: y = x - max(x) - log(sum(exp(x - max(x)))) along dim.
  m.def("log_softmax(Tensor x, int dim=-1) -> Tensor");
  // log_softmax_backward: dx = dy - exp(y) * sum(dy, dim), from the forward's output y.
  m.def("log_softmax_backward(Tensor grad_out, Tensor y, int dim=-1) -> Tensor");
}

// A Python module with no functions: importing fused_ops._C runs the static registrations
// above and in every kernel file.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module);
}
