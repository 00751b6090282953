"""The builder (build.py) is the one reader of the composed root config: every component
below it is built from its own node (cfg.dataloader, cfg.optimizer, cfg.model ...) and the
plain values the builder passes. Checked twice: a real run records every call into a
module below the builder and finds the root in none of its arguments, and the signatures
of those modules name no `cfg` parameter that is not a node of config/schema.py."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import sys

import pytest
from helpers import make_cfg
from omegaconf import DictConfig

import gearshift
from gearshift.config import schema
from train import fit

# The layers below build.py (pyproject.toml's import-linter layers); config/ is the
# checking layer, whose checks read the root by design.
BELOW = (
    "gearshift.run_plan",
    "gearshift.config_advice",
    "gearshift.batch_finder",
    "gearshift.observe",
    "gearshift.state",
    "gearshift.data",
    "gearshift.models",
    "gearshift.tasks",
    "gearshift.parallel",
    "gearshift.engine",
)
# The builder's kin below it, which read the root as the builder does.
KIN = {
    # plan=on plans the run before anything is built (app.preflight), and plan.check /
    # batch_size=auto ask it about the run as composed: it traces what the builder would build.
    "gearshift.observe.plan": "the planner",
    # its two questions from the builder (batch_size=auto's first guess on CUDA, plan.check),
    # in a module of their own so that a run asking neither does not load them
    "gearshift.run_plan": "the planner's questions from the builder",
    # advise=true and python -m gearshift.advise: the nodes the advisor's rules read
    "gearshift.config_advice": "the advisor's picker of nodes",
}


def below(module: str) -> bool:
    inside = any(module == p or module.startswith(f"{p}.") for p in BELOW)
    return inside and module not in KIN


def is_root(value: object) -> bool:
    """A composed root config: a DictConfig with no parent that holds the run's nodes."""
    return (
        isinstance(value, DictConfig)
        and value._get_parent() is None
        and {"model", "optimizer", "dataloader"} <= set(value.keys())
    )


def holds_root(value: object) -> bool:
    """The root itself, in a tuple/list/dict argument, or held by a gearshift object."""
    if is_root(value):
        return True
    if isinstance(value, tuple | list):
        return any(is_root(v) for v in value)
    if isinstance(value, dict):
        return any(is_root(v) for v in value.values())
    if type(value).__module__.startswith("gearshift") and hasattr(value, "__dict__"):
        return any(is_root(v) for v in vars(value).values())
    return False


def root_calls(cfg: DictConfig, folder) -> list[str]:
    """Every function below the builder that a run of `cfg` called with the root."""
    caught: set[str] = set()

    def profile(frame, event, arg) -> None:
        if event != "call" or not below(frame.f_globals.get("__name__", "")):
            return
        code = frame.f_code
        count = code.co_argcount + code.co_kwonlyargcount
        count += bool(code.co_flags & inspect.CO_VARARGS)
        count += bool(code.co_flags & inspect.CO_VARKEYWORDS)
        for name in code.co_varnames[:count]:
            if holds_root(frame.f_locals.get(name)):
                caught.add(f"{frame.f_globals['__name__']}.{code.co_qualname}({name})")

    sys.setprofile(profile)
    try:
        fit(cfg, folder)
    finally:
        sys.setprofile(None)
    return sorted(caught)


RUNS = {
    "default": ("model=mlp",),
    # batch_size=auto probes the model and optimizer; plan.check asks the planner (kin)
    "batch_size=auto": ("model=mlp", "batch_size=auto", "plan.check=true"),
    "lm": (
        "experiment=lm",
        "batch_size=8",
        "model.n_layer=1",
        "model.n_embd=32",
        "data.num_samples=256",
        "task.sample_every=1",
    ),
}


@pytest.mark.parametrize("run", RUNS)
def test_no_component_below_the_builder_is_handed_the_root_config(run, tmp_path):
    tiny = ("logger=none", "progress_bar=false") if run == "lm" else ()  # no image size
    cfg = make_cfg(*tiny, *RUNS[run], "max_steps=2", "val_every_n_steps=2", tiny=run != "lm")
    calls = root_calls(cfg, tmp_path)
    assert calls == [], "\n".join(calls)


def below_modules() -> list[str]:
    names = []
    for package in BELOW:  # a package's modules, or a module on its own
        module = importlib.import_module(package)
        prefix = f"{package}."
        inside = getattr(module, "__path__", [])
        names += [package, *(m.name for m in pkgutil.iter_modules(inside, prefix))]
    return [name for name in names if name not in KIN]


NODES = {
    name
    for name, value in vars(schema).items()
    if dataclasses.is_dataclass(value) and value is not schema.Config
}


def functions_of(module) -> list:
    found = []
    for value in vars(module).values():
        if getattr(value, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(value):
            found.append(value)
        elif inspect.isclass(value):
            found += [v for v in vars(value).values() if inspect.isfunction(v)]
            found += [
                v.__func__
                for v in vars(value).values()
                if isinstance(v, classmethod | staticmethod)
            ]
    return found


def test_no_signature_below_the_builder_takes_the_root_config():
    """A parameter named `cfg` there is a node whose schema type says which; none is typed
    as the root (schema.Config). Nodes without a schema class are named after the node."""
    wrong = []
    for name in below_modules():
        module = importlib.import_module(name)
        for function in functions_of(module):
            for parameter in inspect.signature(function).parameters.values():
                annotation = str(parameter.annotation)
                if annotation.split(".")[-1] in ("Config", "'Config'"):
                    wrong.append(f"{name}.{function.__qualname__}({parameter.name}: {annotation})")
                elif parameter.name == "cfg" and annotation not in NODES:
                    wrong.append(f"{name}.{function.__qualname__}(cfg: {annotation})")
    assert wrong == [], "\n".join(wrong)


def test_the_checks_look_where_they_should():
    """The recorder sees the modules below the builder, and the root as the root."""
    assert below("gearshift.data.loading") and below("gearshift.batch_finder")
    assert not below("gearshift.build") and not below("gearshift.observe.plan")
    assert not below("gearshift.config.checks")
    cfg = make_cfg("model=mlp")
    assert is_root(cfg) and not is_root(cfg.dataloader) and not is_root(cfg.model)
    assert "gearshift.data.loading" in below_modules() and gearshift.__name__ == "gearshift"
