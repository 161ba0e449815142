"""The PyTorch contracts every op keeps beyond eager first-order autograd: autocast, fake
kernels whose strides match the real ones (torch.compile on any layout), double backward,
torch.func (grad, vjp, jacrev, jacfwd, jvp, hessian, vmap with dropout's randomness),
device checks (meta included), exception types, float64 kept in float64, and the nn
modules' signatures and TorchScript. CPU here and in CI; CUDA on the GPU machine."""

import inspect

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.autograd import gradcheck, gradgradcheck

import fused_ops

from utils import CUDA, DEVICES

# Each op with its torch twin: (name, fused fn, native fn, input width). The fns take one
# tensor x of shape [..., width] (other operands are made inside, deterministic in x's
# dtype/device) so every transform below can treat them alike.


# Parameters are fixed functions of their index (no random draw: they are also made inside
# torch.func.vmap, where a draw would be a random op).
def _params(x, n, seed):
    i = torch.arange(n, dtype=torch.float64)
    return (1.0 + 0.5 * torch.sin(1.7 * seed + 0.9 * i)).to(x.device, x.dtype)


def _weight(x, rows, cols, seed=1):
    i = torch.arange(rows * cols, dtype=torch.float64).view(rows, cols)
    return torch.sin(0.37 * seed + 1.3 * i).to(x.device, x.dtype)


def _target(x, classes=None):
    """Class indices for the rows of x (all dims but the last), one row ignored."""
    rows = x.shape[:-1].numel()
    classes = classes or x.shape[-1]
    t = (torch.arange(rows, device=x.device) * 5 + 2) % classes
    if rows > 1:
        t = torch.where(torch.arange(rows, device=x.device) == 1, -100, t)
    return t.view(x.shape[:-1])


def _xent_native(logits, t, reduction="mean", label_smoothing=0.1, z_loss=0.01):
    """F.cross_entropy (classes last) plus the z-loss term, reduced as fused_ops does."""
    V = logits.shape[-1]
    x2, t1 = logits.reshape(-1, V), t.reshape(-1)
    rows = F.cross_entropy(x2, t1, reduction="none", label_smoothing=label_smoothing)
    rows = rows + z_loss * torch.logsumexp(x2, -1).square() * (t1 != -100)
    if reduction == "none":
        return rows.view(t.shape)
    return rows.sum() / (t1 != -100).sum() if reduction == "mean" else rows.sum()


