"""Refreshes the README's results rows from a results .md (its first table), matching rows
by their first five cells (op, variant, pass, shape, dtype), only under the README heading
that names the GPU (the "### <heading>" section: each GPU has its own table):

    python benchmarks/dev/readme_rows.py benchmarks/results/NVIDIA_H200.md README.md "NVIDIA H200"
"""
import argparse
import sys


def key(line):
    return tuple(c.strip() for c in line.strip().strip("|").split("|")[:5])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("md", help="a results .md (benchmarks/results/<gpu>.md)")
    ap.add_argument("readme", help="the README to refresh in place")
    ap.add_argument("heading", help='the GPU section\'s heading, without "### "')
    a = ap.parse_args()
    md = open(a.md).read().split("\n")
    start = next(i for i, l in enumerate(md) if l.startswith("| op | variant | pass |"))
    rows = {}
    for l in md[start + 2:]:
        if not l.startswith("|"):
            break
        rows[key(l)] = l
    out, changed, inside, found = [], 0, False, False
    for l in open(a.readme).read().split("\n"):
        if l.startswith("## ") or l.startswith("### "):  # headings (not code comments)
            inside = l.strip() == f"### {a.heading}"
            found = found or inside
        new = rows.get(key(l)) if inside and l.startswith("| ") else None
        if new is not None and new != l:
            l, changed = new, changed + 1
        out.append(l)
    if not found:
        sys.exit(f"no '### {a.heading}' heading in {a.readme}")
    open(a.readme, "w").write("\n".join(out))
    print(f"{changed} README rows refreshed")


if __name__ == "__main__":
    main()
