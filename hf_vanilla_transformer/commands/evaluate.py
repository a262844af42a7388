"""Score a translation file with BLEU (Vaswani et al., 2017, Section 6.1), chrF and TER.

`--metrics` picks sacreBLEU's corpus metrics, as sacreBLEU's own `-m` does: BLEU and chrF by default, TER on
request (`--metrics bleu chrf ter`); each is printed with its sacreBLEU signature. BLEU is detokenized
sacreBLEU, or with `--tokenized` the paper-style tokenized BLEU with compound splitting (see
`hf_vanilla_transformer.evaluation.tokenized_bleu`); the two numbers are not comparable. `--lowercase`: BLEU
and chrF case-insensitive, for comparison with results reported on lowercased text (TER is case-insensitive
already, as in sacreBLEU). `--chrf-word-order 2`: chrF++.

    vanilla-transformer evaluate --hypotheses out.de --references newstest2014.de [--tokenized] \
        [--lowercase] [--metrics bleu chrf ter] [--chrf-word-order 2] [--json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from ..common.cli import ArgumentParser, input_lines, non_negative_int, run_command

if TYPE_CHECKING:
    from ..evaluation.metrics import BleuResult, MetricResult

METRICS = ("bleu", "chrf", "ter")
DEFAULT_METRICS = ["bleu", "chrf"]


def build_parser(prog: str | None = None) -> ArgumentParser:
    parser = ArgumentParser(prog=prog, description=__doc__)
    parser.add_argument("--hypotheses", type=Path, required=True, help="system output, one segment a line")
    parser.add_argument("--references", type=Path, required=True, help="reference, one segment a line")
    parser.add_argument(
        "--metrics",
        nargs="+",
        choices=METRICS,
        default=DEFAULT_METRICS,
        metavar="METRIC",
        help=f"sacreBLEU metrics to compute, from {', '.join(METRICS)} "
        f"(default: {' '.join(DEFAULT_METRICS)})",
    )
    parser.add_argument(
        "--tokenized", action="store_true", help="paper-style tokenized BLEU with ##AT## compound splitting"
    )
    parser.add_argument("--lowercase", action="store_true", help="case-insensitive BLEU and chrF")
    parser.add_argument(
        "--chrf-word-order",
        type=non_negative_int,
        default=None,
        metavar="N",
        help="word n-grams in chrF as well: 2 for chrF++ (default: 0, character n-grams only)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    return parser


def scores(args: argparse.Namespace, hypotheses: list[str], references: list[str]) -> dict[str, object]:
    """The score of every metric of `args.metrics`, by metric name, in the order given."""
    # Imported here, so that `--help` and argument errors answer without sacreBLEU and `evaluate`.
    from ..evaluation.metrics import corpus_bleu, corpus_chrf, corpus_ter, tokenized_bleu

    results: dict[str, BleuResult | MetricResult] = {}
    for metric in dict.fromkeys(args.metrics):
        if metric == "bleu":
            bleu = tokenized_bleu if args.tokenized else corpus_bleu
            results[metric] = bleu(hypotheses, references, lowercase=args.lowercase)
        elif metric == "chrf":
            word_order = args.chrf_word_order or 0
            results[metric] = corpus_chrf(
                hypotheses, references, word_order=word_order, lowercase=args.lowercase
            )
        else:
            results[metric] = corpus_ter(hypotheses, references)
    return results


def run(args: argparse.Namespace, parser: ArgumentParser) -> None:
    """Print the scores of `args.hypotheses` against `args.references`."""
    if args.tokenized and "bleu" not in args.metrics:
        parser.error("--tokenized applies to BLEU, which --metrics leaves out: add bleu to --metrics.")
    if args.chrf_word_order is not None and "chrf" not in args.metrics:
        parser.error("--chrf-word-order applies to chrF, which --metrics leaves out: add chrf to --metrics.")
    hypotheses = input_lines(str(args.hypotheses), "--hypotheses", parser)
    references = input_lines(str(args.references), "--references", parser)
    try:
        results = scores(args, hypotheses, references)
    except (OSError, ValueError, TypeError) as error:
        parser.error(str(error))

    if args.json:
        print(json.dumps({metric: result.to_dict() for metric, result in results.items()}))
    else:
        for result in results.values():
            print(result)
            print(f"signature: {result.signature}")


def main(argv: list[str] | None = None) -> int | None:
    """`vanilla-transformer evaluate ARGV`."""
    return run_command(run, build_parser(), argv)
