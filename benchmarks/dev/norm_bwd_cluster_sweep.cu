// The long-row (12K-32K columns) bf16 LayerNorm / RMSNorm backward on thread-block clusters,
// shaped at compile time: what the library's norm_bwd_cluster (KERNEL_LOG norm v7: 43-50% of
// copy for the backward alone) could reach, and which of its parts costs. Per variant:
//   COLS   row length; CS blocks per cluster (1: one block per row, no exchange) of
//   T = COLS / (CS * VPT * 8) threads, VPT 8-element vectors per thread;
//   LAG    rows between pushing a row's block sums and writing its dx (0 or 1; v7 uses 1);
//   KEEP   x / dy kept as floats from the sums half to the dx half (else re-unpacked);
// against v7's runtime shape (bounds checks, runtime cluster size / threads, w re-read from
// L1 per use, dw / db accumulated in the sums half). Exchange as v7: each block pushes its
// sums into every peer with st.async on an mbarrier (csrc/common/cluster.cuh), 4 buffers.
// Bytes counted: x + dy + dx (w, mean / rstd and the partials left out); time with and
// without the partials' column sum. Checks: dx on 4 rows, dw / db on every column, float64.
// Standalone (no torch), on the GPU machine from the repository root:
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v \
//        benchmarks/dev/norm_bwd_cluster_sweep.cu -o /tmp/ncsweep && /tmp/ncsweep
#define NORM_SWEEP_NO_MAIN
#include "norm_sweep.cu"  // unpack / pack8 / fresh / row_sum / colsum / timeit / data / reference

#include <cooperative_groups.h>

#include "../../csrc/common/cluster.cuh"

namespace cg = cooperative_groups;
using namespace fused;  // load_pinned, mbar_*, push_to_peer

