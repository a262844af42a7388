"""Translate text with a trained or published model, one sentence per line.

    echo "A dog runs in the park." | python scripts/translate.py --model runs/demo/model
    python scripts/translate.py --model org/name --input test.en --output test.hyp.de

Decoding follows the model's generation config (for this package's models, the paper's: beam 4, GNMT
length penalty 0.6, output up to input length + 50); the flags override it.
"""

import argparse
import sys

import torch
from transformers import AutoModelForSeq2SeqLM

import hf_vanilla_transformer  # noqa: F401  (registers the model with the Auto classes)
from hf_vanilla_transformer.translation import load_tokenizers, quantize_int8, translate


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="model folder or Hub id")
    parser.add_argument("--input", default="-", help="file to translate ('-': standard input)")
    parser.add_argument("--output", default="-", help="where to write translations ('-': standard output)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-beams", type=int, default=None)
    parser.add_argument("--length-penalty", type=float, default=None, help="alpha")
    parser.add_argument(
        "--length-penalty-type", choices=("gnmt", "transformers"), default=None, help="((5+|Y|)/6)^a or |Y|^a"
    )
    parser.add_argument("--max-length-offset", type=int, default=None, help="output length <= input + this")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    parser.add_argument(
        "--int8",
        action="store_true",
        help="int8 dynamic quantization (CPU): faster, slightly different output",
    )
    args = parser.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model)
    tokenizer, target_tokenizer = load_tokenizers(args.model)
    if args.int8:
        model = quantize_int8(model)
    source = sys.stdin if args.input == "-" else open(args.input, encoding="utf-8")
    with source:
        lines = source.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    overrides = {
        "num_beams": args.num_beams,
        "length_penalty": args.length_penalty,
        "length_penalty_type": args.length_penalty_type,
        "max_length_offset": args.max_length_offset,
    }
    overrides = {key: value for key, value in overrides.items() if value is not None}
    hypotheses = translate(
        model,
        tokenizer,
        lines,
        target_tokenizer=target_tokenizer,
        batch_size=args.batch_size,
        progress=args.input != "-",
        **overrides,
    )
    target = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8")
    with target:
        target.writelines(h + "\n" for h in hypotheses)


if __name__ == "__main__":
    main()
