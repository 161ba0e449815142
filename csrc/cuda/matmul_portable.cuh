// The portable tensor-core matmul (sm_80 and later): shared-memory tiles filled by a
// multi-stage cp.async pipeline, fragments read with ldmatrix, mma.sync m16n8k16 with fp32
// accumulation, and the fused bias + activation epilogue straight from registers.
//
// Block tile BM x BN, stepping BK along K; WARPS_M x WARPS_N warps, each owning a
// (BM / WARPS_M) x (BN / WARPS_N) warp tile. Shared-memory tiles keep the global layout of
// their operand (a K-major operand as [rows][BK], an MN-major one as [BK][rows]) with rows
// padded by 16 bytes, which makes both the cp.async writes 16-byte aligned and the
// ldmatrix reads bank-conflict free; ldmatrix.trans turns an MN-major tile into the same
// fragments, so no operand is ever transposed in memory.
//
// The k loop is kept short in instructions, since mma.sync issues from the same schedulers
// (Hopper's mma.sync rate leaves little slack): each thread's copy addresses are set up once
// per output tile and advanced by BK per k-tile, with no bounds checks along K in the loop
// (TileLoader), all ldmatrix addresses are a
// stage base plus compile-time offsets, and the fragments of the next k16 step are loaded
// while the current step's mma run (double-buffered fragments, one barrier per k-tile).
//
// Edges (any M, N, K): see TileLoader. The launcher guarantees
// 16-byte aligned bases and leading dimensions (it copies an operand to a padded buffer
// otherwise).
#pragma once
#include "cuda/matmul_common.cuh"

namespace fused {
namespace matmul {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared (dst a shared-space byte address), copying src_bytes
// (0..16) and zero-filling the rest. The L2 hint fetches whole 128-byte lines: a K-major
// operand's k-tile reads 64 bytes of each row, the next k-tile the following 64.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

template <bool TRANS>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  if constexpr (TRANS) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
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

// MIN_BLOCKS: blocks per SM the register budget is sized for (__launch_bounds__).
template <int BM_, int BN_, int BK_, int WARPS_M_, int WARPS_N_, int STAGES_, int MIN_BLOCKS_>
struct PortableConfig {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, STAGES = STAGES_;
  static constexpr int WARPS_M = WARPS_M_, WARPS_N = WARPS_N_, MIN_BLOCKS = MIN_BLOCKS_;
  static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
  static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;
  static constexpr int MI = WM / 16, NI = WN / 8;  // mma tiles per warp
  static constexpr int KSTEPS = BK / 16;           // k16 steps per k-tile
  static constexpr int PAD = 8;                    // elements (16 bytes) per smem row
  static_assert(WM % 16 == 0 && WN % 16 == 0, "warp tile must be a multiple of 16x16");
  // Even, so the double-buffered fragments' parity repeats from one k-tile to the next.
  static_assert(KSTEPS % 2 == 0, "BK must be a multiple of 32");

  // Shared-memory tile of one operand: [rows][cols + PAD] with cols contiguous.
  template <bool KMAJOR, int MN>
  struct Tile {
    static constexpr int ROWS = KMAJOR ? MN : BK;
    static constexpr int COLS = KMAJOR ? BK : MN;
    static constexpr int PITCH = COLS + PAD;
    static constexpr int ELEMS = ROWS * PITCH;
  };
  template <bool AK, bool BK_MAJ>
  static constexpr int smem_bytes() {
    return STAGES * (Tile<AK, BM>::ELEMS + Tile<BK_MAJ, BN>::ELEMS) * 2;
  }
};

// One operand's copies into shared memory, set up once per output tile. The tile is ROWS x
// COLS (COLS contiguous in global memory) in 16-byte chunks; thread t copies chunks t,
// t + THREADS, ..., which (THREADS being a multiple of the chunks per row) all sit in the
// same column, ROW_STEP rows apart: one pointer and a stride describe all of a thread's
// chunks, and a k-tile step moves the pointer by BK columns (K-major) or rows (MN-major).
//
// Edges. Along M/N a chunk is copied whole or not at all, decided once per output tile (the
// bits of mn_ok): rows and columns past M/N only feed outputs that are never stored, so a
// chunk that straddles the edge of an MN-major operand may bring in whatever follows the
// last element (it lies in the same 16-byte aligned block as that element). Every chunk, a
// K-edge one asking for fewer bytes too, is a 16-byte read to compute-sanitizer, so the
// launcher reads an operand in place only where all of its chunks lie inside its storage
// (chunks_inside_storage, matmul.cu). Along K the values must be exact zeros; the kernel
// walks K downwards from the last, partial k-tile, so only the first k-tile, copied in the
// prologue, needs the per-chunk K test (load_k_edge); the main loop's copies (load) carry
// no bounds checks but the mn_ok bit. A chunk copied as 0 bytes is zero-filled and reads no
// memory (PTX: src-size is the number of bytes read from src), so its source address may
// lie outside the matrix; compute-sanitizer memcheck on the edge shapes agrees
// (docs/design/matmul.md#tried-not-kept).
template <typename T, int ROWS, int COLS, int PITCH, int THREADS, bool KMAJOR>
struct TileLoader {
  static constexpr int CPR = COLS / 8;  // chunks per row
  static constexpr int ITERS = ROWS * CPR / THREADS;
  static constexpr int ROW_STEP = THREADS / CPR;
  static_assert(THREADS % CPR == 0 && (ROWS * CPR) % THREADS == 0,
                "tile chunks must divide evenly among threads");
  static_assert(ITERS <= 32, "mn_ok holds one bit per chunk");

