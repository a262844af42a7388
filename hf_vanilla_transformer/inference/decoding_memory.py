"""What a decoding request may ask of the model and of the machine: a beam no wider than the target
vocabulary, and batches whose beam search fits in the memory free on the device.

A `generate()` call that needs more memory than the machine has is not refused by torch on the CPU: the
process grows until the kernel kills it (no message, exit -9). Here the memory a batch's beam search
holds at its peak is estimated from the model's dimensions (`beam_search_bytes`) and compared, before the
batch decodes, with what the device has free (`free_memory_bytes`); a batch that cannot fit is refused in
one line that says which setting to lower, and to what.
"""

from collections.abc import Callable
from typing import Any

import torch

# Bytes of one float32 value and of one int64 token id.
_FLOAT_BYTES, _ID_BYTES = 4, 8
# Copies of one step's rows x vocabulary scores alive together at the peak of transformers' beam search
# step: the model's logits before and after their bias, their float32 copy, their log-softmax and the
# scores with each beam's running total added.
_STEP_SCORE_COPIES = 5
# Copies of the key and value cache the process holds at its peak: each step grows every layer's cache by
# concatenation and reorders it by beam, each into a new tensor, and the memory of the old ones is not all
# given back to the kernel (measured: peak resident memory grows by twice the cache's size).
_CACHE_COPIES = 2
# Token-id tables of rows x output length held through the search: the running sequences, the finished
# ones, and the top-k candidates drawn from twice the beams.
_SEQUENCE_TABLES = 4
# Copies of the forced-decoding logits alive at once when hypotheses are scored: the logits and their
# log-softmax.
_SCORING_COPIES = 2
# The share of the free memory a batch may plan to use: the estimate leaves out what is small (the
# layers' activations at one position, the encoder's own pass), and the allocator's rounding.
_USABLE_SHARE = 0.8


def beam_search_bytes(
    config: Any, *, batch_size: int, beams: int, source_length: int, output_length: int, n_best: int = 1,
    scores: bool = False,
) -> int:  # fmt: skip
    """The memory in bytes that decoding one batch with transformers' beam search (greedy: `beams` 1)
    holds at its peak, in float32, for a model of `config`'s dimensions:

        rows = batch_size x beams
        4 bytes x rows x [ 2 x decoder_layers x 2 x attention_width x (output_length + source_length)
                           + source_length x d_model
                           + 5 x target_vocabulary ]
        + 8 bytes x 4 x rows x output_length
        + (with `scores`) 4 bytes x 2 x batch_size x n_best x output_length x target_vocabulary

    The first term is the key and value cache of every decoder layer: its self-attention over the
    `output_length` tokens decoded, its cross-attention over the `source_length` source tokens, both kept
    for each beam (`attention_width` is heads x d_k), twice (`_CACHE_COPIES`); then the encoder's output,
    copied for each beam;
    then one step's scores over the target vocabulary (`_STEP_SCORE_COPIES`). The second is the search's
    token-id tables (`_SEQUENCE_TABLES`). The last is the forced decoding that scores each of the `n_best`
    hypotheses kept (`scoring.token_log_probs`): its logits at every output position, and their
    log-softmax. The copies were counted from the peak resident memory that growing the batch adds
    (tests/test_decoding_memory.py measures it); what does not grow with the batch (the model, the
    libraries' own buffers) is not counted."""
    layers = config.decoder_layers
    heads = getattr(config, "decoder_attention_heads", None) or config.h
    d_k = getattr(config, "d_k", None) or config.d_model // heads
    vocabulary = target_vocabulary(config)
    rows = batch_size * beams
    per_row = (
        _CACHE_COPIES * layers * 2 * heads * d_k * (output_length + source_length)
        + source_length * config.d_model
        + _STEP_SCORE_COPIES * vocabulary
    )
    total = _FLOAT_BYTES * rows * per_row + _ID_BYTES * _SEQUENCE_TABLES * rows * output_length
    if scores:
        total += _FLOAT_BYTES * _SCORING_COPIES * batch_size * n_best * output_length * vocabulary
    return total


def target_vocabulary(config: Any) -> int:
    """The number of tokens the decoder chooses among."""
    for name in ("target_vocab_size", "decoder_vocab_size", "vocab_size"):
        size = getattr(config, name, None)
        if size:
            return int(size)
    raise ValueError(f"{type(config).__name__} names no vocabulary size.")


def free_memory_bytes(device: torch.device | str) -> int:
    """The memory a new allocation may take on `device`: the GPU's free memory on CUDA, else the memory the
    kernel reports available (MemAvailable: free memory and the caches it can drop), else psutil's."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import psutil

    return int(psutil.virtual_memory().available)


def check_beams(config: Any, beams: int) -> None:
    """Refuse a beam wider than the target vocabulary: beam search keeps `beams` distinct continuations of
    one prefix at its first step, and there are only as many as there are tokens."""
    vocabulary = target_vocabulary(config)
    if beams > vocabulary:
        raise ValueError(
            f"num_beams {beams} is more than the model's {vocabulary} target tokens, which bound how many "
            f"hypotheses a beam can keep: give at most {vocabulary} (4 to 10 is usual)."
        )


def check_batch_fits(
    config: Any, device: torch.device | str, *, batch_size: int, beams: int, source_length: int,
    output_length: int, n_best: int = 1, scores: bool = False, batch_option: str = "--batch-size",
) -> None:  # fmt: skip
    """Refuse, in one line saying what to lower, a batch whose beam search (`beam_search_bytes`) needs more
    than `_USABLE_SHARE` of the memory free on `device` (`free_memory_bytes`). `batch_option` is the
    command-line option that sets the batch's sentences."""
    shape = dict(source_length=source_length, output_length=output_length, n_best=n_best, scores=scores)
    needed = beam_search_bytes(config, batch_size=batch_size, beams=beams, **shape)
    usable = int(free_memory_bytes(device) * _USABLE_SHARE)
    if needed <= usable:
        return
    sentences = _largest(lambda size: _fits(config, size, beams, shape, usable), batch_size - 1)
    if sentences:
        fix = f"lower the batch size to {sentences} sentences or fewer ({batch_option}), or the beam"
    else:
        widest = _largest(lambda width: _fits(config, 1, width, shape, usable), beams - 1)
        fix = (
            f"lower the beam to {widest} or fewer (--num-beams)"
            if widest
            else "the model cannot decode a sentence this long here; shorten it or free memory"
        )
    raise ValueError(
        f"decoding {batch_size} sentence(s) of up to {source_length} tokens with a beam of {beams} would "
        f"need about {needed / 2**30:.1f} GiB, and {torch.device(device).type} has {usable / 2**30:.1f} "
        f"GiB to spare: {fix}."
    )


def _largest(fits: Callable[[int], bool], upper: int) -> int:
    """The largest n in 1..`upper` for which `fits(n)` holds (it holds for every smaller n), else 0."""
    low, high = 0, upper
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low


def _fits(config: Any, batch_size: int, beams: int, shape: dict[str, Any], usable: int) -> bool:
    return beam_search_bytes(config, batch_size=batch_size, beams=beams, **shape) <= usable


__all__ = ["beam_search_bytes", "check_batch_fits", "check_beams", "free_memory_bytes", "target_vocabulary"]
