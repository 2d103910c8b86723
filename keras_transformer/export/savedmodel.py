"""Export: a `Translator` as a SavedModel in `saved_models/NAME/VERSION/` for TF Serving.

    export_run("runs/NAME", "saved_models/NAME")  # -> saved_models/NAME/1 (the next version)
    translator = load_translator("saved_models/NAME/1")
    translator.signatures["serving_default"](source=tf.constant(["Ein Hund."]))

The exported signatures are listed in `keras_transformer.decoding.translator`. With `batching`, each
runs behind a `BatchFunction` op (`RequestBatching`): concurrent calls are decoded together.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Sequence

import keras
import tensorflow as tf

from keras_transformer.config import (CTRANSLATE2_FORMAT, END_ID, EXPORT_FORMATS, PAD_ID,
                                      PROVENANCE_FILE, SAVEDMODEL_FORMAT, START_ID, UNK_ID,
                                      VOCABULARY_CHECKSUMS, ConfigError)
from keras_transformer.data.text_io import (changed_file, errno_of, file_sha256, first_line,
                                            partial_path, remove_dead_partials, rename_new,
                                            write_error)
from keras_transformer.data.text_normalization import NORMALIZATION
from keras_transformer.data.tokenizers import without_sentencepiece_info
from keras_transformer.decoding.translator import (SIGNATURES, Translator, signature_arguments,
                                                   signature_inputs, translator_from_run)
from keras_transformer.runs.files import check_writable_folder, process_lock
from keras_transformer.runs.folder import Run
from keras_transformer.training.fine_tuning import read_record

WARMUP_FILE = "tf_serving_warmup_requests"  # in assets.extra/, replayed by TF Serving on load
EXPORT_LOCK = ".export.lock"  # in a model folder, held by the export writing a version there
WARMUP_SENTENCES = ("Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "")
# The functions every export has had (later ones, such as translate_sampling, are newer).
LOADER_FUNCTIONS = ("translate_greedy", "translate_beam", "translate_nbest")


@dataclasses.dataclass(frozen=True)
class RequestBatching:
    """In-graph request batching: every signature runs behind a `BatchFunction` op, which
    gathers the sentences of concurrent calls (TF Serving requests, Python threads) into one
    decoding batch. A call never waits for others (no timeout): a batch takes what queued
    while the batch threads were busy. A call of more than `max_batch_size` sentences is split
    into batches of that size; one of more than `max_batch_size * max_enqueued_batches` (the
    queue's capacity) is refused.

    The translations do not depend on the company a request keeps; the scores may differ in the
    last float32 bits (the encoder packs the batch's tokens together).
    """

    num_batch_threads: int = 2  # batches decoded at once: the serving machine's cores
    max_batch_size: int = 64  # sentences
    max_enqueued_batches: int = 100

    def __post_init__(self):
        for field in dataclasses.fields(self):
            if getattr(self, field.name) < 1:
                raise ConfigError(f"batching {field.name}={getattr(self, field.name)}: must be "
                                  ">= 1")


class BatchingTranslator(tf.Module):
    """`translator`'s signature functions behind `BatchFunction` ops (`RequestBatching`), with
    the same names, inputs and outputs. Each gets a queue of its own, named after the
    signature and a random id of the export: `BatchFunction` ops of one name can share a queue
    in a process and then run each other's requests (without names, the export's greedy
    requests went through beam search); the id keeps two exports in one server apart too."""

    def __init__(self, translator: Translator, batching: RequestBatching):
        super().__init__()
        # What the batched functions capture is tracked, not the translator: the save would
        # trace its signature functions again and store them beside the batched ones.
        object.__setattr__(self, "translator", translator)
        self.source_tokenizer = translator.source_tokenizer
        self.target_tokenizer = translator.target_tokenizer
        self.translator_variables = list(translator.variables)
        export_id = uuid.uuid4().hex
        for name, function in translator.signatures().items():
            setattr(self, "__call__" if name == "serving_default" else name,
                    _batched(function.get_concrete_function(), signature_inputs(name),
                             batching, f"keras_transformer_{export_id}_{name}"))

    def signatures(self) -> dict:
        """The tf.functions to export, keyed by signature name, as `Translator`'s."""
        return {"serving_default": self.__call__,
                **{name: getattr(self, name) for name in SIGNATURES[1:]}}


def _batched(function, inputs: dict, batching: RequestBatching, queue: str):
    """A tf.function with `function`'s signature (`inputs`, each `[batch, ...]` ->
    {key: [batch, ...]}) that runs it through a `BatchFunction` op with the queue `queue`."""
    def run(*values):
        outputs = tf.raw_ops.BatchFunction(
            in_tensors=list(values), captured_tensors=function.captured_inputs, f=function,
            num_batch_threads=batching.num_batch_threads,
            # With splitting, max_batch_size bounds a call and the largest allowed size a
            # batch; every smaller size is allowed, so that no batch is padded.
            max_batch_size=batching.max_batch_size * batching.max_enqueued_batches,
            allowed_batch_sizes=list(range(1, batching.max_batch_size + 1)),
            enable_large_batch_splitting=True, batch_timeout_micros=0,
            max_enqueued_batches=batching.max_enqueued_batches, shared_name=queue,
            Tout=[output.dtype for output in function.outputs])
        # An empty call comes back as shape [0] whatever the output's rank (translate_nbest's
        # [batch, beam] too): the inner dimensions the signature fixes are restored.
        batch = tf.shape(values[0])[:1]
        outputs = [tf.reshape(output, tf.concat([batch, spec.shape[1:].as_list()], 0))
                   if spec.shape[1:].is_fully_defined() else output
                   for output, spec in zip(outputs, function.outputs)]
        return tf.nest.pack_sequence_as(function.structured_outputs, outputs)

    return tf.function(run, input_signature=list(inputs.values()), autograph=False)


def export_translator(translator: Translator, export_dir: str | os.PathLike, *,
                      warmup_sentences: Sequence[str] | None = WARMUP_SENTENCES,
                      provenance: dict | None = None,
                      batching: RequestBatching | None = None) -> Path:
    """Writes `translator` as a SavedModel at `export_dir` (which must not exist).

    The SavedModel holds the signatures listed in the module docstring, the tokenizer files as
    assets, and, when `tensorflow_serving_api` is importable and `warmup_sentences` is not None,
    a TF Serving warmup file (one request per signature), and `assets.extra/keras_transformer.json`:
    `provenance(translator)` updated with `provenance` (what `keras-transformer info --model`
    prints) and the SHA-256 of each vocabulary file in `assets/` (`VOCABULARY_CHECKSUMS`,
    which `load_translator` checks). It is written to a hidden sibling folder
    (`text_io.partial_path`, with the process id) and renamed at the end, so that TF Serving,
    which watches the parent folder, never sees a half-written version; a write that fails (a
    full disk: a one-line OSError) removes it, and what an export killed with -9 left there is
    removed first (`text_io.remove_dead_partials`). The weights are exported frozen
    (`Translator(frozen_weights=True)`):
    in the layout the decoding reads, prepared once here rather than at every request, and
    without a compiled model's optimizer state. With `batching`, concurrent calls of a signature
    are decoded together (`RequestBatching`).

    Returns:
        the export folder.
    """
    export_dir = Path(export_dir)
    if export_dir.exists():
        raise FileExistsError(f"{export_dir} already exists: choose another version")
    if not translator.frozen_weights:
        translator = Translator(translator.model, translator.source_tokenizer,
                                translator.target_tokenizer, translator.decode_config,
                                max_source_length=translator.max_source_length,
                                frozen_weights=True, case_folding=translator.case_folding)
    remove_dead_partials(export_dir.parent)
    partial = partial_path(export_dir)
    module = translator if batching is None else BatchingTranslator(translator, batching)
    record = {**translator_provenance(translator), "format": SAVEDMODEL_FORMAT,
              "request_batching": None if batching is None else dataclasses.asdict(batching),
              **(provenance or {})}
    try:
        export_dir.parent.mkdir(parents=True, exist_ok=True)
        tf.saved_model.save(module, str(partial), signatures=module.signatures())
        if warmup_sentences is not None:
            write_warmup_requests(partial, warmup_sentences, model_name=export_dir.parent.name)
        assets = sorted((partial / "assets").glob("*"))  # the tokenizers' vocabulary files
        record[VOCABULARY_CHECKSUMS] = {path.name: file_sha256(path) for path in assets}
        write_provenance(partial / "assets.extra", record)
        rename_new(partial, export_dir, "choose another version")
    except BaseException as error:
        shutil.rmtree(partial, ignore_errors=True)
        # A full disk or an unwritable folder (TensorFlow says so in an OpError): one line.
        if isinstance(error, (OSError, tf.errors.OpError)) and errno_of(error):
            raise write_error(export_dir, error) from None
        raise
    return export_dir


def translator_provenance(translator: Translator) -> dict:
    """What a serving team or a converter needs to know about an export without reading code:
    model config, tokenizer and vocabulary, what is done to a source before tokenizing, source
    markers, search settings and length rule, package versions."""
    import keras_transformer

    decode = translator.decode_config
    tokenizer = translator.source_tokenizer
    return {
        "model": dict(translator.model.get_config()["config"]),
        "tokenizer": type(tokenizer).__name__,
        "vocabulary_size": {"source": translator.source_tokenizer.vocab_size,
                            "target": translator.target_tokenizer.vocab_size},
        "source_normalization": NORMALIZATION,
        "source_markers": f"START (id {START_ID}) and END (id {END_ID}) around every source",
        "placeholders": ("numbers, web addresses and emoji of the source as <ph0>...<ph7>, "
                         "put back into the outputs (keras_transformer.data.placeholders)"
                         if translator.placeholders else "none"),
        "case_folding": ("a source in capitals or title case is lowercased and its "
                         "translation put back into that case (keras_transformer.data.casing)"
                         if translator.case_folding else "none"),
        "reserved_ids": {"pad": PAD_ID, "start": START_ID, "end": END_ID, "unk": UNK_ID},
        "search": {"serving_default": f"beam search, beam {decode.beam_size}",
                   "beam_size": decode.beam_size, "alpha": decode.alpha,
                   "length_penalty": "((5 + |Y|) / 6) ** alpha, |Y| counting END (GNMT)",
                   "stopping": f"{decode.stopping} ({translator.stopping_rule})",
                   "sampling_topk": decode.sampling_topk, "sampling_topp": decode.sampling_topp,
                   "sampling_temperature": decode.sampling_temperature,
                   "alignment_layer": decode.alignment_layer,
                   "no_repeat_ngram_size": decode.no_repeat_ngram_size,
                   "repetition_penalty": decode.repetition_penalty},
        "length_rule": (f"output <= source tokens (with START/END) + {decode.max_extra_length}, "
                        f"capped at {translator.model.config.max_positions} positions; sources "
                        f"truncated to {translator.max_source_length} tokens (END kept)"),
        "versions": {"keras_transformer": keras_transformer.__version__,
                     "tensorflow": tf.__version__, "keras": keras.__version__},
    }


def run_provenance(run_dir: str | os.PathLike, weights: str = "best") -> dict:
    """The run and weight file an export came from, with the file's SHA-256."""
    path = Run(run_dir).weights_path(weights)
    record = {"run": str(Path(run_dir)), "weights": weights, "weights_file": str(path),
              "weights_sha256": file_sha256(path)}
    init = read_record(run_dir)
    if init is not None:  # a fine-tuned run: what it started from
        record["init_from"] = init
    return record


def write_provenance(folder: str | os.PathLike, record: dict) -> Path:
    path = Path(folder) / PROVENANCE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, sort_keys=False) + "\n")
    return path


