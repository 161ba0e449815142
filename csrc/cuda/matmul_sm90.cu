// The Hopper (sm_90a) GEMM: TMA bulk tensor loads into 128B-swizzled shared memory,
// completing on mbarriers; wgmma.mma_async reading both operands from shared memory through
// matrix descriptors; a producer warpgroup and two consumer warpgroups (setmaxnreg moves
// registers from the first to the others); a persistent grid walking tiles in grouped order
// (matmul_common.cuh: tile_coords); the same fused bias + activation epilogue as the
// portable kernel, each warp's 16 x 64 pieces written to shared memory and stored by TMA
// (or, where TMA cannot describe the output, N % 8 != 0, by the warp's own stores).
//
// Block tile BM x BN x BK = 128 x BN x 64 (BN = 256, or 128 for some problems with few
// tiles; choose_schedule, which also picks split-K for those):
// consumer warpgroup c owns rows [64c, 64c + 64) of the tile and issues m64nBNk16 wgmma, four
// per 64-wide K stage. STAGES shared-memory stages of (BM + BN) x 64 elements form a ring:
//   producer (one thread): wait empty[s] -> expect_tx(full[s], bytes) -> TMA A and B into s
//   consumers:             wait full[s] -> wgmma x4 -> commit; once the stage's wgmma have
//                          completed (one group kept in flight), arrive on empty[s].
// The producer runs ahead into the next tile while consumers store the current one; the
// TMA stores drain while the consumers start the next tile.
//
// Scope: each operand K-major (A [M, K] row-major; B given as [N, K] row-major, the weight of
// a linear layer) or MN-major (the backward pass: dX = dZ W reads W N-major, dW = dZ^T X reads
// both MN-major; wgmma transposes 16-bit MN-major tiles itself), all four combinations at
// both tile widths, 16-byte aligned base,
// leading dimension and batch stride (TMA's rules), K >= 1. TMA zero-fills the parts of a
// box outside the matrix (M, N, K edges) and clips its stores to it; the threads' stores are
// predicated. Anything else returns false and runs on the portable kernel.
//
// The kernel body exists only in the sm_90a compile pass (__CUDA_ARCH_FEAT_SM90_ALL, which
// nvcc defines for compute_90a); the host asks the runtime which PTX version the loaded kernel
// came from (cudaFuncGetAttributes: 90 only when sm_90a code was built and a CC 9.0 device
// runs it), so builds without sm_90a, or other GPUs, never launch an empty kernel.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <cuda.h>          // CUtensorMap and its enums (header only: no -lcuda)
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "common/launch.cuh"
#include "common/overrides.h"
#include "cuda/matmul/plan.h"
#include "cuda/matmul_sm90.h"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FUSED_SM90A 1
#endif

namespace fused {
namespace matmul {
namespace {

template <int BN_>
struct HopperConfig {
  static constexpr int BM = 128, BN = BN_, BK = 64;
  static constexpr int CONSUMERS = 2;  // warpgroups, 64 rows each
  static constexpr int THREADS = 128 * (CONSUMERS + 1);
  static constexpr int STAGES = BN == 256 ? 4 : 6;  // ~192 KB of the 227 KB either way
  static constexpr int A_ELEMS = BM * BK, B_ELEMS = BN * BK;
  static constexpr int STAGE_BYTES = (A_ELEMS + B_ELEMS) * 2;
  static constexpr int ACC = BN / 2;  // fp32 accumulators per thread
  static_assert(ACC * 128 == 64 * BN, "a warpgroup holds a 64 x BN fp32 tile");
  // Epilogue scratch: per consumer warp, EPI_BUFS pieces of 16 rows x 64 columns (128 B a
  // row), 128-byte swizzled as TMA reads them (16-byte chunk c of row r at chunk c ^ (r % 8)):
  // the accumulator layout's 4-byte writes and 16-byte row reads are both free of bank
  // conflicts. Two buffers so that a TMA store may still be reading one while the next piece
  // is written to the other.
  static constexpr int EPI_WARP_ELEMS = 16 * 64, EPI_BUFS = 2;
  static constexpr int EPI_BYTES = CONSUMERS * 4 * EPI_BUFS * EPI_WARP_ELEMS * 2;
  // Tiles, the epilogue scratch (both 1024-byte aligned: the swizzle atom), the full and
  // empty barriers; + 1024 to align the start.
  static constexpr int SMEM = STAGES * STAGE_BYTES + EPI_BYTES + 2 * STAGES * 8 + 1024;
  static_assert(SMEM <= 227 * 1024, "shared memory per block");
  static_assert(STAGE_BYTES % 1024 == 0 && EPI_WARP_ELEMS * 2 % 1024 == 0,
                "every stage and every scratch piece starts on a 1024-byte swizzle atom");
};

// Split-K (see the schedule at launch_layout): each output tile's K range is cut into
// `splits` consecutive pieces, one work unit each (unit = tile * splits + piece, so the pieces
// of a tile run at the same time on neighbouring blocks). Every piece writes its fp32
// accumulators to `partials`, in the consumers' register order (unit, float4 q, consumer
// thread), so each warp stores and loads 512 contiguous bytes and no layout changes hands;
// rows at or past M are skipped (decode shapes touch almost nothing). A per-tile counter
// says which piece finished last; that block sums every piece's partials in piece order
// 0, 1, ..., splits - 1 (the same order whichever block is last: deterministic, bit for bit)
// and runs the ordinary epilogue (bias, activation, TMA store). No block ever waits for
// another, so no co-residency is assumed.
struct SplitK {
  float* partials;  // [units][ACC / 4][256] float4; nullptr without split-K
  int* counters;    // [tiles], zero at the launch; each tile's last piece puts its back to 0
  int splits;       // 1 without split-K
};

#if defined(FUSED_SM90A)
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// Waits until the barrier's phase with the given parity has completed. On a fresh barrier
// the phase "before" the first one counts as completed, so waiting with parity 1 returns at
// once: the producer's first pass over the empty barriers does not block.
// A wait that spins for seconds means a protocol bug: trap (a launch error the host
// reports) rather than hang the process.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  uint32_t spins = 0;
  do {
    if (++spins == (1u << 26)) __trap();
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

// 3-D TMA tile load (coordinates innermost first: k, row, batch), completing on bar.
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar,
                                            int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// 3-D TMA tile store of a shared-memory piece (coordinates innermost first: column, row,
// batch); the parts of the box outside the tensor are not written. The calling thread's bulk
// group tracks it: commit after issuing, then wait until at most N groups are still reading
// their shared memory (.read: the global writes may still be on their way), or, before the
// block exits, until all have completed.
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, const void* src, int c0,
                                             int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::
          "l"(reinterpret_cast<uint64_t>(map)),
      "r"(smem_u32(src)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
// Makes this thread's shared-memory writes visible to the TMA unit (the async proxy).
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Synchronises the two consumer warpgroups (256 threads) alone: the producer warp never
// joins (barrier 0 is __syncthreads; 1 is this one).
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, 256;\n" ::: "memory");
}

// Shared-memory matrix descriptors (128-byte swizzle; tiles 1024-byte aligned). Both operand
// layouts are written by TMA boxes whose inner extent is 64 16-bit elements (128 B, one
// swizzle row):
//   K-major tile  [rows][64 k]: 8-row swizzle atoms 1024 B apart (stride byte offset); the
//                 leading byte offset is unused; k-step kk starts 32 B further (inside the
//                 atom, as the swizzle is a function of the address).
//   MN-major tile [mn / 64][64 k][64 mn]: one TMA box per 64-wide mn block, 8 KB apart (the
//                 leading byte offset); 8-k-row groups 1024 B apart (stride byte offset);
//                 k-step kk starts 16 rows (2 KB) further.
__device__ __forceinline__ uint64_t smem_desc(const void* p, uint32_t lbo, uint32_t sbo) {
  uint64_t d = (smem_u32(p) & 0x3FFFF) >> 4;
  d |= uint64_t(lbo >> 4) << 16;
  d |= uint64_t(sbo >> 4) << 32;
  d |= uint64_t(1) << 62;  // 128-byte swizzle
  return d;
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads/writes across wgmma issue and wait.
template <int N>
__device__ __forceinline__ void fence_acc(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The one asm statement behind wgmma_m64n256k16, for TYPE "bf16" or "f16".
#define FUSED_WGMMA_M64N256K16_ASM(TYPE)                                                           \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                                \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE                                 \
      " "                                                                                          \
      "{"                                                                                          \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                     \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "           \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "           \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "           \
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "           \
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "           \
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, "     \
      "%111, "                                                                                     \
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, " \
      "%127"                                                                                       \
      "}, %128, %129, p, 1, 1, %131, %132;\n}\n"                                                   \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),        \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), \
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), \
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), \
        "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), \
        "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), \
        "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), \
        "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), \
        "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), \
        "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),          \
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),        \
        "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]),        \
        "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]),        \
        "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])         \
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_A), "n"(TRANS_B));

