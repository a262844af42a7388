"""`export`: load a model folder or Hub id and write it in the format of one engine of the registry."""

from pathlib import Path

from .export_common import ExportError, load_for_export, require_packages
from .names import DEFAULT_SHORTLIST_SIZE
from .registry import ENGINE_REGISTRY, EXPORT_TARGETS

# The options `export` passes on to an engine's own export where it takes them, with the flag that sets each.
_OPTION_FLAGS = {
    "quantization": "quantization (--quantization)",
    "shortlist_from": "shortlist (--shortlist-from)",
}


def export(
    model: str | Path,
    to: str,
    out: str | Path,
    quantization: str | None = None,
    force: bool = False,
    shortlist_from: tuple[str | Path, str | Path] | None = None,
    shortlist_size: int = DEFAULT_SHORTLIST_SIZE,
) -> Path:
    """Load a model folder or Hub id and export it `to` one of `EXPORT_TARGETS` ("ctranslate2", "onnx") with
    that engine's `export`. `quantization` and `shortlist_from` (line-aligned source and target files to
    `shortlist.build_shortlist` from, with `shortlist_size` target tokens per source token) are CTranslate2's.
    What can be refused without the model is refused before it loads."""
    if to not in EXPORT_TARGETS:
        raise ExportError(f"Unknown export target {to!r}: choose one of {list(EXPORT_TARGETS)}.")
    engine = ENGINE_REGISTRY[to]
    given = {"quantization": quantization, "shortlist_from": shortlist_from}
    for option, label in _OPTION_FLAGS.items():
        if given[option] is not None and option not in engine.export_options:
            takers = [other for other in ENGINE_REGISTRY.values() if option in other.export_options]
            raise ExportError(
                f"{label} applies to {' and '.join(other.title for other in takers)} exports only "
                f"({' or '.join(f'--to {other.name}' for other in takers)})."
            )
    missing = [str(path) for path in shortlist_from or () if not Path(path).is_file()]
    if missing:
        raise ExportError(f"No such shortlist file: {', '.join(missing)}.")
    require_packages(to)
    source = load_for_export(model)
    options = {**given, "shortlist_size": shortlist_size}
    options = {key: value for key, value in options.items() if key in engine.export_options}
    return engine.export(source, out, force=force, **options)


__all__ = ["export"]
