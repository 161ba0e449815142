"""Checks shared by the fake kernels.

A tensor on the `meta` device beside real ones makes the dispatcher pick the Meta kernel,
which is the fake kernel: without this check a CPU input with a meta weight would return
uninitialised memory instead of an error. The message follows torch's."""

import torch


def check_same_device(op: str, x: torch.Tensor, **others) -> None:
    for name, t in others.items():
        if t is not None:
            torch._check(
                t.device == x.device,
                lambda: (
                    f"{op}: Expected all tensors to be on the same device, but found at "
                    f"least two devices, {x.device} and {t.device} ({name})!"
                ),
            )
