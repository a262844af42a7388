"""Publish a trained model on the Hugging Face Hub: safetensors weights (sharded when large), config, the
paper's generation config (unless the model folder has its own), tokenizer, the code that lets users without
this package load it with trust_remote_code=True, and the model card rendered from model_cards/template.md
with the figures of the run's results.json / trainer_state.json. With --with-ctranslate2, the repo also holds
the model exported for CTranslate2 in its `ctranslate2/` folder.

    vanilla-transformer push --model-dir runs/base/model --repo-id ORG/NAME \\
        [--revision BRANCH] [--private] [--token TOKEN] [--card TEMPLATE.md] [--max-shard-size 5GB] \\
        [--with-ctranslate2 [--ctranslate2-quantization int8]]

Log in first (`hf auth login`), set HF_TOKEN, or pass --token. See docs/hub.md.
"""

import argparse
import re
import sys

from ..common.cli import ArgumentParser, first_line, run_command
from ..inference.engines.names import CTRANSLATE2_QUANTIZATIONS

# Answers that mean the token is missing, invalid, or may not write to the repo.
AUTH_STATUSES = {401: "Unauthorized", 403: "Forbidden"}
# Exit status of a refused token, as for argparse's usage errors: the user must change how they call it.
AUTH_EXIT_STATUS = 2


def shard_size(text: str) -> int | str:
    """argparse type: a number of bytes above 0, or a size with one of the units save_pretrained reads (KB
    to TB)."""
    size = re.fullmatch(r"(\d+(\.\d+)?)\s*([KMGT]B)?", text.strip(), flags=re.IGNORECASE)
    number, fraction, unit = size.groups() if size else ("0", None, None)
    if float(number) > 0 and (unit or not fraction):  # a bare number counts whole bytes
        return text.strip() if unit else int(number)
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a size above 0 such as 5GB or 500MB, or a number of bytes"
    )


def build_parser(prog: str | None = None) -> ArgumentParser:
    parser = ArgumentParser(prog=prog, description=__doc__)
    parser.add_argument("--model-dir", required=True, help="folder with the saved model and tokenizer")
    parser.add_argument("--repo-id", required=True, help="Hub repo, ORG/NAME; created if missing")
    parser.add_argument("--revision", help="branch to push to, created from main if missing (default: main)")
    parser.add_argument(
        "--private",
        action="store_true",
        help="create the repo private (an existing repo keeps its visibility)",
    )
    parser.add_argument(
        "--token", help="Hub token with write access (default: the logged-in one, or HF_TOKEN)"
    )
    parser.add_argument(
        "--card", help="Jinja model card template (default: the package's model_cards/template.md)"
    )
    parser.add_argument("--max-shard-size", type=shard_size, help="largest weights file (default: 5GB)")
    parser.add_argument(
        "--commit-message", help="commit message (default: Upload MODEL_DIR with hf-vanilla-transformer)"
    )
    parser.add_argument(
        "--with-ctranslate2",
        action="store_true",
        help="also upload the model exported for CTranslate2, in the repo's ctranslate2/ folder",
    )
    parser.add_argument(
        "--ctranslate2-quantization",
        choices=CTRANSLATE2_QUANTIZATIONS,
        help="weight type of the CTranslate2 export (default: float32)",
    )
    return parser


def run(args: argparse.Namespace, parser: ArgumentParser) -> None:
    """Push `args.model_dir` to `args.repo_id` and print the commit."""
    if args.ctranslate2_quantization is not None and not args.with_ctranslate2:
        parser.error("--ctranslate2-quantization applies to the CTranslate2 export: add --with-ctranslate2.")
    # Imported where the push runs, so that `--help` and argument errors answer without torch.
    from huggingface_hub.errors import HfHubHTTPError

    # huggingface_hub's HTTP client, under the name it exports across its major versions.
    from huggingface_hub.utils import httpx

    from ..hub.model_card import CardTemplateError
    from ..hub.publishing import DEFAULT_MAX_SHARD_SIZE, push_model

    try:
        commit = push_model(
            args.model_dir,
            args.repo_id,
            revision=args.revision,
            private=args.private or None,  # without --private: the Hub's default visibility
            card_template=args.card,
            max_shard_size=args.max_shard_size or DEFAULT_MAX_SHARD_SIZE,
            commit_message=args.commit_message,
            token=args.token,
            with_ctranslate2=args.with_ctranslate2,
            ctranslate2_quantization=args.ctranslate2_quantization,
        )
    # The message starts with the template's path; naming the flag too says which argument to change.
    except CardTemplateError as error:
        parser.error(f"--card {error}" if args.card is not None else str(error))
    # HFValidationError (a malformed repo id) and ExportError (a model CTranslate2 cannot hold) are
    # ValueErrors.
    except (FileNotFoundError, ValueError) as error:
        parser.error(str(error))
    except HfHubHTTPError as error:
        status = error.response.status_code
        if status not in AUTH_STATUSES:
            raise
        print(
            f"{parser.prog}: error: the Hub refused the token ({status} {AUTH_STATUSES[status]}) for "
            f"{args.repo_id}: log in with `hf auth login` (or `huggingface-cli login`) or pass --token, "
            "with a token that has write access to the repo.",
            file=sys.stderr,
        )
        raise SystemExit(AUTH_EXIT_STATUS) from None
    # No network, a name that does not resolve, or HF_HUB_OFFLINE=1 (OfflineModeIsEnabled, a ConnectionError).
    except (ConnectionError, httpx.TransportError) as error:
        parser.error(
            f"cannot reach the Hub ({first_line(error)}): check the network, HF_ENDPOINT and HF_HUB_OFFLINE."
        )
    print(f"Pushed {args.model_dir} to {args.repo_id}@{args.revision or 'main'}: commit {commit.oid}")
    print(commit.commit_url)


def main(argv: list[str] | None = None) -> int | None:
    """`vanilla-transformer push ARGV`."""
    return run_command(run, build_parser(), argv)
