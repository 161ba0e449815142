// dropout and bias_dropout_add on CUDA: one pass over memory, no mask stored.
//
// Randomness: each forward call takes a PhiloxCudaState from the CUDA generator (offset
// advanced by 4: one Philox counter per subsequence, see philox.cuh), unpacks it in the
// kernel (under CUDA-graph capture the offset is read from device memory, so each replay
// draws a fresh mask) and writes the {seed, offset} it used into the small seed_offset
// output. Backward reads seed_offset and regenerates the same mask. Element i's draw is the
// 16-bit half i % 2 of word (i % 8) / 2 of Philox(subsequence i / 8) for most p (one call per
// 8 elements), else word i % 4 of Philox(subsequence i / 4) (DropoutParams::bits16, chosen
// from p): independent of launch configuration, alignment and vector width.
//
// Kernels:
//   dropout_kernel:   out = [res +] mask * scale * (x [+ bias]); dropout forward, dropout
//                     backward (x = grad_out, seed from seed_offset), bias_dropout_add
//                     forward. 16-byte vectors when every pointer is aligned, groups of 4
//                     scalars otherwise.
//   bias_grad_kernel: bias_dropout_add backward: dx = mask * scale * dy, and per-(row chunk,
//                     column) partial sums of dx; bias_grad_finish sums the chunks in a fixed
//                     order (two stages, no atomics: deterministic).
// Bytes: dropout fwd/bwd 2 * n * sizeof(T); bias_dropout_add fwd 3 * n * sizeof(T) (+ bias),
// bwd 2 * n * sizeof(T) (+ partial sums); docs/design/dropout.md#roofline-and-standing.
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>
#include <ATen/cuda/PhiloxUtils.cuh>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "common/checks.h"
#include "common/dispatch.h"
#include "common/dropout.h"
#include "common/dropout_mask.cuh"
#include "common/launch.cuh"
#include "common/philox.cuh"
#include "common/vec.cuh"

namespace fused {
namespace {

// Elementwise launch shape: 128 threads x 2 groups (one 16-byte vector per input each), the
// best shape of the H200 sweep of the shared elementwise kernel (docs/design/gelu.md#design).
// 4 groups shared the per-thread prologue over more elements but measured 3-5 points slower
// at 128-256 MB (docs/design/dropout.md#tried-not-kept: longer-lived blocks, a ragged last wave).
constexpr int kThreads = 128;
constexpr int kGroupsPerThread = 2;

// k[j] = v[j] (ADD: k[j] += v[j]) in float. bf16 pairs are unpacked from their 32-bit word
// with one instruction each (a shift, a mask): the generic conversion spends two on the high
// half.
template <bool ADD, typename T, int V>
__device__ __forceinline__ void to_float(float (&k)[V], const Vec<T, V>& v) {
  auto put = [&](float& d, float f) {
    if constexpr (ADD) {
      d += f;
    } else {
      d = f;
    }
  };
  if constexpr (std::is_same_v<T, at::BFloat16> && V % 2 == 0) {
#pragma unroll
    for (int j = 0; j < V; j += 2) {
      uint32_t w;
      std::memcpy(&w, &v.v[j], sizeof(w));
      put(k[j], __uint_as_float(w << 16));
      put(k[j + 1], __uint_as_float(w & 0xFFFF0000u));
    }
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) put(k[j], static_cast<float>(v.v[j]));
  }
}

// f[0..V) rounded to T; bf16/fp16 pairs with one packed conversion each.
template <typename T, int V>
__device__ __forceinline__ Vec<T, V> round_vec(const float (&f)[V]) {
  Vec<T, V> o;
  constexpr bool kBf16 = std::is_same_v<T, at::BFloat16>;
  constexpr bool kHalf = std::is_same_v<T, at::Half>;
  if constexpr ((kBf16 || kHalf) && V % 2 == 0) {
#pragma unroll
    for (int j = 0; j < V; j += 2) {
      if constexpr (kBf16) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(f[j], f[j + 1]);
        std::memcpy(&o.v[j], &h, sizeof(h));
      } else {
        const __half2 h = __floats2half2_rn(f[j], f[j + 1]);
        std::memcpy(&o.v[j], &h, sizeof(h));
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) o.v[j] = static_cast<T>(f[j]);
  }
  return o;
}

// V consecutive elements from e0: one 16-byte load when FULL (the caller guarantees
// alignment and that the group lies inside the tensor), else guarded scalar loads (elements
// past n read as 0).
template <typename T, int V, bool FULL>
__device__ __forceinline__ Vec<T, V> load_group(const T* p, int64_t e0, int64_t n) {
  if constexpr (FULL) {
    return load_vec<T, V>(p + e0);
  } else {
    Vec<T, V> v;
#pragma unroll
    for (int j = 0; j < V; ++j) v.v[j] = e0 + j < n ? p[e0 + j] : T(0);
    return v;
  }
}

template <typename T, int V, bool FULL>
__device__ __forceinline__ void store_group(T* p, int64_t e0, int64_t n, const Vec<T, V>& v) {
  if constexpr (FULL) {
    store_vec<T, V>(p + e0, v);
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      if (e0 + j < n) p[e0 + j] = v.v[j];
    }
  }
}

