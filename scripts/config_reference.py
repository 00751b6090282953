"""The config reference of the manual, generated from the schema and conf/ at build time.

Every leaf key of the composed default config (what `python train.py --cfg job` prints) with
its default, its allowed values and a one-line meaning: the meanings and allowed values are
the comments and the value constants beside each field in src/gearshift/config/schema.py
(for the nodes without a dataclass, `data`, `model` and `task`, the comments of their
default option's file in conf/), and each config group's options are the files of its
folder in conf/. A key added to the schema therefore appears in the docs without an edit.

    python scripts/config_reference.py            # the page's generated part, to stdout
    python scripts/config_reference.py OUT.md     # written to a file

It is also the site's MkDocs hook (mkdocs.yml `hooks:`): it appends the reference to
docs/config-reference.md and makes README.md the site's front page (docs/index.md, with
its links into docs/ made relative), so `mkdocs build --strict` checks the README's links.
"""

from __future__ import annotations

import ast
import contextlib
import io
import re
import sys
import tokenize
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
SCHEMA = ROOT / "src" / "gearshift" / "config" / "schema.py"
REFERENCE_PAGE = "config-reference.md"
# Config groups that are presets (they set keys of other nodes) rather than nodes of their own.
PRESETS = ("experiment", "gear", "sweep", "hparams_search")
# The nodes built through their _target_, without a dataclass: their default option's file.
TARGET_NODES = ("data", "model", "task")
# Open nodes (a class and its keywords) whose own keys a dataclass documents.
NODE_CLASSES = {"optimizer": "OptimizerConfig", "scheduler": "SchedulerConfig"}


def composed_config() -> dict[str, Any]:
    """The default config as `python train.py --cfg job` prints it, unresolved."""
    if str(ROOT / "src") not in sys.path:
        sys.path.insert(0, str(ROOT / "src"))
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import gearshift.config.schema  # noqa: F401  (registers gearshift_schema)

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config")
    return OmegaConf.to_container(cfg, resolve=False)


def leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    """{dotted key: value} for every leaf (a list is a leaf) of a nested dict."""
    if isinstance(node, dict) and (node or not prefix):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(leaves(value, f"{prefix}{key}" if not prefix else f"{prefix}.{key}"))
        return out
    return {prefix: node}


def comments_by_line(source: str) -> dict[int, str]:
    """{line number: the comment's text} of a Python source."""
    return {
        token.start[0]: token.string.lstrip("#").strip()
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    }


def schema_fields() -> tuple[dict[str, dict[str, dict[str, str]]], dict[str, str], dict]:
    """({class: {field: {type, comment}}}, {class: docstring's first line}, the constants)."""
    source = SCHEMA.read_text()
    tree = ast.parse(source)
    comments = comments_by_line(source)
    lines = source.splitlines()
    classes: dict[str, dict[str, dict[str, str]]] = {}
    docs: dict[str, str] = {}
    constants: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            with contextlib.suppress(ValueError):  # a value that is no literal: not a constant
                constants[node.targets[0].id] = ast.literal_eval(node.value)
        if not isinstance(node, ast.ClassDef):
            continue
        docs[node.name] = " ".join((ast.get_docstring(node) or "").split("\n\n")[0].split())
        fields = classes.setdefault(node.name, {})
        for item in node.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            above = []  # full-line comments right above the field
            number = item.lineno - 1
            while number >= 1 and lines[number - 1].strip().startswith("#"):
                above.insert(0, comments[number])
                number -= 1
            trailing = comments.get(item.lineno, "")
            fields[item.target.id] = {
                "type": ast.get_source_segment(source, item.annotation) or "",
                "comment": " ".join([*above, trailing]).strip(),
            }
    return classes, docs, constants


