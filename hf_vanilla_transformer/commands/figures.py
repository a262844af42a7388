"""Draw the figures of docs/figures/: positional encodings, the learning-rate schedule, given a trained
chatbot (`vanilla-transformer chatbot train`) its attention for one question and its training curves
(`chatbot_training.png`, when its checkpoints are there), and given runs of
`vanilla-transformer train` their training curves, and with `--compare` their training losses on one figure.
Needs the `plots` extra (matplotlib).

    vanilla-transformer figures --model runs/chatbot_ko --question "영화 볼래?" --out docs/figures
    vanilla-transformer figures --run runs/multi30k --out docs/figures   # writes multi30k_training.png
    vanilla-transformer figures --run runs/eager runs/compiled --compare compiled_against_eager
    vanilla-transformer figures --translation-model runs/demo/model --out docs/figures  # the alignment
"""

import argparse
from pathlib import Path

from ..common.cli import ArgumentParser, positive_int, refusals_in_one_line, run_command

ATTENTION_FILES = {
    "encoder": "attention_encoder_self.png",
    "decoder": "attention_decoder_self.png",
    "cross": "attention_cross.png",
}


def build_parser(prog: str | None = None) -> ArgumentParser:
    parser = ArgumentParser(prog=prog, description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("docs/figures"), help="folder for the figures")
    parser.add_argument("--model", type=Path, help="trained chatbot folder; without it no attention figures")
    parser.add_argument("--question", default="영화 볼래?", help="input of the attention figures")
    parser.add_argument(
        "--translation-model", type=Path, help="trained translation model folder, for the alignment figure"
    )
    parser.add_argument(
        "--sentence",
        default="A group of people standing in front of an igloo.",
        help="source sentence of the alignment figure, one from Multi30k's test_2016_flickr by default",
    )
    parser.add_argument(
        "--run", type=Path, nargs="*", default=[], help="output folders of `vanilla-transformer train` runs"
    )
    parser.add_argument(
        "--compare",
        metavar="NAME",
        help="with two or more --run folders: also NAME.png, their training losses on one figure",
    )
    parser.add_argument("--d-model", type=positive_int, default=256, help="d_model of the schedule figure")
    parser.add_argument(
        "--warmup-steps", type=positive_int, default=4000, help="warm-up of the schedule figure"
    )
    parser.add_argument(
        "--total-steps", type=positive_int, default=200_000, help="steps of the schedule figure"
    )
    return parser


def run(args: argparse.Namespace, parser: ArgumentParser) -> None:
    """Draw the figures that `args` ask for into `args.out`."""
    # Imported where the figures are drawn, so that `--help` and argument errors answer without torch.
    from .. import VanillaTransformerForConditionalGeneration
    from ..common.tokenization import load_tokenizer
    from ..figures.plotting import (
        attention_maps,
        find_hangul_font,
        plot_alignment,
        plot_attention,
        plot_chatbot_curves,
        plot_learning_rate,
        plot_positional_encoding,
        plot_training_curves,
        plot_training_losses_compared,
    )
    from ..training.chatbot import load_chatbot, preprocess_sentence

    missing = [
        str(folder)
        for folder in [args.model, args.translation_model, *args.run]
        if folder is not None and not folder.is_dir()
    ]
    if missing:
        parser.error(f"no such folder: {', '.join(missing)}; give the folders of trained runs.")
    if args.compare is not None and len(args.run) < 2:
        parser.error(f"--compare draws two or more runs on one figure; --run gave {len(args.run)}.")

    written = [args.out / "positional_encoding.png", args.out / "learning_rate.png"]
    plot_positional_encoding(50, 128, path=written[0])
    plot_learning_rate(args.d_model, args.warmup_steps, args.total_steps, path=written[1])
    if args.model is not None:
        print(f"Hangul font: {find_hangul_font()}")
        model, tokenizer = load_chatbot(args.model, attn_implementation="eager")
        maps = attention_maps(model, tokenizer, preprocess_sentence(args.question))
        print(f"Input tokens: {maps.source_tokens}\nDecoder tokens: {maps.target_tokens}")
        for kind, name in ATTENTION_FILES.items():
            plot_attention(maps, kind, path=args.out / name)
            written.append(args.out / name)
        try:
            plot_chatbot_curves(args.model, path=args.out / "chatbot_training.png")
            written.append(args.out / "chatbot_training.png")
        except FileNotFoundError as error:  # a folder without its run's checkpoints
            print(f"Skipped chatbot_training.png: {error}")
    if args.translation_model is not None:
        model = VanillaTransformerForConditionalGeneration.from_pretrained(
            args.translation_model, attn_implementation="eager"
        )
        maps = attention_maps(model, load_tokenizer(args.translation_model), args.sentence)
        print(f"Source tokens: {maps.source_tokens}\nOutput tokens: {maps.target_tokens}")
        written.append(args.out / "translation_alignment.png")
        plot_alignment(maps, path=written[-1])
    with refusals_in_one_line(parser):  # a folder without the checkpoints of a training run
        for run in args.run:
            written.append(args.out / f"{run.name}_training.png")
            plot_training_curves(run, path=written[-1])
        if args.compare is not None:
            written.append(args.out / f"{args.compare}.png")
            plot_training_losses_compared(args.run, path=written[-1])
    for path in written:
        print(f"Wrote {path}")


def main(argv: list[str] | None = None) -> int | None:
    """`vanilla-transformer figures ARGV`."""
    return run_command(run, build_parser(), argv)
