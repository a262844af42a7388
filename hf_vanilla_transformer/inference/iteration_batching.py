"""Iteration-level batching of beam search (Section 6.1): sentences decode together in one running batch,
and a sentence joins it, or leaves it, between two decoding steps, as Orca (Yu et al., 2022) and vLLM
schedule decoder-only models; here for the encoder-decoder, with beam search.

`RunningBeamSearch` keeps the running batch: each sentence's `num_beams` rows of the decoder's cache, its
encoder's keys and values, and its beam search state. `add` encodes new sentences once and takes their first
decoding step on their own; `step` runs one decoding step of every sentence in the batch at once, through the
model's own `forward`, and returns the sentences that have finished. A sentence's latency is then its own
number of steps, each the cost of one step of the batch, whatever else is decoding: a long sentence no longer
holds a short one behind it.

Rows that joined the batch later are padded on the left of the self-attention cache, masked out, and the
decoder counts each row's positions from its first token (as it does for left-padded inputs); shorter
sources are padded on the right of the encoder-decoder attention's keys and values, masked out too. Each
sentence's search is transformers' beam search for that sentence alone, step for step: the same top
2 x num_beams candidates, the same finished hypotheses and stopping rules, with the paper's length penalty
and output limit as `generation_vanilla_transformer` defines them. The same tokens come out as from
`generate()` on the sentence by itself, up to the float rounding of a padded batch
(tests/test_iteration_batching.py checks this against `generate()`).

The generation settings it implements are those of the paper's decoding and of greedy search; `unsupported`
names any other setting of a model's generation config (sampling, repetition penalties, ...), for which
callers decode whole batches with `generate()` instead.
"""

from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import GenerationConfig
from transformers.cache_utils import Cache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput

from ..common.cpu_speedups import (
    FreePositionCacheLayer,
    eager_cpu,
    prepare_for_cpu_decoding,
    rows_with_free_position,
    weights_fixed_for_decoding,
)
from ..vanilla_transformer.generation_vanilla_transformer import gnmt_length_penalty, output_length_offset
from ..vanilla_transformer.modeling_vanilla_transformer import OUTPUT_CACHE_FIELD
from .decoding_memory import check_batch_fits
from .scoring import end_token_id, model_positions

# Generation settings whose default the running batch assumes: any other value changes the search, so
# `unsupported` names it. (Settings that only shape generate()'s return value are not listed.)
_DEFAULT_SETTINGS: dict[str, Any] = {
    "do_sample": False,
    "num_beam_groups": 1,
    "diversity_penalty": 0.0,
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "bad_words_ids": None,
    "force_words_ids": None,
    "min_length": 0,
    "min_new_tokens": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "sequence_bias": None,
    "exponential_decay_length_penalty": None,
    "renormalize_logits": False,
    "remove_invalid_values": False,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "watermarking_config": None,
    "constraints": None,
    "prompt_lookup_num_tokens": None,
    "assistant_model": None,
}

# transformers' beam search marks a hypothesis it must not pick by adding this score.
_EXCLUDED = -1.0e9


def unsupported(generation_config: GenerationConfig) -> list[str]:
    """The settings of `generation_config` that the running batch does not implement ("name=value" each),
    none for the paper's decoding and for greedy search."""
    names = []
    for name, default in _DEFAULT_SETTINGS.items():
        value = getattr(generation_config, name, default)
        if value not in (default, None) and not (isinstance(default, (int, float)) and value == default):
            names.append(f"{name}={value!r}")
    if isinstance(generation_config.eos_token_id, list) and len(generation_config.eos_token_id) > 1:
        names.append(f"eos_token_id={generation_config.eos_token_id!r}")
    return names


def _finished_penalty(length: int, alpha: float, penalty_type: str | None) -> float:
    """What transformers' beam search divides a just-finished hypothesis of `length` generated tokens (its
    end token included) by, written as `PaperDecodingMixin`'s override makes transformers compute it, so
    that the float rounding is the same."""
    if penalty_type == "gnmt":
        return (0 + gnmt_length_penalty(length, 1.0) + 1 - 1) ** alpha
    return length**alpha


