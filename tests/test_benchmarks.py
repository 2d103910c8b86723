"""The arithmetic of the benchmark scripts: `benchmarks/train.py`'s FLOP count behind its MFU
figures and token-matched schedule behind its equal-token quality check, `benchmarks/decode.py`'s
helpers, and `benchmarks/export.py`'s medians."""

import time

import numpy as np
import pytest

from keras_transformer.config import ModelConfig
from keras_transformer.data.streams import BatchStats
from keras_transformer.training.schedules import TransformerSchedule
from helpers import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("train")


def stats(batches, target_tokens):
    return BatchStats(batches=batches, pairs=0, shapes=[], source_tokens=0,
                      target_tokens=target_tokens, padded_source_tokens=0,
                      padded_target_tokens=0, max_padded_tokens=0)


def test_flops_per_batch_counts_real_tokens_only(bench):
    config = ModelConfig(num_layers=1, d_model=4, num_heads=1, dff=8, source_vocab_size=10,
                         target_vocab_size=10)
    source = np.array([[5, 6, 7, 0]])  # 3 real tokens
    target = np.array([[5, 6, 0, 0]])  # 2 real tokens
    d, ff, vocab = 4, 8, 10
    encoder = 2 * (4 * d * d + 2 * d * ff) * 3 + 4 * d * 3 * 3
    decoder = 2 * (8 * d * d + 2 * d * ff) * 2 + 4 * d * 2 * 2 + 4 * d * 3 * 2
    forward = encoder + decoder + 2 * d * vocab * 2
    assert bench.flops_per_batch(config, source, target) == 3 * forward
    # More padding does not change the count.
    assert bench.flops_per_batch(config, np.pad(source, ((0, 0), (0, 5))),
                                 np.pad(target, ((0, 0), (0, 5)))) == 3 * forward


@pytest.mark.parametrize("rate_scaling, rate_ratio",
                         [("sqrt", 2.0), ("linear", 4.0), ("none", 1.0)])
