"""Configuration: one dataclass per stage, grouped in `ExperimentConfig`.

A run is described by an experiment YAML file (`experiments/NAME.yaml`) with the sections
`model`, `data`, `train` and `decode`. The `model` section may name a preset
(`experiments/presets/NAME.yaml`) whose values the section's other keys override:

    name: multi30k_de_en
    model: {preset: tutorial, dropout: 0.2}
    data: {dataset: multi30k, source_lang: de, target_lang: en}
    train: {epochs: 20}

A file may extend another with `base: PATH` (relative to the file; bases may have bases): the
sections are merged key by key and the file's own values win, so experiments that share a recipe
keep it in one place (`experiments/base/`).

Every path in a config file is read relative to the file that gives it, as `base:` is: a
`model.preset` that names a .yaml file, `data.data_dir`, `data.vocab_dir`, `data.tfds_data_dir`,
the `data.corpora` entries' `data_dir`, `source_file` and `target_file`, and `train.init_from`
(`PATH_KEYS`); an absolute path, or one from `~`, as it is. Overrides (`--set
section.key=value`) are in no file: relative to the working directory. `to_yaml` writes a path
relative to the file's folder when it lies inside it (it moves with the folder, as a run's
`vocab/` does) and absolute otherwise, so that the file reads back the same paths wherever it
is read from (a run folder's `config.yaml`: `runs.Run.config`).

Every value is checked when the config is built; errors name the field and the value.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Optional

import yaml

from keras_transformer.decoding.search_rules import STOPPING_RULES

# Presets live with the experiments, beside the package in a source checkout.
# `KERAS_TRANSFORMER_PRESETS` points elsewhere (e.g. for a non-editable install).
REPO_ROOT = Path(__file__).resolve().parent.parent
PRESETS_DIR = Path(os.environ.get("KERAS_TRANSFORMER_PRESETS", REPO_ROOT / "experiments" / "presets"))
DATA_ENV = "KERAS_TRANSFORMER_DATA"
# model.activation's values; each runtime says how it computes them
# (layers.feed_forward.ACTIVATION_FUNCTIONS, ctranslate2_export's CTranslate2 names).
ACTIVATIONS = ("relu", "gelu")
# PAD, START, END and UNK take the first ids of every vocabulary (tokenizers.py).
PAD_ID, START_ID, END_ID, UNK_ID = 0, 1, 2, 3
RESERVED_IDS = 4
# File names of what the package writes: the joint SentencePiece model (a run's vocabulary
# folder, a CTranslate2 export), and an export's record of where it came from and how it decodes
# (a SavedModel's assets.extra/, a CTranslate2 export's folder).
SENTENCEPIECE_FILE = "sentencepiece.model"
PROVENANCE_FILE = "keras_transformer.json"
# The key of that record holding the SHA-256 of each vocabulary file the export was made with
# ({file name: hex}: a SavedModel's assets/, a CTranslate2 export's SentencePiece model and
# vocabulary), which loading checks: another vocabulary of the same size fits the model's
# shapes and turns every translation into other words.
VOCABULARY_CHECKSUMS = "vocabulary_sha256"
SECTIONS = ("model", "data", "train", "decode")
# `keras-transformer export --format`: a SavedModel (TF Serving), or a CTranslate2 model folder.
SAVEDMODEL_FORMAT, CTRANSLATE2_FORMAT = EXPORT_FORMATS = ("savedmodel", "ctranslate2")


class ConfigError(ValueError):
    """A config value or key is invalid; the message names the field and the value."""


def _check_choice(field: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise ConfigError(f"{field}={value!r} is not one of {', '.join(map(repr, choices))}")


def _check_positive(field: str, value: Any) -> None:
    if not value > 0:
        raise ConfigError(f"{field}={value!r} must be positive")


def _check_at_least(field: str, value: Any, minimum: int, why: str = "") -> None:
    if not value >= minimum:
        raise ConfigError(f"{field}={value!r} must be >= {minimum}{why}")


def _check_probability(field: str, value: Any) -> None:
    if not 0.0 <= value < 1.0:
        raise ConfigError(f"{field}={value!r} must be in [0, 1)")


@dataclasses.dataclass
class ModelConfig:
    """Hyperparameters of the Transformer (Vaswani et al., 2017, section 3 and table 3)."""

    num_layers: int = 4  # N: layers in the encoder stack, and in the decoder's by default
    # Layers in the decoder stack; None: num_layers. A deep encoder with a shallow decoder (6-1)
    # keeps BLEU and decodes several times faster (Kasai et al. 2021, "Deep Encoder, Shallow
    # Decoder").
    num_decoder_layers: Optional[int] = None
    d_model: int = 128  # width of embeddings and of every sublayer output
    num_heads: int = 8  # h: attention heads; each has d_model // num_heads dimensions
    dff: int = 512  # inner width of the position-wise feed-forward network
    activation: str = "relu"  # the feed-forward network's: "relu" (the paper) | "gelu"
    dropout: float = 0.1  # P_drop: on sublayer outputs and on embeddings + positions
    norm: str = "post"  # "post": LayerNorm(x + Sublayer(x)) as in the paper; "pre": x + Sublayer(LayerNorm(x))
    share_embeddings: str = "none"  # "none" | "target" (decoder embedding = output projection) | "all" (joint vocab)
    source_vocab_size: int = 8000
    target_vocab_size: int = 8000
    max_positions: int = 256  # positions the positional encoding covers: the longest sequence

    def __post_init__(self):
        for name in ("num_layers", "d_model", "num_heads", "dff", "max_positions"):
            _check_positive(f"model.{name}", getattr(self, name))
        for name in ("source_vocab_size", "target_vocab_size"):
            _check_at_least(f"model.{name}", getattr(self, name), RESERVED_IDS + 1,
                            f" (ids 0-{RESERVED_IDS - 1} are reserved for PAD, START, END, UNK)")
        if self.num_decoder_layers is not None:
            _check_positive("model.num_decoder_layers", self.num_decoder_layers)
        _check_choice("model.activation", self.activation, ACTIVATIONS)
        if self.d_model % self.num_heads:
            raise ConfigError(
                f"model.d_model={self.d_model} is not divisible by model.num_heads={self.num_heads}")
        _check_probability("model.dropout", self.dropout)
        _check_choice("model.norm", self.norm, ("post", "pre"))
        _check_choice("model.share_embeddings", self.share_embeddings, ("none", "target", "all"))
        if self.share_embeddings == "all" and self.source_vocab_size != self.target_vocab_size:
            raise ConfigError(
                "model.share_embeddings='all' needs one joint vocabulary, but "
                f"model.source_vocab_size={self.source_vocab_size} != "
                f"model.target_vocab_size={self.target_vocab_size}")

    @property
    def decoder_layers(self) -> int:
        """The number of layers in the decoder stack (`num_decoder_layers`, or `num_layers` if
        unset)."""
        return self.num_layers if self.num_decoder_layers is None else self.num_decoder_layers

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "ModelConfig":
        """Reads `experiments/presets/{name}.yaml` (or a YAML file path) and applies overrides."""
        values = load_preset(name)
        values.update(overrides)
        return from_dict(cls, values, "model")


# data.corpora[].dataset values besides tfds names: keras_transformer.data loads each.
LOCAL_CORPORA = ("multi30k", "files", "file_pair")


@dataclasses.dataclass
class CorpusConfig:
    """One training corpus of several (`data.corpora`), drawn from in proportion to `weight`.

    Marian's and OpenNMT-tf's weighted corpora; `tag` marks a corpus's sources, as tagged
    back-translation marks synthetic ones (Caswell et al. 2019, arXiv:1906.06442).
    """

    # "multi30k", "files" ({data_dir}/{train_split}.{lang}[.gz]), "file_pair" (source_file and
    # target_file, e.g. what `translate --output` wrote and the text it translated), or a tfds
    # translation dataset's name
    dataset: str = "files"
    weight: float = 1.0  # share of the training batches: weight / the sum of the weights
    tag: Optional[str] = None  # a token put before every source (sentencepiece: one piece)
    data_dir: Optional[str] = None  # multi30k, files: default data.data_dir
    train_split: Optional[str] = None  # multi30k, files, tfds: default data.train_split
    source_file: Optional[str] = None  # file_pair: source-language lines (plain or .gz)
    target_file: Optional[str] = None  # file_pair: line-aligned target-language lines

    def __post_init__(self):
        if not (self.weight > 0 and math.isfinite(self.weight)):
            raise ConfigError(f"weight={self.weight!r} must be a positive number")
        is_pair = self.dataset == "file_pair"
        if is_pair != (self.source_file is not None and self.target_file is not None):
            raise ConfigError("source_file and target_file are for dataset file_pair, which "
                              "needs both" if is_pair or self.source_file or self.target_file
                              else "source_file and target_file are for dataset file_pair")
        if self.tag is not None and (not self.tag.strip() or " " in self.tag.strip()):
            raise ConfigError(f"tag={self.tag!r} must be one word, e.g. <BT>")


@dataclasses.dataclass
class ModifiersConfig:
    """Robustness modifiers (`data.modifiers`, keras_transformer.data.modifiers): the share of
    training pairs each changes, drawn anew every pass; 0 turns one off. OpusTrainer's
    modifiers (the Firefox Translations pipeline) and Marian's --all-caps-every. Validation,
    decoding and the export never modify."""

    upper_case: float = 0.0  # the source in capitals
    title_case: float = 0.0  # the source with every word capitalized
    typos: float = 0.0  # the source with a typo in about one word in six
    copy_spans: float = 0.0  # a number, name, URL or emoji inserted into both sides
    # upper_case and title_case change the target too, so that outputs keep the input's case
    # (OpusTrainer's and Marian's way; the model then learns capitals as a second target
    # language, slowly: keras_transformer.data.modifiers)
    case_target: bool = False

    def __post_init__(self):
        for name in MODIFIER_NAMES:
            share = getattr(self, name)
            if not 0.0 <= share <= 1.0:
                raise ConfigError(f"data.modifiers.{name}={share!r} must be a share of the "
                                  "training pairs, in [0, 1]")

    @property
    def active(self) -> bool:
        """Whether any modifier changes pairs."""
        return any(getattr(self, name) > 0 for name in MODIFIER_NAMES)

    def shares(self) -> dict:
        """{modifier name: share} of the modifiers that are on (`case_target` aside)."""
        return {name: getattr(self, name) for name in MODIFIER_NAMES if getattr(self, name) > 0}


MODIFIER_NAMES = ("upper_case", "title_case", "typos", "copy_spans")


@dataclasses.dataclass
class DataConfig:
    """Where the text pairs come from, how they are tokenized and batched."""

    dataset: str = "multi30k"  # "multi30k", "files" (local {split}.{lang}[.gz]), or a tfds name
    source_lang: str = "de"
    target_lang: str = "en"
    data_dir: Optional[str] = None  # local raw files; defaults to $KERAS_TRANSFORMER_DATA
    train_split: str = "train"
    validation_split: str = "validation"
    test_split: str = "test_2016_flickr"
    tokenizer: str = "sentencepiece"  # "sentencepiece" (joint vocabulary) | "wordpiece"
    vocab_size: int = 8000  # target size of each vocabulary (the joint one for sentencepiece)
    # SentencePiece learns from a uniform random sample of at most this many sentences (both
    # sides counted) of the training split, which bounds build-vocab's memory; every sentence is
    # still read once. Not recorded with the vocabulary: another sample size reuses it.
    vocab_sample_sentences: int = 2_000_000
    lowercase: bool = False  # the tutorial lowercases; the paper and sacreBLEU's default do not
    vocab_dir: Optional[str] = None  # where vocabulary files are written/read; default {run}/vocab
    max_pair_length: int = 128  # longest source or target kept, in tokens with START/END
    tokens_per_batch: int = 4096  # padded source (and target) tokens in one global batch
    bucket_step: int = 8  # batches are padded to a multiple of this length
    # Training pairs shuffled together each pass. Larger than most corpora, so that a pass is a
    # uniform shuffle whatever the file's order (a file sorted by length, as Tatoeba's is,
    # would otherwise give batches from short to long); a smaller buffer mixes only
    # neighbours, and holds less in memory (with data.cache off, for corpora beyond RAM).
    shuffle_buffer: int = 1_000_000
    # Training: the pairs of a length bucket that do not fill a batch at the end of a pass wait
    # for the next pass, so that every training batch is full (one shape per bucket); false:
    # each bucket ends its pass with a smaller batch. Runs saved without this key had false.
    carry_remainders: bool = True
    # Subword regularization (Kudo 2018), sentencepiece only: every epoch samples a new
    # segmentation of each training sentence, both sides. sp_nbest_size 0 (or 1): off, the one
    # best segmentation; -1: sample from all segmentations; n > 1: from the n best. sp_alpha:
    # the smoothing, larger is closer to the best segmentation. OpenNMT-tf's names; validation,
    # decoding and the export never sample.
    sp_nbest_size: int = 0
    sp_alpha: float = 0.1
    cache: bool = True  # keep tokenized training pairs in memory; turn off for corpora beyond RAM
    tfds_data_dir: Optional[str] = None  # where tfds prepares datasets; None: ~/tensorflow_datasets
    # Several training corpora (a list of `CorpusConfig`: dataset, weight, tag, ...), drawn from
    # in proportion to their weights, instead of `dataset`'s train split; `dataset` still gives
    # the validation and test splits and the vocabulary's text. None: `dataset` alone.
    corpora: Optional[list[CorpusConfig]] = None
    # Upper case, title case, typos and copied spans in a share of the training pairs
    # (`ModifiersConfig`); all 0 (off) by default.
    modifiers: ModifiersConfig = dataclasses.field(default_factory=ModifiersConfig)
    # Numbers, web addresses and emoji carried through translation by placeholder pieces
    # (keras_transformer.data.placeholders): the vocabulary gets <ph0>...<ph7>, training masks the
    # spans both sides of a pair have, translation masks the source's and puts them back.
    # sentencepiece only; a vocabulary built without them cannot be used with them.
    placeholders: bool = False
    # A source in capitals or title case is lowercased before tokenizing, in training (after
    # the modifiers) and translation, and its translation put back into that case
    # (keras_transformer.data.casing).
    case_folding: bool = False

    def __post_init__(self):
        _check_choice("data.tokenizer", self.tokenizer, ("sentencepiece", "wordpiece"))
        if self.placeholders and self.tokenizer != "sentencepiece":
            raise ConfigError("data.placeholders needs data.tokenizer sentencepiece (a "
                              f"placeholder is a piece of its own), not {self.tokenizer!r}")
        for name in ("tokens_per_batch", "bucket_step", "shuffle_buffer"):
            _check_positive(f"data.{name}", getattr(self, name))
        _check_at_least("data.vocab_size", self.vocab_size, RESERVED_IDS + 1,
                        f" (ids 0-{RESERVED_IDS - 1} are reserved for PAD, START, END, UNK)")
        _check_at_least("data.vocab_sample_sentences", self.vocab_sample_sentences, 101,
                        " (SentencePiece samples more than 100 sentences)")
        _check_at_least("data.max_pair_length", self.max_pair_length, 3,
                        " (START, one token, END)")
        _check_at_least("data.sp_nbest_size", self.sp_nbest_size, -1,
                        " (-1: all segmentations, 0 or 1: the best, n: the n best)")
        if not self.sp_alpha >= 0:
            raise ConfigError(f"data.sp_alpha={self.sp_alpha!r} must be >= 0")
        if self.subword_sampling:
            if self.tokenizer != "sentencepiece":
                raise ConfigError(f"data.sp_nbest_size={self.sp_nbest_size} samples SentencePiece "
                                  f"segmentations, but data.tokenizer={self.tokenizer!r}")
            if not self.sp_alpha > 0:
                raise ConfigError(f"data.sp_alpha={self.sp_alpha} must be > 0 when "
                                  f"data.sp_nbest_size={self.sp_nbest_size} (sampling is on)")
        if self.corpora is not None:
            if not self.corpora:
                raise ConfigError("data.corpora is empty: list at least one corpus, or remove it")
            tags = [corpus.tag for corpus in self.corpora if corpus.tag]
            if tags and self.tokenizer != "sentencepiece":
                raise ConfigError(f"data.corpora tags {tags} need data.tokenizer sentencepiece "
                                  "(a tag is a piece of its own)")
        if self.tokens_per_batch < self.max_pair_length:
            raise ConfigError(
                f"data.tokens_per_batch={self.tokens_per_batch} is smaller than "
                f"data.max_pair_length={self.max_pair_length}: the longest pair would not fit in a batch")

    @property
    def subword_sampling(self) -> bool:
        """Whether training batches sample segmentations (`sp_nbest_size` other than 0 and 1)."""
        return self.sp_nbest_size not in (0, 1)

    def resolved_data_dir(self) -> Path:
        """The local data folder: `data_dir`, else $KERAS_TRANSFORMER_DATA (an error if neither,
        or if it is not a folder)."""
        path = self.data_dir or os.environ.get(DATA_ENV)
        if not path:
            raise ConfigError(
                f"no local data folder: set data.data_dir or the {DATA_ENV} environment variable "
                "to a folder holding {split}.{lang}.gz files (e.g. ../shared/data/multi30k)")
        folder = Path(path).expanduser()
        if not folder.is_dir():
            setting = f"data.data_dir={self.data_dir}" if self.data_dir else f"{DATA_ENV}={path}"
            raise ConfigError(f"{setting}: no such folder")
        return folder


@dataclasses.dataclass
class TrainConfig:
    """Optimization and the training runner (section 5 of the paper)."""

    epochs: int = 10
    steps_per_epoch: Optional[int] = None  # None: one pass over the training data
    # Minutes of training (wall clock from the start of fit, validation included, a resumed
    # run's sessions summed) after which the run stops and is finished, mid-epoch if need be
    # (that epoch is validated and saved like the others); epochs stays an upper bound. With
    # decay "linear" the rate reaches 0 at the budget's end, on any machine. Not with several
    # workers (their clocks differ). None: no budget
    budget_minutes: Optional[float] = None
    warmup_steps: int = 4000  # steps of the rate's linear rise to its peak (equation 3)
    learning_rate_scale: float = 1.0  # multiplies the paper's schedule
    # After the warmup: "inverse_sqrt" (the paper's equation 3) | "linear" (from the same peak
    # to 0 at the last step, epochs x steps_per_epoch, which needs steps_per_epoch; with
    # budget_minutes, to 0 at the budget's end)
    decay: str = "inverse_sqrt"
    adam_beta_1: float = 0.9
    adam_beta_2: float = 0.98
    adam_epsilon: float = 1e-9
    label_smoothing: float = 0.1
    # R-Drop (Liang et al., 2021): each batch runs twice, + alpha x the two passes' symmetric KL
    # (`Transformer.compile`); 0 turns it off. Steps cost more: RESULTS.md, "Time to quality".
    rdrop_alpha: float = 0.0
    accumulate_steps: int = 1  # batches summed into each optimizer update (any strategy)
    strategy: str = "auto"  # auto | mirrored | multi_worker | one_device | tpu
    precision: str = "float32"  # float32 | mixed_bfloat16 | mixed_float16 | auto (per machine)
    jit_compile: bool = False
    validation_bleu_sentences: int = 200  # greedy-decoded each epoch for BLEU; 0 disables
    early_stopping_patience: Optional[int] = None  # epochs without BLEU improvement
    log_every_steps: int = 50  # TensorBoard loss, learning rate, tokens/s every N steps; 0 disables
    # "START,STOP": the TensorFlow profiler traces these batches (from 1) of the training
    # command's fit, for TensorBoard's Profile tab (logs/train/plugins/profile); None: none
    profile_batches: Optional[str] = None
    seed: int = 1234
    # Fine-tuning: start from the weights of this run folder (its best) or weight file, with a
    # fresh optimizer and schedule; keras_transformer.training.fine_tuning. None: from scratch
    init_from: Optional[str] = None

    def __post_init__(self):
        for name in ("epochs", "warmup_steps", "accumulate_steps"):
            _check_positive(f"train.{name}", getattr(self, name))
        if self.steps_per_epoch is not None:
            _check_positive("train.steps_per_epoch", self.steps_per_epoch)
        if self.log_every_steps < 0:
            raise ConfigError(f"train.log_every_steps={self.log_every_steps!r} must be >= 0")
        if self.profile_batches is not None:
            self.profile_range()
        _check_probability("train.label_smoothing", self.label_smoothing)
        _check_at_least("train.rdrop_alpha", self.rdrop_alpha, 0)
        if self.rdrop_alpha and self.accumulate_steps > 1:
            raise ConfigError(f"train.rdrop_alpha={self.rdrop_alpha} runs each batch twice and "
                              f"does not combine with train.accumulate_steps="
                              f"{self.accumulate_steps}: use a smaller data.tokens_per_batch")
        _check_positive("train.learning_rate_scale", self.learning_rate_scale)
        _check_choice("train.decay", self.decay, ("inverse_sqrt", "linear"))
        if self.budget_minutes is not None and not (
                self.budget_minutes > 0 and math.isfinite(self.budget_minutes)):
            raise ConfigError(f"train.budget_minutes={self.budget_minutes!r} must be a positive "
                              f"number of minutes (or null for no budget)")
        if self.decay == "linear" and self.budget_minutes is None:
            if self.steps_per_epoch is None:
                raise ConfigError("train.decay=linear decays to 0 at the last step: set "
                                  "train.steps_per_epoch so that the run's length is known")
            if self.epochs * self.steps_per_epoch <= self.warmup_steps:
                raise ConfigError(
                    f"train.decay=linear: train.epochs x train.steps_per_epoch = "
                    f"{self.epochs * self.steps_per_epoch} steps must exceed "
                    f"train.warmup_steps={self.warmup_steps}")
        _check_probability("train.adam_beta_1", self.adam_beta_1)
        _check_probability("train.adam_beta_2", self.adam_beta_2)
        _check_positive("train.adam_epsilon", self.adam_epsilon)
        _check_at_least("train.validation_bleu_sentences", self.validation_bleu_sentences, 0)
        if self.early_stopping_patience is not None:
            _check_at_least("train.early_stopping_patience", self.early_stopping_patience, 1)
            if not self.validation_bleu_sentences:
                raise ConfigError(
                    f"train.early_stopping_patience={self.early_stopping_patience} watches "
                    "validation BLEU, but train.validation_bleu_sentences=0 turns it off")
        if not 0 <= self.seed < 2 ** 32:
            raise ConfigError(f"train.seed={self.seed!r} must be in [0, 2**32)")
        _check_choice("train.strategy", self.strategy,
                      ("auto", "mirrored", "multi_worker", "one_device", "tpu"))
        _check_choice("train.precision", self.precision,
                      ("float32", "mixed_bfloat16", "mixed_float16", "auto"))


    def profile_range(self) -> tuple[int, int] | None:
        """`profile_batches` as (start, stop), or None; ConfigError unless 1 <= start <= stop."""
        if self.profile_batches is None:
            return None
        try:
            start, stop = (int(part) for part in str(self.profile_batches).split(","))
        except ValueError:
            start = stop = 0
        if not 1 <= start <= stop:
            raise ConfigError(f"train.profile_batches={self.profile_batches!r} must be "
                              "\"START,STOP\", two batch numbers with 1 <= START <= STOP")
        return start, stop


# decode.stopping's values: search_rules.STOPPING_RULES, which says what each does.
STOPPING_CHOICES = tuple(STOPPING_RULES)


@dataclasses.dataclass
class DecodeConfig:
    """Search used for translation (section 6.1: beam 4, length penalty alpha 0.6)."""

    beam_size: int = 4
    alpha: float = 0.6  # GNMT length penalty ((5 + len) / 6) ** alpha; 0 disables it
    max_extra_length: int = 50  # output may be at most source length + this (capped by the model)
    # When beam search stops a sentence: "exact" (no alive hypothesis can beat the worst of
    # `beam_size` finished ones) or "beam_full" (once `patience * beam_size` hypotheses have
    # finished; patience 1 is what fairseq and CTranslate2 do by default); see
    # keras_transformer.decoding.strategies.beam_search. Patience 2 scored "exact"'s validation BLEU or
    # above it, in half its time at alpha 1.4; experiments/RESULTS.md "Decoding speed".
    stopping: str = "beam_full"
    patience: float = 2.0  # "beam_full" only
    # Random sampling (`translate_sampling`, back-translation): the next token is drawn from
    # the `sampling_topk` most probable (0: all), then from the smallest set of those whose
    # probability reaches `sampling_topp` (1: no cut), at `sampling_temperature`.
    sampling_topk: int = 0
    sampling_topp: float = 1.0
    sampling_temperature: float = 1.0
    # Word alignments (`align`, `translate --alignments`): the cross-attention of this decoder
    # layer (negative: from the last), averaged over the heads.
    alignment_layer: int = -1
    # Guards against loops (every search, the SavedModel's and the CTranslate2 runtime's, whose
    # options of the same names these are; never `score` or `align`): no n-gram of this many
    # tokens appears twice in an output (0: off; fairseq's --no-repeat-ngram-size), and the
    # logit of every token already in the output is divided by this penalty where positive,
    # multiplied where negative (1: off; Keskar et al. 2019, arXiv:1909.05858).
    no_repeat_ngram_size: int = 0
    repetition_penalty: float = 1.0

    def __post_init__(self):
        _check_positive("decode.beam_size", self.beam_size)
        if not (isinstance(self.no_repeat_ngram_size, int)
                and not isinstance(self.no_repeat_ngram_size, bool)
                and self.no_repeat_ngram_size >= 0):
            raise ConfigError(f"decode.no_repeat_ngram_size={self.no_repeat_ngram_size!r} must "
                              "be an integer >= 0 (0: off)")
        if not (self.repetition_penalty > 0 and math.isfinite(self.repetition_penalty)):
            raise ConfigError(f"decode.repetition_penalty={self.repetition_penalty!r} must be "
                              "a finite number > 0 (1: off, above 1 penalizes repeats)")
        if not isinstance(self.alignment_layer, int) or isinstance(self.alignment_layer, bool):
            raise ConfigError(f"decode.alignment_layer={self.alignment_layer!r} must be an "
                              "integer (a decoder layer; negative: counted from the last)")
        if not (isinstance(self.sampling_topk, int) and self.sampling_topk >= 0):
            raise ConfigError(f"decode.sampling_topk={self.sampling_topk!r} must be an integer "
                              ">= 0 (0: every token)")
        if not 0 < self.sampling_topp <= 1:
            raise ConfigError(f"decode.sampling_topp={self.sampling_topp!r} must be in (0, 1]")
        if not (self.sampling_temperature > 0 and math.isfinite(self.sampling_temperature)):
            raise ConfigError(f"decode.sampling_temperature={self.sampling_temperature!r} must "
                              "be a finite number > 0")
        _check_choice("decode.stopping", self.stopping, STOPPING_CHOICES)
        if not self.patience >= 1:
            raise ConfigError(f"decode.patience={self.patience!r} must be >= 1")
        if not (self.alpha >= 0 and math.isfinite(self.alpha)):
            raise ConfigError(f"decode.alpha={self.alpha!r} must be a finite number >= 0")
        _check_positive("decode.max_extra_length", self.max_extra_length)


@dataclasses.dataclass
class ExperimentConfig:
    """Everything a run needs; saved as `config.yaml` next to its checkpoints."""

    name: str = "experiment"
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    decode: DecodeConfig = dataclasses.field(default_factory=DecodeConfig)

    @classmethod
    def from_dict(cls, values: dict) -> "ExperimentConfig":
        values = dict(values)
        _check_sections(values)
        model = dict(values.get("model") or {})
        if "preset" in model:
            preset = load_preset(model.pop("preset"))
            preset.update(model)
            model = preset
        values["model"] = model
        return from_dict(cls, values, "")

    @classmethod
    def from_yaml(cls, path: str | os.PathLike, overrides: list[str] = ()) -> "ExperimentConfig":
        """Loads an experiment file and its `base:` chain; `overrides` are `section.key=value`
        strings (YAML values), applied last."""
        path = Path(path)
        values = load_yaml_with_bases(path)
        try:
            _check_sections(values)
        except ConfigError as error:
            raise ConfigError(f"{path}: {error}") from None
        for override in overrides:
            apply_override(values, override)
        return cls.from_dict(values)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_yaml(self, path: str | os.PathLike) -> None:
        """Writes the config to `path`, its paths as that file reads them back (relative to its
        folder inside it, absolute elsewhere: the module docstring)."""
        path = Path(path)
        values = map_paths(self.to_dict(), lambda name, value: _path_for(path, value))
        path.write_text(yaml.safe_dump(values, sort_keys=False))


def load_yaml_with_bases(path: str | os.PathLike, _named_by: tuple[Path, ...] = ()) -> dict:
    """The values of a config file with those of its `base:` file (a path relative to it, whose
    own base is resolved the same way) merged in: section by section, key by key, the file's
    values winning. A missing base or a cycle of bases is a ConfigError naming the files."""
    path = Path(path)
    if not path.is_file():
        if _named_by:
            raise ConfigError(f"{_named_by[-1]}: base file not found: {path} (a base: path is "
                              f"read relative to the folder of the file that names it)")
        raise ConfigError(f"config file not found: {path}")
    values = read_yaml(path)
    if values is None:
        raise ConfigError(f"{path} is empty: an experiment file sets at least one of the "
                          f"sections {', '.join(SECTIONS)} (see experiments/*.yaml)")
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: expected a mapping of sections, got {type(values).__name__}")
    values = map_paths(values, lambda name, value: _beside(path, value))
    base = values.pop("base", None)
    if base is None:
        return values
    if not isinstance(base, str):
        raise ConfigError(f"{path}: base={base!r} must be a path to a YAML file")
    chain = (*_named_by, path)
    base_path = path.parent / base
    if base_path.is_file() and any(base_path.samefile(p) for p in chain):
        cycle = " -> ".join(str(p) for p in (*chain, base_path))
        raise ConfigError(f"{path}: base {base!r} makes a cycle: {cycle}")
    return merge_sections(load_yaml_with_bases(base_path, chain), values)


# The keys of a config that name files or folders, by section (a corpus's in `data.corpora`),
# each read relative to the file that gives it; `model.preset` too when it names a .yaml file.
PATH_KEYS = {"data": ("data_dir", "vocab_dir", "tfds_data_dir"), "train": ("init_from",)}
CORPUS_PATH_KEYS = ("data_dir", "source_file", "target_file")
PRESET_SUFFIXES = (".yaml", ".yml")


def map_paths(values: dict, function) -> dict:
    """A copy of a config's `values` (sections of keys, as a file holds them) with each path
    they give (`PATH_KEYS`, a non-empty string) replaced by `function(name, path)`, `name` as
    errors spell it (`data.corpora[1].source_file`). Values of other types are left for the
    checks to name."""
    def mapped(name: str, value: Any) -> Any:
        return function(name, value) if isinstance(value, str) and value else value

    values = dict(values)
    for section, keys in (("model", ("preset",)), *PATH_KEYS.items()):
        if not isinstance(values.get(section), dict):
            continue
        entries = dict(values[section])
        for key in keys:
            if key in entries and not (key == "preset" and not str(entries[key]).endswith(
                    PRESET_SUFFIXES)):
                entries[key] = mapped(f"{section}.{key}", entries[key])
        if section == "data" and isinstance(entries.get("corpora"), list):
            entries["corpora"] = [
                {key: mapped(f"data.corpora[{index}].{key}", value)
                 if key in CORPUS_PATH_KEYS else value for key, value in corpus.items()}
                if isinstance(corpus, dict) else corpus
                for index, corpus in enumerate(entries["corpora"])]
        values[section] = entries
    return values


def _from_home(path: str) -> bool:
    return path.startswith("~")


def _beside(config_file: Path, path: str) -> str:
    """`path` as the config file that gives it means it: relative to the file's folder (an
    absolute path, or one from `~`, as it is)."""
    return path if os.path.isabs(path) or _from_home(path) else str(config_file.parent / path)


def _path_for(config_file: Path, path: str) -> str:
    """`path` (relative to the working directory, or absolute) as `config_file` gives it:
    relative to the file's folder if it lies inside it, else absolute (one from `~` as it
    is)."""
    if _from_home(path):
        return path
    absolute = os.path.abspath(path)
    folder = os.path.abspath(config_file.parent)
    if os.path.commonpath([absolute, folder]) == folder:
        return os.path.relpath(absolute, folder)
    return absolute


def merge_sections(base: dict, values: dict) -> dict:
    """`base` updated by `values`, recursively for mappings (a section that `values` leaves
    empty keeps the base's keys); neither input is changed."""
    merged = dict(base)
    for key, value in values.items():
        if isinstance(merged.get(key), dict) and (value is None or isinstance(value, dict)):
            merged[key] = merge_sections(merged[key], value or {})
        else:
            merged[key] = value
    return merged


def _check_sections(values: dict) -> None:
    """Each section of an experiment is a mapping (or empty)."""
    for section in SECTIONS:
        value = values.get(section)
        if value is not None and not isinstance(value, dict):
            raise ConfigError(f"section {section!r} must be a mapping of keys (e.g. "
                              f"'{section}: {{key: value}}'), got {value!r}")


def read_yaml(path: Path) -> Any:
    """The YAML document of a file (None if it is empty); ConfigError naming the file, and the
    line, for text that is not UTF-8 or not YAML."""
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 text (byte {error.start})") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}{_yaml_error(error)}") from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load's loader, but a key given twice in one mapping is an error (PyYAML keeps
    the last one silently, so the first would be a setting that never applies)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _yaml_error(error: yaml.YAMLError) -> str:
    """', line N: invalid YAML (problem)', one line."""
    mark = getattr(error, "problem_mark", None)
    where = f", line {mark.line + 1}" if mark is not None else ""
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    return f"{where}: invalid YAML ({problem})"


