// What every CUDA launcher needs: the current stream, the SM count, grid sizing, and a
// launch check. Include this instead of torch/extension.h.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

namespace fused {

inline cudaStream_t current_stream() { return at::cuda::getCurrentCUDAStream(); }

inline int num_sms() { return at::cuda::getCurrentDeviceProperties()->multiProcessorCount; }

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Grid for a grid-stride elementwise kernel: enough blocks to fill every SM several
// times over, never more than the work needs.
inline unsigned elementwise_grid(int64_t work_items, int threads, int blocks_per_sm = 8) {
  int64_t want = ceil_div(std::max<int64_t>(work_items, 1), threads);
  int64_t cap = static_cast<int64_t>(num_sms()) * blocks_per_sm;
  return static_cast<unsigned>(std::min(want, cap));
}

// Blocks of `threads` threads with `smem` bytes of dynamic shared memory that fit on one SM
// (at least 1), for sizing persistent grids; also allows the kernel that much dynamic shared
// memory. Cached per device and kernel (the kernel is always launched with the same smem).
template <typename Kernel>
int resident_blocks(Kernel kernel, int threads, int smem) {
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, int> cache;
  const auto key = std::make_pair(static_cast<int>(c10::cuda::current_device()),
                                  reinterpret_cast<const void*>(kernel));
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int n = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem));
  return cache[key] = std::max(n, 1);
}

}  // namespace fused

// Every launch is followed by this: it turns a bad launch into a C++ exception.
#define FUSED_LAUNCH_CHECK() C10_CUDA_KERNEL_LAUNCH_CHECK()
