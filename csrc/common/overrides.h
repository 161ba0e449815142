// Overrides: the one way to steer the kernel choice and its tuning, for comparisons, tests
// and debugging. The default path needs none.
//
// Set through the environment variable FUSED_OPS_OVERRIDES, read once at the first use, or
// at run time through torch.ops.fused._set_overrides (fused_ops/overrides.py wraps it). A
// spec is a comma-separated list of key=value pairs; an empty spec means every default.
// Unknown keys and values outside a key's range are errors (TORCH_CHECK naming the key and
// what it allows), never silently ignored. Keys and defaults (overrides.cpp holds the table):
//
//   norm.fixed=1            the compile-time-shaped norm kernels (norm_fwd_fixed, the fixed
//                           wide forwards, norm_bwd_fixed); 0 sends their rows elsewhere
//   norm.stage=1            norm_bwd_regs' shared-memory staging of float32 rows
//   norm.bwd_warp=1         norm_bwd_warp for 16-bit rows of 256-512 columns
//   norm.bwd_pf=auto        norm_bwd_warp's prefetching variant: auto (the plain norms), 0, 1
//   norm.bwd_warps=auto     norm_bwd_warp's warps a block: auto (as many as fit) or 1..32
//   norm.bwd_bulk=1         norm_bwd_bulk for 16-bit rows of 520-1024 columns (sm_90)
//   norm.bwd_bulk_stages=auto  norm_bwd_bulk's slots a warp pair: auto, 2, 3 or 4
//   softmax.cluster=1       softmax's thread-block clusters (sm_90)
//   softmax.max_cluster=8   the largest cluster before each thread takes twice the vectors
//                           (2..16)
//   softmax.min_block=32    the smallest block of short rows: 32, 64 or 128 threads
//   softmax.staged=1        softmax_fwd_staged for long plain forward rows
//   softmax.causal=1        softmax_causal_fwd for 16-bit causal forward rows
//   matmul.kernel=auto      auto, portable, or hopper (as auto, but an error where the
//                           Hopper kernel cannot run)
//   matmul.group_m=8        tile-rows per group of the GEMM tile order (1..1024)
//   matmul.tile_n=auto      the Hopper GEMM's tile width: auto, 128 or 256
//   matmul.split_k=auto     the Hopper GEMM's K pieces per tile: auto or 1..64 (split-K needs
//                           a TMA-stored output, N % 8 == 0; capped at the K tiles)
//   pdl=1                   programmatic dependent launch on sm_90
#pragma once
#include <string>

namespace fused {

struct Overrides {
  static constexpr int kAuto = -1;  // an integer knob left to the kernel's own choice

  bool norm_fixed = true;
  bool norm_stage = true;
  bool norm_bwd_warp = true;
  int norm_bwd_pf = kAuto;  // kAuto, 0 or 1
  int norm_bwd_warps = kAuto;
  bool norm_bwd_bulk = true;
  int norm_bwd_bulk_stages = kAuto;
  bool softmax_cluster = true;
  int softmax_max_cluster = 8;
  int softmax_min_block = 32;
  bool softmax_staged = true;
  bool softmax_causal = true;
  enum class MatmulKernel { kAuto, kPortable, kHopper } matmul_kernel = MatmulKernel::kAuto;
  int matmul_group_m = 8;
  int matmul_tile_n = kAuto;   // kAuto, 128 or 256
  int matmul_split_k = kAuto;  // kAuto or 1..64
  bool pdl = true;
};

// The spec parsed into an Overrides (defaults for absent keys); TORCH_CHECK fails on an
// unknown key or a bad value, naming it and what is allowed.
Overrides parse_overrides(const std::string& spec);

// The overrides in force: FUSED_OPS_OVERRIDES parsed at the first call, or the last spec
// given to set_overrides. After the first call, one atomic load (no environment read).
const Overrides& overrides();

// Replaces the overrides in force with `spec` (parsed first: a bad spec changes nothing) and
// returns the spec that was in force.
std::string set_overrides(const std::string& spec);

// The spec in force, as given (FUSED_OPS_OVERRIDES or the last set_overrides).
std::string overrides_spec();

}  // namespace fused
