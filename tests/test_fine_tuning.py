"""Fine-tuning (`train.init_from`, `train --init-from`): the weights a run starts from, the
refusal of another shape, the vocabulary update, a short fine-tune, and the provenance."""

import dataclasses
import gzip
import json

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import cli
from keras_transformer.training import runner as training
from keras_transformer import data as data_lib
from keras_transformer.config import ConfigError
from keras_transformer.export.savedmodel import export_run, read_provenance
from keras_transformer.training.fine_tuning import INIT_FILE, initialize_from, parent_of
from keras_transformer.model import Transformer
from keras_transformer.runs.folder import Run


def fresh_model(model_config, **overrides) -> Transformer:
    model = Transformer(dataclasses.replace(model_config, **overrides))
    model.build()
    return model


def test_a_run_starts_with_its_parents_weights(random_run):
    parent = Run(random_run)
    model = fresh_model(parent.config.model)
    record = initialize_from(model, random_run, parent.tokenizers())
    for got, want in zip(model.get_weights(), parent.load_model("best").get_weights()):
        np.testing.assert_array_equal(got, want)
    size = parent.config.model.source_vocab_size
    assert record["vocabulary"] == {"source": {"shared": size, "new": 0},
                                    "target": {"shared": size, "new": 0}}
    assert record["weights_file"] == str(random_run / "best.weights.h5")
    run, weights = parent_of(random_run / "best.weights.h5")
    assert (run.path, weights) == (random_run, str(random_run / "best.weights.h5"))


def test_a_parent_of_another_shape_is_refused(random_run, tmp_path):
    parent = Run(random_run)
    with pytest.raises(ConfigError, match=f"train.init_from {random_run} has model.num_layers=2, "
                                          "this run model.num_layers=3: a run starts only from "
                                          "a model of its shape"):
        initialize_from(fresh_model(parent.config.model, num_layers=3), random_run,
                        parent.tokenizers())
    loose = tmp_path / "loose.weights.h5"
    loose.write_bytes((random_run / "best.weights.h5").read_bytes())
    with pytest.raises(ConfigError, match="a weight file outside a run folder"):
        parent_of(loose)
    with pytest.raises(ConfigError, match="no such run folder or weight file"):
        parent_of(tmp_path / "nowhere")


def test_a_new_vocabulary_keeps_the_rows_of_shared_pieces(random_run, multi30k_config,
                                                          multi30k_dir, tmp_path):
    """A 400-piece vocabulary learned from 300 pairs: its pieces that the parent's 1,000-piece
    vocabulary has keep their embedding rows and output columns; the others keep the new
    model's initial values."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for lang in ("de", "en"):
        with gzip.open(multi30k_dir / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            lines = [line for _, line in zip(range(300), f)]
        (corpus / f"train.{lang}").write_text("".join(reversed(lines)), encoding="utf-8")
    source, target = data_lib.build_vocab(multi30k_config(data_dir=str(corpus), vocab_size=400),
                                          tmp_path / "vocab")
    parent = Run(random_run)
    model = fresh_model(parent.config.model, source_vocab_size=source.vocab_size,
                        target_vocab_size=target.vocab_size)
    initial = {w.path: w.numpy() for w in model.weights}
    record = initialize_from(model, random_run, (source, target))
    old_model = parent.load_model("best")
    old_pieces = parent.tokenizers()[0].lookup(tf.range(1000)).numpy().tolist()
    new_pieces = source.lookup(tf.range(source.vocab_size)).numpy().tolist()
    shared = [(row, old_pieces.index(p)) for row, p in enumerate(new_pieces) if p in old_pieces]
    fresh = [row for row, p in enumerate(new_pieces) if p not in old_pieces]
    assert len(shared) > 100 and fresh  # both kinds, so that both checks bite
    assert record["vocabulary"]["target"] == {"shared": len(shared), "new": len(fresh)}
    new_rows, old_rows = map(list, zip(*shared))
    weights = {w.path.split("/", 1)[1]: (w.numpy(), initial[w.path]) for w in model.weights}
    old = {w.path.split("/", 1)[1]: w.numpy() for w in old_model.weights}
    for name, axis in (("source_embedding/token_embedding/embeddings", 0),
                       ("target_embedding/token_embedding/embeddings", 0),
                       ("final_layer/kernel", 1), ("final_layer/bias", 0)):
        value, start = weights[name]
        np.testing.assert_array_equal(np.take(value, new_rows, axis),
                                      np.take(old[name], old_rows, axis), err_msg=name)
        np.testing.assert_array_equal(np.take(value, fresh, axis), np.take(start, fresh, axis))
    other = [key for key in weights if key.endswith("kernel") and "embedding" not in key
             and "final_layer" not in key][0]
    np.testing.assert_array_equal(weights[other][0], old[other])  # no vocabulary axis: copied


def test_fine_tuning_from_the_command_line(random_run, short_multi30k_dir, tmp_path, capsys):
    """`train --init-from`: the child starts from the parent (record, message), adopts its
    vocabulary, learns the corpus (training loss below the parent's), and its exports say
    where it started; a parent of another shape is one line, leaving no folder."""
    parent = Run(random_run)
    values = parent.config.to_dict()
    values["data"].update(data_dir=str(short_multi30k_dir), max_pair_length=24)
    values["train"].update(epochs=1, steps_per_epoch=6, warmup_steps=4, strategy="one_device",
                           validation_bleu_sentences=0, learning_rate_scale=2.0)
    config = tmp_path / "child.yaml"
    config.write_text(json.dumps(values))
    child = tmp_path / "child"
    assert cli.main(["train", "--config", str(config), "--output", str(child), "--progress", "0",
                     "--init-from", str(random_run)]) == 0
    out = capsys.readouterr().out
    assert f"weights initialized from {random_run / 'best.weights.h5'}" in out
    record = json.loads((child / INIT_FILE).read_text())
    assert record["init_from"] == str(random_run)
    assert (child / "vocab" / "sentencepiece.model").read_bytes() == (
        random_run / "vocab" / "sentencepiece.model").read_bytes()
    assert Run(child).config.train.init_from == str(random_run)

    run = Run(child)
    source, target = run.tokenizers()
    pairs = data_lib.load_pairs(run.config.data, "train").take(256)
    batches = data_lib.make_batches(pairs, source, target, run.config.data, training=False)

    def loss(model):
        model.compile(loss=training.MaskedLabelSmoothedCrossEntropy(label_smoothing=0.0))
        return model.evaluate(batches, verbose=0)

    assert loss(run.load_model("last")) < loss(parent.load_model("best")) - 0.5

    provenance = read_provenance(export_run(child, tmp_path / "models"))
    assert provenance["init_from"] == record

    wrong = dict(values, model=dict(values["model"], num_layers=3))
    config.write_text(json.dumps(wrong))
    assert cli.main(["train", "--config", str(config), "--output", str(tmp_path / "other"),
                     "--init-from", str(random_run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has model.num_layers=2, this run model.num_layers=3" in err[0]
    assert not (tmp_path / "other").exists()
    config.write_text(json.dumps(dict(values, data=dict(values["data"], max_pair_length=32))))
    assert cli.main(["train", "--config", str(config), "--output", str(tmp_path / "other")]) == 2
    assert ("data.max_pair_length=32 is longer than model.max_positions=24"
            in capsys.readouterr().err)
