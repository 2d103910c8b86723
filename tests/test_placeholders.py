"""Placeholders (`keras_transformer.data.placeholders`, `data.placeholders`): which spans are masked,
that the graph's twin masks and unmasks byte for byte as Python does, that training masks the
spans a pair shares, and that a translator over a vocabulary with placeholders puts the
source's spans into its outputs (SavedModel and CTranslate2 alike)."""

import random

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.data import modifiers
from keras_transformer.data import placeholders
from keras_transformer.config import ConfigError, DataConfig

MIXED = [
    "Am 3. Mai 2024 fuhr Angela Müller mit 42 Kollegen nach Hamburg.",
    "Ich freue mich so auf den Urlaub 😊",
    "Daumen hoch 👍🏽👍🏽 und eine Flagge 🇩🇪!",
    "Schreib an max.muster@example.co.uk oder besuche www.beispiel.de.",
    "Siehe https://example.org/a1?b=2, (Seite 7) und 3,5 kg für 1.250 € um 14:30 (25%).",
    "1 2 3 4 5 6 7 8 9 10 11",
    "Ein <ph3> steht hier, ph4 nicht, <ph12> halb.",
    "kein Span hier",
    "",
    "☀️ Sonne und ✂ Schere",
]


def random_texts(count=200, seed=0):
    """Sentences with spans put in by the training modifier (numbers, names, addresses, emoji)."""
    rng = random.Random(seed)
    texts = []
    for index in range(count):
        source = MIXED[index % len(MIXED)] or "ein Wort"
        for _ in range(rng.randint(0, 3)):
            source, _ = modifiers.insert_span(source, "x", modifiers.random_span(rng), rng)
        texts.append(source)
    return texts


def test_mask_replaces_numbers_addresses_and_emoji_in_reading_order():
    masked, spans = placeholders.mask(MIXED[4])
    assert spans == ["https://example.org/a1?b=2", "7", "3,5", "1.250", "14:30", "25%"]
    assert masked == ("Siehe <ph0>, (Seite <ph1>) und <ph2> kg für <ph3> € um <ph4> (<ph5>).")
    assert placeholders.mask(MIXED[3]) == ("Schreib an <ph0> oder besuche <ph1>.",
                                           ["max.muster@example.co.uk", "www.beispiel.de"])
    assert placeholders.mask(MIXED[2])[1] == ["👍🏽👍🏽", "🇩🇪"]
    assert placeholders.mask(MIXED[9])[1] == ["☀️", "✂"]
    # At most MAX_SPANS; the rest stays in the text.
    masked, spans = placeholders.mask(MIXED[5])
    assert spans == [str(n) for n in range(1, 9)]
    assert masked == "<ph0> <ph1> <ph2> <ph3> <ph4> <ph5> <ph6> <ph7> 9 10 11"
    # A placeholder in the input is a span of its own, carried through as it is; digits in
    # a word are a number.
    assert placeholders.mask(MIXED[6]) == (
        "Ein <ph0> steht hier, ph<ph1> nicht, <ph<ph2>> halb.", ["<ph3>", "4", "12"])
    assert placeholders.mask("kein Span hier") == ("kein Span hier", [])


@pytest.mark.parametrize("text", MIXED + random_texts(50))
def test_unmask_puts_back_what_mask_took(text):
    masked, spans = placeholders.mask(text)
    assert placeholders.unmask(masked, spans) == text


def test_unmask_follows_the_placeholders_of_the_output():
    spans = ["3", "2024"]
    assert placeholders.unmask("On <ph1>-<ph0>-<ph0>.", spans) == "On 2024-3-3."
    assert placeholders.unmask("a <ph2> b <ph9>", spans) == "a  b "  # none such in the source
    assert placeholders.unmask("no placeholder", []) == "no placeholder"


def test_a_training_pair_masks_the_spans_both_sides_have():
    source, target = placeholders.mask_pair(
        "Am 3. Mai 2024 fuhren 2 Männer nach www.x.de 😊",
        "On 3 May 2024 two men went to www.x.de 😊 (not 25 or 3)")
    assert source == "Am <ph0>. Mai <ph1> fuhren 2 Männer nach <ph2> <ph3>"
    assert target == "On <ph0> May <ph1> two men went to <ph2> <ph3> (not 25 or 3)"
    # A span is matched to a target span whole, never to a part of a number or a placeholder.
    assert placeholders.mask_pair("5 und 0", "25 and <ph0> and 0") == (
        "5 und <ph0>", "25 and <ph0> and <ph0>")
    assert placeholders.mask_pair("", "") == ("", "")


