"""The Transformer model: shapes, masks, weight sharing, parameter count, saving, decoding API."""


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


def test_model_options_are_checked():
    from keras_transformer.config import ConfigError

    with pytest.raises(ConfigError, match="model.activation='swish'"):
        tiny(activation="swish")
    with pytest.raises(ConfigError, match="model.num_decoder_layers=0"):
        tiny(num_decoder_layers=0)
    assert tiny().decoder_layers == tiny().num_layers
    assert tiny(num_decoder_layers=1).decoder_layers == 1


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
    model = Transformer(tiny(norm="pre", share_embeddings="target", num_layers=3,
                             num_decoder_layers=1, activation="gelu"))
    batch = random_batch(seed=5)
    expected = model(batch).numpy()
    clone = Transformer.from_config(model.get_config())
    assert len(clone.encoder.stack) == 3 and len(clone.decoder.stack) == 1
    assert clone.decoder.stack[0].ffn.activation == "gelu"
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

    model = Transformer(tiny(activation="gelu", num_decoder_layers=1))
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


def test_fit_traces_the_train_step_once_for_batches_of_every_shape():
    """Token batches come in many shapes (length buckets, each bucket's smaller last batch):
    `fit` over a dataset traces the step once, for the dataset's dynamic shapes."""
    from keras_transformer import MaskedLabelSmoothedCrossEntropy

    model = Transformer(tiny())
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=MaskedLabelSmoothedCrossEntropy())
    traces = []
    step = model.train_step

    def counted(data):
        traces.append(data[1].shape)
        return step(data)

    model.train_step = counted
    shapes = [(3, 9, 7), (4, 9, 7), (6, 16, 8), (3, 8, 6), (5, 24, 16)]
    batches = [random_batch(seed, *shape) for seed, shape in enumerate(shapes)]

    read = []

    def generate():
        for source, target in batches:
            read.append(target.shape)
            yield (source, target[:, :-1]), target[:, 1:]

    spec = tf.TensorSpec([None, None], tf.int32)
    dataset = tf.data.Dataset.from_generator(generate, output_signature=((spec, spec), spec))
    model.fit(dataset, epochs=2, verbose=0)
    assert len(read) == 2 * len(shapes)
    assert len(traces) == 1 and traces[0].as_list() == [None, None]


def decode_steps(model, source, target, beams=1, memory=None, rows=None):
    """Logits `[batch * rows, target_len, vocab]` of `decode_step` fed `target` (each sentence's
    ids repeated on `rows` rows, default `beams`; `beams` rows per row of the memory) one
    position at a time, and the last caches."""
    rows = beams if rows is None else rows
    weights = model.inference_weights()
    if memory is None:
        memory = model.start_decoding(weights, tf.constant(source))
    cache = model.init_cache(len(source) * rows)
    steps = []
    for t in range(target.shape[1]):
        ids = tf.constant(np.repeat(target[:, t], rows))
        logits, cache = model.decode_step(weights, ids, tf.constant(t), cache, memory, beams)
        assert logits.dtype == tf.float32
        assert [c["key"].shape[2] for c in cache] == [t + 1] * len(cache)
        steps.append(logits.numpy())
    return np.stack(steps, axis=1), cache


@pytest.mark.parametrize("config", [
    dict(norm="post", share_embeddings="none"), dict(norm="post", share_embeddings="target"),
    dict(norm="pre", share_embeddings="all"), dict(norm="pre", share_embeddings="none"),
    dict(norm="pre", activation="gelu", num_decoder_layers=1),
    dict(norm="post", activation="gelu", num_layers=3, num_decoder_layers=2)])
def test_decode_steps_equal_teacher_forcing(config):
    """The layers' decoding steps (fused q|k|v, folded pre-norm LayerNorms, packed encoder,
    growing head-major caches) give the teacher-forced `call`'s logits at every real target
    position, to float32 rounding; padding in the source changes nothing."""
    model = Transformer(tiny(**config))
    source, target = random_batch(seed=5)
    full = model((source, target)).numpy()
    randomize_norms(model)
    full = model((source, target)).numpy()
    stepped, _ = decode_steps(model, source, target)
    real = target != 0
    np.testing.assert_allclose(stepped[real], full[real], atol=1e-5, rtol=1e-5)
    assert len(model.decoder.stack) == model.config.decoder_layers


