"""Text pairs from tfds or local files, normalized, counted, and the vocabulary learned from them.

Data flow (the batches: `streams`):

    load_pairs(config, split)                 (source_text, target_text) scalar tf.string pairs
      -> streams.make_batches(pairs, ...)     ((source_ids, target_in_ids), target_out_ids)
      -> streams.TrainingStream(...)          training: endless, the same in every process

Sources (`DataConfig.dataset`):
- "multi30k": the tfds builder in `keras_transformer.data.multi30k` (local folder or download);
- "files": line-aligned `{data_dir}/{split}.{lang}` or `.gz` files;
- any tfds translation dataset, e.g. "ted_hrlr_translate/pt_to_en" or "wmt14_translate/de-en",
  whose examples are {lang: text} dicts; `source_lang`/`target_lang` pick the direction.

Policies (nothing is lost silently: `pair_stats` counts every pair as kept or dropped by reason):
- every line is normalized (`tokenizers.normalize_text`: invisible characters removed, NFC,
  runs of Unicode whitespace made one space, none at either end), as the Translator normalizes
  its inputs;
- a pair with an empty source or target is dropped (reason "empty"); for local files the first
  line numbers are logged when the files are checked;
- a pair whose source or target, in tokens including START and END, is longer than
  `max_pair_length` is dropped (reason "too_long"), never truncated (truncating would lose END).

Every dataset returned here runs without tf.data autotuning (`compat.without_autotuning`: a
TensorFlow 2.21 bug makes deleting a finished iterator wait for the autotuning thread).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from pathlib import Path
from typing import Mapping

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from keras_transformer.compat import without_autotuning
from keras_transformer.config import DATA_ENV, ConfigError, CorpusConfig, DataConfig
from keras_transformer.data.text_io import DataError  # noqa: F401  (DataError: re-exported)
from keras_transformer.data.text_io import first_line, read_parallel_lines
from keras_transformer.data.tokenizers import UNK_ID, Tokenizer, build_tokenizers, normalize_text

logger = logging.getLogger(__name__)

AUTOTUNE = tf.data.AUTOTUNE
KEEP, EMPTY, TOO_LONG = 0, 1, 2
DROP_REASONS = {EMPTY: "empty", TOO_LONG: "too_long"}
# Other names local files use for a split (Multi30k calls its validation split "val").
SPLIT_ALIASES = {"validation": ("val", "valid", "dev"), "val": ("validation",)}
_TOKENIZE_BATCH = 512  # pairs tokenized per call: tf-text ops are much faster on batches
_NORMALIZE_BATCH = 512  # pairs normalized per call (`load_pairs`)


# ----------------------------------------------------------------------------- local text files

@dataclasses.dataclass
class FileCheck:
    """What `check_parallel_files` found: line count and the lines with an empty side."""

    paths: dict
    lines: int
    empty_lines: list  # line numbers (from 1) where some file's line is blank, at most 20
    empty_count: int


def check_parallel_files(paths: Mapping[str, str | os.PathLike], max_listed: int = 20) -> FileCheck:
    """Reads the files once (streaming) to check them; see `read_parallel_lines` for the errors."""
    empty, count, lines = [], 0, 0
    for lines, sentences in read_parallel_lines(paths):
        if any(not s.strip() for s in sentences.values()):
            count += 1
            if len(empty) < max_listed:
                empty.append(lines)
    return FileCheck({k: str(p) for k, p in paths.items()}, lines, empty, count)


def split_files(data_dir: str | os.PathLike, split: str, langs: tuple[str, ...]) -> dict:
    """{lang: path} of `{data_dir}/{split}.{lang}` or `.gz` (or a split alias, e.g. val for validation)."""
    data_dir = Path(data_dir)
    tried = []
    for stem in (split, *SPLIT_ALIASES.get(split, ())):
        found = {}
        for lang in langs:
            candidates = [data_dir / f"{stem}.{lang}{suffix}" for suffix in ("", ".gz")]
            found.update({lang: p for p in reversed(candidates) if p.is_file()})
            tried.extend(str(p) for p in candidates)
        if len(found) == len(langs):
            return found
    raise DataError(f"no files for split {split!r} in {data_dir}: tried {', '.join(tried)}")


def _load_files(data_config: DataConfig, split: str) -> tf.data.Dataset:
    langs = (data_config.source_lang, data_config.target_lang)
    return _load_parallel_files(split_files(data_config.resolved_data_dir(), split, langs), langs)


def _load_parallel_files(paths: dict, langs: tuple[str, str]) -> tf.data.Dataset:
    """(source, target) lines of the line-aligned files `paths` {lang: path}, checked first."""
    check = check_parallel_files(paths)
    if check.empty_count:
        logger.warning("%s: %d of %d line pairs have an empty side and will be dropped (lines %s%s)",
                       " / ".join(check.paths.values()), check.empty_count, check.lines,
                       ", ".join(map(str, check.empty_lines)),
                       ", ..." if check.empty_count > len(check.empty_lines) else "")
    source, target = (
        tf.data.TextLineDataset(str(paths[lang]),
                                compression_type="GZIP" if paths[lang].suffix == ".gz" else None)
        for lang in langs)
    return tf.data.Dataset.zip(source, target)


# ----------------------------------------------------------------------------- tfds sources

def _tfds_data_dir(data_config: DataConfig):
    return data_config.tfds_data_dir


def _local_dir_or_none(data_config: DataConfig) -> str | None:
    """The local folder tfds prepares from, None if none is set (tfds then downloads); a set
    folder that does not exist is an error even when tfds has the dataset prepared already."""
    if not (data_config.data_dir or os.environ.get(DATA_ENV)):
        return None
    return str(data_config.resolved_data_dir())


def check_data_folder(data_config: DataConfig) -> None:
    """Raises ConfigError if the local folder that `data_config` reads is missing: the
    "files" dataset's, or the folder tfds prepares "multi30k" from when one is set."""
    if data_config.dataset == "files":
        data_config.resolved_data_dir()
    elif data_config.dataset == "multi30k":
        _local_dir_or_none(data_config)


