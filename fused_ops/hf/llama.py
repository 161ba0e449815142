"""fused_ops for Hugging Face Llama (LlamaForCausalLM, LlamaModel), per model instance.

Beyond the module swaps of fused_ops.patch (the RMSNorms), the decoder stack (LlamaModel)
gets a forward that carries the residual stream from layer to layer, so each residual add
meets the RMSNorm after it in one fused_ops.add_rms_norm:

    n, h = add_rms_norm(d, h, input_layernorm)  d: the previous layer's MLP output
    a = self_attn(n)                            the attention function as configured (SDPA)
    n, h = add_rms_norm(a, h, post_attention_layernorm)
    d = mlp(n)                                  to the next layer (the final norm after the last)

The fused stack costs the host less than Hugging Face's: in training the GPU waits for the
host whenever the host is slower, so every op and every autograd node a step counts. The
residual stream is carried as a 2-D [tokens, hidden] tensor, so each of the seven linears
a layer is one GEMM (a 3-D input adds a view before and an unsafe view after it, and two
autograd nodes); the attention's forward (on that path only) applies RoPE as
x * cos + roll(x, D/2) * sin', with rotate_half's sign folded into sin' once a forward
for all layers: four ops on q and on k instead of seven (slices, neg, cat), each the same
arithmetic, so the same values.

The MLP's forward is down(swiglu(gate(x), up(x))) through fused_ops.swiglu (for the silu
activation; another activation leaves the MLP as it is, and the report says so). The stack's
forward falls back to Hugging Face's for what it does not cover (a key/value cache,
recorded hidden states or attentions, gradient checkpointing). The causal-LM forward
computes head + loss in one fused_ops.linear_cross_entropy in training with labels (its
logits are then None).
"""

from __future__ import annotations

import itertools

import torch
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaForCausalLM,
    LlamaModel,
    eager_attention_forward,
)

from .. import functional
from ..patch import has_forward, original_forward, set_forward
from ..patch import patch as patch_modules
from . import _common

_HF = object()  # a layer called without fused_residual: Hugging Face's own call


def _add_norm(delta, residual, norm):
    """(rms_norm(residual + delta), residual + delta); the norm of the residual alone for
    the first layer (delta None). norm is an RMSNorm of Hugging Face's form (weight,
    variance_epsilon) or torch's (weight, eps): patch_llama checked every norm once, so
    this reads the two attributes and nothing else (45 calls a step for 22 layers)."""
    weight = norm.weight
    if hasattr(norm, "variance_epsilon"):
        eps, shape = norm.variance_epsilon, weight.shape
    else:
        eps, shape = norm.eps, norm.normalized_shape
    if delta is None:
        return functional.rms_norm(residual, shape, weight, eps), residual
    return functional.add_rms_norm(delta, residual, shape, weight, eps)


def _layer_forward(self, *args, fused_residual=_HF, **kwargs):
    """HF's decoder-layer forward, or (called by the fused stack with fused_residual) the
    layer on the unadded residual stream: (delta, residual) -> (the MLP's output, not yet
    added; the residual stream). Each layer reads only its own parameters (FSDP gathers
    them per layer): the previous layer's MLP output is added in this layer's first norm."""
    if fused_residual is _HF:
        return original_forward(self)(self, *args, **kwargs)
    delta, rope = args
    x, residual = _add_norm(delta, fused_residual, self.input_layernorm)
    a = self.self_attn(x, fused_rope=rope, **kwargs)
    x, residual = _add_norm(a, residual, self.post_attention_layernorm)
    return self.mlp(x), residual


def _fold_rope(cos, sin, shape):
    """(cos, sin', shape) for _attn_forward, made once a forward: cos and sin ([b, T, D],
    as the rotary embedding makes them) unsqueezed to [b, T, 1, D] (queries and keys are
    [B, T, heads, D] there) and rotate_half's sign folded into sin: rotate_half(x) * sin =
    cat(-x2, x1) * cat(s1, s2) = cat(x2, x1) * cat(-s1, s2) = roll(x, D/2) * sin'."""
    half = sin.shape[-1] // 2
    sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
    return cos.unsqueeze(2), sin.unsqueeze(2), shape


