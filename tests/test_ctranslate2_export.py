"""Tests of the CTranslate2 export and translator: the same outputs as `Translator` (greedy and
beam, post-norm untied and pre-norm fully tied models), the settings file, refused tokenizers,
int8, empty sources, and the layout facts the converter relies on."""

import dataclasses
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

pytest.importorskip("ctranslate2")

from ctranslate2.specs.model_spec import OPTIONAL  # noqa: E402

from keras_transformer.config import ConfigError, DecodeConfig, ModelConfig  # noqa: E402
from keras_transformer.export.ctranslate2 import (  # noqa: E402
    KerasTransformerConverter,
    export_ctranslate2,
)
from keras_transformer.export.ctranslate2_runtime import (  # noqa: E402
    _cut,
    SETTINGS_FILE,
    CTranslate2Translator,
)
from keras_transformer.decoding.strategies import NEG_INF, PAD_ID  # noqa: E402
from keras_transformer.layers import positional_encoding  # noqa: E402
from keras_transformer.model import Transformer  # noqa: E402
from keras_transformer.data.text_normalization import NORMALIZATION  # noqa: E402
from keras_transformer.data.tokenizers import END_ID  # noqa: E402
from keras_transformer.decoding.translator import Translator  # noqa: E402
from helpers import seeded_tiny_model  # noqa: E402

MAX_LENGTH = 24  # both test models' max_positions
SENTENCES = [
    "Ein Mann fährt Fahrrad.",
    "Zwei Hunde spielen im Schnee.",
    # 34 tokens with START and END: truncated to the model's 24 positions
    "Eine Frau liest ein Buch im Park, während Kinder neben ihr Fußball spielen und ein alter "
    "Mann auf der Bank sitzt und Zeitung liest.",
    "Hallo",
    "Der Mann's Hut ist rot.",
    "Kinder (drei) laufen über die Straße!",
    "漢字 ☃ 🙂",  # byte-fallback pieces
    "Ein kleines Mädchen klettert in ein Spielhaus aus Holz.",
    "Zwei Männer stehen am Herd und bereiten Essen zu.",
    "Ein Hund rennt.",
    "Leute",
    "Eine Gruppe von Menschen steht vor einem Iglu.",
]
DECODE = DecodeConfig(beam_size=4, alpha=0.6, max_extra_length=8, stopping="exact")


@pytest.fixture(scope="module")
def pre_norm_model(sentencepiece_tokenizers):
    """A random tiny pre-norm Transformer with every embedding shared (share_embeddings "all").

    Built as `random_translation_model` is (seeded numpy weights), with nonzero biases and
    LayerNorm parameters so that a misplaced one shows. The tied projection has no bias: the
    final LayerNorm's beta along END's embedding acts as one, so that some outputs end early
    and others run to their cap.
    """
    tokenizer = sentencepiece_tokenizers[0]
    model = seeded_tiny_model(tokenizer, seed=11, norm="pre", share="all",
                              max_positions=MAX_LENGTH, perturb_vectors=True)
    embeddings = model.target_embedding.token_embedding.embeddings
    embeddings.assign(embeddings * 2.0)
    end = embeddings.numpy()[END_ID]
    beta = model.decoder.final_layernorm.beta
    beta.assign(beta + 1.5 * end / np.linalg.norm(end))
    return model, tokenizer


@pytest.fixture(scope="module", params=["post_none", "pre_all"])
def models(request, random_translation_model, pre_norm_model):
    """(model, tokenizer): the post-norm untied fixture model, then the pre-norm tied one."""
    return random_translation_model if request.param == "post_none" else pre_norm_model


def exact_ct2(folder):
    """A CTranslate2Translator with the rule that reproduces `Translator` exactly."""
    return CTranslate2Translator(folder, beam_rule="exact")


def export(model, tokenizer, folder, decode_config=DECODE, **kwargs):
    return export_ctranslate2(model, tokenizer, tokenizer, decode_config, folder, **kwargs)


def texts(array):
    return [t.decode("utf-8") if isinstance(t, bytes) else t for t in
            np.asarray(array, dtype=object).reshape(-1)]


def tf_texts(tensor):
    return [t.decode("utf-8") for t in tensor.numpy().reshape(-1)]


def test_greedy_matches_translator(models, tmp_path):
    model, tokenizer = models
    translator = Translator(model, tokenizer, tokenizer, DECODE)
    ct2 = exact_ct2(export(model, tokenizer, tmp_path / "ct2"))
    source_ids = translator.source_ids(tf.constant(SENTENCES))
    ids, scores = translator.search(source_ids, "greedy")
    ours = [[int(i) for i in row if i != PAD_ID] for row in ids.numpy()]
    found = ct2.greedy_ids(SENTENCES)
    caps = np.minimum((source_ids.numpy() != PAD_ID).sum(axis=1) + DECODE.max_extra_length,
                      MAX_LENGTH)

    assert len(tokenizer.tokenize(tf.constant(SENTENCES[2:3]))[0]) > MAX_LENGTH
    # What the caps and min_decoding_length=0 are about: the fixture model's outputs are END
    # alone, the pre-norm model's run to their cap or end early.
    if model.config.norm == "post":
        assert all(row == [END_ID] for row in ours)
    else:
        assert any(len(row) == cap for row, cap in zip(ours, caps))
        assert any(row[-1:] == [END_ID] for row in ours)
    assert [row for row, _ in found] == ours
    np.testing.assert_allclose([score for _, score in found], scores.numpy(), atol=1e-3)


