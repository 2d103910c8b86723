"""Helpers shared by the tests: seeded random tiny Transformers, benchmark scripts as modules,
the ops of a SavedModel."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from keras_transformer.runs import legacy_weights
from keras_transformer.config import REPO_ROOT, ExperimentConfig


def load_benchmark(name: str):
    """The module of `benchmarks/NAME.py`, which is a script, not a package module; registered in
    `sys.modules` as `bench_NAME` (dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}",
                                                  REPO_ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def seeded_tiny_model(tokenizer, *, seed: int, norm: str = "post", share: str = "none",
                      max_positions: int = 24, output_scale: float = 1.0,
                      perturb_vectors: bool = False, **config_overrides):
    """A built 2-layer, d_model 32 Transformer over `tokenizer`'s vocabulary with seeded
    Glorot-uniform kernels and embeddings.

    Seeded numpy weights rather than keras.utils.set_random_seed, which clears TensorFlow's
    eager kernel cache and with it the SentencePiece resource of already loaded tokenizers.

    Args:
        output_scale: multiplies the matrices with a vocabulary-sized dimension (embeddings and
            the output layer), for sharper output distributions than a random model's flat ones.
        perturb_vectors: adds N(0, 0.1) to biases and LayerNorm parameters, so that a misplaced
            one shows.
        config_overrides: other `ModelConfig` fields (activation, num_decoder_layers, ...).
    """
    from keras_transformer.config import ModelConfig
    from keras_transformer.model import Transformer

    config = ModelConfig(**{
        **dict(num_layers=2, d_model=32, num_heads=4, dff=64, dropout=0.1, norm=norm,
               share_embeddings=share, source_vocab_size=tokenizer.vocab_size,
               target_vocab_size=tokenizer.vocab_size, max_positions=max_positions),
        **config_overrides})
    model = Transformer(config)
    model.build()
    rng = np.random.default_rng(seed)

    def draw(w):
        if w.ndim >= 2:
            limit = np.sqrt(6.0 / (w.shape[0] + np.prod(w.shape[1:])))
            w = rng.uniform(-limit, limit, w.shape)
            if tokenizer.vocab_size in (w.shape[0], w.shape[-1]):
                w = w * output_scale
        elif perturb_vectors:
            w = w + rng.normal(0.0, 0.1, w.shape)
        return w.astype(np.float32)

    # Drawn in the order and shapes of the attention layout before issue 71 (per-head kernels
    # [d_model, heads, head_dim]), then fused: the same seed gives the same model as then.
    d, heads = config.d_model, config.num_heads
    head = (heads, d // heads)
    legacy_shapes = [(d, *head), head] * 3 + [(*head, d), (d,)]
    weights, variables = [], model.weights
    i = 0
    while i < len(variables):
        path = variables[i].path
        fused = next((name for name in ("qkv", "q") if path.endswith(f"/{name}/kernel")), None)
        if fused is None:
            weights.append(draw(variables[i].numpy()))
            i += 1
            continue
        projections = legacy_weights.fuse_projections(
            [draw(np.zeros(shape)) for shape in legacy_shapes], self_attention=fused == "qkv")
        weights += [array for pair in projections.values() for array in pair]
        i += 2 * len(projections)
    model.set_weights(weights)
    return model


def read_events(folder: Path, steps: bool = False) -> dict:
    """{tag: [values]} of every summary in the event files of `folder` ([(step, value)] with
    `steps`)."""
    values = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                array = tf.make_ndarray(value.tensor)
                values.setdefault(value.tag, []).append((event.step, array) if steps else array)
    return values


def write_config(config: ExperimentConfig, path: Path) -> Path:
    config.to_yaml(path)
    return path


def snapshot(folder: Path) -> dict:
    """{path: (mtime, bytes)} of every file and folder under `folder`."""
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.is_file() and p.read_bytes())
            for p in sorted(folder.rglob("*"))}


def graph_ops(export_dir) -> set:
    """Every op type in the SavedModel's graph and in every function of its library."""
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((Path(export_dir) / "saved_model.pb").read_bytes())
    ops = set()
    for meta_graph in proto.meta_graphs:
        ops.update(node.op for node in meta_graph.graph_def.node)
        for function in meta_graph.graph_def.library.function:
            ops.update(node.op for node in function.node_def)
    return ops


def flip_weight_bytes(path: Path, count: int = 64) -> str:
    """Overwrites `count` bytes inside the largest array of an HDF5 weight file with random ones
    (what `dd conv=notrunc` into the token embedding does): the file still opens and loads.
    Returns the array's name."""
    import h5py

    with h5py.File(path, "r") as f:
        arrays = []
        f.visititems(lambda name, item: arrays.append((item.size, name, item.id.get_offset()))
                     if isinstance(item, h5py.Dataset) and item.size else None)
    _, name, offset = max(arrays)
    with open(path, "r+b") as f:
        f.seek(offset + 16)
        f.write(np.random.default_rng(0).integers(0, 256, count, dtype=np.uint8).tobytes())
    return name
