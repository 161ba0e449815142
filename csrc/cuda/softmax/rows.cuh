// softmax_kernel: ONE kernel template for all four ops (Fwd / Bwd) and every row length the
// other kernels do not take (plan.h), and its launcher; instantiated per dtype in
// rows_<dtype>.cu, which the build compiles in parallel.
//
// Each thread holds P 16-byte vectors of its row in registers, loaded all at once before any
// use, so that P * 16 bytes per thread are in flight. A row belongs to a group of `tpr`
// threads, a power of two: tpr <= 64, blocks of max(tpr, 32) threads (a 1-warp block holds
// one or more rows, shuffle reductions; a 64-thread row is a block of its own, one
// shared-memory step); tpr = BLOCK, one row per block of 128 .. 1024 threads, shuffles then
// one shared-memory step; a split row: chunks of 512 * P * VEC columns, one block each, in
// two launches (kPartial writes each chunk's reduction to a small workspace, kFinish reads the
// chunk again, combines the row's partials and writes). The shape is a compile-time choice
// per launch (P, BLOCK), with bounds checked at run time per vector, not per element: the
// lean code is what reaches the copy bandwidth (a generic kernel with runtime tile loops
// measured far slower: docs/design/softmax.md#tried-not-kept).
#pragma once
#include <ATen/ops/empty.h>

#include "cuda/softmax/families.h"

