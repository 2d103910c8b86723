"""The `keras-transformer` command line: one subcommand per stage of the pipeline.

    keras-transformer info [--preset NAME]
"""

from __future__ import annotations

import argparse
import os
import sys

from keras_transformer.config import ConfigError


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="keras-transformer",
        description="Train, export and serve the Transformer of 'Attention Is All You Need'.")
    commands = parser.add_subparsers(dest="command", required=True)

    info = commands.add_parser("info", help="versions, devices and preset parameter counts")
    info.add_argument("--preset", action="append",
                      help="preset name (repeatable; default: all presets)")
    info.set_defaults(run=_info)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ConfigError, FileNotFoundError) as error:
        print(f"keras-transformer {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
