"""Fine-tuning a translation model with `Seq2SeqTrainer`, with the arguments of transformers' own translation
example (examples/pytorch/translation/run_translation.py): `ModelArguments`, `DataTrainingArguments` and
`Seq2SeqTrainingArguments`, which `HfArgumentParser` reads from a command line or a JSON file.

`run_fine_tuning` reads the pairs (a `datasets` name with its config, or files: JSON Lines in the
`translation` layout the example reads, named .json or .jsonl, TSV, or a prefix of two text files), loads
the model (a Hub id or a local folder, through `AutoModelForSeq2SeqLM`) and its tokenizer, tokenizes the
pairs (those longer than the limits cut, keeping `</s>`), then trains, evaluates and predicts as
`--do_train`, `--do_eval` and `--do_predict` ask. With `--predict_with_generate`, evaluation and
prediction translate with `generate()` (the model's beam search and length penalty, unless `--num_beams` or
the generation flags say otherwise) and report sacreBLEU as `eval_bleu` and `predict_bleu`; prediction
writes the translations, one a line, to `generated_predictions.txt` in the output folder.
"""

from dataclasses import dataclass, field
from pathlib import Path

import datasets
from transformers import (
    AutoModelForSeq2SeqLM,
    DataCollatorForSeq2Seq,
    PreTrainedTokenizerBase,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    set_seed,
)

from ..common.model_weights import load_pretrained
from ..common.tokenization import load_tokenizer
from .data import load_hub_pairs, load_parallel_data, read_jsonl, tokenize_pairs
from .trainer import dev_bleu

PREDICTIONS_FILE = "generated_predictions.txt"
# The splits of a `datasets` name, as the example names them.
SPLITS = {"train": "train", "validation": "validation", "test": "test"}


@dataclass
class ModelArguments:
    """Which model and tokenizer to fine-tune (the translation example's `ModelArguments`)."""

    model_name_or_path: str = field(metadata={"help": "model folder or Hub id to fine-tune"})
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "tokenizer folder or Hub id, if not the model's own"}
    )
    cache_dir: str | None = field(default=None, metadata={"help": "where downloaded models are stored"})
    model_revision: str = field(default="main", metadata={"help": "branch, tag or commit of a Hub model"})
    token: str | None = field(default=None, metadata={"help": "Hub token for a private model"})
    trust_remote_code: bool = field(
        default=False,
        metadata={"help": "run the model code a Hub repository carries (without this package installed)"},
    )


@dataclass
class DataTrainingArguments:
    """Which pairs to train, evaluate and predict on, and how to cut and decode them (the translation
    example's `DataTrainingArguments`)."""

    source_lang: str = field(metadata={"help": "source language code, e.g. en"})
    target_lang: str = field(metadata={"help": "target language code, e.g. de"})
    dataset_name: str | None = field(default=None, metadata={"help": "`datasets` name, e.g. wmt/wmt14"})
    dataset_config_name: str | None = field(default=None, metadata={"help": "its config, e.g. de-en"})
    train_file: str | None = field(
        default=None,
        metadata={
            "help": "training pairs: JSON Lines (.json or .jsonl; {'translation': {SRC: ..., TGT: ...}} a "
            "line), TSV, or a prefix P of P.SRC and P.TGT"
        },
    )
    validation_file: str | None = field(default=None, metadata={"help": "evaluation pairs, as --train_file"})
    test_file: str | None = field(default=None, metadata={"help": "prediction pairs, as --train_file"})
    max_source_length: int = field(default=1024, metadata={"help": "source tokens at most; longer are cut"})
    max_target_length: int = field(default=128, metadata={"help": "target tokens at most; longer are cut"})
    val_max_target_length: int | None = field(
        default=None,
        metadata={"help": "max_length of generate() in evaluation and prediction (default: the model's)"},
    )
    num_beams: int | None = field(
        default=None,
        metadata={"help": "beam size in evaluation and prediction (default: the model's generation config)"},
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "use only the first N pairs"})
    max_eval_samples: int | None = field(default=None, metadata={"help": "evaluate on the first N pairs"})
    max_predict_samples: int | None = field(default=None, metadata={"help": "predict the first N pairs"})

    def __post_init__(self) -> None:
        if self.dataset_name is None and not (self.train_file or self.validation_file or self.test_file):
            raise ValueError("Give --dataset_name, or a --train_file, --validation_file or --test_file.")
        if self.dataset_name is not None and self.dataset_config_name is None:
            raise ValueError(
                f"--dataset_name {self.dataset_name} needs --dataset_config_name, e.g. de-en for wmt/wmt14."
            )
        for name in ("max_source_length", "max_target_length", "val_max_target_length", "num_beams"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name} must be 1 or more, got {value}.")


