"""Tests of the exported SavedModel: fresh-process reload, saved_model_cli (session loader), the
op set TF Serving can run, REST row-format mapping, warmup file, no optimizer state; the CLI."""

import base64
import dataclasses
import io
import json
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import cli
from keras_transformer.config import ConfigError, DecodeConfig, ExperimentConfig
from keras_transformer.decoding.strategies import NEG_INF
from keras_transformer.data.tokenizers import SERVING_TF_TEXT_OPS
from keras_transformer.export.savedmodel import WARMUP_FILE, export_translator, load_translator
from keras_transformer.model import Transformer
from keras_transformer.decoding.translator import (SIGNATURE_INPUT, SIGNATURES, Translator,
                                          signature_arguments, signature_inputs)
from helpers import graph_ops, load_benchmark

SENTENCES = ["Ein Mann fährt Fahrrad.", "", "  ", "Zwei Hunde spielen im Schnee.",
             " ".join(["Wort"] * 2000), "漢字 ☃ 🙂", "Hallo", "Ein Mann\tfährt\tFahrrad.",
             "\u00a0\t\u3000", "\ufeff\u200b"]
NO_WORDS = [1, 2, 8, 9]  # indices of SENTENCES without words
BEAM_SIZE = 3

# Runs in a fresh process: lists the ops TensorFlow core registers (before tensorflow_text is
# imported), then loads the SavedModel as a user would and runs every signature (on the
# sentences, and seeds 0, 1, ... where it takes seeds).
_RELOAD_SCRIPT = r"""
import json, sys
import tensorflow as tf
from tensorflow.python.client import pywrap_tf_session
from tensorflow.core.framework import op_def_pb2
core_ops = op_def_pb2.OpList.FromString(
    pywrap_tf_session.TF_GetBuffer(pywrap_tf_session.TF_GetAllOpList()))
core_ops = sorted(op.name for op in core_ops.op)
import tensorflow_text  # noqa: F401  every loader must register the tf-text ops first
loaded = tf.saved_model.load(sys.argv[1])
sentences = json.loads(sys.argv[2])
outputs = {}
for name in json.loads(sys.argv[3]):
    signature = loaded.signatures[name]
    inputs = {"source": tf.constant(sentences)}
    if "seed" in signature.structured_input_signature[1]:
        inputs["seed"] = tf.range(len(sentences), dtype=tf.int64)
    for extra in ("target", "prefix"):  # score, translate_prefix: the sources again
        if extra in signature.structured_input_signature[1]:
            inputs[extra] = inputs["source"]
    result = signature(**inputs)
    outputs[name] = {key: value.numpy().tolist() for key, value in result.items()}
print("RESULT" + json.dumps({"core_ops": core_ops, "outputs": outputs}, default=bytes.decode))
"""

_SAVED_MODEL_CLI = r"""
import sys
import tensorflow_text  # noqa: F401  saved_model_cli does not register the tf-text ops itself
from tensorflow.python.tools import saved_model_cli
export_dir, inputs, out_root = sys.argv[1:4]
count = len(eval(inputs))
for signature in sys.argv[4:]:
    exprs = "source=" + inputs
    if signature == "translate_sampling":
        exprs += f";seed={list(range(count))}"  # a literal: numpy makes it int64
    if signature in ("score", "align"):
        exprs += ";target=" + inputs
    if signature == "translate_prefix":
        exprs += ";prefix=" + inputs
    sys.argv = ["saved_model_cli", "run", "--dir", export_dir, "--tag_set", "serve",
                "--signature_def", signature, "--input_exprs", exprs,
                "--outdir", f"{out_root}/{signature}"]
    try:
        saved_model_cli.main()
    except SystemExit as exit:
        if exit.code:
            raise
"""


@pytest.fixture(scope="module")
def translator(random_translation_model):
    model, tokenizer = random_translation_model
    return Translator(model, tokenizer, tokenizer,
                      DecodeConfig(beam_size=BEAM_SIZE, alpha=0.6, max_extra_length=8))


@pytest.fixture(scope="module")
def eager_outputs(translator):
    functions = translator.signatures()
    return {name: {k: v.numpy() for k, v in functions[name](
                **signature_arguments(name, SENTENCES)).items()}
            for name in SIGNATURES}


@pytest.fixture(scope="module")
def export_dir(translator, tmp_path_factory):
    """The translator exported from a COMPILED model with optimizer slots, which must not be
    exported."""
    model = translator.model
    compiled = Transformer.from_config(model.get_config())
    compiled.build()
    compiled.set_weights(model.get_weights())
    compiled.compile(optimizer="adam", loss="mse")
    assert compiled.optimizer.variables
    exporting = Translator(compiled, translator.source_tokenizer, translator.target_tokenizer,
                           translator.decode_config)
    return export_translator(exporting, tmp_path_factory.mktemp("saved_models") / "demo" / "1")