namespace fused {
namespace softmax {
namespace {

// Thread `lane` of a row group owns vectors k < P at columns
// begin + (k * tpr + lane) * VEC, begin = the chunk's first column, less the row's head on
// the 16-byte path (row_head: its vectors are those of its 16-byte-aligned span).
// CAUSAL (a launch with a causal mask): the vectors past a row's limit (Cols::live) skip the
// forward's conversions, exps and sums and, both ways, their outputs' math (store_tile);
// otherwise every vector takes it, as a compile-time constant.
// SPAN (16-byte path, rows off the grid or not whole vectors: the plan's Step::span): the
// row's head and the masked, element-wise edges; without it the rows-of-whole-vectors code.
// The kWideP shapes: 5 blocks of 128 threads an SM (10 of 64, 2 of 256), registers capped
// to hold that many (the 16-bit forward's span form wants 105 a thread uncapped, 4 blocks).
template <typename T, typename Op, int VEC, int P, int BLOCK, bool CAUSAL, bool SPAN>
__global__ void __launch_bounds__(BLOCK, P == kWideP   ? 640 / BLOCK
                                         : BLOCK < 128 ? 1024 / BLOCK
                                                       : 1)
    softmax_kernel(Args<T, typename Op::State> a, Op op) {
  grid_dependency_wait();  // launched early (launch_early): nothing global before this
  using State = typename Op::State;
  static_assert(VEC == 1 || sizeof(Vec<T, VEC>) == 16, "vectors are 16 bytes");
  // Two reduction buffers (the ops' two reductions), a float or a double per warp.
  __shared__ double buf[2][BLOCK / 32 > 0 ? BLOCK / 32 : 1];

  const Group<BLOCK> g{a.tpr};
  const int lane = threadIdx.x & (a.tpr - 1);
  const int c = blockIdx.y;
  const int64_t r = (static_cast<int64_t>(blockIdx.x) << (kLog2<BLOCK> - a.tpr_shift)) +
                    (threadIdx.x >> a.tpr_shift);
  const bool active = r < a.rows;  // idle groups of the last block still shuffle along
  const int64_t row = active ? r : 0;
  // The chunk's columns: [c * chunk, + chunk) of the row's span, which starts `head`
  // elements before the row (16-byte path; 0 for rows on the grid).
  const int head = SPAN ? row_head<T, VEC>(a.in[0] + row * a.len) : 0;
  const int begin = c * a.chunk - head;
  const int end = std::min(a.len, begin + a.chunk);
  const int limit = active ? row_limit(a, row, end) : begin;
  const int c0 = begin + lane * VEC;
  const int stride = a.tpr * VEC;

  // Every load first, then the conversions: a conversion next to its load would make the
  // thread wait for each load.
  Raw<T, VEC> raw[Op::kIn][P];
  load_tile<kPlain>(raw, a.in, a.len, row, c0, stride, limit);
  typename Op::template Regs<T, VEC, P> regs;
  // kWideP rows fill 67-100% of their vectors: those past the row's end skip the work too.
  const int live = CAUSAL || P == kWideP ? live_vectors<P>(c0, stride, limit) : P;
  op.template init<SPAN>(regs, raw, Cols{c0, stride, limit, live});

  State total, mine;
  if (a.phase == kFinish) {
    total = mine = op.combine(a.partials + row * a.nchunks, a.nchunks);
  } else {
    total = mine = op.partial(regs, g, buf[0], buf[1]);
    if (a.phase == kPartial) {
      if (threadIdx.x == 0) a.partials[row * a.nchunks + c] = total;
      return;
    }
  }
  if (!active) return;
  const auto coef = op.coef(total, mine, a.phase != kFinish);
  op.finish(regs, coef);
  store_tile<T, VEC, P, false, SPAN>(op, regs, coef, a.out + row * a.len, c0, stride, end, live);
}

// Launches row blocks x a.nchunks blocks of BLOCK threads, a.tpr threads per row; the causal
// variant where the step says so (16-bit rows in blocks of up to 512 threads with a mask).
template <typename T, typename Op, int VEC, int BLOCK, int P = vectors_per_thread(VEC)>
void launch(Args<T, typename Op::State> a, const Op& op, const Step& s) {
  a.tpr_shift = 0;
  while ((1 << a.tpr_shift) < a.tpr) ++a.tpr_shift;
  const int64_t row_blocks = ceil_div(a.rows, BLOCK / a.tpr);
  TORCH_CHECK(row_blocks <= std::numeric_limits<int>::max() && a.nchunks <= 65535,
              "fused softmax: ", a.rows, " rows of ", a.len, " columns need ", row_blocks, " x ",
              a.nchunks, " blocks, more than one launch holds (2^31 - 1 x 65535)");
  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(a.nchunks));
  auto kernel = softmax_kernel<T, Op, VEC, P, BLOCK, false, false>;
  if constexpr (VEC > 1) {
    if (s.span) kernel = softmax_kernel<T, Op, VEC, P, BLOCK, false, true>;
  }
  if constexpr (BLOCK <= 512 && sizeof(T) == 2 && P != kWideP) {
    if (s.causal) {
      kernel = softmax_kernel<T, Op, VEC, P, BLOCK, true, false>;
      if constexpr (VEC > 1) {
        if (s.span) kernel = softmax_kernel<T, Op, VEC, P, BLOCK, true, true>;
      }
    }
  }
  launch_early(kernel, grid, dim3(BLOCK), 0, a, op);
}

}  // namespace

template <typename T, typename Op, int VEC>
void launch_rows(Args<T, typename Op::State> a, const Op& op, const Step& s,
                 const at::TensorOptions& opts) {
  constexpr int P = vectors_per_thread(VEC);
  // One chunk: the whole span of a row (up to VEC - 1 elements before the row, then len).
  a.chunk = VEC == 1 ? a.len : a.len + VEC - 1;
  a.nchunks = 1;
  a.phase = kWhole;
  a.tpr = s.tpr;
  if (s.kernel == Kernel::kSplit) {
    a.chunk = kSplitBlock * P * VEC;
    a.nchunks = s.n;
    const int64_t blocks = a.rows * a.nchunks;
    at::Tensor ws = at::empty({static_cast<int64_t>(blocks * sizeof(typename Op::State))},
                              opts.dtype(at::kByte));
    a.partials = reinterpret_cast<typename Op::State*>(ws.mutable_data_ptr());
    a.phase = kPartial;
    launch<T, Op, VEC, kSplitBlock>(a, op, s);
    a.phase = kFinish;
    launch<T, Op, VEC, kSplitBlock>(a, op, s);
    return;
  }
  if constexpr (VEC == 4 && std::is_same_v<Op, Fwd>) {
    if (s.p == 8 && s.block == 32) return launch<T, Op, VEC, 32, 8>(a, op, s);
  }
  if constexpr (VEC > 1) {
    if (s.p == kWideP) {
      switch (s.block) {
        case 64:
          return launch<T, Op, VEC, 64, kWideP>(a, op, s);
        case 128:
          return launch<T, Op, VEC, 128, kWideP>(a, op, s);
        case 256:
          return launch<T, Op, VEC, 256, kWideP>(a, op, s);
      }
      TORCH_INTERNAL_ASSERT(false, "softmax plan: softmax_kernel p=", s.p, " block=", s.block);
    }
  }
  TORCH_INTERNAL_ASSERT(s.p == P, "softmax plan: softmax_kernel p=", s.p);
  switch (s.block) {
    case 32:
      return launch<T, Op, VEC, 32>(a, op, s);
    case 64:
      return launch<T, Op, VEC, 64>(a, op, s);
    case 128:
      return launch<T, Op, VEC, 128>(a, op, s);
    case 256:
      return launch<T, Op, VEC, 256>(a, op, s);
    case 512:
      return launch<T, Op, VEC, 512>(a, op, s);
    case 1024:
      return launch<T, Op, VEC, 1024>(a, op, s);
  }
  TORCH_INTERNAL_ASSERT(false, "softmax plan: softmax_kernel block=", s.block);
}

}  // namespace softmax
}  // namespace fused
