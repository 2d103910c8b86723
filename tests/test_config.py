"""Config dataclasses: presets, validation errors that name field and value, YAML round trip,
files that extend a `base:` file."""

import re
from pathlib import Path

import pytest
import yaml

from keras_transformer.config import (
    REPO_ROOT,
    ConfigError,
    DataConfig,
    DecodeConfig,
    ExperimentConfig,
    ModelConfig,
    TrainConfig,
    preset_names,
)


def test_presets_hold_the_papers_and_tutorials_models():
    assert {"tiny", "tutorial", "base", "big"} <= set(preset_names())
    tutorial = ModelConfig.from_preset("tutorial")
    assert (tutorial.num_layers, tutorial.d_model, tutorial.dff, tutorial.num_heads) == (4, 128, 512, 8)
    base = ModelConfig.from_preset("base")
    assert (base.num_layers, base.d_model, base.dff, base.num_heads, base.dropout) == (6, 512, 2048, 8, 0.1)
    big = ModelConfig.from_preset("big")
    assert (big.num_layers, big.d_model, big.dff, big.num_heads, big.dropout) == (6, 1024, 4096, 16, 0.3)


@pytest.mark.parametrize("path", sorted((REPO_ROOT / "experiments").glob("*.yaml")),
                         ids=lambda path: path.stem)
def test_every_experiment_file_loads_and_is_named_after_itself(path):
    config = ExperimentConfig.from_yaml(path)
    assert config.name == path.stem
    assert config.data.source_lang != config.data.target_lang


# Values that differ between the three Multi30k experiments (each file's own) and values that
# all three take from experiments/base/multi30k.yaml.
MULTI30K_OWN = {
    "multi30k_de_en": dict(source_lang="de", target_lang="en", sp_nbest_size=-1,
                           sp_alpha=0.5, beam_size=6, alpha=1.4),
    "multi30k_en_de": dict(source_lang="en", target_lang="de", sp_nbest_size=-1,
                           sp_alpha=1.0, beam_size=6, alpha=1.7),
    "multi30k_en_fr": dict(source_lang="en", target_lang="fr", sp_nbest_size=0,
                           sp_alpha=0.1, beam_size=5, alpha=1.7),
}


@pytest.mark.parametrize("name", sorted(MULTI30K_OWN))
def test_multi30k_experiments_extend_the_shared_base(name):
    path = REPO_ROOT / "experiments" / f"{name}.yaml"
    assert yaml.safe_load(path.read_text())["base"] == "base/multi30k.yaml"
    config = ExperimentConfig.from_yaml(path)
    own = MULTI30K_OWN[name]
    assert config.name == name
    assert (config.data.source_lang, config.data.target_lang) == (own["source_lang"],
                                                                  own["target_lang"])
    assert (config.data.sp_nbest_size, config.data.sp_alpha) == (own["sp_nbest_size"],
                                                                 own["sp_alpha"])
    assert (config.decode.beam_size, config.decode.alpha) == (own["beam_size"], own["alpha"])
    # From the base (and the tutorial preset it names), the same in all three.
    model = config.model
    assert (model.num_layers, model.d_model, model.dff, model.num_heads) == (4, 128, 512, 8)
    assert (model.norm, model.share_embeddings, model.dropout) == ("pre", "all", 0.25)
    data = config.data
    assert (data.dataset, data.tokenizer, data.vocab_size) == ("multi30k", "sentencepiece", 8000)
    assert (data.max_pair_length, data.tokens_per_batch) == (128, 4096)
    train = config.train
    assert (train.epochs, train.budget_minutes, train.decay) == (200, 118, "linear")
    assert (train.steps_per_epoch, train.warmup_steps, train.learning_rate_scale) == (170, 500, 0.5)
    assert (train.label_smoothing, train.precision, train.validation_bleu_sentences) == (
        0.1, "auto", 300)


def test_the_wu2021_recipe_overrides_the_base_budget_with_its_step_count():
    config = ExperimentConfig.from_yaml(REPO_ROOT / "experiments" / "multi30k_de_en_wu2021.yaml")
    train = config.train
    assert (train.budget_minutes, train.decay, train.epochs, train.steps_per_epoch) == (
        None, "inverse_sqrt", 100, 80)
    assert (config.model.dropout, config.model.norm) == (0.3, "post")


