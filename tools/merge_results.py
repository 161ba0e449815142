"""Merge a later run's records into a committed results JSON.

    python tools/merge_results.py benchmarks/results/NVIDIA_H200.json NEW.json \
        --note "what was re-measured, when, why" [--only-ops softmax,log_softmax]

Every record of NEW (optionally only those of --only-ops) replaces the record with the same
(op, variant, pass, shape, dtype, impl) in the committed file, or is appended. Records keep
their own ceilings (each record carries the copy / mm ceiling of the run that measured it,
and its % is against that), so rows of different runs stay comparable as % of copy. A fused
record of NEW without x native / x compile (NEW ran fused only) gets them from the committed
native / compile records of its row: times of two runs, which the note must say. The
header gains NEW's argv (as argv_<n>) and the note; then regenerate the table with
`python benchmarks/run.py --report <json> --out DIR --no-plots`.
"""

import argparse
import json


def key(r):
    return (r["op"], r["variant"], r["pass"], tuple(r["shape"]), r["dtype"], r["impl"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("--note", required=True)
    ap.add_argument("--only-ops", default="")
    a = ap.parse_args()
    base = json.load(open(a.base))
    new = json.load(open(a.new))
    only = set(filter(None, a.only_ops.split(",")))
    index = {key(r): i for i, r in enumerate(base["records"])}
    replaced = appended = 0
    for r in new["records"]:
        if only and r["op"] not in only:
            continue
        k = key(r)
        if k in index:
            base["records"][index[k]] = r
            replaced += 1
        else:
            index[k] = len(base["records"])
            base["records"].append(r)
            appended += 1
    # Ratios for fused-only records, from the rows' committed native / compile times.
    by_key = {key(r): r for r in base["records"]}
    for r in new["records"]:
        if r["impl"] != "fused" or (only and r["op"] not in only) or not r.get("median_us"):
            continue
        for impl, field in (("native", "x_vs_native"), ("compile", "x_vs_compile")):
            other = by_key.get(key(r)[:5] + (impl,))
            if r.get(field) is None and other is not None and other.get("median_us"):
                r[field] = other["median_us"] / r["median_us"]
    h = base["header"]
    n = 1 + sum(1 for k in h if k.startswith("argv_merge"))
    h[f"argv_merge{n}"] = new["header"].get("argv")
    h["note"] = (h.get("note", "") + " " + a.note).strip()
    with open(a.base, "w") as f:
        json.dump(base, f, indent=1)
        f.write("\n")
    print(f"{a.base}: {replaced} records replaced, {appended} appended")


if __name__ == "__main__":
    main()
