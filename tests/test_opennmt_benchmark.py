"""`benchmarks/opennmt.py` without OpenNMT-tf: the one line and exit code 2 when its venv is
missing, the SentencePiece-encoded files and vocabulary it gives OpenNMT-tf, the alignment of
the two sides' BLEU at minute marks, and the model mapping from our recipe."""

import importlib.util
import sys
from pathlib import Path

import pytest
import sentencepiece

from keras_transformer.config import REPO_ROOT, ExperimentConfig
from helpers import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("opennmt")


def test_missing_venv_says_how_to_make_it_in_one_line_and_exits_2(bench, tmp_path, capsys):
    work = tmp_path / "work"
    assert bench.main(["--onmt-python", str(tmp_path / "missing" / "python"),
                       "--work-dir", str(work)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and "not found" in err
    assert bench.VENV_COMMAND in err and "tensorflow-cpu==2.13.1 opennmt-tf==2.32.0" in err
    assert not work.exists()  # nothing ran


@pytest.mark.skipif(importlib.util.find_spec("opennmt") is not None,
                    reason="this venv has OpenNMT-tf")
def test_a_python_without_opennmt_is_refused_the_same_way(bench, tmp_path, capsys):
    assert bench.main(["--onmt-python", sys.executable, "--work-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot import opennmt" in err and bench.VENV_COMMAND in err


def test_a_linear_decay_is_refused_in_one_line_before_anything_runs(bench, tmp_path, capsys):
    work = tmp_path / "work"
    assert bench.main(["--config", str(REPO_ROOT / "experiments" / "multi30k_de_en_30min.yaml"),
                       "--onmt-python", sys.executable, "--work-dir", str(work)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "train.decay=linear" in err and "--set train.decay=inverse_sqrt" in err
    assert not work.exists()


PAIRS = [("Ein Mann fährt Fahrrad.", "A man rides a bike."),
         ("Zwei Hunde spielen im Schnee.", "Two dogs play in the snow."),
         ("", "An empty source."),
         ("Eine Frau liest ein Buch im Park.", "A woman reads a book in the park."),
         ("Kinder laufen über die Straße! " * 6, "Children run across the street! " * 6),
         ("Der Mann's Hut ist rot.", "The man's hat is red.")]


@pytest.fixture(scope="module")
def processor(tmp_path_factory):
    """A tiny SentencePiece model with `tokenizers.train_sentencepiece`'s reserved ids and byte
    fallback (trained directly, without TensorFlow)."""
    prefix = tmp_path_factory.mktemp("sp") / "tiny"
    sentences = [text for pair in PAIRS for text in pair if text] * 4
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_prefix=str(prefix), model_type="unigram",
        vocab_size=400, hard_vocab_limit=False, pad_id=0, bos_id=1, eos_id=2, unk_id=3,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        byte_fallback=True, minloglevel=2)
    return sentencepiece.SentencePieceProcessor(model_file=f"{prefix}.model")


def test_export_writes_the_pieces_of_kept_pairs_that_decode_to_the_text(bench, processor,
                                                                        tmp_path):
    paths = [tmp_path / name for name in ("src", "tgt", "ref")]
    longest = max(len(processor.encode(t)) for pair in PAIRS[:4] + PAIRS[5:] for t in pair)
    counts = bench.export_pairs(PAIRS, processor, *paths, max_pair_length=longest + 2)
    kept = [PAIRS[i] for i in (0, 1, 3, 5)]  # not the empty source nor the long pair
    assert counts == {"pairs": 4, "dropped": 2}
    sources, targets, references = (p.read_text(encoding="utf-8").splitlines() for p in paths)
    assert references == [target for _, target in kept]
    for lines, texts in ((sources, [s for s, _ in kept]), (targets, [t for _, t in kept])):
        assert [line.split() for line in lines] == [processor.encode(t, out_type=str)
                                                    for t in texts]
        assert [bench.decode_pieces(line, processor) for line in lines] == texts


def test_validation_export_keeps_every_pair(bench, processor, tmp_path):
    paths = [tmp_path / name for name in ("src", "tgt")]
    assert bench.export_pairs(PAIRS, processor, *paths) == {"pairs": len(PAIRS), "dropped": 0}
    assert len(paths[0].read_text(encoding="utf-8").splitlines()) == len(PAIRS)


def test_vocabulary_puts_opennmt_specials_first_then_the_pieces(bench, processor, tmp_path):
    path = tmp_path / "vocabulary.txt"
    lines_written = bench.write_vocabulary(processor, path)
    lines = path.read_text(encoding="utf-8").split("\n")
    assert lines[-1] == "" and lines_written == len(lines) - 1
    lines = lines[:-1]
    assert lines[:3] == ["<blank>", "<s>", "</s>"]
    size = processor.get_piece_size()
    assert lines[3:] == [processor.id_to_piece(i) for i in range(4, size)]
    assert len(lines) + 1 == size  # with OpenNMT-tf's <unk>: the model's vocabulary size
    assert len(set(lines)) == len(lines)
    encoded = tmp_path / "src"
    bench.export_pairs(PAIRS, processor, encoded, tmp_path / "tgt")
    assert set(encoded.read_text(encoding="utf-8").split()) <= set(lines[3:])


def curve(bench, *points):
    return [bench.Evaluation(minutes, bleu, f"e{i}") for i, (minutes, bleu) in
            enumerate(points, 1)]


def test_minute_marks_take_each_sides_last_evaluation_at_or_before_the_mark(bench):
    ours = curve(bench, (0.8, 5.0), (1.9, 10.0), (3.0, 20.0), (4.6, 25.0))
    onmt = curve(bench, (1.5, 4.0), (3.2, 12.0))
    marks = bench.minute_marks({"ours": ours, "onmt": onmt}, 5)
    # Minute 1: OpenNMT-tf has not evaluated yet, so the mark is left out. An evaluation
    # exactly at the mark counts (ours at 3.0).
    assert [m["minute"] for m in marks] == [2, 3, 4, 5]
    assert [(m["ours"].bleu, m["onmt"].bleu) for m in marks] == [
        (10.0, 4.0), (20.0, 4.0), (20.0, 12.0), (25.0, 12.0)]
    assert bench.minute_marks({"ours": ours, "onmt": onmt}, 1.5) == []
    assert [m["minute"] for m in bench.minute_marks({"ours": ours[::-1], "onmt": onmt}, 2.99)] \
        == [2]  # unordered input, marks up to the whole minutes given


def test_warm_rates_leave_out_the_first_window(bench):
    assert bench.warm_rates([(50, 100.0), (100, 900.0), (150, 1000.0), (200, 2000.0)]) == {
        "target_tokens_per_second": 1000.0, "windows": 3, "warm": True}
    assert bench.warm_rates([(50, 100.0)])["warm"] is False
    assert bench.warm_rates([])["target_tokens_per_second"] is None


def test_batch_stats_count_what_a_step_holds(bench):
    # (target lengths, padded target length, source lengths, padded source length) per batch
    stats = bench.batch_stats([([3, 5], 5, [2, 4], 4), ([4], 8, [6], 6)])
    assert stats == {"batches": 2, "sentences": 1.5, "target_tokens": 6.0,
                     "target_padding": 1 - 12 / 18, "source_padding": 1 - 12 / 14}


def test_profile_window_starts_at_the_third_throughput_window(bench, tmp_path):
    plan = {"log_every": 25}
    args = bench.parse_args(["--work-dir", str(tmp_path), "--profile-steps", "10"])
    assert bench.profile_window(args, plan) == (51, 60)
    args = bench.parse_args(["--work-dir", str(tmp_path), "--profile-steps", "4",
                             "--profile-start", "7"])
    assert bench.profile_window(args, plan) == (7, 10)
    assert "--profile-steps=4" in args.forwarded and "--profile-start=7" in args.forwarded
    assert bench.profile_window(bench.parse_args(["--work-dir", str(tmp_path)]), plan) is None


def test_opennmt_gets_our_recipes_model_size_batches_and_schedule(bench, tmp_path):
    config = ExperimentConfig.from_yaml(REPO_ROOT / "experiments" / "demo.yaml")
    args = bench.parse_args(["--work-dir", str(tmp_path)])
    plan = bench.schedule(config, args)
    assert plan == {"eval_steps": 100, "log_every": 50, "max_steps": bench.FOREVER}
    settings = bench.onmt_settings(config, {}, plan, Path(args.work_dir))
    assert settings["model"] == {
        "num_layers": [4, 4], "num_units": 128, "num_heads": 8, "ffn_inner_dim": 512,
        "dropout": 0.1, "attention_dropout": 0.0, "ffn_dropout": 0.0, "activation": "relu",
        "share_embeddings": "ALL", "pre_norm": True, "output_layer_bias": False}
    params, train, run_eval = (settings["config"][k] for k in ("params", "train", "eval"))
    assert params["decay_params"] == {"model_dim": 128, "warmup_steps": 400}
    assert params["learning_rate"] == 0.68 and params["beam_width"] == 1
    assert (train["batch_size"], train["batch_type"]) == (4096, "tokens")
    assert run_eval["steps"] == train["save_checkpoints_steps"] == 100
    assert run_eval["save_eval_predictions"] is True


def test_our_precisions_resolve_auto_for_this_cpu_and_train_each_once(bench):
    assert bench.our_precisions(["float32", "auto"], native_bfloat16=True) == [
        "float32", "mixed_bfloat16"]
    assert bench.our_precisions(["float32", "auto"], native_bfloat16=False) == ["float32"]
    assert bench.our_precisions(["auto", "mixed_bfloat16", "float32"], True) == [
        "mixed_bfloat16", "float32"]


def test_precisions_are_checked_before_anything_runs(bench, tmp_path, capsys):
    assert bench.parse_args(["--work-dir", str(tmp_path)]).precisions == ["float32", "auto"]
    assert bench.parse_args(["--work-dir", str(tmp_path), "--precisions",
                             " mixed_bfloat16 ,float32"]).precisions == [
        "mixed_bfloat16", "float32"]
    with pytest.raises(SystemExit) as error:
        bench.parse_args(["--work-dir", str(tmp_path), "--precisions", "float32,bf16"])
    assert error.value.code == 2
    assert "--precisions bf16: choose from float32, mixed_bfloat16" in capsys.readouterr().err


def test_precision_override_reaches_our_config_after_the_users_sets(bench, tmp_path):
    args = bench.parse_args(["--work-dir", str(tmp_path), "--set", "train.precision=float32",
                             "--precision", "mixed_bfloat16"])
    assert bench.our_config(args).train.precision == "mixed_bfloat16"
    assert bench.our_run_name("mixed_bfloat16") == "ours_mixed_bfloat16"


def test_report_gives_each_of_our_precisions_its_ratio_and_bleu_table(bench):
    def run(precision, rate, steps, *points):
        return {"precision": precision, "target_tokens_per_second": rate, "windows": 4,
                "warm": True, "window_steps": 25, "steps": steps, "params": 1000,
                "model": "m", "evaluations": [{"label": f"e{i}", "minutes": m, "bleu": b}
                                              for i, (m, b) in enumerate(points, 1)]}
    ours = [run("float32", 1200.0, 300, (1.5, 3.0), (3.0, 9.0)),
            run("mixed_bfloat16", 1800.0, 450, (1.2, 5.0), (2.4, 11.0))]
    onmt = run("float32", 1000.0, 250, (1.8, 4.0), (3.5, 8.0))
    manifest = {"train": {"pairs": 10}, "validation": {"pairs": 5}, "vocab_size": 100}
    text = bench.report(ours, onmt, 4, manifest)
    assert "ours (float32) / OpenNMT-tf (float32) = 1.20x" in text
    assert "ours (mixed_bfloat16) / OpenNMT-tf (float32) = 1.80x" in text
    assert "steps trained: ours float32 300, ours mixed_bfloat16 450, OpenNMT-tf 250" in text
    tables = text.split("validation BLEU, ours in ")[1:]
    assert [t.split(" ")[0] for t in tables] == ["float32", "mixed_bfloat16"]
    # float32: minute 2 has 3.0 against 4.0 (behind); bf16: ahead at minutes 2, 3 and 4
    assert "ours not ahead at minute(s) 2" in tables[0]
    assert "ours ahead at all 3 minute marks" in tables[1]


def test_startup_is_the_excess_over_the_pace_before_the_first_evaluation(bench):
    # 20 s to step 25 (tracing), then 0.5 s a step, a 6 s compilation in (125, 150], an
    # evaluation after step 170: the window ending at 175 is left out.
    windows = [(25, 20.0), (50, 32.5), (75, 45.0), (100, 57.5), (125, 70.0), (150, 88.5),
               (175, 140.0)]
    cost = bench.startup(windows, before_step=170)
    assert cost["pace"] == 0.5
    assert cost["first"] == {"step": 25, "seconds": 20.0, "excess": 7.5}
    assert cost["last"] == {"step": 150, "seconds": 88.5, "excess": 13.5}
    assert bench.startup(windows[:2], before_step=170) is None
    lines = bench.startup_lines([("ours (float32)", {"startup": cost}), ("OpenNMT-tf", {})])
    assert lines[1].split() == ["ours", "(float32)", "step", "25", "at", "20.0", "s", "(+7.5",
                                "s),", "step", "150", "at", "88.5", "s", "(+13.5", "s);",
                                "pace", "500", "ms", "a", "step"]
    assert "fewer than 3 throughput windows" in lines[2]


def test_training_start_is_the_first_training_logs_first_event(tmp_path):
    import tensorflow as tf
    from helpers import load_benchmark as load

    curves = load("curves")
    assert curves.training_start(tmp_path) is None
    writer = tf.summary.create_file_writer(str(tmp_path / "logs" / "train"))
    with writer.as_default():
        tf.summary.scalar("epoch_loss", 1.0, step=0)
    writer.flush()
    files = [curves._read_log_file(p) for p in (tmp_path / "logs" / "train").glob("events*")]
    assert curves.training_start(tmp_path) == min(files[0].wall_times)
