"""Tests of greedy and beam search, driven by scripted and random step functions (no model)."""

import functools
import inspect
import itertools

import math

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.decoding import strategies as decoding
from keras_transformer.config import DecodeConfig

START, END = 1, 2


class TableStep:
    """A random step function whose logits depend on the last token, the step and the whole prefix.

    logits = token_table[step, ids] + history_table[hash(sentence, prefix)], where the prefix
    (START and the tokens generated so far) is carried in the state as `history [batch, length]`
    and `sentence [batch]` gives every sentence of a batch its own function. A search that threads
    or reorders the state wrongly scores sequences differently from `log_probs` below, which
    recomputes everything from the prefix in numpy.

    The tables are variables: `reseed` draws new ones, and a search traced with this object
    runs on them without tracing again.
    """

    buckets = 31  # the prefix hash range

    def __init__(self, seed, vocab_size, max_decode_length, scale=2.0):
        self.max_decode_length, self.vocab_size, self.scale = max_decode_length, vocab_size, scale
        self.multipliers = np.array([7 ** t % self.buckets for t in range(max_decode_length)], np.int32)
        self._tables = None
        self.reseed(seed)

    def reseed(self, seed):
        rng = np.random.default_rng(seed)
        shape = (self.max_decode_length, self.vocab_size, self.vocab_size)
        self.token_table = (self.scale * rng.normal(size=shape)).astype(np.float32)
        self.history_table = (self.scale * rng.normal(size=(self.buckets, self.vocab_size))).astype(
            np.float32)
        if self._tables is None:
            self._tables = (tf.Variable(self.token_table), tf.Variable(self.history_table))
        else:
            self._tables[0].assign(self.token_table)
            self._tables[1].assign(self.history_table)
        return self

    def initial_state(self, batch_size):
        return {"history": tf.zeros([batch_size, self.max_decode_length], tf.int32),
                "sentence": tf.range(batch_size, dtype=tf.int32)}

    def __call__(self, ids, step, state):
        history = state["history"] + tf.one_hot(step, self.max_decode_length, dtype=tf.int32) * ids[:, None]
        bucket = (state["sentence"] * 5 + tf.reduce_sum(history * self.multipliers, axis=1)) % (
            self.buckets)
        token_table, history_table = self._tables
        logits = (tf.gather(tf.gather(token_table, step), ids)
                  + tf.gather(history_table, bucket))  # [batch, vocab]
        return logits, {"history": history, "sentence": state["sentence"]}

    def log_probs(self, sentence, prefix):
        """Numpy log-probabilities `[vocab]` of the token after `prefix` (START first)."""
        step = len(prefix) - 1
        bucket = (sentence * 5 + int(np.dot(prefix, self.multipliers[:len(prefix)]))) % self.buckets
        logits = self.token_table[step, prefix[-1]].astype(np.float64) + self.history_table[bucket]
        return logits - np.logaddexp.reduce(logits)

    def sequence_log_prob(self, sentence, tokens):
        prefix = [START]
        total = 0.0
        for token in tokens:
            total += self.log_probs(sentence, prefix)[token]
            prefix.append(token)
        return total


def strip(ids):
    """Generated tokens up to END (included), or all `max_decode_length` of them; padding dropped."""
    ids = list(ids)
    return ids[:ids.index(END) + 1] if END in ids else ids


def padded(tokens, length):
    return list(tokens) + [decoding.PAD_ID] * (length - len(tokens))


def penalty(length, alpha):
    return ((5 + length) / 6) ** alpha


def exhaustive_search(step_fn, sentence, vocab_size, cap, alpha):
    """Every complete sequence (END-terminated, or `cap` tokens long) with its score, best first."""
    results = []
    non_end = [t for t in range(vocab_size) if t != END]
    for length in range(1, cap + 1):
        for body in itertools.product(non_end, repeat=length - 1):
            endings = [END] if length < cap else range(vocab_size)
            for last in endings:
                tokens = list(body) + [last]
                score = step_fn.sequence_log_prob(sentence, tokens) / penalty(length, alpha)
                results.append((score, tokens))
    return sorted(results, key=lambda r: -r[0])


def exact_beam_search(*args, **kwargs):
    """`decoding.beam_search` with the reference's default rule ("exact"; beam_full's patience
    1) where a test does not name one (the package's default is `DecodeConfig`'s)."""
    kwargs.setdefault("stopping", "exact")
    kwargs.setdefault("patience", 1.0)
    return decoding.beam_search(*args, **kwargs)


def reference_beam_search(step_fn, sentence, vocab_size, beam_size, cap, alpha, stopping="exact",
                          patience=1.0):
    """The beam search `decoding.beam_search` documents, written plainly in numpy."""
    alive, finished, finished_count = [(0.0, [START])], [], 0
    for _ in range(cap):
        candidates = sorted(((log_p + step_fn.log_probs(sentence, prefix)[token], prefix + [token])
                             for log_p, prefix in alive for token in range(vocab_size)),
                            key=lambda c: -c[0])[:2 * beam_size]
        ends = [prefix[-1] == END or len(prefix) - 1 == cap for _, prefix in candidates]
        new = [(log_p / penalty(len(prefix) - 1, alpha), prefix[1:])
               for (log_p, prefix), end in zip(candidates[:beam_size], ends) if end]
        finished_count += len(new)
        finished = sorted(finished + new, key=lambda f: -f[0])[:beam_size]
        alive = [c for c, end in zip(candidates, ends) if not end][:beam_size]
        if not alive or (len(finished) == beam_size and (
                (stopping == "beam_full" and finished_count >= math.ceil(patience * beam_size))
                or alive[0][0] / penalty(cap, alpha) < finished[-1][0])):
            break
    return finished