def test_base_values_are_merged_section_by_section(tmp_path):
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "recipe.yaml").write_text(
        "model: {preset: tutorial, dropout: 0.3, norm: pre}\n"
        "train: {epochs: 10, warmup_steps: 500}\n")
    path = tmp_path / "exp.yaml"
    path.write_text("base: shared/recipe.yaml\nname: exp\nmodel: {dropout: 0.2}\n"
                    "train: {epochs: 3}\ndata: {source_lang: en, target_lang: fr}\n")
    config = ExperimentConfig.from_yaml(path, ["train.warmup_steps=50"])
    assert (config.model.dropout, config.model.norm, config.model.d_model) == (0.2, "pre", 128)
    assert (config.train.epochs, config.train.warmup_steps) == (3, 50)  # the file's, an override
    assert (config.data.source_lang, config.data.target_lang) == ("en", "fr")
    assert config.name == "exp"


def test_bases_chain_and_the_nearest_file_wins(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "root.yaml").write_text(
        "train: {epochs: 1, warmup_steps: 100, label_smoothing: 0.2}\n")
    # Each base path is relative to the file that names it.
    (tmp_path / "a" / "middle.yaml").write_text(
        "base: b/root.yaml\ntrain: {epochs: 2, warmup_steps: 200}\n")
    path = tmp_path / "exp.yaml"
    path.write_text("base: a/middle.yaml\ntrain: {epochs: 3}\n")
    train = ExperimentConfig.from_yaml(path).train
    assert (train.epochs, train.warmup_steps, train.label_smoothing) == (3, 200, 0.2)


