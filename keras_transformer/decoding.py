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

import tensorflow as tf

from keras_transformer.tokenizers import PAD_ID  # written after END

STOPPING_RULE = ("a sentence stops when its finished set is full and no alive hypothesis can "
                 "beat the worst finished one (exact bound, lp at the length cap), or at its cap")
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
                  end_id=2, length_caps=None, state_shape_invariants=None):
    """Batched greedy decoding: picks the most probable next token of every sentence.

    Args:
        symbols_to_logits_fn: `(ids [batch], step [], state) -> (logits [batch, vocab], state)`,
            see the module docstring.
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
    """
    caps = _length_caps(length_caps, batch_size, max_decode_length)  # [batch]

    def cond(step, ids, output, scores, finished, state):
        return tf.logical_and(step < max_decode_length, tf.logical_not(tf.reduce_all(finished)))

    def body(step, ids, output, scores, finished, state):
        logits, state = symbols_to_logits_fn(ids, step, state)
        next_ids, next_log_probs = _argmax_and_log_prob(tf.cast(logits, tf.float32))  # [batch]
        next_ids = tf.where(finished, PAD_ID, next_ids)
        scores += tf.where(finished, 0.0, next_log_probs)
        # A one-hot blend rather than tensor_scatter_nd_update, whose shape check rejects a
        # statically empty batch.
        output += tf.one_hot(step, max_decode_length, dtype=tf.int32) * next_ids[:, tf.newaxis]
        finished = finished | tf.equal(next_ids, end_id) | (step + 1 >= caps)
        return step + 1, next_ids, output, scores, finished, state

    loop_vars = (
        tf.constant(0, tf.int32),
        tf.fill([batch_size], tf.constant(start_id, tf.int32)),
        tf.zeros([batch_size, max_decode_length], tf.int32),
        tf.zeros([batch_size], tf.float32),
        tf.zeros([batch_size], tf.bool),
        initial_state,
    )
    _, _, output, scores, _, _ = tf.while_loop(
        cond, body, loop_vars,
        shape_invariants=_shape_invariants(loop_vars, state_shape_invariants))
    return output, scores


