"""Packed training batches of one static shape: the sentence pairs of a batch laid end to end in a fixed
number of rows of fixed source and target lengths, instead of each padded to the batch's longest.

The paper batches pairs "by approximate sequence length", about 25000 source and 25000 target tokens a batch
(Section 5.1); padding every pair to its batch's longest spends part of those tokens on nothing, and a new
batch shape at every step is a new graph for `torch.compile`. Here a batch is `rows` encoder rows of
`source_length` tokens and as many decoder rows of `target_length` tokens: the sources of the pairs in a row
follow one another in its encoder row, their targets in the decoder row of the same index, and only a row's
tail is padding.

Each pair is computed as it is alone:

- positions restart at 0 with each pair's source and target (`position_ids`, `decoder_position_ids`), as the
  sinusoids of Section 3.5 encode a token's position in its own sentence;
- the attention masks (`packed_attention_masks`) keep every attention inside a pair (Section 3.2.3): encoder
  self-attention within its source, decoder self-attention causal within its target, and encoder-decoder
  attention from its target to its source. They are the prepared 4-D masks that transformers' mask
  functions pass through unchanged, so the model's eager and SDPA attention both take them, and flex
  attention its block masks of the same rule (`packed_block_masks`), which skip the blocks of a row where
  no pair meets another.

The pieces:

- `place_pairs`: bin packing of pairs' (source, target) lengths into rows, largest first as in first-fit
  decreasing, each pair into the row whose two sides it leaves the most level.
- `pack_pairs` -> `PackedBatch`: the batch's tensors, and `PackedBatch.model_inputs()` what the model's
  forward takes; `with_packed_masks` builds the masks from the pairs' segment ids wherever those are, so
  that a batch can travel to a GPU as token, position and segment ids and get its masks there.
- `PackedBatchSampler`: batches of dataset indices that fill the rows, in place of the token-budget sampler
  (`batching.TokenBudgetBatchSampler`), whose batches hold up to `max_tokens` padded tokens, not real ones.
- `PackingCollator`: a data collator making `PackedBatch.model_inputs()` from tokenized pairs, or the same
  with the segment ids in place of the masks.
- `balanced_row_lengths`: source and target row lengths in the proportion of the data's tokens, so that
  neither side's rows are left part empty when the other's are full.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask
from torch.utils.data import Sampler

from .batching import check_pairs_and_replicas, column_lengths

if TYPE_CHECKING:
    import datasets

# The segment id of padding: no pair's index.
PADDING_SEGMENT = -1
# The label of positions without a loss, as transformers' losses ignore it.
IGNORED_LABEL = -100
# The keys of a collated packed batch that carries its pairs' segment ids instead of its masks.
SEGMENT_KEYS = ("source_segments", "target_segments")


def _check_row_fits(index: int, source: int, target: int, source_length: int, target_length: int) -> None:
    if source < 1 or target < 1:
        raise ValueError(
            f"Pair {index} has {source} source and {target} target tokens: every pair needs at least one "
            "token on each side (its end-of-sequence token)."
        )
    if source > source_length or target > target_length:
        raise ValueError(
            f"Pair {index} has {source} source and {target} target tokens, more than a packed row holds "
            f"(source_length={source_length}, target_length={target_length}). Raise the row lengths to at "
            f"least {max(source, source_length)} and {max(target, target_length)}, or leave out long pairs "
            "(tokenize_pairs(..., long_pairs='filter') with smaller max_source_length / max_target_length)."
        )


def _decreasing(lengths: Sequence[tuple[int, int]], source_length: int, target_length: int) -> list[int]:
    """The indices of `lengths` by decreasing share of a row (the fuller side's), then decreasing source and
    target lengths: a strict order on distinct lengths, so equal pairs keep their order (the sort is stable)
    and the packing of a batch depends on its lengths only."""
    return sorted(
        range(len(lengths)),
        key=lambda i: (
            -max(lengths[i][0] * target_length, lengths[i][1] * source_length),
            -lengths[i][0],
            -lengths[i][1],
        ),
    )


def _balanced_fit(
    lengths: Sequence[tuple[int, int]],
    order: Sequence[int],
    rows: int,
    source_length: int,
    target_length: int,
) -> np.ndarray:
    """The row of each pair of `lengths`, taken in `order`: of the rows with room for both its sides, the
    one whose two sides it leaves the most evenly filled (the first of them on ties); -1 for pairs that fit
    in no row. A row is full as soon as either side is, and keeping the sides level leaves less of the
    other side empty than taking the first row with room does (newstest2013/2014's pairs in batches of 97
    rows of 248 and 256 tokens: 0.74% of the positions padded against 2.7%). A pair that fits nowhere
    changes nothing: the others are placed as they would be without it."""
    free_source = np.full(rows, source_length, dtype=np.int64)
    free_target = np.full(rows, target_length, dtype=np.int64)
    placement = np.full(len(lengths), -1, dtype=np.int64)
    for index in order:
        source, target = lengths[index]
        room = (free_source >= source) & (free_target >= target)
        if not room.any():
            continue
        imbalance = np.abs((free_source - source) / source_length - (free_target - target) / target_length)
        row = int(np.where(room, imbalance, np.inf).argmin())
        placement[index] = row
        free_source[row] -= source
        free_target[row] -= target
    return placement


def place_pairs(
    lengths: Sequence[tuple[int, int]], rows: int, source_length: int, target_length: int
) -> np.ndarray:
    """The row of each pair of (source, target) `lengths` in a batch of `rows` rows of `source_length` and
    `target_length` tokens: as in first-fit decreasing the pairs taking the most of a row are placed first,
    each in the row with room for both its sides that it leaves the most evenly filled.
    Deterministic: the placement depends on the lengths only.

    Raises ValueError naming the pair where a pair is longer than a row, and naming the shortfall where the
    pairs do not all fit in `rows` rows (`PackedBatchSampler` makes batches that do).
    """
    for index, (source, target) in enumerate(lengths):
        _check_row_fits(index, source, target, source_length, target_length)
    placement = _balanced_fit(
        lengths, _decreasing(lengths, source_length, target_length), rows, source_length, target_length
    )
    left_out = np.flatnonzero(placement < 0)
    if left_out.size:
        source_total, target_total = (sum(side) for side in zip(*lengths, strict=True))
        raise ValueError(
            f"{len(lengths)} pairs of {source_total} source and {target_total} target tokens do not fit in "
            f"{rows} rows of {source_length} source and {target_length} target tokens ({left_out.size} pairs "
            "left over). Form the batches with PackedBatchSampler, whose batches fit, or raise rows."
        )
    return placement


def _within_pairs(
    query_segments: torch.Tensor, key_segments: torch.Tensor, causal: bool, padding_attends: bool
) -> Callable:
    """Whether a query may attend to a key, as a mask function of (row, head, query, key) indices, the form
    that transformers' mask functions and flex attention's `mask_mod` take: within the query's pair (its
    segment id that of the key), to itself and the keys before it where `causal`. A padding query attends
    to every key where `padding_attends`, else to none."""

    def allowed(
        row: torch.Tensor, head: torch.Tensor | None, query: torch.Tensor, key: torch.Tensor
    ) -> torch.Tensor:
        query_segment = query_segments[row, query]
        same_pair = query_segment == key_segments[row, key]
        if causal:
            same_pair = same_pair & (key <= query)
        if padding_attends:
            return same_pair | (query_segment == PADDING_SEGMENT)
        return same_pair & (query_segment != PADDING_SEGMENT)

    return allowed


def _packed_attentions(
    source_segments: torch.Tensor, target_segments: torch.Tensor, padding_attends: bool
) -> tuple[tuple[Callable, int, int], ...]:
    """(mask function, queries, keys) of the encoder self-attention, the decoder self-attention and the
    encoder-decoder attention of packed rows."""
    return tuple(
        (_within_pairs(queries, keys, causal, padding_attends), queries.shape[1], keys.shape[1])
        for queries, keys, causal in (
            (source_segments, source_segments, False),
            (target_segments, target_segments, True),
            (target_segments, source_segments, False),
        )
    )


def packed_attention_masks(
    source_segments: torch.Tensor, target_segments: torch.Tensor, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The additive 4-D masks (0 where a query may attend to a key, the dtype's lowest value where not) of
    packed rows, from the pair index of every source and target token (`PADDING_SEGMENT` on padding):

    - encoder self-attention (rows, 1, source, source): within the pair's source;
    - decoder self-attention (rows, 1, target, target): within the pair's target, to itself and the tokens
      before it (Section 3.1);
    - encoder-decoder attention (rows, 1, target, source): from the pair's target to its source.

    Padding queries attend to every key: no row of a mask is all masked, whose softmax would be NaN and
    whose NaN the backward pass would spread to the weights' gradients. No real token attends to padding,
    so what padding computes reaches no loss.
    """
    device = source_segments.device

    def indices(count: int) -> torch.Tensor:
        return torch.arange(count, device=device)

    # Indices broadcast to (rows, 1, queries, keys): the mask functions give every entry at once.
    rows = indices(source_segments.shape[0])[:, None, None, None]
    attend = torch.zeros((), dtype=dtype, device=device)
    ignore = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=device)
    return tuple(
        torch.where(allowed(rows, None, indices(queries)[:, None], indices(keys)), attend, ignore)
        for allowed, queries, keys in _packed_attentions(source_segments, target_segments, True)
    )


