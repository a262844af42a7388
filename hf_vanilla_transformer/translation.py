"""Translating many sentences: batches of similar length, the model's own decoding rules, progress."""

from collections.abc import Sequence

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase


def translate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sentences: Sequence[str],
    *,
    batch_size: int = 64,
    progress: bool = True,
    **generate_kwargs,
) -> list[str]:
    """Translate `sentences` in the order given.

    Sentences are sorted by length so that each batch pads little (as Section 5.1 batches training
    pairs), then put back in input order. Decoding follows `model.generation_config` (the paper's beam
    search, Section 6.1, for models trained or published by this package) unless `generate_kwargs`
    override it.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    encoded = tokenizer(list(sentences), add_special_tokens=True)["input_ids"]
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]), reverse=True)
    outputs: list[str] = [""] * len(encoded)
    model.eval()
    bar = tqdm(total=len(order), desc="Translating", unit="sent", disable=not progress)
    for start in range(0, len(order), batch_size):
        indices = order[start : start + batch_size]
        batch = tokenizer.pad({"input_ids": [encoded[i] for i in indices]}, return_tensors="pt")
        batch = {key: value.to(model.device) for key, value in batch.items()}
        with torch.inference_mode():
            generated = model.generate(**batch, **generate_kwargs)
        for i, text in zip(indices, tokenizer.batch_decode(generated, skip_special_tokens=True)):
            outputs[i] = text.strip()
        bar.update(len(indices))
    bar.close()
    return outputs