OPS = {
    "gelu": (lambda x: fused_ops.gelu(x), lambda x: F.gelu(x)),
    "gelu_tanh": (
        lambda x: fused_ops.gelu(x, approximate="tanh"),
        lambda x: F.gelu(x, approximate="tanh"),
    ),
    "layer_norm": (
        lambda x: fused_ops.layer_norm(
            x, x.shape[-1:], _params(x, x.shape[-1], 2), _params(x, x.shape[-1], 3)
        ),
        lambda x: F.layer_norm(
            x, x.shape[-1:], _params(x, x.shape[-1], 2), _params(x, x.shape[-1], 3)
        ),
    ),
    "rms_norm": (
        lambda x: fused_ops.rms_norm(x, x.shape[-1:], _params(x, x.shape[-1], 2)),
        lambda x: F.rms_norm(x, x.shape[-1:], _params(x, x.shape[-1], 2)),
    ),
    "add_layer_norm": (
        lambda x: fused_ops.add_layer_norm(x, x.flip(-1), x.shape[-1:], _params(x, x.shape[-1], 2))[
            0
        ],
        lambda x: F.layer_norm(x + x.flip(-1), x.shape[-1:], _params(x, x.shape[-1], 2)),
    ),
    "add_rms_norm": (
        lambda x: fused_ops.add_rms_norm(x, x.flip(-1), x.shape[-1:])[0],
        lambda x: F.rms_norm(x + x.flip(-1), x.shape[-1:]),
    ),
    "softmax": (lambda x: fused_ops.softmax(x, -1), lambda x: F.softmax(x, -1)),
    "softmax_dim0": (lambda x: fused_ops.softmax(x, 0), lambda x: F.softmax(x, 0)),
    "softmax_scaled_causal": (
        lambda x: fused_ops.softmax(x, -1, scale=0.5, causal=True),
        lambda x: F.softmax(
            (x * 0.5).masked_fill(
                torch.ones(x.shape[-2:], dtype=torch.bool, device=x.device).triu(1), float("-inf")
            ),
            -1,
        ),
    ),
    "log_softmax": (lambda x: fused_ops.log_softmax(x, -1), lambda x: F.log_softmax(x, -1)),
    "matmul": (
        lambda x: fused_ops.matmul(x, _weight(x, x.shape[-1], 3)),
        lambda x: torch.matmul(x, _weight(x, x.shape[-1], 3)),
    ),
    "linear": (
        lambda x: fused_ops.linear(x, _weight(x, 5, x.shape[-1]), _params(x, 5, 4)),
        lambda x: F.linear(x, _weight(x, 5, x.shape[-1]), _params(x, 5, 4)),
    ),
    "linear_gelu": (
        lambda x: fused_ops.linear(x, _weight(x, 5, x.shape[-1]), _params(x, 5, 4), "gelu"),
        lambda x: F.gelu(F.linear(x, _weight(x, 5, x.shape[-1]), _params(x, 5, 4))),
    ),
    "cross_entropy": (
        lambda x: fused_ops.cross_entropy(x, _target(x), label_smoothing=0.1, z_loss=0.01),
        lambda x: _xent_native(x, _target(x)),
    ),
    "cross_entropy_none": (
        lambda x: fused_ops.cross_entropy(
            x, _target(x), reduction="none", label_smoothing=0.1, z_loss=0.01
        ),
        lambda x: _xent_native(x, _target(x), "none"),
    ),
    "cross_entropy_sum": (
        lambda x: fused_ops.cross_entropy(x, _target(x), reduction="sum"),
        lambda x: _xent_native(x, _target(x), "sum", 0.0, 0.0),
    ),
    "linear_cross_entropy": (
        lambda x: fused_ops.linear_cross_entropy(
            x,
            _weight(x, 5, x.shape[-1]),
            _target(x, 5),
            _params(x, 5, 4),
            label_smoothing=0.1,
            z_loss=0.01,
            chunk_size=2,
        ),
        lambda x: _xent_native(
            F.linear(x, _weight(x, 5, x.shape[-1]), _params(x, 5, 4)), _target(x, 5)
        ),
    ),
    "swiglu": (
        lambda x: fused_ops.swiglu(*x.chunk(2, -1)),
        lambda x: F.silu(x.chunk(2, -1)[0]) * x.chunk(2, -1)[1],
    ),
    "geglu_tanh": (
        lambda x: fused_ops.geglu(*x.chunk(2, -1), approximate="tanh"),
        lambda x: F.gelu(x.chunk(2, -1)[0], approximate="tanh") * x.chunk(2, -1)[1],
    ),
    "linear_swiglu": (
        lambda x: fused_ops.linear(x, _weight(x, 6, x.shape[-1]), _params(x, 6, 4), "swiglu"),
        lambda x: (
            F.silu(F.linear(x, _weight(x, 6, x.shape[-1]), _params(x, 6, 4)).chunk(2, -1)[0])
            * F.linear(x, _weight(x, 6, x.shape[-1]), _params(x, 6, 4)).chunk(2, -1)[1]
        ),
    ),
    "bias_dropout_add_eval": (
        lambda x: fused_ops.bias_dropout_add(
            x, _params(x, x.shape[-1], 2), x.flip(0), 0.3, training=False
        ),
        lambda x: x.flip(0) + (x + _params(x, x.shape[-1], 2)),
    ),
}


def _x(device, dtype=torch.float64, shape=(3, 6)):
    return torch.randn(*shape, dtype=dtype, device=device)


# ---- double backward ------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(OPS))
def test_gradgradcheck(name):
    fused, _ = OPS[name]
    x = _x("cpu").requires_grad_()
    assert gradcheck(fused, (x,))
    assert gradgradcheck(fused, (x,))