def scripted_step(script):
    """A step function whose logits at step s are `script[s]`, `[max_decode_length, batch, vocab]`,
    for the sentences of `scripted_state(batch)` (finished ones leave the batch)."""
    script = tf.constant(script, tf.float32)

    def step_fn(ids, step, state):
        return tf.gather(tf.gather(script, step), state["sentence"]), state

    return step_fn


def scripted_state(batch_size):
    return {"sentence": tf.range(batch_size)}


def one_hot_logits(tokens, vocab_size, peak=5.0):
    """`[steps, batch, vocab]` logits that put `peak` on tokens `[batch, steps]`."""
    return peak * np.eye(vocab_size, dtype=np.float32)[np.array(tokens).T]


def peak_log_prob(vocab_size, peak=5.0):
    return peak - np.log(np.exp(peak) + vocab_size - 1)


# Greedy search.


def test_greedy_scripted_ids_end_padding_and_scores():
    vocab_size, max_decode_length = 6, 5
    tokens = [[3, 4, END, 5, 5],  # ends at step 2
              [3, 3, 3, 3, 3],  # never ends: stops at max_decode_length
              [END, 4, 4, 4, 4]]  # ends at once
    script = one_hot_logits(tokens, vocab_size)
    ids, scores = decoding.greedy_search(scripted_step(script), scripted_state(3), batch_size=3,
                                         max_decode_length=max_decode_length, start_id=START, end_id=END)
    np.testing.assert_array_equal(ids, [[3, 4, END, 0, 0], [3, 3, 3, 3, 3], [END, 0, 0, 0, 0]])
    assert ids.dtype == tf.int32 and scores.dtype == tf.float32
    np.testing.assert_allclose(scores, np.array([3, 5, 1]) * peak_log_prob(vocab_size), rtol=1e-6,
                               atol=1e-6)  # float32 rounding of a log-probability sum


def test_greedy_per_sentence_max_lengths():
    vocab_size, max_decode_length = 6, 5
    tokens = [[3, 4, 5, 3, 4], [3, 4, END, 3, 3], [5, 5, 5, 5, 5]]
    script = one_hot_logits(tokens, vocab_size)
    ids, scores = decoding.greedy_search(scripted_step(script), scripted_state(3), batch_size=3,
                                         max_decode_length=max_decode_length, length_caps=[2, 4, 9])
    np.testing.assert_array_equal(ids, [[3, 4, 0, 0, 0], [3, 4, END, 0, 0], [5, 5, 5, 5, 5]])
    np.testing.assert_allclose(scores, np.array([2, 3, 5]) * peak_log_prob(vocab_size), rtol=1e-6,
                               atol=1e-6)


def test_greedy_threads_state():
    """Logits come from a counter in the state only; the step counter would give other ids."""
    vocab_size = 8

    def step_fn(ids, step, state):
        token = 3 + state["counter"] % 4  # [batch]
        return 5.0 * tf.one_hot(token, vocab_size), {"counter": state["counter"] + 2}

    ids, _ = decoding.greedy_search(step_fn, {"counter": tf.constant([0, 1])}, batch_size=2,
                                    max_decode_length=4)
    np.testing.assert_array_equal(ids, [[3, 5, 3, 5], [4, 6, 4, 6]])


def test_greedy_feeds_its_own_tokens():
    """Logits depend on `ids` only (next = ids + 1): the fed tokens are the previous outputs."""
    vocab_size = 8

    def step_fn(ids, step, state):
        return 5.0 * tf.one_hot((ids + 1) % vocab_size, vocab_size), state

    ids, _ = decoding.greedy_search(step_fn, {}, batch_size=1, max_decode_length=8, start_id=4)
    np.testing.assert_array_equal(ids, [[5, 6, 7, 0, 1, END, 0, 0]])


def test_greedy_matches_numpy_reference_on_random_function():
    vocab_size, max_decode_length, batch_size = 7, 6, 5
    step_fn = TableStep(0, vocab_size, max_decode_length)
    ids, scores = tf.function(decoding.greedy_search)(
        step_fn, step_fn.initial_state(batch_size), batch_size=batch_size, max_decode_length=max_decode_length)
    for sentence in range(batch_size):
        prefix, total = [START], 0.0
        while len(prefix) <= max_decode_length:
            log_probs = step_fn.log_probs(sentence, prefix)
            prefix.append(int(np.argmax(log_probs)))
            total += log_probs[prefix[-1]]
            if prefix[-1] == END:
                break
        assert list(ids[sentence]) == padded(prefix[1:], max_decode_length)
        np.testing.assert_allclose(scores[sentence], total, rtol=1e-5)


