"""Shared by the autograd registrations of ops with outputs that only the backward (or
nobody) differentiates: mean / rstd of the norms, dropout's seed_offset, linear_fwd's
pre-activation."""


def no_zero_grads(ctx):
    """Outputs that receive no gradient reach the backward as None instead of a zero
    tensor of their shape. Autograd would otherwise launch a fill for each of them on every
    backward: two small kernels (and their launch gaps) for layer norm's mean / rstd, a
    full M x N one for linear_fwd's pre-activation. Call in setup_context; the backward
    must then accept None for every output gradient."""
    ctx.set_materialize_grads(False)
