"""`model.fit` learns: the tiny preset overfits a few dozen real Multi30k pairs."""

import gzip
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from keras_transformer import MaskedAccuracy, MaskedLabelSmoothedCrossEntropy, ModelConfig, Transformer


def read_pairs(folder: Path, count: int):
    lines = {}
    for lang in ("de", "en"):
        with gzip.open(folder / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            lines[lang] = [next(f).strip() for _ in range(count)]
    return list(zip(lines["de"], lines["en"]))


def word_ids(sentences, vocab):
    """Whitespace tokens -> ids, with START=1 and END=2 around each sentence, padded with 0."""
    rows = [[1] + [vocab.setdefault(w, len(vocab)) for w in s.split()] + [2] for s in sentences]
    out = np.zeros((len(rows), max(map(len, rows))), "int32")
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out


def test_tiny_model_overfits_real_pairs(multi30k_dir):
    keras.utils.set_random_seed(0)
    pairs = read_pairs(multi30k_dir, 32)
    source_vocab, target_vocab = {"": 0, "[START]": 1, "[END]": 2}, {"": 0, "[START]": 1, "[END]": 2}
    source = word_ids([de for de, _ in pairs], source_vocab)
    target = word_ids([en for _, en in pairs], target_vocab)
    config = ModelConfig.from_preset("tiny", source_vocab_size=len(source_vocab),
                                     target_vocab_size=len(target_vocab), dropout=0.0)
    model = Transformer(config)
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=MaskedLabelSmoothedCrossEntropy(label_smoothing=0.0),
                  metrics=[MaskedAccuracy()])
    # 150 steps on the same batch, in 10 epochs (Keras's work between epochs is no test of ours).
    batches = tf.data.Dataset.from_tensors(((source, target[:, :-1]), target[:, 1:])).repeat()
    history = model.fit(batches, epochs=10, steps_per_epoch=15, verbose=0)
    losses = history.history["loss"]
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}, accuracy {history.history['accuracy'][-1]:.3f}")
    assert losses[-1] < 0.1 * losses[0]
    assert history.history["accuracy"][-1] > 0.95