def test_gradgradcheck_parameters():
    # Second derivatives reaching weight, bias and residual, not only x.
    x = _x("cpu").requires_grad_()
    w = torch.randn(6, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, requires_grad=True)
    r = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    W = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    bw = torch.randn(4, dtype=torch.float64, requires_grad=True)
    assert gradgradcheck(lambda x, w, b: fused_ops.layer_norm(x, (6,), w, b), (x, w, b))
    assert gradgradcheck(lambda x, w: fused_ops.rms_norm(x, (6,), w), (x, w))
    assert gradgradcheck(
        lambda x, r, w, b: fused_ops.add_layer_norm(x, r, (6,), w, b), (x, r, w, b)
    )
    assert gradgradcheck(lambda x, r, w: fused_ops.add_rms_norm(x, r, (6,), w), (x, r, w))
    assert gradgradcheck(lambda x, W, b: fused_ops.linear(x, W, b, "gelu_tanh"), (x, W, bw))
    assert gradgradcheck(lambda x, b, r: fused_ops.bias_dropout_add(x, b, r, 0.0), (x, b, r))


def test_dropout_double_backward():
    # dropout's backward is linear in grad_out with the same mask: its derivative is itself.
    x = torch.randn(64, 32, dtype=torch.float64, requires_grad=True)
    y = fused_ops.dropout(x, 0.4)
    (gx,) = torch.autograd.grad((y * y).sum(), x, create_graph=True)
    (ggx,) = torch.autograd.grad(gx.sum(), x)
    keep = (y != 0).double() / 0.6
    torch.testing.assert_close(ggx, 2 * keep * keep)


@pytest.mark.parametrize("device", DEVICES)
def test_create_graph_matches_native(device):
    # A gradient penalty, the usual user of create_graph, on CUDA kernels too.
    dtype = torch.float32 if device == "cuda" else torch.float64
    for name in (
        "gelu",
        "layer_norm",
        "rms_norm",
        "softmax",
        "linear_gelu",
        "add_layer_norm",
        "cross_entropy",
        "cross_entropy_none",
        "linear_cross_entropy",
    ):
        fused, native = OPS[name]
        x = _x(device, dtype).requires_grad_()
        out = []
        for fn in (fused, native):
            (g,) = torch.autograd.grad(fn(x).sin().sum(), x, create_graph=True)
            out.append(torch.autograd.grad((g * g).sum(), x)[0])
        torch.testing.assert_close(out[0], out[1], rtol=1e-4, atol=1e-5, msg=name)


def test_gradgradcheck_cross_entropy_targets_and_parameters():
    # Second derivatives of linear_cross_entropy reaching weight and bias, and of
    # cross_entropy on 3-d logits with a flat target, label smoothing, all reductions.
    h = _x("cpu").requires_grad_()
    W = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    bw = torch.randn(4, dtype=torch.float64, requires_grad=True)
    t = torch.tensor([0, -100, 3])
    assert gradgradcheck(
        lambda h, W, b: fused_ops.linear_cross_entropy(h, W, t, b, z_loss=0.1), (h, W, bw)
    )
    assert gradgradcheck(
        lambda h, W: fused_ops.linear_cross_entropy(h, W, t, reduction="sum", label_smoothing=0.2),
        (h, W),
    )
    x3 = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    t3 = torch.tensor([4, 0, -100, 2, 1, 3])
    for reduction in ("mean", "sum", "none"):
        assert gradgradcheck(
            lambda x: fused_ops.cross_entropy(
                x, t3, reduction=reduction, label_smoothing=0.3, z_loss=0.05
            ),
            (x3,),
        )


def test_cross_entropy_precomputed_grad_refuses_create_graph():
    # Its forward saves no logits to differentiate the gradient again from: an error.
    x = _x("cpu").requires_grad_()
    loss = fused_ops.cross_entropy(x, _target(x), precompute_grad=True)
    with pytest.raises(RuntimeError, match="cannot be differentiated again"):
        torch.autograd.grad(loss, x, create_graph=True)


def test_backward_ops_refuse_create_graph():
    # A backward op called directly with inputs that require grad: an error, not a zero.
    x = torch.randn(3, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match="not implemented"):
        torch.ops.fused.gelu_backward(torch.ones(3, 4), x).sum().backward()


def test_training_backward_uses_fused_kernels():
    # The differentiable path is for create_graph only: a plain backward records nothing.
    x = torch.randn(3, 6, requires_grad=True)
    y = fused_ops.layer_norm(x, (6,))
    assert y.grad_fn is not None and "Norm" in y.grad_fn.name()
    (g,) = torch.autograd.grad(y.sum(), x)
    assert g.grad_fn is None


# ---- torch.func -------------------------------------------------------------------------


