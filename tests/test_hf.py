"""Hugging Face GPT-2 in and out: model.init_from a GPT2LMHeadModel folder gives its logits;
`python -m gearshift.export format=hf` writes a folder transformers loads with ours;
format=torch a state dict the model class loads by itself."""

from __future__ import annotations

import importlib
import json

import pytest
import torch
import transformers
from helpers import make_cfg

from gearshift import export as export_cli
from gearshift.build import build_parts
from gearshift.config import ConfigError
from gearshift.evaluate import load_model
from gearshift.parallel.distributed import Ranks
from gearshift.state.checkpoint_folders import latest_checkpoint
from train import fit

CPU = torch.device("cpu")
CONF = make_cfg.__globals__["CONF"]
SIZES = ("data.vocab_size=50", "data.block_size=32", "model.n_layer=2", "model.n_head=2",
         "model.n_embd=32")  # fmt: skip


def gpt_cfg(*overrides: str):
    return make_cfg("logger=none", "progress_bar=false", "task=lm", "data=synthetic_tokens",
                    "data.num_samples=64", "data.num_val_samples=16", "batch_size=8",
                    "model=gpt", *SIZES, *overrides, tiny=False)  # fmt: skip


def hf_gpt2(folder, **config):
    torch.manual_seed(0)
    options = dict(vocab_size=50, n_positions=32, n_embd=32, n_layer=2, n_head=2) | config
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**options)).eval()
    with torch.no_grad():  # GPT-2 starts its biases and LayerNorms at 0 and 1: make them count
        for name, p in model.named_parameters():
            if name.endswith("bias") or "ln" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def test_a_hugging_face_gpt2_folder_loads_with_its_logits(tmp_path):
    hf = hf_gpt2(tmp_path / "hf")
    cfg = gpt_cfg("model.bias=true", "model.activation=gelu_tanh",
                  f"model.init_from={tmp_path / 'hf'}")  # fmt: skip
    model = build_parts(cfg, Ranks(), "none", CPU).model.eval()
    idx = torch.randint(50, (3, 32))
    with torch.no_grad():
        theirs, ours = hf(idx).logits, model(idx)
    assert ours.shape == theirs.shape == (3, 32, 50)
    assert torch.allclose(ours, theirs, atol=1e-4), (ours - theirs).abs().max()


@pytest.mark.parametrize(
    ("overrides", "config", "message"),
    [
        (
            ["model.bias=true"],
            {},
            "it is a GPT-2 with activation=gelu_tanh, this model has model.activation=gelu",
        ),
        (
            ["model.bias=true", "model.activation=gelu_tanh"],
            {"n_layer": 3},
            "it is a GPT-2 with n_layer=3",
        ),
    ],
)
def test_a_gpt2_of_other_sizes_is_one_line(tmp_path, overrides, config, message):
    hf_gpt2(tmp_path / "hf", **config)
    cfg = gpt_cfg(*overrides, f"model.init_from={tmp_path / 'hf'}")
    with pytest.raises(ConfigError, match=message) as error:
        build_parts(cfg, Ranks(), "none", CPU)
    assert "\n" not in str(error.value)


def test_a_folder_of_another_architecture_is_one_line(tmp_path):
    hf_gpt2(tmp_path / "hf")
    config = json.loads((tmp_path / "hf/config.json").read_text()) | {"model_type": "llama"}
    (tmp_path / "hf/config.json").write_text(json.dumps(config))
    cfg = gpt_cfg("model.bias=true", f"model.init_from={tmp_path / 'hf'}")
    with pytest.raises(ConfigError, match="describes model_type 'llama', not gpt2"):
        build_parts(cfg, Ranks(), "none", CPU)


@pytest.fixture(scope="module")
def trained_gpt(tmp_path_factory):
    """A GPT as model=gpt trains it (no biases, exact GELU), 3 steps, and its checkpoint."""
    folder = tmp_path_factory.mktemp("gpt")
    fit(gpt_cfg("max_steps=3", "optimizer=adamw"), folder)
    return latest_checkpoint(folder / "checkpoints")


def test_export_hf_loads_in_transformers_with_the_same_logits(trained_gpt, tmp_path, capsys):
    assert export_cli.main([f"resume={trained_gpt}", "format=hf", f"out={tmp_path / 'out'}"]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["config.json", "model.safetensors"]  # fmt: skip
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "out").eval()
    ours, _ = load_model(trained_gpt, [], CONF)
    idx = torch.randint(50, (2, 32))
    with torch.no_grad():
        assert torch.allclose(hf(idx).logits, ours(idx), atol=1e-4)


def test_export_torch_is_a_state_dict_the_class_loads_alone(trained_gpt, tmp_path):
    assert export_cli.main([f"resume={trained_gpt}", f"out={tmp_path / 'out'}"]) == 0
    node = json.loads((tmp_path / "out/model.json").read_text())
    module, name = node.pop("_target_").rsplit(".", 1)
    model = getattr(importlib.import_module(module), name)(**node)  # the class, by itself
    model.load_state_dict(torch.load(tmp_path / "out/model.pt", weights_only=True))
    ours, _ = load_model(trained_gpt, [], CONF)
    for (key, a), (_, b) in zip(model.state_dict().items(), ours.state_dict().items(), strict=True):  # fmt: skip
        assert torch.equal(a, b), key
    from safetensors.torch import load_model as load_safetensors

    again = getattr(importlib.import_module(module), name)(**node)
    load_safetensors(again, tmp_path / "out/model.safetensors")
    assert torch.equal(again.wte.weight, model.wte.weight)
    assert again.lm_head.weight is again.wte.weight  # still tied


def test_an_unwritable_out_folder_is_one_line_exit_2_and_nothing_written(trained_gpt, tmp_path, capsys):  # fmt: skip
    (tmp_path / "file").write_text("")
    before = sorted(tmp_path.rglob("*"))
    assert export_cli.main([f"resume={trained_gpt}", f"out={tmp_path / 'file/out'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"error: out={str(tmp_path / 'file/out')!r} is not allowed"), err  # fmt: skip
    assert sorted(tmp_path.rglob("*")) == before