  const T* src;    // the first chunk's source at the current k-tile
  uint32_t dst;    // its byte offset inside a stage
  int k;           // its first k (column if KMAJOR, row otherwise) at the current k-tile
  uint32_t mn_ok;  // bit i: chunk i lies (at least partly) inside M/N

  // The tile whose first row is mn0 (K-major) or whose first column is mn0 (MN-major), at
  // k-tile k0.
  __device__ __forceinline__ TileLoader(const T* g, int64_t ld, int mn0, int k0, int mn_lim) {
    const int r = threadIdx.x / CPR, c = (threadIdx.x % CPR) * 8;
    const int row = KMAJOR ? mn0 + r : k0 + r, col = KMAJOR ? k0 + c : mn0 + c;
    src = g + static_cast<int64_t>(row) * ld + col;
    dst = static_cast<uint32_t>((r * PITCH + c) * sizeof(T));
    k = KMAJOR ? col : row;
    mn_ok = 0;
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      if (KMAJOR ? row + i * ROW_STEP < mn_lim : col < mn_lim) mn_ok |= 1u << i;
    }
  }

  // A k-tile that lies inside K.
  __device__ __forceinline__ void load(uint32_t stage, int64_t ld) const {
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      cp_async_16(stage + dst + i * ROW_STEP * PITCH * sizeof(T), src + i * ROW_STEP * ld,
                  (mn_ok >> i) & 1 ? 16 : 0);
    }
  }
  // Any k-tile: what lies at or past K is zero-filled.
  __device__ __forceinline__ void load_k_edge(uint32_t stage, int64_t ld, int K) const {
    const int left = K - k;  // K-major: elements of this thread's chunks inside K
    const int bytes = KMAJOR ? (left >= 8 ? 8 : left > 0 ? left : 0) * int(sizeof(T)) : 16;
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      const bool inside = ((mn_ok >> i) & 1) && (KMAJOR || k + i * ROW_STEP < K);
      cp_async_16(stage + dst + i * ROW_STEP * PITCH * sizeof(T), src + i * ROW_STEP * ld,
                  inside ? bytes : 0);
    }
  }
  __device__ __forceinline__ void advance(int dk, int64_t ld) {
    k += dk;
    src += KMAJOR ? dk : dk * ld;
  }
};

