"""Tests of the CTranslate2 export: the settings file, the spec's position table, refused
tokenizers."""

import json

import numpy as np
import pytest

pytest.importorskip("ctranslate2")

from keras_transformer.config import ConfigError, DecodeConfig, ModelConfig  # noqa: E402
from keras_transformer.ctranslate2_export import (  # noqa: E402
    SETTINGS_FILE,
    KerasTransformerConverter,
    export_ctranslate2,
)
from keras_transformer.layers import positional_encoding  # noqa: E402
from keras_transformer.model import Transformer  # noqa: E402
from keras_transformer.tokenizers import END_ID  # noqa: E402

MAX_LENGTH = 24  # both test models' max_length
DECODE = DecodeConfig(beam_size=4, alpha=0.6, max_extra_length=8)


@pytest.fixture(scope="module")
def pre_norm_model(sentencepiece_tokenizers):
    """A random tiny pre-norm Transformer with every embedding shared (share_embeddings "all").

    Built as `random_translation_model` is (seeded numpy weights), with nonzero biases and
    LayerNorm parameters so that a misplaced one shows. The tied projection has no bias: the
    final LayerNorm's beta along END's embedding acts as one, so that some outputs end early
    and others run to their cap.
    """
    tokenizer = sentencepiece_tokenizers[0]
    config = ModelConfig(num_layers=2, d_model=32, num_heads=4, dff=64, dropout=0.1, norm="pre",
                         share_embeddings="all", source_vocab_size=tokenizer.vocab_size,
                         target_vocab_size=tokenizer.vocab_size, max_length=MAX_LENGTH)
    model = Transformer(config)
    model.build()
    rng = np.random.default_rng(11)
    weights = []
    for w in model.get_weights():
        if w.ndim >= 2:
            limit = np.sqrt(6.0 / (w.shape[0] + np.prod(w.shape[1:])))
            w = rng.uniform(-limit, limit, w.shape)
        else:
            w = w + rng.normal(0.0, 0.1, w.shape)
        weights.append(w.astype(np.float32))
    model.set_weights(weights)
    embeddings = model.target_embedding.token_embedding.embeddings
    embeddings.assign(embeddings * 2.0)
    end = embeddings.numpy()[END_ID]
    beta = model.decoder.final_layernorm.beta
    beta.assign(beta + 1.5 * end / np.linalg.norm(end))
    return model, tokenizer


def export(model, tokenizer, folder, decode_config=DECODE, **kwargs):
    return export_ctranslate2(model, tokenizer, tokenizer, decode_config, folder, **kwargs)


def test_settings_file_and_layout(random_translation_model, tmp_path):
    model, tokenizer = random_translation_model
    folder = export(model, tokenizer, tmp_path / "ct2", quantization="float32",
                    provenance={"run": "runs/tiny", "weights": "best"})
    settings = json.loads((folder / SETTINGS_FILE).read_text())
    assert settings == {
        "beam_size": 4, "alpha": 0.6, "max_extra_length": 8, "max_positions": MAX_LENGTH,
        "source_start": "<s>", "source_end": "</s>", "sentencepiece_model": "sentencepiece.model",
        "quantization": "float32", "run": "runs/tiny", "weights": "best"}
    assert (folder / "sentencepiece.model").is_file() and (folder / "model.bin").is_file()
    assert not list(tmp_path.glob(".*partial"))

    config = json.loads((folder / "config.json").read_text())
    assert config["add_source_bos"] and config["add_source_eos"]
    assert config["layer_norm_epsilon"] == pytest.approx(1e-6)
    # SentencePiece's reserved pieces are CTranslate2's default special tokens.
    vocabulary = json.loads((folder / "shared_vocabulary.json").read_text())
    assert vocabulary[:4] == ["<pad>", "<s>", "</s>", "<unk>"]
    assert (config["unk_token"], config["bos_token"], config["eos_token"]) == (
        "<unk>", "<s>", "</s>")

    with pytest.raises(FileExistsError):
        export(model, tokenizer, folder)
    with pytest.raises(ConfigError, match="provenance keys \\['alpha'\\]"):
        export(model, tokenizer, tmp_path / "other", provenance={"alpha": 1.0})
    with pytest.raises(ConfigError, match="quantization='int4'"):
        export(model, tokenizer, tmp_path / "other", quantization="int4")


def test_spec_carries_our_position_table(pre_norm_model):
    model, tokenizer = pre_norm_model
    vocabulary = [f"piece{i}" for i in range(tokenizer.vocab_size)]
    spec = KerasTransformerConverter(model, vocabulary)._load()
    table = positional_encoding(MAX_LENGTH, 32)
    np.testing.assert_array_equal(spec.encoder.position_encodings.encodings, table)
    np.testing.assert_array_equal(spec.decoder.position_encodings.encodings, table)
    assert table[0, 0] == 0.0 and table[0, 1] == 1.0  # interleaved, from position 0


def test_wordpiece_is_refused(wordpiece_tokenizers, tmp_path):
    source, target = wordpiece_tokenizers
    config = ModelConfig(num_layers=1, d_model=16, num_heads=2, dff=32,
                         source_vocab_size=source.vocab_size,
                         target_vocab_size=target.vocab_size, max_length=16)
    model = Transformer(config)
    model.build()
    with pytest.raises(ConfigError, match="SentencePiece.*WordPieceTokenizer.*TensorFlow"):
        export_ctranslate2(model, source, target, DECODE, tmp_path / "ct2")
    assert not (tmp_path / "ct2").exists()
