"""The paper's training recipe (Section 5) as one pipeline of stages, in the order `run_training` calls them:

1. the run (`_start_run`): the recipe, `presets` with the given `settings` on top, and the checkpoint it
   resumes from, checked against what the run recorded (`resume`, `training_recipe.json`);
2. the data (`_load_data`): training, dev and test pairs (`data`), with back-translated pairs
   (`backtranslation`);
3. the tokenizer and model (`_tokenizer_and_model`): the shared BPE vocabulary of Section 5.1 and the model
   to train or fine-tune;
4. the tokenized pairs (`_tokenize_data`), resegmented every epoch under `subword_dropout`;
5. the Trainer (`_build_trainer`): `trainer.TokenBudgetSeq2SeqTrainer` with Adam(0.9, 0.98, 1e-9) and the
   warm-up / inverse-square-root learning rate (Section 5.3, `schedule`), the clock, progress lines and early
   stopping;
6. training (`_train`), checkpoints every `save_steps`, the last K kept, resumable after a crash; the
   training time and target tokens of every segment are stored with each checkpoint, so the time budget and
   the tokens/s figure cover the whole run;
7. the final model (`_finish`): the last K checkpoints averaged (Section 6.1), evaluated with the paper's
   beam search and sacreBLEU (`run_report`), its length penalty chosen on the dev set where the recipe says
   so, and saved with `results.json`, which names the run's data and model folder relative to the run.

`run_training` is what the `train` command calls; tests call it too. Progress goes to the
`hf_vanilla_transformer` logger (`transformers.utils.logging`), from the main process only.
"""

import gc
import json
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from accelerate import PartialState
from datasets import Dataset
from transformers import (
    DataCollatorForSeq2Seq,
    PreTrainedTokenizerBase,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
)
from transformers.utils import is_torch_tf32_available, logging

from .. import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from ..common.cpu_speedups import cpu_decoding, cpu_training
from ..common.model_location import RESULTS_FILE
from ..common.model_weights import load_pretrained
from ..common.tokenization import load_tokenizer, train_shared_bpe_tokenizer
from ..vanilla_transformer.generation_vanilla_transformer import paper_generation_config
from .averaging import average_checkpoints, last_checkpoints
from .backtranslation import (
    check_tag,
    load_synthetic_pairs,
    synthetic_record,
    synthetic_special_tokens,
    with_synthetic_pairs,
)
from .compilation import (
    SEQUENCE_MULTIPLE,
    CompileCache,
    CompiledTrainingLoss,
    inductor_cache_dir,
    run_folder_inductor_cache,
)
from .data import load_parallel_data, tokenize_pairs
from .early_stopping import DevEarlyStopping, early_stopping_of, early_stopping_record
from .legacy import drop_legacy_label_smoothing, with_recorded_label_smoothing
from .length_buckets import BucketPadding
from .presets import TrainingPreset
from .progress import DevLossCallback, TrainingClock, show_progress_lines, use_progress_bar
from .resume import (
    RECIPE_FILE,
    LossLoggedAtCheckpoints,
    check_same_model,
    check_same_recipe,
    find_resume_checkpoint,
    recipe_record,
    write_run_record,
)
from .run_report import final_scores, format_summary, results_record
from .schedule import build_paper_optimizer, get_noam_schedule
from .settings import SET_BY_THE_RUN, TrainingSettings
from .subword_dropout import SubwordDropoutDataset
from .trainer import (
    TokenBudgetSeq2SeqTrainer,
    batch_layout,
    cpu_bf16_training,
    dev_bleu,
    mixed_precision,
    precision_words,
    training_arguments,
)

TOKENIZER_DIR = "tokenizer"
FINAL_MODEL_DIR = "model"

logger = logging.get_logger(__name__)


@dataclass
class _Run:
    """What every stage of a run needs to know: its settings and recipe, folder, processes, the checkpoint
    it resumes from (None for a new run) and its mixed precision."""

    settings: TrainingSettings
    recipe: TrainingPreset
    output_dir: Path
    state: PartialState
    checkpoint: Path | None
    precision: str


@dataclass
class _Data:
    """The run's pairs (dev, test and the synthetic training pairs, untagged, None where it has no such set)
    and, once tokenized, its datasets (the training set: the real and the tagged synthetic pairs)."""

    train_pairs: Dataset
    dev_pairs: Dataset | None
    test_pairs: Dataset | None
    synthetic_pairs: Dataset | None = None
    train_dataset: Dataset | SubwordDropoutDataset | None = None
    dev_dataset: Dataset | None = None