def test_sampling_top_k_one_agrees_with_the_savedmodel_and_greedy(pre_norm_model, tmp_path):
    """Where the definitions meet (top-k 1, any temperature and seed): CTranslate2's sampling,
    the Translator's and greedy search give the same translations and log P."""
    model, tokenizer = pre_norm_model
    decode = DecodeConfig(max_extra_length=8, sampling_topk=1, sampling_temperature=1.7)
    translator = Translator(model, tokenizer, tokenizer, decode)
    ct2 = exact_ct2(export(model, tokenizer, tmp_path / "ct2", decode))
    ours = translator.translate_sampling(tf.constant(SENTENCES),
                                         tf.range(len(SENTENCES), dtype=tf.int64) * 977)
    greedy = translator.translate_greedy(tf.constant(SENTENCES))
    for seed in (0, 5):
        theirs = ct2.translate_sampling(SENTENCES, seed)
        assert texts(theirs["translation"]) == tf_texts(ours["translation"])
        np.testing.assert_allclose(theirs["score"], ours["score"].numpy(), atol=1e-3)
    assert tf_texts(ours["translation"]) == tf_texts(greedy["translation"])
    np.testing.assert_allclose(ours["score"], greedy["score"], rtol=1e-6)


def test_ctranslate2_sampling_stays_in_the_top_k_and_scores_log_p(pre_norm_model, tmp_path):
    """Every drawn token is among the 4 most probable after its prefix, and the score is the
    sum of the tokens' log-probabilities under the model (teacher forcing)."""
    model, tokenizer = pre_norm_model
    decode = DecodeConfig(max_extra_length=8, sampling_topk=4, sampling_temperature=2.0)
    ct2 = CTranslate2Translator(export(model, tokenizer, tmp_path / "ct2", decode))
    assert (ct2.sampling_topk, ct2.sampling_temperature, ct2.sampling_topp) == (4, 2.0, 1.0)
    sampled = ct2.sample_ids(SENTENCES, 3)
    source_ids = Translator(model, tokenizer, tokenizer, decode).source_ids(tf.constant(SENTENCES))
    outside_top_1 = 0
    for row, (ids, score) in enumerate(sampled):
        target_in = tf.constant([[1] + ids[:-1]])
        logits = model((source_ids[row:row + 1], target_in), training=False)[0].numpy()
        log_probs = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
        for position, token in enumerate(ids):
            assert token in np.argsort(-logits[position])[:4]
            outside_top_1 += token != np.argmax(logits[position])
        assert score == pytest.approx(sum(log_probs[range(len(ids)), ids]), abs=1e-3)
    assert outside_top_1  # it did sample
    for options, message in [(dict(top_p=0), r"top_p=0 must be in \(0, 1\]$"),
                             (dict(top_p=float("nan")), r"top_p=nan must be in \(0, 1\]$"),
                             (dict(temperature=0), "temperature=0 must be a finite number > 0$"),
                             (dict(temperature=float("inf")),
                              "temperature=inf must be a finite number > 0$")]:
        with pytest.raises(ConfigError, match=message):
            ct2.translate_sampling(SENTENCES, 0, **options)
    assert ct2.translate_sampling([])["translation"].shape == (0,)


@pytest.mark.parametrize("options", [dict(activation="gelu", norm="pre", share="all"),
                                     dict(num_layers=3, num_decoder_layers=1)])
def test_model_options_export_with_the_savedmodels_ids(sentencepiece_tokenizers, options,
                                                        tmp_path):
    """`model.activation` and `model.num_decoder_layers` reach the CTranslate2 spec: its greedy
    and beam ids are the Translator's (whose steps are the layers')."""
    tokenizer = sentencepiece_tokenizers[0]
    model = seeded_tiny_model(tokenizer, seed=5, output_scale=4.0, perturb_vectors=True,
                              **options)
    translator = Translator(model, tokenizer, tokenizer, DECODE)
    ct2 = exact_ct2(export(model, tokenizer, tmp_path / "ct2"))
    source_ids = translator.source_ids(tf.constant(SENTENCES))
    ids, scores = translator.search(source_ids, "greedy")
    # A random model may generate PAD's id as a token: only the padding after the output goes.
    ours = [np.trim_zeros(row, "b").tolist() for row in ids.numpy()]
    found = ct2.greedy_ids(SENTENCES)
    assert len({len(row) for row in ours}) > 1, "every output as long: the test lost its edge"
    assert [row for row, _ in found] == ours
    np.testing.assert_allclose([score for _, score in found], scores.numpy(), atol=1e-3)
    beam_ids, _ = translator.search(source_ids, "beam")
    best = [np.trim_zeros(row, "b").tolist() for row in beam_ids.numpy()[:, 0]]
    assert [hypotheses[0][0] for hypotheses in ct2.beam_ids(SENTENCES)] == best

    expected = translator.translate_greedy(tf.constant(SENTENCES))
    result = ct2.translate_greedy(SENTENCES)
    assert texts(result["translation"]) == tf_texts(expected["translation"])
    np.testing.assert_allclose(result["score"], expected["score"].numpy(), atol=1e-3)


@pytest.mark.parametrize("alpha", [0.6, 1.4])
def test_beam_matches_translator(models, alpha, tmp_path):
    model, tokenizer = models
    decode_config = DecodeConfig(beam_size=4, alpha=alpha, max_extra_length=8, stopping="exact")
    translator = Translator(model, tokenizer, tokenizer, decode_config)
    ct2 = exact_ct2(export(model, tokenizer, tmp_path / "ct2", decode_config))
    sources = tf.constant(SENTENCES)

    expected = translator.translate_beam(sources)
    result = ct2.translate_beam(SENTENCES)
    assert texts(result["translation"]) == tf_texts(expected["translation"])
    np.testing.assert_allclose(result["score"], expected["score"].numpy(), atol=1e-3)

    expected = translator.translate_nbest(sources)
    result = ct2.translate_nbest(SENTENCES)
    assert result["translations"].shape == result["scores"].shape == (len(SENTENCES), 4)
    assert texts(result["translations"]) == tf_texts(expected["translations"])
    np.testing.assert_allclose(result["scores"], expected["scores"].numpy(), atol=1e-3)


