"""GPT-2 124M training steps in eager PyTorch, as a user runs them, with and without the
fused_ops modules swapped in: tokens/s, wall ms a step, GPU kernel ms a step, peak memory.

    python benchmarks/e2e_gpt2.py --out bench_out/e2e_gpt2.json          # eager vs fused
    python benchmarks/e2e_gpt2.py --compile --batches 8                  # + torch.compile
    python benchmarks/e2e_gpt2.py --tiny --device cpu --steps 2          # a check, anywhere

The model: Hugging Face transformers' GPT2LMHeadModel built from GPT2Config() (124M
parameters; nothing downloaded), SDPA attention (attn_implementation="sdpa"), weights in
bf16 (model.to(torch.bfloat16): parameters, activations and AdamW's states all bf16; no
autocast; --precision autocast: fp32 weights, the forward under bf16 autocast, where
PyTorch runs nn.LayerNorm in fp32 on CUDA and fused_ops' LayerNorm takes the bf16
activations with the fp32 parameters as they come), AdamW (lr 1e-4, PyTorch's default
foreach implementation), sequences of 1024
random token ids, the loss HF computes from labels = the inputs. Batches 8 x 1024 and
1 x 1024 by default.

Implementations ("impl" in the records):
  eager:  the model as built.
  fused:  the same weights with its modules swapped by hand (swap_modules): every
          nn.LayerNorm -> fused_ops.nn.LayerNorm (state copied), HF's GeLU
          (NewGELUActivation, the tanh form, "gelu_new") -> fused_ops.nn.GELU("tanh"), every
          nn.Dropout -> fused_ops.nn.Dropout (same p). The attention's attn_dropout is
          swapped too, but under SDPA only its p is read (SDPA applies the dropout).
  eager+compile, fused+compile (--compile): the same under torch.compile(model).

Measured per (impl, batch), on a fresh model and optimizer from the same seed:
  loss_eval0:  the loss of one eval-mode forward (no dropout) before training: eager and
               fused agree to bf16 rounding when the swap is right;
  warm-up steps (--warmup), then --steps timed steps: wall_ms_per_step from the first
  launch to the synchronisation after the last (what a user waits for), tokens_per_s from
  it, peak_mem_bytes (torch.cuda.max_memory_allocated over those steps);
  then --profile-steps steps under torch.profiler: gpu_kernel_ms_per_step (the sum of the
  GPU activities' durations: kernels, memsets and copies), kernels_per_step and
  profiled_wall_ms_per_step (the profiler slows the host; the wall figure above is the
  one to quote).
Records (JSON, --out) follow /work/shared/DESIGN.md: {"op": "e2e_train", "model":
"gpt2-124M", "impl": ..., "tokens_per_s": ..., ...}, with x_vs_eager (tokens/s over the
eager run of the same batch; compiled runs over eager+compile) on each.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import math
import os
import platform
import sys
import time
from collections import Counter

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # built from a configuration: no downloads
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

from benchmarks import report  # noqa: E402

IMPLS = ("eager", "fused", "eager+compile", "fused+compile")


def import_transformers():
    try:
        import transformers
    except ImportError as e:
        print(
            f"cannot import transformers ({e}): install it, e.g. from the wheels in .whl/ "
            f"with `pip install --no-index --no-deps --target /tmp/site .whl/*.whl` and "
            f"PYTHONPATH=/tmp/site",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    return transformers


def gpt2_config(tiny: bool):
    """GPT2Config() (124M), or the --tiny one: 2 layers, hidden 128, 4 heads, 64 positions
    and a 512-token vocabulary (a CPU check in seconds)."""
    from transformers import GPT2Config

    if tiny:
        return GPT2Config(n_layer=2, n_embd=128, n_head=4, n_positions=64, vocab_size=512)
    return GPT2Config()


def build_model(config, device, dtype, seed=0):
    """GPT2LMHeadModel from the configuration, SDPA attention, in train mode on device and
    dtype; the same weights for the same seed."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    if model.config._attn_implementation != "sdpa":
        raise RuntimeError(f"attention is {model.config._attn_implementation!r}, not 'sdpa'")
    return model.to(device=device, dtype=dtype).train()


