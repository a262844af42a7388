"""How a training run measures and shows its progress: the time and target tokens it has trained, across
resumed segments, with the optional time budget; a progress bar whose total is the steps the run will take;
and a line for every dev evaluation. Every run (translation training, the chatbot) shows its progress
lines through the package logger (`show_progress_lines`) and its bar through `use_progress_bar`."""

import logging as python_logging
import math
import time
from typing import Any, TextIO

import torch
from tqdm.auto import tqdm
from transformers import Trainer, TrainerCallback
from transformers.trainer_callback import ExportableState, ProgressCallback
from transformers.utils import logging

logger = logging.get_logger(__name__)


class TrainingClock(TrainerCallback, ExportableState):
    """Measures the run across resumes: its wall time in training (`seconds`, dev evaluations included), the
    part of it spent on dev evaluations (`eval_seconds`) and the target tokens trained on, over all
    processes (`target_tokens`). The figures are saved in every checkpoint's `trainer_state.json` and taken
    up again from the checkpoint a run resumes from.

    With `max_minutes`, ends training, with a checkpoint, once the run has trained that long, counting every
    segment: a budget in time rather than steps gives the same run length on machines of any speed. The
    budget is checked after every step.
    """

    def __init__(self, max_minutes: float | None = None) -> None:
        self.max_minutes = max_minutes
        self.seconds = 0.0
        self.eval_seconds = 0.0
        self.target_tokens = 0
        # While training: when this segment of the run began; `seconds` then holds the segments before it.
        self._segment_started: float | None = None
        # This process's target tokens since the last sum over processes, on the device, so that counting
        # does not wait for the GPU.
        self._uncounted: torch.Tensor | int = 0

    def state(self) -> dict[str, Any]:
        # No constructor arguments: a resumed run may set another budget.
        return {
            "args": {},
            "attributes": {
                "seconds": self.elapsed(),
                "eval_seconds": self.eval_seconds,
                "target_tokens": self.target_tokens,
            },
        }

    def elapsed(self) -> float:
        """Seconds of training so far, over every segment of the run."""
        if self._segment_started is None:
            return self.seconds
        return self.seconds + time.monotonic() - self._segment_started

    @property
    def train_seconds(self) -> float:
        """Seconds of training without the dev evaluations, over every segment of the run."""
        return self.elapsed() - self.eval_seconds

    def count_targets(self, labels: torch.Tensor) -> None:
        """Adds the target tokens of a micro-batch of this process (labels other than -100)."""
        self._uncounted = self._uncounted + labels.ne(-100).sum()

    def on_train_begin(self, args, state, control, **kwargs) -> None:
        # A fresh run's state holds this clock's zeros; a resumed one, the figures of its checkpoint (or
        # nothing, for checkpoints saved without a clock: then they count from here on).
        saved = state.stateful_callbacks.setdefault(type(self).__name__, self.state())["attributes"]
        self.seconds, self.eval_seconds = saved["seconds"], saved["eval_seconds"]
        self.target_tokens = saved["target_tokens"]
        self._segment_started = time.monotonic()
        if self._budget_spent() and state.is_world_process_zero:
            logger.warning(
                f"The run has trained for {self.seconds / 60:.1f} minutes already, its whole --max-minutes "
                f"budget of {self.max_minutes:g} (which counts every resumed segment): it stops after one "
                "more step. Raise --max-minutes to train for longer."
            )

    def on_step_end(self, args, state, control, **kwargs) -> None:
        if self.max_minutes is not None:
            # Every process must stop at the same step, so the main process decides for all.
            stop = torch.tensor(float(self._budget_spent()), device=args.device)
            if args.world_size > 1:
                torch.distributed.broadcast(stop, src=0)
            if stop.item():
                control.should_training_stop = True
                control.should_save = True
        if control.should_save:
            self._sum_over_processes(args)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs) -> None:
        if self._segment_started is not None and metrics and "eval_runtime" in metrics:
            self.eval_seconds += metrics["eval_runtime"]

    def on_train_end(self, args, state, control, **kwargs) -> None:
        self._sum_over_processes(args)
        self.seconds, self._segment_started = self.elapsed(), None

    def _budget_spent(self) -> bool:
        return self.max_minutes is not None and self.elapsed() > self.max_minutes * 60

    def _sum_over_processes(self, args) -> None:
        # A collective: every process calls it at the same step (all save at the same steps and end together).
        uncounted = torch.as_tensor(self._uncounted, device=args.device)
        if args.world_size > 1:
            torch.distributed.all_reduce(uncounted)
        self.target_tokens += int(uncounted)
        self._uncounted = 0


