"""Filtering a parallel corpus before training, back-translated pairs above all.

A small model's sampled back-translations hold pairs that teach nothing: a translation much
longer or shorter than its source, a word of one character repeated ("slonnnnnnnned"), a pair
the model itself finds improbable. `keras-transformer filter` keeps the pairs that pass every
rule given and writes them as a `file_pair` corpus; `keras-transformer score` gives the
scores (its second column, log P / lp). No TensorFlow: the rules read text and numbers.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Iterable, Iterator, Optional

from keras_transformer.config import ConfigError

# the rules in the order they are checked; a dropped pair counts under the first it breaks
RULES = ("empty", "length_ratio", "repeat", "score")


@dataclasses.dataclass(frozen=True)
class FilterRules:
    """What a kept pair satisfies (None: no such rule). Empty sides are always dropped."""

    max_length_ratio: Optional[float] = None  # words of the longer side / the shorter side's
    max_repeat: Optional[int] = None  # the longest run of one character, on either side
    min_score: Optional[float] = None  # `score`'s log P / lp of the pair, at least

    def __post_init__(self):
        # nan and infinity would turn a rule off without a word (no pair compares below nan)
        ratio, score = self.max_length_ratio, self.min_score
        if ratio is not None and not (ratio >= 1 and math.isfinite(ratio)):
            raise ConfigError(f"max_length_ratio={ratio!r} must be a finite number >= 1")
        if self.max_repeat is not None and not self.max_repeat >= 1:
            raise ConfigError(f"max_repeat={self.max_repeat!r} must be >= 1")
        if score is not None and not math.isfinite(score):
            raise ConfigError(f"min_score={score!r} must be a finite number (a log P / lp)")


def longest_repeat(text: str) -> int:
    """The length of the longest run of one character in `text` (0 if empty)."""
    return max((len(match.group(0)) for match in re.finditer(r"(.)\1*", text, re.DOTALL)),
               default=0)


def broken_rule(source: str, target: str, score: Optional[float],
                rules: FilterRules) -> Optional[str]:
    """The first of `RULES` the pair breaks, or None if it is kept."""
    source_words, target_words = len(source.split()), len(target.split())
    if not source_words or not target_words:
        return "empty"
    if rules.max_length_ratio is not None and (
            max(source_words, target_words) > rules.max_length_ratio
            * min(source_words, target_words)):
        return "length_ratio"
    if rules.max_repeat is not None and max(longest_repeat(source),
                                            longest_repeat(target)) > rules.max_repeat:
        return "repeat"
    if rules.min_score is not None and (score is None or score < rules.min_score):
        return "score"
    return None


@dataclasses.dataclass
class FilterCounts:
    """How many pairs were read, kept and dropped under each rule."""

    read: int = 0
    kept: int = 0
    dropped: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(RULES, 0))

    def line(self) -> str:
        dropped = ", ".join(f"{rule.replace('_', ' ')} {count:,}"
                            for rule, count in self.dropped.items() if count)
        return (f"kept {self.kept:,} of {self.read:,} pairs"
                f"{f' (dropped: {dropped})' if dropped else ''}")


def filter_pairs(pairs: Iterable[tuple[str, str]], rules: FilterRules,
                 scores: Optional[Iterable[float]] = None,
                 counts: Optional[FilterCounts] = None) -> Iterator[tuple[str, str]]:
    """Yields the (source, target) pairs that pass `rules`, counting into `counts`; `scores`
    (one a pair, in order) are what `rules.min_score` reads."""
    counts = FilterCounts() if counts is None else counts
    scores = iter(scores) if scores is not None else None
    for source, target in pairs:
        score = next(scores, None) if scores is not None else None
        counts.read += 1
        rule = broken_rule(source, target, score, rules)
        if rule is not None:
            counts.dropped[rule] += 1
            continue
        counts.kept += 1
        yield source, target


def parse_score_line(line: str, number: int, path: str) -> float:
    """The log P / lp of a `keras-transformer score` output line (its second column)."""
    fields = line.split("\t")
    try:
        score = float(fields[1])
    except (IndexError, ValueError):
        raise ConfigError(f"{path}, line {number}: {line.strip()[:60]!r} is not a line of "
                          "`keras-transformer score` (log P, log P / lp, tokens)") from None
    if math.isnan(score):  # it would pass any --min-score (nothing compares below nan)
        raise ConfigError(f"{path}, line {number}: the score (log P / lp) is nan, not a number")
    return score
