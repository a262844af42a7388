"""Translating many sentences: batches of similar length, the model's own decoding rules, the n best
hypotheses with their scores and word alignments, inputs cut to the model's positions, progress; the device
to translate on; and int8 dynamic quantization for faster decoding on CPUs."""

import copy
import sys
import warnings
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging

from ..common.cpu_speedups import (
    CPUDecodingCache,
    eager_cpu,
    weights_fixed_for_decoding,
    with_nn_linear_layers,
)
from ..registration import register_auto_classes
from ..translation_pipeline import find_target_tokenizer
from ..vanilla_transformer.generation_vanilla_transformer import length_penalty, output_length_offset
from .alignment import align
from .blank import is_blank
from .decoding_memory import check_batch_fits, check_beams
from .hypotheses import Hypothesis, Translation
from .scoring import end_token_id, model_positions, token_log_probs

logger = logging.get_logger(__name__)
# What generate() decodes up to where nothing sets a limit: transformers' model-agnostic 20 tokens after the
# decoder start token.
_DEFAULT_MAX_LENGTH = 21


def load_tokenizers(
    model_name_or_path: str | Path,
) -> tuple[PreTrainedTokenizerBase, PreTrainedTokenizerBase | None]:
    """A model's tokenizer, and its target tokenizer when the source and target vocabularies are separate
    (converted fairseq models keep it in `target_tokenizer/`): pass both to `translate`."""
    register_auto_classes()
    return AutoTokenizer.from_pretrained(model_name_or_path), find_target_tokenizer(model_name_or_path)


def resolve_device(device: str = "auto") -> torch.device:
    """The torch device that `device` names: "auto" is CUDA when torch finds a CUDA device, else the CPU;
    "cpu", "cuda" and "cuda:N" are themselves.

    Raises:
        ValueError: `device` is not a torch device, or names a CUDA device torch does not find here.
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise ValueError(f"{device!r} is not a device: use auto, cpu, cuda or cuda:N.") from None
    if resolved.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU-only build"
            raise ValueError(
                f"{device}: torch ({torch.__version__}, {build}) finds no CUDA device here; use cpu, or a "
                "machine with an NVIDIA GPU and a CUDA build of torch."
            )
        if resolved.index is not None and resolved.index >= count:
            raise ValueError(f"{device}: torch finds {count} CUDA device(s) here, numbered from 0.")
    return resolved


def encode_sources(
    model: Any, tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], line_numbers: Sequence[int]
) -> tuple[list[list[int]], set[int]]:
    """Token ids of `texts`, each cut to the model's positions (`scoring.model_positions`; its end token
    kept), and the indices of those cut, each with a warning naming its line (`line_numbers`, one a text)."""
    positions = model_positions(model)
    texts = list(texts)
    encoded = tokenizer(texts, add_special_tokens=True)["input_ids"] if texts else []
    truncated = set()
    for index, ids in enumerate(encoded):
        if positions is not None and len(ids) > positions:
            logger.warning(
                f"line {line_numbers[index]}: {len(ids)} tokens, more than the model's {positions} "
                f"positions; translated its first {positions - 1} tokens only, so the translation is "
                "incomplete. Split such lines (--split-sentences) to translate all of them."
            )
            encoded[index] = ids[: positions - 1] + ids[-1:]
            truncated.add(index)
    return encoded, truncated


def _decoding_settings(model: Any, generate_kwargs: dict[str, Any]) -> tuple[int, bool]:
    """The beam size and whether the call samples, from `generate_kwargs` over the model's config."""
    config = model.generation_config
    beams = generate_kwargs.get("num_beams", config.num_beams) or 1
    sampling = bool(generate_kwargs.get("do_sample", config.do_sample))
    return beams, sampling


def check_n_best(model: Any, n_best: int, generate_kwargs: dict[str, Any]) -> None:
    """Refuse an `n_best` that decoding cannot give: more hypotheses than the beam keeps (sampling draws
    any number)."""
    beams, sampling = _decoding_settings(model, generate_kwargs)
    if n_best < 1:
        raise ValueError(f"n_best must be at least 1, got {n_best}.")
    if not sampling and n_best > beams:
        raise ValueError(
            f"n_best {n_best} is more than the {beams} hypotheses the beam keeps: ask for at most {beams}, "
            f"or search with a beam of at least {n_best} (num_beams)."
        )


