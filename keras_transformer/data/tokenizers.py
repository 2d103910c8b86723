"""Subword tokenizers that run inside the TensorFlow graph and export with a SavedModel.

Two kinds, both `tf.Module`s with the same interface (after the tf.text tutorial's
`CustomTokenizer`):

- `SentencePieceTokenizer`: one JOINT source+target vocabulary, trained with the `sentencepiece`
  package and run with `tensorflow_text.SentencepieceTokenizer` (ops `SentencepieceOp`,
  `SentencepieceTokenizeOp`, `SentencepieceDetokenizeOp`). Identity normalization and byte
  fallback make `detokenize(tokenize(s)) == s` exact for any text without leading whitespace.
- `WordPieceTokenizer`: one vocabulary per language, learned with tf-text's
  `bert_vocab_from_dataset` and run with `tensorflow_text.BertTokenizer` (ops
  `RegexSplitWithOffsets`, `WordpieceTokenizeWithOffsets`, plus `CaseFoldUTF8`/`NormalizeUTF8`
  when lowercasing). Its round trip is exact up to `WordPieceTokenizer.normalize`: words and
  punctuation are split apart, then rejoined with one space except around punctuation (see
  `_NATURAL_SPACING`), characters missing from the vocabulary become `[UNK]`.

Every vocabulary reserves PAD = 0, START = 1, END = 2, UNK = 3. `tokenize` adds START and END;
`detokenize` drops PAD and START and cuts at the first END, so it takes model output directly.

`build_tokenizers` learns the vocabularies from training pairs and writes them to `vocab_dir`
with a `tokenizer.json` describing how they were made; `load_tokenizers` reuses them and refuses
files made with other settings.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterable, Sequence

import sentencepiece
import tensorflow as tf
import tensorflow_text as text
from tensorflow_text.python.ops.bert_tokenizer import BasicTokenizer  # not exported at top level
from tensorflow_text.tools.wordpiece_vocab import bert_vocab_from_dataset

from keras_transformer.config import (END_ID, PAD_ID,  # noqa: F401 (the reserved ids, re-exported)
                                      SENTENCEPIECE_FILE, START_ID, UNK_ID, ConfigError,
                                      DataConfig)
from keras_transformer.data import casing, placeholders
from keras_transformer.data.placeholders import (MAX_SPANS, OUTPUT_PLACEHOLDER_PATTERN, SPAN_PATTERN,
                                                 SYMBOLS)
from keras_transformer.data.text_io import (errno_of, partial_path, remove_dead_partials,
                                            write_error)
from keras_transformer.data.text_normalization import INVISIBLE_PATTERN, WHITESPACE_PATTERN
from keras_transformer.decoding.word_alignment import WORD_BOUNDARY

logger = logging.getLogger(__name__)

WORDPIECE_RESERVED = ["[PAD]", "[START]", "[END]", "[UNK]"]  # in id order
META_FILE = "tokenizer.json"

# tf-text ops the TF Serving model server links, by the Serving version that added them: graphs
# may use no other custom op.
SERVING_TF_TEXT_OPS = frozenset({
    # BertTokenizer (since Serving 2.2)
    "CaseFoldUTF8", "NormalizeUTF8", "RegexSplitWithOffsets", "WordpieceTokenizeWithOffsets",
    # FastWordpiece (2.10), FastBertNormalize and fast SentencePiece (2.12)
    "FastWordpieceTokenizeWithOffsets", "FastWordpieceDetokenize", "FastBertNormalize",
    "TFText>FastSentencepieceTokenize", "TFText>FastSentencepieceDetokenize",
    # SentencepieceOp family
    "SentencepieceOp", "SentencepieceTokenizeOp", "SentencepieceTokenizeWithOffsetsOp",
    "SentencepieceDetokenizeOp", "SentencepieceVocabSizeOp", "SentencepieceIdToStringOp",
    "SentencepieceStringToIdOp",
})

STRINGS_SPEC = tf.TensorSpec([None], tf.string)

def normalize_text(strings):
    """string [...] -> string [...]: the one normalization of text before tokenizing, for
    training pairs (`data.load_pairs`) and translator inputs alike
    (`text_normalization.NORMALIZATION`; `text_normalization.normalize` is its TensorFlow-free
    twin, byte for byte):

    1. bytes that are not UTF-8 become U+FFFD;
    2. characters that show nothing are removed (`text_normalization.INVISIBLE_RANGES`): a byte-order mark, a zero-width
       space or a NUL changes no translation, and a source of nothing else is empty;
    3. NFC: a letter followed by a combining accent (as macOS may write "ä") becomes the one
       precomposed character that training text uses;
    4. every run of Unicode whitespace (tabs, newlines, repeated or no-break spaces, ...) becomes
       one ASCII space, and leading/trailing whitespace is removed.

    Ops: `UnicodeTranscode`, `StaticRegexReplace`, tf-text's `NormalizeUTF8` (which the TF
    Serving model server links), `StringStrip`.
    """
    strings = tf.strings.unicode_transcode(strings, "UTF-8", "UTF-8", errors="replace",
                                           replacement_char=0xFFFD)
    strings = tf.strings.regex_replace(strings, INVISIBLE_PATTERN, "")
    strings = text.normalize_utf8(strings, "NFC")
    return tf.strings.strip(tf.strings.regex_replace(strings, WHITESPACE_PATTERN, " "))


def case_form(strings):
    """string [batch] -> int32 [batch]: `casing.CAPITALS`, `casing.TITLE` or
    `casing.ORDINARY` of each text (`casing.case_form` as TensorFlow ops)."""
    def count(texts, drop):  # the characters of `texts` left after removing `drop`
        return tf.strings.length(tf.strings.regex_replace(texts, drop, ""), unit="UTF8_CHAR")

    letters, capitals = count(strings, r"\P{L}"), count(strings, r"\P{Lu}")
    share = casing.CAPITAL_SHARE
    in_capitals = (letters >= casing.MIN_LETTERS) & (capitals * share[1] >= letters * share[0])
    words = tf.strings.split(strings, " ")  # ragged [batch, (words)]
    long = words.with_flat_values(count(words.flat_values, r"\P{L}") >= 2)
    capital_first = words.with_flat_values(
        tf.strings.regex_full_match(words.flat_values, r"\P{L}*\p{Lu}.*"))
    long_words = tf.reduce_sum(tf.cast(long, tf.int32), axis=1)
    in_title = (long_words >= casing.TITLE_WORDS) & tf.reduce_all(
        tf.logical_or(tf.logical_not(long), capital_first), axis=1)
    return tf.where(in_capitals, casing.CAPITALS,
                    tf.where(in_title, casing.TITLE, casing.ORDINARY))


def fold_case(strings):
    """string [batch] -> (string [batch], int32 [batch]): the texts in capitals or title case
    lowercased, and each text's `case_form` (`casing.fold_case` as TensorFlow ops)."""
    form = case_form(strings)
    return tf.where(form != casing.ORDINARY, tf.strings.lower(strings, encoding="utf-8"),
                    strings), form


