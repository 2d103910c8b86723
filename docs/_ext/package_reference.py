"""`.. package-reference:: PACKAGE`: autodoc entries for every public name of a package.

The names come from the package itself, so a name it starts (or stops) exporting appears in (or
leaves) the reference without an edit here: `keras_transformer._EXPORTS` (name -> module) for
the top-level package, else the public names its `__init__` imports from its modules (as
`keras_transformer.layers` does), in the order it imports them. They are grouped under the
module that defines them, each group headed by the first paragraph of that module's docstring.

Also: Keras layers show their `__init__`'s signature, a dataclass's `default_factory` fields
their factory's call; and docstrings here set code off by indentation alone, as Markdown does
(`Usage:` then an indented block). The `autodoc-process-docstring` hook makes such a block
after a top-level paragraph a literal block, so it is shown as code, not a quoted paragraph.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util import inspect as sphinx_inspect
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

# Napoleon's section headers: an indented block under one of these is the section's content.
NAPOLEON_SECTIONS = {
    "args", "arguments", "attention", "attributes", "caution", "danger", "error", "example",
    "examples", "hint", "important", "keyword args", "keyword arguments", "methods", "note",
    "notes", "other parameters", "parameters", "receive", "receives", "return", "returns",
    "raise", "raises", "references", "see also", "tip", "todo", "warning", "warnings", "warn",
    "warns", "yield", "yields",
}


def public_names(package_name: str) -> dict[str, str]:
    """Public name -> the module that defines it, in the package's order."""
    package = importlib.import_module(package_name)
    exports = getattr(package, "_EXPORTS", None)
    if exports is not None:
        return {name: f"{package_name}.{module}" for name, module in exports.items()}
    tree = ast.parse(inspect.getsource(package))
    return {alias.asname or alias.name: node.module
            for node in tree.body
            if isinstance(node, ast.ImportFrom) and node.module.startswith(package_name + ".")
            for alias in node.names if not alias.name.startswith("_")}


def first_paragraph(text: str | None) -> str:
    paragraphs = inspect.cleandoc(text or "").split("\n\n")
    return paragraphs[0]


class PackageReference(SphinxDirective):
    required_arguments = 1
    has_content = False

    def run(self):
        package_name = self.arguments[0]
        groups: dict[str, list[str]] = {}
        for name, module in public_names(package_name).items():
            groups.setdefault(module, []).append(name)
        if not groups:
            raise self.error(f"{package_name} exports no public names")
        lines = []
        for module_name, names in groups.items():
            module = importlib.import_module(module_name)
            lines += [module_name, "-" * len(module_name), "",
                      *first_paragraph(module.__doc__).splitlines(), ""]
            for name in names:
                value = getattr(importlib.import_module(package_name), name)
                if inspect.isclass(value):
                    lines += [f".. autoclass:: {package_name}.{name}", "   :members:", ""]
                else:
                    lines += [f".. autofunction:: {package_name}.{name}", ""]
        node = nodes.section()
        node.document = self.state.document
        nested_parse_with_titles(self.state, StringList(lines, source=package_name), node)
        return node.children


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def indented_code_as_literal(lines: list[str]) -> list[str]:
    """`lines` with every indented block that follows a top-level paragraph (not a napoleon
    section header, a list item, or a paragraph already ending in `::`) made a literal block."""
    out = []
    for i, line in enumerate(lines):
        previous = lines[i - 1] if i else ""
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if line.strip() or not previous.strip() or not following.strip():
            out.append(line)
            continue
        start = i - 1
        while start > 0 and lines[start - 1].strip():
            start -= 1
        paragraph = lines[start]
        if (_indent(previous) == 0 and _indent(paragraph) == 0 and _indent(following) > 0
                and not previous.rstrip().endswith("::")
                and previous.strip().rstrip(":").lower() not in NAPOLEON_SECTIONS
                and not paragraph.lstrip().startswith(("- ", "* ", "+ ", ".. "))):
            if previous.rstrip().endswith(":"):
                out[-1] = previous.rstrip() + ":"
            else:
                out += ["", "::"]
        out.append(line)
    return out


def _process_docstring(app, what, name, obj, options, lines):
    lines[:] = indented_code_as_literal(lines)


def _process_signature(app, what, name, obj, options, signature, return_annotation):
    """A Keras layer's signature from its `__init__`: Keras' `Layer.__new__(*args, **kwargs)`
    would hide it. A dataclass field's `default_factory` shown as its call (`ModelConfig()`),
    not as `<factory>`, which is no Python expression: Sphinx would print the signature
    unparsed."""
    if not inspect.isclass(obj) or signature is None:
        return None
    if signature == "(*args, **kwargs)" and obj.__init__ is not object.__init__:
        init = sphinx_inspect.signature(obj.__init__, bound_method=True)
        signature = sphinx_inspect.stringify_signature(init, show_return_annotation=False)
    if not dataclasses.is_dataclass(obj):
        return signature, return_annotation
    for field in dataclasses.fields(obj):
        if field.default_factory is not dataclasses.MISSING:
            factory = getattr(field.default_factory, "__qualname__", "factory")
            signature = signature.replace("<factory>", f"{factory}()", 1)
    return signature, return_annotation


def setup(app):
    app.add_directive("package-reference", PackageReference)
    app.connect("autodoc-process-signature", _process_signature)
    # Before napoleon (priority 500), which turns Google sections into indented fields.
    app.connect("autodoc-process-docstring", _process_docstring, priority=400)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
