// The Hopper GEMM's schedule (plan.h).
#include "cuda/matmul/plan.h"

#include <algorithm>
#include <limits>
#include <sstream>

namespace fused {
namespace matmul {

// The schedule (docs/design/matmul.md, "Schedules"): the tile width BN (128 x 256 or
// 128 x 128) and the K pieces per tile (split-K). A grid with at least one 128 x 256 tile per
// SM keeps the wide tile and the whole K (the tail wave is at most one tile per SM). A smaller
// grid (the weight gradients of narrow layers: small M N, long K; decode shapes) takes the
// (BN, splits) of least estimated time, in units of one SM running one 128 x 256 x 64 k-tile:
//   waves    = ceil(tiles(BN) * splits / SMs)
//   per unit = ceil(k_tiles / splits) * (BN / 256) / eff(BN),  eff(256) = 1, eff(128) = 0.92
//              (the narrow tile reads 4/3 the bytes per FLOP from L2 and shared memory)
//   fixup    = (1 + splits) * (BN / 256) for splits > 1: the last piece of a tile writes its
//              fp32 partial and reads all `splits` back (~0.8 k-tile each at ~64 B/clk from L2)
//   time     = waves * per unit + fixup
// with splits from 1 to min(16, k_tiles / 4) (each piece keeps the 4-6 stage pipeline busy),
// 1 where split-K cannot store (split_ok false). Ties keep the wider tile and fewer pieces.
// The overrides matmul.tile_n / matmul.split_k force the width / the pieces (the other is
// then chosen by the same estimate; a forced piece count is capped at the K tiles).
Schedule choose_schedule(int64_t M, int64_t N, int64_t K, int64_t batch, int sms, bool split_ok,
                         const Overrides& o) {
  constexpr int kAuto = Overrides::kAuto;
  const int force_bn = o.matmul_tile_n, force_splits = o.matmul_split_k;
  const int64_t k_tiles = (K + 63) / 64;
  const auto tiles_for = [&](int bn) { return ((M + 127) / 128) * ((N + bn - 1) / bn) * batch; };
  Schedule best{256, 1};
  const bool small = tiles_for(256) < sms;
  if (force_bn == kAuto && force_splits == kAuto && !small) return best;
  double best_time = std::numeric_limits<double>::infinity();
  for (int bn : {256, 128}) {
    if (force_bn != kAuto && bn != force_bn) continue;
    const int64_t tiles = tiles_for(bn);
    int64_t lo = 1;
    int64_t hi = split_ok && small ? std::max<int64_t>(1, std::min<int64_t>(16, k_tiles / 4)) : 1;
    if (force_splits != kAuto) lo = hi = split_ok ? std::min<int64_t>(force_splits, k_tiles) : 1;
    for (int64_t splits = lo; splits <= hi; ++splits) {
      const int64_t waves = (tiles * splits + sms - 1) / sms;
      const double width = bn / 256.0, eff = bn == 256 ? 1.0 : 0.92;
      const double per_unit = double((k_tiles + splits - 1) / splits) * width / eff;
      const double fixup = splits > 1 ? (1.0 + splits) * width : 0.0;
      const double time = waves * per_unit + fixup;
      if (time < best_time) {
        best_time = time;
        best = {bn, static_cast<int>(splits)};
      }
    }
  }
  return best;
}

// The small-M kernel (docs/design/matmul.md, "Small M"). A GEMM with few rows is
// memory-bound on the weight: 2 N K bytes against 2 M N K FLOPs, M FLOPs a byte, while an H200
// streams ~4.3 TB/s and its mma.sync units do ~500 TFLOP/s (~115 FLOPs a byte), so up to
// M = 32 the tensor-core tiles' 128-row height only adds waste, prologue and (split-K)
// reduction traffic. The small-M kernel streams each weight row once with 16-byte loads and
// multiplies it by all M rows of A in mma.sync (A's rows as the MMA's N side). Its blocks each
// take 16 weight rows and the whole K, so it needs enough of them for the SMs: at least half
// a block per SM, or a short K (<= 8192: a few microseconds whatever the grid).
bool use_gemv(int64_t M, int64_t N, int64_t K, int64_t batch, bool both_kmajor, int sms,
              const Overrides& o) {
  if (o.matmul_kernel != Overrides::MatmulKernel::kAuto || o.matmul_tile_n != Overrides::kAuto ||
      o.matmul_split_k != Overrides::kAuto) {
    return false;
  }
  if (!both_kmajor || M < 1 || M > kGemvMaxM || K < 1 || batch > 65535) return false;
  const int64_t blocks = (N + 15) / 16 * batch;
  return blocks * 2 >= sms || K <= 8192;
}

std::string describe(const Schedule& s) {
  std::ostringstream out;
  out << "hopper bn=" << s.bn << " splits=" << s.splits;
  return out.str();
}

}  // namespace matmul
}  // namespace fused
