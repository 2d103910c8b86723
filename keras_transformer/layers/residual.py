"""The residual connection around every sublayer (section 5.4), post- or pre-norm."""

LAYER_NORM_EPSILON = 1e-6  # as in tensor2tensor, the paper's reference implementation


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
