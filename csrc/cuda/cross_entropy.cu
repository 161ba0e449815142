// cross_entropy on CUDA, forward and backward, for any vocabulary width.
//
// One block per row (rows taken in a grid-stride loop). A row of V logits in their own dtype
// is walked as: a scalar head up to the first 16-byte boundary, 16-byte vectors (U of them
// in flight per thread), a scalar tail; so every row of an odd vocabulary (50257: rows
// alternate between aligned and 2-byte-offset starts in bf16) reads at vector speed.
//
// Forward: one pass, online max and sum of exp in float32 (each thread keeps (m, s, sum x),
// rescaling s when m grows, once per group of U vectors), one block reduction of the triples
// (CUB), then thread 0 reads x[target] and writes
//     lse  = m + log s
//     loss = (1 - eps) (lse - x_t) + eps (lse - sum x / V) + z lse^2
// (F.cross_entropy's label smoothing and PaLM's z-loss). Rows whose target is ignore_index
// are not read: loss 0, lse 0.
//
// Backward: one pass, no reduction (lse comes from the forward):
//     dx_j = g ((1 + 2 z lse) exp(x_j - lse) - eps / V - (1 - eps) [j = t])
// in the logits' dtype, into a new tensor or over the logits themselves (inplace); ignored
// rows are written with zeros, not read. The backward walks the rows in reverse order: the
// rows the forward read last may still be in L2 when a backward follows it.
//
// A target outside [0, V) that is not ignore_index cannot be reported without a device-to-
// host sync (which would also break CUDA-graph capture); the kernels never read at such a
// target and give that row a NaN loss and NaN gradient instead, so the error shows in the
// loss rather than corrupting memory or passing silently. (The CPU kernels raise.)
//
// exp is ex2.approx (common/fast_math.cuh): the 16-bit rows would otherwise be instruction-
// bound on the libdevice exp; its ~2 ulp are far inside float32's tolerance for a loss.
#include <ATen/MemoryOverlap.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <torch/library.h>

#include <cub/block/block_reduce.cuh>

#include <cmath>
#include <cstdint>
#include <limits>

#include "common/checks.h"
#include "common/cross_entropy.h"
#include "common/dispatch.h"
#include "common/fast_math.cuh"
#include "common/launch.cuh"
#include "common/vec.cuh"

namespace fused {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kUnroll = 4;  // 16-byte vectors per thread in flight
// Blocks an SM must hold at once (a register cap for ptxas): while one block finishes a row
// (its reduction, the row's first loads), the others keep the memory system busy.
template <int BLOCK>
constexpr int kMinBlocks = 1024 / BLOCK;

// Row layout as the kernels read it (common/cross_entropy.h's XentRows).
struct Rows {
  int64_t rows;
  int64_t inner;
  int64_t outer_stride;
  int64_t inner_stride;
  int len;
};

Rows to_rows(const XentRows& l) {
  return {l.rows, l.inner, l.outer_stride, l.inner_stride, static_cast<int>(l.len)};
}

__device__ __forceinline__ int64_t row_offset(const Rows& l, int64_t r) {
  return (r / l.inner) * l.outer_stride + (r % l.inner) * l.inner_stride;
}

// Elements before the first 16-byte boundary of a row starting at p (at most len).
template <typename T>
__device__ __forceinline__ int head_elems(const T* p, int len) {
  const int bytes = static_cast<int>((16 - (reinterpret_cast<uintptr_t>(p) & 15)) & 15);
  return min(bytes / static_cast<int>(sizeof(T)), len);
}

// The running (max, sum of exp relative to max, sum) of part of a row. An empty part is
// (-inf, 0, 0); exp is taken relative to `off`, the max or 0 when the max is -inf, so an
// all -inf part sums to 0 instead of exp(-inf + inf) = NaN.
struct Stats {
  float m, s, sx;
};

__device__ __forceinline__ float offset_of(float m) { return m == kNegInf ? 0.f : m; }

struct Merge {
  __device__ __forceinline__ Stats operator()(const Stats& a, const Stats& b) const {
    const float m = fmaxf(a.m, b.m);
    const float off = offset_of(m);
    return {m, a.s * exp2_approx((a.m - off) * kLog2e) + b.s * exp2_approx((b.m - off) * kLog2e),
            a.sx + b.sx};
  }
};

// Folds n values (already float) into st: one rescale of the running sum per call.
template <int N>
__device__ __forceinline__ void fold(Stats& st, const float (&f)[N]) {
  float cm = f[0];
#pragma unroll
  for (int i = 1; i < N; ++i) cm = fmaxf(cm, f[i]);
  const float m = fmaxf(st.m, cm);
  const float off2 = offset_of(m) * kLog2e;
  float s = st.s * exp2_approx(fmaf(st.m, kLog2e, -off2));
  float sx = st.sx;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    s += exp2_approx(fmaf(f[i], kLog2e, -off2));
    sx += f[i];
  }
  st = {m, s, sx};
}

