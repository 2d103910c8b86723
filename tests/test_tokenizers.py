"""Tokenizers: exact/normalized round trips, reserved ids, tf.function, SavedModel in a fresh process."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from keras_transformer.config import ConfigError
from keras_transformer.data.text_io import read_parallel_lines
from keras_transformer.data.tokenizers import (END_ID, PAD_ID, SERVING_TF_TEXT_OPS, START_ID, UNK_ID,
                                          SentencePieceTokenizer, build_tokenizers,
                                          load_tokenizers, normalize_text,
                                          training_tokenizers)


def _validation_sentences(multi30k_dir, lang):
    return [line.strip() for _, line in
            ((n, s[lang]) for n, s in read_parallel_lines({lang: multi30k_dir / f"val.{lang}.gz"}))]


def _decode(strings):
    return [s.decode("utf-8") for s in strings.numpy()]


@pytest.mark.parametrize("lang", ["de", "en", "fr"])
def test_sentencepiece_round_trip_is_exact_on_validation(sentencepiece_tokenizers, multi30k_dir,
                                                         lang):
    # French is not in the de+en training text: byte fallback must still give it back exactly.
    tokenizer, _ = sentencepiece_tokenizers
    sentences = _validation_sentences(multi30k_dir, lang)
    back = _decode(tokenizer.detokenize(tokenizer.tokenize(sentences)))
    mismatches = [(s, b) for s, b in zip(sentences, back) if s != b]
    assert len(sentences) == 1014
    assert not mismatches, mismatches[:3]


def test_subword_sampling_varies_segmentation_but_keeps_the_text(sentencepiece_vocab,
                                                                sentencepiece_tokenizers,
                                                                multi30k_dir):
    config, _ = sentencepiece_vocab
    best, _ = sentencepiece_tokenizers
    assert training_tokenizers(config, best, best) == (best, best)  # sampling off by default
    sampling = type(config)(**{**vars(config), "sp_nbest_size": -1, "sp_alpha": 0.2})
    sampler, target_sampler = training_tokenizers(sampling, best, best)
    assert sampler is target_sampler and sampler.samples and not best.samples
    assert sampler.vocab_size == best.vocab_size
    sentences = _validation_sentences(multi30k_dir, "de")[:200]
    first, second = sampler.tokenize(sentences), sampler.tokenize(sentences)
    viterbi = best.tokenize(sentences)
    for ids in (first, second):
        assert _decode(best.detokenize(ids)) == sentences
        assert all(row[0] == START_ID and row[-1] == END_ID for row in ids.to_list())
    changed = [a != b for a, b in zip(first.to_list(), viterbi.to_list())]
    resampled = [a != b for a, b in zip(first.to_list(), second.to_list())]
    assert sum(changed) > 100 and sum(resampled) > 100
    assert tf.reduce_sum(first.row_lengths()) > tf.reduce_sum(viterbi.row_lengths())


@pytest.mark.parametrize("side", [0, 1])
def test_wordpiece_round_trip_equals_normalized_text(wordpiece_tokenizers, wordpiece_vocab,
                                                     multi30k_dir, side):
    tokenizer = wordpiece_tokenizers[side]
    config, _ = wordpiece_vocab
    lang = (config.source_lang, config.target_lang)[side]
    sentences = _validation_sentences(multi30k_dir, lang)
    ids = tokenizer.tokenize(sentences)
    back = _decode(tokenizer.detokenize(ids))
    expected = _decode(tokenizer.normalize(sentences))
    has_unk = tf.reduce_any(ids == UNK_ID, axis=1).numpy()
    mismatches = [(e, b) for e, b, unk in zip(expected, back, has_unk) if not unk and e != b]
    assert not mismatches, mismatches[:3]
    assert has_unk.mean() < 0.05  # characters unseen in the 3,000 training pairs are rare
    # Natural spacing and preserved case: most sentences come back unchanged.
    unchanged = sum(s == b for s, b in zip(sentences, back))
    assert unchanged > 0.9 * len(sentences), unchanged


def test_wordpiece_lowercase_option(tmp_path, small_pairs, multi30k_config):
    config = multi30k_config(tokenizer="wordpiece", lowercase=True, vocab_size=200)
    pairs = tf.data.Dataset.from_tensor_slices(tuple(map(list, zip(*small_pairs))))
    source, _ = build_tokenizers(config, pairs, tmp_path)
    ids = source.tokenize(["EIN MANN fährt", "ein mann FÄHRT"])
    assert ids[0].numpy().tolist() == ids[1].numpy().tolist()
    assert _decode(source.detokenize(ids)) == ["ein mann fahrt"] * 2  # accents stripped, as BERT


@pytest.mark.parametrize("kind", ["sentencepiece", "wordpiece"])
def test_reserved_ids_and_start_end(kind, sentencepiece_tokenizers, wordpiece_tokenizers,
                                    small_pairs):
    tokenizer = {"sentencepiece": sentencepiece_tokenizers,
                 "wordpiece": wordpiece_tokenizers}[kind][0]
    ids = tokenizer.tokenize([s for s, _ in small_pairs] + [""])
    assert ids.dtype == tf.int32
    rows = ids.to_list()
    assert [row[0] for row in rows] == [START_ID] * 6
    assert [row[-1] for row in rows] == [END_ID] * 6
    assert ids[-1].numpy().tolist() == [START_ID, END_ID]  # an empty line: markers only
    inner = ids[:, 1:-1].flat_values
    assert tf.reduce_all((inner > END_ID) & (inner < tokenizer.vocab_size))
    if kind == "sentencepiece":
        vocab = [tokenizer.tokenizer.id_to_string(i).numpy() for i in range(4)]
        assert vocab == [b"<pad>", b"<s>", b"</s>", b"<unk>"]


@pytest.mark.parametrize("kind", ["sentencepiece", "wordpiece"])
def test_lookup_gives_the_pieces_of_the_ids(kind, sentencepiece_tokenizers, wordpiece_tokenizers):
    tokenizer = {"sentencepiece": sentencepiece_tokenizers,
                 "wordpiece": wordpiece_tokenizers}[kind][0]
    sentences = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee."]
    ids = tokenizer.tokenize(sentences)
    rows = [[piece.decode() for piece in row] for row in tokenizer.lookup(ids).to_list()]
    assert [len(row) for row in rows] == ids.row_lengths().numpy().tolist()
    start, end = {"sentencepiece": ("<s>", "</s>"), "wordpiece": ("[START]", "[END]")}[kind]
    assert {(row[0], row[-1]) for row in rows} == {(start, end)}
    if kind == "sentencepiece":  # "▁" marks a word's first piece
        assert ["".join(row[1:-1]).replace("▁", " ").strip() for row in rows] == sentences
    else:  # "##" marks a piece that continues a word
        assert [" ".join(row[1:-1]).replace(" ##", "") for row in rows] == [
            "Ein Mann fährt Fahrrad .", "Zwei Hunde spielen im Schnee ."]
    padded = ids.to_tensor().numpy()  # [2, len], the shorter row padded with PAD_ID
    pad = {"sentencepiece": b"<pad>", "wordpiece": b"[PAD]"}[kind]
    assert set(tokenizer.lookup(padded).numpy()[padded == PAD_ID]) == {pad}


def test_detokenize_drops_markers_and_cuts_at_first_end(sentencepiece_tokenizers):
    tokenizer, _ = sentencepiece_tokenizers
    words = tokenizer.tokenize(["A man rides a bike."])[0, 1:-1].numpy().tolist()
    dense = tf.constant([[START_ID] + words + [END_ID] + words + [PAD_ID, PAD_ID],
                         [START_ID] + words + [PAD_ID] * 2 + [END_ID] * (len(words) + 1)],
                        tf.int32)
    ragged = tf.ragged.constant([[START_ID] + words + [END_ID, 7, 8], words], tf.int32)
    assert _decode(tokenizer.detokenize(dense)) == ["A man rides a bike."] * 2
    assert _decode(tokenizer.detokenize(ragged)) == ["A man rides a bike."] * 2


def test_tokenizers_run_inside_tf_function(sentencepiece_tokenizers, wordpiece_tokenizers,
                                           small_pairs):
    sentences = tf.constant([s for s, _ in small_pairs])
    for tokenizer in (sentencepiece_tokenizers[0], wordpiece_tokenizers[0]):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def round_trip(strings, tokenizer=tokenizer):
            ids = tokenizer.tokenize(strings).to_tensor()  # [batch, len], PAD = 0
            return ids, tokenizer.detokenize(ids)

        ids, back = round_trip(sentences)
        assert ids.numpy().tolist() == tokenizer.tokenize(sentences).to_tensor().numpy().tolist()
        assert _decode(back) == _decode(tokenizer.detokenize(ids))


_RELOAD_SCRIPT = textwrap.dedent("""
    import json, sys
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the tf-text ops before loading)
    module = tf.saved_model.load(sys.argv[1])
    sentences = json.loads(sys.argv[2])
    out = {}
    for name in ("sentencepiece", "wordpiece"):
        tokenizer = getattr(module, name)
        ids = tokenizer.tokenize(tf.constant(sentences))
        out[name] = {"ids": ids.to_list(),
                     "text": [s.decode() for s in tokenizer.detokenize(ids.to_tensor()).numpy()]}
    print("RESULT" + json.dumps(out))
