"""Export a trained model for CTranslate2 or ONNX Runtime.

    vanilla-transformer export --model runs/demo/model --to ctranslate2 --out exports/demo-ct2
    vanilla-transformer export --model runs/demo/model --to ctranslate2 --quantization int8 --out exports/int8
    vanilla-transformer export --model org/name --to onnx --out exports/name-onnx
    vanilla-transformer export --model runs/demo/model --to ctranslate2 --out exports/demo-shortlist \\
        --shortlist-from data/multi30k/train [--src-lang en --tgt-lang de] [--shortlist-size 100]

The folder holds the model in the engine's format, its tokenizer(s) and the model's own decoding settings
(for this package's models, the paper's: beam 4, GNMT length penalty, output up to input length + 50, with
the alpha chosen on the dev set where one was).
`vanilla-transformer translate --model OUT` translates with it, as does
`hf_vanilla_transformer.inference.load_translator(OUT)`; docs/export.md says what each engine reproduces of
the PyTorch model's decoding.
"""

import argparse

from ..common.cli import ArgumentParser, check_writable, positive_int, run_command
from ..inference.engines.names import CTRANSLATE2_QUANTIZATIONS, DEFAULT_SHORTLIST_SIZE, EXPORT_TARGETS


def build_parser(prog: str | None = None) -> ArgumentParser:
    parser = ArgumentParser(prog=prog, description=__doc__)
    parser.add_argument("--model", required=True, help="model folder (save_pretrained) or Hub id")
    parser.add_argument("--to", required=True, choices=EXPORT_TARGETS, help="the engine to export for")
    parser.add_argument("--out", required=True, help="the folder to write")
    parser.add_argument(
        "--quantization",
        choices=CTRANSLATE2_QUANTIZATIONS,
        help="CTranslate2 weight type (default: float32)",
    )
    parser.add_argument("--force", action="store_true", help="replace --out if it holds an earlier export")
    shortlist = parser.add_argument_group("vocabulary shortlist (CTranslate2; docs/export.md)")
    shortlist.add_argument(
        "--shortlist-from",
        metavar="PREFIX",
        help="build a shortlist from PREFIX.<src-lang> and PREFIX.<tgt-lang> (the training data), used "
        "when translating",
    )
    shortlist.add_argument(
        "--shortlist-size",
        type=positive_int,
        help=f"target tokens per source token (default: {DEFAULT_SHORTLIST_SIZE})",
    )
    shortlist.add_argument("--src-lang", default="en", help="source file suffix for --shortlist-from")
    shortlist.add_argument("--tgt-lang", default="de", help="target file suffix for --shortlist-from")
    return parser


def run(args: argparse.Namespace, parser: ArgumentParser) -> None:
    """Export `args.model` for `args.to` into `args.out`."""
    shortlist_from = None
    if args.shortlist_from is not None:
        shortlist_from = tuple(f"{args.shortlist_from}.{lang}" for lang in (args.src_lang, args.tgt_lang))
    elif args.shortlist_size is not None:
        parser.error("--shortlist-size sizes a shortlist: give --shortlist-from PREFIX to build one.")
    check_writable(args.out, "--out", parser)
    from ..inference.engines.export_common import ExportError
    from ..inference.engines.exporting import export

    try:
        out = export(
            args.model,
            args.to,
            args.out,
            quantization=args.quantization,
            force=args.force,
            shortlist_from=shortlist_from,
            shortlist_size=args.shortlist_size or DEFAULT_SHORTLIST_SIZE,
        )
    except ExportError as error:
        parser.error(str(error))
    print(f"Exported {args.model} for {args.to} to {out}")


def main(argv: list[str] | None = None) -> int | None:
    """`vanilla-transformer export ARGV`."""
    return run_command(run, build_parser(), argv)