template <bool LAST_USE, typename T>
__device__ __forceinline__ Vec<T, kVecElems<T>> load_row_vec(const T* p) {
  if constexpr (LAST_USE) {
    return load_vec_stream<T>(p);
  } else {
    return load_vec<T>(p);
  }
}

// dx for one row: f(x, j) -> float, READ = false passes x = 0 without loading (ignored rows).
// `in` and `out` rows share their alignment mod 16 (vec_ok, checked by the caller) for the
// vector path. Vector stores are streaming (evict-first): the gradient is read much later,
// by the LM head's backward GEMM. LAST_USE: the loads are the row's last use (evict-first).
template <typename T, int BLOCK, bool READ, bool LAST_USE = false, typename F>
__device__ __forceinline__ void write_row(const T* in, T* out, int V, bool vec_ok, F f) {
  constexpr int VEC = kVecElems<T>;
  const int tid = threadIdx.x;
  if (!vec_ok) {
    for (int j = tid; j < V; j += BLOCK) {
      out[j] = static_cast<T>(f(READ ? static_cast<float>(in[j]) : 0.f, j));
    }
    return;
  }
  const int head = head_elems(out, V);
  const int nvec = (V - head) / VEC;
  const T* vin = in + head;
  T* vout = out + head;
  int i = tid;
  for (; i + (kUnroll - 1) * BLOCK < nvec; i += kUnroll * BLOCK) {
    Vec<T, VEC> v[kUnroll];
    if constexpr (READ) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = load_row_vec<LAST_USE>(vin + (i + u * BLOCK) * VEC);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      Vec<T, VEC> o;
      const int j0 = head + (i + u * BLOCK) * VEC;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        o.v[k] = static_cast<T>(f(READ ? static_cast<float>(v[u].v[k]) : 0.f, j0 + k));
      }
      store_vec_stream<T, VEC>(vout + (i + u * BLOCK) * VEC, o);
    }
  }
  for (; i < nvec; i += BLOCK) {
    Vec<T, VEC> v;
    if constexpr (READ) v = load_row_vec<LAST_USE>(vin + i * VEC);
    Vec<T, VEC> o;
    const int j0 = head + i * VEC;
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      o.v[k] = static_cast<T>(f(READ ? static_cast<float>(v.v[k]) : 0.f, j0 + k));
    }
    store_vec_stream<T, VEC>(vout + i * VEC, o);
  }
  const int tail0 = head + nvec * VEC;
  const int extra = head + (V - tail0);
  if (tid < extra) {
    const int j = tid < head ? tid : tail0 + (tid - head);
    out[j] = static_cast<T>(f(READ ? static_cast<float>(in[j]) : 0.f, j));
  }
}

// The gradient of one row, given its loss gradient g, lse L and target t (in [0, V)):
// dx_j = g ((1 + 2 z L) exp(x_j - L) - eps / V - (1 - eps) [j = t]).
template <typename T, int BLOCK, bool LAST_USE = false>
__device__ __forceinline__ void grad_row(const T* in, T* out, int V, bool vec_ok, float g, float L,
                                         int64_t t, float eps, float z) {
  const float a = g * (1.f + 2.f * z * L);
  const float b0 = g * eps / static_cast<float>(V);
  const float c = g * (1.f - eps);
  const float L2 = L * kLog2e;
  const int tt = static_cast<int>(t);
  write_row<T, BLOCK, true, LAST_USE>(in, out, V, vec_ok, [=](float v, int j) {
    const float d = a * exp2_approx(fmaf(v, kLog2e, -L2)) - b0;
    return j == tt ? d - c : d;
  });
}

