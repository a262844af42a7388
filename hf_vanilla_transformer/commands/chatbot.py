"""The Keras Transformer Korean chatbot tutorial on ChatbotData.csv, with this package and Seq2SeqTrainer.

    vanilla-transformer chatbot train [--epochs 50] [--max-steps N] [--batch-size 64] [--output-dir DIR]
    vanilla-transformer chatbot train --output-dir DIR --resume        # go on from the last epoch saved
    vanilla-transformer chatbot evaluate --model runs/chatbot_ko [--examples 5]   # on the held-out pairs
    vanilla-transformer chatbot chat --model runs/chatbot_ko            # interactive; 'quit' or Ctrl-D ends
    vanilla-transformer chatbot chat --model runs/chatbot_ko --ask "영화 볼래?" [--beams 4]

`train` uses the tutorial's settings unless told otherwise (see `--help` of the subcommand) and saves a
folder that AutoModelForSeq2SeqLM and AutoTokenizer load (after
`hf_vanilla_transformer.register_auto_classes()`).
"""

import argparse
from pathlib import Path

from ..common.cli import (
    ArgumentParser,
    check_writable,
    non_negative_int,
    positive_int,
    refusals_in_one_line,
    run_command,
)
from ..common.settings_schema import add_arguments, schema_values
from ..training.chatbot_settings import DEFAULT_DATA, SAMPLE_QUESTIONS, ChatbotSettings

MODEL_HELP = "folder of a trained chatbot"


# Each action imports the tutorial's code (torch, transformers, datasets) where it runs, so that `--help` and
# argument errors answer at once.


def _train(args: argparse.Namespace) -> None:
    from ..training.chatbot import answer, train_chatbot

    settings = ChatbotSettings(**schema_values(ChatbotSettings, args))
    result = train_chatbot(args.output_dir, args.data, settings, resume=args.resume)
    metrics = result.metrics
    parts = []
    if "last_logged_loss" in metrics:
        parts.append(f"training loss {metrics['last_logged_loss']:.4f}")
    if "train_loss" in metrics:
        parts.append(
            f"mean over this run's {metrics['updates_this_run']:.0f} updates {metrics['train_loss']:.4f}"
        )
    for split, name in (("train_sample", "training sample"), ("held_out", "held-out")):
        if f"eval_{split}_accuracy" in metrics:
            loss, accuracy = metrics[f"eval_{split}_loss"], metrics[f"eval_{split}_accuracy"]
            parts.append(f"{name} loss {loss:.4f}, accuracy {accuracy:.4f}")
    print(
        f"Final after {metrics['train_steps']:.0f} updates ({result.seconds / 60:.1f} min): "
        + "; ".join(parts)
    )
    for question in SAMPLE_QUESTIONS:
        print(f"Q: {question}\nA: {answer(result.model, result.tokenizer, question)}")


def _evaluate(args: argparse.Namespace) -> None:
    from ..training.chatbot import evaluate_held_out

    evaluation = evaluate_held_out(args.model, args.data, args.examples)
    print(
        f"Held-out pairs: {evaluation.pairs:,}; loss {evaluation.loss:.4f}, token accuracy "
        f"{evaluation.accuracy:.4f} (teacher-forced, padding left out)"
    )
    for question, reference, reply in evaluation.examples:
        print(f"Q: {question}\nA (corpus): {reference}\nA (chatbot): {reply}")


def _chat(args: argparse.Namespace) -> None:
    from ..training.chatbot import answer, chat_session, load_chatbot, read_chatbot_settings

    # Any seq2seq folder of this package loads, but only a chatbot run's answers questions: refused here
    # by the same check as `evaluate`.
    read_chatbot_settings(args.model)
    model, tokenizer = load_chatbot(args.model)
    if args.ask is not None:
        print(answer(model, tokenizer, args.ask, num_beams=args.beams))
    else:
        chat_session(model, tokenizer, num_beams=args.beams)


def build_parser(prog: str | None = None) -> ArgumentParser:
    parser = ArgumentParser(prog=prog, description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, help="what to do")

    train = commands.add_parser("train", help="train the chatbot and save it")
    train.add_argument("--output-dir", type=Path, default=Path("runs/chatbot_ko"), help="folder to save to")
    train.add_argument("--data", type=Path, default=DEFAULT_DATA, help="CSV with columns Q and A")
    add_arguments(train, ChatbotSettings)
    train.add_argument(
        "--resume", action="store_true", help="continue the run in --output-dir from its last checkpoint"
    )
    train.set_defaults(run=_train)

    evaluate = commands.add_parser(
        "evaluate", help="measure a trained chatbot on the pairs its run held out, and show its answers"
    )
    evaluate.add_argument("--model", type=Path, default=Path("runs/chatbot_ko"), help=MODEL_HELP)
    evaluate.add_argument(
        "--data", type=Path, help="the CSV the chatbot was trained on (default: the one its run recorded)"
    )
    evaluate.add_argument(
        "--examples", type=non_negative_int, default=5, help="held-out questions to answer and show"
    )
    evaluate.set_defaults(run=_evaluate)

    chat = commands.add_parser("chat", help="talk to a trained chatbot")
    chat.add_argument("--model", type=Path, default=Path("runs/chatbot_ko"), help=MODEL_HELP)
    chat.add_argument("--ask", help="answer this one question and exit")
    chat.add_argument("--beams", type=positive_int, default=1, help="beam size; 1 is greedy decoding")
    chat.set_defaults(run=_chat)

    return parser


def run(args: argparse.Namespace, parser: ArgumentParser) -> None:
    """Train the chatbot, evaluate it or talk to it, as `args.command` says; what the library refuses is
    reported in one line."""
    if args.command in ("chat", "evaluate") and not args.model.is_dir():
        parser.error(
            f"--model {args.model}: no such folder; train one with `vanilla-transformer chatbot train` first."
        )
    # An empty question is preprocessed to nothing, and the model would answer noise.
    if args.command == "chat" and args.ask is not None and not args.ask.strip():
        parser.error("--ask is empty: give a question.")
    if args.command in ("train", "evaluate") and args.data is not None and not args.data.is_file():
        parser.error(f"--data {args.data}: no such file; give a CSV with columns Q and A.")
    if args.command == "train":
        check_writable(args.output_dir, "--output-dir", parser)
    with refusals_in_one_line(parser):
        args.run(args)


def main(argv: list[str] | None = None) -> int | None:
    """`vanilla-transformer chatbot ARGV`."""
    return run_command(run, build_parser(), argv)
