"""Input pipeline: sources (files, tfds mock, Multi30k builder local and over HTTP), bad input,
token-budget buckets, counting of dropped pairs."""

import collections
import functools
import gzip
import http.server
import logging
import threading

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from keras_transformer.data import multi30k
from keras_transformer.cli import format_data_stats
from keras_transformer.config import DATA_ENV, REPO_ROOT, ConfigError, DataConfig, ExperimentConfig
from keras_transformer.data.corpora import (DataError, check_parallel_files, load_pairs,
                                            pair_stats, split_files)
from keras_transformer.data.stats import data_stats
from keras_transformer.data.streams import (TrainingStream, batch_stats, bucket_batch_sizes,
                                            bucket_lengths, fixed_size_batches, group_batches,
                                            make_batches)
from keras_transformer.data.text_io import read_parallel_lines
from keras_transformer.data.tokenizers import END_ID, PAD_ID, START_ID, training_tokenizers

tfds.display_progress_bar(False)


def _write(path, lines, compress=False):
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def _files_config(folder, **overrides):
    values = dict(dataset="files", data_dir=str(folder), source_lang="de", target_lang="en",
                  max_pair_length=16, tokens_per_batch=64, bucket_step=8)
    values.update(overrides)
    return DataConfig(**values)


def _as_lists(pairs):
    return [(s.decode(), t.decode()) for s, t in pairs.as_numpy_iterator()]


# ----------------------------------------------------------------------------- bad input

def test_mismatched_line_counts_name_both_files_and_counts(tmp_path):
    source = _write(tmp_path / "train.de", ["a", "b", "c"])
    target = _write(tmp_path / "train.en.gz", ["a", "b"], compress=True)
    with pytest.raises(DataError) as error:
        list(read_parallel_lines({"de": source, "en": target}))
    assert str(error.value) == ("line-aligned files have different line counts: "
                                f"{source} has 3 lines, {target} has 2 lines")
    with pytest.raises(DataError, match="train.de has 3 lines, .*train.en.gz has 2 lines"):
        load_pairs(_files_config(tmp_path), "train")


def test_missing_file_lists_what_was_tried(tmp_path):
    _write(tmp_path / "train.de", ["a"])
    with pytest.raises(DataError, match=r"no files for split 'train'.*train\.en\.gz"):
        load_pairs(_files_config(tmp_path), "train")
    with pytest.raises(DataError, match=r"nowhere.en: file not found"):
        list(read_parallel_lines({"en": tmp_path / "nowhere.en"}))


def test_empty_files_are_an_error(tmp_path):
    _write(tmp_path / "train.de", [])
    _write(tmp_path / "train.en", [])
    with pytest.raises(DataError, match=r"train.de, .*train.en: empty file"):
        load_pairs(_files_config(tmp_path), "train")


def test_bytes_that_are_not_utf8_name_file_and_line(tmp_path):
    _write(tmp_path / "train.en", ["one", "two", "three"])
    (tmp_path / "train.de").write_bytes("eins\nzwei\n".encode() + b"dr\xe8i\n")
    with pytest.raises(DataError, match=r"train.de:3: not valid UTF-8 .*b'dr\\xe8i\\n'"):
        load_pairs(_files_config(tmp_path), "train")


def test_empty_lines_are_dropped_counted_and_logged(tmp_path, small_pairs, caplog,
                                                    sentencepiece_tokenizers):
    lines = list(small_pairs)
    lines[1] = ("  ", lines[1][1])  # whitespace only counts as empty
    lines[3] = (lines[3][0], "")
    _write(tmp_path / "train.de", [s for s, _ in lines])
    _write(tmp_path / "train.en", [t for _, t in lines])
    config = _files_config(tmp_path, max_pair_length=64, tokens_per_batch=512)
    with caplog.at_level(logging.WARNING):
        pairs = load_pairs(config, "train")
    assert "2 of 5 line pairs have an empty side" in caplog.text and "(lines 2, 4)" in caplog.text
    stats = pair_stats(pairs, *sentencepiece_tokenizers, config)
    assert (stats.total, stats.kept, stats.dropped) == (5, 3, {"empty": 2, "too_long": 0})
    batched = batch_stats(make_batches(pairs, *sentencepiece_tokenizers, config, training=False))
    assert batched.pairs == 3