template <typename T>
struct DropoutArgs {
  const T* x;          // input (grad_out in backward)
  const T* bias;       // [cols] or nullptr
  const T* res;        // residual, or nullptr
  T* out;              // may alias x (in-place dropout): every element is read before written
  int64_t n;           // elements
  int64_t cols;        // x.size(-1): bias index = i % cols
  int64_t col_step;    // (kThreads * V) % cols: column advance between a thread's groups
  uint32_t threshold;  // keep iff the element's draw < threshold
  float scale;         // 1 / (1 - p)
  bool bits16;         // 16-bit draws (DropoutParams::bits16)
  RngArgs rng;
};

// One thread's U groups of V elements, spaced kThreads groups apart: all loads first (U
// loads in flight per input), then the mask and the stores. FULL: every group is whole and
// 16-byte aligned, so loads and stores are unconditional vectors, in straight-line code.
template <typename T, int V, bool FULL, bool BIAS, bool RES, bool DROP, bool B16, bool BVEC>
__device__ __forceinline__ void dropout_thread(const DropoutArgs<T>& a, int64_t first, int64_t col,
                                               const PhiloxKey& key, uint64_t offset) {
  constexpr int U = kGroupsPerThread;
  Vec<T, V> xv[U], rv[U], bv[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t e0 = (first + static_cast<int64_t>(u) * kThreads) * V;
    if (FULL || e0 < a.n) {
      xv[u] = load_group<T, V, FULL>(a.x, e0, a.n);
      if constexpr (RES) rv[u] = load_group<T, V, FULL>(a.res, e0, a.n);
      if constexpr (BIAS) {
        if constexpr (FULL && BVEC) {
          bv[u] = load_vec<T, V>(a.bias + col);  // cols % V == 0: the group is in one row
        } else {  // element by element (from L1): a group may cross a row's end
          int64_t c = col;
#pragma unroll
          for (int j = 0; j < V; ++j) {
            bv[u].v[j] = a.bias[c];
            if (++c == a.cols) c = 0;
          }
        }
      }
    }
    if constexpr (BIAS) {  // one subtraction wraps it: col < cols and col_step < cols
      col += a.col_step;
      if (col >= a.cols) col -= a.cols;
    }
  }

#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t e0 = (first + static_cast<int64_t>(u) * kThreads) * V;
    if (!FULL && e0 >= a.n) break;
    float k[V];
    to_float<false>(k, xv[u]);
    if constexpr (BIAS) to_float<true>(k, bv[u]);
    if constexpr (DROP) apply_mask<V, B16>(k, e0, key, offset, a.threshold, a.scale);
    if constexpr (RES) to_float<true>(k, rv[u]);
    store_group<T, V, FULL>(a.out, e0, a.n, round_vec<T, V>(k));
  }
}

// A thread's work: the straight-line vector path when all its groups are whole, else the
// guarded one.
template <typename T, int V, bool VEC, bool BIAS, bool RES, bool DROP, bool B16, bool BVEC>
__device__ __forceinline__ void dropout_body(const DropoutArgs<T>& a, int64_t first, int64_t col,
                                             const PhiloxKey& key, uint64_t offset) {
  constexpr int U = kGroupsPerThread;
  if constexpr (VEC) {
    const int64_t last_end = (first + static_cast<int64_t>(U - 1) * kThreads) * V + V;
    if (last_end <= a.n) {
      dropout_thread<T, V, true, BIAS, RES, DROP, B16, BVEC>(a, first, col, key, offset);
      return;
    }
  }
  dropout_thread<T, V, false, BIAS, RES, DROP, B16, BVEC>(a, first, col, key, offset);
}

