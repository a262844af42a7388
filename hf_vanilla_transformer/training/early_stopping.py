"""Early stopping on the dev set, as fairseq's `--patience N` with `--best-checkpoint-metric bleu`:
transformers' `EarlyStoppingCallback` counts the dev evaluations in a row that bring no better score and
stops training after `patience` of them; the Trainer (`load_best_model_at_end`, `metric_for_best_model`)
keeps the best evaluation's checkpoint through checkpoint rotation and loads its weights at the end, and
they become the run's final model."""

from typing import Any

from transformers import Trainer, TrainerState
from transformers.trainer_callback import EarlyStoppingCallback


class DevEarlyStopping(EarlyStoppingCallback):
    """transformers' `EarlyStoppingCallback` for a run that may be resumed and saves every so many steps:

    - every dev evaluation that improves the score also saves a checkpoint, so the best evaluation always
      has one to keep, whichever evaluations fall on a save step;
    - the count of evaluations without improvement is taken up again from the checkpoint a run resumes
      from (the Trainer restores no callback state by default), while the patience is the resumed run's;
    - only the evaluations during training count, not those of the final model after it.
    """

    def __init__(
        self, early_stopping_patience: int = 1, early_stopping_threshold: float | None = 0.0
    ) -> None:
        super().__init__(early_stopping_patience, early_stopping_threshold)
        self._training = False

    def on_train_begin(self, args, state, control, **kwargs) -> None:
        super().on_train_begin(args, state, control, **kwargs)
        # A fresh run's state holds this callback's zero; a resumed one, the count its checkpoint saved.
        saved = state.stateful_callbacks.setdefault(type(self).__name__, self.state())["attributes"]
        self.early_stopping_patience_counter = saved["early_stopping_patience_counter"]
        self._training = True

    def on_evaluate(self, args, state, control, metrics, **kwargs) -> None:
        name = args.metric_for_best_model
        if not self._training or (name if name.startswith("eval_") else f"eval_{name}") not in metrics:
            return
        super().on_evaluate(args, state, control, metrics, **kwargs)
        if self.early_stopping_patience_counter == 0:
            control.should_save = True

    def on_train_end(self, args, state, control, **kwargs) -> None:
        self._training = False

    @property
    def stopped(self) -> bool:
        """Whether the patience ran out, which ended training."""
        return self.early_stopping_patience_counter >= self.early_stopping_patience


def early_stopping_of(trainer: Trainer) -> DevEarlyStopping | None:
    """The trainer's `DevEarlyStopping` callback, None where it stops at its last step only."""
    return next((c for c in trainer.callback_handler.callbacks if isinstance(c, DevEarlyStopping)), None)


def early_stopping_record(callback: DevEarlyStopping, state: TrainerState, metric: str) -> dict[str, Any]:
    """What a run's results record of its early stopping on the dev score `metric` ("bleu" or "loss"): the
    patience, whether it ran out, and the best evaluation (step, score), whose checkpoint is the final
    model (None where no evaluation took place)."""
    return {
        "metric": f"dev {'BLEU' if metric == 'bleu' else metric}",
        "patience": callback.early_stopping_patience,
        "stopped_early": callback.stopped,
        "best_step": state.best_global_step,
        "best_score": state.best_metric,
    }