// The one asm statement behind wgmma_m64n128k16, for TYPE "bf16" or "f16".
#define FUSED_WGMMA_M64N128K16_ASM(TYPE)                                                           \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                 \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE                                 \
      " "                                                                                          \
      "{"                                                                                          \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                     \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "           \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "           \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"             \
      "}, %64, %65, p, 1, 1, %67, %68;\n}\n"                                                       \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),        \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), \
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), \
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), \
        "+f"(d[63])                                                                                \
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_A), "n"(TRANS_B));

// d[128] += A(desc) * B(desc), m64n256k16, TRANS_A/B: 1 = that operand is MN-major.
template <typename T, int TRANS_A, int TRANS_B>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b,
                                                 int scale_d) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    FUSED_WGMMA_M64N256K16_ASM("bf16");
  } else {
    FUSED_WGMMA_M64N256K16_ASM("f16");
  }
}

// d[64] += A(desc) * B(desc), m64n128k16, TRANS_A/B: 1 = that operand is MN-major.
template <typename T, int TRANS_A, int TRANS_B>
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                 int scale_d) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    FUSED_WGMMA_M64N128K16_ASM("bf16");
  } else {
    FUSED_WGMMA_M64N128K16_ASM("f16");
  }
}

template <typename T, int BN, bool AK, bool BK>
__device__ __forceinline__ void wgmma_tile(float (&d)[BN / 2], uint64_t da, uint64_t db) {
  if constexpr (BN == 256) {
    wgmma_m64n256k16<T, AK ? 0 : 1, BK ? 0 : 1>(d, da, db, 1);
  } else {
    wgmma_m64n128k16<T, AK ? 0 : 1, BK ? 0 : 1>(d, da, db, 1);
  }
}

// Descriptor of k-step kk (16 deep) of an operand tile in its stage (see the layouts above).
template <bool KMAJOR, typename T>
__device__ __forceinline__ uint64_t operand_desc(const T* tile, int kk) {
  return KMAJOR ? smem_desc(tile + kk * 16, 16, 1024) : smem_desc(tile + kk * 16 * 64, 8192, 1024);
}

// Epilogue, through a 16 x 64 piece of the warp's shared-memory scratch (swizzled, see
// HopperConfig). write_scratch puts columns [64 jc, 64 jc + 64) of the warp's 16 accumulator
// rows there, bias added and ACT applied: accumulator 4j + {0, 1} is row lane/4, columns
// 8j + 2 (lane%4) + {0, 1}; 4j + {2, 3} the same columns 8 rows down (the same swizzle: rows
// r and r + 8 agree mod 8). jc is a constant after unrolling, so acc is indexed statically.
template <typename T, int ACT, int NACC>
__device__ __forceinline__ void write_scratch(T* piece, const float (&acc)[NACC], int jc,
                                              const float (&bias)[16], int lane) {
  using Pair = typename Elem<T>::pair;
  const int r = lane / 4, q = lane % 4;
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) {
    const int j = jc * 8 + jj;
    // The swizzled chunk, recomputed a step (one LOP3): hoisted, the eight offsets would be
    // held through the mainloop and spill.
    int sw = 8 * r;
    asm volatile("" : "+r"(sw));
    T* s = piece + r * 64 + ((8 * jj) ^ sw) + 2 * q;
    float v0 = acc[4 * j] + bias[2 * jj], v1 = acc[4 * j + 1] + bias[2 * jj + 1];
    float v2 = acc[4 * j + 2] + bias[2 * jj], v3 = acc[4 * j + 3] + bias[2 * jj + 1];
    act_pair_for<T, ACT>(v0, v1);
    act_pair_for<T, ACT>(v2, v3);
    *reinterpret_cast<Pair*>(s) = Elem<T>::pack(v0, v1);
    *reinterpret_cast<Pair*>(s + 8 * 64) = Elem<T>::pack(v2, v3);
  }
}

// Copies a 16 x 64 piece to out rows row0.., columns col0.. of batch b with the threads' own
// stores, the path for outputs TMA cannot describe (N % 8 != 0: rows start at any element,
// so element stores): each lane an 8-column chunk a step, 8 lanes a row; nothing outside
// M x N.
template <typename T>
__device__ __forceinline__ void scratch_to_global(const T* piece, T* out, const GemmProblem& p,
                                                  int b, int row0, int col0, int lane) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int id = i * 32 + lane;
    const int rr = id / 8, cc = id % 8;
    const int row = row0 + rr, col = col0 + 8 * cc;
    if (row >= p.M || col >= p.N) continue;
    const T* src = piece + rr * 64 + 8 * (cc ^ (rr % 8));
    T* dst = out + (static_cast<int64_t>(b) * p.M + row) * p.N + col;
#pragma unroll 1
    for (int e = 0; e < 8 && col + e < p.N; ++e) dst[e] = src[e];
  }
}

// Bias of columns n, n + 1 (load_bias_pair) as the bits of a 16-bit pair (exact: the values
// came from T), and back to two floats.
template <typename T>
__device__ __forceinline__ uint32_t load_bias_bits(const GemmProblem& p, int n) {
  float b0, b1;
  load_bias_pair<T>(p, n, b0, b1);
  const typename Elem<T>::pair v = Elem<T>::pack(b0, b1);
  uint32_t bits;
  memcpy(&bits, &v, 4);
  return bits;
}
// The gated tile's bias pair at columns n, n + 1 of half h (0: gate, 1: up) of a [2N] bias
// (0 past the half's end, or without bias), as load_bias_bits.
template <typename T>
__device__ __forceinline__ uint32_t load_gated_bias_bits(const GemmProblem& p, int h, int n) {
  float b0 = 0.f, b1 = 0.f;
  if (p.bias != nullptr) {
    const T* bias = static_cast<const T*>(p.bias) + static_cast<int64_t>(h) * p.N;
    if (n < p.N) b0 = Elem<T>::to_float(bias[n]);
    if (n + 1 < p.N) b1 = Elem<T>::to_float(bias[n + 1]);
  }
  const typename Elem<T>::pair v = Elem<T>::pack(b0, b1);
  uint32_t bits;
  memcpy(&bits, &v, 4);
  return bits;
}
template <typename T>
__device__ __forceinline__ void unpack_bits(uint32_t bits, float& x, float& y) {
  typename Elem<T>::pair v;
  memcpy(&v, &bits, 4);
  x = Elem<T>::to_float(v.x);
  y = Elem<T>::to_float(v.y);
}

