"""The Transformer model: shapes, masks, weight sharing, parameter count, saving, decoding API."""

import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import ModelConfig, Transformer
from keras_transformer.model import count_parameters

VOCAB = 40


def tiny(**overrides):
    values = dict(source_vocab_size=VOCAB, target_vocab_size=VOCAB, dropout=0.0)
    values.update(overrides)
    return ModelConfig.from_preset("tiny", **values)


def random_batch(seed=0, batch=3, source_len=9, target_len=7):
    rng = np.random.default_rng(seed)
    source = rng.integers(4, VOCAB, size=(batch, source_len)).astype("int32")
    target = rng.integers(4, VOCAB, size=(batch, target_len)).astype("int32")
    source[1, 6:] = 0  # a padded sentence in the batch
    target[2, 5:] = 0
    return source, target


def randomize_norms(model, seed=0):
    """Random LayerNorm scales and offsets (a new model's are ones and zeros, which any folding
    or ordering of them would leave unchanged)."""
    rng = np.random.default_rng(seed)
    norms = [w for w in model.weights if w.path.rsplit("/", 1)[-1] in ("gamma", "beta")]
    assert norms
    for weight in norms:
        center = 1.0 if weight.path.endswith("gamma") else 0.0
        weight.assign(rng.normal(center, 0.5, weight.shape).astype("float32"))


@pytest.fixture(scope="module")
def model():
    model = Transformer(tiny())
    model(random_batch())
    return model


def test_logits_shape_and_dtype(model):
    source, target = random_batch()
    logits = model((source, target))
    assert tuple(logits.shape) == (3, 7, VOCAB)
    assert logits.dtype == "float32"


def test_causality(model):
    source, target = random_batch()
    base = model((source, target)).numpy()
    for t in range(target.shape[1] - 1):
        changed = target.copy()
        changed[:, t + 1:] = (changed[:, t + 1:] + 7) % (VOCAB - 4) + 4
        out = model((source, changed)).numpy()
        np.testing.assert_allclose(out[:, :t + 1], base[:, :t + 1], atol=1e-5)
        assert not np.allclose(out[:, t + 1:], base[:, t + 1:], atol=1e-4)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_padding_invariance(norm):
    """Extra source or target padding leaves the logits at real positions unchanged; this fails
    if any decoder layer's cross-attention loses the source mask."""
    model = Transformer(tiny(norm=norm, num_layers=3))
    source, target = random_batch(seed=1)
    base = model((source, target)).numpy()
    padded_source = np.pad(source, [(0, 0), (0, 5)])
    padded_target = np.pad(target, [(0, 0), (0, 4)])
    out = model((padded_source, padded_target)).numpy()
    real = target != 0
    np.testing.assert_allclose(out[:, :7][real], base[real], atol=1e-5)
    # The padded sentence alone gives the same logits as in the batch.
    alone = model((source[1:2, :6], target[1:2])).numpy()
    np.testing.assert_allclose(alone[0], base[1], atol=1e-5)


def test_source_padding_is_masked_in_every_decoder_layer():
    """Corrupting the encoder output at padded positions must not change anything."""
    model = Transformer(tiny(num_layers=3))
    source, target = random_batch(seed=2)
    context, mask = model.encode(source)
    base = model.decode(target, context, mask).numpy()
    noisy = context.numpy()
    noisy[~mask.numpy()] = 100.0
    out = model.decode(target, tf.constant(noisy), mask).numpy()
    np.testing.assert_allclose(out, base, atol=1e-5)


@pytest.mark.parametrize("share, embeddings", [("none", 2), ("target", 2), ("all", 1)])
def test_embedding_sharing(share, embeddings):
    model = Transformer(tiny(share_embeddings=share))
    model(random_batch())
    matrices = {id(w) for w in model.weights if "embeddings" in w.path}
    assert len(matrices) == embeddings
    assert (model.final_layer is None) == (share != "none")
    if share != "none":  # the projection is the target embedding matrix
        x = np.random.default_rng(0).normal(size=(2, 32)).astype("float32")
        np.testing.assert_allclose(
            model.target_embedding.project(x),
            x @ model.target_embedding.token_embedding.embeddings.numpy().T, rtol=1e-5,
            atol=1e-6)  # float32 sums of 32 products, in another order than NumPy's


