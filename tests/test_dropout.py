"""dropout and bias_dropout_add: exact values, the mask's statistics, its reproducibility
(seed, CUDA graphs, alignment, device) and the ops' plumbing (autograd, opcheck, compile).

The mask of a call is recovered two ways: from the output (inputs are kept away from zero,
so an output is 0 exactly where the element was dropped) and from the call's seed_offset
through dropout_backward(ones) (= mask * scale); tests check that both agree.
"""

import math
import os
import shutil
import subprocess
import tempfile

import pytest
import torch
import torch.nn.functional as F

import fused_ops
from fused_ops import reference

from utils import (
    CUDA,
    DEVICES,
    DTYPES,
    TOL,
    assert_close,
    input_views,
    poison_next_alloc,
    skip_under_memcheck,
)

ops = torch.ops.fused
PS = [0.1, 0.5, 0.9]
SHAPES = [(1,), (7,), (1000,), (3, 5, 7), (129, 257), (64, 1024 + 3), (33, 1024)]


def away_from_zero(x):
    """Same layout as x, every element at least 0.5 in magnitude (so dropped <=> output 0)."""
    with torch.no_grad():
        return x.copy_(torch.where(x >= 0, x + 0.5, x - 0.5))


def fresh_views(shape, dtype, device):
    for name, x in input_views(shape, dtype, device):
        yield name, away_from_zero(x)


def math_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def scaled(t, p, dtype):
    """t / (1 - p) computed as the kernels do: in the math type, scale rounded once."""
    md = math_dtype(dtype)
    scale = torch.tensor(1.0 / (1.0 - p), dtype=md)
    return (t.to(md) * scale.to(t.device)).to(dtype)


def mask_from_seed(seed_offset, shape, p, device, dtype=torch.float32):
    ones = torch.ones(shape, dtype=dtype, device=device)
    return ops.dropout_backward(ones, seed_offset, p) != 0


def fixed_gen(device, seed=1234):
    return torch.Generator(device=device).manual_seed(seed)


def sum_atol(dtype, *terms):
    """Absolute tolerance for a sum computed in float32 (rounded once per operation) and
    rounded to `dtype`: a few float32 ulps of the largest |term|, plus the dtype's atol."""
    biggest = max(t.abs().max().item() for t in terms) if terms[0].numel() else 0.0
    return TOL[dtype][1] + 4 * 2.0**-24 * biggest


def z_bound(count, prob, z=5.0):
    """z standard deviations of the mean of `count` Bernoulli(prob) samples."""
    return z * math.sqrt(prob * (1 - prob) / count)


# ---- exact values ----------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_kept_values_exact(device, dtype, p, shape):
    for name, x in fresh_views(shape, dtype, device):
        poison_next_alloc(x.numel() * x.element_size(), device)
        y, so = ops.dropout(x, p, True)
        assert y.shape == x.shape and y.dtype == x.dtype and y.device == x.device
        assert so.dtype == torch.int64 and so.shape == (2,) and so.device == x.device
        kept = y != 0
        expected = torch.where(kept, scaled(x, p, dtype), torch.zeros_like(x))
        assert torch.equal(y, expected), f"view={name}"
        # The mask regenerated from seed_offset is the forward's mask.
        assert torch.equal(mask_from_seed(so, shape, p, device), kept), f"view={name}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", PS)
def test_gradient_is_mask_times_scale(device, dtype, p):
    for shape in [(7,), (129, 257), (64, 1027)]:
        for name, x in fresh_views(shape, dtype, device):
            xa = x.detach().clone().requires_grad_()
            y = fused_ops.dropout(xa, p)
            g = torch.randn(shape, device=device).to(dtype)
            y.backward(g)
            kept = y.detach() != 0
            expected = torch.where(kept, scaled(g, p, dtype), torch.zeros_like(g))
            assert torch.equal(xa.grad, expected), f"view={name}"


@pytest.mark.parametrize("device", DEVICES)
def test_backward_accepts_any_grad_layout(device):
    # The mask is indexed in logical row-major order, so a transposed grad_out gets the same
    # mask as a contiguous one.
    x = away_from_zero(torch.randn(37, 53, device=device))
    y, so = ops.dropout(x, 0.4, True)
    g = torch.randn(53, 37, device=device).t()
    assert torch.equal(
        ops.dropout_backward(g, so, 0.4), ops.dropout_backward(g.contiguous(), so, 0.4)
    )
    assert torch.equal(ops.dropout_backward(g, so, 0.4) != 0, y != 0)


# ---- statistics ------------------------------------------------------------------------


