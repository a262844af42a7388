"""transformers' own rules for its in-tree models, applied to the model folder: its modeling linter
(`transformers-mlinter`) and the rules of its `utils/check_*.py` scripts as `shared/tools/check_upstream.py`
applies them (transformers' Marian and BART folders pass all of them)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import hf_vanilla_transformer

MODEL_FOLDER = Path(hf_vanilla_transformer.__file__).resolve().parent / "vanilla_transformer"
REPOSITORY = MODEL_FOLDER.parent.parent
CHECK_UPSTREAM = REPOSITORY.parent / "shared" / "tools" / "check_upstream.py"
# The package's registration first: transformers' in-tree models are in its Auto mappings, ours are there once
# the package has registered them.
RUN_CHECK = (
    "import runpy, sys; import hf_vanilla_transformer; hf_vanilla_transformer.register_auto_classes(); "
    "sys.argv = sys.argv[1:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


def test_the_modeling_linter_finds_nothing_in_the_model_folder():
    mlinter = shutil.which("mlinter", path=str(Path(sys.executable).parent)) or shutil.which("mlinter")
    assert mlinter is not None, "transformers-mlinter is in the test extra: pip install -e .[test]"
    run = subprocess.run(
        [mlinter, "--no-progress", "--no-cache", str(MODEL_FOLDER)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPOSITORY,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "violation" not in run.stdout


@pytest.mark.skipif(not CHECK_UPSTREAM.exists(), reason=f"{CHECK_UPSTREAM} is not beside the checkout")
def test_the_model_folder_passes_every_rule_transformers_applies_to_its_own_models():
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            RUN_CHECK,
            str(CHECK_UPSTREAM),
            "--package",
            str(MODEL_FOLDER),
            "--model-type",
            "vanilla_transformer",
            "--tests",
            str(REPOSITORY / "tests"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    failed = [line for line in run.stdout.splitlines() if line.startswith("FAIL")]
    assert failed == [], run.stdout + run.stderr
    assert run.returncode == 0, run.stdout + run.stderr
