"""The benchmark and profiler harness, without a GPU: parsing, case discovery, byte
formulas, the measurement loop on CPU with a stand-in timer, the report builders, and the
one-line exit of run.py / trace.py where no GPU is visible."""

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import harness, report  # noqa: E402
from benchmarks.cases import gelu as gelu_cases  # noqa: E402
from benchmarks.harness import Case  # noqa: E402

from utils import CUDA  # noqa: E402


def _load_trace_module():
    # profiling/trace.py by path: "trace" is also a standard-library module name.
    spec = importlib.util.spec_from_file_location(
        "fused_ops_profiling_trace", os.path.join(ROOT, "profiling", "trace.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


trace_mod = _load_trace_module()


# --- parsing -------------------------------------------------------------------------


def test_parse_shapes():
    assert harness.parse_shape("16384x4096") == (16384, 4096)
    assert harness.parse_shape(" 8X16x2048x2048 ") == (8, 16, 2048, 2048)
    assert harness.parse_shapes("16384x4096,4096x32768,") == [(16384, 4096), (4096, 32768)]
    for bad in ["", "16384x", "axb", "3x-1"]:
        with pytest.raises(ValueError, match="expected sizes joined by 'x'"):
            harness.parse_shape(bad)


def test_parse_dtypes_and_names():
    assert harness.parse_dtypes("bf16, fp16,float32") == [
        torch.bfloat16,
        torch.float16,
        torch.float32,
    ]
    with pytest.raises(ValueError, match="unknown dtype 'int8'"):
        harness.parse_dtypes("int8")
    assert harness.dtype_name(torch.bfloat16) == "bfloat16"
    assert harness.shape_str((4096, 32768)) == "4096x32768"
    assert harness.sanitize_name("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert harness.sanitize_name("NVIDIA H200") == "nvidia-h200"


# --- the Case interface and discovery ----------------------------------------------------


def _toy_case(**kw):
    args = dict(
        op="toy",
        variant="v",
        shapes=[(4, 8), (2, 16)],
        quick_shapes=[(2, 16)],
        dtypes=[torch.float32, torch.bfloat16],
        passes=("fwd", "fwd+bwd"),
        make_inputs=lambda shape, dtype, device: {"x": torch.randn(shape, device=device).to(dtype)},
        grad_inputs=("x",),
        impls={"fused": lambda x: x * 2, "native": lambda x: x + x, "unfused": lambda x: x * 1 + x},
        bytes=lambda shape, dtype, pass_: 2 * shape[0] * shape[1] * dtype.itemsize,
    )
    args.update(kw)
    return Case(**args)


def test_case_defaults_and_required_fields():
    c = Case(
        op="x", shapes=[[1, 2]], make_inputs=lambda *a: {}, impls={"fused": id}, bytes=lambda *a: 0
    )
    assert c.variant == "" and c.shapes == [(1, 2)] and c.quick_shapes == [(1, 2)]
    assert c.passes == ("fwd", "fwd+bwd") and c.flops is None and c.grad_inputs == ()
    assert torch.bfloat16 in c.dtypes
    with pytest.raises(TypeError, match="'bytes' is required"):
        Case(op="x", shapes=[(1,)], make_inputs=lambda *a: {}, impls={})
    with pytest.raises(ValueError, match="unknown pass"):
        _toy_case(passes=("backward",))
    # "compile" follows "unfused"; extra competitors come last.
    c = _toy_case(impls={"cublaslt": id, "unfused": id, "fused": id, "native": id})
    assert c.impl_names() == ["fused", "native", "unfused", "compile", "cublaslt"]
    assert _toy_case(impls={"fused": id}).impl_names() == ["fused"]


def test_discovery_finds_gelu():
    cases = harness.discover_cases()
    gelu = [c for c in cases if c.op == "gelu"]
    assert sorted(c.variant for c in gelu) == ["none", "tanh"]
    for c in gelu:
        assert c.module == "gelu"
        assert c.impl_names() == ["fused", "native", "unfused", "compile"]
        assert (8192, 8192) in c.shapes and (16384, 4096) in c.quick_shapes
        assert c.grad_inputs == ("x",)


def test_discovery_reports_a_broken_module_and_goes_on(tmp_path, monkeypatch):
    pkg = tmp_path / "fakecases"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "good.py").write_text(
        "import torch\nfrom benchmarks.harness import Case\n"
        "CASES = [Case(op='good', shapes=[(2,)], make_inputs=lambda s, d, dev: {},\n"
        "              impls={'fused': abs}, bytes=lambda s, d, p: 0)]\n"
    )
    (pkg / "bad.py").write_text("raise RuntimeError('op not built')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    warnings = []
    cases = harness.discover_cases("fakecases", warn=warnings.append)
    assert [c.op for c in cases] == ["good"]
    assert len(warnings) == 1 and "bad.py" in warnings[0] and "op not built" in warnings[0]


def test_select_filters():
    cases = [_toy_case(), _toy_case(op="other", variant="")]
    plans = harness.select(cases)
    assert len(plans) == 2 * 2 * 2 * 2  # cases x shapes x dtypes x passes
    assert harness.total_measurements(plans) == len(plans) * 4
    plans = harness.select(cases, ops=["toy"], quick=True)
    assert [(p.shape, p.dtype) for p in plans] == [((2, 16), torch.bfloat16)] * 2
    plans = harness.select(
        cases,
        ops=["toy/v"],
        shapes=[(3, 3), (1, 2, 3)],
        dtypes=[torch.float32],
        passes=["fwd"],
        impls=["fused", "compile"],
    )
    assert [(p.shape, p.dtype, p.pass_, p.impls) for p in plans] == [
        ((3, 3), torch.float32, "fwd", ["fused", "compile"])
    ]
    assert harness.select(cases, shapes=[(1, 2, 3)]) == []
    assert harness.select(cases, impls=["nonexistent"]) == []


def test_select_leaves_fwd_only_impls_out_of_the_backward_passes():
    impls = {
        "fused": lambda x: x * 2,
        "native": lambda x: x + x,
        "unfused": lambda x: x * 1 + x,
        "lt": lambda x: x * 2,
    }
    case = _toy_case(
        impls=impls,
        fwd_only=("lt",),
        passes=("fwd", "fwd+bwd", "bwd"),
        dtypes=[torch.float32],
        shapes=[(4, 8)],
    )
    by_pass = {p.pass_: p.impls for p in harness.select([case])}
    assert by_pass["fwd"] == ["fused", "native", "unfused", "compile", "lt"]
    assert by_pass["fwd+bwd"] == by_pass["bwd"] == ["fused", "native", "unfused", "compile"]
    with pytest.raises(ValueError, match="fwd_only names unknown impls"):
        _toy_case(fwd_only=("cublas",))
    # The shipped linear case: cuBLASLt's epilogue has no derivative, so no fwd+bwd record.
    from benchmarks.cases import matmul as matmul_cases

    linear = next(c for c in matmul_cases.CASES if c.op == "linear")
    plans = harness.select([linear], quick=True)
    assert ["cublaslt" in p.impls for p in plans] == [p.pass_ == "fwd" for p in plans]


# --- byte formulas ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype,size", [(torch.bfloat16, 2), (torch.float16, 2), (torch.float32, 4)]
)
def test_gelu_bytes(dtype, size):
    n = 16384 * 4096
    assert gelu_cases.gelu_bytes((16384, 4096), dtype, "fwd") == 2 * n * size
    assert gelu_cases.gelu_bytes((16384, 4096), dtype, "fwd+bwd") == 5 * n * size
    # The design notes' example: 16384x4096 bf16 forward moves 256 MiB.
    if dtype == torch.bfloat16:
        assert gelu_cases.gelu_bytes((16384, 4096), dtype, "fwd") == 256 * 2**20
    for shape in gelu_cases.SHAPES[1:]:  # all but the small one are >= 64 MB in bf16
        assert gelu_cases.gelu_bytes(shape, torch.bfloat16, "fwd") // 2 >= 64 * 2**20


def test_rates_and_speedups():
    case = _toy_case()
    r = harness.rates(case, (1000, 1000), torch.float32, "fwd", 8.0, {"copy_gbps": 2000.0})
    assert r["bytes"] == 8_000_000 and r["gbps"] == pytest.approx(1000.0)
    assert r["pct_of_peak"] == pytest.approx(50.0) and r["tflops"] is None
    mm = _toy_case(flops=lambda shape, pass_: 2 * shape[0] ** 3)
    r = harness.rates(
        mm, (1000, 1000), torch.float32, "fwd", 2000.0, {"copy_gbps": 2000.0, "mm_tflops": 2.0}
    )
    assert r["tflops"] == pytest.approx(1.0) and r["pct_of_peak"] == pytest.approx(50.0)
    assert harness.rates(case, (2, 2), torch.float32, "fwd", None, {})["gbps"] is None
    recs = [
        {"impl": "fused", "median_us": 50.0},
        {"impl": "native", "median_us": 100.0},
        {"impl": "compile", "median_us": None},
    ]
    harness.add_speedups(recs)
    assert recs[0]["x_vs_native"] == pytest.approx(2.0) and recs[0]["x_vs_compile"] is None
    assert recs[1]["x_vs_native"] == pytest.approx(1.0)


def test_summed_records_total_the_rows_every_impl_timed():
    def rec(variant, shape, impl, us, flops=1e9, group="train"):
        return {
            "op": "gemm_train",
            "variant": variant,
            "pass": "fwd",
            "shape": shape,
            "dtype": "bfloat16",
            "impl": impl,
            "median_us": us,
            "min_us": us,
            "wall_us": None,
            "flops": flops,
            "bytes": 10,
            "sum": group,
            "ceiling_mm_tflops": 100.0,
        }

    recs = [
        rec("fwd", [1, 2, 3], "fused", 10.0),
        rec("fwd", [1, 2, 3], "native", 20.0),
        rec("wgrad", [1, 2, 3], "fused", 30.0),
        rec("wgrad", [1, 2, 3], "native", 30.0),
        rec("dgrad", [4, 5, 6], "fused", None),  # failed: the row is left out of every sum
        rec("dgrad", [4, 5, 6], "native", 99.0),
        {**rec("decode", [1, 2, 3], "fused", 5.0), "sum": None},  # not in a sum
    ]
    out = harness.summed_records(recs)
    by_impl = {r["impl"]: r for r in out}
    assert set(by_impl) == {"fused", "native"}
    assert by_impl["fused"]["median_us"] == 40.0 and by_impl["native"]["median_us"] == 50.0
    assert by_impl["fused"]["x_vs_native"] == pytest.approx(1.25)
    assert by_impl["fused"]["tflops"] == pytest.approx(2e9 / 40e-6 / 1e12)
    assert (
        by_impl["fused"]["variant"] == "sum of train (2 rows)" and by_impl["fused"]["shape"] == []
    )
    assert by_impl["fused"]["pass"] == "fwd" and by_impl["fused"]["wall_us"] is None


def test_gemm_train_case_covers_a_training_step():
    from benchmarks.cases import gemm_train

    cases = {c.variant: c for c in gemm_train.CASES}
    assert {v: c.fields.get("layout") for v, c in cases.items()} == {
        "fwd": "NT",
        "dgrad": "NN",
        "wgrad": "TN",
        "decode": "NT",
    }
    assert all(c.fields.get("sum") == "train" for v, c in cases.items() if v != "decode")
    # Every layer's four weights, three GEMMs each (shapes of one kind may coincide).
    tokens, c = 8192, 4096
    for o, i in gemm_train.WEIGHTS.values():
        for kind in ("fwd", "dgrad", "wgrad"):
            assert gemm_train.gemm_shape(kind, tokens, o * c, i * c) in cases[kind].shapes
    assert (2048, 2048, 8192) in cases["wgrad"].shapes  # 2048^2 weight over 8192 tokens
    # The operands are views in autograd's layouts: no copies, the stated strides.
    for kind, want in (("fwd", (True, False)), ("dgrad", (True, True)), ("wgrad", (False, True))):
        a, b = gemm_train._operands(kind, (24, 16, 8), torch.bfloat16, "cpu")
        assert a.shape == (24, 8) and b.shape == (8, 16)
        assert (a.stride(1) == 1, b.stride(1) == 1) == want, kind
    assert {s[0] for s in cases["decode"].shapes} == {1, 16, 128}


# --- the measurement loop, on CPU with a stand-in timer ------------------------------------


class CpuTimer(harness.Timer):
    """Timer's own warm-up, rep count and summary on CPU: the CUDA parts (flush,
    synchronisation, event timing, memory) stubbed out; every repetition "takes" 100 us, so
    budget_ms=1 asks for 10 repetitions. warmup_ms=0: a warm-up is 1 + 3 calls, then the
    3-repetition estimate."""

    def __init__(self, budget_ms=1.0, min_reps=4, max_reps=2000):
        self.budget_ms, self.min_reps, self.max_reps = budget_ms, min_reps, max_reps
        self.warmup_ms = 0.0

    def sync(self):
        pass

    def flush(self):
        pass

    def timed(self, step, reps, host_us):
        for _ in range(reps):
            step()
        return [100.0] * reps

    def peak_memory(self, step):
        step()
        return 123

    def held_memory(self, forward):
        forward()
        return 456


WARM_UP_CALLS = 1 + 3 + 3
# Calls per wall-clock batch under CpuTimer: half of the 1 ms budget over 5 batches is
# 100 us, one 100 us estimate: 1 call, raised to min_reps.
WALL_CALLS = 4


class FakeClock:
    """A host clock that only moves when told: steps advance it by what they "cost"."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def advance(self, us):
        self.now += us * 1e-6


def test_make_step_fwd_bwd_gives_the_gradients():
    case = gelu_cases.CASES[1]  # tanh
    inputs = harness.make_inputs(case, (4, 8), torch.float64, "fwd+bwd", device="cpu")
    assert inputs["x"].requires_grad and inputs["x"].abs().sum() > 0
    step = harness.make_step(case.impls["fused"], inputs, "fwd+bwd", case.grad_inputs)
    (dx,) = step()
    assert inputs["x"].grad is None  # autograd.grad: nothing accumulated between reps
    # Same random output gradient for every implementation: the native one agrees.
    (dx_native,) = harness.make_step(case.impls["native"], inputs, "fwd+bwd", case.grad_inputs)()
    torch.testing.assert_close(dx, dx_native)
    fwd = harness.make_step(case.impls["fused"], inputs, "fwd")
    assert fwd().shape == (4, 8)


def test_make_step_bwd_times_the_backward_alone():
    # The bwd step runs no forward: it differentiates the outputs of one forward made when
    # the step was built, as often as it is called, and agrees with fwd+bwd's gradients.
    from benchmarks.cases import norm as norm_cases

    case = next(c for c in norm_cases.CASES if c.op == "layer_norm")
    assert "bwd" in case.passes
    inputs = harness.make_inputs(case, (6, 32), torch.float64, "bwd", device="cpu")
    calls = []

    def counted(**kw):
        calls.append(1)
        return case.impls["fused"](**kw)

    step = harness.make_step(counted, inputs, "bwd", case.grad_inputs)
    assert len(calls) == 1
    first, second = step(), step()
    assert len(calls) == 1  # no forward inside the step
    both = harness.make_step(case.impls["fused"], inputs, "fwd+bwd", case.grad_inputs)()
    for a, b, c in zip(first, second, both):
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(a, c)


def test_bwd_bytes_are_the_backward_share():
    from benchmarks.cases import norm as norm_cases
    from benchmarks.cases import softmax as softmax_cases

    for case in norm_cases.CASES + softmax_cases.CASES:
        assert "bwd" in case.passes, case.label
        for shape in case.shapes[:2]:
            f, b, fb = (case.bytes(shape, torch.bfloat16, p) for p in ("fwd", "bwd", "fwd+bwd"))
            assert 0 < f and 0 < b and f + b == fb, (case.label, shape)
    m, n = 4096, 8192
    layer = next(c for c in norm_cases.CASES if c.op == "layer_norm")
    # read x, dy, write dx; read w, write dw, db; read mean, rstd
    assert layer.bytes((m, n), torch.bfloat16, "bwd") == 3 * m * n * 2 + 3 * n * 2 + 8 * m
    sm = softmax_cases.CASES[0]
    assert sm.bytes((m, n), torch.bfloat16, "bwd") == 3 * m * n * 2


@pytest.mark.parametrize("rounds", [1, 3])
def test_run_plan_records_on_cpu(rounds):
    case = gelu_cases.CASES[0]
    plan = harness.Plan(case, (8, 16), torch.float32, "fwd+bwd", ["fused", "native", "unfused"])
    env = {"device": "cpu-test", "torch": "x"}
    seen = []
    recs = harness.run_plan(
        plan,
        CpuTimer(),
        {"copy_gbps": 100.0},
        env,
        on_impl=lambda p, i: seen.append(i),
        device="cpu",
        rounds=rounds,
    )
    assert seen == ["fused", "native", "unfused"]
    assert [r["impl"] for r in recs] == seen
    for r in recs:
        assert r["error"] is None and r["median_us"] == 100.0 and r["min_us"] == 100.0
        assert r["reps"] == (10 if rounds == 1 else 12) and r["rounds"] == rounds
        assert r["op"] == "gelu" and r["variant"] == "none" and r["pass"] == "fwd+bwd"
        assert r["shape"] == [8, 16] and r["dtype"] == "float32" and r["device"] == "cpu-test"
        assert r["bytes"] == 5 * 8 * 16 * 4
        assert r["gbps"] == pytest.approx(r["bytes"] / 100e-6 / 1e9)
        assert r["peak_mem_bytes"] == 123 and r["fwd_held_bytes"] == 456
        assert r["x_vs_native"] == pytest.approx(1.0)
    # A failing implementation is recorded, not raised.
    broken = _toy_case(impls={"fused": lambda x: x.no_such_method(), "native": lambda x: x})
    plan = harness.Plan(broken, (2, 2), torch.float32, "fwd", ["fused", "native"])
    recs = harness.run_plan(plan, CpuTimer(), {}, env, device="cpu", rounds=rounds)
    assert "AttributeError" in recs[0]["error"] and recs[0]["median_us"] is None
    assert recs[1]["error"] is None and recs[1]["median_us"] == 100.0


def test_interleave_rotates_and_splits_the_reps():
    reps = {"fused": 10, "native": 4, "cublaslt": 7}
    # One round: today's single block per implementation, in table order.
    assert harness.interleave(reps, 1) == [[("fused", 10), ("native", 4), ("cublaslt", 7)]]
    sched = harness.interleave(reps, 3)
    assert sched == [
        [("fused", 4), ("native", 2), ("cublaslt", 3)],
        [("native", 2), ("cublaslt", 3), ("fused", 4)],
        [("cublaslt", 3), ("fused", 4), ("native", 2)],
    ]
    # More rounds than implementations: the rotation wraps; each gets the same share every
    # round, at least one repetition, and at least its budget's count in all.
    sched = harness.interleave(reps, 8)
    assert [r[0][0] for r in sched] == ["fused", "native", "cublaslt"] * 2 + ["fused", "native"]
    for name, n in reps.items():
        shares = [dict(r)[name] for r in sched]
        assert len(set(shares)) == 1 and shares[0] >= 1 and sum(shares) >= n
        assert sum(shares) - n < 8  # rounded up to a multiple of the rounds, no more
    assert harness.interleave({"a": 1}, 4) == [[("a", 1)]] * 4
    assert harness.interleave({}, 3) == []
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        harness.interleave(reps, 0)


def _logging_case(log, names, fail_after=None):
    """A toy case whose implementations append their name to `log` on every call;
    "flaky" raises from its call number fail_after + 1 on."""

    def impl(name):
        def fn(x):
            log.append(name)
            if name == "flaky" and log.count(name) > fail_after:
                raise RuntimeError("flaky broke")
            return x * 2

        return fn

    return _toy_case(impls={n: impl(n) for n in names})


def _runs(log):
    """['a', 'a', 'b'] -> [('a', 2), ('b', 1)]."""
    out = []
    for name in log:
        if out and out[-1][0] == name:
            out[-1] = (name, out[-1][1] + 1)
        else:
            out.append((name, 1))
    return out


def test_run_plan_interleaves_in_rotating_rounds():
    log = []
    names = ["fused", "native", "cublaslt"]
    plan = harness.Plan(_logging_case(log, names), (2, 2), torch.float32, "fwd", names)
    recs = harness.run_plan(plan, CpuTimer(), {}, {}, device="cpu", rounds=3)
    # Every implementation warmed up first, then 3 rounds of 4 reps (10 rounded up), each
    # round starting one implementation later, then one peak-memory call each.
    f, n, c = names
    # Then the wall-clock batches (WALL_BATCHES of WALL_CALLS calls), also taking turns in
    # a rotating order, then one peak-memory call each.
    w = WALL_CALLS
    assert _runs(log) == [
        (f, WARM_UP_CALLS),
        (n, WARM_UP_CALLS),
        (c, WARM_UP_CALLS),
        (f, 4),
        (n, 4),
        (c, 4),
        (n, 4),
        (c, 4),
        (f, 4),
        (c, 4),
        (f, 4),
        (n, 4),
        (f, w),
        (n, w),
        (c, w),
        (n, w),
        (c, w),
        (f, w),
        (c, w),
        (f, w),
        (n, w),
        (f, w),
        (n, w),
        (c, w),
        (n, w),
        (c, w),
        (f, w + 1),
        (n, 1),
        (c, 1),
    ]
    assert [r["reps"] for r in recs] == [12, 12, 12]
    assert [r["wall_calls"] for r in recs] == [5 * w] * 3
    # rounds=1: one after another (warm-up, timing, wall clock, memory).
    log.clear()
    recs = harness.run_plan(plan, CpuTimer(), {}, {}, device="cpu", rounds=1)
    assert _runs(log) == [(name, WARM_UP_CALLS + 10 + 5 * w + 1) for name in names]
    assert [r["reps"] for r in recs] == [10, 10, 10]
    # wall=False: no wall-clock calls, and the records say so.
    log.clear()
    recs = harness.run_plan(plan, CpuTimer(), {}, {}, device="cpu", rounds=1, wall=False)
    assert _runs(log) == [(name, WARM_UP_CALLS + 10 + 1) for name in names]
    assert all(r["wall_us"] is None and r["x_vs_native_wall"] is None for r in recs)


def test_run_plan_drops_an_implementation_failing_mid_rounds():
    log = []
    names = ["fused", "native", "flaky"]
    case = _logging_case(log, names, fail_after=WARM_UP_CALLS + 2)  # fails in round 0
    plan = harness.Plan(case, (2, 2), torch.float32, "fwd", names)
    recs = harness.run_plan(plan, CpuTimer(), {}, {}, device="cpu", rounds=3)
    by = {r["impl"]: r for r in recs}
    assert "flaky broke" in by["flaky"]["error"] and by["flaky"]["median_us"] is None
    assert log.count("flaky") == WARM_UP_CALLS + 3  # never called again after it raised
    for name in ("fused", "native"):
        assert by[name]["error"] is None and by[name]["reps"] == 12
        assert by[name]["x_vs_native"] == pytest.approx(1.0)


def test_wall_clock_times_back_to_back_calls():
    # From the first launch to the synchronisation after the last, over the calls: the
    # synchronisations bracket the batch, and nothing (no flush, no sleep) runs between calls.
    timer, clock, log = CpuTimer(), FakeClock(), []
    timer.clock = clock
    timer.sync = lambda: (log.append("sync"), clock.advance(30.0))
    timer.flush = lambda: log.append("flush")

    def step():
        log.append("step")
        clock.advance(12.0)

    per_call = timer.wall_clock(step, 10)
    assert log == ["sync"] + ["step"] * 10 + ["sync"]
    # One closing synchronisation (30 us) is spread over the 10 calls; the opening one is
    # not counted (the GPU is idle when the batch starts).
    assert per_call == pytest.approx((10 * 12.0 + 30.0) / 10)
    # Calls per batch: the batch's share of the budget over the estimate, clamped.
    t = CpuTimer(budget_ms=100.0, min_reps=10, max_reps=2000)
    assert t.wall_calls(50.0) == int(100e3 * t.WALL_SHARE / t.WALL_BATCHES / 50.0)
    assert t.wall_calls(1e6) == 10 and t.wall_calls(0.001) == 2000


def _costed_case(clock, costs, fail=None):
    """A toy case whose implementations each advance `clock` by their cost per call;
    the one named `fail` raises in its wall-clock batches (from their second call on)."""
    calls = {}

    def impl(name):
        def fn(x):
            calls[name] = calls.get(name, 0) + 1
            wall_calls = WARM_UP_CALLS + 10 < calls[name] <= WARM_UP_CALLS + 10 + 5 * WALL_CALLS
            if name == fail and wall_calls and calls[name] > WARM_UP_CALLS + 10 + 1:
                raise RuntimeError("broke under the wall clock")
            clock.advance(costs[name])
            return x * 2

        return fn

    return _toy_case(impls={n: impl(n) for n in costs})


@pytest.mark.parametrize("rounds", [1, 3])
def test_run_plan_records_wall_clock_beside_gpu_time(rounds):
    clock = FakeClock()
    timer = CpuTimer()
    timer.clock = clock
    case = _costed_case(clock, {"fused": 5.0, "native": 20.0, "unfused": 40.0})
    plan = harness.Plan(case, (2, 2), torch.float32, "fwd", ["fused", "native", "unfused"])
    recs = {
        r["impl"]: r for r in harness.run_plan(plan, timer, {}, {}, device="cpu", rounds=rounds)
    }
    for impl, cost in (("fused", 5.0), ("native", 20.0), ("unfused", 40.0)):
        r = recs[impl]
        assert r["error"] is None
        # GPU time from the (stand-in) event timer, wall clock from the host clock.
        assert r["median_us"] == 100.0 and r["x_vs_native"] == pytest.approx(1.0)
        assert r["wall_us"] == pytest.approx(cost) and r["wall_min_us"] == pytest.approx(cost)
        assert r["wall_calls"] == 5 * WALL_CALLS
    assert recs["fused"]["x_vs_native_wall"] == pytest.approx(4.0)
    assert recs["unfused"]["x_vs_native_wall"] == pytest.approx(0.5)
    assert recs["native"]["x_vs_native_wall"] == pytest.approx(1.0)
    assert recs["fused"]["x_vs_compile_wall"] is None  # no compile record in this group


def test_run_plan_keeps_gpu_time_when_the_wall_clock_fails():
    clock = FakeClock()
    timer = CpuTimer()
    timer.clock = clock
    case = _costed_case(clock, {"fused": 5.0, "native": 20.0}, fail="fused")
    plan = harness.Plan(case, (2, 2), torch.float32, "fwd", ["fused", "native"])
    recs = {r["impl"]: r for r in harness.run_plan(plan, timer, {}, {}, device="cpu")}
    assert "wall clock: RuntimeError: broke under the wall clock" in recs["fused"]["error"]
    assert recs["fused"]["median_us"] == 100.0 and recs["fused"]["wall_us"] is None
    assert recs["fused"]["x_vs_native_wall"] is None
    assert recs["native"]["error"] is None and recs["native"]["wall_us"] == pytest.approx(20.0)


def test_memory_bound_cases_measure_the_decode_rows():
    # Every memory-bound case (no FLOP count) of a 2-D shape measures 1, 16 and 128 rows of
    # 4096, with byte counts that are the formula's (positive, growing with the rows).
    cases = [c for c in harness.discover_cases() if c.flops is None]
    two_d = [c for c in cases if len(c.shapes[0]) == 2]
    assert {c.op for c in two_d} >= {
        "gelu",
        "layer_norm",
        "rms_norm",
        "add_layer_norm",
        "add_rms_norm",
        "softmax",
        "log_softmax",
        "dropout",
        "bias_dropout_add",
    }
    for c in two_d:
        for shape in harness.DECODE_SHAPES:
            assert shape in c.shapes, (c.label, shape)
            for p in c.passes:
                assert c.bytes(shape, torch.bfloat16, p) > 0
        sizes = [c.bytes(s, torch.bfloat16, "fwd") for s in harness.DECODE_SHAPES]
        assert sizes == sorted(sizes) and sizes[0] < sizes[-1], c.label
    # Not in --quick (which stays one large shape per case).
    assert not any(s in c.quick_shapes for c in two_d for s in harness.DECODE_SHAPES)


@CUDA
def test_run_plan_rounds_on_the_gpu():
    case = gelu_cases.CASES[1]  # tanh
    plan = harness.Plan(
        case, (256, 1024), torch.bfloat16, "fwd+bwd", ["fused", "native", "unfused", "compile"]
    )
    timer = harness.Timer(budget_ms=2.0, min_reps=31, max_reps=31)  # 31 reps each
    env = harness.environment()
    recs = harness.run_plan(plan, timer, {}, env, rounds=3)
    assert [r["impl"] for r in recs] == plan.impls
    for r in recs:
        assert r["error"] is None, r["error"]
        assert r["median_us"] > 0 and 0 < r["min_us"] <= r["median_us"]
        assert r["reps"] == 3 * 11 and r["rounds"] == 3  # ceil(31 / 3) a round
        assert r["peak_mem_bytes"] > 0 and r["fwd_held_bytes"] > 0
        assert r["wall_us"] > 0 and 0 < r["wall_min_us"] <= r["wall_us"]
        assert r["wall_calls"] >= 5 * 31 and r["x_vs_native_wall"] > 0


@CUDA
def test_run_plan_compiles_the_bwd_pass(tmp_path):
    # The bwd pass calls backward on one retained graph again and again: compile's
    # backward must run without AOTAutograd's donated buffers (harness.make_step), or every
    # repetition after the first raises. Layer norm's compiled backward donates buffers.
    from benchmarks.cases import norm as norm_cases

    case = next(c for c in norm_cases.CASES if c.op == "layer_norm")
    plan = harness.Plan(case, (512, 1024), torch.bfloat16, "bwd", ["fused", "compile"])
    timer = harness.Timer(budget_ms=2.0, min_reps=5, max_reps=5)
    recs = harness.run_plan(plan, timer, {}, harness.environment(), rounds=1)
    for r in recs:
        assert r["error"] is None, (r["impl"], r["error"])
        assert r["median_us"] > 0 and r["reps"] == 5
    assert torch._functorch.config.donated_buffer  # restored after the pass
    # The profiler's trace of the same pass (profiling/trace.py) runs the same make_step.
    torch._dynamo.reset()
    rows = trace_mod.profile_impl(
        case, "compile", (512, 1024), torch.bfloat16, "bwd", 2, str(tmp_path / "compile_bwd.json")
    )
    assert rows and (tmp_path / "compile_bwd.json").exists()


# --- reports ---------------------------------------------------------------------------


def _fake_records():
    base = {
        "op": "gelu",
        "variant": "tanh",
        "pass": "fwd",
        "dtype": "bfloat16",
        "device": "Fake GPU",
        "torch": "2.11.0",
        "tflops": None,
        "error": None,
        "peak_mem_bytes": 2**20,
    }
    recs = []
    for shape, times in [
        ((16384, 4096), {"fused": 63.0, "native": 80.0, "unfused": 400.0, "compile": 70.0}),
        ((16384, 1024), {"fused": 20.0, "native": 25.0, "unfused": 100.0, "compile": None}),
    ]:
        group = []
        for impl, us in times.items():
            r = dict(base, shape=list(shape), impl=impl, median_us=us)
            if us is None:
                r["error"] = "BackendCompilerFailed: boom"
                r["gbps"] = r["pct_of_peak"] = None
            else:
                r["gbps"] = 2 * shape[0] * shape[1] * 2 / (us * 1e-6) / 1e9
                r["pct_of_peak"] = r["gbps"] / 4270 * 100
            group.append(r)
        harness.add_speedups(group)
        recs += group
    return recs


def test_markdown_tables():
    recs = _fake_records()
    table = report.pivot_table(recs)
    lines = table.splitlines()
    assert lines[0].startswith("| op | variant | pass | shape | dtype | fused µs | fused rate |")
    assert "fused %" in lines[0] and "compile %" in lines[0] and "fused × native" in lines[0]
    assert len(lines) == 2 + 2  # header, separator, one row per group
    row = lines[2]
    assert "| gelu | tanh | fwd | 16384x4096 | bf16 | 63.0 |" in row
    assert "1.27×" in row and "1.11×" in row  # 80/63, 70/63
    assert "GB/s" in row
    assert "err" in lines[3]  # the failed compile measurement
    # Every row has as many cells as the header.
    assert len({ln.count("|") for ln in lines}) == 1
    md = report.markdown_report(
        {
            "device": "Fake GPU",
            "torch": "2.11.0",
            "cuda": "13.0",
            "ceilings": {"copy_gbps": 4270.0, "mm_tflops": 700.0, "mm_shape": [8192] * 3},
        },
        recs,
    )
    assert "4,270 GB/s" in md and "8192x8192x8192" in md and "BackendCompilerFailed" in md
    assert "## All measurements" in md and md.count("| gelu |") == 2 + len(recs)


def test_markdown_tables_show_wall_clock_beside_gpu_time():
    recs = _fake_records()
    for r in recs:  # wall clock: fused 30 us, native 20 us, unfused 60 us, compile 40 us
        r["wall_us"] = (
            {"fused": 30.0, "native": 20.0, "unfused": 60.0, "compile": 40.0}[r["impl"]]
            if r["median_us"] is not None
            else None
        )
    for shape in ((16384, 4096), (16384, 1024)):
        harness.add_speedups([r for r in recs if tuple(r["shape"]) == shape])
    lines = report.pivot_table(recs).splitlines()
    assert lines[0].endswith(
        "| fused × native | fused × compile | fused wall µs | native wall µs "
        "| wall × native | wall × compile |"
    )
    row = lines[2]
    # GPU time: fused 1.27x native; wall clock: 20/30 = 0.67x native, 40/30 = 1.33x compile.
    assert "| 1.27× | 1.11× | 30.0 | 20.0 | 0.67× | 1.33× |" in row
    assert lines[3].endswith("| 30.0 | 20.0 | 0.67× | – |")  # compile failed there
    assert len({ln.count("|") for ln in lines}) == 1
    long = report.long_table(recs).splitlines()
    assert "| wall µs | wall × native | host µs |" in long[0]
    assert "| 30.0 | 0.67× |" in long[2]
    md = report.markdown_report({"device": "Fake GPU"}, recs)
    assert "wall-clock time per call of back-to-back calls" in md
    # A run without wall-clock figures keeps the GPU-time columns alone.
    assert "wall" not in report.pivot_table(_fake_records()).splitlines()[0]


def test_plots_leave_the_decode_rows_out():
    recs = _fake_records()
    tiny = dict(recs[0], shape=[16, 4096], bytes=2 * 16 * 4096 * 2)
    big = dict(recs[0], bytes=2 * 16384 * 4096 * 2)
    groups = report.plot_groups([tiny, big])
    assert [s for s, _ in groups[("gelu", "tanh", "fwd", "bfloat16")]["fused"]] == [(16384, 4096)]


def test_json_round_trip_and_plots(tmp_path):
    recs = _fake_records()
    header = {"device": "Fake GPU", "ceilings": {"copy_gbps": 4270.0}}
    path = tmp_path / "results" / "fake.json"
    report.write_json(str(path), header, recs)
    h, r = report.load_json(str(path))
    assert h == header and r == recs
    groups = report.plot_groups(recs)
    assert list(groups) == [("gelu", "tanh", "fwd", "bfloat16")]
    fused = groups[("gelu", "tanh", "fwd", "bfloat16")]["fused"]
    assert [s for s, _ in fused] == [(16384, 1024), (16384, 4096)]  # by row length
    pytest.importorskip("matplotlib")
    pngs = report.write_plots(header, recs, str(tmp_path / "plots"))
    assert [os.path.basename(p) for p in pngs] == ["gelu_tanh_fwd_bfloat16.png"]
    assert os.path.getsize(pngs[0]) > 1000


def test_run_report_mode_renders_a_saved_run(tmp_path):
    path = tmp_path / "run.json"
    report.write_json(str(path), {"device": "Fake GPU"}, _fake_records())
    res = subprocess.run(
        [
            sys.executable,
            "benchmarks/run.py",
            "--report",
            str(path),
            "--out",
            str(tmp_path / "out"),
            "--no-plots",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "| gelu | tanh | fwd | 16384x4096 | bf16 |" in res.stdout
    assert (tmp_path / "out" / "results.md").exists()


# --- profiler helpers ------------------------------------------------------------------


def test_kernel_name_shortening():
    assert (
        trace_mod.short_name(
            "void fused::(anonymous namespace)::elementwise_kernel<float, 4>(float*, int)"
        )
        == "fused::elementwise_kernel<float, 4>"
    )
    assert trace_mod.short_name("triton_poi_fused_add_mul_0") == "triton_poi_fused_add_mul_0"
    long = "void at::native::vectorized_elementwise_kernel<4, " + "X" * 200 + ">(int)"
    assert len(trace_mod.short_name(long)) == 90 and trace_mod.short_name(long).endswith("…")


def test_trace_summary_counts_kernels_per_call():
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mul", "dur": 50}]
    for _ in range(2):  # two profiled calls of an op launching a mul and a tanh
        events += [
            {"ph": "X", "cat": "kernel", "name": "void mul_kernel(float*)", "dur": 10},
            {"ph": "X", "cat": "kernel", "name": "tanh_kernel", "dur": 30},
            {"ph": "X", "cat": "gpu_user_annotation", "name": "call", "dur": 45},
        ]
    rows = trace_mod.summarize_trace({"traceEvents": events}, iters=2)
    assert [(r["name"], r["count"], r["per_call"]) for r in rows] == [
        ("tanh_kernel", 2, 1.0),
        ("mul_kernel", 2, 1.0),
    ]
    assert rows[0]["avg_us"] == 30 and rows[1]["total_us"] == 20
    text = trace_mod.format_summary("unfused", rows, 2)
    assert (
        text.splitlines()[0]
        == "unfused: 2 kernel launches per call, 40.0 us of device time per call"
    )
    one = trace_mod.format_summary("fused", rows[:1], 2)
    assert one.startswith("fused: 1 kernel launch per call")


# --- no GPU: one line, exit 2 ------------------------------------------------------------


@pytest.mark.parametrize(
    "script,args,message",
    [
        ("benchmarks/run.py", ["--quick"], "no CUDA GPU found: the benchmark needs one"),
        ("profiling/trace.py", ["--op", "gelu"], "no CUDA GPU found: profiling needs one"),
    ],
)
def test_no_gpu_exits_2_with_one_line(script, args, message, tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # hide any GPU, even on a GPU machine
    res = subprocess.run(
        [sys.executable, script, *args, "--out", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2
    assert res.stderr.strip() == message
    assert res.stdout == ""
