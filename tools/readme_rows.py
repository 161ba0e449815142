"""Refreshes the rows of a markdown page's results tables from a results .md (its first
table), matching rows by their first five cells (op, variant, pass, shape, dtype), only under
the "## " or "### " heading that names the GPU (each GPU has its own table):

    python tools/readme_rows.py benchmarks/results/NVIDIA_H200.md \
        benchmarks/results/README.md "NVIDIA H200"
"""

import argparse
import sys


def key(line):
    return tuple(c.strip() for c in line.strip().strip("|").split("|")[:5])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("md", help="a results .md (benchmarks/results/<gpu>.md)")
    ap.add_argument("readme", help="the markdown page to refresh in place")
    ap.add_argument("heading", help='the GPU section\'s heading, without the "#"s')
    a = ap.parse_args()
    md = open(a.md).read().split("\n")
    start = next(i for i, line in enumerate(md) if line.startswith("| op | variant | pass |"))
    rows = {}
    for line in md[start + 2 :]:
        if not line.startswith("|"):
            break
        rows[key(line)] = line
    out, changed, inside, found = [], 0, False, False
    for line in open(a.readme).read().split("\n"):
        if line.startswith("## ") or line.startswith("### "):  # headings (not code comments)
            inside = line.lstrip("#").strip() == a.heading
            found = found or inside
        new = rows.get(key(line)) if inside and line.startswith("| ") else None
        if new is not None and new != line:
            line, changed = new, changed + 1
        out.append(line)
    if not found:
        sys.exit(f"no '{a.heading}' heading in {a.readme}")
    open(a.readme, "w").write("\n".join(out))
    print(f"{changed} rows refreshed")


if __name__ == "__main__":
    main()
