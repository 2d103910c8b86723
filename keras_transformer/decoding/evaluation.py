"""Scoring translations with sacreBLEU and chrF (detokenized, cased and lowercased)."""

from __future__ import annotations

from typing import Sequence

import sacrebleu


def score(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
    """sacreBLEU (13a tokenization, detokenized input) and chrF, cased and lowercased.

    Returns {"bleu", "bleu_lowercase", "chrf", "chrf_lowercase"} and their signatures.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    result = {}
    for suffix, lowercase in (("", False), ("_lowercase", True)):
        bleu = sacrebleu.metrics.BLEU(lowercase=lowercase)
        chrf = sacrebleu.metrics.CHRF(lowercase=lowercase)
        result[f"bleu{suffix}"] = bleu.corpus_score(hypotheses, [references]).score
        result[f"chrf{suffix}"] = chrf.corpus_score(hypotheses, [references]).score
        result[f"bleu{suffix}_signature"] = str(bleu.get_signature())
        result[f"chrf{suffix}_signature"] = str(chrf.get_signature())
    return result
