"""One module per op, each defining CASES = [benchmarks.harness.Case(...), ...].

The harness imports every module here (benchmarks.harness.discover_cases): adding an op to
the benchmark is adding its file.
"""
