"""Checks that every relative link in the repository's markdown files points at a file or
folder that exists (external http(s) / mailto links and pure #anchors are not checked):

    python tools/check_links.py          # exit status 1 and one line per broken link
"""

import os
import re
import subprocess
import sys

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def markdown_files(root):
    out = subprocess.run(["git", "ls-files", "*.md"], cwd=root, capture_output=True, text=True)
    if out.returncode == 0 and out.stdout.strip():
        return out.stdout.split()
    return [
        os.path.relpath(os.path.join(d, f), root)
        for d, _, fs in os.walk(root)
        for f in fs
        if f.endswith(".md")
    ]


def broken_links(root):
    bad = []
    for md in markdown_files(root):
        text = open(os.path.join(root, md), encoding="utf-8").read()
        for lineno, line in enumerate(text.splitlines(), 1):
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target) or target.startswith("#"):
                    continue
                path = target.split("#")[0]
                full = os.path.normpath(os.path.join(root, os.path.dirname(md), path))
                if not os.path.exists(full):
                    bad.append(f"{md}:{lineno}: {target}")
    return bad


if __name__ == "__main__":
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    bad = broken_links(root)
    print("\n".join(bad) if bad else "all markdown links resolve")
    sys.exit(1 if bad else 0)
