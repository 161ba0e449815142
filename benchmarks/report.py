"""Benchmark reporting: markdown tables, the results JSON and PNG plots.

Pure Python on lists of records (dicts in the DESIGN.md format), so a saved JSON can be
re-rendered anywhere: `python benchmarks/run.py --report benchmarks/results/<gpu>.json`.
"""

from __future__ import annotations

import json
import os

from benchmarks.harness import IMPL_ORDER

GROUP_KEYS = ("op", "variant", "pass", "shape", "dtype")
# Shapes moving fewer bytes are left out of the bandwidth plots (the tables keep them).
PLOT_MIN_BYTES = 8 * 2**20
SHORT_DTYPE = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64"}


def _shape_str(shape) -> str:
    return "x".join(str(d) for d in shape)


def group_key(rec: dict) -> tuple:
    return (rec["op"], rec.get("variant", ""), rec["pass"], tuple(rec["shape"]), rec["dtype"])


def group_records(records: list) -> dict:
    """{(op, variant, pass, shape, dtype): {impl: record}}, in first-appearance order."""
    groups = {}
    for rec in records:
        groups.setdefault(group_key(rec), {})[rec["impl"]] = rec
    return groups


def impl_columns(records: list) -> list:
    names = {r["impl"] for r in records}
    extras = sorted(n for n in names if n not in IMPL_ORDER)
    return [n for n in IMPL_ORDER if n in names] + extras


def _fmt(value, digits=1, suffix=""):
    if value is None:
        return "–"
    return f"{value:,.{digits}f}{suffix}"


def _num(value) -> str:
    """Whole numbers for GPU-sized rates, three significant digits for small ones."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _rate(rec: dict) -> str:
    if rec is None or rec.get("median_us") is None:
        return "–"
    if rec.get("tflops") is not None:
        return f"{_num(rec['tflops'])} TFLOP/s"
    return f"{_num(rec['gbps'])} GB/s" if rec.get("gbps") is not None else "–"


def _pct(rec) -> str:
    if rec is None:
        return "–"
    if rec.get("error"):
        return "err"
    return _fmt(rec.get("pct_of_peak"), 1)


def _speedup(rec, other, suffix="") -> str:
    value = rec.get(f"x_vs_{other}{suffix}") if rec else None
    return "–" if value is None else f"{value:.2f}×"


def _has_wall(records: list) -> bool:
    """Whether any record has a wall-clock figure (runs saved before wall-clock mode, or
    with --no-wall, have none: their tables keep the GPU-time columns alone)."""
    return any(r.get("wall_us") is not None for r in records)


def _table(header: list, rows: list) -> str:
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" if i < 5 else "---:" for i in range(len(header))) + "|",
    ]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def pivot_table(records: list) -> str:
    """One row per op/variant/pass/shape/dtype, implementations as columns:
    fused GPU µs and rate, every implementation's % of the ceiling, fused speed-ups in GPU
    time; then, where the run took them, fused and native wall-clock µs and the fused
    speed-ups in wall-clock time."""
    impls = impl_columns(records)
    wall = _has_wall(records)
    header = ["op", "variant", "pass", "shape", "dtype", "fused µs", "fused rate"]
    header += [f"{impl} %" for impl in impls]
    header += ["fused × native", "fused × compile"]
    if wall:
        header += ["fused wall µs", "native wall µs", "wall × native", "wall × compile"]
    rows = []
    for (op, variant, pass_, shape, dtype), by_impl in group_records(records).items():
        fused = by_impl.get("fused")
        row = [
            op,
            variant or "–",
            pass_,
            _shape_str(shape),
            SHORT_DTYPE.get(dtype, dtype),
            _fmt(fused.get("median_us"), 1) if fused else "–",
            _rate(fused),
        ]
        row += [_pct(by_impl.get(impl)) for impl in impls]
        row += [_speedup(fused, "native"), _speedup(fused, "compile")]
        if wall:
            native = by_impl.get("native")
            row += [
                _fmt(fused.get("wall_us"), 1) if fused else "–",
                _fmt(native.get("wall_us"), 1) if native else "–",
                _speedup(fused, "native", "_wall"),
                _speedup(fused, "compile", "_wall"),
            ]
        rows.append(row)
    return _table(header, rows)


def long_table(records: list) -> str:
    """Every record on its own row (what the JSON holds, for reading)."""
    header = [
        "op",
        "variant",
        "pass",
        "shape",
        "dtype",
        "impl",
        "median µs",
        "GB/s",
        "TFLOP/s",
        "% of peak",
        "× native",
        "× compile",
        "wall µs",
        "wall × native",
        "host µs",
        "peak MiB",
        "error",
    ]
    rows = []
    for r in records:
        mem = r.get("peak_mem_bytes")
        rows.append(
            [
                r["op"],
                r.get("variant") or "–",
                r["pass"],
                _shape_str(r["shape"]),
                SHORT_DTYPE.get(r["dtype"], r["dtype"]),
                r["impl"],
                _fmt(r.get("median_us"), 1),
                _fmt(r.get("gbps"), 0),
                _fmt(r.get("tflops"), 1),
                _fmt(r.get("pct_of_peak"), 1),
                _speedup(r, "native"),
                _speedup(r, "compile"),
                _fmt(r.get("wall_us"), 1),
                _speedup(r, "native", "_wall"),
                _fmt(r.get("host_us"), 1),
                _fmt(mem / 2**20 if mem is not None else None, 1),
                (r.get("error") or "").replace("|", "/"),
            ]
        )
    return _table(header, rows)


def header_text(header: dict) -> str:
    """Device, versions and the run's ceilings, as a few markdown lines."""
    parts = [
        f"Device: {header.get('device', '?')}; torch {header.get('torch', '?')}"
        f" (CUDA {header.get('cuda', '?')})."
    ]
    c = header.get("ceilings") or {}
    if c:
        parts.append(
            f"Ceilings measured at the start of the run: device-to-device copy "
            f"{_fmt(c.get('copy_gbps'), 0)} GB/s (bytes read + written), bf16 torch.mm "
            f"{'x'.join(str(d) for d in c.get('mm_shape', []))} "
            f"{_fmt(c.get('mm_tflops'), 0)} TFLOP/s."
        )
    parts.append(
        "`%` = achieved / ceiling × 100 (GB/s vs the copy, TFLOP/s vs the mm); "
        "`fused × X` = X's median time / fused median time (> 1: fused is faster)."
    )
    parts.append(
        "`µs`, `%`, `fused × X`: GPU time (host launch overhead hidden behind a "
        "spin kernel, L2 flushed before each repetition). `wall µs`, `wall × X`: "
        "wall-clock time per call of back-to-back calls, no spin kernel, no flush "
        "(what a user waits for; on small shapes the host time)."
    )
    return "\n".join(parts)