def test_native_beam_reranks_ctranslate2s_own_hypotheses(models, tmp_path):
    """The default rule runs CTranslate2's search once per group (no rounds) and returns its
    beam_size hypotheses ordered by log P / lp; its best is one of the exact rule's finished
    hypotheses' candidates, so both give a translation for every source."""
    model, tokenizer = models
    folder = export(model, tokenizer, tmp_path / "ct2",
                    DecodeConfig(beam_size=4, alpha=1.4, max_extra_length=8, stopping="exact"))
    native = CTranslate2Translator(folder)
    assert native.beam_rule == "native"
    calls = []
    search = native.translator.translate_batch
    native.translator = type("Spy", (), {"translate_batch": lambda self, *a, **k: (
        calls.append(k), search(*a, **k))[1]})()
    nbest = native.beam_ids(SENTENCES)
    # A nonzero length penalty: with 0 CTranslate2 would ignore the patience.
    assert all(call["num_hypotheses"] == 4 and call["patience"] == 1.0
               and call["length_penalty"] > 0 for call in calls)
    for hypotheses in nbest:
        scores = [score for _, score in hypotheses]
        assert scores == sorted(scores, reverse=True) and len(hypotheses) == 4
    # decode.stopping "beam_full" reaches CTranslate2 as its patience; where patience x beam is
    # not whole, as the export's count (its ceiling), which CTranslate2's rounding keeps.
    for patience, finished in ((2.5, 10), (1.3, 6)):
        patient = CTranslate2Translator(export(
            model, tokenizer, tmp_path / f"ct2_patient_{patience}",
            DecodeConfig(beam_size=4, alpha=1.4, max_extra_length=8, patience=patience)))
        calls = []
        search = patient.translator.translate_batch
        patient.translator = type("Spy", (), {"translate_batch": lambda self, *a, **k: (
            calls.append(k), search(*a, **k))[1]})()
        assert patient.patience == patience
        assert len(patient.beam_ids(SENTENCES)) == len(SENTENCES)
        assert {(call["num_hypotheses"], call["patience"]) for call in calls} == {
            (finished, finished / 4)}
    with pytest.raises(ConfigError, match="beam_rule='fast' is not one of native, exact"):
        CTranslate2Translator(folder, beam_rule="fast")


def test_native_greedy_is_one_call_per_batch_cut_at_each_cap(random_translation_model,
                                                             tmp_path):
    """The default rule decodes a batch in one call with its longest cap; every output is the
    exact rule's (greedy outputs are prefixes of longer ones), and so is every score of an
    output that ended before its cap."""
    model, tokenizer = random_translation_model
    folder = export(model, tokenizer, tmp_path / "ct2", DecodeConfig(max_extra_length=2))
    native = CTranslate2Translator(folder).greedy_ids(SENTENCES)
    exact = CTranslate2Translator(folder, beam_rule="exact").greedy_ids(SENTENCES)
    assert [ids for ids, _ in native] == [ids for ids, _ in exact]
    ended = [i for i, (ids, _) in enumerate(exact) if ids[-1:] == [END_ID]]
    assert ended
    np.testing.assert_allclose([native[i][1] for i in ended], [exact[i][1] for i in ended],
                               atol=1e-4)
    # An output longer than its own cap (possible under the batch's longest cap) is cut there.
    assert _cut(([5, 6, 7, 8], -1.5), 2) == ([5, 6], -1.5)
    assert _cut([([5, 6, 7], -1.0), ([5, END_ID], -2.0)], 2) == [([5, 6], -1.0),
                                                                ([5, END_ID], -2.0)]


def test_beam_rounds_give_the_search_to_the_cap(random_translation_model, tmp_path):
    """Searching first to 1 token and doubling (the stopping rule decides after each round)
    finds what one search to the cap finds."""
    model, tokenizer = random_translation_model
    ct2 = exact_ct2(export(model, tokenizer, tmp_path / "ct2",
                                       DecodeConfig(beam_size=4, alpha=1.4, max_extra_length=8,
                                                    stopping="exact")))
    for sentence in SENTENCES:
        pieces = ct2._source_pieces(sentence.encode("utf-8"))
        cap = ct2._cap(pieces)
        rounds = ct2._beam([pieces], cap, first_limit=1)[0]
        once = ct2._beam([pieces], cap, first_limit=cap)[0]
        assert [ids for ids, _ in rounds] == [ids for ids, _ in once]
        np.testing.assert_allclose([s for _, s in rounds], [s for _, s in once], atol=1e-4)


