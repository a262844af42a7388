"""The paper's training recipe (Section 5) on transformers' Seq2SeqTrainer.

- Batches of about N source and N target tokens of similar length (Section 5.1), with gradient
  accumulation making up for fewer devices than the paper's 8 GPUs.
- Adam(0.9, 0.98, 1e-9) with the warm-up / inverse-square-root learning rate (Section 5.3).
- Label smoothing and dropout from the model config (Section 5.4).
- On GPUs: bf16 autocast where the GPU computes bf16 natively, else fp16 with loss scaling; TF32 matrix
  products where available; the data collated in worker processes.
- Checkpoints every `save_steps`, the last K kept, resumable after a crash (with the same model, recipe and
  number of processes, recorded in `training_recipe.json`); the training time and target tokens of every
  segment are stored with each checkpoint, so the time budget and the tokens/s figure cover the whole run.
  The last K checkpoints are averaged into the final model (Section 6.1), which is then evaluated with the
  paper's beam search and sacreBLEU (`run_report`), its length penalty chosen on the dev set where the
  recipe says so.

`run_training` is what the `train` command calls; tests call it too. Progress goes to the
`hf_vanilla_transformer` logger (`transformers.utils.logging`), from the main process only.
"""

import gc
import json
import logging as python_logging
import math
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import PartialState
from datasets import Dataset
from torch.utils.data import DataLoader
from transformers import (
    DataCollatorForSeq2Seq,
    PreTrainedTokenizerBase,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
)
from transformers.trainer_callback import ProgressCallback
from transformers.trainer_utils import EvalPrediction, seed_worker
from transformers.utils import is_torch_tf32_available, logging

from .averaging import average_checkpoints, last_checkpoints
from .batching import TokenBudgetBatchSampler, bypass_accelerate_sharding
from .configuration_vanilla_transformer import VanillaTransformerConfig
from .cpu_speedups import fast_dropout_masks
from .data import load_parallel_data, tokenize_pairs
from .evaluation import corpus_bleu
from .generation_vanilla_transformer import paper_generation_config
from .hardware import bf16_is_native, cpu_features
from .model_location import RESULTS_FILE, loading
from .modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from .presets import TRAINING_PRESETS, TrainingPreset
from .progress import DevLossCallback, TrainingClock, TrainingProgressBar
from .resume import RECIPE_FILE, check_same_model, check_same_recipe, find_resume_checkpoint, recipe_record
from .run_report import final_scores, format_summary
from .schedule import build_paper_optimizer, get_noam_schedule
from .subword_dropout import SubwordDropoutDataset
from .tokenization import load_tokenizer, train_shared_bpe_tokenizer

TOKENIZER_DIR = "tokenizer"
FINAL_MODEL_DIR = "model"
# Data-loading worker processes per device when not given: enough to collate the next batches while the GPU
# computes. On a CPU the workers would take cores from the computation itself.
GPU_DATALOADER_WORKERS = 2

logger = logging.get_logger(__name__)


