"""The engines by name, as `commands.COMMANDS` lists the subcommands: what `--engine` and `--to` choose from,
and what loading, exporting and the commands look an engine up in instead of naming it."""

from .base import Engine
from .ctranslate2 import CTranslate2Engine
from .names import ENGINES, EXPORT_TARGETS
from .onnx import OnnxEngine
from .torch import TorchEngine

ENGINE_REGISTRY: dict[str, Engine] = {
    engine.name: engine for engine in (TorchEngine(), CTranslate2Engine(), OnnxEngine())
}


def get_engine(name: str) -> Engine:
    """The engine called `name` (one of `ENGINES`); a one-line ValueError for another name."""
    if name not in ENGINE_REGISTRY:
        raise ValueError(f"Unknown engine {name!r}: choose one of {list(ENGINES)}.")
    return ENGINE_REGISTRY[name]


__all__ = ["ENGINES", "ENGINE_REGISTRY", "EXPORT_TARGETS", "get_engine"]