def test_greedy_stops_when_every_sentence_has_ended():
    vocab_size, max_decode_length = 6, 50
    calls = tf.Variable(0)
    tokens = [[3, END] + [4] * (max_decode_length - 2), [END] + [4] * (max_decode_length - 1)]
    script = scripted_step(one_hot_logits(tokens, vocab_size))

    def step_fn(ids, step, state):
        calls.assign_add(1)
        return script(ids, step, state)

    tf.function(decoding.greedy_search)(step_fn, scripted_state(2), batch_size=2,
                                        max_decode_length=max_decode_length)
    assert int(calls.numpy()) == 2


# Beam search.


def test_beam_size_one_equals_greedy():
    vocab_size, max_decode_length, batch_size = 6, 8, 6
    step_fn = TableStep(0, vocab_size, max_decode_length, scale=1.0)
    greedy_search, beam_search = tf.function(decoding.greedy_search), tf.function(exact_beam_search)
    for seed in range(3):
        step_fn.reseed(seed)
        state = step_fn.initial_state(batch_size)
        caps = tf.constant([8, 3, 5, 8, 1, 6])
        greedy_ids, greedy_scores = greedy_search(
            step_fn, state, batch_size=batch_size, max_decode_length=max_decode_length, length_caps=caps)
        beam_ids, beam_scores = beam_search(
            step_fn, state, batch_size=batch_size, beam_size=1, max_decode_length=max_decode_length, alpha=0.0,
            length_caps=caps)
        np.testing.assert_array_equal(beam_ids[:, 0], greedy_ids)
        np.testing.assert_array_equal(beam_scores[:, 0], greedy_scores)


def test_beam_matches_numpy_reference_beam_search():
    """Pruning included: a small beam over a larger vocabulary, per-sentence caps, n-best."""
    vocab_size, max_decode_length, batch_size, beam_size = 8, 7, 4, 3
    caps = [7, 4, 6, 2]
    search = tf.function(exact_beam_search)
    step_fn = TableStep(0, vocab_size, max_decode_length, scale=1.0)
    for seed in range(3):
        step_fn.reseed(seed)
        ids, scores = search(step_fn, step_fn.initial_state(batch_size), batch_size=batch_size,
                             beam_size=beam_size, max_decode_length=max_decode_length, alpha=0.6,
                             length_caps=tf.constant(caps), num_hypotheses=beam_size)
        for sentence, cap in enumerate(caps):
            expected = reference_beam_search(step_fn, sentence, vocab_size, beam_size, cap, 0.6)
            assert ids[sentence].numpy().tolist() == [padded(t, max_decode_length) for _, t in expected]
            np.testing.assert_allclose(scores[sentence], [s for s, _ in expected], rtol=1e-5)


@pytest.mark.parametrize("alpha", [0.6, 1.4])
def test_beam_full_stopping_matches_numpy_reference(alpha):
    """fairseq's and CTranslate2's rule: a sentence stops once beam_size hypotheses finished."""
    vocab_size, max_decode_length, batch_size, beam_size = 8, 7, 4, 3
    caps = [7, 4, 6, 2]
    search = tf.function(exact_beam_search)
    differs = False
    step_fn = TableStep(0, vocab_size, max_decode_length, scale=1.0)
    for seed in range(4):
        step_fn.reseed(seed)
        kwargs = dict(batch_size=batch_size, beam_size=beam_size,
                      max_decode_length=max_decode_length, alpha=alpha,
                      length_caps=tf.constant(caps), num_hypotheses=beam_size)
        ids, scores = search(step_fn, step_fn.initial_state(batch_size), stopping="beam_full",
                             **kwargs)
        exact_ids, _ = search(step_fn, step_fn.initial_state(batch_size), **kwargs)
        differs |= not np.array_equal(ids, exact_ids)
        for sentence, cap in enumerate(caps):
            expected = reference_beam_search(step_fn, sentence, vocab_size, beam_size, cap, alpha,
                                             stopping="beam_full")
            assert ids[sentence].numpy().tolist() == [padded(t, max_decode_length) for _, t in expected]
            np.testing.assert_allclose(scores[sentence], [s for s, _ in expected], rtol=1e-5)
    assert differs, "the two rules never disagree here: the test lost its edge"


def test_beam_full_patience_matches_numpy_reference():
    """Patience p: a sentence stops once p x beam_size hypotheses have finished (or the exact
    bound holds); a patience that never comes gives the exact rule's results."""
    vocab_size, max_decode_length, batch_size, beam_size, alpha = 8, 7, 4, 3, 1.4
    caps = [7, 4, 6, 2]
    search = tf.function(exact_beam_search)
    outputs = {}
    step_fn = TableStep(0, vocab_size, max_decode_length, scale=1.0)
    for seed in range(4):
        step_fn.reseed(seed)
        kwargs = dict(batch_size=batch_size, beam_size=beam_size,
                      max_decode_length=max_decode_length, alpha=alpha,
                      length_caps=tf.constant(caps), num_hypotheses=beam_size)
        for patience in (1.0, 1.5, 2.0, 100.0):
            ids, scores = search(step_fn, step_fn.initial_state(batch_size),
                                 stopping="beam_full", patience=patience, **kwargs)
            outputs[seed, patience] = ids.numpy()
            for sentence, cap in enumerate(caps):
                expected = reference_beam_search(step_fn, sentence, vocab_size, beam_size, cap,
                                                 alpha, stopping="beam_full", patience=patience)
                assert ids[sentence].numpy().tolist() == [
                    padded(t, max_decode_length) for _, t in expected]
                np.testing.assert_allclose(scores[sentence], [s for s, _ in expected], rtol=1e-5)
        exact_ids, _ = search(step_fn, step_fn.initial_state(batch_size), **kwargs)
        np.testing.assert_array_equal(outputs[seed, 100.0], exact_ids)
    assert any(not np.array_equal(outputs[seed, 1.0], outputs[seed, 2.0]) for seed in range(4)), (
        "patience never changes the results here: the test lost its edge")