template <typename T, typename Cfg, bool A_KMAJOR, bool B_KMAJOR>
__global__ void __launch_bounds__(Cfg::THREADS, Cfg::MIN_BLOCKS)
    portable_gemm_kernel(const GemmProblem p) {
  using TA = typename Cfg::template Tile<A_KMAJOR, Cfg::BM>;
  using TB = typename Cfg::template Tile<B_KMAJOR, Cfg::BN>;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, STAGES = Cfg::STAGES;
  constexpr int MI = Cfg::MI, NI = Cfg::NI, KSTEPS = Cfg::KSTEPS;
  constexpr uint32_t A_STAGE = TA::ELEMS * sizeof(T), B_STAGE = TB::ELEMS * sizeof(T);

  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t sA = smem_addr(smem_raw);
  const uint32_t sB = sA + STAGES * A_STAGE;

  const int tiles_m = (p.M + BM - 1) / BM, tiles_n = (p.N + BN - 1) / BN;
  int tm, tn;
  tile_coords(blockIdx.x, tiles_m, tiles_n, p.group_m, tm, tn);
  const int m0 = tm * BM, n0 = tn * BN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_m = warp / Cfg::WARPS_N, warp_n = warp % Cfg::WARPS_N;
  const int k_tiles = (p.K + BK - 1) / BK;

  // This lane's ldmatrix byte offsets inside a stage for k16 step 0 and the warp's first
  // mma tile; other steps and tiles add compile-time constants (immediates in the SASS).
  // x4 matrices, A: (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15);
  // B: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15). The MN-major
  // forms read the same matrices from k-rows of the [k][mn] tile, transposed by ldmatrix.
  const int lj = lane / 8, lr = lane % 8;
  const uint32_t a_lane =
      sizeof(T) * (A_KMAJOR ? (warp_m * Cfg::WM + lane % 16) * TA::PITCH + (lane / 16) * 8
                            : (lr + (lj / 2) * 8) * TA::PITCH + warp_m * Cfg::WM + (lj % 2) * 8);
  const uint32_t b_lane =
      sizeof(T) * (B_KMAJOR ? (warp_n * Cfg::WN + lr + (lj / 2) * 8) * TB::PITCH + (lj % 2) * 8
                            : (lr + (lj % 2) * 8) * TB::PITCH + warp_n * Cfg::WN + (lj / 2) * 8);
  // Byte steps between mma tiles (mi, pairs of ni) and k16 steps.
  constexpr uint32_t A_MI = sizeof(T) * (A_KMAJOR ? 16 * TA::PITCH : 16);
  constexpr uint32_t A_KK = sizeof(T) * (A_KMAJOR ? 16 : 16 * TA::PITCH);
  constexpr uint32_t B_NI2 = sizeof(T) * (B_KMAJOR ? 16 * TB::PITCH : 16);
  constexpr uint32_t B_KK = sizeof(T) * (B_KMAJOR ? 16 : 16 * TB::PITCH);

  auto load_frags = [&](uint32_t(&af)[MI][4], uint32_t(&bf)[NI][2], int stage, int step) {
    const uint32_t a = sA + stage * A_STAGE + a_lane + step * A_KK;
    const uint32_t b = sB + stage * B_STAGE + b_lane + step * B_KK;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) ldmatrix_x4<!A_KMAJOR>(af[mi], a + mi * A_MI);
#pragma unroll
    for (int ni = 0; ni < NI; ni += 2) {
      uint32_t t[4];
      ldmatrix_x4<!B_KMAJOR>(t, b + (ni / 2) * B_NI2);
      bf[ni][0] = t[0];
      bf[ni][1] = t[1];
      bf[ni + 1][0] = t[2];
      bf[ni + 1][1] = t[3];
    }
  };

  for (int batch = blockIdx.y; batch < p.batch; batch += gridDim.y) {
    const T* A = static_cast<const T*>(p.a) + batch * p.batch_stride_a;
    const T* B = static_cast<const T*>(p.b) + batch * p.batch_stride_b;

    // k-tiles are walked downwards: the first one is the last along K, the only one that
    // can be partial (see TileLoader).
    const int k_last = (k_tiles - 1) * BK;
    TileLoader<T, TA::ROWS, TA::COLS, TA::PITCH, Cfg::THREADS, A_KMAJOR> la(A, p.lda, m0, k_last,
                                                                            p.M);
    TileLoader<T, TB::ROWS, TB::COLS, TB::PITCH, Cfg::THREADS, B_KMAJOR> lb(B, p.ldb, n0, k_last,
                                                                            p.N);
    // Copies the next k-tile into stage and steps the loaders one k-tile down.
    auto load_next = [&](int stage, bool k_edge) {
      if (k_edge) {
        la.load_k_edge(sA + stage * A_STAGE, p.lda, p.K);
        lb.load_k_edge(sB + stage * B_STAGE, p.ldb, p.K);
      } else {
        la.load(sA + stage * A_STAGE, p.lda);
        lb.load(sB + stage * B_STAGE, p.ldb);
      }
      la.advance(-BK, p.lda);
      lb.advance(-BK, p.ldb);
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
      if (s < k_tiles) load_next(s, s == 0);
      cp_async_commit();
    }
    cp_async_wait<STAGES - 2>();  // tile 0 has landed (for this thread)...
    __syncthreads();              // ...for every thread

    uint32_t af[2][MI][4], bf[2][NI][2];
    int read_stage = 0, write_stage = STAGES - 1;
    load_frags(af[0], bf[0], 0, 0);
    for (int kt = 0; kt < k_tiles; ++kt) {
#pragma unroll
      for (int s = 0; s < KSTEPS; ++s) {
        if (s == KSTEPS - 1) {
          // Before the last step's mma: wait for tile kt + 1, whose first fragments are
          // loaded next; the barrier also frees the stage of tile kt (all its fragments are
          // in registers by now), which the next iteration's copies overwrite.
          cp_async_wait<STAGES - 2>();
          __syncthreads();
          read_stage = read_stage == STAGES - 1 ? 0 : read_stage + 1;
        }
        load_frags(af[(s + 1) % 2], bf[(s + 1) % 2], read_stage, (s + 1) % KSTEPS);
        if (s == 0) {
          if (kt + STAGES - 1 < k_tiles) load_next(write_stage, false);
          cp_async_commit();
          write_stage = write_stage == STAGES - 1 ? 0 : write_stage + 1;
        }
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
          for (int ni = 0; ni < NI; ++ni)
            mma_16816<T>(acc[mi][ni], af[s % 2][mi], bf[s % 2][ni][0], bf[s % 2][ni][1]);
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
