"""The torch.nn.functional-style API: same names, same arguments, fused kernels.

Swap `F.gelu` for `fused_ops.gelu` and nothing else changes. Each function is a thin call
of its registered op (torch.ops.fused.<name>): argument checks, autograd and autocast all
happen in C++, so a call costs about what the native op's Python binding costs. In eager
mode the call goes straight to C++: for the ops whose calls are cheapest natively (gelu, the
norms, softmax) through the direct entry points of csrc/fast_calls.cpp (plain tensors only;
anything else comes back NotImplemented and takes the next path), otherwise through the
op's C++ entry (OpOverload._op, the function OpOverload.__call__ itself calls). Under
torch.compile (which traces OpOverloads) the call goes through torch.ops.fused.<name>.
"""

import torch
from torch.compiler import is_compiling as _compiling

from . import _C

__all__ = [
    "gelu",
    "layer_norm",
    "rms_norm",
    "add_layer_norm",
    "add_rms_norm",
    "softmax",
    "log_softmax",
    "dropout",
    "bias_dropout_add",
    "matmul",
    "linear",
    "cross_entropy",
    "linear_cross_entropy",
    "dropout_add_layer_norm",
    "dropout_add_rms_norm",
    "swiglu",
    "geglu",
    "mlp",
]

_ops = torch.ops.fused


def _entry(name):
    """(the op for torch.compile, its C++ entry for eager calls)."""
    op = getattr(_ops, name).default
    return op, op._op


_gelu, _gelu_c = _entry("gelu")
_layer_norm, _layer_norm_c = _entry("layer_norm")
_rms_norm, _rms_norm_c = _entry("rms_norm")
_add_layer_norm, _add_layer_norm_c = _entry("add_layer_norm")
_add_rms_norm, _add_rms_norm_c = _entry("add_rms_norm")
_softmax, _softmax_c = _entry("softmax")
_log_softmax, _log_softmax_c = _entry("log_softmax")
_dropout, _dropout_c = _entry("dropout")
_dropout_, _dropout__c = _entry("dropout_")
_bias_dropout_add, _bias_dropout_add_c = _entry("bias_dropout_add")
_matmul, _matmul_c = _entry("matmul")
_linear, _linear_c = _entry("linear")
_linear_fwd, _linear_fwd_c = _entry("linear_fwd")
_cross_entropy, _cross_entropy_c = _entry("cross_entropy")
_cross_entropy_with_grad, _cross_entropy_with_grad_c = _entry("cross_entropy_with_grad")
_linear_cross_entropy, _linear_cross_entropy_c = _entry("linear_cross_entropy")
_swiglu, _swiglu_c = _entry("swiglu")
_geglu, _geglu_c = _entry("geglu")
_mlp, _mlp_c = _entry("mlp")

_ACTIVATIONS = (None, "gelu", "gelu_tanh", "swiglu", "geglu", "geglu_tanh")


def _type_error(e: RuntimeError, fn: str) -> Exception:
    """torch raises TypeError for an argument of the wrong type; the dispatcher's schema
    check raises RuntimeError ("Expected a value of type ..."). Same type as torch."""
    msg = str(e)
    if "Expected a value of type" in msg or "expected a value of type" in msg:
        return TypeError(f"{fn}(): {msg}")
    return e


