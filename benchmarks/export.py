"""What an export of a run costs, and how soon a fresh process serves it: the cold start of a
TF Serving version.

    python benchmarks/export.py --run runs/NAME [--repeats 3] [--repo DIR] [--json FILE]

Each repeat runs two fresh Python processes, one after the other:

- export: `export.export_run` of the run's best weights (the default export, as `keras-transformer
  export` makes it), timed from after the imports to the renamed folder; the size of its
  `saved_model.pb`, and its decoding loops (the `while` bodies of its graph: one per search,
  greedy and beam, whose best and n-best signatures share it);
- load: `tf.saved_model.load` of that export, timed after the imports (what TF Serving does for a
  new version, before its warmup replay), then the first `translate_greedy` call on one sentence
  (Grappler's optimization of the graph, then the decoding).

Prints each repeat and the medians, with the CPU and the commit. To compare two commits, run it
with `--repo` naming each checkout in turn: the processes import `keras_transformer` from there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SENTENCE = "Ein Mann fährt Fahrrad."
FIGURES = ("export_seconds", "load_seconds", "first_call_seconds")


def while_loop_count(export_dir: str | os.PathLike) -> int:
    """The `tf.while_loop` bodies in the SavedModel's function library (also what the export
    tests count)."""
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((Path(export_dir) / "saved_model.pb").read_bytes())
    return sum(function.signature.name.startswith("while_body_")
               for meta_graph in proto.meta_graphs
               for function in meta_graph.graph_def.library.function)


def export_once(run_dir: str, model_root: str) -> dict:
    from keras_transformer.export.savedmodel import export_run

    start = time.perf_counter()
    path = export_run(run_dir, model_root)
    seconds = time.perf_counter() - start
    return {"export_dir": str(path), "export_seconds": seconds,
            "saved_model_bytes": (path / "saved_model.pb").stat().st_size,
            "while_loops": while_loop_count(path)}


def load_once(export_dir: str) -> dict:
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  the tokenizers' ops, as every loader registers them

    start = time.perf_counter()
    loaded = tf.saved_model.load(export_dir)
    loaded_at = time.perf_counter()
    outputs = loaded.signatures["translate_greedy"](source=tf.constant([SENTENCE]))
    translation = outputs["translation"].numpy()[0].decode("utf-8")
    return {"load_seconds": loaded_at - start,
            "first_call_seconds": time.perf_counter() - loaded_at, "translation": translation}


def in_fresh_process(repo: Path, step: str, *args: str) -> dict:
    """`step` ("export" or "load") run by this file in a new Python importing from `repo`."""
    result = subprocess.run([sys.executable, __file__, "--child", step, str(repo), *args],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"the {step} process failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.rsplit("RESULT", 1)[1])


def summarize(repeats: list[dict]) -> dict:
    """The medians of the timed figures; the size and loop count, which must not vary."""
    summary = {name: statistics.median(r[name] for r in repeats) for name in FIGURES}
    for name in ("saved_model_bytes", "while_loops", "translation"):
        values = {r[name] for r in repeats}
        if len(values) != 1:
            raise ValueError(f"{name} differs between repeats: {sorted(values)}")
        summary[name] = values.pop()
    return summary


def format_repeat(figures: dict) -> str:
    return (f"export {figures['export_seconds']:.2f} s, saved_model.pb "
            f"{figures['saved_model_bytes'] / 1e6:.2f} MB, {figures['while_loops']} decoding "
            f"loops, load {figures['load_seconds']:.2f} s, first call "
            f"{figures['first_call_seconds']:.2f} s: {figures['translation']!r}")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="training run folder")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--repo", default=str(HERE.parent),
                        help="the checkout whose keras_transformer the processes import")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: must be >= 1")
    if not (Path(args.run) / "config.yaml").is_file():
        parser.error(f"--run {args.run}: not a training run (no config.yaml)")
    return args


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        step, repo, *rest = argv[1:]
        sys.path.insert(0, repo)
        figures = export_once(*rest) if step == "export" else load_once(*rest)
        print("RESULT" + json.dumps(figures))
        return
    args = parse_args(argv)
    sys.path.insert(0, str(HERE))
    from scale import machine

    repo = Path(args.repo).resolve()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=repo).stdout.strip() or "unknown"
    print(f"{args.run}: {args.repeats} repeats, keras_transformer from {repo} (commit {commit}); "
          f"{machine()}", flush=True)
    repeats = []
    for index in range(args.repeats):
        with tempfile.TemporaryDirectory() as root:
            exported = in_fresh_process(repo, "export", args.run, str(Path(root) / "model"))
            figures = {**exported, **in_fresh_process(repo, "load", exported["export_dir"])}
        repeats.append(figures)
        print(f"  repeat {index + 1}: {format_repeat(figures)}", flush=True)
    summary = summarize(repeats)
    print(f"median of {len(repeats)}: {format_repeat(summary)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"argv": sys.argv, "repo": str(repo),
                                               "repeats": repeats, "median": summary},
                                              indent=2))


if __name__ == "__main__":
    main()
