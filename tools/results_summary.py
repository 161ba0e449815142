"""Prints the README's summary of the committed benchmark runs: per op and GPU, the fused
kernel's typical (median) and worst (lowest) cell over every committed row (all shapes, dtypes
and passes), as % of the run's ceiling (copy bandwidth for the memory-bound ops, the bf16
torch.mm rate for matmul / linear), and the speed-up over native PyTorch and torch.compile
(the other's time / the fused time; above 1.00x the fused kernel is faster):

    python tools/results_summary.py [benchmarks/results/NVIDIA_*.json]

The per-GPU full runs only (NVIDIA_*.json): the other files there (host time, wall clock,
the shapes sweep, end to end) have tables of their own in benchmarks/results/README.md.
"""

import json
import os
import statistics
import sys

OPS = [
    "gelu",
    "softmax",
    "log_softmax",
    "layer_norm",
    "rms_norm",
    "add_layer_norm",
    "add_rms_norm",
    "dropout",
    "bias_dropout_add",
    "matmul",
    "linear",
    "gemm_train",
    "cross_entropy",
    "linear_cross_entropy",
    "dropout_add_layer_norm",
    "dropout_add_rms_norm",
    "swiglu",
    "geglu",
]
SHORT_GPU = {"NVIDIA H100 80GB HBM3": "H100", "NVIDIA H200": "H200"}
SHORT_DTYPE = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def cell(rec):
    shape = "x".join(str(d) for d in rec["shape"])
    return f"{rec['pass']} {shape} {SHORT_DTYPE.get(rec['dtype'], rec['dtype'])}"


def typical_worst(records, field, fmt, where=True):
    """'median (min, at which row)' of a field over the records that have it."""
    have = [r for r in records if r.get(field) is not None]
    if not have:
        return "–", 0
    worst = min(have, key=lambda r: r[field])
    median = statistics.median(r[field] for r in have)
    at = f": {cell(worst)}" if where else ""
    return f"{fmt(median)} ({fmt(worst[field])}{at})", len(have)


def summary(paths):
    lines = [
        "| op | GPU | rows | fused, % of ceiling: typical (worst) | × native | × compile |",
        "|---|---|---:|---|---|---|",
    ]
    runs = []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        runs.append(
            (
                SHORT_GPU.get(data["header"]["device"], data["header"]["device"]),
                [r for r in data["records"] if r["impl"] == "fused" and not r.get("error")],
            )
        )
    for op in OPS:
        for gpu, records in runs:
            rows = [r for r in records if r["op"] == op]
            if not rows:
                continue
            pct, n = typical_worst(rows, "pct_of_peak", lambda v: f"{v:.1f}%")
            nat, _ = typical_worst(rows, "x_vs_native", lambda v: f"{v:.2f}×", where=False)
            comp, _ = typical_worst(rows, "x_vs_compile", lambda v: f"{v:.2f}×", where=False)
            lines.append(f"| {op} | {gpu} | {n} | {pct} | {nat} | {comp} |")
    return "\n".join(lines)


if __name__ == "__main__":
    paths = sys.argv[1:] or sorted(
        os.path.join("benchmarks/results", f)
        for f in os.listdir("benchmarks/results")
        if f.startswith("NVIDIA_") and f.endswith(".json")
    )
    print(summary(paths))
