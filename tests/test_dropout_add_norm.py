"""dropout_add_layer_norm / dropout_add_rms_norm: s = residual + dropout(x + input_bias),
y = norm(s), forward and backward, against float64 references that apply the mask the op
drew. The mask is recovered from the op's seed_offset through fused::dropout_backward (the
plain dropout kernel, a separate code path): element i's keep decision depends on (seed,
offset, i, p) only, so every op that draws from the same state agrees on it."""

import pytest
import torch

import fused_ops
from fused_ops import reference

from utils import (
    CUDA,
    DEVICES,
    DTYPES,
    TOL,
    assert_close,
    assert_graph_replay_matches_eager,
    capture_graph,
    cuda_kernel_names,
    offset_copy,
    poison_next_alloc,
)

ops = torch.ops.fused

# Row lengths over every forward kernel family: short rows (several a block), the scalar
# path (odd), norm_fwd_fixed's widths (1024, 4096), the wide / staged widths and the long
# rows (float32 32768: staged residual; 16-bit 65536 and over: norm_fwd_long for float32).
COLS = [1, 7, 64, 100, 520, 1024, 1032, 4096, 8200]
COLS_LONG = [24576, 32768, 65536, 65536 + 8]


def keep_mask(seed_offset, shape, p, device):
    """The keep mask a forward with this seed_offset drew (dropout's backward of ones)."""
    if p == 0.0:
        return torch.ones(shape, dtype=torch.bool, device=device)
    ones = torch.ones(shape, dtype=torch.float32, device=device)
    return ops.dropout_backward(ones, seed_offset.to(device), p) != 0


def call(layer, x, r, w, b, ib, p, training=True, rif32=False, eps=1e-5, generator=None):
    """The op (all its outputs)."""
    kw = dict(p=p, training=training, input_bias=ib, residual_in_fp32=rif32, generator=generator)
    ns = [x.shape[-1]]
    if layer:
        y, s, _, _, so = ops.dropout_add_layer_norm(x, r, ns, w, b, eps, **kw)
    else:
        y, s, _, so = ops.dropout_add_rms_norm(x, r, ns, w, eps, **kw)
    return y, s, so


def ref64(layer, x, r, w, b, ib, keep, p, eps=1e-5):
    """Float64 s and y for the mask `keep`."""
    h = x.double() + (ib.double() if ib is not None else 0.0)
    if p > 0:
        h = h * keep / (1.0 - p)
    s = r.double() + h
    ns = (x.shape[-1],)
    wd = w.double() if w is not None else None
    if layer:
        y = reference.layer_norm(s, ns, wd, b.double() if b is not None else None, eps)
    else:
        y = reference.rms_norm(s, ns, wd, eps)
    return s, y


def norm64(layer, s, w, b, eps=1e-5):
    ns = (s.shape[-1],)
    wd = w.double() if w is not None else None
    if layer:
        return reference.layer_norm(s.double(), ns, wd, b.double() if b is not None else None, eps)
    return reference.rms_norm(s.double(), ns, wd, eps)


def inputs(rows, cols, dtype, device, rdtype=None, params=True, with_ib=True):
    x = torch.randn(rows, cols, device=device).to(dtype)
    r = torch.randn(rows, cols, device=device).to(rdtype or dtype)
    w = (torch.rand(cols, device=device) + 0.5).to(dtype) if params else None
    b = torch.randn(cols, device=device).to(dtype) if params else None
    ib = torch.randn(cols, device=device).to(dtype) if with_ib else None
    return x, r, w, b, ib


def check_forward(layer, x, r, w, b, ib, p, rif32=False, msg=""):
    device = x.device
    sdt = torch.float32 if rif32 else x.dtype
    poison_next_alloc(x.numel() * x.element_size(), device)
    y, s, so = call(layer, x, r, w, b, ib, p, rif32=rif32)
    assert y.dtype == x.dtype and s.dtype == sdt and y.is_contiguous()
    keep = keep_mask(so, x.shape, p, device)
    s_ref, _ = ref64(layer, x, r, w, b, ib, keep, p)
    # s: rounded once from float32 arithmetic; y: the norm of exactly the s returned.
    assert_close(s, s_ref, sdt, atol=TOL[sdt][1] + 4 * 2.0**-24 * s_ref.abs().max().item(), msg=msg)
    assert_close(y, norm64(layer, s, w, b), x.dtype, msg=msg)
    return keep


