// The norm dispatch table: which kernel family and launch shape takes a problem, as a pure
// function of (rows, width, dtypes, GPU properties, overrides). The CUDA launchers
// (norm/launch.cu) do what the plan says and nothing else; tests/test_plan.py checks the table
// on CPU through torch.ops.fused._plan (debug.cpp). Compiled without CUDA (plan.cpp is part
// of the CPU build too).
//
// A plan is an ordered list of steps. Each step but the last may be refused by the device
// where a launch-time query says the shape cannot be resident (a cluster that does not fit,
// shared memory past the block's limit); the launcher then takes the next step. The last
// step always runs. The design and its measurements: docs/design/norm.md#design.
//
// Forward, by row length (nvec = 16-byte vectors per row, or elements on the scalar path):
//   kFwdWideFixed  norm_fwd_regs, 8 vectors a thread, the launch shape a compile-time
//                  constant: plain rows of 16-bit 24576 / 32768 / 65536, float32 12288 /
//                  16384 / 32768 (384 / 512 / 1024 threads), float32 layer norm 8192 (256);
//                  parameters in x's dtype (override norm.fixed=0: off)
//   kFwdFixed      norm_fwd_fixed: 16-bit rows of 1024..16384 in FixedTprs (4 vectors a
//                  thread, a block a row), parameters and sum in x's dtype (norm.fixed)
//   kFwdRegs       norm_fwd_regs: the row in registers, a row group of tpr threads (a power
//                  of two <= 32, several groups a 128-thread block; or whole warps);
//                  the wide variant (8 vectors) for plain rows past 512 threads at 4; the
//                  add forms' 16-bit rows of 32768 at 1024 threads (shaped at compile time);
//                  the add forms' rows past 4 vectors a thread with the residual staged in
//                  shared memory (RES = kStagedRes; refused where that memory does not fit)
//   kFwdLong       norm_fwd_long: longer rows, a block per row, two reads
//   Rows off the 16-byte grid (a width not a multiple of the vector, or x at an odd offset)
//   whose tensors share that offset (Problem::same_phase) and that norm_fwd_regs holds: its
//   span variant (Step::span; the vector path, each row as the 16-byte vectors of its aligned
//   span, one more vector a row); else the scalar path.
// Backward (dx, and the dweight / dbias partial rows summed by column_sum):
//   kBwdWarp       norm_bwd_warp: 16-bit rows of 256..512 columns, parameters and rows in
//                  x's dtype (norm.bwd_warp, norm.bwd_pf, norm.bwd_warps)
//   kBwdBulk       norm_bwd_bulk (sm_90): 16-bit rows of 520..1024 columns, as above
//                  (norm.bwd_bulk, norm.bwd_bulk_stages)
//   kBwdFixed      norm_bwd_fixed (sm_90): a cluster of CS blocks of TPB threads a row for
//                  16-bit rows of 4096 .. 32768 and float32 12288 / 16384 (norm.fixed)
//   kBwdRegs       norm_bwd_regs: the row in registers (prefetching the next row while a
//                  row fits 512 threads; float32 rows staged in shared memory, norm.stage)
//   kBwdCluster    norm_bwd_cluster (sm_90): rows too long for one block, up to 16 blocks
//   kBwdTwoPass    norm_bwd_row_sums then norm_bwd_tiles: everything else
//   Rows off the 16-byte grid whose dy, x, d_sum and dx share their offset (same_phase) and
//   that the prefetching norm_bwd_regs holds: its span variant (Step::span); else scalar.
#pragma once
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <utility>

#include "common/gpu_props.h"
#include "common/overrides.h"