def restore_case(texts, form):
    """string [batch], int32 [batch] -> string [batch]: each text in the case `form` of its
    source (`casing.restore_case` as TensorFlow ops)."""
    chars = tf.strings.unicode_split(tf.strings.split(texts, " "), "UTF-8")  # [b, (w), (c)]
    first = tf.strings.upper(tf.strings.reduce_join(chars[:, :, :1], axis=-1), encoding="utf-8")
    titled = tf.strings.reduce_join(
        tf.strings.join([first, tf.strings.reduce_join(chars[:, :, 1:], axis=-1)]),
        axis=-1, separator=" ")
    return tf.where(form == casing.CAPITALS, tf.strings.upper(texts, encoding="utf-8"),
                    tf.where(form == casing.TITLE, titled, texts))


def mask_spans(strings):
    """string [batch] -> (string [batch], string [batch, (spans)]): each text with its first
    `placeholders.MAX_SPANS` spans (numbers, web addresses, emoji) replaced by ``<ph0>``,
    ``<ph1>``, ... in reading order, and those spans: `placeholders.mask` as TensorFlow ops
    (`RegexSplitWithOffsets`, `RegexFullMatch`), byte for byte."""
    pieces, _, _ = text.regex_split_with_offsets(strings, SPAN_PATTERN, SPAN_PATTERN)
    flat = pieces.flat_values  # the texts cut into spans and what lies between them
    is_span = tf.strings.regex_full_match(flat, SPAN_PATTERN)
    count = tf.cumsum(tf.cast(is_span, tf.int32), exclusive=True)
    before_row = tf.gather(tf.concat([count, [tf.reduce_sum(tf.cast(is_span, tf.int32))]], 0),
                           pieces.row_starts())
    index = count - tf.gather(before_row, pieces.value_rowids())  # the span's place in its text
    masked = is_span & (index < MAX_SPANS)
    placeholder = tf.strings.join(["<ph", tf.strings.as_string(index), ">"])
    texts = tf.strings.reduce_join(pieces.with_flat_values(tf.where(masked, placeholder, flat)),
                                   axis=1)
    return texts, tf.ragged.boolean_mask(pieces, pieces.with_flat_values(masked))


