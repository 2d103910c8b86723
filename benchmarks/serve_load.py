"""Load test of one exported SavedModel: concurrent clients, mixed and bad inputs, same answers.

    python benchmarks/serve_load.py --model saved_models/NAME/1 [--clients 4] [--seconds 30]
    python benchmarks/serve_load.py --run runs/NAME      # exported to a temp folder first

One process loads the SavedModel once, as a model server would. A pool of `--requests` requests
of 1 to `--max-batch` sentences is drawn from Multi30k test_2016_flickr ($KERAS_TRANSFORMER_DATA)
mixed with bad inputs (`BAD_INPUTS`: empty, whitespace-only, tabs, a 400-word sentence, U+FFFD,
emoji, a lone ".", a byte-order mark, invisible characters only, a decomposed umlaut). Every
request is first sent once to `serving_default` and once to `translate_greedy` by a single
client, in sequence: those are the reference answers, which must be sane (finite scores, valid
UTF-8, "" with score 0 for a source without words). Then `--clients`
threads send requests from the pool to both signatures, for `--seconds` or `--max-requests`
requests, whichever comes first (after a short concurrent warm-up).

It prints requests/s, sentences/s and latency p50/p99 of the load phase, and fails (exit code 1)
unless: no request raised, every answer equals the reference answer of its request and signature
(translations and scores bitwise; for an export with request batching, which decodes concurrent
requests together, translations exactly and scores to `SCORE_RTOL`), and resident memory after
the run is within `--memory-tolerance` (10%) of resident memory after the warm-up.

`--max-batch 1` sends one sentence a request, the load that request batching
(`keras-transformer export --batching`) is for.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import gzip
import math
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

SIGNATURE_NAMES = ("serving_default", "translate_greedy")
LONG_WORDS = 400
SCORE_RTOL = 1e-5  # scores of a batching export: the encoder packs a batch's tokens together
BAD_INPUTS = ("", "   ", "Ein\tMann\tfährt\tFahrrad.", "\ufffd", "🙂🐕 ☃ 🇩🇪", ".",
              "\ufeffEin Hund.", "\u200b\x00", "Ein Mann fa\u0308hrt.")
# (translations, scores) of one request: bytes per sentence, and the float32 scores' raw bytes
# so that equality is bitwise.
Answer = tuple  # (tuple[bytes, ...], bytes)
Signature = Callable[[Sequence[str]], Answer]


def _number(kind, minimum, name):
    """An argparse type: a finite `kind` (int or float) of at least `minimum` (clients 0, nan
    seconds or -1 intra-op threads ran and then failed, hung or aborted the process)."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {name}") from None
        if not math.isfinite(value) or value < minimum:
            raise argparse.ArgumentTypeError(f"{text}: must be a finite number >= {minimum:g}")
        return value
    return parse


POSITIVE_INT = _number(int, 1, "an integer")
COUNT = _number(int, 0, "an integer")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="exported SavedModel version folder")
    source.add_argument("--run", help="training run folder (exported to a temp folder)")
    parser.add_argument("--data-dir", default=os.environ.get("KERAS_TRANSFORMER_DATA"),
                        help="raw Multi30k folder (default: $KERAS_TRANSFORMER_DATA)")
    parser.add_argument("--source-lang", default="de")
    parser.add_argument("--clients", type=POSITIVE_INT, default=4,
                        help="client threads (default 4)")
    parser.add_argument("--seconds", type=_number(float, 0.001, "a number"), default=30.0,
                        help="load phase length")
    parser.add_argument("--max-requests", type=POSITIVE_INT, default=2000,
                        help="the load phase also ends after this many requests")
    parser.add_argument("--requests", type=POSITIVE_INT, default=24,
                        help="distinct requests in the pool (each answered once in sequence "
                             "first)")
    parser.add_argument("--max-batch", type=POSITIVE_INT, default=64,
                        help="most sentences per request")
    parser.add_argument("--memory-tolerance", type=_number(float, 0, "a number"), default=0.10)
    parser.add_argument("--seed", type=COUNT, default=0)
    parser.add_argument("--intra-op", type=COUNT, default=0,
                        help="tf.config.threading intra-op threads (0: TensorFlow's default)")
    return parser.parse_args(argv)


# ----------------------------------------------------------------------------- requests

def read_test_sentences(data_dir, lang: str) -> list[str]:
    """The Multi30k test_2016_flickr sentences of `lang`; exits naming the file if missing."""
    path = Path(data_dir or ".") / f"test_2016_flickr.{lang}.gz"
    if not data_dir or not path.is_file():
        sys.exit(f"serve_load.py: {path} not found: pass --data-dir or set "
                 "KERAS_TRANSFORMER_DATA to the raw Multi30k folder")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def bad_inputs(sentences: Sequence[str]) -> list[str]:
    """BAD_INPUTS plus a sentence of LONG_WORDS words (the test sentences' words, in turn)."""
    words = " ".join(sentences).split()
    return [*BAD_INPUTS, " ".join(words[i % len(words)] for i in range(LONG_WORDS))]


