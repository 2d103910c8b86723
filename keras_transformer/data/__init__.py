"""The data stage: text pairs (tfds or local files) -> tf-text tokenizers -> length-bucketed
token batches.

- `text_io`, `text_normalization`: reading text files, the one normalization of text;
- `tokenizers`: SentencePiece and WordPiece in the graph, and the vocabularies;
- `corpora`: text pairs from tfds or local files, normalized and counted, `build_vocab`;
- `streams`: the batches: `make_batches`, the training streams;
- `modifiers`, `placeholders`: the text people type, made from clean training pairs;
- `filtering`: rules that drop noisy pairs from parallel files; `multi30k`: its tfds builder;
- `stats`: what `keras-transformer data-stats` reports.

The public names of `corpora`, `streams` and `stats` (and the tokenizers' loaders) are also
names of this package (``from keras_transformer import data; data.load_pairs(...)``), loaded
on first use, so that the TensorFlow-free modules here (`text_io`, `text_normalization`, `modifiers`,
`placeholders`, `filtering`) import without TensorFlow.
"""

from keras_transformer import lazy_attributes

# name -> the module that defines it
_EXPORTS = {
    "DataError": "text_io",
    "load_tokenizers": "tokenizers", "build_tokenizers": "tokenizers",
    "FileCheck": "corpora", "check_parallel_files": "corpora", "split_files": "corpora",
    "check_data_folder": "corpora", "load_pairs": "corpora", "load_corpus_pairs": "corpora",
    "drop_reasons": "corpora", "tokenized_pairs": "corpora", "PairStats": "corpora",
    "pair_stats": "corpora", "vocab_folder": "corpora", "build_vocab": "corpora",
    "bucket_lengths": "streams", "bucket_batch_sizes": "streams", "make_batches": "streams",
    "group_batches": "streams", "TrainingStream": "streams", "MixtureStream": "streams",
    "training_stream": "streams", "fixed_size_batches": "streams", "BatchStats": "streams",
    "batch_stats": "streams",
    "data_stats": "stats", "corpus_name": "stats",
}


__getattr__ = lazy_attributes(__name__, _EXPORTS)