def test_settings_file_and_layout(random_translation_model, tmp_path):
    from keras_transformer.data.text_io import file_sha256

    model, tokenizer = random_translation_model
    folder = export(model, tokenizer, tmp_path / "ct2", quantization="float32",
                    provenance={"run": "runs/tiny", "weights": "best"})
    settings = json.loads((folder / SETTINGS_FILE).read_text())
    assert settings == {
        "beam_size": 4, "alpha": 0.6, "patience": 1.0, "max_extra_length": 8,
        "max_positions": MAX_LENGTH, "max_source_length": MAX_LENGTH,
        "sampling_topk": 0, "sampling_topp": 1.0, "sampling_temperature": 1.0,
        "alignment_layer": -1, "no_repeat_ngram_size": 0, "repetition_penalty": 1.0,
        "source_start": "<s>", "source_end": "</s>", "sentencepiece_model": "sentencepiece.model",
        "quantization": "float32", "case_folding": False, "run": "runs/tiny", "weights": "best",
        "model_bin_sha256": file_sha256(folder / "model.bin"),
        "vocabulary_sha256": {name: file_sha256(folder / name) for name in (
            "sentencepiece.model", "shared_vocabulary.json")}}
    assert (folder / "sentencepiece.model").is_file() and (folder / "model.bin").is_file()
    assert not list(tmp_path.glob(".partial-*"))

    config = json.loads((folder / "config.json").read_text())
    assert config["add_source_bos"] and config["add_source_eos"]
    assert config["layer_norm_epsilon"] == pytest.approx(1e-6)
    # SentencePiece's reserved pieces are CTranslate2's default special tokens.
    vocabulary = json.loads((folder / "shared_vocabulary.json").read_text())
    assert vocabulary[:4] == ["<pad>", "<s>", "</s>", "<unk>"]
    assert (config["unk_token"], config["bos_token"], config["eos_token"]) == (
        "<unk>", "<s>", "</s>")

    with pytest.raises(FileExistsError):
        export(model, tokenizer, folder)
    with pytest.raises(ConfigError, match="provenance keys \\['alpha'\\]"):
        export(model, tokenizer, tmp_path / "other", provenance={"alpha": 1.0})
    with pytest.raises(ConfigError, match="quantization='int4'"):
        export(model, tokenizer, tmp_path / "other", quantization="int4")


def test_spec_carries_our_position_table(pre_norm_model):
    model, tokenizer = pre_norm_model
    vocabulary = [f"piece{i}" for i in range(tokenizer.vocab_size)]
    spec = KerasTransformerConverter(model, vocabulary)._load()
    table = positional_encoding(MAX_LENGTH, 32)
    np.testing.assert_array_equal(spec.encoder.position_encodings.encodings, table)
    np.testing.assert_array_equal(spec.decoder.position_encodings.encodings, table)
    assert table[0, 0] == 0.0 and table[0, 1] == 1.0  # interleaved, from position 0