def unmask_spans(texts, spans):
    """string [batch], string [batch, (spans)] -> string [batch]: each placeholder ``<phK>``
    (or ``<PHK>``) replaced by its row's K-th span, or removed where the row has none (`placeholders.unmask`
    as TensorFlow ops, byte for byte)."""
    pattern = OUTPUT_PLACEHOLDER_PATTERN
    pieces, _, _ = text.regex_split_with_offsets(texts, pattern, pattern)
    flat, rows = pieces.flat_values, pieces.value_rowids()
    is_placeholder = tf.strings.regex_full_match(flat, pattern)
    digit = tf.strings.substr(tf.where(is_placeholder, flat, SYMBOLS[0]), 3, 1)  # <phK>: K
    index = tf.strings.to_number(digit, tf.int64)
    found = is_placeholder & (index < tf.gather(spans.row_lengths(), rows))
    at = tf.where(found, tf.gather(spans.row_starts(), rows) + index, tf.size(spans.flat_values,
                                                                            out_type=tf.int64))
    span = tf.gather(tf.concat([spans.flat_values, [""]], 0), at)
    return tf.strings.reduce_join(
        pieces.with_flat_values(tf.where(is_placeholder, span, flat)), axis=1)


class Tokenizer(tf.Module):
    """Strings <-> subword ids with reserved PAD/START/END/UNK ids; exportable with tf.saved_model.

    Subclasses implement `_tokenize_words(strings) -> ragged int32 [batch, (len)]` (no START/END),
    `_detokenize_clean(ragged ids) -> string [batch]` (ids without reserved markers) and
    `lookup(ids)`, and set `vocab_size`.
    """

    vocab_size: int
    samples = False  # whether `tokenize` samples a segmentation (subword regularization)
    placeholders = False  # whether the vocabulary has the placeholders (`mask_spans`)

    def __init__(self, name=None):
        super().__init__(name=name)
        # Trace both `detokenize` signatures now so that a SavedModel holding this module keeps both.
        self.detokenize.get_concrete_function(tf.TensorSpec([None, None], tf.int32))
        self.detokenize.get_concrete_function(tf.RaggedTensorSpec([None, None], tf.int32, 1))

    # Without autograph: no control flow on tensors here, and its conversion is slow.
    @tf.function(input_signature=[STRINGS_SPEC], autograph=False)
    def tokenize(self, strings):
        """string [batch] -> ragged int32 [batch, (len)]: START, subword ids, END."""
        ids = self._tokenize_words(strings)  # [batch, (n)]
        batch = tf.shape(strings, out_type=tf.int64)[0]
        start = tf.fill([batch, 1], tf.constant(START_ID, tf.int32))
        end = tf.fill([batch, 1], tf.constant(END_ID, tf.int32))
        return tf.concat([start, ids, end], axis=1)

    @tf.function(autograph=False)
    def detokenize(self, ids):
        """int32 [batch, len] (dense or ragged) -> string [batch].

        Drops PAD and START, stops at the first END, so decoder output can be passed as it is.
        """
        if isinstance(ids, tf.RaggedTensor):
            ids = ids.to_tensor(default_value=PAD_ID)
        ids = tf.cast(ids, tf.int32)
        before_end = tf.math.cumsum(tf.cast(ids == END_ID, tf.int32), axis=1) == 0
        keep = before_end & (ids != PAD_ID) & (ids != START_ID)
        return self._detokenize_clean(tf.ragged.boolean_mask(ids, keep))

    def lookup(self, ids):
        """int32 ids `[...]` (dense or ragged) -> the subword of each id, string `[...]`, as the
        tf.text tutorial's `lookup` (e.g. for the axes of attention plots). Reserved ids give
        their markers."""
        raise NotImplementedError

    def word_indices(self, ids):
        """int32 ids `[batch, len]` (as `tokenize` or a search makes them, padded) -> int32
        `[batch, len]`: the index of the word each subword belongs to, counted from 0 in its
        row, and -1 at PAD, START and END. Words are what detokenization separates (see
        `word_starts`); word alignments are over them."""
        real = (ids != PAD_ID) & (ids != START_ID) & (ids != END_ID)
        starts = tf.cast(self.word_starts(ids) & real, tf.int32)
        return tf.where(real, tf.maximum(tf.cumsum(starts, axis=1) - 1, 0), -1)

    def word_starts(self, ids):
        """bool `[...]`: whether the subword of each id starts a word."""
        raise NotImplementedError

    def _tokenize_words(self, strings):
        raise NotImplementedError

    def _detokenize_clean(self, ids):
        raise NotImplementedError