def test_plain_and_gzip_files_and_the_val_alias(tmp_path, small_pairs):
    _write(tmp_path / "val.de.gz", [f"  {s} " for s, _ in small_pairs], compress=True)
    _write(tmp_path / "val.en.gz", [t for _, t in small_pairs], compress=True)
    _write(tmp_path / "train.de", [s for s, _ in small_pairs])
    _write(tmp_path / "train.en", [t for _, t in small_pairs])
    config = _files_config(tmp_path)
    assert _as_lists(load_pairs(config, "validation")) == small_pairs  # stripped
    assert _as_lists(load_pairs(config, "train")) == small_pairs


def test_whitespace_inside_lines_is_normalized_as_the_translator_does(tmp_path, small_pairs):
    """Tabs, repeated, no-break and ideographic spaces become one space; a line of only such
    spaces becomes "" (which make_batches drops) and the file check counts it as empty."""
    messy = [s.replace(" ", w) for s, w in zip([s for s, _ in small_pairs],
                                               ["\t", "  ", "\u00a0", "\u3000 ", " \u2009"])]
    _write(tmp_path / "train.de", [" \t" + s + "\u00a0\r" for s in messy] + ["\u00a0\u2003"])
    _write(tmp_path / "train.en", [t for _, t in small_pairs] + ["x"])
    config = _files_config(tmp_path)
    assert _as_lists(load_pairs(config, "train")) == small_pairs + [("", "x")]
    assert check_parallel_files(split_files(tmp_path, "train", ("de", "en"))).empty_lines == [6]


def test_shards_are_every_nth_pair_disjoint_and_together_the_split(tmp_path, small_pairs):
    _write(tmp_path / "train.de", [s + " \t" for s, _ in small_pairs])
    _write(tmp_path / "train.en", [t for _, t in small_pairs])
    config = _files_config(tmp_path)
    shards = [load_pairs(config, "train", shard=(index, 2)) for index in range(2)]
    assert [_as_lists(shard) for shard in shards] == [small_pairs[0::2], small_pairs[1::2]]
    assert _as_lists(load_pairs(config, "train", shard=(0, 1))) == small_pairs
    # tf.distribute must not shard a worker's shard again.
    assert (shards[1].options().experimental_distribute.auto_shard_policy
            == tf.data.experimental.AutoShardPolicy.OFF)
    with pytest.raises(ConfigError, match=r"shard=\(2, 2\): expected \(index, count\)"):
        load_pairs(config, "train", shard=(2, 2))


# ----------------------------------------------------------------------------- tfds sources

def test_tfds_translation_dataset_with_mock_data():
    config = DataConfig(dataset="ted_hrlr_translate/pt_to_en", source_lang="pt", target_lang="en")
    with tfds.testing.mock_data(num_examples=7):
        pairs = load_pairs(config, "train")
        assert pairs.element_spec == (tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.string))
        assert len(_as_lists(pairs)) == 7
        with pytest.raises(ConfigError, match=r"target_lang='de' is not a language .*\['en', 'pt'\]"):
            load_pairs(DataConfig(dataset=config.dataset, source_lang="pt", target_lang="de"),
                       "validation")
    with pytest.raises(ConfigError, match=r"^data.dataset='nope_dataset': Dataset nope_dataset "
                                          r"not found"):
        load_pairs(DataConfig(dataset="nope_dataset"), "train")


@pytest.mark.parametrize("name", ["wmt14_en_de_base", "wmt14_en_de_big"])
def test_wmt14_experiments_read_tfds_wmt14_translate_with_mock_data(name):
    config = ExperimentConfig.from_yaml(REPO_ROOT / "experiments" / f"{name}.yaml")
    assert config.data.dataset == "wmt14_translate/de-en"
    with tfds.testing.mock_data(num_examples=6):
        for split in (config.data.train_split, config.data.validation_split,
                      config.data.test_split):
            assert len(_as_lists(load_pairs(config.data, split))) == 6, split
        whole = _as_lists(load_pairs(config.data, "train"))
        shards = [_as_lists(load_pairs(config.data, "train", shard=(i, 2))) for i in (0, 1)]
    assert shards == [whole[0::2], whole[1::2]]  # each worker its own pairs, together the split


