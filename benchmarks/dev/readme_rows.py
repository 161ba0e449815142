"""Refreshes the README's results rows from a results .md (its first table), matching rows
by their first five cells (op, variant, pass, shape, dtype), only under the README heading
that names the GPU (the "### <heading>" section: each GPU has its own table):

    python benchmarks/dev/readme_rows.py benchmarks/results/NVIDIA_H200.md README.md "NVIDIA H200"
"""
import sys


def key(line):
    return tuple(c.strip() for c in line.strip().strip("|").split("|")[:5])


def main(md_path, readme_path, heading):
    md = open(md_path).read().split("\n")
    start = next(i for i, l in enumerate(md) if l.startswith("| op | variant | pass |"))
    rows = {}
    for l in md[start + 2:]:
        if not l.startswith("|"):
            break
        rows[key(l)] = l
    out, changed, inside = [], 0, False
    for l in open(readme_path).read().split("\n"):
        if l.startswith("#"):
            inside = l.strip() == f"### {heading}"
        new = rows.get(key(l)) if inside and l.startswith("| ") else None
        if new is not None and new != l:
            l, changed = new, changed + 1
        out.append(l)
    open(readme_path, "w").write("\n".join(out))
    print(f"{changed} README rows refreshed")


if __name__ == "__main__":
    main(*sys.argv[1:4])
