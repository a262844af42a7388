"""Checkpoint averaging (Vaswani et al., 2017, Section 6.1).

"For the base models, we used a single model obtained by averaging the last 5 checkpoints, which were written
at 10-minute intervals. For the big models, we averaged the last 20 checkpoints."

Checkpoints are read tensor by tensor from their safetensors files, so averaging 20 big checkpoints needs
memory for one float64 copy of the model, not for 20 models.
"""

import json
import re
import shutil
from collections import defaultdict
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from ..common.model_location import MODEL_DESCRIPTION_FILES, remove_model_descriptions

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
# Weights are rewritten; Trainer's optimizer/scheduler/RNG state and a model's descriptions belong to one run,
# not the average.
_SKIPPED_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_SKIPPED_NAMES = {WEIGHTS_INDEX_NAME, *MODEL_DESCRIPTION_FILES}
_CHECKPOINT_PATTERN = re.compile(r"checkpoint-(\d+)")
# Open safetensors files by path; safe_open's handle type is not importable for annotations.
_Handles = dict[Path, Any]


def last_checkpoints(run_dir: str | Path, k: int | None) -> list[Path]:
    """The last ``k`` of Trainer's ``checkpoint-N`` folders in ``run_dir`` (all of them if ``k`` is None),
    oldest first (Section 6.1).

    Sorted by N as a number, so ``checkpoint-10000`` comes after ``checkpoint-9000``.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"Run directory {run_dir} does not exist; pass the Trainer's output_dir.")
    if k is not None and k < 1:
        raise ValueError(f"k must be >= 1, got {k}.")
    found = sorted(
        (int(match.group(1)), path)
        for path in run_dir.iterdir()
        if path.is_dir() and (match := _CHECKPOINT_PATTERN.fullmatch(path.name))
    )
    if k is None:
        return [path for _, path in found]
    if len(found) < k:
        names = ", ".join(path.name for _, path in found) or "none"
        raise ValueError(
            f"Asked for the last {k} checkpoints but {run_dir} has {len(found)} checkpoint-N folders "
            f"({names}). Average fewer checkpoints, or train with more frequent saves and a larger "
            "save_total_limit."
        )
    return [path for _, path in found[-k:]]


def _weight_map(checkpoint: Path) -> dict[str, Path]:
    """Map every tensor name of a checkpoint to the safetensors file holding it."""
    index_file = checkpoint / WEIGHTS_INDEX_NAME
    if index_file.is_file():
        weight_map = json.loads(index_file.read_text(encoding="utf-8"))["weight_map"]
        files = {name: checkpoint / file_name for name, file_name in weight_map.items()}
        for path in set(files.values()):
            if not path.is_file():
                raise FileNotFoundError(
                    f"{index_file} lists {path.name}, which is missing from {checkpoint}."
                )
        return files
    weights_file = checkpoint / WEIGHTS_NAME
    if not weights_file.is_file():
        raise FileNotFoundError(
            f"{checkpoint} has neither {WEIGHTS_NAME} nor {WEIGHTS_INDEX_NAME}. Only safetensors checkpoints "
            "can be averaged; re-save the model with save_pretrained()."
        )
    with _open_weights(weights_file) as handle:
        return dict.fromkeys(handle.keys(), weights_file)


def _open_weights(path: Path) -> Any:
    """`safe_open` on a checkpoint's weights file; a one-line ValueError naming the file where it is
    damaged (cut short by a full disk or an interrupted copy, say), which safetensors reports on opening."""
    try:
        return safe_open(path, framework="pt")
    except SafetensorError as error:
        raise ValueError(
            f"{path} is damaged ({str(error).strip()}): copy or save that checkpoint again, or leave it out "
            "(average the others with --checkpoints)."
        ) from None


def _check_same_layout(
    checkpoints: list[Path], weight_maps: list[dict[str, Path]], handles: _Handles
) -> None:
    reference, reference_map = checkpoints[-1], weight_maps[-1]
    for checkpoint, weight_map in zip(checkpoints, weight_maps, strict=True):
        missing = sorted(reference_map.keys() - weight_map.keys())
        extra = sorted(weight_map.keys() - reference_map.keys())
        if missing or extra:
            raise ValueError(
                f"Checkpoint {checkpoint} does not have the same tensors as {reference}: missing "
                f"{missing[:5]}{' ...' if len(missing) > 5 else ''}, extra {extra[:5]}"
                f"{' ...' if len(extra) > 5 else ''}. Only checkpoints of one model (one run) can be "
                "averaged."
            )
    for name, reference_file in reference_map.items():
        reference_slice = handles[reference_file].get_slice(name)
        shape, dtype = reference_slice.get_shape(), reference_slice.get_dtype()
        for checkpoint, weight_map in zip(checkpoints, weight_maps, strict=True):
            tensor_slice = handles[weight_map[name]].get_slice(name)
            if (tensor_slice.get_shape(), tensor_slice.get_dtype()) != (shape, dtype):
                raise ValueError(
                    f"Tensor {name!r} is {tensor_slice.get_dtype()} {tensor_slice.get_shape()} in "
                    f"{checkpoint} but {dtype} {shape} in {reference}. Only checkpoints of one model "
                    "(same config and dtype) can be averaged."
                )


def _average_tensor(
    name: str, checkpoints: list[Path], weight_maps: list[dict[str, Path]], handles: _Handles
) -> torch.Tensor:
    # One checkpoint's tensor at a time, so memory does not grow with the number of checkpoints.
    reference = handles[weight_maps[-1][name]].get_tensor(name)
    if reference.is_floating_point():
        total = torch.zeros(reference.shape, dtype=torch.float64)
        for checkpoint, weight_map in zip(checkpoints, weight_maps, strict=True):
            tensor = handles[weight_map[name]].get_tensor(name)
            if not torch.isfinite(tensor).all():
                raise ValueError(
                    f"{checkpoint} holds NaN or infinite values in {name!r}, and so would the average: leave "
                    "that checkpoint out (average the others with --checkpoints)."
                )
            total += tensor.to(torch.float64)
        return (total / len(weight_maps)).to(reference.dtype)
    for checkpoint, weight_map in zip(checkpoints, weight_maps, strict=True):
        if not torch.equal(handles[weight_map[name]].get_tensor(name), reference):
            raise ValueError(
                f"Non-floating-point tensor {name!r} ({reference.dtype}) differs between {checkpoint} and "
                f"{checkpoints[-1]}; such tensors cannot be averaged and must be identical in every "
                "checkpoint."
            )
    return reference


def average_checkpoints(
    checkpoint_dirs: list[str | Path], output_dir: str | Path, *, overwrite: bool = False
) -> Path:
    """Average the weights of several checkpoints into one model folder (Section 6.1).

    Floating-point tensors are summed in float64, divided by the number of checkpoints and cast back to
    their dtype. Other tensors (integer buffers) must be equal in every checkpoint and are copied from the
    last one. The output holds exactly the tensor names of the last checkpoint's files (transformers leaves
    tied duplicates such as ``lm_head.weight`` out of them, and so does the average), in the same file layout,
    next to a copy of every other top-level file of the last checkpoint (config.json, generation_config.json,
    tokenizer files, remote-code ``*.py``) except optimizer, scheduler, RNG and trainer state. The result
    loads with ``from_pretrained(output_dir)``. Returns ``output_dir``. Files that describe one model (a
    run's ``results.json``, the Trainer's state, an export's info file) are neither copied nor kept.

    A folder that holds files already is refused (it may hold a trained model), unless ``overwrite``: then
    its weight files go before the first averaged file is written, so that no shard of an earlier model is
    loaded beside the average. A checkpoint holding NaN or infinite weights is refused.
    """
    checkpoints = [Path(path) for path in checkpoint_dirs]
    if not checkpoints:
        raise ValueError("No checkpoints given to average.")
    for checkpoint in checkpoints:
        if not checkpoint.is_dir():
            raise FileNotFoundError(f"Checkpoint directory {checkpoint} does not exist.")
    resolved = [checkpoint.resolve() for checkpoint in checkpoints]
    if len(set(resolved)) != len(resolved):
        raise ValueError(f"A checkpoint is listed twice in {[str(c) for c in checkpoints]}; list each once.")
    output_dir = Path(output_dir)
    if output_dir.resolve() in resolved:
        raise ValueError(f"output_dir {output_dir} is one of the input checkpoints; choose a new folder.")
    if output_dir.exists() and not output_dir.is_dir():
        raise FileExistsError(f"{output_dir} is a file: give a folder for the averaged model.")
    if output_dir.is_dir() and any(output_dir.iterdir()):
        if not overwrite:
            raise FileExistsError(
                f"{output_dir} is not empty: averaging would overwrite the model it may hold. Give a new "
                "folder, or overwrite it on purpose (--force)."
            )

    weight_maps = [_weight_map(checkpoint) for checkpoint in checkpoints]
    with ExitStack() as stack:
        handles = {
            path: stack.enter_context(_open_weights(path))
            for weight_map in weight_maps
            for path in set(weight_map.values())
        }
        _check_same_layout(checkpoints, weight_maps, handles)
        output_dir.mkdir(parents=True, exist_ok=True)
        names_by_file: dict[Path, list[str]] = defaultdict(list)
        for name, path in weight_maps[-1].items():
            names_by_file[path].append(name)
        for index, (reference_file, names) in enumerate(names_by_file.items()):
            averaged = {name: _average_tensor(name, checkpoints, weight_maps, handles) for name in names}
            if index == 0:  # the first file averaged soundly: only now make way for the new model
                for stale in output_dir.glob("*.safetensors*"):
                    stale.unlink()
                remove_model_descriptions(output_dir)
            # Keeps {"format": "pt"}, which from_pretrained checks.
            save_file(averaged, output_dir / reference_file.name, metadata=handles[reference_file].metadata())

    for path in checkpoints[-1].iterdir():
        if path.is_file() and path.name not in _SKIPPED_NAMES and not path.name.endswith(_SKIPPED_SUFFIXES):
            shutil.copy2(path, output_dir / path.name)
    index_file = checkpoints[-1] / WEIGHTS_INDEX_NAME
    if index_file.is_file():
        shutil.copy2(index_file, output_dir / WEIGHTS_INDEX_NAME)
    return output_dir