def read_provenance(export_dir: str | os.PathLike) -> dict:
    """The provenance record of a SavedModel or CTranslate2 export; FileNotFoundError naming
    the folder if it has none, ConfigError naming the file if it does not parse."""
    export_dir = Path(export_dir)
    for path in (export_dir / "assets.extra" / PROVENANCE_FILE, export_dir / PROVENANCE_FILE):
        if path.is_file():
            try:
                record = json.loads(path.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError) as error:  # JSONDecodeError is a ValueError
                raise ConfigError(f"{path}: not a JSON file ({error})") from None
            if not isinstance(record, dict):
                raise ConfigError(f"{path}: expected a JSON object, found "
                                  f"{type(record).__name__}")
            return record
    raise FileNotFoundError(f"{export_dir}: no {PROVENANCE_FILE} (not an export of "
                            "keras-transformer, or one made before it recorded provenance)")


def write_warmup_requests(export_dir: str | os.PathLike, sentences: Sequence[str], *,
                          model_name: str = "translator") -> Path | None:
    """Writes `assets.extra/tf_serving_warmup_requests`: one PredictRequest per signature.

    TF Serving replays these before it serves a version, so the first real request does not pay
    for loading the tokenizers and tracing. Returns None, writing nothing, when
    tensorflow-serving-api is not installed (an optional extra).
    """
    try:
        from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2
    except ImportError:
        return None
    path = Path(export_dir) / "assets.extra" / WARMUP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for signature in SIGNATURES:
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(name=model_name, signature_name=signature))
            for name, value in signature_arguments(signature, sentences).items():
                request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
            log = prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())
    return path


