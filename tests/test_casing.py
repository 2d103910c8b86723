"""Case folding (`keras_transformer.data.casing`, `data.case_folding`): which sources are in
capitals or title case, that the graph's twin folds and recases byte for byte as Python does,
that training folds after the modifiers, and that a translator with case folding translates a
source in capitals as its lowercased form, put back into capitals (SavedModel and CTranslate2
alike)."""

import io
import random
import sys

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import cli
from keras_transformer.data import casing, modifiers
from keras_transformer.data.casing import CAPITALS, ORDINARY, TITLE

SENTENCES = [
    "Ein Mann mit einem orangefarbenen Hut starrt auf etwas.",
    "Zwei junge Männer spielen Fußball auf der Straße.",
    "A man in an orange hat starring at something.",
    "NASA und ESA",
    "Straße",
    "Ich Liebe Dich",
    "(Ein) Großer Hund — 3 Katzen",
    "İSTANBUL, ΣΟΦΟΣ UND ÆGIR",
    "",
]


def test_the_case_form_of_a_sentence():
    forms = [casing.case_form(text) for text in SENTENCES]
    assert forms == [ORDINARY, ORDINARY, ORDINARY, ORDINARY, ORDINARY, TITLE, TITLE, CAPITALS,
                     ORDINARY]
    assert casing.case_form("EIN MANN MIT EINEM HUT.") == CAPITALS
    assert casing.case_form(modifiers.title_case(SENTENCES[0])) == TITLE
    assert casing.case_form("OK") == ORDINARY  # too few letters to say
    assert casing.fold_case("EIN GROSSER HUND") == ("ein grosser hund", CAPITALS)
    assert casing.fold_case(SENTENCES[0]) == (SENTENCES[0], ORDINARY)
    assert casing.restore_case("a big dog.", CAPITALS) == "A BIG DOG."
    assert casing.restore_case("a big  dog.", TITLE) == "A Big  Dog."
    assert casing.restore_case("a big dog.", ORDINARY) == "a big dog."


def many_sentences(count=300, seed=0):
    rng = random.Random(seed)
    texts = []
    for index in range(count):
        text = SENTENCES[index % len(SENTENCES)]
        change = rng.random()
        if change < 0.3:
            text = modifiers.upper_case(text)
        elif change < 0.6:
            text = modifiers.title_case(text)
        elif change < 0.8:
            text = modifiers.typos(text, rng) if text else text
        texts.append(text)
    return texts


def test_the_graph_folds_and_recases_byte_for_byte_as_python():
    from keras_transformer.data.tokenizers import fold_case, restore_case

    texts = many_sentences()
    folded, forms = fold_case(tf.constant(texts))
    expected = [casing.fold_case(text) for text in texts]
    assert [t.decode() for t in folded.numpy()] == [text for text, _ in expected]
    assert forms.numpy().tolist() == [form for _, form in expected]
    assert {CAPITALS, TITLE, ORDINARY} <= set(forms.numpy().tolist())
    outputs = [text.lower() for text in reversed(texts)]
    recased = restore_case(tf.constant(outputs), forms)
    assert [t.decode() for t in recased.numpy()] == [
        casing.restore_case(output, form) for output, (_, form) in zip(outputs, expected)]


def test_training_folds_the_sources_the_modifiers_put_in_capitals():
    sources, targets = modifiers.modify_batch(
        [b"Ein Mann mit einem Hut.", b"Zwei Hunde."], [b"A man in a hat.", b"Two dogs."],
        {"upper_case": 1.0}, seed=0, pass_index=0, batch_index=0, case_folding=True)
    assert sources == [b"ein mann mit einem hut.", b"zwei hunde."]
    assert targets == [b"A man in a hat.", b"Two dogs."]


@pytest.fixture(scope="module")
def wordy_model(sentencepiece_tokenizers):
    """(model, tokenizer): a random tiny Transformer whose outputs are words, not END alone."""
    from helpers import seeded_tiny_model
    from keras_transformer.data.tokenizers import END_ID

    tokenizer = sentencepiece_tokenizers[0]
    model = seeded_tiny_model(tokenizer, seed=3, output_scale=2.0)
    bias = model.final_layer.bias.numpy()
    bias[END_ID] = -1.0
    model.final_layer.bias.assign(bias)
    return model, tokenizer


CASED = ["EIN MANN MIT EINEM HUT.", "Zwei Hunde Spielen Im Schnee.", "Ein Hund läuft.", ""]


def texts(array):
    return [t.decode() for t in np.ravel(np.asarray(array, dtype=object))]


def test_a_translator_translates_the_folded_source_and_recases_its_output(wordy_model):
    from keras_transformer.config import DecodeConfig
    from keras_transformer.decoding.translator import Translator

    model, tokenizer = wordy_model
    config = DecodeConfig(beam_size=2, max_extra_length=6)
    folding = Translator(model, tokenizer, tokenizer, config, case_folding=True)
    plain = Translator(model, tokenizer, tokenizer, config)
    folded = [casing.fold_case(text) for text in CASED]
    for function in ("translate_greedy", "translate_beam"):
        expected = texts(getattr(plain, function)(tf.constant([t for t, _ in folded]))[
            "translation"])
        assert any(expected[:3])  # the model does write words
        found = texts(getattr(folding, function)(tf.constant(CASED))["translation"])
        assert found == [casing.restore_case(text, form)
                         for text, (_, form) in zip(expected, folded)]
    assert found[0] == found[0].upper() and found[2] == expected[2]


def test_the_ctranslate2_runtime_folds_and_recases_as_the_savedmodel(wordy_model, tmp_path):
    pytest.importorskip("ctranslate2")
    from keras_transformer.config import DecodeConfig
    from keras_transformer.decoding.translator import Translator
    from keras_transformer.export.ctranslate2 import export_ctranslate2
    from keras_transformer.export.ctranslate2_runtime import CTranslate2Translator

    model, tokenizer = wordy_model
    config = DecodeConfig(beam_size=2, max_extra_length=6, stopping="exact")
    translator = Translator(model, tokenizer, tokenizer, config, case_folding=True)
    folder = export_ctranslate2(model, tokenizer, tokenizer, config, tmp_path / "ct2",
                                case_folding=True)
    ct2 = CTranslate2Translator(folder, beam_rule="exact")
    assert ct2.case_folding
    for function in ("translate_greedy", "translate_beam"):
        assert texts(getattr(ct2, function)(CASED)["translation"]) == texts(
            getattr(translator, function)(tf.constant(CASED))["translation"])
    assert texts(ct2.translate_nbest(CASED)["translations"]) == texts(
        translator.translate_nbest(tf.constant(CASED))["translations"])


def test_case_folding_on_an_export_made_without_it_is_refused_in_one_line(
        random_export, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"EIN HUND\n"),
                                                       encoding="utf-8"))
    code = cli.main(["translate", "--model", str(random_export), "--case-folding"])
    err = capsys.readouterr().err
    assert code != 0 and "exported without case folding" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
