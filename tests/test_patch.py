"""fused_ops.patch / unpatch and the Hugging Face patchers (fused_ops.hf) on CPU: tiny GPT-2
and Llama models from configurations (random weights, nothing downloaded), patched against
unpatched copies of the same weights: logits, loss and every gradient equal within float32
tolerance; unpatch restores; state dicts load both ways; torch.compile(fullgraph=True)
traces the patched models; bad input gets clear errors."""

import copy
import os

import pytest
import torch

import fused_ops
from fused_ops import functional

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

F32 = dict(rtol=1e-5, atol=1e-5)


def _transformers():
    return pytest.importorskip(
        "transformers",
        reason="transformers is not installed: pip install 'fused_ops[hf]' (make test's setup "
        "installs it)",
    )


# ---- fused_ops.patch on plain torch modules ---------------------------------------------


class Plain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(24)
        self.rms = torch.nn.RMSNorm(24, eps=1e-6)
        self.act = torch.nn.GELU(approximate="tanh")
        self.drop = torch.nn.Dropout(0.25)
        self.lin = torch.nn.Linear(24, 24)
        self.soft = torch.nn.Softmax(dim=-1)

    def forward(self, x):
        return self.soft(self.lin(self.drop(self.act(self.rms(self.ln(x))))))


def test_patch_plain_modules_shares_parameters_and_matches():
    torch.manual_seed(0)
    ref = Plain().eval()
    model = copy.deepcopy(ref)
    params = {n: p for n, p in model.named_parameters()}
    x = torch.randn(5, 24)
    report = fused_ops.patch(model)
    assert report and len(report) == 5
    assert dict(report.counts()) == {
        "LayerNorm": 1,
        "RMSNorm": 1,
        "GELU": 1,
        "Dropout": 1,
        "Softmax": 1,
    }
    assert report.modules["ln"] == ("LayerNorm", "LayerNorm")
    assert type(model.ln) is fused_ops.nn.LayerNorm
    assert type(model.rms) is fused_ops.nn.RMSNorm
    assert type(model.act) is fused_ops.nn.GELU
    assert type(model.drop) is fused_ops.nn.Dropout
    assert type(model.soft) is fused_ops.nn.Softmax
    assert type(model.lin) is torch.nn.Linear
    # The same Parameter objects: an optimiser built before the patch still updates them.
    assert all(p is params[n] for n, p in model.named_parameters())
    assert list(model.state_dict()) == list(ref.state_dict())
    torch.testing.assert_close(model(x), ref(x), **F32)
    assert "5 modules swapped" in str(report)
    # Idempotent: a second patch finds nothing left to do.
    assert not fused_ops.patch(model)


def test_patch_kind_flags_and_modules_off():
    model = Plain()
    report = fused_ops.patch(model, dropout=False, softmax=False)
    assert set(report.counts()) == {"LayerNorm", "RMSNorm", "GELU"}
    assert type(model.drop) is torch.nn.Dropout
    assert not fused_ops.patch(Plain(), modules=False)


def test_unpatch_restores_classes():
    model = Plain()
    fused_ops.patch(model)
    restored = fused_ops.unpatch(model)
    assert len(restored.modules) == 5
    assert type(model.ln) is torch.nn.LayerNorm and type(model.soft) is torch.nn.Softmax
    assert not any("_fused_ops_patched" in m.__dict__ for m in model.modules())
    assert not fused_ops.unpatch(model)  # nothing left to restore


def test_subclasses_are_left_alone():
    class MyNorm(torch.nn.LayerNorm):
        def forward(self, x):
            return super().forward(x) * 2

    model = torch.nn.Sequential(MyNorm(8))
    assert not fused_ops.patch(model)
    assert type(model[0]) is MyNorm


def test_nothing_to_patch_is_an_empty_report():
    report = fused_ops.patch(torch.nn.Linear(4, 4))
    assert not report and len(report) == 0 and report.modules == {}
    assert str(report) == "nothing patched"


