// The softmax dispatch table: which kernel and launch shape takes a problem, as a pure
// function of (rows, row length, dtype, GPU properties, overrides). softmax/launch.cu does
// what the plan says; tests/test_plan.py checks the table on CPU through
// torch.ops.fused._plan (debug.cpp). Compiled without CUDA (also part of the CPU build).
//
// A plan is an ordered list of steps; each step but the last may be refused by the device
// where a launch-time query says it cannot run there (clusters that do not fit or would
// leave more than half the SMs idle, shared memory past the block's limit); the launcher
// then takes the next. The last step always runs. Design: docs/design/softmax.md#design.
//
// Every kernel sees [rows, len] row-major, the softmax dim last. Each thread holds P
// 16-byte vectors of its row (P * VEC elements; VEC = 16 / sizeof(T), or 1 on the scalar
// path), a row belongs to a group of `tpr` threads. The 16-byte path takes any row length
// and any start: a row's vectors are those of its span, its first element's address rounded
// down to 16 bytes and its end rounded up (`span_vectors`: at most len / VEC + 1 vectors),
// the elements outside the row masked on load and never stored (common.cuh). It needs only
// that every pointer of the op sits at the same offset in its 16-byte chunk (same_phase),
// so that a row's span is the same vectors in each tensor; the scalar path is left for
// tensors at different offsets, which the entry points avoid (launch.cu). `whole`: every
// row starts on the 16-byte grid and is whole vectors (aligned pointers, len % VEC == 0),
// which kCausal and the compile-time-shaped kStaged need.
//   kStaged   softmax_fwd_staged: plain forward rows (scale > 0, no mask, 16-byte path) of
//             2049 .. 65536 vectors: up to 16 even shares of at most 4096 vectors, a
//             256-thread block each, staged in shared memory (a cluster past one share,
//             sm_90). Override softmax.staged=0: off.
//   kCausal   softmax_causal_fwd: 16-bit causal forward rows of 257 .. 16384 columns on the
//             16-byte path, shaped at compile time (softmax.causal=0: off)
//   kRows     softmax_kernel, a row group of tpr <= 512 threads (blocks of max(tpr,
//             softmax.min_block) threads for short rows), or one 1024-thread block a row;
//             float32 forward rows of up to 1024 columns at 8 vectors a thread (a warp a row);
//             rows of 16-byte vectors that fill 50-75% of a 128-512-thread block at 4
//             vectors a thread at kWideP vectors in half the threads (not causal)
//   kCluster  softmax_cluster_kernel (sm_90): longer rows on a persistent cluster of up to
//             16 blocks of 512 threads, the row read once; 2P vectors a thread past
//             softmax.max_cluster blocks on the 16-byte path (softmax.cluster=0: off)
//   kSplit    softmax_kernel twice: chunks of 512 * P vectors reduced to a workspace, then
//             combined and written (rows no other kernel takes: x read twice)
#pragma once
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

#include "common/gpu_props.h"
#include "common/overrides.h"

namespace fused {
namespace softmax {

// Launch-shape constants the kernels and the plan share.
constexpr int kMaxCluster = 16;         // blocks per cluster (over 8: a non-portable size)
constexpr int kSplitBlock = 512;        // block of a split (or clustered) row's chunks
constexpr int kCausalVectors = 2;       // softmax_causal_fwd's vectors a thread
constexpr int kCausalMaxTpr = 1024;     // ... and its longest row group
constexpr int kStagedBlock = 256;       // softmax_fwd_staged's block
constexpr int kStagedShareVecs = 4096;  // its share of a row, in 16-byte vectors (64 KB)
constexpr int kStagedSmem = kStagedShareVecs * 16;
constexpr int kStagedMinVecs = 2048;  // shorter rows: a block a row (kRows)
// The vectors a thread in softmax_kernel: 4 x 16 bytes in flight an input, 8 scalar
// elements on the scalar path.
constexpr int vectors_per_thread(int vec) { return vec == 1 ? 8 : 4; }
// ... and for a row of 16-byte vectors that a power-of-two block of 4-vector threads would
// cover only 50-75% (span vectors in (2, 3] x tpr: 4097 / 5120 16-bit columns): half the
// threads at 6 vectors, so a thread's loads in flight and a block's share of the SM's
// registers match those of a row that fills its block (vectors past the row not worked on).
constexpr int kWideP = 6;

struct Problem {
  int64_t rows = 0;
  int64_t len = 0;
  c10::ScalarType dtype = c10::ScalarType::Float;
  bool forward = true;     // softmax / log_softmax forward, else their backward
  double scale = 1.0;      // the forward's scale
  int64_t causal_q = 0;    // 0: no mask; else the query count (row r is query r % causal_q)
  bool aligned = true;     // every pointer 16-byte aligned
  bool same_phase = true;  // every pointer at the same address mod 16 (the 16-byte path)
};

// Whether every row of p starts on the 16-byte grid and is whole vectors of vec elements.
inline bool whole_vectors(const Problem& p, int vec) { return p.aligned && p.len % vec == 0; }

// The most 16-byte vectors a row's span covers (its start rounded down, its end up to the
// 16-byte grid): len / vec where rows are whole vectors, else ceil((len + vec - 1) / vec),
// the span of a row that starts vec - 1 elements past the grid.
inline int64_t span_vectors(const Problem& p, int vec) {
  return whole_vectors(p, vec) ? p.len / vec : (p.len + 2 * vec - 2) / vec;
}

enum class Kernel { kStaged, kCausal, kRows, kCluster, kSplit };

// One step. Fields a kernel does not use stay 0.
struct Step {
  Kernel kernel = Kernel::kRows;
  int vec = 1;         // elements a vector
  int p = 0;           // vectors a thread (softmax_kernel, softmax_cluster_kernel)
  int block = 0;       // threads a block (BLOCK of softmax_kernel / softmax_cluster_kernel)
  int tpr = 0;         // threads a row group
  int n = 0;           // blocks a row: a cluster's, a split row's chunks, staged shares
  int fixed = 0;       // softmax_fwd_staged's N (n shaped at compile time), or 0
  int share = 0;       // softmax_fwd_staged: vectors a share
  int causal = 0;      // softmax_kernel's CAUSAL variant
  int span = 0;        // rows off the 16-byte grid or not whole vectors (16-byte path): the
                       // kernels' span form (heads, masked edges); 0: rows of whole vectors
  int64_t blocks = 0;  // grid x (rows or row groups; clusters: before occupancy)
};

struct Plan {
  static constexpr int kMaxSteps = 3;
  Step steps[kMaxSteps];
  int n = 0;
  void add(const Step& s) { steps[n++] = s; }
};

Plan plan(const Problem& p, const GpuProps& gpu, const Overrides& o);

// A plan as text, one step a line, for torch.ops.fused._plan and error messages.
std::string describe(const Plan& plan);
const char* kernel_name(Kernel k);

}  // namespace softmax
}  // namespace fused
