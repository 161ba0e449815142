// What every CUDA launcher needs: the current stream, the SM count, grid sizing, and a
// launch check. Include this instead of torch/extension.h.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAMacros.h>
#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "common/gpu_props.h"
#include "common/overrides.h"

namespace fused {

inline cudaStream_t current_stream() { return at::cuda::getCurrentCUDAStream(); }

inline int num_sms() { return at::cuda::getCurrentDeviceProperties()->multiProcessorCount; }

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The current device's properties a dispatch plan reads, queried once a device;
// sm90_code_runs says whether the op's kernels run their sm_90 code here.
template <bool (*sm90_code_runs)()>
const GpuProps& current_gpu_props() {
  static std::once_flag once[C10_COMPILE_TIME_MAX_GPUS];
  static GpuProps props[C10_COMPILE_TIME_MAX_GPUS];
  const int d = c10::cuda::current_device();
  std::call_once(once[d], [d] {
    const cudaDeviceProp* dp = at::cuda::getCurrentDeviceProperties();
    props[d] = GpuProps{dp->major, dp->minor, dp->multiProcessorCount, sm90_code_runs()};
  });
  return props[d];
}

// n / d for 0 <= n, d < 2^31 with a multiply-high in place of a division (a runtime 32-bit
// division is ~20 instructions): Granlund and Montgomery's round-up method, shift =
// ceil(log2 d), magic = floor(2^32 (2^shift - d) / d) + 1, n / d = (mulhi(n, magic) + n)
// >> shift (the sum stays under 2^32 for n < 2^31).
struct Div31 {
  uint32_t d, magic, shift;

  static Div31 make(uint32_t d) {
    uint32_t shift = 0;
    while ((uint64_t{1} << shift) < d) ++shift;
    const uint64_t magic = ((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1;
    return {d, static_cast<uint32_t>(magic), shift};
  }
  __host__ __device__ __forceinline__ uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(n, magic);
#else
    const uint32_t hi = static_cast<uint32_t>((uint64_t{n} * magic) >> 32);
#endif
    return (hi + n) >> shift;
  }
  __host__ __device__ __forceinline__ uint32_t mod(uint32_t n) const { return n - div(n) * d; }
};

// f(std::integral_constant<int, N>{}) for the power of two N in [LO, HI] equal to n: a
// runtime size mapped to a kernel shaped at compile time; false when n is none of them.
template <int LO, int HI, typename F>
bool with_pow2(int64_t n, F&& f) {
  if constexpr (LO > HI) {
    return false;
  } else {
    if (n == LO) return f(std::integral_constant<int, LO>{});
    return with_pow2<LO * 2, HI>(n, f);
  }
}

// Grid for a grid-stride elementwise kernel: enough blocks to fill every SM several
// times over, never more than the work needs.
inline unsigned elementwise_grid(int64_t work_items, int threads, int blocks_per_sm = 8) {
  int64_t want = ceil_div(std::max<int64_t>(work_items, 1), threads);
  int64_t cap = static_cast<int64_t>(num_sms()) * blocks_per_sm;
  return static_cast<unsigned>(std::min(want, cap));
}

// Lets `kernel` launch with `bytes` of dynamic shared memory: past the default 48 KB (which
// counts the kernel's static shared memory too) a kernel must opt in, up to the device's
// limit. Raises the kernel's limit, never lowers it, so other launch shapes of the same
// kernel stay valid. False where static + dynamic would pass the device's limit. Callers
// run it once per launch shape (inside cached_launch_query).
template <typename Kernel>
bool allow_dynamic_smem(Kernel kernel, size_t bytes) {
  cudaFuncAttributes fa;
  C10_CUDA_CHECK(cudaFuncGetAttributes(&fa, kernel));
  const size_t limit = at::cuda::getCurrentDeviceProperties()->sharedMemPerBlockOptin;
  if (fa.sharedSizeBytes + bytes > limit) return false;
  if (fa.sharedSizeBytes + bytes > 48 * 1024 &&
      bytes > static_cast<size_t>(fa.maxDynamicSharedSizeBytes)) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(bytes)));
  }
  return true;
}

// compute() for (current device, kernel, a, b), remembered: launch-shape queries such as
// cudaOccupancyMaxActiveClusters cost the host microseconds each, which on every op call
// can leave the GPU waiting for the next launch. One cache per call site (per F).
template <typename F>
int cached_launch_query(const void* kernel, int a, int b, F&& compute) {
  static std::mutex mutex;
  static std::map<std::tuple<int, const void*, int, int>, int> cache;
  const auto key = std::make_tuple(static_cast<int>(c10::cuda::current_device()), kernel, a, b);
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  return cache[key] = compute();
}

// allow_dynamic_smem once per device, kernel and size: for launchers that run on every call
// (a driver call per launch costs host time the GPU may wait for).
template <typename Kernel>
bool allow_dynamic_smem_once(Kernel kernel, int bytes) {
  return cached_launch_query(reinterpret_cast<const void*>(kernel), bytes, -1, [&] {
           return allow_dynamic_smem(kernel, static_cast<size_t>(bytes)) ? 1 : 0;
         }) != 0;
}

// Blocks of `kernel` (`threads` threads, `smem` bytes of dynamic shared memory) resident on
// an SM at once, 0 where that shared memory does not fit a block; queried once a shape.
template <typename Kernel>
int resident_blocks(Kernel kernel, int threads, size_t smem) {
  return cached_launch_query(
      reinterpret_cast<const void*>(kernel), threads, static_cast<int>(smem), [&] {
        if (!allow_dynamic_smem(kernel, smem)) return 0;
        int n = 0;
        C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem));
        return n;
      });
}

