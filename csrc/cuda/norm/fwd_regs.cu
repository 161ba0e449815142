// norm_fwd_regs: the forward with the row in registers, read from memory once (plan.h: the
// rows it takes). A row group of `tpr` threads owns a row: a power of two <= 32 (several rows
// per 128-thread block, warp-shuffle reductions) for short rows, whole warps (one row per
// block) for long ones. Mean, then the centered sum of squares over the registers (two
// passes, no E[x^2] - E[x]^2 cancellation). Layer norm sums x - x0 (x0 = the row's first
// element), so a constant row gets mean = x0 and xhat = 0 exactly. Layer / residual are
// compile-time flags on the 16-byte path. The wide variant holds 8 vectors a thread; the add
// forms' rows past 4 vectors a thread take it with the residual staged in shared memory.

#include "common/stage.cuh"
#include "cuda/norm/families.h"

namespace fused {
namespace norm {
namespace {

// norm_fwd_regs' launch bound: any block size up to 1024 threads, hence at most 64
// registers per thread, so launch shapes whose blocks tile 1024 threads keep >= 32 warps
// resident per SM (enough loads in flight to cover the memory latency while other rows
// reduce); one-row blocks of 544-992 threads fit once an SM (17-31 warps).
// (kFwdMaxThreads in plan.h.)

// A compile-time flag of norm_fwd_regs can be kRuntime (plan.h): read from the parameters
// (the scalar path, which is not worth 4 instantiations per dtype).

// Vectors per thread in norm_fwd_regs: 64 bytes of row per thread on the
// 16-byte path (4 vectors of 16-bit or float32 rows, 2 of a float32 residual stream with
// 16-bit x), 8 elements on the scalar path.
template <typename R, int VEC>
constexpr int fwd_vpt() {
  return VEC == 1 ? 8 : 64 / (VEC * static_cast<int>(sizeof(R)));
}
// The wide variant for plain rows the default would give more than 512 threads (16-bit
// rows of 16K-32K, float32 rows of 8K-16K): 8 vectors per thread (still 64 registers), so
// blocks of up to 512 threads, two per SM, and one block's loads cover the other's
// reductions (one 1024-thread block per SM would idle in them). Up to 1024 threads (one
// block per SM) for the rows of up to twice that: float32 16K-32K, 16-bit 32K-64K, which
// would otherwise take norm_fwd_long's two reads. (Also float32 layer norm rows of 8192,
// at 256 threads, shaped at compile time: forward_with.)
// (kFwdWideVpt, kFwdWideThreads in plan.h.)

// FIXED_TPR > 0: the row length is FIXED_TPR * VPT * VEC and tpr == FIXED_TPR, both known at
// compile time (no per-vector bounds checks, constant index math), as norm_fwd_fixed does
// for shorter rows; used for the wide variant's rows whose every vector is whole
// (launch_wide_fixed: VPT 8 at 256-1024 threads; forward_add_wide: VPT 8 at 1024 threads,
// the add forms' float32 32768 / 16-bit 65536) and for the add forms at 32768 16-bit
// elements (VPT 4, 1024 threads).
// RES == kStagedRes: the add forms on the wide variant (T == R, rows past what 4 vectors a
// thread hold): the residual is not held in registers (next to x's 8 vectors it would
// spill) but copied by each thread into its own slots of dynamic shared memory ([VPT][tpr]
// vectors, cp.async, in flight with x's loads) and read back by the same thread after
// stage_wait (no barrier).
// (kStagedRes in plan.h.)
// DROP: the dropout forms' input stage (drop_input) on x before the residual add (1, or
// kRuntime: p.drop.on); built only for the add forms.
// SPAN: rows off the 16-byte grid (odd widths, views at odd offsets; x, residual, y and sum at
// one offset): each row read as the 16-byte vectors of its aligned span (common.cuh), the
// neighbours' elements left out of the sums, the edge vectors stored element by element, the
// parameters loaded at the row's shift (param_span).
template <typename T, typename W, typename R, int VEC, int VPT, int LAYER, int RES,
          int FIXED_TPR = 0, int DROP = 0, int SPAN = 0>
__global__ void __launch_bounds__(kFwdMaxThreads, 1) norm_fwd_regs(FwdParams<T, W, R> p, int tpr) {
  grid_dependency_wait();  // launched early (launch_early): nothing global before this
  constexpr bool kFixed = FIXED_TPR > 0;
  constexpr int kFixedCols = FIXED_TPR * VPT * VEC;
  if constexpr (kFixed) tpr = FIXED_TPR;  // the launcher passes the same: a constant here
  // Two scratch slots, alternated by consecutive reductions (mean, variance, next row's
  // ...), so each reduction needs one barrier: a slot is written again only after the
  // other slot's barrier, which every thread reaches after reading this one.
  __shared__ float scratch[2][1][32];
  int slot = 0;
  const bool layer = LAYER == kRuntime ? p.layer : LAYER == 1;
  const bool res = RES == kRuntime ? p.residual != nullptr : RES >= 1;
  const bool drop = DROP == kRuntime ? p.drop.on : DROP == 1;
  const DropSeed dseed = drop ? drop_seed(p) : DropSeed{};
  constexpr bool kStaged = RES == kStagedRes;
  static_assert(!kStaged || (std::is_same_v<T, R> && VEC > 1), "staged: rows in x's dtype");
  constexpr bool kSpan = SPAN == 1;
  static_assert(!kSpan || (std::is_same_v<T, R> && VEC > 1 && !kFixed && DROP == 0),
                "span: rows in x's dtype, the 16-byte path, shaped at run time, no dropout");
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  auto* rstage = reinterpret_cast<Raw<R, VEC>*>(dyn_smem);  // [VPT][tpr] when kStaged
  const RowGroup g(tpr);
  const int64_t cols = kFixed ? kFixedCols : p.cols;
  const int nvec = static_cast<int>(cols / VEC);
  const float inv_n = 1.f / static_cast<float>(cols);
  const int64_t step = static_cast<int64_t>(gridDim.x) * g.groups;
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * g.groups; first < p.rows; first += step) {
    const int64_t row = first + g.group;
    const bool valid = row < p.rows;
    const int64_t off = row * cols;
    // Vector i of the row, if this thread holds it, sits at vbase + col(i) * VEC; it holds
    // columns c0(i) .. c0(i) + VEC - 1 (the span's head shifts them: kSpan).
    const int head = kSpan ? span_head<VEC>(p.phase, off) : 0;
    const int64_t vbase = off - head;
    const int rvec = kSpan ? (head + static_cast<int>(cols) + VEC - 1) / VEC : nvec;
    auto col = [&](int i) { return i * tpr + g.lane; };
    auto c0 = [&](int i) { return col(i) * VEC - head; };
    auto live = [&](int i) { return valid && (kFixed || col(i) < rvec); };
    // Element j of vector i is one of the row's (always, off the span path).
    auto in = [&](int i, int j) {
      return !kSpan || span_whole<VEC>(c0(i), static_cast<int>(cols)) ||
             span_in(c0(i) + j, static_cast<int>(cols));
    };
    // All loads first (no store in between): VPT 16-byte loads per input in flight.
    const float shift = layer && valid ? row_first(p, off, res, drop, dseed) : 0.f;
    // v: the row in the sum's dtype (exactly what the unfused x + residual holds), kept as
    // packed words. When T == R, x is loaded straight into v (no second copy of the row).
    constexpr bool kSame = std::is_same_v<T, R>;
    Raw<R, VEC> v[VPT], rv[kStaged ? 1 : VPT];
    Raw<T, VEC> xsep[kSame ? 1 : VPT];
    auto xv = [&](int i) -> Raw<T, VEC>& {
      if constexpr (kSame) {
        return v[i];
      } else {
        return xsep[i];
      }
    };
    // The residual's vector i: in registers, or in this thread's shared-memory slot.
    auto resv = [&](int i) -> Raw<R, VEC>& {
      if constexpr (kStaged) {
        return rstage[i * tpr + g.lane];
      } else {
        return rv[i];
      }
    };
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      if (live(i)) {
        xv(i) = load_raw<T, VEC>(p.x + vbase + col(i) * VEC);
        const R* r = p.residual + vbase + col(i) * VEC;
        if constexpr (kStaged) {
          stage_vec(&resv(i), reinterpret_cast<const Raw<R, VEC>*>(r));
        } else if (res) {
          resv(i) = load_raw<R, VEC>(r);
        }
      }
    }
    if constexpr (kStaged) {
      stage_commit();
      stage_wait<0>();
    }
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      if (live(i)) {
        FVec<VEC> f = to_float(xv(i));
        if (drop) drop_input(f, p, off + col(i) * VEC, col(i) * VEC, dseed);
        if (res || !kSame) {
          if (res) {
            const FVec<VEC> r = to_float(resv(i));
#pragma unroll
            for (int j = 0; j < VEC; ++j) f.v[j] += r.v[j];
          }
          v[i] = from_float<R, VEC>(f);
          f = to_float(v[i]);
        }
#pragma unroll
        for (int j = 0; j < VEC; ++j) sum += in(i, j) ? f.v[j] - shift : 0.f;
      }
    }
    float mean = 0.f;
    if (layer) {
      float t[1] = {sum};
      group_sum<1>(t, tpr, scratch[slot], false);
      slot ^= 1;
      mean = shift + t[0] * inv_n;
    }
    float t[1] = {0.f};
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      if (live(i)) {
        const FVec<VEC> f = to_float(v[i]);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float d = in(i, j) ? f.v[j] - mean : 0.f;
          t[0] += d * d;
        }
      }
    }
    group_sum<1>(t, tpr, scratch[slot], false);
    slot ^= 1;
    const float rstd = rsqrtf(t[0] * inv_n + p.eps);
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      if (live(i)) {
        const int64_t e = vbase + col(i) * VEC;
        const int cl = static_cast<int>(cols);
        if (res) {
          if constexpr (kSpan) {
            store_span<R, VEC>(p.sum + e, v[i], c0(i), cl);
          } else {
            store_raw<R, VEC>(p.sum + e, v[i]);
          }
        }
        auto param = [&](const W* q, int ph, float dflt) {
          if constexpr (kSpan) {
            return param_span<W, VEC>(q, ph, c0(i), cl, dflt);
          } else {
            return param_or<W, VEC>(q, col(i), dflt);
          }
        };
        const FVec<VEC> w = param(p.weight, p.wphase, 1.f);
        FVec<VEC> o = to_float(v[i]);
        if (layer) {
          const FVec<VEC> b = param(p.bias, p.bphase, 0.f);
#pragma unroll
          for (int j = 0; j < VEC; ++j) o.v[j] = (o.v[j] - mean) * rstd * w.v[j] + b.v[j];
        } else {
#pragma unroll
          for (int j = 0; j < VEC; ++j) o.v[j] = o.v[j] * rstd * w.v[j];
        }
        if constexpr (kSpan) {
          store_span<T, VEC>(p.y + e, from_float<T, VEC>(o), c0(i), cl);
        } else {
          store_raw<T, VEC>(p.y + e, from_float<T, VEC>(o));
        }
      }
    }
    if (valid && g.lane == 0) {
      if (layer) p.mean[row] = mean;
      p.rstd[row] = rstd;
    }
  }
}

}  // namespace

