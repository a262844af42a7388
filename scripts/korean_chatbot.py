"""The Korean chatbot of the Keras Transformer tutorial, trained on ChatbotData.csv (11,823 question-answer
pairs, shipped with the package) and talked to: `vanilla-transformer chatbot`.

    python scripts/korean_chatbot.py train                    # the tutorial's settings, into runs/chatbot_ko
    python scripts/korean_chatbot.py evaluate --model runs/chatbot_ko
    python scripts/korean_chatbot.py chat --model runs/chatbot_ko --ask "영화 볼래?"

`train --help` lists the tutorial's settings (layers, width, epochs, ...), each a flag.
"""

import sys

from hf_vanilla_transformer.commands.chatbot import build_parser
from hf_vanilla_transformer.commands.chatbot import run as chatbot
from hf_vanilla_transformer.common.cli import run_command


def main(argv: list[str] | None = None) -> int | None:
    """`python scripts/korean_chatbot.py ARGV`, as `vanilla-transformer chatbot ARGV`."""
    return run_command(chatbot, build_parser(prog="korean_chatbot.py"), argv)


if __name__ == "__main__":
    sys.exit(main())
