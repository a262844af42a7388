"""The PyTorch engine: the model as `save_pretrained` wrote it (a folder or a Hub id), decoding with its own
`generate()` on any torch device, prepared on a CPU with this package's CPU speed-ups
(`common.cpu_speedups.prepare_for_cpu_decoding`). There is nothing to export for it."""

from pathlib import Path
from typing import Any, ClassVar

from transformers import AutoModelForSeq2SeqLM

from ...common.cpu_speedups import prepare_for_cpu_decoding
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
        """The model on `options.device` (a torch device), prepared for decoding there; the other options are
        the exported engines'."""
        model = load_pretrained(AutoModelForSeq2SeqLM, name_or_path).to(options.device)
        return prepare_for_cpu_decoding(model)

    def select_device(self, device: str, compute_type: str = "default") -> str:
        """`translation.resolve_device`: "auto" is CUDA where torch finds a GPU, else the CPU."""
        try:
            return str(resolve_device(device))
        except ValueError as error:
            raise ValueError(f"--device {error}") from None
