# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: tags,-all
#     formats: ipynb,py:percent
#     notebook_metadata_filter: kernelspec,jupytext
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # The tutorial, told with the package
#
# The TensorFlow tutorial [Neural machine translation with a Transformer and
# Keras](https://www.tensorflow.org/text/tutorials/transformer) builds a Transformer (Vaswani et
# al., 2017, *Attention Is All You Need*) piece by piece and trains it to translate. This guide
# walks the same path, section for section, with `keras_transformer`'s public API: the data, the
# tokenizers, the batches, the positional encoding, the three attention layers, the encoder and
# the decoder, the model and `model.fit`, the translator, the attention plots, and the export
# that TF Serving runs. Where the package departs from the tutorial, the cell says so.
#
# The tutorial translates Portuguese to English (TED talks); this guide translates German to
# English on [Multi30k](https://github.com/multi30k/dataset) (29,000 image captions), the data of
# the package's demo (`make demo`, `experiments/demo.yaml`).
#
# `docs/guide.py` is the source of this notebook (jupytext percent format); `make guide` rebuilds
# `docs/guide.ipynb` from it and runs it at full size, and `tests/test_guide.py` runs it at tiny
# size, so that it cannot drift from the package.

# %% [markdown]
# ## Setup
#
# Two environment variables choose what the notebook does:
#
# - `GUIDE_SIZE`: `tiny` (the `tiny` model preset, a small vocabulary, a few training steps and a
#   few sentences: the whole notebook in well under a minute of CPU) or `full` (the `tutorial`
#   preset trained as `experiments/demo.yaml` trains it, about 6-30 minutes on 2 CPU cores);
# - `GUIDE_OUTPUT`: the folder for everything the notebook writes (vocabulary, run, SavedModel);
#   default: a new temporary folder.
#
# `KERAS_TRANSFORMER_DATA` names the folder of the Multi30k files (`train.de.gz`, `val.en.gz`,
# `test_2016_flickr.de.gz`, ...).

# %% tags=["parameters"]
import os
import tempfile
from pathlib import Path

GUIDE_SIZE = os.environ.get("GUIDE_SIZE", "tiny")
OUTPUT = Path(os.environ.get("GUIDE_OUTPUT") or tempfile.mkdtemp(prefix="keras-transformer-guide-"))
assert GUIDE_SIZE in ("tiny", "full"), f"GUIDE_SIZE={GUIDE_SIZE!r}: tiny or full"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Not the folder itself: the outputs name no folder of the machine that ran them.
print(f"size {GUIDE_SIZE}, writing to", "GUIDE_OUTPUT" if os.environ.get("GUIDE_OUTPUT")
      else "a new temporary folder")

# %%
import dataclasses
import json

import keras
import matplotlib.pyplot as plt
import numpy as np
import tensorflow as tf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import keras_transformer as kt
from keras_transformer import data, layers
from keras_transformer.training import callbacks
from keras_transformer.config import REPO_ROOT

tf.get_logger().setLevel("WARNING")  # no INFO lines from tf.distribute and tf.saved_model

# %% [markdown]
# One `ExperimentConfig` holds every setting, in four sections: `model`, `data`, `train` and
# `decode`. The guide starts from the demo's experiment file and, at tiny size, shrinks it with
# the same `section.key=value` overrides that `keras-transformer train --set` takes. Both sizes
# read the local Multi30k files (`data.dataset=files`); the demo's `data.dataset: multi30k` reads
# the same files through a tfds builder.

# %%
OVERRIDES = {
    # tiny: seconds of training, enough for curves and figures but not for good translations
    "tiny": ["model.preset=tiny", "data.vocab_size=600", "data.vocab_sample_sentences=4000",
             "data.shuffle_buffer=2000", "data.bucket_step=32", "train.epochs=2",
             "train.steps_per_epoch=5", "train.warmup_steps=40", "train.precision=float32",
             "train.validation_bleu_sentences=8", "train.log_every_steps=2",
             "decode.max_extra_length=10"],
    "full": [],  # experiments/demo.yaml as it is
}[GUIDE_SIZE]
SENTENCES = {"tiny": 3, "full": 5}[GUIDE_SIZE]  # translated in "Run inference"
PADDING_PAIRS = {"tiny": 3000, "full": None}[GUIDE_SIZE]  # training pairs batched both ways

