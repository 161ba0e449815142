// The Hopper GEMM's schedule (plan.cpp): plain host C++, so the CPU build has it too and
// tests/test_matmul.py checks it there through torch.ops.fused._plan("matmul", ...).
#pragma once
#include <cstdint>
#include <string>

#include "common/overrides.h"

namespace fused {
namespace matmul {

// Tile width BN (256: 128 x 256 tiles, or 128: 128 x 128) and the pieces each tile's K range
// is cut into (split-K; 1 = none).
struct Schedule {
  int bn = 256, splits = 1;
};

// The schedule of a [batch] M x N x K problem on `sms` SMs; split_ok: the output can take
// split-K (a TMA-stored output: N % 8 == 0, 16-byte aligned). The overrides matmul.tile_n and
// matmul.split_k force either (plan.cpp says how the rest is chosen).
Schedule choose_schedule(int64_t M, int64_t N, int64_t K, int64_t batch, int sms, bool split_ok,
                         const Overrides& o);

// The small-M kernel (matmul_gemv.cu): out = act(A B + bias) for M <= kGemvMaxM rows, both
// operands K-major (a linear layer's forward: x [M, K], W [N, K]). Taken under
// matmul.kernel=auto without a forced tile width or piece count (those pin the Hopper
// kernel); plan.cpp says why these bounds.
constexpr int kGemvMaxM = 32;
bool use_gemv(int64_t M, int64_t N, int64_t K, int64_t batch, bool both_kmajor, int sms,
              const Overrides& o);

// "hopper bn=256 splits=1": the form torch.ops.fused._plan returns.
std::string describe(const Schedule& s);

}  // namespace matmul
}  // namespace fused
