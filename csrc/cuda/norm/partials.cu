// column_sum: dweight / dbias from the backward kernels' float32 partial rows, summed over
// the rows in a fixed order (deterministic, no atomics).

#include "cuda/norm/bwd_common.cuh"
#include "cuda/norm/families.h"

namespace fused {
namespace norm {
namespace {

// out_k[col] = sum over parts of part_k[part, col], k = blockIdx.y: 32 columns x 8 part
// lanes per block, combined in a fixed order.
template <typename O>
__global__ void __launch_bounds__(256)
    column_sum(const float* __restrict__ part0, const float* __restrict__ part1, int64_t parts,
               int cols, O* __restrict__ out0, O* __restrict__ out1) {
  grid_dependency_wait();  // launched early (launch_early): the partials are complete after
  __shared__ float tile[8][33];
  const float* part = blockIdx.y == 0 ? part0 : part1;
  O* out = blockIdx.y == 0 ? out0 : out1;
  const int col = blockIdx.x * 32 + threadIdx.x;
  float s = 0.f;
  if (col < cols) {
    for (int64_t q = threadIdx.y; q < parts; q += 8) s += part[q * cols + col];
  }
  tile[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float t = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k) t += tile[k][threadIdx.x];
    out[col] = static_cast<O>(t);  // one scalar store: no register array involved
  }
}

}  // namespace

template <typename T>
void reduce_partials(const at::Tensor& part, int64_t parts, int cols, NormBackward& nb) {
  const at::Tensor& first = nb.dweight.defined() ? nb.dweight : nb.dbias;
  const int outs = param_grads(nb);  // >= 1 where there are partials
  const float* p0 = part.const_data_ptr<float>();
  const float* p1 = outs == 2 ? p0 + parts * cols : nullptr;
  const dim3 grid(static_cast<unsigned>(ceil_div(cols, 32)), outs), block(32, 8);
  auto run = [&](auto tag) {
    using O = typename decltype(tag)::type;
    O* o0 = first.mutable_data_ptr<O>();
    O* o1 = outs == 2 ? nb.dbias.mutable_data_ptr<O>() : nullptr;
    launch_early(column_sum<O>, grid, block, 0, p0, p1, parts, cols, o0, o1);
  };
  if (first.scalar_type() == at::kFloat) {
    run(Tag<float>{});
  } else {
    if constexpr (!std::is_same_v<T, float>) run(Tag<T>{});
  }
}

template void reduce_partials<float>(const at::Tensor&, int64_t, int, NormBackward&);
template void reduce_partials<c10::Half>(const at::Tensor&, int64_t, int, NormBackward&);
template void reduce_partials<c10::BFloat16>(const at::Tensor&, int64_t, int, NormBackward&);

// Whether the norm kernels' sm_90 code runs on the current device (GpuProps::sm90_code): every
// kernel of the build is compiled for the same architectures, so one kernel answers for all.
bool sm90_code_runs() { return runs_sm90_code(column_sum<float>); }

}  // namespace norm
}  // namespace fused
