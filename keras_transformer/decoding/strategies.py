"""Decoding strategies (greedy, beam, sampling) and the one `tf.while_loop` that drives them.

As in OpenNMT-tf (`opennmt/utils/decoding.py`), the loop (`decode`) knows neither the model nor
the search: a `DecodingStrategy` says how a step's logits extend each sentence's hypotheses and
when a sentence is done, and a step function gives the logits:

    symbols_to_logits_fn(ids, step, state) -> (logits, state), or with a `context`:
    symbols_to_logits_fn(ids, step, state, context, beams) -> (logits, state)

    ids:     int32 `[rows]`, the token at position `step` of each row (START at step 0).
    step:    int32 scalar, the position of `ids`.
    state:   a nested structure (dicts, lists) of tensors whose leading dimension is the rows,
             e.g. the decoder's self-attention key/value caches; reordered to follow the beams.
    context: a nested structure of tensors with one row per sentence that the step function
             reads but never changes (the encoder output's cross-attention keys/values and the
             source mask); `beams` (a Python int) consecutive rows of `ids` belong to each.
    logits:  `[rows, vocab]`, scores of the token at position `step + 1` (cast to float32 here).

Strategies are registered by name (`register_strategy`) and built from a `DecodeConfig` by
`strategy_from_config`; `Translator` gives every registered strategy a `translate_<name>`
signature. Adding one is a `DecodingStrategy` subclass in this file with its registration line.

Finished sentences leave the batch, so that they cost nothing in later steps (as CTranslate2
does): each step, the rows of the sentences that are done are written to the result, and the
search state, the step function's state and the context are gathered down to the others. The
loop stops as soon as every sentence is done. Everything is TensorFlow core ops, so the search
runs inside `tf.function` and exports to SavedModels that TF Serving runs.

Outputs are padded with `PAD_ID` after END and have `max_decode_length` columns; START is not
included. A sentence that reaches its length cap without producing END is finished as it stands.

Paper, section 6.1: "We used beam search with a beam size of 4 and length penalty alpha = 0.6 ...
We set the maximum output length during inference to input length + 50, but terminate early when
possible." Ranking and stopping follow `search_rules`.
"""

from __future__ import annotations

import abc
import math

import tensorflow as tf

from keras_transformer.config import END_ID, PAD_ID, START_ID, DecodeConfig
from keras_transformer.decoding.search_rules import (NEG_INF, STOPPING_RULES, cannot_improve,
                                                     finished_to_stop, length_penalty)

__all__ = ["NEG_INF", "STOPPING_RULES", "STRATEGIES", "DecodingStrategy", "GreedySearch",
           "BeamSearch", "SamplingSearch", "ForcedDecoding", "register_strategy",
           "RepetitionGuard", "strategy_from_config", "decode", "greedy_search", "beam_search", "sampling_search",
           "tile_beams"]

STRATEGIES: dict[str, type] = {}  # name -> DecodingStrategy subclass, in registration order


def register_strategy(name: str):
    """Class decorator: registers a `DecodingStrategy` under `name` (its `translate_<name>`
    signature, `Translator.search(ids, name)`, `strategy_from_config(name, ...)`)."""
    def register(cls):
        if name in STRATEGIES:
            raise ValueError(f"a decoding strategy named {name!r} is already registered")
        cls.name = name
        STRATEGIES[name] = cls
        return cls
    return register


def strategy_from_config(name: str, config: DecodeConfig | None = None,
                         **options) -> "DecodingStrategy":
    """The strategy registered as `name`, with the settings of `config` (default:
    `DecodeConfig()`) overridden by `options` (each strategy's `from_config` lists them)."""
    if name not in STRATEGIES:
        raise ValueError(f"decoding strategy {name!r} is not one of {', '.join(STRATEGIES)}")
    return STRATEGIES[name].from_config(config or DecodeConfig(), **options)


class DecodingStrategy(abc.ABC):
    """How a search extends hypotheses; `decode` drives it.

    The search state is a dict of tensors with one row per sentence still decoding; everything
    that changes during a search lives there, never on the object (a strategy holds only its
    settings, Python numbers or scalar tensors), so one object may drive any number of searches.

    Class attributes:
        name: the registered name (`register_strategy`).
        beams: rows of the step function per sentence.
        first_step_per_sentence: step 0 runs on one row per sentence and is tiled to the beams.
        nbest: the results hold several hypotheses per sentence (`[batch, k, ...]`).
        signature_inputs: `{name: tf.TensorSpec([None], ...)}`, inputs with one value per
            sentence that `Translator`'s signature of this strategy takes besides the source
            and passes to `from_config`.
    """

    name = None
    beams = 1
    first_step_per_sentence = False
    nbest = False
    signature_inputs: dict = {}

    @classmethod
    @abc.abstractmethod
    def from_config(cls, config: DecodeConfig, **options) -> "DecodingStrategy":
        """This strategy with `config`'s settings, overridden by `options`."""

    @abc.abstractmethod
    def initialize(self, start_ids, caps, max_decode_length) -> dict:
        """The search state of a batch: `start_ids` int32 `[batch]`, `caps` int32 `[batch]`
        (each sentence's most tokens), `max_decode_length` int32 scalar (output columns)."""

    def inputs(self, search, first=False):
        """The ids to feed at this step: int32 `[n * beams]` (`[n]` with `first`)."""
        return search["ids"]

    @abc.abstractmethod
    def step(self, step, logits, search):
        """Extends the hypotheses by `logits` float32 `[n * beams, vocab]` (the tokens at
        position `step`) -> (search, parents int32 `[n, beams]` or None, done bool `[n]`).
        `parents` says which row of its sentence each new row continues (None: each its own)."""

    @abc.abstractmethod
    def results(self, search):
        """Per-sentence outputs `[n, ...]`, written to the results when a sentence is done."""

    @abc.abstractmethod
    def empty_results(self, batch_size, max_decode_length):
        """The result buffers `[batch, ...]`, in the structure of `results`."""

    def finalize(self, results):
        """The results -> (ids, scores)."""
        return results


