# Copyright 2026 The hf-vanilla-transformer Authors. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""The paper's decoding rules (Section 6.1) on top of transformers' `generate()`:

- beam search with the length penalty of Wu et al. (2016), lp(Y) = ((5 + |Y|) / 6)^alpha, where
  transformers divides by |Y|^alpha (`length_penalty_type="gnmt"`);
- a maximum output length of each input's own length + 50 (`max_length_offset=50`);
- `paper_generation_config()`: beam 4, alpha 0.6, both rules, stopping once the beams are finished.

The GNMT-penalised beam search is this module's own decoding loop (`gnmt_beam_search`), which
`generate()` runs through transformers' public `custom_generate` argument; it reaches the model only through
its public interfaces (`prepare_inputs_for_generation`, the forward pass, the cache's `reorder_cache`), so
no transformers release can quietly swap its penalty for transformers' own. The choices of one
`generate()` call travel with that call, never on the model, so threads that share a model and re-entrant
calls each decode by their own settings.

This module is copied next to saved weights for `trust_remote_code=True` users, so it imports the
package only relatively.
"""

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from transformers.generation import (
    GenerateBeamEncoderDecoderOutput,
    GenerationConfig,
    GenerationMode,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteriaList,
)

LENGTH_PENALTY_TYPES = ("gnmt", "transformers")


def gnmt_length_penalty(length: torch.Tensor | float, alpha: float) -> torch.Tensor | float:
    """lp(Y) = ((5 + |Y|) / 6)^alpha, the length penalty of Wu et al. (2016) used in Section 6.1."""
    return ((5 + length) / 6) ** alpha


def length_penalty(
    length: torch.Tensor | float, alpha: float, penalty_type: str | None
) -> torch.Tensor | float:
    """What beam search divides a hypothesis' log-probability by to rank it: the GNMT penalty ("gnmt",
    `gnmt_length_penalty`) or transformers' |Y|^alpha (any other type). Every engine ranks by this."""
    return gnmt_length_penalty(length, alpha) if penalty_type == "gnmt" else length**alpha


def output_length_offset(generation_config: GenerationConfig, call: dict) -> int | None:
    """The offset of Section 6.1's output limit (each input's length + offset) that a `generate()` call
    decodes with, None where it does not apply: `max_length_offset` of the call or else of the config, unless
    the call passes `max_new_tokens` or `max_length`, or the config sets `max_new_tokens`, which win. Every
    engine resolves the limit here."""
    if generation_config.max_new_tokens is not None or {"max_new_tokens", "max_length"} & call.keys():
        return None
    offset = call.get("max_length_offset")
    return offset if offset is not None else getattr(generation_config, "max_length_offset", None)


def paper_generation_config(config, **overrides) -> GenerationConfig:
    """The decoding of Section 6.1: beam size 4, GNMT length penalty alpha = 0.6, outputs up to the
    input length + 50, stopping as soon as the beams are finished. `config` gives the special tokens."""
    values = dict(
        num_beams=4,
        length_penalty=0.6,
        early_stopping=True,
        length_penalty_type="gnmt",
        max_length_offset=50,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        decoder_start_token_id=config.decoder_start_token_id,
    )
    values.update(overrides)
    return GenerationConfig(**values)


