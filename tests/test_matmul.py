"""fused::matmul, fused::linear (+ linear_fwd, linear_act_backward) against float64.

Inputs are scaled so outputs are O(1) (b, weight ~ N(0, 1/K)); the fp32 accumulation over K
then adds errors far below the output rounding, and each comparison allows an absolute slack
of a tenth of the dtype's relative tolerance at the typical output size (for elements that
cancel to near zero). Every CUDA test runs once per kernel choice (matmul.kernel:
"auto", which takes the Hopper kernel on an H100/H200 where it applies, and "portable").
"""

import math
import re

import pytest
import torch
import torch.nn.functional as F

import fused_ops
from fused_ops import reference

from utils import CUDA, DEVICES, DTYPES, MEMCHECK, TOL, cuda_kernel_names, input_views

ACTS = [None, "gelu", "gelu_tanh"]
KERNELS = ["auto", "portable"]

# (M, K, N): edges in every dimension, K not a multiple of 8, K = 1, tall and skinny.
SHAPES = [
    (1, 1, 1),
    (1, 17, 1),
    (17, 17, 17),
    (5, 8, 3),
    (33, 70, 65),
    (127, 1, 129),
    (64, 129, 200),
    (3, 300, 2),
]
# Larger ones on the GPU only: the M, N, K set {1, 17, 127, 1000, 4097} mixed, and shapes that
# take the portable kernel's big tile (>= one tile per SM).
CUDA_SHAPES = [
    (1000, 1000, 1000),
    (1, 4097, 1000),
    (17, 1000, 4097),
    (127, 4097, 127),
    (1000, 17, 1000),
    (4097, 1000, 17),
    (4097, 127, 1000),
    (1, 1, 4097),
    (4097, 1000, 1000),
    (1000, 4097, 4096),
    (8192, 64, 64),
    (64, 8192, 64),
    (256, 512, 384),
    (4097, 4097, 4097),
    # the portable kernel's big tile with a single k-tile (K <= BK = 64)
    (4097, 17, 4097),
    (4096, 64, 4096),
]


def set_kernel(choice, knobs):
    # On a Hopper GPU "auto" is run as "hopper": the same choice, but an error if the Hopper
    # kernel is unavailable (a build without sm_90a), so these tests cannot silently check
    # the portable kernel twice.
    if choice == "auto" and torch.cuda.get_device_capability() == (9, 0):
        choice = "hopper"
    knobs(f"matmul.kernel={choice}")


@pytest.fixture(params=KERNELS)
def kernel(request, knobs):
    set_kernel(request.param, knobs)
    return request.param


# CPU, and CUDA once per kernel choice: "cuda:auto", "cuda:portable".
DEVICE_KERNELS = ["cpu"] + [pytest.param(f"cuda:{k}", marks=CUDA) for k in KERNELS]


def use(device_kernel, knobs):
    """Select the kernel (CUDA) and return the device name."""
    device, _, kernel_choice = device_kernel.partition(":")
    if kernel_choice:
        set_kernel(kernel_choice, knobs)
    return device


def check(actual, ref, dtype, msg="", slack=0.1, k=None):
    """Compare with a float64 reference: rtol by dtype, atol = slack * rtol * mean |ref|.

    k: the length of the sums (the GEMM's K), when known: float32's rounding of a K-term sum
    grows as sqrt(K), so its floor is scaled from the K ~ 1e3 it was set at.

    Gradients use slack=1: they pass through intermediates kept in the input dtype (the
    saved pre-activation, dZ), and where those round to the neighbouring value of the
    float64 reference's rounding (an fp32-vs-fp64 tie break, ~0.1% of elements), the
    difference reaches one ulp of a term, i.e. rtol x a typical term, in near-zero sums."""
    rtol, atol = TOL[dtype]
    if dtype == torch.float32:
        # float32 sums of K ~ 1e3 products of O(1) outputs carry fp32's own rounding of a few
        # 1e-6 (torch.mm's too); the elementwise 1e-6 floor would fail cuBLAS itself.
        atol = max(atol, 1e-5 * math.sqrt(max(1.0, (k or 0) / 1000)))
    ref = ref.double().to(actual.device)  # compare where the result is (fast on the GPU)
    scale = ref.abs().mean().item() if ref.numel() else 0.0
    torch.testing.assert_close(
        actual.double(),
        ref,
        rtol=rtol,
        atol=max(atol, slack * rtol * scale),
        equal_nan=True,
        msg=(lambda m: f"{msg}\n{m}") if msg else None,
    )


