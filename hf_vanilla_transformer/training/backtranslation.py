"""Back-translation (Sennrich et al., 2016): training on real pairs and on synthetic pairs whose source side
is a machine translation of target-language monolingual text, the synthetic sources marked with a tag token
(Caswell et al., 2019, "Tagged Back-Translation").

The synthetic pairs are two line-aligned files (the reverse model's translations, and the monolingual text
they translate), read as the training pair is (`data.read_text_pair`: the same refusals of files whose line
counts differ or that are not UTF-8). Each synthetic source starts with the tag (`<BT>` unless told), a
special token of the shared vocabulary: `train_shared_bpe_tokenizer` adds it, the tokenizer matches it
whole and never splits it into subwords, and the model sees one token id in front of the source. The tag is
what lets the model tell the synthetic pairs' noisy sources from real ones; translations at test time are
untagged. The pairs join the training set only: the vocabulary is learned on the real pairs alone (the
synthetic sources are the reverse model's output, built from a vocabulary of the same real text), and the
dev and test sets stay real.

A run records its synthetic files (their paths and sizes) and tag with its recipe, so `--resume` with other
synthetic data is refused as another recipe is.

The settings' part (the tag, its checks) imports no data library: the `train` command's parser uses it, and
`--help` answers before datasets, transformers or torch are imported.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase

# Caswell et al. (2019) prepend a reserved token to every back-translated source.
DEFAULT_TAG = "<BT>"
# What `--synthetic-tag` takes for synthetic sources left untagged (plain back-translation).
NO_TAG = "none"


class SyntheticSettings(Protocol):
    """The settings of a run that name its synthetic pairs (`settings.TrainingSettings` holds them): two
    line-aligned files, or None for a run on real pairs only, and the tag (None or "none": untagged)."""

    synthetic_source: str | None
    synthetic_target: str | None
    synthetic_tag: str | None


def tag_token(text: str) -> str:
    """argparse type of `--synthetic-tag`: a token without spaces (the tokenizer matches it as written), not
    one of the vocabulary's special tokens; "none" for no tag."""
    from ..common.tokenization import SPECIAL_TOKENS

    if not text or text != text.strip() or len(text.split()) != 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a tag: give one word without spaces, e.g. <BT>")
    if text in SPECIAL_TOKENS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is a special token of the vocabulary already ({', '.join(SPECIAL_TOKENS)}): give "
            "another tag, e.g. <BT>"
        )
    return text


def synthetic_tag(settings: SyntheticSettings) -> str | None:
    """The tag that the run puts in front of its synthetic sources: None without synthetic pairs or tag."""
    tag = settings.synthetic_tag
    if settings.synthetic_source is None or tag is None or tag.lower() == NO_TAG:
        return None
    return tag


def check_synthetic_settings(settings: SyntheticSettings) -> None:
    """ValueError unless the synthetic pairs are given as two files, or not at all."""
    if (settings.synthetic_source is None) != (settings.synthetic_target is None):
        given, missing = (
            ("--synthetic-source", "--synthetic-target")
            if settings.synthetic_target is None
            else ("--synthetic-target", "--synthetic-source")
        )
        raise ValueError(
            f"{given} names one side of the synthetic pairs: give {missing} too (the machine-translated "
            "sources and the monolingual targets, two line-aligned files)."
        )


def synthetic_special_tokens(settings: SyntheticSettings) -> list[str]:
    """The tokens that a new vocabulary of the run needs besides `tokenization.SPECIAL_TOKENS`: its tag."""
    tag = synthetic_tag(settings)
    return [] if tag is None else [tag]


def synthetic_record(settings: SyntheticSettings) -> dict[str, Any]:
    """What the run's recipe record holds of its synthetic pairs (nothing without them): the two files'
    absolute paths and sizes in bytes (so that files written anew in place are other data too) and the
    tag."""
    if settings.synthetic_source is None:
        return {}
    files = [Path(settings.synthetic_source).resolve(), Path(settings.synthetic_target).resolve()]
    return {
        "synthetic_files": [str(path) for path in files],
        "synthetic_bytes": [path.stat().st_size if path.is_file() else None for path in files],
        "synthetic_tag": synthetic_tag(settings),
    }


def load_synthetic_pairs(settings: SyntheticSettings) -> Dataset | None:
    """The synthetic pairs, untagged (`src`/`tgt` columns, as `data.read_text_pair` reads them), or None."""
    from .data import read_text_pair

    if settings.synthetic_source is None:
        return None
    return read_text_pair(settings.synthetic_source, settings.synthetic_target)


def _containing(pairs: Dataset, tag: str) -> str | None:
    """The first side (`src`, `tgt`) of `pairs` in which some line holds `tag`, else None."""
    import pyarrow.compute as pc

    table = pairs.with_format("arrow")
    for column in ("src", "tgt"):
        if pc.any(pc.match_substring(table[column], tag, ignore_case=False)).as_py():
            return column
    return None


def check_tag(
    tokenizer: PreTrainedTokenizerBase, settings: SyntheticSettings, real: Dataset, synthetic: Dataset | None
) -> None:
    """ValueError unless the run's tag is a special token of `tokenizer` (matched whole, never split into
    subwords, kept whole by BPE-dropout) that no sentence of the real pairs, nor
    of the synthetic pairs before tagging, holds: the tokenizer would read such a sentence's tag as the tag,
    and the model would take a real pair for a synthetic one."""
    tag = synthetic_tag(settings)
    if tag is None or synthetic is None:
        return
    if tag not in tokenizer.all_special_tokens:
        raise ValueError(
            f"The tokenizer has no special token {tag} (the --synthetic-tag): leave out --tokenizer and "
            "--init-from so that the run learns a vocabulary with it, or pass --synthetic-tag none "
            "(untagged synthetic pairs)."
        )
    for name, pairs, flags in (
        ("training pairs", real, "--train"),
        ("synthetic pairs", synthetic, "--synthetic-source / --synthetic-target"),
    ):
        side = _containing(pairs, tag)
        if side is not None:
            where = "source" if side == "src" else "target"
            raise ValueError(
                f"A {where} sentence of the {name} ({flags}) holds the tag {tag}, which would mark it as "
                "synthetic: give another --synthetic-tag that the text never holds."
            )


def with_synthetic_pairs(real: Dataset, synthetic: Dataset | None, settings: SyntheticSettings) -> Dataset:
    """The training pairs: the real pairs, then the synthetic pairs with the tag and a space in front of
    each source (`check_tag` having checked that the tokenizer reads it as one token). Logs the counts."""
    from accelerate import PartialState
    from datasets import concatenate_datasets
    from transformers.utils import logging

    if synthetic is None:
        return real
    tag = synthetic_tag(settings)
    if tag is not None:
        # One process writes the tagged copy next to the pairs' cache; the others read it.
        with PartialState().main_process_first():
            synthetic = synthetic.map(
                lambda batch: {"src": [f"{tag} {source}" for source in batch["src"]]},
                batched=True,
                desc="Tagging synthetic sources",
            )
    logging.get_logger(__name__).info(
        f"Training pairs: {len(real):,} real and {len(synthetic):,} synthetic ("
        + (f"sources tagged {tag})" if tag is not None else "untagged)")
    )
    return concatenate_datasets([real, synthetic])
