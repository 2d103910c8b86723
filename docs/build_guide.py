"""Builds the guide notebook from its source and runs it: docs/guide.py (jupytext percent
format) -> docs/guide.ipynb, every cell executed top to bottom in a fresh `python3` kernel of
this interpreter, which imports this checkout's package. `make guide` runs it at full size;
tests/test_guide.py runs the same functions at tiny size.

    python docs/build_guide.py [--size full|tiny] [--notebook docs/guide.ipynb] [--output DIR]

`--output` (default: a new temporary folder) receives everything the notebook writes; only the
notebook itself is written into the repository.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

DOCS = Path(__file__).resolve().parent
REPO = DOCS.parent
SOURCE = DOCS / "guide.py"
NOTEBOOK = DOCS / "guide.ipynb"
# TensorFlow's C++ log lines ("I0000 00:00:1796289088.670130    2003 port.cc:153] oneDNN ..."),
# and absl's notice before them: written to stderr before absl's logging is initialized, so
# TF_CPP_MIN_LOG_LEVEL does not silence them all.
NATIVE_LOG_LINE = re.compile(
    r"[IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w.]+:\d+\] .*"
    r"|WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR")


def build():
    """The notebook of `docs/guide.py`, without outputs (an nbformat NotebookNode)."""
    import jupytext

    return jupytext.read(SOURCE)


def kernel_env(size: str, output: str | os.PathLike) -> dict:
    """The kernel's environment: this one, with the guide's size and output folder, and this
    checkout first on the import path (a venv may hold another install of the package)."""
    env = dict(os.environ, GUIDE_SIZE=size, GUIDE_OUTPUT=str(output))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env.pop("MPLBACKEND", None)  # the kernel's inline backend turns figures into image/png
    return env


def execute(notebook, size: str, output: str | os.PathLike, *, timeout: int = 3600):
    """Runs every cell of `notebook` in place in a fresh `python3` kernel (jupyter_client starts
    it with this interpreter); raises `nbclient.exceptions.CellExecutionError` at the first
    cell that fails."""
    from nbclient import NotebookClient

    client = NotebookClient(notebook, kernel_name="python3", timeout=timeout,
                            record_timing=False, resources={"metadata": {"path": str(DOCS)}})
    client.execute(env=kernel_env(size, output))
    return notebook


def drop_native_log_lines(notebook):
    """Removes TensorFlow's C++ log lines (`NATIVE_LOG_LINE`) from the cells' stderr outputs,
    and the outputs left empty; everything else the cells printed stays."""
    for cell in notebook.cells:
        kept = []
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream" and output.get("name") == "stderr":
                lines = output["text"].splitlines(keepends=True)
                output["text"] = "".join(
                    line for line in lines if not NATIVE_LOG_LINE.fullmatch(line.rstrip("\n")))
                if not output["text"].strip():
                    continue
            kept.append(output)
        if "outputs" in cell:
            cell["outputs"] = kept
    return notebook


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=("tiny", "full"), default="full")
    parser.add_argument("--notebook", type=Path, default=NOTEBOOK,
                        help="where to write the executed notebook (default: %(default)s)")
    parser.add_argument("--output", type=Path, default=None,
                        help="the folder for what the notebook writes (default: a new "
                             "temporary folder)")
    args = parser.parse_args(argv)
    import nbformat

    output = args.output or Path(tempfile.mkdtemp(prefix="keras-transformer-guide-"))
    start = time.perf_counter()
    notebook = drop_native_log_lines(execute(build(), args.size, output))
    nbformat.write(notebook, args.notebook)
    print(f"{args.notebook}: {len(notebook.cells)} cells run at size {args.size} in "
          f"{time.perf_counter() - start:.0f} s; its files are in {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
