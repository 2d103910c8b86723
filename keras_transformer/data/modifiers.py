"""Training-pair modifiers: the text people type, made from clean pairs as training reads them.

A model trained on clean captions has never seen a sentence in capitals, a typo, a number at the
start of a sentence or an emoji, and it degenerates on them (``EIN MANN ...`` -> ``TAAAAA...``).
The field makes such input part of training rather than of the data: the Firefox Translations
pipeline trains every model through OpusTrainer (mozilla/translations), whose modifiers upper-case
or title-case a share of the pairs, insert typos and carry numbers and markup through; Marian has
``--all-caps-every`` and ``--english-title-case-every``. These are those modifiers
(`data.modifiers`, `config.ModifiersConfig`), each given the share of training pairs it changes:

- ``upper_case``: the source in capitals (``str.upper``: ``ß`` becomes ``SS``), and the target
  too with `case_target`.
- ``title_case``: the source with every word's first letter a capital, and the target too
  with `case_target`.
- ``typos``: the source gets a typo in about one word in six (`TYPO_RATE`): two letters
  swapped, a letter dropped, doubled, or replaced by a neighbour on the keyboard, or a letter
  inserted (OpusTrainer's ``Typos`` draws from the same kinds).
- ``copy_spans``: one span that a translation copies, a number, a name in Latin script, a URL
  or an emoji (`random_span`), inserted into both sides: before the source word at a random
  place and before the target word at the same relative place (the first, the last, or the
  one as far into the target), so that the model learns to carry such spans through.

Every pair is changed by each modifier independently, in the order typos, case, spans, so one
pair may get several. Case changes the source only unless `case_target`: a model then answers
capitals with ordinary case, and its decoder learns nothing new. Upper-casing the target as
well (OpusTrainer's and Marian's way, so that outputs keep the input's case) makes the model
learn capitals as a second target language, spelled in several times as many pieces: in the
800-step demo it held validation BLEU at 6.3 after 300 steps against 16.5 without modifiers
(experiments/RESULTS.md, "Robustness"). A leading tag such as ``<BT>`` (a corpus's `tag`) is kept as it is. The
changes are a function of the pair, the seed and the pass only (`modify_batch`), so a resumed
run reads the pairs that an uninterrupted run read. Pure Python: `data.TrainingStream` runs it
on each pass's pairs (`tf.numpy_function`); it imports neither TensorFlow nor Keras.
"""

from __future__ import annotations

import random
import re
import string
from typing import Sequence

from keras_transformer.data.casing import fold_case
from keras_transformer.data.placeholders import mask_pair

TYPO_RATE = 1 / 6  # the share of a typo sentence's words that get a typo
MODIFIERS = ("typos", "upper_case", "title_case", "copy_spans")  # the order they apply in

# Neighbours on a QWERTZ keyboard (German; English QWERTY differs in y/z only).
_ROWS = ("qwertzuiopü", "asdfghjklöä", "yxcvbnm")
_NEIGHBOURS = {}
for _row_index, _row in enumerate(_ROWS):
    for _column, _letter in enumerate(_row):
        _near = [_row[c] for c in (_column - 1, _column + 1) if 0 <= c < len(_row)]
        for _other in (_row_index - 1, _row_index + 1):
            if 0 <= _other < len(_ROWS):
                _near += [_ROWS[_other][c] for c in (_column - 1, _column, _column + 1)
                          if 0 <= c < len(_ROWS[_other])]
        _NEIGHBOURS[_letter] = "".join(_near)

_TAG = re.compile(r"<[^\s<>]+>")
_SYLLABLES_START = ("b", "br", "d", "f", "g", "h", "j", "k", "kl", "l", "m", "n", "p", "r", "s",
                    "st", "t", "tr", "v", "w", "z")
_SYLLABLES_VOWEL = ("a", "e", "i", "o", "u", "a", "e", "i", "o", "ä", "é", "ó", "ü", "y", "ei",
                    "ou", "ia")