def translate_n_best(
    model: Any,
    tokenizer: PreTrainedTokenizerBase,
    sentences: Sequence[str],
    *,
    target_tokenizer: PreTrainedTokenizerBase | None = None,
    n_best: int = 1,
    scores: bool = True,
    alignments: bool = False,
    batch_size: int = 64,
    progress: bool = True,
    line_numbers: Sequence[int] | None = None,
    **generate_kwargs: Any,
) -> list[Translation]:
    """Translate `sentences` in the order given, keeping the `n_best` best hypotheses of each (best first),
    with their log-probabilities and scores (`scores`), and their word alignments (`alignments`).

    Sentences are sorted by length so that each batch pads little (as Section 5.1 batches training
    pairs), then put back in input order. Decoding follows `model.generation_config` (the paper's beam
    search, Section 6.1, for models trained or published by this package) unless `generate_kwargs`
    override it; with sampling (`do_sample=True`), the n best are `n_best` independent samples, ranked.
    Outputs are decoded with `target_tokenizer` when given (separate target vocabulary, see
    `load_tokenizers`), else with `tokenizer`. A blank sentence (`blank.is_blank`: empty, or only white
    space, control or zero-width characters) translates to an empty hypothesis without reaching the model,
    which would otherwise decode a sentence from nothing.

    Each hypothesis' `log_prob` is the model's log P(y | x), recomputed by forced decoding of the output
    (`scoring.token_log_probs`); its `score` divides it by the length penalty the beam search ranks by
    (Section 6.1; `log_prob` itself for greedy search and sampling). An input longer than the model's
    positions (`scoring.model_positions`) is cut to them, with a warning naming its line (its number in
    `line_numbers`, one a sentence; by default 1, 2, ...), and its translation is marked `truncated`.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    generate_kwargs.pop("num_return_sequences", None)
    check_n_best(model, n_best, generate_kwargs)
    texts = list(sentences)
    results: list[Translation] = [Translation(text, [Hypothesis("")]) for text in texts]
    kept = [i for i, text in enumerate(texts) if not is_blank(text)]
    numbers = list(line_numbers) if line_numbers is not None else list(range(1, len(texts) + 1))
    encoded, truncated = encode_sources(
        model, tokenizer, [texts[i] for i in kept], [numbers[i] for i in kept]
    )
    order = sorted(range(len(kept)), key=lambda j: len(encoded[j]), reverse=True)
    beams, sampling = _decoding_settings(model, generate_kwargs)
    if not sampling and hasattr(model, "config"):  # a CTranslate2 export keeps its dimensions to itself
        check_beams(model.config, beams)
    model.eval()
    bar = tqdm(total=len(order), desc="Translating", unit="sent", disable=not progress)
    # One decoding context for every batch: the packed weights serve them all.
    with decoding_context(model):
        for start in range(0, len(order), batch_size):
            indices = order[start : start + batch_size]
            if isinstance(model, PreTrainedModel):  # the estimate is of transformers' own beam search
                source_length = len(encoded[indices[0]])  # the longest: the order is by length, longest first
                check_batch_fits(
                    model.config,
                    model.device,
                    batch_size=len(indices),
                    beams=beams,
                    source_length=source_length,
                    output_length=_output_length(model, generate_kwargs, source_length),
                    n_best=n_best,
                    scores=scores,
                )
            batch = tokenizer.pad({"input_ids": [encoded[j] for j in indices]}, return_tensors="pt")
            batch = {key: value.to(model.device) for key, value in batch.items()}
            with torch.inference_mode():
                generated = model.generate(
                    **batch,
                    num_return_sequences=n_best,
                    **decoding_cache(model, beams, generate_kwargs),
                    **generate_kwargs,
                )
            outputs = _output_ids(generated, model)
            # generate() returns each input's n_best rows consecutively.
            hypotheses = hypotheses_of(
                model,
                tokenizer,
                [encoded[j] for j in indices],
                [outputs[p * n_best : (p + 1) * n_best] for p in range(len(indices))],
                scores=scores,
                alignments=alignments,
                target_tokenizer=target_tokenizer,
                batch_size=batch_size,
                generate_kwargs=generate_kwargs,
            )
            for j, found in zip(indices, hypotheses):
                if sampling and scores:  # samples come unordered: rank them as a beam would
                    found.sort(key=lambda hypothesis: -hypothesis.score)
                results[kept[j]] = Translation(texts[kept[j]], found, truncated=j in truncated)
            bar.update(len(indices))
    bar.close()
    return results


def decoding_context(model: Any) -> AbstractContextManager[None]:
    """Where a PyTorch model decodes on a CPU: its weights fixed for the block, so that the `CPULinear`
    layers of a model prepared for CPU decoding (`cpu_speedups.prepare_for_cpu_decoding`, as the PyTorch
    engine loads it) pack each weight once (`cpu_speedups.weights_fixed_for_decoding`). The model itself is
    not changed, so threads may translate with one model. Elsewhere, and for the exported engines,
    nothing."""
    if isinstance(model, PreTrainedModel) and model.device.type == "cpu":
        return weights_fixed_for_decoding()
    return nullcontext()


def decoding_cache(model: Any, beams: int, generate_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The cache argument for a PyTorch model's beam search on a CPU: `CPUDecodingCache`, whose reordering
    fills a free position instead of copying, unless the call chose its own cache."""
    chosen = {"cache", "past_key_values", "cache_implementation"} & generate_kwargs.keys()
    if beams < 2 or chosen or not isinstance(model, PreTrainedModel):
        return {}
    weight = next(model.parameters(), None)  # an exported engine's stand-in model has none
    if weight is None or not eager_cpu(weight):
        return {}
    return {"cache": CPUDecodingCache.for_model(model)}


