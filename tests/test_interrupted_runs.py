"""A training run killed at any point of its end (a checkpoint half written, the last checkpoint written,
the final model half written, results.json half written) and resumed with `train --resume` ends as the run
that was never interrupted: the same steps, the same checkpoints kept and averaged, the same final weights
to the bit (one thread).

The killed run is a process of its own (forked by `forked_processes`), which kills itself; the uninterrupted
and the resumed runs go through `main`, in this process, on one thread and with the products the killed
process computes with (the oneDNN sizes the package ships), so that all three compute alike to the bit."""

import json
import os
import subprocess
import sys
from pathlib import Path

import forked_processes
import pytest
import torch
from conftest import MEASURED_ONEDNN_MINIMA, SHIPPED_ONEDNN_FLOAT32_LINEAR
from safetensors.torch import load_file
from test_training import write_corpus

from hf_vanilla_transformer.commands import main
from hf_vanilla_transformer.common import cpu_speedups

MAX_STEPS, SAVE_STEPS = 6, 2
# Runs `vanilla-transformer train ARGS` in a process that kills itself (SIGKILL: nothing is cleaned up) at
# PHASE, from inside the libraries that write the files, so that the files are left as a kill leaves them.
KILLED_RUN = """
import os
import signal
import sys
from pathlib import Path

import safetensors.torch
import transformers.modeling_utils  # which holds save_file under a name of its own

phase, last_checkpoint = sys.argv[1], f"checkpoint-{sys.argv[2]}"
save_file, write_text = safetensors.torch.save_file, Path.write_text


def kill():
    os.kill(os.getpid(), signal.SIGKILL)


def weights_saved(tensors, filename, *args, **kwargs):
    save_file(tensors, filename, *args, **kwargs)
    if phase == "final model" and Path(filename).parent.name == "model":
        data = Path(filename).read_bytes()
        Path(filename).write_bytes(data[: len(data) // 2])
        kill()


def text_written(self, text, *args, **kwargs):
    if phase == "results" and self.name == "results.json":
        write_text(self, text[: len(text) // 2], *args, **kwargs)
        kill()
    return write_text(self, text, *args, **kwargs)


safetensors.torch.save_file = transformers.modeling_utils.safe_save_file = weights_saved
Path.write_text = text_written

from transformers.trainer_callback import TrainerState

save_to_json = TrainerState.save_to_json


def state_saved(self, json_path):
    at_last = Path(json_path).parent.name == last_checkpoint
    if at_last and phase == "checkpoint":  # its weights and optimizer written, its trainer_state.json not
        kill()
    save_to_json(self, json_path)
    if at_last and phase == "after the last checkpoint":
        kill()


TrainerState.save_to_json = state_saved

from hf_vanilla_transformer.commands import main

sys.exit(main(["train", *sys.argv[3:]]))
"""


def train_flags(out: Path, corpus: Path, *extra: str) -> list[str]:
    return ["--output-dir", str(out), "--train", str(corpus / "train"), "--dev", "none", "--test", "none",
             "--preset", "cpu-demo", "--vocab-size", "300", "--max-steps", str(MAX_STEPS),
             "--save-steps", str(SAVE_STEPS), "--keep-checkpoints", "2", "--average-checkpoints", "2",
             "--model-override", "d_model=32", "N=1", "h=2", "d_ff=64", *extra]  # fmt: skip


def train_killed(tmp_path: Path, out: Path, corpus: Path, killed_at: str) -> subprocess.CompletedProcess:
    """`vanilla-transformer train` on one thread in a process of its own, which kills itself at
    `killed_at`."""
    script = tmp_path / "killed_run.py"
    script.write_text(KILLED_RUN)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(script), killed_at, str(MAX_STEPS), *train_flags(out, corpus)]
    return forked_processes.run(command, capture_output=True, text=True, env=env, timeout=600)


def train(out: Path, corpus: Path, *extra: str) -> None:
    """`vanilla-transformer train` through `main`, in this process, as the killed process trains: on one
    thread, with the oneDNN sizes and CPU gate the package ships."""
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:
        for name, value in MEASURED_ONEDNN_MINIMA.items():
            patch.setattr(cpu_speedups, name, value)
        patch.setattr(cpu_speedups, "_ONEDNN_FLOAT32_LINEAR", SHIPPED_ONEDNN_FLOAT32_LINEAR)
        torch.set_num_threads(1)
        try:
            assert main(["train", *train_flags(out, corpus, *extra)]) in (None, 0)
        finally:
            torch.set_num_threads(threads)


def outcome(out: Path) -> tuple[dict, list[str], dict]:
    """What a finished run leaves: its results (those that do not depend on the clock), its checkpoints and
    its final weights."""
    results = json.loads((out / "model" / "results.json").read_text())
    kept = {key: results[key] for key in ("steps", "averaged_checkpoints", "train_pairs", "parameters")}
    checkpoints = sorted(path.name for path in out.glob("checkpoint-*"))
    return kept, checkpoints, load_file(out / "model" / "model.safetensors")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def uninterrupted(corpus, tmp_path_factory) -> tuple[dict, list[str], dict]:
    folder = tmp_path_factory.mktemp("uninterrupted")
    train(folder / "run", corpus)
    return outcome(folder / "run")


@pytest.mark.parametrize("phase", ["checkpoint", "after the last checkpoint", "final model", "results"])
def test_a_run_killed_at_its_end_resumes_to_the_uninterrupted_run(corpus, uninterrupted, tmp_path, phase):
    out = tmp_path / "run"
    killed = train_killed(tmp_path, out, corpus, phase)
    assert killed.returncode == -9, killed.stderr[-3000:]
    train(out, corpus, "--resume")

    results, checkpoints, weights = outcome(out)
    expected_results, expected_checkpoints, expected_weights = uninterrupted
    assert results == expected_results and results["steps"] == MAX_STEPS
    assert results["averaged_checkpoints"] == [
        f"checkpoint-{MAX_STEPS - SAVE_STEPS}",
        f"checkpoint-{MAX_STEPS}",
    ]
    assert checkpoints == expected_checkpoints
    assert weights.keys() == expected_weights.keys()
    for name, tensor in weights.items():
        assert tensor.equal(expected_weights[name]), name
