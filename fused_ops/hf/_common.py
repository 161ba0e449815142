"""What the GPT-2 and Llama patchers share: the causal-LM loss on fused_ops.cross_entropy,
the LM head + loss through fused_ops.linear_cross_entropy, and when a fused forward may
stand in for Hugging Face's. Imported only when a patcher runs: transformers is needed."""

from __future__ import annotations

import torch
from transformers.masking_utils import create_causal_mask
from transformers.modeling_outputs import CausalLMOutputWithCrossAttentions, CausalLMOutputWithPast

from .. import functional
from ..patch import has_attr, has_forward, original_forward, set_attr, set_forward

# Keyword arguments that ask for something only Hugging Face's own forward provides.
_HF_ONLY = ("output_attentions", "output_hidden_states", "past_key_values")


def fused_path_ok(module, cache, use_cache, kwargs) -> bool:
    """Whether the fused stack forward computes what HF's would: a training-style call (no
    key/value cache in or out, no recorded hidden states or attentions, no gradient
    checkpointing). use_cache=None counts as False in training (HF would build a cache
    nobody reads) and as the configuration's value in eval mode (generation wants it)."""
    config = module.config
    if cache is not None:
        return False
    if use_cache is None:
        use_cache = False if module.training else getattr(config, "use_cache", False)
    if use_cache:
        return False
    if any(kwargs.get(k) for k in _HF_ONLY) or kwargs.get("return_dict") is False:
        return False
    if getattr(config, "output_hidden_states", False) or getattr(
        config, "output_attentions", False
    ):
        return False
    return not (getattr(module, "gradient_checkpointing", False) and module.training)


def shifted_labels(labels, shift_labels, ignore_index):
    """The next-token targets, flat: labels shifted left by one, ignore_index at the end."""
    if shift_labels is None:
        shift_labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    return shift_labels.reshape(-1)


def _reduce(loss_sum_or_mean, num_items_in_batch):
    if num_items_in_batch is None:
        return loss_sum_or_mean
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(loss_sum_or_mean.device)
    return loss_sum_or_mean / num_items_in_batch


def causal_lm_loss(
    logits,
    labels,
    vocab_size: int,
    num_items_in_batch=None,
    ignore_index: int = -100,
    shift_labels=None,
    **kwargs,
):
    """Hugging Face's ForCausalLMLoss on fused_ops.cross_entropy: the logits are read in
    their own dtype (no float32 copy of [tokens, vocabulary]); the loss is float32. With
    num_items_in_batch, the sum over the tokens divided by it (as HF's)."""
    target = shifted_labels(labels, shift_labels, ignore_index).to(logits.device)
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = functional.cross_entropy(
        logits.reshape(-1, vocab_size), target, ignore_index=ignore_index, reduction=reduction
    )
    return _reduce(loss, num_items_in_batch)


def head_loss(hidden, lm_head, labels, kwargs, ignore_index: int = -100):
    """The LM head and the causal-LM loss in one fused_ops.linear_cross_entropy: the
    [tokens, vocabulary] logits are never materialised."""
    num_items = kwargs.get("num_items_in_batch")
    target = shifted_labels(labels, kwargs.get("shift_labels"), ignore_index)
    loss = functional.linear_cross_entropy(
        hidden.reshape(-1, hidden.shape[-1]),
        lm_head.weight,
        target.to(hidden.device),
        lm_head.bias,
        ignore_index=ignore_index,
        reduction="sum" if num_items is not None else "mean",
    )
    return _reduce(loss, num_items)


def head_loss_ok(model, labels, cache, use_cache, logits_to_keep, kwargs) -> bool:
    """Whether the LM head + loss may skip the logits: training with labels, nothing that
    needs logits or HF's own outputs."""
    if labels is None or not model.training or cache is not None or use_cache:
        return False
    if not (isinstance(logits_to_keep, int) and logits_to_keep == 0):
        return False
    if any(kwargs.get(k) for k in _HF_ONLY) or kwargs.get("return_dict") is False:
        return False
    head = model.get_output_embeddings()
    return isinstance(head, torch.nn.Linear) and labels.dim() == 2