def _rotate(x, cos, sin):
    """apply_rotary_pos_emb's x * cos + rotate_half(x) * sin on x [B, T, heads, D]."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin


def _attn_forward(self, *args, fused_rope=_HF, **kwargs):
    """HF's attention forward, or (called by the fused layer with fused_rope, from
    _fold_rope) the same attention on 2-D hidden states [tokens, hidden], without a cache,
    returning the output projection's [tokens, hidden] alone. The attention function is
    the configured one (SDPA, ...), called as Hugging Face calls it."""
    if fused_rope is _HF:
        return original_forward(self)(self, *args, **kwargs)
    (x,) = args
    cos, sin, shape = fused_rope
    heads = (*shape, -1, self.head_dim)
    q = _rotate(self.q_proj(x).view(heads), cos, sin).transpose(1, 2)
    k = _rotate(self.k_proj(x).view(heads), cos, sin).transpose(1, 2)
    v = self.v_proj(x).view(heads).transpose(1, 2)
    attention = ALL_ATTENTION_FUNCTIONS.get_interface(
        self.config._attn_implementation, eager_attention_forward
    )
    out, _ = attention(
        self,
        q,
        k,
        v,
        kwargs.pop("attention_mask", None),
        dropout=0.0 if not self.training else self.attention_dropout,
        scaling=self.scaling,
        **kwargs,
    )
    return self.o_proj(out.reshape(x.shape[0], -1))


def _stack_forward(
    self,
    input_ids=None,
    attention_mask=None,
    position_ids=None,
    cache=None,
    inputs_embeds=None,
    use_cache=None,
    **kwargs,
):
    if not _common.fused_path_ok(self, cache, use_cache, kwargs) or (input_ids is None) == (
        inputs_embeds is None
    ):
        return original_forward(self)(
            self,
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
    kwargs.pop("return_dict", None)
    if inputs_embeds is None:
        inputs_embeds = self.embed_tokens(input_ids)
    position_ids, mask = _common.positions_and_mask(
        self, inputs_embeds, attention_mask, position_ids
    )
    shape = inputs_embeds.shape[:-1]
    rope = _fold_rope(*self.rotary_emb(inputs_embeds, position_ids=position_ids), shape)
    delta, residual = None, inputs_embeds.reshape(-1, inputs_embeds.shape[-1])
    # islice, not self.layers[:n] (as HF's forward): slicing a ModuleList builds a new
    # ModuleList (an nn.Module.__init__ and n add_module calls) on every step.
    for layer in itertools.islice(self.layers, self.config.num_hidden_layers):
        delta, residual = layer(
            delta,
            rope,
            fused_residual=residual,
            attention_mask=mask,
            position_ids=position_ids,
            **kwargs,
        )
    x, _ = _add_norm(delta, residual, self.norm)
    return BaseModelOutputWithPast(last_hidden_state=x.view(*shape, -1))


def _mlp_forward(self, x):
    return self.down_proj(functional.swiglu(self.gate_proj(x), self.up_proj(x)))


def _is_llama_attention(attn) -> bool:
    """LlamaAttention with its own forward (or the one patch_llama gave it): a subclass
    that computes something else keeps Hugging Face's stack."""
    cls = type(attn)
    base = cls.__dict__.get("_fused_ops_base", cls)
    return base is LlamaAttention


def _is_llama_rms(norm) -> bool:
    try:
        return _common.residual_norm(norm)[0] == "rms"
    except TypeError:
        return False


def patch_llama(model: torch.nn.Module, *, modules: bool = True, head_loss: bool = True):
    """Patch a Hugging Face Llama model (LlamaForCausalLM or LlamaModel) in place: the module
    swaps of fused_ops.patch (modules=False skips them), the decoder stack's fused forward
    (residual adds through fused_ops.add_rms_norm), the MLP through fused_ops.swiglu, the loss on fused_ops.cross_entropy and, with head_loss, the LM head
    + loss in one fused_ops.linear_cross_entropy when training with labels. Returns a
    PatchReport."""
    if not isinstance(model, (LlamaForCausalLM, LlamaModel)):
        raise ValueError(
            f"fused_ops.hf.patch_llama: expected a LlamaForCausalLM or LlamaModel, got "
            f"{type(model).__name__}"
        )
    report = patch_modules(model, modules=modules)
    stack = model if isinstance(model, LlamaModel) else model.model
    where = "" if stack is model else "model"
    layers = list(stack.layers[: stack.config.num_hidden_layers])
    norms = [n for lay in layers for n in (lay.input_layernorm, lay.post_attention_layernorm)]
    attns_ok = all(_is_llama_attention(lay.self_attn) for lay in layers)
    if layers and attns_ok and all(_is_llama_rms(n) for n in norms + [stack.norm]):
        if not has_forward(stack):
            for layer in layers:
                set_forward(layer, _layer_forward)
                set_forward(layer.self_attn, _attn_forward)
            set_forward(stack, _stack_forward)
            report.forwards[where] = (
                "residual stream carried across layers (2-D): residual adds + RMSNorm through "
                "fused_ops.add_rms_norm; RoPE in four ops"
            )
    elif layers and not attns_ok:
        report.notes.append(
            "attention is not Hugging Face's LlamaAttention: the decoder stack keeps HF's forward"
        )
    elif layers:
        report.notes.append("norms are not RMSNorms: the decoder stack keeps HF's forward")
    if stack.config.hidden_act not in ("silu", "swish"):
        report.notes.append(f"MLP activation {stack.config.hidden_act!r}: MLP left as it is")
    else:
        for i, layer in enumerate(layers):
            if not has_forward(layer.mlp):
                set_forward(layer.mlp, _mlp_forward)
                report.forwards[f"{where}.layers.{i}.mlp".lstrip(".")] = (
                    "down(swiglu(gate(x), up(x))) through fused_ops.swiglu"
                )
    if isinstance(model, LlamaForCausalLM):
        _common.install_head(model, report, head_loss)
    return report
