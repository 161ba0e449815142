// The portable tensor-core matmul (sm_80 and later): shared-memory tiles filled by a
// multi-stage cp.async pipeline, fragments read with ldmatrix, mma.sync m16n8k16 with fp32
// accumulation, and the fused bias + activation epilogue straight from registers.
//
// Block tile BM x BN, stepping BK = 32 along K; WARPS_M x WARPS_N warps, each owning a
// (BM / WARPS_M) x (BN / WARPS_N) warp tile. Shared-memory tiles keep the global layout of
// their operand (a K-major operand as [rows][BK], an MN-major one as [BK][rows]) with rows
// padded by 16 bytes, which makes both the cp.async writes 16-byte aligned and the
// ldmatrix reads bank-conflict free; ldmatrix.trans turns an MN-major tile into the same
// fragments, so no operand is ever transposed in memory.
//
// Edges: every 16-byte chunk load is predicated; a chunk that runs past the matrix edge
// in its contiguous dimension copies only the bytes inside (cp.async zero-fills the rest),
// so any M, N, K work. The launcher guarantees 16-byte aligned bases and leading
// dimensions (it copies an operand to a padded buffer otherwise).
#pragma once
#include "cuda/matmul_common.cuh"

namespace fused {
namespace matmul {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared, copying src_bytes (0..16) and zero-filling the rest.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
               "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

template <bool TRANS>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  if constexpr (TRANS) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
  }
}

// d += a * b for one m16n8k16 tile (a row-major 16x16, b "col" 16x8, fp32 accumulators).
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

template <int BM_, int BN_, int WARPS_M_, int WARPS_N_, int STAGES_>
struct PortableConfig {
  static constexpr int BM = BM_, BN = BN_, BK = 32, STAGES = STAGES_;
  static constexpr int WARPS_M = WARPS_M_, WARPS_N = WARPS_N_;
  static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
  static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;
  static constexpr int MI = WM / 16, NI = WN / 8;  // mma tiles per warp
  static constexpr int PAD = 8;                     // elements (16 bytes) per smem row
  static_assert(WM % 16 == 0 && WN % 16 == 0, "warp tile must be a multiple of 16x16");

  // Shared-memory tile of one operand: [rows][cols + PAD] with cols contiguous.
  template <bool KMAJOR, int MN>
  struct Tile {
    static constexpr int ROWS = KMAJOR ? MN : BK;
    static constexpr int COLS = KMAJOR ? BK : MN;
    static constexpr int PITCH = COLS + PAD;
    static constexpr int ELEMS = ROWS * PITCH;
  };
  template <bool AK, bool BK_>
  static constexpr int smem_bytes() {
    return STAGES * (Tile<AK, BM>::ELEMS + Tile<BK_, BN>::ELEMS) * 2;
  }
};

// Loads one ROWS x COLS tile (COLS contiguous in global memory) starting at (row0, col0)
// of a matrix with row_lim rows and col_lim columns, in 16-byte chunks.
template <typename T, int ROWS, int COLS, int PITCH, int THREADS>
__device__ __forceinline__ void load_tile_async(T* smem, const T* g, int64_t ld, int row0,
                                                int col0, int row_lim, int col_lim) {
  constexpr int CHUNKS_PER_ROW = COLS / 8;
  constexpr int CHUNKS = ROWS * CHUNKS_PER_ROW;
  static_assert(CHUNKS % THREADS == 0, "tile chunks must divide evenly among threads");
#pragma unroll
  for (int i = 0; i < CHUNKS / THREADS; ++i) {
    const int c = threadIdx.x + i * THREADS;
    const int r = c / CHUNKS_PER_ROW;
    const int cc = (c % CHUNKS_PER_ROW) * 8;
    const int gr = row0 + r, gc = col0 + cc;
    int bytes = 0;
    const T* src = g;  // any valid address when nothing is copied
    if (gr < row_lim && gc < col_lim) {
      const int valid = col_lim - gc < 8 ? col_lim - gc : 8;
      bytes = valid * static_cast<int>(sizeof(T));
      src = g + static_cast<int64_t>(gr) * ld + gc;
    }
    cp_async_16(smem + r * PITCH + cc, src, bytes);
  }
}

