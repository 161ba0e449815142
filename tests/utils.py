"""Shared test helpers: devices and dtypes, tolerances, input views, output poisoning."""

import os

import pytest
import torch

from fused_ops.overrides import overrides  # noqa: F401  (`with overrides("norm.fixed=0"):`)

CUDA = pytest.mark.cuda
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# Set by tests/run_parallel.py --tool (or --memcheck): these processes run under
# compute-sanitizer with torch's caching allocator off, where neither CUDA graph capture (it
# allocates from that allocator's private pools) nor the CUDA profiler (the sanitizer holds
# CUPTI) works, the allocator keeps no statistics (torch.cuda.memory_allocated), and
# poison_next_alloc has no cached block to leave behind.
MEMCHECK = os.environ.get("FUSED_OPS_MEMCHECK") == "1"


def skip_under_memcheck(what):
    """Skip the calling test under compute-sanitizer (see MEMCHECK); the plain run checks it."""
    if MEMCHECK:
        pytest.skip(
            f"{what} does not work under compute-sanitizer with the caching allocator "
            "off (run_parallel --tool)"
        )


# (rtol, atol) for comparing an op's output in `dtype` with a float64 reference.
TOL = {
    torch.float64: (1e-10, 1e-12),
    torch.float32: (1e-5, 1e-6),
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1e-2, 1e-4),
}


def assert_close(actual, ref, dtype=None, rtol=None, atol=None, msg=""):
    """Compare with a float64 reference. NaN passes only where the reference is NaN."""
    dtype = dtype or actual.dtype
    r, a = TOL[dtype]
    torch.testing.assert_close(
        actual.double().cpu(),
        ref.double().cpu(),
        rtol=rtol if rtol is not None else r,
        atol=atol if atol is not None else a,
        equal_nan=True,
        msg=(lambda default: f"{msg}\n{default}") if msg else None,  # keep torch's details
    )


def input_views(shape, dtype, device, scale=1.0):
    """Yield (name, tensor) views of fresh random data with the given logical shape:
    contiguous, transposed (dense but not contiguous), strided with gaps, and offset by one
    element from an aligned allocation (misaligned for 16-byte vector loads)."""

    def rand(*s):
        return (torch.randn(*s, dtype=torch.float32, device=device) * scale).to(dtype)

    yield "contiguous", rand(*shape)
    if len(shape) >= 2:
        yield "transposed", rand(*shape[:-2], shape[-1], shape[-2]).transpose(-1, -2)
    yield "gapped", rand(*shape[:-1], shape[-1] * 2)[..., ::2]
    n = 1
    for s in shape:
        n *= s
    yield "offset", rand(n + 1)[1:].view(shape)


def offset_copy(x):
    """A contiguous copy of x that starts one element past an aligned allocation (a
    misaligned pointer: the kernels' scalar path)."""
    out = torch.empty(x.numel() + 1, device=x.device, dtype=x.dtype)[1:].view(x.shape)
    return out.copy_(x)


def poison_next_alloc(nbytes, device):
    """Leave a NaN-filled block of `nbytes` in the CUDA caching allocator so the op's next
    output allocation of that size reuses it: an element the kernel never writes then
    reads back as NaN and fails the comparison."""
    if torch.device(device).type != "cuda" or nbytes == 0:
        return
    block = torch.full(((nbytes + 1) // 2,), float("nan"), dtype=torch.float16, device=device)
    del block


def cuda_kernel_names(fn):
    """The names of the events fn() records under the CUDA profiler (kernels are named by
    their function, CPU-side ops fused::...): for tests of which kernel a dispatch took."""
    skip_under_memcheck("the CUDA profiler")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events()]


def kernel_template_args(name, kernel):
    """The template arguments of `kernel` in a demangled kernel name, as strings in order
    (`kernel<float, fused::softmax::Fwd, 4, 8, 32, false, false>(...)`: ['float', ...,
    'false']), or None where the name is not an instance of it. Dispatch tests pick
    arguments by their position in the template's parameter list, so a parameter appended
    to a template does not silently stop a pattern from matching."""
    start = name.find(kernel + "<")
    if start < 0:
        return None
    args, depth, cur = [], 0, ""
    for ch in name[start + len(kernel) + 1 :]:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            if depth == 0:
                return [*args, cur.strip()]
            depth -= 1
        elif ch == "," and depth == 0:
            args.append(cur.strip())
            cur = ""
            continue
        cur += ch
    return None


def capture_graph(step):
    """(graph, outputs) of step() captured in a CUDA graph, after a warm-up on a side stream
    that keeps launch-shape queries and allocations out of the capture."""
    skip_under_memcheck("CUDA graph capture")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    return graph, outs


def assert_graph_replay_matches_eager(step, refill, names, msg="", rounds=2):
    """Capture step() (a tuple of output tensors) in a CUDA graph, after a warm-up on a side
    stream that keeps launch-shape queries and allocations out of the capture; then `rounds`
    times refill() the captured inputs in place, replay, and compare every output bit for
    bit with an eager step() on the same data."""
    graph, outs = capture_graph(step)
    for _ in range(rounds):
        with torch.no_grad():
            refill()
        graph.replay()
        for name, got, want in zip(names, outs, step()):
            assert torch.equal(got, want), f"{msg}: replayed {name} differs from eager"
