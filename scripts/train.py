"""Train the Transformer the way the paper did (Section 5), on anything from a laptop CPU to many GPUs.

    python scripts/train.py --preset cpu-demo --output-dir runs/demo
    python scripts/train.py --preset base --train wmt14 --dataset-config de-en --src-lang en --tgt-lang de \\
        --dev none --test none --output-dir runs/base
    accelerate launch --multi_gpu --num_processes 8 scripts/train.py --preset base ...   # one process per GPU
    python scripts/train.py --preset cpu-demo --output-dir runs/demo --resume   # go on after a crash

Data: `--train PREFIX` reads PREFIX.<src-lang> and PREFIX.<tgt-lang>; `--train FILE --train-target FILE`
reads two line-aligned files; a .tsv or .jsonl file, or a `datasets` name with --dataset-config, also work.
"""

import argparse
import json
from pathlib import Path

from hf_vanilla_transformer.training import TRAINING_PRESETS, TrainingSettings, run_training

# The shipped Multi30k, wherever the script is run from.
MULTI30K = Path(__file__).resolve().parent.parent / "data" / "multi30k"


def optional_path(value: str) -> str | None:
    return None if value.lower() == "none" else value


def parse_args(argv: list[str] | None = None) -> TrainingSettings:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--output-dir", required=True, help="run folder: checkpoints, tokenizer, final model")
    parser.add_argument("--preset", default="cpu", choices=sorted(TRAINING_PRESETS), help="training recipe")
    data = parser.add_argument_group("data")
    data.add_argument("--train", default=str(MULTI30K / "train"))
    data.add_argument("--train-target", default=None, help="target-side file when --train is the source file")
    data.add_argument("--dev", type=optional_path, default=str(MULTI30K / "val"), help="'none' to skip")
    data.add_argument("--dev-target", default=None)
    data.add_argument(
        "--test", type=optional_path, default=str(MULTI30K / "test_2016_flickr"), help="'none' to skip"
    )
    data.add_argument("--test-target", default=None)
    data.add_argument("--src-lang", default="en")
    data.add_argument("--tgt-lang", default="de")
    data.add_argument(
        "--dataset-config", default=None, help="config of a `datasets` name, e.g. de-en for wmt14"
    )
    data.add_argument("--train-split", default="train", help="split of a `datasets` name")
    data.add_argument("--dev-split", default="validation")
    data.add_argument("--test-split", default="test")
    data.add_argument("--max-length", type=int, default=None, help="longest pair in tokens")
    data.add_argument("--long-pairs", choices=("filter", "truncate"), default="filter")
    model = parser.add_argument_group("model and vocabulary")
    model.add_argument("--init-from", default=None, help="fine-tune this model folder or Hub id")
    model.add_argument("--tokenizer", default=None, help="use this tokenizer instead of training one")
    model.add_argument("--vocab-size", type=int, default=None)
    model.add_argument(
        "--model-override",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="config field or paper symbol, e.g. N=4, d_model=256, P_drop=0.3",
    )
    training = parser.add_argument_group("training")
    training.add_argument("--max-steps", type=int, default=None)
    training.add_argument(
        "--max-minutes", type=float, default=None, help="stop after this much training time"
    )
    training.add_argument("--max-tokens", type=int, default=None, help="source/target tokens per micro-batch")
    training.add_argument("--tokens-per-step", type=int, default=None, help="per optimizer step, all devices")
    training.add_argument("--warmup-steps", type=int, default=None)
    training.add_argument("--lr-scale", type=float, default=None)
    training.add_argument("--save-steps", type=int, default=None)
    training.add_argument("--keep-checkpoints", type=int, default=None)
    training.add_argument(
        "--average-checkpoints", type=int, default=None, help="average the last K (1: none)"
    )
    training.add_argument("--eval-steps", type=int, default=None)
    training.add_argument("--seed", type=int, default=1)
    training.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    training.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="bf16 autocast (default: the preset's)",
    )
    evaluation = parser.add_argument_group("evaluation")
    evaluation.add_argument("--num-beams", type=int, default=4)
    evaluation.add_argument("--eval-batch-size", type=int, default=64)
    evaluation.add_argument("--max-eval-sentences", type=int, default=None)
    args = parser.parse_args(argv)

    overrides = {}
    for item in args.model_override:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--model-override takes KEY=VALUE, got {item!r}")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    values = {k: v for k, v in vars(args).items() if k != "model_override"}
    return TrainingSettings(**values, model_overrides=overrides)


if __name__ == "__main__":
    run_training(parse_args())
