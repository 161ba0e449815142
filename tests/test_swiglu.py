"""swiglu / geglu (fused_ops.swiglu, fused_ops.geglu; torch.ops.fused.swiglu / geglu and their
backward ops) against float64 references, on every kind of operand view."""

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
    poison_next_alloc,
)

# (name, fused function, reference, backward op, kwargs)
KINDS = [
    ("swiglu", fused_ops.swiglu, reference.swiglu, torch.ops.fused.swiglu_backward, {}),
    ("geglu", fused_ops.geglu, reference.geglu, torch.ops.fused.geglu_backward, {}),
    (
        "geglu_tanh",
        fused_ops.geglu,
        reference.geglu,
        torch.ops.fused.geglu_backward,
        {"approximate": "tanh"},
    ),
]
KIND_IDS = [k[0] for k in KINDS]
# Odd widths (the scalar path and the vector tail), widths that are multiples of the vector
# (the chunked halves stay vectorised), one row, many rows.
SHAPES = [(1,), (7,), (1000,), (3, 5, 7), (129, 257), (64, 1024 + 3), (33, 64), (2, 5, 24)]


def operand_views(shape, dtype, device, scale=3.0):
    """(name, gate, up): fresh random operands of `shape` in each layout the kernels handle."""

    def rand(*s):
        return (torch.randn(*s, device=device) * scale).to(dtype)

    yield "separate", rand(*shape), rand(*shape)
    z = rand(*shape[:-1], 2 * shape[-1])
    g, u = z.chunk(2, -1)
    yield "chunked", g, u  # the halves of one row: row stride 2N, in place
    yield "swapped_chunks", u, g
    if len(shape) >= 2:
        t = rand(*shape[:-2], shape[-1], shape[-2]).transpose(-1, -2)
        yield "transposed_gate", t, rand(*shape)  # not rows: copied
    yield "gapped", rand(*shape[:-1], 2 * shape[-1])[..., ::2], rand(*shape)
    n = 1
    for s in shape:
        n *= s
    yield "offset", rand(n + 1)[1:].view(shape), rand(n + 3)[3:].view(shape)  # misaligned
    if len(shape) >= 2:
        yield "expanded_up", rand(*shape), rand(shape[-1]).expand(shape)