def _first_lines(folder, prefix, n=3):
    lines = read_parallel_lines({lang: folder / f"{prefix}.{lang}.gz" for lang in ("de", "en")})
    return [(line["de"], line["en"]) for _, (_, line) in zip(range(n), lines)]


def _check_multi30k_build(config, multi30k_dir):
    validation = load_pairs(config, "validation")
    assert _as_lists(validation.take(3)) == [(s.strip(), t.strip()) for s, t in
                                             _first_lines(multi30k_dir, "val")]
    builder = tfds.builder("multi30k", data_dir=config.tfds_data_dir)
    splits = {name: info.num_examples for name, info in builder.info.splits.items()}
    assert splits == {"train": 29000, "validation": 1014, "test_2016_flickr": 1000}
    assert builder.info.features["fr"] is not None


def test_multi30k_builder_from_local_folder(multi30k_dir, tmp_path, monkeypatch):
    monkeypatch.setenv(multi30k.URL_ENV, "http://127.0.0.1:9/unreachable/")  # must not be used
    config = DataConfig(dataset="multi30k", data_dir=str(multi30k_dir), source_lang="de",
                        target_lang="en")
    config.tfds_data_dir = str(tmp_path / "tfds")
    _check_multi30k_build(config, multi30k_dir)
    with pytest.raises(ConfigError, match=r"^split 'nope' of data.dataset='multi30k': Unknown "
                                          r"split 'nope'"):
        load_pairs(config, "nope")
    # Prepared already, but a folder that is not there is named, not ignored.
    config.data_dir = str(tmp_path / "missing")
    with pytest.raises(ConfigError, match=rf"^data.data_dir={tmp_path}/missing: no such folder$"):
        load_pairs(config, "validation")


def test_multi30k_builder_downloads_from_its_url(multi30k_dir, tmp_path, monkeypatch):
    (tmp_path / "raw").symlink_to(multi30k_dir)
    requested = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):
            requested.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Handler, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.delenv(DATA_ENV, raising=False)  # no local folder: the builder must download
    monkeypatch.setenv(multi30k.URL_ENV, f"http://127.0.0.1:{server.server_port}/raw/")
    config = DataConfig(dataset="multi30k", source_lang="de", target_lang="en")
    config.tfds_data_dir = str(tmp_path / "tfds")
    try:
        _check_multi30k_build(config, multi30k_dir)
    finally:
        server.shutdown()
        server.server_close()
    assert sorted(requested) == sorted(f"/raw/{prefix}.{lang}.gz"
                                       for prefix in multi30k.SPLIT_FILES.values()
                                       for lang in multi30k.LANGUAGES)


# ----------------------------------------------------------------------------- batching

def test_bucket_lengths_and_batch_sizes():
    config = DataConfig(max_pair_length=30, tokens_per_batch=100, bucket_step=8)
    assert bucket_lengths(config) == [8, 16, 24, 32]
    assert bucket_batch_sizes(config) == [12, 6, 4, 3]
    assert bucket_batch_sizes(config, num_replicas=2) == [12, 6, 4, 2]
    with pytest.raises(ConfigError, match="cannot hold one pair of length 32 per replica for 4"):
        bucket_batch_sizes(config, num_replicas=4)


@pytest.fixture(scope="module")
def train_batches(sentencepiece_tokenizers, multi30k_config):
    """Multi30k train (29,000 pairs); with 1,000 pieces and max_pair_length 64 some pairs are too long."""
    config = multi30k_config(max_pair_length=64, tokens_per_batch=2048)
    pairs = load_pairs(config, "train")
    stats = pair_stats(pairs, *sentencepiece_tokenizers, config)
    batches = make_batches(pairs, *sentencepiece_tokenizers, config, training=True)
    return config, pairs, stats, batches


