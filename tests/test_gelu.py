import pytest
import torch
import torch.nn.functional as F

import fused_ops
from fused_ops import reference

from utils import (
    CUDA,
    DEVICES,
    DTYPES,
    assert_close,
    input_views,
    poison_next_alloc,
    skip_under_memcheck,
)

APPROX = ["none", "tanh"]
SHAPES = [(1,), (7,), (1000,), (3, 5, 7), (129, 257), (64, 1024 + 3)]


def ref_gelu(x, approximate):
    return reference.gelu(x.double(), approximate)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", APPROX)
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_matches_float64(device, dtype, approximate, shape):
    for name, x in input_views(shape, dtype, device, scale=3.0):
        poison_next_alloc(x.numel() * x.element_size(), device)
        y = fused_ops.gelu(x, approximate=approximate)
        assert y.shape == x.shape and y.dtype == x.dtype and y.device == x.device
        assert_close(y, ref_gelu(x, approximate), msg=f"view={name}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", APPROX)
@pytest.mark.parametrize("shape", SHAPES)
def test_backward_matches_float64(device, dtype, approximate, shape):
    for name, x in input_views(shape, dtype, device, scale=3.0):
        dy = torch.randn(shape, device=device).to(dtype)
        xr = x.double().requires_grad_()
        ref_gelu(xr, approximate).backward(dy.double())
        poison_next_alloc(x.numel() * x.element_size(), device)
        dx = torch.ops.fused.gelu_backward(dy, x, approximate=approximate)
        assert_close(dx, xr.grad, dtype=dtype, msg=f"view={name}")
        # The same through autograd.
        xa = x.detach().clone().requires_grad_()
        fused_ops.gelu(xa, approximate=approximate).backward(dy)
        assert_close(xa.grad, xr.grad, dtype=dtype, msg=f"autograd view={name}")


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", APPROX)
def test_cuda_large_and_odd(dtype, approximate):
    # Several vector widths plus a tail, across many blocks.
    x = torch.randn(3 * 1024 * 1024 + 5, device="cuda").to(dtype) * 4
    poison_next_alloc(x.numel() * x.element_size(), "cuda")
    assert_close(fused_ops.gelu(x, approximate=approximate), ref_gelu(x, approximate))


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_extreme_values(dtype):
    # Saturation, the far negative tail, infinities and NaN behave as in torch.
    x = torch.tensor(
        [
            -1e4,
            -50.0,
            -12.0,
            -10.0,
            -5.0,
            -1e-6,
            0.0,
            1e-6,
            5.0,
            10.0,
            50.0,
            1e4,
            float("inf"),
            float("-inf"),
            float("nan"),
        ],
        device="cuda",
    ).to(dtype)
    for a in APPROX:
        torch.testing.assert_close(
            fused_ops.gelu(x, approximate=a), F.gelu(x, approximate=a), equal_nan=True
        )
        dy = torch.ones_like(x)
        torch.testing.assert_close(
            torch.ops.fused.gelu_backward(dy, x, approximate=a),
            torch.ops.aten.gelu_backward(dy, x, approximate=a),
            equal_nan=True,
        )


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    x = torch.empty(0, 4, device=device)
    assert fused_ops.gelu(x).shape == (0, 4)
    assert torch.ops.fused.gelu_backward(x, x).shape == (0, 4)


@pytest.mark.parametrize("approximate", APPROX)
def test_gradcheck_float64(approximate):
    x = torch.randn(4, 9, dtype=torch.float64, requires_grad=True) * 2
    x = x.detach().requires_grad_()
    assert torch.autograd.gradcheck(lambda t: fused_ops.gelu(t, approximate=approximate), (x,))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("approximate", APPROX)
def test_opcheck(device, approximate):
    x = torch.randn(5, 7, device=device, requires_grad=True)
    torch.library.opcheck(torch.ops.fused.gelu.default, (x,), {"approximate": approximate})
    dy = torch.randn(5, 7, device=device)
    torch.library.opcheck(
        torch.ops.fused.gelu_backward.default, (dy, x.detach()), {"approximate": approximate}
    )


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    torch._dynamo.reset()
    x = torch.randn(8, 33, device=device, requires_grad=True)

    def f(t):
        return fused_ops.gelu(t, approximate="tanh").sum()

    compiled = torch.compile(f, fullgraph=True)
    out = compiled(x)
    out.backward()
    xr = x.detach().double().requires_grad_()
    ref_gelu(xr, "tanh").sum().backward()
    assert_close(out, ref_gelu(x.detach(), "tanh").sum(), dtype=torch.float32, rtol=1e-5, atol=1e-4)
    assert_close(x.grad, xr.grad, dtype=torch.float32)