class _OneHypothesis(DecodingStrategy):
    """A search that keeps one hypothesis per sentence and picks its next token by `choose`.

    Search state: `ids` int32 `[n]` (the last token), `output` int32 `[n, max_decode_length]`,
    `scores` float32 `[n]` (the sum of the chosen tokens' log-probabilities under the model),
    `caps` int32 `[n]`, and what `extra_state` adds.
    Results: ids int32 `[batch, max_decode_length]`, scores float32 `[batch]`.
    """

    def __init__(self, *, end_id=END_ID):
        self.end_id = end_id

    def extra_state(self) -> dict:
        return {}

    @abc.abstractmethod
    def choose(self, step, logits, search):
        """-> (ids int32 `[n]`, their log-probabilities float32 `[n]`)."""

    def initialize(self, start_ids, caps, max_decode_length):
        batch_size = tf.shape(start_ids)[0]
        return {"ids": start_ids, "output": tf.zeros([batch_size, max_decode_length], tf.int32),
                "scores": tf.zeros([batch_size], tf.float32), "caps": caps, **self.extra_state()}

    def step(self, step, logits, search):
        ids, log_probs = self.choose(step, tf.cast(logits, tf.float32), search)
        output = search["output"]
        output += tf.one_hot(step, tf.shape(output)[1], dtype=tf.int32) * ids[:, None]
        done = tf.equal(ids, self.end_id) | (step + 1 >= search["caps"])  # [n]
        return {**search, "ids": ids, "output": output,
                "scores": search["scores"] + log_probs}, None, done

    def results(self, search):
        return search["output"], search["scores"]

    def empty_results(self, batch_size, max_decode_length):
        return (tf.zeros([batch_size, max_decode_length], tf.int32),
                tf.zeros([batch_size], tf.float32))


@register_strategy("greedy")
class GreedySearch(_OneHypothesis):
    """Picks the most probable next token of every sentence (ties: the lower id)."""

    @classmethod
    def from_config(cls, config, *, end_id=END_ID):
        return cls(end_id=end_id)

    def choose(self, step, logits, search):
        log_probs, ids = _top_log_probs(logits, 1)  # [n, 1]
        return ids[:, 0], log_probs[:, 0]