def test_patch_bad_input():
    with pytest.raises(TypeError, match="expected a torch.nn.Module"):
        fused_ops.patch("model")
    with pytest.raises(TypeError, match="expected a torch.nn.Module"):
        fused_ops.unpatch(None)


def test_patched_module_trains_and_gradients_match():
    torch.manual_seed(1)
    ref = Plain().eval()
    model = copy.deepcopy(ref)
    fused_ops.patch(model)
    x = torch.randn(7, 24)
    ref(x).square().sum().backward()
    model(x).square().sum().backward()
    for (n, a), (_, b) in zip(ref.named_parameters(), model.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, **F32, msg=n)


def test_compile_fullgraph_of_patched_module():
    model = Plain().eval()
    fused_ops.patch(model)
    x = torch.randn(3, 24)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), model(x), **F32)


# ---- Hugging Face models -------------------------------------------------------------------


def _gpt2(seed=0, **over):
    tr = _transformers()
    cfg = dict(
        n_layer=2,
        n_embd=64,
        n_head=4,
        n_positions=32,
        vocab_size=97,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    cfg.update(over)
    torch.manual_seed(seed)
    return tr.GPT2LMHeadModel._from_config(tr.GPT2Config(**cfg), attn_implementation="sdpa").float()


def _llama(seed=0, **over):
    tr = _transformers()
    cfg = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=97,
        max_position_embeddings=64,
    )
    cfg.update(over)
    torch.manual_seed(seed)
    return tr.LlamaForCausalLM._from_config(
        tr.LlamaConfig(**cfg), attn_implementation="sdpa"
    ).float()


BUILD = {"gpt2": _gpt2, "llama": _llama}


def _ids(batch=2, seq=16, vocab=97, seed=3):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), generator=g)


@pytest.fixture(params=["gpt2", "llama"])
def pair(request):
    """(architecture, unpatched model, patched copy of the same weights, report)."""
    ref = BUILD[request.param]()
    model = copy.deepcopy(ref)
    report = fused_ops.hf.patch(model)
    return request.param, ref, model, report


def _grads(model):
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def test_hf_report_contents(pair):
    arch, _, model, report = pair
    counts = report.counts()
    if arch == "gpt2":
        assert counts["LayerNorm"] == 5  # 2 blocks x (ln_1, ln_2) + ln_f
        assert counts["NewGELUActivation"] == 2
        assert counts["Dropout"] == 2 * 3 + 1
        assert {"transformer", "lm_head", "loss_function"} <= set(report.forwards)
        assert "fused" in report.forwards["transformer"]
        assert "gelu_tanh" in report.forwards["transformer"]
        has_daln = hasattr(functional, "dropout_add_layer_norm")
        assert has_daln != any("dropout_add_layer_norm" in n for n in report.notes)
    else:
        assert counts["LlamaRMSNorm"] == 2 * 2 + 1
        assert {"model", "lm_head", "loss_function"} <= set(report.forwards)
        has_swiglu = hasattr(functional, "swiglu")
        assert has_swiglu == ("model.layers.0.mlp" in report.forwards)
        assert has_swiglu != any("swiglu" in n for n in report.notes)
    # Patching again finds everything patched already.
    assert not fused_ops.hf.patch(model)


def test_hf_fused_residual_path_runs(pair, monkeypatch):
    """The fused stack really runs: one fused residual + norm per sub-block (and the final
    norm), counted on the functional op the patchers call."""
    arch, _, model, _ = pair
    if arch == "gpt2":
        name = (
            "dropout_add_layer_norm"
            if hasattr(functional, "dropout_add_layer_norm")
            else "bias_dropout_add"
        )
    else:
        name = "add_rms_norm"
    calls = []
    real = getattr(functional, name)
    monkeypatch.setattr(
        functional, name, lambda *a, **k: calls.append(1) or real(*a, **k), raising=True
    )
    ids = _ids()
    model.train()(ids, labels=ids)
    assert len(calls) == 2 * 2  # 2 layers x (after attention, next norm / final norm)
    calls.clear()
    model.eval()(ids)  # generation-style call (a cache): HF's own forward, no fused adds
    assert calls == []