""")


def _graph_op_types(export_dir):
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((export_dir / "saved_model.pb").read_bytes())
    graph = proto.meta_graphs[0].graph_def
    ops = {node.op for node in graph.node}
    for function in graph.library.function:
        ops.update(node.op for node in function.node_def)
    return ops


def test_saved_model_reloads_in_fresh_process(sentencepiece_tokenizers, wordpiece_tokenizers,
                                              sentencepiece_vocab, small_pairs, tmp_path):
    module = tf.Module()
    module.sentencepiece = sentencepiece_tokenizers[0]
    module.wordpiece = wordpiece_tokenizers[1]
    export_dir = tmp_path / "tokenizers"
    tf.saved_model.save(module, str(export_dir))
    # The vocabulary files travel with the SavedModel, so the original folder can go away.
    assets = {p.name for p in (export_dir / "assets").iterdir()}
    assert {"sentencepiece.model", "wordpiece.en.vocab"} <= assets

    custom_ops = _graph_op_types(export_dir) - set(dir(tf.raw_ops))
    assert custom_ops and custom_ops <= SERVING_TF_TEXT_OPS, custom_ops - SERVING_TF_TEXT_OPS

    sentences = [t for _, t in small_pairs]
    result = subprocess.run(
        [sys.executable, "-c", _RELOAD_SCRIPT, str(export_dir), json.dumps(sentences)],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    reloaded = json.loads(result.stdout.split("RESULT", 1)[1])
    for name, tokenizer in (("sentencepiece", module.sentencepiece),
                            ("wordpiece", module.wordpiece)):
        assert reloaded[name]["ids"] == tokenizer.tokenize(sentences).to_list()
        assert reloaded[name]["text"] == _decode(tokenizer.detokenize(
            tokenizer.tokenize(sentences).to_tensor()))
    assert reloaded["sentencepiece"]["text"] == sentences


def test_load_tokenizers_refuses_other_settings(sentencepiece_vocab, tmp_path):
    config, vocab_dir = sentencepiece_vocab
    with pytest.raises(ConfigError, match=r"vocab_size: built with 1000, config has 2000"):
        load_tokenizers(type(config)(**{**vars(config), "vocab_size": 2000}), vocab_dir)
    with pytest.raises(ConfigError, match=r"build-vocab"):
        load_tokenizers(config, tmp_path)


@pytest.mark.parametrize("damage", ["meta_not_json", "meta_a_list", "model_missing",
                                    "model_garbage", "model_truncated", "model_empty"])
def test_a_damaged_vocabulary_is_a_config_error_naming_the_file(sentencepiece_vocab, tmp_path,
                                                                 damage):
    import shutil

    config, vocab_dir = sentencepiece_vocab
    copy = tmp_path / "vocab"
    shutil.copytree(vocab_dir, copy)
    meta, model = copy / "tokenizer.json", copy / "sentencepiece.model"
    if damage == "meta_not_json":
        meta.write_text("{tokenizer: sentencepiece")
    elif damage == "meta_a_list":
        meta.write_text("[]")
    elif damage == "model_missing":
        model.unlink()
    elif damage == "model_garbage":
        model.write_bytes(b"\x00garbage" * 50)
    elif damage == "model_truncated":
        model.write_bytes(model.read_bytes()[:5000])
    else:
        model.write_bytes(b"")
    damaged = meta if damage.startswith("meta") else model
    with pytest.raises(ConfigError, match=rf"^{damaged}: "):
        load_tokenizers(config, copy)


def test_sentencepiece_info_lines_are_dropped_and_other_stderr_kept(sentencepiece_vocab,
                                                                   capfd):
    from keras_transformer.data.tokenizers import without_sentencepiece_info

    _, vocab_dir = sentencepiece_vocab
    capfd.readouterr()
    with without_sentencepiece_info():
        SentencePieceTokenizer(vocab_dir / "sentencepiece.model")  # its native line, if first
        os.write(2, b"normalizer.cc(51) LOG(INFO) precompiled_charsmap is empty.\nkept\n")
        print("also kept", file=sys.stderr)
    # (pytest's capfd takes Python's writes apart from file descriptor 2's: no order between)
    assert sorted(capfd.readouterr().err.splitlines()) == ["also kept", "kept"]


def test_sentencepiece_lowercase_is_rejected(multi30k_config, tmp_path):
    with pytest.raises(ConfigError, match="lowercase"):
        build_tokenizers(multi30k_config(lowercase=True), tf.data.Dataset.range(0), tmp_path)


def test_sentencepiece_learns_from_a_sample_of_at_most_vocab_sample_sentences(multi30k_config,
                                                                                 tmp_path):
    """The whole split is read, but SentencePiece keeps a bounded random sample (drawn anew at
    each build): from 150 sentences it learns far fewer than the 3,000 pieces it learns from
    4,000 (the soft vocabulary limit gives what the sample supports)."""
    from keras_transformer.data.corpora import load_pairs

    sizes = {}
    for sample in (150, 4000):
        config = multi30k_config(vocab_sample_sentences=sample, vocab_size=3000)
        pairs = load_pairs(config, "train").take(2000)
        sizes[sample] = build_tokenizers(config, pairs, tmp_path / str(sample))[0].vocab_size
    assert sizes[150] < 2000 and sizes[4000] == 3000, sizes


def test_model_with_other_reserved_ids_is_rejected(tmp_path, small_pairs):
    import sentencepiece

    sentences = [s for pair in small_pairs for s in pair] * 20
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_prefix=str(tmp_path / "default"),
        vocab_size=60, hard_vocab_limit=False, minloglevel=2)  # unk=0, bos=1, eos=2, no pad
    with pytest.raises(ConfigError, match=r"default.model.*pad/bos/eos/unk ids \(-1, 1, 2, 0\)"):
        SentencePieceTokenizer(tmp_path / "default.model")


def test_sentencepiece_vocab_smaller_than_the_alphabet_names_the_setting(tmp_path):
    from keras_transformer.config import ConfigError
    from keras_transformer.data.tokenizers import train_sentencepiece

    sentences = [f"{chr(0x4E00 + i)} {chr(0x4E00 + 2 * i)} abc" for i in range(400)]
    with pytest.raises(ConfigError, match=r"data.vocab_size=50 is too small .*raise data.vocab_size"):
        train_sentencepiece(sentences, tmp_path / "sp.model", vocab_size=50)


def _python_normalize(text: bytes) -> str:
    """`normalize_text` written with Python's str and unicodedata, as a reference."""
    import unicodedata

    chars = text.decode("utf-8", errors="replace")
    visible = "".join(c for c in chars if c.isspace() or c != "\ufffd" and
                      unicodedata.category(c) not in ("Cc", "Cf"))
    return " ".join(unicodedata.normalize("NFC", visible).split())