def test_the_graph_masks_and_unmasks_byte_for_byte_as_python():
    from keras_transformer.data.tokenizers import mask_spans, unmask_spans, normalize_text

    texts = MIXED + random_texts()
    normalized = [t.decode() for t in normalize_text(tf.constant(texts)).numpy()]
    masked, spans = mask_spans(tf.constant(normalized))
    expected = [placeholders.mask(text) for text in normalized]
    assert [t.decode() for t in masked.numpy()] == [m for m, _ in expected]
    assert [[s.decode() for s in row] for row in spans.to_list()] == [s for _, s in expected]
    # Outputs with placeholders the source has, has not, and none.
    rng = random.Random(1)
    outputs = [" ".join(rng.choice(["a", "<ph0>", "<ph1>", "<ph7>", "b.", "<ph", "ph2>"])
                        for _ in range(rng.randint(0, 8))) for _ in texts]
    unmasked = unmask_spans(tf.constant(outputs), spans)
    assert [t.decode() for t in unmasked.numpy()] == [
        placeholders.unmask(output, found) for output, (_, found) in zip(outputs, expected)]
    empty = mask_spans(tf.constant([], tf.string))
    assert empty[0].shape == [0] and empty[1].shape[0] == 0


def test_modify_batch_masks_after_the_modifiers():
    sources, targets = modifiers.modify_batch(
        [b"<BT> 18 Maenner", b"2 Frauen"], [b"18 men", b"Two women"], {"upper_case": 1.0},
        seed=0, pass_index=0, batch_index=0, placeholders=True)
    assert sources == [b"<BT> <ph0> MAENNER", b"2 FRAUEN"]
    assert targets == [b"<ph0> men", b"Two women"]


def test_placeholders_need_sentencepiece():
    with pytest.raises(ConfigError, match="data.placeholders needs data.tokenizer sentencepiece"):
        DataConfig(tokenizer="wordpiece", placeholders=True)


@pytest.fixture(scope="module")
def placeholder_vocab(multi30k_config, tmp_path_factory):
    """(DataConfig, vocab_dir) of the 1,000-piece joint vocabulary built with placeholders."""
    from conftest import built_once
    from keras_transformer.data.corpora import build_vocab

    config = multi30k_config(tokenizer="sentencepiece", placeholders=True)
    return config, built_once(tmp_path_factory, "placeholder_vocab",
                              lambda folder: build_vocab(config, folder))


def test_a_vocabulary_built_with_placeholders_has_each_as_one_piece(
        placeholder_vocab, sentencepiece_vocab, sentencepiece_tokenizers):
    from keras_transformer.data.tokenizers import load_tokenizers

    tokenizer, _ = load_tokenizers(*placeholder_vocab)
    assert tokenizer.placeholders and not sentencepiece_tokenizers[0].placeholders
    pieces = tokenizer.lookup(tokenizer.tokenize(tf.constant(["<ph0> Mann<ph7>."]))[0][1:-1])
    assert [p.decode() for p in pieces.numpy()] == ["▁<ph0>", "▁Mann", "<ph7>", "."]
    # A vocabulary and a config that disagree are refused.
    config, vocab_dir = sentencepiece_vocab
    with pytest.raises(ConfigError, match="placeholders: built with None, config has True"):
        load_tokenizers(DataConfig(**{**vars(config), "placeholders": True}), vocab_dir)


def test_a_training_stream_masks_the_spans_a_pair_shares(placeholder_vocab):
    from keras_transformer import data as data_lib
    from keras_transformer.data.tokenizers import load_tokenizers

    config, vocab_dir = placeholder_vocab
    config = DataConfig(**{**vars(config), "carry_remainders": False})
    tokenizer, _ = load_tokenizers(config, vocab_dir)
    pairs = tf.data.Dataset.from_tensor_slices((
        ["Um 14:30 kamen 3 Hunde.", "Ein Hund."] * 8, ["At 14:30 three dogs came.", "A dog."] * 8))
    stream = data_lib.TrainingStream(pairs, tokenizer, tokenizer, config, seed=0)
    found = set()
    for (source_ids, _), target_out in stream.batches().take(stream.pass_length()):
        found |= {t.decode() for t in tokenizer.detokenize(source_ids).numpy()}
        found |= {t.decode() for t in tokenizer.detokenize(target_out).numpy()}
    assert found == {"Um <ph0> kamen 3 Hunde.", "At <ph0> three dogs came.", "Ein Hund.",
                     "A dog."}


