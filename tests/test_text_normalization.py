"""text_normalization: RE2 and Python's `re` match the same characters, and `normalize` (pure
Python) gives what `tokenizers.normalize_text` (TensorFlow ops) gives, byte for byte."""

import subprocess
import sys
import unicodedata

import pytest
import tensorflow as tf

from keras_transformer.data.text_normalization import (FORMAT_RANGES, INVISIBLE_RANGES,
                                                  WHITESPACE_RANGES, normalize, python_class,
                                                  re2_class)
from keras_transformer.data.tokenizers import normalize_text

# Every code point that UTF-8 can encode (surrogates cannot be), in order.
EVERY_CHARACTER = "".join(chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF)

TRICKY = [
    b"", b" ", b"\t\n\r ", "\u00a0\u3000".encode(),
    # byte-order mark, zero-width characters, bidirectional marks, tags, NUL and controls
    b"\xef\xbb\xbfEin Hund.", "a\u200bb", "a\u200c\u200db", "\u2060", "\u200e\u202aabc\u202c",
    "flag\U000E0067\U000E0062", b"a\x00b", b"\x00", b"\x07\x1b\x7f", "\x9b\x85x",
    "\U00013439 Unicode 15 format", "\u00adsoft", "\ufeff\u200b \x01",
    # combining accents: composition, canonical reordering, a zero-width joiner between
    "fa\u0308hrt", "Cafe\u0301", "e\u0301\u0323", "\u1e0b\u0323", "e\u200d\u0301", "\u212b",
    "\u1100\u1161\u11a8", "\uac00\u11a8", "\u0301 leading mark", "\ufe0f\U0001f469\u200d\U0001f4bb",
    "\ufb01 \uff25\uff49\uff4e \u00bd",
    # whitespace runs: tabs, newlines, no-break and other Unicode spaces, separators
    "  Ein\tMann\n\nfährt \u00a0 Fahrrad.\r\n", "a\u2007\u202f\u205fb", "\u0085 x \u2028\u2029",
    "\x1c\x1d\x1e\x1fy", "a\u1680\u2000\u200ab", "a\u180eb",
    # bytes that are not UTF-8: lone, truncated, overlong, surrogates, past U+10FFFF, Latin-1
    b"\xff", b"\xff\xfe", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82A",
    b"\xf0\x9f\x99", b"a\x80\x80b", b"\xe0\x80\xaf", b"\xf8\x88\x80\x80\x80", b"f\xe4hrt",
    b"\xc3", b"\xc3 \xa4", b"\xff a\xc2\xa0\xc2\xa0b \x80", "\ufffd".encode(),
    "a\ud800b".encode("utf-8", "surrogatepass"),
    # noncharacters and the last code point are UTF-8 and stay
    "\ufffe\uffff\U0010ffff".encode(),
]


def _bytes(text):
    return text if isinstance(text, bytes) else text.encode("utf-8")


def _graph(texts):
    return normalize_text(tf.constant([_bytes(t) for t in texts])).numpy().tolist()


def _characters(ranges):
    return {c for first, last in ranges for c in range(first, last + 1)}


@pytest.mark.parametrize("ranges", [INVISIBLE_RANGES, WHITESPACE_RANGES])
def test_re2_and_python_re_match_the_same_characters(ranges):
    """Removing the pattern's runs from every code point leaves the same text in both engines:
    the RE2 and `re` renderings of the ranges are one character class."""
    graph = tf.strings.regex_replace(EVERY_CHARACTER.encode(), re2_class(ranges), "").numpy()
    python = python_class(ranges).sub("", EVERY_CHARACTER).encode()
    assert graph == python
    assert len(EVERY_CHARACTER) - len(python.decode()) == len(_characters(ranges))


def test_format_ranges_are_re2s_cf_and_hold_pythons():
    """FORMAT_RANGES are RE2's \\p{Cf} (so the graph removes what it removed before they were
    written out), and hold every Cf character of Python's unicodedata."""
    re2_cf = tf.strings.regex_replace(EVERY_CHARACTER.encode(), r"[^\p{Cf}]+", "").numpy()
    assert {ord(c) for c in re2_cf.decode()} == _characters(FORMAT_RANGES)
    python_cf = {ord(c) for c in EVERY_CHARACTER if unicodedata.category(c) == "Cf"}
    assert python_cf <= _characters(FORMAT_RANGES)


def test_whitespace_ranges_are_pythons_isspace():
    assert {ord(c) for c in EVERY_CHARACTER if c.isspace()} == _characters(WHITESPACE_RANGES)


def test_normalize_equals_normalize_text_on_tricky_inputs():
    """Byte for byte, including every kind of byte that is not UTF-8 (U+FFFD per maximal
    ill-formed subsequence in both, then removed)."""
    got = [normalize(t) for t in TRICKY]
    assert got == _graph(TRICKY)
    assert got[:8] == [b"", b"", b"", b"", b"Ein Hund.", b"ab", b"ab", b""]
    assert normalize(b"\xe2\x82A") == b"A" and normalize("e\u200d\u0301") == "\u00e9".encode()


def test_transcoding_replaces_maximal_subparts_as_python_does():
    """Step 1 alone: TensorFlow's U+FFFD for bytes that are not UTF-8 are Python's."""
    raw = [t for t in TRICKY if isinstance(t, bytes)]
    graph = tf.strings.unicode_transcode(raw, "UTF-8", "UTF-8", errors="replace",
                                         replacement_char=0xFFFD).numpy().tolist()
    assert graph == [r.decode("utf-8", "replace").encode() for r in raw]
    replaced = dict(zip(raw, graph))
    assert replaced[b"\xe2\x82A"] == "\ufffdA".encode()  # one for the truncated sequence
    assert replaced[b"\xed\xa0\x80"] == "\ufffd".encode() * 3  # one per byte of a surrogate


def test_normalize_equals_normalize_text_on_every_character_alone():
    """Every code point between two letters and after a letter (where NFC may compose it),
    assigned or not: one text of "|"-separated pieces, which no step joins or splits."""
    pieces = [f"a{c}b" for c in EVERY_CHARACTER if c != "|"]
    pieces += [f"e{c}" for c in EVERY_CHARACTER if c != "|"]
    text = "|".join(pieces)
    graph, = _graph([text])
    python = normalize(text)
    differ = [(p, g, e) for p, g, e in zip(pieces, graph.split(b"|"), python.split(b"|"))
              if g != e]
    assert graph == python, (len(differ), differ[:5])


def test_str_is_normalized_as_its_utf8_bytes():
    for text in ["  Ein\u00a0Hund\u200b.", "a\ud800b", ""]:
        assert normalize(text) == normalize(text.encode("utf-8", "surrogatepass"))
    assert normalize("a\ud800b") == b"ab"


def test_the_module_imports_no_tensorflow():
    code = ("import sys, keras_transformer.data.text_normalization; "
            "assert not any(m.split('.')[0] in ('tensorflow', 'keras', 'tensorflow_text') "
            "for m in sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)