// One piece stored by TMA, by the whole warp: write(piece) fills it. The pieces alternate
// between the warp's two buffers: the store issued two pieces ago must have read this one
// (lane 0 owns the bulk groups); every lane's writes are made visible to the TMA unit before
// lane 0 issues the store, which the warp does not wait for.
template <typename Cfg, typename T, typename Write>
__device__ __forceinline__ void tma_store_piece(T* warp_epi, int& n_stores, const CUtensorMap* map,
                                                Write&& write, int c0, int c1, int c2, int lane) {
  T* piece = warp_epi + (n_stores & 1) * Cfg::EPI_WARP_ELEMS;
  if (lane == 0) bulk_wait_read<1>();
  __syncwarp();
  write(piece);
  fence_proxy_async_shared();
  __syncwarp();
  if (lane == 0) {
    tma_store_3d(map, piece, c0, c1, c2);
    bulk_commit();
  }
  ++n_stores;
}

// One piece of one output (C, or Z before it), by the whole warp: by TMA (tma_store_piece),
// or through the scratch with the threads' own stores.
template <typename T, int ACT, typename Cfg, bool TMA_STORE, int NACC>
__device__ __forceinline__ void store_piece(T* warp_epi, int& n_stores, const CUtensorMap* map,
                                            T* out, const GemmProblem& p, const float (&acc)[NACC],
                                            int jc, const float (&bias)[16], int b, int row0,
                                            int col0, int lane) {
  if constexpr (TMA_STORE) {
    tma_store_piece<Cfg>(
        warp_epi, n_stores, map,
        [&](T* piece) { write_scratch<T, ACT>(piece, acc, jc, bias, lane); }, col0, row0, b, lane);
  } else {
    __syncwarp();  // the previous piece's reads are done
    write_scratch<T, ACT>(warp_epi, acc, jc, bias, lane);
    __syncwarp();
    scratch_to_global<T>(warp_epi, out, p, b, row0, col0, lane);
  }
}

// The k-tiles [begin, end) of piece `piece` of `splits`: k_tiles / splits each, the first
// k_tiles % splits one more (no products that could overflow).
__device__ __forceinline__ void k_range(int piece, int splits, int k_tiles, int& begin, int& end) {
  const int q = k_tiles / splits, r = k_tiles % splits;
  begin = piece * q + min(piece, r);
  end = begin + q + (piece < r ? 1 : 0);
}

// Split-K (SplitK): publishes this piece's accumulators and returns whether this block
// finishes the tile, in which case acc then holds the sum of every piece in piece order.
// ct: the consumer thread (0..255); has_row: this thread's first accumulator row (and so its
// whole float4s: rows r and r + 8, the latter past M whenever the former is) is inside M.
template <typename Cfg, int NACC>
__device__ __forceinline__ bool split_k_reduce(const SplitK& split, float (&acc)[NACC], int unit,
                                               int tile, int splits, int ct, bool has_row,
                                               int* last_piece) {
  constexpr int Q = NACC / 4;
  float4* mine = reinterpret_cast<float4*>(split.partials) + static_cast<int64_t>(unit) * Q * 256;
  if (has_row) {
#pragma unroll
    for (int q = 0; q < Q; ++q) {
      __stcg(mine + q * 256 + ct,
             make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]));
    }
  }
  __threadfence();  // this thread's partials are visible device-wide before the count
  consumers_sync();
  if (ct == 0) {
    const int done = atomicAdd(split.counters + tile, 1);
    __threadfence();  // acquire: the pieces counted before this one are visible
    *last_piece = done == splits - 1;
    // Every piece has counted: the counter is free again, zero for the next launch that
    // shares the workspace (split_workspace), which needs no memset.
    if (done == splits - 1) split.counters[tile] = 0;
  }
  consumers_sync();
  // The next unit's write of last_piece comes after its first consumers_sync, which every
  // thread reaches only after reading this one.
  if (!*last_piece) return false;
  __threadfence();  // the other pieces' partials, published before their counts, are seen
  if (has_row) {
    const float4* first = reinterpret_cast<const float4*>(split.partials) +
                          static_cast<int64_t>(tile) * splits * Q * 256;
#pragma unroll
    for (int q = 0; q < Q; ++q) {
      const float4 v = __ldcg(first + q * 256 + ct);
      acc[4 * q] = v.x;
      acc[4 * q + 1] = v.y;
      acc[4 * q + 2] = v.z;
      acc[4 * q + 3] = v.w;
    }
    for (int s = 1; s < splits; ++s) {
      const float4* part = first + static_cast<int64_t>(s) * Q * 256;
#pragma unroll
      for (int q = 0; q < Q; ++q) {
        const float4 v = __ldcg(part + q * 256 + ct);
        acc[4 * q] += v.x;
        acc[4 * q + 1] += v.y;
        acc[4 * q + 2] += v.z;
        acc[4 * q + 3] += v.w;
      }
    }
  }
  return true;
}
// Bias of this lane's column pair jj of a 64-column piece from the lane-held pairs `bits`
// (bias_lane in the kernel: lane l holds pair l). The source lane is made opaque to the
// compiler, so the shuffles are redone where used and not held as floats across the
// gated epilogue (which spilled with 32 bias floats live beside the 128 accumulators).
template <typename T>
__device__ __forceinline__ void bias_pair(uint32_t bits, int jj, int lane, float& b0, float& b1) {
  int src = 4 * jj + lane % 4;
  asm volatile("" : "+r"(src));
  unpack_bits<T>(__shfl_sync(0xffffffffu, bits, src), b0, b1);
}

// A Z piece of the gated epilogue: accumulator piece jc plus its bias (lane-held pairs).
template <typename T, int NACC>
__device__ __forceinline__ void write_scratch_z(T* piece, const float (&acc)[NACC], int jc,
                                                uint32_t bias_bits, int lane) {
  float bias[16];
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) bias_pair<T>(bias_bits, jj, lane, bias[2 * jj], bias[2 * jj + 1]);
  write_scratch<T, kActNone>(piece, acc, jc, bias, lane);
}

// The gated epilogue's output piece: act(gate) * up of the warp's 16 rows, output columns
// [64 jc, 64 jc + 64) of the tile's half width, from the accumulator's gate columns (piece jc)
// and up columns (piece jc + BN / 128, BN / 2 columns further: the same thread holds both,
// see write_scratch's layout), each with its bias (lane-held pairs gate_bits, up_bits).
template <typename T, int ACT, int BN, int NACC>
__device__ __forceinline__ void write_scratch_gated(T* piece, const float (&acc)[NACC], int jc,
                                                    uint32_t gate_bits, uint32_t up_bits,
                                                    int lane) {
  using Pair = typename Elem<T>::pair;
  const int r = lane / 4, q = lane % 4;
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) {
    const int j = jc * 8 + jj, ju = j + BN / 16;
    int sw = 8 * r;
    asm volatile("" : "+r"(sw));
    T* s = piece + r * 64 + ((8 * jj) ^ sw) + 2 * q;
    float bg0, bg1, bu0, bu1;
    bias_pair<T>(gate_bits, jj, lane, bg0, bg1);
    bias_pair<T>(up_bits, jj, lane, bu0, bu1);
    float g0 = acc[4 * j] + bg0, g1 = acc[4 * j + 1] + bg1;
    float g2 = acc[4 * j + 2] + bg0, g3 = acc[4 * j + 3] + bg1;
    gated_pair_for<T, ACT>(g0, g1, acc[4 * ju] + bu0, acc[4 * ju + 1] + bu1);
    gated_pair_for<T, ACT>(g2, g3, acc[4 * ju + 2] + bu0, acc[4 * ju + 3] + bu1);
    *reinterpret_cast<Pair*>(s) = Elem<T>::pack(g0, g1);
    *reinterpret_cast<Pair*>(s + 8 * 64) = Elem<T>::pack(g2, g3);
  }
}

// ---- the dact epilogue (DactEpilogue) ------------------------------------------------------
// The backward GEMM dH = dY W of a layer y = act(z) W^T + b, with act's derivative applied
// to the accumulator: dZ = dH * act'(Z) (Z read from memory, p.z), so dH never reaches
// memory. Gated (p.act a gated one): dH is [M, N], Z = [gate, up] and dZ = [dgate, dup] are
// [M, 2N], dgate = dH up act'(gate), dup = dH act(gate); the tile's output columns n give
// dZ columns n and N + n. Per warp piece (16 rows x 64 columns) each lane reads the Z pairs
// of its own accumulator elements (rows lane/4 and lane/4 + 8, columns 8 jj + 2 (lane%4) +
// {0, 1}: write_scratch's layout) straight from global memory, 4-byte loads issued together
// before any use.