@dataclass
class TrainingSettings:
    """Everything a run needs; the `train` command fills it from the command line.

    `dataloader_workers` is the number of data-loading processes per device (default: a few on a GPU, none
    on a CPU); `report_to` names the trackers the Trainer reports to ("none", "all", "tensorboard", ...);
    `eval_bleu` adds dev BLEU to every dev evaluation during training (beam search on the whole dev set);
    `tune_length_penalty` chooses the final model's length penalty on the dev set (None: as the preset
    says, where the run has a dev set and decodes with a beam)."""

    output_dir: str
    train: str = "data/multi30k/train"
    train_target: str | None = None
    dev: str | None = "data/multi30k/val"
    dev_target: str | None = None
    test: str | None = "data/multi30k/test_2016_flickr"
    test_target: str | None = None
    src_lang: str = "en"
    tgt_lang: str = "de"
    dataset_config: str | None = None
    train_split: str = "train"
    dev_split: str = "validation"
    test_split: str = "test"
    preset: str = "cpu"
    init_from: str | None = None
    tokenizer: str | None = None
    max_steps: int | None = None
    max_tokens: int | None = None
    tokens_per_step: int | None = None
    warmup_steps: int | None = None
    vocab_size: int | None = None
    save_steps: int | None = None
    keep_checkpoints: int | None = None
    average_checkpoints: int | None = None
    eval_steps: int | None = None
    lr_scale: float | None = None
    weight_decay: float | None = None
    cooldown_steps: int | None = None
    subword_dropout: float | None = None
    max_length: int | None = None
    max_minutes: float | None = None
    long_pairs: str = "filter"
    seed: int = 1
    resume: bool = False
    bf16: bool | None = None
    dataloader_workers: int | None = None
    report_to: str = "none"
    num_beams: int = 4
    eval_batch_size: int = 64
    max_eval_sentences: int | None = None
    eval_bleu: bool = False
    tune_length_penalty: bool | None = None
    model_overrides: dict[str, Any] = field(default_factory=dict)

    def recipe(self) -> TrainingPreset:
        """The preset with every explicitly given setting applied on top."""
        if self.preset not in TRAINING_PRESETS:
            raise ValueError(
                f"Unknown training preset {self.preset!r}: choose one of {sorted(TRAINING_PRESETS)}."
            )
        preset = TRAINING_PRESETS[self.preset]
        chosen = {k: v for k, v in asdict(self).items() if k in preset.__dataclass_fields__ and v is not None}
        chosen["model_overrides"] = {**preset.model_overrides, **self.model_overrides}
        if "max_steps" in chosen and "cooldown_steps" not in chosen:
            # A preset's cool-down is a share of its steps: a shorter or longer run keeps the same share.
            chosen["cooldown_steps"] = round(preset.cooldown_steps * chosen["max_steps"] / preset.max_steps)
        recipe = replace(preset, **chosen)
        for name in (
            "max_steps",
            "max_tokens",
            "tokens_per_step",
            "save_steps",
            "eval_steps",
            "keep_checkpoints",
            "average_checkpoints",
        ):
            if getattr(recipe, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(recipe, name)}.")
        if not 0 <= recipe.subword_dropout < 1:
            raise ValueError(f"subword_dropout must be at least 0 and below 1, got {recipe.subword_dropout}.")
        if not 0 <= recipe.cooldown_steps <= recipe.max_steps:
            raise ValueError(
                f"cooldown_steps must be between 0 and max_steps ({recipe.max_steps}), got "
                f"{recipe.cooldown_steps}: the cool-down is the last part of the run."
            )
        if recipe.average_checkpoints > recipe.keep_checkpoints:
            raise ValueError(
                f"average_checkpoints ({recipe.average_checkpoints}) exceeds keep_checkpoints "
                f"({recipe.keep_checkpoints}): only the last {recipe.keep_checkpoints} checkpoints stay on "
                f"disk to be averaged. Raise --keep-checkpoints to at least {recipe.average_checkpoints}, or "
                "average fewer."
            )
        return recipe

    def workers(self) -> int:
        """Data-loading worker processes per device: the given number, else a few on a GPU, none on a CPU."""
        if self.dataloader_workers is None:
            return GPU_DATALOADER_WORKERS if torch.cuda.is_available() else 0
        if self.dataloader_workers < 0:
            raise ValueError(
                f"dataloader_workers must be 0 (load in the training process) or more, got "
                f"{self.dataloader_workers}."
            )
        return self.dataloader_workers


