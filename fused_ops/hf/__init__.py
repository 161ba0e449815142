"""fused_ops applied to Hugging Face transformers models, per model instance (nothing in
transformers itself is changed): `fused_ops.hf.patch(model)` picks the patcher by the
model's type; `fused_ops.unpatch(model)` undoes any of them. transformers is needed only
when a patcher is called (`pip install fused_ops[hf]`)."""

from __future__ import annotations

__all__ = ["patch", "patch_gpt2", "patch_llama", "SUPPORTED"]

# config.model_type -> the patcher's name in this package.
SUPPORTED = {"gpt2": "patch_gpt2", "llama": "patch_llama"}


def _patcher(name: str):
    """The patcher function of module fused_ops.hf.<name> (imports transformers)."""
    import importlib

    try:
        module = importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name is None or not e.name.startswith("transformers"):
            raise
        raise ImportError(
            "fused_ops.hf patches Hugging Face transformers models and needs transformers: "
            "pip install 'fused_ops[hf]' (or transformers)"
        ) from e
    return getattr(module, f"patch_{name}")


def patch_gpt2(model, *, modules: bool = True, head_loss: bool = True):
    return _patcher("gpt2")(model, modules=modules, head_loss=head_loss)


def patch_llama(model, *, modules: bool = True, head_loss: bool = True):
    return _patcher("llama")(model, modules=modules, head_loss=head_loss)


patch_gpt2.__doc__ = "See fused_ops.hf.gpt2.patch_gpt2."
patch_llama.__doc__ = "See fused_ops.hf.llama.patch_llama."


def patch(model, *, modules: bool = True, head_loss: bool = True):
    """Patch a Hugging Face model in place with the patcher for its architecture
    (config.model_type); a model of another architecture is a ValueError naming the
    supported ones. Returns the patcher's PatchReport."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in SUPPORTED:
        got = repr(model_type) if model_type else f"{type(model).__name__} (no config.model_type)"
        raise ValueError(
            f"fused_ops.hf.patch: no patcher for model type {got}; supported: "
            f"{', '.join(sorted(SUPPORTED))}. fused_ops.patch(model) swaps the modules of "
            "any model."
        )
    return globals()[SUPPORTED[model_type]](model, modules=modules, head_loss=head_loss)
