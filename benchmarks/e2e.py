"""End-to-end training steps of Hugging Face models, as a user runs them, with and without
fused_ops applied (fused_ops.hf.patch): tokens/s, peak memory, a profiler breakdown of one
step by kind of kernel, a plot, and optionally a 50-step loss-curve check.

    python benchmarks/e2e.py                       # GPT-2 124M and Llama ~1B, 4 impls (< 8 min, H200)
    python benchmarks/e2e.py --quick               # fewer steps, per-layer compile (< 4 min)
    python benchmarks/e2e.py --models gpt2 --impls eager,patched --loss-curve 50
    python benchmarks/e2e.py --tiny --device cpu --steps 2 --impls eager,patched   # anywhere
    torchrun --nproc_per_node 2 benchmarks/e2e.py --dist ddp --impls eager,patched  # 2 GPUs

Models, built from transformers configurations with random weights (nothing downloaded),
SDPA attention, on one GPU:
  gpt2:      GPT2Config() (124M), sequence 1024, dropout 0.1 as configured;
  llama-1b:  LlamaConfig with hidden 2048, MLP 5632 (SwiGLU), 22 layers, 32 heads, 4 key/value
             heads, vocabulary 32000, RoPE (1.1B parameters), sequence 1024.
Weights in bf16 (model.to(bfloat16): parameters, activations and AdamW's states all bf16, no
autocast), AdamW (lr 1e-4, foreach), a fixed batch of random token ids, the loss HF computes
from labels = the inputs. --optimizer fused runs AdamW(fused=True) instead, for every impl
alike: Hugging Face Trainer's default (adamw_torch_fused). The foreach AdamW reads and writes
the parameters and their states in a dozen passes (28 ms of the 1.1B Llama's GPU step on an
H200, a third of the patched step); the fused one in one. The default stays foreach so the
records compare with the earlier ones (each record's "optimizer" says which ran).

Implementations ("impl"): eager (the model as built), patched (fused_ops.hf.patch(model):
module swaps, fused residual + norm, fused LM head + loss), compile (torch.compile(model)),
patched+compile. --compile-mode regional compiles each decoder layer on its own instead
(compiled once, reused by every layer: a fraction of the compile time; --quick uses it).

Per (model, impl), on a fresh model and optimizer from the same seed: warm-up steps, then
--steps timed steps: tokens_per_s (from the wall time of those steps, first launch to the
synchronisation after the last), peak_mem_bytes (torch.cuda.max_memory_allocated over them);
then one step under torch.profiler: GPU time a step by kind of kernel (breakdown_ms: gemm,
attention, norm, activation, dropout, loss, optimizer, copies, other), and its timeline
(timeline: GPU busy ms, span ms, the runtime calls that wait for the GPU). --loss-curve N trains
eager and patched N steps on one batch with dropout off and checks that the final losses
agree within 1e-2 relative (records with op "e2e_loss_curve").

Records (JSON, --out; a PNG beside it): {"op": "e2e_train", "model", "impl", "tokens_per_s",
"peak_mem_bytes", "x_vs_eager" (tokens/s over eager's; compiled impls over compile's), ...}.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # built from a configuration: no downloads
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

from benchmarks import report  # noqa: E402

IMPLS = ("eager", "patched", "compile", "patched+compile")
MODELS = ("gpt2", "llama-1b")
KINDS = (
    "gemm",
    "attention",
    "norm",
    "activation",
    "dropout",
    "loss",
    "optimizer",
    "copies",
    "other",
)
# Substrings of (lower-cased) kernel names, first match wins. The loss first: PyTorch's
# log-softmax kernels are cunn_SoftMax*<..., LogSoftMax*Epilogue>, which "softmax" (an
# attention kind) would take. Attention before GEMMs (cutlass-built flash kernels); a GEMM
# with a GeLU or gated epilogue is a GEMM; the fused dropout + residual + norm is a norm (it
# runs in fused::norm's kernels, whose namespace names them all, their column sums too);
# fused_ops' gated kernel (swiglu / geglu) is an activation. A norm PyTorch composes from
# elementwise kernels and a reduction (Hugging Face's LlamaRMSNorm: pow, mean, rsqrt, mul,
# the dtype casts) has no name to find: it counts as other and copies.
_KIND_KEYS = (
    ("loss", ("xent", "cross_entropy", "nll_loss", "log_softmax", "logsoftmax")),
    ("attention", ("flash", "fmha", "attention", "sdpa", "attn", "softmax")),
    ("gemm", ("gemm", "xmma", "cutlass", "nvjet", "cublas", "matmul", "wgmma", "splitk")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("norm", ("norm",)),
    ("dropout", ("dropout", "philox", "fused_dropout", "bernoulli")),
    (
        "activation",
        ("gelu", "silu", "swiglu", "gated_kernel", "act_", "bias_act", "tanh", "sigmoid"),
    ),
    ("copies", ("copy", "memcpy", "memset", "cat_", "catarray", "fill", "transpose")),
)


def kernel_kind(name: str) -> str:
    low = name.lower()
    for kind, keys in _KIND_KEYS:
        if any(k in low for k in keys):
            return kind
    return "other"


def import_transformers():
    try:
        import transformers
    except ImportError as e:
        print(
            f"cannot import transformers ({e}): pip install 'fused_ops[hf]' (or transformers)",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    return transformers


def model_config(name: str, tiny: bool):
    """The configuration of a model name; --tiny: 2 layers, hidden 128 (a CPU check)."""
    from transformers import GPT2Config, LlamaConfig

    if name == "gpt2":
        if tiny:
            return GPT2Config(n_layer=2, n_embd=128, n_head=4, n_positions=64, vocab_size=512)
        return GPT2Config()
    if name == "llama-1b":
        if tiny:
            return LlamaConfig(
                hidden_size=128,
                intermediate_size=352,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                vocab_size=512,
                max_position_embeddings=64,
            )
        return LlamaConfig(
            hidden_size=2048,
            intermediate_size=5632,
            num_hidden_layers=22,
            num_attention_heads=32,
            num_key_value_heads=4,
            vocab_size=32000,
            max_position_embeddings=2048,
            hidden_act="silu",
            tie_word_embeddings=False,
        )
    raise ValueError(f"unknown model {name!r}: one of {', '.join(MODELS)}")


def build_model(config, device, dtype, seed=0, dropout=True):
    """The causal LM from the configuration, SDPA attention, in train mode on device and dtype
    (built there: no CPU initialisation of a billion parameters); the same weights for the
    same seed. dropout=False zeroes the configuration's dropout probabilities."""
    from transformers import AutoModelForCausalLM

    if not dropout:
        for key in ("resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout"):
            if hasattr(config, key):
                setattr(config, key, 0.0)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype)
    if model.config._attn_implementation != "sdpa":
        raise RuntimeError(f"attention is {model.config._attn_implementation!r}, not 'sdpa'")
    return model.to(device=device, dtype=dtype).train()


