"""Sphinx configuration of the documentation site: `make docs` builds it into docs/_build/html.

The user pages are Markdown (myst-parser): the guide notebook as committed, with its pictures
(myst-nb, never executed here: `make guide` runs it), the pages on the command line, your own
data, distributed training and serving, and the results, `experiments/RESULTS.md` with its lab
notebook and figures, copied into `docs/_generated/` at every build so that the links between
them resolve as they do in the repository. The reference is generated from the code:
the exported names and the layers with autodoc (Google style docstrings through napoleon), the
command line from `cli.build_parser()` with sphinx-argparse, and the config tables and
SavedModel signatures with the local extensions in `_ext/`. The build is strict (`-W -n`): a
broken reference or link, or a docstring that does not parse, fails it.
"""

import os
import shutil
import sys

DOCS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(DOCS)
sys.path.insert(0, os.path.dirname(DOCS))  # this checkout's package, before any installed one
sys.path.insert(0, os.path.join(DOCS, "_ext"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # autodoc imports TensorFlow

import keras_transformer  # noqa: E402

project = "keras-transformer"
release = version = keras_transformer.__version__
author = "keras-transformer authors"
copyright = f"2026, {author}"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinxarg.ext",
    "package_reference",
    "config_tables",
    "signatures",
    "myst_nb",
]

exclude_patterns = ["_build"]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
nb_execution_mode = "off"  # the notebook as committed, pictures included; `make guide` runs it
myst_heading_anchors = 3  # RESULTS.md links to sections of its log by their GitHub anchors
html_theme = "furo"
html_title = f"keras-transformer {release}"
smartquotes = False  # quotes inside docstrings are code more often than prose

# The docstrings write code in single backticks, as Markdown does.
default_role = "code"

napoleon_google_docstring = True
napoleon_numpy_docstring = False
# The layers list what `call` takes as keras-hub does, under "Call arguments:".
napoleon_custom_sections = [("Call arguments", "params_style")]
autodoc_member_order = "bysource"
autodoc_typehints_format = "short"
# Keras' docstrings (Markdown) are not this reference's: an override without its own is left out.
autodoc_inherit_docstrings = False

nitpicky = True
# Types of other libraries, which this reference does not hold (no intersphinx: the build runs
# offline). Only their names are ignored; a reference to a keras_transformer name must resolve.
nitpick_ignore_regex = [
    (r"py:.*", r"(tf|tensorflow|keras|np|numpy|h5py|sacrebleu|yaml)(\..+)?"),
    (r"py:.*", r"(pathlib|os|typing|collections\.abc|concurrent\.futures|argparse)\..+"),
    (r"py:.*", r"(Path|PathLike|Callable|Iterable|Sequence|Any)"),
]


def _copy_results(target=os.path.join(DOCS, "_generated", "experiments")):
    """experiments/RESULTS.md, its lab notebook (log/) and its figures, into the source tree."""
    def ignored(folder, names):
        top = os.path.samefile(folder, os.path.join(REPO, "experiments"))
        return [name for name in names
                if not (name.endswith((".md", ".png")) or (top and name == "log"))]

    # Copied over what is there, never deleted first: a test that lists docs/ while a build
    # runs beside it must not meet a folder that vanishes (`make clean` removes it).
    shutil.copytree(os.path.join(REPO, "experiments"), target, ignore=ignored,
                    dirs_exist_ok=True)


_copy_results()