config = kt.ExperimentConfig.from_yaml(
    REPO_ROOT / "experiments" / "demo.yaml",
    ["name=guide", "data.dataset=files", f"data.vocab_dir={OUTPUT / 'vocab'}", *OVERRIDES])
shown = {"model": {key: value for key, value in dataclasses.asdict(config.model).items()
                   if not key.endswith("vocab_size")},  # set from the vocabulary by training
         "data": {key: getattr(config.data, key) for key in
                  ("source_lang", "target_lang", "tokenizer", "vocab_size", "tokens_per_batch")},
         "train": {key: getattr(config.train, key) for key in
                   ("epochs", "steps_per_epoch", "warmup_steps", "precision")}}
print(json.dumps(shown, indent=1))

# %% [markdown]
# ## Data handling
#
# ### The dataset
#
# The tutorial loads `ted_hrlr_translate/pt_to_en` with TensorFlow Datasets. The package's loader,
# `kt.load_pairs`, gives the pairs of a split as a `tf.data.Dataset` of `(source, target)`
# strings, whatever the source of the text (a tfds dataset or local files), each line normalized
# as the translator will normalize its inputs (invisible characters removed, Unicode NFC, runs of
# spaces made one space).

# %%
train_pairs = kt.load_pairs(config.data, config.data.train_split)
for german, english in train_pairs.take(3):
    print(german.numpy().decode("utf-8"))
    print("  ", english.numpy().decode("utf-8"))

# %% [markdown]
# ### The tokenizers
#
# The tutorial downloads a pair of WordPiece tokenizers, one per language. The demo learns one
# joint SentencePiece vocabulary from both sides of the training split (`data.tokenizer`:
# `sentencepiece`, or `wordpiece` for the tutorial's kind). `kt.build_tokenizers` learns it and
# writes it to a folder; `kt.load_tokenizers` reads it back. With a joint vocabulary the source
# and target tokenizers are one object.

# %%
source_tokenizer, target_tokenizer = kt.build_tokenizers(
    config.data, train_pairs, config.data.vocab_dir)
print("vocabulary:", source_tokenizer.vocab_size, "subwords; joint:",
      source_tokenizer is target_tokenizer)

# %% [markdown]
# As in the tutorial, `tokenize` turns a batch of strings into a ragged batch of ids that starts
# with `START` (id 1) and ends with `END` (id 2), `lookup` shows the subword of each id, and
# `detokenize` turns ids back into text.

# %%
sentence = tf.constant(["Zwei Hunde spielen im Schnee."])
ids = source_tokenizer.tokenize(sentence)
print("ids:     ", ids.numpy()[0].tolist())
print("subwords:", [piece.decode("utf-8") for piece in source_tokenizer.lookup(ids).numpy()[0]])
print("text:    ", source_tokenizer.detokenize(ids).numpy()[0].decode("utf-8"))

# %% [markdown]
# ### The batches
#
# Like the tutorial's `make_batches`, `kt.make_batches` gives `((source, target_in), target_out)`
# batches, the form `Model.fit` expects of `(inputs, labels)`: `target_in` is the target starting
# with `START`, `target_out` the same shifted by one and ending with `END`, so that at each
# position the label is the next token.

# %%
batches = kt.make_batches(train_pairs.take(PADDING_PAIRS or -1), source_tokenizer,
                          target_tokenizer, config.data, training=False)
(source_ids, target_in), target_out = next(iter(batches))
print("source    ", source_ids.shape)
print("target_in ", target_in.shape)
print("target_out", target_out.shape)
print("target_in[0][:10] ", target_in[0][:10].numpy())
print("target_out[0][:10]", target_out[0][:10].numpy())

# %% [markdown]
# The batches differ in one way. The tutorial takes 64 pairs in reading order and pads each
# batch to its longest sentence. `make_batches` groups pairs of similar lengths (source and
# target lengths each rounded up to a multiple of `data.bucket_step`) and fills each bucket's
# batches up to `data.tokens_per_batch` padded tokens, so a batch of short sentences holds more
# of them. `data.fixed_size_batches` is the tutorial's batching, and `data.batch_stats` counts
# real and padded tokens: here are both over the same training pairs.

# %%
bucketed = data.batch_stats(batches)
padded_64 = data.batch_stats(data.fixed_size_batches(
    train_pairs.take(PADDING_PAIRS or -1), source_tokenizer, target_tokenizer, config.data,
    batch_size=64))
