"""The config composes from the real conf/ tree, and bad input fails fast and clearly."""

from __future__ import annotations

import re

import pytest
import torch
from helpers import CONF, TINY, fake_cpu_speed, make_cfg, run_train, train_in_process
from omegaconf import OmegaConf

from gearshift.app import preflight
from gearshift.config import ConfigError, check_config
from train import fit


def test_defaults_are_the_plain_baseline():
    cfg = make_cfg(tiny=False)
    check_config(cfg)
    assert cfg.amp.dtype == "none"
    assert cfg.accum == 1
    assert not cfg.memory_format.channels_last
    assert cfg.dataloader.num_workers == 0 and not cfg.dataloader.pin_memory
    assert not cfg.compile.enabled and not cfg.cudnn_benchmark
    assert cfg.matmul_precision == "highest" and not cfg.optimizer.set_to_none
    assert cfg.model._target_ == "torchvision.models.resnet18"


def test_experiment_fast_turns_every_helpful_gear_on():
    cfg = make_cfg("experiment=fast", tiny=False)
    check_config(cfg)
    assert cfg.amp.dtype == "auto" and cfg.memory_format.channels_last
    assert cfg.dataloader.num_workers == "auto" and cfg.dataloader.non_blocking
    assert cfg.compile.enabled and cfg.cudnn_benchmark and cfg.matmul_precision == "high"
    assert cfg.optimizer.fused and cfg.optimizer.set_to_none


def test_experiment_baseline_equals_the_defaults():
    assert make_cfg("experiment=baseline") == make_cfg()