def next_version(model_root: str | os.PathLike) -> int:
    """1 + the highest numbered version folder in `model_root` (1 if there is none)."""
    root = Path(model_root)
    versions = [int(p.name) for p in root.iterdir() if p.is_dir() and p.name.isdigit()] if (
        root.is_dir()) else []
    return max(versions, default=0) + 1


def export_run(run_dir: str | os.PathLike, model_root: str | os.PathLike, *,
               version: int | None = None, format: str = SAVEDMODEL_FORMAT,
               quantization: str = "float32", batching: RequestBatching | None = None,
               **translator_args) -> Path:
    """Exports a training run: a SavedModel to `model_root/<version>/` (default: the next free
    version; `batching`: see `RequestBatching`), or with `format="ctranslate2"` a CTranslate2
    model folder at `model_root` itself (`quantization` float32, int8, bfloat16, ...).

    `translator_args` go to `translator_from_run` (weights, beam_size, alpha, case_folding).
    A `model_root` that cannot be written, or an existing version, is refused before the model
    is loaded.
    """
    if format not in EXPORT_FORMATS:
        raise ConfigError(f"--format {format}: not one of {', '.join(EXPORT_FORMATS)}")
    if version is not None and version < 1:
        raise ConfigError(f"--version {version}: TF Serving versions are positive integers")
    if format == CTRANSLATE2_FORMAT:
        if batching is not None:
            raise ConfigError("--batching is for SavedModel exports; CTranslate2 batches the "
                              "sentences of one call")
        return _export_run_ctranslate2(run_dir, model_root, quantization, **translator_args)
    if quantization != "float32":
        raise ConfigError(f"--quantization {quantization} is for --format ctranslate2; a "
                          "SavedModel keeps the run's float32 weights")
    check_writable_folder(model_root, "export folder")
    root = Path(model_root)
    if version is not None and (root / str(version)).exists():
        raise FileExistsError(f"{root / str(version)} already exists: choose another version")
    # The run is loaded (and refused, if it must be) before the model folder is made.
    translator = translator_from_run(run_dir, **translator_args)
    root.mkdir(parents=True, exist_ok=True)
    # One export into a model folder at a time: a second waits, then takes the next version
    # (both took the first free one, and one failed when the other's was renamed into place).
    with process_lock(root / EXPORT_LOCK, lambda holder: (
            f"{root}: process {holder} is exporting a version there; waiting for it to end"),
            wait=True, remove=True):
        version = next_version(root) if version is None else version
        return export_translator(
            translator, root / str(version), batching=batching,
            provenance=run_provenance(run_dir, translator_args.get("weights", "best")))


