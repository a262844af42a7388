"""Choose the length penalty (alpha), and the beam size with `--beam-sizes`, on the development set, as the
paper did (Section 6.1): translate the dev set once per choice and compare sacreBLEU; `--save` writes the
best into the model's generation config.

    vanilla-transformer tune --model runs/demo/model --source data/multi30k/val.en \\
        --reference data/multi30k/val.de --save
    vanilla-transformer tune --model runs/demo/ct2 --source val.en --reference val.de \\
        --beam-sizes 1 4 8 --length-penalties 0.6 1 2

Use a dev set, never the test set.
"""

import argparse

from ..common.cli import (
    ArgumentParser,
    input_lines,
    non_negative_float,
    positive_int,
    refusals_in_one_line,
    run_command,
)
from ..evaluation.tuning import (
    DEFAULT_LENGTH_PENALTIES,
    generation_config_file,
    save_decoding,
    search_decoding,
)


def build_parser(prog: str | None = None) -> ArgumentParser:
    parser = ArgumentParser(prog=prog, description=__doc__)
    parser.add_argument("--model", required=True, help="model folder, exported folder or Hub id")
    parser.add_argument("--source", required=True, help="dev set source sentences, one a line")
    parser.add_argument("--reference", required=True, help="their reference translations, line for line")
    parser.add_argument(
        "--length-penalties",
        type=non_negative_float,
        nargs="+",
        default=list(DEFAULT_LENGTH_PENALTIES),
        help="the alphas to try (default: %(default)s)",
    )
    parser.add_argument(
        "--beam-sizes",
        type=positive_int,
        nargs="+",
        help="the beam sizes to try, each with every alpha (default: the model's own; 1 decodes greedily)",
    )
    parser.add_argument("--batch-size", type=positive_int, default=64, help="sentences per generate() call")
    parser.add_argument("--threads", type=positive_int, help="CPU threads (default: the engine's)")
    parser.add_argument(
        "--save",
        action="store_true",
        help="write the best alpha (and beam size) into the model folder's generation config",
    )
    return parser


def run(args: argparse.Namespace, parser: ArgumentParser) -> None:
    """Print the dev BLEU of every choice tried and the best; with `--save`, write the best."""
    # Imported where the search runs, so that `--help` and argument errors answer without torch.
    import torch

    from ..inference.engines.base import detect_engine
    from ..inference.translator import load_translator

    sources = input_lines(args.source, "--source", parser)
    references = input_lines(args.reference, "--reference", parser)
    for flag, lines, path in (
        ("--source", sources, args.source),
        ("--reference", references, args.reference),
    ):
        if not any(line.strip() for line in lines):
            parser.error(f"{flag} {path} holds no text: give the dev set, one sentence a line.")
    with refusals_in_one_line(parser):
        if args.save:  # before the search, which takes minutes
            generation_config_file(args.model)
        if args.threads is not None:
            torch.set_num_threads(args.threads)
        translator = load_translator(args.model, detect_engine(args.model), threads=args.threads or 0)
        beam_sizes = args.beam_sizes or [translator.model.generation_config.num_beams or 1]
        if not args.beam_sizes and beam_sizes == [1]:
            raise ValueError(
                f"{args.model} decodes greedily, where a length penalty changes nothing: give --beam-sizes "
                "(the paper's is 4), or set num_beams in its generation config."
            )
        search = search_decoding(
            translator,
            sources,
            references,
            beam_sizes,
            args.length_penalties,
            batch_size=args.batch_size,
            progress=True,
        )
        for choice, bleu in search.bleu.items():
            print(f"{choice}: {bleu}")
        print(f"best on this dev set: {search.best}")
        if args.save:
            print(f"wrote {search.best} into {save_decoding(args.model, search.best)}")


def main(argv: list[str] | None = None) -> int | None:
    """`vanilla-transformer tune ARGV`."""
    return run_command(run, build_parser(), argv)
