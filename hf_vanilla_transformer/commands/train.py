"""Train the Transformer the way the paper did (Section 5), on anything from a laptop CPU to many GPUs.

    vanilla-transformer train --preset cpu-demo --output-dir runs/demo
    vanilla-transformer train --preset base --train wmt14 --dataset-config de-en \\
        --src-lang en --tgt-lang de --dev none --test none --output-dir runs/base
    accelerate launch --multi_gpu --num_processes 8 -m hf_vanilla_transformer train --preset base ...
    vanilla-transformer train --preset cpu-demo --output-dir runs/demo --resume   # go on after a crash

Data: `--train PREFIX` reads PREFIX.<src-lang> and PREFIX.<tgt-lang>; `--train FILE --train-target FILE`
reads two line-aligned files; a .tsv or .jsonl file, or a `datasets` name with --dataset-config, also work.
Without --train the run trains on the shipped Multi30k and evaluates on its val and test_2016_flickr sets.
"""

import argparse
import dataclasses
import math
import textwrap
import typing
from pathlib import Path
from typing import Any

from transformers.integrations.integration_utils import (
    INTEGRATION_TO_CALLBACK,
    get_available_reporting_integrations,
    is_flytekit_available,
)

from ..cli import (
    ArgumentParser,
    check_writable,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    probability,
    random_seed,
    refusals_in_one_line,
    run_command,
)
from ..configuration_vanilla_transformer import VanillaTransformerConfig
from ..presets import TRAINING_PRESETS, TrainingPreset
from ..training import SET_BY_THE_RUN, TrainingSettings, run_training

# The Multi30k copy of the repository (data/ is not part of the installed package), wherever the command is
# run from.
MULTI30K = Path(__file__).resolve().parents[2] / "data" / "multi30k"
DEFAULT_TRAIN = str(MULTI30K / "train")
# The Multi30k evaluation sets, used when the run trains on the shipped Multi30k.
DEFAULT_EVALUATION = {"dev": str(MULTI30K / "val"), "test": str(MULTI30K / "test_2016_flickr")}
NONE = "none"

# Settings that hold a word (the config checks which words); the others take numbers, true/false or null.
WORD_FIELDS = {field.name for field in dataclasses.fields(VanillaTransformerConfig) if field.type is str}
WORD_FIELDS.add("attn_implementation")
NULLABLE_FIELDS = {
    field.name
    for field in dataclasses.fields(VanillaTransformerConfig)
    if type(None) in typing.get_args(field.type)
}
LITERALS = {"true": True, "True": True, "false": False, "False": False, "null": None, "None": None}
# What --report-to takes: transformers' experiment trackers, "all" (every one installed) or "none".
REPORT_TO = ("none", "all", *sorted(INTEGRATION_TO_CALLBACK))


def override_value(key: str, text: str) -> Any:
    """The value of `--model-override KEY=TEXT`: TEXT as is for a word setting (activation_function,
    position_embedding_type, sinusoidal_layout, attn_implementation), else an int, a finite float,
    true/false or null."""
    if key in WORD_FIELDS:
        return text
    if text in LITERALS:
        if LITERALS[text] is None and key not in NULLABLE_FIELDS:
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


def preset_summary(name: str, preset: TrainingPreset) -> str:
    """One preset as the model it builds and the flags it sets, for --help."""
    model = " ".join(f"{key}={value}" for key, value in preset.model_overrides.items())
    words = [f"model {preset.model_preset}" + (f" with {model}" if model else "") + ";"]
    for field in dataclasses.fields(preset):
        value = getattr(preset, field.name)
        flag = f"--{field.name.replace('_', '-')}"
        if field.name == "bf16" and value:
            # A preset's bf16 applies only where bf16 is native; an explicit --bf16 applies everywhere.
            words.append("--bf16 (where the CPU or GPU computes bf16 natively)")
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


def evaluation_set(given: str | None, split: str, train: str) -> str | None:
    """The dev or test set: the one given ('none': none), else Multi30k's when training on Multi30k."""
    if given is None:
        return DEFAULT_EVALUATION[split] if train == DEFAULT_TRAIN else None
    return None if given.lower() == NONE else given


def installed_trackers() -> set[str]:
    """The experiment trackers of `REPORT_TO` whose packages are installed."""
    # transformers' list of installed integrations leaves flyte out.
    return {*get_available_reporting_integrations(), *(["flyte"] if is_flytekit_available() else [])}


