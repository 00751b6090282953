"""Each optional capability deletes cleanly: docs/layout.md's "Deleting a capability" table,
row by row, on a copy of the repository.

For a row: copy the repository's files, delete the row's paths, remove the lines it names;
then no remaining module, test or script imports what was deleted (read with ast, lazy
imports too, except those the row lists as left behind), the remaining tests collect and a
default run trains. The copy runs with its own src/ alone on the path: the shared venv's
editable install would otherwise find a deleted plug-in in the main checkout (hydra_plugins
is a namespace package, merged across the path).
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import ROOT, seconds

CHECKED = ("src/", "tests/", "scripts/")  # and train.py: where an import of a deleted module breaks

# Runs sys.argv[3:] as `python ...` with the copy's src/ (sys.argv[1]) the only one on the path
# that holds gearshift or the plug-ins; sys.argv[2] lists the deleted modules, which must not
# be found.
ISOLATED = """
import importlib.util, runpy, sys
from pathlib import Path
own_src, deleted = sys.argv[1], sys.argv[2].split(",")
sys.path[:] = [p for p in sys.path if p == own_src or not (
    Path(p or ".", "gearshift").is_dir() or any(Path(p or ".", "hydra_plugins").glob("gearshift_*")))]
def found(name):
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # its package is gone too
        return False