// out = [res +] mask * scale * (x [+ bias]) over n elements, in groups of V consecutive
// elements. VEC: x, res and out 16-byte aligned; threads whose groups are all whole take the
// vector path, the rest (the tail) guarded scalars. BVEC: the bias is read as 16-byte
// vectors too (aligned, cols % V == 0); otherwise element by element, its columns wrapping
// inside a group (any width: x, res and out keep their vectors). !VEC: V = 4 scalars per
// group. DROP = false: no mask (bias_dropout_add in eval),
// no randomness drawn.
template <typename T, int V, bool VEC, bool BIAS, bool RES, bool DROP, bool BVEC>
__global__ void __launch_bounds__(kThreads) dropout_kernel(DropoutArgs<T> a) {
  grid_dependency_wait();  // launched early (launch_early): nothing global before this
  constexpr int U = kGroupsPerThread;
  uint64_t seed = 0, offset = 0;
  if constexpr (DROP) rng_seed_offset(a.rng, seed, offset);
  const PhiloxKey key = philox_key(seed);  // unused (and removed) when !DROP
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads * U + threadIdx.x;
  // Column of the first element of this thread's first group (a 32-bit remainder when the
  // operands fit: a 64-bit one is a long subroutine).
  int64_t col = 0;
  if constexpr (BIAS) {
    const uint64_t e = static_cast<uint64_t>(first) * V;
    const uint64_t c = static_cast<uint64_t>(a.cols);
    col = static_cast<int64_t>(
        ((e | c) >> 32) == 0 ? static_cast<uint32_t>(e) % static_cast<uint32_t>(c) : e % c);
  }
  if (DROP && a.bits16) {
    dropout_body<T, V, VEC, BIAS, RES, DROP, true, BVEC>(a, first, col, key, offset);
  } else {
    dropout_body<T, V, VEC, BIAS, RES, DROP, false, BVEC>(a, first, col, key, offset);
  }
}

template <typename T, int V, bool VEC, bool BIAS, bool RES, bool DROP, bool BVEC = true>
void launch_dropout_kernel(DropoutArgs<T> a) {
  a.col_step = BIAS ? (static_cast<int64_t>(kThreads) * V) % a.cols : 0;
  constexpr int U = kGroupsPerThread;
  const int64_t groups = ceil_div(a.n, V);
  const int64_t blocks = ceil_div(groups, static_cast<int64_t>(kThreads) * U);
  launch_early(dropout_kernel<T, V, VEC, BIAS, RES, DROP, BVEC>,
               dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, a);
}

template <typename T, bool BIAS, bool RES, bool DROP>
void launch_dropout_layout(const DropoutArgs<T>& a) {
  constexpr int kVec = kVecElems<T>;
  bool vec = is_aligned(a.x) && is_aligned(a.out);
  if (RES) vec = vec && is_aligned(a.res);
  if (vec && BIAS && !(is_aligned(a.bias) && a.cols % kVec == 0)) {
    // a width off the vector grid: x, res and out as vectors, the bias gathered
    launch_dropout_kernel<T, kVec, true, BIAS, RES, DROP, false>(a);
  } else if (vec) {
    launch_dropout_kernel<T, kVec, true, BIAS, RES, DROP>(a);
  } else {
    launch_dropout_kernel<T, 4, false, BIAS, RES, DROP>(a);
  }
}

