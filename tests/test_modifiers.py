"""The training-pair modifiers (`keras_transformer.data.modifiers`, `data.modifiers`): what each does
to a pair, that the draws are seeded, and that a training stream applies them anew every pass
and only to training batches."""

import collections
import hashlib
import random

import pytest

from keras_transformer.data import modifiers
from keras_transformer.config import ConfigError, DataConfig, ExperimentConfig, ModifiersConfig

SOURCE = "Ein Mann mit einem orangefarbenen Hut starrt auf etwas."
TARGET = "A man in an orange hat starring at something."


def test_case_modifiers_change_the_source_and_with_case_target_the_target():
    assert modifiers.modify_pair(SOURCE, TARGET, {"upper_case": 1.0}, random.Random(0)) == (
        "EIN MANN MIT EINEM ORANGEFARBENEN HUT STARRT AUF ETWAS.", TARGET)
    assert modifiers.modify_pair(SOURCE, TARGET, {"upper_case": 1.0}, random.Random(0),
                                 case_target=True) == (
        "EIN MANN MIT EINEM ORANGEFARBENEN HUT STARRT AUF ETWAS.",
        "A MAN IN AN ORANGE HAT STARRING AT SOMETHING.")
    assert modifiers.upper_case("Straße") == "STRASSE"
    assert modifiers.modify_pair("ein Hund", "a dog", {"title_case": 1.0},
                                 random.Random(0)) == ("Ein Hund", "a dog")
    assert modifiers.modify_pair("ein Hund", "a dog", {"title_case": 1.0}, random.Random(0),
                                 case_target=True) == ("Ein Hund", "A Dog")
    assert modifiers.title_case("3 iPhones, über 20") == "3 IPhones, Über 20"


def test_typos_change_about_one_word_in_six_of_the_source_only():
    rng = random.Random(1)
    changed_words = []
    for _ in range(200):
        source, target = modifiers.modify_pair(SOURCE, TARGET, {"typos": 1.0}, rng)
        assert target == TARGET
        words = source.split(" ")
        assert len(words) == len(SOURCE.split(" "))
        changed_words.append(sum(a != b for a, b in zip(words, SOURCE.split(" "))))
    # 9 words of 2+ letters: round(9 / 6) = 2 typos, a word's typo rarely undone by chance
    assert collections.Counter(changed_words).most_common(1)[0][0] == 2
    assert min(changed_words) >= 1
    for word in ("Hund", "ÄRGER", "zu"):
        for seed in range(50):
            typo = modifiers.typo(word, random.Random(seed))
            assert typo != word and abs(len(typo) - len(word)) <= 1
    assert modifiers.typo("a", random.Random(0)) == "a"  # too short to change
    assert modifiers.typos("42 !", random.Random(0)) == "42 !"  # no word to change


def test_copied_spans_go_into_both_sides_at_the_same_relative_place():
    rng = random.Random(2)
    kinds = collections.Counter()
    for _ in range(300):
        source, target = modifiers.modify_pair(SOURCE, TARGET, {"copy_spans": 1.0}, rng)
        extra_source = [w for w in source.split(" ") if w not in SOURCE.split(" ")]
        extra_target = [w for w in target.split(" ") if w not in TARGET.split(" ")]
        assert extra_source == extra_target and extra_source  # the same span on both sides
        span = " ".join(extra_source)
        place = source.split(" ").index(extra_source[0])
        target_place = target.split(" ").index(extra_target[0])
        if place == 0:
            assert target_place == 0
        elif place == len(SOURCE.split(" ")):
            assert target.endswith(span)
        kinds["number" if any(c.isdigit() for c in span) and "." not in span.strip(".,")
              or span[:1].isdigit() else "url" if "." in span and any(
                  c.isalpha() for c in span) else "name" if span[:1].isupper() else "emoji"] += 1
    assert set(kinds) == {"number", "name", "url", "emoji"}


def test_a_leading_tag_and_empty_pairs_are_kept():
    shares = {"upper_case": 1.0, "title_case": 1.0, "typos": 1.0, "copy_spans": 1.0}
    source, _ = modifiers.modify_pair("<BT> ein hund", "a dog", shares, random.Random(0))
    assert source.startswith("<BT> ")
    assert modifiers.modify_pair("", "a dog", shares, random.Random(0)) == ("", "a dog")


