"""Shared test fixtures: the local Multi30k folder, small sentence pairs, tiny trained vocabularies.

Tokenizer objects are module-scoped, vocabularies session-scoped: `tf.random.set_seed` (called by
`keras.utils.set_random_seed`, e.g. in `training.train`) clears TensorFlow's eager kernel cache,
which destroys the SentencePiece resources of tokenizers loaded before it.

Vocabularies are trained once per session (a 1,000-piece SentencePiece model in a few seconds,
WordPiece on a 3,000-pair sample), also when pytest-xdist runs the files in several processes,
and shared by every test file that asks for them.
"""

import fcntl
import gzip
import os
import shutil
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

from keras_transformer.config import DATA_ENV, REPO_ROOT, DataConfig  # noqa: E402

MULTI30K_FILES = [f"{split}.{lang}.gz" for split in ("train", "val", "test_2016_flickr")
                  for lang in ("de", "en", "fr")]

SMALL_PAIRS = [
    ("Ein Mann fährt Fahrrad.", "A man rides a bike."),
    ("Zwei Hunde spielen im Schnee.", "Two dogs play in the snow."),
    ("Eine Frau liest ein Buch im Park.", "A woman reads a book in the park."),
    ("Kinder (drei) laufen über die Straße!", "Children (three) run across the street!"),
    ("Der Mann's Hut ist rot.", "The man's hat is red."),
]


@pytest.fixture(scope="session")
def multi30k_dir() -> Path:
    """The local raw Multi30k folder ($KERAS_TRANSFORMER_DATA or ../shared/data/multi30k)."""
    folder = Path(os.environ.get(DATA_ENV) or REPO_ROOT.parent / "shared" / "data" / "multi30k")
    missing = [name for name in MULTI30K_FILES if not (folder / name).is_file()]
    if missing:
        pytest.skip(f"Multi30k raw files not found in {folder} (missing {', '.join(missing[:3])}...); "
                    f"set {DATA_ENV} to the folder holding them")
    return folder


@pytest.fixture
def small_pairs() -> list:
    """A handful of (German, English) sentence pairs with punctuation, umlauts and brackets."""
    return list(SMALL_PAIRS)


@pytest.fixture(scope="session")
def multi30k_config(multi30k_dir):
    """Returns a DataConfig reading the local Multi30k files (de->en) with small-vocab settings;
    keyword arguments override fields.

    The shuffle buffer holds 1,000 pairs, not the default 30,000 (all of Multi30k train, which a
    training stream tokenizes before its first batch: about 3 s of every short run)."""
    def make(**overrides) -> DataConfig:
        values = dict(dataset="files", data_dir=str(multi30k_dir), source_lang="de",
                      target_lang="en", vocab_size=1000, max_pair_length=64, tokens_per_batch=2048,
                      shuffle_buffer=1000)
        values.update(overrides)
        return DataConfig(**values)
    return make


