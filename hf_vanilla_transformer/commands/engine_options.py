"""The options of the commands that run a model (translate, score, serve): `--engine` and `--device`, and
for those that decode, the engine's `--compute-type`, `--threads` and `--int8`; the engine, device and
translator they ask for, or a one-line error saying why it cannot be had, before any input is read.

The options are built from names alone (`inference.engines.names`); torch and the engines are imported when a
command runs, so that `--help` answers at once."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..common.cli import ArgumentParser, positive_int, refusals_in_one_line
from ..inference.engines.names import CTRANSLATE2_COMPUTE_TYPES, ENGINES

if TYPE_CHECKING:
    import torch

    from ..inference.engines.base import Engine
    from ..inference.translator import Translator

DEVICES = ("auto", "cpu", "cuda")


def add_engine_arguments(parser: ArgumentParser, verb: str, runtime: bool = False) -> None:
    """`--engine` and `--device`, as the commands that run a model (translate, score, serve) take them,
    and with `runtime` the engine's `--compute-type`, `--threads` and `--int8`; `verb` says what the model
    does there ("decodes")."""
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
        help="where the model runs; auto: cuda when torch finds a GPU, else cpu (the exported engines and "
        f"--int8: cpu; a CTranslate2 export {verb} on the GPU with cuda, an ONNX one on the CPU only)",
    )
    if not runtime:
        return
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


def command_engine(args: argparse.Namespace, parser: ArgumentParser) -> Engine:
    """The engine of a command's `--model` and `--engine`, once the device and settings asked for are
    checked against it (`command_device`): a one-line error otherwise, before any input is read."""
    from ..inference.engines.base import detect_engine
    from ..inference.engines.registry import get_engine

    with refusals_in_one_line(parser):  # a damaged export info file, or one naming an unknown engine
        engine = get_engine(args.engine or detect_engine(args.model))
    command_device(args, engine, parser)
    return engine


def load_command_translator(args: argparse.Namespace, parser: ArgumentParser, engine: Engine) -> Translator:
    """The translator on `engine` that a command's `--model`, `--device` (and where it has them
    `--compute-type`, `--threads`, `--int8`) ask for, or a one-line error saying why it cannot be had."""
    import torch

    from ..inference.translation import quantize_int8
    from ..inference.translator import load_translator

    device = command_device(args, engine, parser)
    threads = getattr(args, "threads", None)
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        translator = load_translator(
            args.model,
            engine.name,
            device=str(device),
            threads=threads or 0,
            compute_type=getattr(args, "compute_type", None) or "default",
        )
    except ValueError as error:
        parser.error(str(error))
    if getattr(args, "int8", False):
        translator.model = quantize_int8(translator.model)
    return translator


def command_device(args: argparse.Namespace, engine: Engine, parser: ArgumentParser) -> torch.device:
    """The device the command translates on, or a one-line error for a device (or compute type) the engine
    cannot use. auto keeps the exported engines on the CPU."""
    import torch

    compute_type = getattr(args, "compute_type", None)
    int8 = getattr(args, "int8", False)
    if int8 and not engine.dynamic_int8:
        parser.error(
            "--int8 quantizes the PyTorch model; for CTranslate2 give --compute-type int8 (CPU) or "
            "int8_float16 (GPU), or export with --quantization int8."
        )
    if compute_type is not None and not engine.compute_types:
        parser.error(
            f"--compute-type sets CTranslate2's compute type, and the {engine.name} engine translates here: "
            "leave it out, or give a CTranslate2 export."
        )
    if args.device != "auto" and args.device not in engine.devices:
        parser.error(
            f"--device {args.device}: the {engine.name} engine runs on {engine.device_names()} here; leave "
            "--device out."
        )
    if args.device == "cuda" and int8:
        parser.error("--int8 quantizes for the CPU: leave out --device cuda, or --int8 to decode on the GPU.")
    if int8:
        return torch.device("cpu")
    with refusals_in_one_line(parser):
        return torch.device(engine.select_device(args.device, compute_type or "default"))