def assert_same_outputs(actual: dict, expected: dict, name: str):
    assert sorted(actual) == sorted(expected), name
    for key in expected:
        want, got = np.asarray(expected[key]), np.asarray(actual[key])
        assert got.shape == want.shape, (name, key)
        if want.dtype == object:  # strings: exactly equal
            assert [t if isinstance(t, bytes) else t.encode() for t in got.reshape(-1)] == list(
                want.reshape(-1)), (name, key)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{name} {key}")


def test_reloaded_in_fresh_process_gives_the_eager_strings(export_dir, eager_outputs):
    result = subprocess.run(
        [sys.executable, "-c", _RELOAD_SCRIPT, str(export_dir), json.dumps(SENTENCES),
         json.dumps(list(SIGNATURES))], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    reloaded = json.loads(result.stdout.split("RESULT", 1)[1])
    for name in SIGNATURES:
        assert_same_outputs(reloaded["outputs"][name], eager_outputs[name], name)

    # Every op is TensorFlow core or a tf-text op that TF Serving links.
    unknown = graph_ops(export_dir) - set(reloaded["core_ops"]) - SERVING_TF_TEXT_OPS
    assert not unknown, f"ops TF Serving cannot run: {sorted(unknown)}"
    assert graph_ops(export_dir) & SERVING_TF_TEXT_OPS  # the walk did reach the tokenizer ops


def test_saved_model_cli_runs_every_signature(export_dir, eager_outputs, tmp_path):
    """The session-based loader of saved_model_cli (and TF Serving) finds every variable."""
    inputs = json.dumps(SENTENCES[:4])
    result = subprocess.run(
        [sys.executable, "-c", _SAVED_MODEL_CLI, str(export_dir), inputs, str(tmp_path),
         *SIGNATURES], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    for name in SIGNATURES:
        outputs = {p.stem: np.load(p, allow_pickle=True) for p in (tmp_path / name).glob("*.npy")}
        expected = {k: v[:4] for k, v in eager_outputs[name].items()}
        assert_same_outputs(outputs, expected, name)


def test_signatures_and_assets(export_dir):
    loaded = load_translator(export_dir)
    assert sorted(loaded.signatures) == sorted(SIGNATURES)
    for name in SIGNATURES:
        signature = loaded.signatures[name]
        specs = signature.structured_input_signature[1]
        assert sorted(specs) == sorted(signature_inputs(name)), name
        assert specs[SIGNATURE_INPUT].shape.as_list() == [None]
        assert specs[SIGNATURE_INPUT].dtype == tf.string
    seed = loaded.signatures["translate_sampling"].structured_input_signature[1]["seed"]
    assert seed.shape.as_list() == [None] and seed.dtype == tf.int64
    assert (export_dir / "assets" / "sentencepiece.model").is_file()


def test_each_search_is_stored_once(export_dir):
    """One decoding loop per strategy in the graph: greedy search, beam search (which the
    best-beam, n-best and prefix signatures share), sampling, the score's forced decoding and
    align's attention. Signatures traced before
    `tf.saved_model.save`, or the searches as tracked tf.functions, made the save trace them
    again and store copies (seven loops for two strategies, twice the graph, twice the load
    time); a search for the best beam alone was one more loop."""
    assert load_benchmark("export").while_loop_count(export_dir) == 5


def test_exported_signatures_skip_sources_without_words_and_normalize_them(export_dir):
    """In the loaded SavedModel: "", whitespace-only and invisible sources give "" with score 0
    (n-best: then NEG_INF), also in a batch of nothing else, and tabs translate as spaces."""
    loaded = load_translator(export_dir)
    tab = SENTENCES.index("Ein Mann\tfährt\tFahrrad.")
    for name in SIGNATURES:
        if name in ("score", "align"):  # not a translation: test_translator.py
            continue
        if name == "translate_nbest":
            texts_key, scores_key = "translations", "scores"
            no_words_score = [0.0] + [NEG_INF] * (BEAM_SIZE - 1)
        else:
            texts_key, scores_key, no_words_score = "translation", "score", 0.0
        signature = loaded.signatures[name]
        mixed = {k: v.numpy() for k, v in signature(
            **signature_arguments(name, SENTENCES)).items()}
        alone = {k: v.numpy() for k, v in signature(
            **signature_arguments(name, [SENTENCES[i] for i in NO_WORDS])).items()}
        for texts, scores in ((mixed[texts_key][NO_WORDS], mixed[scores_key][NO_WORDS]),
                              (alone[texts_key], alone[scores_key])):
            assert (texts == b"").all(), name
            np.testing.assert_array_equal(scores, np.broadcast_to(no_words_score, scores.shape))
        # The same words at another row of the batch: the same translation, and its score to
        # float32 rounding (the encoder packs the batch's real tokens, so that the sentence's
        # rows fall elsewhere in the matmuls' blocks). Sampling draws by each row's seed.
        if name == "translate_sampling":
            mixed = {k: v.numpy() for k, v in signature(
                source=tf.constant(SENTENCES), seed=tf.fill([len(SENTENCES)], tf.constant(
                    5, tf.int64))).items()}
        np.testing.assert_array_equal(mixed[texts_key][tab], mixed[texts_key][0])
        np.testing.assert_allclose(mixed[scores_key][tab], mixed[scores_key][0], rtol=1e-6)
        assert np.all(mixed[scores_key][[0, 3]] < 0)  # sentences with words were decoded


def test_no_optimizer_state_and_sane_size(export_dir, translator):
    names = [name for name, _ in tf.train.list_variables(str(export_dir / "variables" /
                                                              "variables"))]
    assert not [n for n in names if "optimizer" in n.lower()], names
    # The frozen weights: the parameters in the decoding's layout, each once, plus the position
    # table and the output projection's transposed copy of the shared embedding matrix.
    model = translator.model
    parameter_bytes = 4 * sum(int(np.prod(w.shape)) for w in model.weights)
    extra_bytes = 4 * (model.target_embedding.positions.size
                       + int(np.prod(model.target_embedding.token_embedding.embeddings.shape)))
    variables_bytes = sum(p.stat().st_size for p in (export_dir / "variables").iterdir())
    assert parameter_bytes <= variables_bytes < 1.05 * (parameter_bytes + extra_bytes) + 100_000


def rest_predict(signature, body: str) -> str:
    """TF Serving's REST row format mapped onto a signature, as the model server does it.

    `{"instances": [...]}`: each instance is the value of the single input, or an object
    `{"source": value, ...}` with a value for every input; a string value `{"b64": ...}` is
    base64-encoded bytes. The instances are stacked into one batch per input; every output must
    have the batch as its first dimension; the response is `{"predictions": [...]}` with one
    object per instance holding every output's row.
    """
    instances = json.loads(body)["instances"]
    specs = signature.structured_input_signature[1]

    def value(instance, name):
        if isinstance(instance, dict) and name in instance:
            instance = instance[name]
        elif len(specs) > 1:
            raise ValueError(f"instance {instance!r} has no input {name!r}")
        if specs[name].dtype != tf.string:
            return instance
        if isinstance(instance, dict):
            return base64.b64decode(instance["b64"])
        return instance.encode("utf-8")

    outputs = signature(**{name: tf.constant([value(i, name) for i in instances], spec.dtype,
                                             shape=[len(instances)])
                           for name, spec in specs.items()})
    for key, tensor in outputs.items():
        if tensor.shape.rank == 0 or tensor.shape[0] != len(instances):
            raise ValueError(f"output {key} of shape {tensor.shape} is not batch-major")

    def row(tensor, index):
        item = tensor[index].numpy()
        if tensor.dtype == tf.string:
            return item.decode("utf-8") if isinstance(item, bytes) else [
                t.decode("utf-8") for t in item]
        return item.tolist()

    predictions = [{key: row(tensor, i) for key, tensor in outputs.items()}
                   for i in range(len(instances))]
    return json.dumps({"predictions": predictions})


def test_rest_row_format_request(export_dir, eager_outputs):
    loaded = load_translator(export_dir)
    instances = [SENTENCES[0], {"source": SENTENCES[1]},
                 {"b64": base64.b64encode(SENTENCES[3].encode()).decode()}]
    response = json.loads(rest_predict(loaded.signatures["serving_default"],
                                       json.dumps({"instances": instances})))
    expected = eager_outputs["serving_default"]
    assert [set(p) for p in response["predictions"]] == [{"translation", "score"}] * 3
    for prediction, index in zip(response["predictions"], (0, 1, 3)):
        assert prediction["translation"] == expected["translation"][index].decode()
        assert prediction["score"] == pytest.approx(expected["score"][index], rel=1e-5)

    nbest = json.loads(rest_predict(loaded.signatures["translate_nbest"],
                                    json.dumps({"instances": SENTENCES[:2]})))
    assert [len(p["translations"]) for p in nbest["predictions"]] == [BEAM_SIZE] * 2
    empty = json.loads(rest_predict(loaded.signatures["translate_greedy"], '{"instances": []}'))
    assert empty == {"predictions": []}
    sampled = json.loads(rest_predict(loaded.signatures["translate_sampling"], json.dumps(
        {"instances": [{"source": SENTENCES[i], "seed": i} for i in (0, 1, 3)]})))
    for prediction, index in zip(sampled["predictions"], (0, 1, 3)):
        assert prediction["translation"] == (
            eager_outputs["translate_sampling"]["translation"][index].decode())


def test_warmup_requests_replay(export_dir):
    pytest.importorskip("tensorflow_serving.apis")
    from tensorflow_serving.apis import prediction_log_pb2

    path = export_dir / "assets.extra" / WARMUP_FILE
    logs = [prediction_log_pb2.PredictionLog.FromString(record.numpy())
            for record in tf.data.TFRecordDataset(str(path))]
    assert [log.predict_log.request.model_spec.signature_name for log in logs] == list(SIGNATURES)
    loaded = load_translator(export_dir)
    for log in logs:  # as TF Serving replays them before serving the version
        request = log.predict_log.request
        inputs = {key: tf.make_ndarray(proto) for key, proto in request.inputs.items()}
        outputs = loaded.signatures[request.model_spec.signature_name](**inputs)
        assert all(t.shape[0] == len(inputs[SIGNATURE_INPUT]) for t in outputs.values())


def test_export_refuses_an_existing_version(translator, export_dir):
    with pytest.raises(FileExistsError, match="already exists"):
        export_translator(translator, export_dir)


def run_cli(argv, stdin=""):
    out, err = io.StringIO(), io.StringIO()
    old_stdin = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin.encode("utf-8")), encoding="utf-8")
    try:
        with redirect_stdout(out), redirect_stderr(err):
            code = cli.main(argv)
    finally:
        sys.stdin = old_stdin
    return code, out.getvalue(), err.getvalue()