def _dev_bleu(tokenizer: PreTrainedTokenizerBase, prediction: EvalPrediction) -> dict[str, float]:
    """sacreBLEU of the translations generated in a dev evaluation (Section 6.1), against the dev targets
    decoded from their token ids; the Trainer logs it as `eval_bleu`."""

    def decode(ids: np.ndarray) -> list[str]:
        # The Trainer pads the batches it gathers with -100, which is no token.
        texts = tokenizer.batch_decode(
            np.where(ids != -100, ids, tokenizer.pad_token_id), skip_special_tokens=True
        )
        return [text.strip() for text in texts]

    hypotheses, references = decode(prediction.predictions), decode(prediction.label_ids)
    return {"bleu": corpus_bleu(hypotheses, references).score}


class TokenBudgetSeq2SeqTrainer(Seq2SeqTrainer):
    """Seq2SeqTrainer whose training batches hold about `max_tokens` source and target tokens each
    (Section 5.1) instead of a fixed number of sentences; every process gets its own share. The target
    tokens trained on are counted on `clock` as the batches reach the training loop, so data-loading
    workers may collate them."""

    def __init__(self, *args, max_tokens: int, clock: TrainingClock, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.max_tokens = max_tokens
        self.clock = clock

    def get_train_dataloader(self) -> DataLoader:
        dataset = self.train_dataset
        sharding = dict(seed=self.args.seed, num_replicas=self.args.world_size, rank=self.args.process_index)
        if isinstance(dataset, SubwordDropoutDataset):
            # Resegmented every epoch (and holding only the model's inputs): each epoch packs its own lengths.
            sampler = TokenBudgetBatchSampler(
                *dataset.expected_lengths(), self.max_tokens, epoch_lengths=dataset.epoch_lengths, **sharding
            )
        else:
            dataset = self._remove_unused_columns(dataset, description="Training")
            sampler = TokenBudgetBatchSampler.from_dataset(dataset, self.max_tokens, **sharding)
        workers = self.args.dataloader_num_workers
        loader = DataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=self.data_collator,
            num_workers=workers,
            pin_memory=self.args.dataloader_pin_memory,
            persistent_workers=self.args.dataloader_persistent_workers,
            prefetch_factor=self.args.dataloader_prefetch_factor,
            worker_init_fn=partial(seed_worker, num_workers=workers, rank=self.args.process_index),
        )
        loader = self.accelerator.prepare(loader)
        # The sampler shards by process itself; accelerate must not shard its batches a second time.
        bypass_accelerate_sharding(loader, sampler)
        return loader

    def get_batch_samples(
        self, epoch_iterator: Iterator, num_batches: int, device: torch.device
    ) -> tuple[list, torch.Tensor | int | None]:
        """The micro-batches of the next optimizer step, as the Trainer takes them, counted on the clock."""
        batch_samples, num_items_in_batch = super().get_batch_samples(epoch_iterator, num_batches, device)
        for batch in batch_samples:
            self.clock.count_targets(batch["labels"])
        return batch_samples, num_items_in_batch


def _mixed_precision(settings: TrainingSettings, recipe: TrainingPreset) -> str:
    """The autocast of the run: "bf16", "fp16" or "no". An explicit --bf16 / --no-bf16 wins. A preset's bf16
    asks for half precision where it is fast: bf16 where it is native, fp16 with loss scaling on older GPUs
    (V100, T4), none on a CPU without native bf16 (`hardware.bf16_is_native`: the CPU's flags, not oneDNN's
    emulation)."""
    if settings.bf16 is not None:
        return "bf16" if settings.bf16 else "no"
    if not recipe.bf16:
        return "no"
    if bf16_is_native():
        return "bf16"
    return "fp16" if torch.cuda.is_available() else "no"


def _precision_words(precision: str, recipe: TrainingPreset) -> str:
    """The run's precision for the log, saying why a preset's bf16 was not taken on this CPU."""
    if precision != "no":
        return precision
    if recipe.bf16 and not torch.cuda.is_available():
        return f"float32 (this {cpu_features().kind} CPU computes no bf16 natively)"
    return "float32"