_SYLLABLES_END = ("", "", "", "n", "r", "s", "l", "k", "t", "m", "nd", "ck")
_TLDS = ("com", "org", "net", "de", "eu", "io", "info", "co.uk", "at", "ch")
# Emoji blocks: emoticons, pictographs, transport, supplemental symbols, and the older symbols.
_EMOJI_RANGES = ((0x1F600, 0x1F64F), (0x1F300, 0x1F5FF), (0x1F680, 0x1F6C5),
                 (0x1F90C, 0x1F9FF), (0x2600, 0x26FF), (0x2700, 0x27BF))


def random_name(rng: random.Random) -> str:
    """A made-up name in Latin script, one or two words (``Marek Tolani``): a model learns to
    copy names, not a list of them."""
    def word():
        syllables = rng.choice((2, 2, 3))
        text = "".join(rng.choice(_SYLLABLES_START) + rng.choice(_SYLLABLES_VOWEL)
                       for _ in range(syllables)) + rng.choice(_SYLLABLES_END)
        return text[:1].upper() + text[1:]
    return word() if rng.random() < 0.4 else f"{word()} {word()}"


def random_number(rng: random.Random) -> str:
    """A number as people write one: 7, 42, 1,250, 2024, 3.5 or 3,5, 14:30, 25%, 0171 ..."""
    kind = rng.random()
    if kind < 0.35:
        return str(rng.randint(0, 99))
    if kind < 0.55:
        return str(rng.randint(100, 99_999))
    if kind < 0.7:
        return str(rng.randint(1900, 2035))
    if kind < 0.8:
        return f"{rng.randint(0, 99)}{rng.choice('.,')}{rng.randint(0, 99)}"
    if kind < 0.88:
        return f"{rng.randint(0, 23)}:{rng.randint(0, 59):02d}"
    if kind < 0.94:
        return f"{rng.randint(1, 100)}%"
    return f"{rng.randint(1_000, 999_999):,}".replace(",", rng.choice(".,"))


def random_url(rng: random.Random) -> str:
    """A web or e-mail address: www.name.de, https://name.org/path, name@name.com."""
    name = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 9)))
    tld = rng.choice(_TLDS)
    kind = rng.random()
    if kind < 0.4:
        return f"www.{name}.{tld}"
    if kind < 0.75:
        path = "".join(rng.choice(string.ascii_lowercase + string.digits)
                       for _ in range(rng.randint(2, 8)))
        return f"https://{name}.{tld}/{path}"
    user = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 7)))
    return f"{user}@{name}.{tld}"


def random_emoji(rng: random.Random) -> str:
    """One emoji (sometimes two) from the emoji blocks of Unicode."""
    first, last = rng.choice(_EMOJI_RANGES)
    emoji = chr(rng.randint(first, last))
    return emoji * 2 if rng.random() < 0.15 else emoji


SPAN_KINDS = {"number": random_number, "name": random_name, "url": random_url,
              "emoji": random_emoji}
_SPAN_WEIGHTS = (0.45, 0.3, 0.1, 0.15)  # number, name, url, emoji


def random_span(rng: random.Random) -> str:
    """A span a translation should copy as it is: a number, a name, a URL or an emoji."""
    kind = rng.choices(tuple(SPAN_KINDS), weights=_SPAN_WEIGHTS)[0]
    return SPAN_KINDS[kind](rng)


def upper_case(text: str) -> str:
    """Every letter a capital (``Straße`` -> ``STRASSE``)."""
    return text.upper()


def title_case(text: str) -> str:
    """Every word's first letter a capital, the others as they are (``ein Mann`` -> ``Ein
    Mann``)."""
    return " ".join(word[:1].upper() + word[1:] for word in text.split(" "))


