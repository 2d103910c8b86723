"""Length-bucketed token batches of text pairs: `make_batches` (validation, evaluation) and the
training streams (`TrainingStream`, `MixtureStream`, `training_stream`), with the modifiers and
placeholders applied per pass.

A pair whose source or target, in tokens including START and END, is longer than
`max_pair_length` is dropped (reason "too_long"), never truncated (truncating would lose END);
`corpora.pair_stats` counts the drops. Every dataset returned here runs without tf.data
autotuning (`compat.without_autotuning`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math

import numpy as np
import tensorflow as tf

from keras_transformer.compat import without_autotuning
from keras_transformer.config import ConfigError, DataConfig
from keras_transformer.data.corpora import (KEEP, drop_reasons, load_corpus_pairs, load_pairs,
                                            tokenized_pairs)
from keras_transformer.data.modifiers import modify_batch
from keras_transformer.data.tokenizers import Tokenizer

logger = logging.getLogger(__name__)

AUTOTUNE = tf.data.AUTOTUNE
_MODIFY_BATCH = 512  # pairs modified per Python call (`TrainingStream`, data.modifiers)


# ----------------------------------------------------------------------------- batching

def bucket_lengths(data_config: DataConfig) -> list[int]:
    """Padded lengths of the batches: multiples of `bucket_step`, the last one >= `max_pair_length`."""
    step = data_config.bucket_step
    return [step * k for k in range(1, math.ceil(data_config.max_pair_length / step) + 1)]


def bucket_batch_sizes(data_config: DataConfig, num_replicas: int = 1) -> list[int]:
    """Pairs per batch for each bucket length: floor(tokens_per_batch / length), rounded down to
    a multiple of `num_replicas` so that the global batch splits evenly between replicas."""
    sizes = []
    for length in bucket_lengths(data_config):
        size = data_config.tokens_per_batch // length // num_replicas * num_replicas
        if size == 0:
            raise ConfigError(
                f"data.tokens_per_batch={data_config.tokens_per_batch} cannot hold one pair of "
                f"length {length} per replica for {num_replicas} replicas")
        sizes.append(size)
    return sizes


def _shift_target(source_ids, target_ids, empty):
    del empty
    return (source_ids, target_ids[:-1]), target_ids[1:]


def _filtered_examples(pairs, source_tokenizer, target_tokenizer, data_config):
    """Kept pairs as ((source_ids [n], target_in_ids [m]), target_out_ids [m]), unpadded."""
    def keep(source_ids, target_ids, empty):
        return drop_reasons(tf.size(source_ids), tf.size(target_ids), empty,
                            data_config.max_pair_length) == KEEP
    return (tokenized_pairs(pairs, source_tokenizer, target_tokenizer)
            .unbatch()
            .filter(keep)
            .map(_shift_target, num_parallel_calls=AUTOTUNE))


# Buckets are 2-D: (source bucket, target bucket), each the length rounded up to a multiple of
# `bucket_step`, so neither side is padded up to the other's length (German sources run longer
# than English targets). Key = source_bucket * _KEY_BASE + target_bucket, buckets counted from 1.
_KEY_BASE = 1 << 16


def _bucket_key(inputs, target_out, config: DataConfig):
    def bucket(ids):
        return (tf.cast(tf.size(ids), tf.int64) + config.bucket_step - 1) // config.bucket_step
    return bucket(inputs[0]) * _KEY_BASE + bucket(target_out)


def _dense(ids):
    """A row that unbatching ragged batches gives as a RaggedTensor of ragged rank 0, as the
    plain Tensor the other examples are."""
    return ids.flat_values if isinstance(ids, tf.RaggedTensor) else ids


def _bucket_shape(key, config: DataConfig):
    """(source_length, target_length) that the bucket `key` pads to, as int64 scalars."""
    return key // _KEY_BASE * config.bucket_step, key % _KEY_BASE * config.bucket_step


def _bucket_batch_size(key, config: DataConfig, num_replicas: int):
    """floor(tokens_per_batch / longer side) rounded down to a multiple of num_replicas."""
    longest = tf.maximum(*_bucket_shape(key, config))
    return config.tokens_per_batch // longest // num_replicas * num_replicas


def _pad_bucket(key, window, config: DataConfig, num_replicas: int):
    source_length, target_length = _bucket_shape(key, config)
    return window.padded_batch(
        _bucket_batch_size(key, config, num_replicas),
        padded_shapes=(([source_length], [target_length]), [target_length]))


def make_batches(pairs: tf.data.Dataset, source_tokenizer: Tokenizer,
                 target_tokenizer: Tokenizer, data_config: DataConfig, *, training: bool,
                 num_replicas: int = 1) -> tf.data.Dataset:
    """Token batches for `model.fit`: ((source_ids, target_in_ids), target_out_ids).

    Each element is int32 [batch, length], padded with PAD = 0; target_in = [START, w1, ..., wn]
    and target_out = [w1, ..., wn, END]. Pairs are grouped by (source length, target length),
    each rounded up to a multiple of `bucket_step` (so at most `max_pair_length` rounded up), and
    padded to exactly those lengths: batch shapes come from a small fixed set. A bucket whose
    longer side is L holds floor(tokens_per_batch / L) pairs (`bucket_batch_sizes`), so padded
    tokens per batch <= tokens_per_batch on each side; a bucket's last batch may be smaller.
    Pairs with an empty side or longer than `max_pair_length` are dropped (`pair_stats` counts them).

    Tokenized pairs are cached in memory (after the first pass); with `training` they are
    reshuffled each epoch. With a sampling tokenizer (subword regularization, see
    `tokenizers.training_tokenizers`) and `training`, the text pairs are cached instead and
    tokenized again each epoch, so every epoch sees new segmentations (and the `max_pair_length`
    filter applies to each epoch's). With `num_replicas > 1`, batch sizes are multiples of
    `num_replicas` and a bucket's last, smaller batch is left out unless it also divides evenly,
    so every replica gets the same number of pairs; each epoch's shuffle leaves out different
    pairs.
    """
    bucket_batch_sizes(data_config, num_replicas)  # fails early if a longest pair cannot fit

    def cache_and_shuffle(dataset):
        if data_config.cache:
            dataset = dataset.cache()
        if training:
            dataset = dataset.shuffle(data_config.shuffle_buffer, reshuffle_each_iteration=True)
        return dataset

    def tokenize_and_filter(dataset):
        return _filtered_examples(dataset, source_tokenizer, target_tokenizer, data_config)

    if training and (source_tokenizer.samples or target_tokenizer.samples):
        examples = tokenize_and_filter(cache_and_shuffle(pairs))  # new segmentations each epoch
    else:
        examples = cache_and_shuffle(tokenize_and_filter(pairs))
    return without_autotuning(_bucketed(examples, data_config, num_replicas).prefetch(AUTOTUNE))


def _bucketed(examples: tf.data.Dataset, data_config: DataConfig, num_replicas: int):
    """Batches of `make_batches` from its unpadded examples (see there)."""
    batches = examples.group_by_window(
        key_func=functools.partial(_bucket_key, config=data_config),
        reduce_func=functools.partial(_pad_bucket, config=data_config, num_replicas=num_replicas),
        window_size_func=functools.partial(_bucket_batch_size, config=data_config,
                                           num_replicas=num_replicas))
    if num_replicas > 1:
        batches = batches.filter(
            lambda inputs, target_out: tf.shape(target_out)[0] % num_replicas == 0)
    return batches


def group_batches(batches: tf.data.Dataset, group_size: int) -> tf.data.Dataset:
    """Batches of one shape stacked by `group_size` on a second axis, for gradient
    accumulation (`Transformer.train_step` sums the gradients of a group into one update):
    ((source_ids [batch, n, source_len], target_in_ids [batch, n, target_len]),
    target_out_ids [batch, n, target_len]), n = `group_size` but for each shape's last group.

    The batch axis stays first, so a distribution strategy splits every micro-batch of the
    group between its replicas as it would split an ungrouped batch. `make_batches` gives a
    small set of shapes (a bucket's batches, then its last, smaller one), so most groups are full.
    """
    def shape_key(inputs, target_out):
        shape = tf.cast(tf.concat([tf.shape(inputs[0]), tf.shape(target_out)[1:]], 0), tf.int64)
        return (shape[0] * _SHAPE_KEY_BASE + shape[1]) * _SHAPE_KEY_BASE + shape[2]

    def batch_first(*element):
        return tf.nest.map_structure(lambda ids: tf.transpose(ids, [1, 0, 2]), element)

    return batches.group_by_window(
        key_func=shape_key,
        reduce_func=lambda key, window: window.batch(group_size).map(batch_first),
        window_size=group_size)


_SHAPE_KEY_BASE = 1 << 20  # batch size and lengths each below 2^20


class TrainingStream:
    """A run's training batches: one endless stream of passes over the pairs, the same in
    every process given the same pairs, so that a run resumed at batch N reads what an
    uninterrupted run read there. Under several workers each has its own stream over its own
    shard of the pairs (`load_pairs(shard=...)`, `training.TrainingInput`).

    Pass p is the pairs shuffled with the seed (`seed`, p) (with a sampling tokenizer,
    tokenized after the shuffle: new segmentations each pass; with `data.modifiers`, changed
    after the shuffle by draws of (`seed`, p) and tokenized), batched as `make_batches`
    batches them, by length bucket.

    With `data.carry_remainders` (the default) the passes follow each other into the same
    buckets: a bucket's pairs that do not fill a batch at the end of a pass wait for the next
    pass's, so every batch is full and each bucket has one shape. A pass then holds about
    `pass_length()` batches, and pass p's position in the stream and the pairs carried into
    it follow from the pairs each bucket gets a pass: `batches(start)` starts at the pass
    where batch `start` is made, with the pairs carried into it, and skips the batches of that
    pass before `start`. Without it each pass ends every bucket with a smaller batch, every
    pass has the same number of batches, and `batches(start)` starts at pass
    start // `pass_length()`. Either way, without subword sampling or modifiers the position
    is exact; with them, a pass's bucket counts vary a little, and a resumed stream starts at
    about the same place (and without the carried pairs).

    With `accumulate_steps` > 1 the stream's elements are groups of that many batches of one
    shape (`group_batches`); positions and pass lengths count groups.
    """

    def __init__(self, pairs: tf.data.Dataset, source_tokenizer: Tokenizer,
                 target_tokenizer: Tokenizer, data_config: DataConfig, *, seed: int,
                 num_replicas: int = 1, accumulate_steps: int = 1):
        bucket_batch_sizes(data_config, num_replicas)  # fails early if a longest pair cannot fit
        self.data_config, self.seed, self.num_replicas = data_config, seed, num_replicas
        self.accumulate_steps = accumulate_steps
        self._tokenizers = (source_tokenizer, target_tokenizer)
        self._modifiers = data_config.modifiers.shares()
        self._modify = bool(self._modifiers or data_config.placeholders
                            or data_config.case_folding)
        # A pass's tokens differ from the last pass's when the tokenizer samples segmentations
        # or the modifiers change the text: then each pass tokenizes anew.
        self._per_pass = bool(source_tokenizer.samples or target_tokenizer.samples
                              or self._modify)
        # Tokenized pairs are cached (text pairs when each pass tokenizes anew); the cache
        # fills during the first complete pass and every later pass of any stream of this
        # object reads it.
        examples = pairs if self._per_pass else self._tokenize(pairs)
        self._examples = examples.cache() if data_config.cache else examples
        self._carry = data_config.carry_remainders
        self._pass_length = self._counts = self._keys = None

    def _tokenize(self, pairs):
        return _filtered_examples(pairs, *self._tokenizers, self.data_config)

    def _pass_examples(self, index) -> tf.data.Dataset:
        """The examples of pass `index` (an int64 scalar) in its order; traced by `flat_map`
        only."""
        # Clearing the seed of the graph this is traced into makes the order independent of the
        # global seed, which when 0 (mod 2**31 - 1) makes tf.data's seed check compare the
        # tensor seed in Python and fail. Eagerly it would clear TensorFlow's kernel cache.
        examples = self._shuffled(self._examples, index)
        if self._modify:
            examples = self._modified(examples, index)
        if self._per_pass:
            examples = self._tokenize(examples)
        return examples

    def _modified(self, pairs: tf.data.Dataset, index) -> tf.data.Dataset:
        """Text `pairs` of pass `index` through `data.modifiers`, `data.case_folding` and
        `data.placeholders` (`modifiers.modify_batch`), the draws a function of the seed, the
        pass and the pairs' place in it."""
        shares, seed = self._modifiers, self.seed
        case_target = self.data_config.modifiers.case_target
        placeholders, case_folding = self.data_config.placeholders, self.data_config.case_folding

        def modify(batch_index, pairs):
            sources, targets = tf.numpy_function(
                lambda s, t, i, b: tuple(np.array(side, object) for side in modify_batch(
                    s, t, shares, seed, i, b, case_target=case_target,
                    placeholders=placeholders, case_folding=case_folding)),
                [*pairs, tf.cast(index, tf.int64), batch_index],
                (tf.string, tf.string), stateful=False)
            return tf.ensure_shape(sources, [None]), tf.ensure_shape(targets, [None])

        return pairs.batch(_MODIFY_BATCH).enumerate().map(modify).unbatch()

    def _shuffled(self, dataset: tf.data.Dataset, index) -> tf.data.Dataset:
        """`dataset` in pass `index`'s order. The order depends on the seeds and the number of
        elements only, so the cached examples and their indices (`_pass_orders`) get the same."""
        # Clearing the seed of the graph this is traced into makes the order independent of the
        # global seed, which when 0 (mod 2**31 - 1) makes tf.data's seed check compare the
        # tensor seed in Python and fail. Eagerly it would clear TensorFlow's kernel cache.
        tf.random.set_seed(None)
        seed = tf.constant(self.seed, tf.int64) * 1_000_003 + index
        return dataset.shuffle(self.data_config.shuffle_buffer, seed=seed,
                               reshuffle_each_iteration=False)

    def _keys_of(self, examples: tf.data.Dataset) -> np.ndarray:
        """The bucket key of each example, in order."""
        keys = examples.map(functools.partial(_bucket_key, config=self.data_config)).batch(8192)
        return np.concatenate([np.zeros(0, np.int64), *keys.as_numpy_iterator()])

    def _cache_keys(self) -> np.ndarray:
        """The bucket key of each cached example, in cache order (without sampling), once."""
        if self._keys is None:
            self._keys = self._keys_of(self._examples)
        return self._keys

    def _no_batches(self) -> ConfigError:
        config = self.data_config
        return ConfigError(
            f"data.train_split={config.train_split!r} gives no batches: every pair is empty or "
            f"longer than data.max_pair_length={config.max_pair_length}")

    def _pass_orders(self, first: int, end: int) -> np.ndarray:
        """The cache indices of the examples of passes `first` to `end` - 1, in stream order."""
        count = len(self._cache_keys())
        indices = tf.data.Dataset.range(first, end).flat_map(
            lambda index: self._shuffled(tf.data.Dataset.range(count), index)).batch(1 << 16)
        return np.concatenate([np.zeros(0, np.int64), *indices.as_numpy_iterator()])

    def _batched(self, examples: tf.data.Dataset) -> tf.data.Dataset:
        batches = _bucketed(examples, self.data_config, self.num_replicas)
        if self.accumulate_steps > 1:
            return group_batches(batches, self.accumulate_steps)
        return batches

    def _pass(self, index) -> tf.data.Dataset:
        """The batches of pass `index`, each bucket's last one smaller (no carrying)."""
        return self._batched(self._pass_examples(index))

    def _examples_of_passes(self, first: int, end: int) -> tf.data.Dataset:
        # The passes are built inside flat_map, so their options do not reach the stream.
        return tf.data.Dataset.range(first, end).flat_map(self._pass_examples)

    def bucket_counts(self) -> dict[int, int]:
        """Pairs a pass puts in each length bucket (pass 0's when each pass tokenizes anew:
        sampling, modifiers), by bucket key,
        counted once; ConfigError if there are none."""
        if self._counts is None:
            keys = (self._keys_of(self._examples_of_passes(0, 1)) if self._per_pass
                    else self._cache_keys())
            found, counts = np.unique(keys, return_counts=True)
            self._counts = {int(key): int(count) for key, count in zip(found, counts)}
            if not self._counts:
                raise self._no_batches()
        return self._counts

    def _emission_units(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(bucket keys, pairs a pass puts in each, pairs that make one stream element)."""
        counts = self.bucket_counts()
        keys = np.array(sorted(counts), np.int64)
        units = np.array([int(_bucket_batch_size(tf.constant(key), self.data_config,
                                                 self.num_replicas)) * self.accumulate_steps
                          for key in keys], np.int64)
        return keys, np.array([counts[key] for key in keys], np.int64), units

    def pass_length(self) -> int:
        """Elements (batches or groups) in one pass: counted once (pass 0's when sampling);
        with carried remainders the mean over passes, rounded (at least 1). ConfigError if
        there are none."""
        if self._pass_length is None:
            if self._carry:
                _, counts, units = self._emission_units()
                self._pass_length = max(1, round(float(np.sum(counts / units))))
            else:
                self._pass_length = int(self._passes(0, 1).reduce(
                    tf.constant(0, tf.int64), lambda count, _: count + 1))
                if not self._pass_length:
                    raise self._no_batches()
        return self._pass_length

    def position(self, start: int) -> tuple[int, int, dict[int, int]]:
        """Where element `start` of the carrying stream is made: (pass P, the elements of
        pass P before it, {bucket key: pairs carried into pass P}).

        After p passes a bucket with c pairs a pass and u pairs an element has made
        floor(p c / u) elements and holds (p c) mod u pairs."""
        keys, counts, units = self._emission_units()

        def made(passes: int) -> int:
            return int(np.sum(passes * counts // units))

        low, high = 0, 1
        while made(high) <= start:
            low, high = high, 2 * high
        while high - low > 1:  # made(low) <= start < made(high)
            middle = (low + high) // 2
            low, high = (middle, high) if made(middle) <= start else (low, middle)
        carried = low * counts % units
        return low, start - made(low), {int(k): int(n) for k, n in zip(keys, carried) if n}

    def _carried(self, index: int, carried: dict[int, int]) -> tf.data.Dataset:
        """The pairs carried into pass `index`: each bucket's last ones of the passes before,
        in their order (none when each pass tokenizes anew, whose earlier tokens are not
        kept).

        Which ones follows from the passes' orders of cache indices and each example's bucket,
        without reading the examples of those passes; then one read of the cache fetches
        them."""
        if self._per_pass or not carried:
            return self._examples_of_passes(0, 0)
        counts = self.bucket_counts()
        back = max(-(-carried[key] // counts[key]) for key in carried)  # passes to look at
        order = self._pass_orders(index - back, index)
        keys = self._cache_keys()[order]
        positions = np.sort(np.concatenate(
            [np.flatnonzero(keys == key)[-count:] for key, count in carried.items()]))
        wanted = order[positions]  # cache indices in stream order (a pair twice from 2 passes)
        in_cache_order = np.unique(wanted)
        selected = np.zeros(len(self._cache_keys()), bool)
        selected[in_cache_order] = True
        selected = tf.constant(selected)
        rows = tf.constant(np.searchsorted(in_cache_order, wanted))
        fetched = (self._examples.enumerate()
                   .filter(lambda i, example: selected[i])
                   .map(lambda i, example: example)
                   .ragged_batch(len(in_cache_order)))
        return (fetched.flat_map(lambda *batch: tf.data.Dataset.from_tensor_slices(
                    tf.nest.map_structure(lambda ids: tf.gather(ids, rows), batch)))
                .map(lambda inputs, target_out: tf.nest.map_structure(
                    _dense, (inputs, target_out))))

    def batches(self, start: int = 0) -> tf.data.Dataset:
        """The stream from its element `start` (0: the first), endless."""
        if not self._carry:
            first_pass, skip = divmod(start, self.pass_length()) if start else (0, 0)
            return self._passes(first_pass, 2 ** 62).skip(skip).prefetch(AUTOTUNE)
        first_pass, skip, carried = self.position(start) if start else (0, 0, {})
        examples = self._carried(first_pass, carried).concatenate(
            self._examples_of_passes(first_pass, 2 ** 62))
        return without_autotuning(self._batched(examples).skip(skip).prefetch(AUTOTUNE))

    def _passes(self, first: int, end: int) -> tf.data.Dataset:
        # The passes are built inside flat_map, so their options do not reach the stream.
        return without_autotuning(tf.data.Dataset.range(first, end).flat_map(self._pass))


class MixtureStream:
    """Training batches drawn from several corpora's `TrainingStream`s in proportion to their
    weights (`data.corpora`), with the interface of `TrainingStream`.

    Element i of the stream comes from corpus `choices[i mod HORIZON]`, a sequence drawn once
    from the weights with the run's seed; each corpus's stream goes on from where its last
    batch left it. So the stream is the same in every process, and `batches(start)` starts
    each corpus's stream at the count of its batches among the first `start` (exact resume,
    without reading them). A corpus's batches are bucketed by length within that corpus.

    `pass_length()`: the stream's elements per pass over the first corpus (its pass length
    over its share), so that an epoch reads the first corpus about once.
    """

    HORIZON = 1 << 20  # choices drawn ahead, then repeated

    def __init__(self, streams: list, weights: list[float], *, seed: int):
        if len(streams) != len(weights) or not streams:
            raise ValueError(f"{len(streams)} streams for {len(weights)} weights")
        self.streams = streams
        self.shares = np.asarray(weights, np.float64) / np.sum(weights)
        self.choices = np.random.default_rng([seed, len(streams)]).choice(
            len(streams), size=self.HORIZON, p=self.shares).astype(np.int64)

    def pass_length(self) -> int:
        return max(1, round(self.streams[0].pass_length() / self.shares[0]))

    def counts(self, start: int) -> list[int]:
        """How many of the first `start` elements each corpus gives."""
        laps, offset = divmod(start, self.HORIZON)
        size = len(self.streams)
        counts = laps * np.bincount(self.choices, minlength=size) + np.bincount(
            self.choices[:offset], minlength=size)
        return [int(count) for count in counts]

    def batches(self, start: int = 0) -> tf.data.Dataset:
        """The stream from its element `start` (0: the first), endless."""
        choices = tf.data.Dataset.from_tensor_slices(self.choices).repeat().skip(
            start % self.HORIZON)
        streams = [stream.batches(count) for stream, count in zip(self.streams,
                                                                   self.counts(start))]
        return without_autotuning(tf.data.Dataset.choose_from_datasets(
            streams, choices, stop_on_empty_dataset=True).prefetch(AUTOTUNE))


def training_stream(data_config: DataConfig, source_tokenizer: Tokenizer,
                    target_tokenizer: Tokenizer, *, seed: int, shard: tuple[int, int] = (0, 1),
                    **stream_options) -> "TrainingStream | MixtureStream":
    """The training batches of `data_config`: one `TrainingStream` of the train split, or with
    `data.corpora` a `MixtureStream` of one per corpus (each shuffled with its own seed);
    `stream_options` go to `TrainingStream` (num_replicas, accumulate_steps)."""
    if data_config.corpora is None:
        pairs = load_pairs(data_config, data_config.train_split, shard=shard)
        return TrainingStream(pairs, source_tokenizer, target_tokenizer, data_config, seed=seed,
                              **stream_options)
    streams = [TrainingStream(load_corpus_pairs(data_config, corpus, shard=shard),
                              source_tokenizer, target_tokenizer, data_config,
                              seed=seed + 7919 * index, **stream_options)
               for index, corpus in enumerate(data_config.corpora)]
    return MixtureStream(streams, [corpus.weight for corpus in data_config.corpora], seed=seed)


def fixed_size_batches(pairs: tf.data.Dataset, source_tokenizer: Tokenizer,
                       target_tokenizer: Tokenizer, data_config: DataConfig,
                       batch_size: int = 64) -> tf.data.Dataset:
    """The tf.text tutorial's batching, for comparison: `batch_size` pairs in reading order,
    padded to the longest in the batch (same filtering as `make_batches`)."""
    examples = _filtered_examples(pairs, source_tokenizer, target_tokenizer, data_config)
    return without_autotuning(examples.padded_batch(batch_size).prefetch(AUTOTUNE))


@dataclasses.dataclass
class BatchStats:
    """Sizes of a batched dataset's batches (source side and target_out side)."""

    batches: int
    pairs: int
    shapes: list  # distinct (batch, source_length, target_length), sorted
    source_tokens: int  # non-PAD tokens
    target_tokens: int
    padded_source_tokens: int  # batch * length summed over batches
    padded_target_tokens: int
    max_padded_tokens: int  # the largest batch * length of either side
    # With a token budget: batches with fewer pairs than their bucket holds (each bucket's
    # last batch of a pass), and their real target tokens.
    partial_batches: int = 0
    partial_target_tokens: int = 0

    def padding_fraction(self, side: str) -> float:
        real, padded = ((self.source_tokens, self.padded_source_tokens) if side == "source"
                        else (self.target_tokens, self.padded_target_tokens))
        return 1.0 - real / padded if padded else 0.0


def batch_stats(batches: tf.data.Dataset, tokens_per_batch: int | None = None) -> BatchStats:
    """Iterates `((source, target_in), target_out)` batches once and measures them; with
    `tokens_per_batch` (`make_batches`' budget, one replica), also counts the partial batches:
    those holding fewer than floor(tokens_per_batch / longer side) pairs."""
    def measure(inputs, target_out):
        source = inputs[0]
        return (tf.shape(source), tf.shape(target_out),
                tf.math.count_nonzero(source), tf.math.count_nonzero(target_out))

    shapes, totals = set(), np.zeros(4, np.int64)
    count = pairs = max_padded = partial = partial_tokens = 0
    for source_shape, target_shape, source_real, target_real in (
            batches.map(measure).as_numpy_iterator()):
        count += 1
        pairs += int(source_shape[0])
        shapes.add((int(source_shape[0]), int(source_shape[1]), int(target_shape[1])))
        padded = (int(np.prod(source_shape)), int(np.prod(target_shape)))
        totals += (source_real, target_real, *padded)
        max_padded = max(max_padded, *padded)
        if tokens_per_batch and source_shape[0] < tokens_per_batch // max(source_shape[1],
                                                                          target_shape[1]):
            partial += 1
            partial_tokens += int(target_real)
    return BatchStats(count, pairs, sorted(shapes), int(totals[0]), int(totals[1]),
                      int(totals[2]), int(totals[3]), max_padded, partial, partial_tokens)