def test_every_path_in_a_config_file_is_relative_to_that_file(tmp_path, monkeypatch):
    """The probe: `model.preset: ../x.yaml` was read from the working directory while `base:`
    beside it was read relative to the file. Now every path is relative to the file that gives
    it (a base's to the base), wherever the command runs; absolute and `~` paths are as they
    are, and `--set` overrides, which are in no file, are relative to the working
    directory."""
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets" / "small.yaml").write_text(
        "num_layers: 3\nd_model: 64\nnum_heads: 4\ndff: 128\n")
    (tmp_path / "exp" / "sub").mkdir(parents=True)
    (tmp_path / "exp" / "recipe.yaml").write_text(
        "data: {data_dir: data, tfds_data_dir: ~/tfds}\ntrain: {init_from: ../runs/parent}\n")
    path = tmp_path / "exp" / "sub" / "x.yaml"
    path.write_text(
        "base: ../recipe.yaml\nmodel: {preset: ../../presets/small.yaml}\n"
        "data:\n  vocab_dir: ../../vocab\n  corpora:\n"
        "    - {dataset: file_pair, source_file: bt.de, target_file: /abs/bt.en}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = ExperimentConfig.from_yaml(path)
    assert (config.model.num_layers, config.model.d_model) == (3, 64)

    def where(value):
        return Path(value).resolve()

    assert where(config.data.vocab_dir) == tmp_path / "vocab"
    assert where(config.data.data_dir) == tmp_path / "exp" / "data"  # beside the base
    assert where(config.train.init_from) == tmp_path / "runs" / "parent"
    corpus = config.data.corpora[0]
    assert where(corpus.source_file) == tmp_path / "exp" / "sub" / "bt.de"
    assert (corpus.target_file, config.data.tfds_data_dir) == ("/abs/bt.en", "~/tfds")
    overridden = ExperimentConfig.from_yaml(path, ["data.vocab_dir=v", "model.preset=tiny"])
    assert overridden.data.vocab_dir == "v" and overridden.model.d_model == 32
    with pytest.raises(ConfigError, match=r"unknown model preset '.*/exp/sub/nope.yaml' \("):
        ExperimentConfig.from_yaml(path, ["model.preset=../exp/sub/nope.yaml"])


def test_a_written_config_reads_back_the_same_paths_from_anywhere(tmp_path, monkeypatch):
    """`to_yaml` writes paths inside the file's folder relative to it (they move with the
    folder) and the others absolute: read from another working directory, or after the folder
    is moved, it names the same files."""
    monkeypatch.chdir(tmp_path)
    config = ExperimentConfig.from_yaml(REPO_ROOT / "experiments" / "demo.yaml", [
        "data.vocab_dir=runs/one/vocab", "data.data_dir=data", "train.init_from=/abs/run"])
    (tmp_path / "runs" / "one").mkdir(parents=True)
    config.to_yaml(tmp_path / "runs" / "one" / "config.yaml")
    written = yaml.safe_load((tmp_path / "runs" / "one" / "config.yaml").read_text())
    assert written["data"]["vocab_dir"] == "vocab"
    assert written["data"]["data_dir"] == str(tmp_path / "data")
    assert written["train"]["init_from"] == "/abs/run"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    (tmp_path / "runs" / "one").rename(tmp_path / "runs" / "two")
    moved = ExperimentConfig.from_yaml(tmp_path / "runs" / "two" / "config.yaml")
    assert Path(moved.data.vocab_dir) == tmp_path / "runs" / "two" / "vocab"
    assert Path(moved.data.data_dir) == tmp_path / "data"


def test_missing_base_names_both_files(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("base: base/nope.yaml\ntrain: {epochs: 3}\n")
    with pytest.raises(ConfigError, match=r"exp\.yaml: base file not found: .*base/nope\.yaml"):
        ExperimentConfig.from_yaml(path)


def test_cycle_of_bases_is_an_error(tmp_path):
    (tmp_path / "one.yaml").write_text("base: two.yaml\ntrain: {epochs: 1}\n")
    (tmp_path / "two.yaml").write_text("base: one.yaml\ntrain: {epochs: 2}\n")
    with pytest.raises(ConfigError, match=r"two\.yaml: base 'one.yaml' makes a cycle: "
                                          r".*one\.yaml -> .*two\.yaml -> .*one\.yaml"):
        ExperimentConfig.from_yaml(tmp_path / "one.yaml")
    (tmp_path / "self.yaml").write_text("base: self.yaml\n")
    with pytest.raises(ConfigError, match="makes a cycle"):
        ExperimentConfig.from_yaml(tmp_path / "self.yaml")


def test_preset_overrides():
    config = ModelConfig.from_preset("tutorial", dropout=0.2, norm="pre")
    assert (config.dropout, config.norm, config.d_model) == (0.2, "pre", 128)


@pytest.mark.parametrize("kwargs, message", [
    (dict(d_model=100, num_heads=8), "model.d_model=100 is not divisible by model.num_heads=8"),
    (dict(dropout=1.5), "model.dropout=1.5"),
    (dict(norm="middle"), "model.norm='middle'"),
    (dict(share_embeddings="all", source_vocab_size=10, target_vocab_size=20),
     "model.source_vocab_size=10 != model.target_vocab_size=20"),
    (dict(num_layers=0), "model.num_layers=0 must be positive"),
])
def test_model_config_errors_name_field_and_value(kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ModelConfig(**kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(tokenizer="wordpiece", sp_nbest_size=-1),
     "data.sp_nbest_size=-1 samples SentencePiece segmentations, but data.tokenizer='wordpiece'"),
    (dict(sp_nbest_size=64, sp_alpha=0.0), "data.sp_alpha=0.0 must be > 0 when data.sp_nbest_size=64"),
])
def test_subword_sampling_errors_name_field_and_value(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        DataConfig(**kwargs)
    assert not DataConfig(sp_nbest_size=1).subword_sampling


def test_unknown_preset_lists_known_ones():
    with pytest.raises(ConfigError, match="unknown model preset 'huge'.*tutorial"):
        ModelConfig.from_preset("huge")


@pytest.mark.parametrize("name", ["../demo", "presets/../../demo", ".hidden", "sub/tiny"])
def test_a_preset_name_is_never_a_path_to_another_yaml_file(name, tmp_path):
    """`--set model.preset=../demo` read experiments/demo.yaml (an experiment, not a preset) and
    then failed on its `name` key."""
    with pytest.raises(ConfigError, match=rf"^unknown model preset '{re.escape(name)}': a preset "
                       r"is a name, one of \[.*'tiny'.*\], or a \.yaml file's path$"):
        ModelConfig.from_preset(name)
    path = tmp_path / "exp.yaml"
    path.write_text("name: x\n")
    with pytest.raises(ConfigError, match="unknown model preset"):
        ExperimentConfig.from_yaml(path, [f"model.preset={name}"])


def test_experiment_yaml_with_preset_and_overrides(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("name: demo\nmodel: {preset: tutorial, dropout: 0.3}\n"
                    "data: {source_lang: en, target_lang: de}\ntrain: {epochs: 3}\n")
    config = ExperimentConfig.from_yaml(path, ["train.epochs=5", "model.num_layers=2",
                                               "data.data_dir=/tmp/x"])
    assert config.model.d_model == 128 and config.model.dropout == 0.3
    assert config.model.num_layers == 2 and config.train.epochs == 5
    assert config.data.source_lang == "en" and config.data.data_dir == "/tmp/x"
    saved = tmp_path / "saved.yaml"
    config.to_yaml(saved)
    assert ExperimentConfig.from_yaml(saved) == config
    path.write_text("name: demo\ntrain:\n")  # an empty section takes overrides too
    assert ExperimentConfig.from_yaml(path, ["train.epochs=5"]).train.epochs == 5


@pytest.mark.parametrize("override, message", [
    ("train.epoch=3", "unknown config key 'train.epoch'"),
    ("train.epochs=three", r"train.epochs='three' has the wrong type: expected int"),
    ("model.dropout=high", "model.dropout='high' has the wrong type"),
    ("train.precision=float8", "train.precision='float8' is not one of"),
    ("trainepochs", "not of the form section.key=value"),
])
def test_bad_experiment_values_name_the_key(tmp_path, override, message):
    path = tmp_path / "exp.yaml"
    path.write_text("name: demo\n")
    with pytest.raises(ConfigError, match=message):
        ExperimentConfig.from_yaml(path, [override])


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="config file not found: .*nope.yaml"):
        ExperimentConfig.from_yaml(tmp_path / "nope.yaml")


def test_data_dir_error_names_the_variable(monkeypatch, tmp_path):
    monkeypatch.delenv("KERAS_TRANSFORMER_DATA", raising=False)
    with pytest.raises(ConfigError, match="KERAS_TRANSFORMER_DATA"):
        DataConfig().resolved_data_dir()
    monkeypatch.setenv("KERAS_TRANSFORMER_DATA", str(tmp_path))
    assert DataConfig().resolved_data_dir() == tmp_path
    (tmp_path / "m").mkdir()
    assert DataConfig(data_dir=str(tmp_path / "m")).resolved_data_dir() == tmp_path / "m"
    with pytest.raises(ConfigError, match=r"^data.data_dir=/nonexistent/m30k: no such folder$"):
        DataConfig(data_dir="/nonexistent/m30k").resolved_data_dir()
    monkeypatch.setenv("KERAS_TRANSFORMER_DATA", "/nonexistent/m30k")
    with pytest.raises(ConfigError, match=r"^KERAS_TRANSFORMER_DATA=/nonexistent/m30k: no such "):
        DataConfig().resolved_data_dir()


def test_ints_are_accepted_for_floats_but_bools_are_not_ints(tmp_path):
    config = ExperimentConfig.from_dict({"model": {"dropout": 0}, "train": {"label_smoothing": 0}})
    assert isinstance(config.model.dropout, float)
    with pytest.raises(ConfigError, match="train.epochs=True"):
        ExperimentConfig.from_dict({"train": {"epochs": True}})
    assert TrainConfig().strategy == "auto"


@pytest.mark.parametrize("cls, kwargs, message", [
    (ModelConfig, dict(source_vocab_size=4), r"model.source_vocab_size=4 must be >= 5 \(ids 0-3"),
    (ModelConfig, dict(target_vocab_size=0), "model.target_vocab_size=0 must be >= 5"),
    (ModelConfig, dict(dff=-8), "model.dff=-8 must be positive"),
    (ModelConfig, dict(max_positions=0), "model.max_positions=0 must be positive"),
    (DataConfig, dict(vocab_size=3), "data.vocab_size=3 must be >= 5"),
    (DataConfig, dict(max_pair_length=2), r"data.max_pair_length=2 must be >= 3 \(START"),
    (DataConfig, dict(tokens_per_batch=0), "data.tokens_per_batch=0 must be positive"),
    (DataConfig, dict(bucket_step=0), "data.bucket_step=0 must be positive"),
    (DataConfig, dict(shuffle_buffer=0), "data.shuffle_buffer=0 must be positive"),
    (DataConfig, dict(vocab_sample_sentences=100),
     r"data.vocab_sample_sentences=100 must be >= 101 \(SentencePiece samples more than 100"),
    (DataConfig, dict(sp_nbest_size=-2), "data.sp_nbest_size=-2 must be >= -1"),
    (DataConfig, dict(sp_alpha=-0.1), "data.sp_alpha=-0.1 must be >= 0"),
    (TrainConfig, dict(epochs=0), "train.epochs=0 must be positive"),
    (TrainConfig, dict(profile_batches="5"), "train.profile_batches='5' must be \"START,STOP\""),
    (TrainConfig, dict(profile_batches="0,3"), "train.profile_batches='0,3' must be"),
    (TrainConfig, dict(profile_batches="4,2"), "train.profile_batches='4,2' must be"),
    (TrainConfig, dict(steps_per_epoch=0), "train.steps_per_epoch=0 must be positive"),
    (TrainConfig, dict(warmup_steps=0), "train.warmup_steps=0 must be positive"),
    (TrainConfig, dict(learning_rate_scale=-1.0),
     "train.learning_rate_scale=-1.0 must be positive"),
    (TrainConfig, dict(learning_rate_scale=0.0), "train.learning_rate_scale=0.0 must be positive"),
    (TrainConfig, dict(adam_beta_1=1.0), r"train.adam_beta_1=1.0 must be in \[0, 1\)"),
    (TrainConfig, dict(adam_beta_1=-0.1), r"train.adam_beta_1=-0.1 must be in \[0, 1\)"),
    (TrainConfig, dict(adam_beta_2=1.5), r"train.adam_beta_2=1.5 must be in \[0, 1\)"),
    (TrainConfig, dict(adam_epsilon=0.0), "train.adam_epsilon=0.0 must be positive"),
    (TrainConfig, dict(label_smoothing=1.0), r"train.label_smoothing=1.0 must be in \[0, 1\)"),
    (TrainConfig, dict(accumulate_steps=0), "train.accumulate_steps=0 must be positive"),
    (TrainConfig, dict(rdrop_alpha=-1.0), "train.rdrop_alpha=-1.0 must be >= 0"),
    (TrainConfig, dict(rdrop_alpha=5.0, accumulate_steps=2),
     "train.rdrop_alpha=5.0 runs each batch twice and does not combine with "
     "train.accumulate_steps=2"),
    (TrainConfig, dict(validation_bleu_sentences=-1),
     "train.validation_bleu_sentences=-1 must be >= 0"),
    (TrainConfig, dict(early_stopping_patience=0), "train.early_stopping_patience=0 must be >= 1"),
    (TrainConfig, dict(early_stopping_patience=3, validation_bleu_sentences=0),
     "train.early_stopping_patience=3 watches validation BLEU, but "
     "train.validation_bleu_sentences=0"),
    (TrainConfig, dict(seed=-1), r"train.seed=-1 must be in \[0, 2\*\*32\)"),
    (TrainConfig, dict(seed=2 ** 32), r"train.seed=4294967296 must be in \[0, 2\*\*32\)"),
    (DecodeConfig, dict(beam_size=0), "decode.beam_size=0 must be positive"),
    (DecodeConfig, dict(alpha=-0.5), "decode.alpha=-0.5 must be a finite number >= 0"),
    (DecodeConfig, dict(alpha=float("inf")), "decode.alpha=inf must be a finite number >= 0"),
    (DecodeConfig, dict(max_extra_length=0), "decode.max_extra_length=0 must be positive"),
])
def test_every_numeric_setting_has_its_range_checked(cls, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        cls(**kwargs)


def test_decode_stopping_rule_is_checked():
    assert (DecodeConfig().stopping, DecodeConfig().patience) == ("beam_full", 2.0)
    with pytest.raises(ConfigError, match=r"decode.patience=0.5 must be >= 1"):
        DecodeConfig(patience=0.5)
    assert DecodeConfig(stopping="beam_full").stopping == "beam_full"
    with pytest.raises(ConfigError, match="decode.stopping='never' is not one of 'exact', "
                                          "'beam_full'"):
        DecodeConfig(stopping="never")


def test_the_range_limits_themselves_are_accepted():
    TrainConfig(adam_beta_1=0.0, adam_beta_2=0.0, validation_bleu_sentences=0, seed=0,
                early_stopping_patience=None, label_smoothing=0.0)
    TrainConfig(seed=2 ** 32 - 1, early_stopping_patience=1)
    DataConfig(vocab_size=5, max_pair_length=3, tokens_per_batch=3, shuffle_buffer=1,
               sp_nbest_size=-1, sp_alpha=0.5)
    ModelConfig(source_vocab_size=5, target_vocab_size=5)


@pytest.mark.parametrize("override, message", [
    ("train.learning_rate_scale=-1", "train.learning_rate_scale=-1.0 must be positive"),
    # A non-finite number meets the field's own rule first, stated as that rule; what the rule
    # lets pass (inf is positive) is refused as not finite.
    ("train.learning_rate_scale=.nan", "train.learning_rate_scale=nan must be positive"),
    ("train.adam_epsilon=.inf", "train.adam_epsilon=inf must be a finite number"),
    ("model.dropout=.nan", r"model.dropout=nan must be in \[0, 1\)"),
    ("decode.patience=.inf", "decode.patience=inf must be a finite number"),
    ("decode.sampling_topp=.nan", r"decode.sampling_topp=nan must be in \(0, 1\]$"),
    ("decode.sampling_temperature=.nan",
     "decode.sampling_temperature=nan must be a finite number > 0$"),
    ("decode.sampling_temperature=0",
     "decode.sampling_temperature=0.0 must be a finite number > 0$"),
    ("decode.sampling_temperature=-1",
     "decode.sampling_temperature=-1.0 must be a finite number > 0$"),
    ("train.epochs=[1", r"override 'train.epochs=\[1': the value is not valid YAML"),
    ("train.epochs={a: 1", "override 'train.epochs={a: 1': the value is not valid YAML"),
])
def test_out_of_range_and_unparsable_overrides_are_named(tmp_path, override, message):
    path = tmp_path / "exp.yaml"
    path.write_text("name: demo\n")
    with pytest.raises(ConfigError, match=message) as error:
        ExperimentConfig.from_yaml(path, [override])
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"])
def test_an_empty_config_file_is_an_error_naming_it(tmp_path, text):
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"empty.yaml is empty: an experiment file sets"):
        ExperimentConfig.from_yaml(path, ["train.epochs=2"])


@pytest.mark.parametrize("text, message", [
    ("model: 3\n", r"bad.yaml: section 'model' must be a mapping of keys .*got 3"),
    ("name: x\ntrain: fast\n", r"bad.yaml: section 'train' must be a mapping .*got 'fast'"),
    ("data: [multi30k]\n", r"bad.yaml: section 'data' must be a mapping .*got \['multi30k'\]"),
    ("name: x\nmodel:\n  d_model: 8\n num_heads: 2\n", r"bad.yaml, line 4: invalid YAML \("),
    ("name: x\ntrain: {epochs: 3\n", r"bad.yaml, line 3: invalid YAML \("),
    ("name: x\n\ttrain: 1\n", r"bad.yaml, line 2: invalid YAML \("),
    ("- model\n- train\n", "bad.yaml: expected a mapping of sections, got list"),
])
def test_malformed_config_files_are_one_line_errors_naming_file_and_line(tmp_path, text,
                                                                          message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as error:
        ExperimentConfig.from_yaml(path)
    assert "\n" not in str(error.value)


def test_a_config_file_that_is_not_text_is_named(tmp_path):
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"name: \xff\xfe\x00\n")
    with pytest.raises(ConfigError, match=r"binary.yaml: not UTF-8 text \(byte 6\)"):
        ExperimentConfig.from_yaml(path)
    with pytest.raises(ConfigError, match="config file not found"):
        ExperimentConfig.from_yaml(tmp_path)


def test_a_malformed_preset_file_is_named(tmp_path):
    preset = tmp_path / "broken.yaml"
    preset.write_text("num_layers: [2\n")
    with pytest.raises(ConfigError, match=r"broken.yaml, line 2: invalid YAML"):
        ModelConfig.from_preset(str(preset))
    preset.write_text("- 2\n")
    with pytest.raises(ConfigError, match=r"broken.yaml: a model preset is a mapping"):
        ModelConfig.from_preset(str(preset))
