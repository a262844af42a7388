"""Loading a model for one engine of the registry, and translating sentences with it (`Translator`): the
same length-sorted batches, blank-line handling, target tokenizer and detokenization on every engine
(`translation.translate`); what differs is the `generate()` behind it."""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase

from ..common.model_location import loading
from . import sentence_splitting
from .engines.base import LoadOptions, detect_engine
from .engines.registry import get_engine
from .hypotheses import Translation
from .translation import load_tokenizers, translate, translate_n_best


def load_model(
    name_or_path: str | Path,
    engine: str | None = None,
    *,
    device: str = "cpu",
    threads: int = 0,
    compute_type: str = "default",
    use_vmap: bool | None = None,
) -> Any:
    """What `translation.translate` decodes with on `engine` (default: `detect_engine`): the PyTorch model,
    an `OnnxSeq2SeqLM` or a `CTranslate2Seq2SeqLM`. `device` is where it decodes: a torch device for the
    PyTorch model, "cpu" or "cuda" for CTranslate2, "cpu" for ONNX Runtime. `threads` (0: the engine's
    default) applies to the exported engines; `compute_type` (e.g. "int8" on an int8 export, "float16" or
    "int8_float16" on the GPU; "default" keeps the export's own) and `use_vmap` (the export's vocabulary
    shortlist: None uses it where there is one, False turns it off) to CTranslate2."""
    engine = engine or detect_engine(name_or_path)
    options = LoadOptions(device=device, threads=threads, compute_type=compute_type, use_vmap=use_vmap)
    return get_engine(engine).load(name_or_path, options)


@dataclass
class Translator:
    """A model on one engine with its tokenizers; `translate` turns sentences into translations."""

    model: Any
    tokenizer: PreTrainedTokenizerBase
    target_tokenizer: PreTrainedTokenizerBase | None
    engine: str

    def translate(
        self,
        sentences: Sequence[str],
        *,
        batch_size: int = 64,
        progress: bool = False,
        **generate_kwargs: Any,
    ) -> list[str]:
        """`translation.translate` on this engine: the model's decoding settings unless `generate_kwargs`
        override them (num_beams, length_penalty, length_penalty_type, max_length_offset, ...)."""
        return translate(
            self.model,
            self.tokenizer,
            sentences,
            target_tokenizer=self.target_tokenizer,
            batch_size=batch_size,
            progress=progress,
            **generate_kwargs,
        )

    def translate_n_best(
        self,
        sentences: Sequence[str],
        *,
        n_best: int = 1,
        scores: bool = True,
        alignments: bool = False,
        split_sentences: bool = False,
        language: str = "en",
        batch_size: int = 64,
        progress: bool = False,
        first_line: int = 1,
        **generate_kwargs: Any,
    ) -> list[Translation]:
        """`translation.translate_n_best` on this engine: each input's `n_best` hypotheses, with their
        `scores` and word `alignments`. With `split_sentences`, each input is split into sentences of
        `language` (`sentence_splitting`), and all the sentences are translated in one stream of batches
        and joined back into one translation per input (its best only: `n_best` must be 1). The warnings
        about inputs longer than the model's positions number them from `first_line`."""
        options = dict(
            scores=scores, alignments=alignments, batch_size=batch_size, progress=progress, **generate_kwargs
        )
        if not split_sentences:
            return translate_n_best(
                self.model,
                self.tokenizer,
                sentences,
                target_tokenizer=self.target_tokenizer,
                n_best=n_best,
                line_numbers=range(first_line, first_line + len(sentences)),
                **options,
            )
        sentence_splitting.check_n_best(n_best)
        sentence_splitting.check_language(language)
        pieces = [sentence_splitting.split_sentences(text, language) for text in sentences]
        translated = iter(
            translate_n_best(
                self.model,
                self.tokenizer,
                [sentence for piece in pieces for sentence in piece],
                target_tokenizer=self.target_tokenizer,
                line_numbers=[first_line + line for line, piece in enumerate(pieces) for _ in piece],
                **options,
            )
        )
        return [
            sentence_splitting.join_sentences(text, [next(translated) for _ in piece])
            for text, piece in zip(sentences, pieces)
        ]


def load_translator(name_or_path: str | Path, engine: str | None = None, **options: Any) -> Translator:
    """A `Translator` for a model folder, Hub id or exported folder (`load_model` takes `options`)."""
    engine = engine or detect_engine(name_or_path)
    # An exported folder holds its engine's files and export info, not necessarily a config.json.
    with loading(name_or_path, model=not get_engine(engine).exportable):
        model = load_model(name_or_path, engine, **options)
        tokenizer, target_tokenizer = load_tokenizers(name_or_path)
    return Translator(model, tokenizer, target_tokenizer, engine)


__all__ = ["Translator", "load_model", "load_translator"]
