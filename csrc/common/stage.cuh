// Asynchronous global -> shared copies (cp.async, sm_80+) into a thread's own staging slots:
// the thread reads them back itself after stage_wait, so no block barrier is involved (the
// staged norm backwards, norm_bwd_regs with STAGES and norm_bwd_fixed; softmax_fwd_staged).
// The memory clobbers keep the compiler from moving shared-memory reads of a slot across the
// copy that refills it. (The portable matmul has its own cp.async helpers: zero-filling,
// with an L2 hint, ordered by block barriers instead.)
#pragma once
#include "common/cluster.cuh"

namespace fused {

__device__ __forceinline__ void stage_copy(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src)
               : "memory");
}
__device__ __forceinline__ void stage_copy4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(dst)), "l"(src)
               : "memory");
}
// A whole 16-byte-multiple vector (a Raw of 16 or 32 bytes).
template <typename V>
__device__ __forceinline__ void stage_vec(V* dst, const V* src) {
  static_assert(sizeof(V) % 16 == 0, "staged vectors are whole 16-byte chunks");
#pragma unroll
  for (int b = 0; b < static_cast<int>(sizeof(V)); b += 16) {
    stage_copy(reinterpret_cast<char*>(dst) + b, reinterpret_cast<const char*>(src) + b);
  }
}
// One group: the copies issued since the last commit (none is a valid, empty group).
__device__ __forceinline__ void stage_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
// Every group of this thread's copies but the newest N has landed.
template <int N>
__device__ __forceinline__ void stage_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
// The same for an n known once a loop is unrolled (a group index), 0 <= n <= MAX.
template <int MAX>
__device__ __forceinline__ void stage_wait_n(int n) {
  if constexpr (MAX > 0) {
    if (n >= MAX) return stage_wait<MAX>();
    stage_wait_n<MAX - 1>(n);
  } else {
    stage_wait<0>();
  }
}

}  // namespace fused