assert not [n for n in deleted if n and found(n)], f"deleted, yet found: {deleted}"
sys.argv = sys.argv[3:]
if sys.argv[0] == "-m":
    sys.argv = sys.argv[1:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    runpy.run_path(sys.argv[0], run_name="__main__")
"""


@dataclass
class Row:
    capability: str
    delete: list[str]  # paths; one ending in / is a folder
    remove_lines: list[tuple[str, str]]  # (file, text of the line)
    left_behind: list[tuple[str, str]]  # (file, module it may still import)


def pairs(cell: str) -> list[tuple[str, str]]:
    return [tuple(item.split(": ", 1)) for item in re.findall(r"`([^`]+)`", cell)]


def capability_rows() -> list[Row]:
    page = (ROOT / "docs" / "layout.md").read_text()
    section = page.split("\n## Deleting a capability\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| ")][1:]  # no header
    rows = []
    for line in lines:
        name, delete, remove, left = (c.strip() for c in line.strip().strip("|").split("|"))
        rows.append(Row(name, re.findall(r"`([^`]+)`", delete), pairs(remove), pairs(left)))
    return rows


ROWS = capability_rows()


def repository_files() -> list[str]:
    """The files git tracks or would track (untracked ones not ignored), as in a fresh clone."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    return sorted(path for path in set(listed) if (ROOT / path).is_file())


def deleted_by(row: Row, files: list[str]) -> list[str]:
    return [
        f for f in files if any(f == p or (p.endswith("/") and f.startswith(p)) for p in row.delete)
    ]


def module_names(path: str) -> list[str]:
    """The names a .py file is imported by: dotted from src/, by its stem from tests/ and
    scripts/ (their own folder is on the path), a package by its folder."""
    if not path.endswith(".py"):
        return []
    parts = Path(path).with_suffix("").parts
    if parts[0] == "src":
        parts = parts[1:]
    elif parts[0] in ("tests", "scripts"):
        parts = parts[-1:]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return [".".join(parts)]


def imported_modules(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, module) for every import in the file, at any depth (lazy ones too); `from a
    import b` names both a and a.b (b may be a module)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the file's package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def package_of(path: str) -> str:
    parts = Path(path).parts
    return ".".join(parts[1:-1]) if parts[0] == "src" else ""


def dangling_imports(copy: Path, row: Row, gone: list[str]) -> list[str]:
    """`file:line imports module` for each import in the copy's remaining Python files of a
    module the row deleted, except those it lists as left behind."""
    deleted = {name for path in gone for name in module_names(path)}
    allowed = set(row.left_behind)
    bad = []
    for path in sorted(copy.rglob("*.py")):
        rel = path.relative_to(copy).as_posix()
        if not (rel.startswith(CHECKED) or rel == "train.py"):
            continue
        for line, module in imported_modules(path, package_of(rel)):
            hit = next((d for d in deleted if module == d or module.startswith(d + ".")), None)
            if hit and not any(rel == f and module.startswith(m) for f, m in allowed):
                bad.append(f"{rel}:{line} imports {module}")
    return bad


def config_choices(gone: list[str]) -> list[tuple[str, str]]:
    """(group, option) of each deleted config file: conf/model/gpt.yaml is model=gpt."""
    files = [Path(f) for f in gone if f.startswith("conf/") and f.endswith(".yaml")]
    return [(f.parent.relative_to("conf").as_posix(), f.stem) for f in files]


def dangling_names(copy: Path, row: Row, gone: list[str]) -> list[str]:
    """`file:line names x` for each line of the copy's code, configs and scripts that chooses
    a deleted config (model=gpt, experiment=[fast,lm], `/model: gpt`) or names a deleted
    script or page by its file name: a test that would fail on running, not on collecting.
    A file whose imports the row leaves behind may name it too, in the same guarded branch."""
    patterns = [
        rf"(?<![\w./]){re.escape(g)}=\[?(\w+,)*{re.escape(o)}(?![\w.])|/{re.escape(g)}: {re.escape(o)}\b"
        for g, o in config_choices(gone)
    ]
    patterns += [
        rf"(?<![\w.-]){re.escape(Path(f).name)}\b"
        for f in gone
        if f.startswith(("scripts/", "docs/")) and "/" not in f.split("/", 1)[1]
    ]
    patterns += [rf"{re.escape(f)}\b" for f in gone if f.startswith("scripts/")]
    if not patterns:
        return []
    names = re.compile("|".join(patterns))
    bad = []
    for path in sorted(p for p in copy.rglob("*") if p.is_file()):
        rel = path.relative_to(copy).as_posix()
        code = rel.startswith(CHECKED) and path.suffix in (".py", ".sh")
        if not (code or rel.startswith("conf/") or rel in ("train.py", "Makefile", "Dockerfile")):
            continue
        if rel == "tests/test_layout.py" or rel in {f for f, _ in row.left_behind}:
            continue  # this file's own check writes such names; the row's own guarded ones
        for n, text in code_text(path):
            if match := names.search(text):
                bad.append(f"{rel}:{n} names {match[0]}")
    return bad


def code_text(path: Path) -> list[tuple[int, str]]:
    """(line, text) of what a file runs with: a Python file's strings (docstrings aside),
    another file's lines without their comments. A comment or docstring may still name a
    deleted part; the code may not."""
    if path.suffix != ".py":
        return [(n, line.split("#")[0]) for n, line in enumerate(path.read_text().splitlines(), 1)]
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    strings = [node for node in ast.walk(tree) if isinstance(node, ast.Constant)]
    return sorted(
        (node.lineno, node.value)
        for node in strings
        if isinstance(node.value, str) and id(node) not in docstrings
    )


def make_copy(row: Row, files: list[str], target: Path) -> list[str]:
    """The repository's files in `target` without the row's paths and lines; the deleted files."""
    gone = deleted_by(row, files)
    for f in files:
        if f not in gone:
            (target / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, target / f)
    for f, text in row.remove_lines:
        page = target / f
        kept = [line for line in page.read_text().splitlines(keepends=True) if text not in line]
        assert len(kept) == len(page.read_text().splitlines()) - 1, f"{f}: one line with {text}"
        page.write_text("".join(kept))
    return gone


def isolated(copy: Path, gone: list[str], *command: str, timeout: float):
    deleted = sorted({n for p in gone for n in module_names(p) if p.startswith("src/")})
    return subprocess.run(
        [sys.executable, "-c", ISOLATED, str(copy / "src"), ",".join(deleted), *command],
        cwd=copy, env=environment(copy), capture_output=True, text=True, timeout=seconds(timeout),
    )  # fmt: skip


def environment(copy: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "PYTEST_"))}
    return {**env, "PYTHONPATH": str(copy / "src"), "HOME": str(copy)}