// act'(z) of a plain activation (gelu, gelu_tanh).
template <typename T, int ACT>
__device__ __forceinline__ float dact_grad(float z) {
  if constexpr (ACT == kActGelu)
    return gelu_grad_for<T, GeluKind::kNone>(z);
  else if constexpr (ACT == kActGeluTanh)
    return gelu_grad_for<T, GeluKind::kTanh>(z);
  else
    return 1.f;
}

// The Z pairs of this lane's elements of one piece: rows row (and row + 8), columns
// col0 + 8 jj + 2 (lane % 4) of the matrix at z (row pitch ld); 0 outside M x N.
__device__ __forceinline__ void load_z_pairs(const void* z, int64_t ld, const GemmProblem& p,
                                             int row, int col0, int lane, uint32_t (&top)[8],
                                             uint32_t (&bottom)[8]) {
  const uint32_t* base = static_cast<const uint32_t*>(z);
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) {
    const int col = col0 + 8 * jj + 2 * (lane % 4);
    const bool in_n = col < p.N;  // N % 8 == 0 (the host's condition): the pair is whole
    const int64_t i = (static_cast<int64_t>(row) * ld + col) / 2;
    top[jj] = in_n && row < p.M ? __ldg(base + i) : 0u;
    bottom[jj] = in_n && row + 8 < p.M ? __ldg(base + i + 4 * ld) : 0u;
  }
}

// Column sums of a piece's two rows of this lane (s0, s1: columns 8 jj + 2 (lane%4) + {0,
// 1}) over the warp's 16 rows, added across the 8 lanes of each lane % 4 in a fixed order,
// stored by lanes 0..3 into partials row `block` (the warp's 16-row block), columns col..
__device__ __forceinline__ void store_col_sums(float* partials, int64_t width, int block, int col,
                                               float s0, float s1, int lane, bool store) {
#pragma unroll
  for (int o = 4; o < 32; o *= 2) {
    s0 += __shfl_xor_sync(0xffffffffu, s0, o);
    s1 += __shfl_xor_sync(0xffffffffu, s1, o);
  }
  if (store && lane < 4) {
    *reinterpret_cast<float2*>(partials + static_cast<int64_t>(block) * width + col) =
        make_float2(s0, s1);
  }
}

// One lane-held 16-bit pair, packed from two floats, into the swizzled scratch at this lane's
// place for column pair jj of row r (and, bottom, r + 8).
template <typename T>
__device__ __forceinline__ void scratch_pairs(T* piece, int jj, int lane, uint32_t top,
                                              uint32_t bottom) {
  const int r = lane / 4, q = lane % 4;
  int sw = 8 * r;
  asm volatile("" : "+r"(sw));
  T* s = piece + r * 64 + ((8 * jj) ^ sw) + 2 * q;
  *reinterpret_cast<uint32_t*>(s) = top;
  *reinterpret_cast<uint32_t*>(s + 8 * 64) = bottom;
}

template <typename T>
__device__ __forceinline__ uint32_t pack_bits(float x, float y) {
  const typename Elem<T>::pair v = Elem<T>::pack(x, y);
  uint32_t bits;
  memcpy(&bits, &v, 4);
  return bits;
}

// The Z pairs of piece jc of a tile (Z's columns of output columns [col0, col0 + 64)): plain,
// top / bottom rows in z[0..1]; gated, the gate pairs in z[0..1] and the up pairs (N columns
// further) in z[2..3].
__device__ __forceinline__ void load_dact_piece(const GemmProblem& p, bool gated, int row, int col0,
                                                int lane, uint32_t (&z)[4][8]) {
  const int64_t ld = gated ? 2 * static_cast<int64_t>(p.N) : p.N;
  load_z_pairs(p.z, ld, p, row, col0, lane, z[0], z[1]);
  if (gated) {
    const uint16_t* up = static_cast<const uint16_t*>(p.z) + p.N;
    load_z_pairs(up, ld, p, row, col0, lane, z[2], z[3]);
  }
}

// The plain dact epilogue of one tile: dZ [M, N] through map (TMA), column sums into partials
// (when given: [ceil(M / 16), N] floats). zbuf[0] holds piece 0's Z (loaded before the
// mainloop's last MMAs completed); each piece's loads are issued before the previous piece
// is computed and stored, so their latency hides behind it.
template <typename T, int ACT, typename Cfg, int NACC>
__device__ __forceinline__ void dact_tile(T* warp_epi, int& n_stores, const CUtensorMap* map,
                                          const GemmProblem& p, const float (&acc)[NACC],
                                          uint32_t (&zbuf)[2][4][8], float* partials, int tn,
                                          int row0, int lane) {
  const int row = row0 + lane / 4;
#pragma unroll
  for (int jc = 0; jc < Cfg::BN / 64; ++jc) {
    const int col0 = tn * Cfg::BN + 64 * jc;
    if (jc + 1 < Cfg::BN / 64) load_dact_piece(p, false, row, col0 + 64, lane, zbuf[(jc + 1) & 1]);
    uint32_t(&z)[4][8] = zbuf[jc & 1];
    tma_store_piece<Cfg>(
        warp_epi, n_stores, map,
        [&](T* piece) {
#pragma unroll
          for (int jj = 0; jj < 8; ++jj) {
            const int j = jc * 8 + jj;
            float a0, a1, b0, b1;
            unpack_bits<T>(z[0][jj], a0, a1);
            unpack_bits<T>(z[1][jj], b0, b1);
            a0 = acc[4 * j] * dact_grad<T, ACT>(a0);
            a1 = acc[4 * j + 1] * dact_grad<T, ACT>(a1);
            b0 = acc[4 * j + 2] * dact_grad<T, ACT>(b0);
            b1 = acc[4 * j + 3] * dact_grad<T, ACT>(b1);
            scratch_pairs<T>(piece, jj, lane, pack_bits<T>(a0, a1), pack_bits<T>(b0, b1));
            if (partials != nullptr) {
              const int col = col0 + 8 * jj + 2 * (lane % 4);
              store_col_sums(partials, p.N, row0 / 16, col, a0 + b0, a1 + b1, lane,
                             row0 < p.M && col < p.N);
            }
          }
        },
        col0, row0, 0, lane);
  }
}

