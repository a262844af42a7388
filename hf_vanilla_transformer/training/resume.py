"""Resuming a training run after a crash: which checkpoint to continue from, and the checks that a resumed
run is the run it continues (the same model, recipe and number of processes), recorded in
`training_recipe.json` when the run starts. The records (`read_run_record`, `write_run_record`) and the
check that a resumed run changes only what it may (`check_unchanged`) serve every kind of run: the chatbot
keeps its settings in a record of its own name."""

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from accelerate import PartialState
from accelerate.utils import broadcast_object_list
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import rotate_checkpoints
from transformers.utils import logging

from ..common.model_location import TRAINER_STATE_FILE
from ..vanilla_transformer.configuration_vanilla_transformer import (
    LEGACY_LABEL_SMOOTHING,
    VanillaTransformerConfig,
)
from .averaging import last_checkpoints
from .legacy import with_legacy_recipe_fields
from .presets import TrainingPreset

RECIPE_FILE = "training_recipe.json"
# What a checkpoint folder that was not written to the end is renamed to: `incomplete-checkpoint-N`.
INCOMPLETE_PREFIX = "incomplete-"

logger = logging.get_logger(__name__)


def latest_complete_checkpoint(output_dir: Path) -> Path | None:
    """The newest checkpoint that was written to the end. Trainer writes `trainer_state.json` last, so a
    folder without a readable one is what a kill during saving left: it is set aside, not resumed from."""
    for checkpoint in reversed(last_checkpoints(output_dir, k=None)):
        try:
            json.loads((checkpoint / TRAINER_STATE_FILE).read_text())
            return checkpoint
        except (OSError, ValueError):
            aside = checkpoint.with_name(f"{INCOMPLETE_PREFIX}{checkpoint.name}")
            logger.warning(
                f"{checkpoint} was not written completely (killed while saving?); moved to {aside}."
            )
            checkpoint.rename(aside)
    return None


def _look_for_checkpoints(output_dir: Path, resume: bool) -> tuple[bool, Path | None]:
    """Whether `output_dir` holds checkpoints, and (when resuming) the one to resume from."""
    has_checkpoints = output_dir.is_dir() and bool(last_checkpoints(output_dir, k=None))
    return has_checkpoints, latest_complete_checkpoint(output_dir) if resume and has_checkpoints else None


def find_resume_checkpoint(output_dir: Path, resume: bool, state: PartialState) -> Path | None:
    """The checkpoint to resume from; refuses to train over checkpoints unless asked to resume.

    Only the main process looks, and sets incomplete checkpoints aside, while the others wait for its answer:
    processes renaming the same folder at once would crash, and all must resume from the same checkpoint."""
    if output_dir.exists() and not output_dir.is_dir():
        raise FileExistsError(f"--output-dir {output_dir} is a file: give a folder for the run.")
    found = [_look_for_checkpoints(output_dir, resume) if state.is_main_process else None]
    has_checkpoints, last = broadcast_object_list(found)[0]
    if not resume:
        if has_checkpoints:
            raise FileExistsError(
                f"{output_dir} already holds checkpoints. Pass --resume to continue that run, or choose "
                "another --output-dir: a new run would overwrite them."
            )
        return None
    if last is None:
        raise FileNotFoundError(_nothing_to_resume(output_dir))
    logger.info(f"Resuming from {last}")
    return last


def _nothing_to_resume(output_dir: Path) -> str:
    """Why `--resume` has nothing to continue in `output_dir`, and how to start the run afresh there."""
    set_aside = (
        sorted(path.name for path in output_dir.glob(f"{INCOMPLETE_PREFIX}*")) if output_dir.is_dir() else []
    )
    if not set_aside:
        return (
            f"--resume: no complete checkpoint in {output_dir} to resume from (it holds no checkpoint-N "
            "folder). Run without --resume to start the run."
        )
    return (
        f"--resume: no complete checkpoint in {output_dir} to resume from: the run was stopped while writing "
        f"its first one, set aside as {', '.join(set_aside)}. Run without --resume to start afresh in the "
        "same folder: the new run replaces the stopped one's tokenizer and recipe record, and leaves the "
        "incomplete folders for you to delete."
    )