class SentencePieceTokenizer(Tokenizer):
    """SentencePiece model run by tf-text; `model_path` is tracked as a SavedModel asset.

    The model must use the reserved ids (see `train_sentencepiece`). With `nbest_size` other
    than 0 and 1, `tokenize` samples a segmentation at every call (Kudo 2018; see
    `DataConfig.sp_nbest_size`), for training batches only.
    """

    def __init__(self, model_path: str | Path, name=None, *, nbest_size: int = 0,
                 alpha: float = 1.0):
        model_path = str(model_path)
        self.model_file = tf.saved_model.Asset(model_path)
        model = _read_file(model_path, "rb")
        self._check_reserved_ids(model, model_path)
        with without_sentencepiece_info():
            self.tokenizer = text.SentencepieceTokenizer(model=model, out_type=tf.int32,
                                                         nbest_size=nbest_size, alpha=alpha)
        self.samples = nbest_size not in (0, 1)
        self.vocab_size = int(self.tokenizer.vocab_size())
        processor = sentencepiece.SentencePieceProcessor(model_proto=model)
        self.placeholders = placeholders.in_vocabulary(processor.piece_to_id, UNK_ID)
        super().__init__(name=name)

    @staticmethod
    def _check_reserved_ids(model: bytes, model_path: str) -> None:
        try:
            processor = sentencepiece.SentencePieceProcessor(model_proto=model)
        except RuntimeError as error:  # what sentencepiece raises on bytes it cannot parse
            raise ConfigError(f"{model_path}: not a SentencePiece model ({error})") from None
        found = (processor.pad_id(), processor.bos_id(), processor.eos_id(), processor.unk_id())
        if found != (PAD_ID, START_ID, END_ID, UNK_ID):
            raise ConfigError(
                f"{model_path}: SentencePiece model has pad/bos/eos/unk ids {found}, expected "
                f"{(PAD_ID, START_ID, END_ID, UNK_ID)}; train it with train_sentencepiece()")

    def _tokenize_words(self, strings):
        return self.tokenizer.tokenize(strings)

    def _detokenize_clean(self, ids):
        return self.tokenizer.detokenize(ids)

    def lookup(self, ids):
        return self.tokenizer.id_to_string(ids)  # pieces as the model has them, e.g. "▁Mann"

    def word_starts(self, ids):
        return tf.strings.substr(self.lookup(ids), 0, 1, unit="UTF8_CHAR") == WORD_BOUNDARY