@contextmanager
def cpu_bf16_training(model: VanillaTransformerForConditionalGeneration) -> Iterator[None]:
    """Within the block, the fastest way we know to train in bf16 autocast on a CPU (benchmarks/RESULTS.md):
    eager attention, whose backward there is much faster than SDPA's at these sequence lengths, and dropout
    masks from `cpu_speedups.fast_dropout_masks`. Both are undone on the way out, so the model saved at
    the end is the same model whichever way it was trained."""
    attention = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with fast_dropout_masks(model):
            yield
    finally:
        model.set_attn_implementation(attention)


def _batch_layout(recipe: TrainingPreset, world_size: int) -> tuple[int, int]:
    """(tokens per micro-batch and device, gradient accumulation steps) for about `tokens_per_step` tokens
    per optimizer step over all devices (Section 5.1). `max_tokens` caps the micro-batch; when the devices
    together hold more than a step, each takes its share of the step instead (8 GPUs: the paper's 3125)."""
    accumulation = math.ceil(recipe.tokens_per_step / (recipe.max_tokens * world_size))
    return math.ceil(recipe.tokens_per_step / (world_size * accumulation)), accumulation


def _same_vocabulary(a: PreTrainedTokenizerBase, b: PreTrainedTokenizerBase) -> bool:
    return a.get_vocab() == b.get_vocab()


def _prepare_tokenizer(
    settings: TrainingSettings,
    recipe: TrainingPreset,
    output_dir: Path,
    train_pairs: Dataset,
    resuming: bool,
) -> PreTrainedTokenizerBase:
    """The shared source-target BPE vocabulary of Section 5.1: the run's own (when resuming), the one
    given, the fine-tuned model's, or a new one trained on the training data (main process only)."""
    saved_dir = output_dir / TOKENIZER_DIR
    requested = settings.tokenizer or settings.init_from
    if resuming and saved_dir.is_dir():
        tokenizer = load_tokenizer(saved_dir)
        if requested is not None and not _same_vocabulary(tokenizer, load_tokenizer(requested)):
            raise ValueError(
                f"Cannot resume: the vocabulary of {requested} differs from the run's own in {saved_dir}. "
                "Resume without --tokenizer, or start a new --output-dir."
            )
        return tokenizer
    state = PartialState(cpu=not torch.cuda.is_available())
    with state.main_process_first():
        if requested is not None:
            tokenizer = load_tokenizer(requested)
        elif state.is_main_process:
            tokenizer = train_shared_bpe_tokenizer(train_pairs, vocab_size=recipe.vocab_size)
        else:
            tokenizer = load_tokenizer(saved_dir)
        if state.is_main_process:
            tokenizer.save_pretrained(saved_dir)
    return tokenizer


# Config fields a new model takes from the tokenizer and the recipe, never from model overrides, and the
# setting that decides each.
SET_BY_THE_RUN = {
    "vocab_size": "--vocab-size",
    "decoder_vocab_size": "--vocab-size",
    "max_position_embeddings": "--max-length",
    "pad_token_id": "the tokenizer",
    "bos_token_id": "the tokenizer",
    "eos_token_id": "the tokenizer",
    "decoder_start_token_id": "the tokenizer",
}


