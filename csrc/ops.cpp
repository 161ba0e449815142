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
  // matmul: torch.matmul for 2-D and 3-D (batch-broadcast) operands, tensor-core kernel on CUDA.
  m.def("matmul(Tensor a, Tensor b) -> Tensor");
  // linear: act(x @ weight.T + bias) with activation None, 'gelu' or 'gelu_tanh' fused in the epilogue.
  m.def("linear(Tensor x, Tensor weight, Tensor? bias=None, str? activation=None) -> Tensor");
  // linear_fwd: linear for training, returns (y, preact) where preact = x @ weight.T + bias.
  m.def("linear_fwd(Tensor x, Tensor weight, Tensor? bias, str activation) -> (Tensor, Tensor)");
  // linear_act_backward: (grad_preact = grad_out * act'(preact), its column sums (the bias grad, or [0])).
  m.def("linear_act_backward(Tensor grad_out, Tensor preact, str activation, bool bias_grad) -> (Tensor, Tensor)");
}

// A Python module with no functions: importing fused_ops._C runs the static registrations
// above and in every kernel file.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module);
}
