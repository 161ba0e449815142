// The small-M GEMM (plan.cpp: use_gemv): C[b] = act(A[b] B[b] + bias) for M <= 32 rows of A,
// both operands K-major (x [M, K] and a linear layer's weight W [N, K]). Memory-bound on W,
// which it reads once, in 16-byte loads, many in flight a thread.
//
// The MMA's roles are swapped: W's rows are the m16n8k16 MMA's M side (16 rows, the A
// fragment) and A's rows its N side (NT tiles of 8), so a single activation row wastes 7/8 of
// an MMA rather than 127/128 of a 128-row tile. The fragments are loaded straight from global
// memory: a dot product may visit K in any order as long as both operands agree, so lane
// (g, q) of a warp loads the 16-byte chunk q (8 consecutive k) of the 32-wide k step of W rows
// g and g + 8 and of A rows 8t + g, and feeds elements {0, 1 | 2, 3} of each to the first MMA
// (the fragment's k {2q, 2q + 1 | 2q + 8, 2q + 9}) and {4, 5 | 6, 7} to the second. No shared
// memory staging, no layout change.
//
// Block: 8 warps, 16 rows of W (output columns n0 .. n0 + 15) of one batch matrix, the K
// steps cut evenly among the warps; each warp keeps UNROLL steps of loads in flight. The warps'
// fp32 partial sums meet in shared memory and are added in warp order (deterministic); the
// block then stores its 16 x M outputs with the bias and the activation (and Z when asked).
// K edges: a chunk that crosses K is read element by element with zeros past K in both
// operands (the bytes past K of a row may be another view's data, NaN included).
#include <ATen/cuda/CUDAContext.h>

#include "common/launch.cuh"
#include "cuda/matmul/plan.h"
#include "cuda/matmul_gemv.h"
#include "cuda/matmul_portable.cuh"  // mma_16816