// The gated dact epilogue of one tile: dZ [M, 2N] through map (make_gated_z_map: the gate
// half at batch coordinate 0, the up half at 1), column sums into partials ([ceil(M / 16),
// 2N] floats) when given. dup is packed to 16-bit pairs (over the up pairs, used by then)
// while dgate is stored, then stored. One Z buffer (32 registers beside the accumulators:
// no spills, ptxas -v): zbuf[0] holds piece 0's pairs, loaded before the mainloop's last MMAs
// completed; later pieces' loads are issued once the previous piece is in shared memory.
template <typename T, int ACT, typename Cfg, int NACC>
__device__ __forceinline__ void dact_gated_tile(T* warp_epi, int& n_stores, const CUtensorMap* map,
                                                const GemmProblem& p, const float (&acc)[NACC],
                                                uint32_t (&zbuf)[2][4][8], float* partials, int tn,
                                                int row0, int lane) {
  constexpr GatedKind K = ACT == kActSwiglu  ? GatedKind::kSilu
                          : ACT == kActGeglu ? GatedKind::kGelu
                                             : GatedKind::kGeluTanh;
  const int row = row0 + lane / 4;
  const int64_t ld = 2 * static_cast<int64_t>(p.N);
#pragma unroll
  for (int jc = 0; jc < Cfg::BN / 64; ++jc) {
    const int col0 = tn * Cfg::BN + 64 * jc;
    uint32_t(&z)[4][8] = zbuf[0];
    tma_store_piece<Cfg>(
        warp_epi, n_stores, map,
        [&](T* piece) {
#pragma unroll
          for (int jj = 0; jj < 8; ++jj) {
            const int j = jc * 8 + jj;
            float g[4], u[4], dg[4], du[4];
            unpack_bits<T>(z[0][jj], g[0], g[1]);
            unpack_bits<T>(z[1][jj], g[2], g[3]);
            unpack_bits<T>(z[2][jj], u[0], u[1]);
            unpack_bits<T>(z[3][jj], u[2], u[3]);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              float a, da;
              gated_act_and_grad_for<T, K>(g[e], a, da);
              dg[e] = acc[4 * j + e] * u[e] * da;
              du[e] = acc[4 * j + e] * a;
            }
            scratch_pairs<T>(piece, jj, lane, pack_bits<T>(dg[0], dg[1]),
                             pack_bits<T>(dg[2], dg[3]));
            z[2][jj] = pack_bits<T>(du[0], du[1]);
            z[3][jj] = pack_bits<T>(du[2], du[3]);
            if (partials != nullptr) {
              const int col = col0 + 8 * jj + 2 * (lane % 4);
              const bool store = row0 < p.M && col < p.N;
              store_col_sums(partials, ld, row0 / 16, col, dg[0] + dg[2], dg[1] + dg[3], lane,
                             store);
              store_col_sums(partials, ld, row0 / 16, p.N + col, du[0] + du[2], du[1] + du[3], lane,
                             store);
            }
          }
        },
        col0, row0, 0, lane);
    tma_store_piece<Cfg>(
        warp_epi, n_stores, map,
        [&](T* piece) {
#pragma unroll
          for (int jj = 0; jj < 8; ++jj) scratch_pairs<T>(piece, jj, lane, z[2][jj], z[3][jj]);
        },
        col0, row0, 1, lane);
    if (jc + 1 < Cfg::BN / 64) load_dact_piece(p, true, row, col0 + 64, lane, z);
  }
}
#endif  // FUSED_SM90A

// The epilogue variant, a type so that it shows in the kernel's name (the tests read it):
// PlainEpilogue (C = act(A B + bias)); GatedEpilogue (weight [2N, K]: each tile's B holds
// the BN / 2 gate rows of its output columns, then the same up rows, N further; C =
// act(gate) * up, [M, N]; Z [M, 2N] through a map of its two halves as a batch of 2).
struct PlainEpilogue {
  static constexpr bool kGated = false;
  static constexpr bool kDact = false;
};
struct GatedEpilogue {
  static constexpr bool kGated = true;
  static constexpr bool kDact = false;
};
// DactEpilogue (the backward's dZ = (A B) * act'(Z), Z read from p.z; see dact_tile) and
// GatedDactEpilogue (gated p.act: dact_gated_tile), apart so that the plain one's registers
// are not sized by the gated one's: TMA stores, no split-K, whose SplitK argument instead
// carries the column-sum partials (or nullptr).
struct DactEpilogue {
  static constexpr bool kGated = false;
  static constexpr bool kDact = true;
  static constexpr bool kDactGated = false;
};
struct GatedDactEpilogue {
  static constexpr bool kGated = false;
  static constexpr bool kDact = true;
  static constexpr bool kDactGated = true;
};

