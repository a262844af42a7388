"""The PyTorch engine: the model as `save_pretrained` wrote it (a folder or a Hub id), decoding with its own
`generate()` on any torch device. There is nothing to export for it."""

from pathlib import Path
from typing import Any, ClassVar

from transformers import AutoModelForSeq2SeqLM

from ...common.model_weights import load_pretrained
from ..translation import resolve_device
from .base import Engine, LoadOptions


class TorchEngine(Engine):
    """A model folder or Hub id, loaded with `AutoModelForSeq2SeqLM` and moved to the device."""

    name: ClassVar[str] = "torch"
    title: ClassVar[str] = "PyTorch"
    devices: ClassVar[tuple[str, ...]] = ("cpu", "cuda")
    alignments: ClassVar[bool] = True
    dynamic_int8: ClassVar[bool] = True

    def load(self, name_or_path: str | Path, options: LoadOptions) -> Any:
        """The model on `options.device` (a torch device); the other options are the exported engines'."""
        return load_pretrained(AutoModelForSeq2SeqLM, name_or_path).to(options.device)

    def select_device(self, device: str, compute_type: str = "default") -> str:
        """`translation.resolve_device`: "auto" is CUDA where torch finds a GPU, else the CPU."""
        try:
            return str(resolve_device(device))
        except ValueError as error:
            raise ValueError(f"--device {error}") from None