def test_base_preset_parameter_count():
    """Transformer base with a shared 37,000-token vocabulary (the paper quotes about 65M)."""
    v, d, f, n = 37000, 512, 2048, 6
    attention = 4 * (d * d + d)  # query, key, value and output projections with biases
    ffn = d * f + f + f * d + d
    layernorm = 2 * d
    encoder_layer = attention + ffn + 2 * layernorm
    decoder_layer = 2 * attention + ffn + 3 * layernorm
    expected = v * d + n * encoder_layer + n * decoder_layer  # one shared embedding matrix
    assert count_parameters(ModelConfig.from_preset("base")) == expected == 63_082_496


def test_get_config_round_trip():
    """The model rebuilt from its config computes the same function: with the original's weights
    copied in, its logits are equal on the same inputs. Non-default settings (pre-norm, the
    decoder embedding tied to the output projection) would change them if lost."""
    model = Transformer(tiny(norm="pre", share_embeddings="target", num_layers=3))
    batch = random_batch(seed=5)
    expected = model(batch).numpy()
    clone = Transformer.from_config(model.get_config())
    assert clone.config == model.config
    clone(batch)  # builds the clone's weights
    clone.set_weights(model.get_weights())
    np.testing.assert_array_equal(clone(batch).numpy(), expected)


def test_keras_save_and_load(tmp_path):
    model = Transformer(tiny(share_embeddings="all"))
    batch = random_batch()
    logits = model(batch).numpy()
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded, Transformer)
    np.testing.assert_array_equal(loaded(batch).numpy(), logits)


def test_compile_builds_the_model_and_the_optimizer(tmp_path):
    """After `compile` the optimizer's slots exist, so the first `fit` traces a step that creates
    no variable, and a saved compiled model loads with its optimizer state."""
    from keras_transformer import MaskedLabelSmoothedCrossEntropy

    model = Transformer(tiny())
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=MaskedLabelSmoothedCrossEntropy())
    assert model.built and model.optimizer.built
    slots = [v.path for v in model.optimizer.variables]
    assert len(slots) > 2 * len(model.trainable_variables)  # Adam's two moments each
    source, target = random_batch()
    model.fit((source, target[:, :-1]), target[:, 1:], epochs=1, verbose=0)
    assert [v.path for v in model.optimizer.variables] == slots
    assert int(model.optimizer.iterations.numpy()) == 1
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    for got, want in zip(loaded.optimizer.variables, model.optimizer.variables):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.parametrize("growing", [False, True])
def test_cached_decode_steps_equal_teacher_forcing(model, growing):
    source, target = random_batch(seed=3)
    full = model((source, target)).numpy()
    context, mask = model.encode(source)
    memory = model.precompute_context(context, mask)
    state = model.init_cache(3, max_decode_length=None if growing else 12)
    step_fn = functools.partial(model.decode_step, growing=growing)  # eager: shapes may change
    for t in range(target.shape[1]):
        logits, state = step_fn(tf.constant(target[:, t]), tf.constant(t), state, memory)
        if growing:
            assert [cache["key"].shape[2] for cache in state] == [t + 1] * len(state)
        real = target[:, t] != 0
        np.testing.assert_allclose(logits.numpy()[real], full[real, t], atol=1e-4)


@pytest.mark.parametrize("growing", [False, True])
@pytest.mark.parametrize("share", ["none", "target", "all"])
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_inference_step_equals_keras_decode_step(norm, share, growing):
    """`inference.DecoderStep` (fused q|k|v, the weights' tensors, no Keras layer calls) gives
    the logits of the reference `Transformer.decode_step`, to float32 rounding."""
    from keras_transformer.inference import DecoderStep

    model = Transformer(tiny(norm=norm, share_embeddings=share))
    source, target = random_batch(seed=5)
    model((source, target))
    randomize_norms(model)
    context, mask = model.encode(source)
    memory = model.precompute_context(context, mask)
    max_decode_length = None if growing else 12
    state = model.init_cache(3, max_decode_length)
    fast = DecoderStep(model)
    weights = fast.read_weights()
    fast_memory = fast.precompute(weights, context, mask)
    fast_state = fast.init_cache(3, max_decode_length)
    for t in range(target.shape[1]):
        ids, step = tf.constant(target[:, t]), tf.constant(t)
        logits, state = model.decode_step(ids, step, state, memory, growing=growing)
        fast_logits, fast_state = fast.step(weights, ids, step, fast_state, fast_memory,
                                            growing=growing)
        assert fast_logits.dtype == tf.float32
        np.testing.assert_allclose(fast_logits, logits, atol=1e-5, rtol=1e-5)
        for cache, fast_cache in zip(state, fast_state):
            np.testing.assert_allclose(fast_cache["key"], cache["key"], atol=1e-5)
            np.testing.assert_allclose(fast_cache["value"], cache["value"], atol=1e-5)


