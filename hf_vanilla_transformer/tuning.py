"""The length penalty chosen on the development set, as the paper chose its beam size and alpha (Section 6.1:
"These hyperparameters were chosen after experimentation on the development set"). Never tune on a test
set: its score would no longer measure unseen data."""

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from transformers import GenerationConfig

from .evaluation import BleuResult, corpus_bleu
from .model_location import GENERATION_CONFIG_FILE

DEFAULT_LENGTH_PENALTIES = (0.6, 0.8, 1.0, 1.2, 1.5)


class SentenceTranslator(Protocol):
    """What `engines.load_translator` returns: `translate(sentences, **generate_kwargs)`."""

    def translate(self, sentences: Sequence[str], **generate_kwargs: Any) -> list[str]: ...


@dataclass(frozen=True)
class LengthPenaltySearch:
    """The dev BLEU of each length penalty tried, in the order tried."""

    bleu: dict[float, BleuResult]

    @property
    def best(self) -> float:
        """The length penalty with the highest BLEU; of equal scores, the first tried."""
        return max(self.bleu, key=lambda alpha: self.bleu[alpha].score)


def search_length_penalty(
    translator: SentenceTranslator,
    sources: Sequence[str],
    references: Sequence[str],
    length_penalties: Sequence[float] = DEFAULT_LENGTH_PENALTIES,
    *,
    batch_size: int = 64,
    progress: bool = False,
    **generate_kwargs: Any,
) -> LengthPenaltySearch:
    """Translate the dev `sources` once per length penalty (alpha, with the model's other decoding
    settings unless `generate_kwargs` override them) and score each output against `references` with
    sacreBLEU.

    Raises:
        ValueError: no length penalty, a negative or non-finite one, a length_penalty among
            `generate_kwargs`, or sources and references of different lengths.
    """
    if not length_penalties:
        raise ValueError("Give at least one length penalty to try, e.g. 0.6 1.0 1.5.")
    if not all(math.isfinite(alpha) and alpha >= 0 for alpha in length_penalties):
        raise ValueError(
            f"Length penalties must be finite numbers of 0 or more, got {list(length_penalties)}."
        )
    if "length_penalty" in generate_kwargs:
        raise ValueError("The search sets length_penalty itself: give the alphas to try as length_penalties.")
    if len(sources) != len(references):
        raise ValueError(
            f"{len(sources)} source sentences but {len(references)} references: give line-aligned files."
        )
    bleu = {}
    for alpha in dict.fromkeys(float(value) for value in length_penalties):
        hypotheses = translator.translate(
            sources, batch_size=batch_size, progress=progress, **generate_kwargs, length_penalty=alpha
        )
        bleu[alpha] = corpus_bleu(hypotheses, references)
    return LengthPenaltySearch(bleu)


def generation_config_file(model_dir: str | Path) -> Path:
    """The generation config file of the local model folder (or export) `model_dir`.

    Raises:
        FileNotFoundError: `model_dir` is not a local folder with a generation config.
        ValueError: this process may not write that file.
    """
    path = Path(model_dir) / GENERATION_CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{model_dir} is not a local model folder with a {GENERATION_CONFIG_FILE}: download the model "
            "first, or leave out --save."
        )
    if not os.access(path, os.W_OK):
        raise ValueError(f"{path}: permission denied; make it writable, or leave out --save.")
    return path


def save_length_penalty(model_dir: str | Path, alpha: float) -> Path:
    """Write `alpha` as the length penalty of the generation config in `model_dir` (a model folder or an
    export), so that every later translation with it uses it; returns the file written.

    Raises:
        FileNotFoundError: `model_dir` is not a local folder with a generation config.
    """
    path = generation_config_file(model_dir)
    config = GenerationConfig.from_pretrained(path.parent)
    config.length_penalty = alpha
    config.save_pretrained(path.parent)
    return path
