// Tile-shape / pipeline sweep of the portable (mma.sync) GEMM kernel, without torch: one
// binary per configuration (BM, BN, BK, WARPS_M, WARPS_N, STAGES, MIN_BLOCKS), bf16,
// checked against a double-precision host reference on an edge shape of every compiled
// layout, then timed at 4096^3 and 8192^3 (cudaEvents, median of 5 runs of ITERS launches).
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
//        -Icsrc -DV_BM=128 -DV_BN=256 -DV_BK=32 -DV_WM=2 -DV_WN=4 -DV_ST=4 -DV_MB=1 benchmarks/dev/portable_sweep.cu -o /tmp/ps && /tmp/ps
// -DOLD_KERNEL with -I<dir holding the previous cuda/matmul_portable.cuh> ahead of -Icsrc
// builds the committed kernel (its config is <BM,BN,WARPS_M,WARPS_N,STAGES>, BK = 32).
// "/tmp/ps ncu" runs only three 4096^3 launches (for Nsight Compute), "/tmp/ps check" only
// the checks (for compute-sanitizer).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "cuda/matmul_portable.cuh"

using namespace fused::matmul;
using T = __nv_bfloat16;
// Configuration from -DV_BM=.. -DV_BN=.. -DV_BK=.. -DV_WM=.. -DV_WN=.. -DV_ST=.. -DV_MB=..
// (nvcc splits comma lists in -D values, hence one macro each).
#ifndef V_BM
#define V_BM 128
#define V_BN 256
#define V_BK 32
#define V_WM 2
#define V_WN 4
#define V_ST 4
#define V_MB 1
#endif
#ifdef OLD_KERNEL
using Cfg = PortableConfig<V_BM, V_BN, V_WM, V_WN, V_ST>;
#else
using Cfg = PortableConfig<V_BM, V_BN, V_BK, V_WM, V_WN, V_ST, V_MB>;
#endif