def decoder_layers(model):
    """The decoder blocks of a GPT-2 or Llama causal LM (DDP's wrapper looked through)."""
    model = getattr(model, "module", model)
    base = getattr(model, "transformer", None) or getattr(model, "model", None) or model
    return list(getattr(base, "h", None) or getattr(base, "layers", None) or [])


def random_batch(batch, seq, vocab, device, seed=1):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), generator=gen).to(device)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# CUDA runtime calls that make the host wait for the GPU (or may: cudaFree and cudaMalloc
# synchronise the device), seen as CPU events in a profile.
HOST_WAITS = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
    "cudaFree",
    "cudaMalloc",
    "cudaHostAlloc",
    "cudaFreeHost",
)


def breakdown(prof, steps: int) -> tuple:
    """({kind: GPU ms a step}, kernels a step, timeline) from a profile. timeline: the GPU's
    busy ms a step (the union of the kernels' intervals: what overlaps counts once), the span
    ms a step from the first kernel's start to the last one's end (span - busy: the GPU
    idle, waiting for the host), and {runtime call: (calls, ms) a step} of the calls in
    HOST_WAITS (the profiled steps end in one cudaDeviceSynchronize)."""
    ms = dict.fromkeys(KINDS, 0.0)
    count = 0
    spans, waits = [], {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            ms[kernel_kind(e.name)] += e.time_range.elapsed_us() / 1e3 / steps
            spans.append((e.time_range.start, e.time_range.end))
            count += 1
        elif e.name in HOST_WAITS:
            n, t = waits.get(e.name, (0, 0.0))
            waits[e.name] = (n + 1 / steps, t + e.time_range.elapsed_us() / 1e3 / steps)
    busy, end = 0.0, None
    for a, b in sorted(spans):
        if end is None or a > end:
            busy, end = busy + (b - a), b
        elif b > end:
            busy, end = busy + (b - end), b
    timeline = {
        "busy_ms": busy / 1e3 / steps,
        "span_ms": (max(b for _, b in spans) - min(a for a, _ in spans)) / 1e3 / steps
        if spans
        else 0.0,
        "host_waits": waits,
    }
    return ms, count / steps, timeline


class Dist:
    """torch.distributed under torchrun (WORLD_SIZE > 1), else a single process."""

    def __init__(self, mode):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.mode = mode if self.world > 1 else None
        if self.world > 1:
            import torch.distributed as dist

            local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local)
            dist.init_process_group("nccl", device_id=torch.device("cuda", local))

    def wrap(self, model):
        if self.mode == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            return DistributedDataParallel(model)
        if self.mode == "fsdp":
            from torch.distributed.fsdp import fully_shard

            for layer in decoder_layers(model):
                fully_shard(layer)
            fully_shard(model)
        return model

    def latest(self, seconds: float) -> float:
        """The largest of the ranks' elapsed times, so every rank skips the same runs."""
        if self.world == 1:
            return seconds
        import torch.distributed as dist

        t = torch.tensor([seconds], device="cuda")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t)

    def close(self):
        if self.world > 1:
            import torch.distributed as dist

            dist.destroy_process_group()