def _load_multi30k(data_config: DataConfig, split: str) -> tf.data.Dataset:
    # Registers the "multi30k" tfds builder.
    from keras_transformer.data import multi30k  # noqa: F401

    split = {"val": "validation"}.get(split, split)
    builder = tfds.builder("multi30k", data_dir=_tfds_data_dir(data_config))
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=_local_dir_or_none(data_config)))
    with _tfds_errors(data_config, split):
        examples = builder.as_dataset(split=split)
    return _select_languages(examples, data_config, "multi30k")


def _load_tfds(data_config: DataConfig, split: str) -> tf.data.Dataset:
    with _tfds_errors(data_config, split):
        examples = tfds.load(data_config.dataset, split=split,
                             data_dir=_tfds_data_dir(data_config))
    return _select_languages(examples, data_config, data_config.dataset)


@contextlib.contextmanager
def _tfds_errors(data_config: DataConfig, split: str):
    """tfds's errors for an unknown dataset or split as ConfigErrors naming the setting."""
    try:
        yield
    except tfds.core.DatasetNotFoundError as error:
        raise ConfigError(f"data.dataset={data_config.dataset!r}: "
                          f"{first_line(error)}") from None
    except ValueError as error:
        if not str(error).startswith("Unknown split"):
            raise
        raise ConfigError(f"split {split!r} of data.dataset={data_config.dataset!r}: "
                          f"{first_line(error)}") from None


def _select_languages(examples: tf.data.Dataset, data_config: DataConfig, name: str):
    """{lang: text} examples -> (source_text, target_text) pairs."""
    available = sorted(examples.element_spec) if isinstance(examples.element_spec, dict) else []
    for field, lang in (("source_lang", data_config.source_lang),
                        ("target_lang", data_config.target_lang)):
        if lang not in available:
            raise ConfigError(f"data.{field}={lang!r} is not a language of {name}; "
                              f"its examples have {available}")
    source, target = data_config.source_lang, data_config.target_lang
    return examples.map(lambda example: (example[source], example[target]),
                        num_parallel_calls=AUTOTUNE)


