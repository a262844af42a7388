"""What models and runs saved by earlier versions of the package carry, read in one place, as fairseq keeps
its old-argument handling in `transformer_legacy`.

Earlier configs recorded the label smoothing of their training run (Section 5.4's eps_ls), a setting of
training, under `LEGACY_LABEL_SMOOTHING`; the config itself (remote code, which may import nothing from
here) names that key and warns when it loads one. Here a run that resumes or fine-tunes such a model takes
the value as its recipe's label smoothing unless --label-smoothing is given, the model it builds drops the
key, a model card reports it where no run record does, and a recipe record written before the recipe held
label smoothing is read as holding the run's own.
"""

from dataclasses import replace
from pathlib import Path
from typing import Any

from transformers import PreTrainedConfig
from transformers.utils import logging

from ..common.model_location import loading
from ..vanilla_transformer.configuration_vanilla_transformer import (
    LEGACY_LABEL_SMOOTHING,
    VanillaTransformerConfig,
)
from .presets import TrainingPreset

logger = logging.get_logger(__name__)


def legacy_label_smoothing(config: PreTrainedConfig) -> float | None:
    """The label smoothing that a config saved by an earlier version of the package records of its training
    run, else None."""
    return getattr(config, LEGACY_LABEL_SMOOTHING, None)


def drop_legacy_label_smoothing(config: PreTrainedConfig) -> None:
    """Remove the recorded label smoothing from `config`, once the run's recipe holds it: the model saved
    by this run is the model only, and its results record how it was trained."""
    if legacy_label_smoothing(config) is not None:
        delattr(config, LEGACY_LABEL_SMOOTHING)


def with_recorded_label_smoothing(
    recipe: TrainingPreset, given: bool, origin: str | Path | None
) -> TrainingPreset:
    """The recipe, with the label smoothing that the model at `origin` (resumed or fine-tuned from) records
    in its config, unless --label-smoothing is `given` or there is no such model or record."""
    if given or origin is None:
        return recipe
    with loading(str(origin)):
        recorded = legacy_label_smoothing(VanillaTransformerConfig.from_pretrained(origin))
    if recorded is None:
        return recipe
    logger.info(f"Label smoothing {recorded}, as {origin}'s config records (--label-smoothing sets another).")
    return replace(recipe, label_smoothing=recorded)


def with_legacy_recipe_fields(recorded: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    """A recipe record as read back (`recorded`), to compare with the resumed run's `record`: runs recorded
    without label smoothing kept it in the model's config, which the run has read
    (`with_recorded_label_smoothing`), so theirs is the run's own."""
    return {"label_smoothing": record["label_smoothing"], **recorded}
