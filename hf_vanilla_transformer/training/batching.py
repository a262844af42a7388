"""Token-budget batching of sentence pairs (Vaswani et al., 2017, Section 5.1).

"Sentence pairs were batched together by approximate sequence length. Each training batch contained a set of
sentence pairs containing approximately 25000 source tokens and 25000 target tokens." The budget here counts
*padded* tokens (batch size times the longest sequence, for each side), which is what memory and compute pay
for. A collator that pads further (``pad_to_multiple_of``) can exceed the budget by that rounding. The paper's
25000 is per training step on 8 GPUs; ``max_tokens`` is per process and micro-batch, so the paper's setting
is ``25000 / (processes * gradient_accumulation_steps)``.

Multi-process training: every process builds the same batches from the same seed and epoch, then keeps every
``num_replicas``-th one starting at ``rank``. So that every process runs the same number of steps (a missing
step would hang the gradient all-reduce) without repeating or dropping examples, the batch count is first
raised to a multiple of ``num_replicas`` by splitting the batches holding the most pairs in two: the
"remainder" becomes a few smaller batches, and every example is still seen exactly once per epoch.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow.compute as pc
import torch
from torch.utils.data import DataLoader, Sampler

if TYPE_CHECKING:
    import datasets


def check_pairs_and_replicas(
    src_lengths: Sequence[int], tgt_lengths: Sequence[int], num_replicas: int, rank: int
) -> None:
    """ValueError unless the two lists of lengths describe the same sentence pairs and `rank` is one of
    `num_replicas` processes: what every batch sampler of pairs is given."""
    if len(src_lengths) != len(tgt_lengths):
        raise ValueError(
            f"src_lengths has {len(src_lengths)} entries but tgt_lengths has {len(tgt_lengths)}; "
            "they must describe the same sentence pairs."
        )
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {num_replicas}.")
    if not 0 <= rank < num_replicas:
        raise ValueError(f"rank must be in [0, {num_replicas - 1}], got {rank}.")


class TokenBudgetBatchSampler(Sampler[list[int]]):
    """Batch sampler yielding lists of example indices whose padded size fits a token budget (Section 5.1).

    Pairs are sorted by (source length, target length) after a seeded shuffle, so equal-length pairs land in
    different batches each epoch, and packed greedily: a pair joins the current batch while
    ``batch_size * max_source_len <= max_tokens`` and ``batch_size * max_target_len <= max_tokens``.
    The order of the batches is shuffled each epoch from ``seed + epoch`` (call ``set_epoch``).

    For pairs whose lengths change from epoch to epoch (BPE-dropout), pass their expected lengths and
    ``epoch_lengths``, which gives an epoch's own: the number of batches (``len``) is planned on the expected
    lengths, as the Trainer needs one number for every epoch, and each epoch packs its own lengths into that
    many batches, with batches split when it comes out shorter, and the budget stretched by the percent or
    two needed when it comes out longer.

    Pass it as ``DataLoader(dataset, batch_sampler=sampler)``. It deliberately has no ``batch_size``
    attribute: accelerate's ``BatchSamplerShard`` would then keep only batches of exactly that size. With
    accelerate (and so ``transformers.Trainer``), give the sampler ``num_replicas`` and ``rank``, and call
    ``bypass_accelerate_sharding`` on the prepared dataloader.
    """

    def __init__(
        self,
        src_lengths: Sequence[int],
        tgt_lengths: Sequence[int],
        max_tokens: int,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        epoch_lengths: Callable[[int], tuple[np.ndarray, np.ndarray]] | None = None,
    ) -> None:
        check_pairs_and_replicas(src_lengths, tgt_lengths, num_replicas, rank)
        if len(src_lengths) == 0:
            raise ValueError("Cannot batch an empty dataset (src_lengths and tgt_lengths are empty).")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {max_tokens}.")
        self.src_lengths = np.asarray(src_lengths, dtype=np.int64)
        self.tgt_lengths = np.asarray(tgt_lengths, dtype=np.int64)
        self.max_tokens = max_tokens
        too_long = np.flatnonzero(np.maximum(self.src_lengths, self.tgt_lengths) > max_tokens)
        if too_long.size:
            index = int(too_long[0])
            src_len, tgt_len = int(self.src_lengths[index]), int(self.tgt_lengths[index])
            side, length = ("source", src_len) if src_len >= tgt_len else ("target", tgt_len)
            raise ValueError(
                f"Example {index} has a {side} length of {length} tokens, more than the token budget "
                f"max_tokens={max_tokens}, so it fits in no batch ({too_long.size} example(s) in all). Raise "
                f"--max-tokens to at least {length}, or filter out long pairs (tokenize_pairs(..., "
                "long_pairs='filter') with smaller max_source_length / max_target_length)."
            )
        self.shuffle = shuffle
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch_lengths = epoch_lengths
        self.epoch = 0
        # Equal-length pairs are interchangeable for packing, so the batch sizes (and hence len()) do not
        # depend on the epoch's shuffle; computing them once on the unshuffled order is exact.
        self._num_batches = len(self._build_batches(None))

    @classmethod
    def from_dataset(
        cls,
        dataset: datasets.Dataset,
        max_tokens: int,
        source_column: str = "input_ids",
        target_column: str = "labels",
        **kwargs,
    ) -> TokenBudgetBatchSampler:
        """Build the sampler from a tokenized ``datasets.Dataset`` (e.g. the output of ``tokenize_pairs``).

        The lengths are the offsets of the Arrow list columns, read into numpy arrays without decoding a row
        or copying a token, so this takes seconds and two integers per pair on millions of pairs.
        """
        return cls(
            column_lengths(dataset, source_column),
            column_lengths(dataset, target_column),
            max_tokens,
            **kwargs,
        )

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose shuffle to use; every process must pass the same value."""
        self.epoch = epoch

    def __len__(self) -> int:
        return self._num_batches // self.num_replicas

    def __iter__(self) -> Iterator[list[int]]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch) if self.shuffle else None
        batches = (
            self._build_batches(generator) if self.epoch_lengths is None else self._epoch_batches(generator)
        )
        order = (
            range(len(batches)) if generator is None else torch.randperm(len(batches), generator=generator)
        )
        yield from (batches[i].tolist() for i in list(order)[self.rank :: self.num_replicas])

    def _build_batches(self, generator: torch.Generator | None) -> list[np.ndarray]:
        """All batches of the epoch for every process, in length order; ``generator`` shuffles ties."""
        order = self._length_order(generator, self.src_lengths, self.tgt_lengths)
        batches = self._pack(order, self.src_lengths, self.tgt_lengths, self.max_tokens)
        return self._split_to_multiple_of_replicas(batches)

    def _epoch_batches(self, generator: torch.Generator | None) -> list[np.ndarray]:
        """The epoch's own lengths packed into exactly the planned number of batches."""
        src_lengths, tgt_lengths = (
            np.asarray(lengths, dtype=np.int64) for lengths in self.epoch_lengths(self.epoch)
        )
        order = self._length_order(generator, src_lengths, tgt_lengths)
        budget = self.max_tokens
        batches = self._pack(order, src_lengths, tgt_lengths, budget)
        while len(batches) > self._num_batches:
            budget += max(1, budget // 100)
            batches = self._pack(order, src_lengths, tgt_lengths, budget)
        return self._split_fullest(batches, self._num_batches - len(batches))

    @staticmethod
    def _length_order(
        generator: torch.Generator | None, src_lengths: np.ndarray, tgt_lengths: np.ndarray
    ) -> np.ndarray:
        """Pair indices in (source, target) length order, ties in the order ``generator`` shuffles them to."""
        count = len(src_lengths)
        order = np.arange(count) if generator is None else torch.randperm(count, generator=generator).numpy()
        # Two stable sorts give (source, target) order with ties kept in the shuffled order.
        order = order[np.argsort(tgt_lengths[order], kind="stable")]
        return order[np.argsort(src_lengths[order], kind="stable")]

    @staticmethod
    def _pack(
        order: np.ndarray, src_lengths: np.ndarray, tgt_lengths: np.ndarray, budget: int
    ) -> list[np.ndarray]:
        """Greedy packing of the pairs in ``order`` into batches of up to ``budget`` padded tokens a side."""
        # Greedy packing is sequential, so it runs in Python, but only over lengths: the batches themselves
        # are slices of ``order`` (numpy, not millions of Python ints).
        starts = [0]
        src_max = tgt_max = 0
        rows = zip(src_lengths[order].tolist(), tgt_lengths[order].tolist(), strict=True)
        for position, (src_len, tgt_len) in enumerate(rows):
            src_max, tgt_max = max(src_max, src_len), max(tgt_max, tgt_len)
            size = position - starts[-1] + 1
            if size > 1 and (size * src_max > budget or size * tgt_max > budget):
                starts.append(position)
                src_max, tgt_max = src_len, tgt_len
        return np.split(order, starts[1:])

    def _split_to_multiple_of_replicas(self, batches: list[np.ndarray]) -> list[np.ndarray]:
        """Halve the fullest batches until every replica gets the same number of batches."""
        missing = -len(batches) % self.num_replicas
        if len(self.src_lengths) < len(batches) + missing:
            raise ValueError(
                f"Cannot give each of the {self.num_replicas} processes the same number of batches: "
                f"{len(self.src_lengths)} examples already form {len(batches)} batches under "
                f"max_tokens={self.max_tokens}, and {len(batches) + missing} batches would be needed. "
                "Use more data, a larger --max-tokens or fewer processes."
            )
        return self._split_fullest(batches, missing)

    @staticmethod
    def _split_fullest(batches: list[np.ndarray], missing: int) -> list[np.ndarray]:
        """``missing`` more batches, by halving the batches holding the most pairs, in length order."""
        if missing == 0:
            return batches
        # Max-heap on batch size. The key tuple breaks ties identically on every process, and sorting by it
        # afterwards puts the two halves of a split batch where the batch was, keeping length order.
        heap = [(-len(batch), (position,), batch) for position, batch in enumerate(batches)]
        heapq.heapify(heap)
        for _ in range(missing):
            _, key, batch = heapq.heappop(heap)
            half = len(batch) // 2
            heapq.heappush(heap, (-half, (*key, 0), batch[:half]))
            heapq.heappush(heap, (-(len(batch) - half), (*key, 1), batch[half:]))
        return [batch for _, _, batch in sorted(heap, key=lambda item: item[1])]


def column_lengths(dataset: datasets.Dataset, column: str) -> np.ndarray:
    """Length of every row of the list column ``column``, in the dataset's row order."""
    if column not in dataset.column_names:
        raise ValueError(
            f"The dataset has no column {column!r} (it has {dataset.column_names}); tokenize it first, e.g. "
            "with tokenize_pairs, or name the token columns."
        )
    lengths = pc.list_value_length(dataset.data.column(column)).to_numpy()
    # select/shuffle/filter leave the table as it is and add a mapping from rows to table rows.
    mapping = dataset._indices
    return lengths if mapping is None else lengths[mapping.column(0).to_numpy()]


def bypass_accelerate_sharding(dataloader: DataLoader, sampler: TokenBudgetBatchSampler) -> None:
    """Make accelerate's batch-sampler sharding a pass-through for a sampler that shards itself (Section 5.1).

    ``Accelerator.prepare`` wraps the batch sampler of a DataLoader in ``BatchSamplerShard`` when there are
    several processes. That wrapper deals batches round-robin and, with the default ``even_batches=True``,
    completes the last round by repeating the first batches of the epoch (``even_batches=False`` instead
    leaves the processes with unequal step counts). ``TokenBudgetBatchSampler`` already gives each rank an
    equal, disjoint share, so the wrapper is set to one process, as ``transformers.Trainer`` does for its own
    ``BatchRebalanceSampler``. Call this on the dataloader returned by ``prepare``; with one process
    there is no wrapper and nothing changes.
    """
    wrapper = getattr(dataloader, "batch_sampler", None)
    if wrapper is sampler:
        return
    if getattr(wrapper, "batch_sampler", None) is not sampler:
        raise ValueError(
            "The dataloader's batch sampler is neither the TokenBudgetBatchSampler nor accelerate's wrapper "
            f"around it (found {type(wrapper).__name__}); pass the dataloader that Accelerator.prepare "
            "returned for a DataLoader built with batch_sampler=sampler."
        )
    wrapper.num_processes = 1
    wrapper.process_index = 0
    # Trainer forwards set_epoch only two wrappers deep; when resuming mid-epoch it adds a SkipBatchSampler
    # on top, so without this the resumed epoch would replay epoch 0's order on every process.
    wrapper.set_epoch = sampler.set_epoch