def _best_possible_penalty(length: int, alpha: float, penalty_type: str | None) -> float:
    """What transformers' early-stopping check divides the best running score by, for `length` generated
    tokens, computed the same way (see `_finished_penalty`)."""
    if penalty_type == "gnmt":
        return (1 + gnmt_length_penalty(length, 1.0) - 1) ** alpha
    return length**alpha


@dataclass(eq=False)
class _Sentence:
    """One sentence's beam search: its running hypotheses (token ids after the decoder start token) and
    the finished ones, best first (`finished_scores` in the batch's tensors rank them)."""

    key: Hashable
    max_length: int  # decoder tokens, the start token included, at which every hypothesis stops
    limit: float  # generated tokens after which only the end token may follow (inf: no such limit)
    running: list[list[int]]
    finished: list[list[int]]
    length: int = 1  # decoder tokens so far, the start token included


@dataclass
class Finished:
    """A sentence that left the batch: its `key`, its `num_beams` best outputs (token ids after the decoder
    start token, the end token included where the output has one; an empty list where the search finished
    fewer hypotheses), best first, with the `scores` it ranked them by."""

    key: Hashable
    outputs: list[list[int]]
    scores: list[float]


@dataclass
class _Batch:
    """The running batch's tensors: a sentence's rows are `num_beams` consecutive rows, in `sentences`
    order. `self_keys` / `self_values`: per decoder layer, [rows, heads, columns, d_k] with `self_mask`
    [rows, columns] (0 for a row's padding on the left); `cross_keys` / `cross_values`: per layer, [rows,
    heads, source positions, d_k] with `cross_mask`; per sentence, `running_scores`, `finished_scores`,
    `finished_mask` [sentences, num_beams] and `improvable` [sentences]."""

    self_keys: list[torch.Tensor]
    self_values: list[torch.Tensor]
    self_mask: torch.Tensor
    cross_keys: list[torch.Tensor]
    cross_values: list[torch.Tensor]
    cross_mask: torch.Tensor
    running_scores: torch.Tensor
    finished_scores: torch.Tensor
    finished_mask: torch.Tensor
    improvable: torch.Tensor
    sentences: list[_Sentence] = field(default_factory=list)

    def select(self, sentence_indices: list[int], row_indices: torch.Tensor) -> "_Batch":
        """The batch of the sentences at `sentence_indices`, whose self-attention rows are `row_indices`
        (beam search's reordering included) and whose other rows are their own."""
        beams = self.running_scores.shape[1]
        kept = torch.tensor(sentence_indices, dtype=torch.long)
        rows = (kept[:, None] * beams + torch.arange(beams)).flatten()
        device = self.self_mask.device
        row_indices, rows, kept_on = row_indices.to(device), rows.to(device), kept.to(device)
        # A sentence's beams share its source, so the cross-attention rows move only when sentences leave:
        # copying them at every step would cost as much as the step's attention over a long source.
        if len(sentence_indices) == len(self.sentences):
            cross_keys, cross_values, cross_mask = self.cross_keys, self.cross_values, self.cross_mask
        else:
            cross_keys = [keys.index_select(0, rows) for keys in self.cross_keys]
            cross_values = [values.index_select(0, rows) for values in self.cross_values]
            cross_mask = self.cross_mask.index_select(0, rows)
        return _Batch(
            [_reordered(keys, row_indices) for keys in self.self_keys],
            [_reordered(values, row_indices) for values in self.self_values],
            self.self_mask.index_select(0, row_indices),
            cross_keys,
            cross_values,
            cross_mask,
            self.running_scores.index_select(0, kept_on),
            self.finished_scores.index_select(0, kept_on),
            self.finished_mask.index_select(0, kept_on),
            self.improvable.index_select(0, kept_on),
            [self.sentences[i] for i in sentence_indices],
        )

    def trimmed(self) -> "_Batch":
        """The batch without the self-attention columns that every row masks (rows that joined late, whose
        early companions have left) and without source positions that every row masks."""
        first = int(self.self_mask.argmax(dim=1).min())
        if first > 0:
            self.self_keys = [keys[:, :, first:] for keys in self.self_keys]
            self.self_values = [values[:, :, first:] for values in self.self_values]
            self.self_mask = self.self_mask[:, first:]
        needed = int(self.cross_mask.sum(dim=1).max())
        if needed < self.cross_mask.shape[1]:
            self.cross_keys = [keys[:, :, :needed] for keys in self.cross_keys]
            self.cross_values = [values[:, :, :needed] for values in self.cross_values]
            self.cross_mask = self.cross_mask[:, :needed]
        return self