// SPLIT: the split-K schedule (SplitK above); only with TMA stores (the host asks for it only
// there), and a template parameter so that a profiler's kernel name says which schedule ran.
template <typename T, typename Cfg, bool AK, bool BK_MAJ, bool TMA_STORE, bool SPLIT = false,
          typename EPI = PlainEpilogue>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
    hopper_gemm_kernel(const __grid_constant__ CUtensorMap map_a,
                       const __grid_constant__ CUtensorMap map_b,
                       const __grid_constant__ CUtensorMap map_c,
                       const __grid_constant__ CUtensorMap map_z, const GemmProblem p,
                       const SplitK split) {
#if defined(FUSED_SM90A)
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, STAGES = Cfg::STAGES;
  extern __shared__ unsigned char smem_raw[];
  // Tiles aligned to the 1024-byte swizzle atom; pointer arithmetic on smem_raw (not integer
  // casts) keeps these pointers known as shared memory, so the epilogue's scratch accesses
  // compile to STS/LDS rather than generic stores and loads.
  T* sA = reinterpret_cast<T*>(smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023));
  T* sB = sA + STAGES * Cfg::A_ELEMS;
  T* epi = sB + STAGES * Cfg::B_ELEMS;
  uint64_t* full =
      reinterpret_cast<uint64_t*>(epi + Cfg::CONSUMERS * 4 * Cfg::EPI_BUFS * Cfg::EPI_WARP_ELEMS);
  uint64_t* empty = full + STAGES;
  // The split-K verdict (is this block's piece the tile's last?) handed to every consumer.
  __shared__ int last_piece;

  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&full[s], 1);                      // the producer's expect_tx arrival
      mbar_init(&empty[s], Cfg::CONSUMERS * 128);  // every consumer thread
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  constexpr bool GATED = EPI::kGated;
  constexpr int TILE_N = GATED ? BN / 2 : BN;  // output columns a tile
  static_assert(!GATED || (AK && BK_MAJ && TMA_STORE), "the gated epilogue: K-major, TMA stores");
  const int tiles_m = (p.M + BM - 1) / BM, tiles_n = (p.N + TILE_N - 1) / TILE_N;
  const int tiles_per_batch = tiles_m * tiles_n;
  const int k_tiles = (p.K + BK - 1) / BK;
  const int splits = SPLIT ? split.splits : 1;
  const int total = tiles_per_batch * p.batch * splits;  // work units
  const int wg = threadIdx.x / 128;

  if (wg == 0) {
    // Producer warpgroup: gives registers away; one thread issues every TMA load.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (threadIdx.x != 0) return;
    int it = 0;
    for (int unit = blockIdx.x; unit < total; unit += gridDim.x) {
      const int tile = unit / splits, piece = unit - tile * splits;
      const int b = tile / tiles_per_batch;
      int tm, tn;
      tile_coords(tile - b * tiles_per_batch, tiles_m, tiles_n, p.group_m, tm, tn);
      const int ba = p.batch_stride_a != 0 ? b : 0, bb = p.batch_stride_b != 0 ? b : 0;
      int kt, kt_end;
      k_range(piece, splits, k_tiles, kt, kt_end);
      for (; kt < kt_end; ++kt, ++it) {
        const int s = it % STAGES;
        mbar_wait(&empty[s], ((it / STAGES) & 1) ^ 1);
        mbar_expect_tx(&full[s], Cfg::STAGE_BYTES);
        // A K-major: one box {64 k, BM rows}; MN-major: BM / 64 boxes {64 m, 64 k}.
        if constexpr (AK) {
          tma_load_3d(sA + s * Cfg::A_ELEMS, &map_a, &full[s], kt * BK, tm * BM, ba);
        } else {
#pragma unroll
          for (int i = 0; i < BM / 64; ++i) {
            tma_load_3d(sA + s * Cfg::A_ELEMS + i * 64 * BK, &map_a, &full[s], tm * BM + i * 64,
                        kt * BK, ba);
          }
        }
        if constexpr (GATED) {
          // Gate rows [tn BN/2, +BN/2), then the same up rows (N further): boxes of BN / 2 rows.
          // A gate box past row N reads up rows, whose columns are never stored.
          tma_load_3d(sB + s * Cfg::B_ELEMS, &map_b, &full[s], kt * BK, tn * TILE_N, bb);
          tma_load_3d(sB + s * Cfg::B_ELEMS + TILE_N * BK, &map_b, &full[s], kt * BK,
                      p.N + tn * TILE_N, bb);
        } else if constexpr (BK_MAJ) {
          tma_load_3d(sB + s * Cfg::B_ELEMS, &map_b, &full[s], kt * BK, tn * BN, bb);
        } else {
#pragma unroll
          for (int i = 0; i < BN / 64; ++i) {
            tma_load_3d(sB + s * Cfg::B_ELEMS + i * 64 * BK, &map_b, &full[s], tn * BN + i * 64,
                        kt * BK, bb);
          }
        }
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int c = wg - 1;  // consumer index: rows [64c, 64c + 64)
    const int t = threadIdx.x % 128;
    const int lane = t % 32, warp = t / 32;
    float acc[Cfg::ACC];
    T* warp_epi = epi + (c * 4 + warp) * Cfg::EPI_BUFS * Cfg::EPI_WARP_ELEMS;
    int n_stores = 0;  // TMA stores this warp has issued (which buffer is next)
    int it = 0;
    for (int unit = blockIdx.x; unit < total; unit += gridDim.x) {
      const int tile = unit / splits, piece = unit - tile * splits;
      const int b = tile / tiles_per_batch;
      int tm, tn;
      tile_coords(tile - b * tiles_per_batch, tiles_m, tiles_n, p.group_m, tm, tn);
#pragma unroll
      for (int i = 0; i < Cfg::ACC; ++i) acc[i] = 0.f;
      // The tile's bias, loaded now so that the loads' latency hides under the mainloop:
      // lane l of every consumer warp holds column pairs l, l + 32, ... as 16-bit pairs (BN / 64
      // registers through the mainloop; as floats, twice that); the epilogue shuffles each
      // lane its pairs.
      uint32_t bias_lane[BN / 64];
#pragma unroll
      for (int i = 0; i < BN / 64; ++i) {
        if constexpr (GATED) {  // i < BN / 128: gate columns; then the up columns
          const int h = i >= BN / 128;
          bias_lane[i] =
              load_gated_bias_bits<T>(p, h, tn * TILE_N + 2 * (lane + 32 * i) - h * TILE_N);
        } else {
          bias_lane[i] = load_bias_bits<T>(p, tn * BN + 2 * (lane + 32 * i));
        }
      }
      int prev = -1;
      int kt, kt_end;
      k_range(piece, splits, k_tiles, kt, kt_end);
      for (; kt < kt_end; ++kt, ++it) {
        const int s = it % STAGES;
        mbar_wait(&full[s], (it / STAGES) & 1);
        // This consumer's 64 rows: 64 K-major rows, or the c-th 64-wide MN-major block (the
        // same 4096-element offset either way).
        const T* a_s = sA + s * Cfg::A_ELEMS + c * 64 * BK;
        const T* b_s = sB + s * Cfg::B_ELEMS;
        fence_acc(acc);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
          wgmma_tile<T, BN, AK, BK_MAJ>(acc, operand_desc<AK>(a_s, kk),
                                        operand_desc<BK_MAJ>(b_s, kk));
        }
        wgmma_commit();
        fence_acc(acc);
        // Keep this stage's group in flight; the previous one is done: release its stage.
        wgmma_wait<1>();
        if (prev >= 0) mbar_arrive(&empty[prev]);
        prev = s;
      }
      const int row0 = tm * BM + c * 64 + warp * 16;
      // The dact epilogue's first Z piece, loaded while the last MMAs run.
      uint32_t zbuf[EPI::kDact ? 2 : 1][4][8];
      if constexpr (EPI::kDact) {
        load_dact_piece(p, EPI::kDactGated, row0 + lane / 4, tn * BN, lane, zbuf[0]);
      }
      wgmma_wait<0>();
      fence_acc(acc);
      if (prev >= 0) mbar_arrive(&empty[prev]);
      if constexpr (SPLIT) {
        if (!split_k_reduce<Cfg>(split, acc, unit, tile, splits, t + 128 * c, row0 + lane / 4 < p.M,
                                 &last_piece)) {
          continue;  // another piece of this tile finishes it
        }
      }
      if constexpr (EPI::kDact) {
        static_assert(TMA_STORE && !SPLIT, "the dact epilogue: TMA stores, no split-K");
        if constexpr (EPI::kDactGated) {
          dispatch_gated_act(p.act, [&](auto act) {
            dact_gated_tile<T, decltype(act)::value, Cfg>(warp_epi, n_stores, &map_c, p, acc, zbuf,
                                                          split.partials, tn, row0, lane);
          });
        } else if (p.act == kActGelu) {
          dact_tile<T, kActGelu, Cfg>(warp_epi, n_stores, &map_c, p, acc, zbuf, split.partials, tn,
                                      row0, lane);
        } else {
          dact_tile<T, kActGeluTanh, Cfg>(warp_epi, n_stores, &map_c, p, acc, zbuf, split.partials,
                                          tn, row0, lane);
        }
        continue;
      }
      // Epilogue: per 64-column piece, bias + activation into the warp's scratch, then to
      // global memory (the pre-activation first when the backward pass wants it).
      T* out_c = static_cast<T*>(p.c);
      T* out_z = static_cast<T*>(p.z);
      if constexpr (GATED) {
        // Per 64 output columns: Z's gate and up pieces (halves 0 and 1 of map_z), then C.
        dispatch_gated_act(p.act, [&](auto act) {
          constexpr int ACT = decltype(act)::value;
#pragma unroll
          for (int jc = 0; jc < BN / 128; ++jc) {
            const int col0 = tn * TILE_N + 64 * jc;
            const uint32_t gate_bits = bias_lane[jc], up_bits = bias_lane[jc + BN / 128];
            if (out_z != nullptr) {
              tma_store_piece<Cfg>(
                  warp_epi, n_stores, &map_z,
                  [&](T* piece) { write_scratch_z(piece, acc, jc, gate_bits, lane); }, col0, row0,
                  0, lane);
              tma_store_piece<Cfg>(
                  warp_epi, n_stores, &map_z,
                  [&](T* piece) { write_scratch_z(piece, acc, jc + BN / 128, up_bits, lane); },
                  col0, row0, 1, lane);
            }
            tma_store_piece<Cfg>(
                warp_epi, n_stores, &map_c,
                [&](T* piece) {
                  write_scratch_gated<T, ACT, BN>(piece, acc, jc, gate_bits, up_bits, lane);
                },
                col0, row0, b, lane);
          }
        });
        continue;  // the plain epilogue below is not this kernel's
      }
      dispatch_act(p.act, [&](auto act) {
        constexpr int ACT = decltype(act)::value;
#pragma unroll
        for (int jc = 0; jc < BN / 64; ++jc) {
          const int col0 = tn * BN + 64 * jc;
          // This lane's columns 8 jj + 2 (lane % 4) + {0, 1}: tile column pair
          // 32 jc + 4 jj + lane % 4, which lane 4 jj + lane % 4 holds in bias_lane[jc].
          float bias[16];
#pragma unroll
          for (int jj = 0; jj < 8; ++jj) {
            unpack_bits<T>(__shfl_sync(0xffffffffu, bias_lane[jc], 4 * jj + lane % 4), bias[2 * jj],
                           bias[2 * jj + 1]);
          }
          if (out_z != nullptr) {
            store_piece<T, kActNone, Cfg, TMA_STORE>(warp_epi, n_stores, &map_z, out_z, p, acc, jc,
                                                     bias, b, row0, col0, lane);
          }
          store_piece<T, ACT, Cfg, TMA_STORE>(warp_epi, n_stores, &map_c, out_c, p, acc, jc, bias,
                                              b, row0, col0, lane);
        }
      });
    }
    // The scratch must outlive the stores that read it.
    if (TMA_STORE && lane == 0) bulk_wait_all();
  }
#endif  // FUSED_SM90A
}

// ---------------------------------------------------------------------------------------
// Host side.

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q;
    cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                                     cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      f = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// An operand [batch?, rows, k] as a 3-D tensor map, 128-byte swizzled, innermost dimension
