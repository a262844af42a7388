"""Shared test set-up: offline Hub, deterministic tiny models."""

import gc
import io
import json
import os
import socket
import subprocess
import sys

# Read by huggingface_hub at import time: set before anything imports it.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tiny models gain nothing from a second thread, and subprocesses (training runs, Hub clients) inherit
# this: without it, their OpenMP pools and pytest's own fight over the two cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from hf_vanilla_transformer import (
    VanillaTransformerConfig,
    VanillaTransformerForConditionalGeneration,
)
from hf_vanilla_transformer.common import cpu_speedups

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
# The dimensions of the tiny transformers reference models (Marian, FSMT) the tests compare against.
TINY_REFERENCE_DIMS = dict(
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=64,
)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Once the tests are collected, everything imported so far (torch, transformers, the test modules) is
    moved out of the garbage collector's sight (`gc.freeze`): it lives as long as the process anyway, and
    every full collection would otherwise walk it again. transformers' Trainer collects garbage at the start
    of every training run, so in a worker that has imported the whole suite each of the hundreds of tiny
    runs paid for walking millions of objects (a quarter of test_training.py's time)."""
    gc.collect()
    gc.freeze()


def free_port() -> int:
    """A TCP port free on this machine now, for a process group's rendezvous: tests that run side by side
    (pytest -n) must not all wait on torch's default port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def accelerate_cpu_launcher(processes: int) -> list[str]:
    """`accelerate launch` for `processes` CPU processes (gloo) on this machine, as on several GPUs; the
    script and its arguments follow."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
            str(processes), "--num_machines", "1", "--main_process_port", str(free_port()),
            "--mixed_precision", "no", "--dynamo_backend", "no"]  # fmt: skip


def grad_fn_names(output: torch.Tensor) -> set[str]:
    """The names of the autograd nodes behind `output`: which implementation computed it."""
    seen, stack = set(), [output.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and node not in seen:
            seen.add(node)
            stack.extend(next_node for next_node, _ in node.next_functions)
    return {type(node).__name__ for node in seen}


def tiny_config(**overrides) -> VanillaTransformerConfig:
    """A base-shaped model small enough for unit tests (2+2 layers, d_model 32, 4 heads)."""
    values = dict(vocab_size=64, d_model=32, N=2, h=4, d_ff=64, max_position_embeddings=64)
    values.update(overrides)
    return VanillaTransformerConfig.from_preset("base", **values)


def tiny_model(seed: int = 0, **overrides) -> VanillaTransformerForConditionalGeneration:
    torch.manual_seed(seed)
    return VanillaTransformerForConditionalGeneration(tiny_config(**overrides)).eval()


# The product sizes from which `CPULinear` takes oneDNN's path, as the package ships them.
MEASURED_ONEDNN_MINIMA = {
    "_ONEDNN_MIN_TRAINING_ROWS": cpu_speedups._ONEDNN_MIN_TRAINING_ROWS,
    "_ONEDNN_MIN_INFERENCE_WEIGHT": cpu_speedups._ONEDNN_MIN_INFERENCE_WEIGHT,
}
# Whether `CPULinear` takes oneDNN on this CPU at all, as the package decides it (AMD CPUs only).
SHIPPED_ONEDNN_FLOAT32_LINEAR = cpu_speedups._ONEDNN_FLOAT32_LINEAR


@pytest.fixture(autouse=True)
def onednn_for_tiny_products(monkeypatch):
    """Tiny models' products are far below the sizes where oneDNN pays, so the tests lower those sizes to
    nothing: the oneDNN path stays checked against plain torch and under every wrapper. The sizes
    themselves are checked in test_cpu_speedups.py. The path is taken on every x86 CPU here, Intel's too,
    where the package leaves it off for speed but its numbers must still hold."""
    for name in MEASURED_ONEDNN_MINIMA:
        monkeypatch.setattr(cpu_speedups, name, 0)
    monkeypatch.setattr(cpu_speedups, "_ONEDNN_FLOAT32_LINEAR", cpu_speedups._X86_ONEDNN)


@pytest.fixture
def shipped_onednn_sizes(monkeypatch):
    """For tests that compare this process's results bit for bit with a fresh interpreter's (remote code,
    scripts): both must take the same GEMM, so this process keeps the sizes and the CPU gate the package
    ships."""
    for name, value in MEASURED_ONEDNN_MINIMA.items():
        monkeypatch.setattr(cpu_speedups, name, value)
    monkeypatch.setattr(cpu_speedups, "_ONEDNN_FLOAT32_LINEAR", SHIPPED_ONEDNN_FLOAT32_LINEAR)


@pytest.fixture
def model() -> VanillaTransformerForConditionalGeneration:
    return tiny_model()


def run_in_process(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *argv: str, stdin: str | bytes = ""
) -> tuple[int | None, str, str]:
    """`vanilla-transformer ARGV` run through `main` in this process, with `stdin` as its standard input
    (bytes: read as a process reads its standard input, a UTF-8 text stream over those bytes): its exit
    status (None: success), standard output and standard error."""
    from hf_vanilla_transformer.commands import main

    stream = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8") if isinstance(stdin, bytes) else None
    monkeypatch.setattr(sys, "stdin", stream or io.StringIO(stdin))
    try:
        status = main(list(argv))
    except SystemExit as exited:
        status = exited.code
    output = capsys.readouterr()
    return status, output.out, output.err


# Runs each script of argv[2:] as `python SCRIPT ARGS` runs it (its folder first on the path, named __main__),
# with ARGS the JSON list argv[1], one after another in this one interpreter, so that the torch and
# transformers imports are paid once. Prints {script: {"status", "stdout", "stderr"}} as JSON: the status a
# SystemExit carried ("returned" when the script ended without one); an exception is recorded with its
# traceback, as a real run would print it, and status 1.
SCRIPTS_IN_ONE_INTERPRETER = """
import contextlib, io, json, runpy, sys, traceback

arguments, ran = json.loads(sys.argv[1]), {}
for script in sys.argv[2:]:
    sys.argv = [script, *arguments]
    sys.path.insert(0, script.rsplit("/", 1)[0])
    output, errors = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(errors):
        try:
            runpy.run_path(script, run_name="__main__")
            status = "returned"
        except SystemExit as exited:
            status = exited.code
        except Exception:
            traceback.print_exc()
            status = 1
    sys.path.pop(0)
    ran[script] = {"status": status, "stdout": output.getvalue(), "stderr": errors.getvalue()}
print(json.dumps(ran))
"""


def run_scripts_in_one_interpreter(scripts: list[Path], *arguments: str) -> dict[Path, dict]:
    """Each of `scripts` run with `arguments` in one fresh interpreter (this environment, set offline above,
    without warnings): for each, the status its exit carried, its standard output and its standard error."""
    completed = subprocess.run(
        [sys.executable, "-c", SCRIPTS_IN_ONE_INTERPRETER, json.dumps(arguments), *map(str, scripts)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONWARNINGS="ignore"),
        cwd=REPO_ROOT,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    ran = json.loads(completed.stdout)
    return {script: ran[str(script)] for script in scripts}
