// The norm dispatch table (plan.h). Pure: no CUDA, no device queries, no environment.
#include "cuda/norm/plan.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <sstream>

namespace fused {
namespace norm {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int next_pow2(int64_t v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}
int round_up(int64_t v, int m) { return static_cast<int>((v + m - 1) / m * m); }
int64_t grid_for(int64_t blocks) {
  return std::min<int64_t>(std::max<int64_t>(blocks, 1), 1 << 30);
}
// n where n is one of N, else 0.
template <int... N>
int fixed_tpr(int64_t n, std::integer_sequence<int, N...>) {
  return ((n == N ? N : 0) + ...);
}

int elem_size(c10::ScalarType t) { return t == c10::ScalarType::Float ? 4 : 2; }

// What every step of a problem shares: its vector width and the type conditions of the
// compile-time-shaped kernels.
struct Shape {
  int vec;          // elements a vector (1: the scalar path)
  int64_t nvec;     // vectors a row
  int sr;           // bytes of a row element
  bool is16;        // 16-bit x
  bool fixed;       // 16-bit rows, parameters and rows in x's dtype, vector path
  bool has_wide;    // the wide forward exists: rows in x's dtype, vector path
  bool fixed_wide;  // ... and parameters in x's dtype too
  bool fixed_bwd;   // norm_bwd_fixed's types: 16-bit or float32, everything in x's dtype
  int drop;         // the dropout forms' input stage (forward steps' DROP)
  bool span;        // rows off the grid on the vector path (norm_fwd_regs' SPAN)

