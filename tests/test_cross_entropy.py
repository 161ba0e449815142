import pytest
import torch
import torch.nn.functional as F

import fused_ops

from utils import (
    CUDA,
    DEVICES,
    DTYPES,
    assert_close,
    assert_graph_replay_matches_eager,
    cuda_kernel_names,
    input_views,
    poison_next_alloc,
)

ops = torch.ops.fused
IGNORE = -100

# Vocabulary widths: tiny (the scalar head/tail only), the block-size thresholds of the CUDA
# kernel (64 threads up to 4 KB rows, then 256; the gradient-writing forward 512), and the vocabularies of
# real models: Llama-2 32000 (and an odd neighbour), GPT-2 50257 (rows alternate between
# aligned and misaligned starts in 16-bit), Qwen 151936.
CUDA_VOCABS = [1, 7, 1000, 2049, 32000, 32001, 50257, 151936]
CPU_VOCABS = [1, 7, 33, 1000]


def make_target(n, V, device, ignore_frac=0.25, dtype=torch.int64):
    t = torch.randint(0, V, (n,), device=device)
    t[torch.rand(n, device=device) < ignore_frac] = IGNORE
    return t.to(dtype)


def reference_rows(x, t, label_smoothing=0.0, z_loss=0.0, ignore_index=IGNORE):
    """Per-row loss in float64: F.cross_entropy (classes last) plus z_loss * lse^2 on the
    non-ignored rows."""
    V = x.shape[-1]
    x64 = x.double().reshape(-1, V)
    t = t.reshape(-1).long()
    rows = F.cross_entropy(
        x64, t, reduction="none", ignore_index=ignore_index, label_smoothing=label_smoothing
    )
    if z_loss:
        lse = torch.logsumexp(x64, -1)
        rows = rows + z_loss * lse.square() * (t != ignore_index)
    return rows


def reference(x, t, reduction="mean", **kw):
    rows = reference_rows(x, t, **kw)
    if reduction == "none":
        return rows.reshape(t.shape)
    if reduction == "sum":
        return rows.sum()
    return rows.sum() / (t.reshape(-1) != kw.get("ignore_index", IGNORE)).sum()


# --- CPU against float64 F.cross_entropy ---------------------------------------------------