// Launches the elementwise kernel on contiguous tensors (bias/res may be undefined).
// `rng` is ignored unless the mask is random.
void run_dropout(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& res,
                 const at::Tensor& out, const DropoutParams& d, const RngArgs& rng) {
  if (x.numel() == 0) return;
  const bool has_bias = bias.defined();
  const bool has_res = res.defined();
  TORCH_INTERNAL_ASSERT(d.random() || has_res, "identity/zero dropout is handled by the caller");
  FUSED_DISPATCH_CUDA(x.scalar_type(), "fused::dropout", [&] {
    DropoutArgs<scalar_t> a{};
    a.x = x.const_data_ptr<scalar_t>();
    a.bias = has_bias ? bias.const_data_ptr<scalar_t>() : nullptr;
    a.res = has_res ? res.const_data_ptr<scalar_t>() : nullptr;
    a.out = out.data_ptr<scalar_t>();
    a.n = x.numel();
    a.cols = x.dim() > 0 ? x.size(-1) : 1;  // only a bias (x.dim() >= 1) uses it
    a.threshold = d.threshold;
    a.scale = static_cast<float>(d.scale);
    a.bits16 = d.bits16;
    a.rng = rng;
    if (!has_res) {
      launch_dropout_layout<scalar_t, false, false, true>(a);
    } else if (d.random()) {
      if (has_bias) {
        launch_dropout_layout<scalar_t, true, true, true>(a);
      } else {
        launch_dropout_layout<scalar_t, false, true, true>(a);
      }
    } else {  // bias_dropout_add with nothing dropped (eval, p = 0)
      if (has_bias) {
        launch_dropout_layout<scalar_t, true, true, false>(a);
      } else {
        launch_dropout_layout<scalar_t, false, true, false>(a);
      }
    }
  });
}

}  // namespace

// This call's generator state: advances the generator's offset by 4 (every subsequence uses
// one Philox counter; philox_cuda_state needs a multiple of 4). Under graph capture the
// state points at the graph's offset tensor.
at::PhiloxCudaState next_philox_state(const std::optional<at::Generator>& generator,
                                      const at::Device& device) {
  auto* gen = at::get_generator_or_default<at::CUDAGeneratorImpl>(
      generator, at::cuda::detail::getDefaultCUDAGenerator(device.index()));
  std::lock_guard<std::mutex> lock(gen->mutex_);
  return gen->philox_cuda_state(4);
}

// Forward: draws the state and returns seed_offset (filled by the kernel when random).
at::Tensor forward_rng(const at::Tensor& x, const DropoutParams& d,
                       const std::optional<at::Generator>& generator, RngArgs& rng) {
  rng = RngArgs{};
  if (!d.random() || x.numel() == 0) {
    return at::zeros({2}, x.options().dtype(at::kLong));
  }
  at::Tensor so = at::empty({2}, x.options().dtype(at::kLong));
  rng.state = next_philox_state(generator, x.device());
  rng.record = so.mutable_data_ptr<int64_t>();
  return so;
}