def hypotheses_of(
    model: Any,
    tokenizer: PreTrainedTokenizerBase,
    sources: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[Sequence[int]]],
    *,
    scores: bool,
    alignments: bool,
    target_tokenizer: PreTrainedTokenizerBase | None = None,
    batch_size: int = 64,
    generate_kwargs: dict[str, Any] | None = None,
) -> list[list[Hypothesis]]:
    """The hypotheses of each source (token ids, as `encode_sources` gives them) from its decoded
    `outputs` (token ids after the decoder start token, the end token kept, best first): their text and
    tokens, with their log-probabilities and scores (`scores`, by forced decoding, as `translate_n_best`
    describes) and word alignments (`alignments`). `generate_kwargs` are the decoding settings the outputs
    were decoded with, over the model's own."""
    generate_kwargs = generate_kwargs or {}
    decoder = target_tokenizer or tokenizer
    beams, sampling = _decoding_settings(model, generate_kwargs)
    penalty = _ranking_penalty(model, generate_kwargs) if beams > 1 and not sampling else None
    limit = _length_limit(model, generate_kwargs)
    rows = [(position, row) for position, found in enumerate(outputs) for row in found]
    log_probs = aligned = None
    if scores and rows:
        batch = tokenizer.pad({"input_ids": [sources[p] for p, _ in rows]}, return_tensors="pt")
        batch = {key: value.to(model.device) for key, value in batch.items()}
        log_probs = token_log_probs(model, batch["input_ids"], batch["attention_mask"], [r for _, r in rows])
    if alignments and rows:
        start = model.generation_config.decoder_start_token_id
        aligned = align(
            model,
            tokenizer,
            [sources[p] for p, _ in rows],
            [[start, *row] for _, row in rows],
            target_tokenizer=target_tokenizer,
            batch_size=batch_size,
        )
    hypotheses: list[list[Hypothesis]] = [[] for _ in outputs]
    for index, (position, row) in enumerate(rows):
        log_prob = ranked = None
        if log_probs is not None:
            log_prob = ranked = sum(log_probs[index])
            if limit is not None and len(row) == limit(len(sources[position])) + 1:
                # The end token forced at the length limit (Section 6.1) counts as certain there.
                ranked -= log_probs[index][-1]
        hypotheses[position].append(
            Hypothesis(
                text=decoder.decode(row, skip_special_tokens=True).strip(),
                tokens=decoder.convert_ids_to_tokens(_without_end(row, model)),
                log_prob=log_prob,
                score=_score(ranked, len(row), penalty),
                **(asdict(aligned[index]) if aligned is not None else {}),
            )
        )
    return hypotheses


def _ranking_penalty(model: Any, generate_kwargs: dict[str, Any]) -> Callable[[int], float]:
    """The length penalty beam search divides a hypothesis' log-probability by, as a function of its
    length (the end token counted, as transformers counts it)."""
    config = model.generation_config
    alpha = generate_kwargs.get("length_penalty", config.length_penalty)
    kind = generate_kwargs.get("length_penalty_type", getattr(config, "length_penalty_type", None))
    return lambda length: length_penalty(length, alpha, kind)