@pytest.fixture(scope="module")
def placeholder_model(placeholder_vocab):
    """(model, tokenizer): a random tiny Transformer over the placeholder vocabulary whose
    outputs are mostly placeholders: <ph0>'s and <ph1>'s logits raised, END's lowered."""
    from helpers import seeded_tiny_model
    from keras_transformer.data.tokenizers import END_ID, load_tokenizers

    tokenizer, _ = load_tokenizers(*placeholder_vocab)
    model = seeded_tiny_model(tokenizer, seed=5, output_scale=2.0)
    ids = tokenizer.tokenize(tf.constant(["<ph0> <ph1> <ph2>"]))[0][1:-1].numpy()
    bias = model.final_layer.bias.numpy()
    bias[ids] += [5.0, 5.0, 2.0]
    bias[END_ID] = -1.0
    model.final_layer.bias.assign(bias)
    return model, tokenizer


SOURCES = ["Um 14:30 kamen 3 Hunde 😊", "Ein Hund läuft.", "", "www.x.de 7"]


def test_a_translator_puts_the_sources_spans_into_every_output(placeholder_model):
    from keras_transformer.config import DecodeConfig
    from keras_transformer.decoding.translator import Translator

    model, tokenizer = placeholder_model
    translator = Translator(model, tokenizer, tokenizer, DecodeConfig(beam_size=3))
    assert translator.placeholders
    masked = [placeholders.mask(s) for s in SOURCES]
    ids, _ = translator.search(translator.source_ids(tf.constant([m for m, _ in masked])),
                               "greedy")
    raw = [t.decode() for t in tokenizer.detokenize(ids).numpy()]
    assert sum("<ph0>" in text for text in raw) >= 3  # the model does write placeholders
    greedy = [t.decode() for t in translator.translate_greedy(tf.constant(SOURCES))[
        "translation"].numpy()]
    expected = [placeholders.unmask(text, spans) if source else ""
                for text, (_, spans), source in zip(raw, masked, SOURCES)]
    assert greedy == expected
    assert "14:30" in greedy[0] and "3" in greedy[0] and "www.x.de" in greedy[3]
    for outputs in (translator.translate_beam(tf.constant(SOURCES))["translation"],
                    translator.translate_nbest(tf.constant(SOURCES))["translations"]):
        assert not any("<ph" in t.decode() for t in np.ravel(outputs.numpy()))


def test_the_ctranslate2_runtime_puts_the_spans_back_as_the_savedmodel_does(placeholder_model,
                                                                           tmp_path):
    pytest.importorskip("ctranslate2")
    from keras_transformer.config import DecodeConfig
    from keras_transformer.export.ctranslate2 import export_ctranslate2
    from keras_transformer.export.ctranslate2_runtime import CTranslate2Translator
    from keras_transformer.decoding.translator import Translator

    model, tokenizer = placeholder_model
    decode_config = DecodeConfig(beam_size=3, max_extra_length=6, stopping="exact")
    translator = Translator(model, tokenizer, tokenizer, decode_config)
    folder = export_ctranslate2(model, tokenizer, tokenizer, decode_config, tmp_path / "ct2")
    ct2 = CTranslate2Translator(folder, beam_rule="exact")
    assert ct2.placeholders

    def texts(array):
        return [t.decode() for t in np.ravel(np.asarray(array, dtype=object))]

    sources = tf.constant(SOURCES)
    for ours, theirs in (
            (translator.translate_greedy(sources)["translation"],
             ct2.translate_greedy(SOURCES)["translation"]),
            (translator.translate_beam(sources)["translation"],
             ct2.translate_beam(SOURCES)["translation"]),
            (translator.translate_nbest(sources)["translations"],
             ct2.translate_nbest(SOURCES)["translations"]),
            (translator.translate_prefix(sources, tf.constant(["At"] * 4))["translation"],
             ct2.translate_prefix(SOURCES, ["At"] * 4)["translation"])):
        assert texts(theirs) == texts(ours.numpy())
    assert "14:30" in texts(ct2.translate_greedy(SOURCES)["translation"])[0]