@register_strategy("beam")
class BeamSearch(DecodingStrategy):
    """Beam search with the GNMT length penalty; returns the n best hypotheses.

    Each step expands the `beam_size` alive hypotheses of a sentence by every token and keeps the
    `2 * beam_size` most probable candidates (so that at least `beam_size` of them do not end).
    Candidates that end (END, or the sentence's length cap) and rank among the top `beam_size`
    move to the finished set, scored log P / lp(length); the `beam_size` best candidates that do
    not end stay alive, and the step function's state is reordered to follow them. Thus finished
    hypotheses take a place in the beam as in fairseq, and beam size 1 is exactly greedy search
    (with alpha 0). A sentence is done when it reaches its cap or, by the `stopping` rule:

    - "exact": when its finished set is full and no alive hypothesis can beat the worst finished
      one (`search_rules.cannot_improve`, the early stopping of tensorflow/models). The result
      is what the search would return if it ran to the cap.
    - "beam_full": as soon as `patience * beam_size` hypotheses have finished (rounded up;
      patience 1 is fairseq's and CTranslate2's default rule, larger values are the patience
      factor of Kasai et al. 2022, arXiv:2204.05424), or earlier when the exact bound holds.
      A large alpha keeps the exact bound loose, so that sentences often run to their cap;
      this rule's cost does not depend on alpha.

    The beams of a sentence start from the same START and state, so step 0 runs once per
    sentence and is tiled to the beams (as CTranslate2 expands the batch only after the first
    step): step 0 costs a `beam_size`th of the rows.

    Args:
        beam_size: int, the paper uses 4.
        alpha: float >= 0, the length penalty exponent; the paper uses 0.6, 0 ranks by log P.
            May be a float32 scalar tensor (one trace for every alpha; not checked here).
        num_hypotheses: int in [1, beam_size], how many hypotheses to return per sentence.
        stopping: "exact" or "beam_full", see above.
        patience: float >= 1, how many times `beam_size` hypotheses "beam_full" waits for.
        end_id: the token that finishes a hypothesis.

    Search state, one row per sentence:
        alive_ids:       int32 `[n, beam]`, the last token of each alive hypothesis.
        alive_seq:       int32 `[n, beam, max_decode_length]`, alive hypotheses.
        alive_log_probs: float32 `[n, beam]`, log P of each alive hypothesis, best first.
        finished_seq:    int32 `[n, beam, max_decode_length]`.
        finished_scores: float32 `[n, beam]`, log P / lp(length), best first, NEG_INF if empty.
        finished_flags:  bool `[n, beam]`, whether a finished slot holds a hypothesis.
        finished_count:  int32 `[n]`, how many hypotheses have finished so far.
        caps:            int32 `[n]`; max_penalty: float32 `[n]`, lp(cap).
    Results: ids int32 `[batch, num_hypotheses, max_decode_length]`, best first, `PAD_ID` in a
    slot for which no hypothesis exists (fewer possible sequences than `num_hypotheses`);
    scores float32 `[batch, num_hypotheses]`, log P / lp, NEG_INF in such a slot.
    """

    first_step_per_sentence = True
    nbest = True

    def __init__(self, beam_size=DecodeConfig.beam_size, *, alpha=DecodeConfig.alpha,
                 num_hypotheses=1, stopping=DecodeConfig.stopping,
                 patience=DecodeConfig.patience, end_id=END_ID):
        if not 1 <= num_hypotheses <= beam_size:
            raise ValueError(f"num_hypotheses={num_hypotheses} must be in [1, beam_size={beam_size}]")
        if not tf.is_tensor(alpha) and alpha < 0:
            raise ValueError(f"alpha={alpha} must be >= 0 (early stopping relies on it)")
        if stopping not in STOPPING_RULES:
            raise ValueError(f"stopping={stopping!r} is not one of {', '.join(STOPPING_RULES)}")
        if not patience >= 1:
            raise ValueError(f"patience={patience} must be >= 1")
        self.beams = self.beam_size = beam_size
        self.alpha, self.num_hypotheses = alpha, num_hypotheses
        self.stopping, self.end_id = stopping, end_id
        self.finished_needed = finished_to_stop(beam_size, patience)

    @classmethod
    def from_config(cls, config, *, alpha=None, num_hypotheses=None, end_id=END_ID):
        """`config`'s beam size, alpha, stopping rule and patience; every hypothesis returned
        (`num_hypotheses` default: the beam size); `alpha` may be a float32 scalar tensor."""
        return cls(config.beam_size, alpha=config.alpha if alpha is None else alpha,
                   num_hypotheses=num_hypotheses or config.beam_size,
                   stopping=config.stopping, patience=config.patience, end_id=end_id)

    def initialize(self, start_ids, caps, max_decode_length):
        batch_size = tf.shape(start_ids)[0]
        beam = self.beam_size
        # All beams start identical: only the first one may expand at step 0.
        first_beam_only = tf.concat([[0.0], tf.fill([beam - 1], NEG_INF)], axis=0)  # [beam]
        sequences = tf.zeros([batch_size, beam, max_decode_length], tf.int32)
        return {"alive_ids": tf.tile(start_ids[:, None], [1, beam]),
                "alive_seq": sequences,
                "alive_log_probs": tf.tile(first_beam_only[tf.newaxis], [batch_size, 1]),
                "finished_seq": sequences,
                "finished_scores": tf.fill([batch_size, beam], NEG_INF),
                "finished_flags": tf.zeros([batch_size, beam], tf.bool),
                "finished_count": tf.zeros([batch_size], tf.int32),
                "caps": caps,
                "max_penalty": length_penalty(tf.cast(caps, tf.float32), self.alpha)}

    def inputs(self, search, first=False):
        return search["alive_ids"][:, 0] if first else tf.reshape(search["alive_ids"], [-1])

    def step(self, step, logits, search):
        beam = self.beam_size
        n = tf.shape(search["alive_ids"])[0]
        # The 2 * beam best candidates of each beam first: they hold the 2 * beam best of the
        # sentence, in the same order (ties: lower beam, then lower token id first, as a top-k
        # over [n, beam * vocab] orders them), and the top-k over the whole vocabulary needs no
        # [n * beam, vocab] sum with the alive log-probabilities.
        vocab_size = logits.shape[-1]
        per_beam = min(2 * beam, vocab_size) if vocab_size is not None else tf.minimum(
            2 * beam, tf.shape(logits)[-1])
        row_log_probs, row_ids = _top_log_probs(tf.cast(logits, tf.float32), per_beam)
        candidates = search["alive_log_probs"][:, :, tf.newaxis] + tf.reshape(
            row_log_probs, [n, beam, per_beam])  # [n, beam, per_beam]
        top_log_probs, top_index = tf.math.top_k(
            tf.reshape(candidates, [n, beam * per_beam]), k=2 * beam)
        top_beam = top_index // per_beam  # [n, 2 * beam]
        top_ids = tf.gather(tf.reshape(row_ids, [n, -1]), top_index, batch_dims=1)  # [n, 2 * beam]
        top_seq = tf.gather(search["alive_seq"], top_beam, batch_dims=1)  # [n, 2 * beam, len]
        top_seq += tf.one_hot(step, tf.shape(top_seq)[2], dtype=tf.int32) * top_ids[:, :, tf.newaxis]

        length = step + 1
        caps = search["caps"]
        ends = tf.equal(top_ids, self.end_id) | (length >= caps)[:, tf.newaxis]  # [n, 2 * beam]

        # Alive: the best candidates that do not end.
        alive_log_probs, alive_pos = tf.math.top_k(
            tf.where(ends, NEG_INF, top_log_probs), k=beam)  # [n, beam]
        parents = tf.gather(top_beam, alive_pos, batch_dims=1)  # [n, beam]

        # Finished: candidates that end within the top beam_size, merged with the finished set.
        in_beam = tf.range(2 * beam) < beam  # [2 * beam]
        new_flags = ends & in_beam & (top_log_probs > NEG_INF / 2)  # [n, 2 * beam]
        new_scores = tf.where(
            new_flags, top_log_probs / length_penalty(tf.cast(length, tf.float32), self.alpha),
            NEG_INF)
        finished_scores, finished_pos = tf.math.top_k(
            tf.concat([search["finished_scores"], new_scores], axis=1), k=beam)  # [n, beam]
        finished_count = search["finished_count"] + tf.reduce_sum(
            tf.cast(new_flags, tf.int32), axis=1)

        # finished_scores[:, -1] is NEG_INF until the finished set is full.
        stop = cannot_improve(alive_log_probs[:, 0], finished_scores[:, -1],
                              search["max_penalty"])
        if self.stopping == "beam_full":  # or earlier, when nothing can change any more
            stop |= finished_count >= self.finished_needed
        search = {
            "alive_ids": tf.gather(top_ids, alive_pos, batch_dims=1),
            "alive_seq": tf.gather(top_seq, alive_pos, batch_dims=1),
            "alive_log_probs": alive_log_probs,
            "finished_seq": tf.gather(tf.concat([search["finished_seq"], top_seq], axis=1),
                                      finished_pos, batch_dims=1),
            "finished_scores": finished_scores,
            "finished_flags": tf.gather(tf.concat([search["finished_flags"], new_flags], axis=1),
                                        finished_pos, batch_dims=1),
            "finished_count": finished_count,
            "caps": caps,
            "max_penalty": search["max_penalty"],
        }
        return search, parents, (length >= caps) | stop

    def results(self, search):
        n = self.num_hypotheses
        return (search["finished_seq"][:, :n], search["finished_scores"][:, :n],
                search["finished_flags"][:, :n])

    def empty_results(self, batch_size, max_decode_length):
        n = self.num_hypotheses
        return (tf.zeros([batch_size, n, max_decode_length], tf.int32),
                tf.fill([batch_size, n], NEG_INF), tf.zeros([batch_size, n], tf.bool))

    def finalize(self, results):
        sequences, scores, flags = results
        return (tf.where(flags[:, :, tf.newaxis], sequences, PAD_ID),
                tf.where(flags, scores, NEG_INF))