def test_beam_search_rejects_a_patience_below_one():
    step_fn = TableStep(0, 8, 4, scale=1.0)
    with pytest.raises(ValueError, match="patience=0.5 must be >= 1"):
        exact_beam_search(step_fn, step_fn.initial_state(1), batch_size=1, beam_size=2,
                             max_decode_length=4, stopping="beam_full", patience=0.5)


def test_beam_model_score_at_least_greedy():
    """With alpha 0, beam 4 scores at least as well as greedy, except where the greedy path
    falls out of the beam: beam search is not monotone in the beam size, and the numpy reference
    reproduces every such case (one of these 24 sentences)."""
    vocab_size, max_decode_length, batch_size = 8, 7, 8
    beam_total = greedy_total = 0.0
    step_fn = TableStep(0, vocab_size, max_decode_length, scale=1.0)
    greedy_search, beam_search = tf.function(decoding.greedy_search), tf.function(exact_beam_search)
    for seed in range(3):
        step_fn.reseed(seed)
        state = step_fn.initial_state(batch_size)
        _, greedy_scores = greedy_search(
            step_fn, state, batch_size=batch_size, max_decode_length=max_decode_length)
        beam_ids, beam_scores = beam_search(
            step_fn, state, batch_size=batch_size, beam_size=4, max_decode_length=max_decode_length, alpha=0.0)
        for sentence in range(batch_size):
            beam_log_prob = step_fn.sequence_log_prob(sentence, strip(beam_ids[sentence, 0]))
            np.testing.assert_allclose(beam_scores[sentence, 0], beam_log_prob, rtol=1e-5)
            if beam_log_prob < greedy_scores[sentence] - 1e-5:
                reference = reference_beam_search(step_fn, sentence, vocab_size, 4, max_decode_length, 0.0)
                assert strip(beam_ids[sentence, 0]) == reference[0][1]
                assert reference[0][0] < greedy_scores[sentence]
        beam_total += float(tf.reduce_sum(beam_scores[:, 0]))
        greedy_total += float(tf.reduce_sum(greedy_scores))
    assert beam_total > greedy_total


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_large_beam_equals_exhaustive_search(alpha):
    vocab_size, max_decode_length, batch_size, num_hypotheses = 4, 4, 3, 5
    caps = [4, 2, 3]
    search = tf.function(exact_beam_search)
    step_fn = TableStep(0, vocab_size, max_decode_length)
    for seed in range(3):
        step_fn.reseed(seed)
        # 64 >= every candidate count (4 * 3 ** 2) before the last step: nothing is pruned.
        ids, scores = search(step_fn, step_fn.initial_state(batch_size), batch_size=batch_size,
                             beam_size=64, max_decode_length=max_decode_length, alpha=alpha,
                             length_caps=tf.constant(caps), num_hypotheses=num_hypotheses)
        for sentence, cap in enumerate(caps):
            expected = exhaustive_search(step_fn, sentence, vocab_size, cap, alpha)[:num_hypotheses]
            assert ids[sentence].numpy().tolist() == [padded(t, max_decode_length) for _, t in expected]
            np.testing.assert_allclose(scores[sentence], [s for s, _ in expected], rtol=1e-5)


def test_beam_scores_match_rescored_ids():
    """Normalized scores equal numpy's log P / lp of the returned ids: the state was reordered
    along with the hypotheses (the step function's logits depend on the prefix it carries)."""
    vocab_size, max_decode_length, batch_size, beam_size = 9, 10, 4, 4
    step_fn = TableStep(5, vocab_size, max_decode_length, scale=1.0)
    ids, scores = tf.function(exact_beam_search)(
        step_fn, step_fn.initial_state(batch_size), batch_size=batch_size, beam_size=beam_size,
        max_decode_length=max_decode_length, alpha=0.6, num_hypotheses=beam_size)
    lengths = set()
    for sentence in range(batch_size):
        for hypothesis in range(beam_size):
            tokens = strip(ids[sentence, hypothesis])
            lengths.add(len(tokens))
            expected = step_fn.sequence_log_prob(sentence, tokens) / penalty(len(tokens), 0.6)
            np.testing.assert_allclose(scores[sentence, hypothesis], expected, rtol=1e-5)
    assert len(lengths) > 1  # the function is not trivial: hypotheses end at different steps


