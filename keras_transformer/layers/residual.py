"""The residual connection around every sublayer (section 5.4), post- or pre-norm."""

from keras_transformer.layers.normalization import normalize


def residual_connection(x, sublayer, *, layernorm, dropout, norm, training=None):
    """Applies `sublayer` to `x` with dropout, a residual connection and layer normalization.

    "post" is the paper's LayerNorm(x + Dropout(Sublayer(x))); "pre" is
    x + Dropout(Sublayer(LayerNorm(x))), which trains deep stacks without warmup tricks
    (Xiong et al., 2020) and needs a final LayerNorm after the stack.

    Args:
        x: `[batch, length, d_model]`.
        sublayer: a function `[batch, length, d_model] -> [batch, length, d_model]`.
        layernorm, dropout: the sublayer's own LayerNormalization and Dropout layers.
        norm: "post" or "pre".
    """
    if norm == "pre":
        return x + dropout(sublayer(layernorm(x)), training=training)
    return layernorm(x + dropout(sublayer(x), training=training))


def residual_input(x, norm):
    """The decoding steps' `residual_connection`, first half: what the sublayer reads, `[rows,
    d_model]`. Pre-norm: x normalized, its gamma and beta folded into the sublayer's first
    projection (`normalization.fold_norm`)."""
    return normalize(x) if norm == "pre" else x


def residual_output(x, y, norm, weights):
    """The decoding steps' `residual_connection`, second half: `x` plus the sublayer's output
    `y`, both `[rows, d_model]`, then (post-norm) LayerNorm with `weights["norm"]`."""
    return x + y if norm == "pre" else normalize(x + y, weights["norm"])
