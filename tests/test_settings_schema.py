"""Each setting declared once: the `train` and `chatbot train` flags are generated from the settings'
dataclass fields, `train --help` lists what each preset sets from the presets themselves, and the Python API
and the command line take the same defaults and refuse the same values."""

import argparse
import dataclasses
from pathlib import Path

import pytest

from hf_vanilla_transformer.commands import chatbot as chatbot_command
from hf_vanilla_transformer.commands import train as train_command
from hf_vanilla_transformer.common.settings_schema import (
    add_arguments,
    check_settings,
    flag_name,
    optional_copy,
    schema_values,
    setting,
)
from hf_vanilla_transformer.training import presets, resume
from hf_vanilla_transformer.training.chatbot import ChatbotSettings
from hf_vanilla_transformer.training.settings import DEFAULT_EVALUATION, DEFAULT_TRAIN, TrainingSettings


def flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {option: action for action in parser._actions for option in action.option_strings}


def subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices[name]


@pytest.mark.parametrize(
    ("schema", "parser"),
    [
        (TrainingSettings, train_command.build_parser()),
        (ChatbotSettings, subparser(chatbot_command.build_parser(), "train")),
    ],
    ids=["train", "chatbot train"],
)
def test_every_setting_has_a_flag_with_its_help_and_default(schema, parser) -> None:
    shown = flags(parser)
    for field in dataclasses.fields(schema):
        action = shown[flag_name(field)]
        assert action.dest == field.name and action.help == field.metadata["help"]
        if field.type in (int, float, str) and field.default is not dataclasses.MISSING:
            assert action.default == field.default, field.name


def test_every_recipe_setting_may_be_given_and_defaults_to_the_presets() -> None:
    recipe_settings = [
        field.name for field in dataclasses.fields(presets.TrainingPreset) if "help" in field.metadata
    ]
    assert recipe_settings and set(recipe_settings) <= {
        field.name for field in dataclasses.fields(TrainingSettings)
    }
    run = TrainingSettings(output_dir="out", preset="cpu-demo")
    assert all(getattr(run, name) is None for name in recipe_settings)
    assert run.recipe() == presets.TRAINING_PRESETS["cpu-demo"]


def test_train_help_lists_the_presets_as_they_are(monkeypatch, capsys) -> None:
    """The list is made from the presets: a new one, or a changed value, shows without a change to the
    command."""
    changed = {**presets.TRAINING_PRESETS, "tiny": presets.TrainingPreset(max_steps=7, lr_scale=0.5)}
    monkeypatch.setattr(train_command, "TRAINING_PRESETS", changed)
    with pytest.raises(SystemExit):
        train_command.build_parser().parse_args(["--help"])
    listing = capsys.readouterr().out.split("\npresets")[1]
    assert "tiny      model base; --max-steps 7 --tokens-per-step 25000" in listing
    assert "--lr-scale 0.5" in listing
    # The paper's presets take bf16 where it is native, and compile nowhere.
    base = " ".join(listing.split("\n  big")[0].split())
    assert "--no-compile --bf16 (where the CPU or GPU computes bf16 natively)" in base
    assert "--no-compile" in " ".join(listing.split("\n  cpu ")[1].split())


def test_presets_keep_the_positional_constructor() -> None:
    written_out = presets.TrainingPreset(
        "base", {}, 100_000, 25_000, 12_500, 4000, 37_000, 1000, 5, 5, 1000, bf16=True
    )
    assert written_out == presets.TRAINING_PRESETS["base"]


def test_the_recorded_recipe_keeps_its_keys() -> None:
    """Runs recorded before resume: `training_recipe.json` holds the same keys."""
    run = TrainingSettings(output_dir="out")
    record = resume.recipe_record(run.preset, run.seed, run.recipe(), world_size=1)
    assert set(record) == {
        "preset", "seed", "world_size", "max_steps", "tokens_per_step", "max_tokens", "warmup_steps",
        "save_steps", "keep_checkpoints", "average_checkpoints", "eval_steps", "label_smoothing", "lr_scale",
        "weight_decay", "cooldown_steps", "subword_dropout", "length_buckets", "compile", "max_length",
        "max_minutes", "bf16", "tune_length_penalty", "packed_row_length",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("given", "dev", "test"),
    [
        ({}, DEFAULT_EVALUATION["dev"], DEFAULT_EVALUATION["test"]),
        ({"train": "corpus/train"}, None, None),
        ({"train": "corpus/train", "dev": "corpus/dev", "test": "None"}, "corpus/dev", None),
        ({"dev": "none"}, None, DEFAULT_EVALUATION["test"]),
        ({"train": DEFAULT_TRAIN, "test": "corpus/test"}, DEFAULT_EVALUATION["dev"], "corpus/test"),
    ],
)
def test_python_and_the_command_line_take_the_same_dev_and_test_sets(given, dev, test) -> None:
    """Multi30k's dev and test sets only when training on the shipped Multi30k, in Python as on the command
    line."""
    argv = ["--output-dir", "out", *[arg for key, value in given.items() for arg in (f"--{key}", value)]]
    from_python = TrainingSettings(output_dir="out", **given)
    from_command_line = train_command.parse_args(argv)
    assert (from_python.dev, from_python.test) == (dev, test)
    assert from_command_line == from_python


