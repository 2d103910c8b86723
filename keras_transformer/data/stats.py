"""What `keras-transformer data-stats` reports: per split the pairs kept and dropped by reason,
token lengths and unknown-token rates, and the batches the training stream makes."""

from __future__ import annotations

import dataclasses
import os

from keras_transformer.config import CorpusConfig, DataConfig
from keras_transformer.data.corpora import load_corpus_pairs, load_pairs, pair_stats, vocab_folder
from keras_transformer.data.streams import (BatchStats, batch_stats, fixed_size_batches,
                                            make_batches)
from keras_transformer.data.tokenizers import load_tokenizers


def data_stats(data_config: DataConfig, vocab_dir: str | os.PathLike | None = None) -> dict:
    """Per split: pairs kept/dropped by reason, token length percentiles, unknown-token rates;
    for the training split also the batches `make_batches` makes (tokens per batch, padding) next
    to fixed 64-pair batches. Needs the vocabulary (`build_vocab`)."""
    source_tokenizer, target_tokenizer = load_tokenizers(data_config,
                                                         vocab_folder(data_config, vocab_dir))
    result = {"dataset": data_config.dataset,
              "direction": f"{data_config.source_lang}->{data_config.target_lang}",
              "tokenizer": data_config.tokenizer,
              "carry_remainders": data_config.carry_remainders,
              "vocab_size": {"source": source_tokenizer.vocab_size,
                             "target": target_tokenizer.vocab_size},
              "splits": {}}
    # One pass over each split: caching its tokenized pairs would only hold the whole split in
    # memory (data.cache is for training's repeated passes).
    data_config = dataclasses.replace(data_config, cache=False)
    for split in (data_config.train_split, data_config.validation_split, data_config.test_split):
        pairs = load_pairs(data_config, split)
        stats = pair_stats(pairs, source_tokenizer, target_tokenizer, data_config)
        entry = {
            "pairs": stats.total, "kept": stats.kept, "dropped": stats.dropped,
            "source_length": stats.percentiles("source"),
            "target_length": stats.percentiles("target"),
            "source_unk_rate": stats.unk_rate("source"),
            "target_unk_rate": stats.unk_rate("target"),
        }
        if split == data_config.train_split:
            bucketed = batch_stats(make_batches(pairs, source_tokenizer, target_tokenizer,
                                                data_config, training=False),
                                   data_config.tokens_per_batch)
            fixed = batch_stats(fixed_size_batches(pairs, source_tokenizer, target_tokenizer,
                                                   data_config))
            entry["batches"] = _batch_entry(bucketed, data_config.tokens_per_batch)
            entry["fixed_64_batches"] = _batch_entry(fixed, None)
        result["splits"][split] = entry
    if data_config.corpora is not None:
        result["corpora"] = [_corpus_entry(data_config, corpus, source_tokenizer,
                                           target_tokenizer)
                             for corpus in data_config.corpora]
    return result


def corpus_name(corpus: CorpusConfig) -> str:
    """How reports name a corpus: its files, or its dataset and split."""
    if corpus.dataset == "file_pair":
        return f"{corpus.source_file} + {corpus.target_file}"
    return f"{corpus.dataset} {corpus.train_split or '(train split)'}"


def _corpus_entry(data_config: DataConfig, corpus: CorpusConfig, source_tokenizer,
                  target_tokenizer) -> dict:
    """`data_stats` of one of `data.corpora`: pairs kept and dropped, tokens (START and END
    included) of the kept pairs, batches, and its share of the training batches."""
    pairs = load_corpus_pairs(data_config, corpus)
    stats = pair_stats(pairs, source_tokenizer, target_tokenizer, data_config)
    batches = batch_stats(make_batches(pairs, source_tokenizer, target_tokenizer, data_config,
                                       training=False), data_config.tokens_per_batch)
    weights = [entry.weight for entry in data_config.corpora]
    return {"name": corpus_name(corpus), "weight": corpus.weight, "tag": corpus.tag,
            "share": corpus.weight / sum(weights), "pairs": stats.total, "kept": stats.kept,
            "dropped": stats.dropped, "source_tokens": batches.source_tokens,
            "target_tokens": batches.target_tokens, "batches": batches.batches,
            "partial_batches": batches.partial_batches,
            "partial_target_tokens": batches.partial_target_tokens}


def _batch_entry(stats: BatchStats, budget: int | None) -> dict:
    entry = {
        "batches": stats.batches,
        "pairs": stats.pairs,
        "shapes": len(stats.shapes),
        "mean_pairs_per_batch": stats.pairs / max(stats.batches, 1),
        "mean_source_tokens": stats.source_tokens / max(stats.batches, 1),
        "mean_target_tokens": stats.target_tokens / max(stats.batches, 1),
        "max_padded_tokens": stats.max_padded_tokens,
        "source_padding": stats.padding_fraction("source"),
        "target_padding": stats.padding_fraction("target"),
    }
    if budget is not None:
        entry["tokens_per_batch"] = budget
        entry["partial_batches"] = stats.partial_batches
        entry["partial_target_share"] = stats.partial_target_tokens / max(stats.target_tokens, 1)
    return entry