def ctranslate2_sinusoids(length, depth):
    """CTranslate2's built-in table (OpenNMT-tf's): rates 10000^(-i / (depth / 2 - 1)),
    positions from 1, sines then cosines."""
    rates = np.exp(-np.arange(depth // 2) * np.log(10000.0) / (depth // 2 - 1))
    angles = np.arange(1, length + 1)[:, None] * rates[None, :]  # [length, depth / 2]
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1).astype(np.float32)


def export_changed(model, tokenizer, folder, monkeypatch, change):
    """An export whose spec `change(spec)` alters after the converter filled it."""
    load = KerasTransformerConverter._load

    def changed_load(self):
        spec = load(self)
        change(spec)
        return spec

    with monkeypatch.context() as patch:
        patch.setattr(KerasTransformerConverter, "_load", changed_load)
        return export(model, tokenizer, folder)


def set_positions(table):
    def change(spec):
        spec.encoder.position_encodings.encodings = table
        spec.decoder.position_encodings.encodings = table
    return change


def drop_source_markers(spec):
    spec.config.add_source_bos = spec.config.add_source_eos = False


def test_builtin_position_table_is_not_ours(random_translation_model, tmp_path, monkeypatch):
    """Without our table CTranslate2 uses its own, which the spec then has to replace."""
    model, tokenizer = random_translation_model
    builtin = exact_ct2(export_changed(
        model, tokenizer, tmp_path / "builtin", monkeypatch, set_positions(OPTIONAL)))
    described = exact_ct2(export_changed(
        model, tokenizer, tmp_path / "described", monkeypatch,
        set_positions(ctranslate2_sinusoids(MAX_LENGTH, 32))))
    ours = exact_ct2(export(model, tokenizer, tmp_path / "ours"))
    scores = {name: translator.translate_greedy(SENTENCES)["score"]
              for name, translator in [("builtin", builtin), ("described", described),
                                       ("ours", ours)]}
    np.testing.assert_allclose(scores["builtin"], scores["described"], atol=1e-5)
    assert not np.allclose(scores["builtin"], scores["ours"], atol=1e-3)


def test_source_markers_matter(random_translation_model, tmp_path, monkeypatch):
    model, tokenizer = random_translation_model
    without = exact_ct2(export_changed(model, tokenizer, tmp_path / "ct2",
                                                   monkeypatch, drop_source_markers))
    translator = Translator(model, tokenizer, tokenizer, DECODE)  # its tf.functions hold it weakly
    expected = translator.translate_greedy(tf.constant(SENTENCES))
    result = without.translate_greedy(SENTENCES)
    assert not np.allclose(result["score"], expected["score"].numpy(), atol=1e-3)


def test_beam_size_one_is_greedy(random_translation_model, tmp_path):
    """Beam size 1 ranks greedy output by log P / lp, as `decoding.beam_search` does."""
    model, tokenizer = random_translation_model
    ct2 = exact_ct2(export(model, tokenizer, tmp_path / "ct2",
                                       DecodeConfig(beam_size=1, alpha=0.6, max_extra_length=8)))
    greedy = ct2.greedy_ids(SENTENCES)
    beam = ct2.beam_ids(SENTENCES)
    assert [hypotheses[0][0] for hypotheses in beam] == [ids for ids, _ in greedy]
    np.testing.assert_allclose(
        [hypotheses[0][1] for hypotheses in beam],
        [log_prob / ((5.0 + len(ids)) / 6.0) ** 0.6 for ids, log_prob in greedy], rtol=1e-6)


def test_position_table_bounds_lengths(random_translation_model, tmp_path):
    """CTranslate2 refuses positions past the table (it does not stop there), so sources are
    truncated and caps never exceed the table."""
    model, tokenizer = random_translation_model
    ct2 = exact_ct2(export(model, tokenizer, tmp_path / "ct2"))
    pieces = ct2.processor.encode(SENTENCES[2], out_type=str)
    assert len(pieces) + 2 > MAX_LENGTH
    with pytest.raises(RuntimeError, match="position"):
        ct2.translator.translate_batch([pieces], max_input_length=0)
    prefix = [["<unk>"] * MAX_LENGTH]
    with pytest.raises(RuntimeError, match="position"):
        ct2.translator.translate_batch([pieces[:4]], target_prefix=prefix,
                                       max_decoding_length=MAX_LENGTH + 1)
    assert ct2._cap(ct2._source_pieces(SENTENCES[2].encode("utf-8"))) == MAX_LENGTH
    assert len(ct2.translate_greedy(SENTENCES[2:3])["translation"]) == 1


def test_wordpiece_is_refused(wordpiece_tokenizers, tmp_path):
    source, target = wordpiece_tokenizers
    config = ModelConfig(num_layers=1, d_model=16, num_heads=2, dff=32,
                         source_vocab_size=source.vocab_size,
                         target_vocab_size=target.vocab_size, max_positions=16)
    model = Transformer(config)
    model.build()
    with pytest.raises(ConfigError, match="SentencePiece.*WordPieceTokenizer.*TensorFlow"):
        export_ctranslate2(model, source, target, DECODE, tmp_path / "ct2")
    assert not (tmp_path / "ct2").exists()


def test_int8_translates(random_translation_model, tmp_path):
    model, tokenizer = random_translation_model
    folder = export(model, tokenizer, tmp_path / "ct2", quantization="int8")
    assert json.loads((folder / SETTINGS_FILE).read_text())["quantization"] == "int8"
    ct2 = exact_ct2(folder)
    for result in (ct2.translate_greedy(SENTENCES), ct2.translate_beam(SENTENCES)):
        assert result["translation"].shape == result["score"].shape == (len(SENTENCES),)
        assert all(isinstance(t, bytes) for t in result["translation"])
        assert result["score"].dtype == np.float32 and np.all(np.isfinite(result["score"]))


def test_empty_sources_are_not_decoded(random_translation_model, tmp_path):
    model, tokenizer = random_translation_model
    ct2 = exact_ct2(export(model, tokenizer, tmp_path / "ct2"))
    mixed = ["", SENTENCES[0], "   \t ", SENTENCES[1], "\n"]
    alone = ct2.translate_greedy(SENTENCES[:2])
    for result, full in ((ct2.translate_greedy(mixed), alone),
                         (ct2.translate_beam(mixed), ct2.translate_beam(SENTENCES[:2]))):
        assert texts(result["translation"])[0::2] == ["", "", ""]
        assert list(result["score"][0::2]) == [0.0, 0.0, 0.0]
        assert texts(result["translation"])[1::2] == texts(full["translation"])
        np.testing.assert_allclose(result["score"][1::2], full["score"], atol=1e-5)
    nbest = ct2.translate_nbest(mixed)
    assert texts(nbest["translations"][0]) == [""] * 4
    assert list(nbest["scores"][0]) == [0.0] + [NEG_INF] * 3


def test_sources_are_normalized_as_the_savedmodel_normalizes_them(models, tmp_path):
    """Whitespace, invisible characters and decomposed letters: each messy source translates
    as its clean form, in CTranslate2 as in `Translator`, and one with nothing visible is ""
    with score 0."""
    model, tokenizer = models
    translator = Translator(model, tokenizer, tokenizer, DECODE)
    ct2 = exact_ct2(export(model, tokenizer, tmp_path / "ct2"))
    messy = ["Ein\tMann  fährt\u00a0Fahrrad. ", "\ufeffZwei Hunde spielen im Schnee.\u200b",
             "Ein kleines Ma\u0308dchen klettert in ein Spielhaus aus Holz.\x00",
             "\u00a0", "\ufeff", "\u200b\x00 \t"]
    clean = [SENTENCES[0], SENTENCES[1], SENTENCES[7], "", "", ""]
    for search in ("translate_greedy", "translate_beam"):
        got, want = getattr(ct2, search)(messy), getattr(ct2, search)(clean)
        assert texts(got["translation"]) == texts(want["translation"]), search
        np.testing.assert_allclose(got["score"], want["score"], atol=1e-5)
        assert texts(got["translation"])[3:] == [""] * 3 and list(got["score"][3:]) == [0.0] * 3
        saved = getattr(translator, search)(tf.constant(messy))
        assert texts(got["translation"]) == tf_texts(saved["translation"]), search
        np.testing.assert_allclose(got["score"], saved["score"].numpy(), atol=1e-3)
        assert len(set(got["score"][:3])) == 3  # decoded, each its own way
    assert ct2.greedy_ids(messy) == ct2.greedy_ids(clean)
    # Unnormalized, the messy sources would be other pieces.
    pieces = [ct2.processor.encode(text, out_type=str) for text in messy[:3] + clean[:3]]
    assert all(a != b for a, b in zip(pieces[:3], pieces[3:]))


def test_input_types_and_empty_batch(random_translation_model, tmp_path):
    model, tokenizer = random_translation_model
    ct2 = exact_ct2(export(model, tokenizer, tmp_path / "ct2"))
    expected = texts(ct2.translate_greedy(SENTENCES[:3])["translation"])
    as_bytes = [s.encode("utf-8") for s in SENTENCES[:3]]
    for batch in (tf.constant(SENTENCES[:3]), np.array(as_bytes, dtype=object), as_bytes):
        assert texts(ct2.translate_greedy(batch)["translation"]) == expected
    empty = ct2.translate_nbest([])
    assert empty["translations"].shape == empty["scores"].shape == (0, 4)
    assert ct2.translate_beam(tf.constant([], tf.string))["translation"].shape == (0,)


def cli_run(capsys, monkeypatch, argv, stdin=""):
    import io

    from keras_transformer import cli

    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin.encode("utf-8"))))
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_exports_ctranslate2_and_translates_with_either_export(random_run, tmp_path, capsys,
                                                                   monkeypatch):
    ct2_dir, saved = tmp_path / "ct2", tmp_path / "saved_models" / "demo"
    code, out, err = cli_run(capsys, monkeypatch, ["export", "--run", str(random_run), "--format",
                                                   "ctranslate2", "--output", str(ct2_dir)])
    assert code == 0, err
    assert (ct2_dir / "model.bin").is_file() and f"to {ct2_dir}" in out
    assert cli_run(capsys, monkeypatch, ["export", "--run", str(random_run),
                                         "--output", str(saved)])[0] == 0

    lines = "\n".join(SENTENCES[:6]) + "\n"
    outputs = {}
    for name, model_dir in (("ct2", ct2_dir), ("saved", saved / "1")):
        code, outputs[name], err = cli_run(capsys, monkeypatch, [
            "translate", "--model", str(model_dir), "--greedy", "--quiet"], lines)
        assert code == 0, err
    assert outputs["ct2"] == outputs["saved"] and len(outputs["ct2"].splitlines()) == 6

    code, out, _ = cli_run(capsys, monkeypatch, ["info", "--model", str(ct2_dir)])
    record = json.loads(out)
    assert code == 0 and record["format"] == "ctranslate2" and record["beam_size"] == 2
    # Each export names the weight file it came from with its SHA-256 (`sha256sum` finds it).
    from keras_transformer.data.text_io import file_sha256

    weights_sha256 = file_sha256(random_run / "best.weights.h5")
    assert record["weights_file"].endswith("best.weights.h5")
    assert record["weights_sha256"] == weights_sha256
    code, out, _ = cli_run(capsys, monkeypatch, ["info", "--model", str(saved / "1")])
    record = json.loads(out)
    assert record["format"] == "savedmodel" and record["search"]["beam_size"] == 2
    assert record["weights_sha256"] == weights_sha256
    assert record["search"]["stopping"].startswith("beam_full (a sentence stops once patience")
    assert record["search"]["stopping"].endswith("; patience 2)")
    assert record["model"]["max_positions"] == 24 and "sources truncated" in record["length_rule"]
    assert record["source_normalization"] == NORMALIZATION

    code, _, err = cli_run(capsys, monkeypatch, ["export", "--run", str(random_run), "--format",
                                                 "ctranslate2", "--output", str(ct2_dir)])
    assert code == 2 and "already exists" in err and len(err.splitlines()) == 1
    code, _, err = cli_run(capsys, monkeypatch, ["translate", "--model", str(ct2_dir),
                                                 "--beam", "3"], "x\n")
    assert code == 2 and "exported with beam size 2" in err