class ForcedDecoding(_OneHypothesis):
    """Feeds given target ids instead of choosing: the log-probability of a given translation,
    step by step through the same step function as the searches (so a search's score of its
    own output is this score). Not a search, so not registered.

    Args:
        targets: int32 `[batch, length]`, each row its tokens up to END, then `PAD_ID`; run
            with `length_caps` = the rows' token counts (END included).
    """

    def __init__(self, targets, *, end_id=END_ID):
        super().__init__(end_id=end_id)
        self.targets = targets

    @classmethod
    def from_config(cls, config, *, targets, end_id=END_ID):
        return cls(targets, end_id=end_id)

    def extra_state(self):
        return {"targets": tf.convert_to_tensor(self.targets, tf.int32)}

    def choose(self, step, logits, search):
        ids = tf.gather(search["targets"], tf.minimum(step, tf.shape(search["targets"])[1] - 1),
                        axis=1)  # [n]
        log_probs = tf.gather(tf.nn.log_softmax(logits), ids[:, None], batch_dims=1)[:, 0]
        return ids, log_probs


@register_strategy("sampling")
class SamplingSearch(_OneHypothesis):
    """Random sampling: each step draws every sentence's next token from the model's
    distribution at `temperature`, restricted to its `top_k` most probable tokens (0: all) and
    then to the smallest prefix of those, most probable first, whose probability reaches
    `top_p` (nucleus sampling, Holtzman et al. 2020, arXiv:1904.09751). Back-translation at
    scale samples (Edunov et al. 2018, arXiv:1808.09381).

    Every sentence has its own seed, and its draws depend only on its seed, the step and its
    own logits, not on its row or on the other sentences of its batch. The uniform number of a
    draw is a hash of (seed, step) (`_uniform`): TensorFlow's stateless random ops take one
    seed per op, not one per row. The draw is the inverse of the (truncated) distribution's
    cumulative sum at that number: over the vocabulary in id order without truncation, over
    the candidates sorted by probability with it. A model's logits for a sentence may differ
    between batches in their last float32 bits (kernels block rows by batch size), which can
    move a draw that falls at an interval's edge, as it can move a greedy choice between
    near-equal tokens.

    With `top_k` 1 it is greedy search, whatever the seed. Scores are as greedy search's: the
    sum of the chosen tokens' log-probabilities under the model (temperature 1, no truncation).

    Args:
        seeds: int64 `[batch]`, one per sentence.
        top_k: int >= 0, or an int32 scalar tensor.
        temperature: float > 0, or a float32 scalar tensor; below 1 sharpens, above flattens.
        top_p: float in (0, 1], or a float32 scalar tensor; 1 disables nucleus truncation.
        end_id: the token that finishes a sentence.
    """

    signature_inputs = {"seed": tf.TensorSpec([None], tf.int64, name="seed")}

    def __init__(self, *, seeds, top_k=0, temperature=1.0, top_p=1.0, end_id=END_ID):
        super().__init__(end_id=end_id)
        if not tf.is_tensor(top_k) and not (isinstance(top_k, int) and top_k >= 0):
            raise ValueError(f"top_k={top_k!r} must be an integer >= 0 (0: every token)")
        if not tf.is_tensor(temperature) and not (temperature > 0 and math.isfinite(temperature)):
            raise ValueError(f"temperature={temperature!r} must be a finite number > 0")
        if not tf.is_tensor(top_p) and not 0 < top_p <= 1:
            raise ValueError(f"top_p={top_p!r} must be in (0, 1]")
        self.seeds = seeds
        self.top_k, self.temperature, self.top_p = top_k, temperature, top_p

    @classmethod
    def from_config(cls, config, *, seed, top_k=None, temperature=None, top_p=None,
                    end_id=END_ID):
        return cls(seeds=seed, end_id=end_id,
                   top_k=config.sampling_topk if top_k is None else top_k,
                   temperature=config.sampling_temperature if temperature is None else temperature,
                   top_p=config.sampling_topp if top_p is None else top_p)

    def extra_state(self):
        return {"seeds": tf.cast(self.seeds, tf.int64)}

    def choose(self, step, logits, search):
        vocab_size = tf.shape(logits)[1]
        top_k = tf.convert_to_tensor(self.top_k, tf.int32)
        k = tf.where((top_k > 0) & (top_k < vocab_size), top_k, vocab_size)
        top_p = tf.convert_to_tensor(self.top_p, tf.float32)
        scaled = logits / tf.convert_to_tensor(self.temperature, tf.float32)
        uniform = _uniform(search["seeds"], step)  # [n, 1]

        def every_token():  # no truncation: the vocabulary in id order, no sort
            return _inverse_cdf(tf.nn.softmax(scaled), uniform)

        def truncated():
            candidates, ids = tf.math.top_k(scaled, k=k)  # [n, k], most probable first
            probs = tf.nn.softmax(candidates)
            # Nucleus: keep a candidate while the more probable ones sum to less than top_p
            # (the first is always kept).
            in_nucleus = tf.math.cumsum(probs, axis=1, exclusive=True) < top_p
            position = _inverse_cdf(tf.where(in_nucleus, probs, 0.0), uniform)
            return tf.gather(ids, position[:, None], batch_dims=1)[:, 0]

        chosen = tf.cond((k == vocab_size) & (top_p >= 1.0), every_token, truncated)  # [n]
        log_probs = tf.gather(tf.nn.log_softmax(logits), chosen[:, None], batch_dims=1)[:, 0]
        return chosen, log_probs