def build_parser(prog: str | None = None) -> ArgumentParser:
    parser = ArgumentParser(prog=prog, description=__doc__, epilog=presets_help())
    parser.add_argument("--output-dir", required=True, help="run folder: checkpoints, tokenizer, final model")
    parser.add_argument("--preset", default="cpu", choices=sorted(TRAINING_PRESETS), help="training recipe")
    data = parser.add_argument_group("data")
    data.add_argument("--train", default=DEFAULT_TRAIN, help="training data: prefix, file or `datasets` name")
    data.add_argument("--train-target", help="target-side file when --train is the source file")
    data.add_argument(
        "--dev",
        help="dev set, like --train; 'none' to skip (default: Multi30k val when --train is the default)",
    )
    data.add_argument("--dev-target", help="target-side file when --dev is the source file")
    data.add_argument(
        "--test",
        help="test set, like --train; 'none' to skip (default: Multi30k test_2016_flickr when --train is "
        "the default)",
    )
    data.add_argument("--test-target", help="target-side file when --test is the source file")
    data.add_argument("--src-lang", default="en", help="source language code: file suffix or `datasets` key")
    data.add_argument("--tgt-lang", default="de", help="target language code: file suffix or `datasets` key")
    data.add_argument("--dataset-config", help="config of a `datasets` name, e.g. de-en for wmt14")
    data.add_argument("--train-split", default="train", help="split of a `datasets` name")
    data.add_argument("--dev-split", default="validation", help="dev split of a `datasets` name")
    data.add_argument("--test-split", default="test", help="test split of a `datasets` name")
    data.add_argument(
        "--max-length", type=positive_int, help="longest pair side in tokens (default: the preset's)"
    )
    data.add_argument(
        "--long-pairs", choices=("filter", "truncate"), default="filter", help="what happens to longer pairs"
    )
    model = parser.add_argument_group("model and vocabulary")
    model.add_argument("--init-from", help="fine-tune this model folder or Hub id (and its tokenizer)")
    model.add_argument("--tokenizer", help="use this tokenizer instead of training one")
    model.add_argument(
        "--vocab-size", type=positive_int, help="size of the BPE vocabulary to train (default: the preset's)"
    )
    model.add_argument(
        "--model-override",
        action="extend",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="config field or paper symbol, e.g. N=4, d_model=256, P_drop=0.3, "
        "position_embedding_type=learned; several may follow one flag, or repeat the flag",
    )
    training = parser.add_argument_group("training (default: the preset's)")
    training.add_argument("--max-steps", type=positive_int, help="optimizer updates at most")
    training.add_argument("--max-minutes", type=positive_float, help="stop after this much training time")
    training.add_argument(
        "--max-tokens", type=positive_int, help="source/target tokens at most, per device and micro-batch"
    )
    training.add_argument(
        "--tokens-per-step", type=positive_int, help="source/target tokens per optimizer step, all devices"
    )
    training.add_argument("--warmup-steps", type=positive_int, help="warm-up of the learning rate (Eq. 3)")
    training.add_argument("--lr-scale", type=positive_float, help="factor on the learning rate of Eq. 3")
    training.add_argument(
        "--weight-decay",
        type=non_negative_float,
        help="decoupled weight decay on the weight matrices (AdamW); 0: the paper's Adam",
    )
    training.add_argument(
        "--subword-dropout",
        type=probability,
        help="BPE-dropout (Provilkov et al., 2020): resegment the training pairs each epoch, dropping each "
        "merge with this probability; 0: the paper's deterministic BPE",
    )
    training.add_argument(
        "--cooldown-steps",
        type=non_negative_int,
        help="take the learning rate of the last this many updates linearly towards 0 (not reached if "
        "--max-minutes stops the run first); 0: the paper's Eq. 3 to the end",
    )
    training.add_argument("--save-steps", type=positive_int, help="updates between checkpoints")
    training.add_argument("--keep-checkpoints", type=positive_int, help="checkpoints kept on disk")
    training.add_argument(
        "--average-checkpoints", type=positive_int, help="average the last K checkpoints (1: none)"
    )
    training.add_argument("--eval-steps", type=positive_int, help="updates between dev loss evaluations")
    training.add_argument(
        "--seed", type=random_seed, default=1, help="seed of the initialisation and data order"
    )
    training.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    training.add_argument(
        "--bf16", action=argparse.BooleanOptionalAction, help="bf16 autocast; --no-bf16: float32 throughout"
    )
    training.add_argument(
        "--dataloader-workers",
        type=non_negative_int,
        help="data-loading processes per device (default: 2 on a GPU, 0 on a CPU)",
    )
    training.add_argument(
        "--report-to",
        choices=REPORT_TO,
        default="none",
        metavar="TRACKER",
        help=f"log losses and learning rates to this experiment tracker: {', '.join(REPORT_TO)}; all: "
        "every one installed",
    )
    evaluation = parser.add_argument_group("evaluation")
    evaluation.add_argument(
        "--num-beams",
        type=positive_int,
        default=4,
        help="beam size of the BLEU runs, and of the final model's generation config where above 1",
    )
    evaluation.add_argument(
        "--eval-batch-size", type=positive_int, default=64, help="sentences per batch in evaluation"
    )
    evaluation.add_argument(
        "--eval-bleu",
        action="store_true",
        help="dev BLEU (beam search, sacreBLEU) at every dev evaluation during training, not only at the end",
    )
    evaluation.add_argument(
        "--tune-length-penalty",
        action=argparse.BooleanOptionalAction,
        help="choose the final model's length penalty on the dev set (Section 6.1) and save it in its "
        "generation config; --no-tune-length-penalty: keep the paper's 0.6 (default: the preset's)",
    )
    evaluation.add_argument(
        "--max-eval-sentences",
        type=positive_int,
        help="translate only the first N dev and test sentences (the length penalty is then chosen on those)",
    )
    return parser


