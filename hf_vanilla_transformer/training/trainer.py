"""The Trainer of a translation run: `TokenBudgetSeq2SeqTrainer` (the label-smoothed Seq2SeqTrainer on
token-budget batches, Section 5.1, or on packed batches of one shape, `packing`), its arguments
(`training_arguments`, shared with the chatbot), how each
step's tokens are laid out over micro-batches and processes, the dev BLEU it may compute, and the run's
mixed precision: bf16 autocast where the hardware computes bf16 natively, else fp16 with loss scaling on a
GPU, with the CPU's bf16 training mode (`cpu_bf16_training`)."""

import math
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader
from transformers import PreTrainedTokenizerBase, Seq2SeqTrainingArguments
from transformers.trainer_utils import EvalPrediction, seed_worker

from .. import VanillaTransformerForConditionalGeneration
from ..common.cpu_speedups import fast_dropout_masks
from ..common.hardware import bf16_is_native, cpu_features
from ..evaluation.metrics import corpus_bleu
from .batching import TokenBudgetBatchSampler, bypass_accelerate_sharding, column_lengths
from .loss import LabelSmoothedSeq2SeqTrainer
from .packing import (
    SEGMENT_KEYS,
    PackedBatchSampler,
    PackingCollator,
    balanced_row_lengths,
    with_packed_masks,
)
from .presets import TrainingPreset
from .progress import TrainingClock
from .resume import NoStepPastTheEnd, whole_run_loss
from .settings import TrainingSettings
from .subword_dropout import SubwordDropoutDataset


def dev_bleu(tokenizer: PreTrainedTokenizerBase, prediction: EvalPrediction) -> dict[str, float]:
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


class TokenBudgetSeq2SeqTrainer(NoStepPastTheEnd, LabelSmoothedSeq2SeqTrainer):
    """The label-smoothed Seq2SeqTrainer whose training batches hold about `max_tokens` source and target
    tokens each (Section 5.1) instead of a fixed number of sentences; every process gets its own share.
    With `packed_row_length`, the training batches are packed (`packing`): rows of that many tokens on the
    side with more tokens (the other side's in proportion), as many rows as `max_tokens` holds, every batch
    of that one shape, carrying their pairs' segment ids to the device, where `compute_loss` builds their
    attention masks; evaluation keeps the `data_collator`'s padded batches. The target tokens trained on
    are counted on `clock` as the batches reach the training loop, so data-loading workers may collate
    them."""

    def __init__(
        self, *args, max_tokens: int, clock: TrainingClock, packed_row_length: int | None = None, **kwargs
    ) -> None:
        super().__init__(*args, **kwargs)
        self.max_tokens = max_tokens
        self.clock = clock
        self.packed_row_length = packed_row_length

    def get_train_dataloader(self) -> DataLoader:
        dataset = self.train_dataset
        sharding = dict(seed=self.args.seed, num_replicas=self.args.world_size, rank=self.args.process_index)
        collate = self.data_collator
        if self.packed_row_length is not None:
            dataset = self._remove_unused_columns(dataset, description="Training")
            sampler, collate = self._packing(dataset, sharding)
        elif isinstance(dataset, SubwordDropoutDataset):
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
            collate_fn=collate,
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

    def _packing(self, dataset: Any, sharding: dict[str, int]) -> tuple[PackedBatchSampler, PackingCollator]:
        """The packed batches' sampler and collator: rows sized to the data's two sides
        (`balanced_row_lengths`), as many as fit the micro-batch's token budget on the longer side."""
        sources, targets = column_lengths(dataset, "input_ids"), column_lengths(dataset, "labels")
        source_length, target_length = balanced_row_lengths(sources, targets, self.packed_row_length)
        rows = max(1, self.max_tokens // max(source_length, target_length))
        sampler = PackedBatchSampler(sources, targets, rows, source_length, target_length, **sharding)
        collator = PackingCollator(
            rows,
            source_length,
            target_length,
            self.processing_class.pad_token_id,
            self.model.config.decoder_start_token_id,
            with_masks=False,
        )
        return sampler, collator

    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: int | torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, Any]:
        """The loss of a batch, as `LabelSmoothedSeq2SeqTrainer` computes it; a packed batch's attention
        masks are built first, from its segment ids, on the device the batch is on, in the form the model's
        attention takes (block masks for flex attention)."""
        if SEGMENT_KEYS[0] in inputs:
            attention = self.accelerator.unwrap_model(model).config._attn_implementation
            inputs = with_packed_masks(inputs, attn_implementation=attention)
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def get_batch_samples(
        self, epoch_iterator: Iterator, num_batches: int, device: torch.device
    ) -> tuple[list, torch.Tensor | int | None]:
        """The micro-batches of the next optimizer step, as the Trainer takes them, counted on the clock."""
        batch_samples, num_items_in_batch = super().get_batch_samples(epoch_iterator, num_batches, device)
        for batch in batch_samples:
            self.clock.count_targets(batch["labels"])
        return batch_samples, num_items_in_batch

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Logs as the Trainer does, except that a resumed run's `train_loss` is the mean over the whole run
        (`resume.whole_run_loss`), not over the steps since the resume only."""
        if "train_loss" in logs and self._initial_global_step > 0:
            logs["train_loss"] = whole_run_loss(
                self.state.log_history, logs["train_loss"], self._initial_global_step, self.state.global_step
            )
        super().log(logs, start_time)


def mixed_precision(settings: TrainingSettings, recipe: TrainingPreset) -> str:
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


def precision_words(precision: str, recipe: TrainingPreset) -> str:
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


def batch_layout(recipe: TrainingPreset, world_size: int) -> tuple[int, int]:
    """(tokens per micro-batch and device, gradient accumulation steps) for about `tokens_per_step` tokens
    per optimizer step over all devices (Section 5.1). `max_tokens` caps the micro-batch; when the devices
    together hold more than a step, each takes its share of the step instead (8 GPUs: the paper's 3125)."""
    accumulation = math.ceil(recipe.tokens_per_step / (recipe.max_tokens * world_size))
    return math.ceil(recipe.tokens_per_step / (world_size * accumulation)), accumulation


def training_arguments(
    output_dir: Path,
    *,
    seed: int,
    eval_batch_size: int,
    keep_checkpoints: int,
    logging_steps: int,
    report_to: str,
    **schedule: Any,
) -> Seq2SeqTrainingArguments:
    """The Trainer's arguments of every training run of this package (translation and chatbot alike): the
    run's folder, seed, evaluation batch, checkpoints kept, logging interval and tracker, and gradients left
    unclipped as in the paper. `schedule` holds what a kind of run sets its own way: how long it trains, when
    it saves and evaluates, its batches, precision and data loading."""
    return Seq2SeqTrainingArguments(
        output_dir=str(output_dir),
        seed=seed,
        per_device_eval_batch_size=eval_batch_size,
        save_total_limit=keep_checkpoints,
        logging_steps=logging_steps,
        report_to=report_to,
        max_grad_norm=0.0,  # the paper clips nothing; Trainer would clip at 1.0
        **schedule,
    )
