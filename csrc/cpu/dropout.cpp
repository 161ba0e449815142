// dropout and bias_dropout_add on CPU: the fallback and what CI exercises. The mask comes
// from the same Philox function as on CUDA (common/philox.cuh), so for the same seed_offset
// the CPU and CUDA masks are identical. Seed and offset are drawn from the CPU generator
// (torch.manual_seed reproduces them); math in float (double for float64).
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

#include <mutex>
#include <tuple>

#include "common/checks.h"
#include "common/dispatch.h"
#include "common/dropout.h"

namespace fused {
namespace {

template <typename T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

struct SeedOffset {
  uint64_t seed = 0;
  uint64_t offset = 0;
};

// Draws this call's Philox key and counter base from the CPU generator: both random, so
// every counter word is exercised. The offset is a multiple of 4 as on CUDA.
SeedOffset draw_seed_offset(const std::optional<at::Generator>& generator) {
  auto* gen = at::get_generator_or_default<at::CPUGeneratorImpl>(
      generator, at::detail::getDefaultCPUGenerator());
  std::lock_guard<std::mutex> lock(gen->mutex_);
  SeedOffset so;
  so.seed = gen->random64();
  so.offset = gen->random64() & ~uint64_t{3};
  return so;
}

at::Tensor seed_offset_tensor(SeedOffset so) {
  at::Tensor t = at::empty({2}, at::TensorOptions().dtype(at::kLong));
  t.mutable_data_ptr<int64_t>()[0] = static_cast<int64_t>(so.seed);
  t.mutable_data_ptr<int64_t>()[1] = static_cast<int64_t>(so.offset);
  return t;
}

SeedOffset read_seed_offset(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  const int64_t* p = c.const_data_ptr<int64_t>();
  return {static_cast<uint64_t>(p[0]), static_cast<uint64_t>(p[1])};
}

// The one CPU kernel: out[i] = res[i] + mask[i] * scale * (x[i] + bias[i % cols]), with the
// bias and residual terms optional. When `kept` is given it also receives the dropped,
// unrounded value mask * scale * (x + bias) (bias_dropout_add_backward sums it for dbias).
// out may alias x (in-place dropout): each element is read before it is written.
// Each element's random draw, eight at a time (elements 8g .. 8g+7): the 16-bit halves of
// one Philox call, or the 32-bit words of two (philox.cuh, DropoutParams::bits16).
void draws8(const PhiloxKey& key, uint64_t offset, bool bits16, int64_t g, uint32_t (&r)[8]) {
  if (bits16) {
    const Philox4 a = philox_group(key, offset, static_cast<uint64_t>(g));
    for (int w = 0; w < 4; ++w) {
      r[2 * w] = a.w[w] & 0xFFFFu;
      r[2 * w + 1] = a.w[w] >> 16;
    }
  } else {
    for (int h = 0; h < 2; ++h) {
      const Philox4 a = philox_group(key, offset, static_cast<uint64_t>(2 * g + h));
      for (int w = 0; w < 4; ++w) r[4 * h + w] = a.w[w];
    }
  }
}

// The one CPU kernel: out[i] = res[i] + mask[i] * scale * (x[i] + bias[i % cols]), with the
// bias and residual terms optional. When `kept` is given it also receives the dropped,
// unrounded value mask * scale * (x + bias) (bias_dropout_add_backward sums it for dbias).
// out may alias x (in-place dropout): each element is read before it is written.
template <typename T>
void dropout_cpu_kernel(const T* x, const T* bias, const T* res, T* out, acc_t<T>* kept, int64_t n,
                        int64_t cols, SeedOffset so, const DropoutParams& d) {
  using A = acc_t<T>;
  const A scale = static_cast<A>(d.scale);
  const int64_t groups = (n + 7) / 8;  // eight draws at a time (draws8)
  const PhiloxKey key = philox_key(so.seed);
  at::parallel_for(0, groups, 2048, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      uint32_t r[8] = {};
      if (d.random()) draws8(key, so.offset, d.bits16, g, r);
      for (int j = 0; j < 8 && 8 * g + j < n; ++j) {
        const int64_t i = 8 * g + j;
        A v = static_cast<A>(x[i]);
        if (bias != nullptr) v += static_cast<A>(bias[i % cols]);
        A k;
        if (d.drop_all()) {
          k = A(0);
        } else if (d.identity()) {
          k = v;
        } else {
          k = r[j] < d.threshold ? v * scale : A(0);
        }
        if (kept != nullptr) kept[i] = k;
        out[i] = static_cast<T>(res != nullptr ? static_cast<A>(res[i]) + k : k);
      }
    }
  });
}

