"""BPE-dropout (Provilkov et al., 2020): with p = 0 it is the tokenizer's own BPE, token for token; with
p > 0 every segmentation spells the same text in known subwords, changes from epoch to epoch, and is the same
again for the same seed and epoch."""

import random

import datasets
import numpy as np
import pytest
from conftest import REPO_ROOT
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from hf_vanilla_transformer.common.tokenization import train_shared_bpe_tokenizer
from hf_vanilla_transformer.training.data import tokenize_pairs
from hf_vanilla_transformer.training.subword_dropout import BpeDropout, SubwordDropoutDataset


def multi30k(split: str, lang: str, count: int) -> list[str]:
    return (REPO_ROOT / "data" / "multi30k" / f"{split}.{lang}").read_text().split("\n")[:count]


@pytest.fixture(scope="module")
def pairs() -> datasets.Dataset:
    return datasets.Dataset.from_dict(
        {"src": multi30k("train", "en", 400), "tgt": multi30k("train", "de", 400)}
    )


@pytest.fixture(scope="module")
def tokenizer(pairs) -> PreTrainedTokenizerFast:
    return train_shared_bpe_tokenizer(pairs, vocab_size=600, show_progress=False)


@pytest.fixture(scope="module")
def tokenized(pairs, tokenizer) -> datasets.Dataset:
    return tokenize_pairs(pairs, tokenizer, 256, 256)


def words(tokenizer, sentence: str) -> list[str]:
    normalized = tokenizer.backend_tokenizer.normalizer.normalize_str(sentence)
    return [word for word, _ in tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(normalized)]


def test_without_dropout_the_merges_give_the_tokenizers_own_tokens(tokenizer):
    """Unseen sentences too: the merges, not a lookup of the training words."""
    bpe = BpeDropout(tokenizer, 0.0)
    for sentence in multi30k("val", "de", 100) + multi30k("val", "en", 100):
        segmented = [
            token for word in words(tokenizer, sentence) for token in bpe.segment(word, random.Random(0))
        ]
        assert segmented == tokenizer(sentence, add_special_tokens=False)["input_ids"], sentence


def test_dropout_spells_the_same_words_in_more_known_subwords(tokenizer):
    deterministic, dropped = BpeDropout(tokenizer, 0.0), BpeDropout(tokenizer, 0.3)
    rng = random.Random(0)
    vocabulary = set(tokenizer.get_vocab().values())
    more = fewer = 0
    for word in words(tokenizer, " ".join(multi30k("val", "de", 50))):
        once, again = deterministic.segment(word, rng), dropped.segment(word, rng)
        if tokenizer.unk_token_id in once:
            continue  # a character this small vocabulary lacks
        assert "".join(tokenizer.convert_ids_to_tokens(again)) == word
        assert set(again) <= vocabulary
        # A dropped merge can open another path to fewer tokens, but far more words come out longer.
        more += len(again) > len(once)
        fewer += len(again) < len(once)
    assert more > 50 and more > 10 * fewer  # of some 650 words


def test_without_dropout_the_dataset_is_the_tokenized_pairs(tokenized, tokenizer):
    dataset = SubwordDropoutDataset(tokenized, tokenizer, 0.0, seed=1, max_length=256, samples_per_word=2)
    dataset.set_epoch(3)
    for index in range(len(tokenized)):
        assert dataset[index] == tokenized[index]
    expected_source, expected_target = dataset.expected_lengths()
    assert expected_source.tolist() == [len(ids) for ids in tokenized["input_ids"]]
    assert expected_target.tolist() == [len(ids) for ids in tokenized["labels"]]


def test_each_epoch_resegments_the_same_text_reproducibly(tokenized, tokenizer):
    def epoch(dataset: SubwordDropoutDataset, number: int) -> list[dict]:
        dataset.set_epoch(number)
        return [dataset[index] for index in range(len(dataset))]

    dataset = SubwordDropoutDataset(tokenized, tokenizer, 0.1, seed=7, max_length=256)
    first, second = epoch(dataset, 0), epoch(dataset, 1)
    for column in ("input_ids", "labels"):
        texts = tokenizer.batch_decode([list(ids) for ids in tokenized[column]])
        for examples in (first, second):
            assert tokenizer.batch_decode([example[column] for example in examples]) == texts
            assert all(example[column][-1] == tokenizer.eos_token_id for example in examples)
    assert all(len(example["attention_mask"]) == len(example["input_ids"]) for example in first)
    changed = sum(one != other for one, other in zip(first, second, strict=True))
    assert changed > 0.8 * len(tokenized)

    assert epoch(SubwordDropoutDataset(tokenized, tokenizer, 0.1, seed=7, max_length=256), 1) == second
    assert epoch(dataset, 0) == first
    assert epoch(SubwordDropoutDataset(tokenized, tokenizer, 0.1, seed=8, max_length=256), 1) != second


def test_batches_are_planned_on_the_mean_length_under_dropout(tokenized, tokenizer):
    dataset = SubwordDropoutDataset(tokenized, tokenizer, 0.1, seed=1, max_length=256)
    lengths = []
    for number in range(20):
        dataset.set_epoch(number)
        lengths.append([len(dataset[index]["labels"]) for index in range(len(dataset))])
    mean = np.mean(lengths, axis=0)
    _, expected = dataset.expected_lengths()
    assert expected.sum() > 1.05 * sum(len(ids) for ids in tokenized["labels"])
    assert expected.sum() == pytest.approx(mean.sum(), rel=0.02)


def test_pairs_beyond_the_length_limit_keep_their_deterministic_segmentation(tokenized, tokenizer):
    limit = max(len(ids) for ids in tokenized["labels"])
    dataset = SubwordDropoutDataset(tokenized, tokenizer, 0.5, seed=1, max_length=limit)
    dataset.set_epoch(0)
    examples = [dataset[index] for index in range(len(dataset))]
    assert max(len(example["labels"]) for example in examples) <= limit
    kept = [
        index for index, example in enumerate(examples) if example["labels"] == tokenized[index]["labels"]
    ]
    assert any(len(tokenized[index]["labels"]) == limit for index in kept)


def test_words_the_merges_cannot_rebuild_keep_their_tokens(tokenizer):
    """An <unk> (a character the vocabulary lacks) cannot be rebuilt from merges: its word stays as it is."""
    sentence = "Ein Mann ☃☃ mit Hund."
    tokenized = tokenize_pairs(
        datasets.Dataset.from_dict({"src": [sentence], "tgt": [sentence]}), tokenizer, 64, 64
    )
    assert tokenizer.unk_token_id in tokenized[0]["labels"]
    dataset = SubwordDropoutDataset(tokenized, tokenizer, 0.9, seed=1, max_length=64)
    for number in range(5):
        dataset.set_epoch(number)
        assert tokenizer.convert_ids_to_tokens(dataset[0]["labels"]).count("<unk>") == 2
        assert tokenizer.decode(dataset[0]["labels"]) == tokenizer.decode(tokenized[0]["labels"])


@pytest.mark.parametrize("p", [-0.1, 1.0])
def test_dropout_probability_out_of_range_is_refused(tokenizer, p):
    with pytest.raises(ValueError, match="at least 0 and below 1"):
        BpeDropout(tokenizer, p)


def test_a_tokenizer_without_bpe_merges_is_refused():
    backend = Tokenizer(models.WordLevel({"<unk>": 0, "▁a": 1}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    word_level = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")
    with pytest.raises(ValueError, match="needs a BPE tokenizer.*WordLevel model.*without --subword-dropout"):
        BpeDropout(word_level, 0.1)