def test_command_line_beats_experiment():
    assert make_cfg("experiment=fast", "amp=off").amp.dtype == "none"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("accum=0", "accum=0 is not allowed; expected an integer >= 1"),
        ("max_steps=-1", "max_steps=-1 is not allowed"),
        ("optimizer.lr=-1", "optimizer.lr=-1.0 is not allowed; expected a number > 0"),
        ("dataloader.num_workers=-1", "dataloader.num_workers=-1 is not allowed"),
        ("compile.mode=fastest", "compile.mode='fastest' is not allowed; choose one of"),
        ("matmul_precision=low", "matmul_precision='low' is not allowed"),
        ("model._target_=no.such.Model", "model._target_='no.such.Model' is not allowed"),
        ("optimizer.lr=inf", "optimizer.lr=inf is not allowed; expected a finite number > 0"),
        ("optimizer.weight_decay=nan", "optimizer.weight_decay=nan is not allowed"),
        ("optimizer.momentum=-1", "optimizer.momentum=-1.0 is not allowed; expected a number >= 0"),
        (
            "optimizer.momentum=0 ++optimizer.nesterov=true",  # a keyword SGD takes, added
            "optimizer.nesterov=True is not allowed; it needs optimizer.momentum > 0",
        ),
        (
            "optimizer=adamw optimizer.betas=[0.9,1.0]",
            "optimizer.betas=[0.9, 1.0] is not allowed; expected two numbers >= 0 and < 1",
        ),
        ("early_stop.min_delta=nan", "early_stop.min_delta=nan is not allowed"),
        ("experiment=lm data.vocab_size=0", "data.vocab_size=0 is not allowed"),
        ("experiment=lm data.successors=0", "data.successors=0 is not allowed"),
        ("experiment=lm data.num_samples=0", "data.num_samples=0 is not allowed"),
        (
            "experiment=lm data.block_size=128 model.block_size=64",
            "model.block_size=64 is not allowed; the data's windows are data.block_size=128 "
            "tokens: expected >= 128",
        ),
        (
            "experiment=lm model.vocab_size=10",
            "model.vocab_size=10 is not allowed; the data has data.vocab_size=64 token ids: "
            "expected >= 64",
        ),
        (
            "optimizer._target_=no.such.Lion",
            "optimizer._target_='no.such.Lion' is not allowed; expected an importable "
            "torch.optim.Optimizer subclass (module.Name)",
        ),
        (  # importable, but no optimizer
            "optimizer._target_=collections.OrderedDict",
            "optimizer._target_='collections.OrderedDict' is not allowed; expected an "
            "importable torch.optim.Optimizer subclass (module.Name)",
        ),
        (
            "optimizer.schedule=linear",
            "optimizer.schedule='linear' is not allowed; choose one of: constant, cosine, or "
            "name a function factor(step, total_steps) -> float (module.name)",
        ),
        (
            "optimizer.schedule=no.such.factor",
            "optimizer.schedule='no.such.factor' is not allowed; choose one of: constant, "
            "cosine, or name a function",
        ),
    ],
)
def test_check_config_names_key_value_and_what_is_allowed(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_config(make_cfg(*override.split(), tiny=False))


def test_a_feature_node_at_its_schema_defaults_passes_its_check():
    """check_config skips the check of a feature's node at its schema defaults (checks.py
    `_check_unless_default`): the defaults must pass it, or a bad default would go unsaid."""
    from gearshift.config import feature_checks

    cfg = make_cfg(tiny=False)
    nodes = ("amp", "compile", "batch_size_finder", "sweep", "ema", "early_stop", "profile")
    for key in (*nodes, "plan", "distributed", "device_transforms", "dataloader", "checkpoint"):
        cfg[key] = OmegaConf.structured(OmegaConf.get_type(cfg[key]))
        getattr(feature_checks, f"check_{key}")(cfg)


def test_the_lm_experiment_is_allowed():
    check_config(make_cfg("experiment=lm", tiny=False))


def test_an_optimizer_class_and_a_schedule_function_of_ones_own_are_allowed():
    check_config(make_cfg("optimizer._target_=torch.optim.RMSprop", "optimizer.schedule=math.pow"))


BAD_INPUT = [
    ("amp=onn", "amp='onn' is not allowed; choose one of: bf16, fp16, off, on"),
    ("accum=0", "accum=0 is not allowed; expected an integer >= 1"),
    ("accum=-2", "accum=-2 is not allowed; expected an integer >= 1"),
    ("batch_size=abc", "batch_size='abc' is not allowed; expected an integer >= 1 or auto"),
    (
        "memory_format=nchw",
        "memory_format='nchw' is not allowed; choose one of: channels_last, contiguous",
    ),
    ("batch_size=0", "batch_size=0 is not allowed; expected an integer >= 1 or auto"),
    (  # true/false: on/off for a group with those options only
        "memory_format=true",
        "memory_format=true is not allowed; choose one of: channels_last, contiguous",
    ),
    (
        "-m memory_format=contiguous,False",
        "memory_format=False is not allowed; choose one of: channels_last, contiguous",
    ),
    (
        "max_steps=-1",
        "max_steps=-1 is not allowed; expected an integer >= 1 (or null to turn it off)",
    ),
    (
        "dataloader.num_workers=-1",
        "dataloader.num_workers=-1 is not allowed; expected an integer >= 0 or auto",
    ),
    ("optimizer.lr=-1", "optimizer.lr=-1.0 is not allowed; expected a number > 0"),
    ("optimizer.lr=null", "optimizer.lr=None is not allowed; expected a number > 0"),
    (
        "optimizer.clip_grad_norm=0",
        "optimizer.clip_grad_norm=0.0 is not allowed; expected a number > 0 (or null: no clipping)",
    ),
    (
        "data=imagefolder",
        "data.path=None is not allowed; data=imagefolder reads a folder: set data.path=/path/to/it",
    ),
    # once a Hydra stack trace, exit 1 and a run folder: a reshape deep in the model, a
    # wrong type of number, an IndexError in the optimizer
    (
        "experiment=lm data.block_size=0",
        "data.block_size=0 is not allowed; expected an integer >= 1",
    ),
    (
        "optimizer=adamw optimizer.betas=[0.9]",
        "optimizer.betas=[0.9] is not allowed; expected two numbers >= 0 and < 1",
    ),
    (  # a preset's class takes the keywords it takes, no other
        "optimizer=adamw ++optimizer.momentum=0.9",
        "optimizer.momentum=0.9 is not allowed; torch.optim.AdamW takes no keyword 'momentum'; "
        "its keywords: lr, betas, eps, weight_decay, amsgrad, maximize, foreach, capturable, "
        "differentiable, fused",
    ),
    (  # its step needs a metric: not stepped once per optimizer step
        "++scheduler._target_=torch.optim.lr_scheduler.ReduceLROnPlateau",
        "scheduler._target_='torch.optim.lr_scheduler.ReduceLROnPlateau' is not allowed; "
        "expected an importable torch.optim.lr_scheduler.LRScheduler subclass (module.Name) "
        "that steps without a metric, or null: optimizer.schedule",
    ),
    (
        "++scheduler._target_=torch.optim.lr_scheduler.StepLR ++scheduler.step_size=5 "
        "optimizer.schedule=constant",
        "optimizer.schedule='constant' is not allowed; scheduler._target_="
        "torch.optim.lr_scheduler.StepLR is the schedule: leave optimizer.schedule at cosine",
    ),
]
if not torch.cuda.is_available():
    BAD_INPUT.append(
        (
            "device=cuda",
            "device='cuda' is not allowed; this machine has no CUDA device; choose auto or cpu",
        )
    )


@pytest.mark.parametrize(("override", "message"), BAD_INPUT)
def test_bad_input_is_one_line_exit_2_before_any_run_folder(
    tmp_path, monkeypatch, capsys, override, message
):
    assert preflight_error_lines(tmp_path, monkeypatch, capsys, override) == [f"error: {message}"]


def preflight_error_lines(tmp_path, monkeypatch, capsys, override: str) -> list[str]:
    """What train.py runs first, in this process (a fresh `python train.py` per value costs
    4 s): it must exit 2 and leave nothing in the folder; returns what it printed."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit:
        preflight(CONF, argv=override.split())
    assert exit.value.code == 2
    assert list(tmp_path.iterdir()) == []
    return capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize(
    ("override", "message"),
    [BAD_INPUT[0], *(pytest.param(*case, marks=pytest.mark.slow) for case in BAD_INPUT[1:])],
)
def test_bad_input_is_one_line_nonzero_exit_and_no_run_folder(tmp_path, override, message):
    result = run_train(*override.split(), cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines == [f"error: {message}"], result.stderr
    assert list(tmp_path.iterdir()) == []  # no runs/, no outputs/, nothing


def test_a_bad_value_inside_a_sweep_stops_the_sweep_before_it_starts(tmp_path):
    result = train_in_process("-m", "amp=off,onn", "max_steps=1", cwd=tmp_path)
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == "error: amp='onn' is not allowed; choose one of: bf16, fp16, off, on"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("given", "worded"),
    [
        (["amp=true", "compile=False", "deterministic=true"], ["amp=on", "compile=off"]),
        (["-m", "plan=TRUE", "compile=false,true"], ["-m", "plan=on", "compile=off,on"]),
        (["-m", "amp=choice(true,bf16)", "--cfg", "job"], ["-m", "amp=choice(on,bf16)"]),
    ],
)
def test_true_and_false_switch_a_switch_group_on_and_off(monkeypatch, given, worded):
    # plan=on: no plan here
    monkeypatch.setattr("gearshift.run_endings.print_plan", lambda cfg, rank: None)
    argv = list(given)
    preflight(CONF, argv=argv)  # rewritten in place: Hydra parses what preflight checked
    assert argv[: len(worded)] == worded
    assert argv[len(worded) :] == given[len(worded) :]  # keys and flags as they were


def test_a_sweep_of_true_false_records_on_and_off(tmp_path, monkeypatch):
    fake_cpu_speed(monkeypatch, 1.4)  # amp=on resolves unmeasured: this reads what Hydra wrote
    argv = ["-m", "amp=true,false", "max_steps=1", "model=mlp", *TINY]
    result = train_in_process(*argv, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    [sweep] = (tmp_path / "multirun").iterdir()
    task = OmegaConf.load(sweep / "multirun.yaml").hydra.overrides.task
    assert list(task) == ["amp=on,off", *argv[2:]]
    for job, (word, dtype) in enumerate([("on", "auto"), ("off", "none")]):
        hydra_files = sweep / str(job) / ".hydra"
        assert OmegaConf.load(hydra_files / "overrides.yaml")[0] == f"amp={word}"
        assert OmegaConf.load(hydra_files / "config.yaml").amp.dtype == dtype


class ModelWithDelay(torch.nn.Module):
    """One's own model, with an argument its config node does not list."""

    def __init__(self, num_classes: int, delay: float = 0.0) -> None:
        super().__init__()
        self.head, self.delay = torch.nn.LazyLinear(num_classes), delay


UNKNOWN_KEYS = [
    (
        "model._target_=test_config.ModelWithDelay model.delay=0.3",
        "model.delay=0.3 is not allowed; the model node has no key 'delay'; its keys: "
        "checkpointing, init_from, init_strict, num_classes; to pass an argument "
        "test_config.ModelWithDelay accepts, add it: +model.delay=0.3",
    ),
    (
        "experiment=lm model.n_layr=2",
        "model.n_layr=2 is not allowed; the model node has no key 'n_layr'; closest: n_layer; "
        "gearshift.models.GPT takes no argument 'n_layr'",
    ),
    (  # a key below one that is not there: the whole override goes behind the +
        "model._target_=test_config.ModelWithDelay model.delay.x=1",
        "model.delay.x=1 is not allowed; the model node has no key 'delay'; its keys: "
        "checkpointing, init_from, init_strict, num_classes; to pass an argument "
        "test_config.ModelWithDelay accepts, add it: +model.delay.x=1",
    ),
    (  # a node of the schema: its keys are fixed, so no + to suggest
        "amp.enabeld=1",
        "amp.enabeld=1 is not allowed; the amp node has no key 'enabeld'; its keys: dtype",
    ),
    (
        "fooo=1",
        "fooo=1 is not allowed; the config has no key 'fooo'; its keys: accum, advise, amp,",
    ),
    (  # a key that moved: its new spelling, whatever the source
        "data.image_column=img",
        "data.image_column=img is not allowed; the key is now data.fields.inputs: "
        "data.fields.inputs=img",
    ),
]


@pytest.mark.parametrize(("override", "message"), UNKNOWN_KEYS)
def test_an_unknown_key_names_its_node_the_closest_keys_and_how_to_add_one(
    tmp_path, monkeypatch, capsys, override, message
):
    lines = preflight_error_lines(tmp_path, monkeypatch, capsys, override)
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}"), lines
    assert "not in struct" not in lines[0]


