"""Greedy and beam search over a cached decoder step function.

The search knows nothing about the model. It drives a step function

    symbols_to_logits_fn(ids, step, state) -> (logits, state)

    ids:    int32 `[batch]`, the token at position `step` (START at step 0).
    step:   int32 scalar, the position of `ids`.
    state:  a nested structure (dicts, lists) of tensors whose leading dimension is the batch,
            e.g. the decoder's self-attention key/value caches preallocated at a fixed length
            `[batch, heads, max_decode_length, head_dim]` and written at `step`, the cross-attention
            keys/values computed once from the encoder output, and the source padding mask.
    logits: `[batch, vocab]`, scores of the token at position `step + 1` (cast to float32 here).

as OpenNMT-tf and tensorflow/models (official/nlp/modeling/ops/beam_search.py) do. Everything is
TensorFlow core ops in one `tf.while_loop` with loop variables of fixed shapes (the output is a
preallocated `[..., max_decode_length]` buffer), so both searches run inside `tf.function`, compile with
`jit_compile=True`, and export to SavedModels that TF Serving can run. The loop stops as soon as
every sentence is done.

Outputs are padded with `PAD_ID` after END and have `max_decode_length` columns (a fixed size, so that
the functions compile with XLA); START is not included. A sentence that reaches its length cap
without producing END is finished as it stands.

Paper, section 6.1: "We used beam search with a beam size of 4 and length penalty alpha = 0.6 ...
We set the maximum output length during inference to input length + 50, but terminate early when
possible." The length penalty is that of Wu et al. 2016 (GNMT, arXiv:1609.08144, eq. 14):
lp(Y) = ((5 + |Y|) / 6) ** alpha, where |Y| counts the generated tokens including END.
"""

from __future__ import annotations

import math

import tensorflow as tf

from keras_transformer.tokenizers import PAD_ID  # written after END

# How beam search decides that a sentence is done (`beam_search(stopping=...)`), as an export's
# provenance records it.
STOPPING_RULES = {
    "exact": ("a sentence stops when its finished set is full and no alive hypothesis can beat "
              "the worst finished one (exact bound, lp at the length cap), or at its cap"),
    "beam_full": ("a sentence stops once patience x beam-size hypotheses have finished "
                  "(fairseq's and CTranslate2's rule; patience 1 is their default), when the "
                  "exact bound holds, or at its cap"),
}

# Log-probability of impossible hypotheses. Finite (as in tensorflow/models) so that arithmetic
# on it never produces NaN; real sequence log-probabilities are assumed to stay above NEG_INF / 2.
NEG_INF = -1e9


def length_penalty(length, alpha):
    """GNMT length penalty ((5 + length) / 6) ** alpha (Wu et al. 2016, eq. 14).

    Args:
        length: int or float tensor of any shape, the number of generated tokens (END included).
        alpha: float, 0 disables the penalty (returns 1).

    Returns:
        float32 tensor of the shape of `length`.
    """
    return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