def test_beam_n_best_sorted_and_distinct():
    vocab_size, max_decode_length, batch_size, beam_size = 7, 6, 3, 5
    step_fn = TableStep(3, vocab_size, max_decode_length, scale=1.0)
    ids, scores = tf.function(exact_beam_search)(
        step_fn, step_fn.initial_state(batch_size), batch_size=batch_size, beam_size=beam_size,
        max_decode_length=max_decode_length, num_hypotheses=3)
    assert ids.shape == (batch_size, 3, max_decode_length) and scores.shape == (batch_size, 3)
    for sentence in range(batch_size):
        assert np.all(np.diff(scores[sentence]) <= 0)
        assert len({tuple(h) for h in ids[sentence].numpy()}) == 3
        for hypothesis in ids[sentence].numpy():  # padding only after END
            tokens = strip(hypothesis)
            assert list(hypothesis) == padded(tokens, max_decode_length)


def test_beam_stops_early_when_no_hypothesis_can_improve():
    """END is almost certain from step 1 on: the search ends long before max_decode_length."""
    max_decode_length = 40
    calls = tf.Variable(0)

    def step_fn(ids, step, state):
        calls.assign_add(1)
        end_logit = tf.where(step == 0, 0.0, 20.0)
        return tf.tile([[0.0, 0.0, end_logit, 1.0, 0.5]], [tf.shape(ids)[0], 1]), state

    ids, scores = tf.function(exact_beam_search)(step_fn, {}, batch_size=2, beam_size=3,
                                                    max_decode_length=max_decode_length, num_hypotheses=3)
    assert int(calls.numpy()) == 2
    np.testing.assert_array_equal(ids[0, :, :2], [[3, END], [4, END], [0, END]])


def test_beam_n_best_beyond_possible_sequences_are_empty():
    """Only 3 sequences of length 1 exist over 3 tokens: the 4th slot is empty."""
    def step_fn(ids, step, state):
        return tf.zeros([tf.shape(ids)[0], 3]), state

    ids, scores = exact_beam_search(step_fn, {}, batch_size=2, beam_size=4, max_decode_length=1, alpha=0.0,
                                       num_hypotheses=4)
    np.testing.assert_allclose(scores[:, :3], np.full([2, 3], -np.log(3.0)), rtol=1e-6)
    np.testing.assert_array_equal(scores[:, 3], [decoding.NEG_INF] * 2)
    np.testing.assert_array_equal(ids[:, 3], [[0], [0]])


def test_context_rows_and_beams_argument():
    """The context has one row per sentence: the step function is told how many rows of ids
    share one (1 at beam search's step 0, which runs once per sentence; then beam_size)."""
    vocab_size, max_decode_length, batch_size, beam_size = 6, 5, 3, 3
    step_fn = ContextTableStep(4, vocab_size, max_decode_length, scale=1.0)
    seen = []

    def recording_step(ids, step, state, context, beams):
        seen.append(beams)
        return step_fn(ids, step, state, context, beams)

    ids, scores = exact_beam_search(
        recording_step, step_fn.initial_state(batch_size), context=step_fn.context(batch_size),
        batch_size=batch_size, beam_size=beam_size, max_decode_length=max_decode_length,
        num_hypotheses=beam_size)
    assert seen[0] == 1 and set(seen[1:]) == {beam_size}
    expected_ids, expected_scores = exact_beam_search(
        TableStep(4, vocab_size, max_decode_length, scale=1.0), TableStep(
            4, vocab_size, max_decode_length, scale=1.0).initial_state(batch_size),
        batch_size=batch_size, beam_size=beam_size, max_decode_length=max_decode_length,
        num_hypotheses=beam_size)
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-6)


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_growing_state_equals_fixed_state(search):
    """A state that grows by one column per step (with shape invariants, as the decoder's
    growing caches do) gives what the same prefix kept in a fixed-length buffer gives."""
    vocab_size, max_decode_length, batch_size = 6, 5, 3
    step_fn = TableStep(7, vocab_size, max_decode_length)
    fixed_state = step_fn.initial_state(batch_size)

    def growing_step(ids, step, state):
        history = state["history"]  # [batch, step]: the tokens fed before this step
        padded = tf.pad(history, [[0, 0], [0, max_decode_length - step]])
        logits, _ = step_fn(ids, step, {"history": padded, "sentence": state["sentence"]})
        return logits, {"history": tf.concat([history, ids[:, None]], axis=1),
                        "sentence": state["sentence"]}

    growing_state = {"history": tf.zeros([batch_size, 0], tf.int32),
                     "sentence": fixed_state["sentence"]}
    invariants = {"history": tf.TensorShape([None, None]), "sentence": tf.TensorShape([None])}
    if search == "greedy":
        run = tf.function(functools.partial(decoding.greedy_search, batch_size=batch_size,
                                            max_decode_length=max_decode_length))
    else:
        run = tf.function(functools.partial(exact_beam_search, batch_size=batch_size,
                                            beam_size=3, max_decode_length=max_decode_length, num_hypotheses=3))
    expected_ids, expected_scores = run(step_fn, fixed_state)
    ids, scores = run(growing_step, growing_state, state_shape_invariants=invariants)
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-6)


