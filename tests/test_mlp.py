"""fused::mlp (linear -> act -> linear, plain or gated) and fused::linear_dact (dZ = (dY W) *
act'(Z), the GEMM with the activation's derivative in its epilogue) against float64
references, forward and backward, on CPU and on CUDA once per kernel choice."""

import math

import pytest
import torch
import torch.nn.functional as F
from test_matmul import DEVICE_KERNELS, KERNELS, check, poison, rand, set_kernel, use

import fused_ops

from utils import CUDA, DTYPES, TOL, cuda_kernel_names, input_views

ACTS = ["gelu", "gelu_tanh", "swiglu", "geglu", "geglu_tanh"]
GATED = ("swiglu", "geglu", "geglu_tanh")


@pytest.fixture(params=KERNELS)
def kernel(request, knobs):
    set_kernel(request.param, knobs)
    return request.param


def act_of(z, act):
    """The activation in float64 ATen ops: gelu(z), or act(gate) * up for z = [gate, up]."""
    approx = "tanh" if act.endswith("tanh") else "none"
    if act not in GATED:
        return F.gelu(z, approximate=approx)
    g, u = z.chunk(2, -1)
    return (F.silu(g) if act == "swiglu" else F.gelu(g, approximate=approx)) * u


def eager(x, w1, b1, w2, b2, act):
    """The composition the op replaces: F.linear -> act -> F.linear."""
    return F.linear(act_of(F.linear(x, w1, b1), act), w2, b2)


def weights(c, h, c_out, dtype, device, act, with_bias):
    width = 2 * h if act in GATED else h
    w1 = rand((width, c), dtype, device, 1.0 / math.sqrt(c))
    w2 = rand((c_out, h), dtype, device, 1.0 / math.sqrt(h))
    b1 = rand((width,), dtype, device) if with_bias else None
    b2 = rand((c_out,), dtype, device) if with_bias else None
    return w1, b1, w2, b2


def d64(t):
    return None if t is None else t.detach().double()


def forward_ref(x, w1, b1, w2, b2, act, dtype):
    """y in float64 from the hidden activation H the op keeps in the dtype: linear_fwd's (the
    same kernel as the op's first GEMM; tests/test_matmul.py and test_gated_linear.py check it
    against float64)."""
    d = [None if t is None else t.detach() for t in (x, w1, b1)]
    h = torch.ops.fused.linear_fwd(*d, act)[0]
    return F.linear(h.double(), d64(w2), d64(b2))


def mlp_forward_case(x_shape, h, dtype, device, act, with_bias, all_views=True):
    c = x_shape[-1]
    w1, b1, w2, b2 = weights(c, h, c + 3, dtype, device, act, with_bias)
    for xn, x in list(input_views(x_shape, dtype, device))[: None if all_views else 1]:
        ref = forward_ref(x, w1, b1, w2, b2, act, dtype)
        poison([ref.numel()], device, dtype)
        y = fused_ops.mlp(x, w1, b1, w2, b2, act)
        assert y.shape == (*x_shape[:-1], c + 3) and y.dtype == dtype
        check(
            y, ref, dtype, msg=f"mlp x={x_shape} {xn} H={h} act={act} bias={with_bias}", slack=1.0
        )


SHAPES = [((17, 33), 9), ((1, 1), 1), ((2, 3, 40), 24), ((70,), 5), ((64, 129), 100)]


