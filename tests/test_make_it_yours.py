"""The "Make it yours" example (docs/make-it-yours.md) as it stands: its package and config are written into
a folder of their own and trained from the command line, with gears, under DDP, with
batch_size=auto, and stopped by SIGTERM and resumed; bad targets and run folders that cannot
be made end with one line."""

from __future__ import annotations

import csv
import importlib
import importlib.util
import logging
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from unittest import mock

import pytest
import torch
from distributed_workers import count_allreduces
from helpers import (
    ROOT,
    check_amp_on_resolved,
    make_cfg,
    on_ranks,
    only_summary,
    seconds,
    train_in_process,
)
from omegaconf import OmegaConf
from sklearn.metrics import accuracy_score, f1_score
from test_checkpoint import stop_and_resume
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from gearshift.build import build_run, check_validation
from gearshift.data_batches import data_batches
from gearshift.engine.optim import build_schedule
from gearshift.engine.precision import Precision
from gearshift.models.factory import build_model
from gearshift.parallel.distributed import Ranks
from gearshift.state.checkpoint_folders import latest_checkpoint
from gearshift.state.checkpoint_reads import load_checkpoint
from gearshift.tasks import build_task
from train import fit


def readme_example() -> tuple[dict[str, str], list[str]]:
    """The page's files ({path: text}: the blocks with a `# <path>` line) and the
    arguments of its `train.py` command."""
    section = (ROOT / "docs" / "make-it-yours.md").read_text()
    blocks = re.findall(r"^```(\w*)\n(.*?)^```$", section, re.S | re.M)
    files = {}
    for language, text in blocks:
        name = re.search(r"^# ([\w/]+\.(?:py|yaml))$", text, re.M)
        if language in ("python", "yaml") and name:
            files[name[1]] = text
    command = next(
        line for language, text in blocks if language == "bash" for line in text.splitlines()
        if "train.py" in line and "experiment=" in line
    )  # fmt: skip
    words = shlex.split(command)
    script = next(i for i, word in enumerate(words) if word.endswith("train.py"))
    return files, words[script + 1 :]


FILES, COMMAND = readme_example()


def page_command(marker: str) -> list[str]:
    """The arguments of the page's `train.py` command that holds `marker`."""
    page = (ROOT / "docs" / "make-it-yours.md").read_text()
    line = next(line for line in page.splitlines() if "train.py" in line and marker in line)
    words = shlex.split(line)
    return words[next(i for i, word in enumerate(words) if word.endswith("train.py")) + 1 :]


def page_block(header: str) -> str:
    """The text of the page's python block that opens with the line `header`, after it."""
    page = (ROOT / "docs" / "make-it-yours.md").read_text()
    return re.search(rf"^```python\n{re.escape(header)}\n(.*?)^```$", page, re.S | re.M)[1]


def logged_terms_example() -> str:
    """The page's myproject/task.py with Denoise.loss replaced by the one of "A term logged
    beside the loss", as a reader makes the change."""
    block = page_block("# myproject/task.py: Denoise.loss, in place of the one above")
    task = FILES["myproject/task.py"]
    old = re.search(r"^    def loss\(.*?\n(?=\n)", task, re.S | re.M)[0]  # up to its blank line
    return task.replace(old, block)


# Small and quiet; the page's own sizes are for real training.
TINY = (
    "logger=none",
    "progress_bar=false",
    "data.num_samples=256",
    "data.num_val_samples=64",
    "batch_size=32",
)


