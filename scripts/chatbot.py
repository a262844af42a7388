"""`vanilla-transformer chatbot`, run from a checkout; `--help` lists its options."""

import sys

from hf_vanilla_transformer.commands.chatbot import main

if __name__ == "__main__":
    sys.exit(main())
