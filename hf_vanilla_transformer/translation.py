"""Translating many sentences: batches of similar length, the model's own decoding rules, progress; the
device to translate on; and int8 dynamic quantization for faster decoding on CPUs."""

import copy
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .cpu_speedups import with_nn_linear_layers
from .translation_pipeline import find_target_tokenizer


def load_tokenizers(
    model_name_or_path: str | Path,
) -> tuple[PreTrainedTokenizerBase, PreTrainedTokenizerBase | None]:
    """A model's tokenizer, and its target tokenizer when the source and target vocabularies are separate
    (converted fairseq models keep it in `target_tokenizer/`): pass both to `translate`."""
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


def translate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sentences: Sequence[str],
    *,
    target_tokenizer: PreTrainedTokenizerBase | None = None,
    batch_size: int = 64,
    progress: bool = True,
    **generate_kwargs,
) -> list[str]:
    """Translate `sentences` in the order given.

    Sentences are sorted by length so that each batch pads little (as Section 5.1 batches training
    pairs), then put back in input order. Decoding follows `model.generation_config` (the paper's beam
    search, Section 6.1, for models trained or published by this package) unless `generate_kwargs`
    override it. Outputs are decoded with `target_tokenizer` when given (separate target vocabulary, see
    `load_tokenizers`), else with `tokenizer`. A blank sentence (empty or only whitespace) translates to
    an empty string without reaching the model, which would otherwise decode a sentence from nothing.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    returned = generate_kwargs.get("num_return_sequences", model.generation_config.num_return_sequences)
    if (returned or 1) != 1:
        # generate() would give each sentence several rows, and pairing rows with sentences would shift
        # every later sentence onto another's hypotheses.
        raise ValueError(
            f"translate() gives one translation per sentence, but num_return_sequences is {returned}: leave "
            "it at 1, or call model.generate() for several hypotheses per input."
        )
    decoder = target_tokenizer or tokenizer
    texts = list(sentences)
    outputs: list[str] = [""] * len(texts)
    kept = [i for i, text in enumerate(texts) if text.strip()]
    encoded = tokenizer([texts[i] for i in kept], add_special_tokens=True)["input_ids"] if kept else []
    order = sorted(range(len(kept)), key=lambda j: len(encoded[j]), reverse=True)
    model.eval()
    bar = tqdm(total=len(order), desc="Translating", unit="sent", disable=not progress)
    for start in range(0, len(order), batch_size):
        indices = order[start : start + batch_size]
        batch = tokenizer.pad({"input_ids": [encoded[j] for j in indices]}, return_tensors="pt")
        batch = {key: value.to(model.device) for key, value in batch.items()}
        with torch.inference_mode():
            generated = model.generate(**batch, **generate_kwargs)
        for j, text in zip(indices, decoder.batch_decode(generated, skip_special_tokens=True)):
            outputs[kept[j]] = text.strip()
        bar.update(len(indices))
    bar.close()
    return outputs


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
