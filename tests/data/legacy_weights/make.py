"""Writes the weight files of tests/test_legacy_weights.py: a tiny model in the layout before
issue 71 (attention through keras.layers.MultiHeadAttention: separate query, key, value and
output kernels [d_model, heads, head_dim]), with the optimizer's state after two training steps,
and what that model computed.

This script ran at commit 93dfa89, the last commit of that layout; the current code writes the
new layout, so it is kept to say how the files were made, not to make them again.

    python tests/data/legacy_weights/make.py
"""

from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from keras_transformer.config import ExperimentConfig
from keras_transformer.runs.weights import save_weights
from keras_transformer.training.runner import build_model

HERE = Path(__file__).resolve().parent


def main():
    rng = np.random.default_rng(7)
    source = rng.integers(4, 40, size=(3, 6)).astype("int32")
    target_in = rng.integers(4, 40, size=(3, 5)).astype("int32")
    source[1, 4:] = 0
    target_in[2, 3:] = 0
    target_in[:, 0] = 1
    target_out = np.roll(target_in, -1, axis=1)
    target_out[:, -1] = 2
    target_out[target_in == 0] = 0
    for norm, share in (("post", "none"), ("pre", "all")):
        keras.utils.set_random_seed(1)
        config = ExperimentConfig.from_dict({
            "model": dict(num_layers=1, d_model=16, num_heads=2, dff=32, dropout=0.0, norm=norm,
                          share_embeddings=share, source_vocab_size=40, target_vocab_size=40,
                          max_positions=16),
            "train": dict(warmup_steps=4)})
        model = build_model(config)
        for _ in range(2):
            model.train_on_batch((source, target_in), target_out)
        logits = model((source, target_in)).numpy()
        save_weights(model, HERE / f"{norm}_norm.weights.h5")
        model.train_on_batch((source, target_in), target_out)
        logits_after_step = model((source, target_in)).numpy()
        np.savez(HERE / f"{norm}_norm.npz", source=source, target_in=target_in,
                 target_out=target_out, logits=logits, logits_after_step=logits_after_step)
        print(norm, [v.path for v in model.trainable_variables][:12])


if __name__ == "__main__":
    main()