def test_hf_eval_logits_match(pair):
    _, ref, model, _ = pair
    ref.eval(), model.eval()
    ids = _ids()
    with torch.no_grad():
        want = ref(ids, use_cache=False).logits
        # use_cache=False: the fused stack; the default (a cache) goes through HF's forward
        # with the swapped modules.
        torch.testing.assert_close(model(ids, use_cache=False).logits, want, **F32)
        torch.testing.assert_close(model(ids).logits, want, **F32)


def test_hf_train_loss_and_gradients_match(pair):
    _, ref, model, _ = pair
    ref.train(), model.train()
    ids = _ids(seed=4)
    labels = ids.clone()
    labels[0, :3] = -100  # ignored positions count as HF counts them
    want = ref(ids, labels=labels)
    got = model(ids, labels=labels)
    assert got.logits is None  # the LM head and the loss fused: no logits
    torch.testing.assert_close(got.loss, want.loss, **F32)
    want.loss.backward()
    got.loss.backward()
    ga, gb = _grads(ref), _grads(model)
    assert set(ga) == set(gb) and len(ga) == len(list(ref.parameters()))
    for n in ga:
        torch.testing.assert_close(gb[n], ga[n], rtol=1e-4, atol=1e-5, msg=n)


def test_hf_attention_mask_and_num_items(pair):
    _, ref, model, _ = pair
    ref.train(), model.train()
    ids = _ids(seed=5)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding
    n = torch.tensor(11)
    want = ref(ids, attention_mask=mask, labels=ids, num_items_in_batch=n).loss
    got = model(ids, attention_mask=mask, labels=ids, num_items_in_batch=n).loss
    torch.testing.assert_close(got, want, **F32)


def test_hf_loss_function_eval(pair):
    """Eval mode with labels: HF's forward computes logits, the loss on fused cross_entropy."""
    _, ref, model, _ = pair
    ref.eval(), model.eval()
    ids = _ids(seed=6)
    with torch.no_grad():
        want = ref(ids, labels=ids, use_cache=False)
        got = model(ids, labels=ids, use_cache=False)
    torch.testing.assert_close(got.logits, want.logits, **F32)
    torch.testing.assert_close(got.loss, want.loss, **F32)


def test_hf_unpatch_restores(pair):
    _, ref, model, _ = pair
    restored = fused_ops.unpatch(model)
    assert restored
    assert [type(m) for m in model.modules()] == [type(m) for m in ref.modules()]
    assert not any("forward" in m.__dict__ for m in model.modules())
    assert "_loss_function" not in model.__dict__
    ids = _ids()
    ref.eval(), model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref(ids).logits, rtol=0, atol=0)


def test_hf_patched_model_pickles(pair):
    """A patched model saves whole (torch.save pickles it) and loads still patched."""
    import io

    _, ref, model, _ = pair
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert [type(m) for m in loaded.modules()] == [type(m) for m in model.modules()]
    ids = _ids()
    loaded.train(), ref.train()
    got = loaded(ids, labels=ids)
    assert got.logits is None  # still the fused head + loss
    torch.testing.assert_close(got.loss, ref(ids, labels=ids).loss, **F32)
    assert fused_ops.unpatch(loaded)