@pytest.mark.parametrize("device_kernel", DEVICE_KERNELS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("case", SHAPES)
def test_mlp_forward(device_kernel, dtype, act, case, knobs):
    device = use(device_kernel, knobs)
    for with_bias in (True, False):
        mlp_forward_case(*case, dtype, device, act, with_bias)


def grads_ref(x, w1, b1, w2, act, gy, dtype):
    """float64 gradients (dx, dw1, db1, dw2, db2) from the tensors the op keeps in the dtype:
    Z and H (linear_fwd's, the kernel of the op's forward; tests/test_matmul.py and
    test_gated_linear.py check it against float64) and dZ (linear_dact's, the op the
    backward calls; test_linear_dact checks it against float64). What is left to check is
    the composition: the GEMMs around dZ, the bias sums, shapes, views and plumbing."""
    d = [None if t is None else t.detach() for t in (x, w1, b1, w2)]
    h, z = torch.ops.fused.linear_fwd(d[0], d[1], d[2], act)
    g2 = gy.reshape(-1, gy.shape[-1])
    dz = torch.ops.fused.linear_dact(g2, d[3], z.reshape(-1, z.shape[-1]), act, False)[0]
    dz, g2, xd = dz.double(), g2.double(), d64(x).reshape(-1, x.shape[-1])
    return (
        (dz @ d64(w1)).reshape(x.shape),
        dz.t() @ xd,
        dz.sum(0),
        g2.t() @ h.double().reshape(-1, h.shape[-1]),
        g2.sum(0),
    ), dz


def check_db1(got, dz, dtype, msg):
    """db1 against the column sums of the rounded dZ. The kernels sum dZ's float32 values
    before they are rounded to the dtype (the dact epilogue's partial sums; on the composed
    path, after dH itself was rounded), so each of the M terms differs from the reference's
    by up to one rounding of |dZ| (two on the composed path): independent errors whose sum
    has a standard deviation below eps * sqrt(sum dZ^2) / 2. The allowance is 8 of those
    (4 eps sqrt(sum dZ^2)), on top of check's own tolerance."""
    ref = dz.sum(0)
    if dtype == torch.float32:  # no rounding of dZ to speak of: check's float32 tolerance
        check(got, ref, dtype, msg=msg, slack=1.0)
        return
    rtol, atol = TOL[dtype]
    bound = rtol * ref.abs() + 4 * torch.finfo(dtype).eps * (dz * dz).sum(0).sqrt() + atol
    err = (got.double().to(ref.device) - ref).abs()
    bad = err > bound
    assert not bad.any(), (
        f"{msg}: {int(bad.sum())} of {bad.numel()} columns, worst error "
        f"{float(err.max()):.3g} against {float(bound[err.argmax()]):.3g}"
    )


def mlp_backward_case(x_shape, h, dtype, device, act, with_bias, recompute, c_out=None):
    c = x_shape[-1]
    c_out = c + 2 if c_out is None else c_out
    params = weights(c, h, c_out, dtype, device, act, with_bias)
    x = rand(x_shape, dtype, device).requires_grad_()
    params = [None if p is None else p.requires_grad_() for p in params]
    w1, b1, w2, b2 = params
    gy = rand((*x_shape[:-1], c_out), dtype, device)
    refs, dz = grads_ref(x, w1, b1, w2, act, gy, dtype)
    y = fused_ops.mlp(x, w1, b1, w2, b2, act, recompute=recompute)
    y.backward(gy)
    msg = f"x={x_shape} H={h} act={act} bias={with_bias} recompute={recompute}"
    for name, t, r in zip(("dx", "dw1", "db1", "dw2", "db2"), (x, w1, b1, w2, b2), refs):
        if t is None:
            continue
        if name == "db1":
            check_db1(t.grad, dz, dtype, msg=f"{msg} {name}")
        else:
            check(t.grad, r, dtype, msg=f"{msg} {name}", slack=1.0)


@pytest.mark.parametrize("device_kernel", DEVICE_KERNELS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("case", [((33, 70), 17), ((2, 9, 40), 64), ((5,), 3), ((130, 64), 48)])
def test_mlp_backward(device_kernel, dtype, act, case, knobs):
    device = use(device_kernel, knobs)
    for with_bias, recompute in ((True, False), (False, True), (True, True)):
        mlp_backward_case(*case, dtype, device, act, with_bias, recompute)


@pytest.mark.parametrize("act", ["gelu", "swiglu"])
def test_mlp_backward_views(act):
    # Transposed, gapped and misaligned x (and weights) give the contiguous input's gradients.
    dtype = torch.float32
    for (xn, x), (wn, w1) in zip(
        input_views((31, 24), dtype, "cpu"), input_views((34, 24), dtype, "cpu")
    ):
        w2 = rand((24, 17 if act == "swiglu" else 34), dtype, "cpu")
        for t in (x, w1, w2):
            t.requires_grad_()
        gy = rand((31, 24), dtype, "cpu")
        refs, _ = grads_ref(x, w1, None, w2, act, gy, dtype)
        fused_ops.mlp(x, w1, None, w2, None, act).backward(gy)
        for name, t, r in (("dx", x, refs[0]), ("dw1", w1, refs[1]), ("dw2", w2, refs[3])):
            check(t.grad, r, dtype, msg=f"{xn} {wn} {name}", slack=1.0)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_odd_sizes_against_eager(device, dtype):
    if device == "cuda" and dtype == torch.float64:
        pytest.skip("the CUDA kernels take float32, float16 and bfloat16")
    # C = 1000, H = 2752 (a Llama-like 8/3 ratio, not a tile multiple): fused vs eager
    # F.linear -> act -> F.linear in float64, forward and every gradient.
    for act in ("gelu_tanh", "swiglu"):
        w1, b1, w2, b2 = weights(1000, 2752, 1000, dtype, device, act, True)
        x = rand((37, 1000), dtype, device)
        gy = rand((37, 1000), dtype, device)
        ts = [t.requires_grad_() for t in (x, w1, b1, w2, b2)]
        y = fused_ops.mlp(*ts, act)
        got = torch.autograd.grad(y, ts, gy)
        ds = [t.detach().double().requires_grad_() for t in ts]
        yr = eager(*ds, act)
        want = torch.autograd.grad(yr, ds, gy.double())
        check(y, yr, dtype, msg=f"{act} y", slack=1.0)
        for name, g, r in zip(("dx", "dw1", "db1", "dw2", "db2"), got, want):
            check(g, r, dtype, msg=f"{act} {name}", slack=1.0)


@pytest.mark.parametrize("device_kernel", DEVICE_KERNELS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ACTS)
def test_linear_dact(device_kernel, dtype, act, knobs):
    device = use(device_kernel, knobs)
    m, n, k = 45, 40, 33  # grad_out [m, n], weight [n, k], preact [m, k] (gated [m, 2k])
    width = 2 * k if act in GATED else k
    for gn, g in input_views((m, n), dtype, device):
        w = rand((n, k), dtype, device, 1.0 / math.sqrt(n))
        z = rand((m, width), dtype, device, 2.0)
        zr = z.double().requires_grad_()
        (dz_ref,) = torch.autograd.grad(act_of(zr, act), zr, g.double() @ w.double())
        poison([z.numel()], device, dtype)
        dz, db = torch.ops.fused.linear_dact(g, w, z, act, True)
        assert dz.shape == z.shape and db.shape == (width,)
        check(dz, dz_ref, dtype, msg=f"{gn} dz", slack=1.0)
        check(db, dz.double().sum(0), dtype, msg=f"{gn} db", slack=1.0)
        assert torch.ops.fused.linear_dact(g, w, z, act, False)[1].shape == (0,)


@pytest.mark.parametrize("act", ACTS)
def test_gradcheck_float64(act):
    w1, b1, w2, b2 = weights(6, 5, 4, torch.float64, "cpu", act, True)
    x = torch.randn(3, 6, dtype=torch.float64)
    ts = tuple(t.requires_grad_() for t in (x, w1, b1, w2, b2))
    for recompute in (False, True):

        def f(*t):
            return fused_ops.mlp(*t, act, recompute=recompute)

        assert torch.autograd.gradcheck(f, ts)
        assert torch.autograd.gradgradcheck(f, ts)
    assert torch.autograd.gradcheck(
        lambda x, w1, w2: fused_ops.mlp(x, w1, None, w2, None, act), (x, w1, w2)
    )


@pytest.mark.parametrize("act", ["gelu", "geglu_tanh"])
def test_torch_func_and_forward_ad(act):
    w1, b1, w2, b2 = weights(6, 4, 5, torch.float64, "cpu", act, True)
    x = torch.randn(3, 6, dtype=torch.float64)
    got = torch.func.grad(lambda t: fused_ops.mlp(x, t, b1, w2, b2, act).sum())(w1)
    want = torch.func.grad(lambda t: eager(x, t, b1, w2, b2, act).sum())(w1)
    torch.testing.assert_close(got, want)
    tangent = torch.randn_like(x)
    _, jvp = torch.func.jvp(lambda t: fused_ops.mlp(t, w1, b1, w2, b2, act), (x,), (tangent,))
    _, jvp_ref = torch.func.jvp(lambda t: eager(t, w1, b1, w2, b2, act), (x,), (tangent,))
    torch.testing.assert_close(jvp, jvp_ref)


def test_retain_graph_second_backward():
    # The first backward drops the kept H and Z; a second one recomputes them.
    w1, b1, w2, b2 = weights(8, 6, 8, torch.float64, "cpu", "swiglu", True)
    x = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)
    y = fused_ops.mlp(x, w1, b1, w2, b2, "swiglu")
    (g1,) = torch.autograd.grad(y.sum(), x, retain_graph=True)
    (g2,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(g1, g2)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_opcheck(device):
    dt = torch.float32 if device == "cpu" else torch.bfloat16
    for act in ("gelu", "swiglu"):
        w1, b1, w2, b2 = weights(8, 6, 7, dt, device, act, True)
        x = torch.randn(5, 8, device=device, dtype=dt)
        for t in (x, w1, b1, w2, b2):
            t.requires_grad_()
        ops = torch.ops.fused
        torch.library.opcheck(ops.mlp.default, (x, w1, b1, w2, b2, act, False))
        torch.library.opcheck(ops.mlp.default, (x, w1, None, w2, None, act, True))
        g = torch.randn(5, 7, device=device, dtype=dt)
        z = torch.randn(5, w1.shape[0], device=device, dtype=dt)
        torch.library.opcheck(ops.linear_dact.default, (g, w2.detach(), z, act, True))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_compile_fullgraph(device):
    torch._dynamo.reset()
    w1, b1, w2, b2 = weights(16, 12, 16, torch.float32, device, "geglu", True)
    x = torch.randn(6, 16, device=device)
    ts = [t.requires_grad_() for t in (x, w1, b1, w2, b2)]

    def f(*t):
        return fused_ops.mlp(*t, "geglu").sum()

    out = torch.compile(f, fullgraph=True)(*ts)
    got = torch.autograd.grad(out, ts)
    ds = [t.detach().double().requires_grad_() for t in ts]
    want = eager(*ds, "geglu").sum()
    check(out.detach(), want.detach(), torch.float32)
    for g, r in zip(got, torch.autograd.grad(want, ds)):
        check(g, r, torch.float32, slack=1.0)


def test_nn_mlp():
    m = fused_ops.nn.MLP(12, 20, activation="swiglu")
    assert m.fc1.weight.shape == (40, 12) and m.fc2.weight.shape == (12, 20)
    assert "activation='swiglu'" in repr(m)
    x = torch.randn(3, 12)
    want = eager(x, m.fc1.weight, m.fc1.bias, m.fc2.weight, m.fc2.bias, "swiglu")
    torch.testing.assert_close(m(x), want)
    p = fused_ops.nn.MLP(12, 20, 7, bias=False, recompute=True)
    assert p.fc1.bias is None and p.fc2.weight.shape == (7, 20)
    p(x).sum().backward()
    assert p.fc1.weight.grad is not None and p.fc2.weight.grad is not None
    with pytest.raises(ValueError, match="activation must be one of"):
        fused_ops.nn.MLP(12, 20, activation="relu")
    torch.jit.script(p)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_bad_inputs(device):
    x = torch.randn(4, 6, device=device)
    w1, w2 = torch.randn(10, 6, device=device), torch.randn(6, 10, device=device)
    mlp = fused_ops.mlp
    for grad in (False, True):
        xs = x.clone().requires_grad_(grad)
        with pytest.raises(RuntimeError, match=r"w2.size\(1\) = 10 must equal the hidden width 5"):
            mlp(xs, w1, None, w2, None, "swiglu")
        with pytest.raises(RuntimeError, match=r"expected an even number of rows.*\[9, 6\]"):
            mlp(xs, w1[:9], None, w2, None, "geglu")
        with pytest.raises(RuntimeError, match=r"expected b2 of shape \[6\].*\[5\]"):
            mlp(xs, w1, None, w2, torch.randn(5, device=device), "gelu")
        with pytest.raises(RuntimeError, match=r"expected bias of shape \[10\]"):
            mlp(xs, w1, torch.randn(3, device=device), w2, None, "gelu")
        with pytest.raises(RuntimeError, match="but got 'relu'"):
            mlp(xs, w1, None, w2, None, "relu")
        with pytest.raises(RuntimeError, match="w2 to have the same dtype"):
            mlp(xs, w1, None, w2.double(), None, "gelu")
        with pytest.raises(RuntimeError, match=r"x.size\(-1\) = 6 must equal weight.size\(1\)"):
            mlp(xs, w1.t(), None, w2, None, "gelu")
    dact = torch.ops.fused.linear_dact
    with pytest.raises(RuntimeError, match=r"expected preact \[..., 20\]"):
        dact(x, w2, torch.randn(4, 10, device=device), "swiglu", True)
    with pytest.raises(RuntimeError, match=r"expected grad_out \[..., out_features = 6\]"):
        dact(torch.randn(4, 7, device=device), w2, torch.randn(4, 10, device=device), "gelu", True)


@CUDA
def test_cuda_device_errors():
    x = torch.randn(4, 6, device="cuda")
    w1, w2 = torch.randn(10, 6, device="cuda"), torch.randn(6, 10)
    with pytest.raises(RuntimeError, match="device"):
        fused_ops.mlp(x, w1, None, w2, None, "gelu")


# Shapes of the benchmark family, scaled down: N, K multiples of 8 take the Hopper kernels.
CUDA_CASES = [((1000, 1024), 4096), ((4096, 512), 1376), ((3, 300, 256), 1000), ((257, 1000), 2752)]


@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("case", CUDA_CASES)
def test_mlp_cuda_large(kernel, dtype, act, case):
    mlp_forward_case(*case, dtype, "cuda", act, True, all_views=False)
    # C_out = C: dY's rows 16-byte aligned, so the dact epilogue takes it on Hopper
    mlp_backward_case(*case, dtype, "cuda", act, True, recompute=False, c_out=case[0][-1])


@CUDA
@pytest.mark.parametrize("act", ["gelu", "swiglu"])
def test_mlp_peak_memory_not_above_eager(act):
    # The training step's peak (forward and backward) against eager F.linear -> act ->
    # F.linear at a shape where the [tokens, 4C] tensors dominate.
    dtype, device = torch.bfloat16, "cuda"
    w1, b1, w2, b2 = weights(1024, 4096, 1024, dtype, device, act, True)
    x = rand((8192, 1024), dtype, device)
    ts = [t.requires_grad_() for t in (x, w1, b1, w2, b2)]
    gy = rand((8192, 1024), dtype, device)

    def measure(fn):
        """(bytes the forward leaves allocated for the backward, the step's peak)."""
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        y = fn(*ts)
        held = torch.cuda.memory_allocated() - base
        grads = torch.autograd.grad(y, ts, gy)
        torch.cuda.synchronize()
        del grads, y
        return held, torch.cuda.max_memory_allocated() - base

    for _ in range(2):  # the second round without first-call allocations (workspaces)
        fused = measure(lambda *t: fused_ops.mlp(*t, act))
        fused_rc = measure(lambda *t: fused_ops.mlp(*t, act, recompute=True))
        ref = measure(lambda *t: eager(*t, act))
    assert fused[1] <= ref[1], (fused, ref)
    assert fused_rc[1] <= ref[1], (fused_rc, ref)
    # recompute keeps no [tokens, H] tensor: what the forward leaves is y's 16 MiB
    assert fused_rc[0] < 32 * 2**20 < fused[0], (fused_rc, fused)


def hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@CUDA
@pytest.mark.parametrize("act", ACTS)
def test_dact_kernel_choice(act, knobs):
    # On an H100 / H200 linear_dact is one GEMM with the dact epilogue (no separate
    # activation-backward kernel); elsewhere, or with matmul.kernel=portable, a GEMM then the
    # elementwise backward.
    dtype = torch.bfloat16
    width = 2 * 1024 if act in GATED else 1024
    g = rand((2048, 512), dtype, "cuda")
    w = rand((512, 1024), dtype, "cuda", 1 / 16)
    z = rand((2048, width), dtype, "cuda", 2.0)
    zr = z.double().requires_grad_()
    (want,) = torch.autograd.grad(act_of(zr, act), zr, g.double() @ w.double())
    for choice in ("auto", "portable"):
        knobs(f"matmul.kernel={choice}")
        fused = hopper() and choice == "auto"
        names = cuda_kernel_names(lambda: torch.ops.fused.linear_dact(g, w, z, act, True))
        epilogue = [n for n in names if "DactEpilogue" in n]
        separate = [n for n in names if "act_backward_kernel" in n or "gated_kernel" in n]
        assert bool(epilogue) == fused, f"{choice}: {names}"
        assert bool(separate) != fused, f"{choice}: {names}"
        dz, db = torch.ops.fused.linear_dact(g, w, z, act, True)
        check(dz, want, dtype, msg=choice, slack=1.0)
        check(db, dz.double().sum(0), dtype, msg=choice, slack=1.0)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_autocast(device):
    # As its twin's F.linear calls: every input cast to the autocast dtype, forward and
    # backward (the gradients in the parameters' dtype), against float64 references of the
    # bf16 computation.
    bf = torch.bfloat16
    w1, b1, w2, b2 = weights(16, 12, 16, torch.float32, device, "swiglu", True)
    x = torch.randn(6, 16, device=device)
    ts = [t.requires_grad_() for t in (x, w1, b1, w2, b2)]
    with torch.autocast(device, dtype=bf):
        y = fused_ops.mlp(*ts, "swiglu")
    assert y.dtype == bf
    low = [t.detach().to(bf) for t in ts]
    check(y, forward_ref(*low, "swiglu", bf), bf, slack=1.0)
    got = torch.autograd.grad(y.float().sum(), ts)
    refs, _ = grads_ref(low[0], low[1], low[2], low[3], "swiglu", torch.ones_like(y), bf)
    for name, g, r in zip(("dx", "dw1", "db1", "dw2", "db2"), got, refs):
        assert g.dtype == torch.float32
        check(g, r, bf, msg=name, slack=1.0)


@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("mnk", [(1000, 1000, 1000), (17, 264, 512), (4097, 1024, 256)])
def test_linear_dact_cuda(kernel, dtype, act, mnk):
    # M, N, K not tile multiples (N % 8 == 0: the dact epilogue on Hopper), against float64;
    # the bias gradient (the epilogue's column partial sums) against dZ's column sums.
    m, n, k = mnk  # grad_out [m, k], weight [k, n], preact [m, n] (gated [m, 2n])
    width = 2 * n if act in GATED else n
    g = rand((m, k), dtype, "cuda")
    w = rand((k, n), dtype, "cuda", 1.0 / math.sqrt(k))
    z = rand((m, width), dtype, "cuda", 2.0)
    zr = z.double().requires_grad_()
    (want,) = torch.autograd.grad(act_of(zr, act), zr, g.double() @ w.double())
    poison([z.numel()], "cuda", dtype)
    dz, db = torch.ops.fused.linear_dact(g, w, z, act, True)
    check(dz, want, dtype, msg=f"{mnk} dz", slack=1.0)
    check(db, dz.double().sum(0), dtype, msg=f"{mnk} db", slack=1.0)
    assert torch.equal(torch.ops.fused.linear_dact(g, w, z, act, False)[0], dz)
