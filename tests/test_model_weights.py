"""A model folder whose config.json does not describe its weights is refused in one line by every command
that loads one, before anything is allocated; the check finds what transformers' own loading report finds."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import free_port, tiny_model
from transformers import AutoModelForSeq2SeqLM

from hf_vanilla_transformer.commands import main
from hf_vanilla_transformer.common.model_weights import saved_weight_shapes, weight_mismatches
from hf_vanilla_transformer.common.tokenization import train_shared_bpe_tokenizer

SENTENCES = ["A dog runs in the park.", "Two men talk.", "A girl reads a book."]
# config.json changes that no longer describe the saved weights, and what the refusal names.
CORRUPTIONS = {
    "more encoder layers": ({"encoder_layers": 30}, "missing (model.encoder.layers.2-29.*)"),
    "fewer decoder layers": ({"decoder_layers": 1}, "no place in its model (model.decoder.layers.1.*)"),
    "another vocabulary": (
        {"vocab_size": 10},
        "model.shared.weight is [64, 32] in the weights, [10, 32] by config.json",
    ),
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny saved model (tied embeddings and pre-softmax projection) and its tokenizer."""
    folder = tmp_path_factory.mktemp("model")
    tokenizer = train_shared_bpe_tokenizer(SENTENCES * 5, vocab_size=64, min_frequency=1, show_progress=False)
    tiny_model(vocab_size=64, pad_token_id=tokenizer.pad_token_id).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def with_config(model_dir: Path, destination: Path, **changes: object) -> Path:
    """A copy of `model_dir` whose config.json has `changes`."""
    shutil.copytree(model_dir, destination)
    config = json.loads((destination / "config.json").read_text(encoding="utf-8"))
    (destination / "config.json").write_text(json.dumps(config | changes), encoding="utf-8")
    return destination


def test_tied_weights_are_not_missing(model_dir: Path) -> None:
    saved = saved_weight_shapes(model_dir)
    assert "lm_head.weight" not in saved and "model.decoder.embed_tokens.weight" not in saved
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir)
    assert weight_mismatches(model, saved) == (set(), set(), {})


@pytest.mark.parametrize("changes", [{"encoder_layers": 3}, {"decoder_layers": 1}, {"vocab_size": 10}])
def test_the_check_finds_what_transformers_reports(model_dir: Path, tmp_path: Path, changes: dict) -> None:
    folder = with_config(model_dir, tmp_path / "model", **changes)
    loaded, info = AutoModelForSeq2SeqLM.from_pretrained(
        folder, output_loading_info=True, ignore_mismatched_sizes=True
    )
    with torch.device("meta"):
        described = AutoModelForSeq2SeqLM.from_config(loaded.config)
    missing, unexpected, mismatched = weight_mismatches(described, saved_weight_shapes(folder))
    assert missing == info["missing_keys"] and unexpected == info["unexpected_keys"]
    assert {(key, tuple(saved), tuple(wanted)) for key, saved, wanted in info["mismatched_keys"]} == {
        (key, saved_weight_shapes(folder)[key], shape) for key, shape in mismatched.items()
    }
    assert missing or unexpected or mismatched


def command_lines(command: str, model: Path, tmp_path: Path) -> list[str]:
    """`vanilla-transformer COMMAND` given `model`, with whatever else it needs to reach the model."""
    source = tmp_path / "source.txt"
    source.write_text("A dog runs.\n", encoding="utf-8")
    return {
        "translate": ["translate", "--model", str(model), "--input", str(source)],
        "score": ["score", "--model", str(model), "--source", str(source), "--target", str(source)],
        "tune": ["tune", "--model", str(model), "--source", str(source), "--reference", str(source)],
        "serve": [
            "serve",
            "--model",
            str(model),
            "--port",
            str(free_port()),
            "--source-lang",
            "en",
            "--target-lang",
            "de",
        ],
        "export": ["export", "--model", str(model), "--to", "onnx", "--out", str(tmp_path / "out")],
        "push": ["push", "--model-dir", str(model), "--repo-id", "someone/model"],
    }[command]


@pytest.mark.parametrize("corruption", CORRUPTIONS)
@pytest.mark.parametrize("command", ["translate", "score", "tune", "serve", "export", "push"])
def test_commands_refuse_a_config_that_does_not_describe_the_weights(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, corruption: str
) -> None:
    changes, named = CORRUPTIONS[corruption]
    folder = with_config(model_dir, tmp_path / "model", **changes)
    with pytest.raises(SystemExit) as exited:
        main(command_lines(command, folder, tmp_path))
    error = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2
    assert len(error) == 1 and named in error[0] and "does not describe its weights" in error[0], error
    assert not (tmp_path / "out").exists()


def test_commands_still_load_a_matching_model(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(command_lines("translate", model_dir, tmp_path)) is None
    assert len(capsys.readouterr().out.splitlines()) == 1