def gelu(input: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GeLU, as torch.nn.functional.gelu: approximate is 'none' (erf) or 'tanh'."""
    if _compiling():
        return _gelu(input, approximate=approximate)
    try:
        y = _C.gelu(input, approximate)
        if y is NotImplemented:  # a subclass, a torch function mode, an odd argument
            y = _gelu_c(input, approximate=approximate)
        return y
    except RuntimeError as e:
        raise _type_error(e, "gelu") from None


def _shape(normalized_shape):
    return (normalized_shape,) if isinstance(normalized_shape, int) else normalized_shape


def layer_norm(
    input: torch.Tensor, normalized_shape, weight=None, bias=None, eps: float = 1e-5
) -> torch.Tensor:
    """LayerNorm, as torch.nn.functional.layer_norm (weight/bias in input's dtype or float32)."""
    try:
        if _compiling():
            return _layer_norm(input, list(_shape(normalized_shape)), weight, bias, eps)[0]
        y = _C.layer_norm(input, _shape(normalized_shape), weight, bias, eps)
        if y is NotImplemented:
            y = _layer_norm_c(input, _shape(normalized_shape), weight, bias, eps)[0]
        return y
    except RuntimeError as e:
        raise _type_error(e, "layer_norm") from None


def rms_norm(input: torch.Tensor, normalized_shape, weight=None, eps=None) -> torch.Tensor:
    """RMSNorm, as torch.nn.functional.rms_norm: eps=None is torch.finfo(input.dtype).eps."""
    try:
        if _compiling():
            return _rms_norm(input, list(_shape(normalized_shape)), weight, eps)[0]
        y = _C.rms_norm(input, _shape(normalized_shape), weight, eps)
        if y is NotImplemented:
            y = _rms_norm_c(input, _shape(normalized_shape), weight, eps)[0]
        return y
    except RuntimeError as e:
        raise _type_error(e, "rms_norm") from None


def add_layer_norm(
    input, residual, normalized_shape, weight=None, bias=None, eps=1e-5, residual_in_fp32=False
):
    """The pre-norm residual step in one kernel: s = input + residual, returns
    (layer_norm(s), s). s is float32 when residual_in_fp32, else input's dtype."""
    try:
        op = _add_layer_norm if _compiling() else _add_layer_norm_c
        out = op(
            input, residual, list(_shape(normalized_shape)), weight, bias, eps, residual_in_fp32
        )
    except RuntimeError as e:
        raise _type_error(e, "add_layer_norm") from None
    return out[0], out[1]


def add_rms_norm(input, residual, normalized_shape, weight=None, eps=None, residual_in_fp32=False):
    """As add_layer_norm with rms_norm: returns (rms_norm(s), s), s = input + residual."""
    try:
        op = _add_rms_norm if _compiling() else _add_rms_norm_c
        out = op(input, residual, list(_shape(normalized_shape)), weight, eps, residual_in_fp32)
    except RuntimeError as e:
        raise _type_error(e, "add_rms_norm") from None
    return out[0], out[1]


def softmax(
    input: torch.Tensor,
    dim: int = -1,
    _stacklevel: int = 3,
    dtype: torch.dtype = None,
    *,
    scale: float = 1.0,
    causal: bool = False,
) -> torch.Tensor:
    """softmax(scale * input) along dim, as torch.nn.functional.softmax (same positional
    arguments; default dim: the last; _stacklevel is accepted and unused).

    causal=True treats the last two dims as (query i, key j) and masks keys j > i before
    the softmax (output 0 there), as scaled_dot_product_attention(is_causal=True); it
    needs dim=-1. With dtype, the input is cast first, as in torch.nn.functional.softmax.
    """
    if dtype is not None:
        input = input.to(dtype)
    if _compiling():
        return _softmax(input, dim, scale=scale, causal=causal)
    try:
        if scale == 1.0 and not causal:
            y = _C.softmax(input, dim)
            if y is not NotImplemented:
                return y
        return _softmax_c(input, dim, scale=scale, causal=causal)
    except RuntimeError as e:
        raise _type_error(e, "softmax") from None


def log_softmax(
    input: torch.Tensor, dim: int = -1, _stacklevel: int = 3, dtype: torch.dtype = None
) -> torch.Tensor:
    """log_softmax along dim, as torch.nn.functional.log_softmax (default dim: the last)."""
    if dtype is not None:
        input = input.to(dtype)
    if _compiling():
        return _log_softmax(input, dim)
    try:
        y = _C.log_softmax(input, dim)
        return _log_softmax_c(input, dim) if y is NotImplemented else y
    except RuntimeError as e:
        raise _type_error(e, "log_softmax") from None


def _check_dropout_p(p: float) -> None:
    # The same check and message as torch.nn.functional.dropout (a ValueError there too).
    if p < 0.0 or p > 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")


def dropout(
    input: torch.Tensor,
    p: float = 0.5,
    training: bool = True,
    inplace: bool = False,
    *,
    generator: "torch.Generator | None" = None,
) -> torch.Tensor:
    """Dropout, as torch.nn.functional.dropout, with a counter-based (Philox) mask that is
    never stored: backward regenerates it from a 16-byte seed/offset.

    training=False or p=0 returns `input` itself (no kernel); p=1 returns zeros. The mask is
    drawn from `generator` or the default generator of input's device, so torch.manual_seed
    reproduces it and CUDA-graph replays draw fresh masks. inplace=True writes into `input`;
    when autograd records the call it computes out of place and copies back (an in-place op
    has no autograd formula here), which costs one temporary but still stores no mask."""
    _check_dropout_p(p)
    if not training or p == 0.0:
        return input
    if not inplace:
        if _compiling():
            return _dropout(input, p, True, generator=generator)[0]
        if generator is None:
            return _dropout_c(input, p, True)[0]
        return _dropout_c(input, p, True, generator=generator)[0]
    if torch.is_grad_enabled() and input.requires_grad:
        return input.copy_(_dropout(input, p, True, generator=generator)[0])
    _dropout_(input, p, True, generator=generator)
    return input


def bias_dropout_add(
    x: torch.Tensor,
    bias: "torch.Tensor | None",
    residual: torch.Tensor,
    p: float = 0.5,
    training: bool = True,
    *,
    generator: "torch.Generator | None" = None,
) -> torch.Tensor:
    """residual + dropout(x + bias, p, training) in one kernel (bias of shape [x.shape[-1]]
    or None); differentiable in x, bias and residual. Outside training (or p=0) it is the
    fused residual + x + bias, with no randomness drawn."""
    _check_dropout_p(p)
    if _compiling():
        return _bias_dropout_add(x, bias, residual, p, training, generator=generator)[0]
    if generator is None:
        return _bias_dropout_add_c(x, bias, residual, p, training)[0]
    return _bias_dropout_add_c(x, bias, residual, p, training, generator=generator)[0]


def matmul(input: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """torch.matmul for 2-D and 3-D operands (3-D batches broadcast) on the fused GEMM."""
    try:
        return (_matmul if _compiling() else _matmul_c)(input, other)
    except RuntimeError as e:
        raise _type_error(e, "matmul") from None


def linear(input: torch.Tensor, weight: torch.Tensor, bias=None, activation=None) -> torch.Tensor:
    """F.linear, then activation (None, "gelu" or "gelu_tanh") fused into the GEMM epilogue.

    Gated activations "swiglu", "geglu", "geglu_tanh" take weight [2N, in] (and bias [2N]):
    the output is act(z[..., :N]) * z[..., N:] for z = F.linear(input, weight, bias), the same
    as `gate, up = F.linear(input, weight, bias).chunk(2, -1); act(gate) * up`.

    When a gradient will be needed and there is an activation, the training op also returns
    the pre-activation, so backward does not recompute it.
    """
    if (
        activation is not None
        and torch.is_grad_enabled()
        and (
            input.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
        )
    ):
        return (_linear_fwd if _compiling() else _linear_fwd_c)(input, weight, bias, activation)[0]
    try:
        return (_linear if _compiling() else _linear_c)(input, weight, bias, activation)
    except RuntimeError as e:
        raise _type_error(e, "linear") from None


def cross_entropy(
    input: torch.Tensor,
    target: torch.Tensor,
    weight=None,
    size_average=None,
    ignore_index: int = -100,
    reduce=None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    *,
    z_loss: float = 0.0,
    inplace_backward: bool = False,
    precompute_grad: bool = False,
) -> torch.Tensor:
    """Cross-entropy over the LAST dim of `input` (logits [V], [N, V] or [B, T, V]; target of
    the leading shape or flat), as torch.nn.functional.cross_entropy with class indices:
    same ignore_index, reduction ('mean' over the non-ignored rows, 'sum', 'none') and
    label_smoothing. The logits are read once in their dtype, the math is float32, and the
    gradient is written in one pass. Unlike F.cross_entropy, a 3-d input keeps its classes
    last (as language models do), and the loss is float32 (float64 for float64 logits)
    whatever the logits' dtype.

    z_loss adds z_loss * logsumexp(logits)^2 per non-ignored row (PaLM's auxiliary loss).
    inplace_backward=True writes the gradient over the logits (their storage is consumed:
    nothing may read the logits after backward; autograd reports a saved-tensor conflict
    if something tries to), which saves a [rows, V] buffer.

    precompute_grad=True (reduction 'mean' or 'sum', a gradient wanted, not
    inplace_backward): the forward kernel also writes the gradient while it holds each row,
    and the backward only scales it by the loss's gradient. For a loss gradient of exactly
    1 (a plain loss.backward()) the scaling moves nothing and the logits are read once
    instead of twice; any other loss gradient (a loss divided by a token count or by
    gradient-accumulation steps, a GradScaler's scale) costs a pass more than the default.
    The saved gradient is scaled in place, so a second backward through the same graph
    (retain_graph) raises.

    Targets outside [0, V) other than ignore_index: an error on CPU; on CUDA (no host sync)
    that row's loss and gradient are NaN, never a read out of bounds. Per-class weights
    are not supported.
    """
    if weight is not None:
        raise ValueError(
            "fused_ops.cross_entropy: per-class weight is not supported; use "
            "torch.nn.functional.cross_entropy for weighted losses"
        )
    if size_average is not None or reduce is not None:
        reduction = torch.nn._reduction.legacy_get_string(size_average, reduce)
    if reduction == "mean" or reduction == "sum":
        if (
            precompute_grad
            and not inplace_backward
            and torch.is_grad_enabled()
            and input.requires_grad
        ):
            op = _cross_entropy_with_grad if _compiling() else _cross_entropy_with_grad_c
            return op(input, target, ignore_index, label_smoothing, z_loss, reduction == "mean")[0]
    elif reduction != "none":
        raise ValueError(f"{reduction} is not a valid value for reduction")
    # One call does the loss and its reduction ('mean': the sum over the rows whose target
    # is not ignore_index, divided by their count, NaN when every row is ignored, as torch).
    if _compiling():
        loss = _cross_entropy(
            input, target, ignore_index, label_smoothing, z_loss, inplace_backward, reduction
        )[0]
    else:
        loss = _cross_entropy_c(
            input, target, ignore_index, label_smoothing, z_loss, inplace_backward, reduction
        )[0]
    if reduction == "none" and input.dim() == 1 and target.dim() != 0:
        return loss.reshape(())
    return loss


def linear_cross_entropy(
    input: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias=None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    *,
    z_loss: float = 0.0,
    chunk_size: int = 0,
) -> torch.Tensor:
    """cross_entropy(linear(input, weight, bias), target, ...) without the full logits: the LM
    head and the loss in chunks of chunk_size tokens (0: 1024), the gradients of input,
    weight and bias computed chunk by chunk in the forward (so the backward reads no
    logits). Peak memory: the weight's gradient plus one chunk's logits, instead of the
    [tokens, V] logits and their float32 copies.

    reduction 'mean' (over the non-ignored rows) or 'sum'; 'none' (a per-row gradient that
    the forward cannot know) computes the full logits, as the unfused composition does.
    The loss is float32 (float64 for float64 inputs).
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    if reduction == "none":
        return cross_entropy(
            _ops.linear(input, weight, bias),
            target,
            ignore_index=ignore_index,
            reduction="none",
            label_smoothing=label_smoothing,
            z_loss=z_loss,
        )
    # The gradients the backward needs are asked for by the op's autograd (C++) itself.
    op = _linear_cross_entropy if _compiling() else _linear_cross_entropy_c
    return op(
        input,
        weight,
        target,
        bias,
        ignore_index,
        label_smoothing,
        z_loss,
        reduction == "mean",
        chunk_size,
    )[0]


def _dropout_add_norm(name, head, params, opts):
    """The dropout forms' call: head = (input, residual, normalized_shape), params =
    (weight, bias, eps) or (weight, eps), opts = (p, training, input_bias, residual_in_fp32)."""
    input, residual, normalized_shape = head
    p, training, ib, rif32 = opts
    _check_dropout_p(p)
    try:
        op = getattr(_ops, name).default
        op = op if _compiling() else op._op
        args = (input, residual, list(_shape(normalized_shape)), *params)
        out = op(*args, p=p, training=training, input_bias=ib, residual_in_fp32=rif32)
    except RuntimeError as e:
        raise _type_error(e, name) from None
    return out[0], out[1]


def dropout_add_layer_norm(
    input,
    residual,
    normalized_shape,
    weight=None,
    bias=None,
    eps=1e-5,
    *,
    p=0.0,
    training=True,
    input_bias=None,
    residual_in_fp32=False,
):
    """The post-sublayer residual step in one kernel: s = residual + dropout(input +
    input_bias, p), returns (layer_norm(s), s). s is float32 when residual_in_fp32, else
    input's dtype. The mask is never stored (backward regenerates it, as `dropout`); with
    p=0 or training=False and no input_bias it is add_layer_norm."""
    head = (input, residual, normalized_shape)
    opts = (p, training, input_bias, residual_in_fp32)
    return _dropout_add_norm("dropout_add_layer_norm", head, (weight, bias, eps), opts)


def dropout_add_rms_norm(
    input,
    residual,
    normalized_shape,
    weight=None,
    eps=None,
    *,
    p=0.0,
    training=True,
    input_bias=None,
    residual_in_fp32=False,
):
    """As dropout_add_layer_norm with rms_norm: returns (rms_norm(s), s), s = residual +
    dropout(input + input_bias, p)."""
    head = (input, residual, normalized_shape)
    opts = (p, training, input_bias, residual_in_fp32)
    return _dropout_add_norm("dropout_add_rms_norm", head, (weight, eps), opts)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up in one pass. gate and up may be the halves of one tensor
    (`gate, up = z.chunk(2, -1)`): they are read in place."""
    try:
        return (_swiglu if _compiling() else _swiglu_c)(gate, up)
    except RuntimeError as e:
        raise _type_error(e, "swiglu") from None


def geglu(gate: torch.Tensor, up: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """gelu(gate, approximate) * up in one pass ("none": erf, "tanh": as F.gelu)."""
    try:
        return (_geglu if _compiling() else _geglu_c)(gate, up, approximate=approximate)
    except RuntimeError as e:
        raise _type_error(e, "geglu") from None


_MLP_ACTIVATIONS = ("gelu", "gelu_tanh", "swiglu", "geglu", "geglu_tanh")


def mlp(
    input: torch.Tensor,
    w1: torch.Tensor,
    b1=None,
    w2: torch.Tensor = None,
    b2=None,
    activation: str = "gelu",
    *,
    recompute: bool = False,
) -> torch.Tensor:
    """F.linear(act(F.linear(input, w1, b1)), w2, b2): bias and activation in the first GEMM's
    epilogue, and in the backward the activation's derivative in the epilogue of the GEMM
    that makes its input gradient (Hopper).

    activation: "gelu", "gelu_tanh" (w1 [H, C]) or the gated "swiglu", "geglu", "geglu_tanh"
    (w1 [2H, C]: gate rows then up rows, as fused_ops.linear). w2 is [C_out, H].
    recompute=True keeps no [tokens, H] activation for the backward: it recomputes them from
    input with one GEMM.
    """
    if w2 is None:
        raise TypeError("mlp(): missing required argument 'w2'")
    try:
        op = _mlp if _compiling() else _mlp_c
        return op(input, w1, b1, w2, b2, activation, recompute)
    except RuntimeError as e:
        raise _type_error(e, "mlp") from None
