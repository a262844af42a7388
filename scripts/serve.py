"""`vanilla-transformer serve`, run from a checkout; `--help` lists its options."""

import sys

from hf_vanilla_transformer.commands.serve import main

if __name__ == "__main__":
    sys.exit(main())