def load_preset(name: str) -> dict:
    """The values of a model preset, by name (`experiments/presets/NAME.yaml`) or YAML path."""
    name = str(name)
    path = Path(name) if name.endswith((".yaml", ".yml")) else PRESETS_DIR / f"{name}.yaml"
    if not name.endswith((".yaml", ".yml")) and (Path(name).name != name or name.startswith(".")):
        # "../demo" names experiments/demo.yaml, an experiment, not a preset
        raise ConfigError(f"unknown model preset {name!r}: a preset is a name, one of "
                          f"{preset_names()}, or a .yaml file's path")
    if not path.is_file():
        raise ConfigError(f"unknown model preset {name!r} ({path} not found); known: "
                          f"{preset_names()}")
    values = read_yaml(path) or {}
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: a model preset is a mapping of model keys, got {values!r}")
    return values


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def apply_override(values: dict, override: str) -> None:
    """Applies `section.key=value` (value parsed as YAML) to a nested dict, in place."""
    if "=" not in override:
        raise ConfigError(f"override {override!r} is not of the form section.key=value")
    dotted, raw = override.split("=", 1)
    *sections, key = dotted.strip().split(".")
    node = values
    for section in sections:
        if node.get(section) is None:  # absent, or an empty section (`train:` alone)
            node[section] = {}
        node = node[section]
        if not isinstance(node, dict):
            raise ConfigError(f"override {override!r}: {section!r} is not a section")
    try:
        node[key] = yaml.safe_load(raw)
    except yaml.YAMLError as error:
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError(f"override {override!r}: the value is not valid YAML "
                          f"({problem})") from None