def install_loss(model, report, where: str) -> None:
    """The model's loss_function (HF's ForCausalLMLoss) on fused_ops.cross_entropy."""
    if getattr(model, "loss_type", None) not in (None, "ForCausalLM"):
        report.notes.append(f"loss: loss_type {model.loss_type!r} left as it is")
        return
    if has_attr(model, "_loss_function"):
        return
    set_attr(model, "_loss_function", causal_lm_loss)
    report.forwards[f"{where}.loss_function" if where else "loss_function"] = (
        "causal-LM loss on fused_ops.cross_entropy"
    )


def residual_norm(norm):
    """(kind, weight, bias, eps, normalized_shape) of a LayerNorm or RMSNorm module (torch,
    fused_ops or Hugging Face style)."""
    weight = getattr(norm, "weight", None)
    if hasattr(norm, "variance_epsilon"):  # HF's RMSNorms
        return "rms", weight, None, norm.variance_epsilon, tuple(weight.shape)
    if isinstance(norm, torch.nn.RMSNorm):
        return "rms", weight, None, norm.eps, tuple(norm.normalized_shape)
    if isinstance(norm, torch.nn.LayerNorm):
        return "layer", weight, norm.bias, norm.eps, tuple(norm.normalized_shape)
    raise TypeError(f"fused_ops.hf: {type(norm).__name__} is not a LayerNorm or RMSNorm")


# The output class of each supported causal LM's forward, by config.model_type.
_LM_OUTPUT = {"gpt2": CausalLMOutputWithCrossAttentions, "llama": CausalLMOutputWithPast}


def lm_forward(self, *args, labels=None, **kwargs):
    """The causal LM's forward: in training with labels, the base model's hidden states go
    to head_loss (no logits); anything else is the class's own forward."""
    if len(args) == 1 and "input_ids" not in kwargs:
        kwargs["input_ids"] = args[0]
        args = ()
    if (
        args
        or kwargs.get("encoder_hidden_states") is not None
        or not head_loss_ok(
            self,
            labels,
            kwargs.get("cache"),
            kwargs.get("use_cache"),
            kwargs.get("logits_to_keep", 0),
            kwargs,
        )
    ):
        return original_forward(self)(self, *args, labels=labels, **kwargs)
    kwargs.pop("logits_to_keep", None)
    kwargs.pop("cache", None)
    kwargs["use_cache"] = False
    out = getattr(self, self.base_model_prefix)(**kwargs)
    loss = head_loss(out.last_hidden_state, self.get_output_embeddings(), labels, kwargs)
    return _LM_OUTPUT[self.config.model_type](loss=loss, logits=None)


def install_head(model, report, head_loss_on: bool) -> None:
    """The loss on fused_ops.cross_entropy and, with head_loss_on, the fused head + loss."""
    install_loss(model, report, "")
    if head_loss_on and not has_forward(model):
        set_forward(model, lm_forward)
        report.forwards["lm_head"] = (
            "training with labels: LM head + loss through fused_ops.linear_cross_entropy "
            "(logits not returned)"
        )


def positions_and_mask(stack, inputs_embeds, attention_mask, position_ids):
    """(position ids, the attention mask as the configured attention wants it) for a call
    without a cache, as Hugging Face's stack forward makes them.

    Given position ids go to create_causal_mask, which looks in them for packed sequences
    (a reset of the positions inside a row): that test reads a tensor on the host, a GPU
    synchronisation. Positions made here are one arange, never packed, so the mask is made
    without them: the same mask, and no synchronisation. (Hugging Face's own forward skips
    the test too in training, where use_cache builds a cache.) With the synchronisation at
    the start of every forward, the host could not queue the next step's forward while the
    GPU still ran the optimizer step: the forward's host time showed as GPU idle time."""
    given = position_ids
    if position_ids is None:
        position_ids = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device)
        position_ids = position_ids.unsqueeze(0)
    mask = create_causal_mask(
        config=stack.config,
        inputs_embeds=inputs_embeds,
        attention_mask=attention_mask,
        cache=None,
        position_ids=given,
    )
    return position_ids, mask
