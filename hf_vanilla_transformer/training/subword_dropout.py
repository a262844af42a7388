"""BPE-dropout (Provilkov et al., 2020): a new segmentation of the training pairs every epoch.

The paper encodes every sentence the same way, with the deterministic merges of its byte-pair encoding
(Section 5.1). BPE-dropout, a regularizer of small-data translation that the paper does not use, applies
the same merges while dropping each applicable merge with probability ``p`` at every step, so one word is
cut into different, smaller known subwords from one epoch to the next: the model learns how the pieces of
its vocabulary compose, and sees rare words in the pieces it must translate them from. Only training pairs
are resampled; evaluation and translation keep the deterministic segmentation (``p = 0``).

Every draw is seeded, so a run is reproducible and resumes on the same segmentations. Re-running the merges
of every word of every sentence each epoch in Python would take a sizeable part of a short run on a CPU, so
each distinct word gets a pool of ``samples_per_word`` segmentations, drawn once, and each of its
occurrences takes one of them at random each epoch (a vectorized draw over the whole corpus). Words that
hold a token the merges cannot rebuild (``<unk>``) keep their segmentation.

The number of batches of an epoch is planned once, on the expected length of each pair under dropout (the
mean over the pools of its words); each epoch then packs its own lengths into that many batches
(``TokenBudgetBatchSampler``'s ``epoch_lengths``), so batches hold about the token budget, and little
padding, whatever the epoch's draw.

The words and pools are built in memory, in one pass of Python over the tokenized corpus: seconds for
Multi30k's 29,000 pairs, but minutes and gigabytes for a corpus of millions of pairs.
"""

import json
import random
from collections.abc import Sequence

import datasets
import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

# Segmentations drawn for each distinct word: enough that the frequent words, whose occurrences fill most
# batches, show their common segmentations in every epoch.
SAMPLES_PER_WORD = 32


class BpeDropout:
    """The merges of a BPE tokenizer, applied with BPE-dropout to one pre-tokenized word at a time.

    The tokenizer must be a fast tokenizer with a plain BPE model (no subword prefix or suffix, no byte
    fallback), as `train_shared_bpe_tokenizer` learns; with ``p = 0`` ``segment`` gives its tokens exactly.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, p: float) -> None:
        if not 0 <= p < 1:
            raise ValueError(f"The BPE-dropout probability must be at least 0 and below 1, got {p}.")
        backend = getattr(tokenizer, "backend_tokenizer", None)
        model = json.loads(backend.to_str())["model"] if backend is not None else {}
        plain_bpe = model.get("type") == "BPE" and not (
            model.get("continuing_subword_prefix")
            or model.get("end_of_word_suffix")
            or model.get("byte_fallback")
        )
        if not plain_bpe:
            kind = model.get("type", "non-BPE")
            raise ValueError(
                "BPE-dropout needs a BPE tokenizer like the ones `train` learns (a fast tokenizer with a "
                f"plain BPE model); this one is {type(tokenizer).__name__} with a {kind} model. Train "
                "without --subword-dropout, or with a tokenizer that `train` learned."
            )
        self.p = p
        self.vocab: dict[str, int] = model["vocab"]
        # A character outside the vocabulary takes part in no merge and becomes <unk>, as in the tokenizer.
        self.unk_id = self.vocab.get(model.get("unk_token"))
        merges = [
            tuple(merge.split(" ", 1)) if isinstance(merge, str) else tuple(merge)
            for merge in model["merges"]
        ]
        self.ranks: dict[tuple[str, str], int] = {pair: rank for rank, pair in enumerate(merges)}

    def segment(self, word: str, rng: random.Random) -> list[int]:
        """Token ids of ``word`` (one pre-tokenized word, "▁" included): from its characters, repeatedly
        merge the adjacent pair of lowest merge rank (the leftmost of equals), each candidate pair dropped
        with probability ``p`` at each step; stop when no pair is left to merge."""
        symbols = list(word)
        while len(symbols) > 1:
            best_rank, best_position = len(self.ranks), -1
            for position in range(len(symbols) - 1):
                rank = self.ranks.get((symbols[position], symbols[position + 1]))
                if rank is not None and rank < best_rank and not (self.p and rng.random() < self.p):
                    best_rank, best_position = rank, position
            if best_position < 0:
                break
            symbols[best_position : best_position + 2] = [symbols[best_position] + symbols[best_position + 1]]
        return [self.vocab.get(symbol, self.unk_id) for symbol in symbols]


class _Side:
    """One side (source or target) of the tokenized corpus as words: the word type of every word occurrence,
    row after row, and where each row's words start. A word starts at a token beginning with "▁"."""

    def __init__(
        self, rows: Sequence[Sequence[int]], word_types: dict[tuple[int, ...], int], starts_word: list[bool]
    ) -> None:
        types: list[int] = []
        offsets = [0]
        lengths = []
        for row in rows:
            lengths.append(len(row))
            word: list[int] = []
            for token in row[:-1]:  # every row ends with the </s> that the tokenizer appends
                if word and starts_word[token]:
                    types.append(word_types.setdefault(tuple(word), len(word_types)))
                    word = []
                word.append(token)
            if word:
                types.append(word_types.setdefault(tuple(word), len(word_types)))
            offsets.append(len(types))
        self.types = np.asarray(types, dtype=np.int64)
        self.row_offsets = np.asarray(offsets, dtype=np.int64)
        self.deterministic_lengths = np.asarray(lengths, dtype=np.int64)

    def row_sums(self, per_occurrence: np.ndarray) -> np.ndarray:
        """The sum of a per-word-occurrence quantity over each row."""
        totals = np.concatenate([[0], np.cumsum(per_occurrence)])
        return totals[self.row_offsets[1:]] - totals[self.row_offsets[:-1]]


