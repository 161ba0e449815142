"""fused::matmul, fused::linear (+ linear_fwd, linear_act_backward) against float64.

Inputs are scaled so outputs are O(1) (b, weight ~ N(0, 1/K)); the fp32 accumulation over K
then adds errors far below the output rounding, and each comparison allows an absolute slack
of a tenth of the dtype's relative tolerance at the typical output size (for elements that
cancel to near zero). Every CUDA test runs once per kernel choice (matmul.kernel:
"auto", which takes the Hopper kernel on an H100/H200 where it applies, and "portable").
"""

import math

import pytest
import torch
import torch.nn.functional as F

import fused_ops
from fused_ops import reference

from utils import CUDA, DEVICES, DTYPES, TOL, input_views

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


def check(actual, ref, dtype, msg="", slack=0.1):
    """Compare with a float64 reference: rtol by dtype, atol = slack * rtol * mean |ref|.

    Gradients use slack=1: they pass through intermediates kept in the input dtype (the
    saved pre-activation, dZ), and where those round to the neighbouring value of the
    float64 reference's rounding (an fp32-vs-fp64 tie break, ~0.1% of elements), the
    difference reaches one ulp of a term, i.e. rtol x a typical term, in near-zero sums."""
    rtol, atol = TOL[dtype]
    if dtype == torch.float32:
        # float32 sums of K ~ 1e3 products of O(1) outputs carry fp32's own rounding of a few
        # 1e-6 (torch.mm's too); the elementwise 1e-6 floor would fail cuBLAS itself.
        atol = max(atol, 1e-5)
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
