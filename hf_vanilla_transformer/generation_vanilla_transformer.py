"""The paper's decoding rules (Section 6.1) on top of transformers' `generate()`:

- beam search with the length penalty of Wu et al. (2016), lp(Y) = ((5 + |Y|) / 6)^alpha, where
  transformers divides by |Y|^alpha (`length_penalty_type="gnmt"`);
- a maximum output length of each input's own length + 50 (`max_length_offset=50`);
- `paper_generation_config()`: beam 4, alpha 0.6, both rules, stopping once the beams are finished.

The choices of one `generate()` call live in that call's context, never on the model, so threads that
share a model and re-entrant calls each decode by their own settings. transformers' beam search applies its
penalty in two methods, which `PaperDecodingMixin` overrides; if a transformers release renames or
reshapes them, the first GNMT-penalised beam search raises instead of quietly using transformers' penalty.

This module is copied next to saved weights for `trust_remote_code=True` users, so it imports the
package only relatively.
"""

import copy
import inspect
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from transformers.generation import GenerationConfig, GenerationMixin, LogitsProcessor, LogitsProcessorList

LENGTH_PENALTY_TYPES = ("gnmt", "transformers")

# The two beam-search methods where transformers divides a hypothesis' score by its length penalty, and
# the keyword arguments the overrides below rely on.
_PENALTY_HOOKS = {
    "_update_finished_beams": ("cur_len", "decoder_prompt_len", "length_penalty"),
    "_check_early_stop_heuristic": ("cur_len", "max_length", "decoder_prompt_len", "length_penalty"),
}


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


@dataclass
class _DecodingCall:
    """What one generate() call chose, and how often transformers' beam search asked for its penalty."""

    gnmt_penalty: bool
    penalty_hook_calls: int = 0


_CURRENT_CALL: ContextVar[_DecodingCall | None] = ContextVar("_CURRENT_CALL", default=None)


def _check_penalty_hooks() -> None:
    """Fail loudly where transformers' beam search no longer has the methods the GNMT penalty overrides."""
    for name, needed in _PENALTY_HOOKS.items():
        method = getattr(GenerationMixin, name, None)
        parameters = set(inspect.signature(method).parameters) if callable(method) else set()
        missing = [p for p in needed if p not in parameters]
        if missing:
            raise RuntimeError(
                f"length_penalty_type='gnmt' needs transformers' GenerationMixin.{name} with arguments "
                f"{list(needed)}; this transformers version lacks {missing}. Use a transformers version this "
                "package supports (see pyproject.toml), or length_penalty_type='transformers'."
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
        *args,
        length_penalty_type: str | None = None,
        max_length_offset: int | None = None,
        **kwargs,
    ) -> torch.LongTensor:
        """`GenerationMixin.generate`, with two more keyword arguments (Section 6.1):

        - `length_penalty_type="gnmt"`: beam scores are divided by ((5 + |Y|) / 6)^length_penalty, the
          penalty of Wu et al. (2016), instead of transformers' |Y|^length_penalty ("transformers").
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
        gnmt = penalty_type == "gnmt"
        if gnmt:
            _check_penalty_hooks()
        call = _DecodingCall(gnmt_penalty=gnmt)
        token = _CURRENT_CALL.set(call)
        try:
            with self._decoding_context():
                output = super().generate(inputs, generation_config, logits_processor, *args, **kwargs)
        finally:
            _CURRENT_CALL.reset(token)
        beams = kwargs.get("num_beams", getattr(config, "num_beams", 1)) or 1
        if gnmt and beams > 1 and call.penalty_hook_calls == 0:
            raise RuntimeError(
                "length_penalty_type='gnmt': transformers' beam search ran without calling the methods "
                f"that apply the penalty ({', '.join(_PENALTY_HOOKS)}), so the GNMT penalty was not applied. "
                "Use a transformers version this package supports, or length_penalty_type='transformers'."
            )
        return output

    def _decoding_context(self, sentences_apart: bool = False) -> AbstractContextManager:
        """Entered around each generate() call, and around a running batch's steps (`sentences_apart`):
        where a model keeps copies of its fixed weights for the decoding steps, and keeps each sentence's
        attention apart from a batch's padding. Nothing here."""
        return nullcontext()

    # transformers' beam search divides a hypothesis' log-probability by length ** length_penalty in these
    # two methods. For the GNMT penalty they pass a length L' with L' ** alpha == ((5 + L) / 6) ** alpha,
    # so the rest of the search stays transformers' own.
    def _update_finished_beams(self, *, cur_len: int, decoder_prompt_len: int, **kwargs):
        call = _CURRENT_CALL.get()
        if call is not None and call.gnmt_penalty:
            call.penalty_hook_calls += 1
            cur_len = decoder_prompt_len - 1 + gnmt_length_penalty(cur_len + 1 - decoder_prompt_len, 1.0)
        return super()._update_finished_beams(
            cur_len=cur_len, decoder_prompt_len=decoder_prompt_len, **kwargs
        )

    def _check_early_stop_heuristic(
        self, *, cur_len: int, max_length: int, decoder_prompt_len: int, **kwargs
    ):
        call = _CURRENT_CALL.get()
        if call is not None and call.gnmt_penalty:
            call.penalty_hook_calls += 1
            cur_len = decoder_prompt_len + gnmt_length_penalty(cur_len - decoder_prompt_len, 1.0)
            max_length = decoder_prompt_len + gnmt_length_penalty(max_length - decoder_prompt_len, 1.0)
        return GenerationMixin._check_early_stop_heuristic(
            cur_len=cur_len, max_length=max_length, decoder_prompt_len=decoder_prompt_len, **kwargs
        )


__all__ = [
    "LENGTH_PENALTY_TYPES",
    "PaperDecodingMixin",
    "SourceLengthLimitLogitsProcessor",
    "gnmt_length_penalty",
    "length_penalty",
    "output_length_offset",
    "paper_generation_config",
]