def built_once(tmp_path_factory, name: str, build) -> Path:
    """The folder `name` in the session's temporary root, written by `build(folder)` once per
    session: the first pytest-xdist worker to ask builds it under a lock, the others wait for it
    and reuse it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by the session's workers
    folder, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a build that failed part-way
            build(folder)
            done.touch()
    return folder


@pytest.fixture(scope="session")
def short_multi30k_dir(multi30k_dir, tmp_path_factory) -> Path:
    """Multi30k with only the first 4,000 training and 100 validation pairs (the test files are
    links to the real ones): a tiny run reads a few hundred pairs an epoch, yet loaded, hashed
    (for its resume position) and tokenized the whole training split before its first step,
    and validated on all 1,014 pairs every epoch."""
    def build(folder):
        folder.mkdir()
        for name in MULTI30K_FILES:
            count = {"train": 4000, "val": 100}.get(name.split(".")[0])
            if count is None:
                (folder / name).symlink_to(multi30k_dir / name)
                continue
            with gzip.open(multi30k_dir / name, "rt", encoding="utf-8") as lines:
                head = [next(lines) for _ in range(count)]
            with gzip.open(folder / name, "wt", encoding="utf-8") as out:
                out.writelines(head)
    return built_once(tmp_path_factory, "multi30k_short", build)


@pytest.fixture(scope="session")
def sentencepiece_vocab(multi30k_config, tmp_path_factory):
    """(DataConfig, vocab_dir) of a joint de+en 1,000-piece SentencePiece model on Multi30k train."""
    from keras_transformer.data.corpora import build_vocab

    config = multi30k_config(tokenizer="sentencepiece")
    return config, built_once(tmp_path_factory, "sentencepiece_vocab",
                              lambda folder: build_vocab(config, folder))


@pytest.fixture(scope="module")
def sentencepiece_tokenizers(sentencepiece_vocab):
    """(source, target) SentencePiece tokenizers (one joint model: the same object twice)."""
    from keras_transformer.data.tokenizers import load_tokenizers

    return load_tokenizers(*sentencepiece_vocab)


@pytest.fixture(scope="session")
def wordpiece_vocab(multi30k_config, tmp_path_factory):
    """(DataConfig, vocab_dir) of case-preserving de and en WordPiece vocabularies (about 1,000
    tokens each) learned from the first 3,000 pairs of Multi30k train."""
    from keras_transformer.data.corpora import load_pairs
    from keras_transformer.data.tokenizers import build_tokenizers

    config = multi30k_config(tokenizer="wordpiece")
    return config, built_once(tmp_path_factory, "wordpiece_vocab", lambda folder: build_tokenizers(
        config, load_pairs(config, "train").take(3000), folder))


@pytest.fixture(scope="module")
def wordpiece_tokenizers(wordpiece_vocab):
    from keras_transformer.data.tokenizers import load_tokenizers

    return load_tokenizers(*wordpiece_vocab)


@pytest.fixture(scope="module")
def random_translation_model(sentencepiece_tokenizers):
    """(model, tokenizer): a random tiny Transformer over the joint SentencePiece vocabulary.

    `max_positions` 24 keeps searches short. The output layer is scaled and the END logit biased, so
    that outputs have varied lengths (some empty, some at their cap) and the searches' early exits
    are used.
    """
    from keras_transformer.data.tokenizers import END_ID
    from helpers import seeded_tiny_model

    tokenizer = sentencepiece_tokenizers[0]
    model = seeded_tiny_model(tokenizer, seed=7)
    # Sharper output distributions (a random model's are nearly flat), and an END bias with which
    # some outputs end after a few tokens and others run to their cap.
    model.final_layer.kernel.assign(model.final_layer.kernel * 4.0)
    bias = model.final_layer.bias.numpy()
    bias[END_ID] = 3.0
    model.final_layer.bias.assign(bias)
    return model, tokenizer


@pytest.fixture(scope="session")
def tiny_experiment(sentencepiece_vocab, short_multi30k_dir):
    """Returns an ExperimentConfig of the tiny preset on Multi30k with 100 validation pairs (the
    1,000-piece joint vocabulary above, all embeddings shared) for short runs; keyword arguments
    override `train`.

    Translations may be 8 pieces longer than their source, not 50: an untrained model's run to
    their cap, and each epoch's validation BLEU and attention image (one labelled row a piece,
    4 panels) cost time in proportion."""
    import dataclasses

    from keras_transformer.config import DecodeConfig, ExperimentConfig, ModelConfig, TrainConfig

    data_config, vocab_dir = sentencepiece_vocab

    def make(**train_values) -> ExperimentConfig:
        values = dict(epochs=2, steps_per_epoch=3, warmup_steps=10, strategy="mirrored",
                      validation_bleu_sentences=8)
        values.update(train_values)
        return ExperimentConfig(
            name="tiny",
            model=ModelConfig.from_preset("tiny", share_embeddings="all"),
            data=dataclasses.replace(data_config, data_dir=str(short_multi30k_dir),
                                     vocab_dir=str(vocab_dir)),
            train=TrainConfig(**values),
            decode=DecodeConfig(max_extra_length=8))
    return make


@pytest.fixture
def read_only_dir(tmp_path):
    """An empty folder this process cannot write in: mode 555, and for root (whom modes do not
    stop) the immutable attribute; skips where neither holds."""
    import subprocess

    folder = tmp_path / "read_only"
    folder.mkdir()
    folder.chmod(0o555)
    immutable = False
    if os.access(folder, os.W_OK):
        immutable = subprocess.run(["chattr", "+i", str(folder)],
                                   capture_output=True).returncode == 0
        if not immutable or os.access(folder, os.W_OK):
            pytest.skip("cannot make a folder read-only for this user")
    yield folder
    if immutable:
        subprocess.run(["chattr", "-i", str(folder)], check=True)
    folder.chmod(0o755)


@pytest.fixture(scope="module")
def random_export(random_translation_model, tmp_path_factory):
    """The random tiny model (beam 2) exported as a SavedModel, without warmup requests."""
    from keras_transformer.config import DecodeConfig
    from keras_transformer.export.savedmodel import export_translator
    from keras_transformer.decoding.translator import Translator

    model, tokenizer = random_translation_model
    translator = Translator(model, tokenizer, tokenizer,
                            DecodeConfig(beam_size=2, max_extra_length=8))
    return export_translator(translator, tmp_path_factory.mktemp("models") / "demo" / "1",
                             warmup_sentences=None)


@pytest.fixture(scope="module")
def random_run(random_translation_model, sentencepiece_vocab, tmp_path_factory):
    """A training-run folder (config, best weights, vocabulary) holding the random tiny model,
    decoding with beam 2."""
    import shutil

    from keras_transformer.config import DecodeConfig, ExperimentConfig

    model, _ = random_translation_model
    data_config, vocab_dir = sentencepiece_vocab
    run = tmp_path_factory.mktemp("run")
    config = ExperimentConfig(model=model.config, data=data_config,
                              decode=DecodeConfig(beam_size=2, max_extra_length=8))
    config.to_yaml(run / "config.yaml")
    model.save_weights(run / "best.weights.h5")
    shutil.copytree(vocab_dir, run / "vocab")
    return run