class SubwordDropoutDataset(torch.utils.data.Dataset):
    """Tokenized training pairs (``input_ids``, ``attention_mask``, ``labels``, as `tokenize_pairs` gives
    them) resegmented with BPE-dropout each epoch; ``set_epoch`` chooses the epoch, as accelerate's
    dataloaders call it. Pairs whose segmentation grows beyond ``max_length`` keep their deterministic one.
    """

    def __init__(
        self,
        tokenized: datasets.Dataset,
        tokenizer: PreTrainedTokenizerBase,
        p: float,
        *,
        seed: int,
        max_length: int,
        samples_per_word: int = SAMPLES_PER_WORD,
    ) -> None:
        bpe = BpeDropout(tokenizer, p)
        self.tokenized = tokenized
        self.seed = seed
        self.max_length = max_length
        self.eos_token_id = tokenizer.eos_token_id
        self.epoch: int | None = None
        # Per side, the epoch last segmented and its arrays (see _segmented).
        self._epoch_rows: dict[str, tuple] = {}

        id_to_token = {index: token for token, index in tokenizer.get_vocab().items()}
        starts_word = [id_to_token.get(index, "").startswith("▁") for index in range(max(id_to_token) + 1)]
        special_ids = set(tokenizer.all_special_ids)
        word_types: dict[tuple[int, ...], int] = {}
        self.sides = {
            column: _Side(tokenized[column], word_types, starts_word) for column in ("input_ids", "labels")
        }

        # One pool of segmentations per word type, drawn in the order the types first occur.
        rng = random.Random(seed)
        pool_ids: list[int] = []
        lengths = np.empty((len(word_types), samples_per_word), dtype=np.int64)
        for word_type, (tokens, _) in enumerate(sorted(word_types.items(), key=lambda item: item[1])):
            text = "".join(id_to_token[token] for token in tokens)
            rebuildable = special_ids.isdisjoint(tokens)
            for sample in range(samples_per_word):
                segmentation = bpe.segment(text, rng) if rebuildable else list(tokens)
                lengths[word_type, sample] = len(segmentation)
                pool_ids.extend(segmentation)
        self._pool_ids = np.asarray(pool_ids, dtype=np.int64)
        self._pool_lengths = lengths
        self._pool_starts = np.concatenate([[0], np.cumsum(lengths.ravel())[:-1]]).reshape(lengths.shape)

    def __len__(self) -> int:
        return len(self.tokenized)

    def set_epoch(self, epoch: int) -> None:
        """Segment the corpus as epoch ``epoch`` does (the same on every process and in every run)."""
        self.epoch = epoch

    def expected_lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """Expected source and target length of every pair under dropout, ``</s>`` included, rounded: the
        lengths that the number of batches of an epoch is planned on."""
        mean_lengths = self._pool_lengths.mean(axis=1)
        source, target = (
            np.rint(side.row_sums(mean_lengths[side.types])).astype(np.int64) + 1
            for side in self.sides.values()
        )
        return source, target

    def epoch_lengths(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Source and target length of every pair in epoch ``epoch``, ``</s>`` included."""
        source, target = (self._segmented(column, epoch)[2] for column in self.sides)
        return source, target

    def _segmented(self, column: str, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One side in epoch ``epoch``: its token ids, flat; where each row starts in them; and each row's
        length with ``</s>`` (the deterministic length where the drawn one exceeds ``max_length``)."""
        cached = self._epoch_rows.get(column)
        if cached is None or cached[0] != epoch:
            side = self.sides[column]
            rng = np.random.default_rng([self.seed, epoch, list(self.sides).index(column)])
            choice = rng.integers(self._pool_lengths.shape[1], size=len(side.types))
            starts = self._pool_starts[side.types, choice]
            lengths = self._pool_lengths[side.types, choice]
            # Token k of the epoch's flat side lies at pool position starts[word] + (k - first token of word).
            firsts = np.cumsum(lengths) - lengths
            positions = np.repeat(starts - firsts, lengths) + np.arange(lengths.sum())
            row_starts = np.concatenate([[0], np.cumsum(lengths)])[side.row_offsets]
            row_lengths = np.diff(row_starts) + 1
            too_long = row_lengths > self.max_length
            row_lengths[too_long] = side.deterministic_lengths[too_long]
            cached = self._epoch_rows[column] = (epoch, self._pool_ids[positions], row_starts, row_lengths)
        return cached[1:]

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        example = {}
        for column in self.sides:
            ids, row_starts, row_lengths = self._segmented(column, self.epoch or 0)
            tokens = ids[row_starts[index] : row_starts[index + 1]].tolist() + [self.eos_token_id]
            if len(tokens) != row_lengths[index]:  # drawn beyond max_length
                tokens = list(self.tokenized[index][column])
            example[column] = tokens
        example["attention_mask"] = [1] * len(example["input_ids"])
        return example