namespace {

std::tuple<at::Tensor, at::Tensor> dropout_cuda(const at::Tensor& x_in, double p, bool training,
                                                std::optional<at::Generator> generator) {
  const char* op = "fused::dropout";
  check_float(x_in, op, "x");
  const DropoutParams d = dropout_params(p, training, op);
  c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  RngArgs rng;
  at::Tensor so = forward_rng(x, d, generator, rng);
  if (d.identity()) return {x.clone(at::MemoryFormat::Contiguous), so};
  if (d.drop_all()) return {at::zeros_like(x, at::MemoryFormat::Contiguous), so};
  at::Tensor y = at::empty_like(x, at::MemoryFormat::Contiguous);
  run_dropout(x, {}, {}, y, d, rng);
  return {y, so};
}

at::Tensor dropout__cuda(at::Tensor& x, double p, bool training,
                         std::optional<at::Generator> generator) {
  const char* op = "fused::dropout_";
  check_float(x, op, "x");
  const DropoutParams d = dropout_params(p, training, op);
  c10::cuda::CUDAGuard guard(x.device());
  RngArgs rng;
  at::Tensor so = forward_rng(x, d, generator, rng);
  if (d.identity() || x.numel() == 0) return so;
  if (d.drop_all()) {
    x.zero_();
    return so;
  }
  // The mask follows the logical row-major order: a non-contiguous x goes through a
  // contiguous copy.
  at::Tensor xc = x.contiguous();
  run_dropout(xc, {}, {}, xc, d, rng);
  if (!xc.is_same(x)) x.copy_(xc);
  return so;
}

at::Tensor dropout_backward_cuda(const at::Tensor& grad_out, const at::Tensor& seed_offset,
                                 double p) {
  const DropoutParams d =
      dropout_backward_params(grad_out, seed_offset, p, false, "fused::dropout_backward");
  c10::cuda::CUDAGuard guard(grad_out.device());
  const at::Tensor g = grad_out.contiguous();
  if (d.identity()) return g.clone(at::MemoryFormat::Contiguous);
  if (d.drop_all()) return at::zeros_like(g, at::MemoryFormat::Contiguous);
  const at::Tensor so = seed_offset.contiguous();
  at::Tensor dx = at::empty_like(g, at::MemoryFormat::Contiguous);
  RngArgs rng{};
  rng.saved = so.const_data_ptr<int64_t>();
  run_dropout(g, {}, {}, dx, d, rng);
  return dx;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> bias_dropout_add_cuda(const at::Tensor& x_in,
                                                         const std::optional<at::Tensor>& bias_in,
                                                         const at::Tensor& residual_in, double p,
                                                         bool training,
                                                         std::optional<at::Generator> generator) {
  const char* op = "fused::bias_dropout_add";
  check_bias_dropout_add(x_in, bias_in, residual_in, op);
  const DropoutParams d = dropout_params(p, training, op);
  c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  const at::Tensor res = residual_in.contiguous();
  const at::Tensor bias = bias_in.has_value() ? bias_in->contiguous() : at::Tensor();
  RngArgs rng;
  at::Tensor so = forward_rng(x, d, generator, rng);
  if (d.drop_all()) return {res.clone(at::MemoryFormat::Contiguous), so};
  at::Tensor out = at::empty_like(x, at::MemoryFormat::Contiguous);
  run_dropout(x, bias, res, out, d, rng);
  return {out, so};
}

namespace {

// ---- bias_dropout_add backward: dx and a deterministic column sum of dx -------------------

constexpr int kGradTX = 32;  // lanes along columns (a warp covers kGradTX * V columns)
constexpr int kGradThreads = 256;
constexpr int kGradTY = kGradThreads / kGradTX;  // warps along rows
constexpr int kGradRows = 4;                     // rows each thread loads before computing
constexpr int kGradMinBlocks = 3;  // resident blocks per SM the register budget allows

// kGradRows rows r, r + kGradTY, ... of one thread's V columns from c0: loads first, then
// dx = mask * scale * dy stored and added to acc. FULL: all rows exist (unconditional
// loads); otherwise rows from r_end on are skipped. VEC: 16-byte loads (cols % V == 0);
// otherwise V == 1.
template <typename T, int V, bool VEC, bool DROP, bool B16, bool FULL>
__device__ __forceinline__ void bias_grad_rows(const T* __restrict__ dy, T* __restrict__ dx,
                                               float (&acc)[V], int64_t r, int64_t r_end,
                                               int64_t cols, int64_t c0, const PhiloxKey& key,
                                               uint64_t offset, uint32_t threshold, float scale) {
  Vec<T, V> g[kGradRows];
#pragma unroll
  for (int rr = 0; rr < kGradRows; ++rr) {
    const int64_t row = r + rr * kGradTY;
    if (FULL || row < r_end) {
      const T* p = dy + row * cols + c0;
      if constexpr (VEC) {
        g[rr] = load_vec<T, V>(p);
      } else {
        g[rr].v[0] = *p;
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kGradRows; ++rr) {
    const int64_t row = r + rr * kGradTY;
    if (!FULL && row >= r_end) break;
    float k[V];
    to_float<false>(k, g[rr]);
    if constexpr (DROP) apply_mask<V, B16>(k, row * cols + c0, key, offset, threshold, scale);
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] += k[j];
    const Vec<T, V> o = round_vec<T, V>(k);
    T* q = dx + row * cols + c0;
    if constexpr (VEC) {
      store_vec<T, V>(q, o);
    } else {
      *q = o.v[0];
    }
  }
}

// One thread's rows r_begin + ty, + kGradTY, ... below r_end, kGradRows at a time.
template <typename T, int V, bool VEC, bool DROP, bool B16>
__device__ __forceinline__ void bias_grad_walk(const T* __restrict__ dy, T* __restrict__ dx,
                                               float (&acc)[V], int64_t r, int64_t r_end,
                                               int64_t cols, int64_t c0, const PhiloxKey& key,
                                               uint64_t offset, uint32_t threshold, float scale) {
  for (; r < r_end; r += kGradTY * kGradRows) {
    if (r + (kGradRows - 1) * kGradTY < r_end) {
      bias_grad_rows<T, V, VEC, DROP, B16, true>(dy, dx, acc, r, r_end, cols, c0, key, offset,
                                                 threshold, scale);
    } else {
      bias_grad_rows<T, V, VEC, DROP, B16, false>(dy, dx, acc, r, r_end, cols, c0, key, offset,
                                                  threshold, scale);
    }
  }
}

// Block (blockIdx.x, blockIdx.y) covers columns [blockIdx.x * 32 * V, +32 * V) of rows
// [blockIdx.y * rows_per_chunk, +rows_per_chunk). Each thread owns V columns and walks its
// rows (a warp reads 32 * V contiguous columns of a row), writing dx and summing dx in
// float; the block's 8 row-lanes are combined in shared memory in a fixed order and written
// to partial[blockIdx.y][column].
// At most 80 registers (3 blocks of 256 per SM, no spills on sm_90a): 1.5x the loads in
// flight per SM of the unbounded version (116 registers in bf16, 2 blocks); a 64-register
// bound (4 blocks) spilled.
template <typename T, int V, bool VEC, bool DROP>
__global__ void __launch_bounds__(kGradThreads, kGradMinBlocks)
    bias_grad_kernel(const T* __restrict__ dy, T* __restrict__ dx, float* __restrict__ partial,
                     const int64_t* __restrict__ saved, int64_t rows, int64_t cols,
                     int64_t rows_per_chunk, uint32_t threshold, float scale, bool bits16) {
  grid_dependency_wait();  // launched early (launch_early): nothing global before this
  static_assert(VEC || V == 1, "the scalar path takes one column per thread");
  __shared__ float smem[kGradTY][kGradTX * V];
  const int tx = threadIdx.x % kGradTX;
  const int ty = threadIdx.x / kGradTX;
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * kGradTX + tx) * V;
  const int64_t r_begin = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r_end = r_begin + rows_per_chunk < rows ? r_begin + rows_per_chunk : rows;
  uint64_t seed = 0, offset = 0;
  if constexpr (DROP) {
    seed = static_cast<uint64_t>(saved[0]);
    offset = static_cast<uint64_t>(saved[1]);
  }
  const PhiloxKey key = philox_key(seed);

  float acc[V];
#pragma unroll
  for (int j = 0; j < V; ++j) acc[j] = 0.0f;

  if (c0 < cols) {  // VEC: cols % V == 0, so the whole group is inside the row
    if (DROP && bits16) {
      bias_grad_walk<T, V, VEC, DROP, true>(dy, dx, acc, r_begin + ty, r_end, cols, c0, key, offset,
                                            threshold, scale);
    } else {
      bias_grad_walk<T, V, VEC, DROP, false>(dy, dx, acc, r_begin + ty, r_end, cols, c0, key,
                                             offset, threshold, scale);
    }
  }

#pragma unroll
  for (int j = 0; j < V; ++j) smem[ty][tx * V + j] = acc[j];
  __syncthreads();
  for (int c = threadIdx.x; c < kGradTX * V; c += kGradThreads) {
    float s = 0.0f;
#pragma unroll
    for (int y = 0; y < kGradTY; ++y) s += smem[y][c];
    const int64_t col = static_cast<int64_t>(blockIdx.x) * kGradTX * V + c;
    if (col < cols) partial[static_cast<int64_t>(blockIdx.y) * cols + col] = s;
  }
}

// Stage 2: dbias[c] = sum over chunks of partial[chunk][c], in chunk order.
template <typename T>
__global__ void __launch_bounds__(kGradThreads)
    bias_grad_finish(const float* __restrict__ partial, T* __restrict__ dbias, int64_t chunks,
                     int64_t cols) {
  grid_dependency_wait();  // launched early (launch_early): nothing global before this
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kGradThreads + threadIdx.x;
  if (c >= cols) return;
  // Eight loads in flight at a time (the chunks' partials are independent), added in order.
  float s = 0.0f;
  int64_t k = 0;
  for (; k + 8 <= chunks; k += 8) {
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = partial[(k + j) * cols + c];
#pragma unroll
    for (int j = 0; j < 8; ++j) s += v[j];
  }
  for (; k < chunks; ++k) s += partial[k * cols + c];
  dbias[c] = static_cast<T>(s);
}

template <typename T, int V, bool VEC, bool DROP>
void launch_bias_grad(const at::Tensor& g, const at::Tensor& dx, const at::Tensor& dbias,
                      const int64_t* saved, const DropoutParams& d) {
  const int64_t cols = g.size(-1);
  const int64_t rows = g.numel() / cols;
  const int64_t col_blocks = ceil_div(cols, static_cast<int64_t>(kGradTX) * V);
  // Row chunks so that the grid is about one full wave of resident blocks (a ragged last
  // wave would idle SMs); each chunk a whole number of row steps.
  auto kernel = bias_grad_kernel<T, V, VEC, DROP>;
  const int blocks_per_sm = std::max(resident_blocks(kernel, kGradThreads, 0), 1);
  const int64_t row_step = static_cast<int64_t>(kGradTY) * kGradRows;
  const int64_t want_chunks =
      std::max<int64_t>(1, static_cast<int64_t>(num_sms()) * blocks_per_sm / col_blocks);
  int64_t rows_per_chunk = ceil_div(rows, std::min(want_chunks, ceil_div(rows, row_step)));
  rows_per_chunk = ceil_div(rows_per_chunk, row_step) * row_step;
  const int64_t chunks = ceil_div(rows, rows_per_chunk);
  at::Tensor partial = at::empty({chunks, cols}, g.options().dtype(at::kFloat));
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(chunks));
  launch_early(kernel, grid, dim3(kGradThreads), 0, g.const_data_ptr<T>(), dx.mutable_data_ptr<T>(),
               partial.mutable_data_ptr<float>(), saved, rows, cols, rows_per_chunk, d.threshold,
               static_cast<float>(d.scale), d.bits16);
  launch_early(bias_grad_finish<T>, dim3(static_cast<unsigned>(ceil_div(cols, kGradThreads))),
               dim3(kGradThreads), 0, partial.const_data_ptr<float>(), dbias.mutable_data_ptr<T>(),
               chunks, cols);
}

std::tuple<at::Tensor, at::Tensor> bias_dropout_add_backward_cuda(const at::Tensor& grad_out,
                                                                  const at::Tensor& seed_offset,
                                                                  double p) {
  const DropoutParams d =
      dropout_backward_params(grad_out, seed_offset, p, true, "fused::bias_dropout_add_backward");
  c10::cuda::CUDAGuard guard(grad_out.device());
  const at::Tensor g = grad_out.contiguous();
  const int64_t cols = g.size(-1);
  at::Tensor dx = at::empty_like(g, at::MemoryFormat::Contiguous);
  at::Tensor dbias = at::empty({cols}, g.options());
  if (d.drop_all() || g.numel() == 0) {
    dx.zero_();
    dbias.zero_();
    return {dx, dbias};
  }
  const at::Tensor so = seed_offset.contiguous();
  const int64_t* saved = d.random() ? so.const_data_ptr<int64_t>() : nullptr;
  FUSED_DISPATCH_CUDA(g.scalar_type(), "fused::bias_dropout_add_backward", [&] {
    constexpr int kVec = kVecElems<scalar_t>;
    const bool vec = is_aligned(g.const_data_ptr<scalar_t>()) &&
                     is_aligned(dx.const_data_ptr<scalar_t>()) && cols % kVec == 0;
    auto launch = [&](auto drop) {
      if (vec) {
        launch_bias_grad<scalar_t, kVec, true, decltype(drop)::value>(g, dx, dbias, saved, d);
      } else {
        launch_bias_grad<scalar_t, 1, false, decltype(drop)::value>(g, dx, dbias, saved, d);
      }
    };
    if (d.random()) {
      launch(std::true_type{});
    } else {
      launch(std::false_type{});
    }
  });
  return {dx, dbias};
}

}  // namespace

TORCH_LIBRARY_IMPL(fused, CUDA, m) {
  m.impl("dropout", &dropout_cuda);
  m.impl("dropout_", &dropout__cuda);
  m.impl("dropout_backward", &dropout_backward_cuda);
  m.impl("bias_dropout_add", &bias_dropout_add_cuda);
  m.impl("bias_dropout_add_backward", &bias_dropout_add_backward_cuda);
}

}  // namespace fused
