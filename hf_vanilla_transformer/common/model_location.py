"""Where a model or tokenizer is loaded from: a folder written by `save_pretrained`, or a Hub id.

transformers answers a mistyped path with a multi-line OSError about Hub repo ids or connections; here a
location that cannot be one is refused in one line before transformers tries it, and what goes wrong while
loading is reported in one line that names the location.

It is also the one module that names a model folder's files and checks them: the tokenizer's
(`TOKENIZER_FILES`, `missing_tokenizer_files`, `check_holds_tokenizer`), the target tokenizer's subfolder
(`TARGET_TOKENIZER_DIR`, defined in the remote code that reads it,
`translation_pipeline.find_target_tokenizer`), the decoding settings, and the files beside a model that
describe it (a run's figures, an export's engine), which another model written into the folder drops.
"""

import json
import os
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from huggingface_hub.utils import HFValidationError, validate_repo_id
from safetensors import SafetensorError

# Named by the remote code that reads it (`translation_pipeline`, which may import only the model's files).
from ..translation_pipeline import TARGET_TOKENIZER_DIR
from .cli import first_line

_PACKAGE_DIR = Path(__file__).resolve().parents[1]
# Written into every folder that `export` makes: what it is an export of, and for which engine.
EXPORT_INFO_FILE = "vanilla_transformer_export.json"
# Written beside a trained model: the run's figures (`train`) and the Trainer's state (its step count).
RESULTS_FILE = "results.json"
TRAINER_STATE_FILE = "trainer_state.json"
# Files that describe one particular model, not part of it: another model written into the folder must not
# inherit them (a model card would show the earlier model's BLEU, `translate` would take it for an export).
MODEL_DESCRIPTION_FILES = (RESULTS_FILE, TRAINER_STATE_FILE, EXPORT_INFO_FILE)


# Written by `save_pretrained` beside config.json: the decoding settings (beam size, length penalty, ...).
GENERATION_CONFIG_FILE = "generation_config.json"
# What loading a model or tokenizer reads from its folder: the configs and tokenizer files, and the weights.
LOADED_FILE_PATTERNS = ("*.json", "*.safetensors")
# What a fast tokenizer loads from its folder: its vocabulary and pipeline, and its class and special tokens.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def read_json_object(path: Path, fix: str) -> dict[str, Any]:
    """The JSON object in `path`; a one-line ValueError that says where it is damaged, and `fix`, if the
    file holds anything else."""
    try:
        value = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        where = (
            f", line {error.lineno} column {error.colno}" if isinstance(error, json.JSONDecodeError) else ""
        )
        raise ValueError(f"{path} is not valid JSON ({type(error).__name__}{where}): {fix}.") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} holds a {type(value).__name__}, not a JSON object: {fix}.")
    return value


def read_export_info(folder: str | Path) -> dict[str, Any] | None:
    """The `EXPORT_INFO_FILE` of an exported folder, or None for any other folder or Hub id; a damaged
    file, or one that names no engine, is a one-line ValueError."""
    path = Path(folder) / EXPORT_INFO_FILE
    if not path.is_file():
        return None
    fix = "export the model again (vanilla-transformer export)"
    info = read_json_object(path, fix)
    if not isinstance(info.get("engine"), str):
        raise ValueError(f"{path} names no engine: {fix}.")
    return info


