"""Where the fused linear's epilogue time goes (Hopper kernel, bf16): the fused op with and
without bias / activation next to cuBLAS (torch.mm, F.linear, the cuBLASLt gelu epilogue),
each timed twice, interleaved, as triton.testing.do_bench medians (ms).

    python tools/linear_epilogue.py [--reverse] [--rounds R] [MxNxK ...]

--reverse times the cases in the opposite order (the first case timed at each shape runs on
the coolest GPU, so it can read up to 10% faster: docs/design/harness.md).
"""

import sys

import torch
from triton.testing import do_bench

from linear_cases import linear_cases

args = sys.argv[1:]
reverse = "--reverse" in args
rounds = 2
if "--rounds" in args:
    rounds = int(args[args.index("--rounds") + 1])
    del args[args.index("--rounds") : args.index("--rounds") + 2]
shapes = [a for a in args if a != "--reverse"] or [
    "4096x4096x4096",
    "16384x4096x4096",
    "8192x8192x8192",
]
torch.manual_seed(0)
print(torch.cuda.get_device_name())
for s in shapes:
    (m, n, k), every = linear_cases(s)
    cases = {name: f for name, f in every.items() if name != "eager F.gelu(F.linear)"}
    if reverse:
        cases = dict(reversed(list(cases.items())))
    res = {name: [] for name in cases}
    for _ in range(rounds):
        for name, f in cases.items():
            res[name].append(do_bench(f, warmup=50, rep=300, return_mode="median") * 1e3)
    base = min(res["fused mm"])
    for name, t in res.items():
        tf = 2 * m * n * k / (min(t) * 1e-6) / 1e12
        print(
            f"{s:>16} {name:<24} " + " ".join(f"{v:8.1f}" for v in t) + f" us  {tf:6.0f} TFLOP/s  "
            f"{(min(t) / base - 1) * 100:+5.1f}% vs fused mm"
        )