class ContextTableStep(TableStep):
    """TableStep reading each row's sentence from a `context` it never changes."""

    def initial_state(self, batch_size):
        return {"history": super().initial_state(batch_size)["history"]}

    def context(self, batch_size):
        return {"sentence": tf.range(batch_size, dtype=tf.int32)}

    def __call__(self, ids, step, state, context, beams):
        context = tf.nest.map_structure(lambda t: decoding.tile_beams(t, beams), context)
        logits, state = super().__call__(ids, step, {**state, **context})
        return logits, {"history": state["history"]}


def table_step(seed, vocab_size, max_decode_length, batch_size, with_context):
    """A TableStep (or ContextTableStep) and the search's extra arguments (its context)."""
    if with_context:
        step_fn = ContextTableStep(seed, vocab_size, max_decode_length, scale=1.5)
        return step_fn, {"context": step_fn.context(batch_size)}
    return TableStep(seed, vocab_size, max_decode_length, scale=1.5), {}


@pytest.mark.parametrize("search", ["greedy", "beam_exact", "beam_full"])
@pytest.mark.parametrize("with_context", [False, True])
def test_finished_sentences_leave_the_batch(search, with_context):
    """Sentences with other caps finish at other steps and leave the batch (with their state
    and context): every sentence still gets what the numpy reference gives it alone."""
    vocab_size, max_decode_length, batch_size = 7, 9, 6
    caps = [9, 2, 5, 9, 1, 7]
    step_fn, extra = table_step(0, vocab_size, max_decode_length, batch_size, with_context)
    kwargs = dict(batch_size=batch_size, max_decode_length=max_decode_length,
                  length_caps=tf.constant(caps), **extra)
    stopping = {"beam_exact": "exact", "beam_full": "beam_full"}.get(search)
    if search == "greedy":  # beam size 1 with alpha 0 is greedy search
        run = tf.function(functools.partial(decoding.greedy_search, **kwargs))
    else:
        run = tf.function(functools.partial(
            exact_beam_search, beam_size=3, num_hypotheses=2, alpha=0.6, stopping=stopping,
            **kwargs))
    for seed in range(3):
        step_fn.reseed(seed)
        ids, scores = run(step_fn, step_fn.initial_state(batch_size))
        for sentence, cap in enumerate(caps):
            if search == "greedy":
                expected = reference_beam_search(step_fn, sentence, vocab_size, 1, cap, 0.0)
                assert ids[sentence].numpy().tolist() == padded(expected[0][1], max_decode_length)
                np.testing.assert_allclose(scores[sentence], expected[0][0], rtol=1e-5)
            else:
                expected = reference_beam_search(step_fn, sentence, vocab_size, 3, cap, 0.6,
                                                 stopping=stopping)[:2]
                assert ids[sentence].numpy().tolist() == [
                    padded(t, max_decode_length) for _, t in expected]
                np.testing.assert_allclose(scores[sentence], [s for s, _ in expected], rtol=1e-5)


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_growing_state_and_empty_batch(search):
    """A growing state with a free batch dimension, and a batch of 0."""
    vocab_size, max_decode_length = 6, 5
    step_fn = TableStep(7, vocab_size, max_decode_length)

    def growing_step(ids, step, state):
        history = state["history"]
        padded_history = tf.pad(history, [[0, 0], [0, max_decode_length - step]])
        logits, _ = step_fn(ids, step, {"history": padded_history, "sentence": state["sentence"]})
        return logits, {"history": tf.concat([history, ids[:, None]], axis=1),
                        "sentence": state["sentence"]}

    invariants = {"history": tf.TensorShape([None, None]), "sentence": tf.TensorShape([None])}
    for batch_size in (3, 0):
        kwargs = dict(batch_size=batch_size, max_decode_length=max_decode_length)
        if search == "beam":
            kwargs.update(beam_size=3, num_hypotheses=3)
        run = tf.function(functools.partial(
            decoding.greedy_search if search == "greedy" else exact_beam_search, **kwargs))
        expected_ids, expected_scores = run(step_fn, step_fn.initial_state(batch_size))
        growing_state = {"history": tf.zeros([batch_size, 0], tf.int32),
                         "sentence": tf.range(batch_size, dtype=tf.int32)}
        ids, scores = run(growing_step, growing_state, state_shape_invariants=invariants)
        np.testing.assert_array_equal(ids, expected_ids)
        np.testing.assert_allclose(scores, expected_scores, rtol=1e-6)


@pytest.mark.parametrize("n", [256, 1000, 8000])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_top_k_over_blocks_equals_top_k(n, k):
    """Same values and indices as tf.math.top_k, ties (lower index first) and -inf included,
    for rows that are and are not a multiple of the block size."""
    rng = np.random.default_rng(n + k)
    for values in (rng.normal(size=[5, n]), rng.integers(0, 4, size=[5, n]),
                   np.where(rng.random([5, n]) < 0.99, -np.inf, rng.normal(size=[5, n]))):
        values = tf.constant(values, tf.float32)
        expected_values, expected_indices = tf.math.top_k(values, k=k)
        top_values, indices = decoding._top_k(values, k)
        np.testing.assert_array_equal(indices, expected_indices)
        np.testing.assert_array_equal(top_values, expected_values)