def _type_ok(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is list:
        return isinstance(value, list)
    return isinstance(value, hint)


# Keys renamed since runs were first saved: a run's config.yaml with the old key still loads.
RENAMED_KEYS = {"model.max_length": "max_positions", "data.max_length": "max_pair_length"}


def from_dict(cls, values: dict, prefix: str):
    """Builds dataclass `cls` from a dict, rejecting unknown keys and values of the wrong type."""
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {values!r}")
    values = _renamed(values, prefix)
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        name = f"{prefix}.{key}" if prefix else key
        if key not in fields:
            raise ConfigError(f"unknown config key {name!r}; known keys: {sorted(fields)}")
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            kwargs[key] = from_dict(hint, value or {}, name)
            continue
        item = _list_item_dataclass(hint)
        if item is not None and value is not None:
            if not isinstance(value, list):
                raise ConfigError(f"{name}={value!r} has the wrong type: expected a list of "
                                  "mappings")
            kwargs[key] = [_item_from_dict(item, entry, f"{name}[{index}]")
                           for index, entry in enumerate(value)]
            continue
        if isinstance(value, str) and (hint is float or float in typing.get_args(hint)):
            value = _yaml_float(value)
        if not _type_ok(value, hint):
            raise ConfigError(f"{name}={value!r} has the wrong type: expected {_type_name(hint)}")
        if hint is float or float in typing.get_args(hint):
            value = float(value) if value is not None else None
        kwargs[key] = value
    # The fields' own checks first: their messages state each field's rule (nan is refused as
    # "must be in (0, 1]", not only as not finite); then any non-finite number they let pass.
    built = cls(**kwargs)
    for key, value in kwargs.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{prefix + '.' if prefix else ''}{key}={value!r} must be a finite "
                              "number")
    return built


