// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a
// counter-based generator. philox4x32(counter, key) is a pure function that maps a 128-bit
// counter and a 64-bit key to four independent 32-bit random words, so any element's random
// number can be computed (and recomputed, e.g. in backward) from its index alone: nothing
// is stored, and the result does not depend on which thread computes it.
//
// The stream layout is the one curand_init(seed, subsequence, offset) + curand4() uses, so a
// draw here never overlaps a PyTorch kernel's draws made from the same generator state:
//   key     = (seed low 32 bits, seed high 32 bits)
//   counter = (offset / 4 as 64 bits in words 0-1, subsequence as 64 bits in words 2-3)
// and element i of a tensor takes subsequence i / 4, word i % 4 (philox_uint32 below), or
// with 16-bit draws subsequence i / 8, half i % 2 of word (i % 8) / 2 (philox_uint16).
//
// Host and device: the CPU kernels include this header too, so CPU and CUDA agree bit for
// bit for the same (seed, offset). No dependencies beyond <cstdint>.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define FUSED_HD __host__ __device__ __forceinline__
#else
#define FUSED_HD inline
#endif

namespace fused {

struct Philox4 {
  uint32_t w[4];
};

namespace philox_detail {
// Round multipliers and Weyl key increments from the paper (Random123's PHILOX_M4x32_*,
// PHILOX_W32_*).
constexpr uint32_t kM0 = 0xD2511F53u;
constexpr uint32_t kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u;
constexpr uint32_t kW1 = 0xBB67AE85u;

// High and low 32 bits of a 32x32-bit product (one IMAD.WIDE on the GPU).
FUSED_HD void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}
}  // namespace philox_detail

// The ten round keys: key + round * (W0, W1). A kernel computes them once per thread (they
// depend on the seed only) and reuses them for every Philox call, which leaves each round
// two multiplies and two three-input xors.
struct PhiloxKey {
  uint32_t k0[10];
  uint32_t k1[10];
};

FUSED_HD PhiloxKey philox_key(uint64_t seed) {
  PhiloxKey k;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    k.k0[round] = k0;
    k.k1[round] = k1;
    k0 += philox_detail::kW0;
    k1 += philox_detail::kW1;
  }
  return k;
}

// Philox4x32 with 10 rounds: the round function is two 32x32->64 multiplies and xors with
// the round key.
FUSED_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                               const PhiloxKey& key) {
  using namespace philox_detail;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kM0, c0, hi0, lo0);
    mulhilo(kM1, c2, hi1, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ key.k0[round];
    const uint32_t n2 = hi0 ^ c3 ^ key.k1[round];
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  return Philox4{{c0, c1, c2, c3}};
}

FUSED_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                               uint32_t k1) {
  return philox4x32_10(c0, c1, c2, c3, philox_key(static_cast<uint64_t>(k1) << 32 | k0));
}

// The four 32-bit words for elements 4*group .. 4*group+3 of a tensor, drawn from generator
// state (key = philox_key(seed), offset). offset is PyTorch's per-thread philox offset (a
// multiple of 4).
FUSED_HD Philox4 philox_group(const PhiloxKey& key, uint64_t offset, uint64_t group) {
  const uint64_t ctr = offset / 4;
  return philox4x32_10(static_cast<uint32_t>(ctr), static_cast<uint32_t>(ctr >> 32),
                       static_cast<uint32_t>(group), static_cast<uint32_t>(group >> 32), key);
}

FUSED_HD Philox4 philox_group(uint64_t seed, uint64_t offset, uint64_t group) {
  return philox_group(philox_key(seed), offset, group);
}

// The 32-bit random word of element i alone (computes its whole group: use philox_group
// when the caller handles four neighbours anyway).
FUSED_HD uint32_t philox_uint32(const PhiloxKey& key, uint64_t offset, uint64_t i) {
  return philox_group(key, offset, i / 4).w[i % 4];
}

// 16-bit draws: element i takes half (i % 2) (0: low 16 bits, 1: high 16 bits) of word
// (i % 8) / 2 of Philox(subsequence i / 8), so one Philox call serves eight elements. The
// dropout kernels use these when p's keep probability is close enough to a multiple of
// 2^-16 (dropout_keep_threshold16 below); the counter layout is the one above, so draws still
// never overlap PyTorch's.
FUSED_HD uint32_t philox_uint16(const PhiloxKey& key, uint64_t offset, uint64_t i) {
  const uint32_t w = philox_group(key, offset, i / 8).w[(i % 8) / 2];
  return i % 2 ? w >> 16 : w & 0xFFFFu;
}

// Dropout keeps an element when its 32-bit word is below this threshold, which makes
// P(keep) = threshold / 2^32 = 1 - p to within 2^-32 and keeps the per-element test a single
// integer compare. For p in (0, 1).
inline uint32_t dropout_keep_threshold(double p) {
  const double t = (1.0 - p) * 4294967296.0;  // (1 - p) * 2^32
  if (t >= 4294967295.0) return 0xFFFFFFFFu;
  if (t <= 0.0) return 0u;
  return static_cast<uint32_t>(t + 0.5);
}

// The 16-bit threshold for p, or 0 when 16 bits are not precise enough for p: keep iff the
// element's 16-bit draw < threshold, P(keep) = threshold / 2^16. Rounding moves P(keep) by at
// most 2^-17 (7.6e-6); the 16-bit draws are used only when that error is at most 2^-10 of
// min(p, 1 - p), i.e. both the drop rate and the expected output (kept values are still
// scaled by exactly 1 / (1 - p)) are off by less than 0.1% of themselves; p = 0.1: keep
// 58982 / 65536 = 0.8999939 (1 - p - 6.1e-6, expected output 6.8e-6 low, far below bf16/fp16
// rounding and undetectable statistically below ~10^10 elements). In practice every p in
// [0.0078, 0.9922] and every p that is a multiple of 2^-16 qualifies; other p (e.g. 1e-3)
// keep the exact 32-bit draws. For p in (0, 1).
inline uint32_t dropout_keep_threshold16(double p) {
  const double keep = 1.0 - p;
  const double t = std::floor(keep * 65536.0 + 0.5);
  const double err = t / 65536.0 - keep;
  const double tol = std::ldexp(keep < p ? keep : p, -10);
  if (t < 1.0 || t > 65535.0 || (err < 0 ? -err : err) > tol) return 0u;
  return static_cast<uint32_t>(t);
}

}  // namespace fused