def test_the_readme_example_is_complete():
    assert set(FILES) == {
        "myproject/data.py",
        "myproject/model.py",
        "myproject/task.py",
        "conf/experiment/denoise.yaml",
    }
    assert COMMAND == ["hydra.searchpath=[file://conf]", "experiment=denoise"]


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A folder of one's own holding the page's package and config."""
    for name, text in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def command(work: Path, *overrides: str, example: bool = True) -> tuple[list[str], dict]:
    """`PYTHONPATH=. python train.py <the page's arguments> TINY overrides`, in `work`."""
    paths = [str(work), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    arguments = [*(COMMAND if example else ()), *TINY, *overrides]
    return [sys.executable, str(ROOT / "train.py"), *arguments], env


def train(work: Path, *overrides: str, example: bool = True, timeout: float = 120):
    args, env = command(work, *overrides, example=example)
    return subprocess.run(
        args, cwd=work, env=env, capture_output=True, text=True, timeout=seconds(timeout)
    )


def train_here(work: Path, *overrides: str, example: bool = True) -> subprocess.CompletedProcess:
    """`train`, in this process (helpers.train_in_process): the page's package is imported
    from `work` and forgotten after, for the next test's folder holds a copy of its own."""
    args, _ = command(work, *overrides, example=example)
    importlib.invalidate_caches()
    try:
        with mock.patch.object(sys, "path", [str(work), *sys.path]):
            return train_in_process(*args[2:], cwd=work)
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] in ("myproject", "broken")]:
            del sys.modules[name]


def check_task_metrics(summary: dict, world_size: int = 1) -> None:
    assert summary["world_size"] == world_size
    assert math.isfinite(summary["final_loss"])
    assert summary["val_loss"] > 0 and math.isfinite(summary["val_snr_db"])  # the task's own
    assert "val_accuracy" not in summary  # no classification leftovers


def test_gears_train_the_example_and_its_summary_has_its_metrics_and_mfu(work):
    done = train_here(work, "amp=on", "accum=2", "dataloader=tuned", "max_steps=6")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = only_summary(work)
    check_task_metrics(summary)
    assert summary["steps"] == 6 and summary["samples"] == 6 * 2 * 32
    gears = summary["gears"]
    assert gears["accum"] == 2
    check_amp_on_resolved(gears)  # bf16 where this CPU measures it fast; never asserted
    # dataloader=tuned acted: auto workers (on a CPU only the cores compute leaves free)
    assert gears["num_workers_reason"].startswith("auto:") and gears["non_blocking"] is True
    assert gears["distributed"] == "none"
    assert summary["flops_per_sample"] > 0  # counted on the task's example batch
    assert summary["mfu"] is not None and summary["mfu"] > 0  # a CPU's peak is measured