def yaml_comments(path: Path) -> tuple[str, dict[str, str]]:
    """(the file's leading comment, {top-level key: its trailing comment}) of a conf file."""
    head: list[str] = []
    keys: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.startswith("#") and not keys and "@package" not in line:
            head.append(line.lstrip("#").strip())
        elif match := re.match(r"^(\w+):.*?\s#\s*(.*)$", line):
            keys[match[1]] = match[2].strip()
        elif match := re.match(r"^(\w+):", line):
            keys.setdefault(match[1], "")
    return " ".join(head), keys


def first_sentence(text: str) -> str:
    """Up to the first `.` or `;` that ends a clause: one inside brackets does not."""
    depth = 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char in ".;" and depth == 0 and text[i + 1 : i + 2].strip() == "":
            return text[:i]
    return text


def package_of(path: Path, group: str) -> str:
    """Where a conf file's keys go: its `# @package` ('' for `_global_`), else its group."""
    match = re.search(r"^# @package (\S+)", path.read_text(), re.MULTILINE)
    package = match[1] if match else "_group_"
    return {"_global_": "", "_group_": group}.get(package, package)


def value_text(value: Any) -> str:
    """A value as YAML writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ", ".join(value_text(v) for v in value) + "]"
    return str(value)


def allowed(field: dict[str, str], constants: dict[str, Any]) -> tuple[str, str]:
    """(the allowed values, the comment without the constant's name) of a schema field."""
    comment = field["comment"]
    if (match := re.match(r"^([A-Z][A-Z_]+)\b[;:,]?\s*(.*)$", comment)) and match[1] in constants:
        values = ", ".join(f"`{value_text(v)}`" for v in constants[match[1]])
        return values, match[2]
    kind = field["type"]
    optional = "| None" in kind
    base = kind.replace("| None", "").strip()
    text = {
        "bool": "`true`, `false`",
        "int": "an integer",
        "float": "a number",
        "str": "a string",
        "list[float]": "a list of numbers",
        "list[str]": "a list of strings",
    }.get(base, "")
    if optional:
        text = f"{text}, or `null`" if text else "`null` or a value"
    return text, comment


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def group_options(group: str) -> list[str]:
    folder = CONF / group
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def default_choices() -> dict[str, str]:
    """{group: its default option} from conf/config.yaml's defaults list."""
    choices = {}
    for line in (CONF / "config.yaml").read_text().splitlines():
        if match := re.match(r"^\s+- (\w+): \"?([\w]+)\"?", line):
            choices[match[1]] = match[2]
    return choices


def reference() -> str:
    """The generated part of the config reference page, as Markdown."""
    config = composed_config()
    classes, docs, constants = schema_fields()
    top = classes["Config"]
    choices = default_choices()
    out: list[str] = []

    def table(rows: list[tuple[str, str, str, str]]) -> None:
        out.extend(["| key | default | allowed | meaning |", "|---|---|---|---|"])
        out.extend(f"| `{k}` | `{cell(d)}` | {cell(a)} | {cell(m)} |" for k, d, a, m in rows)
        out.append("")

    scalars = [k for k, v in config.items() if not isinstance(v, dict)]
    out += ["## Top-level keys", ""]
    rows = []
    for key in scalars:
        values, meaning = allowed(top.get(key, {"type": "", "comment": ""}), constants)
        rows.append((key, value_text(config[key]), values, meaning))
    table(rows)

    for node, value in config.items():
        if not isinstance(value, dict):
            continue
        out += [f"## `{node}`", ""]
        kind = NODE_CLASSES.get(node) or re.sub(r"\s*=.*", "", top.get(node, {}).get("type", ""))
        options = group_options(node) if node not in PRESETS else []
        intro = docs.get(kind, "") or top.get(node, {}).get("comment", "")
        if node in TARGET_NODES and node in choices:
            head, _ = yaml_comments(CONF / node / f"{choices[node]}.yaml")
            default_head = head and f"The default, `{node}={choices[node]}`: {head}"
            intro = " ".join(filter(None, [intro and f"{intro}.", default_head]))
        if intro:
            out += [intro, ""]
        if options:
            default = f" (default `{choices[node]}`)" if node in choices else ""
            out += [
                f"Options: `{node}={'|'.join(options)}`{default}, the files of `conf/{node}/`.",
                "",
            ]
        rows = []
        yaml_keys = (
            yaml_comments(CONF / node / f"{choices[node]}.yaml")[1]
            if node in TARGET_NODES and node in choices
            else {}
        )
        for key, default in leaves(value, node).items():
            name = key.split(".", 1)[1]
            field = classes.get(kind, {}).get(name.split(".")[0])
            if field is None and node == "model" and name in ("init_from", "init_strict"):
                field = {"type": "", "comment": model_key_comment(name)}
            if field is None:
                target = value.get("_target_", "")
                meaning = yaml_keys.get(name.split(".")[0]) or (
                    "what the node builds" if name == "_target_" else f"an argument of `{target}`"
                )
                field = {"type": "", "comment": meaning}
            values, meaning = allowed(field, constants)
            rows.append((key, value_text(default), values, meaning))
        table(rows)
        if node in TARGET_NODES:
            out.extend(other_options(node, choices.get(node)))

    out += ["## Presets", ""]
    out += [
        "These groups set keys of the nodes above; each is off (`null`) by default.",
        "",
        "| option | what it sets |",
        "|---|---|",
    ]
    for group in PRESETS:
        for option in group_options(group):
            head, _ = yaml_comments(CONF / group / f"{option}.yaml")
            out.append(f"| `{group}={option}` | {cell(first_sentence(head))} |")
    out.append("")
    return "\n".join(out)


def other_options(node: str, default: str | None) -> list[str]:
    """The keys each other option of a _target_ node sets, with its file's comments."""
    from omegaconf import OmegaConf

    out: list[str] = []
    for option in group_options(node):
        if option == default:
            continue
        path = CONF / node / f"{option}.yaml"
        head, comments = yaml_comments(path)
        values = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        values.pop("defaults", None)
        out += [f"### `{node}={option}`", ""]
        if head:
            out += [head, ""]
        out += ["| key | value | meaning |", "|---|---|---|"]
        package = package_of(path, node)  # model=gpt2 is _global_: model.n_layer, data.block_size
        for key, value in leaves(values, package).items():
            in_file = key.removeprefix(f"{package}.") if package else key
            meaning = comments.get(in_file.split(".")[0], "")
            out.append(f"| `{key}` | `{cell(value_text(value))}` | {cell(meaning)} |")
        out.append("")
    return out


def model_key_comment(name: str) -> str:
    """The schema's comment on MODEL_KEYS' `name` (the lines above it: `name: meaning`)."""
    for comment in comments_by_line(SCHEMA.read_text()).values():
        if comment.startswith(f"{name}:"):
            return comment.split(":", 1)[1].strip().rstrip(";.")
    return ""


# ----------------------------------------------------------------- the MkDocs hook


def on_files(files, config):
    """README.md as the site's front page, its links into docs/ relative to the site."""
    from mkdocs.structure.files import File

    text = (ROOT / "README.md").read_text().replace("](docs/", "](")
    files.append(File.generated(config, "index.md", content=text))
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == REFERENCE_PAGE:
        markdown = markdown.rstrip("\n") + "\n\n" + reference()
    return unescape_table_code(markdown)


def unescape_table_code(markdown: str) -> str:
    """`a\\|b` in a table row's code span as `a|b`: GitHub needs the backslash there, and
    Python-Markdown, which keeps a code span's pipes in their cell, would show it."""
    return "\n".join(
        re.sub(r"`[^`\n]*`", lambda m: m[0].replace("\\|", "|"), line)
        if line.startswith("|")
        else line
        for line in markdown.split("\n")
    )


if __name__ == "__main__":
    text = reference()
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(text)
    else:
        print(text)