# Config keys that say how a run was saved or runs, not which model it builds: a resumed run may differ in
# them (fast_dropout_masks is a run-time switch that some saved configs carry, label_smoothing a training
# setting that configs saved by earlier versions carry).
_NOT_THE_MODEL = frozenset(
    (
        "architectures",
        "auto_map",
        "transformers_version",
        "dtype",
        "_name_or_path",
        "use_cache",
        "fast_dropout_masks",
        LEGACY_LABEL_SMOOTHING,
    )
)


def describe_differences(
    saved: dict[str, Any], current: dict[str, Any], ignored: frozenset[str], where: str
) -> str:
    """'key: saved in <where>, current now' for every key whose value differs, joined with '; '."""
    return "; ".join(
        sorted(
            f"{key}: {saved.get(key)!r} in {where}, {current.get(key)!r} now"
            for key in (saved.keys() | current.keys()) - ignored
            if saved.get(key) != current.get(key)
        )
    )


def check_same_model(checkpoint: Path, config: VanillaTransformerConfig) -> None:
    """A resumed run must build the same model it saved: otherwise the weights cannot be loaded."""
    saved = VanillaTransformerConfig.from_pretrained(checkpoint).to_diff_dict()
    differences = describe_differences(saved, config.to_diff_dict(), _NOT_THE_MODEL, "the checkpoint")
    if differences:
        raise ValueError(
            f"Cannot resume from {checkpoint}: its model differs from this run's ({differences}). "
            "Resume with the settings of the original run, or start a new --output-dir."
        )


# Recipe fields a resumed run may change: how long it goes on and how it saves and evaluates. The rest
# shape its batches, schedule and numerics, so changing them midway would not continue the same run.
_MAY_CHANGE_ON_RESUME = frozenset(
    (
        "max_steps",
        "max_minutes",
        "save_steps",
        "keep_checkpoints",
        "average_checkpoints",
        "eval_steps",
        "tune_length_penalty",
        # How the step runs, not what it computes: padding to buckets is masked, compiling changes rounding.
        "length_buckets",
        "compile",
    )
)


# Checked elsewhere: the model against the checkpoint's config (`check_same_model`); and a resumed run keeps
# its own tokenizer, whatever the vocabulary size asked for.
_NOT_THE_RECIPE = frozenset(("model_preset", "model_overrides", "vocab_size"))

# Recipe fields that a run folder's record may lack, with the value every such run trained with.
_RECIPE_DEFAULTS = {
    "weight_decay": 0.0,
    "cooldown_steps": 0,
    "subword_dropout": 0.0,
    "length_buckets": False,
    "compile": False,
    "packed_row_length": None,
}


def recipe_record(preset: str, seed: int, recipe: TrainingPreset, world_size: int) -> dict[str, Any]:
    """What `training_recipe.json` records of a run: its preset, seed, number of processes and recipe."""
    fields = {key: value for key, value in asdict(recipe).items() if key not in _NOT_THE_RECIPE}
    return {"preset": preset, "seed": seed, "world_size": world_size, **fields}


def check_same_recipe(output_dir: Path, record: dict[str, Any]) -> None:
    """A resumed run must train as the run it continues did: `--resume` with another preset (or another
    batch size, warm-up, ...) would otherwise carry on silently with other batches and another schedule,
    and on another number of processes it would skip other batches than those already trained on (each
    process takes its own share of every epoch's batches). Folders from before the recipe was recorded are
    not checked, nor the number of processes of runs recorded without it."""
    recorded = read_run_record(output_dir, RECIPE_FILE)
    if recorded is None:
        return
    recorded = with_legacy_recipe_fields({**_RECIPE_DEFAULTS, **recorded}, record)
    world_size = recorded.get("world_size", record["world_size"])
    if world_size != record["world_size"]:
        raise ValueError(
            f"Cannot resume {output_dir} on {record['world_size']} process(es): it was trained on "
            f"{world_size}, and each process takes its own share of every epoch's batches, so another "
            "number would skip other batches than those already trained on. Resume with "
            f"{world_size} process(es) (e.g. accelerate launch --num_processes {world_size}), or start a new "
            "--output-dir."
        )
    check_unchanged(
        output_dir,
        recorded,
        record,
        ResumeRule(
            _MAY_CHANGE_ON_RESUME,
            "another recipe",
            f"settings (--preset {recorded.get('preset')} and the same flags; ",
            frozenset({"world_size"}),
        ),
    )


