"""Batch lengths rounded up to a few bucket sizes, for a compiled training step.

Token-budget batches (Section 5.1) come in as many lengths as the data has, and `torch.compile` specializes
its graph on shapes. Padding each batch's source and target up to the next bucket leaves a handful of
lengths: multiples of 8 up to 64 (tensor cores want multiples of 8), of 16 up to 128, of 32 up to 256 and
of 64 beyond. The padding is masked (attention mask 0, label -100), so the loss and its gradients are those
of the unpadded batch up to float rounding; each batch pays at most one bucket's step in extra tokens.
"""

from collections.abc import Callable
from typing import Any

import torch

# (up to this length, round up to a multiple of this).
BUCKET_STEPS = ((64, 8), (128, 16), (256, 32))
LAST_STEP = 64
# The keys padded together: the source's, and the target's.
_SIDES = (("input_ids", "attention_mask"), ("labels", "decoder_input_ids", "decoder_attention_mask"))


def bucket_length(length: int) -> int:
    """The bucket a sequence of `length` tokens is padded to: the next multiple of the step that lengths of
    its size take (`BUCKET_STEPS`)."""
    step = next((step for limit, step in BUCKET_STEPS if length <= limit), LAST_STEP)
    return -(-length // step) * step


def pad_to_buckets(
    batch: dict[str, torch.Tensor], pad_token_id: int, round_up: Callable[[int], int] = bucket_length
) -> dict[str, torch.Tensor]:
    """`batch` padded on the right up to its lengths' buckets (`round_up` of each side's length): the
    source ids and mask together, and the labels and decoder inputs (and mask) together; masks fill with 0,
    labels with -100 (no loss), token ids with `pad_token_id`."""
    fills = {"input_ids": pad_token_id, "decoder_input_ids": pad_token_id, "labels": -100}
    for side in _SIDES:
        present = [key for key in side if key in batch]
        if not present:
            continue
        length = batch[present[0]].shape[1]
        extra = round_up(length) - length
        for key in present:
            batch[key] = torch.nn.functional.pad(batch[key], (0, extra), value=fills.get(key, 0))
    return batch


class BucketPadding:
    """A data collator: the batches of `collator` (transformers' `DataCollatorForSeq2Seq`, say) padded up to
    their lengths' buckets (`pad_to_buckets`)."""

    def __init__(self, collator: Any, pad_token_id: int) -> None:
        self.collator = collator
        self.pad_token_id = pad_token_id

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return pad_to_buckets(self.collator(features), self.pad_token_id)


__all__ = ["BUCKET_STEPS", "BucketPadding", "bucket_length", "pad_to_buckets"]