def make_optimizer(model, args):
    """AdamW(lr=1e-4), foreach (torch's default on CUDA) or fused (--optimizer)."""
    kind = {"foreach": {"foreach": True}, "fused": {"fused": True}}[args.optimizer]
    return torch.optim.AdamW(model.parameters(), lr=1e-4, **kind)


def make_step(model, opt, ids):
    def step():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def prepare(model_name, impl, args, config, device, dist, dropout=True):
    import fused_ops

    model = build_model(config, device, torch.bfloat16, seed=args.seed, dropout=dropout)
    patched = {}
    if impl.startswith("patched"):
        rep = fused_ops.hf.patch(model, head_loss=args.head_loss)
        patched = {"modules": dict(rep.counts()), "forwards": sorted(rep.forwards)}
        if rep.notes:
            patched["notes"] = rep.notes
    model = dist.wrap(model)
    if impl.endswith("compile"):
        if args.compile_mode == "regional":
            for layer in decoder_layers(model):
                layer.compile()
        else:
            model = torch.compile(model)
    return model, patched


def run_one(model_name, impl, batch, seq, args, config, device, env, dist) -> dict:
    """One (model, impl) measurement on a fresh model and optimizer; errors are recorded."""
    rec = {
        "op": "e2e_train",
        "model": model_name + ("-tiny" if args.tiny else ""),
        "impl": impl,
        "batch": batch,
        "seq": seq,
        "shape": [batch, seq],
        "gpus": dist.world,
        "dist": dist.mode,
        "tokens_per_step": batch * seq * dist.world,
        "dtype": "bfloat16",
        "optimizer": f"AdamW(lr=1e-4, {args.optimizer})",
        "attn": "sdpa",
        "compile_mode": args.compile_mode if impl.endswith("compile") else None,
        "tokens_per_s": None,
        "wall_ms_per_step": None,
        "peak_mem_bytes": None,
        "gpu_ms_per_step": None,
        "kernels_per_step": None,
        "breakdown_ms": None,
        "timeline": None,
        "warmup_s": None,
        "loss_last": None,
        "patched": {},
        "steps": args.steps,
        "error": None,
        **env,
    }
    model = opt = step = None
    try:
        model, rec["patched"] = prepare(model_name, impl, args, config, device, dist)
        ids = random_batch(batch, seq, config.vocab_size, device, seed=args.seed + 1 + dist.rank)
        opt = make_optimizer(model, args)
        step = make_step(model, opt, ids)
        warm = args.warmup + (2 if impl.endswith("compile") else 0)
        t0 = time.perf_counter()
        for _ in range(warm):
            step()
        sync(device)
        rec["warmup_s"] = time.perf_counter() - t0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            loss = step()
        sync(device)
        wall = (time.perf_counter() - t0) / args.steps
        rec["loss_last"] = float(loss.detach())
        rec["wall_ms_per_step"] = wall * 1e3
        rec["tokens_per_s"] = rec["tokens_per_step"] / wall
        if device.type == "cuda":
            rec["peak_mem_bytes"] = int(torch.cuda.max_memory_allocated(device))
        if args.profile_steps > 0 and impl in args.profile_impls:
            acts = [torch.profiler.ProfilerActivity.CPU]
            if device.type == "cuda":
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            with torch.profiler.profile(activities=acts) as prof:
                for _ in range(args.profile_steps):
                    step()
                sync(device)
            if device.type == "cuda":
                ms, count, rec["timeline"] = breakdown(prof, args.profile_steps)
                rec["breakdown_ms"] = ms
                rec["gpu_ms_per_step"] = sum(ms.values())
                rec["kernels_per_step"] = count
    except Exception as e:  # noqa: BLE001 - an OOM or a failing patch: record, go on
        lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
        rec["error"] = f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]
    finally:
        # Drop every reference to the model (the step's closure included) before emptying
        # the cache, so the next run starts from an empty GPU.
        model = opt = step = None  # noqa: F841
        if impl.endswith("compile"):
            torch._dynamo.reset()
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rec


