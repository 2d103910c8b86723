"""Request batching in the export (`export.RequestBatching`): concurrent calls of a signature
go through one `BatchFunction` op and get the answers they get alone; calls larger than a
batch are split; two exports in one process keep their own queues; the CLI flag."""

import concurrent.futures
import dataclasses
import json

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import cli
from keras_transformer.config import ConfigError, DecodeConfig
from keras_transformer.export.savedmodel import (RequestBatching, export_translator, load_translator,
                                      read_provenance)
from keras_transformer.decoding.translator import SIGNATURES, Translator, signature_arguments
from helpers import graph_ops, load_benchmark, seeded_tiny_model

SENTENCES = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "", "Hallo",
             "Eine Frau liest ein Buch im Park.", "\u200b", "Kinder laufen über die Straße!",
             "Ein Hund rennt.", "Leute", "Der Mann's Hut ist rot.", "Ein Mädchen klettert."]
BATCHING = RequestBatching(num_batch_threads=2, max_batch_size=4)


@pytest.fixture(scope="module")
def translator(sentencepiece_tokenizers):
    """A pre-norm model with sharp outputs, so that translations and scores differ by source."""
    tokenizer = sentencepiece_tokenizers[0]
    model = seeded_tiny_model(tokenizer, seed=5, norm="pre", output_scale=3.0,
                              perturb_vectors=True)
    return Translator(model, tokenizer, tokenizer,
                      DecodeConfig(beam_size=2, alpha=0.6, max_extra_length=6))


@pytest.fixture(scope="module")
def exports(translator, tmp_path_factory):
    """(plain export, batching export) of the same translator, both loaded."""
    root = tmp_path_factory.mktemp("batching")
    plain = export_translator(translator, root / "plain" / "1", warmup_sentences=None)
    batching = export_translator(translator, root / "batching" / "1", warmup_sentences=None,
                                 batching=BATCHING)
    return (plain, load_translator(plain)), (batching, load_translator(batching))


def call(loaded, name, sentences):
    outputs = loaded.signatures[name](**signature_arguments(name, sentences))
    return {key: value.numpy() for key, value in outputs.items()}


def assert_same_answers(got: dict, want: dict, label: str):
    if "alignment" in want:
        assert got["alignment"].tolist() == want["alignment"].tolist(), label
        return
    if "tokens" in want:  # score
        assert got["tokens"].tolist() == want["tokens"].tolist(), label
        np.testing.assert_allclose(got["score"], want["score"], rtol=1e-5, err_msg=label)
        return
    texts = "translation" if "translation" in want else "translations"
    scores = "score" if "score" in want else "scores"
    assert got[texts].tolist() == want[texts].tolist(), label
    np.testing.assert_allclose(got[scores], want[scores], rtol=1e-5, err_msg=label)


def test_the_export_batches_every_signature_and_says_so(exports):
    (plain_dir, _), (batching_dir, _) = exports
    assert "BatchFunction" in graph_ops(batching_dir)
    assert "BatchFunction" not in graph_ops(plain_dir)
    # Each search stored once (greedy; beam, for its best, its n-best and a prefix; sampling;
    # score's forced decoding; align's attention), not again unbatched.
    assert load_benchmark("export").while_loop_count(batching_dir) == 5
    assert read_provenance(batching_dir)["request_batching"] == dataclasses.asdict(BATCHING)
    assert read_provenance(plain_dir)["request_batching"] is None


@pytest.mark.parametrize("name", SIGNATURES)
def test_concurrent_single_sentence_calls_get_their_own_answers(exports, name):
    """8 threads send one sentence a call, 4 rounds over the sentences: every answer is the
    plain export's for that sentence (translations equal, scores to float32 rounding)."""
    (_, plain), (_, batching) = exports
    alone = {s: call(plain, name, [s]) for s in SENTENCES}
    answer_key = next(key for key in ("translation", "translations", "score", "alignment")
                      if key in alone[SENTENCES[0]])
    texts = {tuple(np.asarray(a[answer_key]).reshape(-1)) for a in alone.values()}
    assert len(texts) > 3  # the model's answers differ by source, so a mix-up shows
    jobs = SENTENCES * 4
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda s: call(batching, name, [s]), jobs))
    for sentence, answer in zip(jobs, answers):
        assert_same_answers(answer, alone[sentence], f"{name} {sentence!r}")


def test_a_call_larger_than_a_batch_is_split(exports):
    (_, plain), (_, batching) = exports
    assert len(SENTENCES) > BATCHING.max_batch_size
    for name in SIGNATURES:
        assert_same_answers(call(batching, name, SENTENCES), call(plain, name, SENTENCES), name)
    assert call(batching, "translate_greedy", [])["translation"].shape == (0,)
    # An empty batch keeps the n-best width, as the plain export does (it was (0,)).
    empty = call(batching, "translate_nbest", [])
    assert empty["translations"].shape == empty["scores"].shape == (0, 2)
    assert call(plain, "translate_nbest", [])["scores"].shape == (0, 2)


def test_signatures_and_exports_keep_their_own_queues(translator, exports, tmp_path):
    """Greedy and n-best calls of two exports (beam 2 and beam 3) at once, one sentence each:
    every answer is its own signature's and export's (n-best widths, greedy scores)."""
    (_, plain), (_, first) = exports
    other = Translator(translator.model, translator.source_tokenizer,
                       translator.target_tokenizer, DecodeConfig(beam_size=3, max_extra_length=6))
    second = load_translator(export_translator(other, tmp_path / "b" / "1",
                                               warmup_sentences=None, batching=BATCHING))
    sentence = SENTENCES[:1]
    greedy = call(plain, "translate_greedy", sentence)
    jobs = [(first, "translate_nbest"), (second, "translate_nbest"), (first, "translate_greedy"),
            (second, "translate_greedy")] * 40
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda job: call(job[0], job[1], sentence), jobs))
    for (loaded, name), answer in zip(jobs, answers):
        if name == "translate_nbest":
            assert answer["scores"].shape == (1, 2 if loaded is first else 3)
        else:
            assert_same_answers(answer, greedy, "greedy")


def test_settings_out_of_range_are_refused():
    with pytest.raises(ConfigError, match="batching num_batch_threads=0: must be >= 1"):
        RequestBatching(num_batch_threads=0)


def test_cli_export_batching(random_run, tmp_path, capsys):
    models = tmp_path / "models"
    assert cli.main(["export", "--run", str(random_run), "--output", str(models),
                     "--batching", "3"]) == 0
    capsys.readouterr()
    assert cli.main(["info", "--model", str(models / "1")]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["request_batching"] == {"num_batch_threads": 3, "max_batch_size": 64,
                                          "max_enqueued_batches": 100}
    assert cli.main(["export", "--run", str(random_run), "--output", str(tmp_path / "ct2"),
                     "--format", "ctranslate2", "--batching", "2"]) == 2
    err = capsys.readouterr().err
    assert err.strip().endswith("--batching is for SavedModel exports; CTranslate2 batches the "
                                "sentences of one call") and len(err.splitlines()) == 1
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["export", "--run", str(random_run), "--output", str(models), "--batching",
                  "0"])
    assert exit_info.value.code == 2