def test_inference_step_shares_each_sentences_memory_among_its_beams():
    """With `beams=k`, k consecutive rows of ids read one row of the memory: the logits of the
    memory tiled to every row."""
    from keras_transformer.decoding import tile_beams
    from keras_transformer.inference import DecoderStep

    model = Transformer(tiny())
    source, target = random_batch(seed=5)
    model((source, target))
    context, mask = model.encode(source)
    fast = DecoderStep(model)
    weights = fast.read_weights()
    memory = fast.precompute(weights, context, mask)  # 3 sentences
    tiled = tf.nest.map_structure(lambda t: tile_beams(t, 2), memory)
    shared_state = tiled_state = fast.init_cache(6)
    for t in range(4):
        ids, step = tf.constant(np.repeat(target[:, t], 2)), tf.constant(t)
        shared, shared_state = fast.step(weights, ids, step, shared_state, memory, beams=2)
        expected, tiled_state = fast.step(weights, ids, step, tiled_state, tiled)
        np.testing.assert_allclose(shared, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pack", [True, False])
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_inference_encoder_equals_keras_encode(norm, pack):
    """`inference.EncoderPass` gives `Transformer.encode`'s output and mask on a padded batch,
    to float32 rounding; packed (the real tokens only), a padded position holds a copy of its
    sentence's last real token."""
    from keras_transformer.inference import EncoderPass

    model = Transformer(tiny(norm=norm))
    source, target = random_batch(seed=7)
    model((source, target))
    randomize_norms(model)
    context, mask = model.encode(source, training=False)
    encoder = EncoderPass(model, pack=pack)
    fast_context, fast_mask = encoder(encoder.read_weights(), tf.constant(source))
    assert not np.all(mask)  # the batch has padding
    np.testing.assert_array_equal(fast_mask, mask)
    real = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(fast_context)[real], np.asarray(context)[real],
                               atol=1e-5, rtol=1e-5)
    if pack:
        fast_context = np.asarray(fast_context)
        last = real.sum(axis=1) - 1  # [batch]
        for b, t in zip(*np.nonzero(~real)):
            np.testing.assert_array_equal(fast_context[b, t], fast_context[b, last[b]])


def test_a_folded_norm_gives_the_projection_of_the_norm():
    """`_fold_norm`: the plain normalization through the folded kernel and bias gives the
    LayerNorm's output through the original ones; the layer no longer holds the norm."""
    from keras_transformer.inference import _fold_norm, _layer_norm

    rng = np.random.default_rng(3)
    x = tf.constant(rng.normal(size=(5, 16)).astype("float32"))
    norm = {"gamma": tf.constant(rng.normal(1.0, 0.5, 16).astype("float32")),
            "beta": tf.constant(rng.normal(0.0, 0.5, 16).astype("float32"))}
    kernel = tf.constant(rng.normal(size=(16, 24)).astype("float32"))
    bias = tf.constant(rng.normal(size=24).astype("float32"))
    layer = {"norm": norm, "kernel": kernel, "bias": bias}
    _fold_norm(layer, "norm", "kernel", "bias")
    assert set(layer) == {"kernel", "bias"}
    np.testing.assert_allclose(_layer_norm(x) @ layer["kernel"] + layer["bias"],
                               _layer_norm(x, norm) @ kernel + bias, atol=1e-5, rtol=1e-5)


def test_padded_rows_index_the_packed_layout():
    """`_padded_rows` gathers a padded position from its own packed row when it is real, from
    the row of the last real token before it otherwise (the first row if there is none)."""
    from keras_transformer.inference import _padded_rows, _real_rows

    mask = tf.constant([[False, False], [True, False], [True, True], [True, False]])
    np.testing.assert_array_equal(_real_rows(mask), [2, 4, 5, 6])
    np.testing.assert_array_equal(_padded_rows(mask), [0, 0, 0, 0, 1, 2, 3, 3])