def _build_model(
    settings: TrainingSettings, recipe: TrainingPreset, tokenizer: PreTrainedTokenizerBase
) -> VanillaTransformerForConditionalGeneration:
    if settings.init_from is not None:
        if settings.model_overrides:
            raise ValueError(
                f"--model-override ({', '.join(settings.model_overrides)}) cannot change "
                f"{settings.init_from}: a fine-tuned model keeps the architecture it starts from."
            )
        with loading(settings.init_from):
            model = VanillaTransformerForConditionalGeneration.from_pretrained(settings.init_from)
        if model.config.vocab_size < len(tokenizer):
            raise ValueError(
                f"The tokenizer has {len(tokenizer)} tokens but {settings.init_from} only "
                f"{model.config.vocab_size} embeddings: fine-tune with the model's own tokenizer."
            )
        return model
    if tokenizer.bos_token_id is None:
        raise ValueError(
            "The tokenizer has no bos token, which a new model's decoder starts from. Use a tokenizer made "
            "by train_shared_bpe_tokenizer, or add one with tokenizer.add_special_tokens({'bos_token': ...})."
        )
    set_by_the_run = sorted(recipe.model_overrides.keys() & SET_BY_THE_RUN.keys())
    if set_by_the_run:
        raise ValueError(
            f"Model overrides {set_by_the_run} are set by the run itself, from the tokenizer and max_length: "
            "use vocab_size (a new vocabulary) or max_length instead, or a tokenizer with those ids."
        )
    config = VanillaTransformerConfig.from_preset(
        recipe.model_preset,
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.bos_token_id,
        max_position_embeddings=max(1024, recipe.max_length),
        **recipe.model_overrides,
    )
    torch.manual_seed(settings.seed)
    model = VanillaTransformerForConditionalGeneration(config)
    model.generation_config = paper_generation_config(config)
    return model


def _load_split(settings: TrainingSettings, source: str | None, target: str | None, split: str):
    if source is None:
        return None
    return load_parallel_data(
        source,
        target,
        src_lang=settings.src_lang,
        tgt_lang=settings.tgt_lang,
        config=settings.dataset_config,
        split=split,
    )


def _texts(pairs: Dataset | None, limit: int | None) -> tuple[list[str], list[str]] | None:
    """The source sentences and references of `pairs`, the first `limit` of them where given."""
    if pairs is None:
        return None
    return list(pairs["src"])[:limit], list(pairs["tgt"])[:limit]


def _show_progress(is_main_process: bool) -> None:
    """Makes the run's progress lines visible: INFO and up from the main process, warnings from the others,
    as Trainer's `log_level` and `log_level_replica` do for transformers' logger, on stderr like
    transformers' default handler. A level or a handler the caller has set for the package wins."""
    package_logger = logging.get_logger(__package__)
    if package_logger.level == logging.NOTSET:
        package_logger.setLevel(logging.INFO if is_main_process else logging.WARNING)
    if not package_logger.hasHandlers():
        package_logger.addHandler(python_logging.StreamHandler())