def test_batch_size_auto_sizes_the_example(work):
    done = train_here(
        work, "batch_size=auto", "batch_size_finder.max_memory_gib=0.002", "max_steps=2"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = only_summary(work)
    check_task_metrics(summary)
    found, size = summary["batch_size_finder"], summary["gears"]["batch_size"]
    assert found is not None and found["batch_size"] == size
    assert size % 8 == 0 and 8 <= size <= 256  # within the training set
    if summary["device"] == "cpu":
        assert found["bound"] == "memory_budget"  # 2 MiB holds fewer than 256 samples
        assert found["bytes_per_sample"] > 0


def test_the_example_trains_as_2_rank_ddp(work):
    done = train(work, "distributed.nproc_per_node=2", "max_steps=4", "device=cpu", timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = only_summary(work)
    check_task_metrics(summary, world_size=2)
    assert summary["gears"]["distributed"] == "ddp" and summary["steps"] == 4
    assert summary["samples"] == 4 * 2 * 32


def test_sigterm_then_resume_matches_an_uninterrupted_run(work):
    common = ("batch_size=16", "max_steps=80", "checkpoint.every_n_steps=5")
    whole = train(work, *common, f"hydra.run.dir={work / 'whole'}")
    assert whole.returncode == 0, whole.stderr[-3000:]

    run_dir = work / "stopped"
    args, env = command(work, *common, f"hydra.run.dir={run_dir}")
    process = subprocess.Popen(args, cwd=work, env=env, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + seconds(120)
    while (
        not (run_dir / "checkpoints").is_dir() or latest_checkpoint(run_dir / "checkpoints") is None
    ):
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=seconds(120))
    assert process.returncode == 128 + signal.SIGTERM, output[-3000:]
    stopped_at = load_checkpoint(latest_checkpoint(run_dir / "checkpoints"))["position"]["step"]
    assert 5 <= stopped_at < 80

    resumed = train(work, *common, f"hydra.run.dir={run_dir}")  # the same command: resume=auto
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = load_checkpoint(latest_checkpoint(run_dir / "checkpoints"))
    reference = load_checkpoint(latest_checkpoint(work / "whole" / "checkpoints"))
    assert final["position"] == reference["position"]
    assert final["model"].keys() == reference["model"].keys()
    for name, tensor in reference["model"].items():
        assert torch.equal(final["model"][name], tensor), name


BROKEN_SOURCE = 'def source(**options):\n    raise RuntimeError("the data server is down")\n'


def assert_one_line_error(done: subprocess.CompletedProcess, work: Path, message: str) -> None:
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}"), done.stderr[-3000:]
    assert not (work / "runs").exists()


@pytest.mark.parametrize(
    ("overrides", "example", "message"),
    [
        (
            ("model._target_=os.getcwd",),
            True,
            "model._target_='os.getcwd' is not allowed; got an unexpected keyword argument 'width'",
        ),
        (
            ("model=resnet18", "+model.bogus=1", "data.image_size=8"),
            False,
            "model._target_='torchvision.models.resnet18' could not be built: "
            "TypeError: ResNet.__init__() got an unexpected keyword argument 'bogus'",
        ),
        (
            ("+data.bogus=1",),
            True,
            "data._target_='myproject.data.source' is not allowed; "
            "got an unexpected keyword argument 'bogus'",
        ),
        (
            ("data._target_=broken.source",),
            True,
            "data._target_='broken.source' could not be built: "
            "RuntimeError: the data server is down",
        ),
        (
            ("+task.bogus=1",),
            True,
            "task._target_='myproject.task.Denoise' is not allowed; "
            "got an unexpected keyword argument 'bogus'",
        ),
        (
            ("+data.fields={inputs: noisey, targets: clean}",),
            True,
            "data.fields={'inputs': 'noisey', 'targets': 'clean'} is not allowed; the samples' "
            "fields are noisy, clean, id; expected inputs from one of: noisey; targets from one "
            "of: clean",
        ),
    ],
    ids=[
        "model-arguments",
        "model-raises",
        "source-arguments",
        "source-raises",
        "task-arguments",
        "unread-field",
    ],
)
def test_a_target_that_cannot_be_built_is_one_line(work, overrides, example, message):
    (work / "broken.py").write_text(BROKEN_SOURCE)
    done = train_here(work, *overrides, "max_steps=1", example=example)
    assert_one_line_error(done, work, message)


def test_a_target_that_cannot_be_built_ends_the_process_with_one_line(work):
    """A case of the test above as its own process: the exit path (exit 2, one line, the run
    folder Hydra made removed) of an error found while the run is built."""
    done = train(work, "model=resnet18", "+model.bogus=1", "data.image_size=8", "max_steps=1",
                 example=False)  # fmt: skip
    assert_one_line_error(done, work, "model._target_='torchvision.models.resnet18' could not "
                          "be built: TypeError: ResNet.__init__() got an unexpected keyword "
                          "argument 'bogus'")  # fmt: skip


@pytest.mark.parametrize("where", ["under-a-file", "unwritable"])
def test_a_run_folder_that_cannot_be_made_is_one_line(work, where):
    if where == "under-a-file":
        (work / "a-file").write_text("")
        run_dir, reason = work / "a-file" / "run", f"{work / 'a-file'} is a file, not a folder"
    elif os.geteuid() == 0:  # root may write anywhere but where nothing can be written
        run_dir, reason = Path("/proc/gearshift/run"), "cannot create folders in /proc"
    else:
        (work / "locked").mkdir(mode=0o500)
        run_dir, reason = work / "locked" / "run", f"cannot create folders in {work / 'locked'}"
    done = train_here(work, f"hydra.run.dir={run_dir}", "max_steps=1")
    assert_one_line_error(done, work, f"hydra.run.dir={str(run_dir)!r} is not allowed; {reason}")


def test_a_misspelt_experiment_of_yours_is_one_line_that_lists_yours(work):
    done = train_here(
        work, COMMAND[0], "experiment=denoize", example=False
    )  # the page's searchpath
    choices = "baseline, denoise, fast, lm, regression"
    assert_one_line_error(
        done, work, f"experiment='denoize' is not allowed; choose one of: {choices}"
    )


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_term_logged_beside_the_loss_changes_the_task_file_alone(work, ranks):
    (work / "myproject" / "task.py").write_text(logged_terms_example())
    steps = ("max_steps=4", "log_every_n_steps=2", "warmup_steps=0", "logger=csv")
    ddp = ("distributed.nproc_per_node=2", "device=cpu") if ranks == 2 else ()
    done = train(work, *steps, *ddp, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    # 2 ranks: the loss is their mean, so the relation holds only if the terms are too
    (run_dir,) = (work / "runs").iterdir()
    with (run_dir / "metrics.csv").open(newline="") as file:
        rows = {(int(step), name): value for step, name, value in list(csv.reader(file))[1:]}
    for step in (2, 4):
        loss, mse, jagged = (float(rows[step, f"train/{n}"]) for n in ("loss", "mse", "jagged"))
        assert mse > 0 and jagged > 0
        assert loss == pytest.approx(mse + 0.1 * jagged, rel=1e-5)  # the means of the same steps
    summary = only_summary(work)
    assert summary["world_size"] == ranks
    assert float(rows[4, "train/loss"]) == pytest.approx(summary["final_loss"])


@pytest.fixture
def own_package(tmp_path: Path, monkeypatch) -> Path:
    """A folder of one's own on sys.path (train.py's PYTHONPATH=.), for an in-process run;
    each test imports its myproject afresh."""
    (tmp_path / "myproject").mkdir()
    mine = lambda: [name for name in sys.modules if name.split(".")[0] == "myproject"]  # noqa: E731
    for name in mine():
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in mine():
        del sys.modules[name]


SMALL = ("model=mlp", "logger=none", "progress_bar=false", "data.num_val_samples=0")


def test_an_optimizer_of_ones_own_steps_by_its_rule_and_saves_its_state_by_name(own_package):
    code = page_block("# myproject/optim.py: an optimizer of one's own")
    (own_package / "myproject" / "optim.py").write_text(code)
    lr, steps, moved = 1e-3, [], []

    def before(optimizer, args, kwargs):
        if type(optimizer).__module__ == "myproject.optim":
            steps.append([(p, p.detach().clone()) for g in optimizer.param_groups for p in g["params"]])  # fmt: skip

    def after(optimizer, args, kwargs):
        if type(optimizer).__module__ == "myproject.optim" and len(steps) == 1:
            moved.extend((p.detach() - old).abs().flatten() for p, old in steps[0])

    hooks = register_optimizer_step_pre_hook(before), register_optimizer_step_post_hook(after)
    try:
        result = fit(
            make_cfg(*SMALL, "max_steps=3", "optimizer._target_=myproject.optim.Lion",
                     f"optimizer.lr={lr}", "optimizer.weight_decay=0", "optimizer.momentum=null",
                     "optimizer.schedule=constant"),
            own_package / "run",
        )  # fmt: skip
    finally:
        for hook in hooks:
            hook.remove()
    assert len(steps) == 3 == result.summary["steps"]  # the class steps the run, once a step
    assert result.summary["gears"]["optimizer"] == "myproject.optim.Lion"
    # Lion's first update is lr x the gradient's sign: each element moves by lr (or 0)
    moved = torch.cat(moved)
    assert (moved > 0).float().mean() > 0.5
    assert torch.allclose(moved[moved > 0], torch.tensor(lr), rtol=1e-3)
    saved = load_checkpoint(latest_checkpoint(own_package / "run" / "checkpoints"))["optimizer"]
    names = {name for name, _ in result.model.named_parameters()}
    assert set(saved["state"]) == names  # keyed by parameter name: it loads resharded
    assert all(state["momentum"].abs().sum() > 0 for state in saved["state"].values())


def test_a_schedule_of_ones_own_sets_each_steps_lr(own_package):
    code = page_block("# myproject/schedule.py: a learning-rate schedule of one's own")
    (own_package / "myproject" / "schedule.py").write_text(code)
    lrs: list[float] = []
    hook = register_optimizer_step_pre_hook(
        lambda optimizer, args, kwargs: lrs.append(optimizer.param_groups[0]["lr"])
    )
    try:
        result = fit(
            make_cfg(*SMALL, "max_steps=6", "optimizer.lr=0.08",
                     "optimizer.schedule=myproject.schedule.thirds"),
            own_package / "run",
        )  # fmt: skip
    finally:
        hook.remove()
    from myproject.schedule import thirds

    assert result.summary["steps"] == 6
    assert lrs == [0.08 * thirds(step, 6) for step in range(6)]
    assert lrs == [0.08, 0.08, 0.04, 0.04, 0.02, 0.02]  # halved after each third


def edited_train_py() -> str:
    """train.py as "Edit train.py" edits it, as a reader does: the page's fit in place of
    train.py's (its import beside the others), and the page's step in place of the lines
    from `window, samples = ...` to `optimizers.step_schedules()`."""
    imports, fit_def = page_block("# train.py: fit, edited").split("\n\n\n", 1)
    step = page_block("# train.py: the step, edited")
    text = (ROOT / "train.py").read_text()
    old_fit = re.search(r"^def fit\(.*?\n(?=\n\n)", text, re.S | re.M)[0]
    old_step = re.search(
        r"^ +window, samples = .*?^ +optimizers\.step_schedules\(\)\n", text, re.S | re.M
    )[0]
    text = text.replace(old_fit, fit_def).replace(old_step, step)
    future = "from __future__ import annotations\n"
    return text.replace(future, f"{future}\n{imports}\n", 1)


def import_file(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_edited_train_py_steps_a_gans_two_optimizers_and_checkpoints_and_resumes_both(
    own_package,
):
    gan = page_block(
        "# myproject/gan.py: two nets in one module, their optimizers, and the task that scores them"
    )
    (own_package / "myproject" / "gan.py").write_text(gan)
    (own_package / "train.py").write_text(edited_train_py())
    edited = import_file(own_package / "train.py", "edited_train")
    run_dir = own_package / "run"
    run_dir.mkdir()  # the logger's folder, as Hydra makes it
    cfg = partial(
        make_cfg, *page_command("myproject.gan.GAN"), "logger=csv", "progress_bar=false",
        "data.num_samples=64", "data.num_val_samples=32", "batch_size=16", "log_every_n_steps=2",
    )  # fmt: skip
    stepped, before = [], {}

    def pre(optimizer, args, kwargs):  # each optimizer's parameters before its first step
        params = [p for group in optimizer.param_groups for p in group["params"]]
        before.setdefault(optimizer, [p.detach().clone() for p in params])

    hooks = (
        register_optimizer_step_pre_hook(pre),
        register_optimizer_step_post_hook(lambda optimizer, args, kwargs: stepped.append(optimizer)),
    )  # fmt: skip
    try:
        result = edited.fit(cfg("max_steps=4"), run_dir)
        first = load_checkpoint(latest_checkpoint(run_dir / "checkpoints"))["optimizer"]
        resumed = edited.fit(cfg("max_steps=6"), run_dir)  # resume=auto: the same run folder
    finally:
        for hook in hooks:
            hook.remove()
    model, (generator, discriminator) = result.model, result.optimizers.optimizers
    assert result.summary["steps"] == 4 and result.summary["gears"]["optimizer"] == "adamw"
    assert stepped[:8] == [discriminator, generator] * 4  # each step: the discriminator, then
    for optimizer, net in ((generator, model.generator), (discriminator, model.discriminator)):
        params = [p for group in optimizer.param_groups for p in group["params"]]
        assert {id(p) for p in params} == {id(p) for p in net.parameters()}  # its net's, all
        moved = [not torch.equal(old, p.detach()) for old, p in zip(before[optimizer], params, strict=True)]  # fmt: skip
        assert all(moved) and len(moved) == 4
    with (run_dir / "metrics.csv").open(newline="") as file:
        rows = {(int(step), name): float(value) for step, name, value in list(csv.reader(file))[1:]}
    for step in (2, 4):
        d_loss, g_loss = rows[step, "train/discriminator"], rows[step, "train/generator"]
        assert d_loss > 0 and g_loss > 0
        assert rows[step, "train/loss"] == pytest.approx(d_loss + g_loss, rel=1e-5)
    assert 0 <= rows[4, "val/fooled"] <= 1 and result.summary["val_fooled"] == rows[4, "val/fooled"]
    names = {name for name, _ in model.named_parameters()}
    assert {name.split(".")[0] for name in names} == {"generator", "discriminator"}
    assert set(first["state"]) == names  # both optimizers' state, by parameter name
    assert len(first["param_groups"]) == 2 and len(first["schedules"]) == 2
    assert {float(state["step"]) for state in first["state"].values()} == {4.0}

    assert resumed.summary["steps"] == 6 and (run_dir / "summary.json").is_file()
    generator, discriminator = resumed.optimizers.optimizers
    assert stepped[-4:] == [discriminator, generator] * 2  # steps 5 and 6
    last = load_checkpoint(latest_checkpoint(run_dir / "checkpoints"))["optimizer"]
    # AdamW's step counts went on from 4: both optimizers' state was restored
    assert {float(state["step"]) for state in last["state"].values()} == {6.0}


def test_a_per_sample_weight_reaches_the_task_with_no_wrapper_and_is_logged(work):
    code = page_block("# myproject/weighted.py: samples with a weight, and a task that uses it")
    (work / "myproject" / "weighted.py").write_text(code)
    # one epoch of 8 equal batches, logged once: train/weight is the mean of every weight
    steps = (
        "data.image_size=8",
        "max_steps=8",
        "log_every_n_steps=8",
        "warmup_steps=0",
        "logger=csv",
    )
    done = train_here(work, *page_command("weighted"), *steps, example=False)
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = (work / "runs").iterdir()
    with (run_dir / "metrics.csv").open(newline="") as file:
        rows = {(int(step), name): value for step, name, value in list(csv.reader(file))[1:]}
    page = {}
    exec(code, page)  # the page's source, as the run built it (TINY's samples, the node's rest)
    train_set, _ = page["source"](256, 0, 8, 3, 10, 1.0, 0)
    weights = torch.stack([train_set[i]["weight"] for i in range(256)])
    assert float(rows[8, "train/weight"]) == pytest.approx(weights.mean().item(), rel=1e-5)
    summary = only_summary(work)
    assert summary["steps"] == 8 and summary["samples"] == 256
    assert summary["val_accuracy"] is not None  # Classification's validation reads image, label


F1 = page_command("MulticlassF1Score")
CPU = torch.device("cpu")


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_torchmetrics_f1_is_scikit_learns_macro_f1_of_the_same_predictions(tmp_path, ranks):
    overrides = [*F1, "max_steps=8", "logger=csv"]
    if ranks == 1:
        (tmp_path / "run").mkdir()  # the logger's folder, as Hydra makes it
        result = fit(make_cfg(*overrides), tmp_path / "run")
        summary, weights = result.summary, result.model.state_dict()
        with (tmp_path / "run" / "metrics.csv").open(newline="") as file:
            logged = {(int(s), n): float(v) for s, n, v in list(csv.reader(file))[1:]}
        assert logged[8, "val/f1"] == summary["val_f1"]  # logged as val/f1
    else:
        saved = on_ranks(count_allreduces, 2, tmp_path, [*overrides, "device=cpu"])
        assert [rank["summary"]["val_f1"] for rank in saved] == [saved[0]["summary"]["val_f1"]] * 2
        summary, weights = saved[0]["summary"], saved[0]["params"]
        assert summary["world_size"] == 2
    cfg = make_cfg(*overrides)
    model = build_model(cfg.model, CPU, torch.contiguous_format)
    model.load_state_dict(weights)
    _, val = data_batches(cfg, CPU)  # the whole validation set (each rank validated its share)
    with torch.no_grad():
        predicted = torch.cat([model.eval()(x).argmax(dim=1) for x, _ in val])
    targets = torch.cat([y for _, y in val])
    assert len(targets) == 64 and len(set(predicted.tolist())) > 1  # a real prediction
    expected = f1_score(targets, predicted, average="macro")
    assert summary["val_f1"] == pytest.approx(expected, rel=1e-5)
    assert summary["val_accuracy"] == pytest.approx(accuracy_score(targets, predicted), rel=1e-6)
    assert summary["best"]["metric"] == "val_f1" and summary["best"]["value"] == summary["val_f1"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ("++task.metrics.f1.average=none",),
            "task.metrics.f1._target_='torchmetrics.classification.MulticlassF1Score' is not "
            "allowed; it computes a tensor of shape [10], expected one number (a per-class "
            "metric: average it, e.g. average=macro)",
        ),
        (
            ("++task.metrics.f1._target_=collections.OrderedDict",),
            "task.metrics.f1._target_='collections.OrderedDict' is not allowed; it built a "
            "OrderedDict, expected a torchmetrics.Metric",
        ),
        (
            ("++task.metrics.accuracy._target_=torchmetrics.MeanMetric",),
            "task.metrics.accuracy is not allowed; the task computes val_accuracy itself: "
            "choose another name",
        ),
    ],
    ids=["not-a-scalar", "not-a-metric", "the-tasks-name"],
)
def test_a_metric_that_cannot_give_one_number_is_one_line_before_training(
    tmp_path, overrides, message
):
    done = train_in_process(*COMMAND_TINY, *F1, *overrides, "max_steps=2", cwd=tmp_path)
    assert_one_line_error(done, tmp_path, message)


def test_a_metric_checked_at_the_start_validates_without_its_per_batch_checks():
    """torchmetrics' validate_args (a check of each batch's targets: a host sync per batch)
    is on while the start checks the metric, off after it, unless the node sets it."""
    accuracy = "++task.metrics.top1._target_=torchmetrics.classification.MulticlassAccuracy"
    cfg = make_cfg(*F1, accuracy, "++task.metrics.top1.num_classes=10",
                   "++task.metrics.top1.validate_args=true")  # fmt: skip
    task = build_task(cfg.task)
    f1, top1 = task.validation["f1"], task.validation["top1"]
    assert f1.validate_args is True and top1.validate_args is True  # built with its checks
    model = build_model(cfg.model, CPU, torch.contiguous_format)
    check_validation(cfg, task, model, CPU, Precision(None, CPU), torch.contiguous_format)
    assert f1.validate_args is False
    assert top1.validate_args is True  # the node's own choice stays


COMMAND_TINY = ("logger=none", "progress_bar=false", "data.image_size=8", "batch_size=16")


def test_a_metric_that_raises_at_a_validation_saves_a_checkpoint_then_is_one_line(tmp_path):
    done = train_in_process(
        *COMMAND_TINY, "model=mlp", "++task.metrics.broken._target_=injected.BreaksOnRealData",
        "val_every_n_steps=2", "max_steps=4", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    saved = latest_checkpoint(tmp_path / "run" / "checkpoints")
    assert saved is not None and load_checkpoint(saved)["position"]["step"] == 2  # its step
    assert done.stderr.splitlines() == [
        f"error: validation at step 2: task.metrics.broken raised ValueError: the metric broke; "
        f"checkpoint {saved} holds the weights"
    ]


def test_an_optimizers_own_keywords_reach_it(tmp_path):
    args = page_command("++optimizer.alpha=0.95")
    done = train_in_process(*args, *SMALL, "max_steps=2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = only_summary(tmp_path)
    assert summary["gears"]["optimizer"] == "torch.optim.RMSprop"
    (run_dir,) = (tmp_path / "runs").iterdir()
    (group,) = load_checkpoint(latest_checkpoint(run_dir / "checkpoints"))["optimizer"][
        "param_groups"
    ]
    # its own keywords and the default node's, not RMSprop's defaults (alpha 0.99, momentum 0)
    assert (group["alpha"], group["momentum"], group["weight_decay"]) == (0.95, 0.9, 5e-4)
    assert group["initial_lr"] == 0.05 and not group["centered"]


def test_a_class_named_in_a_presets_place_says_the_keywords_it_takes_from_it(caplog, tmp_path):
    def said(*overrides: str) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="gearshift"):
            cfg = make_cfg("model=mlp", "batch_size=auto", *overrides)  # its probes build too
            build_run(cfg, tmp_path / str(len(overrides)), Ranks(), "none", torch.device("cpu"))
        return [m for m in caplog.messages if m.startswith("optimizer:")]

    assert said() == []  # the preset's own class: nothing to say
    (line,) = said("optimizer._target_=torch.optim.RMSprop")  # once, not per probe
    assert line.startswith("optimizer: torch.optim.RMSprop in optimizer=sgd's place, with the "
                           "keywords lr=0.05, momentum=0.9, weight_decay=0.0005"), line  # fmt: skip


def test_a_keyword_the_optimizer_does_not_take_is_one_line(tmp_path):
    done = train_in_process(*page_command("++optimizer.alpah=0.95"), *SMALL, cwd=tmp_path)
    page = (ROOT / "docs" / "make-it-yours.md").read_text()
    line = re.search(r"`(error: optimizer\.alpah=.*?)`", page)[1]  # the page's line, verbatim
    assert_one_line_error(done, tmp_path, line.removeprefix("error: "))
    assert done.stderr.strip() == line


def lr_per_step(run_dir: Path) -> dict[int, float]:
    with (run_dir / "metrics.csv").open(newline="") as file:
        return {int(step): float(value) for step, name, value in list(csv.reader(file))[1:]
                if name == "train/lr"}  # fmt: skip


def test_a_scheduler_class_restarts_the_lr_and_resumes_on_its_curve(tmp_path):
    args = page_command("++scheduler.T_0=10")
    cfg = partial(make_cfg, *args, *SMALL, "max_steps=25", "logger=csv", "log_every_n_steps=1")
    for run in ("whole", "stopped"):  # made by Hydra when train.py runs
        (tmp_path / run).mkdir()
    fit(cfg(), tmp_path / "whole")
    lrs = lr_per_step(tmp_path / "whole")
    assert sorted(lrs) == list(range(1, 26))
    restarts = [step for step in lrs if step > 1 and lrs[step] > lrs[step - 1]]
    assert restarts == [10, 20] and lrs[10] == lrs[20] == 0.05  # back to the peak every 10
    assert lrs[1] == lrs[11] == lrs[21] < 0.05
    saved, _ = stop_and_resume(cfg, tmp_path / "stopped", step=13)  # mid-cycle
    assert saved["position"]["step"] == 13 and saved["optimizer"]["schedules"][0]["T_cur"] == 3
    assert lr_per_step(tmp_path / "stopped") == lrs  # the same curve, step by step


def test_a_keyword_the_scheduler_needs_is_one_line(tmp_path):
    args = [a for a in page_command("++scheduler.T_0=10") if "T_0" not in a]
    done = train_in_process(*args, *SMALL, cwd=tmp_path)
    page = (ROOT / "docs" / "make-it-yours.md").read_text()
    line = re.search(r"`(error: scheduler\.T_0=.*?)`", page)[1]
    assert_one_line_error(done, tmp_path, line.removeprefix("error: "))
    assert done.stderr.strip() == line


def test_the_warm_up_comes_before_a_scheduler_class_and_resumes_within_it():
    node = OmegaConf.create({"_target_": "torch.optim.lr_scheduler.StepLR", "step_size": 2, "gamma": 0.5})  # fmt: skip
    cfg = make_cfg("optimizer.lr=0.8", "optimizer.lr_warmup_steps=4").optimizer

    def run(steps: int, state: dict | None = None) -> tuple[list[float], dict]:
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.8)
        schedule = build_schedule(optimizer, cfg, node, total_steps=10)
        if state is not None:
            schedule.load_state_dict(state)
            optimizer.param_groups[0]["lr"] = state["lr"]  # as the optimizer's own state does
        lrs = []
        for _ in range(steps):
            lrs.append(optimizer.param_groups[0]["lr"])
            optimizer.step()  # the loop's order: the update, then the schedule
            schedule.step()
        return lrs, schedule.state_dict() | {"lr": optimizer.param_groups[0]["lr"]}

    lrs, _ = run(10)
    assert lrs == pytest.approx([0.2, 0.4, 0.6, 0.8, 0.8, 0.8, 0.4, 0.4, 0.2, 0.2])
    first, state = run(3)  # stopped within the warm-up
    rest, _ = run(7, state)
    assert first + rest == lrs