class SourceLengthLimitLogitsProcessor(LogitsProcessor):
    """Section 6.1's "maximum output length of input length + 50": once hypothesis i has as many
    tokens as its own source's limit, only the end-of-sequence token may follow."""

    def __init__(self, limits: torch.Tensor, eos_token_id: int, prompt_length: int = 1) -> None:
        self.limits = limits
        self.eos_token_id = eos_token_id
        self.prompt_length = prompt_length

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        # generate() repeats each source num_beams (or num_return_sequences) times, consecutively.
        limits = self.limits.to(scores.device).repeat_interleave(input_ids.shape[0] // self.limits.shape[0])
        at_limit = (input_ids.shape[1] - self.prompt_length) >= limits
        forced = torch.full_like(scores, -float("inf"))
        forced[:, self.eos_token_id] = 0
        return torch.where(at_limit[:, None], forced, scores)


# Cache field names of model inputs and outputs: "cache" from transformers 5.24, "past_key_values" before.
_CACHE_NAMES = ("cache", "past_key_values")
# The score that keeps a hypothesis out of a top-k: far below any sum of log-probabilities.
_EXCLUDED = -1.0e9


def _take_beams(tensor: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`tensor[b, index[b, j], ...]` for a (batch, beams, ...) tensor and a (batch, picks) index."""
    index = index.view(*index.shape, *([1] * (tensor.dim() - index.dim())))
    return torch.take_along_dim(tensor, index, dim=1)


def _cache_name(mapping: Mapping[str, Any]) -> str | None:
    """The name under which `mapping` (the model's keyword arguments, or its output) holds a cache."""
    return next((name for name in _CACHE_NAMES if mapping.get(name) is not None), None)


def _after_step(outputs: Any, model_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The model's keyword arguments for the next decoding step: the cache the step returned, and a decoder
    attention mask one position longer (the new tokens are never padding)."""
    returned = _cache_name(outputs)
    if returned is not None:
        model_kwargs[_cache_name(model_kwargs) or returned] = outputs[returned]
    mask = model_kwargs.get("decoder_attention_mask")
    if mask is not None:
        model_kwargs["decoder_attention_mask"] = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=-1)
    return model_kwargs


def gnmt_beam_search(
    model: Any,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    **model_kwargs: Any,
) -> GenerateBeamEncoderDecoderOutput | torch.LongTensor:
    """Beam search that ranks finished hypotheses by log P(Y|X) / lp(Y), lp(Y) = ((5 + |Y|) / 6)^alpha
    with alpha = `length_penalty` (Section 6.1, after Wu et al., 2016), where transformers' own beam search
    divides by |Y|^alpha. `PaperDecodingMixin.generate` passes it to transformers'
    `generate(custom_generate=...)`, which prepares the inputs (the encoder's output, the beams' copies of
    each input, the cache, the logits processors and stopping criteria) and hands over the decoding loop.

    Apart from the penalty it decodes as transformers' beam search does, step for step:

    - each input keeps `num_beams` running hypotheses, ranked by their summed log-probabilities (after the
      logits processors); at first only one, so that the beams do not start alike;
    - each step takes the best max(2, 1 + number of end tokens) x `num_beams` continuations of all its beams
      (or, with `do_sample`, draws them), enough that `num_beams` of them continue even where the best ones
      end; those that hit a stopping criterion (an end token, `max_length`) leave the running beams;
    - a hypothesis ends up among an input's `num_beams` finished ones only if it ended among the best
      `num_beams` continuations of its step and scores, penalised, above the worst finished one; with
      `early_stopping=True` no more are taken once an input has `num_beams`;
    - an input stops taking hypotheses once its best running beam, penalised by its current length (by
      `max_length` where `early_stopping="never"` and alpha > 0, the length that penalty favours), cannot beat
      its worst finished one; the search stops when no input can improve, when every input has `num_beams`
      finished hypotheses and `early_stopping=True`, or when every continuation hit a stopping criterion;
    - the best `num_return_sequences` finished hypotheses of each input are returned, best first, padded
      after their end (with the pad token, or the first end token where the pad token is unset or 0).

    It uses only public interfaces: the model's `prepare_inputs_for_generation` and forward pass, the cache's
    `reorder_cache`, the given processors and criteria, and transformers' output classes.
    """
    config = generation_config
    mode = config.get_generation_mode()
    if mode not in (GenerationMode.BEAM_SEARCH, GenerationMode.BEAM_SAMPLE):
        raise ValueError(
            f"length_penalty_type='gnmt' is a beam search's penalty, not one of {mode.value}: decode with "
            "num_beams > 1 (without beam groups or constraints), or with length_penalty_type='transformers'."
        )
    if not model.config.is_encoder_decoder:
        raise ValueError("The GNMT beam search decodes encoder-decoder models only.")
    alpha = config.length_penalty
    early_stopping = config.early_stopping
    max_length = config.max_length
    num_beams = config.num_beams
    eos = config.eos_token_id
    eos_ids = [] if eos is None else torch.as_tensor(eos).flatten().tolist()
    fill = (config.pad_token_id or eos_ids[0]) if eos_ids else -1
    return_dict = config.return_dict_in_generate
    all_scores = () if return_dict and config.output_scores else None
    raw_logits = () if return_dict and config.output_logits else None
    keep_attentions = return_dict and config.output_attentions
    decoder_attentions = () if keep_attentions else None
    cross_attentions = () if keep_attentions else None
    decoder_hidden_states = () if return_dict and config.output_hidden_states else None

    device = input_ids.device
    batch_size, prompt_length = input_ids.shape[0] // num_beams, input_ids.shape[1]
    candidates = max(2, 1 + len(eos_ids)) * num_beams
    among_best = torch.arange(candidates, device=device) < num_beams
    batch_offsets = torch.arange(batch_size, device=device)[:, None] * num_beams

    # Running and finished hypotheses, (batch, beam, position), with their scores and, per generated token,
    # the flat index (input x num_beams + beam) of the beam it continued.
    running = input_ids.new_full((batch_size, num_beams, max_length), fill)
    running[:, :, :prompt_length] = input_ids.view(batch_size, num_beams, prompt_length)
    running_scores = torch.zeros(batch_size, num_beams, device=device)
    running_scores[:, 1:] = _EXCLUDED
    running_origins = torch.full(
        (batch_size, num_beams, max_length - prompt_length), -1, dtype=torch.int32, device=device
    )
    finished, finished_origins = running.clone(), running_origins.clone()
    finished_scores = torch.full((batch_size, num_beams), _EXCLUDED, device=device)
    is_finished = torch.zeros(batch_size, num_beams, dtype=torch.bool, device=device)
    can_improve = torch.ones(batch_size, 1, dtype=torch.bool, device=device)

    cur_len, step_ids = prompt_length, input_ids
    while True:
        outputs = model(**model.prepare_inputs_for_generation(step_ids, **model_kwargs), return_dict=True)
        model_kwargs = _after_step(outputs, model_kwargs)
        logits = outputs.logits[:, -1, :].to(copy=True, dtype=torch.float32, device=device)
        log_probs = logits_processor(running[:, :, :cur_len].flatten(0, 1), logits.log_softmax(dim=-1))
        if raw_logits is not None:
            raw_logits += (logits.clone(),)
        if all_scores is not None:
            all_scores += (log_probs.clone(),)
        if decoder_attentions is not None:
            decoder_attentions += (outputs.decoder_attentions,)
            cross_attentions += (outputs.cross_attentions,)
        if decoder_hidden_states is not None:
            decoder_hidden_states += (outputs.decoder_hidden_states,)
        del outputs

        # The best (or drawn) continuations of all of an input's beams, by summed log-probability.
        vocab_size = log_probs.shape[-1]
        totals = (log_probs.view(batch_size, num_beams, vocab_size) + running_scores[:, :, None]).flatten(1)
        if config.do_sample:
            picked = torch.multinomial(totals.softmax(dim=-1), num_samples=candidates)
            picked_scores, order = totals.gather(1, picked).sort(dim=-1, descending=True)
            picked = picked.gather(-1, order)
        else:
            picked_scores, picked = totals.topk(candidates)
        from_beam = picked // vocab_size
        picked_seqs = _take_beams(running, from_beam)
        picked_seqs[:, :, cur_len] = picked % vocab_size
        picked_origins = _take_beams(running_origins, from_beam)
        picked_origins[:, :, cur_len - prompt_length] = from_beam + batch_offsets
        ended = stopping_criteria(picked_seqs[:, :, : cur_len + 1].flatten(0, 1), all_scores)
        ended = ended.view(batch_size, candidates)

        # The best continuations that did not end run on.
        open_scores = picked_scores + ended.to(torch.float32) * _EXCLUDED
        kept = open_scores.topk(num_beams).indices
        running = _take_beams(picked_seqs, kept)
        running_scores = _take_beams(open_scores, kept)
        running_origins = _take_beams(picked_origins, kept)

        # Those that ended among the best num_beams compete, penalised, for the finished places.
        just_finished = ended & among_best
        ranked = picked_scores / gnmt_length_penalty(cur_len + 1 - prompt_length, alpha)
        full = is_finished.all(dim=-1, keepdim=True) & (early_stopping is True)
        ranked += full.to(torch.float32) * _EXCLUDED
        ranked += (~can_improve).to(torch.float32) * _EXCLUDED
        ranked += (~just_finished) * _EXCLUDED
        best = torch.cat([finished_scores, ranked], dim=1).topk(num_beams).indices
        finished = _take_beams(torch.cat([finished, picked_seqs], dim=1), best)
        finished_scores = _take_beams(torch.cat([finished_scores, ranked], dim=1), best)
        finished_origins = _take_beams(torch.cat([finished_origins, picked_origins], dim=1), best)
        is_finished = _take_beams(torch.cat([is_finished, just_finished], dim=1), best)

        cache_name = _cache_name(model_kwargs)
        if cache_name is not None:
            model_kwargs[cache_name].reorder_cache(running_origins[:, :, cur_len - prompt_length].flatten())
        cur_len += 1

        # Can an input's best running beam still beat its worst finished hypothesis?
        if early_stopping == "never" and alpha > 0.0:
            best_length = max_length - prompt_length
        else:
            best_length = cur_len - prompt_length
        best_running = running_scores[:, :1] / gnmt_length_penalty(best_length, alpha)
        worst_finished = torch.where(is_finished, finished_scores.min(dim=1, keepdim=True).values, _EXCLUDED)
        can_improve = can_improve & (best_running > worst_finished).any(dim=-1, keepdim=True)
        all_full = bool(is_finished.all()) and early_stopping is True
        if not bool(can_improve.any()) or all_full or bool(ended.all()):
            break
        running_ids = running[:, :, :cur_len].flatten(0, 1)
        step_ids = running_ids[:, -1:] if cache_name is not None else running_ids

    # Each input's best num_return_sequences, cut after the longest of them.
    returned = config.num_return_sequences
    sequences = finished[:, :returned].flatten(0, 1)
    sequences_scores = finished_scores[:, :returned].flatten(0, 1)
    beam_indices = finished_origins[:, :returned].flatten(0, 1)
    generated = int(beam_indices.ne(-1).sum(dim=1).max())
    sequences = sequences[:, : prompt_length + generated]
    if not return_dict:
        return sequences
    encoder_outputs = model_kwargs.get("encoder_outputs")
    fields = {field.name for field in dataclasses.fields(GenerateBeamEncoderDecoderOutput)}
    cache_name = _cache_name(model_kwargs)
    cache = {name: model_kwargs[cache_name] for name in _CACHE_NAMES if name in fields and cache_name}
    return GenerateBeamEncoderDecoderOutput(
        sequences=sequences,
        sequences_scores=sequences_scores if config.output_scores else None,
        scores=all_scores,
        logits=raw_logits,
        beam_indices=beam_indices[:, :generated],
        encoder_attentions=getattr(encoder_outputs, "attentions", None) if keep_attentions else None,
        encoder_hidden_states=(
            getattr(encoder_outputs, "hidden_states", None) if config.output_hidden_states else None
        ),
        decoder_attentions=decoder_attentions,
        cross_attentions=cross_attentions,
        decoder_hidden_states=decoder_hidden_states,
        **cache,
    )


def _source_length_limits(
    model_config, source: torch.Tensor | None, attention_mask: torch.Tensor | None, offset: int
) -> torch.Tensor:
    """Each input's output limit: its length (from the attention mask, else its non-padding ids) + offset."""
    if attention_mask is not None:
        return attention_mask.sum(dim=1) + offset
    if source is None:
        raise ValueError(
            "max_length_offset needs each input's length: pass the source input_ids or its attention_mask, "
            "or set the output limit yourself with max_new_tokens."
        )
    return source.ne(model_config.pad_token_id).sum(1) + offset


class PaperDecodingMixin:
    """The paper's decoding rules on top of `GenerationMixin`, each selectable per call or in the generation
    config (where `paper_generation_config()` puts them). A model class lists it before `GenerationMixin`,
    which transformers wants among the model's direct bases."""

    def generate(
        self,
        inputs: torch.Tensor | None = None,
        generation_config: GenerationConfig | None = None,
        logits_processor: LogitsProcessorList | None = None,
        *args: Any,
        length_penalty_type: str | None = None,
        max_length_offset: int | None = None,
        **kwargs: Any,
    ) -> Any:
        """`GenerationMixin.generate`, with two more keyword arguments (Section 6.1):

        - `length_penalty_type="gnmt"`: beam scores are divided by ((5 + |Y|) / 6)^length_penalty, the
          penalty of Wu et al. (2016), instead of transformers' |Y|^length_penalty ("transformers"). A beam
          search (num_beams > 1) then runs `gnmt_beam_search` as transformers' `custom_generate`, unless the
          call passes its own; greedy search and sampling have no penalty and stay transformers' own.
        - `max_length_offset=50`: each output stops at its own input length + 50 tokens (before the end
          token). Ignored when `max_new_tokens` or `max_length` is passed to this call, or `max_new_tokens`
          is set in the generation config. With learned positions, no output runs past the model's
          `max_position_embeddings`.
        """
        config = generation_config or self.generation_config
        penalty_type = length_penalty_type or getattr(config, "length_penalty_type", None) or "transformers"
        if penalty_type not in LENGTH_PENALTY_TYPES:
            raise ValueError(
                f"Unknown length_penalty_type {penalty_type!r}: choose one of {LENGTH_PENALTY_TYPES}."
            )
        max_length_offset = output_length_offset(config, {**kwargs, "max_length_offset": max_length_offset})
        if max_length_offset is not None:
            source = inputs if inputs is not None else kwargs.get("input_ids")
            limits = _source_length_limits(
                self.config, source, kwargs.get("attention_mask"), max_length_offset
            )
            eos = self.config.eos_token_id
            eos = eos[0] if isinstance(eos, list) else eos
            logits_processor = LogitsProcessorList(
                [*(logits_processor or []), SourceLengthLimitLogitsProcessor(limits, eos)]
            )
            max_new_tokens = int(limits.max()) + 1
            if getattr(self.config, "position_embedding_type", None) == "learned":
                max_new_tokens = min(max_new_tokens, self.config.max_position_embeddings)
            # Set on a copy of the call's config rather than passed beside it, which transformers deprecates.
            if generation_config is None:
                kwargs["max_new_tokens"] = max_new_tokens
            else:
                generation_config = copy.deepcopy(generation_config)
                generation_config.max_new_tokens = max_new_tokens
        beams = kwargs.get("num_beams", getattr(config, "num_beams", 1)) or 1
        if penalty_type == "gnmt" and beams > 1 and kwargs.get("custom_generate") is None:
            # transformers' beam search divides by |Y|^alpha; the GNMT beam search replaces its loop.
            kwargs["custom_generate"] = gnmt_beam_search
        return super().generate(inputs, generation_config, logits_processor, *args, **kwargs)


__all__ = [
    "LENGTH_PENALTY_TYPES",
    "PaperDecodingMixin",
    "SourceLengthLimitLogitsProcessor",
    "gnmt_beam_search",
    "gnmt_length_penalty",
    "length_penalty",
    "output_length_offset",
    "paper_generation_config",
]