def run_training(settings: TrainingSettings) -> dict[str, Any]:
    """Train, average, evaluate and save; returns the run's figures, which results.json records with the data
    and the model folder named relative to the run (`run_report.results_record`). Inductor's cache is the
    run folder's for the run where `--inductor-cache-in-run-folder` asks (`run_folder_inductor_cache`; the
    settings refuse it to an eager run)."""
    asked = settings.inductor_cache_in_run_folder
    with inductor_cache_dir(run_folder_inductor_cache(settings.output_dir) if asked else None):
        run = _start_run(settings)
        data = _load_data(run)
        tokenizer, model = _tokenizer_and_model(run, data)
        _tokenize_data(run, data, tokenizer)
        trainer = _build_trainer(run, data, tokenizer, model)
        _train(run, trainer)
        return _finish(run, data, trainer, tokenizer)


def _start_run(settings: TrainingSettings) -> _Run:
    """The run about to start: its progress lines shown, and the checkpoint it resumes from, refused when
    the run recorded another recipe."""
    recipe = settings.recipe()
    output_dir = Path(settings.output_dir)
    state = PartialState(cpu=not torch.cuda.is_available())
    show_progress_lines(state.is_main_process)
    checkpoint = find_resume_checkpoint(output_dir, settings.resume, state)
    recipe = with_recorded_label_smoothing(
        recipe,
        settings.label_smoothing is not None,
        checkpoint if checkpoint is not None else settings.init_from,
    )
    if checkpoint is not None:
        check_same_recipe(output_dir, _recipe_record(settings, recipe, state))
    return _Run(settings, recipe, output_dir, state, checkpoint, mixed_precision(settings, recipe))


def _recipe_record(settings: TrainingSettings, recipe: TrainingPreset, state: PartialState) -> dict[str, Any]:
    """What `RECIPE_FILE` records of the run."""
    return recipe_record(settings.preset, settings.seed, recipe, state.num_processes) | synthetic_record(
        settings
    )


def _load_data(run: _Run) -> _Data:
    """Data stage, first half: the training, dev and test pairs."""
    settings = run.settings
    return _Data(
        _load_split(settings, settings.train, settings.train_target, settings.train_split),
        _load_split(settings, settings.dev, settings.dev_target, settings.dev_split),
        _load_split(settings, settings.test, settings.test_target, settings.test_split),
        load_synthetic_pairs(settings),
    )


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


def _tokenizer_and_model(
    run: _Run, data: _Data
) -> tuple[PreTrainedTokenizerBase, VanillaTransformerForConditionalGeneration]:
    """Tokenizer and model stage: the vocabulary and the model to train (checked against the checkpoint
    resumed from). A new run's recipe is recorded once they are known to load: a refused run leaves no
    recipe behind."""
    settings, recipe = run.settings, run.recipe
    tokenizer = _prepare_tokenizer(
        settings, recipe, run.output_dir, data.train_pairs, run.checkpoint is not None
    )
    check_tag(tokenizer, settings, data.train_pairs, data.synthetic_pairs)
    model = _build_model(settings, recipe, tokenizer)
    if run.checkpoint is not None:
        check_same_model(run.checkpoint, model.config)
    else:
        write_run_record(run.output_dir, RECIPE_FILE, _recipe_record(settings, recipe, run.state), run.state)
    return tokenizer, model


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
            tokenizer = train_shared_bpe_tokenizer(
                train_pairs,
                vocab_size=recipe.vocab_size,
                extra_special_tokens=synthetic_special_tokens(settings),
            )
        else:
            tokenizer = load_tokenizer(saved_dir)
        if state.is_main_process:
            tokenizer.save_pretrained(saved_dir)
    return tokenizer


def _same_vocabulary(a: PreTrainedTokenizerBase, b: PreTrainedTokenizerBase) -> bool:
    return a.get_vocab() == b.get_vocab()


def _build_model(
    settings: TrainingSettings, recipe: TrainingPreset, tokenizer: PreTrainedTokenizerBase
) -> VanillaTransformerForConditionalGeneration:
    if settings.init_from is not None:
        model = load_pretrained(VanillaTransformerForConditionalGeneration, settings.init_from)
        # Read into the recipe (`legacy.with_recorded_label_smoothing`); the results record it.
        drop_legacy_label_smoothing(model.config)
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