def load_pairs(data_config: DataConfig, split: str,
               shard: tuple[int, int] = (0, 1)) -> tf.data.Dataset:
    """(source_text, target_text) pairs of `split`: two scalar tf.string, normalized
    (`normalize_text`, the Translator's normalization of its inputs).

    Pairs with an empty side are kept here and dropped (and counted) by `make_batches`/`pair_stats`.

    `shard=(index, count)` keeps the pairs index, index + count, index + 2 * count, ... in
    reading order (for files: lines index + 1, index + 1 + count, ...), chosen as the text is
    read, before anything else is done to it: `count` workers given the indexes 0 to count - 1
    read disjoint parts that together make the split, and each normalizes and tokenizes only
    its own (every worker still reads every line). Sharded pairs tell tf.distribute not to
    shard them again (auto-shard policy OFF).
    """
    _checked_shard(shard)
    if data_config.dataset == "files":
        pairs = _load_files(data_config, split)
    elif data_config.dataset == "multi30k":
        pairs = _load_multi30k(data_config, split)
    else:
        pairs = _load_tfds(data_config, split)
    return _sharded_and_normalized(pairs, shard)


def load_corpus_pairs(data_config: DataConfig, corpus: CorpusConfig,
                      shard: tuple[int, int] = (0, 1)) -> tf.data.Dataset:
    """The training pairs of one of `data.corpora`, as `load_pairs` gives a split's, with the
    corpus's tag and a space before every source that has words."""
    _checked_shard(shard)
    if corpus.dataset == "file_pair":
        langs = (data_config.source_lang, data_config.target_lang)
        paths = {}
        for lang, path in zip(langs, (corpus.source_file, corpus.target_file)):
            if not os.path.isfile(path):
                raise DataError(f"{path}: no such file (a corpus's "
                                f"{'source' if lang == langs[0] else 'target'}_file)")
            paths[lang] = Path(path)
        pairs = _sharded_and_normalized(_load_parallel_files(paths, langs), shard)
    else:
        config = dataclasses.replace(
            data_config, dataset=corpus.dataset, corpora=None,
            data_dir=corpus.data_dir or data_config.data_dir)
        pairs = load_pairs(config, corpus.train_split or data_config.train_split, shard)
    if corpus.tag:
        tag = corpus.tag.strip()
        pairs = pairs.map(lambda source, target: (tf.where(
            tf.strings.length(source) > 0, tf.strings.join([tag, source], " "), source), target),
            num_parallel_calls=AUTOTUNE)
    return without_autotuning(pairs)


def _checked_shard(shard: tuple[int, int]) -> tuple[int, int]:
    index, count = shard
    if not 0 <= index < count:
        raise ConfigError(f"shard={shard!r}: expected (index, count) with 0 <= index < count")
    return index, count


def _sharded_and_normalized(pairs: tf.data.Dataset, shard: tuple[int, int]) -> tf.data.Dataset:
    """`load_pairs`' shard of `pairs`, normalized (see there)."""
    index, count = _checked_shard(shard)
    if count > 1:
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        pairs = pairs.shard(count, index).with_options(options)
    # Normalizes a block of pairs at a time: the ops cost about as much per call as per string.
    return without_autotuning(pairs.batch(_NORMALIZE_BATCH).map(
        lambda s, t: (normalize_text(s), normalize_text(t)),
        num_parallel_calls=AUTOTUNE).unbatch())


# ----------------------------------------------------------------------------- filtering, counting

def drop_reasons(source_lengths, target_lengths, empty, max_pair_length: int):
    """KEEP (0), EMPTY or TOO_LONG per pair; lengths in tokens with START/END. Any matching shapes."""
    too_long = (source_lengths > max_pair_length) | (target_lengths > max_pair_length)
    return tf.where(empty, EMPTY, tf.where(too_long, TOO_LONG, KEEP))


