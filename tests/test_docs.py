"""The API reference (`make docs`, docs/) builds with no warning, broken references included,
and holds what it promises: every exported name and layer with its docstring's first line,
every config key of every section, every CLI subcommand with its options, every SavedModel
signature. It is built once, in a subprocess, as `make docs` builds it but into a temporary
folder; the docstring checks read the source and need no build."""

import argparse
import ast
import dataclasses
import html
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

import keras_transformer
from keras_transformer.config import REPO_ROOT, CorpusConfig, ExperimentConfig, ModifiersConfig

DOCS = REPO_ROOT / "docs"
PACKAGE = REPO_ROOT / "keras_transformer"


def module_path(module: str) -> Path:
    """The source file of `keras_transformer.{module}` (a dotted name below the package)."""
    path = PACKAGE.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def layer_exports() -> dict[str, str]:
    """Public name -> defining module (below the package) of what `layers/__init__` imports."""
    tree = ast.parse(module_path("layers").read_text(encoding="utf-8"))
    return {alias.asname or alias.name: node.module.removeprefix("keras_transformer.")
            for node in tree.body if isinstance(node, ast.ImportFrom)
            for alias in node.names if not alias.name.startswith("_")}


# (documented name, module below the package, name in that module)
DOCUMENTED = (
    [(f"keras_transformer.{name}", module, name)
     for name, module in keras_transformer._EXPORTS.items()]
    + [(f"keras_transformer.layers.{name}", module, name)
       for name, module in layer_exports().items()])


def docstring(module: str, name: str) -> str | None:
    """The docstring of the class or function `name` that `module`'s source defines (following
    `from keras_transformer.X import name`), None if it has none."""
    tree = ast.parse(module_path(module).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.name == name:
            return ast.get_docstring(node)
        if isinstance(node, ast.ImportFrom) and node.module.startswith("keras_transformer."):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return docstring(node.module.removeprefix("keras_transformer."), alias.name)
    raise AssertionError(f"keras_transformer.{module} defines no class or function {name!r}: "
                         "an exported name needs a def or class to hold its docstring")


def test_every_exported_name_and_layer_has_a_docstring():
    assert set(keras_transformer.__all__) == {"__version__", *keras_transformer._EXPORTS}
    missing = [f"{documented} (keras_transformer/{module_path(module).relative_to(PACKAGE)})"
               for documented, module, name in DOCUMENTED if not docstring(module, name)]
    assert not missing, f"no docstring: {missing}"


@pytest.fixture(scope="module")
def html_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("docs")
    build = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html",
         "-d", str(out / "doctrees"), str(DOCS), str(out / "html")],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    if "No module named sphinx" in build.stderr:
        pytest.fail("Sphinx is not installed: pip install -e '.[docs]'")
    warnings = [line for line in build.stderr.splitlines()
                if ("WARNING:" in line and "absl::InitializeLog" not in line) or "ERROR:" in line]
    assert build.returncode == 0 and not warnings, \
        f"sphinx-build failed ({build.returncode}):\n" + "\n".join(warnings or [build.stderr])
    return out / "html"


def page(html_dir: Path, name: str) -> str:
    return (html_dir / f"{name}.html").read_text(encoding="utf-8")


def text(fragment: str) -> str:
    """The visible text of an HTML fragment, whitespace runs made one space."""
    fragment = re.sub(r"<(script|style)\b.*?</\1>", "", fragment, flags=re.S)
    fragment = re.sub(r"</?(p|div|dt|dd|li|td|th|tr|h\d|pre|section|table|br)\b[^>]*>", " ",
                      fragment)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", fragment)).split())


def entry(source: str, object_id: str) -> str:
    """The HTML of one autodoc entry, from its signature up to the next signature (a member's
    or the next object's)."""
    start = source.find(f'id="{object_id}"')
    assert start >= 0, f"{object_id} is not in the reference"
    end = source.find("<dt", start + 1)
    return source[start:end if end >= 0 else None]


def test_the_reference_builds_strictly_with_every_name_and_its_first_line(html_dir):
    pages = {"keras_transformer": page(html_dir, "api"),
             "keras_transformer.layers": page(html_dir, "layers")}
    for documented, module, name in DOCUMENTED:
        first_line = docstring(module, name).splitlines()[0]
        expected = " ".join(first_line.replace("`", "").split())
        shown = text(entry(pages[documented.rsplit(".", 1)[0]], documented))
        assert expected in shown, f"{documented}: {expected!r} not in {shown[:300]!r}"


