"""`.. savedmodel-signatures:: MODULE`: a table of the SavedModel's signatures.

Read from the translator module: the signature names from `SIGNATURES`, each signature's inputs
from `signature_inputs(name)`, and its description and outputs from the module docstring's
listing

    Exported signatures (...):

        NAME   description -> output dtype [shape], output dtype [shape]
        NAME   the same as OTHER, ...

A signature that the listing leaves out, or whose outputs it does not give, is a warning, so the
strict build fails when the code and its documentation part.
"""

from __future__ import annotations

import importlib
import inspect
import re

from docutils import nodes
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

from config_tables import _text_with_code

logger = logging.getLogger(__name__)
OUTPUT = re.compile(r"(\w+) (\w+) \[([^\]]*)\]")  # "translation string [batch]"
LISTING = "Exported signatures"


def listing(docstring: str, names) -> dict[str, str]:
    """Signature name -> its entry (continuation lines joined) in the docstring's listing."""
    lines = inspect.cleandoc(docstring).splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(LISTING)), None)
    if start is None:
        return {}
    entries, current = {}, None
    for line in lines[start + 1:]:
        if not line.strip():  # blank lines inside the block are allowed
            continue
        if not line.startswith(" "):  # the block ended
            break
        first = line.split(maxsplit=1)
        if first[0] in names:
            current = first[0]
            entries[current] = first[1] if len(first) > 1 else ""
        elif current is not None:
            entries[current] += " " + line.strip()
    return entries


def spec_text(spec) -> str:
    """`source: string [batch]` for a tf.TensorSpec."""
    dims = ", ".join("batch" if dim is None else str(dim) for dim in spec.shape.as_list())
    return f"{spec.name}: {spec.dtype.name} [{dims}]"


def signature_rows(module_name: str) -> list[tuple[str, str, str, str]]:
    """(name, inputs, outputs, description) of every signature in `SIGNATURES`; warnings for
    what the module's docstring does not say."""
    module = importlib.import_module(module_name)
    entries = listing(module.__doc__ or "", module.SIGNATURES)
    parsed = {}
    for name in module.SIGNATURES:
        entry = entries.get(name)
        if entry is None:
            logger.warning(f"{module_name}: signature {name!r} of SIGNATURES is not in the "
                           f"module docstring's '{LISTING}' listing")
            continue
        description, _, outputs = entry.partition("->")
        parsed[name] = (description.strip(), OUTPUT.findall(outputs))
    rows = []
    for name, (description, outputs) in parsed.items():
        if not outputs:  # "the same as serving_default"
            same = re.search(r"the same as (\w+)", description)
            outputs = parsed.get(same.group(1), ("", []))[1] if same else []
        if not outputs:
            logger.warning(f"{module_name}: the docstring gives no outputs for signature "
                           f"{name!r} ('-> name dtype [shape], ...')")
        specs = module.signature_inputs(name).values()
        rows.append((name, ", ".join(spec_text(spec) for spec in specs),
                     ", ".join(f"{key}: {dtype} [{shape}]" for key, dtype, shape in outputs),
                     description))
    return rows


class SavedModelSignatures(SphinxDirective):
    required_arguments = 1

    def run(self):
        columns = ("signature", "inputs", "outputs", "what it does")
        group = nodes.tgroup(cols=len(columns))
        for width in (2, 3, 4, 4):
            group += nodes.colspec(colwidth=width)
        head = nodes.thead()
        head += nodes.row("", *(nodes.entry("", nodes.paragraph(text=c)) for c in columns))
        body = nodes.tbody()
        for name, inputs, outputs, description in signature_rows(self.arguments[0]):
            cells = [nodes.paragraph("", "", nodes.literal(name, name)),
                     nodes.paragraph("", "", nodes.literal(inputs, inputs)),
                     nodes.paragraph("", "", nodes.literal(outputs, outputs)),
                     nodes.paragraph("", "", *_text_with_code(description))]
            body += nodes.row("", *(nodes.entry("", cell) for cell in cells))
        group += head
        group += body
        table = nodes.table(classes=["signatures-table"])
        table += group
        return [table]


def setup(app):
    app.add_directive("savedmodel-signatures", SavedModelSignatures)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