// The row of an ignored (0) or invalid (NaN) target.
template <typename T, int BLOCK>
__device__ __forceinline__ void fill_row(const T* in, T* out, int V, bool vec_ok, bool ignored) {
  const float v = ignored ? 0.f : std::numeric_limits<float>::quiet_NaN();
  write_row<T, BLOCK, false>(in, out, V, vec_ok, [v](float, int) { return v; });
}

__device__ __forceinline__ bool same_alignment(const void* a, const void* b) {
  return ((reinterpret_cast<uintptr_t>(a) ^ reinterpret_cast<uintptr_t>(b)) & 15) == 0;
}

// GRAD: also the gradient of the loss, for a loss gradient of *grad_scale on every row, into
// dx (laid out as ld): a second pass over the row after its reduction, which finds the
// row in L2 when the rows in flight fit there (see grad_block_for).
template <typename T, int BLOCK, bool GRAD>
__global__ void __launch_bounds__(BLOCK, kMinBlocks<BLOCK>)
    xent_fwd_kernel(const T* __restrict__ x, Rows l, const int64_t* __restrict__ target,
                    float* __restrict__ loss, float* __restrict__ lse, int64_t ignore_index,
                    float eps, float z, T* __restrict__ dx, Rows ld,
                    const float* __restrict__ grad_scale) {
  constexpr int VEC = kVecElems<T>;
  using Reduce = cub::BlockReduce<Stats, BLOCK>;
  __shared__ typename Reduce::TempStorage storage;
  __shared__ float lse_shared;
  const int tid = threadIdx.x;
  const int V = l.len;
  float g = 0.f;
  if constexpr (GRAD) g = *grad_scale;
  for (int64_t r = blockIdx.x; r < l.rows; r += gridDim.x) {
    const int64_t t = target[r];
    const T* row = x + row_offset(l, r);
    T* drow = nullptr;
    if constexpr (GRAD) drow = dx + row_offset(ld, r);
    if (t == ignore_index || t < 0 || t >= V) {  // not read: 0 if ignored, NaN if invalid
      if (tid == 0) {
        const float v = t == ignore_index ? 0.f : std::numeric_limits<float>::quiet_NaN();
        loss[r] = v;
        lse[r] = v;
      }
      if constexpr (GRAD)
        fill_row<T, BLOCK>(row, drow, V, same_alignment(row, drow), t == ignore_index);
      continue;
    }
    // x[target] is loaded first, so its latency hides behind the row's.
    const float xt = tid == 0 ? static_cast<float>(row[t]) : 0.f;
    const int head = head_elems(row, V);
    const int nvec = (V - head) / VEC;
    const T* vrow = row + head;
    Stats st{kNegInf, 0.f, 0.f};
    int i = tid;
    for (; i + (kUnroll - 1) * BLOCK < nvec; i += kUnroll * BLOCK) {
      Vec<T, VEC> v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = load_vec<T, VEC>(vrow + (i + u * BLOCK) * VEC);
      float f[kUnroll * VEC];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int k = 0; k < VEC; ++k) f[u * VEC + k] = static_cast<float>(v[u].v[k]);
      fold(st, f);
    }
    for (; i < nvec; i += BLOCK) {
      const Vec<T, VEC> v = load_vec<T, VEC>(vrow + i * VEC);
      float f[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) f[k] = static_cast<float>(v.v[k]);
      fold(st, f);
    }
    // The head (before the first vector) and the tail (after the last): fewer than 2 VEC
    // elements, one per thread.
    const int tail0 = head + nvec * VEC;
    const int extra = head + (V - tail0);
    if (tid < extra) {
      const int j = tid < head ? tid : tail0 + (tid - head);
      const float f[1] = {static_cast<float>(row[j])};
      fold(st, f);
    }
    const Stats tot = Reduce(storage).Reduce(st, Merge{});
    if (tid == 0) {
      const float L = offset_of(tot.m) + logf(tot.s);
      float out = (1.f - eps) * (L - xt);
      if (eps != 0.f) out += eps * (L - tot.sx / static_cast<float>(V));
      if (z != 0.f) out += z * L * L;
      loss[r] = out;
      lse[r] = L;
      if constexpr (GRAD) lse_shared = L;
    }
    __syncthreads();  // storage is reused by the next row; lse_shared is written
    if constexpr (GRAD) {
      grad_row<T, BLOCK, true>(row, drow, V, same_alignment(row, drow), g, lse_shared, t, eps, z);
      __syncthreads();  // lse_shared is read before the next row writes it
    }
  }
}

