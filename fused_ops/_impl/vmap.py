"""vmap rules. Every op but dropout runs under torch.func.vmap through its ATen composition
(csrc/autograd/common.h), which ATen's batching rules cover; dropout draws randomness,
which vmap's `randomness=` governs: 'error' refuses, 'different' draws one mask over the
whole batch (each sample its own), 'same' draws one sample's mask and applies it to all."""

import torch


def _move_to_front(x, bdim):
    return x if bdim is None or bdim == 0 else x.movedim(bdim, 0)


@torch.library.register_vmap("fused::dropout")
def _dropout_vmap(info, in_dims, x, p, training, *, generator=None):
    (x_bdim, _, _) = in_dims
    op = torch.ops.fused.dropout.default
    if not training or p == 0.0 or p == 1.0:  # nothing random: the op on the batch as is
        y, so = op(x, p, training, generator=generator)
        return (y, so), (x_bdim, None)
    if info.randomness == "error":
        raise RuntimeError(
            "vmap: called random operation while in randomness error mode. Please either use "
            "the 'same' or 'different' randomness flags on vmap or perform the randomness "
            "operation out of vmap"
        )
    if info.randomness == "same":
        sample = x.select(x_bdim, 0) if x_bdim is not None else x
        mask, so = op(torch.ones_like(sample), p, training, generator=generator)
        if x_bdim is None:
            return (x * mask, so), (None, None)
        return (_move_to_front(x, x_bdim) * mask, so), (0, None)
    x = _move_to_front(x, x_bdim)
    if x_bdim is None:
        x = x.unsqueeze(0).expand(info.batch_size, *x.shape)
    y, so = op(x.contiguous(), p, training, generator=generator)
    return (y, so), (0, None)