class DevLossCallback(TrainerCallback):
    """Logs a line for every dev evaluation (loss, and BLEU when scored), so that a long run is readable
    without the progress bars."""

    def on_evaluate(self, args, state, control, metrics=None, **kwargs) -> None:
        if state.is_world_process_zero and metrics and "eval_loss" in metrics:
            bleu = f", dev BLEU {metrics['eval_bleu']:.2f}" if "eval_bleu" in metrics else ""
            logger.info(f"step {state.global_step}: dev loss {metrics['eval_loss']:.4f}{bleu}")


class TrainingProgressBar(ProgressCallback):
    """transformers' training progress bar, with the run's real total: `max_steps`, or under a time budget
    the steps that fit in what is left of it, estimated again after every step from this segment's pace.
    tqdm's ETA follows from the total, so a run that will stop at its budget does not promise the rest of
    `max_steps`. A resumed run's bar starts at the step it resumes from. With `compiling`, the bar says
    so until the first step, which compiles the training step, has ended, and a line then says how long it
    took: minutes on a CPU, which would otherwise look like a stall."""

    def __init__(self, clock: TrainingClock, compiling: bool = False) -> None:
        super().__init__()
        self.clock = clock
        self.compiling = compiling
        self._segment_start: tuple[int, float] = (0, 0.0)

    def on_train_begin(self, args, state, control, **kwargs) -> None:
        self.current_step = state.global_step
        self._segment_start = (state.global_step, self.clock.elapsed())
        if state.is_world_process_zero:
            self.training_bar = tqdm(
                total=self.expected_steps(state), initial=state.global_step, dynamic_ncols=True
            )
            if self.compiling:
                self.training_bar.set_description("compiling the training step")

    def on_step_end(self, args, state, control, **kwargs) -> None:
        if state.is_world_process_zero:
            self.training_bar.total = self.expected_steps(state)
            if self.compiling:
                self.compiling = False
                self.training_bar.set_description("")
                seconds = self.clock.elapsed() - self._segment_start[1]
                logger.info(f"The first step, compiling the training step, took {seconds:.0f} s")
        super().on_step_end(args, state, control, **kwargs)

    def expected_steps(self, state) -> int:
        """The step the run will end at: `max_steps`, or fewer when the time budget runs out first."""
        if self.clock.max_minutes is None:
            return state.max_steps
        first_step, started = self._segment_start
        steps, seconds = state.global_step - first_step, self.clock.elapsed() - started
        if steps == 0:
            return state.max_steps
        # The budget is checked after each step, so the step during which it runs out is still taken.
        left = max(0.0, self.clock.max_minutes * 60 - self.clock.elapsed())
        return min(state.max_steps, state.global_step + math.ceil(left / (seconds / steps)))


def use_progress_bar(trainer: Trainer, clock: TrainingClock) -> None:
    """Replaces the Trainer's progress bar, where it shows one, with `TrainingProgressBar` on `clock`, which
    shows the first step's compilation where the Trainer has a compiled step (`compiled_loss`)."""
    if trainer.pop_callback(ProgressCallback) is not None:
        compiling = getattr(trainer, "compiled_loss", None) is not None
        trainer.add_callback(TrainingProgressBar(clock, compiling=compiling))


def show_progress_lines(is_main_process: bool, stream: TextIO | None = None) -> None:
    """Makes a run's progress lines visible: INFO and up from the main process, warnings from the others,
    as Trainer's `log_level` and `log_level_replica` do for transformers' logger, on `stream` (default:
    stderr, like transformers' default handler). A level or a handler the caller has set for the package
    wins."""
    package_logger = logging.get_logger(__package__)
    if package_logger.level == logging.NOTSET:
        package_logger.setLevel(logging.INFO if is_main_process else logging.WARNING)
    if not package_logger.hasHandlers():
        package_logger.addHandler(python_logging.StreamHandler(stream))