REFUSED = {
    "max_steps": ({"max_steps": 0}, ["--max-steps", "0"], "--max-steps"),
    "cooldown_steps": ({"cooldown_steps": -5}, ["--cooldown-steps", "-5"], "--cooldown-steps"),
    "subword_dropout": ({"subword_dropout": 1.0}, ["--subword-dropout", "1"], "--subword-dropout"),
    "seed": ({"seed": -1}, ["--seed", "-1"], "--seed"),
    "num_beams": ({"num_beams": 0}, ["--num-beams", "0"], "--num-beams"),
    "long_pairs": ({"long_pairs": "drop"}, ["--long-pairs", "drop"], "drop"),
    "dev_target": ({"dev_target": "x.de"}, ["--dev-target", "x.de"], "give --dev SOURCE_FILE"),
    "one language": ({"tgt_lang": "en"}, ["--tgt-lang", "en"], "both en"),
    "vocab_size": (
        {"tokenizer": "t", "vocab_size": 100},
        ["--tokenizer", "t", "--vocab-size", "100"],
        "--tokenizer brings its own",
    ),
    "model": ({"model_overrides": {"h": 5}}, ["--model-override", "h=5"], "not divisible"),
    "greedy alpha": (
        {"tune_length_penalty": True, "num_beams": 1},
        ["--tune-length-penalty", "--num-beams", "1"],
        "num_beams is 1",
    ),
    "averaging": (
        {"average_checkpoints": 3, "keep_checkpoints": 2},
        ["--average-checkpoints", "3", "--keep-checkpoints", "2"],
        "exceeds keep_checkpoints",
    ),
}


@pytest.mark.parametrize("case", REFUSED)
def test_python_and_the_command_line_refuse_the_same_values(case, capsys) -> None:
    values, argv, named = REFUSED[case]
    with pytest.raises(ValueError) as refused:
        TrainingSettings(output_dir="out", **values)
    assert named in str(refused.value)
    with pytest.raises(SystemExit) as exit_info:
        train_command.parse_args(["--output-dir", "out", *argv])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(error.splitlines()) == 1 and named in error


def test_chatbot_settings_refuse_what_its_flags_refuse() -> None:
    with pytest.raises(ValueError, match="--dropout: '1.5' is not a number in"):
        ChatbotSettings(dropout=1.5)
    with pytest.raises(ValueError, match="--batch-size"):
        ChatbotSettings(batch_size=0)


@dataclasses.dataclass
class Example:
    """A schema of every kind of setting the generator knows."""

    steps: int = setting(3, "updates", check=int)
    rate: float | None = setting(None, "a rate", group="numbers", check=float)
    switch: bool = setting(False, "on when given")
    either: bool | None = setting(None, "on, off or left alone")
    word: str = setting("a", "one of two words", choices=("a", "b"), flag="--the-word")
    unlisted: int = 0  # not a setting: no help, no flag


def test_the_parser_generator_on_every_kind_of_setting() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser, Example)
    assert set(flags(parser)) == {
        "-h",
        "--help",
        "--steps",
        "--rate",
        "--switch",
        "--either",
        "--no-either",
        "--the-word",
    }
    args = parser.parse_args(["--rate", "0.5", "--switch", "--no-either", "--the-word", "b"])
    assert Example(**schema_values(Example, args)) == Example(
        steps=3, rate=0.5, switch=True, either=False, word="b"
    )
    assert schema_values(Example, parser.parse_args([])) == {
        "steps": 3, "rate": None, "switch": False, "either": None, "word": "a",
    }  # fmt: skip
    with pytest.raises(ValueError, match="--the-word: invalid choice 'c'"):
        check_settings(Example(word="c"))
    with pytest.raises(ValueError, match="--steps"):
        check_settings(Example(steps="x"))


def test_an_optional_copy_takes_every_setting_as_none() -> None:
    copy = optional_copy(Example, "MaybeExample", exclude=("word",))
    assert [(field.name, field.default) for field in dataclasses.fields(copy)] == [
        ("steps", None), ("rate", None), ("switch", None), ("either", None),
    ]  # fmt: skip
    assert all(field.metadata["help"] for field in dataclasses.fields(copy))
    assert dataclasses.fields(copy)[0].type == int | None


def test_the_default_data_is_declared_once() -> None:
    assert Path(DEFAULT_TRAIN).parent.name == "multi30k" and Path(DEFAULT_TRAIN).is_absolute()