// first: K-major {k, rows, batch} with boxes {64, box_rows, 1}; MN-major {rows, k, batch}
// with boxes {64, 64, 1}. A broadcast operand (batch stride 0) gets a batch extent of 1.
bool make_map(CUtensorMap* map, const void* ptr, bool kmajor, int64_t k, int64_t rows,
              int64_t batch, int64_t ld, int64_t batch_stride, int box_rows, at::ScalarType dtype,
              CUtensorMapL2promotion promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B) {
  auto encode = encode_fn();
  if (encode == nullptr) return false;
  const int64_t esize = 2;
  const int64_t inner = kmajor ? k : rows, outer = kmajor ? rows : k;
  cuuint64_t dims[3] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(outer),
                        static_cast<cuuint64_t>(batch_stride != 0 ? batch : 1)};
  cuuint64_t strides[2] = {
      static_cast<cuuint64_t>(ld * esize),
      static_cast<cuuint64_t>((batch_stride != 0 ? batch_stride : ld * outer) * esize)};
  cuuint32_t box[3] = {64, static_cast<cuuint32_t>(kmajor ? box_rows : 64), 1};
  cuuint32_t elem_strides[3] = {1, 1, 1};
  CUresult r = encode(
      map,
      dtype == at::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
      3, const_cast<void*>(ptr), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

// An output [batch, M, N] (dense, row-major) as make_map lays out a K-major operand with N in
// the place of K: {N, M, batch}, 16 x 64 boxes, 128-byte swizzled as the epilogue scratch is.
// False where TMA cannot describe it: a row pitch that is not a multiple of 16 bytes
// (N % 8 != 0) or a misaligned base, checked here rather than left to the encoder (whose
// refusal compute-sanitizer reports as an API error on every such call).
bool make_out_map(CUtensorMap* map, void* ptr, int64_t m, int64_t n, int64_t batch,
                  at::ScalarType dtype) {
  if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0 || n % 8 != 0) return false;
  return make_map(map, ptr, true, n, m, batch, n, m * n, 16, dtype,
                  CU_TENSOR_MAP_L2_PROMOTION_NONE);
}

// The gated linear's Z [M, 2N] as the two halves of each row, a batch of 2: {N, M, 2} with
// row pitch 2N and batch stride N elements (16-byte multiples: N % 8 == 0), so that a piece
// of half h is stored at batch coordinate h and clipped at the half's N columns.
bool make_gated_z_map(CUtensorMap* map, void* ptr, int64_t m, int64_t n, at::ScalarType dtype) {
  if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0 || n % 8 != 0) return false;
  return make_map(map, ptr, true, n, m, 2, 2 * n, n, 16, dtype, CU_TENSOR_MAP_L2_PROMOTION_NONE);
}

// Whether this device runs the kernel's sm_90a code: a CC 9.0 GPU and code built for it
// (ptxVersion 90 only when sm_90a code was built; see the top of this file).
template <typename Kernel>
bool has_sm90a_code(Kernel kernel) {
  return cached_launch_query(reinterpret_cast<const void*>(kernel), 0, 0, [&] {
           const auto* prop = at::cuda::getCurrentDeviceProperties();
           cudaFuncAttributes attr;
           const bool ok = prop->major == 9 && prop->minor == 0 &&
                           cudaFuncGetAttributes(&attr, kernel) == cudaSuccess &&
                           attr.ptxVersion == 90;
           (void)cudaGetLastError();
           return ok ? 1 : 0;
         }) != 0;
}

// Split-K's fp32 partials and per-tile counters. Outside graph capture: one workspace per
// (device, stream), kept and grown across calls, whose counters are zeroed once when
// allocated and are zero between launches (the last piece of each tile resets its own), so a
// call launches the GEMM alone, no memset. Launches on one stream run in order, so they can
// share it; another stream gets its own. A grown buffer replaces the old one through the
// caching allocator, which reuses the old memory only after the stream's earlier work.
// Under capture (a CUDA graph): buffers of the call itself (partials, counters keep them
// until the launch is recorded), zeroed by a memset the graph records and replays, since a
// workspace made or zeroed at capture time would hold nothing real until replay.
SplitK split_workspace(int64_t partial_floats, int64_t tiles, cudaStream_t stream,
                       at::Tensor& partials, at::Tensor& counters) {
  const auto opts = at::TensorOptions().device(at::kCUDA, at::cuda::current_device());
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    partials = at::empty({partial_floats}, opts.dtype(at::kFloat));
    counters = at::zeros({tiles}, opts.dtype(at::kInt));
    return {partials.mutable_data_ptr<float>(), counters.mutable_data_ptr<int>(), 1};
  }
  struct Workspace {
    at::Tensor partials, counters;
  };
  static std::mutex mutex;
  static std::map<std::pair<int, cudaStream_t>, Workspace> spaces;
  std::lock_guard<std::mutex> lock(mutex);
  Workspace& w = spaces[{at::cuda::current_device(), stream}];
  if (!w.partials.defined() || w.partials.numel() < partial_floats) {
    w.partials = at::empty({partial_floats}, opts.dtype(at::kFloat));
  }
  if (!w.counters.defined() || w.counters.numel() < tiles) {
    w.counters = at::zeros({tiles}, opts.dtype(at::kInt));
  }
  return {w.partials.mutable_data_ptr<float>(), w.counters.mutable_data_ptr<int>(), 1};
}

template <typename T, typename Cfg, bool AK, bool BK>
Sm90Result launch(const GemmProblem& p, at::ScalarType dtype, cudaStream_t stream, int splits) {
  if (!has_sm90a_code(hopper_gemm_kernel<T, Cfg, AK, BK, true>) || encode_fn() == nullptr) {
    return Sm90Result::kUnavailable;
  }
  const int64_t tiles =
      ((p.M + Cfg::BM - 1) / Cfg::BM) * int64_t((p.N + Cfg::BN - 1) / Cfg::BN) * p.batch;
  if (tiles * splits >= (int64_t(1) << 31)) return Sm90Result::kNotApplicable;
  CUtensorMap map_a, map_b;
  if (!make_map(&map_a, p.a, AK, p.K, p.M, p.batch, p.lda, p.batch_stride_a, Cfg::BM, dtype) ||
      !make_map(&map_b, p.b, BK, p.K, p.N, p.batch, p.ldb, p.batch_stride_b, Cfg::BN, dtype)) {
    return Sm90Result::kNotApplicable;  // TMA refused these strides
  }
  // The epilogue stores through TMA where both outputs allow it (Z only when the backward
  // pass wants it), else with the threads' own stores.
  CUtensorMap map_c{}, map_z{};
  const bool tma_store = make_out_map(&map_c, p.c, p.M, p.N, p.batch, dtype) &&
                         (p.z == nullptr || make_out_map(&map_z, p.z, p.M, p.N, p.batch, dtype));
  if (!tma_store) splits = 1;  // split-K is compiled with TMA stores only (choose_schedule)
  auto kernel = splits > 1  ? hopper_gemm_kernel<T, Cfg, AK, BK, true, true>
                : tma_store ? hopper_gemm_kernel<T, Cfg, AK, BK, true>
                            : hopper_gemm_kernel<T, Cfg, AK, BK, false>;
  if (!allow_dynamic_smem_once(kernel, Cfg::SMEM)) return Sm90Result::kUnavailable;
  SplitK split{nullptr, nullptr, 1};
  at::Tensor partials, counters;  // a graph capture's own buffers (split_workspace)
  if (splits > 1) {
    split = split_workspace(tiles * splits * Cfg::BM * Cfg::BN, tiles, stream, partials, counters);
    split.splits = splits;
  }
  const int sms = num_sms();
  const int grid = static_cast<int>(std::min<int64_t>(tiles * splits, sms));
  kernel<<<grid, Cfg::THREADS, Cfg::SMEM, stream>>>(map_a, map_b, map_c, map_z, p, split);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return Sm90Result::kLaunched;
}

