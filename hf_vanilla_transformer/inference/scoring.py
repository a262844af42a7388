"""Scoring given translations by forced decoding: the log-probability the model gives a target sentence y
for a source sentence x, log P(y | x) = sum over t of log p(y_t | y_<t, x), the end token `</s>` included.

The decoder reads the model's `decoder_start_token_id` and then the target, and each next target token's
log-softmax is read off the logits (no label smoothing, no length penalty): the same quantity beam search
accumulates before it divides by its length penalty (Section 6.1). The PyTorch and ONNX Runtime models
compute it from their `forward` logits; a CTranslate2 export with CTranslate2's own `score_batch`, which
appends the end token to the target and scores it too.

`score_pairs` scores sentence pairs in batches of similar length and returns one `PairScore` a pair, in the
order given; `token_log_probs` scores token ids that are already encoded (generate()'s outputs, say).
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

# Logits computed at a time by `token_log_probs`, in bytes of float32: a batch of long targets over a large
# vocabulary would otherwise hold gigabytes.
_LOGITS_BYTES = 2**28


@dataclass(frozen=True)
class PairScore:
    """The score of one (source, target) pair: `log_prob`, the target's log-probability given the source
    (natural log, the end token included), its subword `tokens` as the model reads them (`</s>` last), and
    `per_token`, the log-probability of each of those tokens, whose sum is `log_prob`."""

    log_prob: float
    tokens: list[str]
    per_token: list[float]

    @property
    def mean(self) -> float:
        """The mean log-probability per target token, `</s>` counted: comparable across target lengths."""
        return self.log_prob / len(self.per_token)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of one pair: log_prob, tokens and per_token."""
        return {"log_prob": self.log_prob, "tokens": self.tokens, "per_token": self.per_token}


def model_positions(model: Any) -> int | None:
    """The most tokens `model` reads on either side: an export's position table (an ONNX model's
    `positions`, a CTranslate2 export's `info["positions"]`), else the config's `max_position_embeddings`,
    the positions the model was built and trained for (None where the config has none)."""
    if isinstance(getattr(model, "positions", None), int):
        return model.positions
    info = getattr(model, "info", None)
    if isinstance(info, dict) and "positions" in info:
        return info["positions"]
    return getattr(getattr(model, "config", None), "max_position_embeddings", None)


def end_token_id(model: Any) -> int:
    """The id of the end token `</s>` that the model's outputs finish with."""
    eos = model.generation_config.eos_token_id
    return eos[0] if isinstance(eos, list) else eos


