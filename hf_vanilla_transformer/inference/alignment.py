"""Word alignment from encoder-decoder attention: which source word each output word translates.

The encoder-decoder attention of Section 3.2.3 is a soft alignment: while the decoder produces an output
token, each head of each decoder layer weighs the source tokens. Garg et al. (2019, "Jointly Learning to
Align and Translate with Transformer Models") align each target word to the source word its attention
weighs most; this module does that, at the level of whitespace words rather than subword tokens, and
writes the result in the Pharaoh format of Moses, fast_align and Marian ("i-j": source word i, target word
j, both counted from 0).

- `cross_attention` / `cross_attention_heads`: the encoder-decoder attention behind an output already
  produced (by `generate()` or anyone else), by forced decoding: one forward pass over the output, which
  gives the attention of each step exactly as generation computed it (same prefix, same weights).
- `token_words`: the whitespace words a token sequence decodes to, and which word(s) each token spells.
- `word_attention`: a target-token x source-token attention matrix summed into target-word x source-word
  weights.
- `pharaoh`: each target word aligned to the source word with the largest weight.
- `align`: all of it for a batch of (source, output) pairs.

Which attention (`alignment_layer`): the mean over all heads of the last decoder layer, in the row of the
step that produced each target token. Measured on the 1000 pairs of Multi30k test with the demo model
(3 decoder layers of 4 heads; benchmarks/bench_alignment.py, benchmarks/RESULTS.md), against an
independent statistical aligner (eflomal, both directions, symmetrized with grow-diag-final-and), the F1 of
the reference translations, force-decoded, is 0.20, 0.45 and 0.66 for layers 1, 2 and 3 (AER 0.32 for
layer 3), against 0.62 for the best single head, 0.64 for the mean of all layers and 0.54 for a diagonal
baseline; on the model's own translations layer 3 scores 0.67. The row of the next step, where the token
is the decoder's input, points at the next source word instead (F1 at most 0.15 in any layer). Garg et
al. found the penultimate of 6 layers best in their model; for deeper models the last layer is this rule's
choice, not a measured one.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

_WORD = re.compile(r"\S+")


def alignment_layer(num_decoder_layers: int) -> int:
    """The decoder layer (0-based) whose encoder-decoder attention, averaged over its heads, aligns words:
    the last one, which aligned best in the measurement the module docstring gives."""
    if num_decoder_layers < 1:
        raise ValueError(
            f"A model with {num_decoder_layers} decoder layers has no encoder-decoder attention."
        )
    return num_decoder_layers - 1


def _check_sequences(model: PreTrainedModel, sequences: torch.Tensor) -> None:
    start = model.config.decoder_start_token_id
    if sequences.dim() != 2 or sequences.shape[1] < 2:
        raise ValueError(
            f"sequences must be [batch, length >= 2], the decoder start token and at least one output token "
            f"(got shape {tuple(sequences.shape)})."
        )
    if start is not None and not bool((sequences[:, 0] == start).all()):
        raise ValueError(
            f"sequences must start with the decoder start token ({start}), as generate() returns them; "
            "prepend it to outputs that lack it."
        )


@torch.no_grad()
def cross_attention_heads(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    sequences: torch.Tensor,
    layers: Sequence[int],
) -> torch.Tensor:
    """The encoder-decoder attention weights (Eq. 1) of decoder `layers`, per head, behind the outputs
    `sequences`: a [len(layers), batch, heads, target, source] float32 tensor.

    `sequences` are outputs as `generate()` returns them: the decoder start token, then the output tokens
    (padded on the right). Row t is the attention of the step that produced `sequences[:, t + 1]`, so the
    result has one row fewer than `sequences` has columns; rows past an output's end and columns of
    padded source positions are meaningless and zero respectively.

    One forward pass over the outputs (forced decoding), without the output layer. The weights of the
    chosen layers are recomputed from their own query and key projections while the pass runs, so any
    attention implementation works (SDPA and FlashAttention never materialize the weights, and switching
    the model to eager attention would change it for every other caller); forward hooks collect them, only
    for calls from this thread, and are removed before returning.
    """
    decoder_layers = model.get_decoder().layers
    for layer in layers:
        if not 0 <= layer < len(decoder_layers):
            raise ValueError(
                f"layer {layer} does not exist: the decoder has layers 0 to {len(decoder_layers) - 1}."
            )
    _check_sequences(model, sequences)
    device = model.device
    input_ids = input_ids.to(device)
    source_mask = (
        torch.ones_like(input_ids, dtype=torch.bool)
        if attention_mask is None
        else attention_mask.to(device).bool()
    )
    thread = threading.get_ident()
    captured: dict[int, torch.Tensor] = {}

    def recorder(layer: int):
        def record(module, args, kwargs, output):
            if threading.get_ident() != thread:
                return
            hidden_states = args[0] if args else kwargs["hidden_states"]
            query = module._split_heads(module.q_proj(hidden_states), module.d_k).float()
            key = module._split_heads(module.k_proj(kwargs["key_value_states"]), module.d_k).float()
            scores = torch.matmul(query, key.transpose(2, 3)) * module.scaling
            scores = scores.masked_fill(~source_mask[:, None, None, :], float("-inf"))
            captured[layer] = torch.softmax(scores, dim=-1)

        return record

    handles = [
        decoder_layers[layer].encoder_attn.register_forward_hook(recorder(layer), with_kwargs=True)
        for layer in layers
    ]
    try:
        model.base_model(
            input_ids=input_ids,
            attention_mask=source_mask.long(),
            decoder_input_ids=sequences[:, :-1].to(device),
            use_cache=False,
        )
    finally:
        for handle in handles:
            handle.remove()
    return torch.stack([captured[layer] for layer in layers])


def cross_attention(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    sequences: torch.Tensor,
    layer: int | None = None,
) -> torch.Tensor:
    """The encoder-decoder attention of decoder `layer` (by default `alignment_layer`) averaged over its
    heads, behind the outputs `sequences`: [batch, target, source], row t for the step that produced
    `sequences[:, t + 1]` (see `cross_attention_heads`). A model with an attention of its own (a
    CTranslate2 export, whose alignment layer and heads were fixed when it was exported) has a
    `cross_attention(input_ids, attention_mask, sequences)` method, which is used instead."""
    if hasattr(model, "cross_attention"):
        if layer is not None:
            raise ValueError(
                f"{type(model).__name__} gives the attention of its export's layer only: leave layer out."
            )
        return model.cross_attention(input_ids, attention_mask, sequences)
    if layer is None:
        layer = alignment_layer(len(model.get_decoder().layers))
    return cross_attention_heads(model, input_ids, attention_mask, sequences, [layer])[0].mean(dim=1)


def token_words(
    tokenizer: PreTrainedTokenizerBase, token_ids: Sequence[int]
) -> tuple[list[str], list[tuple[int, ...]]]:
    """The whitespace words of `tokenizer.decode(token_ids, skip_special_tokens=True)`, and for each token
    the indices of the words it spells.

    A token's characters are what it adds to the decoding of the tokens before it, so any tokenizer works
    whose decoding of a prefix is a prefix of the whole decoding (SentencePiece "▁" word starts, subword-nmt
    "@@" continuations, WordPiece "##"). A token that adds only whitespace (a lone "▁") or nothing (an
    `<unk>`) belongs to the word after it, or to the last word at the end; `<s>`, `<pad>` and `</s>` belong
    to none. Words are split as `str.split()` splits, so for the package's tokenizers they are the words of
    the encoded text (after NFKC normalization).
    """
    ids = [int(token_id) for token_id in token_ids]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    spans = [match.span() for match in _WORD.finditer(text)]
    words = [text[start:end] for start, end in spans]
    ignored = {tokenizer.bos_token_id, tokenizer.pad_token_id, tokenizer.eos_token_id} - {None}
    owners: list[tuple[int, ...]] = []
    end = 0
    for k, token_id in enumerate(ids):
        start = end
        prefix = tokenizer.decode(ids[: k + 1], skip_special_tokens=True)
        end = max(end, len(os.path.commonprefix([prefix, text])))
        if token_id in ignored or not words:
            owners.append(())
            continue
        spelled = tuple(w for w, (a, b) in enumerate(spans) if a < end and b > start)
        if not spelled:
            following = [w for w, (a, _) in enumerate(spans) if a >= start]
            spelled = (following[0] if following else len(words) - 1,)
        owners.append(spelled)
    return words, owners


def _membership(owners: list[tuple[int, ...]], num_words: int) -> torch.Tensor:
    """[tokens, words]: each token's share of each word, its mass split evenly over the words it spells."""
    matrix = torch.zeros(len(owners), num_words)
    for token, words in enumerate(owners):
        for word in words:
            matrix[token, word] = 1.0 / len(words)
    return matrix