@dataclass(frozen=True)
class ResumeRule:
    """What a kind of run may change when resumed, and how its refusal names the rest: `what` the resumed
    run brings ("another recipe"), `original` the original run's settings to resume with, up to the list of
    what may change ("flags ("); `ignored` are recorded keys checked elsewhere."""

    may_change: frozenset[str]
    what: str
    original: str
    ignored: frozenset[str] = frozenset()


def check_unchanged(
    output_dir: Path, recorded: dict[str, Any], current: dict[str, Any], rule: ResumeRule
) -> None:
    """Refuse to resume the run in `output_dir` when its recorded settings differ from the current ones
    beyond what `rule` lets change: they would shape other batches or another schedule than those it
    was trained with."""
    differences = describe_differences(recorded, current, rule.may_change | rule.ignored, "the run")
    if differences:
        raise ValueError(
            f"Cannot resume {output_dir} with {rule.what} ({differences}). Resume with the original run's "
            f"{rule.original}only {', '.join(sorted(rule.may_change))} may change), or start a new "
            "--output-dir."
        )


def read_run_record(output_dir: Path, name: str) -> dict[str, Any] | None:
    """The record `name` (a JSON file) that the run in `output_dir` wrote when it started, else None."""
    recorded_file = output_dir / name
    if not recorded_file.is_file():
        return None
    return json.loads(recorded_file.read_text(encoding="utf-8"))


def write_run_record(output_dir: Path, name: str, record: dict[str, Any], state: PartialState) -> None:
    """Record what a starting run must be resumed with, as the JSON file `name` in `output_dir` (created when
    missing), from the main process only."""
    if state.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / name).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


class LossLoggedAtCheckpoints(TrainerCallback):
    """Logs the training loss at every step that saves a checkpoint or evaluates (which may save one), not
    only every `logging_steps`: each checkpoint's log history then holds the loss of every step before it,
    so that a run resumed from it reports its whole mean loss (`whole_run_loss`)."""

    def on_step_end(self, args, state, control, **kwargs) -> None:
        if control.should_save or control.should_evaluate:
            control.should_log = True


class NoStepPastTheEnd(Trainer):
    """A Trainer that, resumed from a checkpoint of the run's last step, trains no further step.

    The Trainer looks at `max_steps` only after a step: resumed at the end (a run killed after its last
    checkpoint, while it wrote its final model or its results), it would train one step past `max_steps`,
    save it as a checkpoint, drop the oldest one kept and average the wrong ones. Here each epoch of such a
    run ends before its first step, the checkpoints beyond `save_total_limit` that a kill between the last
    checkpoint and its clean-up left are deleted, and training ends as it would have: the Trainer's own end
    of training (its final log of the run's loss, the best checkpoint loaded where early stopping asks)."""

    def _run_epoch(self, *args: Any, **kwargs: Any) -> None:
        if self.state.max_steps > 0 and self.state.global_step >= self.state.max_steps:
            self.control.should_training_stop = True
            if self.args.should_save:
                rotate_checkpoints(
                    output_dir=self._get_output_dir(trial=None),
                    save_total_limit=self.args.save_total_limit,
                    best_model_checkpoint=self.state.best_model_checkpoint,
                )
            return
        super()._run_epoch(*args, **kwargs)


def whole_run_loss(
    log_history: list[dict[str, Any]], segment_loss: float, first_step: int, last_step: int
) -> float:
    """The mean training loss over every step of a resumed run.

    `segment_loss` is the Trainer's own `train_loss`, the mean over the steps this segment trained (after
    `first_step`, the step resumed from, up to `last_step`); the steps before come from the `loss` entries
    of the log history up to `first_step`, each the mean over the steps since the entry before, so each is
    weighted by those steps. Steps before `first_step` that no entry covers (a checkpoint saved between two
    logs, without `LossLoggedAtCheckpoints`) have no known loss and are left out of the mean."""
    earlier_sum, covered = 0.0, 0
    for entry in log_history:
        if "loss" in entry and covered < entry["step"] <= first_step:
            earlier_sum += entry["loss"] * (entry["step"] - covered)
            covered = entry["step"]
    segment_steps = last_step - first_step
    return (earlier_sum + segment_loss * segment_steps) / max(covered + segment_steps, 1)