def test_every_pair_is_kept_or_counted_and_batches_fit_the_budget(train_batches):
    config, _, stats, batches = train_batches
    assert stats.total == 29000
    assert stats.kept + sum(stats.dropped.values()) == stats.total
    assert stats.dropped["too_long"] > 0 and stats.dropped["empty"] == 0
    measured = batch_stats(batches)
    assert measured.pairs == stats.kept
    assert measured.max_padded_tokens <= config.tokens_per_batch
    lengths = set(bucket_lengths(config))
    sizes = dict(zip(bucket_lengths(config), bucket_batch_sizes(config)))
    for batch, source_length, target_length in measured.shapes:
        assert {source_length, target_length} <= lengths
        assert batch <= sizes[max(source_length, target_length)]
    assert len(measured.shapes) < 100


def test_partial_batches_are_each_buckets_last_smaller_batch(train_batches):
    """One pass gives each (source, target) bucket full batches, then one partial batch unless
    its pair count is a multiple of its batch size: `batch_stats` counts those."""
    config, _, _, batches = train_batches
    measured = batch_stats(batches, config.tokens_per_batch)
    pairs, tokens = collections.Counter(), collections.Counter()
    for (source, _), target_out in batches:
        key = (source.shape[1], target_out.shape[1])
        pairs[key] += source.shape[0]
        tokens[key] += int(tf.math.count_nonzero(target_out))
    size = {key: config.tokens_per_batch // max(key) for key in pairs}
    partial = [key for key in pairs if pairs[key] % size[key]]
    assert measured.partial_batches == len(partial) > 0
    assert 0 < measured.partial_target_tokens < sum(tokens[key] for key in partial)
    assert batch_stats(batches).partial_batches == 0  # counted only against a budget


def test_targets_are_shifted_and_nothing_is_truncated(train_batches):
    config, _, _, batches = train_batches
    for (source, target_in), target_out in batches.take(20):
        assert source.dtype == target_in.dtype == target_out.dtype == tf.int32
        target_in, target_out, source = target_in.numpy(), target_out.numpy(), source.numpy()
        assert (target_in[:, 0] == START_ID).all() and (source[:, 0] == START_ID).all()
        np.testing.assert_array_equal(target_in[:, 1:], np.where(target_out[:, :-1] == END_ID,
                                                                 PAD_ID, target_out[:, :-1]))
        # Every row ends with END followed only by padding: nothing was cut off.
        for row in [*source, *target_out]:
            length = np.count_nonzero(row)
            assert row[length - 1] == END_ID and not row[length:].any()


def test_bucketing_pads_much_less_than_64_pair_batches(train_batches, sentencepiece_tokenizers):
    config, pairs, _, batches = train_batches
    bucketed = batch_stats(batches)
    fixed = batch_stats(fixed_size_batches(pairs, *sentencepiece_tokenizers, config))
    print(f"\npadding fraction on Multi30k train (source/target): token-budget buckets "
          f"{bucketed.padding_fraction('source'):.1%}/{bucketed.padding_fraction('target'):.1%}, "
          f"64-pair batches {fixed.padding_fraction('source'):.1%}/"
          f"{fixed.padding_fraction('target'):.1%}")
    for side in ("source", "target"):
        assert bucketed.padding_fraction(side) < 0.6 * fixed.padding_fraction(side)


def test_replica_count_divides_every_batch(sentencepiece_tokenizers, multi30k_config):
    config = multi30k_config(tokens_per_batch=512)
    pairs = load_pairs(config, "validation")
    measured = batch_stats(make_batches(pairs, *sentencepiece_tokenizers, config, training=True,
                                        num_replicas=3))
    assert measured.batches > 0 and all(batch % 3 == 0 for batch, _, _ in measured.shapes)
    assert measured.max_padded_tokens <= config.tokens_per_batch


def test_every_pipeline_has_tf_data_autotuning_off(sentencepiece_tokenizers, multi30k_config):
    """Deleting a finished iterator stalls while tf.data autotunes (`compat.without_autotuning`):
    every dataset the data module returns has it off, also when given pairs from elsewhere."""
    config = multi30k_config()
    outside = tf.data.Dataset.from_tensor_slices((["Ein Hund läuft."], ["A dog runs."]))
    assert outside.options().autotune.enabled is None  # tf.data's default: on
    pipelines = {
        "load_pairs": load_pairs(config, "validation"),
        "make_batches": make_batches(outside, *sentencepiece_tokenizers, config, training=True),
        "fixed_size_batches": fixed_size_batches(outside, *sentencepiece_tokenizers, config),
        "TrainingStream.batches": TrainingStream(outside, *sentencepiece_tokenizers, config,
                                                 seed=1).batches(),
    }
    for name, dataset in pipelines.items():
        assert dataset.options().autotune.enabled is False, name


def test_grouped_batches_stack_batches_of_one_shape_batch_axis_first():
    def batch(rows, source_length, target_length, fill):
        return ((np.full([rows, source_length], fill, np.int32),
                 np.full([rows, target_length], fill, np.int32)),
                np.full([rows, target_length], fill, np.int32))

    shapes = [(4, 8, 6), (4, 8, 6), (2, 16, 8), (4, 8, 6), (3, 8, 6), (2, 16, 8), (4, 8, 6)]
    batches = [batch(*shape, fill=i) for i, shape in enumerate(shapes)]
    dataset = tf.data.Dataset.from_generator(lambda: iter(batches), output_signature=(
        (tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None, None], tf.int32)),
        tf.TensorSpec([None, None], tf.int32)))
    groups = list(group_batches(dataset, 2).as_numpy_iterator())
    seen = []
    for (source, target_in), target_out in groups:
        rows, n = source.shape[:2]
        assert target_in.shape == target_out.shape == (rows, n, target_in.shape[2])
        members = [int(source[0, i, 0]) for i in range(n)]
        for i, member in enumerate(members):  # [batch, n, length]: micro-batch i is [:, i]
            assert shapes[member] == (rows, source.shape[2], target_out.shape[2])
            assert (source[:, i] == member).all() and (target_out[:, i] == member).all()
        seen.append(members)
    # Full pairs of one shape as they fill, the shapes' last (partial) groups at the end.
    assert seen == [[0, 1], [2, 5], [3, 6], [4]]