def tokenized_pairs(pairs, source_tokenizer: Tokenizer, target_tokenizer: Tokenizer):
    """Pairs -> batches of (source ids ragged [b, (n)], target ids ragged [b, (m)], empty bool [b])."""
    def tokenize(source, target):
        empty = (tf.strings.length(source) == 0) | (tf.strings.length(target) == 0)
        return source_tokenizer.tokenize(source), target_tokenizer.tokenize(target), empty
    return pairs.batch(_TOKENIZE_BATCH).map(tokenize, num_parallel_calls=AUTOTUNE)


@dataclasses.dataclass
class PairStats:
    """Every pair of a dataset, kept or dropped by reason; token lengths include START and END."""

    total: int
    kept: int
    dropped: dict  # reason -> count (reasons: DROP_REASONS values)
    reasons: np.ndarray  # [total] KEEP, EMPTY or TOO_LONG
    source_lengths: np.ndarray  # [total]
    target_lengths: np.ndarray  # [total]
    source_unk: int  # UNK ids among the source subwords of kept pairs
    target_unk: int

    def percentiles(self, side: str, q=(50, 90, 95, 99, 100)) -> dict:
        lengths = self.source_lengths if side == "source" else self.target_lengths
        return {p: int(np.percentile(lengths, p)) if len(lengths) else 0 for p in q}

    def unk_rate(self, side: str) -> float:
        """UNK ids per subword of the kept pairs (START and END not counted)."""
        lengths = self.source_lengths if side == "source" else self.target_lengths
        unk = self.source_unk if side == "source" else self.target_unk
        subwords = int(np.sum(lengths[self.reasons == KEEP] - 2))
        return unk / subwords if subwords else 0.0


def pair_stats(pairs: tf.data.Dataset, source_tokenizer: Tokenizer, target_tokenizer: Tokenizer,
               data_config: DataConfig) -> PairStats:
    """Counts what `make_batches` keeps and drops from `pairs` (the same rule), with lengths."""
    def summarize(source_ids, target_ids, empty):
        source_len = tf.cast(source_ids.row_lengths(), tf.int32)
        target_len = tf.cast(target_ids.row_lengths(), tf.int32)
        reasons = drop_reasons(source_len, target_len, empty, data_config.max_pair_length)
        kept = reasons == KEEP
        unk = [tf.reduce_sum(tf.cast(tf.ragged.boolean_mask(ids, kept) == UNK_ID, tf.int64))
               for ids in (source_ids, target_ids)]
        return source_len, target_len, reasons, unk[0], unk[1]

    parts = list(tokenized_pairs(pairs, source_tokenizer, target_tokenizer)
                 .map(summarize, num_parallel_calls=AUTOTUNE).as_numpy_iterator())
    source_len, target_len, reasons = (np.concatenate([p[i] for p in parts]) if parts else
                                       np.zeros([0], np.int32) for i in range(3))
    return PairStats(
        total=len(reasons),
        kept=int(np.sum(reasons == KEEP)),
        dropped={name: int(np.sum(reasons == code)) for code, name in DROP_REASONS.items()},
        reasons=reasons,
        source_lengths=source_len,
        target_lengths=target_len,
        source_unk=int(sum(p[3] for p in parts)),
        target_unk=int(sum(p[4] for p in parts)),
    )


def vocab_folder(data_config: DataConfig, vocab_dir) -> Path:
    """`vocab_dir`, else the config's `data.vocab_dir`; a ConfigError without either."""
    vocab_dir = vocab_dir or data_config.vocab_dir
    if not vocab_dir:
        raise ConfigError("no vocabulary folder: set data.vocab_dir or pass vocab_dir")
    return Path(vocab_dir)


def build_vocab(data_config: DataConfig, vocab_dir: str | os.PathLike | None = None):
    """Learns the vocabularies from the training split, writes them; returns (source, target)."""
    if data_config.train_split == data_config.test_split:
        raise ConfigError(f"data.train_split={data_config.train_split!r} is the test split: "
                          "vocabularies are never learned from test data")
    pairs = load_pairs(data_config, data_config.train_split)
    return build_tokenizers(data_config, pairs, vocab_folder(data_config, vocab_dir))
