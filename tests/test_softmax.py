import math
import re

import pytest
import torch

import fused_ops
from fused_ops import reference

from utils import (
    CUDA,
    DEVICES,
    DTYPES,
    assert_close,
    assert_graph_replay_matches_eager,
    cuda_kernel_names,
    input_views,
    kernel_template_args,
    poison_next_alloc,
)

ops = torch.ops.fused
INF = float("inf")


def rows_kernel(name):
    """softmax_kernel<T, Op, VEC, P, BLOCK, CAUSAL, SPAN>'s arguments after its types in a
    kernel name ({"BLOCK": 64, "CAUSAL": False, ...}), or None for another kernel."""
    args = kernel_template_args(name, "softmax_kernel")
    if args is None:
        return None
    ints = [int(a) for a in args[2:5]]
    flags = [{"true": True, "false": False, "1": True, "0": False}[a] for a in args[5:]]
    return dict(zip(("VEC", "P", "BLOCK", "CAUSAL", "SPAN"), ints + flags, strict=True))


# Row lengths across every threshold of the CUDA kernel's shapes and odd ones. Each thread
# holds 4 vectors (32 bf16 / fp16, 16 float32 elements) or 8 scalars (odd lengths): row
# groups of <= 32 threads (1-warp blocks), 64, then one block of 128 / 256 / 512 threads per
# row (float32 forward rows of up to 1024 columns: 8 vectors, a warp a row), then on
# sm_90 a cluster of up to 16 blocks of 512 (scalar: up to 65536; on the 16-byte path up
# to 8 blocks, bf16 131072 / float32 65536, then twice the vectors per thread: bf16 524288,
# float32 262144), beyond that (or with softmax.cluster=0, or before sm_90: one 1024-thread
# block, then) the split path: chunk partials, then a second launch. The forward of rows of
# 16-byte vectors past 16384 16-bit / 8192 float32 columns takes softmax_fwd_staged instead
# (up to 16 even shares; softmax.staged=0 sends it to the paths above).
LENGTHS = [
    1,
    2,
    7,
    31,
    32,
    33,
    100,
    255,
    256,
    257,
    512,
    513,
    1000,
    1024,
    1025,
    2048,
    2049,
    4096,
    4097,
    8192,
    8193,
    16384,
    16385,
    32768,
]
# Long rows: clusters of 2..16 blocks, and odd lengths (scalar clusters, then split).
# 262144 runs once, below.
LONG_LENGTHS = [32769, 40000, 50257, 65536, 65537, 131071, 131072, 151936]
# Past what a cluster holds: the split path (forward and backward alike).
HUGE_LENGTHS = [300001, 600001]
# The CPU kernel has no thresholds: a few lengths keep CI time small.
CPU_LENGTHS = [1, 7, 33, 1000, 4097]


def per_device(cpu_values, cuda_values):
    """(device, value) parameters: the CPU runs cpu_values, the GPU cuda_values."""
    return [("cpu", v) for v in cpu_values] + [
        pytest.param("cuda", v, marks=CUDA) for v in cuda_values
    ]


def fwd_ref(x, dim=-1, scale=1.0, causal=False, log=False):
    x = x.double()
    if log:
        return reference.log_softmax(x, dim)
    return reference.softmax(x, dim, scale=scale, causal=causal)


def fwd(x, dim=-1, scale=1.0, causal=False, log=False):
    if log:
        return fused_ops.log_softmax(x, dim)
    return fused_ops.softmax(x, dim, scale=scale, causal=causal)


def bwd_ref(dy, y, dim=-1, scale=1.0, log=False):
    """The exact gradient given the op's own (rounded) output y, in float64."""
    dy, y = dy.double(), y.double()
    if log:
        return dy - torch.exp(y) * dy.sum(dim, keepdim=True)
    return scale * y * (dy - (dy * y).sum(dim, keepdim=True))


def bwd(dy, y, dim=-1, scale=1.0, log=False, causal=False):
    if log:
        return ops.log_softmax_backward(dy, y, dim)
    return ops.softmax_backward(dy, y, dim, scale=scale, causal=causal)