def test_hf_patched_model_loads_in_a_fresh_process(tmp_path):
    """The generated subclasses pickle as (original class, forward): a process that never
    patched anything loads the saved model patched, its class names HF's own."""
    import subprocess
    import sys

    model = _llama()
    fused_ops.hf.patch(model)
    path = tmp_path / "model.pt"
    torch.save(model, path)
    code = (
        "import sys, torch, fused_ops; P = sys.modules['fused_ops.patch']; "
        f"m = torch.load({str(path)!r}, weights_only=False); "
        "assert type(m).__name__ == 'LlamaForCausalLM', type(m); "
        "L = type(m.model.layers[1]); "
        "assert L is P._fused_subclass(L._fused_ops_base, L._fused_ops_forward, True); "
        "assert type(m.model.norm).__name__.startswith('FusedLlamaRMSNorm'); "
        "ids = torch.randint(0, 97, (2, 8)); assert m(ids, labels=ids).logits is None; "
        "assert fused_ops.unpatch(m); print('ok')"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-2000:]


def test_hf_state_dict_round_trip(pair):
    arch, ref, model, _ = pair
    assert list(model.state_dict()) == list(ref.state_dict())
    ids = _ids()
    # Patched weights into a fresh unpatched model, and unpatched into a patched one.
    fresh = BUILD[arch](seed=9)
    fresh.load_state_dict(model.state_dict(), strict=True)
    other = BUILD[arch](seed=10)
    fused_ops.hf.patch(other)
    other.load_state_dict(ref.state_dict(), strict=True)
    for m in (ref, fresh, other):
        m.eval()
    with torch.no_grad():
        want = ref(ids, use_cache=False).logits
        torch.testing.assert_close(fresh(ids, use_cache=False).logits, want, rtol=0, atol=0)
        torch.testing.assert_close(other(ids, use_cache=False).logits, want, **F32)


def test_hf_optimizer_steps_match(pair):
    """Three AdamW steps: the patched model follows the unpatched one."""
    _, ref, model, _ = pair
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (ref, model)]
    ids = _ids(seed=7)
    for _ in range(3):
        losses = []
        for m, opt in zip((ref, model), opts):
            loss = m(ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=1e-5)


def test_hf_compile_fullgraph(pair):
    """torch.compile of the patched model traces in one graph (no break from fused_ops):
    the training step's forward with the fused head + loss, and its backward."""
    _, ref, model, _ = pair
    torch._dynamo.reset()
    ids = _ids(seed=8)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    got = compiled(ids, labels=ids).loss
    want = ref(ids, labels=ids).loss
    torch.testing.assert_close(got, want, **F32)
    got.backward()
    want.backward()
    ga, gb = _grads(ref), _grads(model)
    for n in ga:
        torch.testing.assert_close(gb[n], ga[n], rtol=1e-4, atol=1e-5, msg=n)
    torch._dynamo.reset()


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_hf_regional_compile_once_for_all_layers(arch):
    """Each decoder layer compiled on its own (Module.compile, as benchmarks/e2e.py's
    regional mode): the patched layers share one class and one forward, so dynamo compiles
    the first layer (no delta to add yet) and one graph for all the others, not one a layer
    (a per-instance forward would fail the guards on every layer)."""
    from torch._dynamo.testing import CompileCounter

    layers_key = "n_layer" if arch == "gpt2" else "num_hidden_layers"
    ref = BUILD[arch](**{layers_key: 5})
    model = copy.deepcopy(ref)
    fused_ops.hf.patch(model)
    stack = model.transformer.h if arch == "gpt2" else model.model.layers
    assert len({type(layer) for layer in stack}) == 1
    torch._dynamo.reset()
    counter = CompileCounter()
    try:
        for layer in stack:
            layer.compile(backend=counter, fullgraph=True)
        ids = _ids(seed=12)
        for _ in range(2):
            loss = model(ids, labels=ids).loss
            loss.backward()
        assert counter.frame_count == 2, counter.frame_count
        torch.testing.assert_close(loss, ref(ids, labels=ids).loss, **F32)
    finally:
        torch._dynamo.reset()


def test_hf_gradient_checkpointing_falls_back(pair):
    _, ref, model, _ = pair
    for m in (ref, model):
        getattr(m, "activation_checkpointing_enable", m.gradient_checkpointing_enable)()
        m.train()
    ids = _ids(seed=11)
    want, got = ref(ids, labels=ids).loss, model(ids, labels=ids).loss
    torch.testing.assert_close(got, want, **F32)


