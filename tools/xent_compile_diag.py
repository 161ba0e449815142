"""Diagnoses tests/test_cross_entropy.py::test_compile_fullgraph on CUDA: for each
(inplace, precompute, dynamic) case, the compiled and eager losses and gradients against a
float64 reference (max abs / rel error of each), under the default float32 matmul precision
and with TF32 forced off, over several seeds.

    python tools/xent_compile_diag.py [--out DIR]

With --out, inductor's generated code of every case is written there (TORCH_LOGS
output_code, one file per case). A case whose compiled errors exceed the test's tolerances
(loss 1e-5, gradients rtol 1e-4 / atol 1e-5) while eager passes is marked FAIL.
"""

import argparse
import contextlib
import io
import logging
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fused_ops  # noqa: E402


def reference(h, w, t):
    x = h.double() @ w.double().t()
    rows = torch.nn.functional.cross_entropy(
        x, t, reduction="none", ignore_index=-100, label_smoothing=0.1
    )
    rows = rows + 1e-3 * torch.logsumexp(x, -1).square() * (t != -100)
    return rows.sum() / (t != -100).sum()


def errors(got, want):
    d = (got.double() - want).abs()
    return d.max().item(), (d / want.abs().clamp_min(1e-30)).max().item()


def run(case, compiled, seed):
    inplace, precompute, dynamic = case
    torch.manual_seed(seed)
    h = torch.randn(12, 8, device="cuda", requires_grad=True)
    w = torch.randn(21, 8, device="cuda", requires_grad=True)
    t = torch.randint(0, 21, (12,), device="cuda")
    t[torch.rand(12, device="cuda") < 0.25] = -100

    def f(h, w, t):
        logits = h @ w.t()
        return fused_ops.cross_entropy(
            logits,
            t,
            label_smoothing=0.1,
            z_loss=1e-3,
            inplace_backward=inplace,
            precompute_grad=precompute,
        )

    fn = f
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(f, fullgraph=True, dynamic=dynamic)
    out = fn(h, w, t)
    (out * 1.5).backward()
    hr = h.detach().double().requires_grad_()
    wr = w.detach().double().requires_grad_()
    ref = reference(hr, wr, t)
    (ref * 1.5).backward()
    res = {
        "out": errors(out, ref),
        "h.grad": errors(h.grad, hr.grad),
        "w.grad": errors(w.grad, wr.grad),
    }
    ok = (
        res["out"][0] <= 1e-5 + 1e-5 * ref.abs().item()
        and torch.allclose(h.grad.double(), hr.grad, rtol=1e-4, atol=1e-5)
        and torch.allclose(w.grad.double(), wr.grad, rtol=1e-4, atol=1e-5)
    )
    return res, ok


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", help="folder for inductor's output code per case")
    p.add_argument("--seeds", type=int, default=20)
    args = p.parse_args()
    cases = [
        (False, False, False),
        (True, False, False),
        (False, True, False),
        (False, True, True),
        (False, False, True),
    ]
    print(
        f"torch {torch.__version__}, {torch.cuda.get_device_name()}, "
        f"allow_tf32={torch.backends.cuda.matmul.allow_tf32}, "
        f"float32_matmul_precision={torch.get_float32_matmul_precision()}"
    )
    for tf32 in (torch.backends.cuda.matmul.allow_tf32, False):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        for case in cases:
            fails = {"eager": 0, "compiled": 0}
            worst = {}
            for seed in range(args.seeds):
                for compiled in (False, True):
                    res, ok = run(case, compiled, seed)
                    key = "compiled" if compiled else "eager"
                    fails[key] += not ok
                    for k, v in res.items():
                        worst[(key, k)] = max(worst.get((key, k), (0, 0)), v)
            flag = "FAIL" if fails["compiled"] > fails["eager"] else "ok"
            print(
                f"tf32={tf32} inplace,precompute,dynamic={case}: {flag} "
                f"failing seeds eager {fails['eager']}/{args.seeds}, compiled "
                f"{fails['compiled']}/{args.seeds}"
            )
            for (key, k), (a, r) in sorted(worst.items()):
                print(f"    {key:8s} {k:7s} max abs {a:.2e} max rel {r:.2e}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        for case in cases:
            buf = io.StringIO()
            handler = logging.StreamHandler(buf)
            torch._logging.set_logs(output_code=True)
            logging.getLogger("torch._inductor").addHandler(handler)
            with contextlib.suppress(Exception):
                run(case, True, 0)
            logging.getLogger("torch._inductor").removeHandler(handler)
            torch._logging.set_logs()
            name = "case_" + "_".join(str(int(c)) for c in case) + ".txt"
            with open(os.path.join(args.out, name), "w") as f:
                f.write(buf.getvalue())


if __name__ == "__main__":
    main()