def test_the_table_has_rows_whose_paths_exist():
    assert [row.capability.split(" (")[0] for row in ROWS][:1] == ["Optuna sweeper"]
    files = repository_files()
    for row in ROWS:
        for path in row.delete:
            assert deleted_by(Row("", [path], [], []), files), f"{row.capability}: {path} is gone"
        for f, text in row.remove_lines:
            assert text in (ROOT / f).read_text(), f"{row.capability}: no line of {f} has {text}"


def test_an_import_or_a_choice_of_a_deleted_capability_is_found(tmp_path):
    # the check's own check: the core importing the Optuna sweeper, at the top or lazily
    [row] = [row for row in ROWS if row.capability.startswith("Optuna sweeper")]
    files = [
        f
        for f in repository_files()
        if f.startswith(("src/", "conf/", "docs/", "README", "mkdocs"))
    ]
    gone = make_copy(row, files, tmp_path)
    assert dangling_imports(tmp_path, row, gone) == []
    build = tmp_path / "src" / "gearshift" / "build.py"
    build.write_text(
        build.read_text()
        + "\n\ndef f():\n    from hydra_plugins.gearshift_sweeper import _sweep\n"
        + "import hydra_plugins.gearshift_sweeper.sweeper\n"
    )
    found = dangling_imports(tmp_path, row, gone)
    assert [line.split(":")[0] for line in found] == ["src/gearshift/build.py"] * 3, found
    assert any("imports hydra_plugins.gearshift_sweeper._sweep" in line for line in found)
    # and a test that still chooses the deleted preset, or reads the deleted page
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        'ARGS = ["-m", "hparams_search=lr_batch"]  # docs/optuna.md\nPAGE = "optuna.md"\n'
    )
    assert dangling_names(tmp_path, row, gone) == [
        "tests/test_x.py:1 names hparams_search=lr_batch",
        "tests/test_x.py:2 names optuna.md",
    ]


IDS = [row.capability.split(" (")[0] for row in ROWS]


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_nothing_left_imports_a_deleted_capability_or_links_its_page(row, tmp_path):
    files = repository_files()
    kept = [f for f in files if f.endswith((".py", ".md", ".yml", ".yaml", ".sh")) or "/" not in f]
    gone = make_copy(row, kept, tmp_path)
    assert dangling_imports(tmp_path, row, gone) == []
    assert dangling_names(tmp_path, row, gone) == []
    # the docs' own references: the README's links and the site's nav
    readme = (tmp_path / "README.md").read_text()
    links = [link.split("#")[0] for link in re.findall(r"\]\((docs/[^)]+)\)", readme)]
    nav = re.findall(r": (\S+\.md)$", (tmp_path / "mkdocs.yml").read_text(), re.M)
    missing = [p for p in [*links, *(f"docs/{page}" for page in nav)] if p in gone]
    assert missing == [], f"named, but deleted: {missing}"


@pytest.mark.slow  # minutes a row: the suite's collection and a run; the imports are checked fast above
@pytest.mark.timeout(seconds(600))  # its two processes' limits
@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_without_a_capability_the_tests_collect_and_a_default_run_trains(row, tmp_path):
    copy = tmp_path / "repo"
    gone = make_copy(row, repository_files(), copy)
    collected = isolated(
        copy, gone, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests",
        timeout=300,
    )  # fmt: skip
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
    run = isolated(
        copy, gone, "train.py", "max_steps=2", "logger=none", f"hydra.run.dir={tmp_path / 'run'}",
        timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert (tmp_path / "run" / "summary.json").is_file()