def test_normalize_text_splits_words_as_python_does():
    """Every character Python's str.split() splits at (tabs, no-break and other Unicode spaces)
    becomes one ASCII space in a run and none at the ends; characters that show nothing
    (zero-width spaces, byte-order marks, soft hyphens, NUL and other controls) are removed."""
    spaces = [chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()]
    invisible = ["\u200b", "\u2060", "\ufeff", "\u180e", "\u00ad", "\u200e", "\x00", "\x07",
                 "\x7f", "\x9b", "\ufffd"]
    texts = [f"{c}a{c}{c}b {c}c{c}" for c in spaces + invisible + ["_"]]
    texts += ["", "   ", "\t\n\u00a0", "Ein Mann\tfährt \u00a0 Fahrrad.\r", "\ufeff\u200b \x01"]
    got = [t.decode("utf-8") for t in normalize_text(tf.constant(texts)).numpy()]
    assert got[:len(spaces)] == ["a b c"] * len(spaces)
    assert got[len(spaces):-6] == ["ab c"] * len(invisible)
    assert got[-6:] == ["_a__b _c_", "", "", "", "Ein Mann fährt Fahrrad.", ""]
    assert got == [_python_normalize(t.encode()) for t in texts]


def test_normalize_text_composes_characters_and_drops_bytes_that_are_not_utf8():
    """NFC, as training text is written: a letter and a combining accent become one character
    (compatibility characters stay); bytes that are not UTF-8 are removed (as U+FFFD)."""
    texts = ["fa\u0308hrt Fahrrad", "Cafe\u0301", "\u212b", "\ufb01 \uff25\uff49\uff4e \u00bd"]
    got = normalize_text(tf.constant(texts)).numpy().tolist()
    assert got == [t.encode() for t in ["fährt Fahrrad", "Café", "\u00c5",
                                        "\ufb01 \uff25\uff49\uff4e \u00bd"]]
    raw = [b"\xff a\xc2\xa0\xc2\xa0b \x80", b"\xc2 x", b"Ein Mann f\xe4hrt", b"\xff\xfe"]
    got = normalize_text(tf.constant(raw)).numpy().tolist()
    assert got == [b"a b", b"x", b"Ein Mann fhrt", b""]
    assert got == [_python_normalize(r).encode() for r in raw]


def test_normalize_text_agrees_with_python_on_every_character():
    """Every character between two letters, and after a letter (where NFC may compose it),
    normalizes as Python's unicodedata says: the graph's removal, NFC and whitespace use the
    same character classes as the reference. Characters that Python's Unicode version has not
    assigned yet are left out (RE2's and ICU's tables may be newer)."""
    import unicodedata

    chars = [chr(c) for c in range(sys.maxunicode + 1)
             if unicodedata.category(chr(c)) not in ("Cn", "Cs")]
    texts = [f"a{c}b" for c in chars] + [f"e{c}" for c in chars]
    got = normalize_text(tf.constant(texts)).numpy()
    expected = [_python_normalize(t.encode()).encode() for t in texts]
    differ = [(t, g, e) for t, g, e in zip(texts, got, expected) if g != e]
    assert not differ, (len(differ), differ[:5])