def gelu_tanh_types() -> tuple:
    """The module classes HF uses for GPT-2's "gelu_new" activation (the tanh GeLU)."""
    from transformers import activations

    return tuple(
        getattr(activations, n)
        for n in ("NewGELUActivation", "GELUTanh", "PytorchGELUTanh")
        if hasattr(activations, n)
    )


def swap_modules(model: torch.nn.Module, gelu_types: tuple) -> Counter:
    """Replace, in place, every nn.LayerNorm by fused_ops.nn.LayerNorm (its state copied,
    on the same device and dtype), every module of gelu_types (tanh GeLUs) by
    fused_ops.nn.GELU(approximate="tanh") and every nn.Dropout by fused_ops.nn.Dropout
    (same p). Subclasses of those are left alone: they may compute something else.
    Returns how many of each were swapped."""
    import fused_ops.nn as fnn

    counts = Counter()
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.LayerNorm:
                ref = child.weight if child.weight is not None else None
                new = fnn.LayerNorm(
                    child.normalized_shape,
                    eps=child.eps,
                    elementwise_affine=child.elementwise_affine,
                    bias=child.bias is not None,
                    device=ref.device if ref is not None else None,
                    dtype=ref.dtype if ref is not None else None,
                )
                new.load_state_dict(child.state_dict())
                kind = "LayerNorm"
            elif type(child) in gelu_types:
                new, kind = fnn.GELU(approximate="tanh"), "GELU"
            elif type(child) is torch.nn.Dropout:
                new, kind = fnn.Dropout(child.p, child.inplace), "Dropout"
            else:
                continue
            new.train(child.training)
            setattr(parent, name, new)
            counts[kind] += 1
    return counts


def random_batch(batch, seq, vocab, device, seed=1):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), generator=gen).to(device)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gpu_activity(prof) -> tuple:
    """(total µs, count) of the GPU activities (kernels, memsets, copies) in a profile."""
    total, count = 0.0, 0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            total += e.time_range.elapsed_us()
            count += 1
    return total, count


PRECISIONS = {
    # name: (weights' dtype, autocast dtype or None, what the records say)
    "bf16": (torch.bfloat16, None, "bf16 weights, no autocast"),
    "autocast": (torch.float32, torch.bfloat16, "fp32 weights, bf16 autocast"),
    "fp32": (torch.float32, None, "fp32 weights, no autocast"),
}


def run_one(impl, batch, seq, args, config, device, precision, env) -> dict:
    """One (impl, batch) measurement on a fresh model and optimizer; errors are recorded."""
    dtype, amp, described = PRECISIONS[precision]
    autocast = (
        (lambda: torch.autocast(device.type, dtype=amp))
        if amp is not None
        else contextlib.nullcontext
    )
    rec = {
        "op": "e2e_train",
        "model": "gpt2-tiny" if args.tiny else "gpt2-124M",
        "impl": impl,
        "batch": batch,
        "seq": seq,
        "shape": [batch, seq],
        "tokens_per_step": batch * seq,
        "dtype": str(dtype).replace("torch.", ""),
        "precision": described,
        "optimizer": "AdamW(lr=1e-4, foreach)",
        "attn": "sdpa",
        "tokens_per_s": None,
        "wall_ms_per_step": None,
        "gpu_kernel_ms_per_step": None,
        "kernels_per_step": None,
        "profiled_wall_ms_per_step": None,
        "peak_mem_bytes": None,
        "loss_eval0": None,
        "loss_last": None,
        "swapped": {},
        "steps": args.steps,
        "warmup": args.warmup,
        "error": None,
        **env,
    }
    model = opt = fwd = step = None
    try:
        model = build_model(config, device, dtype, seed=args.seed)
        if impl.startswith("fused"):
            rec["swapped"] = dict(swap_modules(model, gelu_tanh_types()))
        ids = random_batch(batch, seq, config.vocab_size, device, seed=args.seed + 1)
        model.eval()
        with torch.no_grad(), autocast():
            rec["loss_eval0"] = float(model(input_ids=ids, labels=ids).loss)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        fwd = torch.compile(model) if impl.endswith("+compile") else model

        def step():
            with autocast():
                loss = fwd(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        for _ in range(args.warmup):
            step()
        sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            loss = step()
        sync(device)
        wall = (time.perf_counter() - t0) / args.steps
        rec["loss_last"] = float(loss.detach())
        rec["wall_ms_per_step"] = wall * 1e3
        rec["tokens_per_s"] = batch * seq / wall
        if device.type == "cuda":
            rec["peak_mem_bytes"] = int(torch.cuda.max_memory_allocated(device))
        if args.profile_steps > 0:
            acts = [torch.profiler.ProfilerActivity.CPU]
            if device.type == "cuda":
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            with torch.profiler.profile(activities=acts) as prof:
                t0 = time.perf_counter()
                for _ in range(args.profile_steps):
                    step()
                sync(device)
                pwall = (time.perf_counter() - t0) / args.profile_steps
            rec["profiled_wall_ms_per_step"] = pwall * 1e3
            if device.type == "cuda":
                total_us, count = gpu_activity(prof)
                rec["gpu_kernel_ms_per_step"] = total_us / 1e3 / args.profile_steps
                rec["kernels_per_step"] = count / args.profile_steps
    except Exception as e:  # noqa: BLE001 - an OOM or a failing swap: record, go on
        lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
        rec["error"] = f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]
    finally:
        # Drop every reference to the model (the step's closure included) before emptying
        # the cache, so the next run starts from an empty GPU.
        model = opt = fwd = step = None  # noqa: F841
        if impl.endswith("+compile"):
            torch._dynamo.reset()  # its caches hold the compiled model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rec


