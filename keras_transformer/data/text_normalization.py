"""The one normalization of text before tokenizing, as character sets and a pure-Python twin.

`tokenizers.normalize_text` runs it as TensorFlow ops inside every graph (training pairs, the
SavedModel's inputs); `normalize` runs it without TensorFlow, for the CTranslate2 runtime
(`ctranslate2_translator`). Both read the character sets defined here, written out as code
point ranges and rendered once for RE2 (TensorFlow's regex engine: `INVISIBLE_PATTERN`,
`WHITESPACE_PATTERN`) and once for Python's `re`, so the two engines match the same characters
(`tests/test_text_normalization.py` checks every code point, and both pipelines byte for byte).

The steps (`NORMALIZATION`):

1. bytes that are not UTF-8 become U+FFFD, one per maximal ill-formed subsequence (the Unicode
   "substitution of maximal subparts" practice, which both `tf.strings.unicode_transcode`
   with errors="replace" and Python's `bytes.decode(errors="replace")` follow: b"\\xe2\\x82A"
   is U+FFFD "A", b"\\xed\\xa0\\x80" (a UTF-8 surrogate) three U+FFFD);
2. characters that show nothing are removed (`INVISIBLE_RANGES`), U+FFFD among them;
3. NFC;
4. every run of Unicode whitespace (`WHITESPACE_RANGES`) becomes one ASCII space, none is left
   at either end.

One known difference: NFC here is Python's `unicodedata` (Unicode 14.0 in Python 3.11), in the
graph tf-text's ICU (newer). Marks assigned since 14.0 (Nag Mundari, Garay, Todhri, Ol Onal,
U+0897, U+1E08F) have combining class 0 for Python, so a run of two or more combining marks
that includes one is reordered or composed by the graph but not here. Every character alone,
and every sequence of characters Unicode 14.0 assigned, normalizes identically.
"""

from __future__ import annotations

import re
import unicodedata

# Unicode's format characters (general category Cf) as RE2 in TensorFlow 2.21 has them (Unicode
# 15.0+): soft hyphen, Arabic number signs, zero-width spaces and joiners, bidirectional marks,
# word joiners, the byte-order mark, interlinear annotation, tag characters, ... Written out
# rather than RE2's \p{Cf} because Python's `re` has no \p{...} and Python 3.11's unicodedata
# (Unicode 14.0) lacks U+13439-U+1343F.
FORMAT_RANGES = (
    (0x00AD, 0x00AD), (0x0600, 0x0605), (0x061C, 0x061C), (0x06DD, 0x06DD), (0x070F, 0x070F),
    (0x0890, 0x0891), (0x08E2, 0x08E2), (0x180E, 0x180E), (0x200B, 0x200F), (0x202A, 0x202E),
    (0x2060, 0x2064), (0x2066, 0x206F), (0xFEFF, 0xFEFF), (0xFFF9, 0xFFFB), (0x110BD, 0x110BD),
    (0x110CD, 0x110CD), (0x13430, 0x1343F), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A),
    (0xE0001, 0xE0001), (0xE0020, 0xE007F),
)
# Characters that show nothing: the control characters that are not whitespace (C0, DEL, C1 but
# U+0085), the format characters, and U+FFFD, which stands for bytes that were not UTF-8. A
# byte-order mark, a zero-width space or a NUL changes no translation.
INVISIBLE_RANGES = ((0x00, 0x08), (0x0E, 0x1B), (0x7F, 0x84), (0x86, 0x9F), *FORMAT_RANGES,
                    (0xFFFD, 0xFFFD))
# The characters of Python's str.isspace() (the Unicode White_Space characters plus the ASCII
# separators U+001C-U+001F), so that normalized text and Python's str.split()/strip() agree on
# words.
WHITESPACE_RANGES = ((0x09, 0x0D), (0x1C, 0x20), (0x85, 0x85), (0xA0, 0xA0), (0x1680, 0x1680),
                     (0x2000, 0x200A), (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F),
                     (0x3000, 0x3000))

NORMALIZATION = ("bytes that are not UTF-8 replaced by U+FFFD; control characters other than "
                 "whitespace, format characters (Cf) and U+FFFD removed; NFC; every run of "
                 "Unicode whitespace made one space, none at either end")


def re2_class(ranges: tuple[tuple[int, int], ...]) -> str:
    """Code point ranges ((first, last), ...) -> an RE2 pattern matching a run of them."""
    parts = (f"\\x{{{a:x}}}" if a == b else f"\\x{{{a:x}}}-\\x{{{b:x}}}" for a, b in ranges)
    return f"[{''.join(parts)}]+"


def python_class(ranges: tuple[tuple[int, int], ...]) -> re.Pattern:
    """Code point ranges ((first, last), ...) -> a compiled `re` pattern matching a run of
    them (the same characters as `re2_class(ranges)`)."""
    parts = (f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges)
    return re.compile(f"[{''.join(parts)}]+")


INVISIBLE_PATTERN = re2_class(INVISIBLE_RANGES)  # for tf.strings.regex_replace
WHITESPACE_PATTERN = re2_class(WHITESPACE_RANGES)
_INVISIBLE = python_class(INVISIBLE_RANGES)
_WHITESPACE = python_class(WHITESPACE_RANGES)


def normalize(text: str | bytes) -> bytes:
    """One text -> its normalized UTF-8 bytes, as `tokenizers.normalize_text` makes them.

    Args:
        text: bytes in any state, or a str (encoded as UTF-8 first; a lone surrogate in it
            becomes the three bytes that are not UTF-8, and so is removed).

    Returns:
        UTF-8 bytes: no invisible characters, NFC, single spaces between words, none at the ends.
    """
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    string = _INVISIBLE.sub("", data.decode("utf-8", "replace"))
    string = unicodedata.normalize("NFC", string)
    return _WHITESPACE.sub(" ", string).strip(" ").encode("utf-8")
