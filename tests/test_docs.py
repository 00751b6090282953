"""The docs cannot drift: they name every module and script (docs/layout.md's "Layout" and
docs/architecture.md's tables) and every component of a run (docs/architecture.md's
"Components"), the README stays a short front page whose links reach the
manual, every page is in the site's nav, and the generated config reference lists every key.

A module added without a line in both fails here, so the maps a reader starts from cannot
fall behind the code. (`make docs`, in CI, builds the site with --strict: every link and
anchor of every page, the README's included.)
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re

import pytest
import yaml
from helpers import ROOT, make_cfg
from omegaconf import OmegaConf

from gearshift.build import Run

PACKAGE = "src/gearshift/"


def documented_files() -> list[str]:
    """Every module under src/ (package __init__ files aside) and every script, relative to
    the repository."""
    modules = [p for p in (ROOT / "src").rglob("*.py") if p.name != "__init__.py"]
    scripts = [p for p in (ROOT / "scripts").rglob("*") if p.is_file()]
    return sorted(
        str(p.relative_to(ROOT)) for p in modules + scripts if "__pycache__" not in p.parts
    )


def named_in(text: str, name: str) -> bool:
    """`name` (a file or a/path.py) as a whole name in `text`, not as part of a longer one."""
    return re.search(rf"(?<![\w/.]){re.escape(name)}(?![\w/])", text) is not None


def listed(path: str, entries: dict[str, str]) -> bool:
    """Whether `path` has an entry of its own or is named in the entry of a folder above it."""
    return path in entries or any(
        folder.endswith("/") and path.startswith(folder) and named_in(text, path[len(folder) :])
        for folder, text in entries.items()
    )


def layout_page() -> dict[str, str]:
    """docs/layout.md's "Layout": {path: its text} per entry. An entry starts at column 0 (a
    path from the repository's root) or 2 (one inside the last folder at column 0); deeper
    lines continue the entry above."""
    page = (ROOT / "docs" / "layout.md").read_text()
    block = page.split("\n## Layout\n", 1)[1].split("```", 2)[1]
    entries: dict[str, str] = {}
    top = path = ""
    for line in block.splitlines()[1:]:
        indent = len(line) - len(line.lstrip())
        if not line.strip():
            continue
        if indent >= 4:
            entries[path] += "\n" + line
            continue
        name = line.split()[0]
        path = name if indent == 0 else top + name
        top = name if indent == 0 else top
        entries[path] = line
    return entries


def architecture_tables() -> dict[str, str]:
    """docs/architecture.md's "Packages and layers" rows: {path: the row}. A first cell
    inside src/gearshift/ is relative to it; any other starts at the repository's root."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("\n## Packages and layers\n", 1)[1].split("\n## ", 1)[0]
    entries = {}
    for line in section.splitlines():
        if match := re.match(r"^\| `([^`]+)` \|", line):
            cell = match[1]
            entries[cell if cell.startswith(("src/", "scripts/")) else PACKAGE + cell] = line
    return entries


@pytest.mark.parametrize(
    ("where", "entries"),
    [("docs/layout.md Layout", layout_page), ("docs/architecture.md", architecture_tables)],
)
def test_every_module_and_script_is_in_the_docs(where, entries):
    found = entries()
    missing = [path for path in documented_files() if not listed(path, found)]
    assert missing == [], f"not in {where}: {missing}"