def add_ratios(records: list) -> None:
    """x_vs_eager: tokens/s over the eager run of the same batch and repeat (compiled
    runs: over eager+compile); loss_eval0_diff: loss_eval0 minus that run's."""
    by = {(r["batch"], r.get("repeat", 0), r["impl"]): r for r in records}
    for r in records:
        base = by.get(
            (
                r["batch"],
                r.get("repeat", 0),
                "eager+compile" if r["impl"].endswith("+compile") else "eager",
            )
        )
        ok = base and base.get("tokens_per_s") and r.get("tokens_per_s")
        r["x_vs_eager"] = r["tokens_per_s"] / base["tokens_per_s"] if ok else None
        ok = base and base.get("loss_eval0") is not None and r.get("loss_eval0") is not None
        r["loss_eval0_diff"] = r["loss_eval0"] - base["loss_eval0"] if ok else None


def _f(v, fmt):
    return "–" if v is None else format(v, fmt)


def table(records: list) -> str:
    header = [
        "batch",
        "impl",
        "tokens/s",
        "× eager",
        "wall ms/step",
        "GPU kernel ms/step",
        "kernels/step",
        "profiled wall ms/step",
        "peak GiB",
        "eval loss",
        "error",
    ]
    lines = ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * (len(header) - 3) + "---|"]
    for r in records:
        mem = r.get("peak_mem_bytes")
        lines.append(
            "| "
            + " | ".join(
                [
                    f"{r['batch']}x{r['seq']}",
                    r["impl"],
                    _f(r.get("tokens_per_s"), ",.0f"),
                    _f(r.get("x_vs_eager"), ".3f"),
                    _f(r.get("wall_ms_per_step"), ".2f"),
                    _f(r.get("gpu_kernel_ms_per_step"), ".2f"),
                    _f(r.get("kernels_per_step"), ".0f"),
                    _f(r.get("profiled_wall_ms_per_step"), ".2f"),
                    _f(mem / 2**30 if mem is not None else None, ".2f"),
                    _f(r.get("loss_eval0"), ".4f"),
                    (r.get("error") or "").replace("|", "/"),
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--impls",
        default="eager,fused",
        help=f"comma-separated, of {', '.join(IMPLS)} (default eager,fused)",
    )
    p.add_argument(
        "--compile", action="store_true", help="also the +compile form of each impl given"
    )
    p.add_argument("--batches", default="8,1", help="batch sizes (default 8,1)")
    p.add_argument(
        "--seq", type=int, default=None, help="sequence length (default 1024; --tiny: 64)"
    )
    p.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the whole list of (batch, impl) this many times, in the same "
        "order, each a record (default 1): the spread between repeats is "
        "the run-to-run noise",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=3,
        help="untimed steps first (default 3; +compile runs get 2 more)",
    )
    p.add_argument(
        "--profile-steps",
        type=int,
        default=3,
        help="steps under torch.profiler for the GPU kernel time (default 3; 0: none)",
    )
    p.add_argument(
        "--tiny",
        action="store_true",
        help="2 layers, hidden 128, seq 64, vocabulary 512: a quick check",
    )
    p.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    p.add_argument(
        "--precision",
        default="bf16",
        choices=list(PRECISIONS),
        help="bf16: bf16 weights (and AdamW states), no autocast (default); "
        "autocast: fp32 weights, the forward under bf16 autocast; fp32",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench_out/e2e_gpt2.json", help="JSON output path")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    impls = [s.strip() for s in args.impls.split(",") if s.strip()]
    if args.compile:
        impls += [f"{i}+compile" for i in impls if not i.endswith("+compile")]
    bad = [i for i in impls if i not in IMPLS]
    try:
        batches = [int(b) for b in args.batches.split(",") if b.strip()]
    except ValueError:
        batches = []
    if bad or not impls or not batches or min(batches) < 1 or args.steps < 1 or args.repeat < 1:
        print(
            f"error: --impls takes {', '.join(IMPLS)}; --batches positive integers; "
            f"--steps and --repeat at least 1",
            file=sys.stderr,
        )
        return 2
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU found: use --device cpu", file=sys.stderr)
        return 2
    transformers = import_transformers()
    import fused_ops  # noqa: F401 - registers the ops

    if device.type == "cuda" and not fused_ops.WITH_CUDA:
        print("fused_ops was built without its CUDA kernels", file=sys.stderr)
        return 2
    config = gpt2_config(args.tiny)
    seq = args.seq or (64 if args.tiny else 1024)
    if seq > config.n_positions:
        print(
            f"error: --seq {seq} is longer than the model's {config.n_positions} positions",
            file=sys.stderr,
        )
        return 2
    env = {
        "device": (torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"),
        "torch": torch.__version__.split("+")[0],
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }
    records = []
    for repeat in range(args.repeat):
        for batch in batches:
            for impl in impls:
                print(f"  {impl} batch {batch}x{seq} (repeat {repeat}) ...", file=sys.stderr)
                sub = argparse.Namespace(**vars(args))
                if impl.endswith("+compile"):
                    sub.warmup = args.warmup + 2  # compiles in the first, settles next
                rec = run_one(impl, batch, seq, sub, config, device, args.precision, env)
                records.append(dict(rec, repeat=repeat))
    add_ratios(records)
    header = {
        **env,
        "config": {
            k: getattr(config, k)
            for k in (
                "n_layer",
                "n_embd",
                "n_head",
                "n_positions",
                "vocab_size",
                "activation_function",
                "resid_pdrop",
                "embd_pdrop",
                "attn_pdrop",
            )
        },
        "params": sum(math.prod(s) for s in _param_shapes(config)),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "argv": sys.argv[1:],
    }
    print(
        f"GPT-2 ({header['params'] / 1e6:.1f}M parameters) training step, "
        f"{env['device']}, torch {env['torch']}, transformers {env['transformers']}; "
        f"{records[0]['precision']}, SDPA attention, AdamW.\n"
    )
    print(table(records))
    for r in records:
        d = r.get("loss_eval0_diff")
        if d is not None and abs(d) > 0.05:
            print(
                f"warning: {r['impl']} batch {r['batch']}: eval loss differs from eager's "
                f"by {d:+.4f} (same weights: the swap changed the model?)",
                file=sys.stderr,
            )
    report.write_json(args.out, header, records)
    print(f"\nwrote {args.out}", file=sys.stderr)
    return 1 if any(r["error"] for r in records) else 0


def _param_shapes(config):
    """The parameter shapes of the model (built on the meta device: no memory)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return [p.shape for p in model.parameters()]


if __name__ == "__main__":
    sys.exit(main())