def test_gpt2_dropout_trains_in_train_mode():
    """With dropout on, the fused path draws masks (loss differs from eval's, is finite,
    and backward runs); eval mode matches the unpatched model exactly."""
    ref = _gpt2(resid_pdrop=0.5, embd_pdrop=0.1)
    model = copy.deepcopy(ref)
    fused_ops.hf.patch_gpt2(model)
    ids = _ids()
    model.train()
    loss = model(ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss)
    model.eval(), ref.eval()
    with torch.no_grad():
        torch.testing.assert_close(
            model(ids, labels=ids, use_cache=False).loss, ref(ids, labels=ids).loss, **F32
        )
        assert not torch.allclose(model.train()(ids, labels=ids).loss, loss.detach() * 0)


def test_llama_swiglu_path(monkeypatch):
    """Where fused_ops.swiglu exists the MLP goes through it: checked here with a stand-in
    computing silu(gate) * up, so the path is exercised before the op lands."""
    calls = []
    if not hasattr(functional, "swiglu"):

        def swiglu(gate, up):
            calls.append(gate.shape)
            return torch.nn.functional.silu(gate) * up

        monkeypatch.setattr(functional, "swiglu", swiglu, raising=False)
    ref = _llama()
    model = copy.deepcopy(ref)
    report = fused_ops.hf.patch_llama(model)
    assert "model.layers.1.mlp" in report.forwards
    ids = _ids()
    torch.testing.assert_close(model(ids, labels=ids).loss, ref(ids, labels=ids).loss, **F32)
    if "swiglu" not in dir(fused_ops):  # the stand-in was called, once per layer
        assert len(calls) == 2


def test_patch_llama_rms_norm_alone():
    """fused_ops.patch (no HF patcher) swaps LlamaRMSNorm for a fused subclass of itself."""
    tr = _transformers()
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(32, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(4, 32)
    want = norm(x)
    report = fused_ops.patch(torch.nn.ModuleList([norm]))
    assert report.counts() == {"LlamaRMSNorm": 1}
    assert isinstance(norm, LlamaRMSNorm) and type(norm) is not LlamaRMSNorm
    torch.testing.assert_close(norm(x), want, **F32)
    assert tr.__version__


def test_hf_patch_bad_input():
    _transformers()
    with pytest.raises(ValueError, match="supported: gpt2, llama"):
        fused_ops.hf.patch(torch.nn.Linear(2, 2))
    from transformers import BertConfig, BertModel

    bert = BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2))
    with pytest.raises(ValueError, match="model type 'bert'.*supported: gpt2, llama"):
        fused_ops.hf.patch(bert)
    with pytest.raises(ValueError, match="expected a GPT2LMHeadModel or GPT2Model"):
        fused_ops.hf.patch_gpt2(_llama())
    with pytest.raises(ValueError, match="expected a LlamaForCausalLM or LlamaModel"):
        fused_ops.hf.patch_llama(_gpt2())
    # The generic patch still applies to any model: BERT's LayerNorms, GeLUs, dropouts.
    assert fused_ops.patch(bert).counts()["LayerNorm"] > 0


def test_hf_base_models():
    """GPT2Model and LlamaModel (no LM head) patch too, and match."""
    for build, attr in ((_gpt2, "transformer"), (_llama, "model")):
        ref = getattr(build(), attr).eval()
        model = copy.deepcopy(ref)
        report = fused_ops.hf.patch(model)
        assert "" in report.forwards and "lm_head" not in report.forwards
        ids = _ids()
        with torch.no_grad():
            torch.testing.assert_close(
                model(ids, use_cache=False).last_hidden_state,
                ref(ids, use_cache=False).last_hidden_state,
                **F32,
            )