def test_native_beam_stops_as_the_exports_patience(models, tmp_path):
    """The default rule stops where the SavedModel's "beam_full" rule with the same patience
    does (patience x beam finished hypotheses; CTranslate2 ignores its patience at length
    penalty 0), so it finds the same best translation wherever that translation ends before
    its cap (the rule decodes a batch with its longest cap), with log P / lp scores."""
    model, tokenizer = models
    decode_config = DecodeConfig(beam_size=3, alpha=1.4, max_extra_length=8,
                                 stopping="beam_full", patience=2.0)
    translator = Translator(model, tokenizer, tokenizer, decode_config)
    native = CTranslate2Translator(export(model, tokenizer, tmp_path / "ct2", decode_config))
    calls = []
    search = native.translator.translate_batch
    native.translator = type("Spy", (), {"translate_batch": lambda self, *a, **k: (
        calls.append(k), search(*a, **k))[1]})()
    source_ids = translator.source_ids(tf.constant(SENTENCES))
    ids, scores = translator.search(source_ids, "beam")
    caps = np.minimum((source_ids.numpy() != PAD_ID).sum(axis=1) + decode_config.max_extra_length,
                      model.config.max_positions)
    found = native.beam_ids(SENTENCES)
    assert [(call["num_hypotheses"], call["patience"]) for call in calls] == [(6, 2.0)]
    compared = 0
    for row, score, cap, hypotheses in zip(ids.numpy(), scores.numpy(), caps, found):
        best = [int(i) for i in row[0] if i != PAD_ID]
        if best[-1:] != [END_ID] or len(best) == cap:
            continue
        compared += 1
        assert hypotheses[0][0] == best
        np.testing.assert_allclose(hypotheses[0][1], score[0], atol=1e-3)
    assert compared >= len(SENTENCES) // 2


@pytest.mark.parametrize("damage", ["settings_not_json", "settings_key_missing",
                                    "sentencepiece_missing", "model_truncated",
                                    "model_bytes_changed", "sentencepiece.model_swapped",
                                    "shared_vocabulary.json_swapped"])