def test_cli_export_translate_evaluate(random_run, tmp_path):
    models = tmp_path / "saved_models" / "demo"
    code, out, err = run_cli(["export", "--run", str(random_run), "--output", str(models)])
    assert code == 0, err
    assert (models / "1" / "saved_model.pb").is_file() and "exported" in out

    lines = ["Zwei Hunde spielen im Schnee.", "", "Ein Mann fährt Fahrrad.", "Hallo"]
    code, exported, err = run_cli(["translate", "--model", str(models / "1"), "--batch-size",
                                   "2"], "\n".join(lines) + "\n")
    assert code == 0, err
    assert "translated 4/4" in err  # the progress bar
    code, direct, err = run_cli(["translate", "--run", str(random_run), "--quiet", "--batch-size",
                                 "3"], "\n".join(lines) + "\n")
    assert code == 0, err
    assert exported == direct and len(exported.splitlines()) == len(lines)
    code, concurrent, err = run_cli(["translate", "--model", str(models / "1"), "--quiet",
                                     "--batch-size", "1", "--workers", "3"],
                                    "\n".join(lines) + "\n")
    assert code == 0, err
    assert concurrent == exported  # batches in flight at once, input order kept
    with pytest.raises(SystemExit) as exit_info, redirect_stderr(io.StringIO()) as err:
        cli.main(["translate", "--model", str(models / "1"), "--workers", "0"])
    assert exit_info.value.code == 2 and "argument --workers: 0 is not >= 1" in err.getvalue()

    code, _, err = run_cli(["translate", "--model", str(models / "1"), "--beam", "5"], "x\n")
    assert code == 2 and "exported with beam size 2" in err
    code, _, err = run_cli(["translate", "--model", str(models / "7")], "x\n")
    assert code == 2 and "neither a SavedModel (no saved_model.pb) nor a CTranslate2" in err
    code, _, err = run_cli(["export", "--run", str(random_run), "--output", str(models),
                            "--version", "1"])
    assert code == 2 and "already exists" in err

    source, reference, hypotheses = (tmp_path / name for name in ("src", "ref", "hyp"))
    source.write_text("\n".join(lines) + "\n")
    reference.write_text("Two dogs play in the snow.\n\nA man rides a bike.\nHello\n")
    code, out, err = run_cli(["evaluate", "--model", str(models / "1"), "--source", str(source),
                              "--reference", str(reference), "--output", str(hypotheses),
                              "--quiet"])
    assert code == 0, err
    assert hypotheses.read_text() == exported
    for metric in ("bleu:", "bleu_lowercase:", "chrf:", "chrf_lowercase:"):
        assert metric in out
    assert "case:lc" in out and "tok:13a" in out  # sacreBLEU signatures