def _big(device):
    return (1 << 22) + 3 if device == "cuda" else (1 << 20) + 3


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("p", [0.05, 0.1, 0.5, 0.9, 0.001, 0.999])  # 16-bit draws, then 32-bit
def test_kept_fraction(device, p):
    n = _big(device)
    _, so = ops.dropout(torch.randn(n, device=device), p, True)
    kept = mask_from_seed(so, (n,), p, device).double()
    assert abs(kept.mean().item() - (1 - p)) < z_bound(n, 1 - p)
    # Every 16-bit half (i % 2), Philox word (i % 4 or i % 8 / 2) and position in a 16-byte
    # vector (i % 8) on its own.
    for period in (2, 4, 8):
        m = n // period
        frac = kept[: m * period].view(m, period).mean(0)
        assert (frac - (1 - p)).abs().max().item() < z_bound(m, 1 - p), f"period {period}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_no_correlation_between_neighbours_or_calls(device, p):
    n = _big(device)
    x = torch.randn(n, device=device)
    _, so1 = ops.dropout(x, p, True)
    _, so2 = ops.dropout(x, p, True)
    m1 = mask_from_seed(so1, (n,), p, device)
    m2 = mask_from_seed(so2, (n,), p, device)
    agree = (1 - p) ** 2 + p**2  # two independent Bernoulli(1 - p) agree this often
    pairs = {
        "consecutive calls": (m1, m2),
        "neighbours": (m1[:-1], m1[1:]),
        "same word, next counter": (m1[:-4], m1[4:]),
        "next vector": (m1[:-8], m1[8:]),
        "1024 apart": (m1[:-1024], m1[1024:]),
    }
    for what, (a, b) in pairs.items():
        rate = (a == b).double().mean().item()
        assert abs(rate - agree) < z_bound(a.numel(), agree), f"{what}: {rate} vs {agree}"
    assert not torch.equal(so1, so2)


# ---- reproducibility -------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_same_seed_same_output_and_calls_differ(device):
    x = away_from_zero(torch.randn(4099, device=device))
    torch.manual_seed(17)
    y1, so1 = ops.dropout(x, 0.5, True)
    y2, _ = ops.dropout(x, 0.5, True)
    torch.manual_seed(17)
    y3, so3 = ops.dropout(x, 0.5, True)
    assert torch.equal(y1, y3) and torch.equal(so1, so3)
    assert not torch.equal(y1 != 0, y2 != 0)
    # An explicit generator: reproducible from its own seed, and the default one untouched.
    torch.manual_seed(17)
    a, _ = ops.dropout(x, 0.5, True, generator=fixed_gen(device, 5))
    b = fused_ops.dropout(x, 0.5, generator=fixed_gen(device, 5))
    assert torch.equal(a, b)
    y4, _ = ops.dropout(x, 0.5, True)
    assert torch.equal(y4, y1)


@pytest.mark.parametrize("device", DEVICES)
def test_mask_independent_of_alignment_layout_and_size(device):
    shape = (61, 67)
    for dtype in DTYPES:
        for name, x in fresh_views(shape, dtype, device):
            torch.manual_seed(3)
            a, so_a = ops.dropout(x, 0.3, True)
            torch.manual_seed(3)
            b, so_b = ops.dropout(x.contiguous(), 0.3, True)  # a fresh, aligned copy
            assert torch.equal(so_a, so_b)
            assert torch.equal(a, b), f"dtype={dtype} view={name}"
    # Element i's bit depends on i only: a prefix of a bigger tensor (another grid, the vector
    # path vs the scalar tail) and another dtype (another vector width) see the same bits.
    x = torch.randn(100003, device=device)
    _, so = ops.dropout(x, 0.3, True)
    full = mask_from_seed(so, (100003,), 0.3, device)
    for n in (1, 5, 17, 1000, 4099):
        assert torch.equal(mask_from_seed(so, (n,), 0.3, device), full[:n]), n
        for dtype in (torch.float16, torch.bfloat16):
            assert torch.equal(mask_from_seed(so, (n,), 0.3, device, dtype), full[:n])
    off = torch.ones(100003 + 1, device=device)[1:]  # misaligned grad_out
    assert torch.equal(ops.dropout_backward(off, so, 0.3) != 0, full)


def _keep_threshold16(p):
    """The 16-bit keep threshold, or None where 16 bits are too coarse for p (philox.cuh's
    dropout_keep_threshold16: rounding error at most 2^-10 of min(p, 1 - p))."""
    keep = 1.0 - p
    t = math.floor(keep * 65536.0 + 0.5)
    if t < 1 or t > 65535 or abs(t / 65536.0 - keep) > min(p, keep) * 2.0**-10:
        return None
    return t


