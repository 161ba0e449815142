// Thread-block cluster exchange on sm_90 (Hopper): each block pushes a small value into
// every peer's shared memory with st.async, and each block waits on its own mbarrier until
// all its peers' values have landed. No cluster barrier per exchange: barrier.cluster's
// release (MEMBAR.ALL.GPU in SASS) waits for the thread's outstanding global loads, which
// would stall a prefetched next row (4096x32768 bf16 softmax: 73% -> 90% of copy with the
// prefetch kept in flight, in a standalone sweep; docs/design/softmax.md#tried-not-kept).
//
// Device functions for sm_90 code only: callers compile them under __CUDA_ARCH__ >= 900.
#pragma once
#include <cstdint>
#include <cstring>

namespace fused {

// Loads kept where they are written: ptxas sinks __ldg (ld.global.nc) below a __syncthreads
// to save registers, which would queue the next row's loads behind this row's reductions.
// A weak ld.global in asm volatile stays in place. R: 2, 4 or a multiple of 16 bytes.
template <typename R>
__device__ __forceinline__ R load_pinned(const R* p) {
  R r;
  if constexpr (sizeof(R) % 16 == 0) {
    uint4 u[sizeof(R) / 16];
    const uint4* q = reinterpret_cast<const uint4*>(p);
#pragma unroll
    for (int k = 0; k < static_cast<int>(sizeof(R) / 16); ++k) {
      asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(u[k].x), "=r"(u[k].y), "=r"(u[k].z), "=r"(u[k].w)
                   : "l"(q + k));
    }
    memcpy(&r, u, sizeof(r));
  } else if constexpr (sizeof(R) == 4) {
    uint32_t u;
    asm volatile("ld.global.u32 %0, [%1];" : "=r"(u) : "l"(p));
    memcpy(&r, &u, sizeof(r));
  } else {
    static_assert(sizeof(R) == 2, "load_pinned: 2, 4 or a multiple of 16 bytes");
    uint16_t u;
    asm volatile("ld.global.u16 %0, [%1];" : "=h"(u) : "l"(p));
    memcpy(&r, &u, sizeof(r));
  }
  return r;
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// One arrival expected per phase (the waiting block's own expect_tx below).
__device__ __forceinline__ void mbar_init(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// The phase's one arrival, expecting `bytes` from the peers' pushes (which may land before
// it: the transaction count then runs negative until this call).
__device__ __forceinline__ void mbar_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n W:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra W;\n}" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global memory into this
// block's shared memory on the copy engine (cp.async.bulk: no registers, one instruction for
// the whole run of bytes), counted on *bar as transaction bytes (pair it with mbar_expect).
__device__ __forceinline__ void bulk_load(void* smem, const void* gmem, uint32_t bytes,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_addr(smem)),
      "l"(gmem), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

// The halves of a cluster barrier with no memory ordering (.relaxed): an arrive that does
// not wait for the thread's outstanding loads. For "every block of the cluster has started"
// (its shared memory may be written by a peer): arrive early, wait just before the first
// access to a peer's shared memory.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
// The same with release semantics: this thread's earlier memory accesses (a read of a
// slot a peer will then overwrite) are ordered before the peers' accesses after their wait.
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
}

// v (4 or 8 bytes) into block `rank`'s copy of *slot, counted on its copy of *bar.
template <typename S>
__device__ __forceinline__ void push_to_peer(S* slot, uint64_t* bar, int rank, const S& v) {
  static_assert(sizeof(S) == 4 || sizeof(S) == 8, "push_to_peer: 4 or 8 bytes");
  uint32_t a, b;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(smem_addr(slot)), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(b) : "r"(smem_addr(bar)), "r"(rank));
  if constexpr (sizeof(S) == 8) {
    uint64_t u;
    memcpy(&u, &v, 8);
    asm volatile(
        "st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];" ::"r"(a),
        "l"(u), "r"(b)
        : "memory");
  } else {
    uint32_t u;
    memcpy(&u, &v, 4);
    asm volatile(
        "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(a),
        "r"(u), "r"(b)
        : "memory");
  }
}

}  // namespace fused
