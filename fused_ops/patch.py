"""Applying fused_ops to a model a user already has: `fused_ops.patch(model)` swaps, in place,
the modules that have a fused twin, and `fused_ops.unpatch(model)` puts them back.

A swapped module keeps its identity: only its class changes, to the fused_ops.nn twin (a
subclass of the torch.nn class that overrides forward) or, for Hugging Face modules with the
same arithmetic, to a subclass of the module's own class whose forward calls the fused op.
So the module's Parameters, buffers, hooks, `isinstance` checks, state-dict keys and any
reference an optimiser or a wrapper holds all stay as they were; nothing is copied.

Only exact types are swapped (`type(m) is torch.nn.LayerNorm`): a subclass may compute
something else. Hugging Face RMSNorms qualify when their forward is Llama's, statement for
statement (transformers generates the Mistral, Qwen2, ... copies from it); GeLUs when they
are the tanh form (NewGELUActivation, GELUTanh) or GELUActivation on F.gelu.

The model-specific patchers (fused_ops.hf) add forwards that fuse across modules, each
through a generated subclass of the module's class (set_forward); `unpatch` removes those
too. The bookkeeping lives in each patched module's
`_fused_ops_patched` attribute (not a buffer or Parameter, so state dicts do not see it).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections import Counter
from dataclasses import dataclass, field

import torch

from . import functional
from . import nn as fnn

__all__ = ["patch", "unpatch", "PatchReport"]

_STATE = "_fused_ops_patched"
_NO_FORWARD = object()  # the instance had no forward of its own before patching


@dataclass
class PatchReport:
    """What patch (or unpatch) changed.

    modules:  {qualified module name: (class before, class after)} for every class swap;
    forwards: {qualified module name: what its new forward fuses} (model-specific patchers);
    notes:    what was left as it is and why (an op missing from this build, a config the
              fused forward does not cover).
    An empty report (nothing to patch) is falsy."""

    modules: dict = field(default_factory=dict)
    forwards: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)

    def counts(self) -> Counter:
        """How many modules of each original class were swapped."""
        return Counter(before for before, _ in self.modules.values())

    def __bool__(self) -> bool:
        return bool(self.modules or self.forwards)

    def __len__(self) -> int:
        return len(self.modules) + len(self.forwards)

    def merge(self, other: PatchReport) -> PatchReport:
        self.modules.update(other.modules)
        self.forwards.update(other.forwards)
        self.notes.extend(n for n in other.notes if n not in self.notes)
        return self

    def __str__(self) -> str:
        if not self:
            lines = ["nothing patched"]
        else:
            counts = ", ".join(f"{n} {k}" for k, n in sorted(self.counts().items()))
            lines = [f"{len(self.modules)} modules swapped" + (f" ({counts})" if counts else "")]
            lines += [f"{name or '<model>'}: {what}" for name, what in self.forwards.items()]
        return "\n".join(lines + [f"note: {n}" for n in self.notes])


# ---- HF modules recognised by their arithmetic ------------------------------------------


def _statements(fn) -> str | None:
    """fn's body as a normalised AST dump (docstring and formatting ignored), or None."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None
    body = tree.body[0].body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return "\n".join(ast.dump(s) for s in body)


_LLAMA_RMS_FORWARD: list = []  # [normalised body of LlamaRMSNorm.forward or None], lazily


def _llama_rms_forward():
    if not _LLAMA_RMS_FORWARD:
        try:
            from transformers.models.llama.modeling_llama import LlamaRMSNorm
        except ImportError:
            _LLAMA_RMS_FORWARD.append(None)
        else:
            _LLAMA_RMS_FORWARD.append(_statements(LlamaRMSNorm.forward))
    return _LLAMA_RMS_FORWARD[0]


def _is_hf_llama_rms_norm(cls) -> bool:
    """A Hugging Face RMSNorm computing weight * (x / rms(x)) as LlamaRMSNorm does."""
    if not cls.__module__.startswith("transformers.") or not cls.__name__.endswith("RMSNorm"):
        return False
    ref = _llama_rms_forward()
    return ref is not None and _statements(cls.forward) == ref


