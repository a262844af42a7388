"""The commands of `vanilla-transformer`: every option explained, bad input refused in one line with exit
status 2, translate's line-for-line output and standard streams, train's defaults and model overrides."""

import argparse
import dataclasses
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import forked_processes
import pytest
import torch
from conftest import run_in_process, tiny_model
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from hf_vanilla_transformer.commands import COMMANDS, command_module
from hf_vanilla_transformer.commands.train import parse_args
from hf_vanilla_transformer.commands.translate import main as translate_main
from hf_vanilla_transformer.common.cli import ArgumentParser, may_write, refusals_in_one_line
from hf_vanilla_transformer.common.model_location import EXPORT_INFO_FILE
from hf_vanilla_transformer.common.tokenization import train_shared_bpe_tokenizer
from hf_vanilla_transformer.training.chatbot import read_chatbot_settings
from hf_vanilla_transformer.training.presets import TRAINING_PRESETS

SENTENCES = ["A dog runs in the park.", "Two men talk.", "A girl reads a book.", "The dog sleeps."]
# Every non-empty input translates to the first token of this word, repeated: the tiny model's logits bias
# makes sure.
FORCED_WORD = "dog"
FORCED_LENGTH = 3


def run_subcommand(name: str, *args: str, launcher: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """`python -m hf_vanilla_transformer NAME ARGS` with an empty standard input, started through
    `launcher` (a command that runs the rest) if given."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return forked_processes.run(
        [*launcher, sys.executable, "-m", "hf_vanilla_transformer", name, *args],
        input="",
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny saved model and tokenizer whose greedy output is always the same word, three times."""
    folder = tmp_path_factory.mktemp("model")
    tokenizer = train_shared_bpe_tokenizer(SENTENCES * 5, vocab_size=80, min_frequency=1, show_progress=False)
    ids = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id}
    ids |= {"bos_token_id": tokenizer.bos_token_id, "decoder_start_token_id": tokenizer.bos_token_id}
    model = tiny_model(vocab_size=len(tokenizer), output_bias=True, **ids)
    with torch.no_grad():
        model.final_logits_bias[0, forced_token(tokenizer)] = 1e4
    model.generation_config.num_beams = 1
    model.generation_config.max_new_tokens = FORCED_LENGTH
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def forced_token(tokenizer: PreTrainedTokenizerBase) -> int:
    return tokenizer(FORCED_WORD, add_special_tokens=False)["input_ids"][0]


def forced_translation(model_dir: Path) -> str:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return tokenizer.decode([forced_token(tokenizer)] * FORCED_LENGTH).strip()


def parser_actions(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.Action]]:
    """(parser name, action) for every argument of the parser and of its subcommands."""
    found = []
    for action in parser._actions:
        found.append((parser.prog, action))
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                found += parser_actions(subparser)
    return found


@pytest.mark.parametrize("name", COMMANDS)
def test_every_option_has_help(name: str) -> None:
    module = command_module(name)
    parser = module.build_parser()
    unexplained = [
        (prog, action.dest) for prog, action in parser_actions(parser) if not (action.help or "").strip()
    ]
    assert unexplained == []


@pytest.mark.parametrize("name", COMMANDS)
def test_help_examples_keep_their_line_breaks(name: str) -> None:
    """A backslash at the end of a docstring line joins it to the next: an example meant as two shell lines
    would show as one with a run of spaces in the middle."""
    module = command_module(name)
    joined = [line for line in (module.__doc__ or "").splitlines() if re.search(r"\S {5,}--", line)]
    assert joined == []