@pytest.mark.parametrize("damage", ["variables_truncated", "variables_missing", "foreign",
                                    "provenance_not_json", "provenance_a_list"])
def test_cli_names_a_damaged_or_foreign_saved_model(export_dir, tmp_path, damage):
    import shutil

    copy = tmp_path / "1"
    if damage == "foreign":
        module = tf.Module()
        module.translate_greedy = tf.function(lambda s: {"translation": s},
                                              input_signature=[tf.TensorSpec([None], tf.string)])
        tf.saved_model.save(module, str(copy))
    else:
        shutil.copytree(export_dir, copy)
    data = next((copy / "variables").glob("variables.data-*"), None)
    provenance = copy / "assets.extra" / "keras_transformer.json"
    if damage == "variables_truncated":
        data.write_bytes(data.read_bytes()[:data.stat().st_size // 2])
    elif damage == "variables_missing":
        shutil.rmtree(copy / "variables")
    elif damage == "provenance_not_json":
        provenance.write_text('{"run": ')
    elif damage == "provenance_a_list":
        provenance.write_text("[1, 2]")
    command = ["info"] if damage.startswith("provenance") else ["translate", "--quiet"]
    code, out, err = run_cli([*command, "--model", str(copy)], "Hallo\n")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    expected = {
        "variables_truncated": f"{copy}: the SavedModel does not load",
        "variables_missing": f"{copy}: the SavedModel does not load",
        "foreign": f"{copy}: a SavedModel without translate_beam, translate_nbest: not an export",
        "provenance_not_json": f"{provenance}: not a JSON file",
        "provenance_a_list": f"{provenance}: expected a JSON object, found list",
    }[damage]
    assert expected in err, err


def test_an_export_whose_vocabulary_was_swapped_is_refused_by_name(random_export, tmp_path):
    """The probe: a SavedModel whose assets/sentencepiece.model was swapped for another
    vocabulary of the same size (here two pieces traded) translated without a word (with the
    graph's own copy of the model: a WordPiece graph reads its vocabulary from assets/). The
    export records each vocabulary file's SHA-256, and loading it refuses a swapped one in one
    line naming the file; an export made before the record loads as before."""
    import shutil

    from sentencepiece import sentencepiece_model_pb2

    from keras_transformer.data.text_io import file_sha256

    copy = tmp_path / "1"
    shutil.copytree(random_export, copy)
    asset = copy / "assets" / "sentencepiece.model"
    provenance = copy / "assets.extra" / "keras_transformer.json"
    record = json.loads(provenance.read_text())
    assert record["vocabulary_sha256"] == {"sentencepiece.model": file_sha256(asset)}
    proto = sentencepiece_model_pb2.ModelProto.FromString(asset.read_bytes())
    proto.pieces[10].piece, proto.pieces[11].piece = (proto.pieces[11].piece,
                                                      proto.pieces[10].piece)
    asset.write_bytes(proto.SerializeToString())
    text = tmp_path / "text"
    text.write_text("Hallo\n")
    for command in (["translate", "--quiet"], ["evaluate", "--quiet", "--source", str(text),
                                               "--reference", str(text)]):
        code, out, err = run_cli([*command, "--model", str(copy)], "Hallo\n")
        assert (code, out) == (2, "")
        assert err.strip() == (
            f"keras-transformer {command[0]}: error: {asset} differs from the SHA-256 recorded "
            "in assets.extra/keras_transformer.json when it was exported (not the vocabulary "
            "the model was trained with); export the run again")
    asset.unlink()
    with pytest.raises(ConfigError, match=rf"^{copy}: no assets/sentencepiece.model, a "
                                          "vocabulary file it was exported with"):
        load_translator(copy)
    shutil.copy(random_export / "assets" / "sentencepiece.model", asset)
    del record["vocabulary_sha256"]  # as exports made before the record
    provenance.write_text(json.dumps(record))
    code, out, err = run_cli(["translate", "--quiet", "--model", str(copy)], "Hallo\n")
    assert code == 0 and len(out.splitlines()) == 1, err


def test_cli_export_refuses_quantization_without_ctranslate2(random_run, tmp_path):
    code, _, err = run_cli(["export", "--run", str(random_run), "--output", str(tmp_path / "m"),
                            "--quantization", "int8"])
    assert code == 2 and "--quantization int8 is for --format ctranslate2" in err, err
    assert not (tmp_path / "m").exists()


@pytest.fixture(scope="module")
def varied_run_dir(random_run, random_translation_model, tmp_path_factory):
    """`random_run` with a weaker END bias (0.8), under which each beam size and alpha of the
    tune-search test's grid gives other, non-empty outputs for its sentences."""
    import shutil

    from keras_transformer.data.tokenizers import END_ID

    model, _ = random_translation_model
    original = model.final_layer.bias.numpy()
    run = tmp_path_factory.mktemp("varied_run") / "run"
    shutil.copytree(random_run, run)
    bias = original.copy()
    bias[END_ID] = 0.8
    model.final_layer.bias.assign(bias)
    try:
        model.save_weights(run / "best.weights.h5")
    finally:
        model.final_layer.bias.assign(original)
    return run


def test_cli_tune_search_scores_every_beam_and_alpha(varied_run_dir, tmp_path):
    """Each row's score is its own setting's: the references are beam 3 / alpha 1.5's outputs,
    so that setting scores 100 and is the best, and every row equals the score of its setting's
    outputs decoded separately. Bad input is refused."""
    import json

    from keras_transformer.decoding.evaluation import score
    from keras_transformer.decoding.texts import translate_texts
    from keras_transformer.decoding.translator import translator_from_run

    random_run = varied_run_dir
    grid = [(1, 0.0), (1, 1.5), (3, 0.0), (3, 1.5)]
    sources = ["Zwei Hunde spielen im Schnee.", "Ein Mann fährt Fahrrad.", "Eine Frau singt."]
    translators = [translator_from_run(random_run, beam_size=b, alpha=a) for b, a in grid]  # alive
    outputs = [translate_texts(t.translate_beam, sources) for t in translators]
    references = outputs[3]
    assert all(references) and len({tuple(o) for o in outputs}) == len(grid)

    source, reference, output = tmp_path / "src", tmp_path / "ref", tmp_path / "search.json"
    source.write_text("\n".join(sources) + "\n")
    reference.write_text("\n".join(references) + "\n")
    code, out, err = run_cli(["tune-search", "--run", str(random_run), "--source", str(source),
                              "--reference", str(reference), "--beam", "1,3",
                              "--alpha", "0,1.5", "--output", str(output)])
    assert code == 0, err
    tuned = json.loads(output.read_text())
    assert [(row["beam_size"], row["alpha"]) for row in tuned["results"]] == grid
    for row, hypotheses in zip(tuned["results"], outputs):
        assert row["bleu"] == score(hypotheses, references)["bleu"]
    assert tuned["results"][3]["bleu"] == pytest.approx(100.0)
    assert max(row["bleu"] for row in tuned["results"][:3]) < 100.0
    assert (tuned["best"]["beam_size"], tuned["best"]["alpha"]) == (3, 1.5)
    assert "best: --beam 3 --alpha 1.5" in out and "tok:13a" in out

    code, _, err = run_cli(["tune-search", "--run", str(random_run), "--source", str(source),
                            "--reference", str(tmp_path / "missing")])
    assert code == 2 and "missing: no such file" in err
    short = tmp_path / "short"
    short.write_text(references[0] + "\n")
    code, _, err = run_cli(["tune-search", "--run", str(random_run), "--source", str(source),
                            "--reference", str(short)])
    assert code == 2 and "has 3 lines but" in err and "short has 1" in err
    with pytest.raises(SystemExit), redirect_stderr(io.StringIO()) as err:
        cli.main(["tune-search", "--run", str(random_run), "--source", str(source),
                  "--reference", str(reference), "--alpha", "0.6,-1"])
    assert "every alpha must be a finite number >= 0" in err.getvalue()
    with pytest.raises(SystemExit), redirect_stderr(io.StringIO()) as err:
        cli.main(["tune-search", "--run", str(random_run), "--source", str(source),
                  "--reference", str(reference), "--stopping", "exact,early"])
    assert "'early' is not a stopping rule: use exact or beam_full" in err.getvalue()


def test_cli_tune_search_compares_stopping_rules(varied_run_dir, tmp_path):
    """`--stopping exact,beam_full --patience 1,2` decodes each setting with each rule: a row
    per rule and patience, scored on that rule's own outputs."""
    import json

    from keras_transformer.decoding.evaluation import score
    from keras_transformer.decoding.texts import translate_texts
    from keras_transformer.decoding.translator import Translator, translator_from_run

    sources = ["Zwei Hunde spielen im Schnee.", "Ein Mann fährt Fahrrad.", "Eine Frau singt."]
    base = translator_from_run(varied_run_dir, beam_size=3, alpha=1.5)
    rules = [("exact", None), ("beam_full", 1.0), ("beam_full", 2.0)]
    outputs = {}
    for rule, patience in rules:
        translator = Translator(base.model, base.source_tokenizer, base.target_tokenizer,
                                dataclasses.replace(base.decode_config, stopping=rule,
                                                    patience=patience or 1.0),
                                max_source_length=base.max_source_length)
        outputs[rule, patience] = translate_texts(translator.translate_beam, sources)
    references = outputs["beam_full", 1.0]
    source, reference, output = tmp_path / "src", tmp_path / "ref", tmp_path / "search.json"
    source.write_text("\n".join(sources) + "\n")
    reference.write_text("\n".join(references) + "\n")
    code, out, err = run_cli(["tune-search", "--run", str(varied_run_dir), "--source", str(source),
                              "--reference", str(reference), "--beam", "3", "--alpha", "1.5",
                              "--stopping", "exact,beam_full", "--patience", "1,2",
                              "--output", str(output)])
    assert code == 0, err
    rows = json.loads(output.read_text())["results"]
    assert [(row["stopping"], row["patience"]) for row in rows] == rules
    for row in rows:
        assert row["bleu"] == score(outputs[row["stopping"], row["patience"]], references)["bleu"]
    assert "beam 3 alpha 1.5 stopping beam_full patience 1: BLEU 100.00" in out
    assert "stopping beam_full patience 2: BLEU" in out
    with pytest.raises(SystemExit), redirect_stderr(io.StringIO()) as err:
        cli.main(["tune-search", "--run", str(varied_run_dir), "--source", str(source),
                  "--reference", str(reference), "--patience", "2,0.5"])
    assert "every patience must be a finite number >= 1" in err.getvalue()


# Last in this file: training seeds TensorFlow (`keras.utils.set_random_seed`), which destroys the
# SentencePiece resources of the module's tokenizers loaded before it (see tests/conftest.py).
@pytest.fixture(scope="module")
def wordpiece_run(wordpiece_vocab, short_multi30k_dir, tmp_path_factory):
    """A tiny run trained for two steps with case-preserving WordPiece vocabularies, one per
    language (so only the decoder's embedding is tied to the output projection)."""

    from keras_transformer.training import runner as training
    from keras_transformer.config import ModelConfig, TrainConfig

    data_config, vocab_dir = wordpiece_vocab
    config = ExperimentConfig(
        name="tiny_wordpiece",
        model=ModelConfig.from_preset("tiny", share_embeddings="target"),
        data=dataclasses.replace(data_config, data_dir=str(short_multi30k_dir),
                                 vocab_dir=str(vocab_dir)),
        train=TrainConfig(epochs=1, steps_per_epoch=2, warmup_steps=10, strategy="one_device",
                          validation_bleu_sentences=0),
        decode=DecodeConfig(beam_size=2, max_extra_length=6))
    run = tmp_path_factory.mktemp("wordpiece_run")
    training.train(config, run, verbose=0)
    return run


def test_wordpiece_run_exports_and_translates_after_reloading(wordpiece_run, tmp_path):
    """Train -> export (CLI) -> reload in a fresh process -> translate, with WordPiece: the
    reloaded signatures give the eager Translator's outputs, the vocabularies travel as assets,
    and the graph's tokenizer ops are WordPiece ones that TF Serving links."""
    from keras_transformer.decoding.translator import translator_from_run

    models = tmp_path / "saved_models" / "wordpiece"
    code, out, err = run_cli(["export", "--run", str(wordpiece_run), "--output", str(models)])
    assert code == 0, err
    export = models / "1"
    assets = {p.name for p in (export / "assets").iterdir()}
    assert {"wordpiece.de.vocab", "wordpiece.en.vocab"} <= assets, assets

    translator = translator_from_run(wordpiece_run)
    sentences = ["Ein Mann fährt Fahrrad.", "", "Zwei Hunde spielen im Schnee.", "Hallo"]
    source = tf.constant(sentences)
    # Beam search (serving_default) and greedy; the other signatures share their code paths,
    # which the SentencePiece tests above cover.
    functions = {"serving_default": translator, "translate_greedy": translator.translate_greedy}
    eager = {name: {k: v.numpy() for k, v in function(source).items()}
             for name, function in functions.items()}
    translations = [t.decode() for t in eager["translate_greedy"]["translation"]]
    # Words for every source with words; the empty source gives "" without being decoded.
    assert translations[1] == "" and all(translations[:1] + translations[2:]), translations

    result = subprocess.run(
        [sys.executable, "-c", _RELOAD_SCRIPT, str(export), json.dumps(sentences),
         json.dumps(list(functions))], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    reloaded = json.loads(result.stdout.split("RESULT", 1)[1])
    for name in functions:
        assert_same_outputs(reloaded["outputs"][name], eager[name], name)
    ops = graph_ops(export)
    assert not ops - set(reloaded["core_ops"]) - SERVING_TF_TEXT_OPS
    assert {op for op in ops & SERVING_TF_TEXT_OPS if "ordpiece" in op}  # WordPiece, not SP
    assert not {op for op in ops if "entencepiece" in op}


# A strategy registered in one place reaches the Translator and the export.
_TOY_STRATEGY = r"""
import json, sys
sys.path.insert(0, sys.argv[2])
import numpy as np
import tensorflow as tf
from keras_transformer.decoding import strategies as decoding


@decoding.register_strategy("second_best")  # the one line a new strategy adds
class SecondBest(decoding.GreedySearch):
    "The second most probable token each step, END where END is the most probable."

    def choose(self, step, logits, search):
        top = tf.math.top_k(tf.nn.log_softmax(logits), k=2)
        pick = tf.where(top.indices[:, 0] == self.end_id, 0, 1)[:, None]
        return (tf.gather(top.indices, pick, batch_dims=1)[:, 0],
                tf.gather(top.values, pick, batch_dims=1)[:, 0])


from helpers import seeded_tiny_model
from keras_transformer.config import DecodeConfig
from keras_transformer.export.savedmodel import export_translator, load_translator
from keras_transformer.data.tokenizers import SentencePieceTokenizer
from keras_transformer.decoding.translator import Translator

tokenizer = SentencePieceTokenizer(sys.argv[1] + "/sentencepiece.model")
model = seeded_tiny_model(tokenizer, seed=3, output_scale=3.0)
translator = Translator(model, tokenizer, tokenizer, DecodeConfig(beam_size=2, max_extra_length=6))
sentences = json.loads(sys.argv[3])
source_ids = translator.source_ids(tf.constant(sentences))
ids, _ = translator.search(source_ids, "second_best")
ids = ids.numpy()
checked = 0
for row in range(len(sentences)):
    tokens = [int(t) for t in ids[row] if t != 0]
    target_in = tf.constant([[1] + tokens[:-1]])
    logits = model((source_ids[row:row + 1], target_in), training=False)[0].numpy()
    for position, token in enumerate(tokens):
        order = np.argsort(-logits[position], kind="stable")
        assert token == (order[0] if order[0] == 2 else order[1]), (row, position)
        checked += 1
eager = translator.translate_second_best(tf.constant(sentences))["translation"].numpy()
loaded = load_translator(export_translator(translator, sys.argv[4], warmup_sentences=None))
exported = loaded.signatures["translate_second_best"](source=tf.constant(sentences))
print("RESULT" + json.dumps({"checked": checked, "same": eager.tolist() ==
                            exported["translation"].numpy().tolist()}))
"""


def test_a_strategy_registered_in_decoding_reaches_search_and_export(sentencepiece_vocab,
                                                                      tmp_path):
    """A toy strategy, registered as decoding.py registers its own, is searched by
    `Translator.search` (each token the model's second choice) and exported as
    `translate_second_best`, which gives the eager translations; no other file changes."""
    from helpers import REPO_ROOT

    _, vocab_dir = sentencepiece_vocab
    result = subprocess.run(
        [sys.executable, "-c", _TOY_STRATEGY, str(vocab_dir), str(REPO_ROOT / "tests"),
         json.dumps(SENTENCES[:4] + SENTENCES[6:7]), str(tmp_path / "toy" / "1")],
        capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = json.loads(result.stdout.split("RESULT", 1)[1])
    assert outcome["checked"] > 5 and outcome["same"]


def test_an_input_of_another_rank_is_refused_by_name(export_dir):
    """A loaded signature binds an input of any rank; each is checked first, and the error names
    it and its shape (it was a bare "Can not squeeze dim[1]" deep in the graph)."""
    loaded = load_translator(export_dir)
    for name in SIGNATURES:
        arguments = signature_arguments(name, SENTENCES[:2])
        for key, value in arguments.items():
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match=rf"Shape of tensor {key} \[1,2\] is not compatible with "
                                     r"expected shape \[\?\]"):
                loaded.signatures[name](**{**arguments, key: tf.reshape(value, [1, 2])})


def test_an_export_killed_while_it_writes_leaves_no_version_and_the_next_completes(random_run,
                                                                                   tmp_path):
    """SIGKILL while `export` writes its hidden `.partial-PID-1` folder: the model folder, which
    TF Serving watches, holds no version; the same command then writes version 1 in full and
    removes the dead process's folder."""
    import os
    import signal
    import time

    root = tmp_path / "models"
    command = [sys.executable, "-m", "keras_transformer.cli", "export", "--run",
               str(random_run), "--output", str(root)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=env)
    partial, deadline = root / f".partial-{process.pid}-1", time.time() + 300
    while not partial.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert partial.exists(), "the export ended (or never began writing) before the kill"
    # the lock the killed export held: the kernel let it go, its file stays
    assert sorted(path.name for path in root.iterdir()) == [".export.lock", partial.name]
    again = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert sorted(path.name for path in root.iterdir()) == ["1"]
    loaded = load_translator(root / "1")
    assert loaded.translate_greedy(tf.constant(["Ein Hund."]))["translation"].shape == (1,)


def test_two_exports_into_one_model_folder_at_once_get_two_versions(random_run, tmp_path,
                                                                    monkeypatch, caplog):
    """The probe: two `export --output models/conc` at once both took version 1 and one work
    folder, which each deleted on start, and one failed with "[Errno 39] Directory not empty".
    Here a second export starts while the first writes: it waits, naming the first one's
    process, then writes version 2; both versions load and translate."""
    import logging
    import os
    import threading
    import time

    from keras_transformer.export import savedmodel as export

    root = tmp_path / "conc"
    save, second = tf.saved_model.save, {}

    def export_second():
        try:
            second["path"] = export.export_run(random_run, root)
        except BaseException as error:  # reported by the assertion below
            second["error"] = error

    thread = threading.Thread(target=export_second)
    waiting = f"{root}: process {os.getpid()} is exporting a version there; waiting for it to end"

    def first_save(*args, **kwargs):  # part-way through the first export
        monkeypatch.setattr(tf.saved_model, "save", save)
        thread.start()
        deadline = time.time() + 300
        while waiting not in caplog.text and time.time() < deadline:
            time.sleep(0.05)
        return save(*args, **kwargs)

    monkeypatch.setattr(tf.saved_model, "save", first_save)
    with caplog.at_level(logging.WARNING, logger="keras_transformer.runs.folder"):
        first = export.export_run(random_run, root)
        thread.join(timeout=600)
    assert waiting in caplog.text
    assert (first, second) == (root / "1", {"path": root / "2"})
    assert sorted(path.name for path in root.iterdir()) == ["1", "2"]
    for version in (first, second["path"]):
        loaded = load_translator(version)
        assert loaded.translate_greedy(tf.constant(["Ein Hund."]))["translation"].shape == (1,)


def test_a_ctranslate2_export_whose_folder_another_wrote_meanwhile_is_one_line(
        random_run, tmp_path, monkeypatch, capsys):
    """Two CTranslate2 exports into one --output at once: the one that finishes second is
    refused in one line naming the folder (it failed with "Directory not empty"), and the
    other's export is left as it was."""
    pytest.importorskip("ctranslate2")
    from keras_transformer.export import ctranslate2 as ctranslate2_export

    output = tmp_path / "ct2"
    sha256 = ctranslate2_export.file_sha256

    def other_export_finishes(path):  # while this one writes (checksums its files)
        if not output.exists():
            output.mkdir()
            (output / "model.bin").write_bytes(b"the other export's")
        return sha256(path)

    monkeypatch.setattr(ctranslate2_export, "file_sha256", other_export_finishes)
    assert cli.main(["export", "--run", str(random_run), "--format", "ctranslate2",
                     "--output", str(output)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"keras-transformer export: error: {output} already exists (another process wrote it "
        "while this one did): choose a new --output")
    assert [p.name for p in tmp_path.iterdir()] == ["ct2"]
    assert (output / "model.bin").read_bytes() == b"the other export's"