def _export_run_ctranslate2(run_dir, output_dir, quantization, **translator_args) -> Path:
    try:
        from keras_transformer.export.ctranslate2 import export_ctranslate2
    except ImportError as error:
        raise ConfigError(f"--format ctranslate2 needs the ctranslate2 package ({error}); "
                          "pip install 'keras-transformer[ctranslate2]'") from None
    output_dir = Path(output_dir)
    if output_dir.exists():
        raise FileExistsError(f"{output_dir} already exists: choose a new --output")
    translator = translator_from_run(run_dir, **translator_args)
    provenance = {**translator_provenance(translator), "format": CTRANSLATE2_FORMAT,
                  **run_provenance(run_dir, translator_args.get("weights", "best"))}
    for key in ("search", "case_folding"):  # the settings file states these itself
        provenance.pop(key)
    return export_ctranslate2(translator.model, translator.source_tokenizer,
                              translator.target_tokenizer, translator.decode_config, output_dir,
                              quantization=quantization, provenance=provenance,
                              max_source_length=translator.max_source_length,
                              case_folding=translator.case_folding)


def load_any(export_dir: str | os.PathLike, **ctranslate2_args):
    """A SavedModel (`load_translator`) or a CTranslate2 export (`CTranslate2Translator`),
    whichever `export_dir` holds; both have `translate_greedy`, `translate_beam` and
    `translate_nbest` taking a batch of strings."""
    export_dir = Path(export_dir)
    if (export_dir / "model.bin").is_file():
        from keras_transformer.export.ctranslate2_runtime import CTranslate2Translator

        return CTranslate2Translator(export_dir, **ctranslate2_args)
    if not (export_dir / "saved_model.pb").is_file():
        raise FileNotFoundError(f"{export_dir} is neither a SavedModel (no saved_model.pb) nor "
                                "a CTranslate2 model (no model.bin): pass a version folder such "
                                "as saved_models/NAME/1, or a CTranslate2 export folder")
    return load_translator(export_dir)