def _allclose(a, b):
    if isinstance(a, tuple):
        for p, q in zip(a, b):
            _allclose(p, q)
        return
    torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("name", sorted(OPS))
def test_torch_func(name):
    fused, native = OPS[name]
    x = _x("cpu")
    v = torch.randn_like(x)

    def scalar(f):
        return lambda t: f(t).sin().sum()

    _allclose(torch.func.grad(scalar(fused))(x), torch.func.grad(scalar(native))(x))
    out_f, vjp_f = torch.func.vjp(fused, x)
    out_n, vjp_n = torch.func.vjp(native, x)
    _allclose(out_f, out_n)
    ct = torch.randn_like(out_n)
    _allclose(vjp_f(ct), vjp_n(ct))
    _allclose(torch.func.jacrev(fused)(x), torch.func.jacrev(native)(x))
    _allclose(torch.func.jvp(fused, (x,), (v,)), torch.func.jvp(native, (x,), (v,)))
    jf = torch.func.jacfwd(fused)(x)
    assert jf.abs().sum() > 0
    _allclose(jf, torch.func.jacfwd(native)(x))
    _allclose(torch.func.hessian(scalar(fused))(x[:2]), torch.func.hessian(scalar(native))(x[:2]))
    xb = torch.randn(4, *x.shape, dtype=x.dtype)
    _allclose(torch.func.vmap(fused)(xb), torch.func.vmap(native)(xb))


def test_forward_ad_outside_torch_func():
    import torch.autograd.forward_ad as fwAD

    x, t = _x("cpu"), _x("cpu")
    with fwAD.dual_level():
        y = fwAD.unpack_dual(fused_ops.layer_norm(fwAD.make_dual(x, t), (6,))).tangent
        yn = fwAD.unpack_dual(F.layer_norm(fwAD.make_dual(x, t), (6,))).tangent
    torch.testing.assert_close(y, yn)


@pytest.mark.parametrize("device", DEVICES)
def test_vmap_dropout_randomness(device):
    x = torch.ones(3, 2000, device=device)
    with pytest.raises(RuntimeError, match="randomness"):
        torch.func.vmap(lambda t: fused_ops.dropout(t, 0.5))(x)
    diff = torch.func.vmap(lambda t: fused_ops.dropout(t, 0.5), randomness="different")(x)
    same = torch.func.vmap(lambda t: fused_ops.dropout(t, 0.5), randomness="same")(x)
    for out in (diff, same):
        assert set(out.unique().tolist()) <= {0.0, 2.0}
        assert 0.4 < (out == 0).float().mean().item() < 0.6
    assert not torch.equal(diff[0], diff[1]) and not torch.equal(diff[1], diff[2])
    assert torch.equal(same[0], same[1]) and torch.equal(same[1], same[2])
    # Outside training nothing is random, so the default randomness="error" is fine.
    torch.testing.assert_close(torch.func.vmap(lambda t: fused_ops.dropout(t, 0.5, False))(x), x)


def test_grad_through_dropout():
    x = torch.randn(50, 40, dtype=torch.float64)
    torch.manual_seed(3)
    g = torch.func.grad(lambda t: (fused_ops.dropout(t, 0.3) * t).sum())(x)
    torch.manual_seed(3)
    y = fused_ops.dropout(x, 0.3)
    keep = (y != 0).double() / 0.7
    torch.testing.assert_close(g, 2 * keep * x)


# ---- fake kernels: strides like the real ones, compile on any layout ----------------------


def _layouts(device, dtype):
    base = torch.randn(2, 3, 4, 6, dtype=dtype, device=device)
    yield "contiguous", base
    yield "transposed", torch.randn(2, 3, 6, 4, dtype=dtype, device=device).transpose(-1, -2)
    yield "permuted", torch.randn(6, 2, 4, 3, dtype=dtype, device=device).permute(1, 3, 2, 0)
    yield "channels_last", base.clone().to(memory_format=torch.channels_last)
    yield "sliced", torch.randn(2, 3, 4, 12, dtype=dtype, device=device)[..., ::2]
    yield (
        "transposed_sliced",
        torch.randn(2, 3, 12, 4, dtype=dtype, device=device)[..., ::2, :].transpose(-1, -2),
    )