template <int COLS, int CS, int VPT, int LAG, bool KEEP, bool RMS>
__global__ void __launch_bounds__(COLS / (CS * VPT * 8))
    bwd_cl(const uint4* __restrict__ x, const uint4* __restrict__ dy, const uint4* __restrict__ w,
           const float* __restrict__ mean, const float* __restrict__ rstd, uint4* __restrict__ dx,
           float* __restrict__ part, long rows, uint32_t zero) {
  constexpr int T = COLS / (CS * VPT * 8), TPR = CS * T, NW = T / 32, N = VPT * 8;
  constexpr int LENV = COLS / 8, NS = RMS ? 1 : 2, kSlots = 4;
  constexpr float INV = 1.f / COLS;
  static_assert(T % 32 == 0 && T <= 1024 && CS * T * VPT * 8 == COLS, "exact fits only");
  static_assert(CS > 1 || LAG == 0, "no exchange, no lag");
  __shared__ float buf[2][NS][NW];
  __shared__ float2 slots[kSlots][CS];
  __shared__ uint64_t bar[kSlots];
  const int rank = CS > 1 ? static_cast<int>(cg::this_cluster().block_rank()) : 0;
  const int lane = rank * T + threadIdx.x;
  const long cid = blockIdx.x / CS, clusters = gridDim.x / CS;
  uint4 rw[VPT];
#pragma unroll
  for (int k = 0; k < VPT; ++k) rw[k] = __ldg(w + lane + k * TPR);  // w stays in registers
  float dw[N] = {}, db[N] = {};
  struct Tile {
    uint4 x[VPT], d[VPT];
    float fx[KEEP ? N : 1], fd[KEEP ? N : 1];
    float m, rs;
  };
  auto load = [&](Tile& t, long row) {
    if (row >= rows) return;
    const long o = row * LENV + lane;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      t.x[k] = load_pinned(x + o + k * TPR);
      t.d[k] = load_pinned(dy + o + k * TPR);
    }
    t.m = RMS ? 0.f : load_pinned(mean + row);
    t.rs = load_pinned(rstd + row);
  };
  // Sums half: dweight / dbias terms and this block's shares of the two row sums.
  auto sums = [&](Tile& t, int it, float (&s)[2]) {
    const uint32_t z = zero & it;  // 0 at run time: fresh unpacks, no CSE across the halves
    float a = 0.f, c = 0.f;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      float fx[8], fd[8], fw[8];
      unpack(fresh(t.x[k], z), fx); unpack(fresh(t.d[k], z), fd); unpack(fresh(rw[k], z), fw);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float xh = (fx[e] - t.m) * t.rs, g = fd[e] * fw[e];
        a += g; c += g * xh;
        dw[8 * k + e] += fd[e] * xh;
        if constexpr (!RMS) db[8 * k + e] += fd[e];
        if constexpr (KEEP) { t.fx[8 * k + e] = xh; t.fd[8 * k + e] = g; }
      }
    }
    s[0] = a; s[1] = c;
  };
  auto dxhalf = [&](const Tile& t, long row, int it, float a, float c) {
    const uint32_t z = zero & ~it;
    uint4* o = dx + row * LENV + lane;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      float f[8];
      if constexpr (KEEP) {
#pragma unroll
        for (int e = 0; e < 8; ++e) f[e] = t.rs * (t.fd[8 * k + e] - a - t.fx[8 * k + e] * c);
      } else {
        float fx[8], fd[8], fw[8];
        unpack(fresh(t.x[k], z), fx); unpack(fresh(t.d[k], z), fd); unpack(fresh(rw[k], z), fw);
#pragma unroll
        for (int e = 0; e < 8; ++e) f[e] = t.rs * (fd[e] * fw[e] - a - (fx[e] - t.m) * t.rs * c);
      }
      o[k * TPR] = pack8(f);
    }
  };
  if constexpr (CS > 1) {
    if (threadIdx.x < kSlots) mbar_init(&bar[threadIdx.x]);
  }
  Tile cur, prev, nxt;
  load(cur, cid);
  if constexpr (CS > 1) cg::this_cluster().sync();  // mbarriers set up before any push
  auto finish = [&](const Tile& t, long row, int it) {
    const int k = it % kSlots;
    mbar_wait(&bar[k], (it / kSlots) & 1);
    float a = 0.f, c = 0.f;
#pragma unroll
    for (int b = 0; b < CS; ++b) { a += slots[k][b].x; c += slots[k][b].y; }
    dxhalf(t, row, it, RMS ? 0.f : a * INV, c * INV);
  };
  int it = 0;
  for (long row = cid;; row += clusters, ++it) {
    const bool have = row < rows;
    if (have) {
      load(nxt, row + clusters);
      float s[2];
      sums(cur, it, s);
      float v[NS];
      if constexpr (RMS) v[0] = s[1]; else { v[0] = s[0]; v[1] = s[1]; }
      row_sum<T, NS, NW>(v, buf[it & 1]);
      const float a = RMS ? 0.f : v[0], c = v[NS - 1];
      if constexpr (CS == 1) {
        dxhalf(cur, row, it, a * INV, c * INV);
      } else {
        const int k = it % kSlots;
        if (threadIdx.x < CS) push_to_peer(&slots[k][rank], &bar[k], threadIdx.x, make_float2(a, c));
        if (threadIdx.x == 0) mbar_expect(&bar[k], CS * 8u);
      }
    }
    // dx of iteration it - LAG, whose sums were pushed LAG iterations ago
    if (CS > 1 && it >= LAG && (LAG > 0 || have)) finish(LAG ? prev : cur, row - LAG * clusters, it - LAG);
    if (!have) break;
    if (LAG) prev = cur;
    cur = nxt;
  }
  if constexpr (CS > 1) cg::this_cluster().sync();  // no block leaves while peers may push
  float* out = part + cid * NS * COLS;  // partial row `cid`: [dw, db], each column owned once
#pragma unroll
  for (int e = 0; e < N; ++e) {
    const int c = (lane + e / 8 * TPR) * 8 + e % 8;
    out[c] = dw[e];
    if constexpr (!RMS) out[COLS + c] = db[e];
  }
}

