"""The translation server's OpenAPI description against the server itself: schemathesis, with all its checks,
sends what /openapi.json calls valid and invalid to `vanilla-transformer serve` on 127.0.0.1 and finds no
request the server answers otherwise than the description says (an undocumented status, a valid request
refused, an invalid one taken, an answer of another shape), and no server error.
"""

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_serve import command_in_process, model_dir_fixture  # noqa: F401 (the fixture)

pytest.importorskip("schemathesis", reason="not installed (pip install -e '.[test]')")
httpx = pytest.importorskip("httpx", reason="not installed (pip install -e '.[test]')")

# Test cases an operation gets at most in a phase, and the seconds the whole run may take.
MAX_EXAMPLES = 30
MAX_TIME_S = 300
# schemathesis's statuses for a request that breaks the description, with 413: the server refuses a text
# over its character limit (the description's maxLength) as too large, as it refuses every request over
# a size limit.
REFUSED_STATUSES = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx"]


@pytest.fixture(scope="module")
def served(model_dir: Path) -> Iterator[str]:
    with command_in_process(model_dir) as url:
        yield url


def test_the_openapi_description_declares_every_error_and_the_models_languages(served: str) -> None:
    description = httpx.get(f"{served}/openapi.json", timeout=30).json()
    operations = [operation for path in description["paths"].values() for operation in path.values()]
    error = {"$ref": "#/components/schemas/Error"}
    for operation in operations:
        for status, response in operation["responses"].items():
            if status.startswith(("4", "5")):
                assert response["content"]["application/json"]["schema"] == error, operation["summary"]
    body = description["paths"]["/translate"]["post"]["requestBody"]["content"]["application/json"]
    languages = httpx.get(f"{served}/languages", timeout=30).json()
    assert body["schema"]["properties"]["target"]["enum"] == languages[0]["targets"]
    assert body["schema"]["properties"]["source"]["enum"] == [languages[0]["code"], "auto"]


def test_schemathesis_with_all_its_checks_finds_no_failure(served: str, tmp_path: Path) -> None:
    config = tmp_path / "schemathesis.toml"
    config.write_text(
        f"[checks.negative_data_rejection]\nexpected-statuses = {json.dumps(REFUSED_STATUSES)}\n"
    )
    command = [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run"]
    command += [f"{served}/openapi.json", "--checks", "all", "--max-examples", str(MAX_EXAMPLES)]
    command += ["--seed", "0", "--generation-database", "none"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=MAX_TIME_S, cwd=tmp_path)
    output = run.stdout + run.stderr
    generated = re.search(r"(\d+) generated", output)
    assert generated and int(generated.group(1)) > 100, output[-3000:]
    assert run.returncode == 0, output[-6000:]