namespace fused {
namespace norm {

// Launch-shape constants the kernels and the plan share.
constexpr int kFwdMaxThreads = 1024;   // norm_fwd_regs' launch bound
constexpr int kFwdShortThreads = 128;  // rows of up to 32 threads share a block this size
constexpr int kFwdWideVpt = 8;         // the wide variant's vectors a thread
constexpr int kFwdWideThreads = 512;   // past this many threads at 4 vectors: the wide variant
constexpr int kFixedVpt = 4;           // norm_fwd_fixed's vectors a thread
constexpr int kRuntime = -1;           // a norm_fwd_regs flag read at run time (scalar path)
constexpr int kStagedRes = 2;          // RES: the residual staged in shared memory
constexpr int kLongThreads = 512;      // the long-row kernels: a block per row
constexpr int kBwdMaxThreads = 512;    // norm_bwd_regs' launch bound
constexpr int kBwdElems = 16;          // norm_bwd_regs' elements a thread without prefetch
constexpr int kBwdBlock = 128;         // norm_bwd_regs' smallest block
constexpr int kBwdBlocksPerSm = 4;     // norm_bwd_regs' blocks an SM, at most
constexpr int kBwdStages = 3;          // norm_bwd_regs' staging depth (float32 rows)
constexpr int kClusterElems = 8;       // norm_bwd_cluster's elements a thread
constexpr int kMaxCluster = 16;        // blocks per cluster (over 8: non-portable, sm_90)
constexpr int kTileThreads = 256;      // norm_bwd_tiles: one vector column per thread
constexpr int kBulkBwdThreads = 256;   // norm_bwd_bulk's block: 4 pairs of warps
constexpr int kBulkBwdVpt = 2;         // norm_bwd_bulk's 16-byte vectors a thread
constexpr int kFixedBwdVpt = 2;        // norm_bwd_fixed's 16-byte vectors a thread
// norm_fwd_fixed's row threads: 16-bit rows of kFixedVpt * 8 * TPR, 1024 to 16384 columns
// (tests/test_norm.py FIXED_COLS lists the same lengths).
using FixedTprs = std::integer_sequence<int, 32, 64, 96, 128, 160, 192, 256, 384, 512>;

// One problem. The vector path needs cols a multiple of VEC = 16 / sizeof(x) and every
// pointer aligned to VEC elements of its type (the caller checks the pointers: `aligned`).
struct Problem {
  int64_t rows = 0;
  int64_t cols = 0;
  c10::ScalarType x = c10::ScalarType::Float;  // x / y / grad_out
  c10::ScalarType w = c10::ScalarType::Float;  // weight / bias: x's or float32
  c10::ScalarType r = c10::ScalarType::Float;  // the normalized rows: x's, or float32
  bool layer = true;                           // layer norm (else rms norm)
  bool residual = false;                       // forward: the add forms
  bool dsum = false;                           // backward: the add forms' grad_sum
  bool aligned = true;                         // every pointer aligned to VEC elements of its type
  int grads = 0;         // backward: parameter gradients asked for (dweight, dbias: 0-2)
  bool dropout = false;  // forward: the dropout forms' input stage (with residual)
  // x, residual, y and sum (forward), or dy, x, d_sum and dx (backward) at one offset in their
  // 16-byte chunks, a whole number of elements (the parameters at any): rows off the grid
  // then take the span path (Step::span)
  bool same_phase = false;
};

enum class Kernel {
  kFwdWideFixed,
  kFwdFixed,
  kFwdRegs,
  kFwdLong,
  kBwdWarp,
  kBwdBulk,
  kBwdFixed,
  kBwdRegs,
  kBwdCluster,
  kBwdTwoPass,
};

// One step: the kernel and the template arguments and launch shape it takes. Fields a
// kernel does not use stay 0.
struct Step {
  Kernel kernel = Kernel::kFwdLong;
  int vec = 1;         // elements a vector: 16 / sizeof(x), or 1 (scalar path)
  int vpt = 0;         // vectors a thread
  int layer = 0;       // LAYER template flag: 0, 1 or kRuntime
  int res = 0;         // norm_fwd_regs' RES: 0, 1, kStagedRes or kRuntime; DSUM otherwise
  int fixed = 0;       // FIXED_TPR (forward), TPB (norm_bwd_fixed); 0: shaped at run time
  int cluster = 0;     // blocks a cluster (norm_bwd_fixed, norm_bwd_cluster)
  int lag = 0;         // norm_bwd_fixed / norm_bwd_cluster: rows between a row's sums and dx
  int pf = 0;          // norm_bwd_regs / norm_bwd_warp: prefetch the next row
  int stages = 0;      // norm_bwd_regs / norm_bwd_bulk: staging depth
  int tpr = 0;         // threads a row (group)
  int threads = 0;     // a block
  int64_t blocks = 0;  // the grid (backward persistent kernels: the most, before occupancy)
  int smem = 0;        // dynamic shared memory bytes (where the plan knows it)
  int drop = 0;        // forward: the dropout forms' input stage (DROP)
  int span = 0;        // norm_fwd_regs' / norm_bwd_regs' SPAN: rows as the 16-byte vectors of
                       // their aligned span
};

struct Plan {
  static constexpr int kMaxSteps = 4;
  Step steps[kMaxSteps];
  int n = 0;
  void add(const Step& s) { steps[n++] = s; }
};

// The forward and backward plans. TORCH_CHECK fails on an override the problem cannot take
// (norm.bwd_warps past the kernel's launch bound).
Plan plan_forward(const Problem& p, const GpuProps& gpu, const Overrides& o);
Plan plan_backward(const Problem& p, const GpuProps& gpu, const Overrides& o);

// A plan as text, one step a line ("norm_bwd_fixed vec=8 ... threads=256"), for
// torch.ops.fused._plan and error messages.
std::string describe(const Plan& plan);
const char* kernel_name(Kernel k);

}  // namespace norm
}  // namespace fused