def make_requests(sentences: Sequence[str], count: int, *, max_batch: int = 64,
                  seed: int = 0) -> list[list[str]]:
    """`count` requests of 1 to `max_batch` sentences: test sentences with about one bad input
    in five among them. The first request holds every bad input, the others random ones."""
    rng = random.Random(seed)
    bad = bad_inputs(sentences)
    requests = [bad[:max_batch]]
    while len(requests) < count:
        size = rng.randint(1, max_batch)
        requests.append([rng.choice(bad) if rng.random() < 0.2 else rng.choice(sentences)
                         for _ in range(size)])
    return requests[:count]


# ----------------------------------------------------------------------------- the model

def load_signatures(model_dir) -> tuple[object, dict]:
    """(the loaded SavedModel, {name: batch of str -> Answer}) for SIGNATURE_NAMES. Keep the
    first alive as long as the functions are used (its variables go with it)."""
    from keras_transformer.export.savedmodel import load_translator

    loaded = load_translator(model_dir)
    return loaded, {name: _answering(loaded.signatures[name]) for name in SIGNATURE_NAMES}


def batches_requests(model_dir) -> bool:
    """Whether the export decodes concurrent requests together (its provenance says so)."""
    from keras_transformer.export.savedmodel import read_provenance

    try:
        return bool(read_provenance(model_dir).get("request_batching"))
    except FileNotFoundError:
        return False


def same_answer(answer: Answer, reference: Answer, exact_scores: bool = True) -> bool:
    """Equal translations, and scores bitwise equal or (`exact_scores` False) to SCORE_RTOL."""
    import numpy as np

    if exact_scores or answer[0] != reference[0]:
        return answer == reference
    return np.allclose(np.frombuffer(answer[1], np.float32),
                       np.frombuffer(reference[1], np.float32), rtol=SCORE_RTOL, atol=0)


def _answering(signature) -> Signature:
    import numpy as np
    import tensorflow as tf

    def call(batch: Sequence[str]) -> Answer:
        outputs = signature(source=tf.constant(list(batch), tf.string))
        scores = np.asarray(outputs["score"].numpy(), np.float32)
        return tuple(outputs["translation"].numpy().tolist()), scores.tobytes()

    return call


def export_run_to_temp(run_dir) -> Path:
    from keras_transformer.export.savedmodel import export_run

    return export_run(run_dir, Path(tempfile.mkdtemp(prefix="serve_load_")) / "model")


def reference_answers(signatures: Mapping[str, Signature],
                      requests: Sequence[Sequence[str]]) -> dict:
    """{(signature name, request index): Answer}, one request at a time from one client."""
    return {(name, index): call(request) for name, call in signatures.items()
            for index, request in enumerate(requests)}


def insane_answers(requests: Sequence[Sequence[str]], references: Mapping) -> list[str]:
    """What is wrong with the reference answers: a wrong count, a non-finite score, a
    translation that is not UTF-8, or a source without words (nothing left after
    `tokenizers.normalize_text`: whitespace, invisible characters) not answered "" with score 0."""
    import numpy as np
    import tensorflow as tf

    from keras_transformer.data.tokenizers import normalize_text

    sources = sorted({source for request in requests for source in request})
    normalized = normalize_text(tf.constant(sources, tf.string)).numpy() if sources else []
    no_words = {source for source, text in zip(sources, normalized) if not text}
    problems = []
    for (name, index), (translations, score_bytes) in references.items():
        scores = np.frombuffer(score_bytes, np.float32)
        request = requests[index]
        if len(translations) != len(request) or len(scores) != len(request):
            problems.append(f"{name} request {index}: {len(translations)} answers for "
                            f"{len(request)} sentences")
            continue
        for source, text, score in zip(request, translations, scores):
            try:
                text.decode("utf-8")
            except UnicodeDecodeError:
                problems.append(f"{name}: translation of {source[:40]!r} is not UTF-8")
            if not math.isfinite(score):
                problems.append(f"{name}: score {score} for {source[:40]!r}")
            if source in no_words and (text, float(score)) != (b"", 0.0):
                problems.append(f"{name}: {source!r} gave {text!r} with score {score}")
    return problems


# ----------------------------------------------------------------------------- load

