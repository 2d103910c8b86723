"""Word alignments from cross-attention, without TensorFlow: the rule that
`Translator.align` computes in its graph, for the CTranslate2 runtime and for reading.

The alignment of a translation is Marian's `--alignment hard`: for each target word, the source
word it attends to most, in one decoder layer's cross-attention averaged over the heads
(`decode.alignment_layer`) while the model reads the translation. Words are the subwords merged
as detokenization merges them (SentencePiece: a piece starting with `WORD_BOUNDARY` starts a
word). A source word's weight is the sum of its subwords' weights; a target word's row is the
mean of its subwords' rows; START, END and PAD belong to no word. The result is written in
Pharaoh format, `i-j` pairs of source word i and target word j counted from 0, target words in
order: "0-0 1-2 2-1".

Attention is not alignment: these are approximate (Garg et al. 2019, "Jointly Learning to Align
and Translate with Transformer Models"), good enough to carry markup across but not a word
aligner's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

WORD_BOUNDARY = "\u2581"  # what SentencePiece puts before the first piece of a word


def word_indices(pieces: Sequence[str | None]) -> np.ndarray:
    """Subword pieces -> int array of the index of each one's word (from 0); None (START,
    END, PAD) -> -1. A first piece that starts no word joins word 0."""
    indices, word = [], -1
    for piece in pieces:
        if piece is None:
            indices.append(-1)
            continue
        if piece.startswith(WORD_BOUNDARY) or word < 0:
            word += 1
        indices.append(word)
    return np.array(indices, np.int64)


def word_attention(attention: np.ndarray, source_words: np.ndarray,
                   target_words: np.ndarray) -> np.ndarray:
    """Subword attention `[target_len, source_len]` -> word attention `[target words, source
    words]`: summed over each source word's subwords, averaged over each target word's
    (`source_words`/`target_words` from `word_indices`, -1 left out)."""
    attention = np.asarray(attention, np.float64)
    sources, targets = int(source_words.max(initial=-1)) + 1, int(target_words.max(initial=-1)) + 1
    words = np.zeros((targets, sources))
    counts = np.zeros(targets)
    for t, target_word in enumerate(target_words):
        if target_word < 0:
            continue
        counts[target_word] += 1
        for s, source_word in enumerate(source_words):
            if source_word >= 0:
                words[target_word, source_word] += attention[t, s]
    return words / np.maximum(counts, 1)[:, None]


def hard_alignment(words: np.ndarray) -> str:
    """Word attention `[target words, source words]` -> Pharaoh pairs, each target word with
    its most attended source word ("" without source words)."""
    if words.shape[1] == 0:
        return ""
    return " ".join(f"{source}-{target}" for target, source in enumerate(words.argmax(axis=1)))