def ref_fwd(ref, gate, up, kw):
    return ref(gate.double(), up.double(), **kw)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_matches_float64(device, dtype, kind, shape):
    _, fn, ref, _, kw = kind
    for name, g, u in operand_views(shape, dtype, device):
        poison_next_alloc(g.numel() * g.element_size(), device)
        y = fn(g, u, **kw)
        assert y.shape == g.shape and y.dtype == dtype and y.is_contiguous()
        assert_close(y, ref_fwd(ref, g, u, kw), msg=f"view={name}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_backward_matches_float64(device, dtype, kind, shape):
    _, fn, ref, bwd, kw = kind
    for name, g, u in operand_views(shape, dtype, device):
        dy = torch.randn(shape, device=device).to(dtype)
        gr, ur = g.double().requires_grad_(), u.double().requires_grad_()
        ref(gr, ur, **kw).backward(dy.double())
        poison_next_alloc(g.numel() * g.element_size(), device)
        dg, du = bwd(dy, g, u, **kw)
        assert_close(dg, gr.grad, dtype=dtype, msg=f"dgate view={name}")
        assert_close(du, ur.grad, dtype=dtype, msg=f"dup view={name}")
        # The same through autograd, with gate and up the halves of one leaf.
        if name == "chunked":
            z = torch.cat([g, u], -1).detach().requires_grad_()
            a, b = z.chunk(2, -1)
            fn(a, b, **kw).backward(dy)
            assert_close(z.grad, torch.cat([gr.grad, ur.grad], -1), dtype=dtype, msg="autograd")


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_cuda_large(dtype, kind):
    # Many blocks, rows of the chunked halves (vector path), and a tail of whole rows.
    _, fn, ref, bwd, kw = kind
    z = (torch.randn(4097, 2 * 1536, device="cuda") * 4).to(dtype)
    g, u = z.chunk(2, -1)
    poison_next_alloc(g.numel() * g.element_size(), "cuda")
    assert_close(fn(g, u, **kw), ref_fwd(ref, g, u, kw))
    dy = torch.randn_like(g)
    gr, ur = g.double().requires_grad_(), u.double().requires_grad_()
    ref(gr, ur, **kw).backward(dy.double())
    dg, du = bwd(dy, g, u, **kw)
    assert_close(dg, gr.grad, dtype=dtype)
    assert_close(du, ur.grad, dtype=dtype)


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_extreme_values(dtype):
    # Saturation, the far negative tail, infinities and NaN as torch's own composition.
    vals = [-1e4, -100.0, -20.0, -5.0, -1e-6, 0.0, 1e-6, 5.0, 20.0, 100.0, 1e4]
    vals += [float("inf"), float("-inf"), float("nan")]
    g = torch.tensor(vals, device="cuda").to(dtype)
    u = torch.full_like(g, 1.5)
    for _, fn, ref, _, kw in KINDS:
        torch.testing.assert_close(fn(g, u, **kw), ref(g, u, **kw), equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    x = torch.empty(0, 4, device=device)
    assert fused_ops.swiglu(x, x).shape == (0, 4)
    assert fused_ops.geglu(x, x).shape == (0, 4)
    dg, du = torch.ops.fused.swiglu_backward(x, x, x)
    assert dg.shape == du.shape == (0, 4)
    e = torch.empty(3, 0, device=device)
    assert fused_ops.swiglu(e, e).shape == (3, 0)
    assert torch.ops.fused.geglu_backward(e, e, e)[0].shape == (3, 0)


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_gradcheck_float64(kind):
    _, fn, _, _, kw = kind
    z = (torch.randn(4, 18, dtype=torch.float64) * 2).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: fn(*t.chunk(2, -1), **kw), (z,))
    # Second derivative (create_graph: the ATen path).
    assert torch.autograd.gradgradcheck(lambda t: fn(*t.chunk(2, -1), **kw), (z,))


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_torch_func(kind):
    # torch.func and forward-mode AD take the ATen composition.
    _, fn, ref, _, kw = kind
    g = torch.randn(3, 5, dtype=torch.float64)
    u = torch.randn(3, 5, dtype=torch.float64)
    got = torch.func.grad(lambda a, b: fn(a, b, **kw).sum(), argnums=(0, 1))(g, u)
    want = torch.func.grad(lambda a, b: ref(a, b, **kw).sum(), argnums=(0, 1))(g, u)
    torch.testing.assert_close(got, want)
    t = torch.randn_like(g)
    _, jvp = torch.func.jvp(lambda a: fn(a, u, **kw), (g,), (t,))
    _, jvp_ref = torch.func.jvp(lambda a: ref(a, u, **kw), (g,), (t,))
    torch.testing.assert_close(jvp, jvp_ref)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    g = torch.randn(5, 14, device=device)
    a, b = g.chunk(2, -1)
    dy = torch.randn(5, 7, device=device)
    torch.library.opcheck(torch.ops.fused.swiglu.default, (a, b))
    torch.library.opcheck(torch.ops.fused.swiglu_backward.default, (dy, a, b))
    for approx in ("none", "tanh"):
        kw = {"approximate": approx}
        torch.library.opcheck(torch.ops.fused.geglu.default, (a, b), kw)
        torch.library.opcheck(torch.ops.fused.geglu_backward.default, (dy, a, b), kw)
    # With gradients: opcheck runs the autograd registration too.
    ga = torch.randn(5, 7, device=device, requires_grad=True)
    ua = torch.randn(5, 7, device=device, requires_grad=True)
    torch.library.opcheck(torch.ops.fused.swiglu.default, (ga, ua))
    torch.library.opcheck(torch.ops.fused.geglu.default, (ga, ua), {"approximate": "tanh"})


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    torch._dynamo.reset()
    z = torch.randn(8, 66, device=device, requires_grad=True)

    def f(t):
        g, u = t.chunk(2, -1)
        return (fused_ops.swiglu(g, u) + fused_ops.geglu(g, u, approximate="tanh")).sum()

    def f_ref(t):
        g, u = t.chunk(2, -1)
        return (reference.swiglu(g, u) + reference.geglu(g, u, approximate="tanh")).sum()

    out = torch.compile(f, fullgraph=True)(z)
    out.backward()
    zr = z.detach().double().requires_grad_()
    want = f_ref(zr)
    want.backward()
    assert_close(out, want, dtype=torch.float32, rtol=1e-5, atol=1e-4)
    assert_close(z.grad, zr.grad, dtype=torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_autocast_promotes(device):
    g = torch.randn(4, 8, device=device)
    u = torch.randn(4, 8, device=device).to(torch.bfloat16)
    with torch.autocast(device_type=device, dtype=torch.bfloat16):
        y = fused_ops.swiglu(g, u)
        y2 = fused_ops.geglu(u, g)
    assert y.dtype == y2.dtype == torch.float32  # as silu(g) * u promotes
    assert_close(y, ref_fwd(reference.swiglu, g, u.float(), {}))


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs(device):
    x = torch.randn(3, 4, device=device)
    with pytest.raises(RuntimeError, match="expected gate to be float32.*got Long"):
        fused_ops.swiglu(torch.ones(3, dtype=torch.long, device=device), x[0, :3])
    with pytest.raises(
        RuntimeError, match=r"gate and up to have the same shape.*\[3, 4\].*\[3, 3\]"
    ):
        fused_ops.swiglu(x, x[:, :3])
    with pytest.raises(RuntimeError, match="gate and up to have the same dtype"):
        fused_ops.geglu(x, x.half())
    with pytest.raises(RuntimeError, match="approximate to be 'none' or 'tanh'.*'fast'"):
        fused_ops.geglu(x, x, approximate="fast")
    with pytest.raises(RuntimeError, match="at least 1 dimension"):
        fused_ops.swiglu(torch.tensor(1.0, device=device), torch.tensor(1.0, device=device))
    with pytest.raises(RuntimeError, match="grad_out and gate to have the same shape"):
        torch.ops.fused.swiglu_backward(x[:, :2], x, x)


@CUDA
def test_cuda_device_mismatch():
    with pytest.raises(RuntimeError, match="same device"):
        fused_ops.swiglu(torch.randn(3), torch.randn(3, device="cuda"))
    with pytest.raises(RuntimeError, match="float64"):
        x = torch.randn(3, device="cuda", dtype=torch.float64)
        fused_ops.swiglu(x, x)


@CUDA
def test_cuda_graph_replay():
    z = torch.randn(1024, 2 * 520, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(1024, 520, device="cuda", dtype=torch.bfloat16)

    def step():
        g, u = z.chunk(2, -1)
        return (fused_ops.swiglu(g, u), *torch.ops.fused.swiglu_backward(dy, g, u))

    assert_graph_replay_matches_eager(
        step, lambda: z.copy_(torch.randn_like(z)), ["y", "dgate", "dup"], msg="swiglu"
    )


def test_nn_modules():
    z = torch.randn(3, 10)
    g, u = z.chunk(2, -1)
    torch.testing.assert_close(fused_ops.nn.SwiGLU()(z), reference.swiglu(g, u))
    m = fused_ops.nn.GeGLU(approximate="tanh")
    torch.testing.assert_close(m(z), reference.geglu(g, u, approximate="tanh"))
    assert "tanh" in repr(m)
