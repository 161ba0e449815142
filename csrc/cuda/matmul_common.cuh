// What the two matmul kernels (portable sm_80 in matmul.cu, Hopper sm_90a in matmul_sm90.cu)
// share: the problem description handed to a kernel and the fused epilogue.
//
//   C[b] = act(A[b] B[b] + bias),  optionally also storing Z = A B + bias (the pre-activation
//   that the backward pass needs).
//
// A is M x K, B is K x N, both 16-bit (bf16/fp16), each either "K-major" (K is the
// contiguous dimension: a row-major A, or a column-major B such as the weight W[N, K] of a
// linear layer read as B = W^T) or "MN-major" (M resp. N contiguous). Leading dimensions
// and batch strides are in elements; a batch stride of 0 broadcasts the operand.
// C (and Z) are dense row-major [batch, M, N].
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>
#include <type_traits>

#include "common/gated.h"
#include "common/gelu_math.h"

namespace fused {
namespace matmul {

// The activation applied in the epilogue; the numbers are those of the host enum too. The
// gated ones (weight [2N, K], output act(z[:, :N]) * z[:, N:]) only on the Hopper kernel's
// gated epilogue (matmul_sm90.cu); elsewhere matmul.cu composes them.
enum Act : int {
  kActNone = 0,
  kActGelu = 1,
  kActGeluTanh = 2,
  kActSwiglu = 3,
  kActGeglu = 4,
  kActGegluTanh = 5
};

struct GemmProblem {
  const void* a;
  const void* b;
  void* c;                                 // output, [batch, M, N] dense
  void* z;                                 // pre-activation output (same layout) or nullptr
  const void* bias;                        // [N] or nullptr
  int64_t lda, ldb;                        // leading dimensions (elements)
  int64_t batch_stride_a, batch_stride_b;  // 0 = broadcast
  int M, N, K, batch;
  int act;      // Act
  int group_m;  // tile-rows per group of the tile order (tile_coords)
  bool a_kmajor, b_kmajor;
};

// Conversions for the two 16-bit element types (the build disables their implicit ones).
template <typename T>
struct Elem;
template <>
struct Elem<__nv_bfloat16> {
  using pair = __nv_bfloat162;
  static __device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float v) {
    return __float2bfloat16(v);
  }
  static __device__ __forceinline__ pair pack(float x, float y) {
    return __floats2bfloat162_rn(x, y);
  }
};
template <>
struct Elem<__half> {
  using pair = __half2;
  static __device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half from_float(float v) { return __float2half(v); }
  static __device__ __forceinline__ pair pack(float x, float y) { return __floats2half2_rn(x, y); }
};

__device__ __forceinline__ float apply_act(float z, int act) {
  if (act == kActGelu) return gelu_fwd<GeluKind::kNone>(z);
  if (act == kActGeluTanh) return gelu_fwd<GeluKind::kTanh>(z);
  return z;
}

// The epilogue's activation, fixed at compile time (the kernels switch on p.act once per
// tile, not per element) and in the form fit for the stored type T: for 16-bit T the SFU
// forms of gelu_math.h (gelu_fwd_for: ~9-14 instructions an element instead of ~25 for
// libdevice erff/expf + IEEE division), which keeps the epilogue short next to the MMAs.
template <typename T, int ACT>
__device__ __forceinline__ float act_for(float z) {
  if constexpr (ACT == kActGelu)
    return gelu_fwd_for<T, GeluKind::kNone>(z);
  else if constexpr (ACT == kActGeluTanh)
    return gelu_fwd_for<T, GeluKind::kTanh>(z);
  else
    return z;
}

// ACT of two outputs (v0, v1), in place. Both GeLUs on 16-bit T take their paired forms, one
// reciprocal for the two (gelu_math.h gelu_tanh_fast_pair / gelu_erf_fast_pair: 1.5 MUFU an
// element instead of 2, the epilogue's bound; docs/design/matmul.md#tried-not-kept);
// everything else act_for on each.
template <typename T, int ACT>
__device__ __forceinline__ void act_pair_for(float& v0, float& v1) {
  if constexpr (ACT == kActGeluTanh && sizeof(T) == 2) {
    gelu_tanh_fast_pair(v0, v1);
  } else if constexpr (ACT == kActGelu && sizeof(T) == 2) {
    gelu_erf_fast_pair(v0, v1);
  } else {
    v0 = act_for<T, ACT>(v0);
    v1 = act_for<T, ACT>(v1);
  }
}

// act(g) * u for two neighbouring outputs of a gated epilogue, in g0, g1: the GeLU forms
// paired as above, silu per element (the fast sigmoid of common/gated.h for 16-bit T).
template <typename T, int ACT>
__device__ __forceinline__ void gated_pair_for(float& g0, float& g1, float u0, float u1) {
  if constexpr (ACT == kActSwiglu) {
    g0 = gated_act_for<T, GatedKind::kSilu>(g0);
    g1 = gated_act_for<T, GatedKind::kSilu>(g1);
  } else {
    act_pair_for<T, ACT == kActGeglu ? kActGelu : kActGeluTanh>(g0, g1);
  }
  g0 *= u0;
  g1 *= u1;
}

// Calls f(std::integral_constant<int, ACT>) for the run-time gated activation act.
template <typename F>
__device__ __forceinline__ void dispatch_gated_act(int act, F&& f) {
  if (act == kActSwiglu) {
    f(std::integral_constant<int, kActSwiglu>{});
  } else if (act == kActGeglu) {
    f(std::integral_constant<int, kActGeglu>{});
  } else {
    f(std::integral_constant<int, kActGegluTanh>{});
  }
}

// Calls f(std::integral_constant<int, ACT>) for the run-time activation act.
template <typename F>
__device__ __forceinline__ void dispatch_act(int act, F&& f) {
  if (act == kActGelu) {
    f(std::integral_constant<int, kActGelu>{});
  } else if (act == kActGeluTanh) {
    f(std::integral_constant<int, kActGeluTanh>{});
  } else {
    f(std::integral_constant<int, kActNone>{});
  }
}

// Bias of columns n, n+1 (0 past the edge or without bias), loaded once per column pair and
// reused for every row a thread stores.
template <typename T>
__device__ __forceinline__ void load_bias_pair(const GemmProblem& p, int n, float& b0, float& b1) {
  b0 = b1 = 0.f;
  if (p.bias == nullptr) return;
  const T* bias = static_cast<const T*>(p.bias);
  if (n < p.N) b0 = Elem<T>::to_float(bias[n]);
  if (n + 1 < p.N) b1 = Elem<T>::to_float(bias[n + 1]);
}

// ACT of (v0, v1) stored at c[0], c[1] (c[1] only when has1): one 4-byte store when paired.
template <typename T, int ACT>
__device__ __forceinline__ void store_act_pair(T* c, float v0, float v1, bool has1, bool paired) {
  act_pair_for<T, ACT>(v0, v1);
  if (paired) {
    *reinterpret_cast<typename Elem<T>::pair*>(c) = Elem<T>::pack(v0, v1);
  } else {
    c[0] = Elem<T>::from_float(v0);
    if (has1) c[1] = Elem<T>::from_float(v1);
  }
}

// Stores the two accumulator values of columns n, n+1 of one row (row_offset = its first
// element; the caller checks the row is inside M), adding the bias, storing the
// pre-activation when asked and applying the activation. A 4-byte paired store when both
// columns exist and the row start allows it (N even), element stores otherwise.
template <typename T, int ACT>
__device__ __forceinline__ void epilogue_pair(const GemmProblem& p, int64_t row_offset, int n,
                                              float v0, float v1, float b0, float b1) {
  if (n >= p.N) return;
  const bool has1 = n + 1 < p.N;
  v0 += b0;
  v1 += b1;
  const bool paired = has1 && (p.N % 2 == 0);
  if (p.z != nullptr) {
    store_act_pair<T, kActNone>(static_cast<T*>(p.z) + row_offset + n, v0, v1, has1, paired);
  }
  store_act_pair<T, ACT>(static_cast<T*>(p.c) + row_offset + n, v0, v1, has1, paired);
}

// Tile order shared by both kernels: tiles are walked in groups of group_m tile-rows, column
// by column within a group, so consecutive tiles (run at the same time) share A rows and B
// columns in L2. group_m is the override matmul.group_m (default 8: common/overrides.h).

__host__ __device__ __forceinline__ void tile_coords(int tile, int tiles_m, int tiles_n,
                                                     int group_m, int& tm, int& tn) {
  // A group taller than the problem walks it the same way as one exactly its height; the
  // clamp keeps g * tiles_n within the tile count (< 2^31, checked by the launchers).
  const int g = group_m < tiles_m ? group_m : tiles_m;
  const int group_size = g * tiles_n;
  const int group = tile / group_size;
  const int first_m = group * g;
  const int rows = tiles_m - first_m < g ? tiles_m - first_m : g;
  const int in_group = tile - group * group_size;
  tm = first_m + in_group % rows;
  tn = in_group / rows;
}

}  // namespace matmul
}  // namespace fused