LAYOUT_OPS = [
    "gelu",
    "gelu_tanh",
    "layer_norm",
    "rms_norm",
    "add_layer_norm",
    "add_rms_norm",
    "softmax",
    "softmax_dim0",
    "softmax_scaled_causal",
    "log_softmax",
    "linear",
    "linear_gelu",
    "bias_dropout_add_eval",
    "swiglu",
    "geglu_tanh",
    "linear_swiglu",
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", LAYOUT_OPS)
def test_fake_strides_match_real(name, device):
    fused, native = OPS[name]
    dtype = torch.float32
    for layout, x in _layouts(device, dtype):
        real = fused(x)
        with FakeTensorMode() as mode:
            fake = fused(mode.from_tensor(x))
        assert fake.shape == real.shape and fake.dtype == real.dtype, (name, layout)
        assert fake.stride() == real.stride(), (name, layout, fake.stride(), real.stride())
        if name.startswith("gelu"):  # elementwise: the input's layout, as torch keeps it
            assert real.stride() == native(x).stride(), (name, layout)


@pytest.mark.parametrize("device", DEVICES)
def test_fake_strides_match_real_matmul(device):
    a = torch.randn(3, 6, 4, device=device).transpose(-1, -2)
    b = torch.randn(5, 6, device=device).t()
    for x, y in [(a, b), (a[0], b), (a, torch.randn(3, 5, 6, device=device).transpose(1, 2))]:
        real = fused_ops.matmul(x, y)
        with FakeTensorMode() as mode:
            fake = fused_ops.matmul(mode.from_tensor(x), mode.from_tensor(y))
        assert fake.shape == real.shape and fake.stride() == real.stride()


@pytest.mark.parametrize("device", DEVICES)
def test_fake_strides_match_real_backward_and_dropout(device):
    x = torch.randn(6, 4, device=device).t()
    for op, args in [
        (torch.ops.fused.gelu_backward.default, (torch.randn(4, 6, device=device), x)),
        (torch.ops.fused.dropout.default, (x, 0.3, True)),
        (torch.ops.fused.softmax_backward.default, (x.contiguous(), x)),
    ]:
        real = op(*args)
        with FakeTensorMode() as mode:
            fake = op(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])
        real = real if isinstance(real, tuple) else (real,)
        fake = fake if isinstance(fake, tuple) else (fake,)
        for r, f in zip(real, fake):
            assert r.stride() == f.stride(), (op, r.stride(), f.stride())


