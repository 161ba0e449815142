"""Models patched by fused_ops.hf train under torch.distributed on two GPUs: DDP and FSDP2
(torch.distributed.fsdp.fully_shard, one unit per decoder layer and the root), the losses
of five AdamW steps matching one GPU's training on the whole batch within bf16 noise.
Skipped unless two CUDA GPUs and transformers are present."""

import pytest
import torch
import torch.multiprocessing as mp

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"),
]

STEPS = 5
BATCH, SEQ = 4, 128  # the global batch; each of 2 ranks trains on half of it


def _model(arch):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if arch == "gpt2":
        cfg = GPT2Config(
            n_layer=2,
            n_embd=256,
            n_head=4,
            n_positions=SEQ,
            vocab_size=1000,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
        model = GPT2LMHeadModel._from_config(cfg, attn_implementation="sdpa")
    else:
        cfg = LlamaConfig(
            hidden_size=256,
            intermediate_size=688,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=1000,
            max_position_embeddings=SEQ,
        )
        model = LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa")
    return model.to(torch.bfloat16)


def _ids():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 1000, (BATCH, SEQ), generator=g)


def _train(model, ids, reduce=None):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(STEPS):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = loss.detach().float()
        if reduce is not None:
            reduce(loss)
        losses.append(float(loss))
    return losses


def _worker(rank, arch, mode, store, out):
    import torch.distributed as dist

    import fused_ops

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        model = _model(arch).cuda()
        report = fused_ops.hf.patch(model)
        assert report.forwards, report
        if mode == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            model = DistributedDataParallel(model)
        else:
            from torch.distributed.fsdp import fully_shard

            base = model.transformer if arch == "gpt2" else model.model
            for layer in base.h if arch == "gpt2" else base.layers:
                fully_shard(layer)
            fully_shard(model)
        half = BATCH // 2
        ids = _ids()[rank * half : (rank + 1) * half].cuda()
        losses = _train(model, ids, lambda t: dist.all_reduce(t, op=dist.ReduceOp.AVG))
        if rank == 0:
            torch.save(losses, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_patched_model_trains_on_two_gpus(arch, mode, tmp_path):
    pytest.importorskip(
        "transformers", reason="transformers is not installed: pip install 'fused_ops[hf]'"
    )
    import fused_ops

    model = _model(arch).cuda()
    fused_ops.hf.patch(model)
    want = _train(model, _ids().cuda())
    del model
    out = tmp_path / "losses.pt"
    mp.spawn(_worker, args=(arch, mode, str(tmp_path / "store"), str(out)), nprocs=2, join=True)
    got = torch.load(out)
    assert len(got) == STEPS
    # bf16 weights: the halves' GEMMs and the gradient all-reduce round differently.
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=2e-2, atol=2e-2)
    assert got[-1] < got[0]  # it trains
