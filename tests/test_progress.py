"""A training run's progress bar shows the steps the run will really take, so its ETA can be trusted; the
README's demo preset runs end to end on the shipped Multi30k on a shortened schedule."""

from types import SimpleNamespace

import pytest
from conftest import REPO_ROOT
from test_training import settings, write_corpus
from tqdm.auto import tqdm

from hf_vanilla_transformer.training import progress
from hf_vanilla_transformer.training.pipeline import run_training
from hf_vanilla_transformer.training.presets import TRAINING_PRESETS
from hf_vanilla_transformer.training.settings import TrainingSettings

MULTI30K = REPO_ROOT / "data" / "multi30k"


class RecordedBar(tqdm):
    """A tqdm bar that remembers every total it showed (at each refresh and when closed)."""

    shown: list[list[int]] = []

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.totals = [self.total]
        RecordedBar.shown.append(self.totals)

    def update(self, n: int = 1) -> None:
        self.totals.append(self.total)
        super().update(n)

    def close(self) -> None:
        self.totals.append(self.total)
        super().close()


@pytest.fixture
def recorded_bars(monkeypatch) -> list[list[int]]:
    RecordedBar.shown = []
    monkeypatch.setattr(progress, "tqdm", RecordedBar)
    return RecordedBar.shown


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def test_demo_preset_runs_on_a_short_schedule_and_its_bar_counts_the_steps_it_takes(
    corpus, tmp_path, recorded_bars
):
    """The demo's own model, vocabulary and batches on the shipped Multi30k, for 3 steps instead of its
    full schedule, then averaged, translated and scored. Its dev loss and BLEU are measured on the first 20
    pairs of the validation set rather than all 1014, which would take most of the test's time."""
    demo = TRAINING_PRESETS["cpu-demo"]
    assert demo.max_minutes is None, "the demo trains a fixed number of steps, whatever the machine"
    results = run_training(
        TrainingSettings(
            output_dir=str(tmp_path / "demo"),
            train=str(MULTI30K / "train"),
            dev=str(corpus / "val"),
            test=str(MULTI30K / "test_2016_flickr"),
            preset="cpu-demo",
            max_steps=3,
            save_steps=1,
            max_eval_sentences=4,
        )
    )
    assert results["steps"] == 3
    assert results["test_sentences"] == 4 and "bleu" in results and "dev_bleu" in results
    assert len(results["averaged_checkpoints"]) == min(3, demo.average_checkpoints)
    (bar,) = recorded_bars
    assert set(bar) == {3}, f"the bar showed totals {sorted(set(bar))} for a run of 3 steps"


def test_under_a_time_budget_the_bar_total_comes_down_to_the_steps_taken(corpus, tmp_path, recorded_bars):
    results = run_training(
        settings(corpus, tmp_path, max_steps=100_000, max_minutes=0.05, save_steps=100_000)
    )
    (bar,) = recorded_bars
    steps = results["steps"]
    assert 2 <= steps < 100_000
    assert bar[-1] == steps, f"the bar closed at a total of {bar[-1]} after {steps} steps"
    # From the second step on the total is an estimate from the pace, not max_steps.
    assert all(total < 100_000 for total in bar[3:])


def test_expected_steps_follow_the_pace_of_the_segment():
    clock = progress.TrainingClock(max_minutes=1.0)
    bar = progress.TrainingProgressBar(clock)
    now = {"elapsed": 20.0}
    clock.elapsed = lambda: now["elapsed"]
    # A run resumed at step 100 after 20 s of training, with 40 s of its minute left.
    state = SimpleNamespace(global_step=100, max_steps=1000, is_world_process_zero=False)
    bar.on_train_begin(None, state, None)
    assert bar.expected_steps(state) == 1000  # no pace yet
    state.global_step, now["elapsed"] = 110, 30.0  # 1 s a step, 30 s left
    assert bar.expected_steps(state) == 140
    state.global_step, now["elapsed"] = 130, 70.0  # over budget: this is the last step
    assert bar.expected_steps(state) == 130
    state.max_steps = 120
    state.global_step, now["elapsed"] = 110, 30.0
    assert bar.expected_steps(state) == 120  # max_steps comes first
    assert progress.TrainingProgressBar(progress.TrainingClock()).expected_steps(state) == 120
