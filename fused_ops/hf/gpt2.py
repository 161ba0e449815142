"""fused_ops for Hugging Face GPT-2 (GPT2LMHeadModel, GPT2Model), per model instance.

Beyond the module swaps of fused_ops.patch, the decoder stack (GPT2Model) gets a forward
that carries the residual stream from block to block, so that each residual add meets the
LayerNorm after it:

    n, h = dropout_add_layer_norm(d, h, ln_1, p)     d: the previous block's MLP output
    a = attention(n)                                 SDPA as configured, untouched
    m, h = dropout_add_layer_norm(a @ W_o, h, ln_2, p, input_bias=b_o)
    u = linear(m, W_fc^T, b_fc, activation="gelu_tanh")      GeLU in the GEMM's epilogue
    d = u @ W_proj + b_proj                          to the next block (ln_f after the last)

Conv1D keeps its weight as [in, out]: the GEMMs take it as it is (x @ W) or as a transposed
view (linear's W^T): no copies, the Parameters and state dict unchanged. The stack's forward
falls back to Hugging Face's for what it does not cover (a key/value cache, recorded hidden
states or attentions, cross-attention, gradient checkpointing), where the swapped modules
still apply. The LM head model's forward computes head + loss in one
fused_ops.linear_cross_entropy in training with labels (its logits are then None).
"""

from __future__ import annotations

import torch
from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.gpt2.modeling_gpt2 import (
    GPT2LMHeadModel,
    GPT2Model,
    eager_attention_forward,
)

from .. import functional
from ..patch import has_forward, original_forward, set_forward
from ..patch import patch as patch_modules
from . import _common

_HF = object()  # a block called without fused_residual: Hugging Face's own call
_GELU_EPILOGUE = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}


def _attention(attn, x, mask, kwargs):
    """GPT-2's attention up to the output projection (which the caller fuses)."""
    q, k, v = attn.c_attn(x).split(attn.split_size, dim=2)
    shape = (*q.shape[:-1], -1, attn.head_dim)
    q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
    fn = ALL_ATTENTION_FUNCTIONS.get_interface(
        attn.config._attn_implementation, eager_attention_forward
    )
    out, _ = fn(
        attn,
        q,
        k,
        v,
        mask,
        dropout=attn.attn_dropout.p if attn.training else 0.0,
        scaling=attn.scaling,
        **kwargs,
    )
    return out.reshape(*out.shape[:-2], -1)


def _add_norm(delta, residual, p, norm, training, bias=None):
    """norm(residual + dropout(delta + bias)) and that sum; the embeddings' residual
    alone (delta None) for the first block."""
    if delta is None:
        return norm(residual), residual
    return functional.dropout_add_layer_norm(
        delta,
        residual,
        norm.normalized_shape,
        norm.weight,
        norm.bias,
        norm.eps,
        p=p,
        training=training,
        input_bias=bias,
    )


def _block_forward(self, *args, fused_residual=_HF, fused_p=0.0, **kwargs):
    """HF's block forward, or (called by the fused stack with fused_residual) the block
    on the unadded residual stream: (delta, residual) -> (the MLP's output with its bias,
    not yet dropped out or added; the residual stream). Each block reads only its own
    parameters (FSDP gathers them per block): the previous block's MLP output comes
    with its bias added in the GEMM (addmm), and this block's ln_1 fuses its dropout
    and residual add."""
    if fused_residual is _HF:
        return original_forward(self)(self, *args, **kwargs)
    (delta,) = args
    mask = kwargs.pop("attention_mask")
    attn, mlp = self.attn, self.mlp
    epilogue = _GELU_EPILOGUE.get(attn.config.activation_function)
    x, residual = _add_norm(delta, fused_residual, fused_p, self.ln_1, self.training)
    a = _attention(attn, x, mask, kwargs)
    x, residual = _add_norm(
        torch.matmul(a, attn.c_proj.weight),
        residual,
        attn.resid_dropout.p,
        self.ln_2,
        self.training,
        attn.c_proj.bias,
    )
    if epilogue is not None:
        u = functional.linear(x, mlp.c_fc.weight.t(), mlp.c_fc.bias, epilogue)
    else:
        u = mlp.act(mlp.c_fc(x))
    return mlp.c_proj(u), residual


