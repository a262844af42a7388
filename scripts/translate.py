"""`vanilla-transformer translate`, run from a checkout; `--help` lists its options."""

import sys

from hf_vanilla_transformer.commands.translate import main

if __name__ == "__main__":
    sys.exit(main())
