"""Does an L2 eviction hint on streamed loads change a memory-bound kernel's time under the
harness's flush? (KERNEL_LOG "L2 eviction priority", session 23.)

The harness flushes L2 before every repetition by writing a buffer twice its size, so a
timed kernel starts with L2 full of dirty lines. Every line it brings in evicts one; by
LRU the first ~L2-size of them are the flush's dirty lines (a DRAM write each). Loads
marked evict-first replace their own clean lines instead, so the write-backs fall to the
bytes the kernel writes. Triton copy kernels, one per (load hint, store hint), timed with
the harness's Timer at several sizes. Prints GB/s (bytes read + written) per variant.

    python3 benchmarks/dev/l2_policy.py [--sizes-mib 32,64,128,256,1024]
"""
import argparse

import torch
import triton
import triton.language as tl

from benchmarks.harness import Timer


@triton.jit
def copy_kernel(x, y, n, BLOCK: tl.constexpr, LOAD: tl.constexpr, STORE: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    if LOAD == 1:
        v = tl.load(x + offs, mask=m, eviction_policy="evict_first")
    elif LOAD == 2:
        v = tl.load(x + offs, mask=m, eviction_policy="evict_last")
    else:
        v = tl.load(x + offs, mask=m)
    if STORE == 1:
        tl.store(y + offs, v, mask=m, cache_modifier=".cs")
    elif STORE == 2:
        tl.store(y + offs, v, mask=m, eviction_policy="evict_first")
    else:
        tl.store(y + offs, v, mask=m)


LOADS = {"ld": 0, "ld.evict_first": 1, "ld.evict_last": 2}
STORES = {"st": 0, "st.cs": 1, "st.evict_first": 2}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-mib", default="32,64,128,256,1024")
    ap.add_argument("--budget-ms", type=float, default=30.0)
    args = ap.parse_args()
    timer = Timer(budget_ms=args.budget_ms)
    print(torch.cuda.get_device_name(), "flush", timer.flush_bytes >> 20, "MiB")
    block = 8192
    for mib in [int(s) for s in args.sizes_mib.split(",")]:
        n = mib * 2**20 // 2
        x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        grid = (triton.cdiv(n, block),)
        row = {"torch copy_": timer.measure(lambda: y.copy_(x))["median_us"]}
        for ln, lv in LOADS.items():
            for sn, sv in STORES.items():
                step = lambda: copy_kernel[grid](x, y, n, BLOCK=block, LOAD=lv, STORE=sv,
                                                 num_warps=8)
                step()
                assert torch.equal(y, x)
                row[f"{ln} + {sn}"] = timer.measure(step)["median_us"]
        print(f"\n{mib} MiB a tensor (GB/s, read + written):")
        for k, us in row.items():
            print(f"  {k:28s} {us:9.1f} us {2 * n * 2 / us / 1e3:8.0f} GB/s")
        if mib == 32:
            k = copy_kernel.warmup(x, y, n, BLOCK=block, LOAD=1, STORE=1, num_warps=8,
                                   grid=grid)
            ptx = k.asm["ptx"]
            print("  ptx of ld.evict_first + st.cs:",
                  sorted({l.split()[0] for l in ptx.splitlines()
                          if l.strip().startswith(("ld.global", "st.global", "createpolicy"))}))


if __name__ == "__main__":
    main()
