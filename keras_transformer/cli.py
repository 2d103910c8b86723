"""The `keras-transformer` command line: one subcommand per stage of the pipeline.

    keras-transformer info [--preset NAME]
    keras-transformer build-vocab --config experiments/NAME.yaml [--set k=v] --output DIR
    keras-transformer data-stats --config experiments/NAME.yaml [--set k=v] --vocab DIR
    keras-transformer train --config experiments/NAME.yaml [--set k=v ...] --output runs/NAME
    keras-transformer average --run runs/NAME --last N
"""

from __future__ import annotations

import argparse
import os
import sys

from keras_transformer.config import ConfigError
from keras_transformer.data import DataError


def _info(args) -> int:
    """Prints library versions, visible devices and the parameter counts of presets."""
    import keras
    import tensorflow as tf
    import tensorflow_text

    import keras_transformer
    from keras_transformer.config import ModelConfig, preset_names
    from keras_transformer.model import count_parameters

    print(f"keras-transformer {keras_transformer.__version__}")
    print(f"tensorflow {tf.__version__}, tensorflow-text {tensorflow_text.__version__}, "
          f"keras {keras.__version__}")
    for device in tf.config.list_physical_devices():
        print(f"device {device.device_type}: {device.name}")
    for name in args.preset or preset_names():
        config = ModelConfig.from_preset(name)
        print(f"preset {name}: {config.num_layers} layers, d_model {config.d_model}, "
              f"dff {config.dff}, {config.num_heads} heads, share_embeddings "
              f"{config.share_embeddings}, vocab {config.source_vocab_size}/"
              f"{config.target_vocab_size}: {count_parameters(config):,} parameters")
    return 0


def _load_config(args):
    from keras_transformer.config import ExperimentConfig

    return ExperimentConfig.from_yaml(args.config, args.set or [])


def _build_vocab(args) -> int:
    from keras_transformer.data import build_vocab

    config = _load_config(args)
    source, target = build_vocab(config.data, args.output)
    print(f"wrote {config.data.tokenizer} vocabulary to {args.output}: source "
          f"{source.vocab_size}, target {target.vocab_size} tokens")
    return 0


def _data_stats(args) -> int:
    from keras_transformer.data import data_stats, format_data_stats

    print(format_data_stats(data_stats(_load_config(args).data, args.vocab)))
    return 0


def _train(args) -> int:
    from keras_transformer import training

    if args.logical_cpus:
        training.split_cpu(args.logical_cpus)
    history = training.train(_load_config(args), args.output, verbose=args.verbose)
    final = {k: round(v[-1], 4) for k, v in history.history.items()}
    print(f"keras-transformer train: finished {args.output}: {final}")
    return 0


def _average(args) -> int:
    from keras_transformer.training import average_checkpoints

    path = average_checkpoints(args.run, args.last, args.output)
    print(f"wrote the average of the last {args.last} checkpoints to {path}")
    return 0


def _add_config_arguments(parser):
    parser.add_argument("--config", required=True, help="experiment YAML file")
    parser.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                        help="override a config value (repeatable), e.g. train.epochs=3")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="keras-transformer",
        description="Train, export and serve the Transformer of 'Attention Is All You Need'.")
    commands = parser.add_subparsers(dest="command", required=True)

    info = commands.add_parser("info", help="versions, devices and preset parameter counts")
    info.add_argument("--preset", action="append",
                      help="preset name (repeatable; default: all presets)")
    info.set_defaults(run=_info)

    vocab = commands.add_parser("build-vocab", help="learn and write the vocabulary files")
    _add_config_arguments(vocab)
    vocab.add_argument("--output", required=True, help="vocabulary folder to write")
    vocab.set_defaults(run=_build_vocab)

    stats = commands.add_parser("data-stats", help="pair counts, lengths, batches, padding")
    _add_config_arguments(stats)
    stats.add_argument("--vocab", help="vocabulary folder (default: data.vocab_dir)")
    stats.set_defaults(run=_data_stats)

    train = commands.add_parser("train", help="train a model with model.fit")
    _add_config_arguments(train)
    train.add_argument("--output", required=True, help="run folder (resumes if it holds this run)")
    train.add_argument("--logical-cpus", type=int, default=0, metavar="N",
                       help="split the CPU into N logical devices (distribution without GPUs)")
    train.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2),
                       help="1: progress bar, 2: one line per epoch")
    train.set_defaults(run=_train)

    average = commands.add_parser("average", help="average the last N epoch checkpoints")
    average.add_argument("--run", required=True, help="run folder")
    average.add_argument("--last", type=int, default=5, help="how many checkpoints")
    average.add_argument("--output", help="weights file (default: RUN/average_lastN.weights.h5)")
    average.set_defaults(run=_average)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ConfigError, FileNotFoundError, DataError) as error:
        print(f"keras-transformer {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
