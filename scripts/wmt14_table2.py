"""Reproduce a WMT 2014 row of Table 2 of "Attention Is All You Need": EN-DE base (27.3 BLEU), EN-DE big
(28.4) or EN-FR big (41.8), from the data to the score (`hf_vanilla_transformer.training.paper_runs`).

    python scripts/wmt14_table2.py en-de-base --output-dir runs/en-de-base
    python scripts/wmt14_table2.py en-de-big --output-dir runs/en-de-big \\
        --train corpus/train --dev newstest2013 --test newstest2014       # local files: PREFIX.en, PREFIX.de
    accelerate launch --multi_gpu --num_processes 8 scripts/wmt14_table2.py en-fr-big --output-dir runs/fr

Without --train, --dev and --test the data comes from `datasets` (wmt/wmt14: its training pairs,
newstest2013, newstest2014), which needs a connection. Every flag of `vanilla-transformer train` applies
(--max-steps, --max-tokens, --model-override, ...); the run's own settings are the defaults.
"""

import argparse
import sys

from hf_vanilla_transformer.commands.train import build_parser as train_parser
from hf_vanilla_transformer.commands.train import training_settings
from hf_vanilla_transformer.common.cli import ArgumentParser, refusals_in_one_line, run_command
from hf_vanilla_transformer.training.paper_runs import PAPER_RUNS, PaperRun, table2_comparison
from hf_vanilla_transformer.training.pipeline import run_training
from hf_vanilla_transformer.training.settings import TrainingSettings

# The settings each run fills in where they are not given.
RUN_SETTINGS = ("preset", "train", "dev", "test", "src_lang", "tgt_lang", "dataset_config")


def build_parser() -> ArgumentParser:
    """The `train` command's flags, after the Table 2 row to reproduce."""
    parser = train_parser(prog="wmt14_table2.py")
    parser.description = __doc__
    parser.add_argument("paper_run", choices=sorted(PAPER_RUNS), help="the row of Table 2 to reproduce")
    parser.set_defaults(**dict.fromkeys(RUN_SETTINGS))
    return parser


def settings_of(args: argparse.Namespace, parser: ArgumentParser) -> tuple[PaperRun, TrainingSettings]:
    """The row that `args` name and its run's settings; settings no run could use are a one-line error."""
    paper_run = PAPER_RUNS[args.paper_run]
    values = paper_run.values(vars(args))
    return paper_run, training_settings(argparse.Namespace(**values), parser)


def run(args: argparse.Namespace, parser: ArgumentParser) -> None:
    paper_run, settings = settings_of(args, parser)
    with refusals_in_one_line(parser):
        results = run_training(settings)
    if results:  # the main process's; the others of a multi-GPU run return none
        print(table2_comparison(paper_run, results))


def main(argv: list[str] | None = None) -> int | None:
    """`python scripts/wmt14_table2.py ARGV`."""
    return run_command(run, build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
