"""train.py is the training loop a forker owns: short, whole, the gears visible where they
act; the library holds components, no Trainer class to subclass."""

from __future__ import annotations

import ast
import re

from helpers import ROOT

import train

MAX_LINES = 300
TIPS_AT_LEAST = 8  # distinct tips of docs/gears.md tagged `# tip N` where they act in it


def test_train_py_is_a_short_script_that_holds_the_loop():
    text = (ROOT / "train.py").read_text()
    assert len(text.splitlines()) <= MAX_LINES
    loop = ast.get_source_segment(text, _function(text, "train"))
    for visible in ("autocast", "backward", "zero_grad", "non_blocking", "grad_sync",
                    "clip_grad_norm", "precision.step", "validation("):  # fmt: skip
        assert visible in loop, f"{visible} is not visible in train.py's loop"
    comments = [line.split("#", 1)[1] for line in text.splitlines() if "#" in line]
    tips = {int(n) for comment in comments for n in re.findall(r"\btip (\d+)", comment)}
    assert len(tips) >= TIPS_AT_LEAST, sorted(tips)
    assert train.fit.__module__ == train.train.__module__ == "train"


def test_the_library_has_no_trainer_class():
    for path in (ROOT / "src").rglob("*.py"):
        classes = {
            n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)
        }
        assert "Trainer" not in classes, path


def _function(text: str, name: str) -> ast.FunctionDef:
    (found,) = [
        n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == name
    ]
    return found
