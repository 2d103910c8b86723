"""Case folding: a source in capitals or in title case is translated in lower case, and its
translation put back into the source's case.

A model trained on ordinary text meets ``EIN MANN MIT EINEM HUT`` as a string of rare pieces
and degenerates (``TAAAAAA...``, experiments/RESULTS.md, "Robustness"). Statistical MT
pipelines lowercased or truecased their input and recased their output (Moses' truecaser and
recaser); this is that rule for the two forms people type by mistake or for emphasis:

- capitals (`CAPITALS`): at least `MIN_LETTERS` letters, and at least 80% of them capitals
  (``NASA und ESA`` is not: 7 of 10);
- title case (`TITLE`): at least 3 words of 2 or more letters, each beginning with a capital
  (German capitalizes nouns, never every word of a sentence);
- anything else is ordinary (`ORDINARY`) and left as it is.

With `data.case_folding`, a source of either form is lowercased before it is tokenized, in
training (after `data.modifiers`, whose ``upper_case`` and ``title_case`` thus teach the model
lowercased sources) and in translation, and the translation is put in capitals, or each of its
words given a capital first letter. Names and nouns lose their capitals in a lowercased source;
a model learns them from the `upper_case` and `title_case` shares.

The rule is written twice: here in Python (training pairs, the CTranslate2 runtime) and as
TensorFlow ops in `tokenizers.case_form`, `fold_case` and `restore_case` (the SavedModel),
over the Unicode categories: letters (L) and capitals (Lu). Python's `unicodedata` (Unicode
14.0 in Python 3.11) and TensorFlow's RE2 and ICU (newer) may disagree on letters assigned
since; `str.lower`/`str.upper` and ICU's full case mappings agree on every letter of the
European alphabets (``ß`` -> ``SS``, ``İ`` -> ``i̇``); tests/test_casing.py checks both byte for
byte. TensorFlow-free.
"""

from __future__ import annotations

import unicodedata

ORDINARY, CAPITALS, TITLE = 0, 1, 2
MIN_LETTERS = 4  # a source in capitals has at least this many letters
CAPITAL_SHARE = (4, 5)  # and at least 4/5 of them capitals
TITLE_WORDS = 3  # a source in title case has at least this many words of 2 or more letters


def _is_letter(char: str) -> bool:
    return unicodedata.category(char).startswith("L")


def case_form(text: str) -> int:
    """`CAPITALS`, `TITLE` or `ORDINARY` (see the module docstring)."""
    letters = sum(map(_is_letter, text))
    capitals = sum(unicodedata.category(char) == "Lu" for char in text)
    if letters >= MIN_LETTERS and capitals * CAPITAL_SHARE[1] >= letters * CAPITAL_SHARE[0]:
        return CAPITALS
    long_words = [word for word in text.split(" ") if sum(map(_is_letter, word)) >= 2]
    if len(long_words) >= TITLE_WORDS and all(_starts_with_capital(w) for w in long_words):
        return TITLE
    return ORDINARY


def _starts_with_capital(word: str) -> bool:
    """Whether the first letter of `word` is a capital (``"(Ein"`` does)."""
    first = next(char for char in word if _is_letter(char))
    return unicodedata.category(first) == "Lu"


def fold_case(text: str) -> tuple[str, int]:
    """`text` lowercased if it is in capitals or title case, and its `case_form`."""
    form = case_form(text)
    return (text.lower() if form != ORDINARY else text), form


def restore_case(text: str, form: int) -> str:
    """A translation `text` in the case `form` of its source: capitals (`str.upper`), title
    case (each space-separated word's first character upper-cased), or as it is."""
    if form == CAPITALS:
        return text.upper()
    if form == TITLE:
        return " ".join(word[:1].upper() + word[1:] for word in text.split(" "))
    return text