for name, stats in (("length buckets", bucketed), ("64 pairs, padded", padded_64)):
    print(f"{name:17}: {stats.batches:4} batches of {stats.pairs / stats.batches:6.1f} pairs, "
          f"{len(stats.shapes):3} shapes; padding: "
          f"source {stats.padding_fraction('source'):6.1%}, "
          f"target {stats.padding_fraction('target'):6.1%}")

# %% [markdown]
# ## Define the components
#
# ### The embedding and positional encoding layer
#
# Attention sees a set, not a sequence: the position of each token is added to its embedding as
# a vector of sines and cosines of geometrically spaced frequencies (section 3.5 of the paper).
# `layers.positional_encoding` gives the paper's table, sines on even and cosines on odd
# dimensions (the tutorial concatenates the sines and the cosines instead, a permutation of the
# same table).

# %%
table = layers.positional_encoding(length=2048, depth=512)
print(table.shape)  # [length, depth]
figure, axes = plt.subplots(figsize=(8, 4))
mesh = axes.pcolormesh(table.T, cmap="RdBu")
axes.set_xlabel("position")
axes.set_ylabel("depth")
figure.colorbar(mesh)
plt.show()

# %% [markdown]
# `layers.PositionalEmbedding` looks up each token's embedding, scales it by sqrt(d_model), adds
# the positions and applies dropout. The tutorial's layer also sets a Keras mask for later layers
# to find; the package passes padding masks explicitly instead (see the cross-attention below).

# %%
d_model, num_heads, dff = config.model.d_model, config.model.num_heads, config.model.dff
embed = layers.PositionalEmbedding(vocab_size=source_tokenizer.vocab_size, d_model=d_model,
                                   max_positions=config.model.max_positions)
source_embedded = embed(source_ids)  # the demo shares one embedding between both sides
target_embedded = embed(target_in)
print("source", source_ids.shape, "->", source_embedded.shape)
print("target", target_in.shape, "->", target_embedded.shape)

# %% [markdown]
# ### The attention layers
#
# As in the tutorial, `layers.BaseAttention` holds a `keras.layers.MultiHeadAttention`, a
# `LayerNormalization` and the residual connection, and three layers use it. Each head has
# `d_model / num_heads` dimensions, as in the paper (the tutorial's `key_dim=d_model` makes the
# heads `num_heads` times wider). With `model.norm: pre`, which the demo uses, each sublayer
# normalizes its input instead of its output.
#
# **The cross attention layer** connects the decoder to the encoder: every target position
# attends to the encoder's output, the context. `context_mask` marks the real source tokens.

# %%
source_mask = source_ids != 0  # PAD is id 0
cross_attention = layers.CrossAttention(d_model=d_model, num_heads=num_heads,
                                        norm=config.model.norm)
print(source_embedded.shape, target_embedded.shape, "->",
      cross_attention(target_embedded, source_embedded, context_mask=source_mask).shape)

# %% [markdown]
# The tutorial leaves masking to Keras's implicit masks, which `MultiHeadAttention` drops after
# their first use: in its decoder, only the first layer's cross-attention ignores the source
# padding. The package's layers take the mask explicitly, in every layer, so that more padding
# changes nothing:

# %%
more_padding = tf.pad(source_ids, [[0, 0], [0, 8]])  # 8 more PAD columns
before = cross_attention(target_embedded, source_embedded, context_mask=source_mask)
after = cross_attention(target_embedded, embed(more_padding), context_mask=more_padding != 0)
print("largest change:", float(tf.reduce_max(tf.abs(after - before))))

# %% [markdown]
# **The global self attention layer** is the encoder's: every source position attends to every
# real source position.

# %%
global_self_attention = layers.GlobalSelfAttention(d_model=d_model, num_heads=num_heads,
                                                   norm=config.model.norm)
print(source_embedded.shape, "->",
      global_self_attention(source_embedded, padding_mask=source_mask).shape)

# %% [markdown]
# **The causal self attention layer** is the decoder's: position t attends to positions up to t
# only, so that training predicts every next token of a sentence at once without showing the
# layer the answer. As in the tutorial, the first positions' outputs do not depend on the later
# ones:

# %%
causal_self_attention = layers.CausalSelfAttention(d_model=d_model, num_heads=num_heads,
                                                   norm=config.model.norm)
print(target_embedded.shape, "->", causal_self_attention(target_embedded).shape)
first_three = causal_self_attention(embed(target_in[:, :3]))
all_then_three = causal_self_attention(embed(target_in))[:, :3]
print("largest difference:", float(tf.reduce_max(tf.abs(first_three - all_then_three))))

