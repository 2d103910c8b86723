"""Weight files of the attention layout before issue 71, converted as they load.

Until then each attention layer held a `keras.layers.MultiHeadAttention` named `mha`: separate
`query_dense`, `key_dense` and `value_dense` kernels `[d_model, heads, head_dim]` with biases
`[heads, head_dim]`, and an `output_dense` kernel `[heads, head_dim, d_model]`. Now it holds the
fused projections that training and decoding both read (`layers.attention`): `qkv` `[d_model,
3 d_model]` in self-attention, `q` `[d_model, d_model]` and `kv` `[d_model, 2 d_model]` in
cross-attention, and `out` `[d_model, d_model]`, with the heads in the same order (heads major).
The arithmetic is the same, so a converted file gives the same model.

The optimizer's state converts the same way: Adam's slots are per element, so each slot of a
fused kernel is the old slots fused as the kernel is. The old file lists them in the old order
of the model's trainable variables, which is the new order with each attention layer's
projections in the old one (query, key, value, output; kernel then bias).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

import h5py
import numpy as np

LEGACY_GROUP = "mha"
_LEGACY_PARTS = ("query_dense", "key_dense", "value_dense", "output_dense")


def is_legacy(path: str | Path) -> bool:
    """Whether the weight file at `path` has the `keras.layers.MultiHeadAttention` layout."""
    with h5py.File(path, "r") as f:
        return bool(_legacy_groups(f))


def _legacy_groups(f: h5py.File) -> list[str]:
    """The paths of the attention layers of `f` that hold an `mha` group."""
    found = []
    f.visit(lambda name: found.append(name.rsplit("/", 1)[0])
            if name.rsplit("/", 1)[-1] == LEGACY_GROUP and isinstance(f[name], h5py.Group)
            else None)
    return found


@contextlib.contextmanager
def loadable(path: str | Path, model):
    """Yields a path that `model.load_weights` reads: `path` itself, or a converted copy (in a
    temporary folder, deleted afterwards) if it has the legacy layout. `model` is the built
    model (with its built optimizer, if the file holds an optimizer state) it loads into."""
    path = Path(path)
    if not is_legacy(path):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="keras_transformer_weights_") as folder:
        converted = Path(folder) / path.name
        shutil.copyfile(path, converted)
        with h5py.File(converted, "a") as f:
            convert(f, model)
        yield converted


def convert(f: h5py.File, model) -> None:
    """Rewrites the open legacy weight file `f` in place into the current layout of `model`."""
    for group in _legacy_groups(f):
        old = _legacy_arrays(f[group][LEGACY_GROUP])
        for name, (kernel, bias) in fuse_projections(old, _is_self_attention(group)).items():
            _delete(f[group], name)
            variables = f[group].create_group(name).create_group("vars")
            variables["0"], variables["1"] = kernel, bias
        del f[group][LEGACY_GROUP]
    optimizer = getattr(model, "optimizer", None)
    if (optimizer is not None and optimizer.built and "optimizer/vars" in f
            and len(f["optimizer/vars"])):
        _convert_optimizer(f["optimizer/vars"], model)  # else Keras does not read it


def _delete(group: h5py.Group, name: str) -> None:
    if name in group:
        del group[name]


def _is_self_attention(group: str) -> bool:
    return group.rsplit("/", 1)[-1].endswith("self_attention")


def _legacy_arrays(mha: h5py.Group) -> list[np.ndarray]:
    """query kernel, query bias, key kernel, ..., output bias, as in the old variable order."""
    return [mha[part]["vars"][index][()] for part in _LEGACY_PARTS for index in ("0", "1")]


def fuse_projections(old: list[np.ndarray], self_attention: bool) -> dict:
    """The new projections `{name: (kernel, bias)}` of one attention layer from its 8 old
    arrays (kernels `[d, heads, head_dim]`, `[heads, head_dim, d]`; or slots of those shapes),
    in the new variable order."""
    q_kernel, q_bias, k_kernel, k_bias, v_kernel, v_bias, o_kernel, o_bias = old
    d = o_bias.shape[-1]
    kernels = [k.reshape(d, d) for k in (q_kernel, k_kernel, v_kernel)]
    biases = [b.reshape(d) for b in (q_bias, k_bias, v_bias)]
    if self_attention:
        fused = {"qkv": (np.concatenate(kernels, axis=1), np.concatenate(biases))}
    else:
        fused = {"q": (kernels[0], biases[0]),
                 "kv": (np.concatenate(kernels[1:], axis=1), np.concatenate(biases[1:]))}
    fused["out"] = (o_kernel.reshape(d, d), o_bias)
    return fused


def _convert_optimizer(slots: h5py.Group, model) -> None:
    """Reorders and fuses the optimizer's variables `slots` (`optimizer/vars/N`): its own
    variables first (the step), then each trainable variable's slots in turn."""
    variables = model.trainable_variables
    count = len(model.optimizer.variables)
    per_variable = (count - 1) // len(variables)
    prefix = count - per_variable * len(variables)
    old = [slots[str(i)][()] for i in range(len(slots))]
    new = old[:prefix]
    old_slot = prefix
    i = 0
    while i < len(variables):
        path = variables[i].path
        projection = next((name for name in ("qkv", "q") if path.endswith(f"/{name}/kernel")),
                          None)
        if projection is None:
            new += old[old_slot:old_slot + per_variable]
            old_slot += per_variable
            i += 1
            continue
        # 8 old variables, each with its slots: slot k of every variable fuses alike
        block = old[old_slot:old_slot + 8 * per_variable]
        fused = [fuse_projections(block[k::per_variable], projection == "qkv")
                 for k in range(per_variable)]
        for name in fused[0]:
            for part in (0, 1):  # kernel, bias
                new += [slots_of[name][part] for slots_of in fused]
        old_slot += 8 * per_variable
        i += 2 * len(fused[0])
    if old_slot != len(old) or len(new) != count:
        raise ValueError(f"the optimizer state holds {len(old)} variables, where a legacy "
                         f"state of this model would hold {old_slot}")
    for name in list(slots):
        del slots[name]
    for index, array in enumerate(new):
        slots[str(index)] = array