def errors_text(records: list) -> str:
    errs = [r for r in records if r.get("error")]
    if not errs:
        return ""
    lines = ["Failed measurements:"]
    for r in errs:
        lines.append(
            f"- {r['op']} {r.get('variant') or ''} {r['pass']} "
            f"{_shape_str(r['shape'])} {r['dtype']} {r['impl']}: {r['error']}"
        )
    return "\n".join(lines)


def markdown_report(header: dict, records: list) -> str:
    """The markdown file: header, the pivot table, failures, then every record."""
    out = ["# fused_ops benchmark", "", header_text(header), "", pivot_table(records)]
    err = errors_text(records)
    if err:
        out += ["", err]
    out += ["", "## All measurements", "", long_table(records), ""]
    return "\n".join(out)


def write_json(path: str, header: dict, records: list) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"header": header, "records": records}, f, indent=1)
        f.write("\n")


def load_json(path: str):
    """(header, records) from a results file (a bare list of records is accepted too)."""
    with open(path) as f:
        data = json.load(f)
    if isinstance(data, list):
        return {}, data
    return data.get("header", {}), data["records"]


def plot_groups(records: list) -> dict:
    """{(op, variant, pass, dtype): {impl: [(shape, value)]}} with value in GB/s, or
    TFLOP/s for compute-bound cases; shapes sorted by row length, then size."""
    groups = {}
    for r in records:
        if r.get("median_us") is None:
            continue
        if r.get("bytes") is not None and r["bytes"] < PLOT_MIN_BYTES:
            continue  # a decode row: launch-bound, its GB/s says nothing of the kernel
        value = r["tflops"] if r.get("tflops") is not None else r.get("gbps")
        key = (r["op"], r.get("variant", ""), r["pass"], r["dtype"])
        groups.setdefault(key, {}).setdefault(r["impl"], []).append((tuple(r["shape"]), value))
    for by_impl in groups.values():
        for points in by_impl.values():
            points.sort(key=lambda p: _shape_order(p[0]))
    return groups


def write_plots(header: dict, records: list, out_dir: str) -> list:
    """One PNG per op/variant/pass/dtype: achieved bandwidth (or TFLOP/s) against shape,
    one line per implementation, the run's ceiling dashed. Returns the written paths
    (none when matplotlib is missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    os.makedirs(out_dir, exist_ok=True)
    ceilings = header.get("ceilings") or {}
    flops_ops = {(r["op"], r.get("variant", "")) for r in records if r.get("tflops") is not None}
    paths = []
    for (op, variant, pass_, dtype), by_impl in plot_groups(records).items():
        is_flops = (op, variant) in flops_ops
        shapes = sorted({s for pts in by_impl.values() for s, _ in pts}, key=_shape_order)
        xs = {s: i for i, s in enumerate(shapes)}
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for impl in impl_columns([{"impl": i} for i in by_impl]):
            pts = by_impl[impl]
            ax.plot([xs[s] for s, _ in pts], [v for _, v in pts], marker="o", label=impl)
        ceiling = ceilings.get("mm_tflops" if is_flops else "copy_gbps")
        if ceiling:
            ax.axhline(
                ceiling,
                linestyle="--",
                color="gray",
                label=f"bf16 mm ({ceiling:,.0f} TFLOP/s)"
                if is_flops
                else f"copy ({ceiling:,.0f} GB/s)",
            )
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels([_shape_str(s) for s in shapes], rotation=20, fontsize=8)
        ax.set_xlabel("shape (sorted by row length)")
        ax.set_ylabel("TFLOP/s" if is_flops else "achieved GB/s")
        ax.set_ylim(bottom=0)
        name = f"{op}/{variant}" if variant else op
        ax.set_title(f"{name} {pass_} {dtype} — {header.get('device', '')}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fname = "_".join(p for p in (op, variant, pass_.replace("+", ""), dtype) if p)
        path = os.path.join(out_dir, f"{fname}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def _shape_order(shape) -> tuple:
    """Plots read left to right by row length (the last dim), then by size."""
    n = 1
    for d in shape:
        n *= d
    return (shape[-1] if shape else 0, n)