namespace fused {
namespace matmul {
namespace {

constexpr int kWarps = 8;
constexpr int kRows = 16;  // rows of W (output columns) a block

// A 16-byte load that does not allocate in L1: W, read once a call, leaves L1 to A, which
// every block re-reads. (L2 keeps its normal policy: a weight that fits may stay there between
// calls, as it does for cuBLAS.)
__device__ __forceinline__ uint4 load_no_l1(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// The 16-byte chunk of 8 elements at row[k], zeros for the elements at or past K; none read
// when !live. STREAM: W (load_no_l1); otherwise A (read-only, through L1).
template <typename T, bool STREAM>
__device__ __forceinline__ uint4 load_chunk(const T* row, int k, int K, bool live) {
  if (!live || k >= K) return make_uint4(0, 0, 0, 0);
  if (k + 8 <= K) {
    const uint4* p = reinterpret_cast<const uint4*>(row + k);
    return STREAM ? load_no_l1(p) : __ldg(p);
  }
  union {
    uint4 v;
    unsigned short e[8];
  } out;
  out.v = make_uint4(0, 0, 0, 0);
  const unsigned short* r = reinterpret_cast<const unsigned short*>(row);
  for (int e = 0; e < 8 && k + e < K; ++e) out.e[e] = r[k + e];
  return out.v;
}

template <typename T, int NT, int UNROLL>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(const GemmProblem p) {
  grid_dependency_wait();  // launched early (launch_early): nothing global before this
  __shared__ float red[kWarps][NT * 8][kRows];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, q = lane % 4;
  const int n0 = blockIdx.x * kRows;
  const int b = blockIdx.y;
  const T* a = static_cast<const T*>(p.a) + b * p.batch_stride_a;
  const T* w = static_cast<const T*>(p.b) + b * p.batch_stride_b;
  const bool has_w0 = n0 + g < p.N, has_w1 = n0 + g + 8 < p.N;
  const T* w0 = w + (has_w0 ? n0 + g : 0) * p.ldb;
  const T* w1 = w + (has_w1 ? n0 + g + 8 : 0) * p.ldb;
  const T* x[NT];
  bool has_x[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    has_x[t] = 8 * t + g < p.M;
    x[t] = a + (has_x[t] ? 8 * t + g : 0) * p.lda;
  }
  const int steps = (p.K + 31) / 32;
  const int per = steps / kWarps, rem = steps % kWarps;
  const int s_begin = warp * per + min(warp, rem);
  const int s_end = s_begin + per + (warp < rem ? 1 : 0);
  float acc[NT][4];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
  for (int s = s_begin; s < s_end; s += UNROLL) {
    uint4 wa[UNROLL], wb[UNROLL], xv[UNROLL][NT];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int k = (s + u) * 32 + q * 8;
      const bool live = s + u < s_end;
      wa[u] = load_chunk<T, true>(w0, k, p.K, live && has_w0);
      wb[u] = load_chunk<T, true>(w1, k, p.K, live && has_w1);
#pragma unroll
      for (int t = 0; t < NT; ++t) xv[u][t] = load_chunk<T, false>(x[t], k, p.K, live && has_x[t]);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const uint32_t lo[4] = {wa[u].x, wb[u].x, wa[u].y, wb[u].y};
      const uint32_t hi[4] = {wa[u].z, wb[u].z, wa[u].w, wb[u].w};
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        mma_16816<T>(acc[t], lo, xv[u][t].x, xv[u][t].y);
        mma_16816<T>(acc[t], hi, xv[u][t].z, xv[u][t].w);
      }
    }
  }
  // Accumulator (t, i): W row g (i < 2) or g + 8, A row 8t + 2q + i % 2.
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    red[warp][8 * t + 2 * q][g] = acc[t][0];
    red[warp][8 * t + 2 * q + 1][g] = acc[t][1];
    red[warp][8 * t + 2 * q][g + 8] = acc[t][2];
    red[warp][8 * t + 2 * q + 1][g + 8] = acc[t][3];
  }
  __syncthreads();
  const T* bias = static_cast<const T*>(p.bias);
  T* c = static_cast<T*>(p.c) + static_cast<int64_t>(b) * p.M * p.N;
  T* z = p.z != nullptr ? static_cast<T*>(p.z) + static_cast<int64_t>(b) * p.M * p.N : nullptr;
  dispatch_act(p.act, [&](auto act) {
    constexpr int ACT = decltype(act)::value;
    // Thread i: A row i / 16, W row n0 + i % 16 (16 neighbouring outputs of a row together).
    for (int i = threadIdx.x; i < NT * 8 * kRows; i += kWarps * 32) {
      const int m = i / kRows, r = i % kRows, n = n0 + r;
      if (m >= p.M || n >= p.N) continue;
      float v = 0.f;
#pragma unroll
      for (int j = 0; j < kWarps; ++j) v += red[j][m][r];
      if (bias != nullptr) v += Elem<T>::to_float(bias[n]);
      const int64_t o = static_cast<int64_t>(m) * p.N + n;
      if (z != nullptr) z[o] = Elem<T>::from_float(v);
      c[o] = Elem<T>::from_float(act_for<T, ACT>(v));
    }
  });
}

template <typename T, int NT, int UNROLL>
void launch_nt(const GemmProblem& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((p.N + kRows - 1) / kRows), static_cast<unsigned>(p.batch));
  (void)stream;  // launch_early launches on the current stream, the one passed here
  launch_early(gemv_kernel<T, NT, UNROLL>, grid, dim3(kWarps * 32), 0, p);
}

// Tiles of 8 rows of A: 1, 2 or 4 (M <= 8, 16, 32); the loads of 4 k steps in flight a warp,
// 2 with 4 tiles (their 16 activation chunks a step would otherwise cost ~130 registers and
// half the blocks an SM holds).
template <typename T>
void launch_typed(const GemmProblem& p, cudaStream_t stream) {
  if (p.M <= 8) {
    launch_nt<T, 1, 4>(p, stream);
  } else if (p.M <= 16) {
    launch_nt<T, 2, 4>(p, stream);
  } else {
    launch_nt<T, 4, 2>(p, stream);
  }
}

}  // namespace

void launch_gemv(const GemmProblem& p, at::ScalarType dtype, cudaStream_t stream) {
  TORCH_CHECK(p.M >= 1 && p.M <= kGemvMaxM && p.a_kmajor && p.b_kmajor && p.batch <= 65535 &&
                  p.act < kActSwiglu,
              "fused::matmul: internal error: a problem the small-M kernel does not take (M ", p.M,
              ")");
  if (dtype == at::kBFloat16) {
    launch_typed<__nv_bfloat16>(p, stream);
  } else {
    launch_typed<__half>(p, stream);
  }
}

}  // namespace matmul
}  // namespace fused