def _split(data_args: DataTrainingArguments, split: str, file: str | None, limit: int | None):
    """The pairs of one split (`src`/`tgt` columns): the file given, else the `datasets` name's split; the
    first `limit` of them where given."""
    languages = {"src_lang": data_args.source_lang, "tgt_lang": data_args.target_lang}
    if file is not None and file.removesuffix(".gz").endswith(".json"):
        # The example's files: JSON Lines named .json.
        pairs = read_jsonl(file, **languages)
    elif file is not None:
        pairs = load_parallel_data(file, **languages)
    elif data_args.dataset_name is not None:
        pairs = load_hub_pairs(
            data_args.dataset_name,
            data_args.dataset_config_name,
            data_args.source_lang,
            data_args.target_lang,
            SPLITS[split],
        )
    else:
        raise ValueError(f"No {split} pairs: give --{split}_file or --dataset_name.")
    return pairs.select(range(min(limit, len(pairs)))) if limit is not None else pairs


def _tokenized(
    pairs: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, data_args: DataTrainingArguments
) -> datasets.Dataset:
    # The example truncates long pairs rather than dropping them.
    return tokenize_pairs(
        pairs, tokenizer, data_args.max_source_length, data_args.max_target_length, long_pairs="truncate"
    )


def run_fine_tuning(
    model_args: ModelArguments, data_args: DataTrainingArguments, training_args: Seq2SeqTrainingArguments
) -> dict[str, float]:
    """Train, evaluate and predict as `training_args` ask (`do_train`, `do_eval`, `do_predict`); returns the
    metrics of each (`train_*`, `eval_*`, `predict_*`), which are also saved in the output folder
    (`all_results.json` and one file a step) with the fine-tuned model and its tokenizer.

    Raises:
        ValueError: none of the three steps asked for, or a step without its pairs.
    """
    if not (training_args.do_train or training_args.do_eval or training_args.do_predict):
        raise ValueError("Nothing to do: give --do_train, --do_eval or --do_predict.")
    set_seed(training_args.seed)
    # The example's flags for evaluation's generate(), where the training arguments leave them unset.
    training_args.generation_max_length = (
        training_args.generation_max_length or data_args.val_max_target_length
    )
    training_args.generation_num_beams = data_args.num_beams or training_args.generation_num_beams

    steps = {
        "train": (training_args.do_train, data_args.train_file, data_args.max_train_samples),
        "validation": (training_args.do_eval, data_args.validation_file, data_args.max_eval_samples),
        "test": (training_args.do_predict, data_args.test_file, data_args.max_predict_samples),
    }
    # Every split asked for is read before the model loads, so that a missing one is refused first.
    pairs = {
        split: _split(data_args, split, file, limit) for split, (asked, file, limit) in steps.items() if asked
    }
    hub = {
        "cache_dir": model_args.cache_dir,
        "revision": model_args.model_revision,
        "token": model_args.token,
    }
    tokenizer = load_tokenizer(model_args.tokenizer_name or model_args.model_name_or_path, **hub)
    model = load_pretrained(
        AutoModelForSeq2SeqLM,
        model_args.model_name_or_path,
        trust_remote_code=model_args.trust_remote_code,
        **hub,
    )
    data = {split: _tokenized(split_pairs, tokenizer, data_args) for split, split_pairs in pairs.items()}
    trainer = Seq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=data.get("train"),
        eval_dataset=data.get("validation"),
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        compute_metrics=(lambda prediction: dev_bleu(tokenizer, prediction))
        if training_args.predict_with_generate
        else None,
    )
    metrics: dict[str, float] = {}
    if training_args.do_train:
        result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        trainer.save_model()
        trainer.save_state()
        metrics |= _saved(trainer, "train", {**result.metrics, "train_samples": len(data["train"])})
    if training_args.do_eval:
        evaluated = trainer.evaluate(metric_key_prefix="eval")
        metrics |= _saved(trainer, "eval", {**evaluated, "eval_samples": len(data["validation"])})
    if training_args.do_predict:
        predicted = trainer.predict(data["test"], metric_key_prefix="predict")
        metrics |= _saved(trainer, "predict", {**predicted.metrics, "predict_samples": len(data["test"])})
        if training_args.predict_with_generate and trainer.is_world_process_zero():
            _write_predictions(Path(training_args.output_dir), tokenizer, predicted.predictions)
    return metrics


def _saved(trainer: Seq2SeqTrainer, split: str, metrics: dict[str, float]) -> dict[str, float]:
    """`metrics` logged and saved as the example saves them (`{split}_results.json`, `all_results.json`)."""
    trainer.log_metrics(split, metrics)
    trainer.save_metrics(split, metrics)
    return metrics


def _write_predictions(output_dir: Path, tokenizer: PreTrainedTokenizerBase, predictions) -> Path:
    """The generated translations, one a line, in `PREDICTIONS_FILE`."""
    # The Trainer pads the gathered batches with -100, which is no token.
    ids = [[token for token in row if token >= 0] for row in predictions.tolist()]
    lines = [text.strip() for text in tokenizer.batch_decode(ids, skip_special_tokens=True)]
    path = output_dir / PREDICTIONS_FILE
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path