def test_subword_sampling_resegments_training_pairs_every_epoch(sentencepiece_vocab,
                                                                sentencepiece_tokenizers):
    config, _ = sentencepiece_vocab
    # max_pair_length 256: no pair too long, even resegmented into more pieces.
    config = DataConfig(**{**vars(config), "sp_nbest_size": -1, "sp_alpha": 0.2,
                           "max_pair_length": 256})
    best, _ = sentencepiece_tokenizers
    sampler, _ = training_tokenizers(config, best, best)
    pairs = load_pairs(config, "validation")

    def one_epoch(batches):
        """Sorted (target text, target ids) of every pair in one pass over `batches`."""
        found = []
        for _, target_out in batches.as_numpy_iterator():
            texts = [t.decode("utf-8") for t in best.detokenize(target_out).numpy()]
            found += [(text, tuple(row[row != PAD_ID])) for text, row in zip(texts, target_out)]
        return sorted(found)

    sampled = make_batches(pairs, sampler, sampler, config, training=True)
    first, second = one_epoch(sampled), one_epoch(sampled)
    fixed = make_batches(pairs, best, best, config, training=True)
    viterbi, again = one_epoch(fixed), one_epoch(fixed)
    assert viterbi == again  # without sampling, a reshuffle changes only the order
    references = sorted(t.decode("utf-8") for _, t in pairs.as_numpy_iterator())
    for epoch in (first, second):
        assert [text for text, _ in epoch] == references  # every pair, the text kept exactly
    assert first != second and first != viterbi  # new segmentations each epoch
    # Validation batches (training=False) never sample, whatever the tokenizer.
    assert one_epoch(make_batches(pairs, best, best, config, training=False)) == viterbi


