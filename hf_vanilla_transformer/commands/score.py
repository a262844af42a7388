"""Score given translations: the log-probability the model gives each target line as the translation of
the source line beside it (forced decoding, the end token included), on torch, CTranslate2 or ONNX Runtime.

    vanilla-transformer score --model runs/demo/model --source test.en --target test.hyp.de
    vanilla-transformer score --model runs/demo/ct2 --source test.en --target test.de --output-format jsonl

Text output: one line a pair, its total log-probability (natural log) and its mean per target token, `</s>`
counted, separated by a tab. jsonl: one JSON object a pair, with `log_prob`, `tokens` (the target's subword
tokens, `</s>` last) and `per_token` (the log-probability of each). Refused in one line: files of different
line counts, text that is not UTF-8, a blank source or target line, and a pair longer than the model's
positions.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from ..common.cli import (
    STANDARD_STREAM,
    ArgumentParser,
    check_writable,
    input_lines,
    positive_int,
    refusals_in_one_line,
    run_command,
)
from .engine_options import add_engine_arguments, command_engine, load_command_translator

if TYPE_CHECKING:
    from ..inference.scoring import PairScore

SCORE_FORMATS = ("text", "jsonl")


def build_parser(prog: str | None = None) -> ArgumentParser:
    parser = ArgumentParser(prog=prog, description=__doc__)
    parser.add_argument("--model", required=True, help="model folder, Hub id or exported folder")
    parser.add_argument("--source", required=True, help="source sentences, one a line")
    parser.add_argument("--target", required=True, help="their translations, line for line with --source")
    parser.add_argument(
        "--output", default=STANDARD_STREAM, help="where to write the scores ('-': standard output)"
    )
    parser.add_argument(
        "--output-format",
        choices=SCORE_FORMATS,
        default="text",
        help="text: total and mean log-probability, tab-separated; jsonl: log_prob, tokens and per_token",
    )
    parser.add_argument("--batch-size", type=positive_int, default=64, help="pairs scored at a time")
    add_engine_arguments(parser, "scores")
    return parser


def _format(score: PairScore, output_format: str) -> str:
    if output_format == "jsonl":
        return json.dumps(score.to_dict(), ensure_ascii=False)
    return f"{score.log_prob:.6f}\t{score.mean:.6f}"


def run(args: argparse.Namespace, parser: ArgumentParser) -> None:
    """Write the score of every (`args.source`, `args.target`) line pair to `args.output`."""
    # Imported where scoring runs, so that `--help` and argument errors answer without torch.
    from ..inference.scoring import check_pairs, score_pairs

    if args.output != STANDARD_STREAM:
        if Path(args.output).is_dir():
            parser.error(f"--output {args.output} is a folder: give a file name for the scores.")
        if not Path(args.output).resolve().parent.is_dir():
            parser.error(f"--output {args.output}: its folder does not exist; create it first.")
        check_writable(args.output, "--output", parser, kind="file")
        for flag, path in (("--source", args.source), ("--target", args.target)):
            if Path(args.output).resolve() == Path(path).resolve():
                parser.error(
                    f"--output {args.output} is also {flag}: the scores would replace it; give another file."
                )
    sources = input_lines(args.source, "--source", parser)
    targets = input_lines(args.target, "--target", parser)
    if len(sources) != len(targets):
        parser.error(
            f"--source {args.source} has {len(sources)} lines but --target {args.target} has {len(targets)}: "
            "give line-aligned files, one pair a line."
        )
    with refusals_in_one_line(parser):  # a blank line, refused before the model loads
        check_pairs(sources, targets)

    translator = load_command_translator(args, parser, command_engine(args, parser))
    with refusals_in_one_line(parser):  # a pair longer than the model's positions
        scores = score_pairs(
            translator.model,
            translator.tokenizer,
            sources,
            targets,
            target_tokenizer=translator.target_tokenizer,
            batch_size=args.batch_size,
            progress=True,
        )
    with (
        nullcontext(sys.stdout)
        if args.output == STANDARD_STREAM
        else open(args.output, "w", encoding="utf-8") as out
    ):
        out.writelines(_format(score, args.output_format) + "\n" for score in scores)


def main(argv: list[str] | None = None) -> int | None:
    """`vanilla-transformer score ARGV`."""
    return run_command(run, build_parser(), argv)