def _hf_gelu_kind(module) -> str | None:
    """'tanh' or 'none' for a Hugging Face GeLU module fused_ops computes, else None."""
    cls = type(module)
    if not cls.__module__.startswith("transformers."):
        return None
    if cls.__name__ == "NewGELUActivation":
        return "tanh"
    if cls.__name__ in ("GELUTanh", "PytorchGELUTanh"):
        act = getattr(module, "act", None)  # functools.partial(F.gelu, approximate="tanh")
        if getattr(act, "func", None) is torch.nn.functional.gelu and act.keywords == {
            "approximate": "tanh"
        }:
            return "tanh"
        return None
    if cls.__name__ == "GELUActivation":
        return "none" if getattr(module, "act", None) is torch.nn.functional.gelu else None
    return None


def _rms_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    return functional.rms_norm(
        hidden_states, self.weight.shape, self.weight, self.variance_epsilon
    ).to(torch.promote_types(hidden_states.dtype, self.weight.dtype))


def _gelu_tanh_forward(self, input: torch.Tensor) -> torch.Tensor:
    return functional.gelu(input, "tanh")


def _gelu_forward(self, input: torch.Tensor) -> torch.Tensor:
    return functional.gelu(input, "none")


_SUBCLASSES: dict = {}


def _new_subclass_instance(base: type, forward, keep_name: bool):
    """Unpickling: an empty instance of _fused_subclass(base, forward, keep_name), the
    subclass made again in a process that has not patched yet; pickle then restores its
    state."""
    cls = _fused_subclass(base, forward, keep_name)
    return cls.__new__(cls)


def _reduce_fused_subclass(self, protocol):
    cls = type(self)
    if "_fused_ops_base" not in cls.__dict__:  # a further subclass (FSDP's): as usual
        return object.__reduce_ex__(self, protocol)
    args = (cls._fused_ops_base, cls._fused_ops_forward, cls._fused_ops_keep_name)
    return (_new_subclass_instance, args, self.__getstate__())


def _fused_subclass(base: type, forward, keep_name: bool = False) -> type:
    """One subclass of base per (base, forward), with forward(module, ...) as its forward,
    named Fused<base>_<n> (keep_name: base's own __name__, for the patchers' forwards:
    Hugging Face writes type(model).__name__ into config.architectures and matches
    _no_split_modules by it). Instances pickle as (base, forward) by their qualified
    names, so a model saved patched loads in a process that never patched; the class is
    also published in this module under its qualified name. The original forward is
    original_forward(module)."""
    key = (base, forward, keep_name)
    if key not in _SUBCLASSES:
        qualname = f"Fused{base.__name__}_{len(_SUBCLASSES)}"
        cls = type(
            base.__name__ if keep_name else qualname,
            (base,),
            {
                "forward": forward,
                "_fused_ops_base": base,
                # forward as given: transformers' GradientCheckpointingLayer wraps the
                # forward of each subclass (checkpointing only in the outermost wrapper)
                "_fused_ops_forward": forward,
                "_fused_ops_keep_name": keep_name,
                "__reduce_ex__": _reduce_fused_subclass,
                "__module__": __name__,
            },
        )
        cls.__qualname__ = qualname
        globals()[qualname] = cls
        _SUBCLASSES[key] = cls
    return _SUBCLASSES[key]


# ---- the swaps -----------------------------------------------------------------------------

_TORCH_SWAPS = {
    "layer_norm": {torch.nn.LayerNorm: fnn.LayerNorm},
    "rms_norm": {torch.nn.RMSNorm: fnn.RMSNorm},
    "gelu": {torch.nn.GELU: fnn.GELU},
    "dropout": {torch.nn.Dropout: fnn.Dropout},
    "softmax": {torch.nn.Softmax: fnn.Softmax},
}


def _target_class(module, kinds) -> type | None:
    """The fused class for module, or None when it has none (or its kind is off)."""
    cls = type(module)
    for kind, table in _TORCH_SWAPS.items():
        if kind in kinds and cls in table:
            return table[cls]
    if "rms_norm" in kinds and _is_hf_llama_rms_norm(cls):
        return _fused_subclass(cls, _rms_forward)
    if "gelu" in kinds:
        kind = _hf_gelu_kind(module)
        if kind is not None:
            return _fused_subclass(cls, _gelu_tanh_forward if kind == "tanh" else _gelu_forward)
    return None


def _state(module) -> dict:
    return module.__dict__.setdefault(_STATE, {})


