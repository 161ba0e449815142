"""The fused_ops benchmark suite: harness.py (Case, timing, ceilings), report.py (tables,
JSON, plots), run.py (the command line), cases/<op>.py (one file of Cases per op)."""