def typo(word: str, rng: random.Random) -> str:
    """`word` with one typo: two neighbouring letters swapped, a letter dropped, doubled or
    replaced by a keyboard neighbour, or a letter inserted. The case of a replaced letter is
    kept; a word of fewer than 2 letters is returned as it is."""
    letters = [i for i, char in enumerate(word) if char.isalpha()]
    if len(letters) < 2:
        return word
    i = rng.choice(letters)
    kind = rng.randrange(5)
    if kind == 0 and i + 1 < len(word) and word[i + 1].isalpha() and word[i] != word[i + 1]:
        return word[:i] + word[i + 1] + word[i] + word[i + 2:]
    if kind == 1:
        return word[:i] + word[i + 1:]
    if kind == 2:
        return word[:i] + word[i] + word[i:]
    neighbours = _NEIGHBOURS.get(word[i].lower())
    if not neighbours:  # not a letter of the keyboard (a digit, an accented letter): double it
        return word[:i] + word[i] + word[i:]
    char = rng.choice(neighbours)
    char = char.upper() if word[i].isupper() else char
    if kind in (0, 3):  # kind 0 lands here when the letter after i cannot be swapped with it
        return word[:i] + char + word[i + 1:]
    return word[:i] + char + word[i:]


def typos(text: str, rng: random.Random, rate: float = TYPO_RATE) -> str:
    """`text` with a typo in about `rate` of its words of 2 or more letters, at least one."""
    words = text.split(" ")
    candidates = [i for i, word in enumerate(words) if sum(c.isalpha() for c in word) >= 2]
    if not candidates:
        return text
    count = max(1, round(rate * len(candidates)))
    for i in rng.sample(candidates, count):
        words[i] = typo(words[i], rng)
    return " ".join(words)


def insert_span(source: str, target: str, span: str, rng: random.Random) -> tuple[str, str]:
    """`span` put before a random source word (or at the end) and before the target word at
    the same relative place: the first, the last (or the end), or as far into the target."""
    source_words, target_words = source.split(" "), target.split(" ")
    place = rng.randint(0, len(source_words))
    if place == 0:
        target_place = 0
    elif place == len(source_words):
        target_place = len(target_words)
    else:
        target_place = max(1, min(len(target_words) - 1,
                                  round(place * len(target_words) / len(source_words))))
    source_words.insert(place, span)
    target_words.insert(target_place, span)
    return " ".join(source_words), " ".join(target_words)


def modify_pair(source: str, target: str, shares: dict, rng: random.Random, *,
                case_target: bool = False, placeholders: bool = False,
                case_folding: bool = False) -> tuple[str, str]:
    """One pair through each modifier of `shares` ({name: share of pairs}, names from
    `MODIFIERS`), each drawn independently; a leading tag (``<BT>``) and empty pairs kept.
    Case changes the target as well only with `case_target`. With `case_folding`, a source
    then in capitals or title case is lowercased (`casing.fold_case`); with `placeholders`, the
    spans both sides then have are masked (`placeholders.mask_pair`)."""
    if not source or not target:
        return source, target
    tag = ""
    match = _TAG.match(source)
    if match and match.end() < len(source) and source[match.end()] == " ":
        tag, source = source[:match.end() + 1], source[match.end() + 1:]
    for name in MODIFIERS:
        share = shares.get(name, 0.0)
        if not share or rng.random() >= share:
            continue
        if name == "typos":
            source = typos(source, rng)
        elif name == "upper_case":
            source, target = upper_case(source), upper_case(target) if case_target else target
        elif name == "title_case":
            source, target = title_case(source), title_case(target) if case_target else target
        else:
            source, target = insert_span(source, target, random_span(rng), rng)
    if case_folding:
        source, _ = fold_case(source)
    if placeholders:
        source, target = mask_pair(source, target)
    return tag + source, target


def modify_batch(sources: Sequence[bytes], targets: Sequence[bytes], shares: dict, seed: int,
                 pass_index: int, batch_index: int, *, case_target: bool = False,
                 placeholders: bool = False,
                 case_folding: bool = False) -> tuple[list[bytes], list[bytes]]:
    """`modify_pair` over a batch of UTF-8 pairs, the random draws a function of (seed,
    pass_index, batch_index) and the pairs alone."""
    rng = random.Random((int(seed) * 1_000_003 + int(pass_index)) * 1_000_003
                        + int(batch_index))
    modified = [modify_pair(s.decode("utf-8"), t.decode("utf-8"), shares, rng,
                            case_target=case_target, placeholders=placeholders,
                            case_folding=case_folding)
                for s, t in zip(sources, targets)]
    return ([s.encode("utf-8") for s, _ in modified], [t.encode("utf-8") for _, t in modified])