def _inverse_cdf(probs, uniform):
    """The index whose interval of the cumulative sum of `probs` float32 `[n, m]` (rows of
    nonnegative weights, not necessarily normalized) holds `uniform` float32 `[n, 1]` in [0, 1)
    times the row's total: int32 `[n]`. A zero weight's interval is empty, so it is never
    chosen: the cumulative sum is monotone and its last value exceeds the target."""
    cumulative = tf.math.cumsum(probs, axis=1)
    target = uniform * cumulative[:, -1:]
    return tf.reduce_sum(tf.cast(cumulative <= target, tf.int32), axis=1)


def decode(strategy: DecodingStrategy, symbols_to_logits_fn, initial_state, *, batch_size,
           max_decode_length, start_id=START_ID, length_caps=None, state_shape_invariants=None,
           context=None):
    """Runs `strategy` over a step function in one `tf.while_loop`.

    Args:
        strategy: a `DecodingStrategy`.
        symbols_to_logits_fn: see the module docstring.
        initial_state: nested structure of tensors with one row per sentence (`[batch, ...]`);
            tiled to the beams after step 0 and gathered to follow them.
        batch_size: int or int32 scalar tensor.
        max_decode_length: int or int32 scalar tensor, the most tokens generated per sentence
            and the number of output columns (>= 1).
        start_id: the token fed at step 0.
        length_caps: optional int32 `[batch]`, per-sentence caps (the paper: source length + 50),
            clipped to [1, max_decode_length]; a sentence that reaches its cap is finished.
        state_shape_invariants: optional `tf.TensorShape`s in the structure of `initial_state`,
            for state tensors whose shape changes from step to step (e.g. growing caches).
        context: optional nested structure of tensors with leading dimension `batch` that the
            step function reads but never changes; gathered as sentences finish.

    Returns:
        the strategy's results (`GreedySearch`: ids `[batch, max_decode_length]` and scores
        `[batch]`; `BeamSearch`: `[batch, num_hypotheses, ...]`), in input order.

    Loop state: `step` int32 `[]`; `active` int32 `[n]`, the input rows of the n sentences still
    decoding; the search state `[n, ...]`; the step function's state `[n * beams, ...]`; the
    context `[n, ...]`; the results `[batch, ...]`.
    """
    has_context = context is not None
    if not has_context:
        context = ()  # an empty structure the loop can carry
    beams = strategy.beams
    caps = _length_caps(length_caps, batch_size, max_decode_length)  # [batch]
    start_ids = tf.fill([batch_size], tf.constant(start_id, tf.int32))
    search = strategy.initialize(start_ids, caps, max_decode_length)

    def cond(step, active, *_):
        return tf.logical_and(step < max_decode_length, tf.size(active) > 0)

    def body(step, active, search, state, context, results, first=False):
        ids = strategy.inputs(search, first)
        if has_context:
            logits, state = symbols_to_logits_fn(ids, step, state, context, 1 if first else beams)
        else:
            logits, state = symbols_to_logits_fn(ids, step, state)
        if first:  # one row per sentence -> the beams
            logits, state = tf.nest.map_structure(lambda t: tile_beams(t, beams), (logits, state))
        search, parents, done = strategy.step(step, logits, search)

        def drop_done():
            # The outputs of the sentences that are done go to the results...
            done_rows = tf.where(done)[:, 0]
            rows = tf.gather(active, done_rows)[:, tf.newaxis]
            new_results = tf.nest.map_structure(
                lambda result, t: tf.tensor_scatter_nd_update(result, rows, tf.gather(t, done_rows)),
                results, strategy.results(search))
            # ...and the others stay: one gather compacts (and reorders) the state.
            keep = tf.where(tf.logical_not(done))[:, 0]  # [kept]
            state_rows = keep if parents is None else tf.reshape(
                tf.gather(parents, keep) + tf.cast(keep, tf.int32)[:, tf.newaxis] * beams, [-1])
            return (*tf.nest.map_structure(lambda t: tf.gather(t, keep),
                                           (active, search, context)),
                    tf.nest.map_structure(lambda t: tf.gather(t, state_rows), state),
                    new_results)

        def keep_all():  # no sentence is done: only the state follows the alive hypotheses
            reordered = state if parents is None else _gather_beams(
                state, parents, tf.shape(parents)[0], beams)
            return active, search, context, reordered, results

        active, search, context, state, results = tf.cond(tf.reduce_any(done), drop_done,
                                                          keep_all)
        return step + 1, active, search, state, context, results

    loop_vars = (tf.constant(0, tf.int32), tf.range(batch_size), search, initial_state, context,
                 strategy.empty_results(batch_size, max_decode_length))
    if strategy.first_step_per_sentence:  # step 0 before the loop, one row per sentence
        loop_vars = body(*loop_vars, first=True)
    invariants = (tf.TensorShape([]), tf.TensorShape([None]), _batch_free(loop_vars[2]),
                  _batch_free(loop_vars[3], state_shape_invariants), _batch_free(loop_vars[4]),
                  tf.nest.map_structure(lambda t: t.shape, loop_vars[5]))
    outputs = tf.while_loop(cond, body, loop_vars, shape_invariants=invariants)
    return strategy.finalize(outputs[-1])