def _length_limit(model: Any, generate_kwargs: dict[str, Any]) -> Callable[[int], int] | None:
    """Where the paper's output limit applies, the most tokens an output may have before its forced end
    token, as a function of its input's length."""
    offset = output_length_offset(model.generation_config, generate_kwargs)
    return None if offset is None else lambda source_length: source_length + offset


def _output_length(model: Any, generate_kwargs: dict[str, Any], source_length: int) -> int:
    """The most tokens `generate()` returns for an input of `source_length` tokens: the decoder start token,
    then at most the paper's limit and the end token forced there, or what max_new_tokens or max_length
    allow."""
    limit = _length_limit(model, generate_kwargs)
    if limit is not None:
        return limit(source_length) + 2
    config = model.generation_config
    new_tokens = generate_kwargs.get("max_new_tokens", config.max_new_tokens)
    if new_tokens is not None:
        return new_tokens + 1
    return generate_kwargs.get("max_length") or config.max_length or _DEFAULT_MAX_LENGTH


def _score(log_prob: float | None, length: int, penalty: Callable[[int], float] | None) -> float | None:
    if log_prob is None:
        return None
    return log_prob / penalty(length) if penalty is not None else log_prob


def _output_ids(generated: torch.Tensor, model: Any) -> list[list[int]]:
    """Each row of `generate()`'s output as its generated ids: the decoder start token dropped, and the
    padding after the end token (the end token kept, where the output has one)."""
    end, pad = end_token_id(model), model.generation_config.pad_token_id
    outputs = []
    for row in generated[:, 1:].tolist():
        if end in row:
            row = row[: row.index(end) + 1]
        while row and row[-1] == pad:
            row.pop()
        outputs.append(row)
    return outputs


def _without_end(ids: list[int], model: Any) -> list[int]:
    return ids[:-1] if ids and ids[-1] == end_token_id(model) else ids


def translate(
    model: Any,
    tokenizer: PreTrainedTokenizerBase,
    sentences: Sequence[str],
    *,
    target_tokenizer: PreTrainedTokenizerBase | None = None,
    batch_size: int = 64,
    progress: bool = True,
    **generate_kwargs: Any,
) -> list[str] | list[list[str]]:
    """Translate `sentences` in the order given: one string each, or with `num_return_sequences=K` (in the
    call or the generation config) a list of each one's K best, best first. `translate_n_best` says how
    (batches, decoding settings, blank and over-long inputs) and gives their scores too."""
    returned = generate_kwargs.pop("num_return_sequences", model.generation_config.num_return_sequences) or 1
    translations = translate_n_best(
        model,
        tokenizer,
        sentences,
        target_tokenizer=target_tokenizer,
        n_best=returned,
        scores=False,
        batch_size=batch_size,
        progress=progress,
        **generate_kwargs,
    )
    if returned == 1:
        return [translation.text for translation in translations]
    return [[hypothesis.text for hypothesis in translation.hypotheses] for translation in translations]


def seed_sampling(seed: int) -> None:
    """Seed the random draws of sampling (`do_sample=True`): torch's, and CTranslate2's where it is loaded."""
    torch.manual_seed(seed)
    if "ctranslate2" in sys.modules:
        sys.modules["ctranslate2"].set_random_seed(seed)


def quantize_int8(model: PreTrainedModel) -> PreTrainedModel:
    """A copy of `model` whose linear layers hold int8 weights and quantize their inputs on the fly
    (torch's dynamic quantization), for decoding on CPUs: faster than float32, with slightly different
    outputs (speed and BLEU measured in benchmarks/RESULTS.md). `model` is left as is.
    """
    if any(p.device.type != "cpu" for p in model.parameters()):
        raise ValueError(
            "int8 dynamic quantization runs on the CPU: load the model there (.to('cpu')) first."
        )
    if any(p.dtype != torch.float32 for p in model.parameters()):
        raise ValueError("int8 dynamic quantization starts from float32 weights: load the model in float32.")
    with warnings.catch_warnings():
        # torch marks torch.ao quantization deprecated in favour of torchao; it works in the torch we pin.
        warnings.simplefilter("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantiz.*deprecated", category=UserWarning)
        # A copy, with plain nn.Linear layers: quantize_dynamic matches module types exactly.
        plain = with_nn_linear_layers(copy.deepcopy(model))
        return torch.ao.quantization.quantize_dynamic(plain, {nn.Linear}, dtype=torch.qint8, inplace=True)
