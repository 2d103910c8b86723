"""Several training corpora with weights (`data.corpora`): the config, the mixture's proportions
and exact restarts, tags in the source ids, training that resumes exactly, data-stats."""

import dataclasses
import gzip

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import cli
from keras_transformer.training import runner as training
from keras_transformer import data as data_lib
from keras_transformer.config import ConfigError, CorpusConfig, ExperimentConfig
from keras_transformer.runs.folder import Run


class CountingStream:
    """A stand-in for `TrainingStream`: element i of corpus c is (c, i)."""

    def __init__(self, corpus: int, pass_length: int = 10):
        self.corpus, self._pass_length = corpus, pass_length

    def pass_length(self):
        return self._pass_length

    def batches(self, start=0):
        return tf.data.Dataset.range(start, 2 ** 62).map(
            lambda i: (tf.constant(self.corpus, tf.int64), i))


def test_corpora_config_parses_and_names_its_mistakes():
    config = ExperimentConfig.from_dict({"data": {"corpora": [
        {"dataset": "multi30k"},
        {"dataset": "file_pair", "source_file": "bt.en", "target_file": "captions.de.gz",
         "weight": 2, "tag": "<BT>"}]}})
    assert config.data.corpora[1] == CorpusConfig(dataset="file_pair", source_file="bt.en",
                                                  target_file="captions.de.gz", weight=2.0,
                                                  tag="<BT>")
    assert ExperimentConfig.from_dict(config.to_dict()) == config  # config.yaml round trip
    for corpora, message in [
            ([{"dataset": "file_pair", "source_file": "a"}],
             "data.corpora[0]: source_file and target_file are for dataset file_pair, which "
             "needs both"),
            ([{}, {"weight": -1}], "data.corpora[1]: weight=-1.0 must be a positive number"),
            ([{"tag": "two words"}], "data.corpora[0]: tag='two words' must be one word"),
            ([{"files": "x"}], "unknown config key 'data.corpora[0].files'"),
            ([], "data.corpora is empty"),
            ("train.de", "data.corpora='train.de' has the wrong type: expected a list")]:
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
            ExperimentConfig.from_dict({"data": {"corpora": corpora}})
    with pytest.raises(ConfigError, match="tags .* need data.tokenizer sentencepiece"):
        ExperimentConfig.from_dict({"data": {"tokenizer": "wordpiece",
                                             "corpora": [{"tag": "<BT>"}]}})


def test_a_long_stream_follows_the_weights_and_restarts_exactly():
    mixture = data_lib.MixtureStream([CountingStream(0), CountingStream(1), CountingStream(2)],
                                     [3.0, 1.0, 0.5], seed=11)
    elements = list(mixture.batches().take(9000).as_numpy_iterator())
    corpora = np.array([corpus for corpus, _ in elements])
    np.testing.assert_allclose(np.bincount(corpora) / len(corpora), [3 / 4.5, 1 / 4.5, 0.5 / 4.5],
                               atol=0.015)
    for corpus in range(3):  # each corpus's stream goes on where it was: 0, 1, 2, ...
        positions = [i for c, i in elements if c == corpus]
        assert positions == list(range(len(positions)))
    later = list(mixture.batches(6000).take(50).as_numpy_iterator())
    assert later == elements[6000:6050]
    assert mixture.pass_length() == round(10 / (3 / 4.5))  # a pass over the first corpus
    again = data_lib.MixtureStream([CountingStream(0), CountingStream(1), CountingStream(2)],
                                   [3.0, 1.0, 0.5], seed=11)
    np.testing.assert_array_equal(again.choices, mixture.choices)  # the same in any process
    assert mixture.counts(mixture.HORIZON + 5) == [
        a + b for a, b in zip(mixture.counts(mixture.HORIZON), mixture.counts(5))]