@pytest.mark.cuda
def test_hf_bf16_cuda(pair):
    """On the GPU in bf16: the patched training step follows the unpatched one within bf16
    rounding, dropout on (the masks differ, so the loss is compared in eval mode)."""
    _, ref, model, _ = pair
    ref.cuda().to(torch.bfloat16), model.cuda().to(torch.bfloat16)
    ids = _ids().cuda()
    ref.eval(), model.eval()
    with torch.no_grad():
        want = ref(ids, labels=ids, use_cache=False).loss
        got = model(ids, labels=ids, use_cache=False).loss
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    ref.train(), model.train()
    a, b = ref(ids, labels=ids).loss, model(ids, labels=ids).loss
    a.backward(), b.backward()
    torch.testing.assert_close(b.float(), a.float(), rtol=2e-2, atol=2e-2)
    for n, g in _grads(ref).items():
        gb = dict(model.named_parameters())[n].grad
        assert torch.isfinite(gb).all(), n
        cos = torch.nn.functional.cosine_similarity(g.float().flatten(), gb.float().flatten(), 0)
        assert cos > 0.99, (n, float(cos))


def test_patch_hf_activations():
    """Hugging Face's GeLU modules: the tanh and erf forms on F.gelu are swapped; the Python
    forms and other GeLU approximations are left alone."""
    _transformers()
    from transformers.activations import (
        FastGELUActivation,
        GELUActivation,
        GELUTanh,
        NewGELUActivation,
    )

    acts = torch.nn.ModuleList(
        [
            GELUTanh(),
            GELUTanh(use_gelu_tanh_python=True),
            NewGELUActivation(),
            GELUActivation(),
            FastGELUActivation(),
        ]
    )
    x = torch.randn(257)
    want = [a(x) for a in acts]
    report = fused_ops.patch(acts)
    assert sorted(report.modules) == ["0", "2", "3"]
    for a, w in zip(acts, want):
        torch.testing.assert_close(a(x), w, **F32)
    assert isinstance(acts[0], GELUTanh) and type(acts[1]) is GELUTanh


def test_hf_position_ids_given_match(pair):
    """Position ids the caller gives reach RoPE and the mask as in HF's forward: offset
    positions, and two sequences packed in each row (HF's mask keeps them apart)."""
    _, ref, model, _ = pair
    ref.eval(), model.eval()
    ids = _ids()
    packed = torch.cat((torch.arange(7), torch.arange(9))).expand(2, -1)
    for pos in (torch.arange(16).unsqueeze(0) + 5, packed):
        with torch.no_grad():
            want = ref(ids, position_ids=pos, use_cache=False).logits
            got = model(ids, position_ids=pos, use_cache=False).logits
        torch.testing.assert_close(got, want, **F32)


def test_hf_mask_without_made_positions(pair, monkeypatch):
    """The fused stacks make the causal mask without the position ids they made themselves
    (one arange: HF's packed-sequence test on them would read a tensor on the host, a GPU
    synchronisation every forward); position ids the caller gives are passed on."""
    from fused_ops.hf import _common

    seen = []
    real = _common.create_causal_mask
    monkeypatch.setattr(
        _common,
        "create_causal_mask",
        lambda **kw: seen.append(kw["position_ids"]) or real(**kw),
    )
    _, _, model, _ = pair
    ids = _ids()
    model.train()(ids, labels=ids)
    assert seen == [None]
    pos = torch.arange(16).unsqueeze(0)
    model(ids, labels=ids, position_ids=pos)
    assert seen[1] is pos


@pytest.mark.cuda
def test_hf_train_step_does_not_synchronise(pair):
    """A patched training forward + backward on the GPU never waits for it (a
    synchronisation in a step stops the host from queueing ahead of the GPU):
    torch.cuda's sync debug mode raises on any synchronising call."""
    _, _, model, _ = pair
    model.cuda().to(torch.bfloat16).train()
    ids = _ids().cuda()
    model(ids, labels=ids).loss.backward()  # first call: lazy initialisations
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        model(ids, labels=ids).loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