# %% [markdown]
# ### The feed forward network
#
# Two dense layers with a ReLU between them (`dff` wide inside), dropout, the residual
# connection and the layer norm.

# %%
feed_forward = layers.FeedForward(d_model=d_model, dff=dff, norm=config.model.norm)
print(target_embedded.shape, "->", feed_forward(target_embedded).shape)

# %% [markdown]
# ### The encoder
#
# An `EncoderLayer` is a `GlobalSelfAttention` and a `FeedForward`; the `Encoder` stacks
# `num_layers` of them (with pre-norm, a final layer norm follows). Unlike the tutorial's, the
# package's `Encoder` does not embed the tokens itself: the model owns the embeddings, so that
# the encoder and the decoder can share one (section 3.4 of the paper, `model.share_embeddings`).

# %%
stack_args = dict(d_model=d_model, num_heads=num_heads, dff=dff, norm=config.model.norm)
encoder_layer = layers.EncoderLayer(**stack_args)
print(source_embedded.shape, "->",
      encoder_layer(source_embedded, padding_mask=source_mask).shape)
encoder = layers.Encoder(num_layers=config.model.num_layers, **stack_args)
context = encoder(source_embedded, padding_mask=source_mask)
print(source_embedded.shape, "->", context.shape)

# %% [markdown]
# ### The decoder
#
# A `DecoderLayer` is a `CausalSelfAttention`, a `CrossAttention` over the encoder's output and a
# `FeedForward`; the `Decoder` stacks them.

# %%
decoder_layer = layers.DecoderLayer(**stack_args)
print(target_embedded.shape, context.shape, "->",
      decoder_layer(target_embedded, context, context_mask=source_mask).shape)
decoder = layers.Decoder(num_layers=config.model.decoder_layers, **stack_args)
print(target_embedded.shape, context.shape, "->",
      decoder(target_embedded, context, context_mask=source_mask).shape)

# %% [markdown]
# ## The Transformer
#
# `kt.Transformer` puts the embeddings, the encoder, the decoder and the final projection to
# logits together; like the tutorial's, it is called on `(source, target_in)` and returns
# logits over the target vocabulary at every target position. Its hyperparameters are a
# `ModelConfig`, the experiment's `model` section (the tutorial's `num_layers=4, d_model=128,
# dff=512, num_heads=8` is the `tutorial` preset).

# %%
model_config = dataclasses.replace(config.model, source_vocab_size=source_tokenizer.vocab_size,
                                   target_vocab_size=target_tokenizer.vocab_size)
transformer = kt.Transformer(model_config)
logits = transformer((source_ids, target_in))
print(source_ids.shape, target_in.shape, "->", logits.shape)
print(f"{transformer.count_params():,} parameters")

# %% [markdown]
# ## Training
#
# ### The optimizer, the loss and the metrics
#
# The tutorial's `CustomSchedule` is `kt.TransformerSchedule`, the paper's warmup then
# inverse-square-root rate (equation 3), here with the experiment's warmup steps and scale;
# `kt.create_optimizer` puts it in Adam(0.9, 0.98, 1e-9). The tutorial's `masked_loss` and
# `masked_accuracy` are `kt.MaskedLabelSmoothedCrossEntropy` (with the paper's label smoothing
# of 0.1, which the tutorial leaves out) and `kt.MaskedAccuracy`.

# %%
schedule = kt.TransformerSchedule(d_model, config.train.warmup_steps,
                                  config.train.learning_rate_scale)
steps = np.arange(1, config.train.epochs * config.train.steps_per_epoch + 1)
figure, axes = plt.subplots(figsize=(6, 3))
axes.plot(steps, [float(schedule(step)) for step in steps])
axes.set_xlabel("optimizer step")
axes.set_ylabel("learning rate")
plt.show()

# %% [markdown]
# ### Train the model
#
# The tutorial compiles the model and calls `fit`. `kt.train` does the same, into a run folder:
# it builds the batches (the vocabulary is the one built above, `data.vocab_dir`), compiles the
# model with the optimizer, loss and metrics above, and calls `model.fit` under a distribution
# strategy with callbacks that translate validation sentences for BLEU after each epoch, write
# TensorBoard logs and save the weights. The same call again resumes a killed run.

# %%
run_dir = OUTPUT / "run"
history = kt.train(config, run_dir, verbose=2)
run = kt.Run(run_dir)
print(sorted(path.name for path in run_dir.iterdir()))

