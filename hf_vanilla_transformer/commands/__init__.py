"""The `vanilla-transformer` command (`python -m hf_vanilla_transformer`): one subcommand per task, each in a
module of this package that defines `build_parser(prog)`, `run(args, parser)` and `main(argv)`; what the
subcommands share of their options is in `engine_options`."""

import importlib
import sys
from types import ModuleType

from ..common.cli import ArgumentParser, run_command

PROG = "vanilla-transformer"
DESCRIPTION = """Train, use and publish the Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

    vanilla-transformer train --preset cpu-demo --output-dir runs/demo
    vanilla-transformer translate --model runs/demo/model --input test.en --output test.hyp.de
    vanilla-transformer push --model-dir runs/demo/model --repo-id ORG/NAME --with-ctranslate2

`vanilla-transformer COMMAND --help` lists the options of a command."""
# Subcommand: (module, help line). A module is imported only when its subcommand runs, so that a command
# loads only the libraries it uses (accelerate and datasets for training, the exporters' engines, the Hub).
COMMANDS = {
    "train": ("train", "train a model the way the paper did (Section 5)"),
    "translate": ("translate", "translate text, one sentence a line, on torch, CTranslate2 or ONNX Runtime"),
    "evaluate": ("evaluate", "score translations with sacreBLEU or the paper's tokenized BLEU"),
    "score": ("score", "give each translation's log-probability under the model (forced decoding)"),
    "tune": ("tune", "choose the length penalty on a dev set, as the paper did (Section 6.1)"),
    "average": ("average", "average the parameters of a run's last checkpoints (Section 6.1)"),
    "convert": ("convert", "convert a Marian (opus-mt) or fairseq checkpoint into this package's format"),
    "export": ("export", "export a model for CTranslate2 or ONNX Runtime"),
    "serve": ("serve", "serve translations over HTTP: LibreTranslate's API, a native one and a web page"),
    "push": ("push", "publish a model, its code and its model card on the Hugging Face Hub"),
    "chatbot": ("chatbot", "train the Korean chatbot of the Keras tutorial, evaluate it, or talk to it"),
    "figures": ("figures", "draw the README's figures: encodings, schedule, training curves, attention"),
}


def command_module(name: str) -> ModuleType:
    """The module that implements subcommand `name` (a key of `COMMANDS`)."""
    return importlib.import_module(f"{__name__}.{COMMANDS[name][0]}")


def build_parser() -> ArgumentParser:
    """The top-level parser: it lists the subcommands and refuses a missing or unknown one; each
    subcommand's own arguments are parsed by its module's parser."""
    parser = ArgumentParser(prog=PROG, description=DESCRIPTION)
    subcommands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    for name, (_, help_line) in COMMANDS.items():
        subcommands.add_parser(name, help=help_line, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int | None:
    """Run `vanilla-transformer ARGV`; returns the subcommand's exit status (None: success)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        build_parser().error(f"give a command, one of {', '.join(COMMANDS)} (--help says what each does).")
    if argv[0] not in COMMANDS:
        # --help, or a one-line error naming the unknown command: parse_args exits either way.
        build_parser().parse_args(argv)
    module = command_module(argv[0])
    parser = module.build_parser(prog=f"{PROG} {argv[0]}")
    return run_command(module.run, parser, argv[1:])
