"""Refreshes the README's results rows from a results .md (its first table), matching rows
by their first five cells (op, variant, pass, shape, dtype):

    python benchmarks/dev/readme_rows.py benchmarks/results/NVIDIA_H200.md README.md
"""
import sys


def key(line):
    return tuple(c.strip() for c in line.strip().strip("|").split("|")[:5])


def main(md_path, readme_path):
    md = open(md_path).read().split("\n")
    start = next(i for i, l in enumerate(md) if l.startswith("| op | variant | pass |"))
    rows = {}
    for l in md[start + 2:]:
        if not l.startswith("|"):
            break
        rows[key(l)] = l
    out, changed = [], 0
    for l in open(readme_path).read().split("\n"):
        new = rows.get(key(l)) if l.startswith("| ") else None
        if new is not None and new != l:
            l, changed = new, changed + 1
        out.append(l)
    open(readme_path, "w").write("\n".join(out))
    print(f"{changed} README rows refreshed")


if __name__ == "__main__":
    main(*sys.argv[1:3])