def test_decode_step_shares_each_sentences_memory_among_its_beams():
    """With `beams=k`, k consecutive rows of ids read one row of the memory: the logits of the
    memory tiled to every row."""
    from keras_transformer.decoding.strategies import tile_beams

    model = Transformer(tiny())
    source, target = random_batch(seed=5)
    model((source, target))
    memory = model.start_decoding(model.inference_weights(), tf.constant(source))
    tiled = tf.nest.map_structure(lambda t: tile_beams(t, 2), memory)
    shared, _ = decode_steps(model, source, target[:, :4], beams=2, memory=memory)
    expected, _ = decode_steps(model, source, target[:, :4], beams=1, memory=tiled, rows=2)
    np.testing.assert_allclose(shared, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_encode_rows_equals_encode(norm):
    """`Transformer.encode_rows` gives `encode`'s output at the real tokens of a padded batch,
    to float32 rounding, in the packed layout."""
    model = Transformer(tiny(norm=norm))
    source, target = random_batch(seed=7)
    model((source, target))
    randomize_norms(model)
    context, mask = model.encode(source, training=False)
    rows, packing = model.encode_rows(model.inference_weights(), tf.constant(source))
    assert not np.all(mask)  # the batch has padding
    np.testing.assert_array_equal(packing.mask, mask)
    np.testing.assert_allclose(rows, np.asarray(context)[np.asarray(mask)], atol=1e-5,
                               rtol=1e-5)


def test_a_folded_norm_gives_the_projection_of_the_norm():
    """`fold_norm`: the plain normalization through the folded kernel and bias gives the
    LayerNorm's output through the original ones."""
    from keras_transformer.layers.normalization import fold_norm, normalize

    rng = np.random.default_rng(3)
    x = tf.constant(rng.normal(size=(5, 16)).astype("float32"))
    norm = {"gamma": tf.constant(rng.normal(1.0, 0.5, 16).astype("float32")),
            "beta": tf.constant(rng.normal(0.0, 0.5, 16).astype("float32"))}
    kernel = tf.constant(rng.normal(size=(16, 24)).astype("float32"))
    bias = tf.constant(rng.normal(size=24).astype("float32"))
    folded_kernel, folded_bias = fold_norm(norm, kernel, bias)
    np.testing.assert_allclose(normalize(x) @ folded_kernel + folded_bias,
                               normalize(x, norm) @ kernel + bias, atol=1e-5, rtol=1e-5)


def test_packing_indexes_the_packed_layout():
    """`Packing` gathers a padded position from its own packed row when it is real, from the
    row of the last real token before it otherwise (the first row if there is none)."""
    from keras_transformer.layers.ops import Packing

    packing = Packing(tf.constant([[False, False], [True, False], [True, True], [True, False]]))
    np.testing.assert_array_equal(packing.rows, [2, 4, 5, 6])
    np.testing.assert_array_equal(packing.padded_rows, [0, 0, 0, 0, 1, 2, 3, 3])
    rows = tf.constant([[10.0], [20.0], [30.0], [40.0]])
    np.testing.assert_array_equal(packing.pack(packing.unpack(rows)), rows)


def test_attention_bias_gives_the_masked_logits_exactly():
    """Adding `attention_bias(mask)` to logits gives, bit for bit, the logits with the masked
    positions replaced by the large negative value (what a select would give)."""
    from keras_transformer.layers.attention import LARGE_NEGATIVE, attention_bias

    rng = np.random.default_rng(0)
    logits = tf.constant(rng.normal(scale=50.0, size=(3, 2, 4, 6)), tf.float32)
    mask = tf.constant(rng.random((3, 1, 1, 6)) > 0.4)
    np.testing.assert_array_equal(logits + attention_bias(mask),
                                  tf.where(mask, logits, LARGE_NEGATIVE))


def test_decode_steps_under_mixed_bfloat16():
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = Transformer(tiny(norm="pre"))
        source, target = random_batch(seed=6)
        model((source, target))
        randomize_norms(model)
        full = model((source, target)).numpy()
        stepped, cache = decode_steps(model, source, target[:, :3])
        assert cache[0]["key"].dtype == tf.bfloat16
        np.testing.assert_allclose(stepped, full[:, :3], atol=0.1)  # bfloat16 rounding
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


def test_summary_lists_the_stacks_with_their_shapes():
    """`model.summary()` (which asks every layer for its output shape by its build arguments'
    names) lists the embeddings and stacks, and the parameter count."""
    model = Transformer(tiny())
    model.build()
    lines = []
    model.summary(print_fn=lambda line, **_: lines.append(line))
    text = "\n".join(lines)
    assert "encoder (Encoder)" in text and "decoder (Decoder)" in text
    assert f"{count_parameters(model.config):,}" in text