def _tokenize_data(run: _Run, data: _Data, tokenizer: PreTrainedTokenizerBase) -> None:
    """Data stage, second half (once the tokenizer is known): the training pairs tokenized (resegmented
    every epoch under subword dropout) and the dev pairs tokenized."""
    settings, recipe = run.settings, run.recipe
    tokenize = partial(
        tokenize_pairs,
        tokenizer=tokenizer,
        max_source_length=recipe.max_length,
        max_target_length=recipe.max_length,
        long_pairs=settings.long_pairs,
    )
    data.train_dataset = tokenize(with_synthetic_pairs(data.train_pairs, data.synthetic_pairs, settings))
    if recipe.subword_dropout > 0:
        data.train_dataset = SubwordDropoutDataset(
            data.train_dataset,
            tokenizer,
            recipe.subword_dropout,
            seed=settings.seed,
            max_length=recipe.max_length,
        )
    data.dev_dataset = None if data.dev_pairs is None else tokenize(data.dev_pairs)


def _build_trainer(
    run: _Run,
    data: _Data,
    tokenizer: PreTrainedTokenizerBase,
    model: VanillaTransformerForConditionalGeneration,
) -> TokenBudgetSeq2SeqTrainer:
    """Trainer stage: the Trainer's arguments, the paper's optimizer and schedule, the clock, the dev-loss
    lines and the progress bar."""
    settings, recipe = run.settings, run.recipe
    micro_batch_tokens, accumulation = batch_layout(recipe, run.state.num_processes)
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
        args=_arguments(run, accumulation, has_dev=data.dev_dataset is not None),
        train_dataset=data.train_dataset,
        eval_dataset=data.dev_dataset,
        data_collator=_collator(recipe, tokenizer, model),
        processing_class=tokenizer,
        optimizers=(optimizer, scheduler),
        compute_metrics=partial(dev_bleu, tokenizer) if settings.eval_bleu else None,
        # After the clock, which may ask for a save: the loss is logged at every checkpoint.
        callbacks=[DevLossCallback(), clock, LossLoggedAtCheckpoints()]
        + ([DevEarlyStopping(settings.patience)] if settings.patience is not None else []),
        max_tokens=micro_batch_tokens,
        clock=clock,
        packed_row_length=recipe.packed_row_length,
        label_smoothing=recipe.label_smoothing,
        compiled_loss=_compiled_loss(recipe),
    )
    if recipe.compile:
        trainer.add_callback(CompileCache(run.output_dir))
    use_progress_bar(trainer, clock)
    return trainer


def _compiled_loss(recipe: TrainingPreset) -> CompiledTrainingLoss | None:
    """The compiled forward and loss of a run with --compile (`compilation`), else None (eager)."""
    if not recipe.compile:
        return None
    return CompiledTrainingLoss(recipe.label_smoothing, static_shapes=recipe.packed_row_length is not None)


def _collator(
    recipe: TrainingPreset,
    tokenizer: PreTrainedTokenizerBase,
    model: VanillaTransformerForConditionalGeneration,
) -> DataCollatorForSeq2Seq | BucketPadding:
    """The pairs padded into batches: to each batch's longest (a compiled step's: rounded up to a multiple
    of `compilation.SEQUENCE_MULTIPLE`), or up to its length's bucket (such multiples already)."""
    multiple = SEQUENCE_MULTIPLE if recipe.compile else None
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, pad_to_multiple_of=multiple)
    return BucketPadding(collator, tokenizer.pad_token_id) if recipe.length_buckets else collator