def word_attention(
    attention: torch.Tensor,
    source_ids: Sequence[int],
    target_ids: Sequence[int],
    tokenizer: PreTrainedTokenizerBase,
    target_tokenizer: PreTrainedTokenizerBase | None = None,
) -> tuple[list[str], list[str], torch.Tensor]:
    """Target-word x source-word attention from a target-token x source-token one.

    `attention` is [..., target tokens, source tokens] (leading dimensions, such as layers and heads, are
    kept; extra rows and columns, such as padding, are cut off), row t for the step that produced
    `target_ids[t]`; `source_ids` are decoded with `tokenizer`,
    `target_ids` with `target_tokenizer` (separate target vocabularies) or `tokenizer`. A source word's
    weight is the sum over its tokens (the attention it receives as a whole), a target word's row the mean
    over its tokens' rows (each token decides equally where the word comes from). The columns of `</s>`
    and padding, which hold no word, are dropped and each row renormalized to sum to 1; a row that had all
    its weight there becomes uniform.

    Returns:
        The source words, the target words, and a float32 [..., target words, source words] tensor of
        weights.
    """
    source_words, source_owners = token_words(tokenizer, source_ids)
    target_words, target_owners = token_words(target_tokenizer or tokenizer, target_ids)
    attention = torch.as_tensor(attention, dtype=torch.float32).cpu()
    if attention.dim() < 2 or attention.shape[-2] < len(target_ids) or attention.shape[-1] < len(source_ids):
        raise ValueError(
            f"attention must be [..., target tokens, source tokens] covering {len(target_ids)} x "
            f"{len(source_ids)} tokens, got shape {tuple(attention.shape)}."
        )
    attention = attention[..., : len(target_ids), : len(source_ids)]
    source_share = _membership(source_owners, len(source_words))
    target_share = _membership(target_owners, len(target_words)).T
    target_share = target_share / target_share.sum(dim=1, keepdim=True).clamp(min=1e-12)
    weights = target_share @ attention @ source_share
    totals = weights.sum(dim=-1, keepdim=True)
    if source_words:
        weights = torch.where(totals > 0, weights / totals.clamp(min=1e-30), 1.0 / len(source_words))
    return source_words, target_words, weights