# %% [markdown]
# The curves, read back from the run's TensorBoard logs (`tensorboard --logdir RUN/logs` shows
# the same, with the validation translations and attention images): the loss per target token
# on the training batches and on the validation split, and the validation BLEU (sacreBLEU,
# greedy search).

# %%
def scalars(folder: Path, tag: str) -> tuple[list, list]:
    """(steps, values) of the scalar `tag` in the TensorBoard logs of `folder` (Keras writes
    scalars as tensor summaries)."""
    logs = EventAccumulator(str(folder), size_guidance={"tensors": 0}).Reload()
    points = {event.step: float(tf.make_ndarray(event.tensor_proto))
              for event in logs.Tensors(tag)}
    return sorted(points), [points[step] for step in sorted(points)]


figure, (loss_axes, bleu_axes) = plt.subplots(1, 2, figsize=(10, 3.5))
for split in ("train", "validation"):
    epochs, losses = scalars(run.logs_dir / split, "epoch_loss")
    loss_axes.plot(np.array(epochs) + 1, losses, marker="o", label=split)
epochs, bleu = scalars(run.logs_dir / "validation", "epoch_bleu")
bleu_axes.plot(np.array(epochs) + 1, bleu, marker="o")
loss_axes.set(xlabel="epoch", ylabel="loss per target token")
loss_axes.legend()
bleu_axes.set(xlabel="epoch", ylabel="validation BLEU")
plt.show()
print("validation BLEU by epoch:", [round(value, 2) for value in bleu])

# %% [markdown]
# ## Run inference
#
# The tutorial's `Translator` is a `tf.Module` that tokenizes, runs the decoder one token at a
# time (the whole decoder again at every step) and detokenizes. `kt.Translator` is one too, but
# its search caches each layer's keys and values and decodes whole batches, by greedy or beam
# search (beam 4, length penalty 0.6, as in the paper). `kt.translator_from_run` builds it from
# the run's best weights (by validation BLEU). At tiny size the model has trained for seconds and
# its translations are nonsense; `make guide` runs the notebook at full size.

# %%
translator = kt.translator_from_run(run_dir)
test_pairs = list(kt.load_pairs(config.data, config.data.test_split)
                  .take(SENTENCES).as_numpy_iterator())
sources = [source.decode("utf-8") for source, _ in test_pairs]
outputs = translator.translate_beam(tf.constant(sources))
for (source, reference), translation in zip(test_pairs, outputs["translation"].numpy()):
    print(f"{'Input:':15s}: {source.decode('utf-8')}")
    print(f"{'Prediction':15s}: {translation.decode('utf-8')}")
    print(f"{'Ground truth':15s}: {reference.decode('utf-8')}")
    print()

# %% [markdown]
# ## Create attention plots
#
# The tutorial plots the last decoder layer's cross-attention of one translation, head by head,
# with the source subwords along the x axis and the output subwords along the y axis. Here the
# translator's id-level search gives the output ids of the first sentence,
# `Transformer.cross_attention_scores` the attention weights that the model gives them, and
# `callbacks.attention_figure` (the figure TensorBoard shows after each epoch) draws them.

# %%
source_ids = translator.source_ids(tf.constant(sources[:1]))  # [1, source_len]
ids, _ = translator.search(source_ids, "beam")  # [1, beam, len], best first
output_ids = ids[0, 0].numpy()
output_ids = output_ids[: list(output_ids).index(2) + 1] if 2 in output_ids else output_ids
target_in = tf.constant([[1, *output_ids[:-1]]])  # START, then all but the last output
weights = translator.model.cross_attention_scores(source_ids, target_in)  # [1, heads, out, in]


def pieces(tokenizer, ids) -> list[str]:
    return [piece.decode("utf-8") for piece in tokenizer.lookup(tf.constant(ids)).numpy()]


callbacks.attention_figure(weights[0].numpy(),
                           pieces(translator.source_tokenizer, source_ids[0]),
                           pieces(translator.target_tokenizer, output_ids))

