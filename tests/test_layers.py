"""Every layer: config round trip, output shapes, masks, and cached steps equal full passes."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import layers

D_MODEL, HEADS, DFF = 16, 4, 32
BATCH, SRC_LEN, TGT_LEN = 2, 7, 5

LAYER_CASES = {
    "PositionalEmbedding": (layers.PositionalEmbedding,
                            dict(vocab_size=30, d_model=D_MODEL, max_positions=20)),
    "GlobalSelfAttention": (layers.GlobalSelfAttention, dict(d_model=D_MODEL, num_heads=HEADS)),
    "CausalSelfAttention": (layers.CausalSelfAttention, dict(d_model=D_MODEL, num_heads=HEADS)),
    "CrossAttention": (layers.CrossAttention, dict(d_model=D_MODEL, num_heads=HEADS)),
    "FeedForward": (layers.FeedForward, dict(d_model=D_MODEL, dff=DFF)),
    "EncoderLayer": (layers.EncoderLayer, dict(d_model=D_MODEL, num_heads=HEADS, dff=DFF)),
    "DecoderLayer": (layers.DecoderLayer, dict(d_model=D_MODEL, num_heads=HEADS, dff=DFF)),
    "Encoder": (layers.Encoder, dict(num_layers=2, d_model=D_MODEL, num_heads=HEADS, dff=DFF)),
    "Decoder": (layers.Decoder, dict(num_layers=2, d_model=D_MODEL, num_heads=HEADS, dff=DFF)),
}


def _inputs(name):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH, TGT_LEN, D_MODEL)).astype("float32")
    context = rng.normal(size=(BATCH, SRC_LEN, D_MODEL)).astype("float32")
    if name == "PositionalEmbedding":
        return (rng.integers(1, 30, size=(BATCH, TGT_LEN)),), {}
    if name in ("CrossAttention", "DecoderLayer", "Decoder"):
        return (x, context), {"context_mask": np.ones((BATCH, SRC_LEN), bool)}
    if name in ("GlobalSelfAttention", "EncoderLayer", "Encoder"):
        return (x,), {"padding_mask": np.ones((BATCH, TGT_LEN), bool)}
    return (x,), {}


@pytest.mark.parametrize("name", sorted(LAYER_CASES))
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_layer_shape_and_config_round_trip(name, norm):
    cls, kwargs = LAYER_CASES[name]
    if name != "PositionalEmbedding":
        kwargs = dict(kwargs, norm=norm)
    layer = cls(**kwargs)
    args, call_kwargs = _inputs(name)
    out = layer(*args, **call_kwargs)
    assert tuple(out.shape) == (BATCH, TGT_LEN, D_MODEL)

    config = layer.get_config()
    for key, value in kwargs.items():
        assert config[key] == value
    clone = cls.from_config(config)
    clone(*args, **call_kwargs)
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(clone(*args, **call_kwargs), out, atol=1e-6)


def test_positional_encoding_is_the_papers_interleaved_table():
    table = layers.positional_encoding(50, 8)
    pos, i = 13, 2  # dimension pair (2i, 2i + 1) = (4, 5)
    angle = pos / 10000 ** (2 * i / 8)
    assert table.shape == (50, 8)
    np.testing.assert_allclose(table[pos, 2 * i], np.sin(angle), rtol=1e-6)
    np.testing.assert_allclose(table[pos, 2 * i + 1], np.cos(angle), rtol=1e-6)


def test_positional_embedding_scales_by_sqrt_d_model_and_offsets_positions():
    layer = layers.PositionalEmbedding(vocab_size=30, d_model=D_MODEL, max_positions=20)
    ids = np.array([[3, 4, 5]])
    out = layer(ids).numpy()
    table = layers.positional_encoding(20, D_MODEL)
    embedded = layer.token_embedding.embeddings.numpy()[ids[0]]
    np.testing.assert_allclose(out[0], embedded * np.sqrt(D_MODEL) + table[:3], rtol=1e-5)
    shifted = layer(ids[:, 2:], start_position=2).numpy()
    np.testing.assert_allclose(shifted[0, 0], out[0, 2], rtol=1e-6)


def test_global_self_attention_ignores_masked_keys():
    layer = layers.GlobalSelfAttention(d_model=D_MODEL, num_heads=HEADS)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(1, 6, D_MODEL)).astype("float32")
    mask = np.array([[True] * 4 + [False] * 2])
    y = x.copy()
    y[:, 4:] = rng.normal(size=(1, 2, D_MODEL))  # change only the masked positions
    out_x = layer(x, padding_mask=mask).numpy()
    out_y = layer(y, padding_mask=mask).numpy()
    np.testing.assert_allclose(out_x[:, :4], out_y[:, :4], atol=1e-5)
    assert not np.allclose(layer(y).numpy()[:, :4], out_x[:, :4], atol=1e-3)


def test_attention_uses_papers_head_width():
    layer = layers.CrossAttention(d_model=D_MODEL, num_heads=HEADS)
    layer(np.zeros((1, 2, D_MODEL), "float32"), np.zeros((1, 3, D_MODEL), "float32"))
    assert layer.head_dim == D_MODEL // HEADS
    assert tuple(layer.q.kernel.shape) == (D_MODEL, D_MODEL)
    assert tuple(layer.kv.kernel.shape) == (D_MODEL, 2 * D_MODEL)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_computes_keras_multi_head_attention(causal):
    """The fused projections compute what keras.layers.MultiHeadAttention computes with the
    same weights (the paper's attention, heads of d_model / h dimensions)."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 5, D_MODEL)).astype("float32")
    mask = np.array([[True] * 5, [True] * 3 + [False] * 2])
    layer = (layers.CausalSelfAttention if causal else layers.GlobalSelfAttention)(
        d_model=D_MODEL, num_heads=HEADS, dropout=0.0)
    layer.build(x.shape)
    for variable in layer.trainable_variables:
        variable.assign(rng.normal(scale=0.3, size=variable.shape))
    mha = keras.layers.MultiHeadAttention(num_heads=HEADS, key_dim=D_MODEL // HEADS)
    mha.build(x.shape, x.shape)
    head = (D_MODEL, HEADS, D_MODEL // HEADS)
    projections = layer.projections()
    for dense, name in ((mha.query_dense, "query"), (mha.key_dense, "key"),
                        (mha.value_dense, "value")):
        kernel, bias = projections[name]
        dense.set_weights([kernel.numpy().reshape(head), bias.numpy().reshape(head[1:])])
    kernel, bias = projections["output"]
    mha.output_dense.set_weights([kernel.numpy().reshape(head[1:] + head[:1]), bias.numpy()])
    if causal:
        y = mha(x, x, use_causal_mask=True)
        ours = layer(x)
    else:
        y = mha(x, x, attention_mask=mask[:, None, :])
        ours = layer(x, padding_mask=mask)
    expected = layer.layernorm(x + y)
    np.testing.assert_allclose(ours.numpy(), expected.numpy(), atol=1e-5)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_decoder_steps_equal_full_pass(norm, activation):
    """`Decoder.step` over `inference_weights`, one position at a time, gives the full pass."""
    from keras_transformer.layers.attention import attention_bias
    from keras_transformer.layers.ops import Packing

    decoder = layers.Decoder(num_layers=2, d_model=D_MODEL, num_heads=HEADS, dff=DFF, norm=norm,
                             activation=activation)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(BATCH, TGT_LEN, D_MODEL)).astype("float32")
    context = rng.normal(size=(BATCH, SRC_LEN, D_MODEL)).astype("float32")
    context_mask = np.array([[True] * SRC_LEN, [True] * 4 + [False] * 3])
    full = decoder(x, context, context_mask=context_mask).numpy()

    weights = decoder.inference_weights(tf.float32)
    packing = Packing(tf.constant(context_mask))
    memory = decoder.precompute(weights, packing.pack(tf.reshape(context, [-1, D_MODEL])), packing)
    bias = attention_bias(context_mask[:, None, None, :])
    caches = decoder.init_cache(BATCH, tf.float32)
    steps = []
    for t in range(TGT_LEN):
        y, caches = decoder.step(weights, tf.constant(x[:, t]), caches, memory, bias)
        steps.append(y.numpy())
    np.testing.assert_allclose(np.stack(steps, axis=1), full, atol=1e-5)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_feed_forward_activation(norm):
    """`activation` is the inner activation of `call` and of `packed_call`, and round-trips."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(2, 3, D_MODEL)).astype("float32")
    relu = layers.FeedForward(d_model=D_MODEL, dff=DFF, norm=norm)
    gelu = layers.FeedForward(d_model=D_MODEL, dff=DFF, norm=norm, activation="gelu")
    relu(x), gelu(x)
    gelu.set_weights(relu.get_weights())
    assert not np.allclose(relu(x), gelu(x), atol=1e-3)
    for layer in (relu, gelu):
        rows = layer.packed_call(layer.inference_weights(tf.float32), tf.reshape(x, [-1, D_MODEL]))
        np.testing.assert_allclose(rows, tf.reshape(layer(x), [-1, D_MODEL]), atol=1e-5)
    assert layers.FeedForward.from_config(gelu.get_config()).activation == "gelu"
    with pytest.raises(ValueError, match="activation='tanh'"):
        layers.FeedForward(d_model=D_MODEL, dff=DFF, activation="tanh")


def test_every_configurable_activation_is_computed():
    """`config.ACTIVATIONS` is the one list of names; the layer computes each of them."""
    from keras_transformer.config import ACTIVATIONS
    from keras_transformer.layers.feed_forward import ACTIVATION_FUNCTIONS

    assert set(ACTIVATION_FUNCTIONS) == set(ACTIVATIONS)


def test_layers_run_under_mixed_precision():
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        layer = layers.DecoderLayer(d_model=D_MODEL, num_heads=HEADS, dff=DFF)
        (x, context), kwargs = _inputs("DecoderLayer")
        out = layer(x, context, **kwargs)
        assert out.dtype == "bfloat16"
        assert all(w.dtype == "float32" for w in layer.weights)
    finally:
        keras.config.set_dtype_policy("float32")


def _keras_and_ours(**kwargs):
    """A Keras LayerNormalization and the package's, built with the same random weights."""
    rng = np.random.default_rng(3)
    weights = [rng.uniform(0.5, 1.5, D_MODEL).astype("float32"),
               rng.normal(size=D_MODEL).astype("float32")]
    norms = (keras.layers.LayerNormalization(epsilon=1e-6, **kwargs),
             layers.LayerNormalization(epsilon=1e-6, **kwargs))
    for norm in norms:
        norm.build((None, None, D_MODEL))
        norm.set_weights(weights)
    return norms


@pytest.mark.parametrize("shape", [(BATCH, TGT_LEN, D_MODEL), (BATCH * TGT_LEN, D_MODEL)])
def test_layer_norm_and_its_gradients_equal_keras(shape):
    """The closed-form gradient of `layers.LayerNormalization` gives what Keras derives op by op,
    for the input and both weights."""
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(loc=2.0, scale=3.0, size=shape).astype("float32"))
    upstream = tf.constant(rng.normal(size=shape).astype("float32"))
    results = []
    for norm in _keras_and_ours():
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = norm(x)
            loss = tf.reduce_sum(y * upstream)
        results.append([y, *tape.gradient(loss, [x, norm.gamma, norm.beta])])
    for ours, theirs in zip(results[1], results[0]):
        np.testing.assert_allclose(ours, theirs, atol=2e-5, rtol=1e-5)


def test_layer_norm_under_mixed_bfloat16_equals_keras():
    """bfloat16 in and out (the gradient of the input too), float32 weights and their gradients,
    Keras' values to bfloat16 rounding."""
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        rng = np.random.default_rng(1)
        x = tf.constant(rng.normal(loc=50.0, size=(BATCH, TGT_LEN, D_MODEL)), tf.bfloat16)
        results = []
        for norm in _keras_and_ours():
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = norm(x)
                loss = tf.reduce_sum(tf.cast(y, tf.float32) ** 2)
            grads = tape.gradient(loss, [x, norm.gamma, norm.beta])
            assert y.dtype == tf.bfloat16 and grads[0].dtype == tf.bfloat16
            assert norm.gamma.dtype == "float32" and grads[1].dtype == tf.float32
            results.append([tf.cast(t, tf.float32) for t in (y, *grads)])
        for ours, theirs in zip(results[1], results[0]):
            np.testing.assert_allclose(ours, theirs, atol=0.05, rtol=0.02)
    finally:
        keras.config.set_dtype_policy("float32")


def test_layer_norm_over_other_axes_is_keras():
    """Settings the closed form does not cover (here the middle axis) fall back to Keras."""
    x = tf.constant(np.random.default_rng(2).normal(size=(BATCH, TGT_LEN, D_MODEL)), tf.float32)
    keras_norm = keras.layers.LayerNormalization(axis=1)
    norm = layers.LayerNormalization(axis=1)
    np.testing.assert_array_equal(norm(x), keras_norm(x))


def test_dropout_zeros_the_rate_and_scales_the_rest():
    """`layers.dropout` zeros round(rate * 2**16) / 2**16 of the activations (here over 200,001,
    an odd count), scales the others by 1 / (1 - that) and passes the same mask to the gradient;
    the same seed gives the same mask, another seed another."""
    x = tf.ones([200_001])
    seed = tf.constant([7, 11])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layers.dropout(x, 0.1, seed)
    dropped = (y.numpy() == 0)
    assert abs(dropped.mean() - 0.1) < 0.003
    scale = 2 ** 16 / (2 ** 16 - round(0.1 * 2 ** 16))
    np.testing.assert_array_equal(y.numpy()[~dropped], np.float32(scale))
    np.testing.assert_array_equal(tape.gradient(y, x), y)
    np.testing.assert_array_equal(layers.dropout(x, 0.1, seed), y)
    assert (layers.dropout(x, 0.1, tf.constant([7, 12])).numpy() == 0).tolist() != dropped.tolist()


def test_dropout_layer_acts_in_training_only_and_keeps_the_dtype():
    x = np.ones((BATCH, TGT_LEN, D_MODEL), "float32")
    layer = layers.Dropout(0.5)
    np.testing.assert_array_equal(layer(x), x)
    y = layer(x, training=True).numpy()
    assert 0 < (y == 0).mean() < 1 and set(np.unique(y)) == {0.0, 2.0}
    assert not np.array_equal(layer(x, training=True), y)  # a new seed every call
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        assert layers.Dropout(0.1)(tf.cast(x, tf.bfloat16), training=True).dtype == tf.bfloat16
    finally:
        keras.config.set_dtype_policy("float32")


def test_dropout_with_a_noise_shape_is_keras():
    x = np.ones((BATCH, TGT_LEN, D_MODEL), "float32")
    ours = layers.Dropout(0.5, noise_shape=(BATCH, 1, D_MODEL), seed=3)
    theirs = keras.layers.Dropout(0.5, noise_shape=(BATCH, 1, D_MODEL), seed=3)
    np.testing.assert_array_equal(ours(x, training=True), theirs(x, training=True))