template <typename T, typename Cfg, bool A_KMAJOR, bool B_KMAJOR>
__global__ void __launch_bounds__(Cfg::THREADS)
    portable_gemm_kernel(const GemmProblem p) {
  using TA = typename Cfg::template Tile<A_KMAJOR, Cfg::BM>;
  using TB = typename Cfg::template Tile<B_KMAJOR, Cfg::BN>;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, STAGES = Cfg::STAGES;
  constexpr int MI = Cfg::MI, NI = Cfg::NI;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sA = reinterpret_cast<T*>(smem_raw);
  T* sB = sA + STAGES * TA::ELEMS;

  const int tiles_m = (p.M + BM - 1) / BM, tiles_n = (p.N + BN - 1) / BN;
  int tm, tn;
  tile_coords(blockIdx.x, tiles_m, tiles_n, tm, tn);
  const int m0 = tm * BM, n0 = tn * BN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_m = warp / Cfg::WARPS_N, warp_n = warp % Cfg::WARPS_N;
  const int k_tiles = (p.K + BK - 1) / BK;

  for (int batch = blockIdx.y; batch < p.batch; batch += gridDim.y) {
    const T* A = static_cast<const T*>(p.a) + batch * p.batch_stride_a;
    const T* B = static_cast<const T*>(p.b) + batch * p.batch_stride_b;

    auto load_stage = [&](int stage, int kt) {
      const int k0 = kt * BK;
      T* a_dst = sA + stage * TA::ELEMS;
      T* b_dst = sB + stage * TB::ELEMS;
      if constexpr (A_KMAJOR) {
        load_tile_async<T, TA::ROWS, TA::COLS, TA::PITCH, Cfg::THREADS>(a_dst, A, p.lda, m0, k0,
                                                                        p.M, p.K);
      } else {
        load_tile_async<T, TA::ROWS, TA::COLS, TA::PITCH, Cfg::THREADS>(a_dst, A, p.lda, k0, m0,
                                                                        p.K, p.M);
      }
      if constexpr (B_KMAJOR) {
        load_tile_async<T, TB::ROWS, TB::COLS, TB::PITCH, Cfg::THREADS>(b_dst, B, p.ldb, n0, k0,
                                                                        p.N, p.K);
      } else {
        load_tile_async<T, TB::ROWS, TB::COLS, TB::PITCH, Cfg::THREADS>(b_dst, B, p.ldb, k0, n0,
                                                                        p.K, p.N);
      }
    };

    float acc[MI][NI][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NI; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

    // Prologue: STAGES - 1 tiles in flight. Every step commits a group (possibly empty) so
    // that wait_group counts stay uniform.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < k_tiles) load_stage(s, s);
      cp_async_commit();
    }

    for (int kt = 0; kt < k_tiles; ++kt) {
      cp_async_wait<STAGES - 2>();  // tile kt has landed (for this thread)...
      __syncthreads();              // ...for every thread; and stage kt-1 is free again
      const int next = kt + STAGES - 1;
      if (next < k_tiles) load_stage(next % STAGES, next);
      cp_async_commit();

      const T* a_s = sA + (kt % STAGES) * TA::ELEMS;
      const T* b_s = sB + (kt % STAGES) * TB::ELEMS;
#pragma unroll
      for (int kk = 0; kk < BK; kk += 16) {
        uint32_t af[MI][4];
        uint32_t bf[NI][2];
        const int j = lane / 8, r = lane % 8;
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
          const int mb = warp_m * Cfg::WM + mi * 16;
          if constexpr (A_KMAJOR) {
            // matrices: (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15)
            ldmatrix_x4<false>(af[mi], a_s + (mb + lane % 16) * TA::PITCH + kk + (lane / 16) * 8);
          } else {
            // same fragments from k-rows of the [k][m] tile, transposed by ldmatrix
            ldmatrix_x4<true>(af[mi], a_s + (kk + r + (j / 2) * 8) * TA::PITCH + mb + (j % 2) * 8);
          }
        }
#pragma unroll
        for (int ni = 0; ni < NI; ni += 2) {
          const int nb = warp_n * Cfg::WN + ni * 8;
          uint32_t t[4];
          // matrices: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15)
          if constexpr (B_KMAJOR) {
            ldmatrix_x4<false>(t, b_s + (nb + r + (j / 2) * 8) * TB::PITCH + kk + (j % 2) * 8);
          } else {
            ldmatrix_x4<true>(t, b_s + (kk + r + (j % 2) * 8) * TB::PITCH + nb + (j / 2) * 8);
          }
          bf[ni][0] = t[0];
          bf[ni][1] = t[1];
          bf[ni + 1][0] = t[2];
          bf[ni + 1][1] = t[3];
        }
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
          for (int ni = 0; ni < NI; ++ni) mma_16816<T>(acc[mi][ni], af[mi], bf[ni][0], bf[ni][1]);
      }
    }
    cp_async_wait<0>();
    __syncthreads();  // the next batch's prologue overwrites the stages

    // Epilogue from registers: accumulator (e0, e1) is row lane/4, columns 2*(lane%4)+{0,1};
    // (e2, e3) the same columns 8 rows down.
    const int64_t c_batch = static_cast<int64_t>(batch) * p.M * p.N;
    dispatch_act(p.act, [&](auto act) {
      constexpr int ACT = decltype(act)::value;
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        const int n = n0 + warp_n * Cfg::WN + ni * 8 + (lane % 4) * 2;
        float b0, b1;
        load_bias_pair<T>(p, n, b0, b1);
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int m = m0 + warp_m * Cfg::WM + mi * 16 + lane / 4 + half * 8;
            if (m < p.M) {
              epilogue_pair<T, ACT>(p, c_batch + static_cast<int64_t>(m) * p.N, n,
                                    acc[mi][ni][half * 2], acc[mi][ni][half * 2 + 1], b0, b1);
            }
          }
        }
      }
    });
  }
}

}  // namespace matmul
}  // namespace fused