// Runs the kernel over contiguous tensors (any may be undefined except x and out).
void run_cpu(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& res,
             const at::Tensor& out, const at::Tensor& kept, SeedOffset so, const DropoutParams& d) {
  if (x.numel() == 0) return;
  const int64_t cols = x.dim() > 0 ? x.size(-1) : 1;
  FUSED_DISPATCH_CPU(x.scalar_type(), "fused::dropout", [&] {
    dropout_cpu_kernel<scalar_t>(
        x.const_data_ptr<scalar_t>(), bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr,
        res.defined() ? res.const_data_ptr<scalar_t>() : nullptr, out.mutable_data_ptr<scalar_t>(),
        kept.defined() ? kept.mutable_data_ptr<acc_t<scalar_t>>() : nullptr, x.numel(), cols, so,
        d);
  });
}

std::tuple<at::Tensor, at::Tensor> dropout_cpu(const at::Tensor& x_in, double p, bool training,
                                               std::optional<at::Generator> generator) {
  const char* op = "fused::dropout";
  check_float(x_in, op, "x");
  const DropoutParams d = dropout_params(p, training, op);
  const at::Tensor x = x_in.contiguous();
  at::Tensor y = at::empty_like(x, at::MemoryFormat::Contiguous);
  const SeedOffset so = d.random() && x.numel() > 0 ? draw_seed_offset(generator) : SeedOffset{};
  run_cpu(x, {}, {}, y, {}, so, d);
  return {y, seed_offset_tensor(so)};
}

at::Tensor dropout__cpu(at::Tensor& x, double p, bool training,
                        std::optional<at::Generator> generator) {
  const char* op = "fused::dropout_";
  check_float(x, op, "x");
  const DropoutParams d = dropout_params(p, training, op);
  const SeedOffset so = d.random() && x.numel() > 0 ? draw_seed_offset(generator) : SeedOffset{};
  if (d.identity() || x.numel() == 0) return seed_offset_tensor(so);
  // The mask follows the logical row-major order: a non-contiguous x is processed through a
  // contiguous copy and copied back.
  at::Tensor xc = x.contiguous();
  run_cpu(xc, {}, {}, xc, {}, so, d);
  if (!xc.is_same(x)) x.copy_(xc);
  return seed_offset_tensor(so);
}

at::Tensor dropout_backward_cpu(const at::Tensor& grad_out, const at::Tensor& seed_offset,
                                double p) {
  const DropoutParams d =
      dropout_backward_params(grad_out, seed_offset, p, false, "fused::dropout_backward");
  const at::Tensor g = grad_out.contiguous();
  at::Tensor dx = at::empty_like(g, at::MemoryFormat::Contiguous);
  const SeedOffset so = d.random() ? read_seed_offset(seed_offset) : SeedOffset{};
  run_cpu(g, {}, {}, dx, {}, so, d);
  return dx;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> bias_dropout_add_cpu(const at::Tensor& x_in,
                                                        const std::optional<at::Tensor>& bias_in,
                                                        const at::Tensor& residual_in, double p,
                                                        bool training,
                                                        std::optional<at::Generator> generator) {
  const char* op = "fused::bias_dropout_add";
  check_bias_dropout_add(x_in, bias_in, residual_in, op);
  const DropoutParams d = dropout_params(p, training, op);
  const at::Tensor x = x_in.contiguous();
  const at::Tensor res = residual_in.contiguous();
  const at::Tensor bias = bias_in.has_value() ? bias_in->contiguous() : at::Tensor();
  at::Tensor out = at::empty_like(x, at::MemoryFormat::Contiguous);
  const SeedOffset so = d.random() && x.numel() > 0 ? draw_seed_offset(generator) : SeedOffset{};
  run_cpu(x, bias, res, out, {}, so, d);
  return {out, seed_offset_tensor(so)};
}

namespace {

std::tuple<at::Tensor, at::Tensor> bias_dropout_add_backward_cpu(const at::Tensor& grad_out,
                                                                 const at::Tensor& seed_offset,
                                                                 double p) {
  const DropoutParams d =
      dropout_backward_params(grad_out, seed_offset, p, true, "fused::bias_dropout_add_backward");
  const at::Tensor g = grad_out.contiguous();
  const int64_t cols = g.size(-1);
  at::Tensor dx = at::empty_like(g, at::MemoryFormat::Contiguous);
  const at::ScalarType acc = g.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  // grad_x in the math type, summed over rows for grad_bias (at::sum is deterministic on CPU).
  at::Tensor kept =
      at::empty({g.numel() / std::max<int64_t>(cols, 1), cols}, g.options().dtype(acc));
  const SeedOffset so = d.random() ? read_seed_offset(seed_offset) : SeedOffset{};
  run_cpu(g, {}, {}, dx, kept, so, d);
  at::Tensor dbias = at::sum(kept, {0}).to(g.scalar_type());
  return {dx, dbias};
}

}  // namespace

TORCH_LIBRARY_IMPL(fused, CPU, m) {
  m.impl("dropout", &dropout_cpu);
  m.impl("dropout_", &dropout__cpu);
  m.impl("dropout_backward", &dropout_backward_cpu);
  m.impl("bias_dropout_add", &bias_dropout_add_cpu);
  m.impl("bias_dropout_add_backward", &bias_dropout_add_backward_cpu);
}

}  // namespace fused
