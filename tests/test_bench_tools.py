"""benchmarks/host_time.py (host time per call, fused vs native) and
benchmarks/e2e.py (GPT-2 and Llama training steps, patched by fused_ops.hf), on CPU: their
timing logic with a stand-in clock, their rows on the CPU kernels, the kernel kinds of the
e2e profile. The e2e runs need transformers and are skipped without it."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import e2e, host_time  # noqa: E402

from utils import CUDA  # noqa: E402

HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
needs_transformers = pytest.mark.skipif(
    not HAVE_TRANSFORMERS, reason="transformers is not installed"
)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def advance(self, us):
        self.now += us * 1e-6


# --- host_time -------------------------------------------------------------------------


def test_host_time_times_every_call_in_rotating_batches():
    clock, log = FakeClock(), []
    timer = host_time.HostTimer("cpu")
    timer.clock = clock

    def costing(name, us):
        def step():
            log.append(name)
            clock.advance(us)

        return step

    calls = 2 * host_time.BATCH + 7  # three batches each, the last one short
    times = host_time.measure_pair(
        {"fused": costing("fused", 30.0), "native": costing("native", 20.0)}, timer, calls, warmup=3
    )
    assert times["fused"] == pytest.approx([30.0] * calls)
    assert times["native"] == pytest.approx([20.0] * calls)
    # Warm-up first, then batches taking turns, the first of each round rotating.
    b = host_time.BATCH
    runs = []
    for name in log:
        if runs and runs[-1][0] == name:
            runs[-1][1] += 1
        else:
            runs.append([name, 1])
    # Rounds: fused, native | native, fused | fused (7), native (7).
    assert runs == [
        ["fused", 3],
        ["native", 3],
        ["fused", b],
        ["native", 2 * b],
        ["fused", b + 7],
        ["native", 7],
    ]


def test_host_time_spin_is_sized_on_the_calls(monkeypatch):
    # The CUDA path with the CUDA calls stood in for: each batch starts with a spin of
    # 3 x (BATCH x the median call + 100) us of the previous batch (the warm-up's for the
    # first), twice that after a batch that outlasted its spin, never shorter than before
    # within an op, capped at 0.5 s; an op that waits out the spin in one call does not
    # lengthen it.
    clock, spins, idle = FakeClock(), [], []

    class FakeEvent:
        def record(self):
            pass

        def query(self):
            return idle.pop(0)

    monkeypatch.setattr(
        torch.cuda, "_sleep", lambda cycles: spins.append(cycles / host_time.CYCLES_PER_US)
    )
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    timer = host_time.HostTimer("cpu")
    timer.cuda, timer.clock = True, clock
    costs = iter([10.0] * 4 + [10.0] * 25 + [20.0] * 25 + [5000.0] + [20.0] * 24 + [1e6] * 25)

    def step():
        clock.advance(next(costs))

    b = host_time.BATCH
    idle[:] = [False, True, False]
    times = host_time.measure_pair({"op": step}, timer, 3 * b, warmup=4)
    assert len(times["op"]) == 3 * b
    assert spins[0] == pytest.approx(3 * (b * 10.0 + 100))  # from the warm-up
    assert spins[1] == pytest.approx(3 * (b * 10.0 + 100))  # batch 1: same median
    assert spins[2] == pytest.approx(3 * 2 * (b * 20.0 + 100))  # batch 2 went idle
    assert timer.gpu_idle_batches == 1
    # Batch 3's one 5 ms call (an op waiting out the spin) left the median at 20 us: the
    # spin for a next batch would stay as it was.
    assert timer.spin_us == pytest.approx(spins[2])
    idle[:] = [False]
    timer.batch(step, b)  # calls of a second each: capped
    assert timer.spin_us == 500_000.0


def test_host_time_ratio_and_targets():
    def pair(pass_, fused_us, native_us):
        f = {"pass": pass_, "host_us": fused_us}
        host_time.add_ratio(f, {"pass": pass_, "host_us": native_us})
        return f

    f = pair("fwd", 9.0, 10.0)
    assert f["host_ratio_vs_native"] == pytest.approx(0.9) and f["meets_target"] is True
    assert pair("fwd", 10.5, 10.0)["meets_target"] is False  # forward's target is 1.0
    assert pair("fwd+bwd", 10.5, 10.0)["meets_target"] is True  # and fwd+bwd's 1.1
    assert pair("fwd+bwd", 11.5, 10.0)["meets_target"] is False
    missing = pair("fwd", None, 10.0)
    assert missing["host_ratio_vs_native"] is None and missing["meets_target"] is None


def _entries(*names):
    return host_time.select(host_time.all_entries(), list(names))


def test_host_time_covers_every_op_and_module():
    names = {e.name for e in host_time.all_entries()}
    assert names >= {
        "gelu/none",
        "gelu/tanh",
        "layer_norm",
        "rms_norm",
        "add_layer_norm/residual",
        "add_rms_norm/residual",
        "softmax",
        "log_softmax",
        "dropout/p=0.1",
        "bias_dropout_add/p=0.1",
        "matmul",
        "linear",
        "linear/bias+gelu_tanh",
        "nn.LayerNorm",
        "nn.GELU/tanh",
        "nn.Dropout",
    }
    # Selection by op name takes every variant; by case file, every op in it.
    assert {e.name for e in _entries("gelu")} == {"gelu/none", "gelu/tanh"}
    assert {e.name for e in _entries("norm")} == {
        "layer_norm",
        "rms_norm",
        "add_layer_norm/residual",
        "add_rms_norm/residual",
    }
    with pytest.raises(ValueError, match="no op matches"):
        _entries("conv2d")


@pytest.mark.parametrize(
    "name", ["layer_norm", "matmul", "nn.LayerNorm", "nn.Linear/gelu_tanh", "add_rms_norm/residual"]
)
def test_host_time_rows_on_cpu(name):
    (entry,) = [e for e in host_time.all_entries() if e.name == name]
    timer = host_time.HostTimer("cpu")
    env = {"device": "cpu", "torch": "x"}
    recs = host_time.run_entry(entry, "fwd+bwd", 4, 32, torch.float32, "cpu", timer, 3, env)
    assert [r["impl"] for r in recs] == ["fused", "native"]
    for r in recs:
        assert r["error"] is None, r["error"]
        assert r["host_us"] > 0 and r["calls"] == 3 and r["bench"] == "host_time"
        assert r["pass"] == "fwd+bwd" and r["dtype"] == "float32"
    assert recs[0]["host_ratio_vs_native"] == pytest.approx(recs[0]["host_us"] / recs[1]["host_us"])
    assert recs[0]["target"] == 1.1
    # The GEMM's shape is (M, N, K); the others rows x width.
    assert recs[0]["shape"] == ([4, 32, 32] if name == "matmul" else [4, 32])


@pytest.mark.parametrize("name", ["nn.LayerNorm", "nn.Linear/gelu_tanh", "matmul"])
def test_host_time_fused_and_native_differentiate_the_same_leaves(name):
    # A module row's native twin holds the fused module's own parameters, and a forward-
    # only benchmark case (matmul) differentiates all its inputs, so both implementations'
    # fwd+bwd compute the same gradients: the same work, compared.
    from benchmarks import harness

    (entry,) = [e for e in host_time.all_entries() if e.name == name]
    inputs = entry.make_inputs(4, 16, torch.float64, "cpu")
    for n in entry.grad_inputs:
        if isinstance(inputs[n], torch.nn.Parameter):
            inputs[n].requires_grad_(True)
        else:
            inputs[n] = inputs[n].detach().requires_grad_(True)
    assert len(entry.grad_inputs) >= 2  # x and at least one parameter / operand
    grads = {
        impl: harness.make_step(entry.impls[impl], inputs, "fwd+bwd", entry.grad_inputs)()
        for impl in ("fused", "native")
    }
    assert all(g is not None for g in grads["native"])
    for a, b in zip(grads["fused"], grads["native"]):
        torch.testing.assert_close(a, b)


def test_host_time_errors_are_recorded():
    entry = host_time.Entry(
        name="broken",
        make_inputs=lambda r, w, d, dev: {"x": torch.randn(r, w)},
        impls={"fused": lambda x: x.no_such(), "native": abs},
        grad_inputs=("x",),
    )
    recs = host_time.run_entry(
        entry, "fwd", 2, 4, torch.float32, "cpu", host_time.HostTimer("cpu"), 3, {}
    )
    assert all("AttributeError" in r["error"] for r in recs)
    assert "err: AttributeError" in host_time.table(recs)


def test_host_time_table():
    recs = []
    for pass_, f, n in (("fwd", 12.0, 10.0), ("fwd+bwd", 21.0, 20.0)):
        fr = {"op": "layer_norm", "variant": "", "pass": pass_, "impl": "fused", "host_us": f}
        nr = {"op": "layer_norm", "variant": "", "pass": pass_, "impl": "native", "host_us": n}
        host_time.add_ratio(fr, nr)
        recs += [fr, nr]
    lines = host_time.table(recs).splitlines()
    assert lines[0] == "| op | pass | fused µs | native µs | ratio | target | meets |"
    assert lines[2] == "| layer_norm | fwd | 12.0 | 10.0 | 1.20 | ≤ 1.0 | **no** |"
    assert lines[3] == "| layer_norm | fwd+bwd | 21.0 | 20.0 | 1.05 | ≤ 1.1 | yes |"
    assert host_time.summary_line(recs).startswith("1 of 2 op/pass rows meet the target")


def test_host_time_command_line_on_cpu(tmp_path):
    out, md = tmp_path / "h.json", tmp_path / "h.md"
    res = subprocess.run(
        [
            sys.executable,
            "benchmarks/host_time.py",
            "--device",
            "cpu",
            "--ops",
            "gelu,nn.Dropout",
            "--calls",
            "30",
            "--shape",
            "4x64",
            "--out",
            str(out),
            "--md",
            str(md),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert "| gelu/tanh | fwd+bwd |" in res.stdout and "| nn.Dropout | fwd |" in res.stdout
    data = json.loads(out.read_text())
    assert data["header"]["method"].startswith("CPU tensors")
    assert data["header"]["rows"] == 4 and data["header"]["width"] == 64
    recs = data["records"]
    assert len(recs) == 3 * 2 * 2  # (gelu none, tanh, nn.Dropout) x passes x impls
    assert all(r["host_us"] > 0 and r["calls"] == 30 for r in recs)
    assert "| op | pass | fused µs |" in md.read_text()
    bad = subprocess.run(
        [sys.executable, "benchmarks/host_time.py", "--device", "cpu", "--passes", "bwd"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "--passes takes fwd, fwd+bwd" in bad.stderr


@CUDA
def test_host_time_on_the_gpu_keeps_it_busy():
    (entry,) = [e for e in host_time.all_entries() if e.name == "layer_norm"]
    timer = host_time.HostTimer("cuda")
    recs = host_time.run_entry(entry, "fwd+bwd", 16, 256, torch.bfloat16, "cuda", timer, 100, {})
    assert all(r["error"] is None and r["host_us"] > 0 for r in recs)
    # The spin outlasted nearly every batch (it lengthens itself after one it did not).
    assert timer.gpu_idle_batches <= 2


# --- e2e ---------------------------------------------------------------------------------


def test_kernel_kinds():
    kinds = {
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64": "gemm",
        "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT": "gemm",
        "void fused::hopper_gemm_kernel<GeluTanh>(Params)": "gemm",
        "pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>": "attention",
        "fmha_cutlassB_bf16_aligned_64x64_k64_sm80": "attention",
        "void fused::norm_fwd_regs<bf16, 4>(...)": "norm",
        "void fused::norm::(anonymous namespace)::norm_fwd_regs<c10::BFloat16, c10::BFloat16, "
        "c10::BFloat16, 8, 4, 1, 1, 1024, 0>(fused::norm::FwdParams<c10::BFloat16, "
        "c10::BFloat16, c10::BFloat16>, int)": "norm",
        "void fused::norm::(anonymous namespace)::column_sum(const float*, const float*, long)": (
            "norm"
        ),
        "void fused::(anonymous namespace)::gated_kernel<c10::BFloat16, 8, "
        "(fused::(anonymous namespace)::GatedKind)0, false, unsigned int>("
        "fused::(anonymous namespace)::GatedArgs<c10::BFloat16>, unsigned int, unsigned int)": (
            "activation"
        ),
        "void fused::softmax::(anonymous namespace)::softmax_kernel<c10::Half, "
        "fused::softmax::Fwd, 8, 4, 128, false, false>(fused::softmax::Args<c10::Half, "
        "fused::softmax::Fwd::State>, fused::softmax::Fwd)": "attention",
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, float, float, float, "
        "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, const float*, "
        "int)": "loss",
        "nvjet_sm90_tst_256x128_64x4_2x1_v_bz_coopA_TNT": "gemm",
        "void fused::(anonymous namespace)::xent_fwd_kernel<c10::BFloat16, 256>(...)": "loss",
        "void fused::dropout_kernel<bf16>(...)": "dropout",
        "void at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>": "activation",
        "void fused::xent_fwd_kernel<bf16>(...)": "loss",
        "void at::native::(anonymous)::multi_tensor_apply_kernel<FusedAdamMathFunctor>": "optimizer",
        "Memcpy DtoD (Device -> Device)": "copies",
        "void at::native::unrolled_elementwise_kernel<direct_copy_kernel_cuda>": "copies",
        "void at::native::reduce_kernel<512, 1, SumOps>": "other",
    }
    for name, kind in kinds.items():
        assert e2e.kernel_kind(name) == kind, name


def test_breakdown_timeline_from_a_profile():
    """Kinds, the GPU's busy time (overlaps counted once), the span and the host waits, per
    step, from a stand-in profile."""

    class Range:
        def __init__(self, a, b):
            self.start, self.end = a, b

        def elapsed_us(self):
            return self.end - self.start

    class Ev:
        def __init__(self, name, a, b, cuda=True):
            self.name, self.time_range = name, Range(a, b)
            cpu = torch.autograd.DeviceType.CPU
            self.device_type = torch.autograd.DeviceType.CUDA if cuda else cpu

    class Prof:
        def events(self):
            return [
                Ev("nvjet_sm90_tst_256x128", 0, 1000),
                Ev("void fused::norm::(anonymous namespace)::norm_fwd_regs<float>", 500, 1500),
                Ev("void fused::(anonymous namespace)::gated_kernel<float>", 3000, 4000),
                Ev("cudaStreamSynchronize", 1500, 2900, cuda=False),
                Ev("cudaLaunchKernel", 0, 5, cuda=False),
            ]

    ms, kernels, tl = e2e.breakdown(Prof(), 2)
    assert kernels == 1.5
    assert ms["gemm"] == pytest.approx(0.5) and ms["norm"] == pytest.approx(0.5)
    assert ms["activation"] == pytest.approx(0.5) and ms["other"] == 0
    assert tl["busy_ms"] == pytest.approx(1.25) and tl["span_ms"] == pytest.approx(2.0)
    assert tl["host_waits"] == {"cudaStreamSynchronize": (pytest.approx(0.5), pytest.approx(0.7))}
    rec = {"model": "m", "impl": "patched", "breakdown_ms": ms, "timeline": tl}
    row = e2e.breakdown_table([rec]).splitlines()[-1]
    assert "| 1.50 | 1.25 | 2.00 | cudaStreamSynchronize 0.5x 0.70 ms |" in row


def test_add_ratios_and_table():
    recs = [
        {"model": "gpt2", "batch": 8, "gpus": 1, "impl": i, "tokens_per_s": t, "peak_mem_bytes": m}
        for i, t, m in (
            ("eager", 100.0, 10),
            ("patched", 125.0, 8),
            ("compile", 150.0, 9),
            ("patched+compile", 165.0, 9),
        )
    ]
    recs.append({"model": "gpt2", "batch": 8, "gpus": 2, "impl": "patched", "tokens_per_s": 10.0})
    e2e.add_ratios(recs)
    assert [r["x_vs_eager"] for r in recs[:4]] == pytest.approx([1.0, 1.25, 1.0, 1.1])
    assert recs[1]["mem_vs_eager"] == pytest.approx(0.8)
    assert recs[4]["x_vs_eager"] is None  # no eager run on 2 GPUs
    lines = e2e.table([dict(r, seq=1024) for r in recs]).splitlines()
    assert lines[3].startswith("| gpt2 | 8x1024 | 1 | patched | 125 | 1.250 |")
    assert len({ln.count("|") for ln in lines}) == 1


def test_batches_spec():
    assert e2e.batches(None, ["gpt2", "llama-1b"], False) == {"gpt2": 8, "llama-1b": 4}
    assert e2e.batches("3", ["gpt2"], False) == {"gpt2": 3}
    assert e2e.batches("llama-1b=2", ["gpt2", "llama-1b"], False) == {"gpt2": 8, "llama-1b": 2}


def test_bad_arguments_exit_2():
    assert e2e.main(["--impls", "fused", "--device", "cpu"]) == 2
    assert e2e.main(["--models", "gpt3", "--device", "cpu"]) == 2


@needs_transformers
def test_e2e_command_line_tiny_on_cpu(tmp_path):
    out = tmp_path / "e2e.json"
    res = subprocess.run(
        [
            sys.executable,
            "benchmarks/e2e.py",
            "--tiny",
            "--device",
            "cpu",
            "--impls",
            "eager,patched",
            "--steps",
            "1",
            "--warmup",
            "1",
            "--seq",
            "32",
            "--loss-curve",
            "3",
            "--time-limit",
            "0",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    data = json.loads(out.read_text())
    recs = [r for r in data["records"] if r["op"] == "e2e_train"]
    curves = [r for r in data["records"] if r["op"] == "e2e_loss_curve"]
    assert [(r["model"], r["impl"]) for r in recs] == [
        ("gpt2-tiny", "eager"),
        ("gpt2-tiny", "patched"),
        ("llama-1b-tiny", "eager"),
        ("llama-1b-tiny", "patched"),
    ]
    for r in recs:
        assert r["error"] is None and r["seq"] == 32 and r["gpus"] == 1
        assert r["tokens_per_s"] > 0 and r["wall_ms_per_step"] > 0
        assert r["tokens_per_s"] == pytest.approx(64 / (r["wall_ms_per_step"] / 1e3))
        assert r["peak_mem_bytes"] is None and r["breakdown_ms"] is None  # no GPU
    assert recs[1]["patched"]["modules"]["LayerNorm"] == 5
    assert "lm_head" in recs[3]["patched"]["forwards"]
    for c in curves:
        assert len(c["loss_eager"]) == 3 and c["ok"], c
        assert c["loss_eager"][0] == pytest.approx(c["loss_patched"][0], rel=1e-2)
    assert "| gpt2-tiny | 2x32 | 1 | patched |" in res.stdout
    assert (tmp_path / "e2e.png").exists()


@CUDA
@needs_transformers
def test_e2e_tiny_on_the_gpu(tmp_path):
    # The GPU-only parts: the per-kind profile, peak memory, compile (per layer: quicker).
    out = tmp_path / "e2e.json"
    res = subprocess.run(
        [
            sys.executable,
            "benchmarks/e2e.py",
            "--tiny",
            "--steps",
            "2",
            "--time-limit",
            "0",
            "--compile-mode",
            "regional",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    recs = json.loads(out.read_text())["records"]
    assert len(recs) == 8
    for r in recs:
        assert r["error"] is None and r["device"] != "cpu" and r["peak_mem_bytes"] > 0
        if r["impl"] in ("eager", "patched"):
            assert r["gpu_ms_per_step"] > 0 and r["kernels_per_step"] >= 20
            ms = r["breakdown_ms"]
            assert ms["gemm"] > 0 and ms["attention"] > 0 and ms["optimizer"] > 0, r
            assert ms["loss"] > 0, r
            # Llama's SiLU (eager) or gated kernel (patched); GPT-2's GeLU in eager (patched,
            # it may live in the GEMMs' epilogues).
            if r["impl"] == "eager" or r["model"].startswith("llama"):
                assert ms["activation"] > 0, r
            # Norms show by name in PyTorch's layer_norm kernels and in fused_ops' norm
            # kernels; Hugging Face's LlamaRMSNorm in eager is elementwise kernels and a
            # reduction, with no name to tell them by.
            if r["impl"] == "patched" or r["model"].startswith("gpt2"):
                assert ms["norm"] > 0, r
            tl = r["timeline"]
            assert (
                0 < tl["busy_ms"] <= tl["span_ms"] and tl["busy_ms"] <= r["gpu_ms_per_step"] + 1e-6
            )