// Every operand layout, K-major or MN-major each (wgmma transposes 16-bit MN-major tiles):
// A K-major with B K-major (forward), with B MN-major (dX = dZ W); A MN-major with B
// MN-major (dW = dZ^T X), with B K-major (a transposed input times a linear weight).
template <typename T, typename Cfg>
Sm90Result launch_cfg(const GemmProblem& p, at::ScalarType dtype, cudaStream_t stream, int splits) {
  if (p.a_kmajor) {
    return p.b_kmajor ? launch<T, Cfg, true, true>(p, dtype, stream, splits)
                      : launch<T, Cfg, true, false>(p, dtype, stream, splits);
  }
  return p.b_kmajor ? launch<T, Cfg, false, true>(p, dtype, stream, splits)
                    : launch<T, Cfg, false, false>(p, dtype, stream, splits);
}

// The gated epilogue (GatedEpilogue): both operands K-major, p.N the output's width (B has
// 2 p.N rows), one matrix, outputs that TMA can store (else the caller composes the GEMM and
// the gated kernel).
template <typename T, typename Cfg>
Sm90Result launch_gated(const GemmProblem& p, at::ScalarType dtype, cudaStream_t stream) {
  auto kernel = hopper_gemm_kernel<T, Cfg, true, true, true, false, GatedEpilogue>;
  if (!has_sm90a_code(kernel) || encode_fn() == nullptr) return Sm90Result::kUnavailable;
  constexpr int TILE_N = Cfg::BN / 2;
  const int64_t tiles = ((p.M + Cfg::BM - 1) / Cfg::BM) * int64_t((p.N + TILE_N - 1) / TILE_N);
  if (p.batch != 1 || tiles >= (int64_t(1) << 31)) return Sm90Result::kNotApplicable;
  CUtensorMap map_a, map_b, map_c{}, map_z{};
  if (!make_map(&map_a, p.a, true, p.K, p.M, 1, p.lda, 0, Cfg::BM, dtype) ||
      !make_map(&map_b, p.b, true, p.K, 2 * int64_t(p.N), 1, p.ldb, 0, TILE_N, dtype) ||
      !make_out_map(&map_c, p.c, p.M, p.N, 1, dtype) ||
      (p.z != nullptr && !make_gated_z_map(&map_z, p.z, p.M, p.N, dtype))) {
    return Sm90Result::kNotApplicable;
  }
  if (!allow_dynamic_smem_once(kernel, Cfg::SMEM)) return Sm90Result::kUnavailable;
  const int grid = static_cast<int>(std::min<int64_t>(tiles, num_sms()));
  kernel<<<grid, Cfg::THREADS, Cfg::SMEM, stream>>>(map_a, map_b, map_c, map_z, p,
                                                    SplitK{nullptr, nullptr, 1});
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return Sm90Result::kLaunched;
}

template <typename T>
Sm90Result launch_layout(const GemmProblem& p, at::ScalarType dtype, cudaStream_t stream) {
  if (p.act >= kActSwiglu) {
    if (!p.a_kmajor || !p.b_kmajor) return Sm90Result::kNotApplicable;
    // 128 x 256 tiles (128 output columns) when that gives every SM a tile, as below.
    const bool wide_gated = ((p.M + 127) / 128) * int64_t((p.N + 127) / 128) >= num_sms();
    return wide_gated ? launch_gated<T, HopperConfig<256>>(p, dtype, stream)
                      : launch_gated<T, HopperConfig<128>>(p, dtype, stream);
  }
  const Overrides& o = overrides();
  // Split-K finishes through the TMA store path only: a 16-byte aligned output (and
  // pre-activation) with N % 8 == 0 (make_out_map's conditions).
  const auto aligned16 = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  const bool split_ok = p.N % 8 == 0 && aligned16(p.c) && (p.z == nullptr || aligned16(p.z));
  const Schedule s = choose_schedule(p.M, p.N, p.K, p.batch, num_sms(), split_ok, o);
  return s.bn == 256 ? launch_cfg<T, HopperConfig<256>>(p, dtype, stream, s.splits)
                     : launch_cfg<T, HopperConfig<128>>(p, dtype, stream, s.splits);
}

// The dact epilogue (DactEpilogue): A K-major (dY), B MN-major (the layer's weight [K = out,
// N = in] read in place), one matrix; p.c is dZ ([M, N], or [M, 2N] for a gated p.act), p.z
// the saved Z (same shape), both 16-byte aligned with N % 8 == 0 (else the caller composes).
// partials: [ceil(M / 16), dZ's width] floats for the column sums, or nullptr.
template <typename T, typename Cfg, typename EPI>
Sm90Result launch_dact_cfg(const GemmProblem& p, float* partials, at::ScalarType dtype,
                           cudaStream_t stream) {
  auto kernel = hopper_gemm_kernel<T, Cfg, true, false, true, false, EPI>;
  if (!has_sm90a_code(kernel) || encode_fn() == nullptr) return Sm90Result::kUnavailable;
  const int64_t tiles = ((p.M + Cfg::BM - 1) / Cfg::BM) * int64_t((p.N + Cfg::BN - 1) / Cfg::BN);
  if (p.batch != 1 || tiles >= (int64_t(1) << 31)) return Sm90Result::kNotApplicable;
  if (reinterpret_cast<uintptr_t>(p.z) % 16 != 0 || p.N % 8 != 0) {
    return Sm90Result::kNotApplicable;
  }
  const bool gated = EPI::kDactGated;
  CUtensorMap map_a, map_b, map_c{}, map_z{};
  if (!make_map(&map_a, p.a, true, p.K, p.M, 1, p.lda, 0, Cfg::BM, dtype) ||
      !make_map(&map_b, p.b, false, p.K, p.N, 1, p.ldb, 0, Cfg::BN, dtype) ||
      !(gated ? make_gated_z_map(&map_c, p.c, p.M, p.N, dtype)
              : make_out_map(&map_c, p.c, p.M, p.N, 1, dtype))) {
    return Sm90Result::kNotApplicable;
  }
  if (!allow_dynamic_smem_once(kernel, Cfg::SMEM)) return Sm90Result::kUnavailable;
  const int grid = static_cast<int>(std::min<int64_t>(tiles, num_sms()));
  kernel<<<grid, Cfg::THREADS, Cfg::SMEM, stream>>>(map_a, map_b, map_c, map_z, p,
                                                    SplitK{partials, nullptr, 1});
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return Sm90Result::kLaunched;
}

// 128 x 128 tiles: with 128 x 256 the accumulators (128 registers) beside the Z pairs
// spilled (3.6 KB a thread); 128 x 128 leaves them room.
template <typename T>
Sm90Result launch_dact_layout(const GemmProblem& p, float* partials, at::ScalarType dtype,
                              cudaStream_t stream) {
  using Cfg = HopperConfig<128>;
  return p.act >= kActSwiglu
             ? launch_dact_cfg<T, Cfg, GatedDactEpilogue>(p, partials, dtype, stream)
             : launch_dact_cfg<T, Cfg, DactEpilogue>(p, partials, dtype, stream);
}

}  // namespace

Sm90Result launch_sm90_dact(const GemmProblem& p, float* partials, at::ScalarType dtype,
                            cudaStream_t stream) {
  if (p.K == 0 || !p.a_kmajor || p.b_kmajor || p.act == kActNone) {
    return Sm90Result::kNotApplicable;
  }
  if (dtype == at::kBFloat16) return launch_dact_layout<__nv_bfloat16>(p, partials, dtype, stream);
  if (dtype == at::kHalf) return launch_dact_layout<__half>(p, partials, dtype, stream);
  return Sm90Result::kNotApplicable;
}

Sm90Result launch_sm90_gemm(const GemmProblem& p, at::ScalarType dtype, cudaStream_t stream) {
  if (p.K == 0) return Sm90Result::kNotApplicable;
  if (dtype == at::kBFloat16) return launch_layout<__nv_bfloat16>(p, dtype, stream);
  if (dtype == at::kHalf) return launch_layout<__half>(p, dtype, stream);
  return Sm90Result::kNotApplicable;
}

}  // namespace matmul
}  // namespace fused
