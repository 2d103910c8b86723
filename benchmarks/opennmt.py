"""Training speed and time to quality against OpenNMT-tf 2.32, on the same data and model size.

    python benchmarks/opennmt.py [--config experiments/demo.yaml] [--minutes 30]
                                 [--precisions float32,auto]
                                 [--onmt-python PATH] [--work-dir runs/opennmt]
                                 [--eval-steps N] [--log-every N] [--max-steps N]
                                 [--val-sentences N] [--vocab-dir DIR] [--set SECTION.KEY=VALUE]

One invocation trains both sides, one after the other, each in its own process, for --minutes of
wall-clock time each: ours once per precision of --precisions (default `float32,auto`: float32,
as OpenNMT-tf trains on a CPU, then this machine's best precision where that is another one,
mixed_bfloat16 on a CPU with AMX-BF16 or AVX512-BF16; this replaces the config's
`train.precision`), then OpenNMT-tf. It prints:

- target tokens/s after warm-up for each run and each of ours against OpenNMT-tf's: the median
  of the throughput windows of --log-every steps after the first (which holds tracing). Ours:
  `logs/train_steps` (`callbacks.StepSummaries`); OpenNMT-tf: its own `words_per_sec/target`
  reports (`TrainingStats`, every `save_summary_steps`). Neither side's windows hold an
  evaluation; OpenNMT-tf also leaves out its first 2 steps. Target tokens are the same on both
  sides: the SentencePiece pieces of the target plus one end token per sentence;
- for each of our runs, validation BLEU at every minute mark m = 1, 2, ... that both sides
  reached: each side's BLEU
  at its last evaluation that had finished at or before minute m (a side's curve is a step
  function of training minutes; a mark before a side's first evaluation is left out), then
  each side's last evaluation. Minutes count from the start of each side's training loop
  (Keras `fit`, OpenNMT-tf's `Trainer`), tracing, checkpoints and evaluations included, until
  the evaluation's BLEU is known (ours as `benchmarks/curves.py` reads it).

The same data: the experiment's Multi30k pairs (`data.load_pairs`, normalized), a joint
SentencePiece model built once with our `build-vocab` (or --vocab-dir) encodes the training and
validation pairs into files of space-separated pieces that OpenNMT-tf reads with its default
space tokenizer, with a vocabulary file of the model's pieces (OpenNMT-tf's <blank>, <s>, </s>
and its <unk> in place of our 4 reserved ids: the same vocabulary size). Training pairs
with an empty side or longer than `data.max_pair_length` (with START/END) are left out of its
files, as our batches drop them.

The same model and recipe, from the experiment's config (default `experiments/demo.yaml`: the
tutorial preset, 4 layers, d_model 128, 8 heads, FFN 512): OpenNMT-tf's `Transformer` with
those sizes, pre-norm or post-norm as `model.norm`, embeddings shared as
`model.share_embeddings` (`all`: source, target and output; an output bias only without
sharing, as ours), `model.dropout` on the layers' outputs and the embeddings and none inside
attention or the FFN (as ours); Adam (0.9, 0.98, 1e-9) on the Noam schedule with our warmup
and `train.learning_rate_scale`, label smoothing `train.label_smoothing`, batches of
`data.tokens_per_batch` tokens (`batch_type: tokens`, length buckets of `data.bucket_step`;
--onmt-batch-size sets another, because OpenNMT-tf's batching fills a step with more target
tokens than ours for the same budget: --profile-steps says how many), float32 on a CPU
(OpenNMT-tf has no bfloat16 there; ours: --precisions, each run's printed).

The same evaluation: every --eval-steps optimizer steps (default the recipe's
`train.steps_per_epoch`, our epoch), greedy decoding of the first --val-sentences validation
sentences (default all 1,014), detokenized with the SentencePiece model, cased sacreBLEU
(13a) against the normalized references. Ours: `ValidationBleu` at the end of every epoch (its
translator caps outputs at source length + `decode.max_extra_length`); OpenNMT-tf: its evaluator's
saved predictions (`save_eval_predictions`, `beam_width: 1`, at most `data.max_pair_length`
tokens), scored here afterwards. Both also compute their validation loss at each evaluation, and
save a checkpoint then.

OpenNMT-tf 2.32 pins TensorFlow 2.13: it runs from its own venv (Python 3.11), --onmt-python
(default: $OPENNMT_PYTHON, else ../onmt-venv/bin/python next to the repository). Make it with

    python3.11 -m venv ../onmt-venv
    ../onmt-venv/bin/pip install tensorflow-cpu==2.13.1 opennmt-tf==2.32.0

Without it the script says so in one line and exits with code 2, before anything else runs.

With --profile-steps N, each side also runs steps S to S + N - 1 (S: --profile-start, default
the first step of the third throughput window) under the TensorFlow profiler (ours through
`train.profile_batches`, OpenNMT-tf around its training loop's steps), and the comparison adds
where a step's time goes on each side: kernel time per op group and the op types of each side
with their count per step (`benchmarks/train.py`'s grouping), against two cores' capacity over
the profiled steps' wall time. It also says what a step holds on each side, from each side's
own batching of the same training files: sentences, real target tokens and the padding of the
target and source (the first 200 batches of each).

--max-steps N stops each side after N steps (smoke runs); --minutes still bounds both. The
work folder (--work-dir, overwritten) holds the vocabulary, the encoded files, the runs
(`ours_PRECISION/`, `onmt/`) and `result.json`.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterable, NamedTuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ONMT_ENV = "OPENNMT_PYTHON"
DEFAULT_ONMT_PYTHON = REPO.parent / "onmt-venv" / "bin" / "python"
VENV_COMMAND = ("python3.11 -m venv ../onmt-venv && ../onmt-venv/bin/pip install "
                "tensorflow-cpu==2.13.1 opennmt-tf==2.32.0")
ONMT_VERSION = "2.32"
RESERVED_PIECES = 4  # our PAD, START, END, UNK (ids 0-3); OpenNMT-tf has its own
ONMT_SPECIALS = ("<blank>", "<s>", "</s>")  # OpenNMT-tf's ids 0-2 (opennmt.constants)
FOREVER = 10 ** 9  # steps, when only --minutes bounds a side

# The work folder's layout.
DATA, VOCAB, OURS, ONMT = "data", "vocab", "ours", "onmt"
PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16", "auto")  # train.precision's values
TRAIN_SRC, TRAIN_TGT = "train.src", "train.tgt"
VAL_SRC, VAL_TGT, VAL_REF = "val.src", "val.tgt", "val.ref"
VOCAB_FILE = "vocabulary.txt"
MANIFEST = "manifest.json"


# ----------------------------------------------------------------------------- the data export

def write_vocabulary(processor, path: str | os.PathLike) -> int:
    """An OpenNMT-tf vocabulary file of a SentencePiece model, one token a line: OpenNMT-tf's
    <blank>, <s>, </s> first (ids 0, 1, 2, which its inputters use for padding, start and end,
    and which it does not add itself), then the model's pieces but our 4 reserved ones (<pad>,
    <s>, </s>, <unk>), in id order; OpenNMT-tf adds <unk> after them (its out-of-vocabulary
    bucket). So its vocabulary has as many entries as the model. Returns the number of lines."""
    pieces = [*ONMT_SPECIALS, *(processor.id_to_piece(i)
                                for i in range(RESERVED_PIECES, processor.get_piece_size()))]
    Path(path).write_text("".join(f"{piece}\n" for piece in pieces), encoding="utf-8")
    return len(pieces)


def export_pairs(pairs: Iterable[tuple[str, str]], processor, source_path, target_path,
                 reference_path=None, max_pair_length: int | None = None) -> dict:
    """Writes (source, target) text pairs as space-separated SentencePiece pieces, one pair a
    line (and the target text itself to `reference_path`). With `max_pair_length`, pairs with an
    empty side or more than that many tokens on a side with START/END are left out, as our
    training batches drop them. Returns {"pairs": written, "dropped": left out}."""
    written = dropped = 0
    files = [open(path, "w", encoding="utf-8") for path in
             (source_path, target_path, *([reference_path] if reference_path else []))]
    try:
        for source, target in pairs:
            pieces = [processor.encode(text, out_type=str) for text in (source, target)]
            if max_pair_length is not None and (
                    not source or not target
                    or max(len(p) for p in pieces) + 2 > max_pair_length):
                dropped += 1
                continue
            for file, line in zip(files, [" ".join(p) for p in pieces] + [target]):
                file.write(line + "\n")
            written += 1
    finally:
        for file in files:
            file.close()
    return {"pairs": written, "dropped": dropped}


def decode_pieces(line: str, processor) -> str:
    """A line of space-separated pieces (an OpenNMT-tf prediction) as text."""
    return processor.decode_pieces(line.split())


def _decoded(values: Iterable) -> Iterable[tuple[str, str]]:
    for source, target in values:
        yield source.decode("utf-8"), target.decode("utf-8")


def prepare(args) -> dict:
    """Builds (or reuses) the vocabulary and writes the encoded files; returns the manifest.
    Runs in our venv."""
    import sentencepiece

    from keras_transformer import data as data_lib
    from keras_transformer.config import SENTENCEPIECE_FILE
    from keras_transformer.data.tokenizers import META_FILE

    config = our_config(args)
    if config.data.tokenizer != "sentencepiece":
        raise SystemExit(f"opennmt.py: data.tokenizer={config.data.tokenizer!r}: the comparison "
                         "needs the joint SentencePiece vocabulary (data.tokenizer=sentencepiece)")
    work = Path(args.work_dir)
    vocab_dir = Path(args.vocab_dir) if args.vocab_dir else work / VOCAB
    if (vocab_dir / META_FILE).is_file():
        data_lib.load_tokenizers(config.data, vocab_dir)  # checks it fits the config
    else:
        data_lib.build_vocab(config.data, vocab_dir)
    processor = sentencepiece.SentencePieceProcessor(
        model_file=str(vocab_dir / SENTENCEPIECE_FILE))
    folder = work / DATA
    folder.mkdir(parents=True, exist_ok=True)
    vocabulary = write_vocabulary(processor, folder / VOCAB_FILE)
    train = export_pairs(
        _decoded(data_lib.load_pairs(config.data, config.data.train_split).as_numpy_iterator()),
        processor, folder / TRAIN_SRC, folder / TRAIN_TGT,
        max_pair_length=config.data.max_pair_length)
    validation = list(_decoded(
        data_lib.load_pairs(config.data, config.data.validation_split).as_numpy_iterator()))
    if args.val_sentences:
        validation = validation[:args.val_sentences]
    val = export_pairs(validation, processor, folder / VAL_SRC, folder / VAL_TGT,
                       folder / VAL_REF)
    manifest = {"vocab_dir": str(vocab_dir), "sentencepiece_model": str(
        vocab_dir / SENTENCEPIECE_FILE), "vocab_size": processor.get_piece_size(),
        "vocabulary_lines": vocabulary, "train": train, "validation": val}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


# ----------------------------------------------------------------------------- configs

def our_config(args, vocab_dir=None):
    """The experiment --config with --set applied (and the vocabulary, once built)."""
    from keras_transformer.config import ExperimentConfig

    overrides = [*(args.set or []), *([f"data.vocab_dir={vocab_dir}"] if vocab_dir else []),
                 *([f"train.precision={args.precision}"] if getattr(args, "precision", None)
                   else [])]
    return ExperimentConfig.from_yaml(args.config, overrides)


def our_precisions(requested: Iterable[str], native_bfloat16: bool) -> list[str]:
    """The precisions our side trains in: --precisions in order, `auto` resolved as
    `train.precision: auto` resolves it on this CPU (mixed_bfloat16 with native bfloat16, else
    float32), each once."""
    resolved = []
    for precision in requested:
        if precision == "auto":
            precision = "mixed_bfloat16" if native_bfloat16 else "float32"
        if precision not in resolved:
            resolved.append(precision)
    return resolved


def our_run_name(precision: str) -> str:
    """Our run's folder in the work folder, and the name of its worker's output."""
    return f"{OURS}_{precision}"


def schedule(config, args) -> dict:
    """Steps per evaluation, per throughput window, and the step limit, shared by both sides."""
    eval_steps = args.eval_steps or config.train.steps_per_epoch or 100
    return {"eval_steps": eval_steps,
            "log_every": args.log_every or config.train.log_every_steps or 50,
            "max_steps": args.max_steps or FOREVER}


def onmt_settings(config, manifest: dict, plan: dict, work: Path,
                  batch_size: int | None = None) -> dict:
    """What the OpenNMT-tf worker builds: the model's sizes and its YAML config, from ours;
    `batch_size`: its tokens per batch (default our `data.tokens_per_batch`)."""
    model, data, train = config.model, config.data, config.train
    folder = work / DATA
    sharing = {"all": "ALL", "target": "TARGET", "none": "NONE"}[model.share_embeddings]
    return {
        "model": {"num_layers": [model.num_layers, model.decoder_layers],
                  "num_units": model.d_model, "num_heads": model.num_heads,
                  "ffn_inner_dim": model.dff, "dropout": model.dropout,
                  "attention_dropout": 0.0, "ffn_dropout": 0.0,
                  "activation": model.activation, "share_embeddings": sharing,
                  "pre_norm": model.norm == "pre",
                  # Ours has an output bias only with its own output layer (no sharing).
                  "output_layer_bias": model.share_embeddings == "none"},
        "config": {
            "model_dir": str(work / ONMT),
            "data": {"train_features_file": str(folder / TRAIN_SRC),
                     "train_labels_file": str(folder / TRAIN_TGT),
                     "eval_features_file": str(folder / VAL_SRC),
                     "eval_labels_file": str(folder / VAL_TGT),
                     "source_vocabulary": str(folder / VOCAB_FILE),
                     "target_vocabulary": str(folder / VOCAB_FILE)},
            "params": {"optimizer": "Adam",
                       "optimizer_params": {"beta_1": train.adam_beta_1,
                                            "beta_2": train.adam_beta_2,
                                            "epsilon": train.adam_epsilon},
                       "learning_rate": train.learning_rate_scale,
                       "decay_type": "NoamDecay",
                       "decay_params": {"model_dim": model.d_model,
                                        "warmup_steps": train.warmup_steps},
                       "label_smoothing": train.label_smoothing,
                       "beam_width": 1, "maximum_decoding_length": data.max_pair_length},
            "train": {"batch_size": batch_size or data.tokens_per_batch, "batch_type": "tokens",
                      "length_bucket_width": data.bucket_step,
                      # Ours counts START and END; OpenNMT-tf's source has neither, its target
                      # length one of them. The export already left longer pairs out.
                      "maximum_features_length": data.max_pair_length - 2,
                      "maximum_labels_length": data.max_pair_length - 1,
                      "sample_buffer_size": data.shuffle_buffer,
                      "save_checkpoints_steps": plan["eval_steps"], "keep_checkpoint_max": 2,
                      "save_summary_steps": plan["log_every"], "max_step": plan["max_steps"]},
            "eval": {"steps": plan["eval_steps"], "save_eval_predictions": True,
                     "batch_size": 100, "batch_type": "examples"},
        },
    }


# ----------------------------------------------------------------------------- our side

def warm_rates(windows: list[tuple[int, float]]) -> dict:
    """Target tokens/s after warm-up from (step, tokens/s) windows in step order: the median of
    the windows after the first (tracing, the input pipeline filling); the one window there is
    if there is only one (flagged)."""
    if not windows:
        return {"target_tokens_per_second": None, "windows": 0, "warm": False}
    warm = windows[1:] or windows
    return {"target_tokens_per_second": statistics.median(rate for _, rate in warm),
            "windows": len(warm), "warm": len(windows) > 1}


def startup(windows: list[tuple[int, float]], before_step: int) -> dict | None:
    """What a side's first steps cost beyond its steady pace, from its throughput windows
    `(step, seconds from the loop's start to that step's end)`: the pace is the median seconds
    a step of the windows after the first that end at or before `before_step` (the first
    evaluation); at the first window's end and at the last such window's end, the seconds
    taken and their excess over the pace (tracing, compilations, the input pipeline's start,
    a pass's last batches). None with fewer than 3 such windows."""
    windows = sorted(w for w in windows if w[0] <= before_step)
    if len(windows) < 3:
        return None
    pace = statistics.median((b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(windows, windows[1:]))

    def point(window):
        step, seconds = window
        return {"step": step, "seconds": seconds, "excess": seconds - step * pace}

    return {"pace": pace, "first": point(windows[0]), "last": point(windows[-1])}


def profile_window(args, plan) -> tuple[int, int] | None:
    """The steps (first, last, from 1) that --profile-steps profiles on both sides, or None."""
    if not args.profile_steps:
        return None
    start = args.profile_start or 2 * plan["log_every"] + 1
    return start, start + args.profile_steps - 1


def batch_stats(batches) -> dict:
    """What a step holds, from (target lengths, padded target length, source lengths, padded
    source length) per batch: the means over `batches` of sentences and real target tokens, and
    the padding fractions of the targets and sources."""
    count = sentences = real_target = padded_target = real_source = padded_source = 0
    for lengths, target_width, source_lengths, source_width in batches:
        count += 1
        sentences += len(lengths)
        real_target += sum(lengths)
        padded_target += len(lengths) * target_width
        real_source += sum(source_lengths)
        padded_source += len(source_lengths) * source_width
    return {"batches": count, "sentences": sentences / max(count, 1),
            "target_tokens": real_target / max(count, 1),
            "target_padding": 1 - real_target / max(padded_target, 1),
            "source_padding": 1 - real_source / max(padded_source, 1)}


def our_batch_stats(config, count: int = 200) -> dict:
    """`batch_stats` of our first `count` training batches (targets: the output side, with END;
    sources with START and END)."""
    from keras_transformer import data as data_lib

    source_tokenizer, target_tokenizer = data_lib.load_tokenizers(config.data,
                                                                  config.data.vocab_dir)
    dataset = data_lib.make_batches(data_lib.load_pairs(config.data, "train"), source_tokenizer,
                                    target_tokenizer, config.data, training=True)
    return batch_stats(((target_out != 0).sum(axis=1).tolist(), target_out.shape[1],
                         (source != 0).sum(axis=1).tolist(), source.shape[1])
                        for (source, _), target_out in dataset.take(count).as_numpy_iterator())


def run_ours(args) -> dict:
    """Trains our side for --minutes (or --max-steps); returns its figures. Our venv."""
    import dataclasses

    from keras_transformer.training import runner as training
    from keras_transformer.runs.folder import Run

    sys.path.insert(0, str(HERE))
    from curves import read_curve, training_start  # noqa: E402
    from fit import step_windows  # noqa: E402

    manifest = json.loads((Path(args.work_dir) / DATA / MANIFEST).read_text())
    config = our_config(args, manifest["vocab_dir"])
    plan = schedule(config, args)
    epochs = math.ceil(plan["max_steps"] / plan["eval_steps"])
    # The time budget stops `fit` within --minutes; Keras still ends that epoch (its
    # validation loss, BLEU and checkpoint), inside the budget (`callbacks.TrainingClock`).
    profiled = profile_window(args, plan)
    config = dataclasses.replace(config, train=dataclasses.replace(
        config.train, epochs=epochs, steps_per_epoch=plan["eval_steps"],
        log_every_steps=plan["log_every"], early_stopping_patience=None,
        validation_bleu_sentences=manifest["validation"]["pairs"],
        budget_minutes=float(args.minutes),
        profile_batches=f"{profiled[0]},{profiled[1]}" if profiled else None))
    run_dir = Path(args.work_dir) / our_run_name(config.train.precision)
    batches = our_batch_stats(config) if profiled else None
    history = training.train(config, run_dir, verbose=2, overwrite=True)
    run = Run(run_dir)
    steps = step_windows(run.logs_dir / "train_steps")
    windows = [(w["step"], w["tokens_per_second"]) for w in steps]
    start = training_start(run_dir)
    points = read_curve(run_dir)
    model = run.config.model
    profile = None
    if profiled:
        found = sorted((run_dir / "logs").rglob("*.xplane.pb"))
        profile = {"xplane": str(found[-1]) if found else None, "steps": args.profile_steps,
                   "batches": batches}
    return {"side": "ours", **warm_rates(windows), "window_steps": plan["log_every"],
            "profile": profile,
            "startup": startup([(w["step"], w["wall_time"] - start) for w in steps],
                               plan["eval_steps"]) if start is not None else None,
            "precision": training.resolve_precision(config.train.precision),
            "steps": int(history.model.optimizer.iterations.numpy()),
            "params": history.model.count_params(),
            "model": f"{model.num_layers}+{model.decoder_layers} layers, d_model "
                     f"{model.d_model}, {model.num_heads} heads, FFN {model.dff}, "
                     f"{model.norm}-norm, shared embeddings {model.share_embeddings}",
            "evaluations": [{"label": f"epoch {p.epoch}", "minutes": p.minutes, "bleu": p.bleu}
                            for p in points]}


# ----------------------------------------------------------------------------- OpenNMT-tf's side

def run_onmt(args) -> dict:
    """Trains OpenNMT-tf for --minutes (or --max-steps); returns its figures with the paths of
    its evaluations' predictions (scored by the parent). Runs in the OpenNMT-tf venv: imports
    nothing of this package."""
    import tensorflow as tf
    import opennmt
    from opennmt import evaluation, training

    settings = json.loads(Path(args.settings).read_text())
    sizes = settings["model"]
    deadline = args.minutes * 60.0
    model = opennmt.models.Transformer(
        source_inputter=opennmt.inputters.WordEmbedder(embedding_size=sizes["num_units"]),
        target_inputter=opennmt.inputters.WordEmbedder(embedding_size=sizes["num_units"]),
        num_layers=tuple(sizes["num_layers"]), num_units=sizes["num_units"],
        num_heads=sizes["num_heads"], ffn_inner_dim=sizes["ffn_inner_dim"],
        dropout=sizes["dropout"], attention_dropout=sizes["attention_dropout"],
        ffn_dropout=sizes["ffn_dropout"],
        ffn_activation={"relu": tf.nn.relu, "gelu": tf.nn.gelu}[sizes["activation"]],
        share_embeddings=getattr(opennmt.models.EmbeddingsSharingLevel,
                                 sizes["share_embeddings"]),
        pre_norm=sizes["pre_norm"], output_layer_bias=sizes["output_layer_bias"])

    record = {"start": None, "evaluations": [], "windows": []}
    call, steps = training.Trainer.__call__, training.Trainer._steps

    def timed_call(self, *a, **k):  # the training loop's start: minute 0
        record["start"] = time.time()
        summary = call(self, *a, **k)
        record["steps"] = int(self._optimizer.iterations.numpy())
        record["params"] = int(sum(v.shape.num_elements()
                                   for v in self._model.trainable_variables))
        return summary

    profiled = profile_window(
        args, {"log_every": settings["config"]["train"]["save_summary_steps"]})
    profile_dir = Path(args.work_dir) / "onmt_profile"

    def profiler(done):  # the profiler's state after `done` steps: on within the window
        if profiled and done == profiled[0] - 1:
            tf.profiler.experimental.start(str(profile_dir))
        if profiled and done == profiled[1]:
            tf.profiler.experimental.stop()

    def limited_steps(self, dataset, *a, **k):  # ends the loop after --minutes: OpenNMT-tf
        if profiled:  # then saves and evaluates a last time
            record["batches"] = onmt_batch_stats(self._finalize_dataset(dataset))
        profiler(0)
        done = 0
        try:
            for done, loss in enumerate(steps(self, dataset, *a, **k), start=1):
                yield loss
                profiler(done)
                if time.time() - record["start"] >= deadline:
                    return
        finally:
            if profiled and profiled[0] - 1 <= done < profiled[1]:
                tf.profiler.experimental.stop()  # the run ended inside the window

    evaluate = evaluation.Evaluator.__call__

    def timed_evaluate(self, step):
        results = evaluate(self, step)
        record["evaluations"].append({
            "label": f"step {int(step)}", "step": int(step),
            "minutes": (time.time() - record["start"]) / 60.0,
            "loss": float(results["loss"]),
            "predictions": os.path.join(self.predictions_dir, f"predictions.txt.{int(step)}")})
        return results

    summary = training.TrainingStats.get_last_summary

    def recorded_summary(self):
        values = summary(self)
        if "target" in values["words_per_sec"]:
            record["windows"].append((int(values["step"]), values["words_per_sec"]["target"],
                                      time.time() - record["start"]))
        return values

    training.Trainer.__call__, training.Trainer._steps = timed_call, limited_steps
    evaluation.Evaluator.__call__ = timed_evaluate
    training.TrainingStats.get_last_summary = recorded_summary

    shutil.rmtree(profile_dir, ignore_errors=True)
    runner = opennmt.Runner(model, settings["config"], auto_config=False)
    runner.train(with_eval=True)
    profile = None
    if profiled:
        found = sorted(profile_dir.rglob("*.xplane.pb"))
        profile = {"xplane": str(found[-1]) if found else None, "steps": args.profile_steps,
                   "batches": record.get("batches")}
    # get_last_summary is also called for the final log, whose window ends at the loop's end
    # (after a checkpoint or an evaluation, which reset it): only the regular reports count.
    window_steps = settings["config"]["train"]["save_summary_steps"]
    regular = [w for w in record["windows"] if w[0] % window_steps == 0]
    windows = list({step: rate for step, rate, _ in regular}.items())
    ends = {step: seconds for step, _, seconds in reversed(regular)}  # a step's first report
    return {"side": "onmt", **warm_rates(windows), "window_steps": window_steps,
            "profile": profile,
            "startup": startup(list(ends.items()), settings["config"]["eval"]["steps"]),
            "precision": tf.keras.mixed_precision.global_policy().name,
            "steps": record["steps"], "params": record["params"],
            "model": f"{sizes['num_layers'][0]}+{sizes['num_layers'][1]} layers, d_model "
                     f"{sizes['num_units']}, {sizes['num_heads']} heads, FFN "
                     f"{sizes['ffn_inner_dim']}, {'pre' if sizes['pre_norm'] else 'post'}-norm,"
                     f" shared embeddings {sizes['share_embeddings'].lower()}",
            "versions": f"opennmt-tf {opennmt.__version__}, tensorflow {tf.__version__}",
            "evaluations": record["evaluations"]}


def onmt_batch_stats(dataset, count: int = 200) -> dict:
    """`batch_stats` of OpenNMT-tf's first `count` training batches (`dataset`, its trainer's;
    targets: `ids_out`, with </s>; sources: its features, without <s> or </s>)."""
    return batch_stats((labels["length"].numpy().tolist(), int(labels["ids_out"].shape[1]),
                        features["length"].numpy().tolist(), int(features["ids"].shape[1]))
                       for features, labels in dataset.take(count))


def score_onmt(result: dict, manifest: dict, references: list[str]) -> None:
    """Adds "bleu" to every OpenNMT-tf evaluation: its predictions detokenized with the
    SentencePiece model, cased sacreBLEU against `references` (what `evaluation.score` and so
    `ValidationBleu` compute)."""
    import sacrebleu
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=manifest["sentencepiece_model"])
    for entry in result["evaluations"]:
        lines = Path(entry["predictions"]).read_text(encoding="utf-8").splitlines()
        hypotheses = [decode_pieces(line, processor) for line in lines]
        if len(hypotheses) != len(references):
            raise SystemExit(f"opennmt.py: {entry['predictions']} has {len(hypotheses)} lines "
                             f"for {len(references)} references")
        entry["bleu"] = sacrebleu.metrics.BLEU().corpus_score(hypotheses, [references]).score


# ----------------------------------------------------------------------------- the comparison

class Evaluation(NamedTuple):
    minutes: float  # training minutes when the BLEU was known
    bleu: float
    label: str = ""


def minute_marks(curves: dict[str, list[Evaluation]], minutes: float) -> list[dict]:
    """Per minute mark m = 1, 2, ... up to `minutes`: each side's last evaluation that had
    finished at or before minute m, as {"minute": m, SIDE: Evaluation, ...}. Marks where a side
    has not evaluated yet are left out: only marks that every side evaluated are compared."""
    ordered = {side: sorted(points) for side, points in curves.items()}
    marks = []
    for minute in range(1, int(math.floor(minutes + 1e-9)) + 1):
        row = {"minute": minute}
        for side, points in ordered.items():
            index = bisect.bisect_right([p.minutes for p in points], minute) - 1
            if index < 0:
                break
            row[side] = points[index]
        else:
            marks.append(row)
    return marks


def evaluations(result: dict) -> list[Evaluation]:
    return [Evaluation(e["minutes"], e["bleu"], e["label"]) for e in result["evaluations"]]


def report(ours_runs: list[dict], onmt: dict, minutes: float, manifest: dict) -> str:
    """The comparison as printed: throughput of every run, then each of ours against
    OpenNMT-tf's BLEU curve."""
    def rate(result):
        value = result["target_tokens_per_second"]
        if value is None:
            return "no throughput window"
        count = result["windows"]
        windows = (f"median of {count} window{'s' if count > 1 else ''} of "
                   f"{result['window_steps']} steps after the first" if result["warm"] else
                   "ONE window, warm-up included: raise --max-steps or --minutes")
        return f"{value:,.0f} ({windows}, {result['precision']})"

    first = ours_runs[0]
    steps = ", ".join(f"ours {ours['precision']} {ours['steps']:,}" for ours in ours_runs)
    lines = [f"model: ours {first['model']}, {first['params']:,} parameters; OpenNMT-tf "
             f"{onmt['model']}, {onmt['params']:,} parameters",
             f"data: {manifest['train']['pairs']:,} training pairs, vocabulary "
             f"{manifest['vocab_size']:,} SentencePiece pieces; steps trained: {steps}, "
             f"OpenNMT-tf {onmt['steps']:,}",
             "target tokens/s after warm-up:"]
    lines += [f"  ours        {rate(ours)}" for ours in ours_runs]
    lines.append(f"  OpenNMT-tf  {rate(onmt)}")
    for ours in ours_runs:
        if ours["target_tokens_per_second"] and onmt["target_tokens_per_second"]:
            ratio = ours["target_tokens_per_second"] / onmt["target_tokens_per_second"]
            lines.append(f"  ours ({ours['precision']}) / OpenNMT-tf ({onmt['precision']}) = "
                         f"{ratio:.2f}x")
    lines += startup_lines([*((f"ours ({ours['precision']})", ours) for ours in ours_runs),
                            ("OpenNMT-tf", onmt)])
    for ours in ours_runs:
        lines += bleu_table(ours, onmt, minutes, manifest)
    return "\n".join(lines)


def startup_lines(runs: list[tuple[str, dict]]) -> list[str]:
    """Each run's `startup`, as printed."""
    lines = ["start-up: seconds from the training loop's start to a step's end, and beyond the "
             "side's steady pace (tracing, compilations, the input pipeline's start, a pass's "
             "last batches), before the first evaluation:"]
    width = max(len(name) for name, _ in runs)
    for name, result in runs:
        cost = result.get("startup")
        if not cost:
            lines.append(f"  {name:{width}}  fewer than 3 throughput windows before the first "
                         "evaluation")
            continue
        first, last = cost["first"], cost["last"]
        lines.append(f"  {name:{width}}  step {first['step']} at {first['seconds']:.1f} s "
                     f"({first['excess']:+.1f} s), step {last['step']} at "
                     f"{last['seconds']:.1f} s ({last['excess']:+.1f} s); pace "
                     f"{1000 * cost['pace']:.0f} ms a step")
    return lines


def bleu_table(ours: dict, onmt: dict, minutes: float, manifest: dict) -> list[str]:
    """Our run's validation BLEU against OpenNMT-tf's at each minute mark, and at the last
    evaluation of each, as printed lines."""
    lines = []
    curves = {"ours": evaluations(ours), "onmt": evaluations(onmt)}
    lines.append(f"validation BLEU, ours in {ours['precision']} (cased sacreBLEU, greedy, "
                 f"{manifest['validation']['pairs']:,} validation sentences detokenized with "
                 "SentencePiece), each side's last evaluation finished at or before minute m:")
    rows = [["minute", "ours", "at", "OpenNMT-tf", "at", "ahead"]]

    def cells(point):
        return [f"{point.bleu:.2f}", f"{point.label}, {point.minutes:.1f} min"]

    def ahead(a, b):
        return "ours" if a.bleu > b.bleu else "OpenNMT-tf" if b.bleu > a.bleu else "tie"

    marks = minute_marks(curves, minutes)
    for mark in marks:
        rows.append([str(mark["minute"]), *cells(mark["ours"]), *cells(mark["onmt"]),
                     ahead(mark["ours"], mark["onmt"])])
    last = {side: max(points, key=lambda p: p.minutes) for side, points in curves.items()
            if points}
    if len(last) == 2:
        rows.append(["last", *cells(last["ours"]), *cells(last["onmt"]),
                     ahead(last["ours"], last["onmt"])])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines += ["  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
              for row in rows]
    if not marks:
        lines.append("  (no minute mark that both sides evaluated: raise --minutes)")
    elif all(m["ours"].bleu > m["onmt"].bleu for m in marks):
        lines.append(f"  ours ahead at all {len(marks)} minute marks")
    else:
        behind = [str(m["minute"]) for m in marks if m["ours"].bleu <= m["onmt"].bleu]
        lines.append(f"  ours not ahead at minute(s) {', '.join(behind)}")
    return lines


def read_profile(result: dict) -> dict | None:
    """A side's profile as {"step_ms", "op_ms": {type: ms a step}, "op_count": {type: events a
    step}}, from its trace (`benchmarks/train.py`'s `op_times`), or None without one."""
    profile = result.get("profile") or {}
    if not profile.get("xplane"):
        return None
    sys.path.insert(0, str(HERE))
    from train import op_times  # noqa: E402

    counts = {}
    times = op_times(profile["xplane"], counts)
    steps = profile["steps"]
    return {"step_ms": 1000 * counts.pop("(span)") / steps,
            "op_ms": {kind: 1000 * seconds / steps for kind, seconds in times.items()},
            "op_count": {kind: count / steps for kind, count in counts.items()}}


def profile_report(ours: dict, onmt: dict, cores: int = 2, top: int = 14) -> str:
    """Both sides' batches and profiles side by side: per step, milliseconds (and the share of
    `cores` x the step's wall time) of each op group, then the op types that take the most
    time on either side, with their count per step."""
    sys.path.insert(0, str(HERE))
    from train import op_group  # noqa: E402

    lines = ["what a step holds (each side's own batching of the same training files, "
             "first 200 batches):",
             "  side        sentences  target tokens  target padding  source padding"]
    for name, result in (("ours", ours), ("OpenNMT-tf", onmt)):
        stats = (result.get("profile") or {}).get("batches")
        if stats:
            lines.append(f"  {name:10}  {stats['sentences']:9.1f}  {stats['target_tokens']:13.1f}"
                         f"  {100 * stats['target_padding']:13.1f}%"
                         f"  {100 * stats['source_padding']:13.1f}%")
    profiles = {"ours": read_profile(ours), "OpenNMT-tf": read_profile(onmt)}
    if None in profiles.values():
        missing = [name for name, profile in profiles.items() if profile is None]
        return "\n".join(lines + [f"  no profile from {', '.join(missing)}"])
    a, b = profiles["ours"], profiles["OpenNMT-tf"]
    lines.append(f"profile of {ours['profile']['steps']} steps a side: ours ({ours['precision']}) "
                 f"{a['step_ms']:.1f} ms a step, "
                 f"OpenNMT-tf {b['step_ms']:.1f} ms (wall time of the traced steps); ms a step "
                 f"and share of {cores} cores' capacity:")

    def groups(profile):
        totals = {}
        for kind, ms in profile["op_ms"].items():
            totals[op_group(kind)] = totals.get(op_group(kind), 0) + ms
        totals["no kernel (executor overhead, idle)"] = (
            cores * profile["step_ms"] - sum(totals.values()))
        return totals

    def cell(profile, ms):
        return f"{ms:8.1f} {100 * ms / (cores * profile['step_ms']):5.1f}%"

    ga, gb = groups(a), groups(b)
    lines.append(f"  {'group':36} {'ours':>14}  {'OpenNMT-tf':>14}  {'ours - OpenNMT-tf':>17}")
    for group in sorted(set(ga) | set(gb), key=lambda g: -max(ga.get(g, 0), gb.get(g, 0))):
        x, y = ga.get(group, 0.0), gb.get(group, 0.0)
        lines.append(f"  {group:36} {cell(a, x)}  {cell(b, y)}  {x - y:+13.1f} ms")
    lines.append(f"  top op types (ms a step, ops a step): {'ours':>20}  {'OpenNMT-tf':>20}")
    kinds = sorted(set(a["op_ms"]) | set(b["op_ms"]),
                   key=lambda k: -max(a["op_ms"].get(k, 0), b["op_ms"].get(k, 0)))[:top]
    for kind in kinds:
        lines.append(f"    {kind:36} {a['op_ms'].get(kind, 0):8.1f} "
                     f"{a['op_count'].get(kind, 0):7.1f} ops  {b['op_ms'].get(kind, 0):8.1f} "
                     f"{b['op_count'].get(kind, 0):7.1f} ops  ({op_group(kind)})")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the driver

def check_schedule(config) -> str | None:
    """Why the two sides could not follow one learning-rate schedule, or None. The OpenNMT-tf
    side is given the Noam schedule (ours is `train.decay: inverse_sqrt`); our linear decay
    ends at a step count that a time-bounded run does not have."""
    if config.train.decay != "inverse_sqrt":
        return (f"benchmarks/opennmt.py: train.decay={config.train.decay} has no OpenNMT-tf "
                "counterpart here; both sides follow the Noam schedule: add --set "
                "train.decay=inverse_sqrt")
    return None


def check_onmt_python(python: str) -> str | None:
    """None if `python` imports opennmt; otherwise the one line that says how to get it."""
    problem = None
    if not Path(python).is_file():
        problem = "not found"
    else:
        try:
            # -I: neither the current folder nor PYTHONPATH on sys.path, where `opennmt` could
            # be this script.
            probe = subprocess.run([python, "-I", "-c", "import opennmt"], capture_output=True,
                                   text=True, timeout=300, cwd=REPO,
                                   env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
            if probe.returncode:
                problem = "cannot import opennmt"
        except (OSError, subprocess.TimeoutExpired) as error:
            problem = f"does not run ({error})"
    if problem is None:
        return None
    return (f"opennmt.py: OpenNMT-tf {ONMT_VERSION} is needed, but {python} {problem}: make its "
            f"venv with `{VENV_COMMAND}` (docs/usage.md), then pass "
            f"--onmt-python ../onmt-venv/bin/python or set {ONMT_ENV}")


def _worker(python: str, stage: str, args, extra=(), name: str | None = None) -> dict:
    """Runs one stage in its own process (`python` this script --stage STAGE); returns the JSON
    it writes. Its output goes to ours, and to WORK/NAME.log (NAME: `name`, default STAGE)."""
    work = Path(args.work_dir)
    name = name or stage
    output = work / f"{name}.json"
    output.unlink(missing_ok=True)
    # The OpenNMT-tf worker runs isolated (-I): this script's folder is not on its sys.path, so
    # `import opennmt` finds OpenNMT-tf, not this file; nor are PYTHONPATH's packages.
    isolated = ["-I"] if stage == ONMT else []
    command = [python, *isolated, str(Path(__file__).resolve()), "--stage", stage,
               "--output", str(output), *args.forwarded, *extra]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    if stage != ONMT:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO),
                                                           os.environ.get("PYTHONPATH")]))
    with open(work / f"{name}.log", "w") as log:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, env=env, cwd=REPO)
        for line in process.stdout:
            log.write(line)
            if args.verbose:
                sys.stdout.write(f"  [{name}] {line}")
        process.wait()
    if process.returncode or not output.is_file():
        raise SystemExit(f"opennmt.py: the {name} stage failed (exit code "
                         f"{process.returncode}); its output is in {work / f'{name}.log'}")
    return json.loads(output.read_text())


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="opennmt.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(REPO / "experiments" / "demo.yaml"),
                        help="the experiment (recipe) YAML both sides train: model size, data, "
                             "batches, schedule (default experiments/demo.yaml)")
    parser.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                        help="config overrides, for both sides")
    parser.add_argument("--minutes", type=float, default=30.0,
                        help="wall-clock minutes of training per side (default 30)")
    parser.add_argument("--precisions", default="float32,auto",
                        help="comma-separated precisions our side trains in, one run each "
                             f"({', '.join(PRECISIONS)}; auto: this CPU's best, trained once "
                             "if that is float32; default float32,auto). Replaces the config's "
                             "train.precision")
    parser.add_argument("--onmt-python", default=os.environ.get(ONMT_ENV) or
                        str(DEFAULT_ONMT_PYTHON),
                        help=f"the OpenNMT-tf venv's python (default ${ONMT_ENV}, else "
                             "../onmt-venv/bin/python)")
    parser.add_argument("--work-dir", default=str(REPO / "runs" / "opennmt"),
                        help="vocabulary, encoded files, both runs (overwritten)")
    parser.add_argument("--vocab-dir", help="a built SentencePiece vocabulary to reuse "
                        "(keras-transformer build-vocab, or a run's vocab/)")
    parser.add_argument("--eval-steps", type=int, help="optimizer steps between evaluations "
                        "(default the recipe's train.steps_per_epoch)")
    parser.add_argument("--log-every", type=int, help="optimizer steps per throughput window "
                        "(default the recipe's train.log_every_steps)")
    parser.add_argument("--max-steps", type=int, help="stop each side after this many steps "
                        "(smoke runs)")
    parser.add_argument("--val-sentences", type=int,
                        help="evaluate on the first N validation sentences (default all)")
    parser.add_argument("--onmt-batch-size", type=int,
                        help="OpenNMT-tf's tokens per batch (default our data.tokens_per_batch; "
                             "its batching fills a step with more target tokens than ours: "
                             "--profile-steps shows both, to choose one that matches)")
    parser.add_argument("--profile-steps", type=int, default=0,
                        help="profile this many steps of each side and compare where their "
                             "time goes (default 0: no profile)")
    parser.add_argument("--profile-start", type=int,
                        help="the first profiled step (default: the third throughput window's "
                             "first step)")
    parser.add_argument("--verbose", action="store_true", help="show both sides' output")
    parser.add_argument("--stage", choices=("prepare", OURS, ONMT), help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    parser.add_argument("--precision", choices=PRECISIONS, help=argparse.SUPPRESS)  # a worker's
    args = parser.parse_args(argv)
    args.precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    unknown = [p for p in args.precisions if p not in PRECISIONS]
    if unknown or not args.precisions:
        parser.error(f"--precisions {','.join(unknown) or 'is empty'}: choose from "
                     f"{', '.join(PRECISIONS)}")
    if args.profile_steps < 0:
        parser.error("--profile-steps must be >= 0")
    for name in ("eval_steps", "log_every", "max_steps", "val_sentences", "profile_start",
                 "onmt_batch_size"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not args.minutes > 0:
        parser.error("--minutes must be > 0")
    args.work_dir = str(Path(args.work_dir).resolve())
    args.forwarded = ["--config", str(Path(args.config).resolve()), "--minutes",
                      str(args.minutes), "--work-dir", args.work_dir,
                      *[f"--set={s}" for s in args.set or []],
                      *[f"--{name.replace('_', '-')}={getattr(args, name)}"
                        for name in ("vocab_dir", "eval_steps", "log_every", "max_steps",
                                     "val_sentences", "profile_steps", "profile_start")
                        if getattr(args, name) is not None]]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.stage:  # a worker
        result = {"prepare": prepare, OURS: run_ours, ONMT: run_onmt}[args.stage](args)
        Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
        return 0
    problem = check_schedule(our_config(args)) or check_onmt_python(args.onmt_python)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    print(f"# benchmarks/opennmt.py: {args.minutes:g} minute{'s' if args.minutes != 1 else ''} "
          f"per side; work folder {work}",
          flush=True)
    print(f"command: {' '.join([Path(sys.argv[0]).name, *sys.argv[1:]])}", flush=True)
    manifest = _worker(sys.executable, "prepare", args)
    print(f"prepared: {manifest['train']['pairs']:,} training pairs "
          f"({manifest['train']['dropped']} left out), {manifest['validation']['pairs']:,} "
          f"validation, vocabulary {manifest['vocab_size']:,} ({manifest['vocab_dir']})",
          flush=True)
    config = our_config(args, manifest["vocab_dir"])
    settings = onmt_settings(config, manifest, schedule(config, args), work,
                             args.onmt_batch_size)
    settings_path = work / "onmt_settings.json"
    settings_path.write_text(json.dumps(settings, indent=2) + "\n")
    from keras_transformer.training.runner import cpu_has_native_bfloat16

    ours_runs = []
    for precision in our_precisions(args.precisions, cpu_has_native_bfloat16()):
        started = time.time()
        ours = _worker(sys.executable, OURS, args, [f"--precision={precision}"],
                       name=our_run_name(precision))
        print(f"ours ({ours['precision']}): done in {(time.time() - started) / 60:.1f} min, "
              f"{ours['steps']} steps", flush=True)
        ours_runs.append(ours)
    started = time.time()
    shutil.rmtree(work / ONMT, ignore_errors=True)  # OpenNMT-tf would resume its checkpoint
    onmt = _worker(args.onmt_python, ONMT, args, ["--settings", str(settings_path)])
    print(f"OpenNMT-tf ({onmt['versions']}): done in {(time.time() - started) / 60:.1f} min, "
          f"{onmt['steps']} steps", flush=True)
    references = (work / DATA / VAL_REF).read_text(encoding="utf-8").splitlines()
    score_onmt(onmt, manifest, references)
    (work / "result.json").write_text(json.dumps(
        {"argv": sys.argv, "manifest": manifest, "ours": ours_runs, "onmt": onmt},
        indent=2) + "\n")
    print(report(ours_runs, onmt, args.minutes, manifest), flush=True)
    if args.profile_steps:
        for ours in ours_runs:
            print(profile_report(ours, onmt), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
