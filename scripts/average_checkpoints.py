"""Average the parameters of a run's last K checkpoints into one model (Section 6.1: the base models
average the last 5 checkpoints, the big models the last 20).

    python scripts/average_checkpoints.py --run-dir runs/base --last 5 --output runs/base/averaged
    python scripts/average_checkpoints.py --checkpoints runs/a/checkpoint-9 runs/a/checkpoint-10 --output avg
"""

import argparse

from hf_vanilla_transformer.averaging import average_checkpoints, last_checkpoints


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run-dir", help="a training output folder with checkpoint-N folders")
    source.add_argument("--checkpoints", nargs="+", help="checkpoint folders to average")
    parser.add_argument(
        "--last", type=int, default=5, help="with --run-dir: how many of the last checkpoints"
    )
    parser.add_argument("--output", required=True, help="folder for the averaged model")
    args = parser.parse_args(argv)

    checkpoints = last_checkpoints(args.run_dir, args.last) if args.run_dir else args.checkpoints
    output = average_checkpoints(checkpoints, args.output)
    print(f"Averaged {len(checkpoints)} checkpoints ({', '.join(str(c) for c in checkpoints)}) into {output}")


if __name__ == "__main__":
    main()