def test_nn_gelu_is_drop_in():
    for a in APPROX:
        m, ref = fused_ops.nn.GELU(approximate=a), torch.nn.GELU(approximate=a)
        assert isinstance(m, torch.nn.GELU)
        m.load_state_dict(ref.state_dict())
        x = torch.randn(3, 4)
        torch.testing.assert_close(m(x), ref(x))
        assert repr(m) == repr(ref)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs(device):
    with pytest.raises(RuntimeError, match="expected x to be float32.*got Long"):
        fused_ops.gelu(torch.ones(3, dtype=torch.long, device=device))
    with pytest.raises(RuntimeError, match="approximate to be 'none' or 'tanh'.*'fast'"):
        fused_ops.gelu(torch.randn(3, device=device), approximate="fast")
    with pytest.raises(RuntimeError, match="same shape"):
        torch.ops.fused.gelu_backward(torch.randn(3, device=device), torch.randn(4, device=device))
    with pytest.raises(RuntimeError, match="same dtype"):
        torch.ops.fused.gelu_backward(
            torch.randn(3, device=device), torch.randn(3, device=device).half()
        )


@CUDA
def test_cuda_device_mismatch():
    with pytest.raises(RuntimeError, match="same device"):
        torch.ops.fused.gelu_backward(torch.randn(3), torch.randn(3, device="cuda"))
    with pytest.raises(RuntimeError, match="float64"):
        fused_ops.gelu(torch.randn(3, device="cuda", dtype=torch.float64))


@CUDA
def test_cuda_graph_capture_and_replay():
    skip_under_memcheck("CUDA graph capture")
    x = torch.randn(4096, 257, device="cuda", dtype=torch.bfloat16)
    static_dy = torch.randn_like(x)
    fused_ops.gelu(x)  # warm up outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = fused_ops.gelu(x, approximate="tanh")
        dx = torch.ops.fused.gelu_backward(static_dy, x, approximate="tanh")
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        g.replay()
        torch.cuda.synchronize()
        assert_close(y, ref_gelu(x, "tanh"))
        xr = x.double().requires_grad_()
        ref_gelu(xr, "tanh").backward(static_dy.double())
        assert_close(dx, xr.grad, dtype=torch.bfloat16)


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [0, 1, 3])
@pytest.mark.parametrize("n", [1, 7, 4097, 3 * 5121 + 1])
def test_cuda_any_offset_vectorised(dtype, offset, n):
    # A view at an odd element: one flat array, the elements up to the 16-byte grid and the
    # tail one at a time, the body as 16-byte vectors; the output at x's offset in its chunk
    # (the backward's dx too, and a grad_out there takes the same path).
    import re

    from utils import cuda_kernel_names

    vec = 16 // torch.empty((), dtype=dtype).element_size()
    x = (torch.randn(n + offset, device="cuda") * 4).to(dtype)[offset:]
    dy = torch.randn(n + offset, device="cuda").to(dtype)[offset:]
    for approximate in APPROX:
        poison_next_alloc(x.numel() * x.element_size() + 16, "cuda")
        y = fused_ops.gelu(x, approximate=approximate)
        assert y.data_ptr() % 16 == x.data_ptr() % 16
        assert_close(y, ref_gelu(x, approximate))
        xr = x.double().requires_grad_()
        ref_gelu(xr, approximate).backward(dy.double())
        dx = torch.ops.fused.gelu_backward(dy, x, approximate=approximate)
        assert_close(dx, xr.grad, dtype=dtype)
        names = cuda_kernel_names(lambda: fused_ops.gelu(x, approximate=approximate))
        names += cuda_kernel_names(
            lambda: torch.ops.fused.gelu_backward(dy, x, approximate=approximate)
        )
        vs = [
            int(m.group(1))
            for n_ in names
            for m in [re.search(r"elementwise_kernel<[^,]+, (\d+),", n_)]
            if m
        ]
        assert len(vs) == 2 and set(vs) == {vec}, names