def write_export_info(folder: str | Path, engine: str, **details: Any) -> None:
    """Write the `EXPORT_INFO_FILE` of a folder exported for `engine`, which `read_export_info` reads back:
    the engine's name, and `details` (what it is an export of, its token ids, ...)."""
    info = {"engine": engine, **details}
    (Path(folder) / EXPORT_INFO_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


def remove_model_descriptions(folder: str | Path) -> None:
    """Delete what `MODEL_DESCRIPTION_FILES` holds in `folder`: call it when another model replaces one."""
    for name in MODEL_DESCRIPTION_FILES:
        (Path(folder) / name).unlink(missing_ok=True)


def missing_tokenizer_files(folder: str | Path) -> list[str]:
    """The `TOKENIZER_FILES` that `folder` lacks.

    A folder holds a tokenizer when it holds at least one of them (`check_holds_tokenizer`), not only when it
    holds both: `tokenizer_config.json` names the tokenizer's class, and a class other than the fast one
    (Marian's SentencePiece tokenizer, which a converted opus-mt model keeps) loads its vocabulary from files
    of its own (`source.spm`, `vocab.json`) and has no `tokenizer.json`. Which of the two are missing is named
    when a tokenizer then fails to load (`loading`)."""
    return [name for name in TOKENIZER_FILES if not (Path(folder) / name).is_file()]


def check_holds_tokenizer(folder: str | Path) -> None:
    """Raise a one-line ValueError when the folder `folder` holds none of `TOKENIZER_FILES`."""
    if len(missing_tokenizer_files(folder)) == len(TOKENIZER_FILES):
        raise ValueError(
            f"{folder} holds no tokenizer ({' or '.join(TOKENIZER_FILES)}): save it next to the weights with "
            f"tokenizer.save_pretrained('{folder}')."
        )


def check_location(name_or_path: str | Path, *, model: bool = True) -> None:
    """Raise a one-line ValueError for a location that cannot hold a model (`model`) or a tokenizer: a
    missing path that is no valid Hub id, a file, or (for a model) a folder without config.json, one
    that `export` wrote for another engine, or one whose decoding settings are damaged."""
    name = str(name_or_path)
    path = Path(name)
    saved_by = "a folder written by save_pretrained"
    if path.is_file():
        raise ValueError(f"{name} is a file: give the folder that holds it ({saved_by}).")
    export_info = read_export_info(path) if model else None
    if export_info is not None:
        engine = export_info["engine"]
        raise ValueError(
            f"{name} is an export for {engine}, not a PyTorch model folder: give the folder it was exported "
            f"from (`vanilla-transformer translate --engine {engine}` translates with the export itself)."
        )
    if path.is_dir():
        # safetensors reports a file it may not read as missing; and it writes its files readable by their
        # owner alone, so a folder another user saved is often one this user cannot load.
        unreadable = sorted(
            entry.name
            for pattern in LOADED_FILE_PATTERNS
            for entry in path.glob(pattern)
            if entry.is_file() and not os.access(entry, os.R_OK)
        )
        if unreadable:
            raise ValueError(
                f"{name}: this user may not read {', '.join(unreadable)}; make "
                f"{'it' if len(unreadable) == 1 else 'them'} readable (chmod a+r), or load as the user who "
                "saved the folder."
            )
        if model and not (path / "config.json").is_file():
            inner = path / "model" if (path / "model" / "config.json").is_file() else None
            hint = f"; {inner} is one" if inner else ""
            raise ValueError(f"{name} has no config.json: give {saved_by}{hint}.")
        if model and (path / GENERATION_CONFIG_FILE).is_file():
            # transformers warns about a damaged one and decodes greedily up to 20 tokens instead.
            read_json_object(
                path / GENERATION_CONFIG_FILE, "fix it, or delete it to decode with the model's defaults"
            )
        return
    try:
        validate_repo_id(name)
    except HFValidationError:
        raise ValueError(f"{name}: no such folder. Give {saved_by} or a Hub id.") from None


def _missing_tokenizer_files(name: str, error: Exception) -> ValueError | None:
    """The one-line error for a tokenizer that failed to load (`error`, raised in transformers' tokenizer
    code) from a folder that lacks one of `TOKENIZER_FILES`, the model's folder or its target tokenizer's;
    None where the failure has another cause. transformers says only that it could not instantiate the
    tokenizer "from one of" an empty list."""
    frames = traceback.extract_tb(error.__traceback__)
    if not any("tokeniz" in Path(frame.filename).name for frame in frames):
        return None
    for folder in (Path(name), Path(name) / TARGET_TOKENIZER_DIR):
        if folder.is_dir() and (missing := missing_tokenizer_files(folder)):
            return ValueError(
                f"{folder} has no {' and no '.join(missing)}, which its tokenizer loads from: copy "
                f"{'it' if len(missing) == 1 else 'them'} from the folder where the model was trained or "
                f"converted, or save the tokenizer there (tokenizer.save_pretrained('{folder}'))."
            )
    return None


@contextmanager
def loading(name_or_path: str | Path, *, model: bool = True) -> Iterator[None]:
    """Check the location (`check_location`), then load inside the block: an OSError or ValueError that
    transformers or huggingface_hub raise there becomes a one-line ValueError naming the location (and,
    for a tokenizer that cannot load from a folder lacking its files, the file missing). This package's own
    ValueErrors (an unusable tokenizer, say) pass through as they are."""
    check_location(name_or_path, model=model)
    name = str(name_or_path)
    try:
        yield
    except (OSError, ValueError, SafetensorError) as error:
        origin = Path(traceback.extract_tb(error.__traceback__)[-1].filename).resolve()
        if isinstance(error, ValueError) and origin.is_relative_to(_PACKAGE_DIR):
            raise
        if Path(name).is_dir() and (missing := _missing_tokenizer_files(name, error)) is not None:
            raise missing from error
        reason = first_line(error)
        if Path(name).exists():
            raise ValueError(f"Cannot load {name} ({reason}).") from error
        raise ValueError(
            f"{name}: no such folder, and no Hub model that can be loaded here ({reason})."
        ) from error
