"""`.. config-tables:: MODULE.CLASS`: one table per section of an experiment config.

The sections are the fields of the config class (`ExperimentConfig`) whose type is a dataclass
(model, data, train, decode, ...); its other fields (`name`) are the top-level keys. Each table
lists a section's keys with their type, default and description, read from the code:
`dataclasses.fields` for the key and default, the type hints for the type (named as the config
errors name it), and the comments beside the field in the class's source for the description:
the comment after the field, or the comment lines right above it. A comment block above a field
that is followed (with no blank line) by fields without comments of their own describes the
group; those fields point to the first.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import io
import re
import textwrap
import tokenize
import typing

import yaml
from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective

COLUMNS = (("key", 2), ("type", 2), ("default", 2), ("description", 8))


@dataclasses.dataclass
class Key:
    name: str
    type: str
    default: str
    description: str


def field_comments(cls) -> dict[str, str]:
    """Field name -> the description its comments give (see the module docstring); fields
    without one are left out."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    comments = {}  # line number -> comment text, without "#"
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()

    def comment_only(lineno):
        return lineno in comments and lines[lineno - 1].lstrip().startswith("#")

    class_node = ast.parse(source).body[0]
    descriptions, group, previous_end = {}, None, None
    for statement in class_node.body:
        if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
            group, previous_end = None, None
            continue
        name = statement.target.id
        leading, lineno = [], statement.lineno - 1
        while comment_only(lineno):
            leading.insert(0, comments[lineno])
            lineno -= 1
        trailing = [comments[n] for n in range(statement.lineno, statement.end_lineno + 1)
                    if n in comments and not comment_only(n)]
        follows = previous_end is not None and statement.lineno == previous_end + 1
        if leading:
            group = name
        elif not follows:
            group = None
        text = " ".join(leading + trailing)
        if text:
            descriptions[name] = text
        elif group is not None and group != name:
            descriptions[name] = f"See `{group}`."
        if trailing:
            group = None
        previous_end = statement.end_lineno
    return descriptions


def yaml_value(value) -> str:
    """`value` as written in a YAML config file."""
    text = yaml.safe_dump(value, default_flow_style=True).strip()
    return text.removesuffix("...").strip()


def section_keys(cls, type_name, names=None) -> list[Key]:
    """The keys of dataclass `cls` (only those in `names`, if given)."""
    hints = typing.get_type_hints(cls)
    descriptions = field_comments(cls)
    keys = []
    for field in dataclasses.fields(cls):
        if names is not None and field.name not in names:
            continue
        if field.default is not dataclasses.MISSING:
            default = yaml_value(field.default)
        elif field.default_factory is not dataclasses.MISSING:
            value = field.default_factory()
            default = "(a section)" if dataclasses.is_dataclass(value) else yaml_value(value)
        else:
            default = "(required)"
        keys.append(Key(field.name, type_name(hints[field.name]), default,
                        descriptions.get(field.name, "")))
    return keys


def sections(config_cls) -> tuple[list[Key], dict[str, type]]:
    """(the top-level keys, {section name: its dataclass}) of an experiment config class."""
    hints = typing.get_type_hints(config_cls)
    found, top = {}, []
    for field in dataclasses.fields(config_cls):
        if dataclasses.is_dataclass(hints[field.name]):
            found[field.name] = hints[field.name]
        else:
            top.append(field.name)
    return top, found


def list_sections(cls) -> dict[str, type]:
    """{key: its item dataclass} of the keys of `cls` that hold a list of dataclasses."""
    found = {}
    for field in dataclasses.fields(cls):
        for hint in (typing.get_type_hints(cls)[field.name],
                     *typing.get_args(typing.get_type_hints(cls)[field.name])):
            if typing.get_origin(hint) is list and dataclasses.is_dataclass(
                    typing.get_args(hint)[0]):
                found[field.name] = typing.get_args(hint)[0]
    return found


def _text_with_code(text: str) -> list[nodes.Node]:
    """`text` with its `backticked` parts as inline code."""
    parts = re.split(r"`([^`]+)`", text)
    return [nodes.literal(part, part) if i % 2 else nodes.Text(part)
            for i, part in enumerate(parts) if part]


def table(keys: list[Key]) -> nodes.table:
    group = nodes.tgroup(cols=len(COLUMNS))
    for _, width in COLUMNS:
        group += nodes.colspec(colwidth=width)
    head = nodes.thead()
    head += nodes.row("", *(nodes.entry("", nodes.paragraph(text=title)) for title, _ in COLUMNS))
    body = nodes.tbody()
    for key in keys:
        cells = [nodes.paragraph("", "", nodes.literal(key.name, key.name)),
                 nodes.paragraph(text=key.type),
                 nodes.paragraph("", "", nodes.literal(key.default, key.default)),
                 nodes.paragraph("", "", *_text_with_code(key.description))]
        body += nodes.row("", *(nodes.entry("", cell) for cell in cells))
    group += head
    group += body
    result = nodes.table(classes=["config-table"])
    result += group
    return result


class ConfigTables(SphinxDirective):
    required_arguments = 1

    def section(self, name: str, title: str, doc: str, keys: list[Key]) -> nodes.section:
        section = nodes.section(ids=[f"config-{name}"], names=[f"config {name}"])
        section += nodes.title("", "", *_text_with_code(title))
        if doc:
            self.state.nested_parse(StringList(inspect.cleandoc(doc).splitlines(),
                                               source=title), self.content_offset, section)
        section += table(keys)
        self.state.document.note_implicit_target(section, section)
        return section

    def run(self):
        module_name, class_name = self.arguments[0].rsplit(".", 1)
        module = importlib.import_module(module_name)
        config_cls = getattr(module, class_name)
        type_name = getattr(module, "_type_name")  # the config errors' names for types
        top, found = sections(config_cls)
        if not found:
            raise self.error(f"{self.arguments[0]} has no sections (dataclass fields)")
        result = []
        if top:
            result.append(self.section("top", "Top-level keys", "",
                                       section_keys(config_cls, type_name, top)))
        for name, cls in found.items():
            result.append(self.section(name, f"`{name}`: {cls.__name__}", cls.__doc__,
                                       section_keys(cls, type_name)))
            for key, item in list_sections(cls).items():  # e.g. data.corpora, a list
                result.append(self.section(f"{name}-{key}", f"`{name}.{key}[]`: {item.__name__}",
                                           item.__doc__, section_keys(item, type_name)))
            for key, item in sections(cls)[1].items():  # e.g. data.modifiers, a mapping
                result.append(self.section(f"{name}-{key}", f"`{name}.{key}`: {item.__name__}",
                                           item.__doc__, section_keys(item, type_name)))
        return result


def setup(app):
    app.add_directive("config-tables", ConfigTables)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