@dataclasses.dataclass
class LoadResult:
    seconds: float  # wall time of the load phase
    latencies: list  # seconds per answered request
    sentences: int  # sentences in the answered requests
    errors: list  # "signature request N: Error: message", one per failed request
    mismatches: list  # "signature request N: ...", one per answer unlike its reference

    @property
    def requests(self) -> int:
        return len(self.latencies) + len(self.errors)

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        if not ordered:
            return float("nan")
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def run_load(signatures: Mapping[str, Signature], requests: Sequence[Sequence[str]],
             references: Mapping, *, clients: int, seconds: float, max_requests: int,
             seed: int = 0, exact_scores: bool = True) -> LoadResult:
    """`clients` threads each send random (request, signature) pairs of the pool, one at a
    time, until `seconds` have passed or `max_requests` were sent in all; every answer is
    compared with `references` (`same_answer`)."""
    lock = threading.Lock()
    sent = [0]
    latencies, errors, mismatches, sentences = [], [], [], [0]
    names = sorted(signatures)
    deadline = time.perf_counter() + seconds

    def client(number: int):
        rng = random.Random(seed * 1000 + number)
        while True:
            with lock:
                if sent[0] >= max_requests or time.perf_counter() >= deadline:
                    return
                sent[0] += 1
            name, index = rng.choice(names), rng.randrange(len(requests))
            label = f"{name} request {index}"
            start = time.perf_counter()
            try:
                answer = signatures[name](requests[index])
            except Exception as error:  # noqa: BLE001  every failure is counted and reported
                with lock:
                    errors.append(f"{label}: {type(error).__name__}: {error}"[:300])
                continue
            elapsed = time.perf_counter() - start
            with lock:
                latencies.append(elapsed)
                sentences[0] += len(requests[index])
                if not same_answer(answer, references[(name, index)], exact_scores):
                    mismatches.append(f"{label}: answer differs from the single-client one")

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return LoadResult(time.perf_counter() - start, latencies, sentences[0], errors, mismatches)


def resident_memory() -> int:
    """This process's resident set size in bytes (after a garbage collection)."""
    gc.collect()
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import psutil

    return psutil.Process().memory_info().rss


def failures(result: LoadResult, memory_warm: int, memory_after: int,
             tolerance: float = 0.10) -> list[str]:
    """Why the load test failed (empty: it passed)."""
    found = []
    if result.errors:
        found.append(f"{len(result.errors)} requests failed, first: {result.errors[0]}")
    if result.mismatches:
        found.append(f"{len(result.mismatches)} answers differ from the single-client answers, "
                     f"first: {result.mismatches[0]}")
    if not result.latencies:
        found.append("no request was answered")
    if memory_after > memory_warm * (1 + tolerance):
        found.append(f"resident memory grew from {memory_warm / 2**20:.0f} MB after warm-up to "
                     f"{memory_after / 2**20:.0f} MB after the run (more than "
                     f"{tolerance:.0%})")
    return found


def format_report(result: LoadResult, clients: int, memory_warm: int, memory_after: int) -> str:
    seconds = max(result.seconds, 1e-9)
    return "\n".join([
        f"{clients} clients, {result.seconds:.1f} s: {result.requests} requests "
        f"({result.sentences} sentences answered), {result.requests / seconds:.2f} requests/s, "
        f"{result.sentences / seconds:.1f} sentences/s",
        f"latency p50 {result.percentile(50) * 1000:.0f} ms, p99 "
        f"{result.percentile(99) * 1000:.0f} ms",
        f"errors {len(result.errors)}, answers unlike the single-client ones "
        f"{len(result.mismatches)}",
        f"resident memory {memory_warm / 2**20:.0f} MB after warm-up, "
        f"{memory_after / 2**20:.0f} MB after the run "
        f"({(memory_after - memory_warm) / memory_warm:+.1%})"])


def main(argv=None) -> int:
    args = parse_args(argv)
    import tensorflow as tf

    if args.intra_op:
        tf.config.threading.set_intra_op_parallelism_threads(args.intra_op)
    from keras_transformer.config import ConfigError
    from keras_transformer.data.text_io import first_line

    try:
        model_dir = export_run_to_temp(args.run) if args.run else Path(args.model)
        sentences = read_test_sentences(args.data_dir, args.source_lang)
        requests = make_requests(sentences, args.requests, max_batch=args.max_batch,
                                 seed=args.seed)
        loaded, signatures = load_signatures(model_dir)
        exact_scores = not batches_requests(model_dir)
    except (ConfigError, OSError) as error:  # a missing or damaged model or run
        raise SystemExit(f"serve_load.py: {first_line(error)}") from None
    print(f"serve_load: {model_dir}, {len(requests)} requests of "
          f"{sum(map(len, requests))} sentences, signatures {', '.join(SIGNATURE_NAMES)}, "
          f"{'no request batching' if exact_scores else 'request batching'}", flush=True)

    start = time.perf_counter()
    references = reference_answers(signatures, requests)
    print(f"single client, in sequence: {len(references)} answers in "
          f"{time.perf_counter() - start:.1f} s", flush=True)
    problems = insane_answers(requests, references)
    warm_up = run_load(signatures, requests, references, clients=args.clients,
                       seconds=args.seconds, max_requests=2 * args.clients, seed=args.seed + 1,
                       exact_scores=exact_scores)
    memory_warm = resident_memory()
    result = run_load(signatures, requests, references, clients=args.clients,
                      seconds=args.seconds, max_requests=args.max_requests, seed=args.seed,
                      exact_scores=exact_scores)
    memory_after = resident_memory()

    print(format_report(result, args.clients, memory_warm, memory_after))
    problems += failures(warm_up, memory_warm, memory_warm)
    problems += failures(result, memory_warm, memory_after, args.memory_tolerance)
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    print("serve_load: " + ("FAILED" if problems else "OK"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