def test_a_damaged_export_is_a_config_error_naming_the_folder(random_translation_model, tmp_path,
                                                              damage):
    model, tokenizer = random_translation_model
    folder = export(model, tokenizer, tmp_path / "ct2")
    settings = folder / SETTINGS_FILE
    if damage == "settings_not_json":
        settings.write_text('{"beam_size": ')
    elif damage == "settings_key_missing":
        record = json.loads(settings.read_text())
        del record["beam_size"]
        settings.write_text(json.dumps(record))
    elif damage == "sentencepiece_missing":
        (folder / json.loads(settings.read_text())["sentencepiece_model"]).unlink()
    elif damage == "model_truncated":
        (folder / "model.bin").write_bytes((folder / "model.bin").read_bytes()[:1000])
    elif damage == "sentencepiece.model_swapped":  # another vocabulary of the same size: two
        from sentencepiece import sentencepiece_model_pb2  # pieces traded; it loaded silently

        path = folder / "sentencepiece.model"
        proto = sentencepiece_model_pb2.ModelProto.FromString(path.read_bytes())
        proto.pieces[10].piece, proto.pieces[11].piece = (proto.pieces[11].piece,
                                                          proto.pieces[10].piece)
        path.write_bytes(proto.SerializeToString())
    elif damage == "shared_vocabulary.json_swapped":
        path = folder / "shared_vocabulary.json"
        pieces = json.loads(path.read_text(encoding="utf-8"))
        pieces[10], pieces[11] = pieces[11], pieces[10]
        path.write_text(json.dumps(pieces), encoding="utf-8")
    else:  # random bytes in the weights: CTranslate2 itself loads them and translates garbage
        data = bytearray((folder / "model.bin").read_bytes())
        data[len(data) // 2:len(data) // 2 + 64] = np.random.default_rng(0).bytes(64)
        (folder / "model.bin").write_bytes(bytes(data))
    with pytest.raises(ConfigError, match=rf"^{folder}: damaged CTranslate2 export \(.+\)$") as info:
        CTranslate2Translator(folder)
    if damage == "settings_key_missing":
        assert f"no 'beam_size' in {SETTINGS_FILE}" in str(info.value)
    if damage.startswith("model_"):
        assert str(info.value).endswith(
            f"(model.bin differs from the SHA-256 recorded in {SETTINGS_FILE} when it was "
            "exported; export the run again)")
    if damage.endswith("_swapped"):
        assert str(info.value).endswith(
            f"({damage.removesuffix('_swapped')} differs from the SHA-256 recorded in "
            f"{SETTINGS_FILE} when it was exported (not the vocabulary the model was trained "
            "with); export the run again)")
    if damage == "sentencepiece_missing":
        assert str(info.value).endswith("(no sentencepiece.model)")


def test_every_configurable_activation_converts():
    from keras_transformer.config import ACTIVATIONS
    from keras_transformer.export.ctranslate2 import CTRANSLATE2_ACTIVATIONS

    assert set(CTRANSLATE2_ACTIVATIONS) == set(ACTIVATIONS)


def test_the_export_records_model_bins_checksum_and_older_exports_load(random_translation_model,
                                                                       tmp_path):
    from keras_transformer.data.text_io import file_sha256

    model, tokenizer = random_translation_model
    folder = export(model, tokenizer, tmp_path / "ct2")
    record = json.loads((folder / SETTINGS_FILE).read_text())
    assert record["model_bin_sha256"] == file_sha256(folder / "model.bin")
    expected = CTranslate2Translator(folder).translate_greedy(["Ein Hund."])
    del record["model_bin_sha256"]  # as exports made before the record
    (folder / SETTINGS_FILE).write_text(json.dumps(record))
    got = CTranslate2Translator(folder).translate_greedy(["Ein Hund."])
    assert list(got["translation"]) == list(expected["translation"])


NO_TENSORFLOW = ("import sys, keras_transformer.export.ctranslate2_runtime; "
                 "assert not any(m.split('.')[0] in ('tensorflow', 'keras', 'tensorflow_text') "
                 "for m in sys.modules)")


def test_the_runtime_imports_no_tensorflow():
    subprocess.run([sys.executable, "-c", NO_TENSORFLOW], check=True)


def test_the_runtime_translates_without_tensorflow(random_translation_model, tmp_path):
    """A fresh process that never imports TensorFlow, Keras or tf-text gives the translations
    of this one (normalization included: the sources have a BOM, a tab and a no-break space)."""
    model, tokenizer = random_translation_model
    folder = export(model, tokenizer, tmp_path / "ct2")
    sources = ["\ufeffEin Mann\tfährt Fahrrad.", "Zwei\u00a0Hunde spielen im Schnee.", ""]
    code = textwrap.dedent(f"""
        import json, sys
        from keras_transformer.export.ctranslate2_runtime import CTranslate2Translator
        result = CTranslate2Translator(sys.argv[1]).translate_beam(json.loads(sys.argv[2]))
        {NO_TENSORFLOW.split("; ", 1)[1]}
        print(json.dumps([t.decode("utf-8") for t in result["translation"]]))
        """)
    out = subprocess.run([sys.executable, "-c", code, str(folder), json.dumps(sources)],
                         check=True, capture_output=True, text=True).stdout
    expected = CTranslate2Translator(folder).translate_beam(sources)["translation"]
    assert json.loads(out) == texts(expected)


def test_score_agrees_with_the_savedmodel(models, tmp_path):
    """`CTranslate2Translator.score` (CTranslate2's score_batch) gives `Translator.score`'s log
    P, log P / lp and token counts for the same pairs, long and empty targets included."""
    model, tokenizer = models
    translator = Translator(model, tokenizer, tokenizer, DECODE)
    ct2 = CTranslate2Translator(export(model, tokenizer, tmp_path / "ct2"))
    targets = ["A man rides a bike.", "", "Two dogs play in the snow.", "x " * 60, "Hallo",
               "Der Mann's Hut.", "漢字", "a", "Kinder.", "Ein Hund.", "Leute", "Iglu!"]
    ours = translator.score(tf.constant(SENTENCES), tf.constant(targets))
    theirs = ct2.score(SENTENCES, targets)
    np.testing.assert_array_equal(theirs["tokens"], ours["tokens"])
    assert theirs["tokens"][3] == MAX_LENGTH
    for key in ("score", "normalized_score"):
        np.testing.assert_allclose(theirs[key], ours[key].numpy(), rtol=1e-4, atol=1e-3)
    assert ct2.score([], [])["score"].shape == (0,)
    with pytest.raises(ConfigError, match="2 sources for 1 targets"):
        ct2.score(SENTENCES[:2], targets[:1])


def test_a_forced_prefix_starts_the_output_and_agrees_with_target_prefix(pre_norm_model,
                                                                       tmp_path):
    """Greedy search with a prefix: every output starts with its prefix (one ending inside a
    word continues it), "" forces nothing, and CTranslate2's target_prefix completes the same."""
    model, tokenizer = pre_norm_model
    translator = Translator(model, tokenizer, tokenizer, DECODE)
    ct2 = CTranslate2Translator(export(model, tokenizer, tmp_path / "ct2"))
    prefixes = ["A man", "Two dog", "", "Hallo Welt", "The man's", "Kinder (", "x",
                "Ein kleines Mäd", "Zwei", "A", "", "Eine Gruppe von"]
    ours = tf_texts(translator.translate(tf.constant(SENTENCES), "greedy",
                                         prefix=tf.constant(prefixes))["translation"])
    greedy = tf_texts(translator.translate_greedy(tf.constant(SENTENCES))["translation"])
    for text, prefix, plain in zip(ours, prefixes, greedy):
        assert text.startswith(prefix), (text, prefix)
        if not prefix:
            assert text == plain
    assert any(text != prefix for text, prefix in zip(ours, prefixes) if prefix)  # continued
    theirs = texts(ct2.translate_prefix(SENTENCES, prefixes, greedy=True)["translation"])
    assert theirs == ours
    beam = tf_texts(translator.translate_prefix(tf.constant(SENTENCES), tf.constant(prefixes))[
        "translation"])
    assert all(text.startswith(prefix) for text, prefix in zip(beam, prefixes))


@pytest.mark.parametrize("layer", [-1, 0])
def test_alignments_agree_with_the_savedmodel(models, layer, tmp_path):
    """`CTranslate2Translator.align` (CTranslate2's return_attention, the target forced as
    prefix) gives `Translator.align`'s word alignments and word attention on the same weights,
    for the export's alignment layer; long, empty and byte-fallback targets included."""
    model, tokenizer = models
    decode = dataclasses.replace(DECODE, alignment_layer=layer)
    translator = Translator(model, tokenizer, tokenizer, decode)
    ct2 = CTranslate2Translator(export(model, tokenizer, tmp_path / "ct2", decode))
    targets = ["A man rides a bike.", "", "Two dogs play in the snow.", "x " * 60, "Hallo",
               "Der Mann's Hut.", "漢字 ☃", "a", "Kinder.", "Ein Hund.", "Leute", "Iglu!"]
    ours = translator.align(tf.constant(SENTENCES), tf.constant(targets))
    theirs = ct2.align(SENTENCES, targets)
    assert texts(theirs["alignment"]) == tf_texts(ours["alignment"])
    assert sum(len(a.split()) for a in tf_texts(ours["alignment"])) > 30
    np.testing.assert_allclose(ct2.word_attention(SENTENCES, targets),
                               translator.word_attention(SENTENCES, targets).numpy(), atol=1e-5)
    assert json.loads((tmp_path / "ct2" / SETTINGS_FILE).read_text())["alignment_layer"] == layer
    assert ct2.align([], [])["alignment"].shape == (0,)
    assert ct2.word_attention([], []).shape == (0, 0, 0)
    with pytest.raises(ConfigError, match="2 sources for 1 targets"):
        ct2.align(SENTENCES[:2], targets[:1])


@pytest.mark.parametrize("guard", [dict(no_repeat_ngram_size=2), dict(no_repeat_ngram_size=1),
                                   dict(repetition_penalty=1.5)])
def test_the_repetition_guard_agrees_with_the_savedmodel(sentencepiece_tokenizers, guard,
                                                         tmp_path):
    """decode.no_repeat_ngram_size and repetition_penalty are CTranslate2's options of those
    names: a model that loops gives the same guarded greedy and beam outputs in both runtimes,
    the export carries them, and the runtime's arguments override the export's."""
    tokenizer = sentencepiece_tokenizers[0]
    model = seeded_tiny_model(tokenizer, seed=11, output_scale=2.0, norm="pre")
    bias = model.final_layer.bias.numpy()
    bias[[40, 41, 42]] += 4.0  # the model loops over these three tokens
    bias[END_ID] = -5.0
    model.final_layer.bias.assign(bias)
    decode_config = dataclasses.replace(DECODE, **guard)
    translator = Translator(model, tokenizer, tokenizer, decode_config)
    folder = export(model, tokenizer, tmp_path / "ct2", decode_config)
    ct2 = exact_ct2(folder)
    assert {key: json.loads((folder / SETTINGS_FILE).read_text())[key] for key in guard} == guard
    sources = tf.constant(SENTENCES)
    for search in ("greedy", "beam"):
        expected = getattr(translator, f"translate_{search}")(sources)
        result = getattr(ct2, f"translate_{search}")(SENTENCES)
        assert texts(result["translation"]) == tf_texts(expected["translation"]), search
        np.testing.assert_allclose(result["score"], expected["score"].numpy(), atol=1e-3)
    unguarded = Translator(model, tokenizer, tokenizer, DECODE).translate_greedy(sources)
    off = CTranslate2Translator(folder, beam_rule="exact", no_repeat_ngram_size=0,
                                repetition_penalty=1.0).translate_greedy(SENTENCES)
    assert texts(off["translation"]) == tf_texts(unguarded["translation"])
    assert texts(off["translation"]) != texts(ct2.translate_greedy(SENTENCES)["translation"])
    with pytest.raises(ConfigError, match="repetition_penalty=0"):
        CTranslate2Translator(folder, repetition_penalty=0.0)