def _stack_forward(
    self,
    input_ids=None,
    cache=None,
    attention_mask=None,
    token_type_ids=None,
    position_ids=None,
    inputs_embeds=None,
    encoder_hidden_states=None,
    encoder_attention_mask=None,
    use_cache=None,
    **kwargs,
):
    if (
        not _common.fused_path_ok(self, cache, use_cache, kwargs)
        or encoder_hidden_states is not None
        or (input_ids is None) == (inputs_embeds is None)
    ):
        return original_forward(self)(
            self,
            input_ids,
            cache=cache,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
            use_cache=use_cache,
            **kwargs,
        )
    kwargs.pop("return_dict", None)
    if input_ids is not None:
        input_shape = input_ids.shape
        input_ids = input_ids.view(-1, input_shape[-1])
        inputs_embeds = self.wte(input_ids)
    else:
        input_shape = inputs_embeds.shape[:-1]
    if attention_mask is not None and attention_mask.ndim < 4:
        attention_mask = attention_mask.view(inputs_embeds.shape[0], -1)
    position_ids, mask = _common.positions_and_mask(
        self, inputs_embeds, attention_mask, position_ids
    )
    hidden = inputs_embeds + self.wpe(position_ids).to(inputs_embeds.device)
    if token_type_ids is not None:
        hidden = hidden + self.wte(token_type_ids.view(-1, input_shape[-1]))
    delta, residual, p = None, self.drop(hidden), 0.0
    for block in self.h:
        delta, residual = block(
            delta,
            fused_residual=residual,
            fused_p=p,
            attention_mask=mask,
            position_ids=position_ids,
            **kwargs,
        )
        p = block.mlp.dropout.p
    x, _ = _add_norm(delta, residual, p, self.ln_f, self.training)
    out_shape = (-1,) + tuple(input_shape[1:]) + (x.shape[-1],)
    return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=x.view(out_shape))


def patch_gpt2(model: torch.nn.Module, *, modules: bool = True, head_loss: bool = True):
    """Patch a Hugging Face GPT-2 model (GPT2LMHeadModel or GPT2Model) in place: the module
    swaps of fused_ops.patch (modules=False skips them), the decoder stack's fused forward,
    the loss on fused_ops.cross_entropy and, with head_loss, the LM head + loss in one
    fused_ops.linear_cross_entropy when training with labels. Returns a PatchReport."""
    if not isinstance(model, (GPT2LMHeadModel, GPT2Model)):
        raise ValueError(
            f"fused_ops.hf.patch_gpt2: expected a GPT2LMHeadModel or GPT2Model, got "
            f"{type(model).__name__}"
        )
    report = patch_modules(model, modules=modules)
    stack = model if isinstance(model, GPT2Model) else model.transformer
    where = "" if stack is model else "transformer"
    config = stack.config
    attn0 = stack.h[0].attn if len(stack.h) else None
    if config.add_cross_attention:
        report.notes.append("cross-attention model: the decoder stack keeps HF's forward")
    elif attn0 is not None and attn0.reorder_and_upcast_attn:
        report.notes.append("reorder_and_upcast_attn: the decoder stack keeps HF's forward")
    elif len(stack.h) and not has_forward(stack):
        epilogue = _GELU_EPILOGUE.get(config.activation_function)
        for block in stack.h:
            set_forward(block, _block_forward)
        set_forward(stack, _stack_forward)
        report.forwards[where] = (
            "residual stream carried across blocks: output projections + bias + dropout + "
            "residual + next LayerNorm fused"
            + (f"; c_fc + {epilogue} through fused_ops.linear" if epilogue else "")
        )
        if epilogue is None:
            report.notes.append(
                f"activation {config.activation_function!r}: applied after c_fc, not fused"
            )
    if isinstance(model, GPT2LMHeadModel):
        _common.install_head(model, report, head_loss)
    return report
