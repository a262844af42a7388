"""run_training across processes, GPUs and resumes: two gloo processes on a CPU, the number of processes
recorded and checked on resume, the time budget and the tokens/s figure over every segment of a run,
incomplete checkpoints set aside by one process only, refused settings, and the GPU choices (mixed precision,
TF32, data-loading workers)."""

import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import accelerate_cpu_launcher
from test_training import settings, write_corpus

from hf_vanilla_transformer.commands import train as train_command
from hf_vanilla_transformer.common.tokenization import load_tokenizer
from hf_vanilla_transformer.training import resume, trainer
from hf_vanilla_transformer.training import settings as training_settings
from hf_vanilla_transformer.training.batching import TokenBudgetBatchSampler
from hf_vanilla_transformer.training.data import load_parallel_data, tokenize_pairs
from hf_vanilla_transformer.training.pipeline import run_training
from hf_vanilla_transformer.training.presets import TRAINING_PRESETS
from hf_vanilla_transformer.training.settings import TrainingSettings

# What `accelerate launch` runs in every process: run_training on settings given as JSON.
LAUNCHED = """
import gc
import json
import sys

import torch.distributed
from torch.nn.parallel import DistributedDataParallel

from hf_vanilla_transformer.training.pipeline import run_training
from hf_vanilla_transformer.training.settings import TrainingSettings

destroy_process_group = torch.distributed.destroy_process_group


def destroy_once_no_wrapper_owns_the_group(*args, **kwargs):
    # A DDP wrapper alive at this point would own the group afterwards and take it down when run_training's
    # objects go, joining gloo's threads while holding the GIL: a hang at exit.
    wrappers = [o for o in gc.get_objects() if isinstance(o, DistributedDataParallel)]
    assert not wrappers, f"{len(wrappers)} DistributedDataParallel wrapper(s) outlive the process group"
    destroy_process_group(*args, **kwargs)


torch.distributed.destroy_process_group = destroy_once_no_wrapper_owns_the_group
run_training(TrainingSettings(**json.loads(sys.argv[1])))
"""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def launch(tmp_path: Path, processes: int, run: TrainingSettings) -> subprocess.CompletedProcess:
    """`run` in `processes` CPU processes (gloo) under `accelerate launch`, as on several GPUs."""
    script = tmp_path / "launched.py"
    script.write_text(LAUNCHED)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    settings_json = json.dumps(vars(run))
    return subprocess.run(
        [*accelerate_cpu_launcher(processes), str(script), settings_json],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def clock(checkpoint: Path) -> dict[str, float]:
    """The training time and target tokens a checkpoint stores for the run so far."""
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return state["stateful_callbacks"]["TrainingClock"]["attributes"]


def test_two_processes_train_resume_over_an_incomplete_checkpoint_and_refuse_one(corpus, tmp_path):
    out = tmp_path / "run"
    two = settings(
        corpus, out, max_steps=2, save_steps=1, keep_checkpoints=4, max_tokens=256, tokens_per_step=512,
        dev=str(corpus / "val"), eval_steps=2, eval_bleu=True, max_eval_sentences=4,
    )  # fmt: skip
    first = launch(tmp_path, 2, two)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "256 per micro-batch x 1 accumulation x 2 process(es)" in first.stderr
    # Both processes translate their share of the dev set; the Trainer gathers the translations.
    assert "step 2: dev loss" in first.stderr and ", dev BLEU" in first.stderr
    assert json.loads((out / resume.RECIPE_FILE).read_text())["world_size"] == 2
    assert clock(out / "checkpoint-2")["target_tokens"] > 0

    # A kill while checkpoint-3 was being saved: both processes find it, the main one alone sets it aside.
    incomplete = out / "checkpoint-3"
    incomplete.mkdir()
    (incomplete / "model.safetensors").write_bytes(b"cut short")
    resumed = launch(tmp_path, 2, replace(two, max_steps=4, resume=True))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resuming from" in resumed.stderr and str(out / "checkpoint-2") in resumed.stderr
    assert (out / "incomplete-checkpoint-3" / "model.safetensors").read_bytes() == b"cut short"
    results = json.loads((out / "model" / "results.json").read_text())
    assert results["steps"] == 4 and results["processes"] == 2
    assert clock(out / "checkpoint-4")["target_tokens"] > clock(out / "checkpoint-2")["target_tokens"]

    with pytest.raises(ValueError, match=r"on 1 process\(es\): it was trained on 2.*--num_processes 2"):
        run_training(replace(two, max_steps=5, resume=True))


def train_flags(corpus: Path, out: Path, *extra: str) -> list[str]:
    """The `train` command's flags for the run that `test_training.settings` makes."""
    return ["--output-dir", str(out), "--train", str(corpus / "train"), "--dev", "none", "--test", "none",
            "--preset", "cpu-demo", "--vocab-size", "300",
            "--model-override", "d_model=32", "N=1", "h=2", "d_ff=64", *extra]  # fmt: skip


def test_resume_after_a_kill_during_the_first_checkpoint_says_how_to_start_afresh(corpus, tmp_path, capsys):
    """A kill while the first checkpoint was written leaves the run's record, its tokenizer and a checkpoint
    folder without trainer_state.json. --resume says there is nothing to resume, where the partial files
    went and that a run without --resume starts afresh; which it then does, in the same folder."""
    out = tmp_path / "run"
    run = settings(corpus, out, max_steps=2, save_steps=2)
    run_training(run)
    partial = out / "checkpoint-2"
    (partial / "trainer_state.json").unlink()  # written last: the kill came before it
    shutil.rmtree(out / "model")
    weights = (partial / "model.safetensors").read_bytes()
    capsys.readouterr()  # the first run's progress

    with pytest.raises(SystemExit) as exit_info:
        train_command.main(train_flags(corpus, out, "--max-steps", "2", "--save-steps", "2", "--resume"))
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1, error
    assert f"no complete checkpoint in {out} to resume from" in error
    assert "set aside as incomplete-checkpoint-2" in error and "Run without --resume to start afresh" in error
    assert not partial.exists()
    assert (out / "incomplete-checkpoint-2" / "model.safetensors").read_bytes() == weights

    # As the message says: without --resume the run starts afresh there, and leaves the set-aside folder.
    assert run_training(run)["steps"] == 2
    assert json.loads((partial / "trainer_state.json").read_text())["global_step"] == 2
    assert (out / "incomplete-checkpoint-2" / "model.safetensors").read_bytes() == weights


def test_resume_of_a_folder_without_checkpoints_says_to_start_the_run(corpus, tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no checkpoint-N folder.*Run without --resume"):
        run_training(settings(corpus, tmp_path, resume=True))


def test_a_run_resumed_on_one_process_refuses_two(corpus, tmp_path):
    one = settings(corpus, tmp_path, max_steps=2, save_steps=2)
    run_training(one)
    assert run_training(settings(corpus, tmp_path, max_steps=3, save_steps=2, resume=True))["steps"] == 3
    refused = launch(tmp_path, 2, settings(corpus, tmp_path, max_steps=4, save_steps=2, resume=True))
    assert refused.returncode != 0
    assert "Cannot resume" in refused.stderr and "on 2 process(es): it was trained on 1" in refused.stderr
    assert not (tmp_path / "checkpoint-4").exists()


def test_recipes_recorded_without_the_number_of_processes_resume_on_any(corpus, tmp_path):
    run = settings(corpus, tmp_path)
    record = resume.recipe_record(run.preset, run.seed, run.recipe(), world_size=2)
    (tmp_path / resume.RECIPE_FILE).write_text(json.dumps({**record, "world_size": 1}))
    with pytest.raises(ValueError, match="it was trained on 1"):
        resume.check_same_recipe(tmp_path, record)
    del record["world_size"]
    (tmp_path / resume.RECIPE_FILE).write_text(json.dumps(record))
    resume.check_same_recipe(tmp_path, resume.recipe_record(run.preset, run.seed, run.recipe(), world_size=2))


def test_recipes_recorded_without_length_penalty_tuning_resume(corpus, tmp_path):
    """Choosing alpha on the dev set comes after training: a run may resume with it on or off."""
    run = settings(corpus, tmp_path)
    record = resume.recipe_record(run.preset, run.seed, run.recipe(), world_size=1)
    del record["tune_length_penalty"]
    (tmp_path / resume.RECIPE_FILE).write_text(json.dumps(record))
    resume.check_same_recipe(tmp_path, resume.recipe_record(run.preset, run.seed, run.recipe(), world_size=1))


def test_the_time_budget_and_tokens_per_second_cover_every_segment(corpus, tmp_path):
    run_training(settings(corpus, tmp_path, max_steps=2, save_steps=2))
    first = clock(tmp_path / "checkpoint-2")
    assert first["seconds"] > 0 and first["target_tokens"] > 0
    # As if the first segment had trained for an hour: a 30-minute budget is spent, so the resumed run stops
    # after the one step it takes before it looks at the clock, far from its max_steps.
    state_file = tmp_path / "checkpoint-2" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state["stateful_callbacks"]["TrainingClock"]["attributes"]["seconds"] = 3600.0
    state_file.write_text(json.dumps(state))
    results = run_training(
        settings(corpus, tmp_path, max_steps=50, save_steps=50, max_minutes=30, resume=True)
    )
    assert results["steps"] == 3
    total = clock(tmp_path / "checkpoint-3")
    assert total["target_tokens"] > first["target_tokens"]
    # The checkpoint's clock is exact; the results round to a tenth of a second, more than a tiny step takes.
    assert 3600 < total["seconds"] < 3600 + 60
    assert 3600 <= results["train_seconds"] < 3600 + 60
    assert results["target_tokens_per_second"] == round(total["target_tokens"] / results["train_seconds"], 1)


def test_every_target_token_of_an_epoch_is_counted_with_a_data_loading_worker(corpus, tmp_path):
    """The count happens in the training loop, so batches collated in a worker process count too."""
    first = run_training(settings(corpus, tmp_path / "tokenizer", max_steps=1, max_tokens=256))
    tokenizer = load_tokenizer(Path(first["model_dir"]))
    dataset = tokenize_pairs(
        load_parallel_data(str(corpus / "train"), None, src_lang="en", tgt_lang="de"), tokenizer, 256, 256
    )
    epoch = len(TokenBudgetBatchSampler.from_dataset(dataset, 256))
    run = settings(
        corpus, tmp_path / "run", tokenizer=first["model_dir"], max_steps=epoch, save_steps=epoch,
        max_tokens=256, tokens_per_step=256, dataloader_workers=1,
    )  # fmt: skip
    run_training(run)
    expected = sum(len(labels) for labels in dataset["labels"])
    assert clock(tmp_path / "run" / f"checkpoint-{epoch}")["target_tokens"] == expected


def test_refused_settings(corpus, tmp_path):
    with pytest.raises(
        ValueError, match=r"average_checkpoints \(4\) exceeds keep_checkpoints \(3\).*at least 4"
    ):
        run_training(settings(corpus, tmp_path / "a", average_checkpoints=4, keep_checkpoints=3))
    with pytest.raises(ValueError, match="dataloader_workers must be 0"):
        run_training(settings(corpus, tmp_path / "b", dataloader_workers=-1))
    with pytest.raises(ValueError, match=r"cooldown_steps must be between 0 and max_steps \(2\), got 3"):
        run_training(settings(corpus, tmp_path / "c", max_steps=2, cooldown_steps=3))
    with pytest.raises(ValueError, match="eval_bleu scores the dev set"):
        run_training(settings(corpus, tmp_path / "c", eval_bleu=True))
    assert not any((tmp_path / name).exists() for name in "abc")


@pytest.mark.parametrize(
    ("preset", "processes", "layout"),
    [("base", 1, (12_500, 2)), ("base", 2, (12_500, 1)), ("base", 3, (8334, 1)), ("base", 8, (3125, 1)),
     ("big", 1, (12_500, 2)), ("cpu-demo", 1, (1024, 1))],
)  # fmt: skip
def test_every_step_holds_about_the_recipe_tokens(preset, processes, layout):
    recipe = TRAINING_PRESETS[preset]
    micro_batch, accumulation = trainer.batch_layout(recipe, processes)
    assert (micro_batch, accumulation) == layout and micro_batch <= recipe.max_tokens
    assert 0 <= micro_batch * accumulation * processes - recipe.tokens_per_step < processes * accumulation


def test_half_precision_choice(monkeypatch, corpus, tmp_path):
    base = TRAINING_PRESETS["base"]
    run = settings(corpus, tmp_path)
    monkeypatch.setattr(trainer, "bf16_is_native", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    # A GPU without native bf16 (V100, T4): fp16 with loss scaling; an explicit --bf16 or --no-bf16 wins.
    assert trainer.mixed_precision(run, base) == "fp16"
    assert trainer.mixed_precision(replace(run, bf16=True), base) == "bf16"
    assert trainer.mixed_precision(replace(run, bf16=False), base) == "no"
    assert run.workers() == training_settings.GPU_DATALOADER_WORKERS
    monkeypatch.setattr(trainer, "bf16_is_native", lambda: True)
    assert trainer.mixed_precision(run, base) == "bf16"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(trainer, "bf16_is_native", lambda: False)
    assert trainer.mixed_precision(run, base) == "no" and run.workers() == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_gpu_run_uses_half_precision_tf32_and_workers(corpus, tmp_path):
    results = run_training(
        settings(corpus, tmp_path, max_steps=2, preset="base", max_tokens=256, tokens_per_step=256)
    )
    native_bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
    assert results["mixed_precision"] == ("bf16" if native_bf16 else "fp16")
    if torch.cuda.get_device_capability()[0] >= 8:  # TF32 exists from Ampere on
        assert torch.backends.fp32_precision == "tf32"
    assert clock(tmp_path / "checkpoint-2")["target_tokens"] > 0


@pytest.mark.parametrize(
    ("field", "paper_value", "other_value"), [("weight_decay", 0.0, 0.1), ("cooldown_steps", 0, 1)]
)
def test_recipes_recorded_without_a_later_field_resume_only_with_the_papers_value(
    corpus, tmp_path, field, paper_value, other_value
):
    """A record without weight decay or a cool-down is a run trained with the paper's Adam and Eq. 3: it
    resumes as such, and a resume that asks for either would change the update rule midway."""
    run = settings(corpus, tmp_path, **{field: paper_value})
    record = resume.recipe_record(run.preset, run.seed, run.recipe(), world_size=1)
    del record[field]
    (tmp_path / resume.RECIPE_FILE).write_text(json.dumps(record))
    resume.check_same_recipe(tmp_path, resume.recipe_record(run.preset, run.seed, run.recipe(), world_size=1))
    changed = replace(run, **{field: other_value})
    with pytest.raises(ValueError, match=f"{field}: {paper_value} in the run, {other_value} now"):
        resume.check_same_recipe(
            tmp_path, resume.recipe_record(run.preset, run.seed, changed.recipe(), world_size=1)
        )