def components_table() -> list[list[str]]:
    """docs/architecture.md's "Components" table: each row's cells, header and rule left out."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("\n## Components\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in row.strip().strip("|").split("|")] for row in rows[1:]]


def test_every_field_of_a_run_has_its_row_in_components():
    # a field is named in backticks in a row's first (component) or second (built by) cell
    rows = components_table()
    assert rows and all(len(row) == 5 for row in rows), "five columns a row"
    named = {name for row in rows for name in re.findall(r"`([^`]+)`", row[0] + row[1])}
    fields = [field.name for field in dataclasses.fields(Run)]
    assert {"precision", "forward", "checkpointer", "memory_history"} <= set(fields)
    assert [name for name in fields if name not in named] == []


def test_the_check_finds_a_missing_module():
    entries = {"src/gearshift/data/": "  data/  sources.py the seam; text.py the tokenizers"}
    assert listed("src/gearshift/data/sources.py", entries)
    assert not listed("src/gearshift/data/tokens.py", entries)  # named nowhere
    assert not listed("src/gearshift/observe/sources.py", entries)  # another folder's
    assert not listed("src/gearshift/data/seam.py", {"src/gearshift/data/": "data/ myseam.py"})


def test_the_readme_is_a_front_page_whose_links_reach_the_manual():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    links = re.findall(r"\]\(([^)]+)\)", readme)
    relative = [link.split("#")[0] for link in links if not re.match(r"\w+:", link)]
    assert relative, "the README links into docs/"
    outside = [link for link in relative if not link.startswith("docs/")]
    missing = [link for link in relative if not (ROOT / link).is_file()]
    assert outside == [] and missing == [], (outside, missing)


def test_the_readmes_make_it_yours_is_the_pages_example():
    # the README's short form of docs/make-it-yours.md (which tests/test_make_it_yours.py
    # trains): the same config, and the same command
    readme = (ROOT / "README.md").read_text().split("\n## Make it yours\n", 1)[1]
    page = (ROOT / "docs" / "make-it-yours.md").read_text()
    config = re.search(r"^```yaml\n(.*?)^```$", readme, re.S | re.M)[1]
    example = re.search(r"^```yaml\n(# @package _global_\n.*?)^```$", page, re.S | re.M)[1]
    assert yaml.safe_load(config) == yaml.safe_load(example)
    [readme_command] = [
        line for line in readme.split("\n## ", 1)[0].splitlines() if "train.py" in line
    ]
    [page_command] = [line for line in page.splitlines() if line.startswith("PYTHONPATH=. ")]
    assert readme_command.endswith(page_command)


def test_every_page_is_in_the_sites_nav():
    nav = (ROOT / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1]
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert [page for page in pages if f": {page}\n" not in nav] == []
    assert ": index.md\n" in nav  # README.md, made the front page by the hook


def test_the_config_reference_lists_every_key_of_the_composed_config():
    config_reference = load_script("config_reference")
    config = config_reference.composed_config()  # what `python train.py --cfg job` prints
    keys = config_reference.leaves(config)
    assert {"amp.dtype", "optimizer.lr", "data._target_", "model.init_from", "seed"} <= set(keys)
    text = config_reference.reference()
    assert [key for key in keys if f"| `{key}` |" not in text] == []
    # each group's options are its files in conf/, and a constant's values are listed
    assert "`amp=bf16|fp16|off|on`" in text and "`none`, `auto`, `bfloat16`, `float16`" in text


def test_each_options_keys_in_the_config_reference_are_keys_it_composes():
    config_reference = load_script("config_reference")
    text = config_reference.reference()
    sections = re.findall(r"^### `(\w+)=(\w+)`\n(.*?)(?=^#|\Z)", text, re.MULTILINE | re.DOTALL)
    assert ("model", "gpt2") in [(node, option) for node, option, _ in sections]
    for node, option, table in sections:
        composed = make_cfg(f"{node}={option}", tiny=False)
        keys = config_reference.leaves(OmegaConf.to_container(composed, resolve=False))
        listed = re.findall(r"^\| `([^`]+)` \|", table, re.MULTILINE)
        assert listed and [key for key in listed if key not in keys] == [], (node, option)
        if option == "gpt2":  # `# @package _global_`: the config's own keys, not model.model.*
            assert listed == [
                "model.block_size", "model.n_layer", "model.n_head", "model.n_embd",
                "data.block_size",
            ]  # fmt: skip


def test_a_presets_row_in_the_config_reference_keeps_its_brackets():
    text = load_script("config_reference").reference()
    rows = [line for line in text.splitlines() if re.match(r"\| `\w+=\w+` \| ", line)]
    assert [row for row in rows if row.count("(") != row.count(")")] == []
    assert (
        "| `experiment=baseline` | The plain loop: every gear off "
        "(the same as the defaults; named for sweeps) |"
    ) in rows


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# A comment that cites a tip of docs/gears.md by its number alone: "# 18", "# 1, 4, 6",
# "# 9, 10, 15-18", "# 11: against this machine".
BARE_TIP = re.compile(r"#\s*\d+(\s*[,-]\s*\d+)*\s*(:|$)")


def test_code_cites_tips_in_words():
    # "# tip 13: accumulation", never a bare number a reader has to look up
    bare = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted([*(ROOT / "src").rglob("*.py"), *(ROOT / "scripts").rglob("*.py")])
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if BARE_TIP.search(line)
    ]
    assert bare == []