def test_attention_bias_gives_the_masked_logits_exactly():
    """Adding `inference._attention_bias(mask)` to logits gives, bit for bit, the logits with
    the masked positions replaced by the large negative value (what a select would give)."""
    from keras_transformer.inference import _LARGE_NEGATIVE, _attention_bias

    rng = np.random.default_rng(0)
    logits = tf.constant(rng.normal(scale=50.0, size=(3, 2, 4, 6)), tf.float32)
    mask = tf.constant(rng.random((3, 1, 1, 6)) > 0.4)
    np.testing.assert_array_equal(logits + _attention_bias(mask),
                                  tf.where(mask, logits, _LARGE_NEGATIVE))


def test_inference_memory_of_the_real_source_tokens_only():
    """`DecoderStep.precompute` with `pack` projects the real tokens alone: their keys and
    values are those of the padded layout, a padded position's are its sentence's last real
    token's, and a decoding step over them gives the padded layout's logits."""
    from keras_transformer.inference import DecoderStep

    model = Transformer(tiny())
    source, target = random_batch(seed=7)
    model((source, target))
    context, mask = model.encode(source, training=False)
    real = np.asarray(mask)
    packed, padded = (DecoderStep(model, pack=pack) for pack in (True, False))
    weights = packed.read_weights()
    packed_memory = packed.precompute(weights, context, mask)
    padded_memory = padded.precompute(weights, context, mask)
    last = real.sum(axis=1) - 1  # [batch]
    for layer, full in zip(packed_memory["layers"], padded_memory["layers"]):
        for name in ("key", "value"):
            got = np.transpose(np.asarray(layer[name]), [0, 2, 1, 3])  # [batch, len, heads, dim]
            want = np.transpose(np.asarray(full[name]), [0, 2, 1, 3])
            np.testing.assert_allclose(got[real], want[real], atol=1e-6)
            for b, t in zip(*np.nonzero(~real)):
                np.testing.assert_array_equal(got[b, t], got[b, last[b]])
    ids = tf.constant(target[:, 0])
    logits = [packed.step(weights, ids, tf.constant(0), packed.init_cache(len(source)), memory)[0]
              for memory in (packed_memory, padded_memory)]
    np.testing.assert_allclose(logits[0], logits[1], atol=1e-5, rtol=1e-5)


def test_inference_step_under_mixed_bfloat16():
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        from keras_transformer.inference import DecoderStep

        model = Transformer(tiny(norm="pre"))
        source, target = random_batch(seed=6)
        model((source, target))
        randomize_norms(model)
        context, mask = model.encode(source)
        memory = model.precompute_context(context, mask)
        state = model.init_cache(3)
        fast = DecoderStep(model)
        weights = fast.read_weights()
        fast_memory, fast_state = fast.precompute(weights, context, mask), fast.init_cache(3)
        for t in range(3):
            ids, step = tf.constant(target[:, t]), tf.constant(t)
            logits, state = model.decode_step(ids, step, state, memory, growing=True)
            fast_logits, fast_state = fast.step(weights, ids, step, fast_state, fast_memory)
            assert fast_logits.dtype == tf.float32
            np.testing.assert_allclose(fast_logits, logits, atol=0.1)  # bfloat16 rounding
    finally:
        keras.config.set_dtype_policy("float32")


def test_mixed_bfloat16_keeps_float32_logits():
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = Transformer(tiny())
        logits = model(random_batch())
        assert model.compute_dtype == "bfloat16"
        assert logits.dtype == "float32"
        assert np.isfinite(logits.numpy()).all()
    finally:
        keras.config.set_dtype_policy("float32")


def test_cross_attention_scores_are_distributions_over_real_source_tokens(model):
    source, target = random_batch(seed=4)
    scores = model.cross_attention_scores(source, target).numpy()
    assert scores.shape == (3, model.config.num_heads, 7, 9)
    np.testing.assert_allclose(scores.sum(-1), 1.0, rtol=1e-5)
    assert np.all(scores[1, :, :, 6:] < 1e-6)  # sentence 1 is padded from position 6