def _check_data_flags(args: argparse.Namespace, parser: ArgumentParser) -> None:
    """One-line errors for data and vocabulary flags that the run would otherwise ignore or misread."""
    for split in ("train", "dev", "test"):
        source, target = getattr(args, split), getattr(args, f"{split}_target")
        if target is not None and (source is None or source == DEFAULT_TRAIN or source.lower() == NONE):
            parser.error(
                f"--{split}-target names the target side of --{split}: give --{split} SOURCE_FILE too."
            )
    if args.src_lang == args.tgt_lang and args.train_target is None:
        parser.error(
            f"--src-lang and --tgt-lang are both {args.src_lang}: give the two languages of the pairs (for "
            "a monolingual task, give --train and --train-target as two files)."
        )
    given = {"--init-from": args.init_from, "--tokenizer": args.tokenizer}
    vocabulary_from = next((flag for flag, value in given.items() if value is not None), None)
    if args.vocab_size is not None and vocabulary_from is not None:
        parser.error(
            f"--vocab-size sizes a new vocabulary, but {vocabulary_from} brings its own: leave one of them "
            "out."
        )


def training_settings(args: argparse.Namespace, parser: ArgumentParser) -> TrainingSettings:
    """The run that parsed `args` ask for, or a one-line error for settings no run could use."""
    if args.train == DEFAULT_TRAIN and not MULTI30K.is_dir():
        parser.error(
            f"--train: the default, the repository's Multi30k, is not at {MULTI30K} (an installed package "
            "has no data/ folder); give --train, or run from a checkout."
        )
    if args.report_to not in ("none", "all") and args.report_to not in installed_trackers():
        parser.error(
            f"--report-to {args.report_to}: its package is not installed; install it (e.g. pip install "
            f"{args.report_to.replace('_', '-')}), or pick another tracker."
        )
    try:
        overrides = parse_overrides(args.model_override)
        preset = TRAINING_PRESETS[args.preset]
        VanillaTransformerConfig.from_preset(preset.model_preset, **{**preset.model_overrides, **overrides})
    except (ValueError, TypeError) as error:
        parser.error(f"--model-override: {error}")
    if overrides and args.init_from is not None:
        parser.error("--model-override cannot change the model of --init-from; leave it out to fine-tune.")
    _check_data_flags(args, parser)
    check_writable(args.output_dir, "--output-dir", parser)
    values = {key: value for key, value in vars(args).items() if key != "model_override"}
    values |= {split: evaluation_set(values[split], split, args.train) for split in DEFAULT_EVALUATION}
    return TrainingSettings(**values, model_overrides=overrides)


def parse_args(argv: list[str] | None = None) -> TrainingSettings:
    """The run that `vanilla-transformer train ARGV` asks for."""
    parser = build_parser()
    return training_settings(parser.parse_args(argv), parser)


def run(args: argparse.Namespace, parser: ArgumentParser) -> None:
    """Train, average and evaluate as `args` say; what the run refuses (a folder of checkpoints without
    --resume, a resume with another recipe, missing or mismatched data) is reported in one line."""
    settings = training_settings(args, parser)
    with refusals_in_one_line(parser):
        run_training(settings)


def main(argv: list[str] | None = None) -> int | None:
    """`vanilla-transformer train ARGV`."""
    return run_command(run, build_parser(), argv)