def test_train_help_shows_what_every_preset_sets(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--help"])
    assert exit_info.value.code == 0
    shown: dict[str, str] = {}
    current = ""
    for line in capsys.readouterr().out.split("\npresets")[1].splitlines()[1:]:
        if line.startswith("   "):  # a preset's continuation line
            shown[current] += " " + line.strip()
        else:
            current, shown[current] = line.split(maxsplit=1)
    assert shown.keys() == TRAINING_PRESETS.keys()
    for name, preset in TRAINING_PRESETS.items():
        expected = [f"model {preset.model_preset}", "--bf16 " if preset.bf16 else "--no-bf16"]
        expected += [f"{key}={value}" for key, value in preset.model_overrides.items()]
        for field in dataclasses.fields(preset):
            value = getattr(preset, field.name)
            flag = f"--{field.name.replace('_', '-')}"
            if field.name in ("model_preset", "model_overrides", "bf16") or value is None:
                continue
            if isinstance(value, bool):  # an on/off flag, shown as the flag or its --no- form
                expected.append(f"{flag} " if value else f"--no-{flag[2:]} ")
            else:
                expected.append(f"{flag} {value} ")
        assert [text for text in expected if text not in shown[name] + " "] == [], name


BAD_INPUTS = {
    "translate: missing --input file": (
        "translate",
        ["--model", "MODEL", "--input", "MISSING"],
        "--input",
    ),
    "translate: batch size 0": ("translate", ["--model", "MODEL", "--batch-size", "0"], "--batch-size"),
    "average: --last with --checkpoints": (
        "average",
        ["--checkpoints", "a", "b", "--last", "2", "--output", "out"],
        "--last",
    ),
    "average: --last 0": (
        "average",
        ["--run-dir", "runs", "--last", "0", "--output", "out"],
        "--last",
    ),
    "train: override value not a number": (
        "train",
        ["--output-dir", "out", "--model-override", "d_model=abc"],
        "d_model=abc",
    ),
    "train: override without a value": ("train", ["--output-dir", "out", "--model-override", "N4"], "N4"),
    "train: override of an unknown setting": (
        "train",
        ["--output-dir", "out", "--model-override", "depth=3"],
        "depth",
    ),
    "train: max steps 0": ("train", ["--output-dir", "out", "--max-steps", "0"], "--max-steps"),
    "train: negative weight decay": (
        "train",
        ["--output-dir", "out", "--weight-decay", "-0.1"],
        "--weight-decay",
    ),
    "train: negative cool-down": (
        "train",
        ["--output-dir", "out", "--cooldown-steps", "-5"],
        "--cooldown-steps",
    ),
    "tune: missing dev file": (
        "tune",
        ["--model", "MODEL", "--source", "MISSING", "--reference", "MISSING"],
        "--source",
    ),
    "tune: --save with a Hub id": (
        "tune",
        ["--model", "org/name", "--source", "SOURCE", "--reference", "SOURCE", "--save"],
        "--save",
    ),
    "tune: an infinite alpha": (
        "tune",
        ["--model", "MODEL", "--source", "SOURCE", "--reference", "SOURCE", "--length-penalties", "inf"],
        "--length-penalties",
    ),
    "tune: an empty dev set": (
        "tune",
        ["--model", "MODEL", "--source", "EMPTY_FILE", "--reference", "EMPTY_FILE"],
        "--source",
    ),
    "tune: source not UTF-8": (
        "tune",
        ["--model", "MODEL", "--source", "LATIN1", "--reference", "SOURCE"],
        "--source",
    ),
    "translate: no such model folder": (
        "translate",
        ["--model", "MISSING", "--input", "SOURCE"],
        "no such folder",
    ),
    "translate: a Hub id not in the cache": (
        "translate",
        ["--model", "org/not-downloaded", "--input", "SOURCE"],
        "no Hub model that can be loaded here",
    ),
    "translate: a file as the model": ("translate", ["--model", "CONFIG", "--input", "SOURCE"], "is a file"),
    "translate: a folder without a model": (
        "translate",
        ["--model", "FOLDER", "--input", "SOURCE"],
        "has no config.json",
    ),
    "translate: input not UTF-8": (
        "translate",
        ["--model", "MODEL", "--input", "LATIN1"],
        "latin1.en, line 1: not valid UTF-8",
    ),
    "translate: nan length penalty": (
        "translate",
        ["--model", "MODEL", "--input", "SOURCE", "--length-penalty", "nan"],
        "--length-penalty",
    ),
    "translate: output a folder": (
        "translate",
        ["--model", "MODEL", "--input", "SOURCE", "--output", "FOLDER"],
        "is a folder",
    ),
    "evaluate: hypotheses not UTF-8": (
        "evaluate",
        ["--hypotheses", "LATIN1", "--references", "SOURCE"],
        "--hypotheses",
    ),
    "average: output holds files already": (
        "average",
        ["--checkpoints", "MODEL", "EMPTY", "--output", "FOLDER"],
        "not empty",
    ),
    "convert: no such --src": (
        "convert",
        ["--from", "marian", "--src", "MISSING", "--out", "EMPTY"],
        "--src",
    ),
    "convert: --out holds files already": (
        "convert",
        ["--from", "marian", "--src", "MODEL", "--out", "FOLDER"],
        "not empty",
    ),
    "push: a shard size without a unit": (
        "push",
        ["--model-dir", "MODEL", "--repo-id", "someone/x", "--max-shard-size", "banana"],
        "--max-shard-size",
    ),
    "average: output a file": (
        "average",
        ["--checkpoints", "MODEL", "EMPTY", "--output", "SOURCE"],
        "is a file",
    ),
    "translate: weights cut short": ("translate", ["--model", "CORRUPT", "--input", "SOURCE"], "Cannot load"),
    "translate: an export on the torch engine": (
        "translate",
        ["--model", "EXPORT", "--engine", "torch", "--input", "SOURCE"],
        "is an export for ctranslate2, not a PyTorch model folder",
    ),
    "push: an export": (
        "push",
        ["--model-dir", "EXPORT", "--repo-id", "someone/x"],
        "is an export for ctranslate2, not a PyTorch model folder",
    ),
    "push: a shard size of 0": (
        "push",
        ["--model-dir", "MODEL", "--repo-id", "someone/x", "--max-shard-size", "0"],
        "--max-shard-size",
    ),
    "push: a card template not UTF-8": (
        "push",
        ["--model-dir", "MODEL", "--repo-id", "someone/x", "--card", "LATIN1"],
        "latin1.en, line 1: not valid UTF-8",
    ),
    "train: a negative seed": ("train", ["--output-dir", "out", "--seed", "-1"], "--seed"),
    "train: output a file": ("train", ["--output-dir", "SOURCE"], "is a file"),
    "chatbot: output a file": ("chatbot", ["train", "--output-dir", "SOURCE"], "is a file"),
    "translate: output the input": (
        "translate",
        ["--model", "MODEL", "--input", "SOURCE", "--output", "SOURCE"],
        "is also --input",
    ),
    "translate: input a folder": ("translate", ["--model", "MODEL", "--input", "FOLDER"], "is a folder"),
    "train: a dev target without its source": (
        "train",
        ["--output-dir", "out", "--dev-target", "SOURCE"],
        "give --dev SOURCE_FILE",
    ),
    "train: a test target with no test set": (
        "train",
        ["--output-dir", "out", "--test", "none", "--test-target", "SOURCE"],
        "give --test SOURCE_FILE",
    ),
    "train: one language on both sides": (
        "train",
        ["--output-dir", "out", "--src-lang", "en", "--tgt-lang", "en"],
        "both en",
    ),
    "train: a vocabulary size with a given tokenizer": (
        "train",
        ["--output-dir", "out", "--tokenizer", "MODEL", "--vocab-size", "100"],
        "--vocab-size",
    ),
    "train: a vocabulary size when fine-tuning": (
        "train",
        ["--output-dir", "out", "--init-from", "MODEL", "--vocab-size", "100"],
        "--init-from brings its own",
    ),
    "export: a shortlist size without a shortlist": (
        "export",
        ["--model", "MODEL", "--to", "ctranslate2", "--out", "EMPTY", "--shortlist-size", "50"],
        "--shortlist-from",
    ),
    "chatbot: no pair fits the length": (
        "chatbot",
        ["train", "--output-dir", "EMPTY", "--max-length", "1"],
        "raise max_length",
    ),
    "chatbot: chat with a model that is no chatbot": (
        "chatbot",
        ["chat", "--model", "MODEL"],
        "has no chatbot_settings.json",
    ),
    "translate: damaged decoding settings": (
        "translate",
        ["--model", "BAD_GENERATION_CONFIG", "--input", "SOURCE"],
        "generation_config.json is not valid JSON (JSONDecodeError, line 1 column 2): fix it",
    ),
    "tune: a dev set of blank lines": (
        "tune",
        ["--model", "MODEL", "--source", "BLANK_FILE", "--reference", "BLANK_FILE"],
        "holds no text",
    ),
}


@pytest.mark.parametrize("case", BAD_INPUTS, ids=list(BAD_INPUTS))
def test_bad_input_is_one_line_and_exit_status_2(
    case: str,
    model_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through `main`, in this process: the refusals of an output this user may not write (below) run every
    subcommand but push as a command of its own, and test_push_without_a_hub_to_reach_ends_in_one_line
    push, each with exit status 2 and one line on standard error."""
    name, args, named = BAD_INPUTS[case]
    (tmp_path / "dev.en").write_text("A dog runs.\n", encoding="utf-8")
    (tmp_path / "latin1.en").write_bytes("A déjà vu.\n".encode("latin-1"))
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty.en").write_text("", encoding="utf-8")
    replacements = {"MODEL": str(model_dir), "MISSING": str(tmp_path / "missing.en")}
    replacements |= {"SOURCE": str(tmp_path / "dev.en"), "LATIN1": str(tmp_path / "latin1.en")}
    replacements |= {"FOLDER": str(tmp_path), "EMPTY": str(tmp_path / "empty")}
    replacements["CONFIG"] = str(model_dir / "config.json")
    replacements["EMPTY_FILE"] = str(tmp_path / "empty.en")
    shutil.copytree(model_dir, tmp_path / "corrupt")
    weights = tmp_path / "corrupt" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    shutil.copytree(model_dir, tmp_path / "export")
    export_info = json.dumps({"engine": "ctranslate2"})
    (tmp_path / "export" / EXPORT_INFO_FILE).write_text(export_info, encoding="utf-8")
    replacements |= {"CORRUPT": str(tmp_path / "corrupt"), "EXPORT": str(tmp_path / "export")}
    shutil.copytree(model_dir, tmp_path / "bad_generation_config")
    (tmp_path / "bad_generation_config" / "generation_config.json").write_text("{bad", encoding="utf-8")
    (tmp_path / "blank.en").write_text("\n \n\n", encoding="utf-8")
    replacements["BAD_GENERATION_CONFIG"] = str(tmp_path / "bad_generation_config")
    replacements["BLANK_FILE"] = str(tmp_path / "blank.en")
    status, _, error = run_in_process(
        capsys, monkeypatch, name, *[replacements.get(arg, arg) for arg in args]
    )
    assert status == 2, error
    assert len(error.splitlines()) == 1, error
    assert error.startswith(f"vanilla-transformer {name}: error: ") and named in error
    assert "Traceback" not in error


# Root may write anywhere: setpriv (util-linux) takes away its capabilities to override file permissions, so
# that the permission bits bind root as they bind any other user.
WITHOUT_PERMISSION_OVERRIDE = (
    "setpriv",
    "--inh-caps=-dac_override,-dac_read_search",
    "--bounding-set=-dac_override,-dac_read_search",
)
# A command that writes where this user may not: (script, arguments, what the message names). READONLY is a
# folder this user may read but not write; READONLY_MODEL a model folder likewise.
UNWRITABLE_OUTPUTS = {
    "translate --output": (
        "translate",
        ["--model", "MODEL", "--input", "SOURCE", "--output", "READONLY/out"],
    ),
    "average --output": (
        "average",
        ["--checkpoints", "MODEL", "READONLY_MODEL", "--output", "READONLY/average"],
    ),
    "export --out": ("export", ["--model", "MODEL", "--to", "onnx", "--out", "READONLY/onnx"]),
    "convert --out": (
        "convert",
        ["--from", "marian", "--src", "MODEL", "--out", "READONLY/model"],
    ),
    "train --output-dir": ("train", ["--output-dir", "READONLY/run"]),
    "chatbot train --output-dir": ("chatbot", ["train", "--output-dir", "READONLY/run"]),
    "tune --save": (
        "tune",
        ["--model", "READONLY_MODEL", "--source", "SOURCE", "--reference", "SOURCE", "--save"],
    ),
}


def run_without_permission_override(name: str, *args: str) -> subprocess.CompletedProcess:
    """`run_subcommand`, where file permissions bind this user (root included)."""
    if os.geteuid() != 0:
        return run_subcommand(name, *args)
    if shutil.which("setpriv") is None:
        pytest.skip("runs as root without setpriv (util-linux), so file permissions do not bind it")
    return run_subcommand(name, *args, launcher=WITHOUT_PERMISSION_OVERRIDE)


def assert_permission_refusal(result: subprocess.CompletedProcess, name: str, path: Path) -> None:
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"vanilla-transformer {name}: error: ") and str(path) in result.stderr, (
        result.stderr
    )
    assert "permission denied" in result.stderr or "may not read" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("case", UNWRITABLE_OUTPUTS, ids=list(UNWRITABLE_OUTPUTS))
def test_an_output_this_user_may_not_write_is_one_line(case: str, model_dir: Path, tmp_path: Path) -> None:
    name, args = UNWRITABLE_OUTPUTS[case]
    (tmp_path / "dev.en").write_text("A dog runs.\n", encoding="utf-8")
    readonly, readonly_model = tmp_path / "readonly", tmp_path / "readonly_model"
    readonly.mkdir()
    shutil.copytree(model_dir, readonly_model)
    for path in (readonly_model / "generation_config.json", readonly_model, readonly):
        path.chmod(0o444 if path.is_file() else 0o555)
    replacements = {"MODEL": str(model_dir), "READONLY_MODEL": str(readonly_model)}
    replacements |= {"SOURCE": str(tmp_path / "dev.en"), "READONLY": str(readonly)}
    arguments = [replacements.get(arg, arg) for arg in args]
    arguments = [
        str(readonly / arg.split("/", 1)[1]) if arg.startswith("READONLY/") else arg for arg in arguments
    ]
    try:
        result = run_without_permission_override(name, *arguments)
    finally:
        for path in (readonly, readonly_model):
            path.chmod(0o755)
    assert_permission_refusal(result, name, tmp_path)
    assert str(readonly if "READONLY/" in " ".join(args) else readonly_model) in result.stderr
    assert list(readonly.iterdir()) == []


def test_weights_this_user_may_not_read_are_named(model_dir: Path, tmp_path: Path) -> None:
    """safetensors itself reports such weights as missing, and writes its files readable by their owner
    alone."""
    (tmp_path / "dev.en").write_text("A dog runs.\n", encoding="utf-8")
    shutil.copytree(model_dir, tmp_path / "model")
    (tmp_path / "model" / "model.safetensors").chmod(0o000)
    result = run_without_permission_override(
        "translate", "--model", str(tmp_path / "model"), "--input", str(tmp_path / "dev.en")
    )
    assert_permission_refusal(result, "translate", tmp_path / "model")
    assert "may not read model.safetensors; make it readable" in result.stderr


def test_an_input_this_user_may_not_read_is_one_line(tmp_path: Path) -> None:
    """A PermissionError met anywhere in a command, here reading an input file."""
    (tmp_path / "dev.de").write_text("Ein Hund rennt.\n", encoding="utf-8")
    shutil.copyfile(tmp_path / "dev.de", tmp_path / "hypotheses.de")
    (tmp_path / "hypotheses.de").chmod(0o000)
    result = run_without_permission_override(
        "evaluate",
        "--hypotheses",
        str(tmp_path / "hypotheses.de"),
        "--references",
        str(tmp_path / "dev.de"),
    )
    assert_permission_refusal(result, "evaluate", tmp_path)
    assert f"permission denied on {tmp_path / 'hypotheses.de'}" in result.stderr


def test_a_new_folder_may_be_written_where_its_nearest_existing_folder_may(tmp_path: Path) -> None:
    assert may_write(tmp_path / "runs" / "new" / "model")
    (tmp_path / "file").write_text("", encoding="utf-8")
    assert not may_write(tmp_path / "file" / "model")  # a file is no folder to create anything in


def test_translate_gives_an_empty_line_for_an_empty_line(
    model_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    status, output, error = run_in_process(
        capsys, monkeypatch, "translate", "--model", str(model_dir), stdin="A dog runs.\n\nTwo men.\n"
    )
    assert status is None, error
    forced = forced_translation(model_dir)
    assert forced.strip()
    assert output.split("\n") == [forced, "", forced, ""]


def test_translate_leaves_the_callers_standard_streams_open(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stdin = io.StringIO("A dog runs.\n \n")
    monkeypatch.setattr(sys, "stdin", stdin)
    translate_main(["--model", str(model_dir)])
    assert not stdin.closed and not sys.stdout.closed
    assert capsys.readouterr().out.split("\n") == [forced_translation(model_dir), "", ""]


def test_train_evaluates_on_multi30k_only_when_training_on_it() -> None:
    default = parse_args(["--output-dir", "out"])
    assert Path(default.dev).name == "val" and Path(default.test).name == "test_2016_flickr"
    own = parse_args(["--output-dir", "out", "--train", "corpus/train"])
    assert own.dev is None and own.test is None
    given = parse_args(
        ["--output-dir", "out", "--train", "corpus/train", "--dev", "corpus/dev", "--test", "None"]
    )
    assert given.dev == "corpus/dev" and given.test is None
    assert parse_args(["--output-dir", "out", "--dev", "none"]).dev is None


def test_train_reads_override_values_as_numbers_booleans_null_or_words() -> None:
    items = ["N=4", "P_drop=0.3", "scale_embedding=false", "d_k=null", "position_embedding_type=learned"]
    expected = {
        "N": 4,
        "P_drop": 0.3,
        "scale_embedding": False,
        "d_k": None,
        "position_embedding_type": "learned",
    }
    repeated = [arg for item in items for arg in ("--model-override", item)]
    assert parse_args(["--output-dir", "out", *repeated]).model_overrides == expected
    one_flag = ["--model-override", *items[:2], "--model-override", *items[2:]]
    assert parse_args(["--output-dir", "out", *one_flag]).model_overrides == expected


@pytest.mark.parametrize(
    "item, message",
    [
        ("dropout=0.1x", "integer, a number"),
        ("layer_norm_eps=null", "not null"),
        ("d_model=nan", "integer, a number"),
        ("vocab_size=100", "--vocab-size"),
        ("h=5", "not divisible"),
        ("activation_function=tanh", "activation_function"),
    ],
)
def test_train_refuses_malformed_overrides(
    item: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--output-dir", "out", "--model-override", item])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert message in error and len(error.splitlines()) == 1


def test_only_the_packages_own_refusals_become_one_line_errors(tmp_path, capsys):
    parser = ArgumentParser(prog="prog")
    with pytest.raises(SystemExit) as exited, refusals_in_one_line(parser):
        read_chatbot_settings(tmp_path)  # raised by the package: a refusal written for the user
    assert exited.value.code == 2
    assert capsys.readouterr().err.startswith(f"prog: error: {tmp_path} has no chatbot_settings.json")
    # The same kind of error from elsewhere (here, this test) is no refusal, and keeps its traceback.
    with pytest.raises(ValueError, match="from elsewhere"), refusals_in_one_line(parser):
        raise ValueError("from elsewhere")


def test_a_refused_training_run_leaves_no_recipe_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for side in ("en", "de"):
        (tmp_path / f"tiny.{side}").write_text("A dog runs.\nTwo men.\n", encoding="utf-8")
    output = tmp_path / "run"
    args = ["--train", str(tmp_path / "tiny"), "--dev", "none", "--test", "none", "--output-dir", str(output)]
    status, _, error = run_in_process(
        capsys, monkeypatch, "train", *args, "--init-from", str(tmp_path / "no-such-model")
    )
    assert status == 2 and "no such folder" in error, error
    assert not (output / "training_recipe.json").exists()


def test_push_without_a_hub_to_reach_ends_in_one_line(model_dir: Path) -> None:
    """The model is staged first (with its progress bars), then the Hub is out of reach: HF_HUB_OFFLINE."""
    result = run_subcommand("push", "--model-dir", str(model_dir), "--repo-id", "someone/x")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert (
        last.startswith("vanilla-transformer push: error: cannot reach the Hub (")
        and "HF_HUB_OFFLINE" in last
    )