def greedy_search(symbols_to_logits_fn, initial_state, *, end_id=END_ID, **loop_options):
    """`decode` with a `GreedySearch`: ids int32 `[batch, max_decode_length]` (END included
    where produced, `PAD_ID` after it) and scores float32 `[batch]`, the sum of the generated
    tokens' log-probabilities. `loop_options` are `decode`'s keyword arguments."""
    return decode(GreedySearch(end_id=end_id), symbols_to_logits_fn, initial_state,
                  **loop_options)


def beam_search(symbols_to_logits_fn, initial_state, *, beam_size=DecodeConfig.beam_size,
                alpha=DecodeConfig.alpha, num_hypotheses=1, stopping=DecodeConfig.stopping,
                patience=DecodeConfig.patience, end_id=END_ID, **loop_options):
    """`decode` with a `BeamSearch` (see its arguments): ids int32 `[batch, num_hypotheses,
    max_decode_length]` and scores float32 `[batch, num_hypotheses]`, log P / lp, best first.
    `loop_options` are `decode`'s keyword arguments."""
    strategy = BeamSearch(beam_size, alpha=alpha, num_hypotheses=num_hypotheses,
                          stopping=stopping, patience=patience, end_id=end_id)
    return decode(strategy, symbols_to_logits_fn, initial_state, **loop_options)


def sampling_search(symbols_to_logits_fn, initial_state, *, seeds, top_k=0, temperature=1.0,
                    top_p=1.0, end_id=END_ID, **loop_options):
    """`decode` with a `SamplingSearch` (see its arguments): ids int32 `[batch,
    max_decode_length]` and scores float32 `[batch]` (log P of the sampled tokens).
    `loop_options` are `decode`'s keyword arguments."""
    strategy = SamplingSearch(seeds=seeds, top_k=top_k, temperature=temperature, top_p=top_p,
                              end_id=end_id)
    return decode(strategy, symbols_to_logits_fn, initial_state, **loop_options)


