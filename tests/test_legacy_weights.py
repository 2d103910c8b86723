"""Weight files of the attention layout before issue 71 (`keras.layers.MultiHeadAttention`'s
separate projections) load into the fused layout and give the same model, optimizer state
included (tests/data/legacy_weights/make.py wrote them with that code)."""

import h5py
import numpy as np
import pytest

from keras_transformer.runs import legacy_weights
from keras_transformer.config import ExperimentConfig
from keras_transformer.model import Transformer
from keras_transformer.runs.weights import load_weights, save_weights
from keras_transformer.training.runner import build_model
from tests.helpers import REPO_ROOT

DATA = REPO_ROOT / "tests" / "data" / "legacy_weights"


def fixture_config(norm):
    return ExperimentConfig.from_dict({
        "model": dict(num_layers=1, d_model=16, num_heads=2, dff=32, dropout=0.0, norm=norm,
                      share_embeddings="none" if norm == "post" else "all",
                      source_vocab_size=40, target_vocab_size=40, max_positions=16),
        "train": dict(warmup_steps=4)})


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_a_legacy_checkpoint_gives_the_same_logits_and_the_same_next_step(norm):
    path = DATA / f"{norm}_norm.weights.h5"
    expected = np.load(DATA / f"{norm}_norm.npz")
    assert legacy_weights.is_legacy(path)
    config = fixture_config(norm)
    model = build_model(config)
    load_weights(model, path, config.model)
    inputs = (expected["source"], expected["target_in"])
    np.testing.assert_allclose(model(inputs).numpy(), expected["logits"], atol=1e-5)
    assert int(model.optimizer.iterations.numpy()) == 2
    # Adam's next update reads the converted moments: a misplaced one changes it
    model.train_on_batch(inputs, expected["target_out"])
    np.testing.assert_allclose(model(inputs).numpy(), expected["logits_after_step"], atol=1e-5)


def test_a_legacy_file_loads_into_a_model_without_optimizer_and_is_left_as_it_was(tmp_path):
    path = DATA / "post_norm.weights.h5"
    before = path.read_bytes()
    expected = np.load(DATA / "post_norm.npz")
    config = fixture_config("post")
    model = Transformer(config.model)
    model.build()
    load_weights(model, path, config.model)
    logits = model((expected["source"], expected["target_in"])).numpy()
    np.testing.assert_allclose(logits, expected["logits"], atol=1e-5)
    assert path.read_bytes() == before
    # saved again, it has the current layout, and loads to the same model
    saved = save_weights(model, tmp_path / "current.weights.h5")
    assert not legacy_weights.is_legacy(saved)
    with h5py.File(saved) as f:
        assert f["encoder/stack/encoder_layer/self_attention/qkv/vars/0"].shape == (16, 48)
        assert f["decoder/stack/decoder_layer/cross_attention/kv/vars/0"].shape == (16, 32)
    again = Transformer(config.model)
    again.build()
    load_weights(again, saved, config.model)
    np.testing.assert_array_equal(
        again((expected["source"], expected["target_in"])).numpy(), logits)


def test_an_optimizer_state_of_another_model_is_refused(tmp_path):
    path = tmp_path / "legacy.weights.h5"
    path.write_bytes((DATA / "post_norm.weights.h5").read_bytes())
    with h5py.File(path, "a") as f:
        del f["optimizer/vars/92"]
    model = build_model(fixture_config("post"))
    with pytest.raises(ValueError, match="optimizer state holds 92 variables"):
        with h5py.File(path, "a") as f:
            legacy_weights.convert(f, model)
