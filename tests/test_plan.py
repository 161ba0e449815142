"""The dispatch plans (csrc/cuda/<op>/plan.h) checked directly, on CPU, through the debug op
torch.ops.fused._plan: which kernel family and launch shape a problem gets on a given GPU with
given overrides. The boundaries between kernel families, odd widths and misaligned pointers
(the scalar path), dtypes, and each override; and, on a GPU, that the kernels an op launches
are its plan's (test_norm.py and test_softmax.py check the launches in more detail)."""

import os
import re
import subprocess
import sys

import pytest
import torch

import fused_ops  # noqa: F401  (registers torch.ops.fused)

from utils import CUDA, cuda_kernel_names, overrides

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32


def plan(op, rows, cols, dtype, options="", sm=90, num_sms=132, sm90_code=True, spec=""):
    """The plan's steps, each a dict: {"kernel": name, field: int, ...}."""
    text = torch.ops.fused._plan(op, rows, cols, dtype, options, sm, num_sms, sm90_code, spec)
    steps = []
    for line in text.splitlines():
        name, *fields = line.split()
        steps.append({"kernel": name, **{k: int(v) for k, v in (f.split("=") for f in fields)}})
    return steps


def kernels(steps):
    return [s["kernel"] for s in steps]


def only(steps):
    assert len(steps) == 1, steps
    return steps[0]


# ---- norm forward -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize(
    "cols,tpr", [(1024, 32), (3072, 96), (4096, 128), (5120, 160), (12288, 384), (16384, 512)]
)
def test_norm_fwd_fixed_lengths(dtype, cols, tpr):
    for opts in ("", "rms", "residual", "rms,residual"):
        s = only(plan("norm_fwd", 1000, cols, dtype, opts))
        assert s["kernel"] == "norm_fwd_fixed", (cols, opts, s)
        assert (s["fixed"], s["threads"], s["blocks"], s["vec"], s["vpt"]) == (tpr, tpr, 1000, 8, 4)
        assert s["layer"] == ("rms" not in opts) and s["res"] == ("residual" in opts)
    # The override, float32 parameters, a float32 residual stream, a length off the list:
    # the run-time-shaped kernel; a misaligned pointer: the span path (4 vectors a thread);
    # pointers at different offsets: the scalar path (8 elements a thread, past 8K columns
    # norm_fwd_long).
    for opts, spec in (("", "norm.fixed=0"), ("weight_fp32", ""), ("residual,rows_fp32", "")):
        assert kernels(plan("norm_fwd", 1000, cols, dtype, opts, spec=spec)) == ["norm_fwd_regs"]
    assert kernels(plan("norm_fwd", 1000, cols + 8, dtype)) == ["norm_fwd_regs"]
    s = only(plan("norm_fwd", 1000, cols, dtype, "unaligned"))
    assert (s["kernel"], s["vec"], s["vpt"], s["span"]) == ("norm_fwd_regs", 8, 4, 1)
    s = only(plan("norm_fwd", 1000, cols, dtype, "unaligned,mixed"))
    assert s["vec"] == 1
    assert s["kernel"] == ("norm_fwd_regs" if cols <= 8192 else "norm_fwd_long")
    assert kernels(plan("norm_fwd", 1000, cols, F32)) != ["norm_fwd_fixed"]


def test_norm_fwd_fixed_row_limit():
    # a grid of one block a row: up to 2^30 rows
    assert kernels(plan("norm_fwd", 2**30, 4096, BF16)) == ["norm_fwd_fixed"]
    assert kernels(plan("norm_fwd", 2**30 + 1, 4096, BF16)) == ["norm_fwd_regs"]