# Natural spacing for WordPiece output, whose words come back joined by single spaces:
# no space before closing punctuation, none after opening brackets, none around ' ’ - /.
_NATURAL_SPACING = (
    (r" ([.,!?;:%)\]}])", r"\1"),
    (r"([(\[{]) ", r"\1"),
    (r" ?(['’/-]) ?", r"\1"),
)


class WordPieceTokenizer(Tokenizer):
    """tf-text `BertTokenizer` over a vocabulary file (tracked as a SavedModel asset).

    Case-preserving unless `lowercase` (then NFD, case folding and accent stripping, as BERT and
    the tf.text tutorial do). The vocabulary's first ids must be `WORDPIECE_RESERVED`.
    """

    def __init__(self, vocab_path: str | Path, lowercase: bool = False, name=None):
        vocab_path = str(vocab_path)
        self.vocab_file = tf.saved_model.Asset(vocab_path)
        vocab = _read_vocab(vocab_path)
        if vocab[:len(WORDPIECE_RESERVED)] != WORDPIECE_RESERVED:
            raise ConfigError(f"{vocab_path}: vocabulary must start with {WORDPIECE_RESERVED}, "
                              f"found {vocab[:len(WORDPIECE_RESERVED)]}")
        self.vocab_size = len(vocab)
        self.pieces = tf.constant(vocab)  # [vocab_size] strings, for `lookup`
        self.lowercase = lowercase
        # A path string lets the lookup table's TextFileInitializer track the file as an asset too.
        self.tokenizer = text.BertTokenizer(vocab_path, lower_case=lowercase,
                                            token_out_type=tf.int32, unknown_token="[UNK]")
        super().__init__(name=name)

    def _tokenize_words(self, strings):
        return self.tokenizer.tokenize(strings).merge_dims(-2, -1)  # [batch, (words), (pieces)] -> [batch, (n)]

    def _detokenize_clean(self, ids):
        return self._join_words(self.tokenizer.detokenize(ids))  # words: ragged string [batch, (words)]

    def lookup(self, ids):
        return tf.gather(self.pieces, ids)  # pieces as the model has them, e.g. "##s"

    def word_starts(self, ids):
        return ~tf.strings.regex_full_match(self.lookup(ids), "##.*")

    def normalize(self, strings):
        """string [batch] -> string [batch]: what a round trip gives back when every character is
        in the vocabulary (same word splitting and lowercasing as `tokenize`, natural spacing)."""
        words = BasicTokenizer(lower_case=self.lowercase).tokenize(strings)  # BertTokenizer's splitter
        return self._join_words(words)

    @staticmethod
    def _join_words(words):
        """ragged string [batch, (words)] -> string [batch] with natural spacing."""
        joined = tf.strings.reduce_join(words, separator=" ", axis=-1)
        for pattern, rewrite in _NATURAL_SPACING:
            joined = tf.strings.regex_replace(joined, pattern, rewrite)
        return joined


# What SentencePiece's C++ code writes on stderr when tf-text loads a model trained with
# identity normalization, as `train_sentencepiece` trains them ("normalizer.cc(51) LOG(INFO)
# precompiled_charsmap is empty. use identity normalization."); its log level is the library's
# own, which no Python setting reaches.
_SENTENCEPIECE_INFO = re.compile(rb"normalizer\.cc\(\d+\) LOG\(INFO\) ")