def _yaml_float(text: str) -> Any:
    """A number that YAML 1.1 (PyYAML) reads as a string, such as 1e-9 (no dot): as a float;
    any other text unchanged (then refused for its type)."""
    if re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+", text.strip()):
        return float(text)
    return text


def _list_item_dataclass(hint: Any):
    """The dataclass `X` of a `list[X]` or `Optional[list[X]]` hint, else None."""
    for candidate in (hint, *typing.get_args(hint)):
        if typing.get_origin(candidate) is list:
            (item,) = typing.get_args(candidate)
            return item if dataclasses.is_dataclass(item) else None
    return None


def _item_from_dict(cls, values: Any, name: str):
    """`from_dict` of one list entry, its own checks' errors prefixed with its name."""
    try:
        return from_dict(cls, values, name)
    except ConfigError as error:
        message = str(error)
        raise ConfigError(message if message.startswith(name) or name in message
                          else f"{name}: {message}") from None


def _renamed(values: dict, prefix: str) -> dict:
    """`values` with the old names of `RENAMED_KEYS` replaced by the new ones."""
    values = dict(values)
    for key in list(values):
        new = RENAMED_KEYS.get(f"{prefix}.{key}")
        if new is None:
            continue
        if new in values:
            raise ConfigError(f"{prefix}.{key} is the old name of {prefix}.{new}; give only "
                              f"{prefix}.{new}")
        values[new] = values.pop(key)
    return values


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) is list:
        return f"list of {_type_name(typing.get_args(hint)[0])}"
    args = typing.get_args(hint)
    if args:
        return " or ".join(_type_name(a) for a in args)
    return "null" if hint is type(None) else hint.__name__
