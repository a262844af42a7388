"""Train the README's demo: a small Transformer on the shipped Multi30k English-German captions on a CPU,
1700 steps (the `cpu-demo` preset), the last 2 checkpoints averaged, then BLEU on the val and
test_2016_flickr sets. The same run as `bash run.sh demo` and `vanilla-transformer train --preset cpu-demo`.

    python scripts/multi30k_cpu_demo.py                           # into runs/demo
    python scripts/multi30k_cpu_demo.py --output-dir runs/demo2 --seed 2

Every flag of `vanilla-transformer train` applies; --preset cpu trains the longer CPU recipe (6000 steps).
"""

import sys

from hf_vanilla_transformer.commands.train import main as train

DEFAULTS = ["--preset", "cpu-demo", "--output-dir", "runs/demo"]


def main(argv: list[str] | None = None) -> int | None:
    """`python scripts/multi30k_cpu_demo.py ARGV`: `vanilla-transformer train` with the demo's preset and
    output folder unless ARGV gives others (a flag given later wins)."""
    return train([*DEFAULTS, *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