def test_top_log_probs_are_log_softmax_at_the_top_k():
    logits = tf.constant(np.random.default_rng(0).normal(size=[4, 3000]) * 5, tf.float32)
    log_probs, ids = decoding._top_log_probs(logits, 6)
    expected_log_probs, expected_ids = tf.math.top_k(tf.nn.log_softmax(logits), k=6)
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_allclose(log_probs, expected_log_probs, rtol=1e-6, atol=1e-6)


def test_beam_argument_checks():
    with pytest.raises(ValueError, match="stopping"):
        exact_beam_search(None, {}, batch_size=1, beam_size=2, max_decode_length=3,
                             stopping="never")
    with pytest.raises(ValueError, match="num_hypotheses"):
        exact_beam_search(None, {}, batch_size=1, beam_size=2, max_decode_length=3, num_hypotheses=3)
    with pytest.raises(ValueError, match="alpha"):
        exact_beam_search(None, {}, batch_size=1, beam_size=2, max_decode_length=3, alpha=-1.0)


# Compilation and edge cases.


def test_batch_size_zero():
    step_fn = TableStep(0, 5, 4)
    state = step_fn.initial_state(0)
    ids, scores = tf.function(decoding.greedy_search)(
        step_fn, state, batch_size=0, max_decode_length=4)
    assert ids.shape == (0, 4) and scores.shape == (0,)
    ids, scores = tf.function(exact_beam_search)(
        step_fn, state, batch_size=0, beam_size=3, max_decode_length=4, num_hypotheses=2)
    assert ids.shape == (0, 2, 4) and scores.shape == (0, 2)


def test_dynamic_batch_size_in_a_signature():
    """As in an exported translator: the batch size is only known when the function runs."""
    step_fn = TableStep(2, 6, 5, scale=1.0)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int32)])
    def translate(sentence):
        batch_size = tf.shape(sentence)[0]
        state = {"history": tf.zeros([batch_size, 5], tf.int32), "sentence": sentence}
        return exact_beam_search(step_fn, state, batch_size=batch_size, beam_size=2,
                                    max_decode_length=5)

    ids, scores = translate(tf.range(3))
    expected_ids, expected_scores = exact_beam_search(
        step_fn, step_fn.initial_state(3), batch_size=3, beam_size=2, max_decode_length=5)
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-6)
    assert translate(tf.zeros([0], tf.int32))[0].shape == (0, 1, 5)


# Sampling.


def sample(step_fn, batch_size, seeds, max_decode_length, **options):
    return tf.function(decoding.sampling_search)(
        step_fn, step_fn.initial_state(batch_size), seeds=tf.constant(seeds, tf.int64),
        batch_size=batch_size, max_decode_length=max_decode_length, **options)


def test_sampling_draws_only_from_the_top_k_and_scores_log_p():
    vocab_size, max_decode_length, batch_size, top_k = 9, 6, 16, 3
    step_fn = TableStep(3, vocab_size, max_decode_length)
    ids, scores = sample(step_fn, batch_size, range(batch_size), max_decode_length, top_k=top_k,
                         temperature=1.5)
    outside_top_2 = 0
    for sentence in range(batch_size):
        tokens, prefix = strip(ids[sentence].numpy()), [START]
        for token in tokens:
            ranks = np.argsort(-step_fn.log_probs(sentence, prefix), kind="stable")
            assert token in ranks[:top_k], (sentence, prefix, token)
            outside_top_2 += token not in ranks[:2]
            prefix.append(token)
        np.testing.assert_allclose(scores[sentence], step_fn.sequence_log_prob(sentence, tokens),
                                   rtol=1e-5)
    assert outside_top_2, "never drew the third token: the test lost its edge"


def test_sampling_top_k_one_is_greedy_whatever_the_seed():
    vocab_size, max_decode_length, batch_size = 7, 6, 5
    step_fn = TableStep(0, vocab_size, max_decode_length)
    greedy_ids, greedy_scores = decoding.greedy_search(
        step_fn, step_fn.initial_state(batch_size), batch_size=batch_size,
        max_decode_length=max_decode_length)
    for seeds in ([0] * batch_size, [11, 3, 8, 2, 99]):
        ids, scores = sample(step_fn, batch_size, seeds, max_decode_length, top_k=1,
                             temperature=3.0)
        np.testing.assert_array_equal(ids, greedy_ids)
        np.testing.assert_allclose(scores, greedy_scores, rtol=1e-6)


def test_sampling_is_reproducible_and_per_sentence():
    """The same seeds give the same output; other seeds other outputs; a sentence's draws
    depend on its own seed only, not on its row or its batch."""
    vocab_size, max_decode_length, batch_size = 9, 8, 6
    step_fn = TableStep(1, vocab_size, max_decode_length, scale=0.5)  # flat: varied samples

    def same_function(batch_size):  # every row the same distribution (sentence 0's)
        return {"history": tf.zeros([batch_size, max_decode_length], tf.int32),
                "sentence": tf.zeros([batch_size], tf.int32)}

    step_fn.initial_state = same_function
    seeds = [5, 6, 7, 8, 9, 10]
    first, _ = sample(step_fn, batch_size, seeds, max_decode_length)
    again, _ = sample(step_fn, batch_size, seeds, max_decode_length)
    other, _ = sample(step_fn, batch_size, [s + 100 for s in seeds], max_decode_length)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    assert len({tuple(row) for row in first.numpy()}) > 1  # distinct seeds, distinct samples
    alone, _ = sample(step_fn, 1, [7], max_decode_length)
    np.testing.assert_array_equal(alone[0], first[2])
    reordered, _ = sample(step_fn, 3, [9, 7, 7], max_decode_length)
    np.testing.assert_array_equal(reordered, first.numpy()[[4, 2, 2]])