def load_translator(export_dir: str | os.PathLike):
    """Loads an exported translator (its signatures are `.signatures[name]`, its functions
    `translate_greedy` etc.); registers the tf-text ops first, as every loader must.

    ConfigError, before loading, if a vocabulary file in `assets/` differs from the SHA-256 its
    export recorded (`check_vocabulary`); exports made before that record load unchecked."""
    import tensorflow_text  # noqa: F401  (registers the tokenizer ops)

    export_dir = Path(export_dir)
    if not (export_dir / "saved_model.pb").is_file():
        raise FileNotFoundError(f"{export_dir} is not a SavedModel (no saved_model.pb): pass a "
                                "version folder such as saved_models/NAME/1")
    check_vocabulary(export_dir)
    try:
        with without_sentencepiece_info():
            module = tf.saved_model.load(str(export_dir))
    except (tf.errors.OpError, OSError, ValueError, KeyError, IndexError, RuntimeError) as error:
        raise ConfigError(f"{export_dir}: the SavedModel does not load, damaged? "
                          f"({type(error).__name__}: {first_line(error)})") from error
    missing = [name for name in LOADER_FUNCTIONS if not hasattr(module, name)]
    if missing:
        raise ConfigError(f"{export_dir}: a SavedModel without {', '.join(missing)}: not an "
                          "export of keras-transformer")
    return module


def check_vocabulary(export_dir: str | os.PathLike) -> None:
    """ConfigError naming the file if a vocabulary file in the SavedModel's `assets/` is
    missing or differs from the SHA-256 recorded when it was exported. A WordPiece graph reads
    its vocabulary from there when it loads (another vocabulary of the same size translates
    into other words); a SentencePiece graph holds a copy of its model, and the file is what
    anyone else reads as the export's vocabulary. Exports without the record (made before it,
    or not by this package) are not checked."""
    export_dir = Path(export_dir)
    record_file = export_dir / "assets.extra" / PROVENANCE_FILE
    if not record_file.is_file():
        return
    recorded = read_provenance(export_dir).get(VOCABULARY_CHECKSUMS)
    if recorded is None:
        return
    if not (isinstance(recorded, dict) and all(isinstance(v, str) for v in recorded.values())):
        raise ConfigError(f"{record_file}: {VOCABULARY_CHECKSUMS} is not a mapping of file "
                          "names to SHA-256s (damaged?)")
    changed = changed_file(export_dir / "assets", recorded)
    if changed is not None and not (export_dir / "assets" / changed).is_file():
        raise ConfigError(f"{export_dir}: no assets/{changed}, a vocabulary file it was exported "
                          "with (damaged?); export the run again")
    if changed is not None:
        raise ConfigError(f"{export_dir / 'assets' / changed} differs from the SHA-256 recorded "
                          f"in assets.extra/{PROVENANCE_FILE} when it was exported (not the "
                          "vocabulary the model was trained with); export the run again")