template <typename T, int BLOCK>
__global__ void __launch_bounds__(BLOCK, kMinBlocks<BLOCK>)
    xent_bwd_kernel(const float* __restrict__ grad, int64_t grad_stride, const T* x, Rows lx, T* dx,
                    Rows ld, const int64_t* __restrict__ target, const float* __restrict__ lse,
                    int64_t ignore_index, float eps, float z) {
  // x and dx may be the same memory (in place): no __restrict__ on them. Each element is
  // read before it is written, by the same thread.
  const int V = lx.len;
  for (int64_t b = blockIdx.x; b < lx.rows; b += gridDim.x) {
    const int64_t r = lx.rows - 1 - b;
    const int64_t t = target[r];
    const T* in = x + row_offset(lx, r);
    T* out = dx + row_offset(ld, r);
    const bool vec_ok = same_alignment(in, out);
    if (t == ignore_index || t < 0 || t >= V) {
      fill_row<T, BLOCK>(in, out, V, vec_ok, t == ignore_index);
      continue;
    }
    grad_row<T, BLOCK>(in, out, V, vec_ok, grad[r * grad_stride], lse[r], t, eps, z);
  }
}

// The 'mean' / 'sum' of the per-row losses, in one block: each thread sums rows in a fixed
// order, then a block reduction (deterministic), with the count of non-ignored targets
// beside it, in double. One launch where the ATen sum, count and division were four.
// 'mean' over no rows is 0 / 0: NaN, as torch; an invalid target's NaN row makes it NaN.
template <int BLOCK>
__global__ void __launch_bounds__(BLOCK)
    xent_reduce_kernel(const float* __restrict__ loss, const int64_t* __restrict__ target,
                       int64_t rows, int64_t ignore_index, bool mean, float* __restrict__ out) {
  using Reduce = cub::BlockReduce<double, BLOCK>;
  __shared__ typename Reduce::TempStorage sum_storage, count_storage;
  double sum = 0.0, count = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += BLOCK) {
    sum += static_cast<double>(loss[r]);
    count += target[r] != ignore_index ? 1.0 : 0.0;
  }
  sum = Reduce(sum_storage).Sum(sum);
  count = Reduce(count_storage).Sum(count);
  if (threadIdx.x == 0) *out = static_cast<float>(mean ? sum / count : sum);
}

// The row gradient of a 'mean': the loss gradient *g divided by the count of non-ignored
// targets (one block; 0 / 0 is NaN, and the backward writes 0 on ignored rows anyway).
template <int BLOCK>
__global__ void __launch_bounds__(BLOCK)
    xent_mean_grad_kernel(const float* __restrict__ g, const int64_t* __restrict__ target,
                          int64_t rows, int64_t ignore_index, float* __restrict__ out) {
  using Reduce = cub::BlockReduce<int64_t, BLOCK>;
  __shared__ typename Reduce::TempStorage storage;
  int64_t count = 0;
  for (int64_t r = threadIdx.x; r < rows; r += BLOCK) count += target[r] != ignore_index;
  count = Reduce(storage).Sum(count);
  if (threadIdx.x == 0) *out = *g / static_cast<float>(count);
}

// Threads per row: 256 on long rows (4+ blocks an SM, 64 KB of loads in flight per SM, so
// a block between rows costs a quarter of the SM's traffic, not half), 64 on short ones.
int block_for(int64_t row_bytes) {
  if (row_bytes > 4 * 1024) return 256;
  return 64;
}