def _philox_reference_mask(seed, offset, n, p):
    """Philox4x32-10 in numpy (written from the paper's definition), the stream layout of
    csrc/common/philox.cuh and the keep threshold: the mask the kernels must produce. 16-bit
    draws: element i takes half i % 2 (low, high) of word (i % 8) // 2 of Philox(i // 8);
    32-bit draws: word i % 4 of Philox(i // 4)."""
    np = pytest.importorskip("numpy")
    m32 = np.uint64(0xFFFFFFFF)
    t16 = _keep_threshold16(p)
    per_call = 8 if t16 is not None else 4
    groups = np.arange((n + per_call - 1) // per_call, dtype=np.uint64)
    ctr = np.uint64(offset // 4)
    c = [
        np.full_like(groups, ctr & m32),
        np.full_like(groups, ctr >> np.uint64(32)),
        groups & m32,
        groups >> np.uint64(32),
    ]
    k0, k1 = seed & 0xFFFFFFFF, seed >> 32
    for _ in range(10):
        p0 = c[0] * np.uint64(0xD2511F53)
        p1 = c[2] * np.uint64(0xCD9E8D57)
        c = [
            (p1 >> np.uint64(32)) ^ c[1] ^ np.uint64(k0),
            p1 & m32,
            (p0 >> np.uint64(32)) ^ c[3] ^ np.uint64(k1),
            p0 & m32,
        ]
        k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    words = np.stack(c, axis=1).reshape(-1)
    if t16 is not None:
        halves = np.stack([words & np.uint64(0xFFFF), words >> np.uint64(16)], axis=1)
        return torch.from_numpy(halves.reshape(-1)[:n] < np.uint64(t16))
    threshold = min(int((1 - p) * 2.0**32 + 0.5), 0xFFFFFFFF)
    return torch.from_numpy(words[:n] < np.uint64(threshold))


def test_16bit_draws_rule():
    # Which p take 16-bit draws: every p in [2^-7, 1 - 2^-7], multiples of 2^-16, not 1e-3.
    for p in (0.0078125, 0.01, 0.05, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99, 0.9921875, 2.0**-12):
        assert _keep_threshold16(p) is not None, p
    for p in (1e-3, 0.999, 1e-5, 1 - 1e-5, 0.003):
        assert _keep_threshold16(p) is None, p


@pytest.mark.parametrize("device", DEVICES)
def test_mask_matches_philox_reference(device):
    n = 10007
    for p in (0.1, 0.7, 0.001, 0.999, 2.0**-12):  # 16-bit, 16-bit, 32-bit, 32-bit, 16-bit
        _, so = ops.dropout(torch.randn(n, device=device), p, True)
        seed, offset = (int(v) % 2**64 for v in so.cpu())
        ref = _philox_reference_mask(seed, offset, n, p)
        assert torch.equal(mask_from_seed(so, (n,), p, device).cpu(), ref)


def test_philox_known_answers():
    # Random123's known-answer vectors for philox4x32-10, through the C++ header itself.
    cxx = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    here = os.path.dirname(os.path.abspath(__file__))
    csrc = os.path.join(here, "..", "csrc")
    src = r"""
#include <cstdio>
#include "common/philox.cuh"
int main() {
  const unsigned v[3][6] = {{0, 0, 0, 0, 0, 0},
    {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
    {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u}};
  for (auto& a : v) {
    fused::Philox4 r = fused::philox4x32_10(a[0], a[1], a[2], a[3], a[4], a[5]);
    std::printf("%08x %08x %08x %08x\n", r.w[0], r.w[1], r.w[2], r.w[3]);
  }
}
"""
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "kat.cpp"), "w") as f:
            f.write(src)
        exe = os.path.join(d, "kat")
        subprocess.run(
            [cxx, "-std=c++17", "-I", csrc, os.path.join(d, "kat.cpp"), "-o", exe], check=True
        )
        out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout.split("\n")
    assert out[:3] == [
        "6627e8d5 e169c58d bc57ac4c 9b00dbd8",
        "408f276d 41c83b0e a20bc7c6 6d5451fd",
        "d16cfe09 94fdcceb 5001e420 24126ea1",
    ]


