// cp.async (sm_80+): 16-byte copies global -> shared that complete in the background, so
// loads can be in flight without holding registers. Groups of copies are committed and
// waited for per thread: a thread that reads back only what it copied needs no barrier.
#pragma once
#include <cstdint>

namespace fused {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Copies 16 bytes (bypassing L1); src_bytes < 16 copies that many and zero-fills the rest.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes = 16) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
               "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace fused