def beam_search(symbols_to_logits_fn, initial_state, *, batch_size, beam_size, max_decode_length,
                alpha=0.6, start_id=1, end_id=2, length_caps=None, num_hypotheses=1,
                state_shape_invariants=None):
    """Batched beam search with the GNMT length penalty; returns the n best hypotheses.

    Each step expands the `beam_size` alive hypotheses of a sentence by every token and keeps the
    `2 * beam_size` most probable candidates (so that at least `beam_size` of them do not end).
    Candidates that end (END, or the sentence's length cap) and rank among the top `beam_size`
    move to the finished set, scored log P / lp(length); the `beam_size` best candidates that do
    not end stay alive, and the step function's state is reordered to follow them. Thus finished
    hypotheses take a place in the beam as in fairseq, and beam size 1 is exactly greedy search
    (with alpha 0). A sentence is done when it reaches its cap or when its finished set is full and
    no alive hypothesis can beat the worst finished one: log-probabilities only decrease and, for
    alpha >= 0, lp is largest at the cap, so the best alive log P / lp(cap) bounds every future
    score (the early stopping of tensorflow/models).

    Args:
        symbols_to_logits_fn: `(ids [batch * beam], step [], state) -> (logits [batch * beam,
            vocab], state)`, see the module docstring; vocab >= 2.
        initial_state: nested structure of tensors with leading dimension `batch`; tiled here to
            `[batch * beam, ...]` (beams of one sentence adjacent, as `tile_beams` does) and
            gathered every step. Tensors that never change during the search (cross-attention
            keys/values, the source mask) are the same for every beam of a sentence: a step
            function may capture them already tiled with `tile_beams` instead of carrying them
            in the state, which saves reordering them at every step.
        batch_size: int or int32 scalar tensor.
        beam_size: int, the paper uses 4.
        max_decode_length: int (or int32 scalar tensor without XLA), the most tokens generated per
            sentence and the number of output columns.
        alpha: float >= 0, the length penalty exponent; the paper uses 0.6, 0 ranks by log P.
        start_id: the token fed at step 0.
        end_id: the token that finishes a hypothesis.
        length_caps: optional int32 `[batch]`, per-sentence caps (the paper: source length + 50),
            clipped to [1, max_decode_length].
        num_hypotheses: int in [1, beam_size], how many hypotheses to return per sentence.
        state_shape_invariants: optional `tf.TensorShape`s in the structure of `initial_state`
            (batch dimension free), for state tensors whose shape changes from step to step.

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
        done:            bool `[batch]`, the sentences whose search is over.
        state:           the step function's state, `[batch * beam, ...]`.
    """
    if not 1 <= num_hypotheses <= beam_size:
        raise ValueError(f"num_hypotheses={num_hypotheses} must be in [1, beam_size={beam_size}]")
    if alpha < 0:
        raise ValueError(f"alpha={alpha} must be >= 0 (early stopping relies on it)")
    caps = _length_caps(length_caps, batch_size, max_decode_length)  # [batch]
    max_penalty = length_penalty(caps, alpha)  # [batch]

    def cond(step, alive_ids, alive_seq, alive_log_probs, finished_seq, finished_scores,
             finished_flags, done, state):
        return tf.logical_and(step < max_decode_length, tf.logical_not(tf.reduce_all(done)))

    def body(step, alive_ids, alive_seq, alive_log_probs, finished_seq, finished_scores,
             finished_flags, done, state):
        logits, state = symbols_to_logits_fn(tf.reshape(alive_ids, [-1]), step, state)
        log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32))  # [batch * beam, vocab]
        vocab_size = tf.shape(log_probs)[-1]
        log_probs = tf.reshape(log_probs, [batch_size, beam_size, vocab_size])
        candidates = alive_log_probs[:, :, tf.newaxis] + log_probs  # [batch, beam, vocab]
        top_log_probs, top_index = tf.math.top_k(
            tf.reshape(candidates, [batch_size, beam_size * vocab_size]), k=2 * beam_size)
        top_beam = top_index // vocab_size  # [batch, 2 * beam]
        top_ids = top_index % vocab_size  # [batch, 2 * beam]
        top_seq = tf.gather(alive_seq, top_beam, batch_dims=1)  # [batch, 2 * beam, max_decode_length]
        top_seq += tf.one_hot(step, max_decode_length, dtype=tf.int32) * top_ids[:, :, tf.newaxis]

        length = step + 1
        ends = tf.equal(top_ids, end_id) | (length >= caps)[:, tf.newaxis]  # [batch, 2 * beam]

        # Alive: the best candidates that do not end.
        alive_log_probs, alive_pos = tf.math.top_k(
            tf.where(ends, NEG_INF, top_log_probs), k=beam_size)  # [batch, beam]
        alive_ids = tf.gather(top_ids, alive_pos, batch_dims=1)  # [batch, beam]
        alive_seq = tf.gather(top_seq, alive_pos, batch_dims=1)  # [batch, beam, max_decode_length]
        parents = tf.gather(top_beam, alive_pos, batch_dims=1)  # [batch, beam]
        state = _gather_beams(state, parents, batch_size, beam_size)

        # Finished: candidates that end within the top beam_size, merged with the finished set.
        in_beam = tf.range(2 * beam_size) < beam_size  # [2 * beam]
        new_flags = ends & in_beam & (top_log_probs > NEG_INF / 2)  # [batch, 2 * beam]
        new_scores = tf.where(new_flags, top_log_probs / length_penalty(length, alpha), NEG_INF)
        finished_scores, finished_pos = tf.math.top_k(
            tf.concat([finished_scores, new_scores], axis=1), k=beam_size)  # [batch, beam]
        finished_seq = tf.gather(
            tf.concat([finished_seq, top_seq], axis=1), finished_pos, batch_dims=1)
        finished_flags = tf.gather(
            tf.concat([finished_flags, new_flags], axis=1), finished_pos, batch_dims=1)

        # finished_scores[:, -1] is NEG_INF until the finished set is full.
        cannot_improve = alive_log_probs[:, 0] / max_penalty < finished_scores[:, -1]
        done = done | (length >= caps) | cannot_improve
        return (step + 1, alive_ids, alive_seq, alive_log_probs, finished_seq, finished_scores,
                finished_flags, done, state)

    first_beam_only = tf.concat([[0.0], tf.fill([beam_size - 1], NEG_INF)], axis=0)  # [beam]
    loop_vars = (
        tf.constant(0, tf.int32),
        tf.fill([batch_size, beam_size], tf.constant(start_id, tf.int32)),
        tf.zeros([batch_size, beam_size, max_decode_length], tf.int32),
        # All beams start identical: only the first one may expand at step 0.
        tf.tile(first_beam_only[tf.newaxis], [batch_size, 1]),
        tf.zeros([batch_size, beam_size, max_decode_length], tf.int32),
        tf.fill([batch_size, beam_size], NEG_INF),
        tf.zeros([batch_size, beam_size], tf.bool),
        tf.zeros([batch_size], tf.bool),
        tf.nest.map_structure(lambda t: tile_beams(t, beam_size), initial_state),
    )
    outputs = tf.while_loop(cond, body, loop_vars,
                            shape_invariants=_shape_invariants(loop_vars, state_shape_invariants))
    finished_seq, finished_scores, finished_flags = outputs[4:7]
    flags = finished_flags[:, :num_hypotheses]  # [batch, n]
    ids = tf.where(flags[:, :, tf.newaxis], finished_seq[:, :num_hypotheses], PAD_ID)
    scores = tf.where(flags, finished_scores[:, :num_hypotheses], NEG_INF)
    return ids, scores


def tile_beams(tensor, beam_size):
    """`[batch, ...]` -> `[batch * beam, ...]`, each row repeated `beam_size` times in place.

    The layout of the state and ids that `beam_search` passes to the step function: row
    `b * beam_size + j` is beam j of sentence b.
    """
    return tf.repeat(tensor, beam_size, axis=0)


def _argmax_and_log_prob(logits):
    """The most probable token and its log-probability, int32 and float32 `[batch]`.

    Equals `argmax(logits)` (first index on ties) and `log_softmax(logits)` at it, without the
    full log_softmax, and with max/min reductions instead of ArgMax, which XLA on CPU runs about
    3x slower than TensorFlow's kernel.

    Args:
        logits: float32 `[batch, vocab]`.
    """
    max_logits = tf.reduce_max(logits, axis=-1, keepdims=True)  # [batch, 1]
    vocab_size = tf.shape(logits)[-1]
    ids = tf.reduce_min(tf.where(tf.equal(logits, max_logits), tf.range(vocab_size), vocab_size),
                        axis=-1)  # [batch]
    log_probs = -tf.math.log(tf.reduce_sum(tf.exp(logits - max_logits), axis=-1))  # [batch]
    return ids, log_probs


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
