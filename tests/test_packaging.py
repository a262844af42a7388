"""The built wheel carries the files the library opens by default (model card templates, chatbot corpus) and
the `vanilla-transformer` command.

A checkout or an editable install finds them whatever the packaging says; an installed wheel only has what
`pyproject.toml` puts into it. So the wheel is built, unpacked on its own, and asked for those files.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

pytestmark = pytest.mark.slow

# Run in the unpacked wheel: where the package was imported from, and the default files it looks for.
PROBE = """
import json
from hf_vanilla_transformer.training import chatbot
from hf_vanilla_transformer.hub import model_card
print(json.dumps({
    "package": model_card.__file__,
    "cards": [str(model_card.CARD_TEMPLATE)],
    "corpus": str(chatbot.DEFAULT_DATA),
    "pairs": len(chatbot.load_chatbot_pairs()[0]),
}))
"""


@pytest.fixture(scope="module")
def unpacked_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wheel_dir = tmp_path_factory.mktemp("wheel")
    # Built with the test environment's setuptools and no index: a build environment fetched from an index
    # would wait on the network, up to pip's timeout for each retry.
    pip = [sys.executable, "-m", "pip", "--quiet"]
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "--wheel-dir", str(wheel_dir)]
    subprocess.run([*build, str(REPO_ROOT)], check=True, capture_output=True, text=True, timeout=300)
    (wheel,) = wheel_dir.glob("hf_vanilla_transformer-*.whl")
    target = tmp_path_factory.mktemp("site")
    install = [*pip, "install", "--no-deps", "--no-index", "--target", str(target)]
    subprocess.run([*install, str(wheel)], check=True, capture_output=True, text=True, timeout=300)
    return target


def test_installed_wheel_finds_its_model_cards_and_chatbot_corpus(unpacked_wheel: Path) -> None:
    env = {"PYTHONPATH": str(unpacked_wheel), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    probe = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=env,
        capture_output=True,
        text=True,
        cwd=unpacked_wheel,
        timeout=300,
    )
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    package = unpacked_wheel / "hf_vanilla_transformer"
    # The probe must have imported the wheel's copy, not the checkout this test runs from.
    assert Path(found["package"]).parent == package / "hub"
    assert [Path(card).name for card in found["cards"]] == ["template.md"]
    for card in found["cards"]:
        assert Path(card).parent == package / "hub" / "model_cards"
        assert Path(card).read_bytes() == (REPO_ROOT / "model_cards" / Path(card).name).read_bytes()
    corpus = Path(found["corpus"])
    assert corpus.parent == package / "training" / "chatbot_ko"
    assert corpus.read_bytes() == (REPO_ROOT / "data" / "chatbot_ko" / corpus.name).read_bytes()
    # The corpus' MIT license must travel with every copy of it.
    assert (corpus.parent / "LICENSE").read_bytes() == (
        REPO_ROOT / "data" / "chatbot_ko" / "LICENSE"
    ).read_bytes()
    assert found["pairs"] > 11_000


def test_installed_wheel_has_the_vanilla_transformer_command(unpacked_wheel: Path) -> None:
    command = unpacked_wheel / "bin" / "vanilla-transformer"
    assert command.is_file()
    env = {"PYTHONPATH": str(unpacked_wheel), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    for args in (["--help"], ["translate", "--help"]):
        result = subprocess.run(
            [sys.executable, str(command), *args],
            env=env,
            capture_output=True,
            text=True,
            cwd=unpacked_wheel,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"usage: {' '.join(['vanilla-transformer', *args[:-1]])} ")
