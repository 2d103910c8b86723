"""The guide notebook cannot rot: docs/guide.py is built into a notebook with jupytext and run
top to bottom with nbclient at tiny size (GUIDE_SIZE=tiny), in a fresh `python3` kernel of this
interpreter that imports this checkout's package, as `make guide` runs it at full size
(docs/build_guide.py). Any cell error fails the test; the outputs must hold the figures, a
translation and the serving answer."""

import importlib.util
import json
import re
import time

import pytest

from keras_transformer.config import REPO_ROOT

pytest.importorskip("jupytext")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")


def build_guide():
    """docs/build_guide.py as a module (docs/ is not a package)."""
    spec = importlib.util.spec_from_file_location("build_guide", REPO_ROOT / "docs" / "build_guide.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def outputs_of(cell) -> list:
    return [output for output in cell.get("outputs", [])]


def text_of(cell) -> str:
    """A code cell's printed and returned text."""
    parts = []
    for output in outputs_of(cell):
        if output["output_type"] == "stream":
            parts.append(output["text"])
        elif "data" in output:
            parts.append(output["data"].get("text/plain", ""))
    return "".join(parts)


def cell_with(notebook, code: str):
    """The one code cell whose source holds `code`."""
    cells = [cell for cell in notebook.cells if cell.cell_type == "code" and code in cell.source]
    assert len(cells) == 1, f"{len(cells)} code cells hold {code!r}"
    return cells[0]


def repository_files() -> set:
    """The repository's top-level entries and the files in docs/ (where the kernel runs), but
    for what builds write there (the docs build's `_build` and `_generated`, bytecode)."""
    return {path.name for path in REPO_ROOT.iterdir()} | {
        str(path.relative_to(REPO_ROOT)) for path in (REPO_ROOT / "docs").rglob("*")
        if not {"_build", "_generated", "__pycache__"} & set(path.parts)}


def has_png(cell) -> bool:
    return any("image/png" in output.get("data", {}) for output in outputs_of(cell))


def test_the_guide_runs_top_to_bottom_at_tiny_size(multi30k_dir, tmp_path, monkeypatch):
    from nbformat import v4

    monkeypatch.setenv("KERAS_TRANSFORMER_DATA", str(multi30k_dir))
    guide = build_guide()
    notebook = guide.build()
    # Which package the kernel imported: this checkout's, not another install in the venv.
    notebook.cells.append(v4.new_code_cell("print(kt.__file__)"))
    output = tmp_path / "output"
    repository_before = repository_files()
    start = time.perf_counter()
    guide.execute(notebook, "tiny", output, timeout=300)
    seconds = time.perf_counter() - start
    print(f"the guide ran at tiny size in {seconds:.1f} s")

    assert text_of(notebook.cells[-1]).strip() == str(REPO_ROOT / "keras_transformer" / "__init__.py")
    errors = [output for cell in notebook.cells for output in outputs_of(cell)
              if output["output_type"] == "error"]
    assert not errors
    assert "size tiny" in text_of(cell_with(notebook, 'GUIDE_SIZE = os.environ'))

    # The padding of both batchings, in numbers.
    padding = text_of(cell_with(notebook, "data.batch_stats(batches)"))
    assert "length buckets" in padding and "64 pairs, padded" in padding
    assert padding.count("%") == 4

    # The figures came out as images: positional encoding, schedule, curves, attention, the
    # word alignment.
    for code in ("layers.positional_encoding(", "kt.TransformerSchedule(", "epoch_bleu",
                 "callbacks.attention_figure(", "translator.word_attention("):
        assert has_png(cell_with(notebook, code)), f"no image from the cell with {code!r}"

    # Translations came out: from the Translator, and from the reloaded SavedModel's signature.
    assert "Prediction" in text_of(cell_with(notebook, "translator.translate_beam("))
    aligned = [line for line in text_of(cell_with(notebook, "translator.word_attention("))
               .splitlines() if not line.startswith("<Figure")]
    assert len(aligned) == 4 + 1  # the beam's 4 hypotheses, the alignment
    assert re.fullmatch(r"alignment: \d+-0( \d+-\d+)*", aligned[-1])
    answer = text_of(cell_with(notebook, '{"predictions": ['))
    predictions = json.loads(answer)["predictions"]
    assert len(predictions) == 3
    assert all(isinstance(p["translation"], str) and isinstance(p["score"], float)
               for p in predictions)
    request = json.loads(text_of(cell_with(notebook, 'request = {"signature_name"')))
    assert request["signature_name"] == "serving_default" and len(request["instances"]) == 3

    # Everything the notebook wrote is in its output folder, none of it in the repository.
    assert (output / "run" / "config.yaml").is_file()
    assert (output / "saved_models" / "guide" / "1" / "saved_model.pb").is_file()
    assert repository_files() == repository_before


def test_the_saved_notebook_drops_tensorflows_native_log_lines_and_keeps_the_rest():
    from nbformat import v4

    guide = build_guide()
    native = ("WARNING: All log messages before absl::InitializeLog() is called are written to "
              "STDERR\nI0000 00:00:1796289088.670130    2003 port.cc:153] oneDNN custom "
              "operations are on.\nE0000 00:00:1796289092.198065    2003 cuda_platform.cc:52] "
              "failed call to cuInit\n")
    only_native = v4.new_code_cell("import tensorflow")
    only_native.outputs = [v4.new_output("stream", name="stderr", text=native)]
    mixed = v4.new_code_cell("fit()")
    mixed.outputs = [v4.new_output("stream", name="stderr", text=native + "Epoch 1/8\n"),
                     v4.new_output("stream", name="stdout", text=native)]
    notebook = guide.drop_native_log_lines(v4.new_notebook(cells=[only_native, mixed]))
    assert notebook.cells[0].outputs == []
    assert [output["text"] for output in notebook.cells[1].outputs] == ["Epoch 1/8\n", native]


def test_the_committed_notebook_is_the_full_run_without_native_log_lines():
    import nbformat

    guide = build_guide()
    notebook = nbformat.read(REPO_ROOT / "docs" / "guide.ipynb", as_version=4)
    assert "size full" in text_of(cell_with(notebook, 'GUIDE_SIZE = os.environ'))
    assert [cell.source for cell in notebook.cells] == [cell.source for cell in guide.build().cells]
    for cell in notebook.cells:
        for output in outputs_of(cell):
            if output["output_type"] == "stream":
                assert not any(guide.NATIVE_LOG_LINE.fullmatch(line)
                               for line in output["text"].splitlines())
    # No folder of the machine that ran it (it printed /tmp/keras-transformer-guide-...).
    machine_folder = re.compile(r"(?<![\w.])/(tmp|home|root|work|Users|var|private|mnt)/")
    for cell in notebook.cells:
        assert not machine_folder.search(text_of(cell)), text_of(cell)[:300]
