"""`benchmarks/serve_load.py` in short: a tiny exported model, 3 client threads for a few
seconds, the benchmark's own assertions; and that those assertions do fail."""

import numpy as np
import pytest

from helpers import load_benchmark


@pytest.fixture(scope="module")
def serve_load():
    return load_benchmark("serve_load")


def test_requests_mix_test_sentences_and_every_bad_input(serve_load):
    sentences = [f"Satz {i}." for i in range(50)]
    requests = serve_load.make_requests(sentences, 40, max_batch=64, seed=3)
    assert len(requests) == 40 and all(1 <= len(r) <= 64 for r in requests)
    assert requests[0] == serve_load.bad_inputs(sentences)
    assert len(requests[0][-1].split()) == serve_load.LONG_WORDS
    assert {"", "   ", "\ufffd", "."} <= set(requests[0])
    mixed = [s for r in requests[1:] for s in r]
    assert 0.1 < sum(s not in sentences for s in mixed) / len(mixed) < 0.3
    assert requests == serve_load.make_requests(sentences, 40, max_batch=64, seed=3)


def test_concurrent_clients_get_the_single_client_answers(serve_load, random_export, multi30k_dir,
                                                          capsys):
    code = serve_load.main(["--model", str(random_export), "--data-dir", str(multi30k_dir),
                            "--clients", "3", "--seconds", "3", "--requests", "6",
                            "--max-batch", "16"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "serve_load: OK" in out and "FAILED" not in err
    assert "errors 0, answers unlike the single-client ones 0" in out
    assert "requests/s" in out and "sentences/s" in out and "p99" in out


def answer(texts, scores):
    return tuple(texts), np.asarray(scores, np.float32).tobytes()


def test_errors_wrong_answers_and_memory_growth_fail(serve_load):
    requests = [["Hallo", ""], ["boom"]]
    good = answer([b"Hello", b""], [-1.5, 0.0])
    references = {("a", 0): good, ("a", 1): answer([b"x"], [-1.0])}

    def flaky(batch):
        if batch == ["boom"]:
            raise ValueError("kaputt")
        return answer([b"Hello", b""], [-1.5000001, 0.0])  # one ulp away: not equal

    result = serve_load.run_load({"a": flaky}, requests, references, clients=2, seconds=5,
                                 max_requests=20)
    assert result.requests == 20 and len(result.errors) + len(result.latencies) == 20
    assert result.errors and result.mismatches and len(result.mismatches) == len(result.latencies)
    problems = serve_load.failures(result, 1000, 1200)
    assert len(problems) == 3
    assert "requests failed, first: a request 1: ValueError: kaputt" in problems[0]
    assert "differ from the single-client answers" in problems[1]
    assert "resident memory grew" in problems[2]
    assert serve_load.failures(result, 1000, 1099) == problems[:2]

    assert serve_load.insane_answers(requests, references) == []
    insane = {("a", 0): answer([b"Hello", b"Hallucinated"], [-1.5, -2.0]),
              ("a", 1): answer([b"\xff"], [float("nan")])}
    assert len(serve_load.insane_answers(requests, insane)) == 3
    invisible = [["\u200b\x00", "Hallo"]]
    assert len(serve_load.insane_answers(
        invisible, {("a", 0): answer([b"Hallucinated", b"Hello"], [-2.0, -1.5])})) == 1
    assert serve_load.insane_answers(
        invisible, {("a", 0): answer([b"", b"Hello"], [0.0, -1.5])}) == []


def test_a_model_folder_that_is_no_export_is_one_line(serve_load, multi30k_dir, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        serve_load.main(["--model", str(tmp_path), "--data-dir", str(multi30k_dir)])
    assert str(exit_info.value.code) == (f"serve_load.py: {tmp_path} is not a SavedModel (no "
                                         "saved_model.pb): pass a version folder such as "
                                         "saved_models/NAME/1")


def test_same_answer_compares_scores_bitwise_or_to_rounding(serve_load):
    reference = answer([b"Hello", b""], [-1.5, 0.0])
    close = answer([b"Hello", b""], [-1.5000001, 0.0])
    assert not serve_load.same_answer(close, reference)
    assert serve_load.same_answer(close, reference, exact_scores=False)
    assert not serve_load.same_answer(answer([b"Hello", b""], [-1.51, 0.0]), reference,
                                      exact_scores=False)
    assert not serve_load.same_answer(answer([b"Hallo", b""], [-1.5, 0.0]), reference,
                                      exact_scores=False)


def test_one_sentence_requests_to_a_batching_export(serve_load, random_translation_model,
                                                    multi30k_dir, tmp_path, capsys):
    """Concurrent requests decoded together: the same translations, scores to rounding."""
    from keras_transformer.config import DecodeConfig
    from keras_transformer.export.savedmodel import RequestBatching, export_translator
    from keras_transformer.decoding.translator import Translator

    model, tokenizer = random_translation_model
    translator = Translator(model, tokenizer, tokenizer,
                            DecodeConfig(beam_size=2, max_extra_length=8))
    export = export_translator(translator, tmp_path / "batching" / "1", warmup_sentences=None,
                               batching=RequestBatching(num_batch_threads=2))
    code = serve_load.main(["--model", str(export), "--data-dir", str(multi30k_dir),
                            "--clients", "6", "--seconds", "3", "--requests", "12",
                            "--max-batch", "1"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "request batching" in out and "serve_load: OK" in out
    assert "errors 0, answers unlike the single-client ones 0" in out


@pytest.mark.parametrize("flag, value", [
    ("--clients", "0"), ("--clients", "-2"), ("--seconds", "nan"), ("--seconds", "-1"),
    ("--seconds", "inf"), ("--intra-op", "-1"), ("--requests", "0"), ("--max-batch", "0"),
    ("--max-requests", "-5"), ("--memory-tolerance", "nan"), ("--seed", "-1"),
    ("--clients", "two")])
def test_out_of_range_settings_are_refused_before_any_work(serve_load, flag, value, capsys):
    """--clients 0 and negative values ran and then failed, --intra-op -1 aborted the process
    (SIGABRT), --seconds nan hung."""
    with pytest.raises(SystemExit) as exit_info:
        serve_load.parse_args(["--model", "m", flag, value])
    assert exit_info.value.code == 2
    assert f"argument {flag}: " in capsys.readouterr().err
