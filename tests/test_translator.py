"""Tests of the Translator (eager, no export): cached search against uncached decoding, beam vs
greedy, batching invariance, bad inputs. See test_export.py for the SavedModel."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.decoding import strategies as decoding
from keras_transformer.config import ConfigError, DecodeConfig
from keras_transformer.decoding.strategies import NEG_INF, PAD_ID
from keras_transformer.data.tokenizers import END_ID, START_ID
from keras_transformer.decoding.translator import Translator
from helpers import seeded_tiny_model

SENTENCES = [
    "Ein Mann fährt Fahrrad.",
    "Zwei Hunde spielen im Schnee.",
    "Eine Frau liest ein Buch im Park, während Kinder neben ihr Fußball spielen.",
    "Hallo",
    "Der Mann's Hut ist rot.",
]
BAD_INPUTS = [
    "",
    "   \t ",
    " ".join(["Wort"] * 2000),
    b"\xff\xfe ung\xc3ltig \x80",  # invalid UTF-8
    "漢字 ☃ 🙂 ʕ•ᴥ•ʔ",  # characters outside the vocabulary
]


@pytest.fixture(scope="module")
def translator(random_translation_model):
    model, tokenizer = random_translation_model
    return Translator(model, tokenizer, tokenizer, DecodeConfig(beam_size=3, alpha=0.6,
                                                                max_extra_length=8))


def texts(tensor):
    return [t.decode("utf-8") for t in np.asarray(tensor).reshape(-1)]


def uncached_greedy(model, source_ids, length_caps, max_decode_length, guard=None):
    """The tutorial's decoding: the whole model re-run on the prefix at every step, argmax;
    `guard(logits, generated)` may change each row's float32 logits in place, given the
    tokens it has generated.

    Returns int32 [batch, max_decode_length] shaped like `decoding.greedy_search`'s ids.
    """
    batch = source_ids.shape[0]
    prefix = np.full([batch, 1], START_ID, np.int32)
    output = np.full([batch, max_decode_length], PAD_ID, np.int32)
    finished = np.zeros([batch], bool)
    for step in range(max_decode_length):
        logits = model((source_ids, prefix), training=False)[:, -1].numpy()  # [batch, vocab]
        if guard is not None:
            logits = logits.astype(np.float32)
            for row in range(batch):
                guard(logits[row], list(prefix[row, 1:]))
        next_ids = np.where(finished, PAD_ID, logits.argmax(-1)).astype(np.int32)
        output[:, step] = next_ids
        finished |= (next_ids == END_ID) | (step + 1 >= length_caps)
        if finished.all():
            break
        prefix = np.concatenate([prefix, next_ids[:, None]], axis=1)
    return output


def sequence_log_probs(model, source_ids, ids):
    """Teacher-forced log P of each row of ids int32 [batch, len] (END-terminated or capped,
    PAD after) -> float64 [batch]."""
    target_in = np.concatenate([np.full([ids.shape[0], 1], START_ID), ids[:, :-1]], axis=1)
    logits = model((source_ids, target_in), training=False).numpy().astype(np.float64)
    log_probs = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    picked = np.take_along_axis(log_probs, ids[:, :, None], axis=-1)[:, :, 0]
    return np.where(ids != PAD_ID, picked, 0.0).sum(axis=1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cached_greedy_equals_uncached_greedy(translator, seed):
    rng = np.random.default_rng(seed)
    model = translator.model
    batch, source_len = 4, 3 + 4 * seed
    source_ids = rng.integers(4, model.config.source_vocab_size, [batch, source_len]).astype(
        np.int32)
    source_ids[:, -1] = END_ID
    source_ids[1, source_len // 2:] = PAD_ID  # a padded sentence
    length_caps = np.array([20, 5, 12, 1], np.int32)
    cached, _ = translator.search(tf.constant(source_ids), "greedy",
                                  length_caps=tf.constant(length_caps))
    expected = uncached_greedy(model, source_ids, length_caps, 20)
    np.testing.assert_array_equal(cached.numpy(), expected)
    assert (expected == END_ID).any(), "the random model never ends: the test lost its edge"


def random_model_like_the_fixture(tokenizer, norm, share):
    """The `random_translation_model` fixture's recipe (seeded Glorot weights, sharper output
    distributions) for any LayerNorm placement and weight sharing."""
    return seeded_tiny_model(tokenizer, seed=11, norm=norm, share=share, output_scale=4.0)


@pytest.mark.parametrize("share", ["target", "all"])
def test_frozen_weights_give_the_live_outputs_and_store_each_tensor_once(
        random_translation_model, share):
    """`frozen_weights` prepares the decoding's weights once: the same strings and scores as
    the translator that prepares them at every call (bit for bit, but for beam scores: beam
    search's first step runs before its loop, where Grappler folds the live translator's
    per-batch transpose of a shared embedding into the logits matmul, which rounds
    differently); the variables are those weights (the model's own are not tracked), the
    embedding matrix of a shared vocabulary once; and they do not follow later changes to the
    model."""
    _, tokenizer = random_translation_model
    model = random_model_like_the_fixture(tokenizer, "pre", share)
    config = DecodeConfig(beam_size=3, alpha=0.6, max_extra_length=8)
    live = Translator(model, tokenizer, tokenizer, config)
    frozen = Translator(model, tokenizer, tokenizer, config, frozen_weights=True)
    source = tf.constant(SENTENCES + BAD_INPUTS[:2])
    for name in ("translate_greedy", "translate_beam", "translate_nbest"):
        expected = getattr(live, name)(source)
        for key, value in getattr(frozen, name)(source).items():
            if name == "translate_greedy" or value.dtype == tf.string:
                np.testing.assert_array_equal(value.numpy(), expected[key].numpy(),
                                              err_msg=name)
            else:
                np.testing.assert_allclose(value.numpy(), expected[key].numpy(), rtol=1e-6,
                                           err_msg=name)

    model_variables = {id(w.value) for w in model.weights}
    assert not model_variables & {id(v) for v in frozen.variables}
    embedding = model.target_embedding.token_embedding.embeddings.numpy()  # [vocab, d]
    stored = {id(v): v.numpy() for v in frozen.variables}.values()
    assert sum(np.array_equal(v, embedding) for v in stored if v.shape == embedding.shape) == 1
    # "all": one matrix for the source and the target; "target": the source has its own.
    assert sum(v.shape == embedding.shape for v in stored) == (1 if share == "all" else 2)
    assert sum(np.array_equal(v, embedding.T) for v in stored if v.shape == embedding.T.shape) == 1

    before = frozen.translate_greedy(source)["score"].numpy()
    model.target_embedding.token_embedding.embeddings.assign(embedding * 0.5)
    np.testing.assert_array_equal(frozen.translate_greedy(source)["score"].numpy(), before)
    assert not np.array_equal(live.translate_greedy(source)["score"].numpy(), before)


@pytest.mark.parametrize("share", ["none", "target", "all"])
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_searches_follow_the_teacher_forced_model(random_translation_model, norm, share):
    """For every layout of the weights (`norm`, `share`), greedy search over the layers'
    decoding steps gives the uncached greedy search over the teacher-forced `call`, and beam
    search's scores are the model's log P / lp of its ids."""
    fixture_model, tokenizer = random_translation_model
    model = fixture_model if (norm, share) == ("post", "none") else (
        random_model_like_the_fixture(tokenizer, norm, share))
    translator = Translator(model, tokenizer, tokenizer,
                            DecodeConfig(beam_size=3, alpha=0.0, max_extra_length=8))
    source_ids = translator.source_ids(tf.constant(SENTENCES + BAD_INPUTS[:1]))
    ids, _ = translator.search(source_ids, "greedy")
    lengths = (source_ids.numpy() != PAD_ID).sum(axis=1)
    caps = np.minimum(lengths + 8, model.config.max_positions)
    np.testing.assert_array_equal(ids, uncached_greedy(model, source_ids.numpy(), caps, ids.shape[1]))
    beam_ids, beam_scores = (t.numpy() for t in translator.search(source_ids, "beam"))
    for rank in range(3):
        np.testing.assert_allclose(beam_scores[:, rank],
                                   sequence_log_probs(model, source_ids, beam_ids[:, rank]),
                                   atol=1e-3)


def test_stopping_rule_follows_the_config(random_translation_model):
    """decode.stopping reaches the search (beam_full stops no later than exact, and the outputs
    of both are model hypotheses) and the rule's description the export records."""
    model, tokenizer = random_translation_model
    searches = {}
    for stopping in ("exact", "beam_full"):
        config = DecodeConfig(beam_size=3, alpha=2.0, max_extra_length=8, stopping=stopping,
                              patience=1.0)
        searches[stopping] = Translator(model, tokenizer, tokenizer, config)
        assert searches[stopping].stopping_rule.startswith(decoding.STOPPING_RULES[stopping])
    assert searches["beam_full"].stopping_rule.endswith("; patience 1")
    source_ids = searches["exact"].source_ids(tf.constant(SENTENCES))
    exact_ids, exact_scores = searches["exact"].search(source_ids, "beam")
    full_ids, full_scores = searches["beam_full"].search(source_ids, "beam")
    # The exact rule returns the best of everything beam_full finished and more.
    assert np.all(exact_scores.numpy()[:, 0] >= full_scores.numpy()[:, 0] - 1e-5)
    assert not np.array_equal(exact_ids, full_ids), "the rules agree here: the test lost its edge"


def test_beam_size_one_equals_greedy(random_translation_model):
    model, tokenizer = random_translation_model
    one = Translator(model, tokenizer, tokenizer, DecodeConfig(beam_size=1, alpha=0.0,
                                                               max_extra_length=8))
    source = tf.constant(SENTENCES)
    greedy, beam = one.translate_greedy(source), one.translate_beam(source)
    assert texts(beam["translation"]) == texts(greedy["translation"])
    np.testing.assert_allclose(beam["score"], greedy["score"], rtol=1e-5)


def test_beam_scores_are_model_scores_and_beat_greedy(random_translation_model):
    """With alpha 0 the beam score is log P. Beam search usually finds a sequence at least as
    probable as greedy's; it may legitimately score lower only when greedy's sequence fell out
    of the beam (k other prefixes were more probable at some step), so then that sequence must
    not be among the beam's finished hypotheses."""
    model, tokenizer = random_translation_model
    beam_size = 4
    search = Translator(model, tokenizer, tokenizer, DecodeConfig(beam_size=beam_size, alpha=0.0,
                                                                  max_extra_length=8))
    source_ids = search.source_ids(tf.constant(SENTENCES))
    greedy_ids, greedy_scores = search.search(source_ids, "greedy")
    beam_ids, beam_scores = search.search(source_ids, "beam")
    greedy_ids, beam_ids = greedy_ids.numpy(), beam_ids.numpy()  # [batch, len], [batch, k, len]
    greedy_scores, beam_scores = greedy_scores.numpy(), beam_scores.numpy()  # [batch], [batch, k]

    np.testing.assert_allclose(greedy_scores, sequence_log_probs(model, source_ids, greedy_ids),
                               atol=1e-3)
    for rank in range(beam_size):
        np.testing.assert_allclose(beam_scores[:, rank],
                                   sequence_log_probs(model, source_ids, beam_ids[:, rank]),
                                   atol=1e-3)
    assert np.all(np.diff(beam_scores, axis=1) <= 1e-6), "n-best not sorted"
    better = beam_scores[:, 0] >= greedy_scores - 1e-4
    for sentence in np.flatnonzero(~better):
        assert not any((beam_ids[sentence, r] == greedy_ids[sentence]).all()
                       for r in range(beam_size)), f"sentence {sentence}: greedy's sequence was " \
                                                   "found but ranked below a worse one"
    assert better.mean() >= 0.8, beam_scores[:, 0] - greedy_scores


def test_the_best_beam_is_the_first_of_the_nbest_of_one_search(random_translation_model):
    """translate_beam and translate_nbest call one beam search, traced once (so an export
    stores it once): the best beam is the n-best's first translation, with its score."""
    model, tokenizer = random_translation_model
    search = Translator(model, tokenizer, tokenizer, DecodeConfig(beam_size=3, alpha=0.6,
                                                                  max_extra_length=8))
    source = tf.constant(SENTENCES)
    best, nbest = search.translate_beam(source), search.translate_nbest(source)
    assert texts(best["translation"]) == texts(nbest["translations"][:, 0])
    np.testing.assert_array_equal(best["score"], nbest["scores"][:, 0])
    assert search.trace_counts()["beam"] == 1


def test_a_beam_translator_at_another_alpha_is_a_translator_made_with_it(
        sentencepiece_tokenizers):
    """`beam_translator(alpha)` gives what a Translator configured with that alpha gives,
    translations and scores bitwise, and one trace serves every alpha (tune-search's grid)."""
    tokenizer = sentencepiece_tokenizers[0]
    # Sharp outputs and a weak END bias: hypotheses end at several lengths, which alpha reranks.
    model = seeded_tiny_model(tokenizer, seed=7, output_scale=4.0)
    bias = model.final_layer.bias.numpy()
    bias[END_ID] = 0.8
    model.final_layer.bias.assign(bias)
    config = DecodeConfig(beam_size=3, alpha=0.6, max_extra_length=8)
    search = Translator(model, tokenizer, tokenizer, config)
    source = tf.constant(SENTENCES + ["Eine Frau singt."])
    results = []
    for alpha in (0.0, 1.5):
        got = search.beam_translator(alpha)(source)
        configured = Translator(model, tokenizer, tokenizer, dataclasses.replace(config,
                                                                                 alpha=alpha))
        want = configured.translate_beam(source)
        assert texts(got["translation"]) == texts(want["translation"]), alpha
        np.testing.assert_array_equal(got["score"], want["score"])
        results.append(texts(got["translation"]))
    assert results[0] != results[1]  # the alphas rank these sentences' beams differently
    assert search.trace_counts()["translate_beam"] == 1
    with pytest.raises(ConfigError, match="alpha=-0.5: must be >= 0"):
        search.beam_translator(-0.5)


@pytest.mark.parametrize("function", ["translate_greedy", "translate_beam", "translate_nbest"])
def test_batch_equals_each_sentence_alone(translator, function):
    """Padding in a batch changes nothing, including for bad inputs; order is preserved."""
    sentences = SENTENCES + BAD_INPUTS
    translate = getattr(translator, function)
    batch = translate(tf.constant(sentences))
    keys = sorted(batch)
    assert all(batch[key].shape[0] == len(sentences) for key in keys)
    for index, sentence in enumerate(sentences):
        alone = translate(tf.constant([sentence]))
        for key in keys:
            if batch[key].dtype == tf.string:
                assert texts(batch[key][index]) == texts(alone[key][0]), (function, sentence)
            else:
                np.testing.assert_allclose(batch[key][index], alone[key][0], rtol=1e-4,
                                           atol=1e-4)


def test_bad_inputs_give_one_valid_output_each(translator):
    model_limit = translator.model.config.max_positions
    for function in (translator.translate_greedy, translator.translate_beam, translator):
        result = function(tf.constant(BAD_INPUTS))
        assert result["translation"].shape == (len(BAD_INPUTS),)
        assert np.all(np.isfinite(result["score"]))
        for text in texts(result["translation"]):  # valid UTF-8 (texts decodes strictly)
            assert len(text.split()) <= model_limit
    nbest = translator.translate_nbest(tf.constant(BAD_INPUTS))
    assert nbest["translations"].shape == (len(BAD_INPUTS), 3)


SIGNATURE_METHODS = ["translate_greedy", "translate_beam", "__call__", "translate_nbest"]
NO_WORDS = ["", "   ", "\t", "\u00a0 \u3000\r\n", "\ufeff", "\u200b\x00 \u00ad"]


class CountingTranslator(Translator):
    """A Translator that counts its searches and the sentences they decode."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.searches, self.searched_rows = tf.Variable(0), tf.Variable(0)

    def _count(self, source_ids):
        self.searches.assign_add(1)
        self.searched_rows.assign_add(tf.shape(source_ids)[0])

    def _search_ids(self, source_ids, *args, **kwargs):
        self._count(source_ids)
        return super()._search_ids(source_ids, *args, **kwargs)

    def counts(self):
        counts = int(self.searches.numpy()), int(self.searched_rows.numpy())
        self.searches.assign(0)
        self.searched_rows.assign(0)
        return counts


@pytest.fixture(scope="module")
def counting(translator):
    return CountingTranslator(translator.model, translator.source_tokenizer,
                              translator.target_tokenizer, translator.decode_config)


def outputs_of(function, sentences):
    return {key: value.numpy() for key, value in function(tf.constant(sentences)).items()}


@pytest.mark.parametrize("function", SIGNATURE_METHODS)
def test_sources_without_words_give_empty_translations_without_decoding(counting, function):
    """"", whitespace-only and invisible sources: "" with score 0 (n-best: then "" with NEG_INF), and no
    search runs for them; in a mixed batch the other sentences are decoded as a batch of their
    own and come out bitwise the same as when translated without the empty ones."""
    translate = getattr(counting, function)
    outputs_of(translate, SENTENCES[:1])  # traced before counting
    counting.counts()
    alone = outputs_of(translate, NO_WORDS)
    assert counting.counts() == (0, 0)
    if function == "translate_nbest":
        assert texts(alone["translations"]) == [""] * 3 * len(NO_WORDS)
        np.testing.assert_array_equal(alone["scores"], [[0.0, NEG_INF, NEG_INF]] * len(NO_WORDS))
    else:
        assert texts(alone["translation"]) == [""] * len(NO_WORDS)
        np.testing.assert_array_equal(alone["score"], np.zeros(len(NO_WORDS)))

    mixed = [NO_WORDS[0], SENTENCES[0], NO_WORDS[1], NO_WORDS[2], SENTENCES[1], SENTENCES[3],
             NO_WORDS[3], NO_WORDS[4], NO_WORDS[5]]
    words = [i for i, sentence in enumerate(mixed) if sentence not in NO_WORDS]
    empty = [i for i, sentence in enumerate(mixed) if sentence in NO_WORDS]
    together = outputs_of(translate, mixed)
    assert counting.counts() == (1, len(words))
    without_empty = outputs_of(translate, [mixed[i] for i in words])
    for key, value in together.items():
        assert value.shape[0] == len(mixed)
        np.testing.assert_array_equal(value[words], without_empty[key])  # bitwise
        np.testing.assert_array_equal(value[empty], alone[key])
    score_key = "scores" if function == "translate_nbest" else "score"
    best_scores = together[score_key][words].reshape(len(words), -1)[:, 0]
    assert (best_scores < 0).all()  # decoded: at least END, with its log-probability


def test_sources_are_normalized_as_training_text(translator):
    """Tabs, repeated, no-break and other Unicode spaces translate as one space would, invisible
    characters (a byte-order mark, zero-width spaces, controls) as if absent, and decomposed
    letters as their precomposed form, as the training text was normalized."""
    clean = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Hallo"]
    messy = ["\ufeffEin Mann\tfa\u0308hrt\tFahrrad.",
             " Zwei  Hunde\u00a0spielen\u2009im \u3000Schnee.\t", "Hal\u00adlo\u200b\x00"]
    for function in SIGNATURE_METHODS:
        translate = getattr(translator, function)
        expected, got = outputs_of(translate, clean), outputs_of(translate, messy)
        for key in expected:
            np.testing.assert_array_equal(got[key], expected[key])
    tokenize = translator.source_tokenizer.tokenize
    assert tokenize(messy).to_list() != tokenize(clean).to_list()  # not equal by themselves


def test_long_source_is_truncated_to_the_model_length(translator):
    """A source longer than max_decode_length is cut to its first max_decode_length - 1 tokens plus END, so
    sentences that share those tokens get the same translation."""
    long_a = " ".join(["Wort"] * 2000)
    long_b = " ".join(["Wort"] * 300 + ["Hund"] * 50)
    source_ids = translator.source_ids(tf.constant([long_a, long_b]))
    limit = translator.model.config.max_positions
    assert source_ids.shape == (2, limit)
    assert (source_ids[:, -1].numpy() == END_ID).all()
    assert translator.search(source_ids, "greedy")[0].shape == (2, limit)  # capped outputs
    result = translator.translate_greedy(tf.constant([long_a, long_b]))
    assert texts(result["translation"])[0] == texts(result["translation"])[1]


def test_empty_batch_gives_empty_outputs(translator):
    empty = tf.constant([], tf.string)
    for function in (translator.translate_greedy, translator.translate_beam, translator):
        result = function(empty)
        assert result["translation"].shape == (0,) and result["score"].shape == (0,)
    nbest = translator.translate_nbest(empty)
    assert nbest["translations"].shape == (0, 3) and nbest["scores"].shape == (0, 3)


def test_output_length_is_capped_by_source_length(random_translation_model):
    model, tokenizer = random_translation_model
    short = Translator(model, tokenizer, tokenizer, DecodeConfig(max_extra_length=1))
    source_ids = short.source_ids(tf.constant(["Hallo", "Ein Hund."]))
    ids, _ = short.search(source_ids, "greedy")
    source_lengths = (source_ids.numpy() != PAD_ID).sum(axis=1)
    generated = (ids.numpy() != PAD_ID).sum(axis=1)
    assert (generated <= source_lengths + 1).all() and ids.shape[1] == max(source_lengths) + 1


@pytest.mark.parametrize("function", ["translate_greedy", "translate_beam"])
def test_decoding_loop_reads_no_variables(translator, function):
    """The loop body sees weights read once per batch: no ReadVariableOp at every step."""
    graph = getattr(translator, function).get_concrete_function().graph
    library = {f.signature.name: f for f in graph.as_graph_def().library.function}
    bodies = [f for name, f in library.items() if "while_body" in name]
    assert bodies
    for body in bodies:
        assert "ReadVariableOp" not in {node.op for node in body.node_def}, body.signature.name


# Scoring given translations.


def test_a_searchs_score_of_its_output_is_the_score_of_that_output(translator):
    """`score_ids` of greedy's and beam's own ids: greedy's log P, and the beam's log P / lp for
    every hypothesis that ended (a hypothesis cut at its cap has no END, which a given
    translation always has)."""
    source_ids = translator.source_ids(tf.constant(SENTENCES))
    greedy_ids, greedy_scores = translator.search(source_ids, "greedy")
    scores, tokens = translator.score_ids(source_ids, greedy_ids)
    ended = (greedy_ids.numpy() == END_ID).any(axis=1)
    assert ended.any()
    np.testing.assert_allclose(scores.numpy()[ended], greedy_scores.numpy()[ended], rtol=1e-5)
    np.testing.assert_array_equal(tokens, (greedy_ids.numpy() != PAD_ID).sum(axis=1))
    beam_ids, beam_scores = (t.numpy() for t in translator.search(source_ids, "beam"))
    checked = 0
    for rank in range(3):
        ids = beam_ids[:, rank]
        scores, tokens = (t.numpy() for t in translator.score_ids(source_ids, ids))
        penalty = decoding.length_penalty(tokens.astype(np.float32), 0.6)
        for row in np.flatnonzero((ids == END_ID).any(axis=1)):
            assert scores[row] / penalty[row] == pytest.approx(beam_scores[row, rank], rel=1e-5)
            checked += 1
    assert checked >= 5


def test_the_score_signature_tokenizes_targets_as_translations_are(translator):
    """`score(source, target)` on texts: the target normalized and tokenized (END added), log P
    and log P / lp; an empty target is END alone; a batch of nothing is nothing."""
    targets = ["A man rides a bike.", "", "  Two   dogs\tplay. ", "x " * 100, "Hallo"]
    result = {k: v.numpy() for k, v in translator.score(tf.constant(SENTENCES),
                                                        tf.constant(targets)).items()}
    target_ids = translator.target_ids(tf.constant(targets)).numpy()
    assert target_ids[1].tolist()[:1] == [END_ID] and result["tokens"][1] == 1
    assert result["tokens"][3] == translator.model.config.max_positions  # truncated, END last
    assert target_ids[3][-1] == END_ID
    same = translator.score(tf.constant(SENTENCES[2:3]), tf.constant(["Two dogs play."]))
    assert result["score"][2] == pytest.approx(float(same["score"][0]), rel=1e-5)
    scores, tokens = translator.score_ids(translator.source_ids(tf.constant(SENTENCES)),
                                          target_ids)
    np.testing.assert_allclose(result["score"], scores, rtol=1e-6)
    np.testing.assert_allclose(result["normalized_score"],
                               result["score"] / decoding.length_penalty(
                                   result["tokens"].astype(np.float32), 0.6), rtol=1e-6)
    assert (result["score"] < 0).all()
    empty = translator.score(tf.constant([], tf.string), tf.constant([], tf.string))
    assert {k: v.shape for k, v in empty.items()} == {"score": (0,), "normalized_score": (0,),
                                                      "tokens": (0,)}


def test_the_output_cap_and_source_limit_are_one_rule_for_numbers_and_tensors():
    """`search_rules.output_cap`, which both runtimes use: source tokens + max_extra_length, at
    least a prefix's tokens + 1, at most max_positions, the same for Python numbers and tensors."""
    from keras_transformer.decoding.search_rules import kept_source_tokens, output_cap

    for source, prefix, want in [(5, 0, 55), (5, 60, 61), (200, 0, 128), (100, 200, 128)]:
        assert output_cap(source, 50, 128, prefix) == want
        assert int(output_cap(tf.constant(source), 50, 128, tf.constant(prefix),
                              minimum=tf.minimum, maximum=tf.maximum)) == want
    assert kept_source_tokens(None, 24) == kept_source_tokens(100, 24) == 24
    assert kept_source_tokens(10, 24) == 10


def guarded_greedy(model, source_ids, length_caps, max_decode_length, n, penalty):
    """`uncached_greedy` with `decoding.RepetitionGuard`'s rules written in numpy: tokens that
    would repeat an n-gram of the output are impossible, and the logits of tokens already in
    the output are divided by `penalty` where positive, multiplied where negative."""
    def guard(logits, generated):
        for token in set(generated):
            value = logits[token]
            logits[token] = value / penalty if value > 0 else value * penalty
        if n and len(generated) >= n:
            last = generated[len(generated) - n + 1:]
            for start in range(len(generated) - n + 1):
                if generated[start:start + n - 1] == last:
                    logits[generated[start + n - 1]] = NEG_INF

    return uncached_greedy(model, source_ids, length_caps, max_decode_length, guard)


def repeated_ngrams(ids, n):
    """The n-grams that occur more than once in each row of `ids` (up to END)."""
    found = []
    for row in np.asarray(ids).reshape(-1, np.asarray(ids).shape[-1]):
        tokens = list(row)  # up to END, or without the PAD after a row that ends at its cap
        tokens = tokens[:tokens.index(END_ID)] if END_ID in tokens else tokens
        while tokens and tokens[-1] == PAD_ID:
            tokens.pop()
        grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
        found.append(sorted({g for g in grams if grams.count(g) > 1}))
    return found


@pytest.fixture(scope="module")
def looping_model(sentencepiece_tokenizers):
    """(model, tokenizer): a random tiny Transformer that loops, as a model does on text unlike
    its training data: three tokens' logits raised, END's lowered, so that its unguarded
    outputs repeat them to their caps."""
    tokenizer = sentencepiece_tokenizers[0]
    model = seeded_tiny_model(tokenizer, seed=11, output_scale=2.0)
    bias = model.final_layer.bias.numpy()
    bias[[40, 41, 42]] += 4.0
    bias[END_ID] = -5.0
    model.final_layer.bias.assign(bias)
    return model, tokenizer


@pytest.mark.parametrize("n, penalty", [(1, 1.0), (2, 1.0), (3, 1.0), (0, 1.5), (2, 1.3)])
def test_the_repetition_guard_follows_a_numpy_reference(looping_model, n, penalty):
    """Greedy search under decode.no_repeat_ngram_size and repetition_penalty equals the
    uncached greedy search with the same rules applied in numpy, step by step, and differs
    from the unguarded search of this looping model."""
    model, tokenizer = looping_model
    translator = Translator(model, tokenizer, tokenizer, DecodeConfig(
        max_extra_length=30, no_repeat_ngram_size=n, repetition_penalty=penalty))
    source_ids = translator.source_ids(tf.constant(SENTENCES))
    caps = tf.fill([len(SENTENCES)], 20)
    ids, _ = translator.search(source_ids, "greedy", length_caps=caps)
    expected = guarded_greedy(model, source_ids.numpy(), caps.numpy(), int(ids.shape[1]), n,
                              penalty)
    np.testing.assert_array_equal(ids.numpy(), expected)
    if n:
        assert repeated_ngrams(ids, n) == [[]] * len(SENTENCES)
    unguarded = guarded_greedy(model, source_ids.numpy(), caps.numpy(), int(ids.shape[1]), 0,
                               1.0)
    assert all(repeated_ngrams(unguarded, max(n, 1)))  # every unguarded output loops
    assert not np.array_equal(ids.numpy(), unguarded)


def test_every_search_is_guarded_and_scores_are_not(looping_model):
    """With no_repeat_ngram_size 2, no greedy, beam, n-best, sampled or prefixed output holds a
    bigram twice, where the unguarded searches of this model do; `score` and `align` read the
    model's own probabilities whatever the guard."""
    model, tokenizer = looping_model
    plain = Translator(model, tokenizer, tokenizer, DecodeConfig(beam_size=3,
                                                                 max_extra_length=30))
    guarded = Translator(model, tokenizer, tokenizer, DecodeConfig(
        beam_size=3, max_extra_length=30, no_repeat_ngram_size=2))
    source_ids = plain.source_ids(tf.constant(SENTENCES))
    caps = tf.fill([len(SENTENCES)], 24)
    seeds = tf.range(len(SENTENCES), dtype=tf.int64)
    prefix = plain.prefix_ids(tf.constant(["a"] * len(SENTENCES)))
    searches = {"greedy": {}, "beam": {}, "sampling": {"seed": seeds, "top_k": 3},
                "prefix": {"prefix": prefix}}
    for name, options in searches.items():
        search = "greedy" if name == "prefix" else name
        plain_ids, _ = plain.search(source_ids, search, length_caps=caps, **dict(options))
        ids, _ = guarded.search(source_ids, search, length_caps=caps, **dict(options))
        assert any(repeated_ngrams(plain_ids, 2)), name  # unguarded, the model loops
        assert not any(repeated_ngrams(ids, 2)), name  # every hypothesis of every sentence
    targets = tf.constant(["a a a a", "two two dogs dogs"])
    sources = tf.constant(SENTENCES[:2])
    np.testing.assert_array_equal(plain.score(sources, targets)["score"].numpy(),
                                  guarded.score(sources, targets)["score"].numpy())
    np.testing.assert_array_equal(plain.align(sources, targets)["alignment"].numpy(),
                                  guarded.align(sources, targets)["alignment"].numpy())
