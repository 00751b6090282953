"""optimizer=muon: torch's Muon on the hidden matrices, AdamW on the rest, each with its own
lr; its state saves and resumes exactly; a model without hidden matrices is one line."""

from __future__ import annotations

import os

import pytest
import torch
from distributed_workers import train_recorded
from helpers import free_port, make_cfg, run_train
from omegaconf import OmegaConf
from test_checkpoint import assert_same_parameters
from test_distributed import GPT_CLIPPED, two_ranks

from gearshift.build import build_parts, build_run
from gearshift.config import ConfigError
from gearshift.engine.optim import Optimizers, build_optimizers
from gearshift.engine.precision import Precision
from gearshift.models import GPT
from gearshift.parallel.distributed import Ranks
from gearshift.state.checkpoint_folders import latest_checkpoint
from gearshift.state.checkpoint_reads import load_checkpoint
from train import fit

CPU = torch.device("cpu")


def lm_cfg(*overrides: str):
    return make_cfg("logger=none", "progress_bar=false", "experiment=lm", "optimizer=muon",
                    "data.num_samples=128", "data.num_val_samples=16", "model.n_layer=2",
                    "model.n_embd=32", "model.n_head=2", *overrides, tiny=False)  # fmt: skip


def test_muon_takes_the_hidden_matrices_and_adamw_the_rest_each_at_its_lr():
    cfg = lm_cfg("optimizer.muon_lr=0.05", "optimizer.lr=0.001")
    model = GPT(64, 16, n_layer=2, n_head=2, n_embd=32)
    optimizers = build_optimizers(model, cfg.optimizer)
    assert isinstance(optimizers, Optimizers)
    muon, adamw = optimizers.optimizers
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    names = {id(p): n for n, p in model.named_parameters()}
    on_muon = {names[id(p)] for g in muon.param_groups for p in g["params"]}
    on_adamw = {names[id(p)] for g in adamw.param_groups for p in g["params"]}
    assert on_muon == {f"blocks.{i}.{m}.weight" for i in range(2)
                       for m in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")}  # fmt: skip
    assert on_adamw == set(names.values()) - on_muon  # wte (the tied head), wpe, LayerNorms
    assert {g["lr"] for g in muon.param_groups} == {0.05}
    assert {g["lr"] for g in adamw.param_groups} == {0.001}
    assert len(optimizers.param_groups) == 3  # both optimizers' groups, the same dicts
    assert all(a is b for a, b in zip(optimizers.param_groups, [*muon.param_groups, *adamw.param_groups], strict=True))  # fmt: skip


def test_muon_state_saves_and_resumes_exactly(tmp_path):
    steady = ("optimizer.schedule=constant", "optimizer.lr_warmup_steps=0")
    whole = fit(lm_cfg(*steady, "max_steps=6"), tmp_path / "whole")
    fit(lm_cfg(*steady, "max_steps=3"), tmp_path / "split")
    saved = load_checkpoint(latest_checkpoint(tmp_path / "split/checkpoints"))["optimizer"]
    # both optimizers' state in one, keyed by parameter name (DCP)
    buffers = [s["momentum_buffer"] for s in saved["state"].values() if "momentum_buffer" in s]
    assert len(buffers) == 8 and all(b.abs().sum() > 0 for b in buffers)  # Muon's own state
    resumed = fit(lm_cfg(*steady, "max_steps=6"), tmp_path / "split")
    assert resumed.summary["steps"] == 6
    assert_same_parameters(whole.model, resumed.model)


def test_a_model_without_hidden_matrices_is_one_line(tmp_path):
    cfg = lm_cfg()
    cfg.model = OmegaConf.create({"_target_": "torch.nn.Embedding", "num_embeddings": 64,
                                  "embedding_dim": 64})  # fmt: skip
    with pytest.raises(ConfigError) as error:
        build_run(cfg, tmp_path, Ranks(), "none", CPU)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("optimizer.name='muon' is not allowed; Embedding has no 2-D hidden weights")  # fmt: skip


# GPT_CLIPPED's SGD keyword momentum=0 is no keyword of the muon preset's classes
MUON_GPT = [*(o for o in GPT_CLIPPED if o != "optimizer.momentum=0"), "optimizer=muon", "optimizer.muon_lr=0.02", "optimizer.lr=0.01",
            "optimizer.schedule=constant", "optimizer.clip_grad_norm=null", "max_steps=3"]  # fmt: skip


def one_process(folder, overrides: list[str]) -> dict:
    """train_recorded in this process, undoing what it sets for a rank afterwards."""
    environ, threads = dict(os.environ), torch.get_num_threads()
    try:
        train_recorded(0, 1, free_port(), str(folder), overrides)
    finally:
        os.environ.clear()
        os.environ.update(environ)
        torch.set_num_threads(threads)
    return torch.load(folder / "rank0.pt", weights_only=False)


def initial_parameters() -> dict[str, torch.Tensor]:
    """The parameters every run of MUON_GPT starts from (the seed builds the same model)."""
    parts = build_parts(make_cfg(*MUON_GPT, "batch_size=16", tiny=False), Ranks(), "none", CPU)
    return parts.model.state_dict()


def assert_near_the_update(
    name: str, ranks: torch.Tensor, one: torch.Tensor, initial: torch.Tensor, bound: float
):
    """2 ranks' parameter near one process's: the same 16 windows a step, their gradient
    means summed in another order; Muon's Newton-Schulz iteration runs in bfloat16, whose
    rounding turns those last-bit differences into small ones of the update, so they are
    measured against the update itself: within `bound` for Muon's matrices, a tenth of it
    for AdamW's tensors. One process stepping on 8 windows (a rank alone) lands 50-87% of
    the update apart."""
    update, apart = (one - initial).norm(), (ranks - one).norm()
    on_muon = name.startswith("blocks") and one.dim() == 2
    assert update > 0, name
    assert apart <= (bound if on_muon else bound / 10) * update, (name, float(apart / update))


def test_2_ranks_under_ddp_with_muon_reach_one_process_with_the_doubled_batch(tmp_path):
    ranks = two_ranks(
        tmp_path / "ddp", [*MUON_GPT, "distributed=ddp", "batch_size=8"], worker=train_recorded
    )
    one = one_process(tmp_path / "one", [*MUON_GPT, "batch_size=16"])
    assert ranks[0]["summary"]["gears"]["optimizer"] == "muon"
    initial = initial_parameters()
    for name, tensor in one["params"].items():
        assert torch.equal(ranks[0]["params"][name], ranks[1]["params"][name]), name
        # measured: Muon's matrices 1.0-1.6% of their update apart, AdamW's below 0.03%
        assert_near_the_update(name, ranks[0]["params"][name], tensor, initial[name], 0.05)


def test_fsdp_shards_step_with_muon_and_resume_to_one_process_with_the_doubled_batch(tmp_path):
    # two steps, a checkpoint, then the third after a resume: the sharded Muon momentum
    # must come back (lost, the third update would point elsewhere)
    sharded = [*MUON_GPT, "distributed=fsdp", "batch_size=8"]
    two_ranks(tmp_path / "fsdp", [*sharded, "max_steps=2"], worker=train_recorded)
    saved = load_checkpoint(latest_checkpoint(tmp_path / "fsdp/rank0/checkpoints"))["optimizer"]
    buffers = [v["momentum_buffer"] for k, v in saved["state"].items() if "momentum_buffer" in v]
    assert len(buffers) == 8 and all(b.dim() == 2 and b.abs().sum() > 0 for b in buffers)
    ranks = two_ranks(tmp_path / "fsdp", [*sharded, "max_steps=3"], worker=train_recorded)
    assert ranks[0]["summary"]["steps"] == 3
    assert ranks[0]["summary"]["gears"]["distributed"] == "fsdp"
    one = one_process(tmp_path / "one", [*MUON_GPT, "batch_size=16"])
    initial = initial_parameters()
    for name, tensor in one["params"].items():
        whole = torch.cat([ranks[0]["params"][name], ranks[1]["params"][name]])[: len(tensor)]
        assert ranks[0]["params"][name].numel() < tensor.numel(), name  # really sharded
        # measured: Muon's matrices 3.4-5.3% of their update apart (the sharded Newton-Schulz
        # also sums bfloat16 partial products across ranks), AdamW's below 0.3%
        assert_near_the_update(name, whole, tensor, initial[name], 0.1)


@pytest.mark.slow  # the line itself: the fast test above; exit 2 and no folder for any such line:
# test_init_from.py's command line
def test_muon_on_a_model_without_hidden_matrices_exits_2_with_no_run_folder(tmp_path):
    done = run_train("experiment=lm", "optimizer=muon", "logger=none", "max_steps=1",
                     "model._target_=torch.nn.Embedding", "+model.num_embeddings=64",
                     "+model.embedding_dim=64", "~model.vocab_size", "~model.block_size",
                     "~model.n_layer", "~model.n_head", "~model.n_embd", "~model.dropout",
                     "~model.bias", "~model.activation", "~model.pad_vocab_to",
                     "~model.checkpointing", cwd=tmp_path, timeout=120)  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        "error: optimizer.name='muon' is not allowed; Embedding has no 2-D hidden weights "
        "(Muon orthogonalises matrices; embeddings, heads, convolutions and 1-D parameters "
        "take AdamW): use optimizer=adamw"
    ]
    assert list(tmp_path.iterdir()) == []


def test_under_fp16_muon_and_adamw_skip_a_step_with_inf_gradients_together():
    # the GradScaler takes both as one: one inf/nan check a step, one decision for both
    model = GPT(64, 16, n_layer=1, n_head=2, n_embd=32)
    optimizers = build_optimizers(model, lm_cfg().optimizer, total_steps=4)
    precision = Precision(torch.float16, CPU)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    idx = torch.randint(64, (2, 16))
    with precision.autocast():
        loss = model(idx).float().mean()
    precision.backward(loss * float("inf"))
    precision.step(optimizers)
    assert int(precision.skipped_steps) == 1
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    optimizers.zero_grad()
    with precision.autocast():
        loss = model(idx).float().mean()
    precision.backward(loss)
    precision.unscale(optimizers)  # as the loop does before clipping; step does not again
    precision.step(optimizers)
    assert int(precision.skipped_steps) == 1
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert "blocks.0.mlp.fc.weight" in moved and "wte.weight" in moved  # Muon's and AdamW's
