"""What every exported engine shares. Writing: loading the model to export, preparing the output folder, and
the companions every exported folder holds (tokenizers, generation config and `EXPORT_INFO_FILE`, which says
which engine reads it). Reading: the export info of a folder, and the one-line errors for a damaged export
or an input longer than its positions."""

import importlib.util
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForSeq2SeqLM, PreTrainedTokenizerBase

from ... import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from ...common.cli import first_line
from ...common.model_location import loading, read_export_info, write_export_info
from ...common.model_weights import load_pretrained
from ...translation_pipeline import TARGET_TOKENIZER_DIR
from ..translation import load_tokenizers

# The packages each export needs, and running an ONNX export.
_REQUIREMENTS = {
    "ctranslate2": ("ctranslate2",),
    "onnx": ("onnx", "onnxscript", "onnxruntime"),
    "onnxruntime": ("onnxruntime",),
}


class ExportError(ValueError):
    """A model, folder or setting that cannot be exported; the message names it and says what to do."""


@dataclass
class ExportSource:
    """A float32 model in evaluation mode and the tokenizers that go with it."""

    model: VanillaTransformerForConditionalGeneration
    tokenizer: PreTrainedTokenizerBase
    target_tokenizer: PreTrainedTokenizerBase | None = None
    name: str = ""

    @property
    def config(self) -> VanillaTransformerConfig:
        return self.model.config


def require_packages(target: str) -> None:
    """Raise ExportError, with the install command, if a package `target` needs is missing."""
    missing = [name for name in _REQUIREMENTS[target] if importlib.util.find_spec(name) is None]
    if missing:
        raise ExportError(f"Missing {', '.join(missing)} (for {target}): pip install {' '.join(missing)}")


def load_for_export(name_or_path: str | Path) -> ExportSource:
    """The model and tokenizers of a `save_pretrained` folder or Hub id, in float32, ready to export."""
    name = str(name_or_path)
    try:
        with loading(name):
            model = load_pretrained(AutoModelForSeq2SeqLM, name, dtype=torch.float32)
            tokenizer, target_tokenizer = load_tokenizers(name)
    except ValueError as error:
        raise ExportError(str(error)) from error
    if not isinstance(model, VanillaTransformerForConditionalGeneration):
        raise ExportError(
            f"{name} holds a {type(model).__name__}; the exporters read this package's "
            "VanillaTransformerForConditionalGeneration (convert other checkpoints with "
            "`vanilla-transformer convert` first)."
        )
    return ExportSource(model.eval(), tokenizer, target_tokenizer, name)


def _prepare_output(out: Path, source: ExportSource, force: bool) -> None:
    """Make `out` an empty folder: refuse a non-empty one unless `force` and it holds an earlier export, and
    never one holding the model."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file: give a folder.")
    if out.is_dir() and any(out.iterdir()):
        if (
            source.name
            and Path(source.name).exists()
            and Path(source.name).resolve().is_relative_to(out.resolve())
        ):
            raise ExportError(f"--out {out} holds the model being exported: give another folder.")
        if not force:
            raise ExportError(
                f"--out {out} exists and is not empty: give a new folder, or --force to replace it."
            )
        try:
            earlier_export = read_export_info(out)
        except ValueError:
            raise ExportError(
                f"--out {out} holds a damaged export: delete the folder yourself, or give a new one."
            ) from None
        if earlier_export is None:
            raise ExportError(
                f"--out {out} holds files that no export wrote (a model, checkpoints, ...): --force replaces "
                "only an earlier export. Give a new folder."
            )
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


def _save_companions(source: ExportSource, out: Path, engine: str, **details: Any) -> None:
    """What every exported folder holds besides the model: tokenizers, generation config, export info."""
    source.tokenizer.save_pretrained(out)
    if source.target_tokenizer is not None:
        source.target_tokenizer.save_pretrained(out / TARGET_TOKENIZER_DIR)
    source.model.generation_config.save_pretrained(out)
    write_export_info(
        out,
        engine,
        source=source.name,
        positions=source.config.max_position_embeddings,
        decoder_start_token_id=source.config.decoder_start_token_id,
        pad_token_id=source.config.pad_token_id,
        eos_token_id=source.config.eos_token_id,
        **details,
    )


def export_info(name_or_path: str | Path, engine: str) -> dict[str, Any]:
    """The export info of a folder exported for `engine`; ValueError saying what the folder is otherwise."""
    info = read_export_info(name_or_path)
    if info is None or info["engine"] != engine:
        found = f"a {info['engine']} export" if info else "not an exported folder"
        raise ValueError(
            f"{name_or_path} is {found}: export it first "
            f"(vanilla-transformer export --to {engine}), or pick the engine that reads it."
        )
    return info


def damaged_export(folder: Path, error: Exception) -> ValueError:
    """The one-line error for an export whose engine cannot read its files."""
    return ValueError(
        f"Cannot load the export in {folder} ({first_line(error)}): a file is missing or damaged; export "
        "the model again (vanilla-transformer export)."
    )


def check_source_lengths(lengths: list[int], positions: int) -> None:
    """Refuse inputs longer than the `positions` of an export's position table."""
    longest = max(lengths, default=0)
    if longest > positions:
        raise ValueError(
            f"An input of {longest} tokens is longer than the {positions} positions of this export "
            "(max_position_embeddings): split or truncate it, or translate with the PyTorch model."
        )
