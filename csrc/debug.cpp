// Debug ops, for tests and for looking into the library (fused_ops/overrides.py wraps the
// first two): not part of the API.
//
//   fused::_set_overrides(str spec) -> str   sets the overrides in force (common/overrides.h),
//                                            returns the spec that was in force
//   fused::_overrides() -> str               the spec in force
//   fused::_plan(op, rows, cols, dtype, options, sm, num_sms, sm90_code, overrides) -> str
//       the dispatch plan (cuda/<op>/plan.h) a problem would get on a GPU with the given
//       properties, one step a line. op: norm_fwd, norm_bwd, softmax_fwd or softmax_bwd.
//       options, comma-separated: rms (else layer norm), residual (the add forms' forward),
//       dsum (their backward's grad_sum), weight_fp32, rows_fp32 (residual_in_fp32),
//       grads=N (backward parameter gradients, default 2), unaligned (a pointer off the
//       16-byte grid), mixed (softmax, norm forward: pointers at different offsets in
//       their 16-byte chunks), scale=X, causal_q=N (softmax). overrides: a spec parsed for this
//       call alone (the overrides in force are not read).
//       op matmul: the GEMM's schedule (cuda/matmul/plan.h) for rows = M, cols = N and the
//       options k=K (required), batch=B; unaligned: an output TMA cannot store (no split-K);
//       mn_major: an operand is MN-major (no small-M kernel). "gemv": the small-M kernel.
// Plain C++ (the plans are pure host functions), so the CPU build has them too.
#include <torch/library.h>

#include <sstream>
#include <string>

#include "common/overrides.h"
#include "cuda/matmul/plan.h"
#include "cuda/norm/plan.h"
#include "cuda/softmax/plan.h"

namespace fused {
namespace {

std::string set_overrides_op(std::string spec) { return set_overrides(spec); }

std::string overrides_op() { return overrides_spec(); }

struct Options {
  bool rms = false, residual = false, dsum = false, weight_fp32 = false, rows_fp32 = false;
  bool unaligned = false, mixed = false;
  int64_t grads = 2, causal_q = 0;
  int64_t k = 0, batch = 1;  // matmul
  bool mn_major = false;     // matmul: an operand is MN-major (no small-M kernel)
  double scale = 1.0;
};

Options parse_options(const std::string& spec) {
  Options o;
  std::stringstream in(spec);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
    try {
      if (key == "rms")
        o.rms = true;
      else if (key == "residual")
        o.residual = true;
      else if (key == "dsum")
        o.dsum = true;
      else if (key == "weight_fp32")
        o.weight_fp32 = true;
      else if (key == "rows_fp32")
        o.rows_fp32 = true;
      else if (key == "unaligned")
        o.unaligned = true;
      else if (key == "mixed")
        o.mixed = true;
      else if (key == "grads")
        o.grads = std::stoll(value);
      else if (key == "causal_q")
        o.causal_q = std::stoll(value);
      else if (key == "scale")
        o.scale = std::stod(value);
      else if (key == "k")
        o.k = std::stoll(value);
      else if (key == "batch")
        o.batch = std::stoll(value);
      else if (key == "mn_major")
        o.mn_major = true;
      else
        TORCH_CHECK(
            false, "fused::_plan: unknown option '", item,
            "' (options: rms, residual, "
            "dsum, weight_fp32, rows_fp32, unaligned, grads=N, causal_q=N, scale=X, k=N, batch=N, "
            "mn_major)");
    } catch (const std::logic_error&) {  // stoll / stod: not a number
      TORCH_CHECK(false, "fused::_plan: option ", key, " needs a number, but got '", value, "'");
    }
  }
  return o;
}

std::string plan_op(std::string op, int64_t rows, int64_t cols, at::ScalarType dtype,
                    std::string options, int64_t sm, int64_t num_sms, bool sm90_code,
                    std::string overrides_spec) {
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16,
              "fused::_plan: the CUDA kernels take float32, float16 and bfloat16, but got ", dtype);
  TORCH_CHECK(rows >= 0 && cols >= 1, "fused::_plan: expected rows >= 0 and cols >= 1, but got ",
              rows, " and ", cols);
  const Options o = parse_options(options);
  const Overrides ov = parse_overrides(overrides_spec);
  GpuProps gpu;
  gpu.major = static_cast<int>(sm / 10);
  gpu.minor = static_cast<int>(sm % 10);
  gpu.num_sms = static_cast<int>(num_sms);
  gpu.sm90_code = sm90_code;
  if (op == "matmul") {
    TORCH_CHECK(o.k >= 1 && o.batch >= 1,
                "fused::_plan: matmul needs k=K >= 1 (and batch=B >= 1), but got k=", o.k,
                ", batch=", o.batch);
    if (dtype == at::kFloat) return "cublas";
    if (matmul::use_gemv(rows, cols, o.k, o.batch, !o.mn_major, gpu.num_sms, ov)) {
      return "gemv";
    }
    if (gpu.major != 9 || gpu.minor != 0 || !gpu.sm90_code ||
        ov.matmul_kernel == Overrides::MatmulKernel::kPortable) {
      return "portable";
    }
    const bool split_ok = !o.unaligned && cols % 8 == 0;
    return matmul::describe(
        matmul::choose_schedule(rows, cols, o.k, o.batch, gpu.num_sms, split_ok, ov));
  }
  if (op == "norm_fwd" || op == "norm_bwd") {
    norm::Problem p;
    p.rows = rows;
    p.cols = cols;
    p.x = dtype;
    p.w = o.weight_fp32 ? at::kFloat : dtype;
    p.r = o.rows_fp32 ? at::kFloat : dtype;
    p.layer = !o.rms;
    p.residual = o.residual;
    p.dsum = o.dsum;
    p.grads = static_cast<int>(o.grads);
    p.aligned = !o.unaligned;
    p.same_phase = !o.mixed;
    return norm::describe(op == "norm_fwd" ? norm::plan_forward(p, gpu, ov)
                                           : norm::plan_backward(p, gpu, ov));
  }
  TORCH_CHECK(op == "softmax_fwd" || op == "softmax_bwd",
              "fused::_plan: op must be norm_fwd, "
              "norm_bwd, softmax_fwd, softmax_bwd or matmul, but got '",
              op, "'");
  softmax::Problem p;
  p.rows = rows;
  p.len = cols;
  p.dtype = dtype;
  p.forward = op == "softmax_fwd";
  p.scale = o.scale;
  p.causal_q = o.causal_q;
  p.aligned = !o.unaligned;
  p.same_phase = !o.mixed;
  return softmax::describe(softmax::plan(p, gpu, ov));
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fused, m) {
  m.def("_set_overrides(str spec) -> str", &set_overrides_op);
  m.def("_overrides() -> str", &overrides_op);
  m.def(
      "_plan(str op, int rows, int cols, ScalarType dtype, str options='', int sm=90, "
      "int num_sms=132, bool sm90_code=True, str overrides='') -> str",
      &plan_op);
}

}  // namespace fused
