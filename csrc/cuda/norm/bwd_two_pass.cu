// The backward for rows no other kernel takes (plan.h): norm_bwd_row_sums (the two row sums)
// then norm_bwd_tiles (column tiles x row chunks: dx and the partial rows); x and dy are read
// twice.

#include "cuda/norm/bwd_common.cuh"
#include "cuda/norm/families.h"

namespace fused {
namespace norm {
namespace {

// Long rows, step 1: per row, c = (mean(g), mean(g * xhat)) (mean(g) = 0 for rms norm).
template <typename T, typename W, typename R, int VEC>
__global__ void __launch_bounds__(kLongThreads)
    norm_bwd_row_sums(BwdParams<T, W, R> p, float2* __restrict__ c_out) {
  grid_dependency_wait();  // launched early (launch_early): nothing global before this
  __shared__ float scratch[2][32];
  const int nvec = p.cols / VEC;
  const float inv_n = 1.f / static_cast<float>(p.cols);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const int64_t off = row * p.cols;
    const float mean = p.mean ? p.mean[row] : 0.f, rstd = p.rstd[row];
    float s[2] = {0.f, 0.f};
#pragma unroll 4
    for (int c = threadIdx.x; c < nvec; c += blockDim.x) {
      const int64_t e = off + static_cast<int64_t>(c) * VEC;
      const FVec<VEC> xf = to_float(load_raw<R, VEC>(p.x + e));
      const FVec<VEC> df = to_float(load_raw<T, VEC>(p.dy + e));
      const FVec<VEC> w = param_or<W, VEC>(p.weight, c, 1.f);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float xhat = (xf.v[j] - mean) * rstd;
        const float gw = df.v[j] * w.v[j];
        s[0] += gw;
        s[1] += gw * xhat;
      }
    }
    group_sum<2>(s, blockDim.x, scratch);
    if (threadIdx.x == 0) c_out[row] = make_float2(p.mean ? s[0] * inv_n : 0.f, s[1] * inv_n);
  }
}

// Long rows, step 2: a block owns a tile of kTileThreads vector columns and a chunk of rows;
// it writes dx there and the dweight / dbias partials of its columns (partial row blockIdx.y).
template <typename T, typename W, typename R, int VEC>
__global__ void __launch_bounds__(kTileThreads)
    norm_bwd_tiles(BwdParams<T, W, R> p, const float2* __restrict__ c_in, int64_t rows_per_chunk) {
  grid_dependency_wait();  // launched early (launch_early): nothing global before this
  const int nvec = p.cols / VEC;
  const int cv = blockIdx.x * blockDim.x + threadIdx.x;
  if (cv >= nvec) return;  // no barriers in this kernel
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = std::min<int64_t>(p.rows, r0 + rows_per_chunk);
  const FVec<VEC> w = param_or<W, VEC>(p.weight, cv, 1.f);
  float dw[VEC], db[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) dw[j] = db[j] = 0.f;
  for (int64_t r = r0; r < r1; r += kTileRows) {
    Raw<R, VEC> xv[kTileRows], sv[kTileRows];
    Raw<T, VEC> gv[kTileRows];
#pragma unroll
    for (int k = 0; k < kTileRows; ++k) {
      if (r + k < r1) {
        const int64_t e = (r + k) * p.cols + static_cast<int64_t>(cv) * VEC;
        xv[k] = load_raw<R, VEC>(p.x + e);
        gv[k] = load_raw<T, VEC>(p.dy + e);
        if (p.dsum) sv[k] = load_raw<R, VEC>(p.dsum + e);
      }
    }
#pragma unroll
    for (int k = 0; k < kTileRows; ++k) {
      if (r + k < r1) {
        const int64_t row = r + k;
        const float mean = p.mean ? p.mean[row] : 0.f, rstd = p.rstd[row];
        const float2 c = c_in[row];
        const FVec<VEC> xf = to_float(xv[k]), df = to_float(gv[k]);
        FVec<VEC> o;
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float xhat = (xf.v[j] - mean) * rstd;
          o.v[j] = rstd * (df.v[j] * w.v[j] - c.x - xhat * c.y);
          dw[j] += df.v[j] * xhat;
          db[j] += df.v[j];
        }
        if (p.dsum) {
          const FVec<VEC> sf = to_float(sv[k]);
#pragma unroll
          for (int j = 0; j < VEC; ++j) o.v[j] += sf.v[j];
        }
        store_raw<R, VEC>(p.dx + row * p.cols + static_cast<int64_t>(cv) * VEC,
                          from_float<R, VEC>(o));
      }
    }
  }
  const int64_t prow = static_cast<int64_t>(blockIdx.y) * p.cols + static_cast<int64_t>(cv) * VEC;
  if (p.dw_part) store_floats<VEC>(p.dw_part + prow, dw);
  if (p.db_part) store_floats<VEC>(p.db_part + prow, db);
}

}  // namespace

template <typename T, typename W, typename R, int VEC>
void bwd_two_pass(const BwdParams<T, W, R>& p_in, NormBackward& nb, const Step& s) {
  BwdParams<T, W, R> p = p_in;
  const int nvec = p.cols / VEC;
  at::Tensor c = at::empty({p.rows, 2}, nb.dy.options().dtype(at::kFloat));
  float2* cp = reinterpret_cast<float2*>(c.mutable_data_ptr<float>());
  launch_early(norm_bwd_row_sums<T, W, R, VEC>, dim3(grid_for(s.blocks)), dim3(kLongThreads), 0, p,
               cp);
  const int64_t col_tiles = ceil_div(nvec, kTileThreads);
  int64_t chunks = std::clamp<int64_t>(8 * num_sms() / col_tiles, 1, p.rows);
  const int64_t rows_per_chunk = ceil_div(p.rows, chunks);
  chunks = ceil_div(p.rows, rows_per_chunk);
  at::Tensor part = alloc_partials(nb, chunks);
  point_partials(p, part, chunks, nb);
  const dim3 grid(static_cast<unsigned>(col_tiles), static_cast<unsigned>(chunks));
  launch_early(norm_bwd_tiles<T, W, R, VEC>, grid, dim3(kTileThreads), 0, p, cp, rows_per_chunk);
  if (part.defined()) reduce_partials<T>(part, chunks, p.cols, nb);
}

#define FUSED_INSTANCE(T, W, R, VEC) \
  template void bwd_two_pass<T, W, R, VEC>(const BwdParams<T, W, R>&, NormBackward&, const Step&);
FUSED_NORM_FOR_TYPES(FUSED_INSTANCE)
#undef FUSED_INSTANCE

}  // namespace norm
}  // namespace fused
