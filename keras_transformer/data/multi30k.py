"""A tfds builder for Multi30k task 1 (Elliott et al., 2016): image captions in en, de and fr.

Importing this module registers the builder as `multi30k` (`keras_transformer.data` imports it
when it loads the dataset).
Each example holds the three line-aligned translations: {"en": ..., "de": ..., "fr": ...}.

Where the raw files come from, in this order:
1. a local folder holding `{train,val,test_2016_flickr}.{en,de,fr}.gz`: tfds' manual_dir
   (`download_config=tfds.download.DownloadConfig(manual_dir=...)`), else $KERAS_TRANSFORMER_DATA;
2. a download from `Multi30k.url_base` (the public Multi30k repository), which the environment
   variable $KERAS_TRANSFORMER_MULTI30K_URL overrides (e.g. a mirror, or a test server).
"""

from __future__ import annotations

import os
from pathlib import Path

import tensorflow_datasets as tfds

from keras_transformer.config import DATA_ENV
from keras_transformer.data.text_io import read_parallel_lines

URL_ENV = "KERAS_TRANSFORMER_MULTI30K_URL"
LANGUAGES = ("en", "de", "fr")
# tfds split name -> file name prefix in the Multi30k repository.
SPLIT_FILES = {"train": "train", "validation": "val", "test_2016_flickr": "test_2016_flickr"}


class Multi30k(tfds.core.GeneratorBasedBuilder):
    """Multi30k task 1 raw text, splits train (29,000), validation (1,014), test_2016_flickr (1,000)."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Task 1 raw text: en, de, fr; train, val, test_2016_flickr."}
    MANUAL_DOWNLOAD_INSTRUCTIONS = (
        "Optional: a folder holding {train,val,test_2016_flickr}.{en,de,fr}.gz from "
        "https://github.com/multi30k/dataset/tree/master/data/task1/raw. Without it the files "
        "are downloaded.")
    url_base = "https://github.com/multi30k/dataset/raw/master/data/task1/raw/"

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(
            description="Multi30k task 1: Flickr30k image captions translated into German and "
                        "French (raw text, not tokenized).",
            features=tfds.features.Translation(languages=LANGUAGES),
            supervised_keys=("de", "en"),
            disable_shuffling=True,  # keep file order: example i is line i (references stay aligned)
            homepage="https://github.com/multi30k/dataset",
            citation="Elliott, Frank, Sima'an, Specia. Multi30K: Multilingual English-German "
                     "Image Descriptions. Workshop on Vision and Language, 2016.",
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        local = self._local_folder(dl_manager)
        if local is not None:
            files = {split: {lang: local / f"{prefix}.{lang}.gz" for lang in LANGUAGES}
                     for split, prefix in SPLIT_FILES.items()}
        else:
            base = os.environ.get(URL_ENV, self.url_base).rstrip("/") + "/"
            urls = {split: {lang: f"{base}{prefix}.{lang}.gz" for lang in LANGUAGES}
                    for split, prefix in SPLIT_FILES.items()}
            files = dl_manager.download(urls)  # same nesting, local paths to the .gz files
        return {split: self._generate_examples(paths) for split, paths in files.items()}

    @staticmethod
    def _local_folder(dl_manager) -> Path | None:
        """The manual_dir or $KERAS_TRANSFORMER_DATA, if it holds every raw file; else None."""
        candidates = []
        try:
            candidates.append(Path(dl_manager.manual_dir))
        except AssertionError:  # tfds raises it when no manual_dir was configured
            pass
        if os.environ.get(DATA_ENV):
            candidates.append(Path(os.environ[DATA_ENV]))
        needed = [f"{prefix}.{lang}.gz" for prefix in SPLIT_FILES.values() for lang in LANGUAGES]
        for folder in candidates:
            if folder.is_dir() and all((folder / name).is_file() for name in needed):
                return folder
        return None

    def _generate_examples(self, paths: dict):
        for line_number, sentences in read_parallel_lines(paths):
            yield line_number, sentences
