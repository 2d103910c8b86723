"""Placeholders: numbers, web addresses and emoji carried through a translation unchanged.

A model copies a span it has never seen badly: the demo model turned `18 ein Mann` into
`A man 80` and dropped or mangled emoji (experiments/RESULTS.md, "Robustness"). The field
carries such spans through placeholders (OpusTrainer's placeholder modifier in the Firefox
Translations pipeline, Marian's and Sockeye's inline tags): the translator replaces each span
of the source by a placeholder piece, the model copies the piece as it copies any word it
learned to copy, and the translator puts the span back. With `data.placeholders`:

- the vocabulary gets the pieces ``<ph0>`` ... ``<ph7>`` (`SYMBOLS`, each never split);
- training replaces each span of a source that its target has too by the next placeholder, on
  both sides (`mask_pair`: the spans a reference spells otherwise, ``2`` -> ``two``, stay as
  they are), after `data.modifiers` (whose ``copy_spans`` puts such spans in);
- translation replaces every span of the source (`mask`), the first `MAX_SPANS` in reading
  order, and puts the spans back into the output (`unmask`; a placeholder the source did not
  have becomes nothing).

A span (`SPAN_PATTERN`) is a placeholder (a ``<ph3>`` typed in the input comes out as it
is), a web address (``https://...``, ``www....``), an e-mail address, a
run of emoji (with a variation selector) or a number (``42``, ``3,5``, ``1.250``, ``14:30``,
``25%``), the first that matches where the text is read. The pattern is written for RE2
(TensorFlow's regex engine, in the SavedModel: `tokenizers.mask_spans`) and for Python's `re`
(here, for training pairs and the CTranslate2 runtime) alike: ASCII classes only, so both
engines find the same spans (tests/test_placeholders.py checks both, byte for byte). Names are
not spans here: a capitalized German word is a noun as often as a name, so names are learned
through ``copy_spans``. TensorFlow-free.
"""

from __future__ import annotations

import re

MAX_SPANS = 8  # placeholders a sentence can have; later spans stay in the text
SYMBOLS = tuple(f"<ph{index}>" for index in range(MAX_SPANS))
PLACEHOLDER_PATTERN = "<ph[0-9]>"
# What `unmask` replaces: a placeholder as the model writes it, or upper-cased with the
# output (`casing.restore_case`).
OUTPUT_PLACEHOLDER_PATTERN = "<[pP][hH][0-9]>"

# Emoji blocks: regional indicators (flags), pictographs, emoticons, transport, supplemental
# symbols and pictographs, and the older miscellaneous symbols and dingbats; then U+FE0F (the
# emoji presentation selector) may follow. Skin tones (U+1F3FB-U+1F3FF) are pictographs here.
EMOJI_RANGES = ((0x1F1E6, 0x1F1FF), (0x1F300, 0x1FAFF), (0x2600, 0x27BF))
_EMOJI = "".join(f"{chr(first)}-{chr(last)}" for first, last in EMOJI_RANGES)
_URL_END = " .,;:!?)\\]}\"'"  # characters that end a sentence rather than an address
SPAN_PATTERN = "|".join((
    PLACEHOLDER_PATTERN,  # a placeholder in the input is carried through as it is
    f"(?:https?://|www\\.)[^ ]*[^{_URL_END}]",  # web address, trailing punctuation left out
    "[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\\.[A-Za-z0-9-]+)+",  # e-mail address
    f"[{_EMOJI}][{_EMOJI}\ufe0f]*",  # emoji, one or several
    "[0-9]+(?:[.,:][0-9]+)*%?",  # number
))
_SPAN = re.compile(SPAN_PATTERN)
WORD_BOUNDARY = "\u2581"  # SentencePiece's mark of a word start (word_alignment.WORD_BOUNDARY)
_OUTPUT_PLACEHOLDER = re.compile(OUTPUT_PLACEHOLDER_PATTERN)


def in_vocabulary(piece_to_id, unk_id: int) -> bool:
    """Whether a SentencePiece vocabulary has every placeholder as a piece of its own, after a
    space (``▁<ph0>``) and inside a word (``<ph0>``): whether it was built with
    `data.placeholders`. `piece_to_id`: the processor's method of that name."""
    return all(piece_to_id(piece) != unk_id for piece in pieces())


def pieces() -> list[str]:
    """The vocabulary pieces of the placeholders: each after a space and inside a word."""
    return [WORD_BOUNDARY + symbol for symbol in SYMBOLS] + list(SYMBOLS)


def spans(text: str) -> list[str]:
    """The spans of `text` in reading order, as `SPAN_PATTERN` finds them."""
    return _SPAN.findall(text)


def mask(text: str) -> tuple[str, list[str]]:
    """`text` with its first `MAX_SPANS` spans replaced by ``<ph0>``, ``<ph1>``, ... in reading
    order, and those spans (``"18 Männer"`` -> ``("<ph0> Männer", ["18"])``)."""
    found = []

    def replace(match):
        if len(found) == MAX_SPANS:
            return match[0]
        found.append(match[0])
        return SYMBOLS[len(found) - 1]

    return _SPAN.sub(replace, text), found


def unmask(text: str, spans_of_source: list[str]) -> str:
    """`text` with each placeholder ``<phK>`` (or ``<PHK>``) replaced by `spans_of_source[K]`,
    or removed where the source had no K-th span."""
    def replace(match):
        index = int(match[0][3:-1])
        return spans_of_source[index] if index < len(spans_of_source) else ""
    return _OUTPUT_PLACEHOLDER.sub(replace, text)


def mask_pair(source: str, target: str) -> tuple[str, str]:
    """A training pair with each source span that the target has too replaced by the next
    placeholder on both sides (the target's first occurrence not yet replaced), at most
    `MAX_SPANS`; the other spans stay as they are."""
    parts, cursor, index = [], 0, 0
    for match in _SPAN.finditer(source):
        if index == MAX_SPANS:
            break
        place = _free_occurrence(target, match[0])
        if place < 0:
            continue
        parts.append(source[cursor:match.start()] + SYMBOLS[index])
        cursor = match.end()
        target = target[:place] + SYMBOLS[index] + target[place + len(match[0]):]
        index += 1
    return "".join(parts) + source[cursor:], target


def _free_occurrence(target: str, span: str) -> int:
    """Where `span` is in `target` as a span of its own (not inside a longer span: ``5`` is not
    in ``25``, nor in the placeholder ``<ph5>``), or -1."""
    for match in _SPAN.finditer(target):
        if match[0] == span:
            return match.start()
    return -1
