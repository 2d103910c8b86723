"""README's Python examples run as written, shrunk to a tiny model and a few steps, so that the
code a newcomer copies cannot drift from the package's API. A replaced phrase that README no
longer holds fails the test: change the example and this file together. The table of
translation modes says which take a corpus file, as the command line does."""

import re

import pytest

from keras_transformer import cli
from keras_transformer.config import DATA_ENV, REPO_ROOT


def python_examples(section: str) -> list:
    """The ```python blocks of README's `## section`."""
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", body, re.S)


def shrink(code: str, replacements: dict) -> str:
    for old, new in replacements.items():
        assert code.count(old) == 1, f"README's example no longer holds {old!r}"
        code = code.replace(old, new)
    return code


@pytest.fixture
def in_empty_folder(tmp_path, monkeypatch, multi30k_dir):
    """Relative paths of the examples land in `tmp_path`; the Multi30k files are where
    README says `KERAS_TRANSFORMER_DATA` names them."""
    monkeypatch.setenv(DATA_ENV, str(multi30k_dir))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_readme_has_its_two_python_examples():
    assert len(python_examples("From Python")) == 2


def test_the_stages_one_by_one_run_and_export(in_empty_folder, capsys):
    import tensorflow as tf

    from keras_transformer.export.savedmodel import load_translator

    code = shrink(python_examples("From Python")[0], {
        'vocab_size=8000': 'vocab_size=1000, vocab_sample_sentences=4000',
        'from_preset("tutorial"': 'from_preset("tiny"',
        'batches.take(200)': 'batches.take(2)',
    })
    scope = {}
    exec(compile(code, "README.md (From Python, first example)", "exec"), scope)

    # The comment's promise: ((source_ids, target_in_ids), target_out_ids), int32 [batch, length].
    (source_spec, target_in_spec), target_out_spec = scope["batches"].element_spec
    for spec in (source_spec, target_in_spec, target_out_spec):
        assert spec.dtype == tf.int32 and spec.shape.rank == 2
    assert (in_empty_folder / "runs" / "vocab").is_dir()
    printed = capsys.readouterr().out
    assert "tf.Tensor(" in printed and "dtype=string" in printed  # the printed translations
    loaded = load_translator(in_empty_folder / "saved_models" / "mine" / "1")
    outputs = loaded.signatures["serving_default"](source=tf.constant(["Ein Hund."]))
    assert outputs["translation"].shape == (1,)


def test_the_runner_trains_translates_and_exports(in_empty_folder, capsys):
    config_path = REPO_ROOT / "experiments" / "multi30k_de_en.yaml"
    code = shrink(python_examples("From Python")[1], {
        '"experiments/multi30k_de_en.yaml"': repr(str(config_path)),
        '["train.epochs=5"]': repr(["train.epochs=1", "train.steps_per_epoch=2",
                                    "model.preset=tiny", "data.vocab_size=1000",
                                    "data.vocab_sample_sentences=4000",
                                    "data.shuffle_buffer=1000",
                                    "train.validation_bleu_sentences=8",
                                    "decode.max_extra_length=8"]),
    })
    scope = {}
    exec(compile(code, "README.md (From Python, second example)", "exec"), scope)

    assert scope["history"].params["epochs"] == 1
    run_dir = in_empty_folder / "runs" / "multi30k_de_en"
    assert (run_dir / "best.weights.h5").is_file() and (run_dir / "config.yaml").is_file()
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert printed.startswith("[") and printed.endswith("]")  # one translation, a list of str
    assert (in_empty_folder / "saved_models" / "multi30k_de_en" / "1" / "saved_model.pb").is_file()


def test_the_configs_of_your_own_data_are_configs():
    """The data.modifiers and data.corpora examples of the "Your own data" page parse as
    written."""
    import yaml

    from keras_transformer.config import ExperimentConfig, ModifiersConfig

    text = (REPO_ROOT / "docs" / "your_own_data.md").read_text(encoding="utf-8")
    modifiers, corpora = (ExperimentConfig.from_dict(yaml.safe_load(block)).data for block in
                          re.findall(r"```yaml\n(.*?)```", text, re.S))
    assert modifiers.modifiers == ModifiersConfig(upper_case=0.1, title_case=0.05, typos=0.1,
                                                  copy_spans=0.2)
    assert modifiers.placeholders and modifiers.case_folding
    corpora = corpora.corpora
    assert [(c.dataset, c.weight, c.tag) for c in corpora] == [
        ("multi30k", 1.0, None), ("file_pair", 1.0, "<BT>")]
    assert ExperimentConfig.from_yaml(REPO_ROOT / "experiments" / "multi30k_en_de_bt.yaml"
                                      ).data.corpora[1].tag == "<BT>"


def test_the_mode_tables_corpus_row_names_the_modes_that_resume(random_run, tmp_path, capsys):
    """README said every mode ran as a resumable, sharded corpus job, but --nbest, --prefix
    and --alignments refuse --output: the row names the searches that take `--output`, and
    those that do not, and each does as it says."""
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    row = next(line for line in text.splitlines()
               if line.startswith("| a corpus, resumable, sharded |"))
    resuming, _, refusing = row.split(" | ")[1].partition("; not ")
    source = tmp_path / "in.de"
    source.write_text("Ein Hund.\nZwei Hunde.\n", encoding="utf-8")
    (tmp_path / "prefix").write_text("A\nTwo\n", encoding="utf-8")
    modes = {"beam search": [], "`--greedy`": ["--greedy"], "`--sampling`": ["--sampling"],
             "`--nbest`": ["--nbest", "2"], "`--prefix`": ["--prefix", str(tmp_path / "prefix")],
             "`--alignments`": ["--alignments"]}
    assert sorted(name for name in modes if name in resuming) == [
        "`--greedy`", "`--sampling`", "beam search"]
    assert sorted(name for name in modes if name in refusing) == [
        "`--alignments`", "`--nbest`", "`--prefix`"]
    for index, (name, flags) in enumerate(modes.items()):
        output = tmp_path / f"out{index}.en"
        code = cli.main(["translate", "--run", str(random_run), "--quiet", "--source",
                         str(source), "--output", str(output), "--shard", "0/1", *flags])
        err = capsys.readouterr().err
        if name in resuming:
            assert code == 0 and len(output.read_text().splitlines()) == 2, (name, err)
        else:
            assert code == 2 and "writes to standard output" in err, (name, err)
            assert not output.exists()