@contextlib.contextmanager
def without_sentencepiece_info():
    """Runs a block that loads a SentencePiece model into tf-text (a tokenizer, a SavedModel)
    with the process's stderr (file descriptor 2) written to a file, then writes that back
    without SentencePiece's INFO lines. Whatever else the block writes on stderr appears when it
    ends."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().splitlines(keepends=True)
                    if not _SENTENCEPIECE_INFO.match(line)]
            if kept:
                os.write(2, b"".join(kept))


def _read_vocab(path: str | Path) -> list[str]:
    try:
        return _read_file(path, "r").splitlines()
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not a UTF-8 vocabulary file ({error.reason} at byte "
                          f"{error.start})") from None


def _read_file(path: str | Path, mode: str):
    """A vocabulary file's contents (`mode` "r" or "rb"); ConfigError if it is not there."""
    if not tf.io.gfile.exists(str(path)) or tf.io.gfile.isdir(str(path)):
        raise ConfigError(f"{path}: vocabulary file not found")
    with tf.io.gfile.GFile(str(path), mode) as f:
        return f.read()


def train_sentencepiece(sentences: Iterable[str], model_path: str | Path, vocab_size: int,
                        max_sentences: int = 2_000_000, symbols: Sequence[str] = ()) -> Path:
    """Trains a unigram SentencePiece model on `sentences` and writes `model_path`.

    `symbols` (e.g. the tags of `data.corpora`) are pieces of their own, never split.

    Identity normalization, kept whitespace and byte fallback make the round trip exact (no
    NFKC rewriting, unseen characters become byte pieces instead of UNK). `vocab_size` is a soft
    limit: a small corpus may give fewer pieces. At most `max_sentences` (a random sample) are used.

    SentencePiece hands the model back as bytes, which Python writes: its own file writing
    says nothing when the disk fills during the model (a cut model file was left) and raises a
    RuntimeError without the errno during the `.vocab` copy, where Python's OSError keeps it.
    """
    model_path = Path(model_path)
    model_path.parent.mkdir(parents=True, exist_ok=True)
    model = io.BytesIO()
    try:
        _train_sentencepiece(sentences, model, vocab_size, max_sentences, symbols)
    except RuntimeError as error:
        if "Vocabulary size is smaller than required_chars" not in str(error):
            raise
        needed = re.search(r"(\d+) vs (\d+)", str(error))
        raise ConfigError(f"data.vocab_size={vocab_size} is too small for the characters of the "
                          f"training text (they alone take {needed[2] if needed else 'more'} "
                          "pieces); raise data.vocab_size") from error
    model_path.write_bytes(model.getvalue())
    return model_path


def _train_sentencepiece(sentences, model_writer: BinaryIO, vocab_size: int,
                         max_sentences: int, symbols: Sequence[str] = ()):
    """Trains the model and writes its bytes to `model_writer` (no file is written)."""
    sentencepiece.SentencePieceTrainer.train(
        user_defined_symbols=list(symbols),
        sentence_iterator=iter(sentences),
        model_writer=model_writer,
        model_type="unigram",
        vocab_size=vocab_size,
        hard_vocab_limit=False,
        pad_id=PAD_ID, bos_id=START_ID, eos_id=END_ID, unk_id=UNK_ID,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        byte_fallback=True,
        character_coverage=0.9999,
        input_sentence_size=max_sentences,
        shuffle_input_sentence=True,
        num_threads=2,
        minloglevel=2,
    )


