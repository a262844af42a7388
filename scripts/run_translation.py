"""Fine-tune a Transformer of this package for translation with `Seq2SeqTrainer`, with the arguments of
transformers' translation example (examples/pytorch/translation/run_translation.py), so that a command
written for that example runs here (`hf_vanilla_transformer.training.fine_tuning`).

    python scripts/run_translation.py --model_name_or_path runs/demo/model \\
        --source_lang en --target_lang de --train_file train.jsonl --validation_file dev.jsonl \\
        --do_train --do_eval --predict_with_generate --output_dir runs/fine-tuned \\
        --per_device_train_batch_size 32 --learning_rate 1e-4 --num_train_epochs 3
    python scripts/run_translation.py --model_name_or_path ORG/NAME --source_lang en --target_lang de \\
        --dataset_name wmt/wmt14 --dataset_config_name de-en --do_predict --predict_with_generate \\
        --max_predict_samples 100 --num_beams 4 --output_dir runs/predictions
    python scripts/run_translation.py args.json        # the three argument groups as one JSON object

Files hold one pair a line: JSON Lines named .json or .jsonl ({"translation": {"en": ..., "de": ...}}, as
the example reads), TSV, or a prefix P of two line-aligned text files P.en and P.de. Every
`Seq2SeqTrainingArguments` flag applies (--label_smoothing_factor 0.1 is the paper's label smoothing).
"""

import sys
from typing import NoReturn

from transformers import HfArgumentParser, Seq2SeqTrainingArguments

from hf_vanilla_transformer.common.cli import refusals_in_one_line
from hf_vanilla_transformer.training.fine_tuning import DataTrainingArguments, ModelArguments, run_fine_tuning

PROG = "run_translation.py"


class OneLineArgumentParser(HfArgumentParser):
    """`HfArgumentParser` whose errors are one line, `PROG: error: MESSAGE`, with exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse(parser: HfArgumentParser, argv: list[str]) -> tuple:
    """The three argument groups, from a JSON file given alone or from the flags."""
    if len(argv) == 1 and argv[0].endswith(".json"):
        return parser.parse_json_file(argv[0])
    # No `.args` file beside the script is read: the command line says everything.
    return parser.parse_args_into_dataclasses(argv, look_for_args_file=False)


def main(argv: list[str] | None = None) -> int | None:
    """`python scripts/run_translation.py ARGV`: fine-tune, evaluate and predict; what is refused (a missing
    file, a missing language, nothing to do) is one line with exit status 2."""
    parser = OneLineArgumentParser(
        (ModelArguments, DataTrainingArguments, Seq2SeqTrainingArguments), prog=PROG, description=__doc__
    )
    argv = sys.argv[1:] if argv is None else argv
    with refusals_in_one_line(parser):
        model_args, data_args, training_args = parse(parser, argv)
        run_fine_tuning(model_args, data_args, training_args)
    return None


if __name__ == "__main__":
    sys.exit(main())
