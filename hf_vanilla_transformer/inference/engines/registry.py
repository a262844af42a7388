"""The engines by name, as `commands.COMMANDS` lists the subcommands: what `--engine` and `--to` choose from,
and what loading, exporting and the commands look an engine up in instead of naming it."""

from .base import Engine
from .ctranslate2 import CTranslate2Engine
from .onnx import OnnxEngine
from .torch import TorchEngine

ENGINE_REGISTRY: dict[str, Engine] = {
    engine.name: engine for engine in (TorchEngine(), CTranslate2Engine(), OnnxEngine())
}
# The names of the engines, and of those a model can be exported for.
ENGINES = tuple(ENGINE_REGISTRY)
EXPORT_TARGETS = tuple(name for name, engine in ENGINE_REGISTRY.items() if engine.exportable)


def get_engine(name: str) -> Engine:
    """The engine called `name` (one of `ENGINES`); a one-line ValueError for another name."""
    if name not in ENGINE_REGISTRY:
        raise ValueError(f"Unknown engine {name!r}: choose one of {list(ENGINES)}.")
    return ENGINE_REGISTRY[name]


__all__ = ["ENGINES", "ENGINE_REGISTRY", "EXPORT_TARGETS", "get_engine"]
