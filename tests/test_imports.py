"""What a default run imports: gearshift's modules and its Hydra plug-ins, in lines of code
(docs/layout.md, "Pay for what you use"); the sweeper's and launchers' machinery and Optuna
load only in a sweep that uses them."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

from helpers import ROOT, seconds

# What a default run may load (4,915 lines when this was set): lower it when a step takes
# modules out of the default run; never raise it to let one in.
MAX_DEFAULT_RUN_LINES = 5_000

# Runs train.py as `python train.py` would (argv[2:] its arguments), then writes the lines
# of each of our modules it imported, and the names of every module it imported, to argv[1].
COUNT_IMPORTS = """
import json, runpy, sys
from pathlib import Path

out, train = sys.argv[1], sys.argv[2]
sys.argv = [train, *sys.argv[3:]]
try:
    runpy.run_path(train, run_name="__main__")
except SystemExit as stop:
    if stop.code:
        raise
lines = {}
for name, module in list(sys.modules.items()):
    ours = name.split(".")[0] == "gearshift" or name.startswith("hydra_plugins.gearshift_")
    if ours and getattr(module, "__file__", None):
        lines[name] = len(Path(module.__file__).read_text().splitlines())
Path(out).write_text(json.dumps({"lines": lines, "loaded": sorted(sys.modules)}))
"""

OPTIONAL = ("optuna", "submitit")  # a sweep's libraries (the Optuna sweeper, the launchers)
# Our modules of features a default run does not configure (docs/layout.md, "Pay for what
# you use"): each is imported only where its feature is, so none may load here.
NOT_CONFIGURED = (
    "gearshift.batch_finder",  # batch_size=auto
    "gearshift.observe.plan",  # plan=on, plan.check=true
    "gearshift.observe.roofline",
    "gearshift.observe.profiler",  # profile=on
    "gearshift.observe.memory_snapshot",  # profile.memory_snapshot=true
    "gearshift.observe.samples",  # task.sample_every
    "gearshift.models.sampling",
    "gearshift.data.text",
    "gearshift.models.gpt",  # model=gpt, model=gpt2
    "gearshift.models.hf_gpt2",
    "gearshift.models.small",  # model=mlp, model=simple_cnn
    "gearshift.tasks.lm",  # task=lm
    "gearshift.observe.token_rates",  # a task whose samples are tokens (tokens_per_sample)
    "gearshift.tasks.regression",  # task=regression
    "gearshift.data.synthetic_regression",  # data=synthetic_regression
    "gearshift.config.token_files",  # data=tokens
    "gearshift.state.init_from",  # model.init_from
    "gearshift.data.prefetch",  # CUDA
    "gearshift.data.host_loader",  # data.on_device=false
    "gearshift.data.device_transforms",  # device_transforms.*, a source's own, uint8 images
    "gearshift.data.gpu_decode",  # data.decode=gpu
    "gearshift.data.decode",  # the image sources
    "gearshift.data.streams",  # IterableDataset sources
    "gearshift.data.named_fields",  # samples that are not pairs: dicts of named fields
    "gearshift.local_ranks",  # distributed.nproc_per_node > 1
    "gearshift.models.recompute",  # model.checkpointing=true
    "gearshift.data.staging",  # data.stage_to
    "gearshift.engine.ema",  # ema.decay
    "gearshift.engine.muon",  # optimizer=muon
    "gearshift.engine.scheduler_class",  # scheduler._target_
    "gearshift.engine.amp_choice",  # amp=on, bf16, fp16
    "gearshift.engine.loss_scaling",  # amp=fp16
    "gearshift.engine.decay_groups",  # optimizer.weight_decay_1d=false
    "gearshift.tasks.added_metrics",  # task.metrics
    "gearshift.tasks.loss_terms",  # a loss with terms, or of a wrong form
    "gearshift.tasks.unreadable",  # a dict batch without the fields the task reads
    "gearshift.config.disk_checks",  # the sources read from disk
    "gearshift.observe.attention_probe",  # the advisor, for a model with attention
    "gearshift.observe.cuda_findings",  # the advisor, on CUDA
    "gearshift.observe.findings",  # advise=true, python -m gearshift.advise
    "gearshift.observe.advisor_base",
    "gearshift.parallel.process_group",  # several ranks
    "gearshift.parallel.slurm_env",  # srun with several tasks
    "gearshift.parallel.wrappers",  # distributed=ddp, dp or fsdp
    "gearshift.state.restore",  # a resumed run
    "gearshift.state.checkpoint_reads",  # a checkpoint read: resume, evaluate, model.init_from
    "gearshift.engine.optim_loading",  # a resumed run
    "gearshift.state.checkpoint_failures",  # a checkpoint save or load that fails
    "gearshift.state.async_writes",  # checkpoint.async_save=true
    "gearshift.config.unknown_keys",  # a command line that fails
    "gearshift.observe.tensorboard_logger",  # logger=tensorboard
    "gearshift.observe.csv_logger",  # logger=csv
    "gearshift.observe.several_loggers",  # logger= with several backends: logger=[wandb,csv]
    "gearshift.engine.cpu_probe",  # amp=on on a CPU
    "gearshift.observe.gpu_datasheets",  # CUDA, plan=on
    "gearshift.observe.nonfinite",  # a NaN/inf loss or weights
    "gearshift.config.allowed_types",  # a value of the wrong type
    "gearshift.run_endings",  # a run stopped, or refused; plan=on
    "gearshift.observe.trial",  # trial.reporter: a run that is a study's trial
    "gearshift.run_plan",  # batch_size=auto, plan.check=true
    "gearshift.config_advice",  # advise=true, python -m gearshift.advise
    "gearshift.observe.analytic_flops",  # a model with flops_per_token: model=gpt
    "gearshift.observe.loss_skip",  # on_nonfinite=skip
    "gearshift.state.budget",  # max_tokens, a resumed run
    "gearshift.state.resumed",  # a resumed run, batch_size=auto
    "gearshift.sweep_preflight",  # a command line that sweeps or sets a key of the sweeper's
    "gearshift.config.switches",  # true/false on the command line
    "gearshift.argv_rewrites",  # true/false on the command line; a rank other than 0
    "gearshift.data_batches",  # no run: the tests' and the scripts' batches
    "gearshift.config.token_targets",  # data=synthetic_tokens, data=tokens, model=gpt, task=lm
    "gearshift.config.disk_targets",  # the sources read from disk
    "gearshift.config.hf_targets",  # data=hf
    "gearshift.config.feature_checks",  # a feature's node set: amp, ema, plan, scheduler, ...
    "gearshift.config.small_targets",  # model=mlp, model=simple_cnn, task=regression
    "gearshift.config.keyword_checks",  # an optimizer or scheduler class of one's own, bad keys
)


def test_a_default_run_loads_no_sweep_machinery_and_at_most_the_ratchets_lines(tmp_path):
    out = tmp_path / "imports.json"
    # the run `make train` starts, with its default logger: W&B, offline as on a machine
    # without a key
    wandb = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", COUNT_IMPORTS, str(out), str(ROOT / "train.py"), "max_steps=2"],
        cwd=tmp_path, capture_output=True, text=True, timeout=seconds(240),
        env={**os.environ, **wandb},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    imported = json.loads(out.read_text())
    lines = imported["lines"]
    listing = "\n".join(f"{n:6d} {name}" for name, n in sorted(lines.items()))
    # the count sees the run's modules and the plug-ins Hydra scanned
    assert "gearshift.build" in lines, listing
    assert "hydra_plugins.gearshift_launcher.processes" in lines, listing
    assert "gearshift.observe.wandb_logger" in lines, listing  # the default logger
    machinery = [
        name
        for name in lines
        if name.startswith("hydra_plugins.gearshift_")
        and name.rsplit(".", 1)[-1].startswith("_")
        and not name.endswith(".__init__")
    ]
    assert machinery == [], f"a default run imported {machinery}:\n{listing}"
    optional = [name for name in imported["loaded"] if name.split(".")[0] in OPTIONAL]
    assert optional == [], f"a default run imported {optional[:5]} ..."
    unused = [name for name in NOT_CONFIGURED if name in lines]
    assert unused == [], f"a default run imported modules of features it does not use: {unused}"
    total = sum(lines.values())
    assert total <= MAX_DEFAULT_RUN_LINES, (
        f"a default run loaded {total} lines of gearshift and its plug-ins, over the "
        f"{MAX_DEFAULT_RUN_LINES} allowed; its modules:\n{listing}"
    )


def test_each_module_a_default_run_must_not_load_is_one_of_ours():
    """A misspelt or moved name in NOT_CONFIGURED would be absent from every run."""
    missing = [name for name in NOT_CONFIGURED if importlib.util.find_spec(name) is None]
    assert missing == []