def greedy_search(symbols_to_logits_fn, initial_state, *, batch_size, max_decode_length, start_id=1,
                  end_id=2, length_caps=None, state_shape_invariants=None, context=None,
                  compact=False):
    """Batched greedy decoding: picks the most probable next token of every sentence.

    Args:
        symbols_to_logits_fn: `(ids [batch], step [], state) -> (logits [batch, vocab], state)`,
            see the module docstring; with `context`, called as `(ids, step, state, context)`.
        initial_state: nested structure of tensors with leading dimension `batch`.
        batch_size: int or int32 scalar tensor.
        max_decode_length: int (or int32 scalar tensor without XLA), the most tokens generated per
            sentence and the number of output columns.
        start_id: the token fed at step 0.
        end_id: the token that finishes a sentence.
        length_caps: optional int32 `[batch]`, per-sentence caps (the paper: source length + 50),
            clipped to [1, max_decode_length]; a sentence that reaches its cap is finished.
        state_shape_invariants: optional `tf.TensorShape`s in the structure of `initial_state`,
            for state tensors whose shape changes from step to step (not under XLA).
        context: optional nested structure of tensors with leading dimension `batch` that the
            step function reads but never changes (e.g. the cross-attention keys/values).
        compact: drop finished sentences from the batch (the state, the context and the ids the
            step function sees), so that they cost nothing in later steps, as CTranslate2 does.
            The step function must then keep everything per-sentence in `state` or `context`
            (nothing captured); not under XLA (the batch dimension changes).

    Returns:
        ids: int32 `[batch, max_decode_length]`, the generated tokens without START, END included where
            produced, `PAD_ID` after it.
        scores: float32 `[batch]`, the sum of the log-probabilities of the generated tokens.

    Loop state (one `tf.while_loop`):
        step:     int32 `[]`, position of `ids`.
        ids:      int32 `[batch]`, the last token (START at step 0, PAD_ID once finished).
        output:   int32 `[batch, max_decode_length]`, zeros from column `step` on.
        scores:   float32 `[batch]`.
        finished: bool `[batch]`.
        state:    the step function's state, `[batch, ...]`.
    With `compact`, `ids`, `output`, `scores`, the caps, the state and the context hold the
    unfinished sentences only (`active` holds their rows), and each sentence's output and
    score are written to the result when it finishes.
    """
    caps = _length_caps(length_caps, batch_size, max_decode_length)  # [batch]

    has_context = context is not None
    if not has_context:
        context = ()  # an empty structure the loops can carry

    def call(ids, step, state, context):
        if not has_context:
            return symbols_to_logits_fn(ids, step, state)
        return symbols_to_logits_fn(ids, step, state, context)

    def next_tokens(ids, step, state, context):
        logits, state = call(ids, step, state, context)
        log_probs, next_ids = _top_log_probs(tf.cast(logits, tf.float32), 1)  # [batch, 1]
        next_ids, next_log_probs = next_ids[:, 0], log_probs[:, 0]
        return next_ids, next_log_probs, state

    start = tf.fill([batch_size], tf.constant(start_id, tf.int32))
    empty_output = tf.zeros([batch_size, max_decode_length], tf.int32)
    if compact:
        return _compact_greedy(next_tokens, initial_state, context, caps, start, empty_output,
                               batch_size, max_decode_length, end_id, state_shape_invariants)

    def cond(step, ids, output, scores, finished, state):
        return tf.logical_and(step < max_decode_length, tf.logical_not(tf.reduce_all(finished)))

    def body(step, ids, output, scores, finished, state):
        next_ids, next_log_probs, state = next_tokens(ids, step, state, context)
        next_ids = tf.where(finished, PAD_ID, next_ids)
        scores += tf.where(finished, 0.0, next_log_probs)
        # A one-hot blend rather than tensor_scatter_nd_update, whose shape check rejects a
        # statically empty batch.
        output += tf.one_hot(step, max_decode_length, dtype=tf.int32) * next_ids[:, tf.newaxis]
        finished = finished | tf.equal(next_ids, end_id) | (step + 1 >= caps)
        return step + 1, next_ids, output, scores, finished, state

    loop_vars = (
        tf.constant(0, tf.int32),
        start,
        empty_output,
        tf.zeros([batch_size], tf.float32),
        tf.zeros([batch_size], tf.bool),
        initial_state,
    )
    _, _, output, scores, _, _ = tf.while_loop(
        cond, body, loop_vars,
        shape_invariants=_shape_invariants(loop_vars, state_shape_invariants))
    return output, scores


