"""Average the parameters of a run's last K checkpoints into one model (Section 6.1: the base models
average the last 5 checkpoints, the big models the last 20).

    vanilla-transformer average --run-dir runs/base --last 5 --output runs/base/averaged
    vanilla-transformer average --checkpoints runs/a/checkpoint-9 runs/a/checkpoint-10 --output avg
"""

import argparse

from ..common.cli import ArgumentParser, check_writable, positive_int, run_command

DEFAULT_LAST = 5


def build_parser(prog: str | None = None) -> ArgumentParser:
    parser = ArgumentParser(prog=prog, description=__doc__)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run-dir", help="a training output folder with checkpoint-N folders")
    source.add_argument(
        "--checkpoints",
        nargs="+",
        help="checkpoint folders to average; the last one's config and tokenizer files are copied",
    )
    parser.add_argument(
        "--last",
        type=positive_int,
        help=f"with --run-dir: how many of the newest checkpoints to average (default: {DEFAULT_LAST})",
    )
    parser.add_argument("--output", required=True, help="folder for the averaged model")
    parser.add_argument(
        "--force", action="store_true", help="replace the model in --output if it holds one already"
    )
    return parser


def run(args: argparse.Namespace, parser: ArgumentParser) -> None:
    """Average the checkpoints `args` name into `args.output`."""
    from ..training.averaging import average_checkpoints, last_checkpoints

    if args.checkpoints and args.last is not None:
        parser.error(
            "--last counts the checkpoints of --run-dir; with --checkpoints, list only those to average."
        )
    check_writable(args.output, "--output", parser)

    try:
        if args.run_dir:
            checkpoints = last_checkpoints(args.run_dir, args.last or DEFAULT_LAST)
        else:
            checkpoints = args.checkpoints
        output = average_checkpoints(checkpoints, args.output, overwrite=args.force)
    except (FileNotFoundError, FileExistsError, ValueError) as error:
        parser.error(str(error))
    print(f"Averaged {len(checkpoints)} checkpoints ({', '.join(str(c) for c in checkpoints)}) into {output}")


def main(argv: list[str] | None = None) -> int | None:
    """`vanilla-transformer average ARGV`."""
    return run_command(run, build_parser(), argv)