def poison(numels, device, dtype=torch.bfloat16):
    """Leave NaN-filled blocks in the CUDA caching allocator, one per expected output of
    `numels[i]` elements of `dtype`, so an element the kernel never writes reads back as NaN."""
    if torch.device(device).type != "cuda":
        return
    size = torch.empty((), dtype=dtype).element_size()
    blocks = [
        torch.full(((n * size + 1) // 2,), float("nan"), dtype=torch.float16, device=device)
        for n in numels
        if n > 0
    ]
    del blocks


def rand(shape, dtype, device, scale=1.0):
    return (torch.randn(*shape, device=device) * scale).to(dtype)


def views(shape, dtype, device, scale, limit=None):
    out = list(input_views(shape, dtype, device, scale))
    return out if limit is None else out[:limit]


def run_matmul_case(M, K, N, dtype, device, all_views=True):
    for an, a in views((M, K), dtype, device, 1.0, None if all_views else 1):
        for bn, b in views((K, N), dtype, device, 1.0 / math.sqrt(K), None if all_views else 2):
            poison([M * N], device, dtype)
            c = fused_ops.matmul(a, b)
            assert c.shape == (M, N) and c.dtype == dtype and c.device == a.device
            check(c, a.double() @ b.double(), dtype, msg=f"{(M, K, N)} a={an} b={bn}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_matmul_2d(device, dtype, shape):
    run_matmul_case(*shape, dtype, device)


@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES + CUDA_SHAPES)
def test_matmul_2d_cuda_kernels(kernel, dtype, shape):
    M, K, N = shape
    run_matmul_case(M, K, N, dtype, "cuda", all_views=M * N * K < 2e10)


@CUDA
def test_matmul_cuda_float32_follows_tf32_flag(monkeypatch):
    # float32 goes to cuBLAS: full fp32 accuracy unless torch allows TF32.
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    run_matmul_case(1000, 4097, 127, torch.float32, "cuda", all_views=False)
    linear_case((1000, 4097), 127, torch.float32, "cuda", True, "gelu", all_views=False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
    a = rand((1000, 4097), torch.float32, "cuda")
    b = rand((4097, 127), torch.float32, "cuda", 1 / math.sqrt(4097))
    # With TF32 allowed the result is torch's own (the same cuBLAS call), not fp32-exact.
    torch.testing.assert_close(fused_ops.matmul(a, b), torch.matmul(a, b))


BATCHED = [  # (a shape, b shape)
    ((3, 17, 33), (3, 33, 9)),
    ((3, 17, 33), (33, 9)),  # 3-D x 2-D
    ((17, 33), (4, 33, 9)),  # 2-D x 3-D
    ((1, 17, 33), (5, 33, 9)),  # batch broadcast
    ((5, 17, 33), (1, 33, 9)),
]
BATCHED_CUDA = [
    ((2, 130, 1000), (2, 1000, 260)),
    ((4, 1000, 127), (127, 1000)),
    ((3, 2048, 512), (3, 512, 2048)),  # enough tiles for the Hopper kernel's wide tile
    ((1, 2048, 512), (3, 512, 2048)),
]


@pytest.mark.parametrize("device_kernel", DEVICE_KERNELS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shapes", BATCHED + [pytest.param(s, marks=CUDA) for s in BATCHED_CUDA])
def test_matmul_batched(device_kernel, dtype, shapes, knobs):
    device = use(device_kernel, knobs)
    if device == "cpu" and shapes in BATCHED_CUDA:
        pytest.skip("large batched shapes run on the GPU only")
    sa, sb = shapes
    K = sa[-1]
    for an, a in views(sa, dtype, device, 1.0):
        for bn, b in views(sb, dtype, device, 1.0 / math.sqrt(K)):
            ref = torch.matmul(a.double(), b.double())
            poison([ref.numel()], device, dtype)
            c = fused_ops.matmul(a, b)
            assert c.shape == ref.shape
            check(c, ref, dtype, msg=f"{sa}x{sb} a={an} b={bn}")


@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_matmul_many_batches(kernel, dtype):
    # More batches than one grid dimension holds: the kernel loops over the rest.
    a = rand((70000, 3, 5), dtype, "cuda")
    b = rand((70000, 5, 2), dtype, "cuda")
    poison([70000 * 6], "cuda", dtype)
    check(fused_ops.matmul(a, b), torch.matmul(a.double(), b.double()), dtype)


def linear_case(x_shape, N, dtype, device, with_bias, act, all_views=True):
    K = x_shape[-1]
    for xn, x in views(x_shape, dtype, device, 1.0, None if all_views else 1):
        for wn, w in views((N, K), dtype, device, 1.0 / math.sqrt(K), None if all_views else 2):
            b = rand((N,), dtype, device) if with_bias else None
            ref = reference.linear(x.double(), w.double(), None if b is None else b.double(), act)
            poison([ref.numel()], device, dtype)
            y = fused_ops.linear(x, w, b, act)
            assert y.shape == ref.shape and y.dtype == dtype
            check(y, ref, dtype, msg=f"x={x_shape} {xn} w={wn} bias={with_bias} act={act}")
            # The training op: y and the pre-activation.
            if act is not None:
                zref = F.linear(x.double(), w.double(), None if b is None else b.double())
                poison([ref.numel(), ref.numel()], device, dtype)
                y2, z = torch.ops.fused.linear_fwd(x, w, b, act)
                check(y2, ref, dtype, msg=f"linear_fwd y {xn} {wn}")
                check(z, zref, dtype, msg=f"linear_fwd preact {xn} {wn}")


LINEAR_SHAPES = [
    ((17, 33), 9),
    ((1, 1), 1),
    ((2, 3, 40), 24),
    ((70,), 5),
    ((64, 129), 200),
    ((0, 8), 4),
]


@pytest.mark.parametrize("device_kernel", DEVICE_KERNELS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("case", LINEAR_SHAPES)
def test_linear(device_kernel, dtype, act, case, knobs):
    device = use(device_kernel, knobs)
    x_shape, N = case
    for with_bias in (True, False):
        linear_case(x_shape, N, dtype, device, with_bias, act)


@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize(
    "case",
    [
        ((1000, 4097), 1000),
        ((4, 1000, 1000), 4097),
        ((4097, 127), 17),
        ((2048, 1024), 4096),
        ((1, 4097), 127),
    ],
)
def test_linear_cuda_large(kernel, dtype, act, case):
    x_shape, N = case
    linear_case(x_shape, N, dtype, "cuda", True, act, all_views=False)


@pytest.mark.parametrize("device", DEVICES)
def test_linear_k_zero(device):
    # An empty reduction: y = act(bias).
    x = torch.randn(5, 0, device=device).half() if device == "cuda" else torch.randn(5, 0)
    w = torch.randn(3, 0, device=device, dtype=x.dtype)
    b = torch.randn(3, device=device, dtype=x.dtype)
    y = fused_ops.linear(x, w, b, "gelu")
    check(y, F.gelu(b.double()).expand(5, 3), x.dtype)


def act_ref(z, act):
    return F.gelu(z, approximate="tanh") if act == "gelu_tanh" else F.gelu(z)


def mirrored_grads(x, w, b, act, gy):
    """float64 gradients of act(x W^T + b), rounding the saved pre-activation and dZ to the
    input dtype where the fused backward keeps them in it."""
    dtype = x.dtype
    xd, wd = x.double(), w.double()
    z = F.linear(xd, wd, None if b is None else b.double())
    if act is not None:
        zr = z.to(dtype).double().requires_grad_()
        (dz,) = torch.autograd.grad(act_ref(zr, act), zr, gy.double())
    else:
        dz = gy.double()
    db = dz.reshape(-1, dz.shape[-1]).sum(0)
    dzr = dz.to(dtype).double() if act is not None else dz
    dz2 = dzr.reshape(-1, dz.shape[-1])
    dx = (dz2 @ wd).reshape(x.shape)
    dw = dz2.t() @ xd.reshape(-1, x.shape[-1])
    return dx, dw, db


@pytest.mark.parametrize("device_kernel", DEVICE_KERNELS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("case", [((33, 70), 17), ((2, 9, 40), 130), ((5,), 3), ((300, 64), 96)])
def test_linear_backward(device_kernel, dtype, act, case, knobs):
    device = use(device_kernel, knobs)
    x_shape, N = case
    K = x_shape[-1]
    for with_bias in (True, False):
        x = rand(x_shape, dtype, device).requires_grad_()
        w = rand((N, K), dtype, device, 1.0 / math.sqrt(K)).requires_grad_()
        b = rand((N,), dtype, device).requires_grad_() if with_bias else None
        gy = rand((*x_shape[:-1], N), dtype, device)
        dx_ref, dw_ref, db_ref = mirrored_grads(
            x.detach(), w.detach(), None if b is None else b.detach(), act, gy
        )
        # The training path (linear_fwd) and the inference op's own autograd (recompute).
        for name, fn in (("functional", fused_ops.linear), ("op", torch.ops.fused.linear)):
            for t in (x, w, b):
                if t is not None:
                    t.grad = None
            fn(x, w, b, act).backward(gy)
            msg = f"{name} x={x_shape} N={N} bias={with_bias} act={act}"
            check(x.grad, dx_ref, dtype, msg=msg + " dx", slack=1.0)
            check(w.grad, dw_ref, dtype, msg=msg + " dw", slack=1.0)
            if with_bias:
                check(b.grad, db_ref, dtype, msg=msg + " db", slack=1.0)


@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("act", ["gelu", "gelu_tanh"])
@pytest.mark.parametrize("mkn", [(4097, 1000, 1030), (8192, 2048, 4096)])
def test_linear_backward_cuda_large(kernel, dtype, act, mkn):
    # The second shape makes dX and dW large enough for the Hopper kernel's MN-major paths.
    M, K, N = mkn
    x = rand((M, K), dtype, "cuda").requires_grad_()
    w = rand((N, K), dtype, "cuda", 1.0 / math.sqrt(K)).requires_grad_()
    b = rand((N,), dtype, "cuda").requires_grad_()
    gy = rand((M, N), dtype, "cuda")
    dx_ref, dw_ref, db_ref = mirrored_grads(x.detach(), w.detach(), b.detach(), act, gy)
    fused_ops.linear(x, w, b, act).backward(gy)
    check(x.grad, dx_ref, dtype, msg="dx", slack=1.0)
    check(w.grad, dw_ref, dtype, msg="dw", slack=1.0)
    check(b.grad, db_ref, dtype, msg="db", slack=1.0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ["gelu", "gelu_tanh"])
@pytest.mark.parametrize("shape", [(1, 1), (7, 130), (300, 65), (2, 3, 64)])
def test_linear_act_backward(device, dtype, act, shape):
    z = rand(shape, dtype, device, 2.0)
    g = rand(shape, dtype, device)
    zr = z.double().requires_grad_()
    (dz_ref,) = torch.autograd.grad(act_ref(zr, act), zr, g.double())
    db_ref = dz_ref.reshape(-1, shape[-1]).sum(0)
    for views_ in (lambda t: t, lambda t: t.transpose(-1, -2).contiguous().transpose(-1, -2)):
        poison([z.numel()], device, dtype)
        dz, db = torch.ops.fused.linear_act_backward(views_(g), views_(z), act, True)
        check(dz, dz_ref, dtype)
        check(db, db_ref, dtype, slack=1.0)
        _, db0 = torch.ops.fused.linear_act_backward(g, z, act, False)
        assert db0.shape == (0,)


@CUDA
def test_linear_act_backward_deterministic():
    z = torch.randn(5000, 3000, device="cuda").bfloat16()
    g = torch.randn(5000, 3000, device="cuda").bfloat16()
    first = torch.ops.fused.linear_act_backward(g, z, "gelu", True)[1]
    for _ in range(3):
        assert torch.equal(torch.ops.fused.linear_act_backward(g, z, "gelu", True)[1], first)


@pytest.mark.parametrize("act", ACTS)
def test_gradcheck_float64(act):
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *t: fused_ops.linear(*t, act), (x, w, b))
    assert torch.autograd.gradcheck(lambda *t: torch.ops.fused.linear(*t, act), (x, w, b))
    assert torch.autograd.gradcheck(lambda x, w: fused_ops.linear(x, w, None, act), (x, w))


@pytest.mark.parametrize(
    "shapes",
    [
        ((4, 6), (6, 5)),
        ((3, 4, 6), (6, 5)),
        ((4, 6), (2, 6, 5)),
        ((1, 4, 6), (3, 6, 5)),
        ((3, 4, 6), (3, 6, 5)),
    ],
)
def test_matmul_gradcheck_float64(shapes):
    a = torch.randn(*shapes[0], dtype=torch.float64, requires_grad=True)
    b = torch.randn(*shapes[1], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(fused_ops.matmul, (a, b))


@pytest.mark.parametrize("device_kernel", DEVICE_KERNELS)
def test_opcheck(device_kernel, knobs):
    device = use(device_kernel, knobs)
    dt = torch.float32 if device == "cpu" else torch.bfloat16
    x = torch.randn(5, 7, device=device, dtype=dt, requires_grad=True)
    w = torch.randn(3, 7, device=device, dtype=dt, requires_grad=True)
    b = torch.randn(3, device=device, dtype=dt, requires_grad=True)
    ops = torch.ops.fused
    torch.library.opcheck(ops.matmul.default, (x, w.t()))
    torch.library.opcheck(ops.matmul.default, (x.unsqueeze(0).expand(2, 5, 7), w.t()))
    for act in ACTS:
        torch.library.opcheck(ops.linear.default, (x, w, b, act))
        torch.library.opcheck(ops.linear.default, (x, w, None, act))
    torch.library.opcheck(ops.linear_fwd.default, (x, w, b, "gelu_tanh"))
    z = torch.randn(5, 3, device=device, dtype=dt)
    torch.library.opcheck(ops.linear_act_backward.default, (z, z, "gelu", True))
    torch.library.opcheck(ops.linear_act_backward.default, (z, z, "gelu_tanh", False))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    torch._dynamo.reset()
    x = torch.randn(8, 33, device=device, requires_grad=True)
    w = torch.randn(16, 33, device=device, requires_grad=True)
    b = torch.randn(16, device=device, requires_grad=True)

    def f(x, w, b):
        return fused_ops.linear(x, w, b, "gelu_tanh").sum()

    out = torch.compile(f, fullgraph=True)(x, w, b)
    out.backward()
    xd, wd, bd = (t.detach().double().requires_grad_() for t in (x, w, b))
    ref = reference.linear(xd, wd, bd, "gelu_tanh").sum()
    ref.backward()
    check(out.detach(), ref.detach(), torch.float32)
    for t, r in ((x, xd), (w, wd), (b, bd)):
        check(t.grad, r.grad, torch.float32, slack=1.0)


def test_nn_linear_is_drop_in():
    ref = torch.nn.Linear(6, 4)
    m = fused_ops.nn.Linear(6, 4)
    assert isinstance(m, torch.nn.Linear)
    m.load_state_dict(ref.state_dict())
    assert repr(m) == repr(ref)
    x = torch.randn(3, 6)
    torch.testing.assert_close(m(x), ref(x))
    g = fused_ops.nn.Linear(6, 4, bias=False, activation="gelu")
    assert "activation='gelu'" in repr(g)
    torch.testing.assert_close(g(x), F.gelu(F.linear(x, g.weight)))
    with pytest.raises(ValueError, match="activation must be"):
        fused_ops.nn.Linear(6, 4, activation="relu")


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs(device):
    f = torch.randn(3, 4, device=device)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        fused_ops.matmul(f, torch.randn(3, 4, device=device))
    with pytest.raises(RuntimeError, match="expected a to be 2-D or 3-D.*1-D"):
        fused_ops.matmul(torch.randn(4, device=device), f)
    with pytest.raises(RuntimeError, match="expected b to be 2-D or 3-D.*4-D"):
        fused_ops.matmul(f, torch.randn(1, 1, 4, 3, device=device))
    with pytest.raises(RuntimeError, match="batch sizes.*must match"):
        fused_ops.matmul(torch.randn(2, 3, 4, device=device), torch.randn(3, 4, 5, device=device))
    with pytest.raises(RuntimeError, match="same dtype"):
        fused_ops.matmul(f, torch.randn(4, 3, device=device).half())
    with pytest.raises(RuntimeError, match="expected a to be float32.*Long"):
        fused_ops.matmul(f.long(), f.long().t())
    w = torch.randn(5, 4, device=device)
    with pytest.raises(RuntimeError, match="must equal weight.size\\(1\\)"):
        fused_ops.linear(torch.randn(3, 5, device=device), w)
    with pytest.raises(RuntimeError, match="expected weight to be 2-D"):
        fused_ops.linear(f, w.unsqueeze(0))
    with pytest.raises(RuntimeError, match="expected bias of shape \\[5\\]"):
        fused_ops.linear(f, w, torch.randn(4, device=device))
    with pytest.raises(
        RuntimeError,
        match="activation to be None, 'gelu', 'gelu_tanh', 'swiglu', 'geglu' or 'geglu_tanh'.*'relu'",
    ):
        fused_ops.linear(f, w, None, "relu")
    with pytest.raises(RuntimeError, match="same dtype"):
        fused_ops.linear(f, w.half())
    with pytest.raises(
        RuntimeError, match="activation to be None, 'gelu', .* or 'geglu_tanh'.*'none'"
    ):
        torch.ops.fused.linear_act_backward(f, f, "none", True)
    with pytest.raises(RuntimeError, match="same shape"):
        torch.ops.fused.linear_act_backward(f, f.t(), "gelu", True)


@CUDA
def test_cuda_device_and_dtype_errors():
    with pytest.raises(RuntimeError, match="same device"):
        fused_ops.matmul(torch.randn(3, 4), torch.randn(4, 3, device="cuda"))
    with pytest.raises(RuntimeError, match="same device"):
        fused_ops.linear(torch.randn(3, 4, device="cuda"), torch.randn(5, 4))
    with pytest.raises(RuntimeError, match="float64"):
        fused_ops.matmul(
            torch.randn(3, 4, device="cuda").double(), torch.randn(4, 3, device="cuda").double()
        )


@CUDA
def test_bad_kernel_env(knobs):
    a = torch.randn(8, 8, device="cuda").half()
    with pytest.raises(RuntimeError, match="matmul.kernel must be"):
        knobs("matmul.kernel=fastest")
        fused_ops.matmul(a, a)


# The tile order's group height (matmul.group_m, default 8) only reorders the tiles:
# every value gives bitwise the default's output, including groups of 1, a height that does
# not divide the tile-rows (a short last group) and one taller than the whole problem. Both
# kernels, on the linear layer (the batch folded into M) and on a batched matmul (weights
# given K-major, so the Hopper kernel takes it; its tile order restarts per batch item). K is
# a multiple of 8 (TMA's 16-byte rows) but not of 64. Outputs land in NaN-poisoned memory,
# so a tile the order skips shows.
@CUDA
@pytest.mark.parametrize("kernel_choice", KERNELS)
@pytest.mark.parametrize("shape", [(3, 1000, 4104, 700), (1, 4097, 1000, 2500)])
def test_tile_group_height_only_reorders(kernel_choice, shape, knobs):
    batch, m, k, n = shape
    set_kernel(kernel_choice, knobs)
    torch.manual_seed(0)
    x = torch.randn(batch, m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    wb = (torch.randn(batch, n, k, device="cuda", dtype=torch.bfloat16) / k**0.5).transpose(1, 2)
    cases = {
        "linear": (
            lambda: fused_ops.linear(x, w, bias, "gelu_tanh"),
            reference.gelu(F.linear(x.double(), w.double(), bias.double()), "tanh"),
        ),
        "batched matmul": (lambda: fused_ops.matmul(x, wb), torch.matmul(x.double(), wb.double())),
    }
    for name, (run, ref) in cases.items():
        knobs("matmul.group_m=8")  # the default
        poison([ref.numel()], "cuda")
        want = run()
        check(want, ref, torch.bfloat16, msg=f"{name}, default group, {shape}")
        for g in ("1", "3", "16", "1024"):
            knobs(f"matmul.group_m={g}")
            poison([ref.numel()], "cuda")
            got = run()
            assert torch.equal(got, want), f"{name}, matmul.group_m={g}, {shape}"


@CUDA
@pytest.mark.parametrize("value", ["0", "-2", "eight", "8x", "2000"])
def test_bad_tile_group_env(value, knobs):
    a = torch.randn(8, 8, device="cuda").half()
    with pytest.raises(RuntimeError, match="matmul.group_m must be"):
        knobs(f"matmul.group_m={value}")
        fused_ops.matmul(a, a)


def _ordered_bits(t):
    """16-bit floats as integers in value order (one apart = one ulp apart; -0 == +0)."""
    v = t.view(torch.int16).int()
    return torch.where(v < 0, -(v & 0x7FFF), v)


# The GeLU epilogue rounds well. With operands on a coarse grid (x in k/8, w in k/16, K = 64,
# bias in k/8) every fp32 product and sum is exact, so the pre-activation z is exact and each
# output can be held to the correctly rounded float64 GeLU of z (written in the tail-exact
# forms x sigmoid(2u) and x erfc(-x / sqrt 2) / 2, since 1 + tanh / 1 + erf cancel there):
# never more than one ulp off, and off at all for at most 1% (bf16) / 3% (fp16) of outputs,
# overall and in the negative tail z < -1.5. A GeLU through 1 + tanh(u) fails this: cuBLASLt's
# fused epilogue is off for 4.9% / 11.9% of tail outputs, by up to 4 ulp (docs/design/matmul.md,
# "Roofline and standing"). Values below 2^-100 are left out: the
# epilogue flushes float subnormals to zero there.
@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("act", ["gelu", "gelu_tanh"])
def test_linear_gelu_epilogue_rounding(kernel, dtype, act):
    g = torch.Generator(device="cuda").manual_seed(1)
    m, k, n = 1024, 64, 1000
    x = (torch.randint(-16, 17, (m, k), device="cuda", generator=g) / 8).to(dtype)
    w = (torch.randint(-16, 17, (n, k), device="cuda", generator=g) / 16).to(dtype)
    b = (torch.randint(-24, 25, (n,), device="cuda", generator=g) / 8).to(dtype)
    z = F.linear(x.double(), w.double(), b.double())
    if act == "gelu_tanh":
        exact = z * torch.sigmoid(2 * math.sqrt(2 / math.pi) * (z + 0.044715 * z**3))
    else:
        exact = 0.5 * z * torch.special.erfc(-z / math.sqrt(2))
    want = exact.to(dtype)
    poison([m * n], "cuda", dtype)
    got = fused_ops.linear(x, w, b, act)
    assert torch.isfinite(got).all()
    keep = exact.abs() >= 2.0**-100
    ulps = (_ordered_bits(got) - _ordered_bits(want)).abs()[keep]
    tail = (z < -1.5)[keep]
    assert tail.float().mean() > 0.2  # the grid reaches far into the tail
    limit = 0.01 if dtype == torch.bfloat16 else 0.03
    assert ulps.max().item() <= 1, f"{act} {dtype}: {ulps.max().item()} ulp off"
    for name, sel in (("all", torch.ones_like(tail)), ("tail z < -1.5", tail)):
        off = (ulps[sel] > 0).float().mean().item()
        assert off <= limit, f"{act} {dtype} {name}: {off:.2%} of outputs off the rounded value"


# The 16-bit GeLU epilogues share one reciprocal between two neighbouring columns
# (docs/design/matmul.md, "Design"): a NaN or infinite pre-activation must stay in its own
# column. Bias entries NaN, +inf, -inf on even and odd columns make whole columns non-finite;
# every output matches float64 (gelu(+inf) = inf, gelu(-inf) = NaN as in torch), both
# kernels, both GeLUs.
@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("act", ["gelu", "gelu_tanh"])
def test_linear_gelu_nonfinite_stays_in_its_column(kernel, dtype, act):
    m, k, n = 300, 64, 520
    x, w = rand((m, k), dtype, "cuda"), rand((n, k), dtype, "cuda", 1 / k**0.5)
    b = rand((n,), dtype, "cuda")
    for col, v in (
        (4, math.nan),
        (7, math.nan),
        (10, math.inf),
        (13, math.inf),
        (16, -math.inf),
        (301, -math.inf),
    ):
        b[col] = v
    ref = reference.gelu(
        F.linear(x.double(), w.double(), b.double()), "tanh" if act == "gelu_tanh" else "none"
    )
    poison([m * n], "cuda", dtype)
    got = fused_ops.linear(x, w, b, act)
    for kind in (torch.isnan, torch.isposinf, torch.isneginf):
        assert torch.equal(kind(got), kind(ref)), f"{act} {dtype}: {kind.__name__} differs"
    finite = torch.isfinite(b)
    assert torch.isfinite(ref[:, finite]).all()
    check(got[:, finite], ref[:, finite], dtype, msg=f"{act} {dtype}")


# ---------------------------------------------------------------------------------------
# Every operand layout on the Hopper kernel, and its schedules (docs/design/matmul.md,
# "Schedules"). A layout is (A K-major?, B K-major?): the forward (True, True), dX = dZ W
# (True, False), dW = dZ^T X (False, False), a transposed input times a weight (False, True).
LAYOUTS = [(True, True), (True, False), (False, False), (False, True)]
LAYOUT_IDS = ["a_k-b_k", "a_k-b_mn", "a_mn-b_mn", "a_mn-b_k"]


def layout_operands(batch, m, k, n, a_kmajor, b_kmajor, dtype):
    """a [batch?, m, k] and b [batch?, k, n] as views of fresh contiguous tensors: K-major is a
    row-major A or a transposed [n, k] B; MN-major a transposed [k, m] A or a row-major B."""
    lead = () if batch is None else (batch,)
    a = rand((*lead, m, k), dtype, "cuda") if a_kmajor else rand((*lead, k, m), dtype, "cuda")
    b_scale = 1.0 / math.sqrt(max(k, 1))
    if b_kmajor:
        b = rand((*lead, n, k), dtype, "cuda", b_scale)
    else:
        b = rand((*lead, k, n), dtype, "cuda", b_scale)
    return (a if a_kmajor else a.transpose(-1, -2)), (b.transpose(-1, -2) if b_kmajor else b)


def check_layout_case(batch, m, k, n, layout, dtype, msg=""):
    if MEMCHECK and m * k * n * (batch or 1) > 2e9:
        return None  # the float64 reference alone would take minutes under the sanitizer
    a, b = layout_operands(batch, m, k, n, *layout, dtype)
    ref = torch.matmul(a.double(), b.double())
    poison([ref.numel()], "cuda", dtype)
    c = fused_ops.matmul(a, b)
    assert c.shape == ref.shape
    check(c, ref, dtype, msg=f"{msg} batch={batch} (M, K, N)={(m, k, n)} layout={layout}")
    return c


# M, N, K from {1, 17, 127, 1000, 4097}, each size in every position, plus multiples of 8
# (operands read in place: odd leading dimensions are copied to padded rows first).
LAYOUT_SHAPES = [
    (1, 17, 127),
    (17, 127, 1),
    (127, 1, 17),
    (1000, 4097, 17),
    (17, 1000, 4097),
    (4097, 127, 1000),
    (1, 4097, 1000),
    (1000, 1000, 1000),
    (4097, 17, 4097),
    (256, 384, 520),
    (2048, 8192, 2048),
]


@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("shape", LAYOUT_SHAPES)
def test_matmul_every_layout(kernel, dtype, layout, shape):
    check_layout_case(None, *shape, layout, dtype)


@CUDA
@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("shapes", [(3, 127, 1000, 17), (2, 520, 4097, 264), (4, 1, 2048, 1000)])
def test_matmul_every_layout_batched(kernel, layout, shapes):
    check_layout_case(*shapes, layout, torch.bfloat16)


def is_hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


HOPPER = pytest.mark.skipif(
    not is_hopper(), reason="the Hopper kernel needs compute capability 9.0"
)

# The kernel's demangled name spells every template argument, the defaulted ones too:
# hopper_gemm_kernel<__nv_bfloat16, fused::matmul::(anonymous namespace)::HopperConfig<256>,
# true, true, true, false, fused::matmul::(anonymous namespace)::PlainEpilogue>.
_HOPPER_GEMM = re.compile(
    r"hopper_gemm_kernel<[^,]+, [\w:() ]*HopperConfig<(\d+)>, (true|false), (true|false), "
    r"(true|false), (true|false), [\w:() ]*?(\w+Epilogue)>"
)


def hopper_launches(fn, epilogue="PlainEpilogue"):
    """(BN, A K-major, B K-major, TMA store, split-K) of each Hopper GEMM with that epilogue
    fn() launches."""
    return [
        (int(m[1]), m[2] == "true", m[3] == "true", m[4] == "true", m[5] == "true")
        for name in cuda_kernel_names(fn)
        for m in [_HOPPER_GEMM.search(name)]
        if m and m[6] == epilogue
    ]


# On an H100 / H200 every layout runs on the Hopper kernel, read in place (sizes that are
# multiples of 8), at both tile widths; no portable kernel is launched.
@CUDA
@HOPPER
@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("tile_n", ["auto", "128", "256"])
def test_hopper_kernel_takes_every_layout(layout, tile_n, knobs):
    knobs(f"matmul.kernel=hopper,matmul.tile_n={tile_n}")
    for m, k, n in [(256, 384, 520), (1000, 1000, 1000 - 8)]:
        a, b = layout_operands(None, m, k, n, *layout, torch.bfloat16)
        names = cuda_kernel_names(lambda: fused_ops.matmul(a, b))
        assert not any("portable_gemm_kernel" in x for x in names), names
        runs = hopper_launches(lambda: fused_ops.matmul(a, b))
        assert len(runs) == 1 and runs[0][1:3] == layout, runs
        if tile_n != "auto":
            assert runs[0][0] == int(tile_n), runs
        check(fused_ops.matmul(a, b), a.double() @ b.double(), torch.bfloat16)


# The weight gradient of a 2048 x 2048 weight over 8192 tokens (M = N = 2048, K = 8192, both
# operands MN-major: 128 wide tiles for 132 SMs) runs on the Hopper kernel's wide tile, whole
# K; the linear layer's backward takes the same path. A narrow layer's weight gradient
# (M = N = 1024, K = 16384: 32 wide tiles) and the decode shapes take split-K.
@CUDA
@HOPPER
def test_hopper_schedule_of_training_gemms(knobs):
    knobs("matmul.kernel=hopper")
    dy = rand((8192, 2048), torch.bfloat16, "cuda")
    x = rand((8192, 2048), torch.bfloat16, "cuda", 1 / 8192**0.5)
    assert hopper_launches(lambda: fused_ops.matmul(dy.t(), x)) == [
        (256, False, False, True, False)
    ]
    check(fused_ops.matmul(dy.t(), x), dy.double().t() @ x.double(), torch.bfloat16)

    dy = rand((16384, 1024), torch.bfloat16, "cuda")
    x = rand((16384, 1024), torch.bfloat16, "cuda", 1 / 16384**0.5)
    runs = hopper_launches(lambda: fused_ops.matmul(dy.t(), x))
    assert len(runs) == 1 and runs[0][1:] == (False, False, True, True), runs
    check(fused_ops.matmul(dy.t(), x), dy.double().t() @ x.double(), torch.bfloat16)

    w = rand((4096, 4096), torch.bfloat16, "cuda", 1 / 64)
    for m in (1, 16, 128):
        xs = rand((m, 4096), torch.bfloat16, "cuda")
        runs = hopper_launches(lambda: fused_ops.matmul(xs, w.t()))
        assert len(runs) == 1 and runs[0][1:] == (True, True, True, True), (m, runs)
        check(fused_ops.matmul(xs, w.t()), xs.double() @ w.double().t(), torch.bfloat16)

    # The whole linear backward of the square layer: dX (A K-major, B MN-major) and dW.
    xl = rand((8192, 2048), torch.bfloat16, "cuda").requires_grad_()
    wl = rand((2048, 2048), torch.bfloat16, "cuda", 1 / 2048**0.5).requires_grad_()
    y = fused_ops.linear(xl, wl)
    g = torch.randn_like(y)
    runs = hopper_launches(lambda: torch.autograd.grad(y, (xl, wl), g, retain_graph=True))
    assert sorted(r[1:3] for r in runs) == [(False, False), (True, False)], runs


# Split-K (forced through matmul.split_k, and chosen): every layout, odd sizes, batches,
# both dtypes, against float64; a piece count that does not divide the K tiles; more pieces
# than K tiles (capped); bitwise the same result on every run (pieces summed in order).
SPLIT_SHAPES = [  # (batch, M, K, N)
    (None, 1000, 4097, 1000),
    (None, 17, 1000, 8),
    (None, 1, 4096, 4096),
    (None, 127, 127, 136),
    (3, 130, 2000, 264),
    (None, 1024, 16384, 1024),
]


@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("splits", ["auto", "2", "3", "7", "64"])
def test_matmul_split_k(dtype, layout, splits, knobs):
    if not is_hopper():
        pytest.skip("split-K is the Hopper kernel's schedule")
    knobs(f"matmul.kernel=hopper,matmul.split_k={splits}")
    for shape in SPLIT_SHAPES:
        check_layout_case(*shape, layout, dtype, msg=f"split_k={splits}")
        if splits == "7":
            torch.manual_seed(0)
            a, b = layout_operands(*shape, *layout, dtype)
            first = fused_ops.matmul(a, b)
            for _ in range(2):
                assert torch.equal(fused_ops.matmul(a, b), first), f"{shape}: not deterministic"


@CUDA
@HOPPER
def test_split_k_kernel_names(knobs):
    knobs("matmul.kernel=hopper,matmul.split_k=3")
    a, b = layout_operands(None, 1000, 2048, 1000, False, False, torch.bfloat16)
    assert [r[4] for r in hopper_launches(lambda: fused_ops.matmul(a, b))] == [True]
    # An output TMA cannot store (N % 8 != 0) keeps the whole K (split-K stores through TMA).
    a, b = layout_operands(None, 1000, 2048, 1001, False, False, torch.bfloat16)
    assert [r[3:] for r in hopper_launches(lambda: fused_ops.matmul(a, b))] == [(False, False)]
    check(fused_ops.matmul(a, b), a.double() @ b.double(), torch.bfloat16)


# The epilogue after the split-K reduction: bias, both GeLUs, the pre-activation output.
@CUDA
@pytest.mark.parametrize("act", ACTS)
def test_linear_split_k_epilogue(act, knobs):
    if not is_hopper():
        pytest.skip("split-K is the Hopper kernel's schedule")
    knobs("matmul.kernel=hopper,matmul.split_k=4")
    linear_case((130, 4096), 264, torch.bfloat16, "cuda", True, act, all_views=False)
    linear_case((1, 2048), 1000, torch.float16, "cuda", True, act, all_views=False)


def gemm_plan(
    m, n, k, batch=1, num_sms=132, spec="", unaligned=False, sm=90, dtype=None, mn_major=False
):
    """The Hopper kernel's schedule (csrc/cuda/matmul/plan.h) as (BN, splits), or the other
    path's name ("portable", "cublas", "gemv": the small-M kernel)."""
    opts = f"k={k},batch={batch}" + (",unaligned" if unaligned else "")
    opts += ",mn_major" if mn_major else ""
    text = torch.ops.fused._plan(
        "matmul", m, n, dtype or torch.bfloat16, opts, sm, num_sms, True, spec
    )
    if not text.startswith("hopper"):
        return text
    fields = dict(f.split("=") for f in text.split()[1:])
    return int(fields["bn"]), int(fields["splits"])


# The schedule rule (docs/design/matmul.md, "Schedules") on the gemm_train set's shapes,
# checked on CPU: big grids keep 128 x 256 and the whole K; 128 wide tiles (one wave on 132
# SMs) stay wide and whole; narrow layers' weight gradients and decode shapes split K.
@pytest.mark.parametrize(
    "mnk, want",
    [
        ((8192, 8192, 8192), (256, 1)),
        ((8192, 12288, 4096), (256, 1)),
        ((2048, 2048, 8192), (256, 1)),  # the 2048^2 wgrad over 8192 tokens
        ((2048, 2048, 2048), (256, 1)),
        ((4096, 1024, 16384), (256, 1)),
        ((1024, 1024, 16384), (256, 4)),  # 32 tiles: 128 units in one wave
        ((3072, 1024, 16384), (256, 4)),  # 96 tiles: 384 units in 2.9 waves
        ((1, 4096, 4096), (128, 4)),
        ((128, 4096, 4096), (128, 4)),
        ((16, 14336, 4096), (128, 1)),  # 112 narrow tiles
        ((1000, 1000, 64), (128, 1)),  # one k-tile, 64 narrow tiles: half the latency
    ],
)
def test_gemm_schedule(mnk, want):
    # The Hopper kernel's schedule; under matmul.kernel=auto the decode shapes (M <= 32) take
    # the small-M kernel instead (test_gemv_plan).
    assert gemm_plan(*mnk, spec="matmul.kernel=hopper") == want


def test_gemm_schedule_edges_and_overrides():
    # Split-K needs a TMA-stored output: N % 8 == 0 and an aligned pointer.
    assert gemm_plan(1024, 1024, 16384, unaligned=True)[1] == 1
    assert gemm_plan(1024, 1020, 16384)[1] == 1
    assert gemm_plan(1024, 1016, 16384)[1] > 1
    # Fewer SMs (an H100 PCIe): 128 wide tiles are a full grid there.
    assert gemm_plan(2048, 2048, 8192, num_sms=114) == (256, 1)
    assert gemm_plan(1024, 1024, 16384, num_sms=114)[1] > 1
    # The batch multiplies the tiles: 8 x 32 wide tiles keep the whole K.
    assert gemm_plan(1024, 1024, 16384, batch=8) == (256, 1)
    # Each piece keeps >= 4 k-tiles: K = 512 (8 k-tiles) splits at most in 2.
    assert gemm_plan(128, 256, 512)[1] <= 2
    # The overrides: a forced width or piece count (capped at the K tiles).
    assert gemm_plan(8192, 8192, 8192, spec="matmul.tile_n=128") == (128, 1)
    assert gemm_plan(8192, 8192, 8192, spec="matmul.split_k=3") == (256, 3)
    assert gemm_plan(1000, 1000, 100, spec="matmul.split_k=64")[1] == 2
    assert gemm_plan(1024, 1024, 16384, spec="matmul.split_k=1")[1] == 1
    assert gemm_plan(1024, 1024, 16384, spec="matmul.tile_n=128")[0] == 128
    assert gemm_plan(1024, 1024, 16384, spec="matmul.split_k=5", unaligned=True)[1] == 1
    # Other GPUs and dtypes, and the forced portable kernel.
    assert gemm_plan(1024, 1024, 16384, sm=80) == "portable"
    assert gemm_plan(1024, 1024, 16384, spec="matmul.kernel=portable") == "portable"
    assert gemm_plan(1024, 1024, 16384, dtype=torch.float32) == "cublas"
    with pytest.raises(RuntimeError, match="matmul needs k=K >= 1"):
        torch.ops.fused._plan("matmul", 4, 4, torch.bfloat16, "", 90, 132, True, "")


# On a Hopper GPU the kernel launched is the plan's: tile width and split-K as planned.
@CUDA
@HOPPER
@pytest.mark.parametrize("mnk", [(2048, 2048, 8192), (1024, 1024, 16384), (16, 4096, 4096)])
def test_hopper_launches_its_plan(mnk, knobs):
    knobs("matmul.kernel=hopper")
    m, n, k = mnk
    a, b = layout_operands(None, m, k, n, False, False, torch.bfloat16)
    bn, splits = gemm_plan(
        m,
        n,
        k,
        num_sms=torch.cuda.get_device_properties(0).multi_processor_count,
        spec="matmul.kernel=hopper",
    )
    runs = hopper_launches(lambda: fused_ops.matmul(a, b))
    assert [(r[0], r[4]) for r in runs] == [(bn, splits > 1)], runs


def test_bad_schedule_overrides(knobs):
    for spec, what in (
        ("matmul.split_k=0", "matmul.split_k must be auto or an integer from 1 to 64"),
        ("matmul.split_k=65", "matmul.split_k must be"),
        ("matmul.split_k=two", "matmul.split_k must be"),
        ("matmul.tile_n=64", "matmul.tile_n must be auto, 128 or 256"),
        ("matmul.tile_n=200", "matmul.tile_n must be"),
    ):
        with pytest.raises(RuntimeError, match=what):
            knobs(spec)


# ---------------------------------------------------------------------------------------
# The small-M kernel (csrc/cuda/matmul_gemv.cu; docs/design/matmul.md, "Small M"): M <= 32
# rows against a K-major B, under matmul.kernel=auto (a forced kernel, tile width or piece
# count pins the others), on any GPU.
def test_gemv_plan():
    for m, n, k in [(1, 4096, 4096), (16, 14336, 4096), (32, 4096, 4096), (7, 1000, 4095)]:
        assert gemm_plan(m, n, k) == "gemv", (m, n, k)
        assert gemm_plan(m, n, k, sm=80) == "gemv", (m, n, k)
        assert gemm_plan(m, n, k, dtype=torch.float16) == "gemv", (m, n, k)
    # 33 rows and up: the tensor-core tiles.
    assert isinstance(gemm_plan(33, 4096, 4096), tuple)
    assert isinstance(gemm_plan(128, 14336, 4096), tuple)
    # An MN-major operand, a forced kernel or schedule, float32.
    assert isinstance(gemm_plan(1, 4096, 4096, mn_major=True), tuple)
    assert gemm_plan(1, 4096, 4096, mn_major=True, sm=80) == "portable"
    for spec in ("matmul.kernel=hopper", "matmul.split_k=2", "matmul.tile_n=128"):
        assert isinstance(gemm_plan(1, 4096, 4096, spec=spec), tuple), spec
    assert gemm_plan(1, 4096, 4096, spec="matmul.kernel=portable") == "portable"
    assert gemm_plan(1, 4096, 4096, dtype=torch.float32) == "cublas"
    # Too few 16-row blocks for the SMs and a long K: split-K spreads K instead.
    assert isinstance(gemm_plan(1, 64, 65536), tuple)
    assert gemm_plan(1, 64, 8192) == "gemv"
    assert gemm_plan(1, 64, 65536, batch=64) == "gemv"


def gemv_launches(fn):
    """How many small-M kernels and other GEMM kernels fn() launches."""
    names = cuda_kernel_names(fn)
    gemv = sum("gemv_kernel<" in x for x in names)
    other = sum(("hopper_gemm_kernel<" in x or "portable_gemm_kernel" in x) for x in names)
    return gemv, other


GEMV_M = [1, 2, 7, 16, 33]
GEMV_KN = [(4095, 1000), (1000, 4097), (4096, 4096), (64, 24), (5, 3)]


@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", GEMV_M)
@pytest.mark.parametrize("kn", GEMV_KN)
def test_gemv_matmul(dtype, m, kn, knobs):
    knobs("matmul.kernel=auto")
    k, n = kn
    # x [m, k] and W [n, k] (B = W^T) in every view: contiguous, transposed, gapped, offset.
    for xn, x in views((m, k), dtype, "cuda", 1.0):
        for wn, w in views((n, k), dtype, "cuda", 1.0 / math.sqrt(k)):
            poison([m * n], "cuda", dtype)
            c = fused_ops.matmul(x, w.t())
            check(c, x.double() @ w.double().t(), dtype, msg=f"{(m, k, n)} x={xn} w={wn}")
    # Both K-major: the small-M kernel for m <= 32 (K not a multiple of 8: rows copied to padded
    # ones), the tensor-core kernels above.
    x, w = rand((m, k), dtype, "cuda"), rand((n, k), dtype, "cuda", 1.0 / math.sqrt(k))
    assert gemv_launches(lambda: fused_ops.matmul(x, w.t())) == ((1, 0) if m <= 32 else (0, 1))


# Rows read in place past whose K lie other columns, NaN here: the K edge reads element by
# element and never multiplies past K (NaN * 0 would poison the sum).
@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m, k", [(1, 4089), (16, 4085), (32, 1001), (5, 3)])
def test_gemv_k_edge_reads_in_place(dtype, m, k, knobs):
    knobs("matmul.kernel=auto")
    width = (k + 7) // 8 * 8 + 8
    xs = torch.full((m, width), float("nan"), dtype=dtype, device="cuda")
    ws = torch.full((1000, width), float("nan"), dtype=dtype, device="cuda")
    xs[:, :k] = rand((m, k), dtype, "cuda")
    ws[:, :k] = rand((1000, k), dtype, "cuda", 1.0 / math.sqrt(k))
    x, w = xs[:, :k], ws[:, :k]
    poison([m * 1000], "cuda", dtype)
    c = fused_ops.matmul(x, w.t())
    check(c, x.double() @ w.double().t(), dtype, msg=f"m={m} k={k}")
    assert gemv_launches(lambda: fused_ops.matmul(x, w.t())) == (1, 0)


# Batches: a batch of B matrices (batch strides, B broadcast), and a 3-D input folded into rows.
@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gemv_batched(dtype, knobs):
    knobs("matmul.kernel=auto")
    a = rand((5, 3, 1024), dtype, "cuda").transpose(0, 1)  # [3, 5, 1024], batch stride 1024
    w = rand((3, 1000, 1024), dtype, "cuda", 1 / 32)
    w2 = rand((1000, 1024), dtype, "cuda", 1 / 32)
    for b in (w.transpose(-1, -2), w2.t()):
        poison([3 * 5 * 1000], "cuda", dtype)
        check(fused_ops.matmul(a, b), torch.matmul(a.double(), b.double()), dtype)
        assert gemv_launches(lambda: fused_ops.matmul(a, b)) == (1, 0)
    a = rand((4, 4, 1024), dtype, "cuda")  # contiguous: one GEMM of 16 rows
    poison([16 * 1000], "cuda", dtype)
    check(fused_ops.matmul(a, w2.t()), torch.matmul(a.double(), w2.double().t()), dtype)


# The linear layer's epilogue on the small-M kernel: bias, both GeLUs, the pre-activation
# (linear_fwd), every input view; the gated forms (the small-M kernel writes z, the gated
# kernel pairs it) against their composition; the backward's GEMMs (dX is B MN-major: the
# tensor-core kernels).
@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("case", [((7, 4095), 1000), ((2, 8, 1000), 4097), ((1, 4096), 4096)])
def test_gemv_linear(dtype, act, case, knobs):
    knobs("matmul.kernel=auto")
    for with_bias in (True, False):
        linear_case(*case, dtype, "cuda", with_bias, act)
    x_shape, n = case
    x = rand(x_shape, dtype, "cuda")
    w = rand((n, x_shape[-1]), dtype, "cuda", x_shape[-1] ** -0.5)
    b = rand((n,), dtype, "cuda")
    assert gemv_launches(lambda: fused_ops.linear(x, w, b, act)) == (1, 0)


@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("act", ["swiglu", "geglu", "geglu_tanh"])
def test_gemv_gated_linear(dtype, act, knobs):
    from test_gated_linear import gated_linear_case

    knobs("matmul.kernel=auto")
    for (m, k), n, all_views in [((1, 4096), 1000, False), ((7, 1001), 4097, True)]:
        gated_linear_case((m, k), n, dtype, "cuda", True, act, all_views=all_views)
        x = rand((m, k), dtype, "cuda")
        w = rand((2 * n, k), dtype, "cuda", k**-0.5)
        assert gemv_launches(lambda: fused_ops.linear(x, w, None, act))[0] == 1


# Split-K's workspace (matmul_sm90.cu: split_workspace) is kept per stream and its counters
# reset by the kernel: a call launches the GEMM alone (no memset or fill), results stay right
# and bitwise equal over calls, across workspace growth and on a second stream; CUDA graph
# capture and replay of both small-M paths (split-K records its own zeroed buffers).
@CUDA
@HOPPER
def test_split_k_workspace_and_graphs(knobs):
    knobs("matmul.kernel=hopper")
    dtype = torch.bfloat16
    w = rand((4096, 4096), dtype, "cuda", 1 / 64)
    x = rand((128, 4096), dtype, "cuda")
    big_a = rand((1024, 16384), dtype, "cuda")
    big_b = rand((16384, 1024), dtype, "cuda", 1 / 128)
    first = fused_ops.matmul(x, w.t())
    check(first, x.double() @ w.double().t(), dtype)
    names = cuda_kernel_names(lambda: fused_ops.matmul(x, w.t()))
    runs = hopper_launches(lambda: fused_ops.matmul(x, w.t()))
    assert len(runs) == 1 and runs[0][4], runs  # split-K
    assert not any("Memset" in n or "Fill" in n or "fill" in n for n in names), names
    for _ in range(3):
        assert torch.equal(fused_ops.matmul(x, w.t()), first)
    big = fused_ops.matmul(big_a, big_b)  # more tiles and pieces: the workspace grows
    check(big, big_a.double() @ big_b.double(), dtype)
    assert torch.equal(fused_ops.matmul(x, w.t()), first)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_side = fused_ops.matmul(x, w.t())
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(on_side, first)

    for spec in ("matmul.kernel=hopper", "matmul.kernel=auto"):  # split-K, then small M
        knobs(spec)
        xs = rand((16, 4096), dtype, "cuda") if spec.endswith("auto") else x.clone()
        ref = fused_ops.matmul(xs, w.t())
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fused_ops.matmul(xs, w.t())  # warm-up outside the graph
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fused_ops.matmul(xs, w.t())
        for _ in range(3):
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, ref), spec
        xs.copy_(rand(tuple(xs.shape), dtype, "cuda"))
        graph.replay()
        check(out, xs.double() @ w.double().t(), dtype, msg=spec)
        assert torch.equal(fused_ops.matmul(xs, w.t()), out), spec  # eager after capture
