"""Greedy and beam search: one `tf.while_loop` driver and two decoding strategies.

As in OpenNMT-tf (`opennmt/utils/decoding.py`), the loop (`decode`) knows neither the model nor
the search: a `DecodingStrategy` (`GreedySearch`, `BeamSearch`) says how a step's logits extend
each sentence's hypotheses and when a sentence is done, and a step function gives the logits:

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

import tensorflow as tf

from keras_transformer.search_rules import (
    NEG_INF,
    STOPPING_RULES,
    cannot_improve,
    finished_to_stop,
    length_penalty,
)
from keras_transformer.tokenizers import END_ID, PAD_ID, START_ID

__all__ = ["NEG_INF", "STOPPING_RULES", "DecodingStrategy", "GreedySearch", "BeamSearch",
           "decode", "greedy_search", "beam_search", "tile_beams"]


class DecodingStrategy:
    """How a search extends hypotheses; `decode` drives it.

    The search state is a dict of tensors with one row per sentence still decoding. A strategy
    defines `beams` (rows of the step function per sentence) and:

        initialize(batch_size, start_ids, caps, max_decode_length) -> search state (called once
            per search, inside the traced function: the strategy may keep `max_decode_length`)
        inputs(search, first) -> ids int32 `[n * beams]` (`[n]` with `first`)
        step(step, logits, search) -> (search, parents int32 `[n, beams]` or None, done bool `[n]`)
        results(search) -> per-sentence outputs `[n, ...]`, written when a sentence is done
        empty_results(batch_size, max_decode_length) -> the result buffers `[batch, ...]`
        finalize(results) -> (ids, scores)

    `parents` says which row of its sentence each new row continues (None: every row its own).
    """

    beams = 1
    first_step_per_sentence = False  # step 0 on one row per sentence, then tiled to the beams


class GreedySearch(DecodingStrategy):
    """Picks the most probable next token of every sentence.

    Search state: `ids` int32 `[n]` (the last token), `output` int32 `[n, max_decode_length]`,
    `scores` float32 `[n]` (the sum of the tokens' log-probabilities), `caps` int32 `[n]`.
    Results: ids int32 `[batch, max_decode_length]`, scores float32 `[batch]`.
    """

    def __init__(self, *, end_id=END_ID):
        self.end_id = end_id

    def initialize(self, batch_size, start_ids, caps, max_decode_length):
        self.max_decode_length = max_decode_length  # the output columns, for `step`
        return {"ids": start_ids, "output": tf.zeros([batch_size, max_decode_length], tf.int32),
                "scores": tf.zeros([batch_size], tf.float32), "caps": caps}

    def inputs(self, search, first=False):
        return search["ids"]

    def step(self, step, logits, search):
        log_probs, ids = _top_log_probs(tf.cast(logits, tf.float32), 1)  # [n, 1]
        ids, log_probs = ids[:, 0], log_probs[:, 0]
        output = search["output"] + tf.one_hot(
            step, self.max_decode_length, dtype=tf.int32) * ids[:, None]
        done = tf.equal(ids, self.end_id) | (step + 1 >= search["caps"])  # [n]
        return ({"ids": ids, "output": output, "scores": search["scores"] + log_probs,
                 "caps": search["caps"]}, None, done)

    def results(self, search):
        return search["output"], search["scores"]

    def empty_results(self, batch_size, max_decode_length):
        return (tf.zeros([batch_size, max_decode_length], tf.int32),
                tf.zeros([batch_size], tf.float32))

    def finalize(self, results):
        return results


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

    def __init__(self, beam_size, *, alpha=0.6, num_hypotheses=1, stopping="exact",
                 patience=1.0, end_id=END_ID):
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

    def initialize(self, batch_size, start_ids, caps, max_decode_length):
        self.max_decode_length = max_decode_length  # the output columns, for `step`
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
        top_seq += tf.one_hot(step, self.max_decode_length, dtype=tf.int32) * top_ids[:, :, tf.newaxis]

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


def decode(strategy: DecodingStrategy, symbols_to_logits_fn, initial_state, *, batch_size,
           max_decode_length, start_id=START_ID, length_caps=None, state_shape_invariants=None,
           context=None):
    """Runs `strategy` over a step function in one `tf.while_loop`.

    Args:
        strategy: a `GreedySearch` or `BeamSearch`.
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
    search = strategy.initialize(batch_size, start_ids, caps, max_decode_length)

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


def beam_search(symbols_to_logits_fn, initial_state, *, beam_size, alpha=0.6, num_hypotheses=1,
                stopping="exact", patience=1.0, end_id=END_ID, **loop_options):
    """`decode` with a `BeamSearch` (see its arguments): ids int32 `[batch, num_hypotheses,
    max_decode_length]` and scores float32 `[batch, num_hypotheses]`, log P / lp, best first.
    `loop_options` are `decode`'s keyword arguments."""
    strategy = BeamSearch(beam_size, alpha=alpha, num_hypotheses=num_hypotheses,
                          stopping=stopping, patience=patience, end_id=end_id)
    return decode(strategy, symbols_to_logits_fn, initial_state, **loop_options)


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
