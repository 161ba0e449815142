"""The shapes sweep (benchmarks/run.py --sweep): every case's op over row lengths across odd
and aligned values and public models' hidden sizes and vocabularies, so that a width whose
rows fall off the 16-byte grid (a performance cliff) shows at a glance; and its plots, one
PNG per op: % of the run's copy bandwidth against the row length, one line per
implementation / pass / dtype.

Rows per width keep each shape at ~2^25 elements (bf16: 64 MiB an input, a forward moving
128 MiB; float32 twice that), past the L2 and past launch latency."""

import os

WIDTHS = [1000, 1024, 4095, 4096, 4097, 5120, 5121, 8192, 32000, 32001, 50257, 128256, 151936]
# --sweep quick: an aligned width and its odd neighbour, at a hidden size and a vocabulary
QUICK_WIDTHS = [4096, 4097, 32000, 32001, 50257]
ELEMENTS = 1 << 25
# The ops a sweep takes unless --ops says otherwise, and its implementations unless --impls:
# torch.compile specializes per shape (a compile of seconds per width, pass and dtype), so
# the full sweep leaves it out to stay under 10 minutes a call; compare it op by op
# (--sweep full --ops softmax --dtypes bf16 --impls fused,native,compile).
QUICK_OPS = ["softmax", "log_softmax", "layer_norm", "rms_norm"]
FULL_OPS = QUICK_OPS + [
    "add_layer_norm",
    "add_rms_norm",
    "gelu",
    "dropout",
    "bias_dropout_add",
    "cross_entropy",
]
QUICK_IMPLS = ["fused", "native", "compile"]
FULL_IMPLS = ["fused", "native"]


def shapes(quick=False):
    return [(max(1, round(ELEMENTS / w)), w) for w in (QUICK_WIDTHS if quick else WIDTHS)]


def write_plots(header: dict, records: list, out_dir: str) -> list:
    """One PNG per op (op/variant): % of copy against the row length, a line per
    (impl, pass, dtype). Returns the written paths (none without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    os.makedirs(out_dir, exist_ok=True)
    groups = {}
    for r in records:
        if r.get("median_us") is None or r.get("pct_of_peak") is None or r.get("tflops"):
            continue
        op = f"{r['op']}/{r['variant']}" if r.get("variant") else r["op"]
        line = f"{r['impl']} {r['pass']} {r['dtype']}"
        groups.setdefault(op, {}).setdefault(line, []).append((r["shape"][-1], r["pct_of_peak"]))
    paths = []
    for op, lines in sorted(groups.items()):
        fig, ax = plt.subplots(figsize=(9, 5))
        # widths evenly spaced in order, so that 4096 and 4097 sit apart
        widths = sorted({w for pts in lines.values() for w, _ in pts})
        xs = {w: i for i, w in enumerate(widths)}
        for line, pts in sorted(lines.items()):
            pts.sort()
            style = "-" if line.startswith("fused") else ":"
            ax.plot(
                [xs[w] for w, _ in pts], [p for _, p in pts], style, marker="o", ms=3, label=line
            )
        ax.set_xticks(range(len(widths)))
        ax.set_xticklabels([str(w) for w in widths], rotation=45, fontsize=7)
        ax.set_xlabel("row length (last dim; odd widths next to their aligned neighbours)")
        ax.set_ylabel("% of copy bandwidth")
        ax.set_ylim(0, 110)
        ax.set_title(f"{op}: % of copy against width — {header.get('device', '')}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, ncol=3)
        fig.tight_layout()
        path = os.path.join(out_dir, f"sweep_{op.replace('/', '_')}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
