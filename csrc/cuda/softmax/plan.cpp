// The softmax dispatch table (plan.h). Pure: no CUDA, no device queries, no environment.
#include "cuda/softmax/plan.h"

#include <algorithm>
#include <limits>
#include <sstream>

namespace fused {
namespace softmax {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t next_pow2(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

// softmax_kernel: BLOCK threads, row groups of tpr, P vectors a thread.
Step rows_step(const Problem& p, int vec, int pv, int block, int64_t tpr, bool is16) {
  Step s;
  s.kernel = Kernel::kRows;
  s.vec = vec;
  s.span = vec > 1 && !whole_vectors(p, vec);
  s.p = pv;
  s.block = block;
  s.tpr = static_cast<int>(tpr);
  s.n = 1;
  // 16-bit causal rows in blocks of up to 512 threads take the variant that skips the
  // vectors past a row's limit; the others mask element by element (float32 causal rows of
  // 2048 measured faster that way).
  s.causal = p.causal_q != 0 && block <= 512 && is16;
  s.blocks = ceil_div(p.rows, block / tpr);
  return s;
}

}  // namespace

Plan plan(const Problem& p, const GpuProps& gpu, const Overrides& o) {
  Plan plan;
  const bool is16 = p.dtype != c10::ScalarType::Float;
  const int v = is16 ? 8 : 4;
  const bool vec = p.same_phase;
  const bool whole = whole_vectors(p, v);
  const bool clusters = o.softmax_cluster && gpu.sm90_code;  // else every cluster is refused
  if (vec) {
    // softmax_fwd_staged: plain forward rows past the block-per-row kernels' limit, in at
    // most kMaxCluster even shares; past one share only where clusters run. Rows that are
    // not whole vectors take its run-time-shaped form (N = 0), which masks a row's span.
    const int64_t nvec = span_vectors(p, v);
    const int64_t n = ceil_div(nvec, kStagedShareVecs);
    if (p.forward && o.softmax_staged && nvec > kStagedMinVecs && n <= kMaxCluster &&
        p.causal_q == 0 && p.scale > 0 && p.scale <= std::numeric_limits<float>::max() &&
        p.rows > 0 && p.rows <= std::numeric_limits<int>::max() && (n == 1 || clusters)) {
      Step s;
      s.kernel = Kernel::kStaged;
      s.vec = v;
      s.span = !whole;
      s.block = kStagedBlock;
      s.n = static_cast<int>(n);
      s.share = static_cast<int>(ceil_div(nvec, n));
      // Shaped at compile time where every share is whole and n a power of two.
      s.fixed = whole && s.share == kStagedShareVecs && nvec == n * s.share && (n & (n - 1)) == 0
                    ? s.n
                    : 0;
      s.blocks = p.rows;
      plan.add(s);  // refused where its shared memory or cluster does not fit here
    }
    // softmax_causal_fwd: 16-bit causal forward rows of 32 .. 1024 threads at 2 vectors.
    const int64_t ctpr = next_pow2(ceil_div(nvec, kCausalVectors));
    constexpr int64_t kMax = std::numeric_limits<int32_t>::max();  // Div31's range
    if (whole && p.forward && is16 && o.softmax_causal && p.causal_q != 0 && ctpr >= 32 &&
        ctpr <= kCausalMaxTpr && p.rows <= kMax && p.causal_q <= kMax) {
      Step s;
      s.kernel = Kernel::kCausal;
      s.vec = v;
      s.p = kCausalVectors;
      s.tpr = static_cast<int>(ctpr);
      s.block = std::max(128, s.tpr);
      s.blocks = ceil_div(p.rows, std::max<int64_t>(1, 128 / ctpr));
      plan.add(s);
      return plan;
    }
  }
  const int vw = vec ? v : 1;
  const int pv = vectors_per_thread(vw);
  const int64_t span = vec ? span_vectors(p, v) * v : p.len;  // the columns a row's threads cover
  const int64_t nvec = ceil_div(span, vw);
  const int64_t tpr = next_pow2(ceil_div(nvec, pv));
  if (vec && p.causal_q == 0 && tpr >= 128 && tpr <= 512 && nvec <= 3 * tpr) {
    // A row of (2, 3] x tpr vectors: tpr / 2 threads of kWideP vectors, 4-6 live each
    // against 2-3 of 4 in tpr threads, so an SM holds more of its rows in flight (the bf16
    // 16384x4097 forward: 5 blocks of 128 threads x 513 vectors, 41 KB, not 2 of 256, 16 KB).
    const int64_t half = tpr / 2;
    const int block = static_cast<int>(std::max<int64_t>(half, o.softmax_min_block));
    plan.add(rows_step(p, vw, kWideP, block, half, is16));
    return plan;
  }
  if (tpr <= 128) {
    // Rows of tpr threads in blocks of max(tpr, min_block): a 32-thread row is a 1-warp
    // block by default (its resources freed when its row is done).
    const int mb = o.softmax_min_block;
    if (vw == 4 && p.forward) {
      // float32 forward rows of up to 1024 columns: 8 vectors a thread, so that a warp holds
      // a row (shuffles only). Not the backward: its double sums spill at 8 vectors.
      const int64_t tpr8 = next_pow2(ceil_div(nvec, 8));
      if (tpr8 <= 32 && mb == 32) {
        plan.add(rows_step(p, vw, 8, 32, tpr8, is16));
        return plan;
      }
    }
    plan.add(rows_step(p, vw, pv, static_cast<int>(std::max<int64_t>(tpr, mb)), tpr, is16));
    return plan;
  }
  if (tpr == 256 || tpr == 512) {
    plan.add(rows_step(p, vw, pv, static_cast<int>(tpr), tpr, is16));
    return plan;
  }
  // Longer rows, on sm_90: persistent clusters of n <= 16 blocks of 512 threads, even shares
  // of the row (whole vectors), the row read once, the next rows' loads in flight. Past
  // max_cluster blocks of P vectors a thread, 2P on the 16-byte path where rows are whole
  // vectors (its rows are staged by the copy engine from the 16-byte grid).
  if (clusters) {
    const int64_t per_block = int64_t{kSplitBlock} * pv * vw;
    int64_t n = ceil_div(span, per_block);
    int cp = pv;
    if (vw > 1 && whole && n > o.softmax_max_cluster) {
      cp = 2 * pv;
      n = ceil_div(span, 2 * per_block);
    }
    if (n <= kMaxCluster) {
      Step s;
      s.kernel = Kernel::kCluster;
      s.vec = vw;
      s.span = vw > 1 && !whole;
      s.p = cp;
      s.block = kSplitBlock;
      s.tpr = kSplitBlock;
      s.n = static_cast<int>(n);
      s.blocks = p.rows;  // clusters: the launcher caps it by residency
      plan.add(s);
    }
  }
  if (tpr == 1024) {
    plan.add(rows_step(p, vw, pv, 1024, 1024, is16));
    return plan;
  }
  // Split: chunks of kSplitBlock * P vectors, reductions written to a workspace, then
  // combined by each chunk's block in a second launch.
  Step s = rows_step(p, vw, pv, kSplitBlock, kSplitBlock, is16);
  s.kernel = Kernel::kSplit;
  s.n = static_cast<int>(ceil_div(span, int64_t{kSplitBlock} * pv * vw));
  plan.add(s);
  return plan;
}

const char* kernel_name(Kernel k) {
  switch (k) {
    case Kernel::kStaged:
      return "softmax_fwd_staged";
    case Kernel::kCausal:
      return "softmax_causal_fwd";
    case Kernel::kRows:
      return "softmax_kernel";
    case Kernel::kCluster:
      return "softmax_cluster_kernel";
    case Kernel::kSplit:
      return "softmax_kernel(split)";
  }
  return "?";
}

std::string describe(const Plan& plan) {
  std::ostringstream out;
  for (int i = 0; i < plan.n; ++i) {
    const Step& s = plan.steps[i];
    out << (i ? "\n" : "") << kernel_name(s.kernel) << " vec=" << s.vec << " p=" << s.p
        << " block=" << s.block << " tpr=" << s.tpr << " n=" << s.n << " fixed=" << s.fixed
        << " share=" << s.share << " causal=" << s.causal << " span=" << s.span
        << " blocks=" << s.blocks;
  }
  return out.str();
}

}  // namespace softmax
}  // namespace fused