def learn_wordpiece_vocab(sentences: tf.data.Dataset, vocab_path: str | Path, vocab_size: int,
                          lowercase: bool = False) -> Path:
    """Learns a WordPiece vocabulary from a dataset of scalar strings; writes one token a line.

    The reserved tokens come first, so their ids are PAD_ID, START_ID, END_ID, UNK_ID.
    """
    vocab = bert_vocab_from_dataset.bert_vocab_from_dataset(
        sentences.batch(1024).prefetch(2),
        vocab_size=vocab_size,
        reserved_tokens=WORDPIECE_RESERVED,
        bert_tokenizer_params={"lower_case": lowercase},
        learn_params={},
    )
    vocab_path = Path(vocab_path)
    vocab_path.parent.mkdir(parents=True, exist_ok=True)
    vocab_path.write_text("".join(token + "\n" for token in vocab), encoding="utf-8")
    return vocab_path


def _settings(data_config: DataConfig) -> dict:
    """What a vocabulary depends on; stored beside it so a changed config is not silently ignored."""
    if data_config.tokenizer == "sentencepiece" and data_config.lowercase:
        raise ConfigError("data.lowercase=True is for the wordpiece tokenizer; sentencepiece keeps "
                          "the text exactly (set data.tokenizer='wordpiece' or lowercase=False)")
    settings = {
        "tokenizer": data_config.tokenizer,
        "vocab_size": data_config.vocab_size,
        "lowercase": data_config.lowercase,
        "languages": sorted({data_config.source_lang, data_config.target_lang}),
        "dataset": data_config.dataset,
    }
    if corpus_tags(data_config):  # vocabularies made before corpora had tags have no such key
        settings["tags"] = corpus_tags(data_config)
    if data_config.placeholders:  # nor before placeholders
        settings["placeholders"] = True
    return settings


def corpus_tags(data_config: DataConfig) -> list[str]:
    """The tags of `data.corpora`, each once, in order: pieces of their own."""
    tags = [corpus.tag.strip() for corpus in data_config.corpora or () if corpus.tag]
    return list(dict.fromkeys(tags))


def build_tokenizers(data_config: DataConfig, train_pairs: tf.data.Dataset,
                     vocab_dir: str | Path) -> tuple[Tokenizer, Tokenizer]:
    """Learns vocabularies from (source, target) string pairs; writes them to `vocab_dir`.

    SentencePiece: one joint model from both sides (the two returned tokenizers are the same
    object). WordPiece: one vocabulary per language. Pass training pairs only, never test pairs.

    The files are written into a hidden sibling folder (`text_io.partial_path`) and moved into
    `vocab_dir` at the end: a failure (a vocabulary size the data cannot give, a full disk: a
    one-line OSError) leaves no file and no folder that was not there before, and what a
    build killed with -9 left beside it is removed first (`text_io.remove_dead_partials`).
    """
    settings = _settings(data_config)
    vocab_dir = Path(vocab_dir)
    created = [folder for folder in (vocab_dir, *vocab_dir.parents) if not folder.exists()]
    remove_dead_partials(vocab_dir.parent)
    partial = partial_path(vocab_dir)
    try:
        partial.mkdir(parents=True)
        if data_config.tokenizer == "sentencepiece":
            def both_sides():
                # Blocks of pairs: tf.data costs about as much per element as per block.
                for sources, targets in train_pairs.batch(1024).as_numpy_iterator():
                    for source, target in zip(sources, targets):
                        yield source.decode("utf-8")
                        yield target.decode("utf-8")
            train_sentencepiece(both_sides(), partial / SENTENCEPIECE_FILE,
                                data_config.vocab_size,
                                max_sentences=data_config.vocab_sample_sentences,
                                # with the word-start mark that SentencePiece puts before a
                                # word: "<BT> Ein" is "▁<BT>", "▁Ein", not "▁", "<BT>", ...
                                symbols=[WORD_BOUNDARY + tag for tag in corpus_tags(data_config)]
                                + (placeholders.pieces() if data_config.placeholders else []))
        else:
            for index, lang in enumerate(_wordpiece_langs(data_config)):
                side = train_pairs.map(lambda *pair, i=index: pair[i])
                learn_wordpiece_vocab(side, partial / f"wordpiece.{lang}.vocab",
                                      data_config.vocab_size, data_config.lowercase)
        (partial / META_FILE).write_text(json.dumps(settings, indent=2) + "\n")
        vocab_dir.mkdir(exist_ok=True)
        for path in sorted(partial.iterdir(), key=lambda p: p.name == META_FILE):
            os.replace(path, vocab_dir / path.name)  # META_FILE last: it marks a whole vocabulary
        partial.rmdir()
    except BaseException as error:
        shutil.rmtree(partial, ignore_errors=True)
        for folder in created:  # innermost first
            with contextlib.suppress(OSError):
                folder.rmdir()
        if isinstance(error, OSError) and errno_of(error):
            raise write_error(vocab_dir, error) from None
        raise
    logger.info("wrote %s vocabulary to %s", data_config.tokenizer, vocab_dir)
    return load_tokenizers(data_config, vocab_dir)