  // allow_span: a forward whose rows are off the grid may take the span path.
  Shape(const Problem& p, bool allow_span) {
    const int sx = elem_size(p.x);
    const int vw = 16 / sx;
    const bool on_grid = p.aligned && p.cols % vw == 0;
    span = !on_grid && allow_span && p.same_phase && p.r == p.x && !p.dropout;
    vec = on_grid || span ? vw : 1;
    // A span: the row's vectors plus the head's and the tail's partial ones, at most.
    nvec = span ? (p.cols + 2 * vw - 2) / vw : p.cols / vec;
    sr = elem_size(p.r);
    is16 = sx == 2;
    const bool same = p.w == p.x && p.r == p.x;
    fixed = vec > 1 && is16 && same && !span;
    has_wide = vec > 1 && p.r == p.x;
    fixed_wide = has_wide && p.w == p.x && !span;
    fixed_bwd = vec > 1 && same && !span;  // x is 16-bit or float32
    drop = p.dropout ? 1 : 0;
  }
};

// The forward's shape: the span path where norm_fwd_regs holds the row (the wide variant's
// 8 vectors a thread, 1024 threads), else the scalar path for rows off the grid.
Shape forward_shape(const Problem& p) {
  const Shape s(p, true);
  if (s.span && ceil_div(s.nvec, kFwdWideVpt) > kFwdMaxThreads) return Shape(p, false);
  return s;
}

Step fwd_step(Kernel k, const Shape& s, int vpt, int layer, int res, int fixed, int tpr,
              int threads, int64_t blocks, int smem = 0) {
  Step st;
  st.kernel = k;
  st.vec = s.vec;
  st.vpt = vpt;
  st.layer = layer;
  st.res = res;
  st.fixed = fixed;
  st.tpr = tpr;
  st.threads = threads;
  st.blocks = blocks;
  st.smem = smem;
  st.drop = s.drop;
  st.span = s.span ? 1 : 0;
  return st;
}

// norm_bwd_regs' shape for `need` threads a row: a row group a block, or several of under
// kBwdBlock threads.
Step bwd_regs_step(const Problem& p, const Shape& s, int vpt, int pf, int stages, int64_t need) {
  Step st;
  st.kernel = Kernel::kBwdRegs;
  st.vec = s.vec;
  st.vpt = vpt;
  st.pf = pf;
  st.stages = stages;
  st.res = p.dsum;
  st.span = s.span ? 1 : 0;
  st.tpr = need <= 32 ? next_pow2(need) : round_up(need, 32);
  const int groups = std::max(1, kBwdBlock / st.tpr);
  st.threads = st.tpr * groups;
  st.blocks = ceil_div(p.rows, groups);  // row groups; the launcher caps it by residency
  return st;
}

}  // namespace

Plan plan_forward(const Problem& p, const GpuProps& gpu, const Overrides& o) {
  Plan plan;
  const Shape s = forward_shape(p);
  const bool fixed_on = o.norm_fixed;
  const int layer = p.layer ? 1 : 0, res = p.residual ? 1 : 0;
  const int64_t rows_grid = grid_for(p.rows);
  // float32 layer norm rows of 8192 on the wide variant at 256 threads, shaped at compile time.
  if (s.fixed_wide && !s.is16 && fixed_on && p.layer && !p.residual &&
      p.cols == 256 * kFwdWideVpt * s.vec) {
    plan.add(fwd_step(Kernel::kFwdWideFixed, s, kFwdWideVpt, 1, 0, 256, 256, 256, rows_grid));
    return plan;
  }
  // norm_fwd_fixed: the common 16-bit hidden sizes, a block a row.
  if (s.fixed && fixed_on && p.rows <= (int64_t{1} << 30)) {
    const int tpr = fixed_tpr(p.cols / (kFixedVpt * s.vec), FixedTprs{});
    if (p.cols % (kFixedVpt * s.vec) == 0 && tpr > 0) {
      plan.add(fwd_step(Kernel::kFwdFixed, s, kFixedVpt, layer, res, tpr, tpr, tpr, p.rows));
      return plan;
    }
  }
  const int vpt = s.vec == 1 ? 8 : 64 / (s.vec * s.sr);
  const int64_t need = ceil_div(s.nvec, vpt);  // threads a row
  const int64_t need_wide = ceil_div(s.nvec, kFwdWideVpt);
  // (Span rows keep 4 vectors a thread up to 1024 threads: the wide variant's 8 vectors and
  // the shifted parameter loads do not fit its 64 registers without spills.)
  const int64_t wide_from = s.span ? kFwdMaxThreads : kFwdWideThreads;
  if (s.has_wide && !p.residual && need > wide_from && need_wide <= kFwdMaxThreads) {
    // Plain rows past 512 threads at 4 vectors: the wide variant, a row a block; shaped at
    // compile time where every thread's 8 vectors are whole.
    if (s.fixed_wide && fixed_on) {
      for (int tpr : {384, kFwdWideThreads, kFwdMaxThreads}) {
        if (p.cols == int64_t{tpr} * kFwdWideVpt * s.vec) {
          plan.add(
              fwd_step(Kernel::kFwdWideFixed, s, kFwdWideVpt, layer, 0, tpr, tpr, tpr, rows_grid));
          return plan;
        }
      }
    }
    const int tpr = round_up(need_wide, 32);
    plan.add(fwd_step(Kernel::kFwdRegs, s, kFwdWideVpt, layer, 0, 0, tpr, tpr, rows_grid));
    return plan;
  }
  if (s.fixed && fixed_on && p.residual && s.nvec == int64_t{kFwdMaxThreads} * vpt) {
    // The add forms at 32768 16-bit elements: 1024 threads, shaped at compile time (the wide
    // variant would spill next to the residual).
    plan.add(fwd_step(Kernel::kFwdRegs, s, vpt, layer, 1, kFwdMaxThreads, kFwdMaxThreads,
                      kFwdMaxThreads, rows_grid));
    return plan;
  }
  if (s.has_wide && p.residual && need > kFwdMaxThreads && need_wide <= kFwdMaxThreads) {
    // The add forms' rows past 4 vectors a thread: the wide variant, the residual staged in
    // shared memory (refused where it does not fit a block: then norm_fwd_long).
    const int tpr = round_up(need_wide, 32);
    const int fixed =
        s.fixed_wide && fixed_on && p.cols == int64_t{kFwdMaxThreads} * kFwdWideVpt * s.vec
            ? kFwdMaxThreads
            : 0;
    plan.add(fwd_step(Kernel::kFwdRegs, s, kFwdWideVpt, layer, kStagedRes, fixed, tpr, tpr,
                      rows_grid, kFwdWideVpt * tpr * 16));
  } else if (need <= kFwdMaxThreads) {
    // A power-of-two group of <= 32 threads a row, several rows a 128-thread block; or whole
    // warps, a row a block. The scalar path reads the layer / residual flags at run time.
    const int tpr = need <= 32 ? next_pow2(need) : round_up(need, 32);
    const int threads = tpr <= 32 ? kFwdShortThreads : tpr;
    const int groups = threads / tpr;
    plan.add(fwd_step(Kernel::kFwdRegs, s, vpt, s.vec == 1 ? kRuntime : layer,
                      s.vec == 1 ? kRuntime : res, 0, tpr, threads,
                      grid_for(ceil_div(p.rows, groups))));
    return plan;
  }
  Step st = fwd_step(Kernel::kFwdLong, s, 0, layer, res, 0, kLongThreads, kLongThreads,
                     grid_for(std::min<int64_t>(p.rows, 4 * int64_t{gpu.num_sms})));
  if (s.span) st.vec = 1, st.span = 0;  // the staged span step refused: the scalar long rows
  plan.add(st);
  return plan;
}

// The backward's shape: the span path where norm_bwd_regs' prefetching variant holds the row
// (up to 512 threads), else the scalar path for rows off the grid.
Shape backward_shape(const Problem& p) {
  const Shape s(p, true);
  const int pf_vpt = 32 / (s.vec * s.sr);
  if (s.span && ceil_div(s.nvec, pf_vpt) > kBwdMaxThreads) return Shape(p, false);
  return s;
}

Plan plan_backward(const Problem& p, const GpuProps& gpu, const Overrides& o) {
  Plan plan;
  const Shape s = backward_shape(p);
  const int dsum = p.dsum ? 1 : 0, layer = p.layer ? 1 : 0;
  // norm_bwd_warp: 16-bit rows of 32-64 vectors, a warp a row.
  if (s.fixed && s.nvec >= 32 && s.nvec <= 64 && o.norm_bwd_warp) {
    Step st;
    st.kernel = Kernel::kBwdWarp;
    st.vec = s.vec;
    st.vpt = s.nvec <= 32 ? 1 : 2;
    st.res = dsum;
    // The prefetching variant for the plain norms; the add forms' third stream does better
    // at 24 warps without it.
    st.pf = o.norm_bwd_pf == Overrides::kAuto ? !p.dsum : o.norm_bwd_pf;
    const int limit = st.pf ? 512 : 768;  // the kernel's launch bound
    const int warps = o.norm_bwd_warps == Overrides::kAuto ? limit / 32 : o.norm_bwd_warps;
    TORCH_CHECK(warps <= limit / 32, "fused overrides: norm.bwd_warps=", warps,
                " is past norm_bwd_warp's launch bound of ", limit / 32, " warps ",
                st.pf ? "with" : "without", " prefetch (norm.bwd_pf)");
    st.threads = 32 * warps;
    st.tpr = 32;
    st.blocks = ceil_div(p.rows, warps);
    st.smem = 16 * st.vpt * 2 * 32 * p.grads * warps;  // a warp's slice a parameter gradient
    plan.add(st);
  }
  // norm_bwd_bulk (sm_90): 16-bit rows of 65-128 vectors, a row a pair of warps.
  if (s.fixed && s.nvec > 64 && s.nvec <= 64 * kBulkBwdVpt && o.norm_bwd_bulk && gpu.sm90_code) {
    Step st;
    st.kernel = Kernel::kBwdBulk;
    st.vec = s.vec;
    st.vpt = kBulkBwdVpt;
    st.layer = layer;
    st.res = dsum;
    // A pair's slots: 4 (three rows in flight) at 776-1024 columns; shorter rows measured
    // best with 3 (plain norms) or 2 (add forms).
    const int fit = s.nvec > 96 ? 4 : p.dsum ? 2 : 3;
    st.stages = o.norm_bwd_bulk_stages == Overrides::kAuto ? fit : o.norm_bwd_bulk_stages;
    st.threads = kBulkBwdThreads;
    st.tpr = 64;
    st.blocks = ceil_div(p.rows, kBulkBwdThreads / 64);
    st.smem = (kBulkBwdThreads / 64) * st.stages * (2 + dsum) * 64 * kBulkBwdVpt * 8 * 2;
    plan.add(st);
  }
  // norm_bwd_fixed (sm_90): the sweep's best shape per row length, TPB threads x CS blocks.
  if (s.fixed_bwd && o.norm_fixed && gpu.sm90_code) {
    int tpb = 0, cs = 0;
    if (!s.is16) {
      if (p.cols == 12288) tpb = 192, cs = 8;
      if (p.cols == 16384) tpb = 256, cs = 8;
    } else {
      switch (p.cols) {
        case 4096:
          tpb = 128, cs = 2;
          break;
        case 5120:
          tpb = 160, cs = 2;
          break;
        case 8192:
          tpb = 256, cs = 2;
          break;
        case 12288:
          tpb = 192, cs = 4;
          break;
        case 16384:
          tpb = 256, cs = 4;
          break;
        case 32768:
          tpb = 256, cs = 8;
          break;
      }
    }
    if (tpb > 0) {
      Step st;
      st.kernel = Kernel::kBwdFixed;
      st.vec = s.vec;
      st.vpt = kFixedBwdVpt;
      st.layer = layer;
      st.res = dsum;
      st.fixed = tpb;
      st.cluster = cs;
      st.lag = 1;
      st.tpr = tpb * cs;
      st.threads = tpb;
      st.blocks = std::min<int64_t>(p.rows, 1 << 30) * cs;  // the launcher caps it by residency
      st.smem = 3 * 2 * kFixedBwdVpt * tpb * 16;
      plan.add(st);
    }
  }
  // norm_bwd_regs: the prefetching variant while a row fits 512 threads at its width (16-bit
  // rows: 8K columns; float32 rows: 4K), float32 rows staged in shared memory first; then
  // (float32 4K-8K) 16 elements a thread without prefetch.
  const int vpt = kBwdElems / s.vec;
  const int64_t need = ceil_div(s.nvec, vpt);
  const int pf_vpt = s.vec > 1 ? 32 / (s.vec * s.sr) : vpt;
  if (s.vec > 1) {
    const int64_t need_pf = ceil_div(s.nvec, pf_vpt);
    if (need_pf <= kBwdMaxThreads) {
      if (s.sr == 4 && o.norm_stage && !s.span) {
        plan.add(bwd_regs_step(p, s, pf_vpt, 1, kBwdStages, need_pf));
      }
      plan.add(bwd_regs_step(p, s, pf_vpt, 1, 0, need_pf));
      return plan;
    }
  }
  if ((s.vec == 1 || pf_vpt != vpt) && need <= kBwdMaxThreads) {
    plan.add(bwd_regs_step(p, s, vpt, 0, 0, need));
    return plan;
  }
  // Rows too long for one block, on sm_90: a cluster of up to 16 blocks a row; the smallest
  // power-of-two cluster of up to 8 blocks of 256 threads (several blocks an SM: some stream
  // while others wait for their row sums), then of 512, then 16 blocks.
  if (gpu.sm90_code) {
    const int cvpt = std::max(1, kClusterElems / s.vec);
    const int64_t cneed = ceil_div(s.nvec, cvpt);
    if (cneed <= int64_t{kMaxCluster} * kBwdMaxThreads) {
      const int per_block = cneed > 8 * 256 ? kBwdMaxThreads : 256;
      int csize = 1;
      while (int64_t{csize} * per_block < cneed) csize *= 2;
      Step st;
      st.kernel = Kernel::kBwdCluster;
      st.vec = s.vec;
      st.vpt = cvpt;
      st.res = dsum;
      st.cluster = csize;
      st.lag = s.sr == 2 && s.vec > 1 ? 1 : 0;
      st.threads = round_up(ceil_div(cneed, csize), 32);
      st.tpr = st.threads * csize;
      st.blocks = std::min<int64_t>(p.rows, 1 << 30) * csize;
      plan.add(st);
    }
  }
  // Everything else: the two row sums first, then column tiles x row chunks.
  Step st;
  st.kernel = Kernel::kBwdTwoPass;
  st.vec = s.vec;
  st.res = dsum;
  st.threads = kLongThreads;
  st.blocks = grid_for(std::min<int64_t>(p.rows, 4 * int64_t{gpu.num_sms}));
  plan.add(st);
  return plan;
}

const char* kernel_name(Kernel k) {
  switch (k) {
    case Kernel::kFwdWideFixed:
      return "norm_fwd_regs(fixed)";
    case Kernel::kFwdFixed:
      return "norm_fwd_fixed";
    case Kernel::kFwdRegs:
      return "norm_fwd_regs";
    case Kernel::kFwdLong:
      return "norm_fwd_long";
    case Kernel::kBwdWarp:
      return "norm_bwd_warp";
    case Kernel::kBwdBulk:
      return "norm_bwd_bulk";
    case Kernel::kBwdFixed:
      return "norm_bwd_fixed";
    case Kernel::kBwdRegs:
      return "norm_bwd_regs";
    case Kernel::kBwdCluster:
      return "norm_bwd_cluster";
    case Kernel::kBwdTwoPass:
      return "norm_bwd_row_sums+norm_bwd_tiles";
  }
  return "?";
}

std::string describe(const Plan& plan) {
  std::ostringstream out;
  for (int i = 0; i < plan.n; ++i) {
    const Step& s = plan.steps[i];
    out << (i ? "\n" : "") << kernel_name(s.kernel) << " vec=" << s.vec << " vpt=" << s.vpt
        << " layer=" << s.layer << " res=" << s.res << " fixed=" << s.fixed
        << " cluster=" << s.cluster << " lag=" << s.lag << " pf=" << s.pf << " stages=" << s.stages
        << " tpr=" << s.tpr << " threads=" << s.threads << " blocks=" << s.blocks
        << " smem=" << s.smem;
    if (s.drop) out << " drop=" << s.drop;
    if (s.span) out << " span=" << s.span;
  }
  return out.str();
}

}  // namespace norm
}  // namespace fused