#define CK(x)                                                                  \
  do {                                                                         \
    cudaError_t e = (x);                                                       \
    if (e != cudaSuccess) {                                                    \
      printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

template <bool AK, bool BKM>
void launch(const GemmProblem& p) {
  auto k = portable_gemm_kernel<T, Cfg, AK, BKM>;
  constexpr int smem = Cfg::template smem_bytes<AK, BKM>();
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int tiles = ((p.M + Cfg::BM - 1) / Cfg::BM) * ((p.N + Cfg::BN - 1) / Cfg::BN);
  k<<<dim3(tiles, p.batch), Cfg::THREADS, smem>>>(p);
}
// -DV_TN_ONLY: only the TN layout (both operands K-major), for tiles whose MN-major copies
// do not divide among the threads (e.g. BM or BN = 192).
#ifdef V_TN_ONLY
constexpr std::pair<bool, bool> kLayouts[] = {{true, true}};
void launch_any(const GemmProblem& p) { launch<true, true>(p); }
#else
constexpr std::pair<bool, bool> kLayouts[] = {{true, true}, {true, false}, {false, false}};
void launch_any(const GemmProblem& p) {
  if (p.a_kmajor && p.b_kmajor) launch<true, true>(p);
  else if (p.a_kmajor) launch<true, false>(p);
  else launch<false, false>(p);
}
#endif

// A: M x K, stored K-major ([M][lda]) or MN-major ([K][lda]); B: K x N, K-major ([N][ldb])
// or MN-major ([K][ldb]).
struct Case {
  int M, N, K;
  bool ak, bk;
};
const char* lname(bool ak, bool bk) { return ak ? (bk ? "TN(A K, B K)" : "NN(A K, B MN)") : "TT(A MN, B MN)"; }

float bf(T v) { return __bfloat162float(v); }

GemmProblem make(const Case& c, const T* a, const T* b, T* out, int64_t lda, int64_t ldb) {
  GemmProblem p{};
  p.a = a; p.b = b; p.c = out; p.z = nullptr; p.bias = nullptr;
  p.lda = lda; p.ldb = ldb; p.batch_stride_a = p.batch_stride_b = 0;
  p.M = c.M; p.N = c.N; p.K = c.K; p.batch = 1; p.act = kActNone;
  p.group_m = kGroupM;  // the tile order the extension uses by default (0 would divide by zero)
  p.a_kmajor = c.ak; p.b_kmajor = c.bk;
  return p;
}

bool check(const Case& c) {
  // Leading dimensions padded past the matrix (multiples of 8 elements: the kernel's
  // 16-byte alignment contract).
  auto pad = [](int x) { return (x + 7) / 8 * 8 + 8; };
  const int64_t lda = pad(c.ak ? c.K : c.M), ldb = pad(c.bk ? c.K : c.N);
  const int64_t na = (c.ak ? c.M : c.K) * lda, nb = (c.bk ? c.N : c.K) * ldb;
  std::vector<T> ha(na), hb(nb), hc((size_t)c.M * c.N);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto& v : ha) v = __float2bfloat16(u(rng));
  for (auto& v : hb) v = __float2bfloat16(u(rng));
  T *da, *db, *dc;
  CK(cudaMalloc(&da, na * 2)); CK(cudaMalloc(&db, nb * 2)); CK(cudaMalloc(&dc, hc.size() * 2));
  CK(cudaMemcpy(da, ha.data(), na * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(db, hb.data(), nb * 2, cudaMemcpyHostToDevice));
  CK(cudaMemset(dc, 0xff, hc.size() * 2));
  launch_any(make(c, da, db, dc, lda, ldb));
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(hc.data(), dc, hc.size() * 2, cudaMemcpyDeviceToHost));
  double worst = 0;
  for (int m = 0; m < c.M; ++m)
    for (int n = 0; n < c.N; ++n) {
      double r = 0;
      for (int k = 0; k < c.K; ++k) {
        const float x = c.ak ? bf(ha[m * lda + k]) : bf(ha[k * lda + m]);
        const float y = c.bk ? bf(hb[n * ldb + k]) : bf(hb[k * ldb + n]);
        r += (double)x * y;
      }
      const double o = bf(hc[(size_t)m * c.N + n]);
      const double e = std::fabs(o - r) / (0.01 * std::fabs(r) + 0.1);
      if (!(e <= worst)) worst = std::isnan(e) ? 1e30 : std::max(worst, e);
    }
  cudaFree(da); cudaFree(db); cudaFree(dc);
  printf("  check %-15s %5d x %5d x %5d: worst err/tol %.3f %s\n", lname(c.ak, c.bk), c.M, c.N,
         c.K, worst, worst <= 1 ? "ok" : "FAIL");
  return worst <= 1;
}

double time_case(const Case& c, int iters, int reps) {
  const int64_t lda = c.ak ? c.K : c.M, ldb = c.bk ? c.K : c.N;
  T *da, *db, *dc;
  CK(cudaMalloc(&da, (size_t)c.M * c.K * 2)); CK(cudaMalloc(&db, (size_t)c.N * c.K * 2));
  CK(cudaMalloc(&dc, (size_t)c.M * c.N * 2));
  CK(cudaMemset(da, 0x3c, (size_t)c.M * c.K * 2)); CK(cudaMemset(db, 0x3c, (size_t)c.N * c.K * 2));
  const GemmProblem p = make(c, da, db, dc, lda, ldb);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0); cudaEventCreate(&e1);
  for (int i = 0; i < 3; ++i) launch_any(p);
  std::vector<float> ms;
  for (int r = 0; r < reps; ++r) {
    cudaEventRecord(e0);
    for (int i = 0; i < iters; ++i) launch_any(p);
    cudaEventRecord(e1);
    CK(cudaEventSynchronize(e1));
    float t; cudaEventElapsedTime(&t, e0, e1); ms.push_back(t / iters);
  }
  CK(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  cudaFree(da); cudaFree(db); cudaFree(dc);
  return ms[ms.size() / 2];
}

int main(int argc, char** argv) {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  cudaFuncAttributes fa;
  CK(cudaFuncGetAttributes(&fa, portable_gemm_kernel<T, Cfg, true, true>));
  printf("%s  tile %dx%dx%d  warps %dx%d  stages %d  regs %d  smem %d B\n", prop.name, Cfg::BM,
         Cfg::BN, Cfg::BK, Cfg::WARPS_M, Cfg::WARPS_N, Cfg::STAGES, fa.numRegs,
         Cfg::template smem_bytes<true, true>());
  if (argc > 1 && !strcmp(argv[1], "ncu")) {
    time_case({4096, 4096, 4096, true, true}, 1, 1);
    return 0;
  }
  bool ok = true;
  for (auto [ak, bk] : kLayouts) {
    ok &= check({333, 517, 1000, ak, bk});
    ok &= check({1, 300, 17, ak, bk});
    ok &= check({257, 129, 72, ak, bk});
  }
  if (argc > 1 && !strcmp(argv[1], "check")) return ok ? 0 : 1;  // e.g. under compute-sanitizer
  for (int s : {4096, 8192})
    for (auto [ak, bk] : kLayouts) {
      const double ms = time_case({s, s, s, ak, bk}, s == 4096 ? 20 : 5, 5);
      printf("  %5d^3 %-15s %8.1f us %6.1f TFLOP/s\n", s, lname(ak, bk), ms * 1e3,
             2.0 * s * s * s / (ms * 1e-3) / 1e12);
    }
  printf(ok ? "ALL CHECKS OK\n" : "SOME CHECK FAILED\n");
  return ok ? 0 : 1;
}