// The fused-gradient forward reads each row twice; the second read hits L2 only while the
// rows in flight (blocks an SM x SMs x row bytes) fit there: 512-thread blocks, 2 an SM
// (26 MB of 50257-wide bf16 rows on 132 SMs).
int grad_block_for(int64_t row_bytes) {
  if (row_bytes <= 4 * 1024) return 64;
  return 512;
}

template <typename F>
void with_grad_block(int block, F&& f) {
  switch (block) {
    case 512:
      return f(std::integral_constant<int, 512>{});
    default:
      return f(std::integral_constant<int, 64>{});
  }
}

template <typename F>
void with_block(int block, F&& f) {
  switch (block) {
    case 256:
      return f(std::integral_constant<int, 256>{});
    default:
      return f(std::integral_constant<int, 64>{});
  }
}

unsigned row_grid(int64_t rows) {
  return static_cast<unsigned>(std::min<int64_t>(rows, std::numeric_limits<int>::max()));
}

void check_len(int64_t V, const char* op) {
  TORCH_CHECK(V <= std::numeric_limits<int>::max(), op,
              ": expected at most 2^31 - 1 classes, "
              "but got ",
              V);
}

at::Tensor long_target(const at::Tensor& target) {
  return target.to(at::kLong).contiguous().reshape({-1});
}