def loss_curve(model_name, steps, batch, seq, args, config, device, env, dist) -> dict:
    """eager and patched trained `steps` steps on one batch, dropout off: both curves and
    whether the final losses agree within 1e-2 relative."""
    curves = {}
    for impl in ("eager", "patched"):
        model, _ = prepare(model_name, impl, args, config, device, dist, dropout=False)
        ids = random_batch(batch, seq, config.vocab_size, device, seed=args.seed + 1 + dist.rank)
        opt = make_optimizer(model, args)
        step = make_step(model, opt, ids)
        curves[impl] = [float(step().detach()) for _ in range(steps)]
        model = opt = step = None
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    a, b = curves["eager"][-1], curves["patched"][-1]
    rel = abs(b - a) / abs(a)
    return {
        "op": "e2e_loss_curve",
        "model": model_name + ("-tiny" if args.tiny else ""),
        "impl": "patched",
        "batch": batch,
        "seq": seq,
        "steps": steps,
        "dropout": 0.0,
        "loss_eager": curves["eager"],
        "loss_patched": curves["patched"],
        "final_rel_diff": rel,
        "ok": rel <= 1e-2,
        **env,
    }


def add_ratios(records: list) -> None:
    """x_vs_eager: tokens/s over the eager run of the same model, batch and GPU count
    (compiled impls: over compile's); mem_vs_eager likewise for peak memory."""
    by = {(r["model"], r["batch"], r.get("gpus", 1), r["impl"]): r for r in records}
    for r in records:
        base = by.get(
            (
                r["model"],
                r["batch"],
                r.get("gpus", 1),
                "compile" if r["impl"].endswith("compile") else "eager",
            )
        )
        ok = base and base.get("tokens_per_s") and r.get("tokens_per_s")
        r["x_vs_eager"] = r["tokens_per_s"] / base["tokens_per_s"] if ok else None
        ok = base and base.get("peak_mem_bytes") and r.get("peak_mem_bytes")
        r["mem_vs_eager"] = r["peak_mem_bytes"] / base["peak_mem_bytes"] if ok else None