def pharaoh(weights: torch.Tensor) -> str:
    """Each target word (row) aligned to its source word (column) of largest weight, Garg et al. (2019)'s
    rule, as Pharaoh pairs "i-j" (source i, target j, 0-based) sorted by source then target word."""
    weights = torch.as_tensor(weights)
    if weights.dim() != 2:
        raise ValueError(f"weights must be [target words, source words], got shape {tuple(weights.shape)}.")
    if weights.shape[1] == 0:
        return ""
    links = sorted((int(i), j) for j, i in enumerate(weights.argmax(dim=1).tolist()))
    return " ".join(f"{i}-{j}" for i, j in links)


@dataclass(frozen=True)
class WordAlignment:
    """One output's alignment to its input: the Pharaoh `alignment` string, the `source_words` and
    `target_words` it numbers, and `attention`, one row per target word of weights over the source words
    (each row sums to 1)."""

    alignment: str
    source_words: list[str]
    target_words: list[str]
    attention: list[list[float]]


def align(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    source_ids: Sequence[Sequence[int]],
    sequences: Sequence[Sequence[int]],
    *,
    target_tokenizer: PreTrainedTokenizerBase | None = None,
    layer: int | None = None,
    batch_size: int = 64,
) -> list[WordAlignment]:
    """Word alignments of outputs to their inputs: `sequences[i]` (as `generate()` returns it: the decoder
    start token first, padding and `</s>` allowed) is the output for the input `source_ids[i]` (as the
    tokenizer encodes it, `</s>` included). Several outputs of one input (an n-best list) are simply
    several pairs. Attention from `cross_attention` of `layer` (by default `alignment_layer`), in batches
    of `batch_size` pairs."""
    if len(source_ids) != len(sequences):
        raise ValueError(f"{len(source_ids)} inputs but {len(sequences)} outputs: pass one input per output.")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    pad = model.generation_config.pad_token_id
    results: list[WordAlignment] = []
    for begin in range(0, len(sequences), batch_size):
        sources = [list(ids) for ids in source_ids[begin : begin + batch_size]]
        outputs = [list(ids) for ids in sequences[begin : begin + batch_size]]
        inputs = tokenizer.pad({"input_ids": sources}, return_tensors="pt")
        width = max(len(ids) for ids in outputs)
        padded = torch.tensor([ids + [pad] * (width - len(ids)) for ids in outputs])
        attention = cross_attention(model, inputs["input_ids"], inputs["attention_mask"], padded, layer)
        for row, (source, output) in enumerate(zip(sources, outputs)):
            source_words, target_words, weights = word_attention(
                attention[row], source, output[1:], tokenizer, target_tokenizer
            )
            results.append(WordAlignment(pharaoh(weights), source_words, target_words, weights.tolist()))
    return results


__all__ = [
    "WordAlignment",
    "align",
    "alignment_layer",
    "cross_attention",
    "cross_attention_heads",
    "pharaoh",
    "token_words",
    "word_attention",
]
