"""Score a translation file with BLEU (Vaswani et al., 2017, Section 6.1).

Default: detokenized sacreBLEU. `--tokenized`: the paper-style tokenized BLEU with compound splitting
(see `hf_vanilla_transformer.evaluation.tokenized_bleu`); the two numbers are not comparable.
`--lowercase`: either score case-insensitive, for comparison with results reported on lowercased text.

    vanilla-transformer evaluate --hypotheses out.de --references newstest2014.de [--tokenized] \
        [--lowercase] [--json]
"""

import argparse
import json
from pathlib import Path

from ..cli import ArgumentParser, input_lines, run_command
from ..evaluation import corpus_bleu, tokenized_bleu


def build_parser(prog: str | None = None) -> ArgumentParser:
    parser = ArgumentParser(prog=prog, description=__doc__)
    parser.add_argument("--hypotheses", type=Path, required=True, help="system output, one segment a line")
    parser.add_argument("--references", type=Path, required=True, help="reference, one segment a line")
    parser.add_argument(
        "--tokenized", action="store_true", help="paper-style tokenized BLEU with ##AT## compound splitting"
    )
    parser.add_argument("--lowercase", action="store_true", help="case-insensitive BLEU")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    return parser


def run(args: argparse.Namespace, parser: ArgumentParser) -> None:
    """Print the BLEU score of `args.hypotheses` against `args.references`."""
    hypotheses = input_lines(str(args.hypotheses), "--hypotheses", parser)
    references = input_lines(str(args.references), "--references", parser)
    try:
        score = tokenized_bleu if args.tokenized else corpus_bleu
        result = score(hypotheses, references, lowercase=args.lowercase)
    except (OSError, ValueError, TypeError) as error:
        parser.error(str(error))

    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        print(result)
        print(f"signature: {result.signature}")


def main(argv: list[str] | None = None) -> int | None:
    """`vanilla-transformer evaluate ARGV`."""
    return run_command(run, build_parser(), argv)