class RepetitionGuard:
    """Guards a search against loops (the outputs ``TAAAAAAA...`` of a model given text unlike
    its training data), as CTranslate2's and fairseq's options of the same names do:

    - `no_repeat_ngram_size` n > 0: a token that would complete an n-gram the output already
      holds gets `NEG_INF`, so no n-gram appears twice (with n = 1 no token twice);
    - `repetition_penalty` p != 1: the logit of every token already in the output is divided
      by p where positive and multiplied by p where negative (Keskar et al. 2019,
      arXiv:1909.05858; CTranslate2's rule), so p > 1 makes repeats less likely.

    A step function keeps each row's output so far in its state (`initial_state`, `update`),
    which the search reorders with the rest of the state, so every strategy is guarded alike.

    Args:
        no_repeat_ngram_size: int >= 0, 0 off.
        repetition_penalty: float > 0, 1 off.
    """

    def __init__(self, *, no_repeat_ngram_size: int = 0, repetition_penalty: float = 1.0):
        if not (isinstance(no_repeat_ngram_size, int) and no_repeat_ngram_size >= 0):
            raise ValueError(f"no_repeat_ngram_size={no_repeat_ngram_size!r} must be an "
                             "integer >= 0 (0: off)")
        if not (repetition_penalty > 0 and math.isfinite(repetition_penalty)):
            raise ValueError(f"repetition_penalty={repetition_penalty!r} must be a finite "
                             "number > 0 (1: off)")
        self.no_repeat_ngram_size = no_repeat_ngram_size
        self.repetition_penalty = float(repetition_penalty)

    @classmethod
    def from_config(cls, config: DecodeConfig) -> "RepetitionGuard | None":
        """The guard of `config`'s settings, or None when both are off (no state, no op)."""
        if not config.no_repeat_ngram_size and config.repetition_penalty == 1.0:
            return None
        return cls(no_repeat_ngram_size=config.no_repeat_ngram_size,
                   repetition_penalty=config.repetition_penalty)

    @staticmethod
    def initial_state(rows, max_decode_length):
        """Each row's tokens so far: int32 `[rows, max_decode_length]`, column `step` the token
        fed at that step (START at 0)."""
        return tf.zeros([rows, max_decode_length], tf.int32)

    @staticmethod
    def state_shape():
        return tf.TensorShape([None, None])

    @staticmethod
    def update(history, ids, step):
        """`history` with `ids` int32 `[rows]`, the tokens fed at `step`, in column `step`."""
        return history + tf.one_hot(step, tf.shape(history)[1], dtype=tf.int32) * ids[:, None]

    def apply(self, logits, history, step):
        """float32 `logits` `[rows, vocab]` of the token after `step`, guarded: `history`
        (`update`d with the tokens fed at `step`) holds the output in columns 1 to `step`."""
        logits = tf.cast(logits, tf.float32)
        output = history[:, 1:step + 1]  # [rows, step], the generated tokens
        rows = tf.shape(logits)[0]
        if self.repetition_penalty != 1.0:
            row_ids = tf.repeat(tf.range(rows)[:, None], tf.shape(output)[1], axis=1)
            seen = tf.scatter_nd(tf.stack([tf.reshape(row_ids, [-1]),
                                           tf.reshape(output, [-1])], axis=1),
                                 tf.ones([tf.size(output)], tf.int32), tf.shape(logits)) > 0
            penalty = self.repetition_penalty
            logits = tf.where(seen, tf.where(logits > 0, logits / penalty, logits * penalty),
                              logits)
        n = self.no_repeat_ngram_size
        if n:
            logits = tf.cond(step >= n, lambda: self._ban_ngrams(logits, output, step, n),
                             lambda: logits)
        return logits

    @staticmethod
    def _ban_ngrams(logits, output, length, n):
        """`logits` with `NEG_INF` for each token that follows an earlier occurrence of the
        output's last n - 1 tokens (`output` int32 `[rows, length]`, length >= n)."""
        count = length - n + 1  # the n-grams already complete: they start at 0 ... length - n
        match = tf.ones([tf.shape(output)[0], count], tf.bool)
        for k in range(n - 1):  # the n-gram's first n - 1 tokens equal the output's last
            match &= tf.equal(output[:, k:k + count], output[:, length - n + 1 + k][:, None])
        followers = output[:, n - 1:n - 1 + count]  # [rows, count], each n-gram's last token
        found = tf.cast(tf.where(match), tf.int32)  # [m, 2]: (row, n-gram start)
        banned = tf.stack([found[:, 0], tf.gather_nd(followers, found)], axis=1)
        return tf.tensor_scatter_nd_update(logits, banned,
                                           tf.fill([tf.shape(banned)[0]], NEG_INF))


def tile_beams(tensor, beam_size):
    """`[batch, ...]` -> `[batch * beam, ...]`, each row repeated `beam_size` times in place.

    The layout of the state and ids that beam search passes to the step function: row
    `b * beam_size + j` is beam j of sentence b.
    """
    return tf.repeat(tensor, beam_size, axis=0)