def run_training(settings: TrainingSettings) -> dict[str, Any]:
    """Train, average, evaluate and save; returns (and writes to results.json) the run's figures."""
    recipe = settings.recipe()
    workers = settings.workers()
    if settings.eval_bleu and settings.dev is None:
        raise ValueError("eval_bleu scores the dev set during training, but the run has none: pass --dev.")
    if settings.tune_length_penalty and settings.dev is None:
        raise ValueError(
            "tune_length_penalty chooses alpha on the dev set, but the run has none: pass --dev, or leave "
            "out --tune-length-penalty."
        )
    if settings.tune_length_penalty and settings.num_beams == 1:
        raise ValueError(
            "tune_length_penalty chooses alpha for beam search, but num_beams is 1 (greedy, where a length "
            "penalty changes nothing): give --num-beams 2 or more, or leave out --tune-length-penalty."
        )
    output_dir = Path(settings.output_dir)
    state = PartialState(cpu=not torch.cuda.is_available())
    _show_progress(state.is_main_process)
    checkpoint = find_resume_checkpoint(output_dir, settings.resume, state)
    record = recipe_record(settings.preset, settings.seed, recipe, state.num_processes)
    if checkpoint is not None:
        check_same_recipe(output_dir, record)

    train_pairs = _load_split(settings, settings.train, settings.train_target, settings.train_split)
    dev_pairs = _load_split(settings, settings.dev, settings.dev_target, settings.dev_split)
    test_pairs = _load_split(settings, settings.test, settings.test_target, settings.test_split)

    # Both sides of the training pairs, read in Arrow batches.
    tokenizer = _prepare_tokenizer(settings, recipe, output_dir, train_pairs, checkpoint is not None)
    model = _build_model(settings, recipe, tokenizer)
    if checkpoint is not None:
        check_same_model(checkpoint, model.config)
    # Written once the data, tokenizer and model are known to load: a refused run leaves no recipe behind.
    if checkpoint is None and state.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / RECIPE_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")

    train_dataset = tokenize_pairs(
        train_pairs, tokenizer, recipe.max_length, recipe.max_length, settings.long_pairs
    )
    if recipe.subword_dropout > 0:
        train_dataset = SubwordDropoutDataset(
            train_dataset, tokenizer, recipe.subword_dropout, seed=settings.seed, max_length=recipe.max_length
        )
    dev_dataset = None
    if dev_pairs is not None:
        dev_dataset = tokenize_pairs(
            dev_pairs, tokenizer, recipe.max_length, recipe.max_length, settings.long_pairs
        )

    micro_batch_tokens, accumulation = _batch_layout(recipe, state.num_processes)
    precision = _mixed_precision(settings, recipe)
    args = Seq2SeqTrainingArguments(
        output_dir=str(output_dir),
        max_steps=recipe.max_steps,
        gradient_accumulation_steps=accumulation,
        per_device_eval_batch_size=settings.eval_batch_size,
        save_strategy="steps",
        save_steps=recipe.save_steps,
        save_total_limit=recipe.keep_checkpoints,
        eval_strategy="steps" if dev_dataset is not None else "no",
        eval_steps=recipe.eval_steps,
        logging_steps=max(1, min(50, recipe.max_steps // 20)),
        max_grad_norm=0.0,  # the paper clips nothing
        seed=settings.seed,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        # TF32 matrix products on Ampere and newer GPUs; TrainingArguments refuses tf32=True elsewhere.
        tf32=True if is_torch_tf32_available() else None,
        use_cpu=not torch.cuda.is_available(),
        report_to=settings.report_to,
        dataloader_num_workers=workers,
        # Workers forked once for the run rather than for every epoch and every dev evaluation; but a
        # dataset resegmented each epoch must reach them anew with the epoch that the Trainer sets.
        dataloader_persistent_workers=workers > 0 and recipe.subword_dropout == 0,
        ddp_find_unused_parameters=False,
        predict_with_generate=settings.eval_bleu,
        generation_num_beams=settings.num_beams,
    )
    optimizer = build_paper_optimizer(model, weight_decay=recipe.weight_decay)
    scheduler = get_noam_schedule(
        optimizer,
        model.config.d_model,
        recipe.warmup_steps,
        recipe.lr_scale,
        total_steps=recipe.max_steps,
        cooldown_steps=recipe.cooldown_steps,
    )
    clock = TrainingClock(recipe.max_minutes)
    trainer = TokenBudgetSeq2SeqTrainer(
        model=model,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=dev_dataset,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        processing_class=tokenizer,
        optimizers=(optimizer, scheduler),
        compute_metrics=partial(_dev_bleu, tokenizer) if settings.eval_bleu else None,
        callbacks=[DevLossCallback(), clock],
        max_tokens=micro_batch_tokens,
        clock=clock,
    )
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(TrainingProgressBar(clock))
    millions = sum(p.numel() for p in model.parameters()) / 1e6
    logger.info(
        f"Training {recipe.model_preset} ({millions:.1f}M parameters) "
        f"on {len(train_dataset):,} pairs: {recipe.max_steps} steps"
        + (f" or {recipe.max_minutes:g} minutes, whichever ends first," if recipe.max_minutes else "")
        + f" of ~{recipe.tokens_per_step} tokens "
        f"({micro_batch_tokens} per micro-batch x {accumulation} accumulation x {state.num_processes} "
        f"process(es)), warmup {recipe.warmup_steps}, {_precision_words(precision, recipe)}, "
        f"output {output_dir}"
    )
    with cpu_bf16_training(model) if precision == "bf16" and not torch.cuda.is_available() else nullcontext():
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    train_seconds = clock.train_seconds
    tokens_per_second = round(clock.target_tokens / train_seconds, 1) if train_seconds > 0 else None

    # Section 6.1 averages the last K checkpoints; a short run may have saved fewer.
    final_dir = output_dir / FINAL_MODEL_DIR
    available = last_checkpoints(output_dir, k=None)
    averaged = available[-recipe.average_checkpoints :] if recipe.average_checkpoints > 1 else []
    if state.is_main_process:
        if len(averaged) > 1:
            average_checkpoints(averaged, final_dir, overwrite=True)
            logger.info(
                f"Averaged the last {len(averaged)} checkpoints: {', '.join(c.name for c in averaged)}"
            )
        else:
            trainer.model.save_pretrained(final_dir)
    state.wait_for_everyone()
    model = VanillaTransformerForConditionalGeneration.from_pretrained(final_dir).to(trainer.args.device)
    # The model decodes with the beam size its scores below were measured with (and its alpha chosen for);
    # a greedy evaluation leaves it the paper's beam search.
    beam = {"num_beams": settings.num_beams} if settings.num_beams > 1 else {}
    model.generation_config = paper_generation_config(model.config, **beam)
    results: dict[str, Any] = {
        "preset": settings.preset,
        "steps": trainer.state.global_step,
        "train_pairs": len(train_dataset),
        "train_seconds": round(train_seconds, 1),
        "target_tokens_per_second": tokens_per_second,
        "parameters": sum(p.numel() for p in model.parameters()),
        "mixed_precision": precision,
        "processes": state.num_processes,
        "averaged_checkpoints": [p.name for p in averaged] if len(averaged) > 1 else [],
        "dataset": settings.train,
        "src_lang": settings.src_lang,
        "tgt_lang": settings.tgt_lang,
        "model_dir": str(final_dir),
    }
    if dev_dataset is not None:
        # Every process takes part: the Trainer's evaluation gathers across them. Its loss only: the dev BLEU
        # of the final model follows, on the dev set's own text.
        trainer.model, trainer.compute_metrics = model, None
        results["dev_loss"] = round(trainer.evaluate()["eval_loss"], 4)
    _leave_process_group(state, trainer)
    if not state.is_main_process:
        return {}

    model.save_pretrained(final_dir)
    tokenizer.save_pretrained(final_dir)
    results |= final_scores(
        model,
        tokenizer,
        _texts(dev_pairs, settings.max_eval_sentences),
        _texts(test_pairs, settings.max_eval_sentences),
        test_set=settings.test,
        num_beams=settings.num_beams,
        batch_size=settings.eval_batch_size,
        tune_length_penalty=recipe.tune_length_penalty and settings.num_beams > 1,
    )
    # The length penalty chosen on the dev set, for every later translation with the model.
    model.generation_config.save_pretrained(final_dir)
    (final_dir / RESULTS_FILE).write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    logger.info(format_summary(results))
    return results


def _leave_process_group(state: PartialState, trainer: Seq2SeqTrainer) -> None:
    """Every process leaves the group once no collective follows: a worker that exits with the group alive
    can die with SIGABRT when gloo's threads outlive the interpreter.

    The group must not be freed by the DDP wrapper's reducer when the run's objects go away: the last owner
    of a gloo group joins gloo's threads while it holds the GIL, and a gloo thread still freeing the tensors
    of a finished gather waits for the GIL, so the process hangs at exit. The wrapper is therefore released
    while the group is still registered, and the group itself only after a barrier, which lets gloo's threads
    finish the last gather first.
    """
    trainer.accelerator.free_memory()
    trainer.model_wrapped = trainer.model
    gc.collect()
    state.wait_for_everyone()
    state.destroy_process_group()
