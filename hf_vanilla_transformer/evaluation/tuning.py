"""The beam size and length penalty chosen on the development set, as the paper chose them (Section 6.1:
"These hyperparameters were chosen after experimentation on the development set"). Never tune on a test
set: its score would no longer measure unseen data.

The metrics and transformers are imported where a search or a save runs: the `tune` command's parser reads
this module's defaults, and `--help` answers before they are imported."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    from .metrics import BleuResult

DEFAULT_LENGTH_PENALTIES = (0.6, 0.8, 1.0, 1.2, 1.5)


class SentenceTranslator(Protocol):
    """What `inference.translator.load_translator` returns: `translate(sentences, **generate_kwargs)`."""

    def translate(self, sentences: Sequence[str], **generate_kwargs: Any) -> list[str]: ...


class DecodingChoice(NamedTuple):
    """One beam size and length penalty (alpha). Greedy decoding (beam 1) has no length penalty: alpha
    ranks finished beam hypotheses only, so it is None there."""

    num_beams: int
    length_penalty: float | None

    @classmethod
    def of(cls, num_beams: int, length_penalty: float) -> DecodingChoice:
        """The choice of `num_beams` with `length_penalty`, which greedy decoding drops."""
        return cls(num_beams, None if num_beams == 1 else length_penalty)

    def generate_kwargs(self) -> dict[str, int | float]:
        """The settings to pass to `generate()`; greedy decoding passes no length penalty."""
        if self.length_penalty is None:
            return {"num_beams": self.num_beams}
        return {"num_beams": self.num_beams, "length_penalty": self.length_penalty}

    def __str__(self) -> str:
        if self.length_penalty is None:
            return f"beam {self.num_beams} (greedy)"
        return f"beam {self.num_beams}, length penalty {self.length_penalty:g}"


@dataclass(frozen=True)
class DecodingSearch:
    """The dev BLEU of each beam size and length penalty tried, in the order tried."""

    bleu: dict[DecodingChoice, BleuResult]

    @property
    def best(self) -> DecodingChoice:
        """The choice with the highest BLEU; of equal scores, the first tried."""
        return max(self.bleu, key=lambda choice: self.bleu[choice].score)


def search_decoding(
    translator: SentenceTranslator,
    sources: Sequence[str],
    references: Sequence[str],
    beam_sizes: Sequence[int],
    length_penalties: Sequence[float] = DEFAULT_LENGTH_PENALTIES,
    *,
    batch_size: int = 64,
    progress: bool = False,
    **generate_kwargs: Any,
) -> DecodingSearch:
    """Translate the dev `sources` once per beam size and length penalty (alpha), beam size by beam size,
    with the model's other decoding settings unless `generate_kwargs` override them, and score each output
    against `references` with sacreBLEU. Beam size 1 is translated once, whatever the alphas.

    Raises:
        ValueError: no beam size or length penalty, a beam size below 1, a negative or non-finite alpha,
            num_beams or length_penalty among `generate_kwargs`, or sources and references of different
            lengths.
    """
    if not beam_sizes or not length_penalties:
        raise ValueError("Give at least one beam size and one length penalty to try, e.g. 4 and 0.6 1.0 1.5.")
    if not all(isinstance(size, int) and size >= 1 for size in beam_sizes):
        raise ValueError(f"Beam sizes must be whole numbers of 1 or more, got {list(beam_sizes)}.")
    if not all(math.isfinite(alpha) and alpha >= 0 for alpha in length_penalties):
        raise ValueError(
            f"Length penalties must be finite numbers of 0 or more, got {list(length_penalties)}."
        )
    searched = {"num_beams", "length_penalty"} & set(generate_kwargs)
    if searched:
        raise ValueError(
            f"The search sets {sorted(searched)} itself: give the values to try as beam_sizes and "
            "length_penalties."
        )
    if len(sources) != len(references):
        raise ValueError(
            f"{len(sources)} source sentences but {len(references)} references: give line-aligned files."
        )
    from .metrics import corpus_bleu

    alphas = list(dict.fromkeys(float(value) for value in length_penalties))
    choices = dict.fromkeys(DecodingChoice.of(size, alpha) for size in beam_sizes for alpha in alphas)
    bleu = {}
    for choice in choices:
        hypotheses = translator.translate(
            sources, batch_size=batch_size, progress=progress, **generate_kwargs, **choice.generate_kwargs()
        )
        bleu[choice] = corpus_bleu(hypotheses, references)
    return DecodingSearch(bleu)


def generation_config_file(model_dir: str | Path) -> Path:
    """The generation config file of the local model folder (or export) `model_dir`.

    Raises:
        FileNotFoundError: `model_dir` is not a local folder with a generation config.
        ValueError: this process may not write that file.
    """
    from ..common.model_location import GENERATION_CONFIG_FILE

    path = Path(model_dir) / GENERATION_CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{model_dir} is not a local model folder with a {GENERATION_CONFIG_FILE}: download the model "
            "first, or leave out --save."
        )
    if not os.access(path, os.W_OK):
        raise ValueError(f"{path}: permission denied; make it writable, or leave out --save.")
    return path


def save_decoding(model_dir: str | Path, choice: DecodingChoice) -> Path:
    """Write `choice`'s beam size and length penalty into the generation config in `model_dir` (a model
    folder or an export), so that every later translation with it uses them; returns the file written. For
    greedy decoding the beam-only settings are unset, as transformers saves no greedy config with them.

    Raises:
        FileNotFoundError: `model_dir` is not a local folder with a generation config.
    """
    from transformers import GenerationConfig

    path = generation_config_file(model_dir)
    config = GenerationConfig.from_pretrained(path.parent)
    config.num_beams = choice.num_beams
    config.length_penalty = choice.length_penalty
    if choice.num_beams == 1:
        config.early_stopping = None
    config.save_pretrained(path.parent)
    return path