@pytest.mark.parametrize("V", CPU_VOCABS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_cpu_matches_torch(V, reduction, label_smoothing, dtype):
    x = (torch.randn(37, V) * 3).to(dtype)
    t = make_target(37, V, "cpu")
    xa = x.clone().requires_grad_()
    got = fused_ops.cross_entropy(xa, t, reduction=reduction, label_smoothing=label_smoothing)
    assert got.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    xr = x.double().requires_grad_()
    want = F.cross_entropy(xr, t, reduction=reduction, label_smoothing=label_smoothing)
    assert_close(got, want, dtype=torch.float32 if dtype != torch.float64 else dtype)
    dy = torch.randn_like(want)
    got.backward(dy.to(got.dtype))
    want.backward(dy)
    assert xa.grad.dtype == dtype
    assert_close(xa.grad, xr.grad, dtype=dtype)
    assert torch.all(xa.grad[t == IGNORE] == 0)


@pytest.mark.parametrize("device", DEVICES)
def test_z_loss_matches_composition(device):
    x = torch.randn(29, 101, device=device, dtype=torch.float32) * 4
    t = make_target(29, 101, device)
    for reduction in ["mean", "sum", "none"]:
        xa = x.clone().requires_grad_()
        got = fused_ops.cross_entropy(xa, t, reduction=reduction, label_smoothing=0.05, z_loss=1e-3)
        xr = x.double().requires_grad_()
        want = reference(xr, t, reduction, label_smoothing=0.05, z_loss=1e-3)
        assert_close(got, want, dtype=torch.float32, rtol=2e-5, atol=2e-5)
        got.sum().backward()
        want.sum().backward()
        assert_close(xa.grad, xr.grad, dtype=torch.float32, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_shapes_3d_flat_target_and_views(device):
    B, T, V = 3, 9, 51
    full = torch.randn(B, T + 1, V, device=device)
    x = full[:, :-1, :]  # the shifted logits of a training step: rows with a gap, read in place
    t = make_target(B * T, V, device).view(B, T)
    for target in (t, t.reshape(-1)):
        for reduction in ["mean", "sum", "none"]:
            got = fused_ops.cross_entropy(x, target, reduction=reduction)
            want = reference(x, target, reduction)
            assert_close(got, want, dtype=torch.float32)
            if reduction == "none":
                assert got.shape == target.shape
    # 1-d logits, 0-d target, and int32 targets
    v = torch.randn(V, device=device)
    tt = torch.tensor(4, device=device)
    assert_close(
        fused_ops.cross_entropy(v, tt), F.cross_entropy(v.double(), tt), dtype=torch.float32
    )
    assert_close(
        fused_ops.cross_entropy(v, tt, reduction="none"),
        F.cross_entropy(v.double(), tt, reduction="none"),
        dtype=torch.float32,
    )
    assert_close(fused_ops.cross_entropy(x, t.int()), reference(x, t), dtype=torch.float32)
    # 4-d logits and a transposed (class dim strided) view: copied once, same answers
    x4 = torch.randn(2, 3, 4, V, device=device)
    t4 = make_target(24, V, device).view(2, 3, 4)
    assert_close(fused_ops.cross_entropy(x4, t4), reference(x4, t4), dtype=torch.float32)
    xt = torch.randn(V, 12, device=device).t()
    t2 = make_target(12, V, device)
    assert_close(
        fused_ops.cross_entropy(xt, t2, reduction="sum"),
        reference(xt, t2, "sum"),
        dtype=torch.float32,
    )


@pytest.mark.parametrize("device", DEVICES)
def test_empty_and_all_ignored(device):
    x = torch.randn(0, 10, device=device, requires_grad=True)
    t = torch.zeros(0, dtype=torch.long, device=device)
    assert torch.isnan(fused_ops.cross_entropy(x, t))  # as torch: 0 / 0
    assert fused_ops.cross_entropy(x, t, reduction="sum").item() == 0
    assert fused_ops.cross_entropy(x, t, reduction="none").shape == (0,)
    x = torch.randn(4, 10, device=device, requires_grad=True)
    t = torch.full((4,), IGNORE, device=device)
    assert torch.isnan(fused_ops.cross_entropy(x, t)) and torch.isnan(F.cross_entropy(x, t))
    loss = fused_ops.cross_entropy(x, t, reduction="sum")
    assert loss.item() == 0
    loss.backward()
    assert torch.all(x.grad == 0)


@pytest.mark.parametrize("device", DEVICES)
def test_op_reduction_is_one_node(device):
    # The op reduces itself: the functional's loss is the op's output, one autograd node
    # (no sum / division nodes after it), and the op's 'mean' / 'sum' match torch's.
    x = torch.randn(3, 5, 17, device=device, requires_grad=True)
    t = make_target(15, 17, device).view(3, 5)
    for reduction in ("mean", "sum", "none"):
        loss, lse = ops.cross_entropy(x, t, IGNORE, 0.1, 1e-3, False, reduction)
        assert lse.shape == t.shape
        assert loss.shape == (t.shape if reduction == "none" else ())
        assert_close(
            loss, reference(x, t, reduction, label_smoothing=0.1, z_loss=1e-3), dtype=torch.float32
        )
        y = fused_ops.cross_entropy(x, t, reduction=reduction)
        assert "::CrossEntropy>" in y.grad_fn.name(), y.grad_fn.name()
        assert y.grad_fn.next_functions[0][0].name().endswith("AccumulateGrad")
    with pytest.raises(RuntimeError, match="expected reduction 'none', 'mean' or 'sum'"):
        ops.cross_entropy(x, t, reduction="avg")
    # The backward ops take the reduced loss's gradient as it is: one value, divided by the
    # count of non-ignored rows for 'mean' (on CUDA: on the device).
    _, lse = ops.cross_entropy(x.detach(), t, IGNORE, 0.1, 1e-3)
    g = torch.tensor(0.7, device=device)
    count = (t != IGNORE).sum()
    for reduction, rows in (("sum", g.expand(t.shape)), ("mean", (g / count).expand(t.shape))):
        want = ops.cross_entropy_backward(rows.contiguous(), x.detach(), t, lse, IGNORE, 0.1, 1e-3)
        got = ops.cross_entropy_backward(g, x.detach(), t, lse, IGNORE, 0.1, 1e-3, reduction)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-8)
        inplace = x.detach().clone()
        ops.cross_entropy_backward_(g, inplace, t, lse, IGNORE, 0.1, 1e-3, reduction)
        torch.testing.assert_close(inplace, want, rtol=1e-6, atol=1e-8)
    with pytest.raises(RuntimeError, match="one grad_loss value"):
        ops.cross_entropy_backward(g.expand(2), x.detach(), t, lse, IGNORE, 0.0, 0.0, "sum")


@pytest.mark.parametrize("device", DEVICES)
def test_custom_ignore_index(device):
    x = torch.randn(16, 20, device=device)
    t = torch.randint(0, 20, (16,), device=device)
    t[::3] = 5
    assert_close(
        fused_ops.cross_entropy(x, t, ignore_index=5),
        F.cross_entropy(x.double(), t, ignore_index=5),
        dtype=torch.float32,
    )


# --- in-place backward ----------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_inplace_backward(device):
    h = torch.randn(24, 16, device=device, requires_grad=True)
    w = torch.randn(33, 16, device=device, requires_grad=True)
    t = make_target(24, 33, device)

    def step(inplace):
        logits = h @ w.t()  # its backward needs h and w, not logits: clobbering them is safe
        loss = fused_ops.cross_entropy(
            logits, t, label_smoothing=0.1, z_loss=1e-3, inplace_backward=inplace
        )
        logits.retain_grad()
        loss.backward()
        grads = (logits.grad.clone(), h.grad.clone(), w.grad.clone())
        h.grad = w.grad = None
        return logits, grads

    logits, (gl, gh, gw) = step(True)
    # The gradient was written over the logits (retain_grad keeps a copy of it).
    torch.testing.assert_close(logits.detach(), gl, rtol=0, atol=0)
    _, (gl0, gh0, gw0) = step(False)
    torch.testing.assert_close(gl, gl0, rtol=0, atol=0)
    torch.testing.assert_close(gh, gh0)
    torch.testing.assert_close(gw, gw0)


def test_inplace_backward_detects_other_readers():
    # Something else saved the logits for its backward: the in-place write bumps their
    # version, and autograd refuses rather than differentiating through a clobbered tensor.
    x = torch.randn(8, 12, requires_grad=True)
    logits = x * 2
    t = torch.randint(0, 12, (8,))
    other = logits.square().sum()  # saves logits; its backward runs after the loss's
    loss = fused_ops.cross_entropy(logits, t, inplace_backward=True) + other
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


# --- autograd, gradcheck, opcheck, compile --------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(label_smoothing=0.2),
        dict(z_loss=0.05),
        dict(label_smoothing=0.1, z_loss=0.01, reduction="none"),
    ],
)
def test_gradcheck_float64(kw):
    x = torch.randn(6, 9, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 9, (6,))
    t[2] = IGNORE
    # gradcheck runs several backwards through one graph: the two-kernel path (the
    # precomputed gradient is scaled in place, once; test_precomputed_grad checks it).
    assert torch.autograd.gradcheck(lambda a: fused_ops.cross_entropy(a, t, **kw), (x,))
    x3 = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    t3 = torch.randint(0, 5, (2, 3))
    assert torch.autograd.gradcheck(
        lambda a: fused_ops.cross_entropy(a[:, 1:], t3[:, 1:], **kw), (x3,)
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_precomputed_grad(device, reduction):
    # The forward that writes the gradient gives the two-kernel path's loss and gradient,
    # for a loss gradient of 1 (no scaling) and of another value.
    x = torch.randn(2, 19, 41, device=device) * 3
    t = make_target(38, 41, device).view(2, 19)
    kw = dict(reduction=reduction, label_smoothing=0.1, z_loss=1e-3)
    for scale in (1.0, 0.37):
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        a = fused_ops.cross_entropy(xa, t, precompute_grad=True, **kw)
        b = fused_ops.cross_entropy(xb, t, **kw)
        assert a.grad_fn.name() != b.grad_fn.name()  # two different ops
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        (a * scale).backward()
        (b * scale).backward()
        torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-6, atol=1e-8)
    xr = x.double().requires_grad_()
    reference(xr, t, **kw).backward()
    assert_close(xa.grad, xr.grad * 0.37, dtype=torch.float32)
    # All rows ignored: 'mean' is NaN as in torch, the gradient 0.
    xa = x.clone().requires_grad_()
    loss = fused_ops.cross_entropy(
        xa, torch.full_like(t, IGNORE), reduction=reduction, precompute_grad=True
    )
    assert torch.isnan(loss) if reduction == "mean" else loss.item() == 0
    loss.backward()
    assert torch.all(xa.grad == 0)
    # A second backward through the graph is refused, not scaled twice.
    xa = x.clone().requires_grad_()
    loss = fused_ops.cross_entropy(xa, t, precompute_grad=True, **kw)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    xb = x.clone().requires_grad_()
    loss = fused_ops.cross_entropy(xb, t, **kw)
    loss.backward(retain_graph=True)
    loss.backward()
    torch.testing.assert_close(xb.grad, 2 * xa.grad, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    x = torch.randn(7, 13, device=device, requires_grad=True)
    t = make_target(7, 13, device)
    torch.library.opcheck(ops.cross_entropy.default, (x, t))
    torch.library.opcheck(ops.cross_entropy.default, (x, t, IGNORE, 0.1, 1e-3, True))
    x3 = torch.randn(2, 4, 13, device=device, requires_grad=True)
    torch.library.opcheck(ops.cross_entropy.default, (x3, make_target(8, 13, device)))
    loss, lse = ops.cross_entropy(x.detach(), t, IGNORE, 0.1, 1e-3)
    g = torch.rand_like(loss)
    args = (t, lse, IGNORE, 0.1, 1e-3)
    torch.library.opcheck(ops.cross_entropy_backward.default, (g, x.detach()) + args)
    torch.library.opcheck(ops.cross_entropy_backward_.default, (g, x.detach().clone()) + args)
    # cross_entropy_with_grad's backward scales its own 'grad' output in place: opcheck's AOT
    # test differentiates every output as if a user held them all (the functional API never
    # returns 'grad'), which that mutation does not allow; test_compile_fullgraph (static and
    # dynamic shapes) compiles its real use.
    no_aot = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(
        ops.cross_entropy_with_grad.default, (x, t, IGNORE, 0.1, 1e-3, True), test_utils=no_aot
    )
    torch.library.opcheck(
        ops.cross_entropy_with_grad.default,
        (x3, make_target(8, 13, device)),
        {"mean": False},
        test_utils=no_aot,
    )
    torch.library.opcheck(
        ops.cross_entropy_scale_.default, (x.detach().clone(), torch.tensor(0.5, device=device))
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "inplace,precompute,dynamic",
    [
        (False, False, False),
        (True, False, False),
        (False, True, False),
        (False, True, True),
        (False, False, True),
    ],
)
def test_compile_fullgraph(device, inplace, precompute, dynamic):
    torch._dynamo.reset()
    h = torch.randn(12, 8, device=device, requires_grad=True)
    w = torch.randn(21, 8, device=device, requires_grad=True)
    t = make_target(12, 21, device)

    def f(h, w, t):
        return fused_ops.cross_entropy(
            h @ w.t(),
            t,
            label_smoothing=0.1,
            z_loss=1e-3,
            inplace_backward=inplace,
            precompute_grad=precompute,
        )

    out = torch.compile(f, fullgraph=True, dynamic=dynamic)(h, w, t)
    (out * 1.5).backward()  # a loss gradient other than 1: the precomputed one is scaled
    hr = h.detach().double().requires_grad_()
    wr = w.detach().double().requires_grad_()
    ref = reference(hr @ wr.t(), t, label_smoothing=0.1, z_loss=1e-3)
    (ref * 1.5).backward()
    assert_close(out, ref, dtype=torch.float32, rtol=1e-5, atol=1e-5)
    assert_close(h.grad, hr.grad, dtype=torch.float32, rtol=1e-4, atol=1e-5)
    assert_close(w.grad, wr.grad, dtype=torch.float32, rtol=1e-4, atol=1e-5)


def test_meta():
    x = torch.empty(2, 5, 11, device="meta", dtype=torch.bfloat16)
    t = torch.empty(2, 5, device="meta", dtype=torch.long)
    loss, lse = ops.cross_entropy(x, t)
    assert loss.shape == (2, 5) and lse.dtype == torch.float32 and loss.device.type == "meta"
    assert fused_ops.cross_entropy(x, t).shape == ()


# --- modules -------------------------------------------------------------------------------


def test_nn_module_is_drop_in():
    x = torch.randn(10, 17)
    t = make_target(10, 17, "cpu")
    for kw in [
        dict(),
        dict(reduction="sum"),
        dict(label_smoothing=0.3),
        dict(ignore_index=3, reduction="none"),
    ]:
        m, ref = fused_ops.nn.CrossEntropyLoss(**kw), torch.nn.CrossEntropyLoss(**kw)
        assert isinstance(m, torch.nn.CrossEntropyLoss)
        assert repr(m) == repr(ref)
        tk = t.masked_fill(t == IGNORE, kw.get("ignore_index", IGNORE))
        torch.testing.assert_close(m(x, tk), ref(x, tk))
    m = fused_ops.nn.CrossEntropyLoss(z_loss=0.01)
    assert_close(m(x, t), reference(x, t, z_loss=0.01), dtype=torch.float32)
    with pytest.raises(ValueError, match="weight is not supported"):
        fused_ops.nn.CrossEntropyLoss(weight=torch.ones(17))


# --- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs(device):
    x = torch.randn(4, 6, device=device)
    t = torch.randint(0, 6, (4,), device=device)
    with pytest.raises(RuntimeError, match="expected logits to be float32.*got Long"):
        fused_ops.cross_entropy(torch.ones(4, 6, dtype=torch.long, device=device), t)
    with pytest.raises(RuntimeError, match="expected target to be int64 \\(or int32\\).*got Float"):
        fused_ops.cross_entropy(x, t.float())
    with pytest.raises(RuntimeError, match=r"expected target of shape \[4\].*got \[5\]"):
        fused_ops.cross_entropy(x, torch.zeros(5, dtype=torch.long, device=device))
    with pytest.raises(RuntimeError, match=r"expected target of shape \[2, 3\].*or \[6\]"):
        fused_ops.cross_entropy(
            torch.randn(2, 3, 5, device=device), torch.zeros(3, 2, dtype=torch.long, device=device)
        )
    with pytest.raises(RuntimeError, match="0-d tensor"):
        fused_ops.cross_entropy(torch.tensor(1.0, device=device), t[0])
    with pytest.raises(RuntimeError, match="label_smoothing in \\[0, 1\\]"):
        fused_ops.cross_entropy(x, t, label_smoothing=1.5)
    with pytest.raises(RuntimeError, match="at least one class"):
        fused_ops.cross_entropy(
            torch.randn(3, 0, device=device), torch.zeros(3, dtype=torch.long, device=device)
        )
    with pytest.raises(ValueError, match="not a valid value for reduction"):
        fused_ops.cross_entropy(x, t, reduction="avg")
    with pytest.raises(ValueError, match="weight is not supported"):
        fused_ops.cross_entropy(x, t, torch.ones(6, device=device))
    loss, lse = ops.cross_entropy(x, t)
    with pytest.raises(RuntimeError, match="grad_loss and lse to be Float"):
        ops.cross_entropy_backward(loss.double(), x, t, lse, IGNORE, 0.0, 0.0)
    with pytest.raises(RuntimeError, match="one value per row"):
        ops.cross_entropy_backward(loss[:2], x, t, lse, IGNORE, 0.0, 0.0)
    with pytest.raises(RuntimeError, match="single memory location"):
        ops.cross_entropy_backward_(loss, x[:1].expand(4, 6), t, lse, IGNORE, 0.0, 0.0)


def test_out_of_range_target_cpu():
    x = torch.randn(4, 6)
    for bad in (6, -1, -101):
        t = torch.tensor([0, bad, 2, IGNORE])
        with pytest.raises(
            RuntimeError,
            match=f"target {bad} at \\(flat\\) position 1 is out of "
            "bounds: expected a class in \\[0, 6\\)",
        ):
            fused_ops.cross_entropy(x, t)


def test_float64_rejected_on_cuda_and_devices_mixed():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this machine")
    x = torch.randn(4, 6, device="cuda")
    with pytest.raises(RuntimeError, match="float64 on cuda"):
        fused_ops.cross_entropy(x.double(), torch.zeros(4, dtype=torch.long, device="cuda"))
    with pytest.raises(RuntimeError, match="same device"):
        fused_ops.cross_entropy(x, torch.zeros(4, dtype=torch.long))


# --- CUDA ----------------------------------------------------------------------------------


def _rows_for(V):
    # Enough rows to fill the GPU at small V; fewer at the widest vocabularies.
    return 16 if V >= 100000 else (64 if V >= 10000 else 300)


@CUDA
@pytest.mark.parametrize("V", CUDA_VOCABS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_matches_float64(V, dtype):
    n = _rows_for(V)
    for name, x in input_views((n, V), dtype, "cuda", scale=3.0):
        t = make_target(n, V, "cuda")
        for ls, z in [(0.0, 0.0), (0.1, 1e-3)]:
            poison_next_alloc(n * 4, "cuda")
            loss, lse = ops.cross_entropy(x, t, IGNORE, ls, z)
            want = reference_rows(x, t, ls, z)
            msg = f"V={V} {dtype} {name} ls={ls} z={z}"
            # The reference sees the same rounded logits: float32 math error only.
            assert_close(loss, want, dtype=torch.float32, rtol=2e-5, atol=2e-5, msg=msg)
            keep = t != IGNORE
            assert_close(
                lse[keep],
                torch.logsumexp(x.double(), -1)[keep],
                dtype=torch.float32,
                rtol=2e-6,
                atol=2e-5,
                msg=msg,
            )
            g = torch.rand(n, device="cuda")
            poison_next_alloc(x.numel() * x.element_size(), "cuda")
            dx = ops.cross_entropy_backward(g, x, t, lse, IGNORE, ls, z)
            xr = x.double().requires_grad_()
            reference_rows(xr, t, ls, z).backward(g.double())
            assert dx.dtype == dtype
            assert_close(dx, xr.grad, dtype=dtype, msg=msg)
            assert torch.all(dx[~keep] == 0)


@CUDA
@pytest.mark.parametrize("V", [50257, 32001, 1000])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_strided_rows_and_inplace(V, dtype):
    # Rows of a 3-d view with a gap (the shifted logits of a step) read in place; the
    # in-place backward writes over them, the rest of the storage untouched.
    B, T = 3, 17
    full = (torch.randn(B, T + 1, V, device="cuda") * 2).to(dtype)
    x = full[:, 1:, :]
    t = make_target(B * T, V, "cuda").view(B, T)
    loss, lse = ops.cross_entropy(x, t, IGNORE, 0.05, 0.0)
    assert_close(
        loss, reference_rows(x, t, 0.05).view(B, T), dtype=torch.float32, rtol=2e-5, atol=2e-5
    )
    g = torch.rand(B, T, device="cuda")
    dx = ops.cross_entropy_backward(g, x, t, lse, IGNORE, 0.05, 0.0)
    first = full[:, 0, :].clone()
    ops.cross_entropy_backward_(g, x, t, lse, IGNORE, 0.05, 0.0)
    assert_close(x, dx, dtype=dtype)
    torch.testing.assert_close(full[:, 0, :], first, rtol=0, atol=0)


@CUDA
def test_cuda_autograd_inplace_and_kernels():
    x0 = torch.randn(64, 50257, device="cuda", dtype=torch.bfloat16)
    t = make_target(64, 50257, "cuda")
    xa = x0.clone().requires_grad_()
    loss = fused_ops.cross_entropy(xa * 1, t, inplace_backward=True)
    loss.backward()
    xr = x0.double().requires_grad_()
    ref = F.cross_entropy(xr, t)
    ref.backward()
    assert_close(loss, ref, dtype=torch.float32, rtol=2e-5, atol=2e-5)
    assert_close(xa.grad, xr.grad, dtype=torch.bfloat16)
    names = cuda_kernel_names(lambda: ops.cross_entropy(x0, t))
    assert sum("xent_fwd_kernel" in n for n in names) == 1, names


@CUDA
@pytest.mark.parametrize("V", [7, 1000, 32001, 50257, 151936])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_precomputed_grad(V, dtype):
    n = _rows_for(V)
    for name, x in input_views((n, V), dtype, "cuda", scale=3.0):
        t = make_target(n, V, "cuda")
        for mean, g in [(True, 1.0), (False, 0.3)]:
            msg = f"V={V} {dtype} {name} mean={mean} g={g}"
            poison_next_alloc(x.numel() * x.element_size(), "cuda")
            loss, dx = ops.cross_entropy_with_grad(x, t, IGNORE, 0.1, 1e-3, mean)
            ops.cross_entropy_scale_(dx, torch.tensor(g, device="cuda"))
            xr = x.double().requires_grad_()
            want = reference(xr, t, "mean" if mean else "sum", label_smoothing=0.1, z_loss=1e-3)
            (want * g).backward()
            assert_close(loss, want, dtype=torch.float32, rtol=2e-5, atol=2e-5, msg=msg)
            assert dx.dtype == dtype and dx.shape == x.shape
            assert_close(dx, xr.grad, dtype=dtype, msg=msg)


@CUDA
def test_cuda_out_of_range_target_is_nan_not_a_read():
    x = torch.randn(4, 1000, device="cuda", dtype=torch.bfloat16)
    t = torch.tensor([3, 1000, -7, IGNORE], device="cuda")
    loss, lse = ops.cross_entropy(x, t)
    assert torch.isfinite(loss[0]) and torch.isnan(loss[1]) and torch.isnan(loss[2])
    assert loss[3] == 0
    dx = ops.cross_entropy_backward(torch.ones(4, device="cuda"), x, t, lse, IGNORE, 0.0, 0.0)
    assert torch.isfinite(dx[0]).all() and torch.isnan(dx[1:3]).all() and (dx[3] == 0).all()
    assert torch.isnan(fused_ops.cross_entropy(x, t))


@CUDA
def test_cuda_graph_replay():
    x = torch.randn(32, 32001, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    t = make_target(32, 32001, "cuda")

    def step():
        x.grad = None
        loss = fused_ops.cross_entropy(x, t, label_smoothing=0.1)
        loss.backward()
        return loss.detach(), x.grad

    def refill():
        x.copy_(torch.randn_like(x))
        t.copy_(make_target(32, 32001, "cuda"))

    assert_graph_replay_matches_eager(step, refill, ("loss", "grad"), msg="cross_entropy")


# --- linear_cross_entropy -------------------------------------------------------------------


def linear_reference(h, w, t, b=None, reduction="mean", **kw):
    logits = F.linear(h.double(), w.double(), None if b is None else b.double())
    return reference(logits, t, reduction, **kw)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("chunk_size", [16, 0])
def test_linear_cross_entropy_matches_composition(device, reduction, with_bias, chunk_size):
    B, T, H, V = 2, 45, 24, 77
    h = torch.randn(B, T, H, device=device, requires_grad=True)
    w = (torch.randn(V, H, device=device) / H**0.5).requires_grad_()
    b = torch.randn(V, device=device, requires_grad=True) if with_bias else None
    t = make_target(B * T, V, device).view(B, T)
    kw = dict(label_smoothing=0.1, z_loss=1e-3)
    # chunks of 16 tokens: 6 chunks, the last one short; 0: the default, one chunk here
    got = fused_ops.linear_cross_entropy(
        h, w, t, b, reduction=reduction, chunk_size=chunk_size, **kw
    )
    leaves = [h, w] + ([b] if with_bias else [])
    ref_leaves = [x.detach().double().requires_grad_() for x in leaves]
    want = linear_reference(
        *ref_leaves[:2], t, ref_leaves[2] if with_bias else None, reduction, **kw
    )
    assert_close(got, want, dtype=torch.float32, rtol=2e-5, atol=2e-5)
    dy = torch.rand_like(want)
    grads = torch.autograd.grad(got, leaves, dy.to(got.dtype))
    ref_grads = torch.autograd.grad(want, ref_leaves, dy)
    for name, g, r in zip("hwb", grads, ref_grads):
        assert_close(g, r, dtype=torch.float32, rtol=1e-4, atol=1e-5, msg=name)


def test_linear_cross_entropy_gradcheck_and_no_grad():
    h = torch.randn(11, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(9, 5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(9, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 9, (11,))
    t[4] = IGNORE
    assert torch.autograd.gradcheck(
        lambda h, w, b: fused_ops.linear_cross_entropy(
            h, w, t, b, chunk_size=4, label_smoothing=0.2, z_loss=0.01
        ),
        (h, w, b),
    )
    # Without grad the op computes no gradients (empty outputs).
    with torch.no_grad():
        loss, gh, gw, gb = ops.linear_cross_entropy(h, w, t, b)
    assert gh.numel() == gw.numel() == gb.numel() == 0
    assert_close(loss, linear_reference(h, w, t, b), dtype=torch.float64)


@pytest.mark.parametrize("device", DEVICES)
def test_linear_cross_entropy_opcheck_and_compile(device):
    h = torch.randn(20, 8, device=device, requires_grad=True)
    w = torch.randn(13, 8, device=device, requires_grad=True)
    t = make_target(20, 13, device)
    torch.library.opcheck(
        ops.linear_cross_entropy.default,
        (h, w, t),
        {"chunk_size": 6, "grad_mask": [True, True, False]},
    )
    torch._dynamo.reset()
    f = torch.compile(
        lambda h, w, t: fused_ops.linear_cross_entropy(h, w, t, chunk_size=8), fullgraph=True
    )
    out = f(h, w, t)
    out.backward()
    hr, wr = (x.detach().double().requires_grad_() for x in (h, w))
    ref = linear_reference(hr, wr, t)
    ref.backward()
    assert_close(out, ref, dtype=torch.float32, rtol=1e-5, atol=1e-5)
    assert_close(h.grad, hr.grad, dtype=torch.float32, rtol=1e-4, atol=1e-5)
    assert_close(w.grad, wr.grad, dtype=torch.float32, rtol=1e-4, atol=1e-5)


def test_linear_cross_entropy_bad_inputs():
    h, w, t = torch.randn(4, 8), torch.randn(6, 8), torch.randint(0, 6, (4,))
    with pytest.raises(RuntimeError, match=r"expected hidden of shape \[\.\.\., 8\]"):
        fused_ops.linear_cross_entropy(torch.randn(4, 7), w, t)
    with pytest.raises(RuntimeError, match="same dtype"):
        fused_ops.linear_cross_entropy(h.double(), w, t)
    with pytest.raises(RuntimeError, match=r"expected bias of shape \[6\]"):
        fused_ops.linear_cross_entropy(h, w, t, torch.randn(5))
    with pytest.raises(RuntimeError, match=r"expected target of shape \[4\] or \[4\]"):
        fused_ops.linear_cross_entropy(h, w, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="not a valid value for reduction"):
        fused_ops.linear_cross_entropy(h, w, t, reduction="avg")


@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_linear_cross_entropy(dtype):
    N, H, V = 3000, 256, 32001  # 3 chunks (the last short) of the default 1024 tokens
    h = (torch.randn(N, H, device="cuda") * 0.5).to(dtype).requires_grad_()
    w = (torch.randn(V, H, device="cuda") / H**0.5).to(dtype).requires_grad_()
    t = make_target(N, V, "cuda")
    got = fused_ops.linear_cross_entropy(h, w, t, label_smoothing=0.1)
    got.backward()
    hr, wr = (x.detach().double().requires_grad_() for x in (h, w))
    # Reference from the same rounded logits the fused path sees
    logits = F.linear(hr, wr)
    want = reference(logits, t, label_smoothing=0.1)
    want.backward()
    assert_close(got, want, dtype=torch.float32, rtol=1e-3 if dtype != torch.float32 else 1e-4)
    tol = dict(rtol=5e-2, atol=1e-4) if dtype == torch.bfloat16 else dict(rtol=1e-3, atol=1e-6)
    assert_close(h.grad, hr.grad, dtype=dtype, **tol)
    assert_close(w.grad, wr.grad, dtype=dtype, **tol)


@CUDA
def test_cuda_linear_cross_entropy_peak_memory():
    # The point of the op: the [tokens, V] logits (and their float32 copies) never exist.
    # Peak memory of forward + backward above the inputs, against eager's.
    N, H, V = 4096, 1024, 32000
    h = (torch.randn(N, H, device="cuda") * 0.5).to(torch.bfloat16).requires_grad_()
    w = (torch.randn(V, H, device="cuda") / H**0.5).to(torch.bfloat16).requires_grad_()
    t = make_target(N, V, "cuda")

    def peak(fn):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        grads = torch.autograd.grad(fn(), (h, w))
        torch.cuda.synchronize()
        used = torch.cuda.max_memory_allocated() - base
        del grads
        return used

    fused = peak(lambda: fused_ops.linear_cross_entropy(h, w, t))
    eager = peak(lambda: F.cross_entropy(F.linear(h, w).float(), t))
    # grad_W (64 MB) + one 1024-token chunk of logits (64 MB) + grad_h, against eager's
    # bf16 logits, float32 copy, log-softmax and their gradients (~1.3 GB).
    assert fused * 4 <= eager, (fused, eager)