def test_data_stats_report(sentencepiece_vocab, multi30k_dir):
    config, vocab_dir = sentencepiece_vocab
    stats = data_stats(config, vocab_dir)
    splits = stats["splits"]
    assert {name: entry["pairs"] for name, entry in splits.items()} == {
        "train": 29000, "validation": 1014, "test_2016_flickr": 1000}
    train = splits["train"]
    assert train["kept"] + sum(train["dropped"].values()) == 29000
    # Lengths count START and END of every pair; a pair is dropped as too long exactly when a
    # side exceeds max_pair_length, so the longest pair decides whether any was.
    longest = max(train["source_length"][100], train["target_length"][100])
    assert (train["dropped"]["too_long"] > 0) == (longest > config.max_pair_length)
    for side in ("source", "target"):
        lengths = list(train[f"{side}_length"].values())  # p50, p90, p95, p99, p100
        assert lengths == sorted(lengths) and lengths[0] >= 3
        assert 0 <= train[f"{side}_unk_rate"] < 0.01
    # Every kept pair is in exactly one batch of each kind; the buckets pad less than 64-pair
    # batches and never exceed the token budget.
    bucketed, fixed = train["batches"], train["fixed_64_batches"]
    assert bucketed["pairs"] == fixed["pairs"] == train["kept"]
    assert fixed["batches"] == -(-train["kept"] // 64)
    assert bucketed["max_padded_tokens"] <= config.tokens_per_batch == bucketed["tokens_per_batch"]
    assert bucketed["source_padding"] < fixed["source_padding"]
    assert bucketed["target_padding"] < fixed["target_padding"]
    report = format_data_stats(stats)
    dropped = ", ".join(f"{n} {reason}" for reason, n in train["dropped"].items())
    assert f"\n[train] 29000 pairs: {train['kept']} kept, dropped {dropped}\n" in report
    assert "[validation] 1014 pairs" in report and "[test_2016_flickr] 1000 pairs" in report
    assert (f"bucketed batches: {bucketed['batches']} batches in {bucketed['shapes']} shapes"
            in report)
    assert f"(max padded {bucketed['max_padded_tokens']}, budget 2048)" in report
    assert 0 < bucketed["partial_batches"] < bucketed["batches"]
    assert 0 < bucketed["partial_target_share"] < 0.5
    assert (f"    {bucketed['partial_batches']} of the {bucketed['batches']} batches are a length "
            "bucket's last, smaller batch") in report
    assert "training carries their pairs into the next pass instead" in report


def test_read_lines_reads_plain_and_gzip_alike(tmp_path):
    import gzip

    from keras_transformer.data.text_io import read_lines

    text = "Ein Hund.\r\nZwei Katzen.\n\nÄrger.\n"
    (tmp_path / "a.txt").write_text(text, encoding="utf-8", newline="")
    with gzip.open(tmp_path / "a.txt.gz", "wt", encoding="utf-8", newline="") as f:
        f.write(text)
    expected = ["Ein Hund.", "Zwei Katzen.", "", "Ärger."]
    assert list(read_lines(tmp_path / "a.txt")) == expected
    assert list(read_lines(tmp_path / "a.txt.gz")) == expected


@pytest.mark.parametrize("damage", ["truncated", "corrupt_body", "bad_method"])
def test_a_damaged_gzip_file_is_a_data_error_naming_it(tmp_path, damage):
    from keras_transformer.data.text_io import read_lines, read_user_lines

    data = gzip.compress(("Ein Hund.\n" * 2000).encode())
    if damage == "truncated":
        data = data[:len(data) // 2]
    elif damage == "corrupt_body":
        data = data[:12] + bytes(b ^ 0x5A for b in data[12:40]) + data[40:]
    else:  # the header's compression method byte
        data = data[:2] + b"\x07" + data[3:]
    path = tmp_path / "train.de.gz"
    path.write_bytes(data)
    with pytest.raises(DataError, match=r"train\.de\.gz: damaged gzip file"):
        list(read_lines(path))
    with pytest.raises(DataError, match=r"train\.de\.gz: damaged gzip file"):
        read_user_lines(path)