def rows_for(length, budget=1 << 18):
    # Enough rows to fill several blocks (and leave a partial one), capped for CPU time.
    return max(2, min(300, budget // length + 3))


def check_forward(x, dim=-1, scale=1.0, causal=False, log=False, msg=""):
    poison_next_alloc(x.numel() * x.element_size(), x.device)
    y = fwd(x, dim, scale, causal, log)
    assert y.shape == x.shape and y.dtype == x.dtype and y.device == x.device
    assert y.is_contiguous()
    assert_close(y, fwd_ref(x, dim, scale, causal, log), msg=msg or None)
    return y


def check_backward(y, dim=-1, scale=1.0, log=False, causal=False, msg=""):
    dy = torch.randn(y.shape, device=y.device).to(y.dtype)
    poison_next_alloc(y.numel() * y.element_size(), y.device)
    dx = bwd(dy, y, dim, scale, log, causal)
    assert dx.shape == y.shape and dx.dtype == y.dtype and dx.is_contiguous()
    assert_close(dx, bwd_ref(dy, y, dim, scale, log), dtype=y.dtype, msg=msg or None)


# --- forward and backward against float64, every strategy ------------------------------


@pytest.mark.parametrize("device,length", per_device(CPU_LENGTHS, LENGTHS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_rows_match_float64(device, length, dtype, log):
    shape = (rows_for(length, 1 << 18 if device == "cuda" else 1 << 14), length)
    for name, x in input_views(shape, dtype, device, scale=3.0):
        y = check_forward(x, log=log, msg=f"forward view={name}")
        check_backward(y, log=log, msg=f"backward view={name}")


# Backward row sums that cancel, at every CUDA shape (32 bf16 / 16 float32 elements or 8
# scalars per thread): row groups 64 / 100 / 333 / 500, one block per row 1000 / 4099 /
# 8192, a cluster 12000 / 50001 / 262144 (sm_90; split without clusters), split 300001.
SUM_LENGTHS = [64, 100, 333, 500, 1000, 4099, 8192, 12000, 50001, 262144, 300001]


def cancelling_rows(rows, length, log, device):
    """float32 (dy, y) whose backward sum (sum dy, or sum dy * y) cancels: half the entries
    carry +-A terms (equal y there, the + all before the -) so the partial sums run ~A
    times larger than the total. A float accumulation then loses the small terms (it put the
    fp32 log_softmax backward off at rows >= 255); the kernels' double one does not. Entry 1
    holds ~40% of the probability with dy = 0, so dx there is -p * sum, and checks the sum to
    float32 accuracy."""
    gen = torch.Generator().manual_seed(length)
    big = torch.randperm(length, generator=gen)[: length // 2]
    big = big[big != 1]
    big = big[: big.numel() // 2 * 2].sort().values
    sign = torch.ones(big.numel(), dtype=torch.float64)
    sign[big.numel() // 2 :] = -1
    x = torch.randn(rows, length, dtype=torch.float64, generator=gen)
    x[:, big] = 0.0
    x[:, 1] = math.log(length)
    y = (torch.log_softmax if log else torch.softmax)(x, -1)
    dy = torch.randn(rows, length, dtype=torch.float64, generator=gen)
    dy[:, 1] = 0.0
    # log_softmax: sum(dy) cancels; softmax: sum(dy * y) does (terms +-1e2 on equal y).
    dy[:, big] = sign * 1e4 if log else sign * (1e2 / y.float().double()[:, big[:1]])
    return dy.float().to(device), y.float().to(device)


@pytest.mark.parametrize("device,length", per_device([64, 1000], SUM_LENGTHS))
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_backward_sum_cancellation(device, length, log):
    dy, y = cancelling_rows(3, length, log, device)
    poison_next_alloc(y.numel() * y.element_size(), y.device)
    assert_close(bwd(dy, y, log=log), bwd_ref(dy, y, log=log), dtype=torch.float32)


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("length", LONG_LENGTHS + HUGE_LENGTHS)
def test_cuda_long_rows(dtype, log, length):
    for name, x in input_views((3, length), dtype, "cuda", scale=3.0):
        if name == "transposed":
            continue  # same kernel as contiguous after the copy; saves time
        y = check_forward(x, log=log, msg=f"forward view={name}")
        check_backward(y, log=log, msg=f"backward view={name}")


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_262144(dtype):
    # The longest benchmarked row: clusters of 8 vectors per thread (8 blocks for bf16 /
    # fp16, 16 for float32).
    x = torch.randn(5, 262144, device="cuda").to(dtype) * 3
    for log in (False, True):
        y = check_forward(x, log=log)
        check_backward(y, log=log)
    y = check_forward(x, scale=0.3)
    check_backward(y, scale=0.3)


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("length", [32768, 50257, 131072])
def test_cuda_long_rows_persistent(dtype, length):
    # More rows than clusters fit at once (sm_90): each persistent cluster walks several
    # rows, loading the next while it reduces this one, its exchange slots, mbarriers and
    # reduction buffers alternating by row parity. Rows of different spreads, so that a
    # row combined with a neighbour's partial results would show.
    # Scales other than 1 (a negative one too) on the same rows.
    rows = 400 if length <= 65536 else 200
    spread = torch.rand(rows, 1, device="cuda") * 6 + 0.5
    x = (torch.randn(rows, length, device="cuda") * spread).to(dtype)
    for log in (False, True):
        y = check_forward(x, log=log, msg=f"log={log}")
        check_backward(y, log=log, msg=f"log={log}")
    for scale in (0.3, -0.7):
        y = check_forward(x, scale=scale, msg=f"scale={scale}")
        check_backward(y, scale=scale, msg=f"scale={scale}")


# softmax_fwd_staged: the forward of rows of 16-byte vectors past 16384 16-bit / 8192
# float32 columns, cut into even shares of up to 64 KB (on sm_90 up to 16, a cluster),
# each staged in shared memory (scale > 0, no mask); softmax.staged=0 sends the same
# rows to the general path (persistent clusters on sm_90), which 16-bit rows of 16384 take
# either way. 24576: one share of 3072 vectors (a thread's last group partly past the
# end); 151936: five shares (float32: ten, a non-portable cluster) the last one shorter.
# More rows than clusters fit at once; rows of different spreads and offsets (a row mixed with another's max or sum would
# show), a constant row (exactly 1 / length each), a row at +-1e4 (only the max
# subtraction keeps exp finite), a row whose first half is -inf and the rest near -100,
# the special rows, scales either side of 1 and a negative one (which takes the general
# path).
@CUDA
@pytest.mark.parametrize("staged", ["1", "0"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("length", [16384, 24576, 32768, 65536, 131072, 151936, 262144])
def test_cuda_staged_rows(length, dtype, staged, knobs):
    knobs(f"softmax.staged={staged}")
    rows = (1 << 23) // length + 45  # 301 rows of 32768, ..., 77 of 262144
    spread = torch.rand(rows, 1, device="cuda") * 6 + 0.5
    x = torch.randn(rows, length, device="cuda") * spread + torch.randn(rows, 1, device="cuda") * 4
    x[3] = 2.5
    x[7] = (torch.rand(length, device="cuda") * 2 - 1) * 1e4
    # First half -inf, the rest near -100: blocks of a row with no finite entry while the
    # row's max is below -88 (exp(0 - max) overflows float32; the share's outputs are 0).
    x[8, : length // 2] = -INF
    x[8, length // 2 :] = torch.randn(length - length // 2, device="cuda") * 0.5 - 100
    x = x.to(dtype)
    for log in (False, True):
        y = check_forward(x, log=log, msg=f"log={log} softmax.staged={staged}")
        check_backward(y, log=log, msg=f"log={log}")
        if not log:
            assert torch.equal(y[3], torch.full_like(y[3], 1 / length)), "constant row"
    # Without the rows at +-1e4 and near -100: at scale != 1 float32's own rounding of
    # scale * x (2^-16 relative at |3x| ~ 300, ~1e-3 at 3e4) is past float32's tolerance in
    # a float32 implementation that rounds scale * x (seen on the GPU; checked by emulation).
    xs = torch.cat([x[:7], x[9:]])
    for scale in (0.125, 3.0, -0.7):
        check_forward(xs, scale=scale, msg=f"scale={scale} softmax.staged={staged}")
    special = special_rows(length, "cuda", dtype)
    for log in (False, True):
        y = check_forward(special, log=log, msg=f"special log={log}")
        native = torch.log_softmax(special, -1) if log else torch.softmax(special, -1)
        torch.testing.assert_close(y.isnan(), native.isnan())


@CUDA
@pytest.mark.parametrize("min_block", ["32", "64", "128"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_short_row_blocks(dtype, min_block, knobs):
    # Rows of up to 128 threads run in blocks of max(tpr, softmax.min_block) threads:
    # 32 by default (1-warp blocks; float32 forward rows of up to 1024 columns at 8 vectors
    # a thread, a warp a row), 64 / 128 the older shapes kept for comparisons (several rows
    # a block; 257 rows leave a partial last block). Each shape is checked, and that it ran.
    knobs(f"softmax.min_block={min_block}")
    for length in (7, 100, 512, 1000, 1024, 4096):
        x = (torch.randn(257, length, device="cuda") * 3).to(dtype)
        for log in (False, True):
            msg = f"length={length} log={log} softmax.min_block={min_block}"
            y = check_forward(x, log=log, msg=msg)
            check_backward(y, log=log, msg=msg)
    # The block size of softmax_kernel's launch (BLOCK) at 1024 columns:
    # a 32-thread row (16-bit; float32 forward by default), else a 64-thread one.
    x = torch.randn(257, 1024, device="cuda").to(dtype)
    warp_row = dtype != torch.float32
    for name, call in [
        ("fwd", lambda: fused_ops.softmax(x)),
        ("bwd", lambda: ops.softmax_backward(x, x, -1)),
    ]:
        tpr = 32 if warp_row or (name == "fwd" and min_block == "32") else 64
        names = [n for n in cuda_kernel_names(call) if "softmax_kernel<" in n]
        blocks = {a["BLOCK"] for a in map(rows_kernel, names) if a and not a["CAUSAL"]}
        assert blocks == {max(tpr, int(min_block))}, (name, names)


@CUDA
def test_cuda_staged_dispatch(knobs):
    # Which rows reach softmax_fwd_staged (a dispatch slip would fall back silently: every
    # result would still be right): rows whose 16-byte span is past 2048 vectors (16384
    # 16-bit / 8192 float32 columns), up to one 64 KB share (32768 / 16384) or, on sm_90, 16
    # of them; scale > 0, no mask, softmax.staged unset; the backward never. Rows of whole
    # vectors in whole shares take the compile-time-shaped form (N > 0), others (32767:
    # the masked span of 4096 vectors) its run-time-shaped form, N = 0.
    def kernels(fn):
        names = ("softmax_kernel", "softmax_cluster_kernel", "softmax_fwd_staged")
        return [n for n in cuda_kernel_names(fn) if any(k in n for k in names)]

    x = torch.randn(4, 32768, device="cuda", dtype=torch.bfloat16)

    def long_row(t, k):  # one row of k copies of t's rows
        return t.view(1, 4, 32768).expand(k, 4, 32768).reshape(1, k * 4 * 32768)

    # Clusters run here (sm_90 code on an sm_90 GPU, softmax.cluster not 0) if the
    # general path takes them for 65536 columns.
    knobs("softmax.staged=0")
    general = kernels(lambda: fused_ops.softmax(x.view(2, 65536)))
    sm90 = any("softmax_cluster_kernel" in n for n in general)
    cases = [
        ("bf16", lambda: fused_ops.softmax(x), "1", True),
        ("65536", lambda: fused_ops.softmax(x.view(2, 65536)), "1", sm90),
        (
            "262144",
            lambda: fused_ops.softmax(x.view(1, 4, 32768).expand(2, 4, 32768).reshape(1, 262144)),
            "1",
            sm90,
        ),
        ("98304 (3 blocks)", lambda: fused_ops.softmax(x[:3].reshape(1, 98304)), "1", sm90),
        ("24576", lambda: fused_ops.softmax(x[:, :24576]), "1", True),
        ("16384", lambda: fused_ops.softmax(x.view(8, 16384)), "1", False),
        ("524288", lambda: fused_ops.softmax(long_row(x, 4)), "1", sm90),
        ("655360 (20 blocks)", lambda: fused_ops.softmax(long_row(x, 5)), "1", False),
        ("fp16 log", lambda: fused_ops.log_softmax(x.half()), "1", True),
        ("scale 0.5", lambda: fused_ops.softmax(x, scale=0.5), "1", True),
        ("negative scale", lambda: fused_ops.softmax(x, scale=-0.5), "1", False),
        ("causal", lambda: fused_ops.softmax(x.view(1, 4, 32768), causal=True), "1", False),
        ("float32 32768", lambda: fused_ops.softmax(x.float()), "1", sm90),
        ("float32 16384", lambda: fused_ops.softmax(x.float().view(8, 16384)), "1", True),
        ("float32 262144", lambda: fused_ops.softmax(long_row(x.float(), 2)), "1", sm90),
        ("float32 524288", lambda: fused_ops.softmax(long_row(x.float(), 4)), "1", False),
        ("32767", lambda: fused_ops.softmax(x[:, :32767]), "1", True),
        ("backward", lambda: ops.softmax_backward(x, x, -1), "1", False),
        ("softmax.staged=0", lambda: fused_ops.softmax(x), "0", False),
    ]
    for name, call, staged, want in cases:
        knobs(f"softmax.staged={staged}")
        names = kernels(call)
        assert names, name
        assert any("softmax_fwd_staged" in n for n in names) == want, (name, names)
    knobs("softmax.staged=1")
    shaped = {
        name: [a[1] for n in kernels(call) if (a := kernel_template_args(n, "softmax_fwd_staged"))]
        for name, call in [
            ("bf16", lambda: fused_ops.softmax(x)),
            ("32767", lambda: fused_ops.softmax(x[:, :32767])),
            ("24576", lambda: fused_ops.softmax(x[:, :24576])),
        ]
    }
    assert shaped == {"bf16": ["1"], "32767": ["0"], "24576": ["0"]}, shaped


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("length", [262144, 300000, 524288])
def test_cuda_wide_clusters(dtype, length, knobs):
    # Rows past 8 blocks of 4 vectors per thread on the 16-byte path (sm_90): clusters of 8
    # vectors per thread, staged (float32 262144 in 16 blocks; bf16 / fp16 262144 in 8,
    # 300000 in 10, 524288 in 16), else the split path (float32 300000 and 524288). 40
    # rows: float32 262144 has 7 clusters of 16 at once, so each walks 5-6 rows through
    # its single backward slot. The forward of these rows goes to softmax_fwd_staged unless
    # softmax.staged=0 (except float32 300000 / 524288): the general forward here.
    knobs("softmax.staged=0")
    spread = torch.rand(40, 1, device="cuda") * 6 + 0.5
    x = (torch.randn(40, length, device="cuda") * spread).to(dtype)
    for log in (False, True):
        y = check_forward(x, log=log, msg=f"log={log}")
        check_backward(y, log=log, msg=f"log={log}")
    y = check_forward(x, scale=-0.7, msg="scale=-0.7")
    check_backward(y, scale=-0.7, msg="scale=-0.7")


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_many_rows(dtype):
    # Many row blocks, several waves: 20000 rows of each short strategy.
    for length in (1, 7, 64, 1000, 1536):
        x = torch.randn(20000, length, device="cuda").to(dtype) * 3
        y = check_forward(x, msg=f"len={length}")
        check_backward(y, msg=f"len={length}")


# Forward and backward captured in a CUDA graph and replayed on new data: every softmax
# kernel is launched with programmatic dependent launch on sm_90 (common/launch.cuh), which
# a graph keeps as programmatic edges. 1024: a block a row; 65536: the staged forward on a
# 2-block cluster and the persistent cluster backward; 40000: the staged forward in two
# shorter shares; 40001 (odd: scalar): the persistent clusters both ways; the causal form. The replay must equal an eager run bit for bit.
@CUDA
@pytest.mark.parametrize(
    "shape,causal",
    [
        ((300, 1024), False),
        ((24, 65536), False),
        ((24, 40000), False),
        ((24, 40001), False),
        ((2, 3, 256, 256), True),
    ],
)
def test_cuda_graph_replay(shape, causal):
    x = (torch.randn(shape, device="cuda") * 3).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(shape, device="cuda").to(torch.bfloat16)
    scale = 0.125 if causal else 1.0

    def step():
        y = fused_ops.softmax(x, -1, scale=scale, causal=causal)
        return (y, *torch.autograd.grad(y, [x], dy))

    def refill():
        x.copy_(torch.randn(shape, device="cuda") * 3)
        dy.copy_(torch.randn(shape, device="cuda"))

    assert_graph_replay_matches_eager(step, refill, ["y", "dx"], msg=f"{shape} causal={causal}")


# --- dims, views, special values ---------------------------------------------------------

OTHER_DIMS = [
    ((3, 5, 7), 0),
    ((3, 5, 7), 1),
    ((3, 5, 7), -2),
    ((3, 5, 7), -3),
    ((4, 1030, 6), 1),
    ((6, 40), 0),
    ((2, 3, 4, 33), 2),
    ((9,), 0),
    ((9,), -1),
]


@pytest.mark.parametrize(
    "device,shape_dim", per_device([OTHER_DIMS[i] for i in (0, 3, 4, 6, 8)], OTHER_DIMS)
)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_other_dims(device, shape_dim, dtype, log):
    shape, dim = shape_dim
    for name, x in input_views(shape, dtype, device, scale=3.0):
        y = check_forward(x, dim, log=log, msg=f"dim={dim} view={name}")
        check_backward(y, dim, log=log, msg=f"dim={dim} view={name}")
    # The backward op also takes a non-contiguous grad_out.
    y = fwd(torch.randn(shape, device=device).to(dtype), dim, log=log)
    dy = (
        torch.randn(tuple(reversed(shape)), device=device)
        .to(dtype)
        .permute(*reversed(range(len(shape))))
    )
    assert_close(bwd(dy, y, dim, log=log), bwd_ref(dy, y, dim, log=log), dtype=dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_scalar_and_empty(device):
    x = torch.tensor(2.5, device=device)
    for dim in (0, -1):
        assert_close(fused_ops.softmax(x, dim), torch.softmax(x.double(), dim))
        assert_close(fused_ops.log_softmax(x, dim), torch.log_softmax(x.double(), dim))
    for shape, dim in [((0, 4), -1), ((4, 0), -1), ((4, 0), 0), ((2, 0, 3), 2)]:
        x = torch.empty(shape, device=device)
        assert fused_ops.softmax(x, dim).shape == shape
        assert fused_ops.log_softmax(x, dim).shape == shape
        assert ops.softmax_backward(x, x, dim).shape == shape
        assert ops.log_softmax_backward(x, x, dim).shape == shape
    x = torch.empty(0, 3, 5, device=device)
    assert fused_ops.softmax(x, causal=True).shape == (0, 3, 5)


@pytest.mark.parametrize("device,length", per_device([7, 1000], [7, 33, 1000, 4097, 16385]))
@pytest.mark.parametrize("dtype", DTYPES)
def test_large_logits(device, length, dtype):
    # Logits in [-1e4, 1e4]: only the max subtraction keeps exp finite. scale = 1 keeps
    # v = x exact; log_softmax outputs stay above -2e4 (finite in float16).
    x = ((torch.rand(6, length, device=device) * 2 - 1) * 1e4).to(dtype)
    for log in (False, True):
        check_forward(x, log=log)
    long_len = 65537 if device == "cuda" else None
    if long_len:
        check_forward(((torch.rand(3, long_len, device=device) * 2 - 1) * 1e4).to(dtype))


def special_rows(length, device, dtype):
    """Rows with scattered -inf, a single finite entry, all -inf, +inf, NaN."""
    x = torch.randn(7, length, device=device) * 3
    x[0, torch.rand(length, device=device) < 0.5] = -INF
    x[0, length // 2] = 1.0  # at least one finite entry
    x[1] = -INF
    x[1, length - 1] = 0.5  # only the last entry finite
    x[2] = -INF  # all -inf: NaN, as torch
    x[3, length // 3] = INF  # +inf: NaN, as torch
    x[4, 0] = float("nan")  # NaN: NaN
    x[5, : length // 2] = -INF  # first half -inf
    # row 6 stays finite
    return x.to(dtype)


@pytest.mark.parametrize(
    "device,length", per_device([1, 2, 7, 1025], [1, 2, 7, 33, 1024, 1025, 4097, 20000])
)
@pytest.mark.parametrize("dtype", DTYPES)
def test_special_values_as_torch(device, length, dtype):
    x = special_rows(length, device, dtype)
    for log in (False, True):
        y = check_forward(x, log=log)
        native = torch.log_softmax(x, -1) if log else torch.softmax(x, -1)
        torch.testing.assert_close(y.isnan(), native.isnan())


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("length", [65536, 131071, 600001])
def test_cuda_special_values_long(dtype, length):
    x = special_rows(length, "cuda", dtype)
    for log in (False, True):
        check_forward(x, log=log)


# --- scale and causal --------------------------------------------------------------------


@pytest.mark.parametrize("device,length", per_device([33], [7, 33, 1000, 4097]))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [0.125, 0.37, -0.5, 2.0])
def test_scale(device, length, dtype, scale):
    for name, x in input_views((rows_for(length, 1 << 16), length), dtype, device, scale=3.0):
        y = check_forward(x, scale=scale, msg=f"view={name}")
        check_backward(y, scale=scale, msg=f"view={name}")


CAUSAL_SHAPES = [
    (1, 1),
    (2, 2),
    (7, 7),
    (5, 9),
    (9, 5),
    (3, 4, 33, 33),
    (2, 1, 100, 300),
    (2, 1, 300, 100),
    (1, 2, 1025, 1025),
]


@pytest.mark.parametrize("device,shape", per_device(CAUSAL_SHAPES[:-1], CAUSAL_SHAPES))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [1.0, 0.125])
def test_causal(device, shape, dtype, scale):
    for name, x in input_views(shape, dtype, device, scale=3.0):
        y = check_forward(x, scale=scale, causal=True, msg=f"view={name}")
        # Masked entries (key j > query i) are exactly 0.
        mask = reference.causal_mask(shape[-2], shape[-1], device).expand(shape)
        assert (y[mask] == 0).all()
        check_backward(y, scale=scale, msg=f"view={name}")
        # causal=True in the backward skips the masked entries (y = 0 there): same result.
        check_backward(y, scale=scale, causal=True, msg=f"causal backward view={name}")
    # dim=-1 spelled as a positive dim is accepted.
    x = torch.randn(shape, device=device).to(dtype)
    assert_close(fused_ops.softmax(x, len(shape) - 1, causal=True), fwd_ref(x, causal=True))


@pytest.mark.parametrize("device,length", per_device([33], [33, 2048, 16384]))
@pytest.mark.parametrize("dtype", DTYPES)
def test_causal_special_values_as_torch(device, length, dtype, knobs):
    # A query whose unmasked keys hold a NaN or a +inf, or only -inf, gives a row of NaN,
    # its masked keys too (torch: masked_fill with -inf, then softmax), forward and
    # backward. On CUDA 16-bit rows of 2048 / 16384 take kernels that skip the vectors past
    # a query's limit and write them from the row's state (Op::masked).
    x = torch.randn(1, 2, 64, length, device=device) * 3
    x[0, 0, 0, 0] = -INF  # query 0: its one key -inf
    x[0, 0, 1, 1] = float("nan")  # query 1: a NaN
    x[0, 0, 2, 0] = INF  # query 2: +inf
    x[0, 0, 40, :41] = -INF  # query 40: every unmasked key -inf
    x[0, 1, 50, 7] = INF  # query 50 of the second head: +inf
    x[0, 1, 60, :30] = -INF  # query 60: half its keys -inf (finite row)
    x = x.to(dtype)
    mask = reference.causal_mask(64, length, device).expand(x.shape)
    native = torch.softmax(x.float().masked_fill(mask, -INF) * 0.5, -1)
    # On CUDA both forward kernels of 16-bit causal rows: softmax_causal_fwd, and with
    # softmax.causal=0 softmax_kernel's causal variant.
    for env in ("1", "0") if device == "cuda" else ("1",):
        knobs(f"softmax.causal={env}")
        y = check_forward(x, scale=0.5, causal=True, msg=f"softmax.causal={env}")
        torch.testing.assert_close(y.isnan(), native.isnan())
        assert y.isnan().all(-1).sum() == 5  # the five rows above, whole
        assert (y[~y.isnan().all(-1, keepdim=True).expand_as(y) & mask] == 0).all()
    dy = torch.randn_like(x)
    dx = bwd(dy, y, scale=0.5, causal=True)
    torch.testing.assert_close(dx.isnan(), bwd(dy, y, scale=0.5).isnan())
    assert dx.isnan().all(-1).sum() == 5


@CUDA
def test_cuda_causal_dispatch(knobs):
    # Which launches take which causal kernel (a dispatch slip would fall back silently:
    # every result would still be right). softmax_causal_fwd: the forward of 16-bit causal
    # rows on the 16-byte path of 257 to 16384 columns, unless softmax.causal=0.
    # softmax_kernel's causal variant (CAUSAL = true: a row's vectors past its causal limit
    # skip the forward's math and their outputs'): 16-bit rows with a causal mask in blocks
    # of up to 512 threads, the backward, and the forward rows the first does not take;
    # float32 and unmasked rows never.
    def kernels(fn):
        out = set()
        for n in cuda_kernel_names(fn):
            a = rows_kernel(n)
            if a:
                out.add("true" if a["CAUSAL"] else "false")
            elif "softmax_causal_fwd" in n:
                out.add("causal_fwd")
        return out

    x = torch.randn(2, 4, 64, 2048, device="cuda", dtype=torch.bfloat16)
    cases = [
        ("bf16 causal", lambda: fused_ops.softmax(x, causal=True), "1", {"causal_fwd"}),
        ("bf16 causal, softmax.causal=0", lambda: fused_ops.softmax(x, causal=True), "0", {"true"}),
        (
            "fp16 causal 16384",
            lambda: fused_ops.softmax(x.half().view(1, 1, 64, 16384), causal=True),
            "1",
            {"causal_fwd"},
        ),
        (
            "bf16 causal 264",
            lambda: fused_ops.softmax(x[..., :264], causal=True),
            "1",
            {"causal_fwd"},
        ),
        ("bf16 causal 256", lambda: fused_ops.softmax(x[..., :256], causal=True), "1", {"true"}),
        (
            "bf16 causal, 2 bytes off 16",
            lambda: fused_ops.softmax(
                x.flatten()[1 : 1 + 512 * 2000].view(2, 4, 64, 2000), causal=True
            ),
            "1",
            {"true"},
        ),
        (
            "bf16 causal backward",
            lambda: ops.softmax_backward(x, x, -1, scale=1.0, causal=True),
            "1",
            {"true"},
        ),
        ("float32 causal", lambda: fused_ops.softmax(x.float(), causal=True), "1", {"false"}),
        ("bf16 unmasked", lambda: fused_ops.softmax(x), "1", {"false"}),
    ]
    for name, call, env, want in cases:
        knobs(f"softmax.causal={env}")
        assert kernels(call) == want, name


@CUDA
@pytest.mark.parametrize("causal_fwd", ["1", "0"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape",
    [
        (2, 2, 2048, 2048),
        (1, 2, 300, 8192),
        (1, 1, 200, 16384),
        (3, 1, 129, 264),
        (2, 3, 300, 264),
        (1, 3, 100, 1000),
        (1, 2, 77, 4096),
        (1, 1, 64, 20000),
        (1, 1, 3, 70000),
        (2, 1, 257, 40000),
    ],
)
def test_cuda_causal_large(dtype, shape, causal_fwd, knobs):
    # Attention scores at the benchmarked row length. 16-bit rows of 264 to 16384 columns
    # take softmax_causal_fwd forward (a row group of 32 to 1024 threads; 387 rows of 264:
    # the last 128-thread block part idle; queries past the keys, Lq > Lk: whole rows),
    # with softmax.causal=0 softmax_kernel's causal variant in blocks of 128 / 256 /
    # 512 threads, which also takes the backward; float32 rows the plain kernel; rows long
    # enough to take clusters or 1024-thread blocks (the last: more rows than clusters,
    # whole blocks past the causal limit); split rows only where clusters do not run
    # (before sm_90).
    knobs(f"softmax.causal={causal_fwd}")
    x = torch.randn(shape, device="cuda").to(dtype) * 3
    y = check_forward(x, scale=1 / 8, causal=True)
    check_backward(y, scale=1 / 8, causal=True)
    check_backward(y, scale=1 / 8)
    # A negative scale: masked keys must still give 0.
    check_forward(x, scale=-1 / 8, causal=True)


@pytest.mark.parametrize("device", DEVICES)
def test_causal_matches_sdpa_convention(device):
    # softmax(q k^T * s, causal) @ v == scaled_dot_product_attention(is_causal=True),
    # Lq != Lk included (top-left aligned mask).
    for lq, lk in [(6, 6), (4, 9), (9, 4)]:
        q = torch.randn(2, lq, 16, device=device, dtype=torch.float64)
        k = torch.randn(2, lk, 16, device=device, dtype=torch.float64)
        v = torch.randn(2, lk, 8, device=device, dtype=torch.float64)
        s = 1 / math.sqrt(16)
        p = fused_ops.softmax(q.float() @ k.float().transpose(-1, -2), scale=s, causal=True)
        out = p.double() @ v
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


# --- autograd, gradcheck, opcheck, compile ------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(log=True),
        dict(scale=0.3),
        dict(causal=True),
        dict(scale=0.5, causal=True),
        dict(dim=0),
        dict(dim=1),
    ],
)
def test_autograd(device, kw):
    kw = dict(kw)
    dim = kw.pop("dim", -1)
    log = kw.pop("log", False)
    x = torch.randn(3, 37, 45, device=device) * 2
    dy = torch.randn(3, 37, 45, device=device)
    xa = x.clone().requires_grad_()
    y = fwd(xa, dim, log=log, **kw)
    y.backward(dy)
    # The autograd wiring calls the backward op on the forward's output...
    explicit = bwd(dy, y.detach(), dim, kw.get("scale", 1.0), log, kw.get("causal", False))
    torch.testing.assert_close(xa.grad, explicit, rtol=0, atol=0)
    # ...and the result is the float64 gradient (float32 here: no cancellation issue).
    xr = x.double().requires_grad_()
    fwd_ref(xr, dim, log=log, **kw).backward(dy.double())
    assert_close(xa.grad, xr.grad, dtype=torch.float32)


@pytest.mark.parametrize(
    "kw", [dict(), dict(scale=0.7), dict(causal=True), dict(scale=-1.3, causal=True)]
)
def test_gradcheck_float64(kw):
    x = torch.randn(2, 5, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: fused_ops.softmax(t, -1, **kw), (x,))
    if not kw:
        assert torch.autograd.gradcheck(lambda t: fused_ops.softmax(t, 1), (x,))
        assert torch.autograd.gradcheck(lambda t: fused_ops.log_softmax(t, -1), (x,))
        assert torch.autograd.gradcheck(lambda t: fused_ops.log_softmax(t, 0), (x,))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    x = torch.randn(4, 6, 9, device=device, requires_grad=True)
    for kwargs in [{}, {"scale": 0.5}, {"scale": 0.5, "causal": True}]:
        torch.library.opcheck(ops.softmax.default, (x, -1), kwargs)
    torch.library.opcheck(ops.softmax.default, (x, 1))
    torch.library.opcheck(ops.log_softmax.default, (x, -1))
    torch.library.opcheck(ops.log_softmax.default, (x, 0))
    y = torch.softmax(x.detach(), -1)
    dy = torch.randn_like(y)
    torch.library.opcheck(ops.softmax_backward.default, (dy, y, -1), {"scale": 0.5})
    torch.library.opcheck(ops.softmax_backward.default, (dy, y, 1))
    torch.library.opcheck(ops.softmax_backward.default, (dy, y, -1), {"causal": True})
    torch.library.opcheck(ops.log_softmax_backward.default, (dy, y.log(), -1))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    torch._dynamo.reset()
    x = torch.randn(4, 16, 33, device=device, requires_grad=True)

    def f(t):
        a = fused_ops.softmax(t, -1, scale=0.25, causal=True)
        b = fused_ops.log_softmax(t, 1)
        return (a * b).sum()

    compiled = torch.compile(f, fullgraph=True)
    out = compiled(x)
    out.backward()
    xr = x.detach().double().requires_grad_()
    ref = (fwd_ref(xr, -1, 0.25, True) * fwd_ref(xr, 1, log=True)).sum()
    ref.backward()
    assert_close(out, ref, dtype=torch.float32, rtol=1e-5, atol=1e-4)
    assert_close(x.grad, xr.grad, dtype=torch.float32, atol=1e-5)


# --- modules -------------------------------------------------------------------------------


def test_nn_modules_are_drop_in():
    x = torch.randn(3, 4, 5)
    for fused_cls, torch_cls in [
        (fused_ops.nn.Softmax, torch.nn.Softmax),
        (fused_ops.nn.LogSoftmax, torch.nn.LogSoftmax),
    ]:
        for dim in (0, 1, -1, 2):
            m, ref = fused_cls(dim=dim), torch_cls(dim=dim)
            assert isinstance(m, torch_cls)
            m.load_state_dict(ref.state_dict())
            assert repr(m) == repr(ref)
            torch.testing.assert_close(m(x), ref(x))
        with pytest.warns(UserWarning):
            expected = torch_cls()(x)  # dim=None: torch's legacy choice
        torch.testing.assert_close(fused_cls()(x), expected)


# --- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs(device):
    x = torch.randn(3, 4, device=device)
    # A bad dim is an IndexError, as in torch.
    with pytest.raises(
        IndexError, match=r"fused::softmax: Dimension out of range.*\[-2, 1\].*got 2"
    ):
        fused_ops.softmax(x, 2)
    with pytest.raises(IndexError, match=r"fused::log_softmax: Dimension out of range.*got -3"):
        fused_ops.log_softmax(x, -3)
    with pytest.raises(IndexError, match=r"range of \[-2, 1\]"):
        ops.softmax_backward(x, x, 5)
    with pytest.raises(RuntimeError, match="expected x to be float32.*got Long"):
        fused_ops.softmax(torch.ones(3, 4, dtype=torch.long, device=device))
    with pytest.raises(RuntimeError, match="expected x to be float32.*got Int"):
        fused_ops.log_softmax(torch.ones(3, dtype=torch.int32, device=device))
    with pytest.raises(RuntimeError, match="causal=True needs an input with at least 2 dims"):
        fused_ops.softmax(torch.randn(5, device=device), causal=True)
    with pytest.raises(
        RuntimeError, match="causal=True takes the softmax over the last dim.*dim=0"
    ):
        fused_ops.softmax(x, 0, causal=True)
    with pytest.raises(
        RuntimeError, match="softmax_backward: causal=True needs an input with at least 2"
    ):
        ops.softmax_backward(
            torch.randn(5, device=device), torch.randn(5, device=device), causal=True
        )
    with pytest.raises(RuntimeError, match="same shape"):
        ops.softmax_backward(torch.randn(3, device=device), torch.randn(4, device=device))
    with pytest.raises(RuntimeError, match="same dtype"):
        ops.log_softmax_backward(x, x.half())
    with pytest.raises(RuntimeError, match="expected y to be float32.*got Long"):
        ops.softmax_backward(x.long(), x.long())


@CUDA
def test_cuda_device_and_dtype_errors():
    with pytest.raises(RuntimeError, match="same device"):
        ops.softmax_backward(torch.randn(3), torch.randn(3, device="cuda"))
    with pytest.raises(RuntimeError, match="float64"):
        fused_ops.softmax(torch.randn(3, device="cuda", dtype=torch.float64))


def test_functional_matches_torch_signature():
    # Same positional arguments as torch.nn.functional (input, dim, _stacklevel, dtype);
    # scale and causal are keyword-only.
    x = torch.randn(3, 4)
    torch.testing.assert_close(
        fused_ops.softmax(x, 0, 3, torch.float64),
        torch.nn.functional.softmax(x, 0, 3, torch.float64),
    )
    torch.testing.assert_close(
        fused_ops.log_softmax(x, 1, dtype=torch.float64),
        torch.nn.functional.log_softmax(x, 1, dtype=torch.float64),
    )
    with pytest.raises(TypeError):
        fused_ops.softmax(x, -1, 3, None, 0.5)


# --- any width, any offset: the 16-byte path ---------------------------------------------
# Row lengths off the 16-byte grid (public vocabularies among them) and views at an odd
# offset: every row is read as the 16-byte vectors of its aligned span, the elements of the
# neighbouring rows masked and never written (docs/design/softmax.md#misaligned-or-odd-rows).
CLIFF_LENGTHS = [1, 7, 1000, 4095, 4097, 5120, 5121, 32001, 50257, 151936]


def softmax_launches(names):
    """(kernel, VEC) of each softmax kernel launched: softmax_kernel and
    softmax_cluster_kernel name their VEC (3rd template argument); softmax_fwd_staged and
    softmax_causal_fwd run only on 16-byte vectors (VEC None)."""
    out = []
    for n in names:
        m = re.search(r"(softmax_kernel|softmax_cluster_kernel)<[^,<>]+, [^,]+?, (\d+), ", n)
        v = re.search(r"(softmax_fwd_staged|softmax_causal_fwd)<", n)
        if m:
            out.append((m.group(1), int(m.group(2))))
        elif v:
            out.append((v.group(1), None))
    return out


@CUDA
@pytest.mark.parametrize("length", CLIFF_LENGTHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_any_width_and_offset_vectorised(length, dtype):
    vec = 16 // torch.empty((), dtype=dtype).element_size()
    rows = max(3, min(64, (1 << 21) // length))
    for offset in (0, 1, 3):  # elements past a 16-byte-aligned allocation
        base = (torch.randn(rows * length + offset, device="cuda") * 3).to(dtype)
        x = base[offset:].view(rows, length)
        for log in (False, True):
            msg = f"length={length} offset={offset} log={log}"
            y = check_forward(x, log=log, msg=msg)
            # the output at x's offset in its 16-byte chunk (so both take 16-byte vectors)
            assert y.data_ptr() % 16 == x.data_ptr() % 16, msg
            check_backward(y, log=log, msg=msg)  # a fresh (aligned) grad_out: realigned
            dy = torch.randn_like(y)
            launched = softmax_launches(
                cuda_kernel_names(lambda: fwd(x, log=log))
                + cuda_kernel_names(lambda: bwd(dy, y, log=log))
            )
            assert launched and all(v in (None, vec) for _, v in launched), (msg, launched)
            # a grad_out at y's offset: no copy, and the same kernels
            g = torch.empty(rows * length + offset, device="cuda", dtype=dtype)[offset:]
            g = g.view(rows, length).copy_(dy)
            poison_next_alloc(y.numel() * y.element_size(), y.device)
            dx = bwd(g, y, log=log)
            assert_close(dx, bwd_ref(g, y, log=log), dtype=dtype, msg=msg)


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_odd_rows_staged(dtype):
    # 4096 x 32001 (a row's head cycles through every offset of its 16-byte chunk) takes
    # softmax_fwd_staged, as 4096 x 32000 does, and the rows' neighbours are left alone: the
    # output of a softmax over rows [1, 4095) equals the slice of the whole one's.
    x = (torch.randn(4096, 32001, device="cuda") * 3).to(dtype)
    names = softmax_launches(cuda_kernel_names(lambda: fused_ops.softmax(x)))
    assert [k for k, _ in names] == ["softmax_fwd_staged"], names
    y = check_forward(x, msg="4096x32001")
    inner = check_forward(x[1:4095], msg="4096x32001 rows 1..4094")
    torch.testing.assert_close(inner, y[1:4095], rtol=0, atol=0)
    for scale in (0.5, 2.0):
        check_forward(x[:7], scale=scale, msg=f"scale={scale}")


@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_odd_rows_causal(dtype):
    # A causal forward whose rows are off the grid: softmax_kernel's causal variant on
    # 16-byte vectors (softmax_causal_fwd takes rows of whole vectors only)
    x = (torch.randn(2, 3, 999, 999, device="cuda") * 3).to(dtype)
    check_forward(x, causal=True, msg="causal 999")
    launched = softmax_launches(cuda_kernel_names(lambda: fused_ops.softmax(x, causal=True)))
    assert launched and all(v == 8 for _, v in launched), launched


# Widths whose span is (2, 3] x tpr vectors for the power-of-two group tpr of 4-vector
# threads (128-512): softmax_kernel at 6 vectors a thread in tpr / 2 threads, forward and
# backward, at any offset (plan.h kWideP). (length, BLOCK of 16-bit rows, BLOCK of float32)
WIDE_ROWS = [(4095, 128, 256), (4097, 128, 256), (5120, 128, 256), (5121, 128, 256)]


@CUDA
@pytest.mark.parametrize("length,block16,block32", WIDE_ROWS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_wide_rows(length, block16, block32, dtype):
    vec = 16 // torch.empty((), dtype=dtype).element_size()
    block = block32 if dtype == torch.float32 else block16
    rows = 37  # a few blocks, one row each
    for offset in (0, 1, 3):  # elements past a 16-byte-aligned allocation
        base = (torch.randn(rows * length + offset, device="cuda") * 3).to(dtype)
        x = base[offset:].view(rows, length)
        whole = offset == 0 and length % vec == 0
        want = {"VEC": vec, "P": 6, "BLOCK": block, "CAUSAL": False, "SPAN": not whole}
        for log in (False, True):
            msg = f"length={length} offset={offset} log={log}"
            y = check_forward(x, log=log, msg=msg)
            check_backward(y, log=log, msg=msg)
            g = torch.empty(rows * length + offset, device="cuda", dtype=dtype)[offset:]
            g = g.view(rows, length).copy_(torch.randn_like(y))  # at y's offset: no copy
            poison_next_alloc(y.numel() * y.element_size(), y.device)
            dx = bwd(g, y, log=log)
            assert_close(dx, bwd_ref(g, y, log=log), dtype=dtype, msg=msg)
            for name, call in (
                ("fwd", lambda: fwd(x, log=log)),
                ("bwd", lambda: bwd(g, y, log=log)),
            ):
                names = [n for n in cuda_kernel_names(call) if "softmax" in n and "<" in n]
                shapes = [rows_kernel(n) for n in names]
                assert shapes == [want], (msg, name, names)
                op = kernel_template_args(names[0], "softmax_kernel")[1]
                assert ("Bwd" in op) == (name == "bwd"), (msg, name, names)


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_wide_rows_neighbours(dtype):
    # The 6-vector shape's tail threads (vectors past the row's end, not worked on) leave the
    # neighbouring rows alone: rows [1, rows - 1) of a softmax equal the whole one's slice.
    x = (torch.randn(9, 4097, device="cuda") * 3).to(dtype)
    y = check_forward(x, msg="9x4097")
    inner = check_forward(x[1:8], msg="9x4097 rows 1..7")
    torch.testing.assert_close(inner, y[1:8], rtol=0, atol=0)
    dy = torch.randn_like(y)
    dx = bwd(dy, y)
    torch.testing.assert_close(bwd(dy[1:8], y[1:8]), dx[1:8], rtol=0, atol=0)


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_vocab_few_rows(dtype):
    # A vocabulary-wide row, few rows (668 x 50257 in the benchmarks; 5 here), at offsets
    # 0 / 1 / 3: the forward on softmax_fwd_staged, the backward on the cluster kernel (sm_90)
    # or softmax_kernel, all on 16-byte vectors, against float64.
    vec = 16 // torch.empty((), dtype=dtype).element_size()
    for offset in (0, 1, 3):
        base = (torch.randn(5 * 50257 + offset, device="cuda") * 3).to(dtype)
        x = base[offset:].view(5, 50257)
        for log in (False, True):
            msg = f"offset={offset} log={log}"
            y = check_forward(x, log=log, msg=msg)
            check_backward(y, log=log, msg=msg)
            fwd_names = softmax_launches(cuda_kernel_names(lambda: fwd(x, log=log)))
            assert [k for k, _ in fwd_names] == ["softmax_fwd_staged"], (msg, fwd_names)
            dy = torch.randn_like(y)
            bwd_names = softmax_launches(cuda_kernel_names(lambda: bwd(dy, y, log=log)))
            assert bwd_names and all(v == vec for _, v in bwd_names), (msg, bwd_names)
