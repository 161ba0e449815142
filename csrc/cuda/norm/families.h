// The norm kernel families' launchers, one translation unit each (norm/<family>.cu), and
// the type combinations they are built for. norm/launch.cu walks a plan (plan.h) and calls
// the launcher of each step. A launcher returning bool may refuse its step (false, nothing
// launched) where a launch-time query says the shape cannot be resident; the plan's next
// step then runs.
#pragma once
#include "common/norm.h"
#include "cuda/norm/common.cuh"

namespace fused {
namespace norm {

// Forward. fwd_regs takes kFwdRegs and kFwdWideFixed steps.
template <typename T, typename W, typename R, int VEC>
bool fwd_regs(const FwdParams<T, W, R>& p, const Step& s);
template <typename T, typename W, typename R, int VEC>
void fwd_long(const FwdParams<T, W, R>& p, const Step& s);
template <typename T>  // 16-bit T, parameters and rows in T, the 16-byte path
void fwd_fixed(const FwdParams<T, T, T>& p, const Step& s);

// Backward.
template <typename T>  // 16-bit T, parameters and rows in T, the 16-byte path
bool bwd_warp(const BwdParams<T, T, T>& p, NormBackward& nb, const Step& s);
template <typename T>  // as bwd_warp
bool bwd_bulk(const BwdParams<T, T, T>& p, NormBackward& nb, const Step& s);
template <typename T>  // 16-bit or float32 T, parameters and rows in T, the 16-byte path
bool bwd_fixed(const BwdParams<T, T, T>& p, NormBackward& nb, const Step& s);
template <typename T, typename W, typename R, int VEC>
bool bwd_regs(const BwdParams<T, W, R>& p, NormBackward& nb, const Step& s);
template <typename T, typename W, typename R, int VEC>
bool bwd_cluster(const BwdParams<T, W, R>& p, NormBackward& nb, const Step& s);
template <typename T, typename W, typename R, int VEC>
void bwd_two_pass(const BwdParams<T, W, R>& p, NormBackward& nb, const Step& s);

// X(T, W, R, VEC) for every (x, parameters, rows) dtype combination and vector width a
// launcher of all types is built for: float32 everything, or 16-bit x with parameters and
// rows each in x's dtype or float32; the 16-byte path (VEC = 16 / sizeof(x)) and the
// scalar one. (clang-format is not idempotent on these lists: kept as written.)
// clang-format off
#define FUSED_NORM_FOR_16BIT(X, T)                                                  \
  X(T, T, T, 8) X(T, T, T, 1) X(T, float, T, 8) X(T, float, T, 1) X(T, T, float, 8) \
  X(T, T, float, 1) X(T, float, float, 8) X(T, float, float, 1)
#define FUSED_NORM_FOR_TYPES(X)                       \
  X(float, float, float, 4) X(float, float, float, 1) \
  FUSED_NORM_FOR_16BIT(X, c10::Half) FUSED_NORM_FOR_16BIT(X, c10::BFloat16)
// clang-format on

}  // namespace norm
}  // namespace fused