@CUDA
def test_cpu_and_cuda_masks_agree():
    # 16-bit draws (0.1, 0.5) and 32-bit draws (0.001); every vector width (dtype) and the
    # bias-gradient kernel's paths (vector: 1024 columns, scalar: the others).
    for p in (0.1, 0.5, 0.001):
        for shape in [(5,), (129, 257), ((1 << 16) + 3,), (64, 1024)]:
            _, so = ops.dropout(torch.randn(shape, device="cuda"), p, True)
            cpu_mask = mask_from_seed(so.cpu(), shape, p, "cpu")
            for dtype in (torch.float32, torch.bfloat16, torch.float16):
                cuda_mask = mask_from_seed(so, shape, p, "cuda", dtype).cpu()
                assert torch.equal(cuda_mask, cpu_mask), (p, shape, dtype)
                ones = torch.ones(shape, device="cuda", dtype=dtype)
                dx, _ = ops.bias_dropout_add_backward(ones, so, p)
                assert torch.equal((dx != 0).cpu(), cpu_mask), (p, shape, dtype, "bias grad")


@CUDA
def test_cuda_graph_replay_fresh_masks_reproducible_from_seed():
    skip_under_memcheck("CUDA graph capture")
    n, p = (1 << 20) + 5, 0.3
    x = away_from_zero(torch.randn(n, device="cuda"))
    ones = torch.ones(n, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the capture
        for _ in range(2):
            y, so = ops.dropout(x, p, True)
            ops.dropout_backward(ones, so, p)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, so = ops.dropout(x, p, True)
        dx = ops.dropout_backward(ones, so, p)

    def replay():
        graph.replay()
        torch.cuda.synchronize()
        return (y != 0).clone(), so.clone(), (dx != 0).clone()

    torch.manual_seed(11)
    m1, so1, d1 = replay()
    m2, so2, d2 = replay()
    assert not torch.equal(m1, m2) and not torch.equal(so1, so2)
    assert torch.equal(d1, m1) and torch.equal(d2, m2)  # backward inside the graph agrees
    kept = m1.double().mean().item()
    assert abs(kept - (1 - p)) < z_bound(n, 1 - p)
    torch.manual_seed(11)
    m3, so3, _ = replay()
    assert torch.equal(m3, m1) and torch.equal(so3, so1)
    # Graphed and eager draws are the same for the same generator state.
    torch.manual_seed(11)
    ye, soe = ops.dropout(x, p, True)
    assert torch.equal(soe, so1) and torch.equal(ye != 0, m1)


# ---- special values of p and training ----------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_identity_cases_return_input(device):
    x = torch.randn(5, 6, device=device)
    assert fused_ops.dropout(x, 0.0) is x
    assert fused_ops.dropout(x, 0.5, training=False) is x
    assert fused_ops.dropout(x, 0.5, training=False, inplace=True) is x
    m = fused_ops.nn.Dropout(0.5).eval()
    assert m(x) is x
    # Even an integer tensor passes through untouched outside training (as F.dropout).
    i = torch.arange(4, device=device)
    assert fused_ops.dropout(i, 0.5, training=False) is i
    # The op itself returns a fresh copy and draws no randomness.
    state = torch.cuda.get_rng_state() if device == "cuda" else torch.get_rng_state()
    y, so = ops.dropout(x, 0.5, False)
    assert torch.equal(y, x) and y.data_ptr() != x.data_ptr()
    after = torch.cuda.get_rng_state() if device == "cuda" else torch.get_rng_state()
    assert torch.equal(state, after)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_p_one_gives_zeros_and_zero_grads(device, dtype):
    x = torch.randn(9, 33, device=device).to(dtype).requires_grad_()
    y = fused_ops.dropout(x, 1.0)
    assert torch.equal(y, torch.zeros_like(y))
    y.backward(torch.randn_like(y))
    assert torch.equal(x.grad, torch.zeros_like(x))
    b = torch.randn(33, device=device).to(dtype).requires_grad_()
    r = torch.randn(9, 33, device=device).to(dtype).requires_grad_()
    x.grad = None
    out = fused_ops.bias_dropout_add(x, b, r, 1.0)
    assert torch.equal(out, r.detach())
    g = torch.randn_like(out)
    out.backward(g)
    assert torch.equal(x.grad, torch.zeros_like(x)) and torch.equal(b.grad, torch.zeros_like(b))
    assert torch.equal(r.grad, g)


@pytest.mark.parametrize("device", DEVICES)
def test_zero_dim(device):
    x = torch.tensor(3.0, device=device, requires_grad=True)
    kept = 0
    for _ in range(64):
        y = fused_ops.dropout(x, 0.5)
        assert y.shape == () and y.item() in (0.0, 6.0)
        kept += y.item() != 0
        y.backward()
    assert 0 < kept < 64
    assert x.grad.item() == 2.0 * kept


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    x = torch.empty(0, 4, device=device)
    y, so = ops.dropout(x, 0.5, True)
    assert y.shape == (0, 4) and so.shape == (2,)
    assert ops.dropout_backward(x, so, 0.5).shape == (0, 4)
    out, so = ops.bias_dropout_add(x, torch.randn(4, device=device), x, 0.5, True)
    assert out.shape == (0, 4)
    dx, db = ops.bias_dropout_add_backward(x, so, 0.5)
    assert dx.shape == (0, 4) and torch.equal(db, torch.zeros(4, device=device))


# ---- in place ----------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_inplace(device):
    x = away_from_zero(torch.randn(130, 67, device=device))
    torch.manual_seed(5)
    ref = fused_ops.dropout(x, 0.3)
    for name, view in [
        ("contiguous", x.clone()),
        ("transposed", x.t().clone().t()),
        ("offset", torch.empty(x.numel() + 1, device=device)[1:].view(x.shape)),
    ]:
        view.copy_(x)
        torch.manual_seed(5)
        out = fused_ops.dropout(view, 0.3, inplace=True)
        assert out is view and torch.equal(view, ref), name
    # With autograd: same values, gradient through the mask (computed out of place + copy_).
    xl = x.clone().requires_grad_()
    h = xl * 1.0
    torch.manual_seed(5)
    out = fused_ops.dropout(h, 0.3, inplace=True)
    assert out is h and torch.equal(out, ref)
    out.backward(torch.ones_like(out))
    assert torch.equal(
        xl.grad, torch.where(ref != 0, scaled(torch.ones_like(x), 0.3, torch.float32), 0.0)
    )
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        fused_ops.dropout(x.clone().requires_grad_(), 0.3, inplace=True)
    # p = 1 in place.
    z = x.clone()
    fused_ops.dropout(z, 1.0, inplace=True)
    assert torch.equal(z, torch.zeros_like(z))


# ---- bias_dropout_add --------------------------------------------------------------------

BDA_SHAPES = [(7,), (3, 5, 7), (129, 257), (64, 1027), (33, 1024), (300, 64)]


def _bda_reference(x, bias, residual, mask, p):
    h = x.double() + (bias.double() if bias is not None else 0.0)
    return residual.double() + mask.double() * h / (1.0 - p)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", BDA_SHAPES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_bias_dropout_add_matches_float64(device, dtype, shape, with_bias):
    p = 0.2
    views = list(input_views(shape, dtype, device))
    biases = dict(input_views(shape[-1:], dtype, device))
    for (name, x), (_, r) in zip(views, reversed(views)):
        for bname in ["contiguous", "offset"] if with_bias else [None]:
            b = biases[bname] if bname else None
            poison_next_alloc(x.numel() * x.element_size(), device)
            out, so = ops.bias_dropout_add(x, b, r, p, True)
            assert out.shape == x.shape and out.dtype == dtype
            mask = mask_from_seed(so, shape, p, device)
            ref = _bda_reference(x, b, r, mask, p)
            # float32 math, then one rounding: the tolerance follows the terms' size (the
            # residual and the scaled x + bias), since the sum can cancel.
            atol = sum_atol(dtype, r.double(), (ref - r.double()))
            assert_close(out, ref, atol=atol, msg=f"x={name} bias={bname}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", BDA_SHAPES)
def test_bias_dropout_add_backward(device, dtype, shape):
    p = 0.3
    for name, g in input_views(shape, dtype, device):
        x = torch.randn(shape, device=device).to(dtype).requires_grad_()
        b = torch.randn(shape[-1], device=device).to(dtype).requires_grad_()
        r = torch.randn(shape, device=device).to(dtype).requires_grad_()
        out, so = ops.bias_dropout_add(x, b, r, p, True)
        out.backward(g)
        kept = mask_from_seed(so, shape, p, device)
        expected_dx = torch.where(kept, scaled(g, p, dtype), torch.zeros_like(g))
        assert torch.equal(x.grad, expected_dx), f"grad view={name}"
        assert torch.equal(r.grad, g), f"grad view={name}"
        rows_ref = (kept.double() * g.double() / (1 - p)).reshape(-1, shape[-1])
        ref = rows_ref.sum(0)
        # Summation error model: the fp32 accumulation is bounded by a multiple of the sum of
        # |terms|; then one rounding to the dtype.
        atol = 1e-6 * rows_ref.abs().sum(0).max().item() + TOL[dtype][1]
        torch.testing.assert_close(
            b.grad.double(), ref, rtol=TOL[dtype][0], atol=atol, msg=f"dbias view={name}"
        )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("p", [0.25, 0.001])  # 16-bit and 32-bit draws
def test_bias_dropout_add_backward_op_consistent_with_forward_mask(device, p):
    shape = (77, 40)
    x = away_from_zero(torch.randn(shape, device=device))
    zero_b = torch.zeros(shape[-1], device=device)
    out, so = ops.bias_dropout_add(x, zero_b, torch.zeros(shape, device=device), p, True)
    g = torch.randn(shape, device=device)
    dx, db = ops.bias_dropout_add_backward(g, so, p)
    assert torch.equal(dx != 0, out != 0)
    assert torch.equal(dx, ops.dropout_backward(g, so, p))
    torch.testing.assert_close(db, dx.sum(0), rtol=1e-5, atol=1e-5)
    # Deterministic: bitwise the same on a second run.
    dx2, db2 = ops.bias_dropout_add_backward(g, so, p)
    assert torch.equal(dx, dx2) and torch.equal(db, db2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_dropout_add_eval_is_fused_add(device, dtype):
    x = torch.randn(17, 24, device=device).to(dtype).requires_grad_()
    b = torch.randn(24, device=device).to(dtype).requires_grad_()
    r = torch.randn(17, 24, device=device).to(dtype).requires_grad_()
    for out in (
        fused_ops.bias_dropout_add(x, b, r, 0.5, training=False),
        fused_ops.bias_dropout_add(x, b, r, 0.0),
    ):
        assert_close(
            out,
            r.double() + x.double() + b.double(),
            atol=sum_atol(dtype, r.double(), x.double() + b.double()),
        )
    g = torch.randn(17, 24, device=device).to(dtype)
    fused_ops.bias_dropout_add(x, b, r, 0.5, training=False).backward(g)
    assert torch.equal(x.grad, g) and torch.equal(r.grad, g)
    assert_close(b.grad, g.double().sum(0), rtol=TOL[dtype][0], atol=1e-4 * 17)


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_large_bias_grad_many_chunks(dtype):
    # Many row chunks in the two-stage dbias reduction, vector path.
    shape, p = (4096, 1024), 0.1
    g = torch.randn(shape, device="cuda").to(dtype)
    _, so = ops.bias_dropout_add(
        torch.randn(shape, device="cuda").to(dtype),
        None,
        torch.randn(shape, device="cuda").to(dtype),
        p,
        True,
    )
    poison_next_alloc(g.numel() * g.element_size(), "cuda")
    dx, db = ops.bias_dropout_add_backward(g, so, p)
    mask = mask_from_seed(so, shape, p, "cuda")
    assert torch.equal(dx, torch.where(mask, scaled(g, p, dtype), torch.zeros_like(g)))
    terms = mask.double() * g.double() / (1 - p)
    atol = 1e-6 * terms.abs().sum(0).max().item() + TOL[dtype][1]
    torch.testing.assert_close(db.double(), terms.sum(0), rtol=TOL[dtype][0], atol=atol)


# ---- autograd, opcheck, compile ------------------------------------------------------------


def test_gradcheck_float64():
    x = torch.randn(6, 11, dtype=torch.float64, requires_grad=True)
    b = torch.randn(11, dtype=torch.float64, requires_grad=True)
    r = torch.randn(6, 11, dtype=torch.float64, requires_grad=True)

    # A fresh generator with a fixed seed per call: every evaluation draws the same mask.
    def drop(t):
        return fused_ops.dropout(t, 0.4, generator=fixed_gen("cpu"))

    def bda(t, bb, rr):
        return fused_ops.bias_dropout_add(t, bb, rr, 0.4, generator=fixed_gen("cpu"))

    assert torch.autograd.gradcheck(drop, (x,))
    assert torch.autograd.gradgradcheck(drop, (x,))
    assert torch.autograd.gradcheck(bda, (x, b, r))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    def t(*s):
        return torch.randn(*s, device=device, requires_grad=True)

    x, b, r = t(5, 8), t(8), t(5, 8)
    for p, training in [(0.3, True), (0.0, True), (1.0, True), (0.3, False)]:
        torch.library.opcheck(ops.dropout.default, (x, p, training))
        torch.library.opcheck(ops.bias_dropout_add.default, (x, b, r, p, training))
        torch.library.opcheck(ops.bias_dropout_add.default, (x, None, r, p, training))
        torch.library.opcheck(ops.dropout_.default, (x.detach().clone(), p, training))
    # An explicit Generator cannot be traced into an FX graph (make_fx raises on the
    # argument type), so test_aot_dispatch_dynamic is left out for it; torch.compile graph
    # breaks on generator= the same way. The default generator (None) compiles (see below).
    for kw in ({"generator": fixed_gen(device)}, {"generator": None}):
        torch.library.opcheck(
            ops.dropout.default,
            (x, 0.3, True),
            kw,
            test_utils=("test_schema", "test_autograd_registration", "test_faketensor"),
        )
        torch.library.opcheck(
            ops.bias_dropout_add.default,
            (x, b, r, 0.3, True),
            kw,
            test_utils=("test_schema", "test_autograd_registration", "test_faketensor"),
        )
    _, so = ops.dropout(x.detach(), 0.3, True)
    g = torch.randn(5, 8, device=device)
    torch.library.opcheck(ops.dropout_backward.default, (g, so, 0.3))
    torch.library.opcheck(ops.bias_dropout_add_backward.default, (g, so, 0.3))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    torch._dynamo.reset()
    p = 0.3
    x = away_from_zero(torch.randn(16, 40, device=device)).requires_grad_()
    b = torch.randn(40, device=device, requires_grad=True)
    r = torch.randn(16, 40, device=device, requires_grad=True)

    # Two dropouts of the same input are two independent masks (not merged by the compiler's
    # CSE: see fused_ops/_impl/dropout.py), drawn in program order, so compiled and eager give
    # the same masks from the same seed; backward regenerates each call's own mask.
    def f(t, bias, res):
        o, so = ops.bias_dropout_add(t, bias, res, p, True)
        return fused_ops.dropout(t, p), fused_ops.dropout(t, p), o, so

    compiled = torch.compile(f, fullgraph=True)
    compiled(x, b, r)  # compile outside the seeded region
    torch.manual_seed(9)
    a, c, o, so = compiled(x, b, r)
    torch.manual_seed(9)
    for got, want in zip((a, c, o, so), f(x, b, r)):
        assert torch.equal(got, want)
    assert not torch.equal(a != 0, c != 0)
    (a.sum() + 2 * c.sum() + o.sum()).backward()
    mask_o = mask_from_seed(so, x.shape, p, device)
    masks = torch.where(a != 0, 1.0, 0.0) + 2 * torch.where(c != 0, 1.0, 0.0) + mask_o.float()
    torch.testing.assert_close(x.grad, masks.detach() / (1 - p), rtol=1e-6, atol=0)
    torch.testing.assert_close(b.grad, mask_o.float().sum(0) / (1 - p), rtol=1e-5, atol=1e-5)
    assert torch.equal(r.grad, torch.ones_like(r))

    # The module, in place under no_grad, compiles too.
    torch._dynamo.reset()
    m = torch.compile(fused_ops.nn.Dropout(p, inplace=True), fullgraph=True)
    with torch.no_grad():
        z = torch.ones(64, 64, device=device)
        assert m(z) is z
    kept = z != 0
    assert 0 < kept.sum() < z.numel()
    assert torch.equal(z[kept], scaled(torch.ones_like(z), p, torch.float32)[kept])


def test_nn_dropout_is_drop_in():
    m, ref = fused_ops.nn.Dropout(0.2, inplace=False), torch.nn.Dropout(0.2)
    assert isinstance(m, torch.nn.Dropout)
    assert repr(m) == repr(ref)
    m.load_state_dict(ref.state_dict())
    x = away_from_zero(torch.randn(64, 64))
    y = m(x)
    kept = y != 0
    assert torch.equal(y[kept], scaled(x, 0.2, torch.float32)[kept])
    assert m.eval()(x) is x


# ---- memory: nothing of x's size saved for backward ---------------------------------------


@CUDA
def test_cuda_saves_no_mask():
    skip_under_memcheck("torch.cuda.memory_allocated (the caching allocator's statistics)")
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    nbytes = x.numel() * x.element_size()

    def saved_bytes(fn):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        y = fn(x)
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated() - before  # output + what backward keeps
        del y
        return held

    fused = saved_bytes(lambda t: fused_ops.dropout(t, 0.1))
    native = saved_bytes(lambda t: F.dropout(t, 0.1))
    assert fused <= nbytes + 4096  # y and the 16-byte seed_offset (one allocator block)
    assert native >= nbytes + x.numel()  # y and a one-byte mask per element


# ---- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs(device):
    x = torch.randn(4, 7, device=device)
    for p in (1.5, -0.1, float("nan")):
        with pytest.raises(RuntimeError, match="dropout probability has to be between 0 and 1"):
            ops.dropout(x, p, True)
        with pytest.raises(RuntimeError, match="dropout probability has to be between 0 and 1"):
            ops.bias_dropout_add(x, None, x, p, True)
    with pytest.raises(ValueError, match="between 0 and 1, but got 1.5"):
        fused_ops.dropout(x, 1.5)
    with pytest.raises(ValueError, match="between 0 and 1, but got -0.1"):
        fused_ops.bias_dropout_add(x, None, x, -0.1)
    with pytest.raises(RuntimeError, match="expected x to be float32.*got Long"):
        fused_ops.dropout(torch.ones(3, dtype=torch.long, device=device), 0.5)
    with pytest.raises(RuntimeError, match="expected x to be float32.*got Int"):
        fused_ops.dropout(torch.ones(3, dtype=torch.int32, device=device), 0.5, inplace=True)
    with pytest.raises(RuntimeError, match=r"expected bias of shape \[7\].*\[4\]"):
        fused_ops.bias_dropout_add(x, torch.randn(4, device=device), x, 0.5)
    with pytest.raises(RuntimeError, match="expected x and residual to have the same shape"):
        fused_ops.bias_dropout_add(x, None, torch.randn(4, 8, device=device), 0.5)
    with pytest.raises(RuntimeError, match="expected x and residual to have the same dtype"):
        fused_ops.bias_dropout_add(x, None, x.half(), 0.5)
    with pytest.raises(RuntimeError, match="expected x and bias to have the same dtype"):
        fused_ops.bias_dropout_add(x, torch.randn(7, device=device).half(), x, 0.5)
    with pytest.raises(RuntimeError, match="seed_offset to be the int64 tensor of 2 elements"):
        ops.dropout_backward(x, torch.zeros(3, dtype=torch.long, device=device), 0.5)
    with pytest.raises(RuntimeError, match="seed_offset to be the int64 tensor of 2 elements"):
        ops.bias_dropout_add_backward(x, torch.zeros(2, device=device), 0.5)
    with pytest.raises(RuntimeError, match="expected grad_out to be float32"):
        ops.dropout_backward(
            torch.ones(3, dtype=torch.long, device=device),
            torch.zeros(2, dtype=torch.long, device=device),
            0.5,
        )


@CUDA
def test_cuda_device_mismatch():
    x = torch.randn(4, 7, device="cuda")
    with pytest.raises(RuntimeError, match="expected x and residual on the same device"):
        fused_ops.bias_dropout_add(x, None, x.cpu(), 0.5)
    with pytest.raises(RuntimeError, match="expected x and bias on the same device"):
        fused_ops.bias_dropout_add(x, torch.randn(7), x, 0.5)
    with pytest.raises(RuntimeError, match="grad_out and seed_offset on the same device"):
        ops.dropout_backward(x, torch.zeros(2, dtype=torch.long), 0.5)
    with pytest.raises(RuntimeError, match="float64"):
        fused_ops.dropout(torch.randn(3, device="cuda", dtype=torch.float64), 0.5)
    with pytest.raises(RuntimeError, match="generator"):
        fused_ops.dropout(x, 0.5, generator=torch.Generator())  # a CPU generator


def test_reference_compositions():
    # The benchmark's unfused/compile competitors compute the same function.
    x = torch.randn(100, 50)
    y = reference.dropout(x, 0.3)
    kept = y != 0
    torch.testing.assert_close(y[kept], x[kept] / 0.7)
    b, r = torch.randn(50), torch.randn(100, 50)
    assert torch.equal(reference.bias_dropout_add(x, b, r, 0.3, training=False), r + (x + b))


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [1000, 4095, 5121, 50257])
def test_cuda_bias_dropout_add_odd_width_vectorised(dtype, cols):
    # A width off the vector grid: x, residual and out as 16-byte vectors, the bias
    # gathered element by element (dropout_kernel's last template argument, BVEC, false).
    # Rows cross vector boundaries, so a group's bias columns wrap (checked by the values).
    import re

    from utils import cuda_kernel_names

    vec = 16 // torch.empty((), dtype=dtype).element_size()
    rows = max(2, (1 << 20) // cols)
    x = torch.randn(rows, cols, device="cuda").to(dtype)
    r = torch.randn(rows, cols, device="cuda").to(dtype)
    b = torch.randn(cols, device="cuda").to(dtype)
    p = 0.2
    poison_next_alloc(x.numel() * x.element_size(), "cuda")
    out, so = ops.bias_dropout_add(x, b, r, p, True)
    mask = mask_from_seed(so, (rows, cols), p, "cuda")
    ref = _bda_reference(x, b, r, mask, p)
    assert_close(out, ref, atol=sum_atol(dtype, r.double(), ref - r.double()))
    names = cuda_kernel_names(lambda: ops.bias_dropout_add(x, b, r, p, True))
    shapes = [
        (int(m.group(1)), m.group(2))
        for n in names
        for m in [re.search(r"dropout_kernel<[^,]+, (\d+), (?:true|1), .*, (true|false|1|0)>", n)]
        if m
    ]
    # 1000: whole vectors, the bias as vectors too
    want = ("true", "1") if cols % vec == 0 else ("false", "0")
    assert shapes and all(v == vec and bvec in want for v, bvec in shapes), names
