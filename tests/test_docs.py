"""The documentation's relative links point at files that exist (tools/check_links.py)."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import check_links  # noqa: E402


def test_markdown_links_resolve():
    assert check_links.broken_links(ROOT) == []


def test_a_broken_link_is_reported(tmp_path):
    (tmp_path / "a.md").write_text("see [b](b.md) and [web](https://example.com) [x](#top)\n")
    assert check_links.broken_links(str(tmp_path)) == ["a.md:1: b.md"]
    (tmp_path / "b.md").write_text("")
    assert check_links.broken_links(str(tmp_path)) == []
