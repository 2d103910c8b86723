"""How long a search may run, how it ranks hypotheses and when it may stop: the rules every
runtime follows.

The SavedModel's `tf.while_loop` (`decoding`) and the CTranslate2 runtime
(`ctranslate2_translator`) both rank and stop by these, so the rules exist once. Pure Python
arithmetic: each function takes Python numbers or TensorFlow tensors alike (this module imports
neither TensorFlow nor Keras).

Paper, section 6.1: "We used beam search with a beam size of 4 and length penalty alpha = 0.6".
The length penalty is that of Wu et al. 2016 (GNMT, arXiv:1609.08144, eq. 14):
lp(Y) = ((5 + |Y|) / 6) ** alpha, where |Y| counts the generated tokens including END.
"""

from __future__ import annotations

import math

# Log-probability of impossible hypotheses, and the score of an empty n-best slot. Finite (as in
# tensorflow/models) so that arithmetic on it never produces NaN; real sequence log-probabilities
# are assumed to stay above NEG_INF / 2.
NEG_INF = -1e9

# How beam search decides that a sentence is done (`decode.stopping`), as an export's provenance
# records it.
STOPPING_RULES = {
    "exact": ("a sentence stops when its finished set is full and no alive hypothesis can beat "
              "the worst finished one (exact bound, lp at the length cap), or at its cap"),
    "beam_full": ("a sentence stops once patience x beam-size hypotheses have finished "
                  "(fairseq's and CTranslate2's rule; patience 1 is their default), when the "
                  "exact bound holds, or at its cap"),
}


def output_cap(source_tokens, max_extra_length, max_positions, prefix_tokens=0, *,
               minimum=min, maximum=max):
    """The most tokens a search generates for one source (END included): the source's tokens
    (START and END counted, after `kept_source_tokens`) + `max_extra_length` (section 6.1's
    "input length + 50"), at least a forced prefix's tokens + 1, at most the model's
    `max_positions`. `minimum`/`maximum`: the element-wise ops for tensors (`tf.minimum`,
    `tf.maximum`); Python's for numbers."""
    return minimum(maximum(source_tokens + max_extra_length, prefix_tokens + 1), max_positions)


def kept_source_tokens(max_source_length, max_positions):
    """How many tokens of a source (START and END counted) the encoder reads: a longer source
    keeps its first `kept - 1` tokens and END, as every training source ends with END; never
    more than the model's `max_positions` (a missing `max_source_length`: that)."""
    return min(max_source_length or max_positions, max_positions)


def length_penalty(length, alpha):
    """GNMT length penalty ((5 + length) / 6) ** alpha (Wu et al. 2016, eq. 14).

    Args:
        length: the number of generated tokens (END included): a Python number, or a float
            tensor of any shape.
        alpha: float >= 0 (or a float scalar tensor); 0 disables the penalty (returns 1).

    Returns:
        a float, or a tensor of the shape of `length`.
    """
    return ((5.0 + length) / 6.0) ** alpha


def finished_to_stop(beam_size: int, patience: float) -> int:
    """How many finished hypotheses end a sentence's search under the "beam_full" rule:
    ceil(patience x beam_size)."""
    return math.ceil(patience * beam_size)


def cannot_improve(best_alive_log_prob, worst_finished_score, max_penalty):
    """The exact early-stopping bound: no alive hypothesis can beat the worst of a full finished
    set. Log-probabilities only decrease and, for alpha >= 0, lp is largest at the length cap
    (`max_penalty` = lp(cap)), so the best alive log P / lp(cap) bounds every later score.

    Python numbers or tensors of one shape (an empty finished slot scores `NEG_INF`, so the bound
    never holds before the set is full)."""
    return best_alive_log_prob / max_penalty < worst_finished_score