def vocabulary_checksum(vocab_dir: str | Path) -> str | None:
    """The SHA-256 of a vocabulary folder's files (names and contents, in name order; hidden
    files left out): which pieces a model's ids stand for. None if the folder holds no
    vocabulary (no `META_FILE`)."""
    vocab_dir = Path(vocab_dir)
    if not (vocab_dir / META_FILE).is_file():
        return None
    digest = hashlib.sha256()
    for path in sorted(vocab_dir.iterdir()):
        if path.is_file() and not path.name.startswith("."):
            digest.update(path.name.encode("utf-8") + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def training_tokenizers(data_config: DataConfig, source: Tokenizer,
                        target: Tokenizer) -> tuple[Tokenizer, Tokenizer]:
    """The tokenizers for training batches: with subword regularization on
    (`data.sp_nbest_size`), a sampling copy of the joint SentencePiece model for both sides;
    otherwise (source, target) unchanged."""
    if not data_config.subword_sampling:  # DataConfig allows sampling for sentencepiece only
        return source, target
    sampler = SentencePieceTokenizer(source.model_file.asset_path.numpy().decode("utf-8"),
                                     nbest_size=data_config.sp_nbest_size,
                                     alpha=data_config.sp_alpha)
    return sampler, sampler


def _wordpiece_langs(data_config: DataConfig) -> tuple[str, str]:
    return data_config.source_lang, data_config.target_lang


def load_tokenizers(data_config: DataConfig,
                    vocab_dir: str | Path) -> tuple[Tokenizer, Tokenizer]:
    """(source, target) tokenizers from the files `build_tokenizers` wrote to `vocab_dir`.

    Raises ConfigError if the files are missing or were built with other settings.
    """
    vocab_dir = Path(vocab_dir)
    meta_path = vocab_dir / META_FILE
    if not meta_path.is_file():
        raise ConfigError(f"no vocabulary in {vocab_dir} ({META_FILE} not found): "
                          "run `keras-transformer build-vocab --config ...` first")
    try:
        built = json.loads(meta_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:  # JSONDecodeError is a ValueError
        raise ConfigError(f"{meta_path}: not a JSON file ({error})") from None
    if not isinstance(built, dict):
        raise ConfigError(f"{meta_path}: expected a JSON object, found {type(built).__name__}")
    wanted = _settings(data_config)
    changed = {k: (built.get(k), v) for k, v in wanted.items() if built.get(k) != v}
    if changed:
        details = ", ".join(f"{k}: built with {b!r}, config has {w!r}" for k, (b, w) in changed.items())
        raise ConfigError(f"vocabulary in {vocab_dir} does not match data config ({details}); "
                          "rebuild it or point data.vocab_dir elsewhere")
    if data_config.tokenizer == "sentencepiece":
        joint = SentencePieceTokenizer(vocab_dir / SENTENCEPIECE_FILE)
        return joint, joint
    source, target = (WordPieceTokenizer(vocab_dir / f"wordpiece.{lang}.vocab", data_config.lowercase)
                      for lang in _wordpiece_langs(data_config))
    return source, target
