// The dropout mask on the GPU, shared by the kernels that apply it (cuda/dropout.cu and the
// dropout forms of the norms, cuda/norm/): where a kernel gets its Philox seed and offset, and
// the keep / scale of a group of consecutive elements. Element i's decision is a function of
// (seed, offset, i, threshold, bits16) only (common/philox.cuh), so every kernel that applies
// the mask to element i of a row-major tensor draws the same one.
#pragma once
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/PhiloxUtils.cuh>

#include <optional>
#include <tuple>

#include "common/dropout.h"
#include "common/philox.cuh"

namespace fused {

// Where a kernel gets its Philox key and counter base: forward unpacks the generator's
// state (and records what it used in seed_offset), backward reads seed_offset back.
struct RngArgs {
  at::PhiloxCudaState state;  // forward: this call's generator state
  const int64_t* saved;       // backward: seed_offset from forward, else nullptr
  int64_t* record;            // forward: seed_offset to fill, else nullptr
};

__device__ __forceinline__ void rng_seed_offset(const RngArgs& a, uint64_t& seed,
                                                uint64_t& offset) {
  if (a.saved != nullptr) {
    seed = static_cast<uint64_t>(a.saved[0]);
    offset = static_cast<uint64_t>(a.saved[1]);
    return;
  }
  auto so = at::cuda::philox::unpack(a.state);
  seed = std::get<0>(so);
  offset = std::get<1>(so);
  if (a.record != nullptr && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
    a.record[0] = static_cast<int64_t>(seed);
    a.record[1] = static_cast<int64_t>(offset);
  }
}

// Applies the mask to k[0..V), the values of elements e0 .. e0+V-1: k = keep ? k * scale : 0.
// e0 is a multiple of V, and of 4 when V is. B16 (DropoutParams::bits16): element i's draw
// is the 16-bit half i % 2 of word (i % 8) / 2 of Philox(i / 8): one Philox call serves 8
// elements (a 16-byte vector of bf16/fp16), half a call 4 (the fp32 vector and the scalar
// groups). Otherwise word i % 4 of Philox(i / 4), one call per 4 elements. Single elements
// (V == 1) draw their own call. threshold < 2^16 with B16: the high half h of a word w is
// below it iff w < threshold << 16, and the low half iff (w << 16) < threshold << 16.
template <int V, bool B16>
__device__ __forceinline__ void apply_mask(float (&k)[V], int64_t e0, const PhiloxKey& key,
                                           uint64_t offset, uint32_t threshold, float scale) {
  if constexpr (B16 && V % 4 == 0) {
    const uint32_t t_hi = threshold << 16;
    auto mask_pair = [&](float& lo, float& hi, uint32_t w) {
      lo = (w << 16) < t_hi ? lo * scale : 0.0f;
      hi = w < t_hi ? hi * scale : 0.0f;
    };
    if constexpr (V % 8 == 0) {
#pragma unroll
      for (int q = 0; q < V / 8; ++q) {
        const Philox4 r = philox_group(key, offset, static_cast<uint64_t>(e0 / 8 + q));
#pragma unroll
        for (int w = 0; w < 4; ++w) mask_pair(k[8 * q + 2 * w], k[8 * q + 2 * w + 1], r.w[w]);
      }
    } else {
      static_assert(V == 4, "groups of 4 or of a multiple of 8");
      // Words 0-1 serve elements 8g .. 8g+3, words 2-3 elements 8g+4 .. 8g+7.
      const Philox4 r = philox_group(key, offset, static_cast<uint64_t>(e0 / 8));
      const bool upper = e0 % 8 != 0;
      mask_pair(k[0], k[1], upper ? r.w[2] : r.w[0]);
      mask_pair(k[2], k[3], upper ? r.w[3] : r.w[1]);
    }
  } else if constexpr (!B16 && V % 4 == 0) {
#pragma unroll
    for (int q = 0; q < V / 4; ++q) {
      const Philox4 r = philox_group(key, offset, static_cast<uint64_t>(e0 / 4 + q));
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        k[4 * q + w] = r.w[w] < threshold ? k[4 * q + w] * scale : 0.0f;
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const uint64_t i = static_cast<uint64_t>(e0 + j);
      const uint32_t w = B16 ? philox_uint16(key, offset, i) : philox_uint32(key, offset, i);
      k[j] = w < threshold ? k[j] * scale : 0.0f;
    }
  }
}

// This call's generator state (cuda/dropout.cu): the generator's offset advanced by 4 under
// its mutex; under graph capture the state points at the graph's offset tensor.
at::PhiloxCudaState next_philox_state(const std::optional<at::Generator>& generator,
                                      const at::Device& device);

// A forward's RngArgs and the seed_offset it returns (cuda/dropout.cu): zeros and no
// randomness drawn unless the mask is random and x is not empty; else a fresh generator
// state, recorded into seed_offset by the kernel's first thread.
at::Tensor forward_rng(const at::Tensor& x, const DropoutParams& d,
                       const std::optional<at::Generator>& generator, RngArgs& rng);

}  // namespace fused
