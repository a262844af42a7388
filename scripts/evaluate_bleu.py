#!/usr/bin/env python
"""Score a translation file with BLEU (Vaswani et al., 2017, Section 6.1).

Default: detokenized sacreBLEU. `--tokenized`: the paper-style tokenized BLEU with compound splitting
(see `hf_vanilla_transformer.evaluation.tokenized_bleu`); the two numbers are not comparable.

    python scripts/evaluate_bleu.py --hypotheses out.de --references newstest2014.de [--tokenized] [--json]
"""

from __future__ import annotations

import json
from pathlib import Path

from hf_vanilla_transformer.cli import ArgumentParser
from hf_vanilla_transformer.evaluation import corpus_bleu, tokenized_bleu


def _read_lines(path: Path) -> list[str]:
    # Only "\n" ends a line: splitlines() would also split at U+2028 and U+0085, which occur inside WMT
    # sentences. The final newline does not start another segment.
    lines = path.read_text(encoding="utf-8").split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("--hypotheses", type=Path, required=True, help="system output, one segment a line")
    parser.add_argument("--references", type=Path, required=True, help="reference, one segment a line")
    parser.add_argument(
        "--tokenized", action="store_true", help="paper-style tokenized BLEU with ##AT## compound splitting"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)

    try:
        hypotheses, references = _read_lines(args.hypotheses), _read_lines(args.references)
        score = tokenized_bleu if args.tokenized else corpus_bleu
        result = score(hypotheses, references)
    except (OSError, ValueError, TypeError) as error:
        parser.error(str(error))

    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        print(result)
        print(f"signature: {result.signature}")


if __name__ == "__main__":
    main()