@pytest.mark.parametrize(
    "cols,tpr,threads",
    [(8, 1, 128), (64, 2, 128), (256, 8, 128), (1000, 32, 128), (1032, 64, 64), (4104, 160, 160)],
)
def test_norm_fwd_regs_groups(cols, tpr, threads):
    # 16-bit rows on the 16-byte path, 4 vectors a thread: a power-of-two group of <= 32
    # threads, several a 128-thread block, or whole warps a block.
    s = only(plan("norm_fwd", 1000, cols, BF16))
    assert s["kernel"] == "norm_fwd_regs" and s["vpt"] == 4 and s["vec"] == 8
    assert (s["tpr"], s["threads"]) == (tpr, threads)
    assert s["blocks"] == -(-1000 // (threads // tpr))
    assert (s["layer"], s["res"]) == (1, 0)


@pytest.mark.parametrize("cols", [4100, 1001, 7])
def test_norm_fwd_scalar_path(cols):
    # odd widths whose pointers sit at different offsets: elements, 8 a thread, the flags
    # read at run time (-1)
    s = only(plan("norm_fwd", 10, cols, F16, "residual,mixed"))
    need = -(-cols // 8)
    want = 1 << (need - 1).bit_length() if need <= 32 else -(-need // 32) * 32
    assert (s["kernel"], s["vec"], s["vpt"], s["layer"], s["res"], s["tpr"]) == (
        "norm_fwd_regs",
        1,
        8,
        -1,
        -1,
        want,
    )
    assert only(plan("norm_fwd", 10, 4096, F16, "unaligned,mixed"))["vec"] == 1


def _span_plan(op, dtype, cols, opts):
    """(steps, vector width, span vectors) of rows off the grid: odd widths as they are,
    whole-vector widths through a misaligned pointer."""
    vw = 16 // dtype.itemsize
    s = plan(op, 1000, cols, dtype, opts + (",unaligned" if cols % vw == 0 else ""))
    return s, vw, (cols + 2 * vw - 2) // vw


# Rows off the 16-byte grid (odd widths, views at odd offsets) whose row tensors share an
# offset: norm_fwd_regs' span variant, the row plus up to two partial vectors, 4 vectors a
# thread up to 1024 threads, then 8 (the add forms: the residual staged); past that the
# scalar path.
@pytest.mark.parametrize("dtype", [BF16, F16, F32])
@pytest.mark.parametrize("cols", [1, 7, 1001, 4095, 4096, 4097, 5121, 8190, 32001, 50257])
@pytest.mark.parametrize("opts", ["", "rms", "residual", "rms,residual", "weight_fp32"])
def test_norm_fwd_span(dtype, cols, opts):
    if dtype == F32 and "weight_fp32" in opts:
        return
    s, vw, nvec = _span_plan("norm_fwd", dtype, cols, opts)
    need, need_wide = -(-nvec // 4), -(-nvec // 8)
    if need_wide > 1024:
        assert all(st["vec"] == 1 and "span" not in st for st in s), s
        return
    st = s[0]
    assert (st["kernel"], st["vec"], st["span"]) == ("norm_fwd_regs", vw, 1), s
    assert st["layer"] == ("rms" not in opts) and st["fixed"] == 0
    if need <= 1024:
        assert st["vpt"] == 4 and st["res"] == ("residual" in opts)
        assert st["tpr"] == (1 << (need - 1).bit_length() if need <= 32 else -(-need // 32) * 32)
        assert len(s) == 1
    else:
        assert st["vpt"] == 8 and st["tpr"] == -(-need_wide // 32) * 32
        if "residual" in opts:  # refused where the staged residual does not fit: scalar
            assert st["res"] == 2 and st["smem"] == 8 * st["tpr"] * 16
            assert [(x["kernel"], x["vec"]) for x in s[1:]] == [("norm_fwd_long", 1)]
        else:
            assert len(s) == 1 and st["res"] == 0
    # a float32 residual stream with 16-bit x, pointers at different offsets: no span
    if dtype != F32:
        r = plan("norm_fwd", 1000, cols, dtype, opts + ",residual,rows_fp32,unaligned")
        assert all(x.get("span", 0) == 0 for x in r)
    m = plan("norm_fwd", 1000, cols, dtype, opts + ",unaligned,mixed")
    assert all(x["vec"] == 1 and x.get("span", 0) == 0 for x in m)


# The backward's span path: norm_bwd_regs' prefetching variant (32 bytes of row a thread) while
# the span fits 512 threads, never staged; else the scalar path.
@pytest.mark.parametrize("dtype", [BF16, F16, F32])
@pytest.mark.parametrize("cols", [1, 7, 1001, 4095, 4096, 4097, 5121, 8190, 8192, 32001])
@pytest.mark.parametrize("opts", ["", "rms", "dsum", "rms,dsum,grads=0", "weight_fp32"])
def test_norm_bwd_span(dtype, cols, opts):
    if dtype == F32 and "weight_fp32" in opts:
        return
    s, vw, nvec = _span_plan("norm_bwd", dtype, cols, opts)
    pf_vpt = 32 // (vw * dtype.itemsize)
    need = -(-nvec // pf_vpt)
    if need > 512:
        assert all(st["vec"] == 1 and "span" not in st for st in s), s
        return
    st = only(s)
    assert (st["kernel"], st["vec"], st["span"], st["pf"], st["stages"]) == (
        "norm_bwd_regs",
        vw,
        1,
        1,
        0,
    )
    assert st["vpt"] == pf_vpt and st["res"] == ("dsum" in opts)
    assert st["tpr"] == (1 << (need - 1).bit_length() if need <= 32 else -(-need // 32) * 32)
    if dtype != F32:
        r = plan("norm_bwd", 1000, cols, dtype, opts + ",rows_fp32,unaligned")
        assert all(x.get("span", 0) == 0 for x in r)
    m = plan("norm_bwd", 1000, cols, dtype, opts + ",unaligned,mixed")
    assert all(x["vec"] == 1 and x.get("span", 0) == 0 for x in m)


def test_norm_fwd_wide_boundary():
    # 16-bit plain rows past 512 threads at 4 vectors (16384 columns) take 8 vectors a thread;
    # shaped at compile time at 24576 / 32768 / 65536; past 1024 threads at 8: norm_fwd_long.
    s = only(plan("norm_fwd", 100, 16392, BF16))
    assert (s["kernel"], s["vpt"], s["fixed"], s["tpr"]) == ("norm_fwd_regs", 8, 0, 288)
    for cols, tpr in ((24576, 384), (32768, 512), (65536, 1024)):
        s = only(plan("norm_fwd", 100, cols, BF16, "rms"))
        assert (s["kernel"], s["vpt"], s["fixed"], s["threads"], s["layer"]) == (
            "norm_fwd_regs(fixed)",
            8,
            tpr,
            tpr,
            0,
        )
        s = only(plan("norm_fwd", 100, cols, BF16, "weight_fp32"))  # not at compile time
        assert (s["kernel"], s["vpt"], s["fixed"]) == ("norm_fwd_regs", 8, 0)
    assert kernels(plan("norm_fwd", 100, 65544, BF16)) == ["norm_fwd_long"]
    s = only(plan("norm_fwd", 100, 65544, BF16, num_sms=20))
    assert (s["threads"], s["blocks"]) == (512, 80)  # 4 blocks an SM, at most
    # 16384 with the fixed kernels off: 512 threads at 4 vectors
    s = only(plan("norm_fwd", 100, 16384, BF16, spec="norm.fixed=0"))
    assert (s["kernel"], s["vpt"], s["tpr"]) == ("norm_fwd_regs", 4, 512)


def test_norm_fwd_float32():
    # float32 layer norm rows of 8192: the wide variant at 256 threads; not rms_norm's
    s = only(plan("norm_fwd", 100, 8192, F32))
    assert (s["kernel"], s["fixed"], s["vpt"]) == ("norm_fwd_regs(fixed)", 256, 8)
    s = only(plan("norm_fwd", 100, 8192, F32, "rms"))
    assert (s["kernel"], s["vpt"], s["tpr"]) == ("norm_fwd_regs", 4, 512)
    for cols, tpr in ((12288, 384), (16384, 512), (32768, 1024)):
        assert only(plan("norm_fwd", 100, cols, F32))["fixed"] == tpr
    assert kernels(plan("norm_fwd", 100, 32776, F32)) == ["norm_fwd_long"]


@pytest.mark.parametrize(
    "dtype,cols,res32,want,fixed",
    [
        (F32, 32768, False, "staged", 1024),
        (F32, 20004, False, "staged", 0),
        (F32, 16388, False, "staged", 0),
        (F32, 16384, False, "regs", 0),
        (F32, 32776, False, "long", 0),
        (BF16, 65536, False, "staged", 1024),
        (F16, 40008, False, "staged", 0),
        (BF16, 65544, False, "long", 0),
        (BF16, 40008, True, "long", 0),
        (BF16, 32768, False, "regs", 1024),
    ],
)
def test_norm_fwd_add_forms(dtype, cols, res32, want, fixed):
    # The add forms' rows past 4 vectors a thread: the wide variant with the residual staged
    # in shared memory (RES = 2), refused where that does not fit (then norm_fwd_long).
    steps = plan("norm_fwd", 6, cols, dtype, "residual" + (",rows_fp32" if res32 else ""))
    if want == "staged":
        assert kernels(steps) == ["norm_fwd_regs", "norm_fwd_long"]
        s = steps[0]
        assert (s["vpt"], s["res"], s["fixed"]) == (8, 2, fixed)
        assert s["smem"] == 8 * s["tpr"] * 16
    elif want == "long":
        assert kernels(steps) == ["norm_fwd_long"]
    else:
        s = only(steps)
        assert (s["kernel"], s["vpt"], s["res"], s["fixed"]) == ("norm_fwd_regs", 4, 1, fixed)
    # 16-bit x with float32 parameters: never shaped at compile time
    if dtype != F32:
        steps = plan("norm_fwd", 6, cols, dtype, "residual,weight_fp32")
        assert all(s["fixed"] == 0 for s in steps)


# ---- norm backward ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [BF16, F16])
def test_norm_bwd_warp(dtype):
    # 16-bit rows of 256..512 columns: a warp a row, then (if refused) norm_bwd_regs
    for cols, vpt in ((256, 1), (264, 2), (512, 2)):
        steps = plan("norm_bwd", 4096, cols, dtype)
        assert kernels(steps) == ["norm_bwd_warp", "norm_bwd_regs"], cols
        s = steps[0]
        assert (s["vpt"], s["pf"], s["threads"], s["res"]) == (vpt, 1, 512, 0)
        assert s["smem"] == 16 * vpt * 2 * 32 * 2 * 16  # two terms, 16 warps
        assert s["blocks"] == 4096 // 16
    s = plan("norm_bwd", 4096, 512, dtype, "dsum,grads=1")[0]  # the add forms: no prefetch
    assert (s["pf"], s["threads"], s["res"], s["smem"]) == (0, 768, 1, 16 * 2 * 2 * 32 * 24)
    for cols in (248, 520):
        assert "norm_bwd_warp" not in kernels(plan("norm_bwd", 4096, cols, dtype))
    for opts in ("weight_fp32", "rows_fp32", "unaligned"):
        assert "norm_bwd_warp" not in kernels(plan("norm_bwd", 4096, 512, dtype, opts))
    assert kernels(plan("norm_bwd", 4096, 512, dtype, spec="norm.bwd_warp=0")) == ["norm_bwd_regs"]


def test_norm_bwd_warp_overrides():
    s = plan("norm_bwd", 4096, 512, BF16, spec="norm.bwd_pf=0")[0]
    assert (s["pf"], s["threads"]) == (0, 768)
    s = plan("norm_bwd", 4096, 512, BF16, "dsum", spec="norm.bwd_pf=1")[0]
    assert (s["pf"], s["threads"]) == (1, 512)
    s = plan("norm_bwd", 4096, 512, BF16, spec="norm.bwd_warps=3")[0]
    assert (s["threads"], s["blocks"]) == (96, -(-4096 // 3))
    s = plan("norm_bwd", 4096, 512, BF16, spec="norm.bwd_warps=20,norm.bwd_pf=0")[0]
    assert s["threads"] == 640
    with pytest.raises(RuntimeError, match="norm.bwd_warps=20 is past norm_bwd_warp's launch"):
        plan("norm_bwd", 4096, 512, BF16, spec="norm.bwd_warps=20")


def test_norm_bwd_bulk():
    # 16-bit rows of 520..1024 columns, sm_90: a row a pair of warps, 2..4 slots a pair
    for cols, dsum, stages in (
        (1024, False, 4),
        (1024, True, 4),
        (776, False, 4),
        (768, False, 3),
        (768, True, 2),
        (520, False, 3),
    ):
        steps = plan("norm_bwd", 4096, cols, BF16, "dsum" if dsum else "")
        assert kernels(steps) == ["norm_bwd_bulk", "norm_bwd_regs"], cols
        s = steps[0]
        assert (s["stages"], s["res"], s["threads"], s["blocks"]) == (stages, dsum, 256, 1024)
        assert s["smem"] == 4 * stages * (3 if dsum else 2) * 2048
    assert plan("norm_bwd", 4096, 1024, BF16, "rms")[0]["layer"] == 0
    assert plan("norm_bwd", 4096, 768, BF16, spec="norm.bwd_bulk_stages=4")[0]["stages"] == 4
    assert kernels(plan("norm_bwd", 4096, 1024, BF16, spec="norm.bwd_bulk=0")) == ["norm_bwd_regs"]
    assert kernels(plan("norm_bwd", 4096, 1024, BF16, sm=80, sm90_code=False)) == ["norm_bwd_regs"]
    assert kernels(plan("norm_bwd", 4096, 1032, BF16)) == ["norm_bwd_regs"]


@pytest.mark.parametrize(
    "dtype,cols,tpb,cs",
    [
        (BF16, 4096, 128, 2),
        (BF16, 5120, 160, 2),
        (F16, 8192, 256, 2),
        (BF16, 12288, 192, 4),
        (F16, 16384, 256, 4),
        (BF16, 32768, 256, 8),
        (F32, 12288, 192, 8),
        (F32, 16384, 256, 8),
    ],
)
def test_norm_bwd_fixed(dtype, cols, tpb, cs):
    for opts in ("", "rms", "dsum", "rms,dsum,grads=0"):
        s = plan("norm_bwd", 1000, cols, dtype, opts)[0]
        assert (s["kernel"], s["fixed"], s["cluster"], s["lag"]) == ("norm_bwd_fixed", tpb, cs, 1)
        assert s["layer"] == ("rms" not in opts) and s["res"] == ("dsum" in opts)
        assert s["smem"] == 3 * 2 * 2 * tpb * 16
    off = [("", "norm.fixed=0", True), ("unaligned", "", True), ("", "", False)]
    if dtype != F32:  # float32 parameters are x's dtype there
        off.append(("weight_fp32", "", True))
    for opts, spec, sm90 in off:
        assert "norm_bwd_fixed" not in kernels(
            plan("norm_bwd", 1000, cols, dtype, opts, sm90_code=sm90, spec=spec)
        )


def test_norm_bwd_regs_and_beyond():
    # 16-bit rows up to 8K columns: the prefetching norm_bwd_regs (2 vectors a thread)
    s = only(plan("norm_bwd", 1000, 6144, BF16))
    assert (s["kernel"], s["vpt"], s["pf"], s["stages"], s["tpr"], s["threads"]) == (
        "norm_bwd_regs",
        2,
        1,
        0,
        384,
        384,
    )
    s = only(plan("norm_bwd", 1000, 64, BF16))  # short rows share a 128-thread block
    assert (s["tpr"], s["threads"], s["blocks"]) == (4, 128, 1000 // 32 + 1)
    # float32 rows up to 4K: staged first (refused where the ring does not fit), then unstaged
    steps = plan("norm_bwd", 1000, 2048, F32)
    assert kernels(steps) == ["norm_bwd_regs", "norm_bwd_regs"]
    assert [(s["stages"], s["pf"], s["vpt"]) for s in steps] == [(3, 1, 2), (0, 1, 2)]
    assert len(plan("norm_bwd", 1000, 2048, F32, spec="norm.stage=0")) == 1
    # float32 4K-8K: 16 elements a thread without prefetch
    s = only(plan("norm_bwd", 1000, 6144, F32))
    assert (s["vpt"], s["pf"], s["tpr"]) == (4, 0, 384)
    # 16-bit x with a float32 residual stream: staged (float32 rows)
    assert plan("norm_bwd", 1000, 2048, BF16, "rows_fp32")[0]["stages"] == 3
    # past one block: a cluster of up to 16 blocks (sm_90), else the two-pass kernels
    steps = plan("norm_bwd", 1000, 20000, BF16)
    assert kernels(steps) == ["norm_bwd_cluster", "norm_bwd_row_sums+norm_bwd_tiles"]
    c = steps[0]
    assert (c["cluster"], c["threads"], c["lag"], c["vpt"]) == (8, 320, 1, 1)
    assert plan("norm_bwd", 1000, 65536, BF16)[0]["cluster"] == 16
    assert kernels(plan("norm_bwd", 1000, 65544, BF16)) == ["norm_bwd_row_sums+norm_bwd_tiles"]
    assert kernels(plan("norm_bwd", 1000, 20000, BF16, sm=80, sm90_code=False)) == [
        "norm_bwd_row_sums+norm_bwd_tiles"
    ]
    assert plan("norm_bwd", 1000, 20000, F32)[0]["lag"] == 0


@pytest.mark.parametrize("cols", [1001, 4097, 8190])
def test_norm_bwd_scalar_path(cols):
    steps = plan("norm_bwd", 100, cols, F16, "mixed")
    s = steps[0]
    assert s["vec"] == 1
    if -(-cols // 16) <= 512:
        assert (s["kernel"], s["vpt"], s["pf"]) == ("norm_bwd_regs", 16, 0)
    else:
        assert s["kernel"] == "norm_bwd_cluster" and s["vpt"] == 8


# ---- softmax ------------------------------------------------------------------------------


def test_softmax_short_rows():
    s = only(plan("softmax_fwd", 16384, 1024, BF16))
    assert (s["kernel"], s["p"], s["tpr"], s["block"]) == ("softmax_kernel", 4, 32, 32)
    s = only(plan("softmax_fwd", 16384, 1024, BF16, spec="softmax.min_block=128"))
    assert (s["tpr"], s["block"], s["blocks"]) == (32, 128, 4096)
    # float32 forward rows of up to 1024 columns: 8 vectors a thread, a warp a row
    s = only(plan("softmax_fwd", 16384, 1024, F32))
    assert (s["p"], s["tpr"], s["block"]) == (8, 32, 32)
    s = only(plan("softmax_bwd", 16384, 1024, F32))  # not the backward
    assert (s["p"], s["tpr"], s["block"]) == (4, 64, 64)
    s = only(plan("softmax_fwd", 16384, 1024, F32, spec="softmax.min_block=64"))
    assert (s["p"], s["tpr"], s["block"]) == (4, 64, 64)
    s = only(plan("softmax_fwd", 100, 8, BF16))
    assert (s["tpr"], s["block"], s["blocks"]) == (1, 32, 4)


@pytest.mark.parametrize("dtype", [BF16, F32])
def test_softmax_block_rows(dtype):
    per = 32 if dtype == BF16 else 16  # columns a thread: 4 vectors
    for tpr in (128, 256, 512):
        s = only(plan("softmax_bwd", 100, tpr * per, dtype))
        assert (s["kernel"], s["tpr"], s["block"], s["blocks"]) == ("softmax_kernel", tpr, tpr, 100)
    steps = plan("softmax_bwd", 100, 1024 * per, dtype)
    assert kernels(steps) == ["softmax_cluster_kernel", "softmax_kernel"]
    assert (steps[0]["n"], steps[0]["p"], steps[1]["block"]) == (2, 4, 1024)
    assert kernels(plan("softmax_bwd", 100, 1024 * per, dtype, spec="softmax.cluster=0")) == [
        "softmax_kernel"
    ]


# Rows of (2, 3] x tpr 16-byte vectors, tpr = 128..512 the power-of-two group of 4-vector
# threads: tpr / 2 threads of 6 vectors (4-6 live each) instead of tpr threads with 2-3 live.
# (cols, dtype, options, tpr of the 6-vector shape, span form)
WIDE_ROWS = [
    (4097, BF16, "", 128, 1),  # span 513 vectors
    (4095, BF16, "", 128, 1),
    (4095, F16, "unaligned", 128, 1),
    (5120, BF16, "", 128, 0),  # 640 whole vectors
    (5121, BF16, "", 128, 1),
    (3072, BF16, "", 64, 0),  # 384 vectors: 64 threads of 6
    (4097, F32, "", 256, 1),  # span 1025
    (4095, F32, "", 256, 1),
    (5120, F32, "", 256, 0),
    (5121, F32, "unaligned", 256, 1),
]


@pytest.mark.parametrize("cols,dtype,options,tpr,span_form", WIDE_ROWS)
def test_softmax_wide_rows(cols, dtype, options, tpr, span_form):
    for op in ("softmax_fwd", "softmax_bwd"):
        s = only(plan(op, 6552, cols, dtype, options))
        assert (s["kernel"], s["p"], s["tpr"], s["block"], s["blocks"], s["span"]) == (
            "softmax_kernel",
            6,
            tpr,
            tpr,
            6552,
            span_form,
        ), (op, s)
        # softmax.min_block past the group: that many threads, two rows a block
        if tpr == 64:
            s = only(plan(op, 6552, cols, dtype, options, spec="softmax.min_block=128"))
            assert (s["p"], s["tpr"], s["block"], s["blocks"]) == (6, 64, 128, 3276)
    # a causal mask keeps the 4-vector shape (its variant skips the masked vectors instead)
    s = only(
        plan("softmax_bwd", 6552, cols, dtype, ",".join(filter(None, (options, "causal_q=6552"))))
    )
    assert s["p"] == 4 and s["tpr"] == 2 * tpr, s


@pytest.mark.parametrize("dtype,per", [(BF16, 32), (F32, 16)])
def test_softmax_wide_rows_bounds(dtype, per):
    # 3 x tpr vectors is the last row of the 6-vector shape, one vector more takes 4 x tpr
    # (75-100% of its vectors); rows that fill their 4-vector block keep it (16384x4096)
    vec = per // 4
    for tpr in (128, 256, 512):
        s = only(plan("softmax_bwd", 100, 3 * tpr * vec, dtype))
        assert (s["p"], s["tpr"]) == (6, tpr // 2), s
        s = only(plan("softmax_bwd", 100, (3 * tpr + 1) * vec, dtype))
        assert (s["p"], s["tpr"]) == (4, tpr), s
    s = only(plan("softmax_fwd", 16384, 4096, dtype))
    assert (s["p"], s["tpr"]) == (4, 4096 // per), s
    # the scalar path keeps 8 elements a thread
    steps = plan("softmax_fwd", 100, 4097, dtype, "mixed")
    assert all((s["vec"], s["p"]) == (1, 8) for s in steps), steps


def span(cols, vec, whole=False):
    # The 16-byte vectors a row's span covers at most (plan.h span_vectors).
    return cols // vec if whole else (cols + 2 * vec - 2) // vec


@pytest.mark.parametrize("dtype,vec", [(BF16, 8), (F16, 8), (F32, 4)])
@pytest.mark.parametrize("cols", [1, 7, 1000, 1001, 4095, 4097, 5121, 32001, 50257, 151936])
def test_softmax_odd_lengths_vectorised(dtype, vec, cols):
    # Any length, any offset (the same offset in every tensor): the 16-byte path over each
    # row's span, sized as an aligned row of span(cols) vectors would be.
    for opts in ("", "unaligned"):
        for op in ("softmax_fwd", "softmax_bwd"):
            steps = plan(op, 1000, cols, dtype, opts)
            assert all(s["vec"] == vec for s in steps), (op, opts, steps)
            # the kernels and launch shapes of the aligned row of as many vectors, but for the
            # cluster kernel, whose 2P (copy-engine) shape takes rows of whole vectors only
            whole = opts == "" and cols % vec == 0
            ref = plan(op, 1000, span(cols, vec, whole) * vec, dtype)

            def shapes(steps):
                return [
                    (s["kernel"], s["p"], s["tpr"], s["block"], s["n"])
                    for s in steps
                    if s["kernel"] != "softmax_cluster_kernel"
                ]

            assert shapes(steps) == shapes(ref), (op, opts, steps, ref)
            # the kernels' span form (heads, masked edges) exactly where rows are not whole
            # vectors on the grid; rows that are keep the code measured before it
            assert all(s["span"] == (not whole) for s in steps), (op, opts, steps)
            assert all(s["span"] == 0 for s in ref)
            if not whole:
                # neither the compile-time-shaped staged kernel nor the 2P cluster shape
                assert all(s["fixed"] == 0 for s in steps)
                assert all(s["p"] == 4 for s in steps if s["kernel"] == "softmax_cluster_kernel"), (
                    steps
                )
    # pointers at different offsets in their 16-byte chunks: the scalar path
    assert all(s["vec"] == 1 for s in plan("softmax_fwd", 1000, cols, dtype, "mixed"))


def test_softmax_odd_lengths():
    s = only(plan("softmax_fwd", 100, 1001, BF16, "mixed"))  # scalar path: 8 elements a thread
    assert (s["vec"], s["p"], s["tpr"], s["block"]) == (1, 8, 128, 128)
    s = only(plan("softmax_fwd", 100, 1001, BF16))  # 126 vectors (the span): 32 threads of 4
    assert (s["vec"], s["p"], s["tpr"], s["block"]) == (8, 4, 32, 32)
    assert only(plan("softmax_fwd", 100, 1024, BF16, "unaligned"))["vec"] == 8
    assert only(plan("softmax_fwd", 100, 1024, BF16, "mixed"))["vec"] == 1
    # 4096x32001 bf16: the staged kernel, one share of the span's 4001 vectors, shaped at
    # run time (32000: 4000 vectors, the same kernel)
    s = plan("softmax_fwd", 4096, 32001, BF16)[0]
    assert (s["kernel"], s["n"], s["fixed"], s["share"], s["vec"]) == (
        "softmax_fwd_staged",
        1,
        0,
        4001,
        8,
    )
    s = plan("softmax_fwd", 4096, 32001, F32)[0]  # 8001 vectors: two shares
    assert (s["kernel"], s["n"], s["share"], s["vec"]) == ("softmax_fwd_staged", 2, 4001, 4)
    # a causal forward off the grid: softmax_kernel's causal variant, not softmax_causal_fwd
    s = only(plan("softmax_fwd", 4096, 2047, BF16, "causal_q=2048"))
    assert (s["kernel"], s["vec"], s["causal"]) == ("softmax_kernel", 8, 1)
    steps = plan("softmax_bwd", 1000, 1000001, F32, "mixed")
    assert kernels(steps) == ["softmax_kernel(split)"]  # past 16 clusters of 512 x 8
    assert (steps[0]["n"], steps[0]["block"], steps[0]["vec"]) == (-(-1000001 // 4096), 512, 1)
    steps = plan("softmax_bwd", 1000, 40001, F32, "mixed")
    assert kernels(steps) == ["softmax_cluster_kernel", "softmax_kernel(split)"]
    assert steps[0]["n"] == 10 and steps[0]["p"] == 8
    # the 16-byte path: 10001 vectors, clusters of 512 x 4 (5 blocks); no 2P shape off the grid
    steps = plan("softmax_bwd", 1000, 40001, F32)
    assert kernels(steps) == ["softmax_cluster_kernel", "softmax_kernel(split)"]
    assert (steps[0]["n"], steps[0]["p"], steps[0]["vec"]) == (5, 4, 4)
    # 262151 bf16: 32770 vectors, 17 blocks of 512 x 4 (the 8 x 8 shape is for whole rows):
    # split
    assert kernels(plan("softmax_bwd", 64, 262151, BF16)) == ["softmax_kernel(split)"]
    assert kernels(plan("softmax_bwd", 64, 262144, BF16, "unaligned")) == ["softmax_kernel(split)"]


def test_softmax_staged():
    # plain forward rows of 2049..65536 vectors, shares of at most 4096 vectors
    steps = plan("softmax_fwd", 64, 262144, BF16)
    assert kernels(steps) == [
        "softmax_fwd_staged",
        "softmax_cluster_kernel",
        "softmax_kernel(split)",
    ]
    assert (steps[0]["n"], steps[0]["fixed"], steps[0]["share"]) == (8, 8, 4096)
    # past softmax.max_cluster (8) blocks of 4 vectors: 8 blocks of 8 vectors
    assert (steps[1]["n"], steps[1]["p"]) == (8, 8)
    assert (lambda s: (s["n"], s["p"]))(
        plan("softmax_fwd", 64, 262144, BF16, spec="softmax.max_cluster=16")[1]
    ) == (16, 4)
    s = plan("softmax_fwd", 64, 300000, BF16)[0]  # uneven shares: shaped at run time
    assert (s["kernel"], s["n"], s["fixed"], s["share"]) == ("softmax_fwd_staged", 10, 0, 3750)
    s = plan("softmax_fwd", 64, 16392, BF16)[0]  # the shortest: 2049 vectors, one share
    assert (s["kernel"], s["n"], s["fixed"]) == ("softmax_fwd_staged", 1, 0)
    assert plan("softmax_fwd", 64, 16384, BF16)[0]["kernel"] == "softmax_kernel"
    assert plan("softmax_fwd", 64, 8200, F32)[0]["kernel"] == "softmax_fwd_staged"
    # not: the backward, a scale <= 0, a causal mask, more than 16 shares, the override, and
    # past one share without clusters
    for op, opts, cols, spec, sm90 in (
        ("softmax_bwd", "", 262144, "", True),
        ("softmax_fwd", "scale=-1", 262144, "", True),
        ("softmax_fwd", "causal_q=64", 262144, "", True),
        ("softmax_fwd", "", 524296, "", True),
        ("softmax_fwd", "", 262144, "softmax.staged=0", True),
        ("softmax_fwd", "", 262144, "softmax.cluster=0", True),
        ("softmax_fwd", "", 262144, "", False),
    ):
        assert "softmax_fwd_staged" not in kernels(
            plan(op, 64, cols, BF16, opts, sm90_code=sm90, spec=spec)
        ), (op, opts, cols, spec)
    # one share needs no cluster
    s = plan("softmax_fwd", 64, 32768, BF16, sm90_code=False)[0]
    assert s["kernel"] == "softmax_fwd_staged"


def test_softmax_causal():
    for cols, tpr in ((264, 32), (2048, 128), (16384, 1024)):
        s = only(plan("softmax_fwd", 4096, cols, BF16, "causal_q=2048"))
        assert (s["kernel"], s["tpr"], s["block"], s["p"]) == (
            "softmax_causal_fwd",
            tpr,
            max(128, tpr),
            2,
        )
        assert s["blocks"] == -(-4096 // max(1, 128 // tpr))
    # shorter rows, the override, float32, the backward: softmax_kernel's causal variant
    # (16-bit rows in blocks of up to 512 threads) or its plain form
    s = only(plan("softmax_fwd", 4096, 2048, F16, "causal_q=2048", spec="softmax.causal=0"))
    assert (s["kernel"], s["causal"], s["block"]) == ("softmax_kernel", 1, 64)
    assert only(plan("softmax_fwd", 4096, 256, BF16, "causal_q=256"))["causal"] == 1
    assert only(plan("softmax_fwd", 4096, 2048, F32, "causal_q=2048"))["causal"] == 0
    assert only(plan("softmax_bwd", 4096, 2048, BF16, "causal_q=2048"))["causal"] == 1
    assert plan("softmax_fwd", 64, 32768, BF16, "causal_q=64")[-1]["causal"] == 0  # 1024 threads


# ---- the debug op and the overrides -------------------------------------------------------


def test_plan_op_errors():
    with pytest.raises(RuntimeError, match="op must be norm_fwd, norm_bwd, softmax_fwd"):
        plan("gelu", 1, 1, F32)
    with pytest.raises(RuntimeError, match="unknown option 'bias'"):
        plan("norm_fwd", 1, 8, F32, "bias")
    with pytest.raises(RuntimeError, match="take float32, float16 and bfloat16"):
        plan("norm_fwd", 1, 8, torch.float64)
    with pytest.raises(RuntimeError, match="unknown key 'norm.fxed'"):
        plan("norm_fwd", 1, 8, F32, spec="norm.fxed=0")


def test_overrides_spec_and_errors():
    from fused_ops.overrides import current, set_spec

    base = current()
    with overrides("norm.fixed=0"):
        assert current().endswith("norm.fixed=0")
        with overrides("pdl=0"):
            assert current().endswith("norm.fixed=0,pdl=0")
        assert current().endswith("norm.fixed=0")
    assert current() == base
    for spec, msg in (
        ("norm.fxed=0", "unknown key 'norm.fxed'"),
        ("norm.fixed=yes", "norm.fixed must be 0 or 1, but got 'yes'"),
        ("softmax.min_block=48", "softmax.min_block must be 32, 64 or 128"),
        ("softmax.max_cluster=17", "softmax.max_cluster must be an integer from 2"),
        ("matmul.kernel=fastest", "matmul.kernel must be auto, portable or hopper"),
        ("matmul.group_m=0", "matmul.group_m must be an integer from 1 to 1024"),
        ("matmul.group_m=8x", "matmul.group_m must be"),
        ("norm.bwd_bulk_stages=5", "norm.bwd_bulk_stages must be auto, 2, 3 or 4"),
        ("pdl", "expected key=value"),
    ):
        with pytest.raises(RuntimeError, match=msg):
            set_spec(spec)
        assert current() == base  # a bad spec changes nothing
    with pytest.raises(RuntimeError, match="unknown key"):
        with overrides("nope=1"):
            pass
    assert current() == base
    # every key takes its documented values; the last of a key wins
    set_spec(
        " norm.fixed = 0 ,, norm.bwd_pf=auto,norm.bwd_warps=24,softmax.max_cluster=2,"
        "matmul.kernel=hopper,matmul.group_m=1024,pdl=1,norm.fixed=1"
    )
    set_spec(base)


def test_overrides_from_environment():
    code = "import fused_ops.overrides as o; print(o.current())"
    env = dict(os.environ, FUSED_OPS_OVERRIDES="norm.stage=0,pdl=0")
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "norm.stage=0,pdl=0"
    env["FUSED_OPS_OVERRIDES"] = "norm.stage=2"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert out.returncode != 0
    want = "FUSED_OPS_OVERRIDES='norm.stage=2': fused overrides: norm.stage must be 0 or 1"
    assert want in out.stderr


# ---- on the GPU: the kernels launched are the plan's ---------------------------------------


def _device_plan(op, rows, cols, dtype, options=""):
    p = torch.cuda.get_device_properties(0)
    # sm_90 code runs on a compute capability 9.0 GPU of a build with sm_90a (the default)
    return plan(
        op,
        rows,
        cols,
        dtype,
        options,
        sm=p.major * 10 + p.minor,
        num_sms=p.multi_processor_count,
        sm90_code=(p.major, p.minor) == (9, 0),
    )


def _launched(call, prefix):
    """The kernels call() launches whose names start with prefix (the CPU-side op events,
    fused::..., have no template arguments)."""
    found = (re.search(r"\b(%s\w*)<" % prefix, n) for n in cuda_kernel_names(call))
    return {m.group(1) for m in found if m}


def _planned(steps):
    """Each step's kernels, by name without the plan's qualifiers."""
    return [set(s["kernel"].split("(")[0].split("+")) for s in steps]


@CUDA
@pytest.mark.parametrize(
    "dtype,cols,opts",
    [
        (BF16, 4096, ""),
        (BF16, 4096, "residual"),
        (F16, 24576, "rms"),
        (BF16, 16392, ""),
        (BF16, 65544, ""),
        (F32, 8192, ""),
        (F32, 20004, "residual"),
        (BF16, 4100, ""),
        (BF16, 40008, "residual,rows_fp32"),
    ],
)
def test_cuda_norm_launches_plan(dtype, cols, opts):
    rows = 64
    x = torch.randn(rows, cols, device="cuda", dtype=dtype)
    r = torch.randn(
        rows, cols, device="cuda", dtype=torch.float32 if "rows_fp32" in opts else dtype
    )
    w = torch.randn(cols, device="cuda", dtype=dtype)
    if "residual" in opts:
        fwd = lambda: torch.ops.fused.add_layer_norm(
            x,
            r,
            [cols],
            w,
            w,
            1e-5,  # noqa: E731
            "rows_fp32" in opts,
        )
    else:
        fwd = lambda: torch.ops.fused.rms_norm(x, [cols], w, 1e-5)  # noqa: E731
    want = _planned(_device_plan("norm_fwd", rows, cols, dtype, opts))
    got = _launched(fwd, "norm_")
    assert got in want, (got, want)
    _, mean, rstd = torch.ops.fused.layer_norm(x, [cols], w, w, 1e-5)
    bwd = lambda: torch.ops.fused.layer_norm_backward(
        torch.randn_like(x),
        x,
        [cols],  # noqa: E731
        mean,
        rstd,
        w,
        w,
        [True, True],
    )
    want = _planned(_device_plan("norm_bwd", rows, cols, dtype))
    got = _launched(bwd, "norm_")
    assert got in want, (got, want)


@CUDA
@pytest.mark.parametrize(
    "dtype,cols,causal",
    [
        (BF16, 1024, False),
        (F32, 1024, False),
        (BF16, 32768, False),
        (BF16, 262144, False),
        (F32, 1000001, False),
        (BF16, 2048, True),
        (F16, 256, True),
        (BF16, 1001, False),
    ],
)
def test_cuda_softmax_launches_plan(dtype, cols, causal):
    rows = 2048 if causal else 8
    x = torch.randn(1, rows, cols, device="cuda", dtype=dtype)
    opts = f"causal_q={rows}" if causal else ""
    want = _planned(_device_plan("softmax_fwd", rows, cols, dtype, opts))
    got = _launched(lambda: torch.ops.fused.softmax(x, -1, causal=causal), "softmax_")
    assert got in want, (got, want)
    want = _planned(_device_plan("softmax_bwd", rows, cols, dtype, opts))
    got = _launched(lambda: torch.ops.fused.softmax_backward(x, x, -1, causal=causal), "softmax_")
    assert got in want, (got, want)