@pytest.fixture(scope="module")
def small_corpora(multi30k_dir, tmp_path_factory):
    """A folder of 300-pair train files and 40-pair val/test files (de, en), and a file pair of
    60 other training pairs, as `translate --output` and its input would be."""
    folder = tmp_path_factory.mktemp("corpora")
    for split, start, count in (("train", 0, 300), ("val", 0, 40), ("test_2016_flickr", 0, 40),
                                ("pair", 300, 60)):
        for lang in ("de", "en"):
            name = "train" if split == "pair" else split
            with gzip.open(multi30k_dir / f"{name}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = [line for _, line in zip(range(start + count), f)][start:]
            (folder / f"{split}.{lang}").write_text("".join(lines), encoding="utf-8")
    return folder


def two_corpora(folder, tag=None) -> list:
    return [CorpusConfig(dataset="files", weight=2.0),
            CorpusConfig(dataset="file_pair", source_file=str(folder / "pair.de"),
                         target_file=str(folder / "pair.en"), weight=1.0, tag=tag)]


def test_a_tag_is_one_piece_at_the_start_of_its_corpus_sources(multi30k_config, small_corpora,
                                                              tmp_path):
    data_config = multi30k_config(data_dir=str(small_corpora), vocab_size=500,
                                  corpora=two_corpora(small_corpora, tag="<BT>"))
    source, target = data_lib.build_vocab(data_config, tmp_path / "vocab")
    tag_id = int(source.tokenize(tf.constant(["<BT>"]))[0][1])
    assert source.tokenize(tf.constant(["<BT>"]))[0].numpy().tolist() == [1, tag_id, 2]
    for corpus, tagged in zip(data_config.corpora, (False, True)):
        pairs = data_lib.load_corpus_pairs(data_config, corpus)
        batches = data_lib.make_batches(pairs, source, target, data_config, training=False)
        (source_ids, target_in), _ = next(iter(batches))
        assert ((source_ids[:, 1] == tag_id).numpy().all()) == tagged
        assert not (source_ids[:, 2:] == tag_id).numpy().any()
        assert not (target_in == tag_id).numpy().any()
    # A vocabulary learned without the tag is refused for the tagged config.
    untagged = dataclasses.replace(data_config, corpora=two_corpora(small_corpora))
    data_lib.build_vocab(untagged, tmp_path / "untagged")
    with pytest.raises(ConfigError, match="tags: built with None, config has \\['<BT>'\\]"):
        data_lib.load_tokenizers(data_config, tmp_path / "untagged")


def corpora_experiment(tiny_experiment, small_corpora, epochs):
    experiment = tiny_experiment(epochs=epochs, steps_per_epoch=3, strategy="one_device",
                                 validation_bleu_sentences=0)
    corpora = [CorpusConfig(dataset="files", data_dir=str(small_corpora), weight=2.0),
               *two_corpora(small_corpora)[1:]]
    return dataclasses.replace(experiment, data=dataclasses.replace(experiment.data,
                                                                    corpora=corpora))


def test_the_training_input_of_two_corpora_restarts_at_its_epoch(tiny_experiment, small_corpora):
    """What `fit` reads when a run resumes at epoch 2 is what the run read from its step 3."""
    config = corpora_experiment(tiny_experiment, small_corpora, 3)
    source, target = data_lib.load_tokenizers(config.data, config.data.vocab_dir)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    whole = list(training.TrainingInput(config, strategy, source, target).batches(0, 3))
    resumed = list(training.TrainingInput(config, strategy, source, target).batches(1, 3))
    assert len(whole) == 9 and len(resumed) == 6
    for (got_inputs, got_out), (want_inputs, want_out) in zip(resumed, whole[3:]):
        for got, want in zip((*got_inputs, got_out), (*want_inputs, want_out)):
            np.testing.assert_array_equal(got, want)


@pytest.mark.slow
def test_training_on_two_corpora_resumes_exactly(tiny_experiment, small_corpora, tmp_path,
                                                  capsys):
    """Two epochs in one go, and one epoch then two on another folder: the same weights."""
    def config(epochs):
        return corpora_experiment(tiny_experiment, small_corpora, epochs)

    training.train(config(2), tmp_path / "straight", verbose=0)
    training.train(config(1), tmp_path / "resumed", verbose=0)
    training.train(config(2), tmp_path / "resumed", verbose=0)
    assert "resuming at epoch 2" in capsys.readouterr().out
    for got, want in zip(Run(tmp_path / "resumed").load_model("last").get_weights(),
                         Run(tmp_path / "straight").load_model("last").get_weights()):
        np.testing.assert_array_equal(got, want)
    changed = config(2)
    changed.data.corpora[1].weight = 5.0
    with pytest.raises(ConfigError, match="differs in data.corpora"):
        training.train(changed, tmp_path / "resumed", verbose=0)


def test_data_stats_reports_each_corpus(multi30k_config, small_corpora, tmp_path, capsys):
    config = tmp_path / "corpora.yaml"
    corpora = two_corpora(small_corpora, tag="<BT>")
    config.write_text(
        f"data: {{dataset: files, data_dir: {small_corpora}, vocab_size: 500, corpora: [\n"
        f"  {{dataset: files, weight: 2}},\n"
        f"  {{dataset: file_pair, source_file: {corpora[1].source_file}, "
        f"target_file: {corpora[1].target_file}, tag: <BT>}}]}}\n")
    vocab = tmp_path / "vocab"
    assert cli.main(["build-vocab", "--config", str(config), "--output", str(vocab)]) == 0
    assert cli.main(["data-stats", "--config", str(config), "--vocab", str(vocab)]) == 0
    report = capsys.readouterr().out
    assert "[corpus files (train split)] weight 2: 66.7% of the training batches" in report
    assert (f"[corpus {corpora[1].source_file} + {corpora[1].target_file}] weight 1, tag <BT>: "
            "33.3% of the training batches") in report
    assert "\n  300 pairs: 300 kept, dropped 0 empty, 0 too_long; " in report
    assert "\n  60 pairs: 60 kept, dropped 0 empty, 0 too_long; " in report
    assert report.count("are a length bucket's last, smaller batch") == 3  # train split, corpora


def test_a_missing_corpus_file_is_named(multi30k_config, small_corpora):
    data_config = multi30k_config(corpora=[CorpusConfig(
        dataset="file_pair", source_file="nowhere.en", target_file=str(small_corpora / "pair.en"))])
    with pytest.raises(data_lib.DataError, match="nowhere.en: no such file \\(a corpus's "
                                                 "source_file\\)"):
        data_lib.load_corpus_pairs(data_config, data_config.corpora[0])
