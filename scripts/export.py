"""Export a trained model for CTranslate2 or ONNX Runtime.

    python scripts/export.py --model runs/demo/model --to ctranslate2 --out exports/demo-ct2
    python scripts/export.py --model runs/demo/model --to ctranslate2 --quantization int8 --out exports/int8
    python scripts/export.py --model org/name --to onnx --out exports/name-onnx

The folder holds the model in the engine's format, its tokenizer(s) and its decoding settings (for this
package's models, the paper's: beam 4, GNMT length penalty 0.6, output up to input length + 50).
Translate with it through `hf_vanilla_transformer.engines.load_translator(OUT)`; docs/export.md says what
each engine reproduces of the PyTorch model's decoding.
"""

import hf_vanilla_transformer  # noqa: F401  (registers the model with the Auto classes)
from hf_vanilla_transformer.cli import ArgumentParser
from hf_vanilla_transformer.export import CTRANSLATE2_QUANTIZATIONS, EXPORT_TARGETS, ExportError, export


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True, help="model folder (save_pretrained) or Hub id")
    parser.add_argument("--to", required=True, choices=EXPORT_TARGETS, help="the engine to export for")
    parser.add_argument("--out", required=True, help="the folder to write")
    parser.add_argument(
        "--quantization",
        choices=CTRANSLATE2_QUANTIZATIONS,
        help="CTranslate2 weight type (default: float32)",
    )
    parser.add_argument("--force", action="store_true", help="replace --out if it exists and is not empty")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        out = export(args.model, args.to, args.out, quantization=args.quantization, force=args.force)
    except ExportError as error:
        parser.error(str(error))
    print(f"Exported {args.model} for {args.to} to {out}")


if __name__ == "__main__":
    main()
