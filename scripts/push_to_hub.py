#!/usr/bin/env python
"""Publish a trained model on the Hugging Face Hub in one commit: safetensors weights (sharded when large),
config, the paper's generation config (unless the model folder has its own), tokenizer, the code that
lets users without this package load it with trust_remote_code=True, and the model card rendered from
model_cards/ with the figures of the run's results.json / trainer_state.json.

    python scripts/push_to_hub.py --model-dir runs/base/model --repo-id ORG/NAME \\
        [--revision BRANCH] [--private] [--card model_cards/base.md] [--max-shard-size 5GB]

Log in first (`hf auth login`) or set HF_TOKEN. See docs/hub.md.
"""

import argparse

from hf_vanilla_transformer.hub import DEFAULT_MAX_SHARD_SIZE, push_model


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-dir", required=True, help="folder with the saved model and tokenizer")
    parser.add_argument("--repo-id", required=True, help="Hub repo, ORG/NAME; created if missing")
    parser.add_argument(
        "--revision", default=None, help="branch to push to (created from main); default main"
    )
    parser.add_argument("--private", action="store_true", help="create the repo private")
    parser.add_argument(
        "--card", default=None, help="model card template; default model_cards/base.md or big.md by width"
    )
    parser.add_argument("--max-shard-size", default=DEFAULT_MAX_SHARD_SIZE, help="largest weights file")
    parser.add_argument("--commit-message", default=None)
    args = parser.parse_args(argv)

    try:
        commit = push_model(
            args.model_dir,
            args.repo_id,
            revision=args.revision,
            private=args.private,
            card_template=args.card,
            max_shard_size=args.max_shard_size,
            commit_message=args.commit_message,
        )
    # HFValidationError (a malformed repo id) is a ValueError.
    except (FileNotFoundError, ValueError) as error:
        parser.error(str(error))
    print(f"Pushed {args.model_dir} to {args.repo_id}@{args.revision or 'main'}: commit {commit.oid}")
    print(commit.commit_url)


if __name__ == "__main__":
    main()