def test_an_unknown_key_is_one_line_from_train_py(tmp_path):
    # the command: train.py's own path, Hydra's multi-line error turned into a line
    result = train_in_process("model.delay=0.3", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: model.delay=0.3 is not allowed; the model node has no key 'delay'; its keys: "
        "checkpointing, init_from, init_strict, num_classes; to pass an argument "
        "torchvision.models.resnet18 accepts, add it: +model.delay=0.3"
    ]
    assert list(tmp_path.iterdir()) == []


def vectors(num_samples: int = 64, features: int = 12):
    """A source without images: (features,) vectors and 3 classes."""
    from torch.utils.data import TensorDataset

    x = torch.randn(num_samples, features, generator=torch.Generator().manual_seed(0))
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    return TensorDataset(x, y), TensorDataset(x[:16], y[:16])


def vectors_cfg(*overrides: str):
    """The default config (classification, model=mlp) on `vectors`, with `overrides`."""
    from omegaconf import OmegaConf

    cfg = make_cfg("model=mlp", "logger=none", "progress_bar=false", "max_steps=2", *overrides,
                   tiny=False)  # fmt: skip
    cfg.data = OmegaConf.create({"_target_": "test_config.vectors"})  # in place of the images
    return cfg


def test_a_source_without_images_is_told_the_default_tasks_two_keys():
    cfg = vectors_cfg("model.in_shape=[12]", "model.num_classes=3")
    with pytest.raises(ConfigError) as error:
        check_config(cfg)
    assert str(error.value) == (
        "task.num_classes='${data.num_classes}' is not allowed; data.num_classes does not exist "
        "in this config; a source without images sets task.num_classes=N and "
        "task.input_shape=[...] (one sample's inputs' shape, e.g. [12])"
    )


def test_inputs_of_another_shape_than_task_input_shape_are_one_line_before_training(tmp_path):
    keys = ("model.in_shape=[12]", "model.num_classes=3", "task.num_classes=3")
    with pytest.raises(ConfigError) as error:  # was a matmul traceback in the FLOP count
        fit(vectors_cfg(*keys, "task.input_shape=[3,8,8]"), tmp_path / "wrong")
    assert str(error.value) == (
        "task.input_shape=[3, 8, 8] is not allowed; the samples' inputs are shaped [12]: set "
        "task.input_shape=[12] (the default follows the image keys data.channels and "
        "data.image_size, which a source without images lacks)"
    )
    assert not (tmp_path / "wrong" / "checkpoints").exists()
    summary = fit(vectors_cfg(*keys, "task.input_shape=[12]"), tmp_path / "right").summary
    assert summary["steps"] == 2 and "val_accuracy" in summary