def _f(v, fmt):
    return "–" if v is None else format(v, fmt)


def table(records: list) -> str:
    header = ["model", "tokens", "GPUs", "impl", "tokens/s", "× base", "peak GiB", "× mem"]
    header += ["GPU ms/step", "warm-up s", "error"]
    lines = ["| " + " | ".join(header) + " |", "|---|---|---:|---|" + "---:|" * 6 + "---|"]
    for r in records:
        mem = r.get("peak_mem_bytes")
        cells = [
            r["model"],
            f"{r['batch']}x{r['seq']}",
            str(r.get("gpus", 1)) + (f" {r['dist']}" if r.get("dist") else ""),
            r["impl"],
            _f(r.get("tokens_per_s"), ",.0f"),
            _f(r.get("x_vs_eager"), ".3f"),
            _f(mem / 2**30 if mem is not None else None, ".2f"),
            _f(r.get("mem_vs_eager"), ".3f"),
            _f(r.get("gpu_ms_per_step"), ".2f"),
            _f(r.get("warmup_s"), ".1f"),
            (r.get("error") or "").replace("|", "/"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def breakdown_table(records: list) -> str:
    rows = [r for r in records if r.get("breakdown_ms")]
    if not rows:
        return ""
    header = ["model", "impl"] + list(KINDS) + ["total", "busy", "span", "host waits"]
    lines = ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * (len(KINDS) + 3) + "---|"]
    for r in rows:
        ms, tl = r["breakdown_ms"], r.get("timeline") or {}
        cells = [r["model"], r["impl"]] + [f"{ms[k]:.2f}" for k in KINDS]
        cells += [
            f"{sum(ms.values()):.2f}",
            _f(tl.get("busy_ms"), ".2f"),
            _f(tl.get("span_ms"), ".2f"),
        ]
        waits = tl.get("host_waits") or {}
        cells.append(", ".join(f"{k} {n:g}x {t:.2f} ms" for k, (n, t) in sorted(waits.items())))
        lines.append("| " + " | ".join(cells) + " |")
    return "GPU ms a step by kind of kernel (one profiled step):\n\n" + "\n".join(lines)


def plot(records: list, path: str) -> str | None:
    """tokens/s per model and impl (left) and the per-kind breakdown (right), one PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    ok = [r for r in records if r.get("tokens_per_s")]
    if not ok:
        return None
    models = list(
        dict.fromkeys(r["model"] + (f" x{r['gpus']}" if r["gpus"] > 1 else "") for r in ok)
    )
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.8 / max(1, len(IMPLS))
    for i, impl in enumerate(IMPLS):
        vals = []
        for m in models:
            hit = [
                r
                for r in ok
                if r["impl"] == impl
                and r["model"] + (f" x{r['gpus']}" if r["gpus"] > 1 else "") == m
            ]
            vals.append(hit[0]["tokens_per_s"] / 1e3 if hit else 0)
        ax1.bar([j + i * width for j in range(len(models))], vals, width, label=impl)
    ax1.set_xticks([j + 0.4 - width / 2 for j in range(len(models))], models)
    ax1.set_ylabel("thousand tokens/s")
    ax1.set_title("training step throughput")
    ax1.legend(fontsize=8)
    rows = [r for r in ok if r.get("breakdown_ms")]
    if not rows:
        ax2.set_visible(False)
    labels = [f"{r['model']}\n{r['impl']}" for r in rows]
    bottom = [0.0] * len(rows)
    for kind in KINDS:
        vals = [r["breakdown_ms"][kind] for r in rows]
        ax2.bar(range(len(rows)), vals, bottom=bottom, label=kind)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax2.set_xticks(range(len(rows)), labels, fontsize=7)
    ax2.set_ylabel("GPU ms a step")
    ax2.set_title("one step by kind of kernel")
    ax2.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--models", default=",".join(MODELS), help=f"of {', '.join(MODELS)}")
    p.add_argument("--impls", default=",".join(IMPLS), help=f"of {', '.join(IMPLS)}")
    p.add_argument(
        "--batch",
        default=None,
        help="batch per GPU, or model=batch pairs (default gpt2=8,llama-1b=4)",
    )
    p.add_argument(
        "--seq", type=int, default=None, help="sequence length (default 1024; --tiny 64)"
    )
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 10, --quick 5)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (+2 when compiled)")
    p.add_argument("--profile-steps", type=int, default=1, help="profiled steps (0: none)")
    p.add_argument(
        "--profile-impls",
        default="eager,patched",
        help="the impls profiled (default eager,patched)",
    )
    p.add_argument(
        "--compile-mode",
        choices=("full", "regional"),
        default=None,
        help="full: torch.compile(model) (default); regional: each decoder layer (--quick)",
    )
    p.add_argument(
        "--loss-curve",
        type=int,
        default=0,
        metavar="N",
        help="also train eager and patched N steps (dropout off) and compare the losses",
    )
    p.add_argument(
        "--head-loss",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="patched: the LM head + loss in one linear_cross_entropy (default; "
        "--no-head-loss keeps the logits and runs the loss on cross_entropy)",
    )
    p.add_argument(
        "--optimizer",
        choices=("foreach", "fused"),
        default="foreach",
        help="AdamW's implementation, the same for every impl (default foreach; fused: "
        "Hugging Face Trainer's default)",
    )
    p.add_argument("--dist", choices=("ddp", "fsdp"), default="ddp", help="under torchrun")
    p.add_argument("--quick", action="store_true", help="5 timed steps, regional compile")
    p.add_argument(
        "--time-limit",
        type=float,
        default=None,
        metavar="S",
        help="start no run after S seconds (its record says skipped; default 330, --quick 170, "
        "0: none)",
    )
    p.add_argument("--tiny", action="store_true", help="2-layer models, sequence 64")
    p.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench_out/e2e.json", help="JSON output (a PNG beside it)")
    args = p.parse_args(argv)
    args.steps = args.steps or (5 if args.quick else 10)
    if args.time_limit is None:
        args.time_limit = 170.0 if args.quick else 330.0
    args.compile_mode = args.compile_mode or ("regional" if args.quick else "full")
    args.profile_impls = [s for s in args.profile_impls.split(",") if s]
    return args


def batches(spec, models, tiny) -> dict:
    default = {"gpt2": 8, "llama-1b": 4} if not tiny else {m: 2 for m in MODELS}
    if spec is None:
        return {m: default[m] for m in models}
    if "=" not in spec:
        return dict.fromkeys(models, int(spec))
    pairs = dict(kv.split("=") for kv in spec.split(","))
    return {m: int(pairs.get(m, default[m])) for m in models}


def main(argv=None) -> int:
    args = parse_args(argv)
    impls = [s.strip() for s in args.impls.split(",") if s.strip()]
    models = [s.strip() for s in args.models.split(",") if s.strip()]
    bad = [i for i in impls if i not in IMPLS] + [m for m in models if m not in MODELS]
    try:
        per_model = batches(args.batch, [m for m in models if m in MODELS], args.tiny)
    except ValueError:
        per_model = {}
    if bad or not impls or not models or not per_model or min(per_model.values()) < 1:
        print(
            f"error: --impls of {', '.join(IMPLS)}; --models of {', '.join(MODELS)}; "
            f"--batch a positive integer or model=batch pairs (got {', '.join(bad) or args.batch})",
            file=sys.stderr,
        )
        return 2
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU found: use --device cpu", file=sys.stderr)
        return 2
    transformers = import_transformers()
    import fused_ops

    if device.type == "cuda" and not fused_ops.WITH_CUDA:
        print("fused_ops was built without its CUDA kernels", file=sys.stderr)
        return 2
    dist = Dist(args.dist)
    if dist.world > 1:
        device = torch.device("cuda", torch.cuda.current_device())
    seq = args.seq or (64 if args.tiny else 1024)
    env = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__.split("+")[0],
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }
    say = (lambda *a: print(*a, file=sys.stderr, flush=True)) if dist.rank == 0 else (lambda *a: 0)
    t_start = time.perf_counter()
    records, curves = [], []
    configs = {name: model_config(name, args.tiny) for name in models}
    # The uncompiled runs of every model first, then the loss curves, then the compiled runs
    # (minutes of compile time): what a time limit cuts is the least informative.
    jobs = [("train", n, i) for n in models for i in impls if not i.endswith("compile")]
    jobs += [("curve", n, None) for n in models]
    jobs += [("train", n, i) for n in models for i in impls if i.endswith("compile")]
    for what, name, impl in jobs:
        if what == "curve" and args.loss_curve <= 0:
            continue
        elapsed = dist.latest(time.perf_counter() - t_start)
        label = f"{name} {impl or 'loss curve'} {per_model[name]}x{seq}"
        if args.time_limit and elapsed > args.time_limit:
            say(f"  {label}: skipped, past --time-limit {args.time_limit:.0f} s")
            if what == "train":
                records.append(
                    dict(
                        op="e2e_train",
                        model=name + ("-tiny" if args.tiny else ""),
                        impl=impl,
                        batch=per_model[name],
                        seq=seq,
                        gpus=dist.world,
                        dist=dist.mode,
                        tokens_per_s=None,
                        error=f"skipped: past --time-limit {args.time_limit:.0f} s",
                        **env,
                    )
                )
            continue
        say(f"  {label} ({elapsed:.0f} s) ...")
        args_ = (per_model[name], seq, args, configs[name], device, env, dist)
        if what == "train":
            records.append(run_one(name, impl, *args_))
        else:
            curves.append(loss_curve(name, args.loss_curve, *args_))
    dist.close()
    if dist.rank != 0:
        return 0
    add_ratios(records)
    header = {
        **env,
        "configs": {
            k: {c: v for c, v in sorted(cfg.to_dict().items()) if isinstance(v, (int, float, str))}
            for k, cfg in configs.items()
        },
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "argv": sys.argv[1:],
        "wall_s": time.perf_counter() - t_start,
    }
    print(
        f"Training steps, {env['device']}, torch {env['torch']}, transformers "
        f"{env['transformers']}; bf16 weights, SDPA attention, AdamW ({args.optimizer}); "
        f"compile mode "
        f"{args.compile_mode}.\n"
    )
    print(table(records))
    text = breakdown_table(records)
    if text:
        print("\n" + text)
    for c in curves:
        print(
            f"\nloss curve {c['model']}, {c['steps']} steps: eager {c['loss_eager'][-1]:.4f}, "
            f"patched {c['loss_patched'][-1]:.4f}, relative difference "
            f"{c['final_rel_diff']:.2e} ({'ok' if c['ok'] else 'ABOVE 1e-2'})"
        )
    report.write_json(args.out, header, records + curves)
    png = plot(records, os.path.splitext(args.out)[0] + ".png")
    say(f"\nwrote {args.out}" + (f" and {png}" if png else "") + f" in {header['wall_s']:.0f} s")
    failed = any(r["error"] for r in records) or any(not c["ok"] for c in curves)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