def test_token_matched_schedule_scales_the_rate_per_token(bench, rate_scaling, rate_ratio):
    """Batches of 4x the reference's target tokens: warmup 4x shorter in steps; at every token
    count of the warmup the rate is sqrt(4) = 2x (sqrt), 4x (linear) or 1x (none) the
    reference's."""
    reference, larger = stats(100, 100 * 800), stats(25, 25 * 3200)
    assert bench.token_matched_schedule(4000, reference, reference, rate_scaling) == (4000, 1.0)
    warmup, scale = bench.token_matched_schedule(4000, reference, larger, rate_scaling)
    assert warmup == 1000
    reference_rate = TransformerSchedule(128, 4000)
    larger_rate = TransformerSchedule(128, warmup, scale=scale)
    for tokens in (80_000, 1_600_000, 3_200_000):  # reference steps 100, 2000, 4000
        ratio = float(larger_rate(tokens // 3200)) / float(reference_rate(tokens // 800))
        assert ratio == pytest.approx(rate_ratio, rel=1e-5)


def result(seed, tokens_per_second, validation_loss=None, quality_seconds=0):
    figures = {"seed": seed, "target_tokens_per_second": tokens_per_second}
    if validation_loss is not None:
        figures.update(validation_loss=validation_loss, quality_seconds=quality_seconds,
                       quality_tokens=0 if quality_seconds else 1000,
                       quality_target_tokens=int(tokens_per_second * (quality_seconds or 1)),
                       quality_warmup_steps=4000 if tokens_per_second < 2000 else 2000,
                       rate_scaling="sqrt")
    return figures


def test_compare_pairs_seeds_and_averages_the_gaps(bench):
    reference = [result(1, 1000, 4.0), result(2, 1000, 5.0)]
    best = [result(2, 3000, 5.5), result(1, 2000, 4.0)]  # out of order: paired by seed
    speed, losses, spread = bench.compare(reference, best)
    assert speed == "best / reference: 2.50x target tokens/s"
    assert "warmup 4000 / 2000 steps" in losses
    assert "seed 1: reference 4.0000, best 4.0000 (+0.00%)" in losses
    assert "seed 2: reference 5.0000, best 5.5000 (+10.00%)" in losses
    assert spread == "best - reference over 2 seeds: mean +5.00%, from +0.00% to +10.00%"


def test_compare_without_quality_or_common_seed(bench):
    assert bench.compare([result(1, 1000)], [result(1, 1500)]) == [
        "best / reference: 1.50x target tokens/s"]
    with pytest.raises(ValueError, match="reference and matched share no seed"):
        bench.compare([result(1, 1000)], [result(2, 1500)], "matched")


def test_compare_names_the_configuration(bench):
    lines = bench.compare([result(1, 1000, 4.0)], [result(1, 1900, 4.06)], "matched")
    assert lines[0] == "matched / reference: 1.90x target tokens/s"
    assert "seed 1: reference 4.0000, matched 4.0600 (+1.50%)" in lines[1]


def test_with_overrides_parses_values_and_names_bad_keys(bench):
    spec = bench.with_overrides(bench.CONFIGS["best"],
                                ["tokens_per_batch=1728", "jit_compile=true", "precision=float32",
                                 "rdrop_alpha=5"])
    assert spec == {**bench.CONFIGS["best"], "tokens_per_batch": 1728, "jit_compile": True,
                    "precision": "float32", "rdrop_alpha": 5}
    assert bench.CONFIGS["best"]["tokens_per_batch"] == 4096  # not modified in place
    with pytest.raises(ValueError, match="'bucket_setp=16'"):
        bench.with_overrides(bench.CONFIGS["best"], ["bucket_setp=16"])
    with pytest.raises(ValueError, match="KEY=VALUE"):
        bench.with_overrides(bench.CONFIGS["best"], ["bucket_step"])
    for name, spec in bench.CONFIGS.items():
        assert set(spec) <= set(bench.SETTINGS), name


def test_compare_also_gives_the_sentence_weighted_gap(bench):
    reference, matched = result(1, 1000, 4.0), result(1, 1900, 4.06)
    reference["sentence_weighted_validation_loss"] = 3.8
    matched["sentence_weighted_validation_loss"] = 3.99
    lines = bench.compare([reference], [matched], "matched")
    assert "seed 1: reference 4.0000, matched 4.0600 (+1.50%)" in lines[1]
    assert lines[2] == ("the same weighted by sentences (Keras's default, depends on the "
                        "batching): seed 1: reference 3.8000, matched 3.9900 (+5.00%)")


def test_ceilings_are_the_tokens_per_second_at_full_peak(bench):
    # 2,000 target tokens/s at 40 GFLOP/s of model FLOPs: 20 MFLOP a target token.
    result = {"target_tokens_per_second": 2000.0, "model_flops_per_second": 4e10}
    ceiling = bench.ceilings(result, {"float32": 1e11, "bfloat16": 2e11})
    assert ceiling == pytest.approx({"float32": 5000.0, "bfloat16": 10000.0})


def test_compare_at_equal_time_says_how_far_each_got(bench):
    lines = bench.compare([result(1, 1000, 4.0, quality_seconds=600)],
                          [result(1, 2000, 3.6, quality_seconds=600)])
    assert lines[1].startswith("validation loss after 600 s of training (warmup 4000 / 2000")
    assert lines[1].endswith("seed 1: reference 4.0000 (600,000 tokens), best 3.6000 "
                             "(1,200,000 tokens) (-10.00%)")


def test_budget_spent_by_tokens_or_by_time(bench):
    assert not bench.budget_spent(999, 10.0, max_tokens=1000, max_seconds=0)
    assert bench.budget_spent(1000, 10.0, max_tokens=1000, max_seconds=0)
    assert not bench.budget_spent(10**9, 59.9, max_tokens=0, max_seconds=60)
    assert bench.budget_spent(1, 60.0, max_tokens=0, max_seconds=60)


@pytest.mark.parametrize("op_type, group", [
    ("_MklEinsum", "matmul"), ("_MklNativeFusedMatMul", "matmul"), ("BatchMatMulV3", "matmul"),
    ("Cast", "cast"), ("StatelessRandomUniformFullIntV2", "dropout masks"),
    ("BiasAddGrad", "reduction"), ("BiasAdd", "element-wise"), ("ReluGrad", "element-wise"),
    ("ResourceApplyAdam", "Adam"), ("(XLA executable)", "XLA (the loss)"),
    ("(tf.data threads)", "input pipeline"), ("Unique", "other"),
    ("Maximum", "element-wise"), ("Minimum", "element-wise"), ("Max", "reduction"),
    ("UnsortedSegmentSum", "reduction"), ("ExpandDims", "other"), ("PaddedBatchV2", "other")])
def test_op_groups(bench, op_type, group):
    assert bench.op_group(op_type) == group


def test_profile_lines_are_shares_of_the_cores_capacity(bench):
    profile = {"steps": 4, "wall_ms": 100.0,
               "op_ms": {"_MklMatMul": 50.0, "Einsum": 30.0, "Cast": 20.0, "Mul": 10.0}}
    lines = bench.profile_lines(profile, cores=2, top=2)
    assert lines[0] == "profile of 4 steps: 100.0 ms a step, 200.0 ms of 2 cores' capacity"
    assert lines[1].split() == ["no", "kernel", "(executor", "overhead,", "idle)", "90.0", "ms",
                                "45.0%"]
    assert lines[2].split() == ["matmul", "80.0", "ms", "40.0%"]
    assert [line.split()[0] for line in lines[3:]] == ["cast", "element-wise", "top",
                                                       "_MklMatMul", "Einsum"]


def test_op_times_reads_a_real_profile_and_leaves_out_calls(bench, tmp_path):
    """A profiled tf.function of 20 large matmuls: their kernel time is most of the traced
    time, under the matmul type oneDNN or Eigen gives; the function's call op is not counted."""
    import tensorflow as tf

    a = tf.random.normal([512, 512])

    @tf.function
    def run(x):
        for _ in range(20):
            x = tf.matmul(x, a) * 1e-3
        return x

    run(a).numpy()
    tf.profiler.experimental.start(str(tmp_path))
    start = time.perf_counter()
    run(a).numpy()
    wall = time.perf_counter() - start
    tf.profiler.experimental.stop()
    (xplane,) = tmp_path.rglob("*.xplane.pb")
    times = bench.op_times(xplane)
    matmul = sum(seconds for kind, seconds in times.items() if bench.op_group(kind) == "matmul")
    assert 0.3 * wall < matmul <= wall
    assert not set(times) & set(bench.CONTAINER_OPS)
    assert {bench.op_group(kind) for kind in times} <= {"matmul", "element-wise", "other"}


@pytest.fixture(scope="module")
def decode_bench():
    return load_benchmark("decode")


def decode_row(variant, search, cores, rate, outputs=("a", "b"), alpha=None):
    return {"variant": variant, "search": search, "alpha": alpha, "cores": cores, "beam": 4,
            "sentences_per_second": rate, "tokens_per_second": 10 * rate,
            "outputs": list(outputs)}


def test_decode_ratios_are_to_ctranslate2_float32_of_the_same_search_and_cores(decode_bench):
    rows = [decode_row("ct2_float32", "greedy", 1, 100.0), decode_row("ct2_float32", "greedy", 2, 200.0),
            decode_row("savedmodel", "greedy", 1, 50.0), decode_row("savedmodel", "greedy", 2, 300.0),
            decode_row("ct2_float32", "beam", 1, 40.0, alpha=0.6),
            decode_row("savedmodel", "beam", 1, 10.0, alpha=0.6),
            decode_row("savedmodel", "beam", 1, 8.0, alpha=1.4)]  # no reference row
    decode_bench.add_ratios(rows)
    assert [row["ratio"] for row in rows] == [1.0, 1.0, 0.5, 1.5, 1.0, 0.25, None]


def test_decode_rows_of_a_group_take_turns_one_pass_at_a_time(decode_bench):
    """Every row is loaded before the first timed pass, each round times every row once, the
    first row of a round moves on by one, and each row keeps its own seconds and outputs."""
    events = []

    class FakeRow:
        def __init__(self, spec):
            self.name, self.passes = spec["variant"], 0
            events.append(("start", self.name))

        def timed_pass(self):
            self.passes += 1
            events.append(("pass", self.name))
            return {"a": 1.0, "b": 2.0, "c": 4.0}[self.name] * self.passes

        def finish(self):
            return [self.name]

    specs = [{"variant": name} for name in "abc"]
    results = decode_bench.run_group(specs, 3, start=FakeRow)
    assert events[:3] == [("start", "a"), ("start", "b"), ("start", "c")]
    assert [name for _, name in events[3:]] == list("abc" "bca" "cab")
    assert results == [{"seconds": [1.0, 2.0, 3.0], "outputs": ["a"]},
                       {"seconds": [2.0, 4.0, 6.0], "outputs": ["b"]},
                       {"seconds": [4.0, 8.0, 12.0], "outputs": ["c"]}]


def test_decode_round_ratios_compare_the_passes_of_each_round(decode_bench):
    rows = [dict(decode_row("ct2_float32", "greedy", 1, 10.0), seconds=[1.0, 1.2, 0.9]),
            dict(decode_row("savedmodel", "greedy", 1, 5.0), seconds=[2.0, 2.0, 3.0])]
    decode_bench.add_ratios(rows)
    assert rows[1]["round_ratios"] == pytest.approx([0.5, 0.6, 0.3])
    assert rows[1]["ratio"] == 0.5


def test_decode_output_comparison_counts_identical_sentences(decode_bench):
    rows = [decode_row("ct2_float32", "greedy", 1, 1.0, outputs=("a", "b", "c")),
            decode_row("savedmodel", "greedy", 1, 1.0, outputs=("a", "x", "c")),
            decode_row("savedmodel", "greedy", 2, 1.0, outputs=("a", "x", "c"))]
    assert decode_bench.compare_outputs(rows) == [
        "savedmodel greedy: 2/3 outputs identical to ct2_float32"]
    scores = [decode_row("ct2_float32", "score", 1, 1.0, outputs=(-10.0, -2.0, -3.0)),
              decode_row("savedmodel", "score", 1, 1.0, outputs=(-10.005, -2.0005, -3.1))]
    assert decode_bench.compare_outputs(scores) == [
        "savedmodel score: 2/3 scores within 1e-3 of ct2_float32"]


def test_decode_score_rows_score_the_references_on_every_runtime(decode_bench, tmp_path):
    """`--searches score`: one row per variant and cores, no alpha; each row's function is the
    runtime's score (CTranslate2's score_batch, the SavedModel's signature) on given pairs."""
    args = decode_bench.parse_args(["--run", "r", "--data-dir", "d", "--searches", "score",
                                    "--variants", "savedmodel,ct2_float32"])
    paths = {(v, 0.6): f"{v}_0.6" for v in ("savedmodel", "ct2_float32")}
    got = [(r["variant"], r["search"], r["alpha"], r["cores"])
           for r in decode_bench.rows(args, paths, [0.6])]
    assert got == [("ct2_float32", "score", None, 1), ("savedmodel", "score", None, 1),
                   ("ct2_float32", "score", None, 2), ("savedmodel", "score", None, 2)]


def test_decode_rows_put_the_reference_first_and_beam_rows_per_alpha(decode_bench):
    args = decode_bench.parse_args(["--run", "r", "--data-dir", "d", "--variants",
                                    "savedmodel,ct2_float32", "--cores", "1"])
    paths = {(v, a): f"{v}_{a}" for v in ("savedmodel", "ct2_float32") for a in (1.4, 0.6)}
    got = [(r["variant"], r["search"], r["alpha"], r["path"])
           for r in decode_bench.rows(args, paths, [1.4, 0.6])]
    assert got == [("ct2_float32", "greedy", None, "ct2_float32_1.4"),
                   ("savedmodel", "greedy", None, "savedmodel_1.4"),
                   ("ct2_float32", "beam", 1.4, "ct2_float32_1.4"),
                   ("savedmodel", "beam", 1.4, "savedmodel_1.4"),
                   ("ct2_float32", "beam", 0.6, "ct2_float32_0.6"),
                   ("savedmodel", "beam", 0.6, "savedmodel_0.6")]


def test_decode_names_a_folder_that_is_not_a_run(decode_bench, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        decode_bench.main(["--run", str(tmp_path), "--data-dir", str(tmp_path)])
    assert str(exit_info.value) == (f"decode.py: {tmp_path} is not a training run "
                                    "(config.yaml not found)")


CT2_VERBOSE_LOG = """\
[2026-11-29 02:11:58.103] [ctranslate2] [thread 8789] [info] CPU: AuthenticAMD (SSE4.1=true, AVX=true, AVX2=true, AVX512=true)
[2026-11-29 02:11:58.103] [ctranslate2] [thread 8789] [info]  - Selected ISA: AVX2
[2026-11-29 02:11:58.103] [ctranslate2] [thread 8789] [info]  - Use Intel MKL: false
[2026-11-29 02:11:58.103] [ctranslate2] [thread 8789] [info]  - SGEMM backend: DNNL (packed: false)
[2026-11-29 02:11:58.103] [ctranslate2] [thread 8789] [info]  - GEMM_S16 backend: none (packed: false)
[2026-11-29 02:11:58.103] [ctranslate2] [thread 8789] [info]  - GEMM_S8 backend: DNNL (packed: false, u8s8 preferred: true)
"""


def test_decode_reads_ctranslate2s_cpu_choices_from_its_log(decode_bench):
    assert decode_bench.parse_ctranslate2_log(CT2_VERBOSE_LOG) == {
        "ISA": "AVX2", "float32 GEMM": "DNNL (packed: false)",
        "int8 GEMM": "DNNL (packed: false, u8s8 preferred: true)"}
    with pytest.raises(SystemExit, match="did not report its CPU choices"):
        decode_bench.parse_ctranslate2_log("RuntimeError: Unable to open file 'model.bin'")


def test_decode_reports_what_ctranslate2_chose_and_the_override(decode_bench,
                                                                random_translation_model,
                                                                tmp_path, monkeypatch):
    """A real CTranslate2 load in a subprocess: it reports the instruction set that the
    environment forces (AVX, which is no CPU's default here) and the variables set."""
    from keras_transformer.config import DecodeConfig
    from keras_transformer.export.ctranslate2 import export_ctranslate2

    model, tokenizer = random_translation_model
    folder = export_ctranslate2(model, tokenizer, tokenizer, DecodeConfig(), tmp_path / "ct2")
    monkeypatch.setenv("CT2_FORCE_CPU_ISA", "AVX")
    monkeypatch.delenv("CT2_USE_MKL", raising=False)
    choices = decode_bench.ctranslate2_cpu_choices(folder)
    assert choices["ISA"] == "AVX"
    assert choices["CT2_FORCE_CPU_ISA"] == "AVX" and choices["CT2_USE_MKL"] == "unset"
    assert choices["float32 GEMM"] and choices["int8 GEMM"]


# ----------------------------------------------------------------------------- export.py

def export_repeat(export_seconds, load_seconds, loops=3, translation="A man."):
    return {"export_seconds": export_seconds, "saved_model_bytes": 1_835_312,
            "while_loops": loops, "load_seconds": load_seconds, "first_call_seconds": 1.0,
            "translation": translation}


def test_export_benchmark_gives_medians_and_refuses_repeats_that_disagree(tmp_path):
    export = load_benchmark("export")
    summary = export.summarize([export_repeat(9.0, 2.0), export_repeat(12.0, 1.5),
                                export_repeat(10.0, 2.5)])
    assert (summary["export_seconds"], summary["load_seconds"]) == (10.0, 2.0)
    assert (summary["while_loops"], summary["translation"]) == (3, "A man.")
    assert export.format_repeat(summary) == (
        "export 10.00 s, saved_model.pb 1.84 MB, 3 decoding loops, load 2.00 s, first call "
        "1.00 s: 'A man.'")
    with pytest.raises(ValueError, match=r"while_loops differs between repeats: \[3, 7\]"):
        export.summarize([export_repeat(9.0, 2.0), export_repeat(9.0, 2.0, loops=7)])
    with pytest.raises(SystemExit):
        export.parse_args(["--run", str(tmp_path)])  # no config.yaml: not a run


def test_decode_step_counts_a_loop_body_with_its_larger_branch_and_fits_a_line():
    import tensorflow as tf

    bench = load_benchmark("decode_step")

    def graph(extra_adds: int):
        def branch(x):
            x = x * 2.0 + 1.0
            for value in range(extra_adds):
                x = x + float(value + 3)
            return x

        @tf.function(autograph=False)
        def loop(x):
            def body(step, x):
                return step + 1, tf.sin(tf.cond(x[0] > 0, lambda: branch(x), lambda: x))

            return tf.while_loop(lambda step, _: step < 3, body, (tf.constant(0), x))

        return loop.get_concrete_function(tf.TensorSpec([1])).graph.as_graph_def()

    counts = []
    for extra in (0, 2):
        graph_def = graph(extra)
        (body,) = bench.loop_bodies(graph_def)
        counts.append(bench.body_ops(graph_def, body))
    assert counts[1] - counts[0] == 2 * 2  # each add: a constant and the add, in the branch
    assert bench.fit_line([1, 2, 3], [3.0, 5.0, 7.0]) == pytest.approx((1.0, 2.0))
    assert bench.per_op_seconds(4, 8, steps=50) > 0