// Whether the code of `kernel` that runs on this device was compiled for sm_90 or later:
// kernels whose Hopper paths (clusters, wgmma) compile to no-ops in the 8.0 pass, which a
// Hopper GPU would also run as PTX JIT-compiled from compute_80. PTX JIT-compiled here
// reports its PTX version; SASS-only code may report 0, and then its SASS arch is the one.
// Cached per device and kernel.
template <typename Kernel>
bool runs_sm90_code(Kernel kernel) {
  return cached_launch_query(reinterpret_cast<const void*>(kernel), 0, 0, [&] {
           if (at::cuda::getCurrentDeviceProperties()->major < 9) return 0;
           cudaFuncAttributes fa;
           if (cudaFuncGetAttributes(&fa, kernel) != cudaSuccess) {
             (void)cudaGetLastError();  // an answer, not an error to keep
             return 0;
           }
           return (fa.ptxVersion > 0 ? fa.ptxVersion : fa.binaryVersion) >= 90 ? 1 : 0;
         }) != 0;
}

// Programmatic dependent launch (sm_90): a kernel launched with it (early_start on a
// ClusterLaunch, or launch_early) is scheduled while the kernel before it in the stream
// finishes, instead of after, which takes the launch gap (~1-2 us a kernel on an H200) out
// of a chain of kernels. Such a kernel must call grid_dependency_wait() before its first
// global memory access: that waits for the previous kernel to complete and its writes to
// be visible (a no-op when the kernel was launched normally). The override pdl=0 turns it
// off (common/overrides.h).
inline bool pdl_enabled() {
  return overrides().pdl && at::cuda::getCurrentDeviceProperties()->major >= 9;
}

__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Appends the early-launch attribute to cfg (its attrs array has room for one more) where
// it applies: enabled, and the kernel's sm_90 code is what runs (runs_sm90_code: a newer
// GPU running code JIT-compiled from the compute_80 PTX would lack the wait, which
// compiles to nothing there). The one rule for launch_early and ClusterLaunch.
template <typename Kernel>
void allow_early_start(cudaLaunchConfig_t& cfg, Kernel kernel) {
  if (!pdl_enabled() || !runs_sm90_code(kernel)) return;
  cudaLaunchAttribute& a = cfg.attrs[cfg.numAttrs++];
  a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a.val.programmaticStreamSerializationAllowed = 1;
}

// A launch of thread-block clusters: `cluster` blocks per cluster, `threads` per block,
// `smem` bytes of dynamic shared memory, on the current stream. cfg.attrs points into the
// object, so it is not copied.
struct ClusterLaunch {
  cudaLaunchAttribute attr[2]{};  // the cluster shape, and room for allow_early_start's
  cudaLaunchConfig_t cfg{};
  int blocks;  // per cluster
  bool early = false;

  ClusterLaunch(dim3 cluster, int threads, int smem)
      : blocks(static_cast<int>(cluster.x * cluster.y * cluster.z)) {
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cluster.x;
    attr[0].val.clusterDim.y = cluster.y;
    attr[0].val.clusterDim.z = cluster.z;
    cfg.gridDim = cluster;
    cfg.blockDim = dim3(static_cast<unsigned>(threads));
    cfg.dynamicSmemBytes = static_cast<size_t>(smem);
    cfg.stream = current_stream();
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }

  // Launch early where it applies (allow_early_start): the kernel calls
  // grid_dependency_wait() first.
  ClusterLaunch& early_start() {
    early = true;
    return *this;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;

  // How many such clusters of `kernel` fit on the GPU at once; 0 when they cannot run (a
  // size over 8 that this GPU does not allow, or a failed query: an answer, not an error
  // to keep). Sets the non-portable-size attribute first where a cluster is over 8 blocks.
  // Callers cache it (cached_launch_query).
  template <typename Kernel>
  int max_active(Kernel kernel) {
    int n = 0;
    const bool ok =
        (blocks <= 8 || cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed,
                                             1) == cudaSuccess) &&
        cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) == cudaSuccess;
    (void)cudaGetLastError();
    return ok ? n : 0;
  }

  template <typename Kernel, typename... Args>
  void launch(dim3 grid, Kernel kernel, const Args&... args) {
    cfg.gridDim = grid;
    cfg.numAttrs = 1;
    if (early) allow_early_start(cfg, kernel);
    C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
  }
};

// kernel<<<grid, block, smem, current stream>>>(args...), launched early where it applies
// (allow_early_start): the kernel calls grid_dependency_wait() before touching global
// memory. Launch errors throw here (C10_CUDA_CHECK).
template <typename... KArgs, typename... Args>
void launch_early(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                  const Args&... args) {
  cudaLaunchAttribute attr{};
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = current_stream();
  cfg.attrs = &attr;
  cfg.numAttrs = 0;
  allow_early_start(cfg, kernel);
  C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...));
}

}  // namespace fused

// Every <<<>>> launch is followed by this: it turns a bad launch into a C++ exception
// (launch_early and ClusterLaunch::launch check cudaLaunchKernelEx's result themselves).
#define FUSED_LAUNCH_CHECK() C10_CUDA_KERNEL_LAUNCH_CHECK()
