"""Loading a model whose weights are the ones its config.json describes, or refusing it in one line.

transformers builds the model that config.json describes and fills it with the weights it finds: a weight
the config asks for and the file lacks is drawn at random (one warning table, then a model that translates
every sentence alike), and one of another shape stops the load with a multi-line traceback. Here the
weights files' names and shapes (their safetensors headers: nothing is read but the headers) are compared
with those of the model the config describes, built on the meta device (nothing is allocated, so a
config.json that asks for 1000 layers costs nothing to refuse), before transformers loads anything. A
weight tied to another that the file holds (the shared embeddings, the pre-softmax projection tied to them,
Section 3.4) is not missing; non-persistent buffers (the sinusoid table) are not saved, so not expected.
"""

import json
import re
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors import safe_open
from transformers import AutoConfig, PreTrainedModel
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, cached_file

from ..registration import register_auto_classes
from .model_location import loading

Model = TypeVar("Model")
# The names shown of each kind of mismatch; the count says how many there are in all.
_SHOWN = 3
# A weight of one layer of a stack ("model.encoder.layers.7.ffn.fc1.weight"): shown once per stack.
_LAYER_WEIGHT = re.compile(r"^(?P<stack>.*\.layers)\.(?P<index>\d+)\.")


def load_pretrained(model_class: type[Model], name_or_path: str | Path, **kwargs: Any) -> Model:
    """`model_class.from_pretrained(name_or_path, **kwargs)` (a model class, or an Auto class) inside
    `loading`, once `check_weights_match` has found the weights to be what the config describes: a one-line
    ValueError otherwise. The package's model is registered with the Auto classes first."""
    register_auto_classes()
    with loading(name_or_path):
        check_weights_match(model_class, name_or_path)
        return model_class.from_pretrained(name_or_path, **kwargs)


def check_weights_match(model_class: type, name_or_path: str | Path) -> None:
    """Raise a one-line ValueError naming the weights missing from `name_or_path`'s safetensors files, those
    it holds that its config.json has no place for, and those of another shape, if there are any. A model
    without safetensors weights (a PyTorch pickle) is left to transformers."""
    saved = saved_weight_shapes(name_or_path)
    if saved is None:
        return
    config = AutoConfig.from_pretrained(name_or_path)
    with torch.device("meta"):
        build = model_class.from_config if hasattr(model_class, "from_config") else model_class._from_config
        model = build(config)
    missing, unexpected, mismatched = weight_mismatches(model, saved)
    if not (missing or unexpected or mismatched):
        return
    found = []
    if missing:
        found.append(f"{len(missing)} weights that config.json asks for are missing ({_names(missing)})")
    if unexpected:
        found.append(f"{len(unexpected)} saved weights have no place in its model ({_names(unexpected)})")
    if mismatched:
        shapes = ", ".join(
            f"{key} is {list(saved[key])} in the weights, {list(expected)} by config.json"
            for key, expected in sorted(mismatched.items())[:_SHOWN]
        )
        more = f" and {len(mismatched) - _SHOWN} more" if len(mismatched) > _SHOWN else ""
        found.append(f"{len(mismatched)} weights have another shape ({shapes}{more})")
    raise ValueError(
        f"{name_or_path}: its config.json does not describe its weights: {'; '.join(found)}. Restore the "
        "config.json saved with these weights (a copy from the folder the model was trained or converted in)."
    )


def weight_mismatches(
    model: PreTrainedModel, saved: dict[str, tuple[int, ...]]
) -> tuple[set[str], set[str], dict[str, tuple[int, ...]]]:
    """The weights `model` expects that `saved` (name: shape) lacks, those `saved` holds that `model` has no
    place for, and those of another shape (name: the shape `model` expects), as transformers'
    `from_pretrained(..., output_loading_info=True)` reports them: a tied weight whose source is saved is
    not missing, and the names the model class says to ignore are ignored."""
    expected = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    missing = {name for name in expected.keys() - saved.keys() if not (name in tied and tied[name] in saved)}
    unexpected = saved.keys() - expected.keys()
    mismatched = {name: shape for name, shape in expected.items() if name in saved and saved[name] != shape}
    ignored_missing = _pattern(getattr(model, "_keys_to_ignore_on_load_missing", None))
    ignored_unexpected = _pattern(getattr(model, "_keys_to_ignore_on_load_unexpected", None))
    if ignored_missing is not None:
        missing = {name for name in missing if ignored_missing.search(name) is None}
    if ignored_unexpected is not None:
        unexpected = {name for name in unexpected if ignored_unexpected.search(name) is None}
    return missing, unexpected, mismatched


def saved_weight_shapes(name_or_path: str | Path) -> dict[str, tuple[int, ...]] | None:
    """Every weight's name and shape in a model's safetensors file, or in the shards its index names; None
    where it has neither. Only the files' headers are read."""
    name = str(name_or_path)
    single = cached_file(name, SAFE_WEIGHTS_NAME, _raise_exceptions_for_missing_entries=False)
    if single is not None:
        files = [Path(single)]
    else:
        index = cached_file(name, SAFE_WEIGHTS_INDEX_NAME, _raise_exceptions_for_missing_entries=False)
        if index is None:
            return None
        shards = sorted(set(json.loads(Path(index).read_text(encoding="utf-8"))["weight_map"].values()))
        files = [Path(cached_file(name, shard)) for shard in shards]
    shapes = {}
    for file in files:
        with safe_open(file, framework="pt") as weights:
            for key in weights.keys():
                shapes[key] = tuple(weights.get_slice(key).get_shape())
    return shapes


def _pattern(patterns: Iterable[str] | None) -> re.Pattern[str] | None:
    """One regular expression matching any of `patterns`; None for none."""
    patterns = list(patterns or ())
    return re.compile("|".join(f"({pattern})" for pattern in patterns)) if patterns else None


def _names(keys: set[str]) -> str:
    """A few of `keys`, a stack's layers shown once as a range ("model.encoder.layers.6-999.*")."""
    layers: dict[str, set[int]] = defaultdict(set)
    others = []
    for key in keys:
        match = _LAYER_WEIGHT.match(key)
        if match:
            layers[match["stack"]].add(int(match["index"]))
        else:
            others.append(key)
    shown = [f"{stack}.{_ranges(sorted(indices))}.*" for stack, indices in sorted(layers.items())]
    shown += sorted(others)
    more = ", ..." if len(shown) > _SHOWN else ""
    return ", ".join(shown[:_SHOWN]) + more


def _ranges(indices: list[int]) -> str:
    """Sorted integers as runs: [2, 3, 4, 7] -> "2-4,7"."""
    runs: list[list[int]] = []
    for index in indices:
        if runs and index == runs[-1][1] + 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return ",".join(str(first) if first == last else f"{first}-{last}" for first, last in runs)


__all__ = ["check_weights_match", "load_pretrained", "saved_weight_shapes", "weight_mismatches"]