# ---- forward values ------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layer", [True, False])
@pytest.mark.parametrize("cols", COLS)
def test_forward_matches_float64(device, dtype, layer, cols):
    for p, with_ib in [(0.1, True), (0.5, False), (0.001, True)]:  # 16-bit, then 32-bit draws
        x, r, w, b, ib = inputs(37, cols, dtype, device, with_ib=with_ib)
        keep = check_forward(layer, x, r, w, b, ib, p, msg=f"p={p}")
        if x.numel() >= 1000 and p >= 0.1:
            assert 0 < keep.sum() < keep.numel()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layer", [True, False])
def test_forward_dtype_mixes_and_layouts(device, layer):
    # float32 parameters, a float32 residual stream (residual_in_fp32), a float32 residual into
    # a 16-bit sum (composed by bias_dropout_add), misaligned and strided operands.
    for dtype in (torch.bfloat16, torch.float16):
        for cols in (64, 1024, 4104):
            x, r, w, b, ib = inputs(9, cols, dtype, device)
            check_forward(layer, x, r, w.float(), b.float(), ib, 0.2, msg="fp32 params")
            check_forward(layer, x, r, w, b, ib, 0.2, rif32=True, msg="rif32")
            check_forward(layer, x, r.float(), w, b, ib, 0.2, msg="fp32 residual")
            check_forward(layer, x, r.float(), w, b, ib, 0.2, rif32=True, msg="both fp32")
            check_forward(
                layer, offset_copy(x), offset_copy(r), w, b, offset_copy(ib), 0.2, msg="offset"
            )
            xt = torch.randn(cols, 9, device=device).to(dtype).t()
            check_forward(layer, xt, r, w, b, ib, 0.2, msg="transposed x")


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", COLS_LONG)
def test_forward_long_rows(device, dtype, cols):
    for layer in (True, False):
        x, r, w, b, ib = inputs(5, cols, dtype, device)
        check_forward(layer, x, r, w, b, ib, 0.1)
        check_forward(layer, x, r, w, b, ib, 0.1, rif32=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layer", [True, False])
def test_fixed_widths_all_kernels(device, layer, knobs):
    # norm_fwd_fixed's every row length in bf16, and the same rows with it off (norm_fwd_regs).
    for spec in ("", "norm.fixed=0"):
        knobs(spec)
        for cols in (1024, 2048, 3072, 5120, 6144, 8192, 12288, 16384):
            x, r, w, b, ib = inputs(3, cols, torch.bfloat16, device)
            check_forward(layer, x, r, w, b, ib, 0.25, msg=f"{spec} {cols}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layer", [True, False])
def test_layer_norm_of_constant_sum(device, layer):
    # Every element dropped: s = residual exactly, a constant row normalizes to exactly 0.
    x = torch.randn(4, 4096, device=device, dtype=torch.bfloat16)
    r = torch.full((4, 4096), 3.0, device=device, dtype=torch.bfloat16)
    y, s, so = call(layer, x, r, None, None, None, 1.0)
    assert torch.equal(s, r) and torch.equal(so.cpu(), torch.zeros(2, dtype=torch.int64))
    if layer:
        assert torch.equal(y, torch.zeros_like(y))


# ---- p = 0, eval, p = 1 --------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [64, 1000, 4096])
def test_no_dropout_equals_add_norm(device, dtype, cols):
    x, r, w, b, ib = inputs(6, cols, dtype, device)
    for p, training in [(0.0, True), (0.3, False)]:
        for rif32 in (False, True):
            got = fused_ops.dropout_add_layer_norm(
                x, r, (cols,), w, b, p=p, training=training, residual_in_fp32=rif32
            )
            want = fused_ops.add_layer_norm(x, r, (cols,), w, b, residual_in_fp32=rif32)
            assert all(torch.equal(g, v) for g, v in zip(got, want))
            got = fused_ops.dropout_add_rms_norm(
                x, r, (cols,), w, p=p, training=training, residual_in_fp32=rif32
            )
            want = fused_ops.add_rms_norm(x, r, (cols,), w, residual_in_fp32=rif32)
            assert all(torch.equal(g, v) for g, v in zip(got, want))
        # With input_bias and no mask: x + input_bias + residual, rounded once.
        for layer in (True, False):
            y, s, so = call(layer, x, r, w, b, ib, p, training=training)
            assert torch.equal(so.cpu(), torch.zeros(2, dtype=torch.int64))
            s_ref, _ = ref64(layer, x, r, w, b, ib, None, 0.0)
            assert_close(s, s_ref, dtype, atol=TOL[dtype][1] + 4 * 2.0**-24 * 8)
            assert_close(y, norm64(layer, s, w, b), dtype)


# ---- backward ------------------------------------------------------------------------------


def check_backward(layer, x, r, w, b, ib, p, rif32=False, use_s=True, msg=""):
    b = b if layer else None  # rms norm has no bias
    leaves = [t.detach().requires_grad_() if t is not None else None for t in (x, r, w, b, ib)]
    y, s, so = call(layer, *leaves, p, rif32=rif32)
    gy = torch.randn_like(y)
    gs = torch.randn_like(s)
    ((y.float() * gy.float()).sum() + ((s.float() * gs.float()).sum() if use_s else 0)).backward()
    keep = keep_mask(so, x.shape, p, x.device)
    l64 = [
        t.detach().double().requires_grad_() if t is not None else None for t in (x, r, w, b, ib)
    ]
    s64, y64 = ref64(layer, *l64, keep, p)
    ((y64 * gy.double()).sum() + ((s64 * gs.double()).sum() if use_s else 0)).backward()
    for name, got, want in zip("x r w b ib".split(), leaves, l64):
        if got is None:
            continue
        dt = got.dtype
        rtol, atol = TOL[dt]
        scale = want.grad.abs().max().item()
        assert_close(
            got.grad,
            want.grad,
            dt,
            rtol=4 * rtol,
            atol=atol + 4 * rtol * scale,
            msg=f"{msg} d{name}",
        )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layer", [True, False])
@pytest.mark.parametrize("cols", [7, 64, 512, 1024, 4096, 8200])
def test_backward_matches_float64(device, dtype, layer, cols):
    x, r, w, b, ib = inputs(33, cols, dtype, device)
    check_backward(layer, x, r, w, b, ib, 0.2)
    check_backward(layer, x, r, w, b, None, 0.2, use_s=False, msg="y only")
    check_backward(layer, x, r, w, b, ib, 0.0, msg="p=0")
    if dtype != torch.float32:
        check_backward(layer, x, r, w, b, ib, 0.2, rif32=True, msg="rif32")


@pytest.mark.parametrize("device", DEVICES)
def test_backward_gradients_follow_the_forward_mask(device):
    # d input = mask * ds / (1 - p), d residual = ds: with y unused, ds = the incoming grad.
    x = torch.randn(16, 256, device=device, requires_grad=True)
    r = torch.randn(16, 256, device=device, requires_grad=True)
    ib = torch.randn(256, device=device, requires_grad=True)
    _, s, _, _, so = ops.dropout_add_layer_norm(x, r, [256], None, None, p=0.3, input_bias=ib)
    g = torch.randn_like(s)
    s.backward(g)
    keep = keep_mask(so, x.shape, 0.3, device)
    want = g * keep / 0.7
    torch.testing.assert_close(x.grad, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ib.grad, want.sum(0), rtol=1e-5, atol=1e-5)
    assert torch.equal(r.grad, g)


def test_gradcheck_float64():
    x = torch.randn(5, 9, dtype=torch.float64, requires_grad=True)
    r = torch.randn(5, 9, dtype=torch.float64, requires_grad=True)
    w = torch.randn(9, dtype=torch.float64, requires_grad=True)
    b = torch.randn(9, dtype=torch.float64, requires_grad=True)
    ib = torch.randn(9, dtype=torch.float64, requires_grad=True)

    def gen():  # a fresh generator with a fixed seed per call: the same mask every time
        return torch.Generator().manual_seed(7)

    def ln(x, r, w, b, ib):
        out = ops.dropout_add_layer_norm(x, r, [9], w, b, p=0.3, input_bias=ib, generator=gen())
        return out[0], out[1]

    def rms(x, r, w, ib):
        out = ops.dropout_add_rms_norm(x, r, [9], w, p=0.3, input_bias=ib, generator=gen())
        return out[0], out[1]

    assert torch.autograd.gradcheck(ln, (x, r, w, b, ib))
    assert torch.autograd.gradcheck(rms, (x, r, w, ib))
    assert torch.autograd.gradgradcheck(ln, (x, r, w, b, ib))
    assert torch.autograd.gradgradcheck(rms, (x, r, w, ib))


def test_forward_ad_and_torch_func_use_the_same_mask():
    # The composition path (forward-mode AD, torch.func) draws the mask the kernel draws.
    x = torch.randn(4, 16, dtype=torch.float64)
    r = torch.randn(4, 16, dtype=torch.float64)
    w = torch.randn(16, dtype=torch.float64)
    t = torch.randn(4, 16, dtype=torch.float64)

    def f(x):
        g = torch.Generator().manual_seed(3)
        return ops.dropout_add_layer_norm(x, r, [16], w, None, p=0.4, generator=g)[0]

    y, jy = torch.func.jvp(f, (x,), (t,))
    torch.testing.assert_close(y, f(x))
    eps = 1e-6
    torch.testing.assert_close(
        jy, (f(x + eps * t) - f(x - eps * t)) / (2 * eps), rtol=1e-5, atol=1e-6
    )
    gx = torch.func.grad(lambda x: f(x).sum())(x)
    xl = x.clone().requires_grad_()
    f(xl).sum().backward()
    torch.testing.assert_close(gx, xl.grad)


# ---- randomness ------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.001])
def test_kept_fraction_and_seed(device, p):
    n = 256 * 1024
    x = torch.randn(256, 1024, device=device)
    r = torch.zeros(256, 1024, device=device)
    torch.manual_seed(5)
    y1, s1, so1 = call(False, x, r, None, None, None, p)
    keep = keep_mask(so1, x.shape, p, device)
    frac = keep.double().mean().item()
    assert abs(frac - (1 - p)) < 5 * ((p * (1 - p) / n) ** 0.5) + 1e-9
    # Neighbouring elements (one 16-bit draw word serves two) are not correlated.
    if p == 0.5:
        k = keep.flatten().double()
        corr = torch.corrcoef(torch.stack([k[:-1], k[1:]]))[0, 1].item()
        assert abs(corr) < 5 / n**0.5
    torch.manual_seed(5)
    y2, s2, so2 = call(False, x, r, None, None, None, p)
    assert torch.equal(s1, s2) and torch.equal(so1, so2) and torch.equal(y1, y2)
    y3, s3, so3 = call(False, x, r, None, None, None, p)
    assert not torch.equal(so3, so1) and not torch.equal(s3, s1)


@CUDA
def test_cpu_and_cuda_draw_the_same_mask():
    x = torch.randn(33, 1024)
    r = torch.randn(33, 1024)
    _, _, so = call(True, x.cuda(), r.cuda(), None, None, None, 0.25)
    assert torch.equal(
        keep_mask(so.cpu(), x.shape, 0.25, "cpu"), keep_mask(so, x.shape, 0.25, "cuda").cpu()
    )


@CUDA
@pytest.mark.parametrize("layer", [True, False])
def test_cuda_graph_replay(layer):
    x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    r = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.rand(1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    ib = torch.randn(1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    gy = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    p = 0.3

    def step():
        for t in (x, r, w, ib):
            t.grad = None
        if layer:
            y, s, _, _, so = ops.dropout_add_layer_norm(x, r, [1024], w, None, p=p, input_bias=ib)
        else:
            y, s, _, so = ops.dropout_add_rms_norm(x, r, [1024], w, p=p, input_bias=ib)
        y.backward(gy)
        return y.detach(), s.detach(), so, x.grad, r.grad, ib.grad

    graph, outs = capture_graph(step)

    def replay():
        graph.replay()
        torch.cuda.synchronize()
        return [o.clone() for o in outs]

    torch.manual_seed(21)
    a = replay()
    b = replay()
    assert not torch.equal(a[2], b[2]) and not torch.equal(a[1], b[1])  # fresh masks
    for _y, _s, so, dx, dr, _dib in (a, b):
        keep = keep_mask(so, x.shape, p, "cuda")
        assert torch.equal(dx != 0, keep & (dr != 0))  # backward used the forward's mask
    torch.manual_seed(21)
    c = replay()
    assert all(torch.equal(u, v) for u, v in zip(a, c))
    # Graphed and eager draws agree for the same generator state.
    torch.manual_seed(21)
    e = step()
    assert all(torch.equal(u, v) for u, v in zip(a, e))


@CUDA
def test_graph_replay_with_fresh_inputs():
    # The forward alone, with p = 0 (deterministic), graphed against eager on refilled data.
    x = torch.randn(40, 1032, device="cuda", dtype=torch.float16)
    r = torch.randn(40, 1032, device="cuda", dtype=torch.float16)
    ib = torch.randn(1032, device="cuda", dtype=torch.float16)

    def step():
        return call(True, x, r, None, None, ib, 0.0)[:2]

    def refill():
        for t in (x, r, ib):
            t.normal_()

    assert_graph_replay_matches_eager(step, refill, ["y", "s"], "dropout_add_layer_norm p=0")


# ---- kernels taken --------------------------------------------------------------------------


@CUDA
def test_forward_is_one_norm_kernel():
    # The dropout stage runs inside the norm kernel (no dropout_kernel launch), except for
    # a float32 residual into a 16-bit sum (composed by bias_dropout_add).
    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    r = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    names = cuda_kernel_names(lambda: call(True, x, r, None, None, None, 0.1))
    assert any("norm_fwd" in n for n in names) and not any("dropout_kernel" in n for n in names)
    names = cuda_kernel_names(lambda: call(True, x, r.float(), None, None, None, 0.1))
    assert any("dropout_kernel" in n for n in names)


# ---- plumbing: opcheck, compile, autocast, modules, errors ---------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    def t(*s):
        return torch.randn(*s, device=device, requires_grad=True)

    x, r, w, b, ib = t(5, 8), t(5, 8), t(8), t(8), t(8)
    # Deterministic settings for the full check (outputs compared across runs).
    for p, training, bias in [
        (0.0, True, ib),
        (0.3, False, ib),
        (0.0, True, None),
        (1.0, True, ib),
    ]:
        kw = dict(p=p, training=training, input_bias=bias)
        torch.library.opcheck(ops.dropout_add_layer_norm.default, (x, r, [8], w, b, 1e-5), kw)
        torch.library.opcheck(ops.dropout_add_rms_norm.default, (x, r, [8], w, None), kw)
    for kw in ({"p": 0.3}, {"p": 0.3, "residual_in_fp32": True}):
        utils = ("test_schema", "test_autograd_registration", "test_faketensor")
        torch.library.opcheck(
            ops.dropout_add_layer_norm.default, (x, r, [8], w, b, 1e-5), kw, test_utils=utils
        )
        torch.library.opcheck(
            ops.dropout_add_rms_norm.default, (x, r, [8], w, None), kw, test_utils=utils
        )


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    torch._dynamo.reset()
    p = 0.3
    x = torch.randn(16, 64, device=device, requires_grad=True)
    r = torch.randn(16, 64, device=device, requires_grad=True)
    w = torch.randn(64, device=device, requires_grad=True)
    ib = torch.randn(64, device=device, requires_grad=True)

    # Two calls on the same inputs draw two masks (not merged), in program order.
    def f(x, r, w, ib):
        y1, s1 = fused_ops.dropout_add_layer_norm(x, r, (64,), w, None, p=p, input_bias=ib)
        y2, s2 = fused_ops.dropout_add_rms_norm(x, r, (64,), w, p=p, input_bias=ib)
        return y1, s1, y2, s2

    compiled = torch.compile(f, fullgraph=True)
    compiled(x, r, w, ib)
    torch.manual_seed(4)
    got = compiled(x, r, w, ib)
    torch.manual_seed(4)
    want = f(x, r, w, ib)
    for g, v in zip(got, want):
        assert torch.equal(g, v)
    assert not torch.equal(got[1], got[3])
    sum(t.sum() for t in got).backward()
    grads = [t.grad.clone() for t in (x, r, w, ib)]
    for t in (x, r, w, ib):
        t.grad = None
    torch.manual_seed(4)
    sum(t.sum() for t in f(x, r, w, ib)).backward()
    for g, t in zip(grads, (x, r, w, ib)):
        torch.testing.assert_close(g, t.grad, rtol=1e-5, atol=1e-5)


@CUDA
def test_autocast():
    x = torch.randn(4, 64, device="cuda")
    r = torch.randn(4, 64, device="cuda")
    w = torch.randn(64, device="cuda")
    ib = torch.randn(64, device="cuda", dtype=torch.bfloat16)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y, s = fused_ops.dropout_add_layer_norm(x.bfloat16(), r, (64,), w, p=0.1, input_bias=ib)
        assert y.dtype == torch.float32 and s.dtype == torch.float32  # as F.layer_norm
        y, s = fused_ops.dropout_add_rms_norm(x, r, (64,), w, p=0.1)
        assert y.dtype == torch.float32  # untouched, as F.rms_norm


@pytest.mark.parametrize("device", DEVICES)
def test_modules(device):
    m = fused_ops.nn.DropoutAddLayerNorm(64, p=0.2, device=device)
    ref = torch.nn.LayerNorm(64, device=device)
    m.load_state_dict(ref.state_dict())
    ref.load_state_dict(m.state_dict())
    assert set(m.state_dict()) == set(ref.state_dict())
    x, r, ib = torch.randn(3, 64, device=device), torch.randn(3, 64, device=device), None
    m.eval()
    y, s = m(x, r)
    torch.testing.assert_close(y, ref(x + r))
    torch.testing.assert_close(s, x + r)
    m.train()
    y, s = m(x, r, ib)
    assert not torch.equal(s, x + r)
    mr = fused_ops.nn.DropoutAddRMSNorm(64, p=0.2, device=device)
    refr = torch.nn.RMSNorm(64, device=device)
    mr.load_state_dict(refr.state_dict())
    assert set(mr.state_dict()) == set(refr.state_dict())
    mr.eval()
    y, s = mr(x, r)
    torch.testing.assert_close(y, refr(x + r))
    with pytest.raises(ValueError, match="between 0 and 1"):
        fused_ops.nn.DropoutAddLayerNorm(64, p=1.5)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs(device):
    x = torch.randn(4, 8, device=device)
    r = torch.randn(4, 8, device=device)
    for fn, args in [
        (fused_ops.dropout_add_layer_norm, (x, r, (8,))),
        (fused_ops.dropout_add_rms_norm, (x, r, (8,))),
    ]:
        for p in (-0.1, 1.5):
            with pytest.raises(ValueError, match="between 0 and 1"):
                fn(*args, p=p)
        with pytest.raises(RuntimeError, match="residual"):
            fn(x, torch.randn(4, 9, device=device), (8,), p=0.1)
        with pytest.raises(RuntimeError, match="input_bias"):
            fn(*args, p=0.1, input_bias=torch.randn(7, device=device))
        with pytest.raises(RuntimeError, match="input_bias"):
            fn(*args, p=0.1, input_bias=torch.randn(8, device=device, dtype=torch.float64))
        with pytest.raises(RuntimeError, match="residual"):
            fn(x, r.to(torch.int32), (8,), p=0.1)
        with pytest.raises(RuntimeError, match="normalized_shape"):
            fn(x, r, (9,), p=0.1)
    with pytest.raises(RuntimeError, match="between 0 and 1"):
        ops.dropout_add_layer_norm(x, r, [8], p=1.5)
    with pytest.raises(RuntimeError, match="between 0 and 1"):
        ops.dropout_add_rms_norm(x, r, [8], p=float("nan"))


@CUDA
def test_device_mismatch():
    x = torch.randn(4, 8, device="cuda")
    r = torch.randn(4, 8, device="cuda")
    with pytest.raises(RuntimeError, match="residual"):
        fused_ops.dropout_add_layer_norm(x, r.cpu(), (8,), p=0.1)
    with pytest.raises(RuntimeError, match="input_bias"):
        fused_ops.dropout_add_layer_norm(x, r, (8,), p=0.1, input_bias=torch.randn(8))
    with pytest.raises(RuntimeError, match="weight"):
        fused_ops.dropout_add_rms_norm(x, r, (8,), torch.randn(8), p=0.1)


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    for shape in [(0, 8), (3, 0)]:
        x = torch.randn(shape, device=device, requires_grad=True)
        r = torch.randn(shape, device=device, requires_grad=True)
        y, s = fused_ops.dropout_add_layer_norm(x, r, shape[-1:], p=0.3)
        assert y.shape == x.shape and s.shape == x.shape
        (y.sum() + s.sum()).backward()
        assert x.grad.shape == x.shape