def swap_class(module: torch.nn.Module, cls: type) -> None:
    """Give module the class cls (a subclass of its own), remembering the original."""
    state = _state(module)
    state.setdefault("class", type(module))
    module.__class__ = cls


def original_forward(module: torch.nn.Module):
    """The forward module had before set_forward (its class's own), unbound."""
    return type(module)._fused_ops_base.forward


def set_forward(module: torch.nn.Module, forward) -> None:
    """Give module the forward forward(module, ...) (a function defined once at module
    level), through a generated subclass of its class: the forward lives on a class, not
    in the instance's __dict__, so that every layer of a model runs the same code object on
    the same type and torch.compile compiles a layer's forward once for all layers (an
    instance attribute differs per layer and fails dynamo's guards on each). unpatch
    restores the class. A forward the instance had of its own (in its __dict__, which
    nn.Module.__call__ would find first) is set aside until then."""
    state = _state(module)
    state.setdefault("forward", module.__dict__.pop("forward", _NO_FORWARD))
    swap_class(module, _fused_subclass(type(module), forward, keep_name=True))


def set_attr(module: torch.nn.Module, name: str, value) -> None:
    """Set an instance attribute, remembering its previous value (or its absence)."""
    saved = _state(module).setdefault("attrs", {})
    saved.setdefault(name, module.__dict__.get(name, _NO_FORWARD))
    module.__dict__[name] = value


def has_forward(module: torch.nn.Module) -> bool:
    """Whether a patcher already gave this module its own forward."""
    return "forward" in module.__dict__.get(_STATE, {})


def has_attr(module: torch.nn.Module, name: str) -> bool:
    """Whether a patcher already set this instance attribute."""
    return name in module.__dict__.get(_STATE, {}).get("attrs", {})


def _check_module(model, fn: str) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"fused_ops.{fn}: expected a torch.nn.Module, got {type(model).__name__}")


KINDS = tuple(_TORCH_SWAPS)


def patch(
    model: torch.nn.Module,
    *,
    modules: bool = True,
    layer_norm: bool = True,
    rms_norm: bool = True,
    gelu: bool = True,
    dropout: bool = True,
    softmax: bool = True,
) -> PatchReport:
    """Swap, in place, every module of model (model itself included) that has a fused twin:
    torch.nn.LayerNorm, RMSNorm, GELU, Dropout, Softmax, Hugging Face's Llama-style RMSNorms
    and GeLU modules. Each flag turns one kind off; modules=False swaps nothing (the
    model-specific patchers use it to add only their fused forwards).

    Returns a PatchReport of what changed; a model with nothing to patch (or one patched
    already) gives an empty report, not an error. `unpatch(model)` undoes it."""
    _check_module(model, "patch")
    report = PatchReport()
    if not modules:
        return report
    flags = dict(
        layer_norm=layer_norm, rms_norm=rms_norm, gelu=gelu, dropout=dropout, softmax=softmax
    )
    kinds = {k for k, on in flags.items() if on}
    for name, module in model.named_modules(remove_duplicate=True):
        cls = _target_class(module, kinds)
        if cls is None:
            continue
        before = type(module).__name__
        swap_class(module, cls)
        report.modules[name] = (before, cls.__name__)
    return report


def unpatch(model: torch.nn.Module) -> PatchReport:
    """Undo patch and the fused_ops.hf patchers on model: original classes, forwards and
    attributes back. Returns what was restored (empty when nothing was patched)."""
    _check_module(model, "unpatch")
    report = PatchReport()
    for name, module in model.named_modules(remove_duplicate=True):
        state = module.__dict__.pop(_STATE, None)
        if state is None:
            continue
        if "class" in state:
            cls = type(module)
            if not (getattr(cls, "_fused_ops_keep_name", False) and cls.__base__ is state["class"]):
                report.modules[name] = (type(module).__name__, state["class"].__name__)
            module.__class__ = state["class"]
        if "forward" in state:
            module.__dict__.pop("forward", None)
            if state["forward"] is not _NO_FORWARD:
                module.__dict__["forward"] = state["forward"]
            report.forwards[name] = "original forward"
        for attr, old in state.get("attrs", {}).items():
            module.__dict__.pop(attr, None)
            if old is not _NO_FORWARD:
                module.__dict__[attr] = old
    return report
