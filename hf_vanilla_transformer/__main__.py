"""`python -m hf_vanilla_transformer COMMAND ...`: the `vanilla-transformer` command."""

import sys

from .commands import main

if __name__ == "__main__":
    sys.exit(main())
