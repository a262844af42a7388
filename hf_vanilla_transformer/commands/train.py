"""Train the Transformer the way the paper did (Section 5), on anything from a laptop CPU to many GPUs.

    vanilla-transformer train --preset cpu-demo --output-dir runs/demo
    vanilla-transformer train --preset base --train wmt14 --dataset-config de-en \\
        --src-lang en --tgt-lang de --dev none --test none --output-dir runs/base
    accelerate launch --multi_gpu --num_processes 8 -m hf_vanilla_transformer train --preset base ...
    vanilla-transformer train --preset cpu-demo --output-dir runs/demo --resume   # go on after a crash

Data: `--train PREFIX` reads PREFIX.<src-lang> and PREFIX.<tgt-lang>; `--train FILE --train-target FILE`
reads two line-aligned files; a .tsv or .jsonl file, or a `datasets` name with --dataset-config, also work.
Without --train the run trains on the shipped Multi30k and evaluates on its val and test_2016_flickr sets.
`--synthetic-source FILE --synthetic-target FILE` adds back-translated pairs to the training set, their
sources tagged <BT> (docs/backtranslation.md).
"""

import argparse
import dataclasses
import math
import textwrap
import typing
from typing import Any

from ..common.cli import ArgumentParser, check_writable, refusals_in_one_line, run_command
from ..common.settings_schema import add_arguments, flag_name, schema_values
from ..training.presets import DATA, EVALUATION, MODEL, TRAINING, TRAINING_PRESETS, TrainingPreset
from ..training.settings import SET_BY_THE_RUN, TrainingSettings

__all__ = ["build_parser", "main", "parse_args", "run"]

LITERALS = {"true": True, "True": True, "false": False, "False": False, "null": None, "None": None}


def override_value(key: str, text: str) -> Any:
    """The value of `--model-override KEY=TEXT`: TEXT as is for a word setting (activation_function,
    position_embedding_type, sinusoidal_layout, attn_implementation), else an int, a finite float,
    true/false or null."""
    # The config is imported here, not with the module, so that `--help` answers without torch.
    from .. import VanillaTransformerConfig

    fields = dataclasses.fields(VanillaTransformerConfig)
    # Settings that hold a word (the config checks which words); the others take numbers, true/false or null.
    if key == "attn_implementation" or key in {field.name for field in fields if field.type is str}:
        return text
    if text in LITERALS:
        nullable = {field.name for field in fields if type(None) in typing.get_args(field.type)}
        if LITERALS[text] is None and key not in nullable:
            raise ValueError(f"{key}={text}: {key} takes a value, not null")
        return LITERALS[text]
    for kind in (int, float):
        try:
            value = kind(text)
        except ValueError:
            continue
        if math.isfinite(value):
            return value
    raise ValueError(f"{key}={text}: the value must be an integer, a number, true/false or null")


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`--model-override KEY=VALUE` items as a dict; ValueError names the first malformed one."""
    overrides = {}
    for item in items:
        key, separator, text = item.partition("=")
        if not separator or not key:
            raise ValueError(f"{item!r} is not KEY=VALUE, e.g. N=4 or P_drop=0.3")
        if key in SET_BY_THE_RUN:
            raise ValueError(f"{key} is set by the run: use {SET_BY_THE_RUN[key]}")
        overrides[key] = override_value(key, text)
    return overrides


# A preset's switches that apply only where they were measured to pay (`trainer.mixed_precision`); the same
# flag given on the command line applies everywhere.
_APPLIES_WHERE_IT_PAYS = {"bf16": "where the CPU or GPU computes bf16 natively"}


def preset_summary(name: str, preset: TrainingPreset) -> str:
    """One preset as the model it builds and the flags it sets, for --help."""
    model = " ".join(f"{key}={value}" for key, value in preset.model_overrides.items())
    words = [f"model {preset.model_preset}" + (f" with {model}" if model else "") + ";"]
    for field in dataclasses.fields(preset):
        value = getattr(preset, field.name)
        flag = flag_name(field)
        if field.name in _APPLIES_WHERE_IT_PAYS and value:
            words.append(f"{flag} ({_APPLIES_WHERE_IT_PAYS[field.name]})")
        elif isinstance(value, bool):
            words.append(flag if value else f"--no-{flag[2:]}")
        elif field.name not in ("model_preset", "model_overrides") and value is not None:
            words.append(f"{flag} {value}")
    # Lines break between flags, never within one or between a flag and its value (those spaces wait as NULs).
    text = " ".join(word.replace(" ", "\0") for word in words)
    indents = {"initial_indent": f"  {name:<9} ", "subsequent_indent": " " * 12}
    wrapped = textwrap.fill(text, width=100, break_on_hyphens=False, break_long_words=False, **indents)
    return wrapped.replace("\0", " ")


def presets_help() -> str:
    lines = ["presets (each sets the flags shown; a flag given on the command line wins):"]
    lines += [preset_summary(name, preset) for name, preset in sorted(TRAINING_PRESETS.items())]
    return "\n".join(lines)


def build_parser(prog: str | None = None) -> ArgumentParser:
    """The `train` command's parser: one flag for every field of `TrainingSettings` (`settings_schema`)."""
    parser = ArgumentParser(prog=prog, description=__doc__, epilog=presets_help())
    add_arguments(parser, TrainingSettings, groups=(DATA, MODEL, TRAINING, EVALUATION))
    return parser


def training_settings(args: argparse.Namespace, parser: ArgumentParser) -> TrainingSettings:
    """The run that parsed `args` ask for; settings no run could use (`TrainingSettings` checks them) are a
    one-line error."""
    try:
        overrides = parse_overrides(args.model_overrides)
    except ValueError as error:
        parser.error(f"--model-override: {error}")
    check_writable(args.output_dir, "--output-dir", parser)
    with refusals_in_one_line(parser):
        return TrainingSettings(**{**schema_values(TrainingSettings, args), "model_overrides": overrides})


def parse_args(argv: list[str] | None = None) -> TrainingSettings:
    """The run that `vanilla-transformer train ARGV` asks for."""
    parser = build_parser()
    return training_settings(parser.parse_args(argv), parser)


def run(args: argparse.Namespace, parser: ArgumentParser) -> None:
    """Train, average and evaluate as `args` say; what the run refuses (a folder of checkpoints without
    --resume, a resume with another recipe, missing or mismatched data) is reported in one line."""
    from ..training.pipeline import run_training

    settings = training_settings(args, parser)
    with refusals_in_one_line(parser):
        run_training(settings)


def main(argv: list[str] | None = None) -> int | None:
    """`vanilla-transformer train ARGV`."""
    return run_command(run, build_parser(), argv)