def packed_block_masks(source_segments: torch.Tensor, target_segments: torch.Tensor) -> tuple[BlockMask, ...]:
    """The masks of `packed_attention_masks` as flex attention's block masks, for a model whose
    `attn_implementation` is "flex_attention": the same rule for every real token, kept as a function of
    the indices, with the blocks of 128 x 128 that no query may attend to listed so that flex attention
    skips them. A padding query attends to no key: flex attention gives such a query zeros, not NaN, and
    the padding at a row's end then leaves its blocks empty. They are 4-D, so the model's mask functions
    pass them through to the attention as they do the dense masks."""
    rows = source_segments.shape[0]
    return tuple(
        create_block_mask(allowed, rows, None, queries, keys, device=source_segments.device)
        for allowed, queries, keys in _packed_attentions(source_segments, target_segments, False)
    )


@dataclass
class PackedBatch:
    """Pairs packed into rows (`pack_pairs`). Rows of the source side are (rows, source_length), of the
    target side (rows, target_length); a token's segment is the index of its pair in the packed list
    (`PADDING_SEGMENT` on padding), its position its place in its own sentence (0 on padding)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    source_segments: torch.Tensor
    decoder_input_ids: torch.Tensor
    decoder_position_ids: torch.Tensor
    target_segments: torch.Tensor
    labels: torch.Tensor

    @property
    def padded_fraction(self) -> float:
        """The share of the batch's source and target positions that hold no token."""
        sides = (self.source_segments, self.target_segments)
        padded = sum(int((segments == PADDING_SEGMENT).sum()) for segments in sides)
        return padded / sum(segments.numel() for segments in sides)

    def segment_inputs(self) -> dict[str, torch.Tensor]:
        """The batch as `model_inputs` gives it, with the segment ids of its tokens (`SEGMENT_KEYS`) in
        place of the masks: a few kilobytes a row where the masks take rows x length x length numbers;
        `with_packed_masks` builds them."""
        return {
            "input_ids": self.input_ids,
            "position_ids": self.position_ids,
            "source_segments": self.source_segments,
            "decoder_input_ids": self.decoder_input_ids,
            "decoder_position_ids": self.decoder_position_ids,
            "target_segments": self.target_segments,
            "labels": self.labels,
        }

    def model_inputs(self, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
        """The keyword arguments of the model's forward for this batch, labels included: token ids,
        positions and the 4-D masks of `packed_attention_masks` in `dtype`. Float32 masks serve a float32
        model, and any model under autocast or with SDPA attention; a model loaded in half precision with
        eager attention needs masks of its own dtype, which its attention weights keep."""
        return with_packed_masks(self.segment_inputs(), dtype)


def with_packed_masks(
    inputs: dict[str, torch.Tensor],
    dtype: torch.dtype = torch.float32,
    attn_implementation: str | None = None,
) -> dict:
    """A packed batch that carries its tokens' segment ids (`PackedBatch.segment_inputs`) as the model's
    keyword arguments: the segment ids replaced by the masks of `packed_attention_masks` in `dtype`, built
    on the device the segment ids are on; for a model whose `attn_implementation` is "flex_attention",
    by those of `packed_block_masks`."""
    inputs = dict(inputs)
    source_segments, target_segments = (inputs.pop(key) for key in SEGMENT_KEYS)
    if attn_implementation == "flex_attention":
        masks = packed_block_masks(source_segments, target_segments)
    else:
        masks = packed_attention_masks(source_segments, target_segments, dtype)
    return {
        **inputs,
        **dict(zip(("attention_mask", "decoder_attention_mask", "cross_attention_mask"), masks, strict=True)),
    }


def pack_pairs(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    rows: int,
    source_length: int,
    target_length: int,
    pad_id: int,
    decoder_start_id: int,
) -> PackedBatch:
    """The (source ids, target ids) `pairs` packed into `rows` rows of `source_length` source and
    `target_length` target tokens (`place_pairs`; its errors where they do not fit). Within a row the pairs
    follow one another in the order of `place_pairs`; each pair's decoder inputs are its target shifted
    right by one, starting from `decoder_start_id` (Section 3.1), and its labels the target; padding has
    `pad_id` for ids and -100 for labels."""
    sources = [torch.as_tensor(source, dtype=torch.long) for source, _ in pairs]
    targets = [torch.as_tensor(target, dtype=torch.long) for _, target in pairs]
    lengths = [(len(source), len(target)) for source, target in zip(sources, targets, strict=True)]
    placement = place_pairs(lengths, rows, source_length, target_length)
    source_shape, target_shape = (rows, source_length), (rows, target_length)
    batch = PackedBatch(
        input_ids=torch.full(source_shape, pad_id),
        position_ids=torch.zeros(source_shape, dtype=torch.long),
        source_segments=torch.full(source_shape, PADDING_SEGMENT),
        decoder_input_ids=torch.full(target_shape, pad_id),
        decoder_position_ids=torch.zeros(target_shape, dtype=torch.long),
        target_segments=torch.full(target_shape, PADDING_SEGMENT),
        labels=torch.full(target_shape, IGNORED_LABEL),
    )
    source_end, target_end = [0] * rows, [0] * rows
    for index in _decreasing(lengths, source_length, target_length):
        row = int(placement[index])
        source, target = sources[index], targets[index]
        span = slice(source_end[row], source_end[row] + len(source))
        batch.input_ids[row, span] = source
        batch.position_ids[row, span] = torch.arange(len(source))
        batch.source_segments[row, span] = index
        span = slice(target_end[row], target_end[row] + len(target))
        batch.labels[row, span] = target
        batch.decoder_input_ids[row, span.start] = decoder_start_id
        batch.decoder_input_ids[row, span.start + 1 : span.stop] = target[:-1]
        batch.decoder_position_ids[row, span] = torch.arange(len(target))
        batch.target_segments[row, span] = index
        source_end[row] += len(source)
        target_end[row] += len(target)
    return batch


class PackingCollator:
    """A data collator for the training set: tokenized pairs (`input_ids`, `labels`, as `data.tokenize_pairs`
    makes them) packed into `rows` rows of `source_length` and `target_length` tokens, as the model's
    keyword arguments (`PackedBatch.model_inputs`, masks in `mask_dtype`). Every batch has the same shape,
    so a compiled training step compiles once. The batches must fit the rows: form them with
    `PackedBatchSampler` of the same rows and lengths.

    With `with_masks=False` a batch carries its segment ids instead of its masks
    (`PackedBatch.segment_inputs`), for `with_packed_masks` to build them once it is on its device: the
    masks of a base-size batch (97 rows of 256 tokens) are about 75 MB to build on a CPU and to copy to a
    GPU, its segment ids 0.2 MB."""

    def __init__(
        self,
        rows: int,
        source_length: int,
        target_length: int,
        pad_token_id: int,
        decoder_start_token_id: int,
        mask_dtype: torch.dtype = torch.float32,
        with_masks: bool = True,
    ) -> None:
        self.rows = rows
        self.source_length = source_length
        self.target_length = target_length
        self.pad_token_id = pad_token_id
        self.decoder_start_token_id = decoder_start_token_id
        self.mask_dtype = mask_dtype
        self.with_masks = with_masks

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        pairs = [(feature["input_ids"], feature["labels"]) for feature in features]
        batch = pack_pairs(
            pairs,
            self.rows,
            self.source_length,
            self.target_length,
            self.pad_token_id,
            self.decoder_start_token_id,
        )
        return batch.model_inputs(self.mask_dtype) if self.with_masks else batch.segment_inputs()


class PackedBatchSampler(Sampler[list[int]]):
    """Batch sampler yielding lists of dataset indices whose pairs fill `rows` rows of `source_length`
    and `target_length` tokens (`place_pairs` packs each of them).

    Each epoch (`set_epoch`) the pairs are shuffled from `seed + epoch`, then taken in that order into a
    window until the window holds a full batch's tokens on one side; the window is packed as `place_pairs`
    packs a batch, the pairs that found a row make the batch, and those left over open the next window. Small
    pairs late in a window fill the gaps that large ones leave, so the rows come out nearly full.

    With several processes every process builds the same batches and keeps every `num_replicas`-th one
    from `rank`; the last `len(batches) % num_replicas` batches of the epoch are left out, so that all
    processes take as many steps (different pairs each epoch, as with `DistributedSampler(drop_last=True)`).
    The number of batches depends on the epoch's shuffle by a batch or so: `len()` is the current epoch's.
    """

    def __init__(
        self,
        src_lengths: Sequence[int],
        tgt_lengths: Sequence[int],
        rows: int,
        source_length: int,
        target_length: int,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
    ) -> None:
        check_pairs_and_replicas(src_lengths, tgt_lengths, num_replicas, rank)
        if rows < 1:
            raise ValueError(f"rows must be a positive integer, got {rows}.")
        self.src_lengths = np.asarray(src_lengths, dtype=np.int64)
        self.tgt_lengths = np.asarray(tgt_lengths, dtype=np.int64)
        misfits = np.flatnonzero(
            (np.minimum(self.src_lengths, self.tgt_lengths) < 1)
            | (self.src_lengths > source_length)
            | (self.tgt_lengths > target_length)
        )
        if misfits.size:  # the first of them named, with what to change
            index = int(misfits[0])
            source, target = int(self.src_lengths[index]), int(self.tgt_lengths[index])
            _check_row_fits(index, source, target, source_length, target_length)
        self.rows = rows
        self.source_length = source_length
        self.target_length = target_length
        self.shuffle = shuffle
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self._batches: tuple[int, list[list[int]]] | None = None

    @classmethod
    def from_dataset(
        cls,
        dataset: datasets.Dataset,
        rows: int,
        source_length: int,
        target_length: int,
        source_column: str = "input_ids",
        target_column: str = "labels",
        **kwargs: Any,
    ) -> PackedBatchSampler:
        """The sampler of a tokenized `datasets.Dataset` (`data.tokenize_pairs`'s), its lengths read from the
        Arrow offsets as `TokenBudgetBatchSampler.from_dataset` reads them."""
        return cls(
            column_lengths(dataset, source_column),
            column_lengths(dataset, target_column),
            rows,
            source_length,
            target_length,
            **kwargs,
        )

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose shuffle to use; every process must pass the same value."""
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self._epoch_batches()) // self.num_replicas

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._epoch_batches()
        kept = len(batches) - len(batches) % self.num_replicas
        yield from batches[self.rank : kept : self.num_replicas]

    def _epoch_batches(self) -> list[list[int]]:
        """All processes' batches of the current epoch, computed once per epoch."""
        if self._batches is None or self._batches[0] != self.epoch:
            self._batches = (self.epoch, self._build_batches())
        return self._batches[1]

    def _build_batches(self) -> list[list[int]]:
        count = len(self.src_lengths)
        if self.shuffle:
            order = torch.randperm(count, generator=torch.Generator().manual_seed(self.seed + self.epoch))
            order = order.numpy()
        else:
            order = np.arange(count)
        capacity = (self.rows * self.source_length, self.rows * self.target_length)
        batches, window, taken = [], [], 0
        while taken < count or window:
            source_total = int(self.src_lengths[window].sum())
            target_total = int(self.tgt_lengths[window].sum())
            # Whole pairs up to a batch's worth on the fuller side: the rest then fill the gaps.
            while taken < count and source_total < capacity[0] and target_total < capacity[1]:
                index = int(order[taken])
                window.append(index)
                source_total += int(self.src_lengths[index])
                target_total += int(self.tgt_lengths[index])
                taken += 1
            lengths = [(int(self.src_lengths[i]), int(self.tgt_lengths[i])) for i in window]
            decreasing = _decreasing(lengths, self.source_length, self.target_length)
            placement = _balanced_fit(lengths, decreasing, self.rows, self.source_length, self.target_length)
            batches.append([window[i] for i in decreasing if placement[i] >= 0])
            window = [window[i] for i in decreasing if placement[i] < 0]
        return batches


def balanced_row_lengths(
    src_lengths: Sequence[int], tgt_lengths: Sequence[int], row_length: int, multiple: int = 8
) -> tuple[int, int]:
    """(source_length, target_length) of packed rows: `row_length` for the side with more tokens in all,
    and for the other that length times the ratio of the two sides' totals, to the nearest multiple of
    `multiple` (tensor cores' and SDPA's alignment) and at least that side's longest sequence: rows that
    the two sides fill alike, so that neither is left part empty when the other is full."""
    source_total, target_total = int(np.sum(src_lengths)), int(np.sum(tgt_lengths))

    def shorter_side(total: int, other_total: int, longest: int) -> int:
        nearest = round(row_length * total / other_total / multiple) * multiple
        return min(row_length, max(nearest, -(-longest // multiple) * multiple))

    if source_total >= target_total:
        return row_length, shorter_side(target_total, source_total, int(np.max(tgt_lengths)))
    return shorter_side(source_total, target_total, int(np.max(src_lengths))), row_length


__all__ = [
    "PADDING_SEGMENT",
    "PackedBatch",
    "PackedBatchSampler",
    "PackingCollator",
    "SEGMENT_KEYS",
    "balanced_row_lengths",
    "pack_pairs",
    "packed_attention_masks",
    "packed_block_masks",
    "place_pairs",
    "with_packed_masks",
]