template <int COLS, int CS, int VPT, int LAG, bool KEEP, bool RMS>
void run1(long rows) {
  constexpr int T = COLS / (CS * VPT * 8);
  constexpr long NC = (RMS ? 1 : 2) * COLS;
  setup(rows, COLS);
  upload_stats(rows, RMS);
  auto kern = bwd_cl<COLS, CS, VPT, LAG, KEEP, RMS>;
  if (CS > 8) cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = CS; attr.val.clusterDim.y = 1; attr.val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.blockDim = dim3(T);
  cfg.gridDim = dim3(CS);
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int active = 0;
  if (cudaOccupancyMaxActiveClusters(&active, kern, &cfg) != cudaSuccess || active < 1) {
    printf("%5ldx%-5d cs %2d vpt %d: no fit (%s)\n", rows, COLS, CS, VPT, cudaGetErrorString(cudaGetLastError()));
    return;
  }
  const long clusters = std::min<long>(active, rows);
  if (clusters * NC * 4 > PART_BYTES) { printf("skip: partials too large\n"); return; }
  cfg.gridDim = dim3(clusters * CS);
  auto main_k = [&] { cudaLaunchKernelEx(&cfg, kern, (const uint4*)X, (const uint4*)DY, (const uint4*)W,
                                         (const float*)MEAN, (const float*)RSTD, DX, PART, rows, 0u); };
  const float tm = timeit(main_k);
  const float tt = timeit([&] { main_k(); colsum<<<NC / 32, 512>>>(PART, OUT, clusters, NC); });
  const cudaError_t err = cudaDeviceSynchronize();
  double edx, edw, edb, mdw, mdb;
  check_bwd(rows, COLS, RMS, NC, edx, edw, edb, mdw, mdb);
  cudaFuncAttributes fa;
  cudaFuncGetAttributes(&fa, kern);
  const double bytes = 3.0 * rows * COLS * 2;
  printf("%5ldx%-5d %s cs %2d T %4d vpt %d lag %d keep %d regs %3d lmem %3d clusters %3ld | %7.1f us %5.1f%% "
         "+colsum %7.1f us %5.1f%% | err dx %.1e dw(rel) %.1e db(rel) %.1e %s\n",
         rows, COLS, RMS ? "rms  " : "layer", CS, T, VPT, LAG, (int)KEEP, fa.numRegs, (int)fa.localSizeBytes,
         clusters, tm, 100 * bytes / tm / copy_bps, tt, 100 * bytes / tt / copy_bps, edx, edw / mdw,
         RMS ? 0 : edb / mdb, err == cudaSuccess ? "" : cudaGetErrorString(err));
}

// Per cluster shape: v7's choices (lag 1, re-unpacked) for both norms, then lag 0 and kept
// floats for layer norm (CS = 1: one block per row, the reference without any exchange).
template <int COLS, int CS, int VPT>
void shape(long rows) {
  if constexpr (CS == 1) {
    run1<COLS, 1, VPT, 0, false, false>(rows); run1<COLS, 1, VPT, 0, true, false>(rows);
    run1<COLS, 1, VPT, 0, false, true>(rows);
  } else {
    run1<COLS, CS, VPT, 1, false, false>(rows); run1<COLS, CS, VPT, 1, false, true>(rows);
    run1<COLS, CS, VPT, 0, false, false>(rows); run1<COLS, CS, VPT, 1, true, false>(rows);
  }
}

int main() {
  init_data();
  // 4096 x 12288 (v7: cluster 8 x 192 threads, 8 elements each)
  shape<12288, 1, 2>(4096); shape<12288, 2, 1>(4096); shape<12288, 2, 2>(4096);
  shape<12288, 4, 1>(4096); shape<12288, 4, 2>(4096); shape<12288, 8, 1>(4096);
  // 4096 x 16384 (v7: 8 x 256)
  shape<16384, 1, 2>(4096); shape<16384, 2, 1>(4096); shape<16384, 4, 1>(4096);
  shape<16384, 4, 2>(4096); shape<16384, 8, 1>(4096);
  // 2048 x 32768 (v7: 8 x 512; 128 MiB buffers hold 2048 rows)
  shape<32768, 2, 2>(2048); shape<32768, 4, 1>(2048); shape<32768, 4, 2>(2048);
  shape<32768, 8, 1>(2048); shape<32768, 8, 2>(2048); shape<32768, 16, 1>(2048);
  printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