@pytest.mark.parametrize("device", DEVICES)
def test_fake_matches_real_cross_entropy(device):
    x = torch.randn(2, 4, 7, device=device)[:, 1:]
    t = torch.randint(0, 7, (2, 3), device=device)
    h, W = torch.randn(6, 5, device=device), torch.randn(7, 5, device=device)
    cases = [
        (torch.ops.fused.cross_entropy.default, (x, t), {"reduction": r})
        for r in ("none", "mean", "sum")
    ]
    cases += [
        (torch.ops.fused.cross_entropy_with_grad.default, (x, t), {}),
        (
            torch.ops.fused.linear_cross_entropy.default,
            (h, W, t.view(-1)),
            {"grad_mask": [True, False, False]},
        ),
    ]
    for op, args, kw in cases:
        real = op(*args, **kw)
        with FakeTensorMode() as mode:
            fake = op(*[mode.from_tensor(a) for a in args], **kw)
        for r, f in zip(real, fake):
            assert (r.shape, r.dtype, r.stride()) == (f.shape, f.dtype, f.stride()), (op, kw)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_on_transposed_and_permuted_inputs(device):
    # The reported case, and a backward through a transposed view, under inductor.
    torch._dynamo.reset()
    fn = torch.compile(lambda x: fused_ops.gelu(x) + 1, fullgraph=True)
    for layout, x in list(_layouts(device, torch.float32))[1:4]:
        torch.testing.assert_close(fn(x), F.gelu(x) + 1, msg=layout)
    ln = torch.compile(lambda x, w: fused_ops.layer_norm(x, (6,), w) * 2, fullgraph=True)
    xs = torch.randn(6, 2, 4, 3, device=device).permute(1, 3, 2, 0).requires_grad_()
    w = torch.randn(6, device=device, requires_grad=True)
    ln(xs.transpose(-1, -2).transpose(-1, -2), w).sum().backward()
    want_x, want_w = torch.autograd.grad(F.layer_norm(xs, (6,), w).sum() * 2, (xs, w))
    torch.testing.assert_close(xs.grad, want_x, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(w.grad, want_w, rtol=1e-4, atol=1e-5)
    sm = torch.compile(lambda x: fused_ops.softmax(x.transpose(0, 1), -1).sum(0), fullgraph=True)
    x = torch.randn(5, 7, device=device)
    torch.testing.assert_close(sm(x), F.softmax(x.t(), -1).sum(0))


# ---- autocast -------------------------------------------------------------------------------


def _autocast_cases(device):
    x = torch.randn(8, 16, device=device)
    w = torch.randn(16, device=device)
    b = torch.randn(16, device=device)
    W = torch.randn(12, 16, device=device)
    bW = torch.randn(12, device=device)
    h = x.to(torch.bfloat16)
    t = torch.randint(0, 16, (8,), device=device)
    tW = torch.randint(0, 12, (8,), device=device)
    return [
        ("matmul", lambda: fused_ops.matmul(x, W.t()), lambda: torch.matmul(x, W.t())),
        ("linear", lambda: fused_ops.linear(x, W, bW), lambda: F.linear(x, W, bW)),
        (
            "linear_gelu",
            lambda: fused_ops.linear(x, W, bW, "gelu"),
            lambda: F.gelu(F.linear(x, W, bW)),
        ),
        (
            "layer_norm",
            lambda: fused_ops.layer_norm(x, (16,), w, b),
            lambda: F.layer_norm(x, (16,), w, b),
        ),
        (
            "layer_norm_bf16_in",
            lambda: fused_ops.layer_norm(h, (16,), w, b),
            lambda: F.layer_norm(h, (16,), w, b),
        ),
        (
            "rms_norm_bf16_in",
            lambda: fused_ops.rms_norm(h, (16,), w),
            lambda: F.rms_norm(h, (16,), w),
        ),
        ("softmax_bf16_in", lambda: fused_ops.softmax(h, -1), lambda: F.softmax(h, -1)),
        ("log_softmax_bf16_in", lambda: fused_ops.log_softmax(h, -1), lambda: F.log_softmax(h, -1)),
        ("gelu", lambda: fused_ops.gelu(x), lambda: F.gelu(x)),
        (
            "add_layer_norm_bf16_in",
            lambda: fused_ops.add_layer_norm(h, h, (16,), w, b)[0],
            lambda: F.layer_norm(h + h, (16,), w, b),
        ),
        (
            "bias_dropout_add_mixed",
            lambda: fused_ops.bias_dropout_add(h, None, x, 0.0),
            lambda: x + h,
        ),
        ("cross_entropy", lambda: fused_ops.cross_entropy(x, t), lambda: F.cross_entropy(x, t)),
        (
            "cross_entropy_bf16_in",
            lambda: fused_ops.cross_entropy(h, t),
            lambda: F.cross_entropy(h, t),
        ),
        (
            "cross_entropy_none_bf16_in",
            lambda: fused_ops.cross_entropy(h, t, reduction="none"),
            lambda: F.cross_entropy(h, t, reduction="none"),
        ),
        (
            "linear_cross_entropy",
            lambda: fused_ops.linear_cross_entropy(x, W, tW, bW),
            lambda: F.cross_entropy(F.linear(x, W, bW), tW),
        ),
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_autocast_matches_native(device):
    for name, fused, native in _autocast_cases(device):
        with torch.autocast(device, dtype=torch.bfloat16):
            got, want = fused(), native()
        assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2, msg=name)


@pytest.mark.parametrize("device", DEVICES)
def test_autocast_linear_cross_entropy_runs_the_head_in_the_autocast_dtype(device):
    # As F.linear: hidden, weight and bias cast to bf16 (the loss float32), so the result is
    # the op's on bf16 inputs, and the gradients reach the float32 leaves in float32.
    x = torch.randn(8, 16, device=device, requires_grad=True)
    W = torch.randn(12, 16, device=device, requires_grad=True)
    b = torch.randn(12, device=device, requires_grad=True)
    t = torch.randint(0, 12, (8,), device=device)
    with torch.autocast(device, dtype=torch.bfloat16):
        got = fused_ops.linear_cross_entropy(x, W, t, b)
    want = fused_ops.linear_cross_entropy(x.bfloat16(), W.bfloat16(), t, b.bfloat16())
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    got.backward()
    assert x.grad.dtype == W.grad.dtype == b.grad.dtype == torch.float32


@pytest.mark.parametrize("device", DEVICES)
def test_autocast_training_step_matches_native(device):
    torch.manual_seed(0)

    def model(lin_cls, ln_cls, act):
        return torch.nn.Sequential(
            lin_cls(32, 64), act, lin_cls(64, 32), ln_cls(32), lin_cls(32, 10)
        ).to(device)

    fused = model(fused_ops.nn.Linear, fused_ops.nn.LayerNorm, fused_ops.nn.GELU())
    native = model(torch.nn.Linear, torch.nn.LayerNorm, torch.nn.GELU())
    native.load_state_dict(fused.state_dict())
    x = torch.randn(64, 32, device=device)
    t = torch.randint(0, 10, (64,), device=device)
    losses, grads = [], []
    for m in (fused, native):
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = F.cross_entropy(m(x), t)
        loss.backward()
        losses.append(loss.item())
        grads.append(m[0].weight.grad.clone())
    assert abs(losses[0] - losses[1]) < 2e-2 * abs(losses[1]), losses
    torch.testing.assert_close(grads[0], grads[1], rtol=5e-2, atol=5e-3)


# ---- devices, exception types, float64 ------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_meta_arguments_are_refused(device):
    x = torch.randn(4, 8, device=device)
    meta = torch.empty(8, device="meta")
    cases = [
        lambda: fused_ops.layer_norm(x, (8,), meta),
        lambda: fused_ops.layer_norm(x, (8,), None, meta),
        lambda: fused_ops.rms_norm(x, (8,), meta),
        lambda: fused_ops.add_layer_norm(x, torch.empty(4, 8, device="meta"), (8,)),
        lambda: fused_ops.add_rms_norm(x, x, (8,), meta),
        lambda: fused_ops.linear(x, torch.empty(3, 8, device="meta")),
        lambda: fused_ops.matmul(x, torch.empty(8, 3, device="meta")),
        lambda: fused_ops.bias_dropout_add(x, meta, x, 0.1),
        lambda: fused_ops.bias_dropout_add(x, None, torch.empty(4, 8, device="meta"), 0.1),
        lambda: fused_ops.cross_entropy(x, torch.empty(4, dtype=torch.long, device="meta")),
        lambda: fused_ops.cross_entropy(
            x, torch.empty(4, dtype=torch.long, device="meta"), reduction="none"
        ),
        lambda: fused_ops.linear_cross_entropy(
            x, torch.empty(3, 8, device="meta"), torch.zeros(4, dtype=torch.long, device=device)
        ),
        lambda: fused_ops.linear_cross_entropy(
            x,
            torch.randn(3, 8, device=device),
            torch.zeros(4, dtype=torch.long, device=device),
            meta[:3],
        ),
    ]
    for i, case in enumerate(cases):
        with pytest.raises(RuntimeError, match="device"):
            case()
            pytest.fail(f"case {i} did not raise")


def test_exception_types_match_torch():
    x = torch.randn(3, 4)
    for fn in (fused_ops.softmax, fused_ops.log_softmax):
        with pytest.raises(IndexError):
            fn(x, 2)
        with pytest.raises(IndexError):
            F.softmax(x, 2)
    with pytest.raises(TypeError):
        fused_ops.gelu("x")
    with pytest.raises(TypeError):
        F.gelu("x")
    with pytest.raises(TypeError):
        fused_ops.layer_norm(x, (4,), "w")
    with pytest.raises(TypeError):
        fused_ops.matmul(x, 3)


def test_float64_stays_float64():
    x = torch.randn(5, 7, dtype=torch.float64) + 1e-9
    r = torch.randn(5, 7, dtype=torch.float32).double()  # exactly representable in float32
    _, s = fused_ops.add_layer_norm(x, r.float(), (7,))
    assert s.dtype == torch.float64
    assert torch.equal(s, x + r)  # no rounding of x to float32 before the add
    _, s = fused_ops.add_rms_norm(x, r.float(), (7,))
    assert torch.equal(s, x + r)
    # linear's bias gradient is summed in float64.
    w = torch.randn(3, 7, dtype=torch.float64)
    b = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    g = torch.full((4096, 3), 1.0 + 2**-40, dtype=torch.float64)
    fused_ops.linear(torch.randn(4096, 7, dtype=torch.float64), w, b).backward(g)
    assert torch.equal(b.grad, g.sum(0))


def test_layer_norm_eps_zero_constant_row_is_nan_like_torch():
    x = torch.full((2, 5), 0.1)
    got = fused_ops.layer_norm(x, (5,), eps=0.0)
    want = F.layer_norm(x, (5,), eps=0.0)
    assert torch.isnan(want).all() and torch.isnan(got).all()


# ---- nn modules: signatures and TorchScript -----------------------------------------------


def test_nn_signatures_match_torch():
    for name in fused_ops.nn.__all__:
        if not hasattr(torch.nn, name):  # no torch twin (SwiGLU, GeGLU)
            continue
        ours = inspect.signature(getattr(fused_ops.nn, name).__init__).parameters
        # A module with no torch.nn namesake (DropoutAddLayerNorm) matches the one it extends.
        bases = getattr(fused_ops.nn, name).__mro__[1:]
        twin = getattr(torch.nn, name, None) or next(
            c for c in bases if c.__module__.startswith("torch.nn")
        )
        theirs = inspect.signature(twin.__init__).parameters
        positional = [p for p in ours.values() if p.kind != p.KEYWORD_ONLY]
        assert [p.name for p in positional] == list(theirs), name
    lin = fused_ops.nn.Linear(8, 5, True, activation="gelu")
    assert lin.activation == "gelu"
    with pytest.raises(TypeError):
        fused_ops.nn.Linear(8, 5, True, None, None, "gelu")


def test_nn_modules_script():
    x = torch.randn(4, 8)
    for mod in (
        fused_ops.nn.GELU("tanh"),
        fused_ops.nn.LayerNorm(8),
        fused_ops.nn.RMSNorm(8),
        fused_ops.nn.Softmax(-1),
        fused_ops.nn.LogSoftmax(-1),
        fused_ops.nn.Dropout(0.3).eval(),
        fused_ops.nn.Linear(8, 5),
        fused_ops.nn.Linear(8, 5, activation="gelu_tanh"),
    ):
        scripted = torch.jit.script(mod)
        torch.testing.assert_close(scripted(x), mod(x))


@CUDA
def test_cuda_tensor_beside_cpu_tensor_is_refused():
    x = torch.randn(4, 8, device="cuda")
    with pytest.raises(RuntimeError, match="device"):
        fused_ops.layer_norm(x, (8,), torch.randn(8))
    with pytest.raises(RuntimeError, match="device"):
        fused_ops.linear(x, torch.randn(3, 8))


# ---- cross_entropy: torch.func through its composition, create_graph refused ---------------


def test_cross_entropy_torch_func_and_create_graph():
    x = torch.randn(5, 11, dtype=torch.float64)
    t = torch.tensor([3, -100, 0, 10, 7])

    def fused(z):
        return fused_ops.cross_entropy(z, t, label_smoothing=0.1)

    def native(z):
        return F.cross_entropy(z, t, label_smoothing=0.1)

    _allclose(torch.func.grad(fused)(x), torch.func.grad(native)(x))
    _allclose(torch.func.jacrev(fused)(x), torch.func.jacrev(native)(x))
    _allclose(torch.func.hessian(fused)(x), torch.func.hessian(native)(x))
    w = torch.randn(11, 4, dtype=torch.float64)
    _allclose(
        torch.func.grad(lambda h: fused_ops.linear_cross_entropy(h, w, t))(x[:, :4]),
        torch.func.grad(lambda h: F.cross_entropy(h @ w.t(), t))(x[:, :4]),
    )
    xr = x.clone().requires_grad_()
    (g,) = torch.autograd.grad(fused(xr), xr)  # first order as usual
    _allclose(g, torch.func.grad(native)(x))
    # create_graph: a gradient that is differentiable again, equal to torch's.
    (gf,) = torch.autograd.grad(fused(xr), xr, create_graph=True)
    xn = x.clone().requires_grad_()
    (gn,) = torch.autograd.grad(native(xn), xn, create_graph=True)
    v = torch.randn_like(x)
    _allclose(torch.autograd.grad(gf, xr, v)[0], torch.autograd.grad(gn, xn, v)[0])
