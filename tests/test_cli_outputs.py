"""`translate` and `score` whose output breaks mid-run, as real commands in subprocesses: a full disk
(/dev/full) ends with one line on standard error and exit status 1, and a reader that goes away (`| head
-1`) ends the command silently with status 141, as it ends a Unix tool; never a traceback."""

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import forked_processes
import pytest
from test_export import train_reverse_model

COMMAND = [sys.executable, "-m", "hf_vanilla_transformer"]
PIPE_BYTES = 4096
pytestmark = [
    pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this system"),
    pytest.mark.skipif(not hasattr(fcntl, "F_SETPIPE_SZ"), reason="pipe sizes are not settable here"),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_reverse_model(tmp_path_factory.mktemp("model"), "paper")


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Enough lines that their translations or scores (tens of kB) outgrow a one-page pipe and what `head`
    reads at once, so that the command is still writing when its reader goes away."""
    path = tmp_path_factory.mktemp("text") / "source.txt"
    path.write_text("w1 w2 w3 w4\n" * 3000, encoding="utf-8")
    return path


def arguments(command: str, model: Path, text: Path) -> list[str]:
    if command == "translate":
        return ["translate", "--model", str(model), "--input", str(text)]
    return ["score", "--model", str(model), "--source", str(text), "--target", str(text)]


@pytest.mark.parametrize("command", ["translate", "score"])
@pytest.mark.parametrize("how", ["--output", "standard output"])
def test_a_full_disk_ends_with_one_line_and_status_1(
    model_dir: Path, text: Path, command: str, how: str
) -> None:
    args = COMMAND + arguments(command, model_dir, text)
    with open("/dev/full", "w") as full:
        if how == "--output":
            result = forked_processes.run(
                args + ["--output", "/dev/full"], capture_output=True, text=True, timeout=300
            )
        else:
            result = forked_processes.run(args, stdout=full, stderr=subprocess.PIPE, text=True, timeout=300)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"vanilla-transformer {command}: error: ") and "No space left" in last
    assert result.stderr.count("error:") == 1


@pytest.mark.parametrize("command", ["translate", "score"])
def test_a_closed_pipe_ends_silently(model_dir: Path, text: Path, command: str) -> None:
    """`COMMAND | head -1`: head reads one line and exits; the command stops without a word."""
    read_end, write_end = os.pipe()
    # One page, not Linux's 64 KiB default, which could hold all the scores before head has read a line.
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    producer = forked_processes.popen(
        COMMAND + arguments(command, model_dir, text), stdout=write_end, stderr=subprocess.PIPE
    )
    os.close(write_end)  # the producer holds the only write end
    reader = subprocess.run(["head", "-1"], stdin=read_end, capture_output=True, timeout=300)
    os.close(read_end)  # head held the only other read end: once it exits, the pipe has no reader
    _, stderr = producer.communicate(timeout=300)
    assert reader.returncode == 0 and len(reader.stdout.splitlines()) == 1
    assert producer.returncode == 141, stderr.decode()
    assert b"Traceback" not in stderr and b"Error" not in stderr and b"Exception" not in stderr
