"""The installed `vanilla-transformer` command and `python -m hf_vanilla_transformer`: every subcommand
answers `--help` and is listed in docs/cli.md, a missing or unknown subcommand is one line with exit status
2, and the flags that pass settings on (train --report-to, translate --device, push --with-ctranslate2)
refuse what they cannot do in one line."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO_ROOT

from hf_vanilla_transformer.commands import COMMANDS, PROG, main
from hf_vanilla_transformer.commands.train import parse_args
from hf_vanilla_transformer.inference.translation import resolve_device
from hf_vanilla_transformer.training.settings import REPORT_TO, TRACKERS, installed_trackers

# Where `pip install -e .` (run.sh) puts the console script: next to the interpreter running the tests.
CONSOLE_SCRIPT = Path(sys.executable).parent / PROG
ENTRY_POINTS = {
    "console script": [str(CONSOLE_SCRIPT)],
    "python -m": [sys.executable, "-m", "hf_vanilla_transformer"],
}
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def start(entry_point: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [*ENTRY_POINTS[entry_point], *args],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen) -> subprocess.CompletedProcess:
    stdout, stderr = process.communicate(timeout=300)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def run(entry_point: str, *args: str) -> subprocess.CompletedProcess:
    return finish(start(entry_point, *args))


def assert_one_line_error(result: subprocess.CompletedProcess, prog: str, *named: str) -> None:
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"{prog}: error: "), line
    assert all(text in line for text in named), line
    assert not result.stdout


def test_pip_install_puts_the_console_script_in_the_environment() -> None:
    assert CONSOLE_SCRIPT.is_file() and os.access(CONSOLE_SCRIPT, os.X_OK), (
        f"{CONSOLE_SCRIPT} is missing: install the package with `pip install -e .`"
    )
    result = run("console script", "--help")
    assert result.returncode == 0, result.stderr
    for name, (_, help_line) in COMMANDS.items():
        assert name in result.stdout and help_line.split()[0] in result.stdout, name


def test_every_subcommand_answers_help(capsys: pytest.CaptureFixture[str]) -> None:
    """Through `main`, which the console script and `python -m` call: the console script's own `--help`
    and its refusal of a missing or unknown subcommand (the tests beside this one) show that both reach
    it, in a process of their own."""
    for name in COMMANDS:
        with pytest.raises(SystemExit) as exited:
            main([name, "--help"])
        output = capsys.readouterr()
        assert exited.value.code == 0, f"{name}: {output.err}"
        assert output.out.startswith(f"usage: {PROG} {name} "), output.out[:200]
        assert "Traceback" not in output.err


@pytest.mark.parametrize("entry_point", ENTRY_POINTS)
@pytest.mark.parametrize("args, named", [([], "give a command"), (["transalte"], "'transalte'")])
def test_missing_or_unknown_subcommand_is_one_line_with_exit_status_2(
    entry_point: str, args: list[str], named: str
) -> None:
    assert_one_line_error(run(entry_point, *args), PROG, named, "translate")


def test_main_runs_the_subcommand_it_is_given(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "hyp").write_text("a cat sits on the mat\n")
    (tmp_path / "ref").write_text("a cat sits on the mat\n")
    assert (
        main(["evaluate", "--hypotheses", str(tmp_path / "hyp"), "--references", str(tmp_path / "ref")])
        is None
    )
    assert capsys.readouterr().out.startswith("BLEU = 100.00")


def test_the_trackers_offered_are_transformers_own():
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    assert sorted(TRACKERS) == sorted(INTEGRATION_TO_CALLBACK)
    assert REPORT_TO == ("none", "all", *TRACKERS)


def test_report_to_reaches_the_training_settings(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_args(["--output-dir", "out"]).report_to == "none"
    assert parse_args(["--output-dir", "out", "--report-to", "all"]).report_to == "all"
    for tracker in sorted(installed_trackers() & set(REPORT_TO)):
        assert parse_args(["--output-dir", "out", "--report-to", tracker]).report_to == tracker
    refused = {"tensorbord": "invalid choice"}
    refused |= {
        tracker: "its package is not installed"
        for tracker in sorted(set(REPORT_TO) - {"none", "all"} - installed_trackers())[:1]
    }
    for tracker, expected in refused.items():
        with pytest.raises(SystemExit) as exit_info:
            parse_args(["--output-dir", "out", "--report-to", tracker])
        assert exit_info.value.code == 2
        error = capsys.readouterr().err
        assert len(error.splitlines()) == 1 and tracker in error and expected in error


def test_resolve_device() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="is not a device"):
        resolve_device("gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="finds no CUDA device here"):
            resolve_device("cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="torch finds a CUDA device here")
def test_translate_on_cuda_without_cuda_is_one_line(tmp_path: Path) -> None:
    # Refused before the model is looked for: the folder need not exist.
    result = run("console script", "translate", "--model", str(tmp_path / "model"), "--device", "cuda")
    assert_one_line_error(result, f"{PROG} translate", "--device cuda", "finds no CUDA device here")


@pytest.mark.parametrize(
    "args, named",
    [
        (["--device", "cuda", "--int8"], "--int8 quantizes for the CPU"),
        (["--device", "tpu"], "invalid choice: 'tpu'"),
    ],
)
def test_translate_refuses_devices_it_cannot_use(
    args: list[str], named: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["translate", "--model", str(tmp_path), *args])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert len(error.splitlines()) == 1 and named in error


def test_push_quantization_needs_the_ctranslate2_export(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "push",
                "--model-dir",
                str(tmp_path),
                "--repo-id",
                "org/name",
                "--ctranslate2-quantization",
                "int8",
            ]
        )
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith(f"{PROG} push: error: ") and "add --with-ctranslate2" in error
    assert len(error.splitlines()) == 1


def test_the_command_guide_lists_every_command() -> None:
    guide = (REPO_ROOT / "docs" / "cli.md").read_text()
    listed = re.findall(r"^\| `vanilla-transformer (\w+)` \|", guide, re.MULTILINE)
    assert sorted(listed) == sorted(COMMANDS)
