#!/usr/bin/env python
"""The Keras Transformer Korean chatbot tutorial on ChatbotData.csv, with this package and Seq2SeqTrainer.

    python scripts/chatbot.py train [--epochs 8] [--max-steps N] [--batch-size 64] [--output-dir DIR]
    python scripts/chatbot.py chat --model runs/chatbot_ko               # interactive; 'quit' or Ctrl-D ends
    python scripts/chatbot.py chat --model runs/chatbot_ko --ask "영화 볼래?" [--beams 4]

`train` uses the tutorial's settings unless told otherwise (see `--help` of the subcommand) and saves a
folder that AutoModelForSeq2SeqLM and AutoTokenizer load (after `import hf_vanilla_transformer`).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from hf_vanilla_transformer.chatbot import (
    DEFAULT_DATA,
    SAMPLE_QUESTIONS,
    ChatbotSettings,
    answer,
    chat_session,
    load_chatbot,
    train_chatbot,
)


def _train(args: argparse.Namespace) -> None:
    settings = ChatbotSettings(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ChatbotSettings)})
    result = train_chatbot(args.output_dir, args.data, settings)
    metrics = result.metrics
    parts = [
        f"training loss {metrics.get('last_logged_loss', metrics['train_loss']):.4f} "
        f"(mean over the run {metrics['train_loss']:.4f})"
    ]
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


def _chat(args: argparse.Namespace) -> None:
    model, tokenizer = load_chatbot(args.model)
    if args.ask is not None:
        print(answer(model, tokenizer, args.ask, num_beams=args.beams))
    else:
        chat_session(model, tokenizer, num_beams=args.beams)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train the chatbot and save it")
    train.add_argument(
        "--output-dir", type=Path, default=Path("runs/chatbot_ko"), help="default: %(default)s"
    )
    train.add_argument(
        "--data", type=Path, default=DEFAULT_DATA, help="CSV with columns Q, A (default: shipped)"
    )
    # One flag per setting (--epochs, --max-steps, --batch-size, --d-model ...), with the tutorial's defaults.
    for setting in dataclasses.fields(ChatbotSettings):
        train.add_argument(
            "--" + setting.name.replace("_", "-"),
            type=float if setting.type is float else int,
            default=setting.default,
            help="default: %(default)s",
        )
    train.set_defaults(run=_train)

    chat = commands.add_parser("chat", help="talk to a trained chatbot")
    chat.add_argument("--model", type=Path, default=Path("runs/chatbot_ko"), help="default: %(default)s")
    chat.add_argument("--ask", help="answer this one question and exit")
    chat.add_argument("--beams", type=int, default=1, help="beam size; 1 (default) is greedy decoding")
    chat.set_defaults(run=_chat)

    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