def _top_log_probs(logits, k):
    """The `k` most probable tokens of each row and their log-probabilities:
    float32 and int32 `[rows, k]`, best first (ties: lower id first, as `tf.math.top_k`).

    The top-k of the logits is that of the log-probabilities, so the normalizer is subtracted
    from the k selected only: log p = (logit - max) - log sum(exp(logits - max)). The most
    probable token's probability is 1 / sum(exp(logits - max)), so one Softmax (oneDNN's kernel
    on CPU, a single pass) gives the normalizer faster than an Exp and a Sum over the row.
    """
    top_logits, ids = _top_k(logits, k)  # [rows, k]
    log_sum = -tf.math.log(tf.gather(tf.nn.softmax(logits), ids[:, :1], batch_dims=1))
    return (top_logits - top_logits[:, :1]) - log_sum, ids


def _top_k(values, k, block_size=64):
    """`tf.math.top_k(values, k)` of `[rows, n]`: the same values and indices (ties: lower index
    first), over contiguous blocks of `block_size`.

    A block that holds one of the k first values (in top_k's order) ranks among the k first
    blocks by (maximum, block index): any block ranked before it has a maximum that precedes
    that value. So a max over each block, a top-k over the blocks and a top-k over the k chosen
    blocks' values (gathered in index order, so that ties keep top_k's order) replace a top-k
    over the whole row, whose heap TensorFlow runs element by element (several times slower for
    a [256, 8000] row set than a max and a Softmax together).
    """
    n = values.shape[-1]
    if k == 1 or n is None or n < 4 * k * block_size:  # top_k's k=1 kernel is one max pass
        return tf.math.top_k(values, k=k)
    padding = -n % block_size
    if padding:
        values = tf.pad(values, [[0, 0], [0, padding]], constant_values=float("-inf"))
    rows = tf.shape(values)[0]
    blocks = tf.reshape(values, [rows, -1, block_size])  # [rows, blocks, block_size]
    _, top_blocks = tf.math.top_k(tf.reduce_max(blocks, axis=-1), k=k)  # [rows, k]
    top_blocks = tf.sort(top_blocks, axis=-1)  # index order, so that ties keep theirs
    candidates = tf.reshape(tf.gather(blocks, top_blocks, batch_dims=1), [rows, k * block_size])
    top_values, positions = tf.math.top_k(candidates, k=k)  # [rows, k]
    indices = (tf.gather(top_blocks, positions // block_size, batch_dims=1) * block_size
               + positions % block_size)
    return top_values, indices


def _batch_free(structure, shape_invariants=None):
    """`tf.TensorShape`s of `structure` with a free leading (batch) dimension."""
    if shape_invariants is not None:
        return tf.nest.map_structure(lambda s: tf.TensorShape([None, *s[1:]]), shape_invariants)
    return tf.nest.map_structure(lambda t: tf.TensorShape([None, *t.shape[1:]]), structure)


def _length_caps(length_caps, batch_size, max_decode_length):
    """Per-sentence length caps, int32 `[batch]`, clipped to [1, max_decode_length]."""
    if length_caps is None:
        return tf.fill([batch_size], tf.cast(max_decode_length, tf.int32))
    return tf.clip_by_value(tf.cast(length_caps, tf.int32), 1, max_decode_length)


def _gather_beams(state, parents, batch_size, beam_size):
    """Reorders `[batch * beam, ...]` state so that beam j of sentence b follows `parents[b, j]`.

    Args:
        state: nested structure of `[batch * beam, ...]` tensors.
        parents: int32 `[batch, beam]`, beam indices within each sentence.
    """
    offsets = tf.range(batch_size)[:, tf.newaxis] * beam_size  # [batch, 1]
    flat_parents = tf.reshape(parents + offsets, [-1])  # [batch * beam]
    return tf.nest.map_structure(lambda t: tf.gather(t, flat_parents), state)


def _uniform(seeds, step):
    """One float32 in [0, 1) per row, a function of (seed, step) only: SplitMix64's finalizer
    (Steele et al. 2014) over the seed, then over the seed's hash mixed with the step.

    Args:
        seeds: int64 `[n]`; step: int32 scalar.
    Returns:
        float32 `[n, 1]`.
    """
    def mix(x):  # uint64 arithmetic wraps around, as SplitMix64 needs
        x += tf.constant(0x9E3779B97F4A7C15, tf.uint64)
        x = _xor_shift(x, 30) * tf.constant(0xBF58476D1CE4E5B9, tf.uint64)
        x = _xor_shift(x, 27) * tf.constant(0x94D049BB133111EB, tf.uint64)
        return _xor_shift(x, 31)

    state = mix(tf.bitwise.bitwise_xor(mix(tf.bitcast(seeds, tf.uint64)),
                                       tf.cast(step, tf.uint64)))
    # The top 24 bits: every float32 in [0, 1) that they give is exact.
    top_bits = tf.bitwise.right_shift(state, tf.constant(40, tf.uint64))
    return tf.cast(top_bits, tf.float32)[:, None] * (1.0 / (1 << 24))


def _xor_shift(x, bits):
    return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, tf.constant(bits, tf.uint64)))