# %% [markdown]
# ## n-best lists and word alignments
#
# Beam search keeps `beam_size` hypotheses to the end; the `"nbest"` search (the
# `translate_nbest` signature, `keras-transformer translate --nbest N`) returns them all, best
# first, with their scores, log P / lp. `align` (the `align` signature, `translate
# --alignments`) pairs each word of a translation with the source word it attends to most, in
# one decoder layer's cross-attention (`decode.alignment_layer`, default the last) averaged over
# the heads and over each word's subwords, as Pharaoh `i-j` pairs (source word i, target word
# j), the way Marian's `--alignment hard` does; `word_attention` is the matrix that it chooses
# from, drawn below with the chosen pairs boxed. Attention is not alignment, so the pairs are
# approximate, good enough to carry markup across. (At tiny size the best hypothesis may be
# empty; then the reference is aligned instead.)

# %%
nbest = translator.translate(tf.constant(sources[:1]), "nbest")
for text, score in zip(nbest["translations"].numpy()[0], nbest["scores"].numpy()[0]):
    print(f"{score:9.4f}  {text.decode('utf-8')}")
best = nbest["translations"].numpy()[0, 0].decode("utf-8") or test_pairs[0][1].decode("utf-8")
alignment = translator.align(tf.constant(sources[:1]), tf.constant([best]))["alignment"]
print("alignment:", alignment.numpy()[0].decode("utf-8"))
source_words, target_words = sources[0].split(), best.split()
matrix = translator.word_attention(sources[:1], [best])[0].numpy()
matrix = matrix[:len(target_words), :len(source_words)]  # [target words, source words], cut
target_words, source_words = target_words[:len(matrix)], source_words[:matrix.shape[1]]
figure, axes = plt.subplots(figsize=(0.6 * len(source_words) + 2, 0.45 * len(target_words) + 1.5))
axes.imshow(matrix, cmap="Blues", vmin=0.0)
axes.scatter(matrix.argmax(axis=1), range(len(target_words)), marker="s", s=150,
             facecolors="none", edgecolors="red")
axes.set_xticks(range(len(source_words)), source_words, rotation=60, ha="right")
axes.set_yticks(range(len(target_words)), target_words)
axes.set_title("word attention; the alignment boxed")
plt.show()

# %% [markdown]
# ## Export the model
#
# The tutorial saves its translator with `tf.saved_model.save` and reloads it. `kt.export_translator`
# writes a SavedModel whose signatures take a batch of strings and return translations: the
# tokenizers, the search and the detokenizer are all in the graph, so TF Serving runs it with no
# Python. `kt.export_run` does the same from a run folder, into the next version folder of a
# model (`saved_models/NAME/1`).

# %%
export_dir = kt.export_translator(translator, OUTPUT / "saved_models" / "guide" / "1")
print(sorted(path.name for path in export_dir.iterdir()))

# %% [markdown]
# `kt.load_translator` reloads it (after registering the tf-text ops, which every loader of the
# export needs), as a fresh process or a server would.

# %%
reloaded = kt.load_translator(export_dir)
print(sorted(reloaded.signatures))
greedy = reloaded.translate_greedy(tf.constant(sources[:1]))
print("greedy:", greedy["translation"].numpy()[0].decode("utf-8"))

# %% [markdown]
# ## Serve it
#
# TF Serving loads the highest version in the model folder (`docker run -p 8501:8501
# --mount type=bind,source=$PWD/saved_models/guide,target=/models/guide -e MODEL_NAME=guide
# tensorflow/serving`). A REST client sends a body that names a signature and lists the
# instances, here to `POST http://localhost:8501/v1/models/guide:predict`:

# %%
request = {"signature_name": "serving_default", "instances": sources}
print(json.dumps(request, ensure_ascii=False, indent=1))

# %% [markdown]
# The server calls the signature on the instances as one batch and answers with one prediction
# per instance, each with the signature's outputs by name. The answer, computed here by calling
# the reloaded signature itself (no server):

# %%
signature = reloaded.signatures[request["signature_name"]]
results = signature(source=tf.constant(request["instances"]))  # {"translation", "score"}
response = {"predictions": [
    {"score": round(float(score), 4), "translation": translation.decode("utf-8")}
    for score, translation in zip(results["score"].numpy(), results["translation"].numpy())]}
print(json.dumps(response, ensure_ascii=False, indent=1))

# %% [markdown]
# ## Conclusion
#
# The same path from the command line: `keras-transformer train --config experiments/demo.yaml
# --output runs/demo`, then `keras-transformer export --run runs/demo --output
# saved_models/demo` (`make demo` runs both and scores the test split with sacreBLEU). The
# documentation site (`make docs`) has a page on every command, on your own data, on training
# across machines and on serving, the results, and the API reference.