def table_rows(fragment: str) -> list[str]:
    """The first cell's text of every body row of the HTML tables in `fragment`."""
    rows = re.findall(r"<tr[^>]*>\s*<td[^>]*>(.*?)</td>", fragment, re.S)
    return [text(cell) for cell in rows]


def test_every_config_key_of_every_section_has_its_row(html_dir):
    source = page(html_dir, "config")
    hints = typing.get_type_hints(ExperimentConfig)
    sections = {"top": [f.name for f in dataclasses.fields(ExperimentConfig)
                        if not dataclasses.is_dataclass(hints[f.name])]}
    for field in dataclasses.fields(ExperimentConfig):
        if dataclasses.is_dataclass(hints[field.name]):
            sections[field.name] = [f.name for f in dataclasses.fields(hints[field.name])]
    sections["data-corpora"] = [f.name for f in dataclasses.fields(CorpusConfig)]  # a list
    sections["data-modifiers"] = [f.name for f in dataclasses.fields(ModifiersConfig)]
    assert {"model", "data", "train", "decode"} <= set(sections)
    chunks = re.split(r'<section id="config-', source)[1:]
    by_section = {chunk.split('"', 1)[0]: chunk for chunk in chunks}
    assert set(by_section) == set(sections)
    for section, keys in sections.items():
        assert table_rows(by_section[section]) == keys, section
    # A comment in config.py is the key's description.
    assert "inner width of the position-wise feed-forward network" in text(by_section["model"])


def test_every_cli_subcommand_appears_with_its_options(html_dir):
    from keras_transformer.cli import build_parser

    source = page(html_dir, "cli")
    parser = build_parser()
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    names = list(subparsers.choices)
    assert "train" in names and "tune-search" in names
    starts = {name: source.find(f'<section id="{name}"') for name in names}
    assert all(start >= 0 for start in starts.values()), starts
    ordered = sorted(starts.values()) + [len(source)]
    for name, subparser in subparsers.choices.items():
        start = starts[name]
        chunk = text(source[start:ordered[ordered.index(start) + 1]])
        assert chunk.startswith(name), (name, chunk[:100])
        for action in subparser._actions:
            if isinstance(action, argparse._HelpAction):  # sphinx-argparse leaves out -h
                continue
            for option in action.option_strings:
                assert option in chunk, f"{name}: {option} is not documented"


def test_every_savedmodel_signature_has_its_row(html_dir):
    from keras_transformer.decoding.translator import SIGNATURE_INPUT, SIGNATURES

    source = page(html_dir, "savedmodel")
    assert table_rows(source) == list(SIGNATURES)
    assert f"{SIGNATURE_INPUT}: string [batch]" in text(source)


def test_the_site_holds_the_guide_with_its_pictures_the_user_pages_and_the_results(html_dir):
    """The guide notebook rendered as committed (each picture it holds is an image of the
    page), the pages README links to, RESULTS.md with its figures and the log it links to, and
    a footer with its copyright."""
    import json

    notebook = json.loads((DOCS / "guide.ipynb").read_text(encoding="utf-8"))
    pictures = sum("image/png" in output.get("data", {}) for cell in notebook["cells"]
                   for output in cell.get("outputs", []))
    guide = page(html_dir, "guide")
    assert pictures >= 4 and len(re.findall(r'<img [^>]*src="_images/', guide)) == pictures
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    for name in re.findall(r"\]\(docs/(\w+)\.md\)", readme):
        title = (DOCS / f"{name}.md").read_text(encoding="utf-8").splitlines()[0][2:]
        assert title in text(page(html_dir, name)), name
    results = page(html_dir, "_generated/experiments/RESULTS")
    assert "Translation quality" in text(results)
    assert re.search(r'href="../../_downloads/\w+/curves_2h.png"', results)  # its figure
    assert (html_dir / "_generated/experiments/log/2026-12-06.html").is_file()
    assert "2026, keras-transformer authors" in text(page(html_dir, "index"))
    assert len(readme.splitlines()) <= 255  # the front page; the rest is here