def _compact_greedy(next_tokens, initial_state, context, caps, start, empty_output, batch_size,
                    max_decode_length, end_id, state_shape_invariants):
    """`greedy_search` with `compact`: finished sentences leave the batch."""

    def cond(step, active, ids, output, scores, caps, state, context, result_ids, result_scores):
        return tf.logical_and(step < max_decode_length, tf.size(active) > 0)

    def body(step, active, ids, output, scores, caps, state, context, result_ids, result_scores):
        ids, log_probs, state = next_tokens(ids, step, state, context)
        output += tf.one_hot(step, max_decode_length, dtype=tf.int32) * ids[:, tf.newaxis]
        scores += log_probs
        finished = tf.equal(ids, end_id) | (step + 1 >= caps)  # [active]

        def drop_finished():
            done = tf.where(finished)[:, 0]
            rows = tf.gather(active, done)[:, tf.newaxis]
            keep = tf.where(tf.logical_not(finished))[:, 0]
            kept = tf.nest.map_structure(lambda t: tf.gather(t, keep),
                                         (active, ids, output, scores, caps, state, context))
            return (*kept,
                    tf.tensor_scatter_nd_update(result_ids, rows, tf.gather(output, done)),
                    tf.tensor_scatter_nd_update(result_scores, rows, tf.gather(scores, done)))

        def unchanged():
            return active, ids, output, scores, caps, state, context, result_ids, result_scores

        return (step + 1, *tf.cond(tf.reduce_any(finished), drop_finished, unchanged))

    loop_vars = (tf.constant(0, tf.int32), tf.range(batch_size), start, empty_output,
                 tf.zeros([batch_size], tf.float32), caps, initial_state, context, empty_output,
                 tf.zeros([batch_size], tf.float32))
    invariants = (tf.TensorShape([]), tf.TensorShape([None]), tf.TensorShape([None]),
                  tf.TensorShape([None, None]), tf.TensorShape([None]), tf.TensorShape([None]),
                  _batch_free(initial_state, state_shape_invariants), _batch_free(context),
                  tf.TensorShape([None, None]), tf.TensorShape([None]))
    outputs = tf.while_loop(cond, body, loop_vars, shape_invariants=invariants)
    return outputs[-2], outputs[-1]


def finished_to_stop(beam_size: int, patience: float) -> int:
    """How many finished hypotheses end a sentence's search under the "beam_full" rule:
    ceil(patience x beam_size)."""
    return math.ceil(patience * beam_size)


