"""Translate text with a trained or published model, one sentence per line.

    echo "A dog runs in the park." | vanilla-transformer translate --model runs/demo/model
    vanilla-transformer translate --model org/name --input test.en --output test.hyp.de --device cuda
    vanilla-transformer translate --model runs/demo/ct2 --engine ctranslate2 --input test.en   # an export
    vanilla-transformer translate --model runs/demo/ct2 --device cuda --compute-type int8_float16 < test.en

Decoding follows the model's generation config (for this package's models, the paper's: beam 4, GNMT
length penalty 0.6, output up to input length + 50); the flags override it. Every input line gives one
output line; an empty input line gives an empty output line.
"""

import argparse
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import TextIO

import torch

from ..cli import (
    ArgumentParser,
    check_writable,
    finite_float,
    input_lines,
    non_negative_int,
    positive_int,
    refusals_in_one_line,
    run_command,
)
from ..engines import CTRANSLATE2_COMPUTE_TYPES, ENGINES, Engine, detect_engine, get_engine, load_translator
from ..translation import quantize_int8

STANDARD_STREAM = "-"
DEVICES = ("auto", "cpu", "cuda")


def _open(path: str, mode: str, stream: TextIO) -> nullcontext[TextIO] | TextIO:
    """The file at `path`, or the standard `stream` for "-", which is left open for the caller."""
    return nullcontext(stream) if path == STANDARD_STREAM else open(path, mode, encoding="utf-8")


def build_parser(prog: str | None = None) -> ArgumentParser:
    parser = ArgumentParser(prog=prog, description=__doc__)
    parser.add_argument("--model", required=True, help="model folder or Hub id")
    parser.add_argument("--input", default=STANDARD_STREAM, help="file to translate ('-': standard input)")
    parser.add_argument(
        "--output", default=STANDARD_STREAM, help="where to write translations ('-': standard output)"
    )
    parser.add_argument("--batch-size", type=positive_int, default=64, help="sentences per generate() call")
    parser.add_argument(
        "--num-beams", type=positive_int, help="beam size; 1 is greedy (default: the model's)"
    )
    parser.add_argument(
        "--length-penalty", type=finite_float, help="alpha of the length penalty (default: the model's)"
    )
    parser.add_argument(
        "--length-penalty-type",
        choices=("gnmt", "transformers"),
        help="gnmt: ((5 + |Y|) / 6)^alpha, transformers: |Y|^alpha (default: the model's)",
    )
    parser.add_argument(
        "--max-length-offset",
        type=non_negative_int,
        help="outputs at most this many tokens longer than their input (default: the model's)",
    )
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        help="torch, or the engine of a folder written by `vanilla-transformer export` (default: the "
        "folder's)",
    )
    parser.add_argument(
        "--device",
        choices=DEVICES,
        default="auto",
        help="where the model runs; auto: cuda when torch finds a GPU, else cpu (cpu for --int8 and the "
        "exported engines; a CTranslate2 export decodes on the GPU with cuda, an ONNX one on the CPU only)",
    )
    parser.add_argument(
        "--compute-type",
        choices=CTRANSLATE2_COMPUTE_TYPES,
        help="CTranslate2's compute type: float16, int8_float16 and bfloat16 on the GPU, int8 or float32 on "
        "the CPU, ... (default: the export's own weight type)",
    )
    parser.add_argument("--threads", type=positive_int, help="CPU threads (default: the engine's)")
    parser.add_argument(
        "--int8",
        action="store_true",
        help="int8 dynamic quantization (CPU): faster, slightly different output",
    )
    return parser


def _device(args: argparse.Namespace, engine: Engine, parser: ArgumentParser) -> torch.device:
    """The device the command translates on, or a one-line error for a device (or compute type) the engine
    cannot use. auto keeps the exported engines on the CPU."""
    if args.compute_type is not None and not engine.compute_types:
        parser.error(
            f"--compute-type sets CTranslate2's compute type, and the {engine.name} engine translates here: "
            "leave it out, or give a CTranslate2 export."
        )
    if args.device != "auto" and args.device not in engine.devices:
        parser.error(
            f"--device {args.device}: the {engine.name} engine runs on {engine.device_names()} here; leave "
            "--device out."
        )
    if args.device == "cuda" and args.int8:
        parser.error("--int8 quantizes for the CPU: leave out --device cuda, or --int8 to decode on the GPU.")
    if args.int8:
        return torch.device("cpu")
    with refusals_in_one_line(parser):
        return torch.device(engine.select_device(args.device, args.compute_type or "default"))


def run(args: argparse.Namespace, parser: ArgumentParser) -> None:
    """Translate `args.input` into `args.output`, line for line."""
    if args.output != STANDARD_STREAM and Path(args.output).is_dir():
        parser.error(f"--output {args.output} is a folder: give a file name for the translations.")
    if args.output != STANDARD_STREAM and not Path(args.output).resolve().parent.is_dir():
        parser.error(f"--output {args.output}: its folder does not exist; create it first.")
    if args.output != STANDARD_STREAM:
        check_writable(args.output, "--output", parser, kind="file")
    if (
        STANDARD_STREAM not in (args.input, args.output)
        and Path(args.output).resolve() == Path(args.input).resolve()
    ):
        parser.error(
            f"--output {args.output} is also --input: the translations would replace the text; "
            "give another file."
        )

    with refusals_in_one_line(parser):  # a damaged export info file, or one naming an unknown engine
        engine = get_engine(args.engine or detect_engine(args.model))
    if args.int8 and not engine.dynamic_int8:
        parser.error(
            "--int8 quantizes the PyTorch model; for CTranslate2 give --compute-type int8 (CPU) or "
            "int8_float16 (GPU), or export with --quantization int8."
        )
    device = _device(args, engine, parser)
    # Read before the model loads: input it cannot use is refused at once.
    lines = input_lines(args.input, "--input", parser, stdin=sys.stdin)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        translator = load_translator(
            args.model,
            engine.name,
            device=str(device),
            threads=args.threads or 0,
            compute_type=args.compute_type or "default",
        )
    except ValueError as error:
        parser.error(str(error))
    if args.int8:
        translator.model = quantize_int8(translator.model)
    overrides = {
        "num_beams": args.num_beams,
        "length_penalty": args.length_penalty,
        "length_penalty_type": args.length_penalty_type,
        "max_length_offset": args.max_length_offset,
    }
    overrides = {key: value for key, value in overrides.items() if value is not None}
    with refusals_in_one_line(parser):  # an input longer than an export's positions, say
        hypotheses = translator.translate(
            lines, batch_size=args.batch_size, progress=args.input != STANDARD_STREAM, **overrides
        )
    with _open(args.output, "w", sys.stdout) as target:
        target.writelines(h + "\n" for h in hypotheses)


def main(argv: list[str] | None = None) -> int | None:
    """`vanilla-transformer translate ARGV`."""
    return run_command(run, build_parser(), argv)