def token_log_probs(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, outputs: Sequence[Sequence[int]]
) -> list[list[float]]:
    """log p(y_t | y_<t, x) of every token of every output (its end token included where it has one), by
    forced decoding. Row i of `input_ids` (padded, with `attention_mask`) is the source of `outputs[i]`,
    a list of target token ids without the decoder start token and without padding.

    A transformers model (the PyTorch model, `OnnxSeq2SeqLM`) is run on the whole target at once, with no
    cache. A model with a scorer of its own (`CTranslate2Seq2SeqLM`, whose `token_log_probs` runs
    CTranslate2's `score_batch`) has a `token_log_probs` method of this signature, which is used instead."""
    if hasattr(model, "token_log_probs"):
        return model.token_log_probs(input_ids, attention_mask, outputs)
    width = max((len(ids) for ids in outputs), default=0) or 1
    config, generation = model.config, model.generation_config
    start = generation.decoder_start_token_id
    start = config.decoder_start_token_id if start is None else start
    pad = generation.pad_token_id if generation.pad_token_id is not None else config.pad_token_id
    # Padding after a target's last token is never read by its tokens: the decoder's attention is causal.
    decoder_input_ids = torch.full((len(outputs), width), pad, dtype=torch.long)
    decoder_input_ids[:, 0] = start
    for row, ids in enumerate(outputs):
        decoder_input_ids[row, 1 : len(ids)] = torch.tensor(list(ids[:-1]), dtype=torch.long)
    vocabulary = getattr(config, "decoder_vocab_size", None) or config.vocab_size
    rows_at_once = max(1, _LOGITS_BYTES // (4 * width * vocabulary))
    scores: list[list[float]] = []
    with torch.inference_mode():
        for first in range(0, len(outputs), rows_at_once):
            rows = slice(first, first + rows_at_once)
            logits = model(
                input_ids=input_ids[rows],
                attention_mask=attention_mask[rows],
                decoder_input_ids=decoder_input_ids[rows].to(input_ids.device),
                use_cache=False,
            ).logits
            log_probs = torch.log_softmax(logits.float(), dim=-1).cpu()
            for offset, ids in enumerate(outputs[rows]):
                picked = log_probs[offset, torch.arange(len(ids)), torch.tensor(list(ids), dtype=torch.long)]
                scores.append(picked.tolist())
    return scores


def check_pairs(sources: Sequence[str], targets: Sequence[str]) -> None:
    """Refuse, in a one-line ValueError, pairs that cannot be scored: lists of different lengths, and a
    blank (empty or whitespace) source or target, named by its 1-based line: a blank line in one of two
    line-aligned files most often means that they have slipped apart."""
    if len(sources) != len(targets):
        raise ValueError(
            f"{len(sources)} sources but {len(targets)} targets: give one target per source, line for line."
        )
    for line, (source, target) in enumerate(zip(sources, targets, strict=True), start=1):
        blank = [side for side, text in (("source", source), ("target", target)) if not text.strip()]
        if blank:
            raise ValueError(
                f"line {line}: the {' and the '.join(blank)} {'is' if len(blank) == 1 else 'are'} blank: "
                "scoring needs a sentence on both sides; remove the line from both files."
            )


def _encode_pairs(
    model: Any,
    tokenizer: PreTrainedTokenizerBase,
    target_tokenizer: PreTrainedTokenizerBase,
    sources: list[str],
    targets: list[str],
) -> tuple[list[list[int]], list[list[int]]]:
    """The token ids of each source (with its end token, as `translate` encodes inputs) and each target
    (as training encodes labels, `</s>` last); a one-line ValueError naming the first line longer than the
    model's positions."""
    source_ids = tokenizer(sources, add_special_tokens=True)["input_ids"] if sources else []
    target_ids = target_tokenizer(text_target=targets)["input_ids"] if targets else []
    end = end_token_id(model)
    target_ids = [ids if ids and ids[-1] == end else [*ids, end] for ids in target_ids]
    positions = model_positions(model)
    if positions is not None:
        for line, (source, target) in enumerate(zip(source_ids, target_ids, strict=True), start=1):
            if max(len(source), len(target)) > positions:
                raise ValueError(
                    f"line {line}: a source of {len(source)} and a target of {len(target)} tokens, more than "
                    f"the model's {positions} positions (max_position_embeddings): split the pair, or leave "
                    "it out."
                )
    return source_ids, target_ids


def score_pairs(
    model: Any,
    tokenizer: PreTrainedTokenizerBase,
    sources: Sequence[str],
    targets: Sequence[str],
    *,
    target_tokenizer: PreTrainedTokenizerBase | None = None,
    batch_size: int = 64,
    progress: bool = False,
) -> list[PairScore]:
    """Score each target sentence as a translation of its source: one `PairScore` a pair, in the order
    given. `model` is what `translator.load_model` loads on any engine, `tokenizer` its (source) tokenizer and
    `target_tokenizer` its target tokenizer where the vocabularies are separate (`load_tokenizers`).

    Pairs are sorted by length so that each batch of `batch_size` pads little, then put back in input
    order; `progress` shows a bar over the pairs. Refused with a one-line ValueError before any is scored:
    what `check_pairs` refuses, and a pair longer than the model's positions (`model_positions`, named by
    its 1-based line)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    sources, targets = list(sources), list(targets)
    check_pairs(sources, targets)
    decoder = target_tokenizer or tokenizer
    source_ids, target_ids = _encode_pairs(model, tokenizer, decoder, sources, targets)
    order = sorted(range(len(sources)), key=lambda i: (len(source_ids[i]), len(target_ids[i])), reverse=True)
    model.eval()
    results: list[PairScore | None] = [None] * len(sources)
    with tqdm(total=len(order), desc="Scoring", unit="pair", disable=not progress) as bar:
        for first in range(0, len(order), batch_size):
            indices = order[first : first + batch_size]
            batch = tokenizer.pad({"input_ids": [source_ids[i] for i in indices]}, return_tensors="pt")
            batch = {key: value.to(model.device) for key, value in batch.items()}
            log_probs = token_log_probs(
                model, batch["input_ids"], batch["attention_mask"], [target_ids[i] for i in indices]
            )
            for i, per_token in zip(indices, log_probs, strict=True):
                tokens = decoder.convert_ids_to_tokens(target_ids[i])
                results[i] = PairScore(math.fsum(per_token), tokens, per_token)
            bar.update(len(indices))
    return results


__all__ = ["PairScore", "check_pairs", "end_token_id", "model_positions", "score_pairs", "token_log_probs"]