def beam_search(symbols_to_logits_fn, initial_state, *, batch_size, beam_size, max_decode_length,
                alpha=0.6, start_id=1, end_id=2, length_caps=None, num_hypotheses=1,
                state_shape_invariants=None, stopping="exact", patience=1.0, context=None,
                tile_context=True, compact=False, first_step_fn=None):
    """Batched beam search with the GNMT length penalty; returns the n best hypotheses.

    Each step expands the `beam_size` alive hypotheses of a sentence by every token and keeps the
    `2 * beam_size` most probable candidates (so that at least `beam_size` of them do not end).
    Candidates that end (END, or the sentence's length cap) and rank among the top `beam_size`
    move to the finished set, scored log P / lp(length); the `beam_size` best candidates that do
    not end stay alive, and the step function's state is reordered to follow them. Thus finished
    hypotheses take a place in the beam as in fairseq, and beam size 1 is exactly greedy search
    (with alpha 0). A sentence is done when it reaches its cap or, by the `stopping` rule:

    - "exact": when its finished set is full and no alive hypothesis can beat the worst finished
      one: log-probabilities only decrease and, for alpha >= 0, lp is largest at the cap, so the
      best alive log P / lp(cap) bounds every future score (the early stopping of
      tensorflow/models). The result is what the search would return if it ran to the cap.
    - "beam_full": as soon as `patience * beam_size` hypotheses have finished (rounded up;
      patience 1 is fairseq's and CTranslate2's default rule, larger values are the patience
      factor of Kasai et al. 2022, arXiv:2204.05424, CTranslate2's `patience`), or earlier
      when the exact bound holds. A large alpha keeps the exact bound loose, so that sentences
      often run to their cap; this rule's cost does not depend on alpha.

    Args:
        symbols_to_logits_fn: `(ids [batch * beam], step [], state) -> (logits [batch * beam,
            vocab], state)`, see the module docstring; vocab >= 2. With `context`, called as
            `(ids, step, state, context)`.
        initial_state: nested structure of tensors with leading dimension `batch`; tiled here to
            `[batch * beam, ...]` (beams of one sentence adjacent, as `tile_beams` does) and
            gathered every step. Tensors that never change during the search (cross-attention
            keys/values, the source mask) are the same for every beam of a sentence: a step
            function may capture them already tiled with `tile_beams` instead of carrying them
            in the state, which saves reordering them at every step (or pass them as `context`).
        batch_size: int or int32 scalar tensor.
        beam_size: int, the paper uses 4.
        max_decode_length: int (or int32 scalar tensor without XLA), the most tokens generated per
            sentence and the number of output columns.
        alpha: float >= 0, the length penalty exponent; the paper uses 0.6, 0 ranks by log P.
            May be a float32 scalar tensor (one trace for every alpha; not checked here).
        start_id: the token fed at step 0.
        end_id: the token that finishes a hypothesis.
        length_caps: optional int32 `[batch]`, per-sentence caps (the paper: source length + 50),
            clipped to [1, max_decode_length].
        num_hypotheses: int in [1, beam_size], how many hypotheses to return per sentence.
        state_shape_invariants: optional `tf.TensorShape`s in the structure of `initial_state`
            (batch dimension free), for state tensors whose shape changes from step to step.
        stopping: "exact" or "beam_full", see above.
        patience: float >= 1, how many times `beam_size` hypotheses "beam_full" waits for.
        context: optional nested structure of tensors with leading dimension `batch` that the
            step function reads but never changes; tiled to the beams here and never reordered
            (only compacted).
        tile_context: False: the step function gets the context untiled, one row per sentence
            for the `beam_size` consecutive rows of its ids (so that attention over it can
            share the sentence's keys among its beams).
        compact: drop done sentences from the batch, as in `greedy_search` (not under XLA).
        first_step_fn: optional step function for step 0 on one row per sentence: `(ids [batch],
            step, state [batch, ...]) -> (logits [batch, vocab], state [batch, ...])`, with
            `context` `(ids, step, state, context)` and the context untiled. The beams of a
            sentence start from the same START and state, so their step-0 logits are one
            sentence's: run once per sentence, then tiled to the beams (as CTranslate2 expands
            the batch only after the first step), step 0 costs a `beam_size`th of the rows.
            Needs `max_decode_length >= 1`.

    Returns:
        ids: int32 `[batch, num_hypotheses, max_decode_length]`, best first, without START, END included
            where produced, `PAD_ID` after it.
        scores: float32 `[batch, num_hypotheses]`, log P / lp(length). A slot for which no
            hypothesis exists (fewer possible sequences than `num_hypotheses`) has score NEG_INF
            and ids `PAD_ID`.

    Loop state (one `tf.while_loop`):
        step:            int32 `[]`, position of `alive_ids`.
        alive_ids:       int32 `[batch, beam]`, the last token of each alive hypothesis.
        alive_seq:       int32 `[batch, beam, max_decode_length]`, alive hypotheses (columns >= step 0).
        alive_log_probs: float32 `[batch, beam]`, log P of each alive hypothesis, best first.
        finished_seq:    int32 `[batch, beam, max_decode_length]`.
        finished_scores: float32 `[batch, beam]`, log P / lp(length), best first, NEG_INF if empty.
        finished_flags:  bool `[batch, beam]`, whether a finished slot holds a hypothesis.
        finished_count:  int32 `[batch]`, how many hypotheses have finished so far.
        done:            bool `[batch]`, the sentences whose search is over.
        state:           the step function's state, `[batch * beam, ...]`.
    With `compact`, these hold the sentences that are not done (`active` holds their rows; no
    `done`), and each sentence's n best are written to the result when it is done.
    """
    if not 1 <= num_hypotheses <= beam_size:
        raise ValueError(f"num_hypotheses={num_hypotheses} must be in [1, beam_size={beam_size}]")
    if not tf.is_tensor(alpha) and alpha < 0:
        raise ValueError(f"alpha={alpha} must be >= 0 (early stopping relies on it)")
    if stopping not in STOPPING_RULES:
        raise ValueError(f"stopping={stopping!r} is not one of {', '.join(STOPPING_RULES)}")
    if not patience >= 1:
        raise ValueError(f"patience={patience} must be >= 1")
    finished_needed = finished_to_stop(beam_size, patience)
    caps = _length_caps(length_caps, batch_size, max_decode_length)  # [batch]
    max_penalty = length_penalty(caps, alpha)  # [batch]
    has_context = context is not None
    if not has_context:
        context = ()  # an empty structure the loops can carry
    sentence_state, sentence_context = initial_state, context  # one row per sentence
    if has_context and tile_context:
        context = tf.nest.map_structure(lambda t: tile_beams(t, beam_size), context)

    def call(fn, ids, step, state, context):
        return fn(ids, step, state, context) if has_context else fn(ids, step, state)

    def expand(step, alive_ids, alive_seq, alive_log_probs, finished_seq, finished_scores,
               finished_flags, finished_count, caps, max_penalty, state, context, first=False):
        """One step for `n` sentences -> the new alive and finished sets, each sentence's
        `done` bool `[n]`, and the state reordered to follow the alive hypotheses. `first`:
        step 0 by `first_step_fn` on one row per sentence (`state` and `context` unused)."""
        if first:
            logits, state = call(first_step_fn, alive_ids[:, 0], step, sentence_state,
                                 sentence_context)
            logits, state = tf.nest.map_structure(lambda t: tile_beams(t, beam_size),
                                                  (logits, state))
        else:
            logits, state = call(symbols_to_logits_fn, tf.reshape(alive_ids, [-1]), step, state,
                                 context)
        n = tf.shape(alive_ids)[0]
        # The 2 * beam best candidates of each beam first: they hold the 2 * beam best of the
        # sentence, in the same order (ties: lower beam, then lower token id first, as a top-k
        # over [n, beam * vocab] orders them), and the top-k over the whole vocabulary needs no
        # [n * beam, vocab] sum with the alive log-probabilities.
        vocab_size = logits.shape[-1]
        per_beam = min(2 * beam_size, vocab_size) if vocab_size is not None else tf.minimum(
            2 * beam_size, tf.shape(logits)[-1])
        row_log_probs, row_ids = _top_log_probs(tf.cast(logits, tf.float32), per_beam)
        candidates = alive_log_probs[:, :, tf.newaxis] + tf.reshape(
            row_log_probs, [n, beam_size, per_beam])  # [n, beam, per_beam]
        top_log_probs, top_index = tf.math.top_k(
            tf.reshape(candidates, [n, beam_size * per_beam]), k=2 * beam_size)
        top_beam = top_index // per_beam  # [n, 2 * beam]
        top_ids = tf.gather(tf.reshape(row_ids, [n, -1]), top_index, batch_dims=1)  # [n, 2 * beam]
        top_seq = tf.gather(alive_seq, top_beam, batch_dims=1)  # [n, 2 * beam, max_decode_length]
        top_seq += tf.one_hot(step, max_decode_length, dtype=tf.int32) * top_ids[:, :, tf.newaxis]

        length = step + 1
        ends = tf.equal(top_ids, end_id) | (length >= caps)[:, tf.newaxis]  # [n, 2 * beam]

        # Alive: the best candidates that do not end.
        alive_log_probs, alive_pos = tf.math.top_k(
            tf.where(ends, NEG_INF, top_log_probs), k=beam_size)  # [n, beam]
        alive_ids = tf.gather(top_ids, alive_pos, batch_dims=1)  # [n, beam]
        alive_seq = tf.gather(top_seq, alive_pos, batch_dims=1)  # [n, beam, max_decode_length]
        parents = tf.gather(top_beam, alive_pos, batch_dims=1)  # [n, beam]

        # Finished: candidates that end within the top beam_size, merged with the finished set.
        in_beam = tf.range(2 * beam_size) < beam_size  # [2 * beam]
        new_flags = ends & in_beam & (top_log_probs > NEG_INF / 2)  # [n, 2 * beam]
        new_scores = tf.where(new_flags, top_log_probs / length_penalty(length, alpha), NEG_INF)
        finished_scores, finished_pos = tf.math.top_k(
            tf.concat([finished_scores, new_scores], axis=1), k=beam_size)  # [n, beam]
        finished_seq = tf.gather(
            tf.concat([finished_seq, top_seq], axis=1), finished_pos, batch_dims=1)
        finished_flags = tf.gather(
            tf.concat([finished_flags, new_flags], axis=1), finished_pos, batch_dims=1)
        finished_count += tf.reduce_sum(tf.cast(new_flags, tf.int32), axis=1)

        # finished_scores[:, -1] is NEG_INF until the finished set is full.
        stop = alive_log_probs[:, 0] / max_penalty < finished_scores[:, -1]
        if stopping == "beam_full":  # or earlier, when nothing can change any more
            stop |= finished_count >= finished_needed
        done = (length >= caps) | stop
        return (alive_ids, alive_seq, alive_log_probs, finished_seq, finished_scores,
                finished_flags, finished_count, done, parents, state)

    first_beam_only = tf.concat([[0.0], tf.fill([beam_size - 1], NEG_INF)], axis=0)  # [beam]
    start = (
        tf.fill([batch_size, beam_size], tf.constant(start_id, tf.int32)),
        tf.zeros([batch_size, beam_size, max_decode_length], tf.int32),
        # All beams start identical: only the first one may expand at step 0.
        tf.tile(first_beam_only[tf.newaxis], [batch_size, 1]),
        tf.zeros([batch_size, beam_size, max_decode_length], tf.int32),
        tf.fill([batch_size, beam_size], NEG_INF),
        tf.zeros([batch_size, beam_size], tf.bool),
        tf.zeros([batch_size], tf.int32),
    )
    initial_state = tf.nest.map_structure(lambda t: tile_beams(t, beam_size), initial_state)
    if compact:
        finished_seq, finished_scores, finished_flags = _compact_beam(
            expand, start, caps, max_penalty, initial_state, context, batch_size, beam_size,
            max_decode_length, num_hypotheses, state_shape_invariants, tile_context,
            first_step=first_step_fn is not None)
    else:
        def cond(step, alive_ids, alive_seq, alive_log_probs, finished_seq, finished_scores,
                 finished_flags, finished_count, done, state):
            return tf.logical_and(step < max_decode_length, tf.logical_not(tf.reduce_all(done)))

        def body(step, alive_ids, alive_seq, alive_log_probs, finished_seq, finished_scores,
                 finished_flags, finished_count, done, state, first=False):
            (alive_ids, alive_seq, alive_log_probs, new_seq, new_scores, new_flags,
             finished_count, now_done, parents, state) = expand(
                step, alive_ids, alive_seq, alive_log_probs, finished_seq, finished_scores,
                finished_flags, finished_count, caps, max_penalty, state, context, first)
            state = _gather_beams(state, parents, batch_size, beam_size)
            # A sentence that is done keeps its finished set (under "exact" nothing could enter
            # it any more; under "beam_full" a later candidate could, after the stop).
            finished_seq = tf.where(done[:, tf.newaxis, tf.newaxis], finished_seq, new_seq)
            finished_scores = tf.where(done[:, tf.newaxis], finished_scores, new_scores)
            finished_flags = tf.where(done[:, tf.newaxis], finished_flags, new_flags)
            return (step + 1, alive_ids, alive_seq, alive_log_probs, finished_seq,
                    finished_scores, finished_flags, finished_count, done | now_done, state)

        loop_vars = (tf.constant(0, tf.int32), *start, tf.zeros([batch_size], tf.bool),
                     initial_state)
        if first_step_fn is not None:  # step 0 before the loop, one row per sentence
            loop_vars = body(*loop_vars, first=True)
        outputs = tf.while_loop(
            cond, body, loop_vars,
            shape_invariants=_shape_invariants(loop_vars, state_shape_invariants))
        finished_seq, finished_scores, finished_flags = outputs[4:7]
    flags = finished_flags[:, :num_hypotheses]  # [batch, n]
    ids = tf.where(flags[:, :, tf.newaxis], finished_seq[:, :num_hypotheses], PAD_ID)
    scores = tf.where(flags, finished_scores[:, :num_hypotheses], NEG_INF)
    return ids, scores