// The kernel a kFwdRegs / kFwdWideFixed step names. Only the variants a plan can name for
// these types are built: the flags at run time on the scalar path; on the 16-byte path the
// plain forms where the rows are in x's dtype, the add forms always; the wide variant (8
// vectors) where the rows are in x's dtype; shaped at compile time where the parameters are
// too (and, at 1024 threads with 4 vectors, the 16-bit add forms).
template <typename T, typename W, typename R, int VEC>
bool fwd_regs(const FwdParams<T, W, R>& p, const Step& s) {
  constexpr int VPT = fwd_vpt<R, VEC>();
  constexpr bool kSame = std::is_same_v<T, R>;
  constexpr bool kHasWide = VEC > 1 && kSame;
  constexpr bool kFixedWide = kHasWide && std::is_same_v<T, W>;
  constexpr bool kFixed = kFixedWide && sizeof(T) == 2;
  using Kernel = void (*)(FwdParams<T, W, R>, int);
  Kernel kernel = nullptr;
  const bool layer = s.layer == 1;
  // The add forms' variants, with the dropout forms' input stage (D = 1) or without.
  auto add_forms = [&](auto drop) {
    constexpr int D = decltype(drop)::value;
    if (s.vpt == VPT && s.fixed == 0 && s.res == 1) {
      kernel = layer ? norm_fwd_regs<T, W, R, VEC, VPT, 1, 1, 0, D>
                     : norm_fwd_regs<T, W, R, VEC, VPT, 0, 1, 0, D>;
    }
    if constexpr (kFixed) {
      constexpr int kM = kFwdMaxThreads;
      if (s.vpt == VPT && s.fixed == kM && s.res == 1) {
        kernel = layer ? norm_fwd_regs<T, W, R, VEC, VPT, 1, 1, kM, D>
                       : norm_fwd_regs<T, W, R, VEC, VPT, 0, 1, kM, D>;
      }
    }
    if constexpr (kHasWide) {
      constexpr int V8 = kFwdWideVpt;
      if (s.vpt == V8 && s.fixed == 0 && s.res == kStagedRes) {
        kernel = layer ? norm_fwd_regs<T, W, R, VEC, V8, 1, kStagedRes, 0, D>
                       : norm_fwd_regs<T, W, R, VEC, V8, 0, kStagedRes, 0, D>;
      }
      if constexpr (kFixedWide) {
        constexpr int kM = kFwdMaxThreads;
        if (s.vpt == V8 && s.fixed == kM && s.res == kStagedRes) {
          kernel = layer ? norm_fwd_regs<T, W, R, VEC, V8, 1, kStagedRes, kM, D>
                         : norm_fwd_regs<T, W, R, VEC, V8, 0, kStagedRes, kM, D>;
        }
      }
    }
  };
  if constexpr (VEC == 1) {
    kernel = s.drop ? norm_fwd_regs<T, W, R, VEC, VPT, kRuntime, kRuntime, 0, 1>
                    : norm_fwd_regs<T, W, R, VEC, VPT, kRuntime, kRuntime>;
  } else if (s.span) {
    // Rows off the 16-byte grid.
    if constexpr (kSame) {
      auto span = [&](auto vpt, auto rs) {
        constexpr int V = decltype(vpt)::value, RS = decltype(rs)::value;
        if (s.vpt == V && s.res == RS) {
          kernel = layer ? norm_fwd_regs<T, W, R, VEC, V, 1, RS, 0, 0, 1>
                         : norm_fwd_regs<T, W, R, VEC, V, 0, RS, 0, 0, 1>;
        }
      };
      using I = std::integral_constant<int, VPT>;
      using I8 = std::integral_constant<int, kFwdWideVpt>;
      span(I{}, std::integral_constant<int, 0>{});
      span(I{}, std::integral_constant<int, 1>{});
      span(I8{}, std::integral_constant<int, 0>{});
      span(I8{}, std::integral_constant<int, kStagedRes>{});
    }
  } else {
    if (s.drop) {
      add_forms(std::integral_constant<int, 1>{});
    } else {
      add_forms(std::integral_constant<int, 0>{});
    }
    if constexpr (kSame) {
      if (s.vpt == VPT && s.fixed == 0 && s.res == 0) {
        kernel =
            layer ? norm_fwd_regs<T, W, R, VEC, VPT, 1, 0> : norm_fwd_regs<T, W, R, VEC, VPT, 0, 0>;
      }
    }
    if constexpr (kHasWide) {
      constexpr int V8 = kFwdWideVpt;
      if (s.vpt == V8 && s.fixed == 0 && s.res == 0) {
        kernel =
            layer ? norm_fwd_regs<T, W, R, VEC, V8, 1, 0> : norm_fwd_regs<T, W, R, VEC, V8, 0, 0>;
      }
      if constexpr (kFixedWide) {
        auto wide_fixed = [&](auto tpr) {
          constexpr int TPR = decltype(tpr)::value;
          if (s.vpt == V8 && s.fixed == TPR && s.res == 0) {
            kernel = layer ? norm_fwd_regs<T, W, R, VEC, V8, 1, 0, TPR>
                           : norm_fwd_regs<T, W, R, VEC, V8, 0, 0, TPR>;
          }
        };
        wide_fixed(std::integral_constant<int, 384>{});
        wide_fixed(std::integral_constant<int, kFwdWideThreads>{});
        wide_fixed(std::integral_constant<int, kFwdMaxThreads>{});
        if constexpr (sizeof(T) == 4) {  // float32 layer norm rows of 8192
          if (s.vpt == V8 && s.fixed == 256 && s.res == 0 && layer) {
            kernel = norm_fwd_regs<T, W, R, VEC, V8, 1, 0, 256>;
          }
        }
      }
    }
  }
  TORCH_INTERNAL_ASSERT(kernel != nullptr, "norm plan: no norm_fwd_regs variant for vpt=", s.vpt,
                        " res=", s.res, " fixed=", s.fixed);
  TORCH_INTERNAL_ASSERT(
      s.smem == (s.res == kStagedRes ? s.vpt * s.tpr * static_cast<int>(sizeof(Raw<R, VEC>)) : 0),
      "norm plan: norm_fwd_regs' residual slots take other shared memory than ", s.smem);
  // The staged residual's slots: refused where they do not fit a block here.
  if (s.smem > 0 && !allow_dynamic_smem_once(kernel, s.smem)) return false;
  launch_early(kernel, dim3(grid_for(s.blocks)), dim3(s.threads), static_cast<size_t>(s.smem), p,
               s.tpr);
  return true;
}

#define FUSED_INSTANCE(T, W, R, VEC) \
  template bool fwd_regs<T, W, R, VEC>(const FwdParams<T, W, R>&, const Step&);
FUSED_NORM_FOR_TYPES(FUSED_INSTANCE)
#undef FUSED_INSTANCE

}  // namespace norm
}  // namespace fused
