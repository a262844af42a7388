"""`vanilla-transformer average`, run from a checkout; `--help` lists its options."""

import sys

from hf_vanilla_transformer.commands.average import main

if __name__ == "__main__":
    sys.exit(main())