def _compact_beam(expand, start, caps, max_penalty, state, context, batch_size, beam_size,
                  max_decode_length, num_hypotheses, state_shape_invariants, tile_context,
                  first_step=False):
    """`beam_search`'s loop with `compact`: done sentences leave the batch. Returns the
    finished sequences, scores and flags of every sentence, `[batch, num_hypotheses, ...]`.
    `first_step`: step 0 runs before the loop, by `expand(..., first=True)`."""

    def cond(step, active, *_):
        return tf.logical_and(step < max_decode_length, tf.size(active) > 0)

    def body(step, active, alive_ids, alive_seq, alive_log_probs, finished_seq, finished_scores,
             finished_flags, finished_count, caps, max_penalty, state, context, result_seq,
             result_scores, result_flags, first=False):
        (alive_ids, alive_seq, alive_log_probs, finished_seq, finished_scores, finished_flags,
         finished_count, done, parents, state) = expand(
            step, alive_ids, alive_seq, alive_log_probs, finished_seq, finished_scores,
            finished_flags, finished_count, caps, max_penalty, state, context, first)
        carried = (active, alive_ids, alive_seq, alive_log_probs, finished_seq, finished_scores,
                   finished_flags, finished_count, caps, max_penalty)

        def drop_done():
            # The n best of the sentences that are done go to the result...
            done_pos = tf.where(done)[:, 0]
            rows = tf.gather(active, done_pos)[:, tf.newaxis]
            results = tuple(
                tf.tensor_scatter_nd_update(result, rows,
                                            tf.gather(t[:, :num_hypotheses], done_pos))
                for result, t in ((result_seq, finished_seq), (result_scores, finished_scores),
                                  (result_flags, finished_flags)))
            # ...and the others stay: one gather reorders and compacts the state.
            keep = tf.where(tf.logical_not(done))[:, 0]  # [kept]
            kept_rows = tf.reshape(tf.gather(parents, keep)
                                   + tf.cast(keep, tf.int32)[:, tf.newaxis] * beam_size,
                                   [-1])  # [kept * beam]
            context_rows = tf.reshape(
                tf.cast(keep, tf.int32)[:, tf.newaxis] * beam_size + tf.range(beam_size),
                [-1]) if tile_context else keep
            return (tf.nest.map_structure(lambda t: tf.gather(t, keep), carried),
                    tf.nest.map_structure(lambda t: tf.gather(t, kept_rows), state),
                    tf.nest.map_structure(lambda t: tf.gather(t, context_rows), context),
                    results)

        def reorder():  # no sentence is done: only the state follows the alive hypotheses
            return (carried, _gather_beams(state, parents, tf.shape(parents)[0], beam_size),
                    context, (result_seq, result_scores, result_flags))

        kept, state, context, (result_seq, result_scores, result_flags) = tf.cond(
            tf.reduce_any(done), drop_done, reorder)
        return (step + 1, *kept, state, context, result_seq, result_scores, result_flags)

    result_seq = tf.zeros([batch_size, num_hypotheses, max_decode_length], tf.int32)
    result_scores = tf.fill([batch_size, num_hypotheses], NEG_INF)
    result_flags = tf.zeros([batch_size, num_hypotheses], tf.bool)
    loop_vars = (tf.constant(0, tf.int32), tf.range(batch_size), *start, caps, max_penalty,
                 state, context, result_seq, result_scores, result_flags)
    invariants = tf.nest.map_structure(
        lambda t: tf.TensorShape([None, *t.shape[1:]]), loop_vars[1:11])
    invariants = (tf.TensorShape([]), *invariants,
                  _batch_free(state, state_shape_invariants), _batch_free(context),
                  result_seq.shape, result_scores.shape, result_flags.shape)
    if first_step:
        loop_vars = body(*loop_vars, first=True)
    outputs = tf.while_loop(cond, body, loop_vars, shape_invariants=invariants)
    return outputs[-3:]


def tile_beams(tensor, beam_size):
    """`[batch, ...]` -> `[batch * beam, ...]`, each row repeated `beam_size` times in place.

    The layout of the state and ids that `beam_search` passes to the step function: row
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


def _shape_invariants(loop_vars, state_shape_invariants):
    """`tf.while_loop` shape invariants: every loop variable keeps its shape except the state
    (the last loop variable), which follows `state_shape_invariants` when given."""
    if state_shape_invariants is None:
        return None
    return (*tf.nest.map_structure(lambda t: t.shape, loop_vars[:-1]),
            state_shape_invariants)


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
