"""What every inference engine offers (`Engine`), and which engine reads a folder (`detect_engine`); what the
exported engines share is `export_common`'s."""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ...common.model_location import read_export_info
from .export_common import ExportError, ExportSource

# How the errors name the devices an engine decodes on.
DEVICE_NAMES = {"cpu": "the CPU", "cuda": "the GPU"}


@dataclass(frozen=True)
class LoadOptions:
    """How an engine loads a model (`load_model` says what each means): the `device` it decodes on, its CPU
    `threads` (0: the engine's default), and for CTranslate2 the `compute_type` and whether to decode over
    the export's vocabulary shortlist (`use_vmap`; None: where it has one)."""

    device: str = "cpu"
    threads: int = 0
    compute_type: str = "default"
    use_vmap: bool | None = None


class Engine(ABC):
    """One way to run this package's models: how a folder is loaded for it (`load`), how a model is exported
    for it (`export`, where it reads a format of its own), and what it supports.

    `load` returns what `translation.translate_n_best` decodes with: a model whose `generate(input_ids,
    attention_mask, **overrides)` returns token ids as transformers' does, n best (`num_return_sequences`)
    and samples (`do_sample`) included, and whose log-probabilities of given outputs `scoring.token_log_probs`
    computes (by forced decoding). `alignments` says whether it gives the encoder-decoder attention that
    `alignment.align` aligns words with.
    """

    # The name `--engine` and `--to` take, and the export info records.
    name: ClassVar[str]
    # The name the messages give it ("CTranslate2").
    title: ClassVar[str]
    # Where it decodes ("cpu", "cuda"), and the compute types it takes (none: it has no such setting).
    devices: ClassVar[tuple[str, ...]]
    compute_types: ClassVar[tuple[str, ...]] = ()
    alignments: ClassVar[bool] = False
    # Whether `translate --int8` may quantize the loaded model (torch's dynamic int8 quantization).
    dynamic_int8: ClassVar[bool] = False
    # Whether it reads a folder that `export` writes (not a model saved by `save_pretrained`), and the
    # keyword options its `export` takes besides `force`.
    exportable: ClassVar[bool] = False
    export_options: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def load(self, name_or_path: str | Path, options: LoadOptions) -> Any:
        """What `translation.translate` decodes with, read from `name_or_path` with `options`."""

    @abstractmethod
    def select_device(self, device: str, compute_type: str = "default") -> str:
        """The device this engine decodes on for `device` ("auto", "cpu", "cuda"), or a one-line ValueError
        saying why it cannot (no such device here, or a `compute_type` the device lacks)."""

    def export(self, source: ExportSource, out: str | Path, *, force: bool = False, **options: Any) -> Path:
        """Write `source` in this engine's format into `out` (`force`: replace an earlier export there)."""
        raise ExportError(f"The {self.name} engine reads models as they are saved: nothing to export.")

    def device_names(self) -> str:
        """Where it decodes, as the errors say it: "the CPU or the GPU"."""
        return " or ".join(DEVICE_NAMES.get(device, device) for device in self.devices)


def detect_engine(name_or_path: str | Path) -> str:
    """The engine that reads a folder: the one its export info names, else "torch" (model folder, Hub id)."""
    info = read_export_info(name_or_path)
    return info["engine"] if info else "torch"