def _arguments(run: _Run, accumulation: int, has_dev: bool) -> Seq2SeqTrainingArguments:
    """The Trainer's arguments of a translation run: steps, saves and dev evaluations every so many steps."""
    settings, recipe = run.settings, run.recipe
    workers = settings.workers()
    return training_arguments(
        run.output_dir,
        seed=settings.seed,
        eval_batch_size=settings.eval_batch_size,
        keep_checkpoints=recipe.keep_checkpoints,
        logging_steps=max(1, min(50, recipe.max_steps // 20)),
        report_to=settings.report_to,
        max_steps=recipe.max_steps,
        gradient_accumulation_steps=accumulation,
        save_strategy="steps",
        save_steps=recipe.save_steps,
        eval_strategy="steps" if has_dev else "no",
        eval_steps=recipe.eval_steps,
        bf16=run.precision == "bf16",
        fp16=run.precision == "fp16",
        # TF32 matrix products on Ampere and newer GPUs; TrainingArguments refuses tf32=True elsewhere.
        tf32=True if is_torch_tf32_available() else None,
        use_cpu=not torch.cuda.is_available(),
        dataloader_num_workers=workers,
        # Workers forked once for the run rather than for every epoch and every dev evaluation; but a
        # dataset resegmented each epoch must reach them anew with the epoch that the Trainer sets.
        dataloader_persistent_workers=workers > 0 and recipe.subword_dropout == 0,
        ddp_find_unused_parameters=False,
        # A compiled step (`compilation`) keeps its loss on the device: no NaN check that waits for it.
        logging_nan_inf_filter=not recipe.compile,
        predict_with_generate=settings.eval_bleu,
        generation_num_beams=settings.num_beams,
        # Early stopping: the best dev evaluation's checkpoint is kept, and loaded when training ends.
        load_best_model_at_end=settings.patience is not None,
        metric_for_best_model=_best_metric(settings) if settings.patience is not None else None,
    )


def _best_metric(settings: TrainingSettings) -> str:
    """The dev score that early stopping watches: BLEU where the run scores it during training, else loss."""
    return "bleu" if settings.eval_bleu else "loss"


def _train(run: _Run, trainer: TokenBudgetSeq2SeqTrainer) -> None:
    """Train (from the checkpoint resumed from, if any), after a line that says what the run does."""
    recipe, model = run.recipe, trainer.model
    micro_batch_tokens = trainer.max_tokens
    accumulation = trainer.args.gradient_accumulation_steps
    millions = sum(p.numel() for p in model.parameters()) / 1e6
    logger.info(
        f"Training {recipe.model_preset} ({millions:.1f}M parameters) "
        f"on {len(trainer.train_dataset):,} pairs: {recipe.max_steps} steps"
        + (f" or {recipe.max_minutes:g} minutes, whichever ends first," if recipe.max_minutes else "")
        + f" of ~{recipe.tokens_per_step} tokens "
        f"({micro_batch_tokens} per micro-batch x {accumulation} accumulation x {run.state.num_processes} "
        f"process(es)), warmup {recipe.warmup_steps}, {precision_words(run.precision, recipe)}, "
        + (f"pairs packed in rows of {recipe.packed_row_length} tokens, " if recipe.packed_row_length else "")
        + ("the step compiled (--no-compile: eager), " if recipe.compile else "")
        + f"output {run.output_dir}"
    )
    on_cpu = not torch.cuda.is_available()
    with cpu_training(model) if on_cpu else nullcontext():
        with cpu_bf16_training(model) if on_cpu and run.precision == "bf16" else nullcontext():
            trainer.train(resume_from_checkpoint=str(run.checkpoint) if run.checkpoint else None)


def _finish(
    run: _Run, data: _Data, trainer: TokenBudgetSeq2SeqTrainer, tokenizer: PreTrainedTokenizerBase
) -> dict[str, Any]:
    """Finish stage: the final model (averaged checkpoints), its dev loss, then on the main process its
    length penalty chosen on the dev set, its dev and test BLEU, and the model, tokenizer, generation
    config and results saved. Returns the results (empty on the other processes)."""
    model, averaged = _final_model(run, trainer)
    results = _run_figures(run, trainer, model, averaged)
    if trainer.eval_dataset is not None:
        # Every process takes part: the Trainer's evaluation gathers across them. Its loss only: the dev BLEU
        # of the final model follows, on the dev set's own text.
        trainer.model, trainer.compute_metrics = model, None
        results["dev_loss"] = round(trainer.evaluate()["eval_loss"], 4)
    _leave_process_group(run.state, trainer)
    if not run.state.is_main_process:
        return {}
    # The final model decodes the dev and test sets with the CPU speed-ups of `translate` in place.
    with cpu_decoding(model) if model.device.type == "cpu" else nullcontext():
        return _score_and_save(run, data, model, tokenizer, results)


def _final_model(
    run: _Run, trainer: TokenBudgetSeq2SeqTrainer
) -> tuple[VanillaTransformerForConditionalGeneration, list[Path]]:
    """The final model, loaded from `FINAL_MODEL_DIR`: the last K checkpoints averaged (Section 6.1; a short
    run may have saved fewer), else the trained weights; with the generation config of its scores. Also
    the checkpoints averaged (none when not)."""
    final_dir = run.output_dir / FINAL_MODEL_DIR
    available = last_checkpoints(run.output_dir, k=None)
    averaged = available[-run.recipe.average_checkpoints :] if run.recipe.average_checkpoints > 1 else []
    averaged = averaged if len(averaged) > 1 else []
    if run.settings.patience is not None:
        # Early stopping: the Trainer loaded the best evaluation's checkpoint, which is the final model.
        averaged = []
        logger.info(f"Final model: the best dev evaluation's, {trainer.state.best_model_checkpoint}")
    if run.state.is_main_process:
        if averaged:
            average_checkpoints(averaged, final_dir, overwrite=True)
            logger.info(
                f"Averaged the last {len(averaged)} checkpoints: {', '.join(c.name for c in averaged)}"
            )
        else:
            trainer.model.save_pretrained(final_dir)
    run.state.wait_for_everyone()
    model = VanillaTransformerForConditionalGeneration.from_pretrained(final_dir).to(trainer.args.device)
    # The model decodes with the beam size its scores below were measured with (and its alpha chosen for);
    # a greedy evaluation leaves it the paper's beam search.
    num_beams = run.settings.num_beams
    beam = {"num_beams": num_beams} if num_beams > 1 else {}
    model.generation_config = paper_generation_config(model.config, **beam)
    return model, averaged


def _run_figures(
    run: _Run,
    trainer: TokenBudgetSeq2SeqTrainer,
    model: VanillaTransformerForConditionalGeneration,
    averaged: list[Path],
) -> dict[str, Any]:
    """What results.json records of the run before its BLEU scores."""
    settings, clock = run.settings, trainer.clock
    train_seconds = clock.train_seconds
    history = trainer.state.log_history
    train_loss = next((entry["train_loss"] for entry in reversed(history) if "train_loss" in entry), None)
    early_stopping = early_stopping_of(trainer)
    return {
        "preset": settings.preset,
        "label_smoothing": run.recipe.label_smoothing,
        "steps": trainer.state.global_step,
        "train_loss": train_loss,
        "train_pairs": len(trainer.train_dataset),
        "train_seconds": round(train_seconds, 1),
        "target_tokens_per_second": round(clock.target_tokens / train_seconds, 1)
        if train_seconds > 0
        else None,
        "parameters": sum(p.numel() for p in model.parameters()),
        "mixed_precision": run.precision,
        "processes": run.state.num_processes,
        "averaged_checkpoints": [p.name for p in averaged],
        **(
            {"early_stopping": early_stopping_record(early_stopping, trainer.state, _best_metric(settings))}
            if early_stopping is not None
            else {}
        ),
        "dataset": settings.train,
        "src_lang": settings.src_lang,
        "tgt_lang": settings.tgt_lang,
        "model_dir": str(run.output_dir / FINAL_MODEL_DIR),
    }


def _leave_process_group(state: PartialState, trainer: Seq2SeqTrainer) -> None:
    """Every process leaves the group once no collective follows: a worker that exits with the group alive
    can die with SIGABRT when gloo's threads outlive the interpreter.

    The group must not be freed by the DDP wrapper's reducer when the run's objects go away: the last owner
    of a gloo group joins gloo's threads while it holds the GIL, and a gloo thread still freeing the tensors
    of a finished gather waits for the GIL, so the process hangs at exit. The wrapper is therefore released
    while the group is still registered, and the group itself only after a barrier, which lets gloo's threads
    finish the last gather first.

    A run without a process group has none to leave, and skips the garbage collections.
    """
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    trainer.accelerator.free_memory()
    trainer.model_wrapped = trainer.model
    gc.collect()
    state.wait_for_everyone()
    state.destroy_process_group()


def _score_and_save(
    run: _Run,
    data: _Data,
    model: VanillaTransformerForConditionalGeneration,
    tokenizer: PreTrainedTokenizerBase,
    results: dict[str, Any],
) -> dict[str, Any]:
    """The final model's dev and test BLEU (its length penalty chosen on the dev set where the recipe says
    so; the test BLEU the paper's way too), saved with its tokenizer, generation config and `results`
    (with no absolute local path: `run_report.results_record`), which it returns with the scores."""
    settings = run.settings
    final_dir = run.output_dir / FINAL_MODEL_DIR
    model.save_pretrained(final_dir)
    tokenizer.save_pretrained(final_dir)
    results |= final_scores(
        model,
        tokenizer,
        _texts(data.dev_pairs, settings.max_eval_sentences),
        _texts(data.test_pairs, settings.max_eval_sentences),
        test_set=settings.test,
        num_beams=settings.num_beams,
        batch_size=settings.eval_batch_size,
        tune_length_penalty=run.recipe.tune_length_penalty and settings.num_beams > 1,
        target_language=settings.tgt_lang,
    )
    # The length penalty chosen on the dev set, for every later translation with the model.
    model.generation_config.save_pretrained(final_dir)
    record = results_record(results, run.output_dir)
    (final_dir / RESULTS_FILE).write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    logger.info(format_summary(results))
    return results


def _texts(pairs: Dataset | None, limit: int | None) -> tuple[list[str], list[str]] | None:
    """The source sentences and references of `pairs`, the first `limit` of them where given."""
    if pairs is None:
        return None
    return list(pairs["src"])[:limit], list(pairs["tgt"])[:limit]