std::tuple<at::Tensor, at::Tensor> cross_entropy_cuda(const at::Tensor& logits,
                                                      const at::Tensor& target,
                                                      int64_t ignore_index, double label_smoothing,
                                                      double z_loss, bool /*inplace_backward*/,
                                                      c10::string_view reduction) {
  const char* op = "fused::cross_entropy";
  const XentReduction red = xent_reduction(reduction, op);
  xent_check(logits, target, label_smoothing, op);
  at::Tensor loss = xent_row_output(logits, target);
  at::Tensor lse = xent_row_output(logits, target);
  if (loss.numel() == 0) return {xent_reduce(loss, target, ignore_index, red), lse};
  check_len(logits.size(-1), op);
  c10::cuda::CUDAGuard guard(logits.device());
  const XentInput in = xent_input(logits);
  const at::Tensor t = long_target(target);
  const Rows l = to_rows(in.layout);
  const int block = block_for(in.layout.len * in.x.element_size());
  FUSED_DISPATCH_CUDA(in.x.scalar_type(), "fused::cross_entropy", [&] {
    with_block(block, [&](auto kb) {
      constexpr int B = decltype(kb)::value;
      xent_fwd_kernel<scalar_t, B, false><<<row_grid(l.rows), B, 0, current_stream()>>>(
          in.x.const_data_ptr<scalar_t>(), l, t.const_data_ptr<int64_t>(),
          loss.mutable_data_ptr<float>(), lse.mutable_data_ptr<float>(), ignore_index,
          static_cast<float>(label_smoothing), static_cast<float>(z_loss), nullptr, l, nullptr);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  if (red == XentReduction::None) return {loss, lse};
  at::Tensor out = at::empty({}, loss.options());
  constexpr int kReduceBlock = 256;
  xent_reduce_kernel<kReduceBlock><<<1, kReduceBlock, 0, current_stream()>>>(
      loss.const_data_ptr<float>(), t.const_data_ptr<int64_t>(), l.rows, ignore_index,
      red == XentReduction::Mean, out.mutable_data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {out, lse};
}

// dx into `out` (laid out as `lout`) from `in`. red != None: grad_loss is one value for
// every row (divided by the count of non-ignored rows for 'mean', on the device).
void backward_into(const at::Tensor& grad_loss, const XentInput& in, at::Tensor& out,
                   const XentRows& lout, const at::Tensor& target, const at::Tensor& lse,
                   int64_t ignore_index, double label_smoothing, double z_loss,
                   XentReduction red = XentReduction::None) {
  // A per-row gradient that reaches here expanded (stride 0) is read as it is.
  at::Tensor g = grad_loss.reshape({-1});
  if (g.numel() > 1 && g.stride(0) != 0 && g.stride(0) != 1) g = g.contiguous();
  const int64_t g_stride = g.numel() > 1 ? g.stride(0) : 0;
  const at::Tensor s = lse.contiguous();
  const at::Tensor t = long_target(target);
  if (red == XentReduction::Mean) {
    at::Tensor scaled = at::empty({1}, g.options());
    constexpr int kReduceBlock = 256;
    xent_mean_grad_kernel<kReduceBlock><<<1, kReduceBlock, 0, current_stream()>>>(
        g.const_data_ptr<float>(), t.const_data_ptr<int64_t>(), t.numel(), ignore_index,
        scaled.mutable_data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    g = scaled;
  }
  const Rows lx = to_rows(in.layout);
  const Rows ld = to_rows(lout);
  const int block = block_for(in.layout.len * in.x.element_size());
  FUSED_DISPATCH_CUDA(in.x.scalar_type(), "fused::cross_entropy_backward", [&] {
    with_block(block, [&](auto kb) {
      constexpr int B = decltype(kb)::value;
      xent_bwd_kernel<scalar_t, B><<<row_grid(lx.rows), B, 0, current_stream()>>>(
          g.const_data_ptr<float>(), g_stride, in.x.const_data_ptr<scalar_t>(), lx,
          out.mutable_data_ptr<scalar_t>(), ld, t.const_data_ptr<int64_t>(),
          s.const_data_ptr<float>(), ignore_index, static_cast<float>(label_smoothing),
          static_cast<float>(z_loss));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

at::Tensor cross_entropy_backward_cuda(const at::Tensor& grad_loss, const at::Tensor& logits,
                                       const at::Tensor& target, const at::Tensor& lse,
                                       int64_t ignore_index, double label_smoothing, double z_loss,
                                       c10::string_view reduction) {
  const char* op = "fused::cross_entropy_backward";
  const XentReduction red = xent_reduction(reduction, op);
  xent_check(logits, target, label_smoothing, op);
  xent_check_backward(grad_loss, logits, target, lse, op, red != XentReduction::None);
  at::Tensor dx = at::empty(logits.sizes(), logits.options());
  if (dx.numel() == 0) return dx;
  check_len(logits.size(-1), op);
  c10::cuda::CUDAGuard guard(logits.device());
  const XentInput in = xent_input(logits);
  XentRows lout;
  TORCH_INTERNAL_ASSERT(xent_layout(dx.dim() <= 3 ? dx : dx.view({-1, dx.size(-1)}), lout));
  backward_into(grad_loss, in, dx, lout, target, lse, ignore_index, label_smoothing, z_loss, red);
  return dx;
}

void cross_entropy_backward_inplace_cuda(const at::Tensor& grad_loss, const at::Tensor& logits,
                                         const at::Tensor& target, const at::Tensor& lse,
                                         int64_t ignore_index, double label_smoothing,
                                         double z_loss, c10::string_view reduction) {
  const char* op = "fused::cross_entropy_backward_";
  const XentReduction red = xent_reduction(reduction, op);
  xent_check(logits, target, label_smoothing, op);
  xent_check_backward(grad_loss, logits, target, lse, op, red != XentReduction::None);
  // Rows that share memory (an expanded tensor) cannot each take their own gradient.
  at::assert_no_internal_overlap(logits);
  if (logits.numel() == 0) return;
  check_len(logits.size(-1), op);
  c10::cuda::CUDAGuard guard(logits.device());
  XentInput in = xent_input(logits);
  // A layout the kernel cannot address is computed in its contiguous copy, copied back.
  backward_into(grad_loss, in, in.x, in.layout, target, lse, ignore_index, label_smoothing, z_loss,
                red);
  if (!in.x.is_same(logits)) logits.copy_(in.x.view(logits.sizes()));
}

// grad *= *scale in place, unless *scale == 1 (read on the device: no host sync, and the
// usual loss.backward() costs a launch, not a pass over the gradient).
template <typename T>
__global__ void xent_scale_kernel(T* __restrict__ p, int64_t n, const float* __restrict__ scale) {
  constexpr int VEC = kVecElems<T>;
  const float g = *scale;
  if (g == 1.f) return;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nvec = n / VEC;
  for (int64_t i = first; i < nvec; i += step) {
    Vec<T, VEC> v = load_vec_stream<T>(p + i * VEC);
#pragma unroll
    for (int k = 0; k < VEC; ++k) v.v[k] = static_cast<T>(static_cast<float>(v.v[k]) * g);
    store_vec_stream<T>(p + i * VEC, v);
  }
  for (int64_t j = nvec * VEC + first; j < n; j += step) {
    p[j] = static_cast<T>(static_cast<float>(p[j]) * g);
  }
}

std::tuple<at::Tensor, at::Tensor> cross_entropy_with_grad_cuda(const at::Tensor& logits,
                                                                const at::Tensor& target,
                                                                int64_t ignore_index,
                                                                double label_smoothing,
                                                                double z_loss, bool mean) {
  const char* op = "fused::cross_entropy_with_grad";
  xent_check(logits, target, label_smoothing, op);
  check_len(logits.size(-1), op);
  c10::cuda::CUDAGuard guard(logits.device());
  at::Tensor rows = xent_row_output(logits, target);
  at::Tensor lse = xent_row_output(logits, target);
  at::Tensor dx = at::empty(logits.sizes(), logits.options());
  const at::Tensor t = long_target(target);
  // 'mean': every row's loss gradient is 1 / (rows not ignored), on the device.
  const at::Tensor count = t.ne(ignore_index).sum().to(at::kFloat);
  const at::Tensor scale = mean ? count.reciprocal() : at::ones({}, rows.options());
  if (rows.numel() > 0) {
    const XentInput in = xent_input(logits);
    XentRows lout;
    TORCH_INTERNAL_ASSERT(xent_layout(dx.dim() <= 3 ? dx : dx.view({-1, dx.size(-1)}), lout));
    const Rows l = to_rows(in.layout);
    const Rows ld = to_rows(lout);
    const int block = grad_block_for(in.layout.len * in.x.element_size());
    FUSED_DISPATCH_CUDA(in.x.scalar_type(), "fused::cross_entropy_with_grad", [&] {
      with_grad_block(block, [&](auto kb) {
        constexpr int B = decltype(kb)::value;
        xent_fwd_kernel<scalar_t, B, true><<<row_grid(l.rows), B, 0, current_stream()>>>(
            in.x.const_data_ptr<scalar_t>(), l, t.const_data_ptr<int64_t>(),
            rows.mutable_data_ptr<float>(), lse.mutable_data_ptr<float>(), ignore_index,
            static_cast<float>(label_smoothing), static_cast<float>(z_loss),
            dx.mutable_data_ptr<scalar_t>(), ld, scale.const_data_ptr<float>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
    });
  }
  at::Tensor total = rows.sum();
  return {mean ? total.div(count) : total, dx};
}

void cross_entropy_scale_inplace_cuda(const at::Tensor& grad, const at::Tensor& scale) {
  const char* op = "fused::cross_entropy_scale_";
  check_float(grad, op, "grad");
  check_same_device(grad, scale, op, "grad", "scale");
  TORCH_CHECK(scale.numel() == 1 && scale.scalar_type() == at::kFloat, op,
              ": expected scale "
              "to be one float32 value, but got ",
              scale.scalar_type(), " of shape ", scale.sizes());
  if (grad.numel() == 0) return;
  c10::cuda::CUDAGuard guard(grad.device());
  if (!grad.is_contiguous() || !is_aligned(grad.data_ptr())) {
    grad.mul_(scale.reshape({}));  // not the op's own gradient layout: the plain multiply
    return;
  }
  FUSED_DISPATCH_CUDA(grad.scalar_type(), "fused::cross_entropy_scale_", [&] {
    const unsigned blocks = elementwise_grid(grad.numel() / kVecElems<scalar_t> + 1, 256);
    xent_scale_kernel<scalar_t><<<blocks, 256, 0, current_stream()>>>(
        grad.mutable_data_ptr<scalar_t>(), grad.numel(), scale.const_data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(fused, CUDA, m) {
  m.impl("cross_entropy_with_grad", &cross_entropy_with_grad_cuda);
  m.impl("cross_entropy_scale_", &cross_entropy_scale_inplace_cuda);
  m.impl("cross_entropy", &cross_entropy_cuda);
  m.impl("cross_entropy_backward", &cross_entropy_backward_cuda);
  m.impl("cross_entropy_backward_", &cross_entropy_backward_inplace_cuda);
}

}  // namespace fused
