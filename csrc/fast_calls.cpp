// Direct Python entry points for the ops whose Python call overhead shows against the native
// op's (fused_ops/functional.py uses them in eager mode). A call through torch.ops goes
// through the generic boxed path: each Python argument is matched against the schema and
// converted to an IValue, the result converted back. Here the arguments are read with the
// CPython API and the op is called through its typed (unboxed) dispatcher handle, as
// torch's own generated bindings do, so autograd, autocast and every backend run as usual.
//
// Only plain tensors take this path: a tensor subclass or an active torch function mode
// (anything with __torch_function__), or an argument of an unexpected type, returns
// NotImplemented, and the caller goes through torch.ops instead, which handles all of them.
#include <Python.h>

#include <ATen/PythonTorchFunctionTLS.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <optional>
#include <string_view>
#include <vector>

#include "autograd/ops.h"

namespace fused {
namespace {

using autograd::OptT;

// A plain tensor argument: an exact torch.Tensor (no __torch_function__ of a subclass) while
// no torch function mode is active.
bool plain_tensor(PyObject* o) {
  return THPVariable_CheckExact(o) && !at::impl::torch_function_mode_enabled();
}

// An optional tensor argument: None, or a plain tensor.
bool optional_tensor(PyObject* o, OptT& out) {
  if (o == Py_None) return true;
  if (!plain_tensor(o)) return false;
  out = THPVariable_Unpack(o);
  return true;
}

bool int_arg(PyObject* o, int64_t& out) {
  if (!PyLong_CheckExact(o)) return false;
  out = PyLong_AsLongLong(o);
  return !(out == -1 && PyErr_Occurred());
}

bool float_arg(PyObject* o, double& out) {
  if (PyFloat_CheckExact(o)) {
    out = PyFloat_AS_DOUBLE(o);
    return true;
  }
  int64_t i = 0;
  if (!int_arg(o, i)) return false;
  out = static_cast<double>(i);
  return true;
}

// normalized_shape: a tuple or list of ints (torch.Size is a tuple).
bool int_list(PyObject* o, std::vector<int64_t>& out) {
  if (!PyTuple_Check(o) && !PyList_Check(o)) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
  PyObject** items = PySequence_Fast_ITEMS(o);
  out.resize(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!int_arg(items[i], out[static_cast<size_t>(i)])) return false;
  }
  return true;
}

PyObject* not_handled() {
  PyErr_Clear();
  Py_RETURN_NOTIMPLEMENTED;
}

// gelu(x, approximate: str)
PyObject* gelu(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 2 || !plain_tensor(args[0]) || !PyUnicode_Check(args[1])) return not_handled();
  Py_ssize_t len = 0;
  const char* s = PyUnicode_AsUTF8AndSize(args[1], &len);
  if (s == nullptr) return not_handled();
  const auto& op = autograd::gelu_op();
  const at::Tensor& x = THPVariable_Unpack(args[0]);
  at::Tensor y;
  {
    pybind11::gil_scoped_release no_gil;
    y = op.call(x, c10::string_view(s, static_cast<size_t>(len)));
  }
  return THPVariable_Wrap(std::move(y));
  END_HANDLE_TH_ERRORS
}

// layer_norm(x, normalized_shape, weight, bias, eps) -> y
PyObject* layer_norm(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  std::vector<int64_t> ns;
  OptT w, b;
  double eps = 0;
  if (nargs != 5 || !plain_tensor(args[0]) || !int_list(args[1], ns) ||
      !optional_tensor(args[2], w) || !optional_tensor(args[3], b) || !float_arg(args[4], eps)) {
    return not_handled();
  }
  const auto& op = autograd::layer_norm_op();
  const at::Tensor& x = THPVariable_Unpack(args[0]);
  at::Tensor y;
  {
    pybind11::gil_scoped_release no_gil;
    y = std::get<0>(op.call(x, ns, w, b, eps));
  }
  return THPVariable_Wrap(std::move(y));
  END_HANDLE_TH_ERRORS
}

// rms_norm(x, normalized_shape, weight, eps or None) -> y
PyObject* rms_norm(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  std::vector<int64_t> ns;
  OptT w;
  std::optional<double> eps;
  double e = 0;
  if (nargs != 4 || !plain_tensor(args[0]) || !int_list(args[1], ns) ||
      !optional_tensor(args[2], w)) {
    return not_handled();
  }
  if (args[3] != Py_None) {
    if (!float_arg(args[3], e)) return not_handled();
    eps = e;
  }
  const auto& op = autograd::rms_norm_op();
  const at::Tensor& x = THPVariable_Unpack(args[0]);
  at::Tensor y;
  {
    pybind11::gil_scoped_release no_gil;
    y = std::get<0>(op.call(x, ns, w, eps));
  }
  return THPVariable_Wrap(std::move(y));
  END_HANDLE_TH_ERRORS
}

// softmax(x, dim) (scale 1, not causal)
PyObject* softmax(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  int64_t dim = 0;
  if (nargs != 2 || !plain_tensor(args[0]) || !int_arg(args[1], dim)) return not_handled();
  const auto& op = autograd::softmax_op();
  const at::Tensor& x = THPVariable_Unpack(args[0]);
  at::Tensor y;
  {
    pybind11::gil_scoped_release no_gil;
    y = op.call(x, dim, 1.0, false);
  }
  return THPVariable_Wrap(std::move(y));
  END_HANDLE_TH_ERRORS
}

// log_softmax(x, dim)
PyObject* log_softmax(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  int64_t dim = 0;
  if (nargs != 2 || !plain_tensor(args[0]) || !int_arg(args[1], dim)) return not_handled();
  const auto& op = autograd::log_softmax_op();
  const at::Tensor& x = THPVariable_Unpack(args[0]);
  at::Tensor y;
  {
    pybind11::gil_scoped_release no_gil;
    y = op.call(x, dim);
  }
  return THPVariable_Wrap(std::move(y));
  END_HANDLE_TH_ERRORS
}

}  // namespace

PyMethodDef fast_call_methods[] = {
    {"gelu", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&gelu)), METH_FASTCALL,
     "gelu(x, approximate) -> y, or NotImplemented"},
    {"layer_norm", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&layer_norm)),
     METH_FASTCALL, "layer_norm(x, normalized_shape, weight, bias, eps) -> y, or NotImplemented"},
    {"rms_norm", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&rms_norm)),
     METH_FASTCALL, "rms_norm(x, normalized_shape, weight, eps) -> y, or NotImplemented"},
    {"softmax", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&softmax)),
     METH_FASTCALL, "softmax(x, dim) -> y, or NotImplemented"},
    {"log_softmax", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&log_softmax)),
     METH_FASTCALL, "log_softmax(x, dim) -> y, or NotImplemented"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace fused