def test_a_batch_is_modified_by_its_seed_pass_and_place_alone():
    sources = [SOURCE.encode()] * 64
    targets = [TARGET.encode()] * 64
    shares = {"upper_case": 0.3, "typos": 0.3, "copy_spans": 0.3}
    once = modifiers.modify_batch(sources, targets, shares, 7, 2, 5)
    assert once == modifiers.modify_batch(sources, targets, shares, 7, 2, 5)
    for other in ((8, 2, 5), (7, 3, 5), (7, 2, 6)):
        assert once != modifiers.modify_batch(sources, targets, shares, *other)
    upper = sum(s.decode().isupper() for s, _ in zip(*once))
    assert 5 <= upper <= 35  # about 0.3 of 64


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan")])
def test_a_share_outside_0_to_1_is_refused(value):
    with pytest.raises(ConfigError, match=r"data.modifiers.typos=.* must be a share of the "
                                          r"training pairs, in \[0, 1\]"):
        ModifiersConfig(typos=value)


def test_modifiers_are_a_config_section_that_older_runs_lack():
    config = ExperimentConfig.from_dict({"data": {"modifiers": {"upper_case": 0.05}}})
    assert config.data.modifiers == ModifiersConfig(upper_case=0.05)
    assert config.data.modifiers.shares() == {"upper_case": 0.05}
    assert not ExperimentConfig.from_dict({"data": {}}).data.modifiers.active
    with pytest.raises(ConfigError, match="unknown config key 'data.modifiers.lower_case'"):
        ExperimentConfig.from_dict({"data": {"modifiers": {"lower_case": 0.1}}})
    again = ExperimentConfig.from_dict(config.to_dict())
    assert again.data.modifiers == config.data.modifiers


def test_a_training_stream_modifies_each_pass_anew_and_validation_never(
        sentencepiece_vocab, sentencepiece_tokenizers):
    from keras_transformer import data as data_lib

    config, _ = sentencepiece_vocab
    config = DataConfig(**{**vars(config), "max_pair_length": 256, "tokens_per_batch": 2048,
                           "carry_remainders": False,
                           "modifiers": ModifiersConfig(upper_case=0.5, copy_spans=0.5,
                                                        case_target=True)})
    tokenizer, _ = sentencepiece_tokenizers
    pairs = data_lib.load_pairs(config, "validation").take(300)
    texts = sorted(t.decode() for _, t in pairs.as_numpy_iterator())

    def stream():
        return data_lib.TrainingStream(pairs, tokenizer, tokenizer, config, seed=3)

    def targets(batches, count):
        found = []
        for _, target_out in batches.take(count).as_numpy_iterator():
            found += [t.decode() for t in tokenizer.detokenize(target_out).numpy()]
        return found

    first = stream()
    length = first.pass_length()
    one_pass = targets(first.batches(), length)
    assert len(one_pass) == len(texts)  # without carrying, a pass is every pair once

    def capitals(text):  # an inserted span keeps its case
        letters = [c for c in text if c.isalpha()]
        return sum(c.isupper() for c in letters) > 0.7 * len(letters)

    upper = sum(map(capitals, one_pass))
    assert 0.35 * len(one_pass) < upper < 0.65 * len(one_pass)
    plain = [t.lower() for t in texts]
    assert sum(t.lower() not in plain for t in one_pass) > 0.3 * len(one_pass)  # spans put in
    # A stream built anew (a resumed run) reads the same modified batches; the next pass
    # draws anew.
    again = stream().batches()
    fingerprint = [hashlib.sha1(t.numpy().tobytes()).hexdigest()
                   for _, t in again.take(3)]
    assert fingerprint == [hashlib.sha1(t.numpy().tobytes()).hexdigest()
                           for _, t in stream().batches().take(3)]
    second_pass = targets(stream().batches(length), length)
    assert sorted(second_pass) != sorted(one_pass)
    # Validation batches are the text as it is.
    batches = data_lib.make_batches(pairs, tokenizer, tokenizer, config, training=False)
    validation = sorted(t for t in targets(batches, 10_000))
    assert validation == texts