def test_sampling_frequencies_follow_the_distribution():
    """4,000 one-token draws: the frequencies of the full distribution at temperature 1, of the
    tempered one, and of the nucleus (top_p), each within 0.03 of its probability."""
    logits = np.array([2.0, 0.0, 1.5, 1.0, 0.5, -1.0], np.float32)

    def step_fn(ids, step, state):
        return tf.tile(logits[None], [tf.shape(ids)[0], 1]), state

    def frequencies(**options):
        ids, _ = decoding.sampling_search(step_fn, {}, seeds=tf.range(4000, dtype=tf.int64),
                                          batch_size=4000, max_decode_length=1, **options)
        return np.bincount(ids[:, 0].numpy(), minlength=len(logits)) / 4000

    def softmax(x):
        return np.exp(x - x.max()) / np.exp(x - x.max()).sum()

    np.testing.assert_allclose(frequencies(), softmax(logits), atol=0.03)
    np.testing.assert_allclose(frequencies(temperature=2.0), softmax(logits / 2), atol=0.03)
    # Nucleus 0.75: tokens 0 and 2 hold 0.63 of the mass, token 3 brings it past 0.75.
    probs = softmax(logits)
    nucleus = np.where(np.isin(np.arange(len(logits)), [0, 2, 3]), probs, 0)
    np.testing.assert_allclose(frequencies(top_p=0.75), nucleus / nucleus.sum(), atol=0.03)
    assert frequencies(top_k=2, top_p=0.1)[0] == 1.0  # the first candidate is always kept


@pytest.mark.parametrize("options, message", [
    (dict(top_k=-1), "top_k=-1 must be an integer >= 0"),
    (dict(temperature=0.0), "temperature=0.0 must be a finite number > 0"),
    (dict(top_p=1.5), r"top_p=1.5 must be in \(0, 1\]"),
    (dict(top_p=0.0), r"top_p=0.0 must be in \(0, 1\]")])
def test_sampling_rejects_settings_out_of_range(options, message):
    with pytest.raises(ValueError, match=message):
        decoding.SamplingSearch(seeds=tf.constant([0], tf.int64), **options)


# The strategy interface.


def test_registered_strategies_and_the_factory_follow_the_config():
    assert list(decoding.STRATEGIES) == ["greedy", "beam", "sampling"]
    config = DecodeConfig(beam_size=3, alpha=1.2, stopping="exact", sampling_topk=5,
                          sampling_temperature=0.7, sampling_topp=0.9)
    beam = decoding.strategy_from_config("beam", config)
    assert (beam.beam_size, beam.alpha, beam.stopping, beam.num_hypotheses) == (3, 1.2, "exact", 3)
    sampling = decoding.strategy_from_config("sampling", config, seed=tf.constant([1], tf.int64))
    assert (sampling.top_k, sampling.temperature, sampling.top_p) == (5, 0.7, 0.9)
    assert isinstance(decoding.strategy_from_config("greedy"), decoding.GreedySearch)
    with pytest.raises(ValueError, match="'nope' is not one of greedy, beam, sampling"):
        decoding.strategy_from_config("nope")
    with pytest.raises(ValueError, match="already registered"):
        decoding.register_strategy("beam")(decoding.GreedySearch)


def test_the_search_defaults_are_the_config_defaults():
    """`BeamSearch`, `beam_search` and `DecodeConfig` agree on every default."""
    config, beam = DecodeConfig(), decoding.BeamSearch()
    assert (beam.beam_size, beam.alpha, beam.stopping) == (
        config.beam_size, config.alpha, config.stopping)
    assert beam.finished_needed == math.ceil(config.patience * config.beam_size)
    defaults = inspect.signature(decoding.beam_search).parameters
    assert {name: defaults[name].default for name in ("beam_size", "alpha", "stopping",
                                                      "patience")} == {
        "beam_size": config.beam_size, "alpha": config.alpha, "stopping": config.stopping,
        "patience": config.patience}


def test_a_strategy_keeps_no_search_state_on_itself():
    """One strategy object drives searches of different lengths, one after the other."""
    vocab_size = 7
    strategy = decoding.BeamSearch(2, alpha=0.0, num_hypotheses=2)
    step_fn = TableStep(4, vocab_size, 6)
    short = decoding.decode(strategy, step_fn, step_fn.initial_state(3), batch_size=3,
                            max_decode_length=3)
    long = decoding.decode(strategy, step_fn, step_fn.initial_state(3), batch_size=3,
                           max_decode_length=6)
    assert short[0].shape == (3, 2, 3) and long[0].shape == (3, 2, 6)
    assert vars(strategy) == vars(decoding.BeamSearch(2, alpha=0.0, num_hypotheses=2))