def _reordered(states: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Self-attention keys or values at `rows`; on a CPU with a free position after them, which the next
    step fills (`FreePositionCacheLayer`) rather than copying the whole cache once more to append it."""
    if eager_cpu(states):
        return rows_with_free_position(states, rows)
    return states.index_select(0, rows)


def _cache(batch: "_Batch") -> EncoderDecoderCache:
    """The decoder's cache over the batch's own tensors, none of them copied."""
    self_attention = Cache(
        layers=[FreePositionCacheLayer.holding(k, v) for k, v in zip(batch.self_keys, batch.self_values)]
    )
    cross_attention = Cache(
        layers=[FreePositionCacheLayer.holding(k, v) for k, v in zip(batch.cross_keys, batch.cross_values)]
    )
    return EncoderDecoderCache(self_attention, cross_attention)


def _pad(tensor: torch.Tensor, dim: int, length: int, left: bool) -> torch.Tensor:
    """`tensor` padded with zeros along `dim` to `length`, on the left or the right."""
    missing = length - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    zeros = tensor.new_zeros(shape)
    return torch.cat([zeros, tensor] if left else [tensor, zeros], dim=dim)


def _joined(first: _Batch | None, second: _Batch) -> _Batch:
    """One batch of the sentences of `first` then those of `second`: the self-attention columns aligned on
    the right (the newest column is every row's last), the source positions on the left."""
    if first is None:
        return second
    columns = max(first.self_mask.shape[1], second.self_mask.shape[1])
    positions = max(first.cross_mask.shape[1], second.cross_mask.shape[1])

    def both(a: torch.Tensor, b: torch.Tensor, dim: int, length: int | None, left: bool) -> torch.Tensor:
        if length is not None:
            a, b = _pad(a, dim, length, left), _pad(b, dim, length, left)
        return torch.cat([a, b])

    return _Batch(
        [both(a, b, 2, columns, True) for a, b in zip(first.self_keys, second.self_keys)],
        [both(a, b, 2, columns, True) for a, b in zip(first.self_values, second.self_values)],
        both(first.self_mask, second.self_mask, 1, columns, True),
        [both(a, b, 2, positions, False) for a, b in zip(first.cross_keys, second.cross_keys)],
        [both(a, b, 2, positions, False) for a, b in zip(first.cross_values, second.cross_values)],
        both(first.cross_mask, second.cross_mask, 1, positions, False),
        both(first.running_scores, second.running_scores, 0, None, False),
        both(first.finished_scores, second.finished_scores, 0, None, False),
        both(first.finished_mask, second.finished_mask, 0, None, False),
        both(first.improvable, second.improvable, 0, None, False),
        first.sentences + second.sentences,
    )


class RunningBeamSearch:
    """The running batch of one model (see the module docstring), which it prepares for decoding on a CPU
    (`prepare_for_cpu_decoding`). Not thread-safe: one thread owns it, and enters `decoding()` around its
    steps. `generation_config` defaults to the model's; `unsupported` must name none of its settings."""

    def __init__(self, model: Any, generation_config: GenerationConfig | None = None) -> None:
        config = generation_config or model.generation_config
        problems = unsupported(config)
        if problems:
            raise ValueError(
                f"iteration-level batching implements the paper's beam search and greedy search, not "
                f"{', '.join(problems)}: decode such settings with generate()."
            )
        self.model = prepare_for_cpu_decoding(model)
        self.config = config
        self.num_beams = config.num_beams or 1
        # Greedy search stops a sentence at its first end token: the search with one beam that stops as
        # soon as its beam is finished.
        self.early_stopping = True if self.num_beams == 1 else config.early_stopping
        self.alpha = config.length_penalty if config.length_penalty is not None else 1.0
        self.penalty_type = getattr(config, "length_penalty_type", None)
        self.offset = output_length_offset(config, {})
        self.eos = end_token_id(model)
        start = config.decoder_start_token_id
        self.start = model.config.decoder_start_token_id if start is None else start
        pad = config.pad_token_id
        self.pad = model.config.pad_token_id if pad is None else pad
        self.learned_positions = getattr(model.config, "position_embedding_type", None) == "learned"
        self._batch: _Batch | None = None

    def decoding(self):
        """The context to enter around `add` and `step` calls: the weights fixed for decoding, with each
        sentence's attention kept apart from the batch's padding."""
        return weights_fixed_for_decoding(sentences_apart=True)

    def check_fits(self, sentences: int, batch_option: str) -> None:
        """Refuse (ValueError, one line naming `batch_option`) a running batch of `sentences` that could
        not fit in the memory free on the model's device at its largest: every sentence as long as the
        model's positions allow, each decoding to its output limit."""
        positions = model_positions(self.model)
        if positions is None:
            return
        max_length, _ = self._stopping_lengths(positions)
        check_batch_fits(
            self.model.config,
            self.model.device,
            batch_size=sentences,
            beams=self.num_beams,
            source_length=positions,
            output_length=max_length,
            batch_option=batch_option,
        )

    def __len__(self) -> int:
        """Sentences in the running batch."""
        return 0 if self._batch is None else len(self._batch.sentences)

    def _stopping_lengths(self, source_length: int) -> tuple[int, float]:
        """(max_length, limit) of a sentence whose source has `source_length` tokens, as
        `PaperDecodingMixin.generate` and transformers set them for that sentence alone."""
        if self.offset is not None:
            limit = source_length + self.offset
            new_tokens = limit + 1
            if self.learned_positions:
                new_tokens = min(new_tokens, self.model.config.max_position_embeddings)
            return 1 + new_tokens, limit
        if self.config.max_new_tokens is not None:
            return 1 + self.config.max_new_tokens, float("inf")
        return self.config.max_length, float("inf")

    @torch.inference_mode()
    def add(self, sources: Sequence[Sequence[int]], keys: Sequence[Hashable]) -> list[Finished]:
        """Encode the `sources` (token ids, end token included, each within the model's positions), take
        their first decoding step, and put them in the running batch under `keys`. Returns those that
        finished at once (an output limit of no tokens)."""
        if not sources:
            return []
        model, beams = self.model, self.num_beams
        device = model.device
        width = max(len(ids) for ids in sources)
        source_mask = torch.zeros((len(sources), width), dtype=torch.long, device=device)
        hidden = torch.zeros((len(sources), width, model.config.d_model), device=device, dtype=model.dtype)
        for row, ids in enumerate(sources):
            # Each source by itself, as generate() encodes a sentence alone: in a padded batch, the
            # encoder's attention sums would round differently.
            input_ids = torch.tensor([list(ids)], dtype=torch.long, device=device)
            encoded = model.get_encoder()(input_ids=input_ids, return_dict=True)
            hidden[row, : len(ids)] = encoded.last_hidden_state[0]
            source_mask[row, : len(ids)] = 1
        # generate() encodes each sentence once and gives each of its beams a copy.
        hidden = hidden.repeat_interleave(beams, dim=0)
        cross_mask = source_mask.repeat_interleave(beams, dim=0)
        rows = len(sources) * beams
        outputs = model(
            encoder_outputs=BaseModelOutput(last_hidden_state=hidden),
            attention_mask=cross_mask,
            decoder_input_ids=torch.full((rows, 1), self.start, dtype=torch.long, device=device),
            use_cache=True,
            return_dict=True,
        )
        cache = getattr(outputs, OUTPUT_CACHE_FIELD)
        running_scores = torch.zeros((len(sources), beams), device=device)
        running_scores[:, 1:] = _EXCLUDED  # the first step's candidates come from one beam only
        sentences = []
        for ids, key in zip(sources, keys, strict=True):
            max_length, limit = self._stopping_lengths(len(ids))
            sentences.append(_Sentence(key, max_length, limit, [[] for _ in range(beams)], [[]] * beams))
        arrivals = _Batch(
            [layer.keys for layer in cache.self_attention_cache.layers],
            [layer.values for layer in cache.self_attention_cache.layers],
            torch.ones((rows, 1), dtype=torch.long, device=device),
            [layer.keys for layer in cache.cross_attention_cache.layers],
            [layer.values for layer in cache.cross_attention_cache.layers],
            cross_mask,
            running_scores,
            torch.full((len(sources), beams), _EXCLUDED, device=device),
            torch.zeros((len(sources), beams), dtype=torch.bool, device=device),
            torch.ones(len(sources), dtype=torch.bool, device=device),
            sentences,
        )
        arrivals, finished = self._advance(arrivals, outputs.logits[:, -1, :])
        if arrivals is not None:
            self._batch = _joined(self._batch, arrivals)
        return finished

    @torch.inference_mode()
    def step(self) -> list[Finished]:
        """One decoding step of every sentence in the running batch; returns those that finished."""
        batch = self._batch
        if batch is None:
            return []
        rows = batch.self_mask.shape[0]
        device = batch.self_mask.device
        last = torch.tensor(
            [hypothesis[-1] for sentence in batch.sentences for hypothesis in sentence.running],
            dtype=torch.long,
            device=device,
        )
        self_mask = torch.cat([batch.self_mask, torch.ones((rows, 1), dtype=torch.long, device=device)], 1)
        cache = _cache(batch)
        # The encoder's states are read from the cache's keys and values; the decoder needs their shape only.
        positions = batch.cross_mask.shape[1]
        placeholder = batch.cross_keys[0].new_zeros(1, 1, self.model.config.d_model)
        placeholder = placeholder.expand(rows, positions, -1)
        outputs = self.model(
            encoder_outputs=BaseModelOutput(last_hidden_state=placeholder),
            attention_mask=batch.cross_mask,
            decoder_input_ids=last[:, None],
            decoder_attention_mask=self_mask,
            cache=cache,
            use_cache=True,
            return_dict=True,
        )
        self_attention_cache = getattr(outputs, OUTPUT_CACHE_FIELD).self_attention_cache
        batch.self_keys = [layer.keys for layer in self_attention_cache.layers]
        batch.self_values = [layer.values for layer in self_attention_cache.layers]
        batch.self_mask = self_mask
        self._batch, finished = self._advance(batch, outputs.logits[:, -1, :])
        return finished

    def remove(self, keys: Collection[Hashable]) -> None:
        """Take the sentences under `keys` out of the running batch unfinished (their client has gone)."""
        batch = self._batch
        if batch is None:
            return
        staying = [index for index, sentence in enumerate(batch.sentences) if sentence.key not in keys]
        if len(staying) == len(batch.sentences):
            return
        if not staying:
            self._batch = None
            return
        beams = self.num_beams
        rows = (torch.tensor(staying)[:, None] * beams + torch.arange(beams)).flatten()
        self._batch = batch.select(staying, rows).trimmed()

    def keys(self) -> list[Hashable]:
        """The keys of the sentences in the running batch."""
        return [] if self._batch is None else [sentence.key for sentence in self._batch.sentences]

    def _advance(self, batch: _Batch, logits: torch.Tensor) -> tuple[_Batch | None, list[Finished]]:
        """Beam search's step for each sentence of `batch` on the decoder's `logits` (one row per beam):
        transformers' `_beam_search` loop body for each sentence alone (its steps c to g). Returns the batch
        of the sentences still searching, reordered for their beams, and those that have finished."""
        beams, sentences = self.num_beams, batch.sentences
        count = len(sentences)
        device = logits.device
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        vocabulary = log_probs.shape[-1]
        lengths = torch.tensor([s.length for s in sentences], device=device)
        limits = torch.tensor([s.limit for s in sentences], device=device)
        max_lengths = torch.tensor([s.max_length for s in sentences], device=device)
        # Section 6.1's output limit, as SourceLengthLimitLogitsProcessor forces it.
        at_limit = ((lengths - 1) >= limits).repeat_interleave(beams)
        if bool(at_limit.any()):
            forced = torch.full_like(log_probs, -float("inf"))
            forced[:, self.eos] = 0
            log_probs = torch.where(at_limit[:, None], forced, log_probs)

        scores = (log_probs.view(count, beams, vocabulary) + batch.running_scores[:, :, None]).view(count, -1)
        top_scores, top_indices = torch.topk(scores, k=2 * beams)
        origins, tokens = top_indices // vocabulary, top_indices % vocabulary
        hits = (tokens == self.eos) | (lengths + 1 >= max_lengths)[:, None]

        # The running beams: the best candidates that did not finish.
        candidates = top_scores + hits.to(torch.float32) * _EXCLUDED
        kept = torch.topk(candidates, k=beams)[1]
        running_scores = candidates.gather(1, kept)
        running_origins, running_tokens = origins.gather(1, kept), tokens.gather(1, kept)

        # The finished hypotheses: the best so far, and those among the first num_beams candidates that
        # just finished, ranked by their length-penalised scores.
        just_finished = hits.clone()
        just_finished[:, beams:] = False
        penalties = torch.tensor(
            [_finished_penalty(s.length, self.alpha, self.penalty_type) for s in sentences], device=device
        )
        finishing = top_scores / penalties[:, None]
        full = batch.finished_mask.all(dim=1, keepdim=True) & (self.early_stopping is True)
        finishing = finishing + full.to(torch.float32) * _EXCLUDED
        finishing = finishing + (~batch.improvable[:, None]).to(torch.float32) * _EXCLUDED
        finishing = finishing + (~just_finished) * _EXCLUDED
        merged_scores = torch.cat([batch.finished_scores, finishing], dim=1)
        merged_mask = torch.cat([batch.finished_mask, just_finished], dim=1)
        picked = torch.topk(merged_scores, k=beams)[1]
        batch.finished_scores = merged_scores.gather(1, picked)
        batch.finished_mask = merged_mask.gather(1, picked)
        batch.running_scores = running_scores

        # transformers' early-stopping check, after the step.
        for sentence in sentences:
            sentence.length += 1
        if self.early_stopping == "never" and self.alpha > 0.0:
            reach = [s.max_length - 1 for s in sentences]
        else:
            reach = [s.length - 1 for s in sentences]
        best_penalties = torch.tensor(
            [_best_possible_penalty(n, self.alpha, self.penalty_type) for n in reach], device=device
        )
        best_possible = batch.running_scores[:, :1] / best_penalties[:, None]
        worst_finished = torch.where(
            batch.finished_mask, batch.finished_scores.min(dim=1, keepdim=True)[0], _EXCLUDED
        )
        batch.improvable = batch.improvable & (best_possible > worst_finished).any(dim=-1)

        origins_list, tokens_list = origins.tolist(), tokens.tolist()
        picked_list = picked.tolist()
        running_origins_list, running_tokens_list = running_origins.tolist(), running_tokens.tolist()
        for index, sentence in enumerate(sentences):
            previous = sentence.running
            sentence.finished = [
                sentence.finished[k]
                if k < beams
                else previous[origins_list[index][k - beams]] + [tokens_list[index][k - beams]]
                for k in picked_list[index]
            ]
            sentence.running = [
                previous[origin] + [token]
                for origin, token in zip(running_origins_list[index], running_tokens_list[index])
            ]

        searching = (
            batch.improvable
            & ~(batch.finished_mask.all(dim=1) & (self.early_stopping is True))
            & ~hits.all(dim=1)
        ).tolist()
        finished = []
        scores_list = batch.finished_scores.tolist()
        for index, sentence in enumerate(sentences):
            if not searching[index]:
                finished.append(Finished(sentence.key, sentence.finished, scores_list[index]))
        staying = [index for index, still in enumerate(searching) if still]
        if not staying:
            return None, finished
        # Each staying sentence's rows, in the order of its running beams' origins.
        row_indices = (
            torch.tensor(staying, device=device)[:, None] * beams + running_origins[staying]
        ).flatten()
        return batch.select(staying, row_indices).trimmed(), finished


__all__ = ["Finished", "RunningBeamSearch", "unsupported"]
