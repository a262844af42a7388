"""The paper's training recipe (Section 5) on transformers' Seq2SeqTrainer.

- Batches of about N source and N target tokens of similar length (Section 5.1), with gradient
  accumulation making up for fewer devices than the paper's 8 GPUs.
- Adam(0.9, 0.98, 1e-9) with the warm-up / inverse-square-root learning rate (Section 5.3).
- Label smoothing from the recipe (`loss`), dropout from the model config (Section 5.4).
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
import math
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, replace
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
from transformers.integrations.integration_utils import (
    INTEGRATION_TO_CALLBACK,
    get_available_reporting_integrations,
    is_flytekit_available,
)
from transformers.trainer_utils import EvalPrediction, seed_worker
from transformers.utils import is_torch_tf32_available, logging

from ..common.cli import non_negative_int, positive_int, random_seed
from ..common.model_location import RESULTS_FILE, loading
from ..common.model_weights import load_pretrained
from ..common.settings_schema import check_settings, optional_copy, setting
from ..common.tokenization import load_tokenizer, train_shared_bpe_tokenizer
from ..configuration_vanilla_transformer import (
    LEGACY_LABEL_SMOOTHING,
    VanillaTransformerConfig,
    legacy_label_smoothing,
)
from ..cpu_speedups import fast_dropout_masks
from ..evaluation.metrics import corpus_bleu
from ..generation_vanilla_transformer import paper_generation_config
from ..hardware import bf16_is_native, cpu_features
from ..modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from .averaging import average_checkpoints, last_checkpoints
from .backtranslation import (
    DEFAULT_TAG,
    check_synthetic_settings,
    check_tag,
    load_synthetic_pairs,
    synthetic_record,
    synthetic_special_tokens,
    tag_token,
    with_synthetic_pairs,
)
from .batching import TokenBudgetBatchSampler, bypass_accelerate_sharding
from .compilation import CompileCache, CompiledTrainingLoss
from .data import load_parallel_data, tokenize_pairs
from .early_stopping import DevEarlyStopping, early_stopping_of, early_stopping_record
from .length_buckets import BucketPadding
from .loss import LabelSmoothedSeq2SeqTrainer
from .presets import DATA, EVALUATION, MODEL, TRAINING, TRAINING_PRESETS, TrainingPreset
from .progress import DevLossCallback, TrainingClock, show_progress_lines, use_progress_bar
from .resume import (
    RECIPE_FILE,
    LossLoggedAtCheckpoints,
    NoStepPastTheEnd,
    check_same_model,
    check_same_recipe,
    find_resume_checkpoint,
    recipe_record,
    whole_run_loss,
    write_run_record,
)
from .run_report import final_scores, format_summary
from .schedule import build_paper_optimizer, get_noam_schedule
from .subword_dropout import SubwordDropoutDataset

TOKENIZER_DIR = "tokenizer"
FINAL_MODEL_DIR = "model"
# Data-loading worker processes per device when not given: enough to collate the next batches while the GPU
# computes. On a CPU the workers would take cores from the computation itself.
GPU_DATALOADER_WORKERS = 2

logger = logging.get_logger(__name__)


# The shipped Multi30k (data/ of the repository; an installed package has none): the default training data,
# and its dev and test sets, taken only when the run trains on it.
MULTI30K = Path(__file__).resolve().parents[2] / "data" / "multi30k"
DEFAULT_TRAIN = str(MULTI30K / "train")
DEFAULT_EVALUATION = {"dev": str(MULTI30K / "val"), "test": str(MULTI30K / "test_2016_flickr")}
# The default of `dev` and `test`: Multi30k's when training on the default data, else none.
AUTO = "auto"
# What `dev`, `test` (and their flags) take for no such set.
NONE = "none"
# What `report_to` takes: transformers' experiment trackers, "all" (every one installed) or "none".
REPORT_TO = ("none", "all", *sorted(INTEGRATION_TO_CALLBACK))

# The recipe settings a run may change, each None (the preset's) unless given: `TrainingPreset`'s fields.
RecipeOverrides = optional_copy(TrainingPreset, "RecipeOverrides")


def installed_trackers() -> set[str]:
    """The experiment trackers of `REPORT_TO` whose packages are installed."""
    # transformers' list of installed integrations leaves flyte out.
    return {*get_available_reporting_integrations(), *(["flyte"] if is_flytekit_available() else [])}


@dataclass
class TrainingSettings(RecipeOverrides):
    """Everything a run needs, each setting declared once here or (the recipe's: `max_steps`, `lr_scale`,
    `bf16`, ..., None for the preset's) in `TrainingPreset`, with its help text and check; the `train`
    command's flags are generated from these fields, and a value no run could use is refused (ValueError)
    when the settings are made, with the words the command line would use.

    `dev` and `test` default to "auto": Multi30k's val and test_2016_flickr sets when `train` is the shipped
    Multi30k, else none; None or "none" is no such set."""

    output_dir: str = setting(help="run folder: checkpoints, tokenizer, final model", required=True)
    preset: str = setting("cpu", "training recipe", choices=sorted(TRAINING_PRESETS))
    train: str = setting(DEFAULT_TRAIN, "training data: prefix, file or `datasets` name", group=DATA)
    train_target: str | None = setting(None, "target-side file when --train is the source file", group=DATA)
    dev: str | None = setting(
        AUTO,
        "dev set, like --train; 'none' to skip (default: Multi30k val when --train is the default)",
        group=DATA,
    )
    dev_target: str | None = setting(None, "target-side file when --dev is the source file", group=DATA)
    test: str | None = setting(
        AUTO,
        "test set, like --train; 'none' to skip (default: Multi30k test_2016_flickr when --train is the "
        "default)",
        group=DATA,
    )
    test_target: str | None = setting(None, "target-side file when --test is the source file", group=DATA)
    # Back-translation (docs/backtranslation.md): training pairs only, never dev or test.
    synthetic_source: str | None = setting(
        None,
        "synthetic training pairs' source file: the machine translations of --synthetic-target",
        group=DATA,
    )
    synthetic_target: str | None = setting(
        None, "synthetic training pairs' target file: target-language monolingual text", group=DATA
    )
    synthetic_tag: str | None = setting(
        DEFAULT_TAG,
        "token put in front of every synthetic source (tagged back-translation); 'none': untagged",
        check=tag_token,
        group=DATA,
    )
    src_lang: str = setting("en", "source language code: file suffix or `datasets` key", group=DATA)
    tgt_lang: str = setting("de", "target language code: file suffix or `datasets` key", group=DATA)
    dataset_config: str | None = setting(
        None, "config of a `datasets` name, e.g. de-en for wmt14", group=DATA
    )
    train_split: str = setting("train", "split of a `datasets` name", group=DATA)
    dev_split: str = setting("validation", "dev split of a `datasets` name", group=DATA)
    test_split: str = setting("test", "test split of a `datasets` name", group=DATA)
    long_pairs: str = setting(
        "filter", "what happens to longer pairs", group=DATA, choices=("filter", "truncate")
    )
    init_from: str | None = setting(
        None, "fine-tune this model folder or Hub id (and its tokenizer)", group=MODEL
    )
    tokenizer: str | None = setting(None, "use this tokenizer instead of training one", group=MODEL)
    # Added to the preset's model overrides; the command line reads them from KEY=VALUE words.
    model_overrides: dict[str, Any] = setting(
        help="config field or paper symbol, e.g. N=4, d_model=256, P_drop=0.3, "
        "position_embedding_type=learned; several may follow one flag, or repeat the flag",
        default_factory=dict,
        group=MODEL,
        flag="--model-override",
        action="extend",
        nargs="+",
        flag_default=[],
        metavar="KEY=VALUE",
    )
    seed: int = setting(1, "seed of the initialisation and data order", check=random_seed, group=TRAINING)
    resume: bool = setting(False, "continue from the last checkpoint", group=TRAINING)
    dataloader_workers: int | None = setting(
        None,
        "data-loading processes per device (default: 2 on a GPU, 0 on a CPU)",
        check=non_negative_int,
        group=TRAINING,
    )
    report_to: str = setting(
        "none",
        f"log losses and learning rates to this experiment tracker: {', '.join(REPORT_TO)}; all: every one "
        "installed",
        group=TRAINING,
        choices=REPORT_TO,
        metavar="TRACKER",
    )
    num_beams: int = setting(
        4,
        "beam size of the BLEU runs, and of the final model's generation config where above 1",
        check=positive_int,
        group=EVALUATION,
    )
    eval_batch_size: int = setting(
        64, "sentences per batch in evaluation", check=positive_int, group=EVALUATION
    )
    max_eval_sentences: int | None = setting(
        None,
        "translate only the first N dev and test sentences (the length penalty is then chosen on those)",
        check=positive_int,
        group=EVALUATION,
    )
    eval_bleu: bool = setting(
        False,
        "dev BLEU (beam search, sacreBLEU) at every dev evaluation during training, not only at the end",
        group=EVALUATION,
    )
    patience: int | None = setting(
        None,
        "stop once N dev evaluations in a row bring no better dev BLEU (with --eval-bleu; else dev loss), "
        "and make the best evaluation's checkpoint the final model instead of an average",
        check=positive_int,
        group=EVALUATION,
    )

    def __post_init__(self) -> None:
        """Resolve the dev and test sets, then refuse what no run could use: the checks with their own words
        first, then each field's check (`settings_schema.check_settings`)."""
        self._check_data()
        check_synthetic_settings(self)
        self.dev, self.test = self._evaluation_set(self.dev, "dev"), self._evaluation_set(self.test, "test")
        recipe = self.recipe()
        self.workers()
        self._check_model(recipe)
        self._check_evaluation(recipe)
        check_settings(self)
        self._check_environment()

    def _evaluation_set(self, given: str | None, split: str) -> str | None:
        """The dev or test set: the one given (None or 'none': none), else Multi30k's when training on it."""
        if given == AUTO:
            return DEFAULT_EVALUATION[split] if self.train == DEFAULT_TRAIN else None
        return None if given is None or given.lower() == NONE else given

    def _check_data(self) -> None:
        """Data and vocabulary settings that the run would otherwise ignore or misread."""
        for split in ("train", "dev", "test"):
            source, target = getattr(self, split), getattr(self, f"{split}_target")
            if target is not None and (source in (None, DEFAULT_TRAIN, AUTO) or source.lower() == NONE):
                raise ValueError(
                    f"--{split}-target names the target side of --{split}: give --{split} SOURCE_FILE too."
                )
        if self.src_lang == self.tgt_lang and self.train_target is None:
            raise ValueError(
                f"--src-lang and --tgt-lang are both {self.src_lang}: give the two languages of the pairs "
                "(for a monolingual task, give --train and --train-target as two files)."
            )
        given = {"--init-from": self.init_from, "--tokenizer": self.tokenizer}
        vocabulary_from = next((flag for flag, value in given.items() if value is not None), None)
        if self.vocab_size is not None and vocabulary_from is not None:
            raise ValueError(
                f"--vocab-size sizes a new vocabulary, but {vocabulary_from} brings its own: leave one of "
                "them out."
            )

    def _check_model(self, recipe: TrainingPreset) -> None:
        """The model overrides must make a valid config, and cannot change a model to fine-tune."""
        if self.init_from is not None and self.model_overrides:
            raise ValueError(
                f"--model-override ({', '.join(self.model_overrides)}) cannot change {self.init_from}: a "
                "fine-tuned model keeps the architecture it starts from."
            )
        try:
            VanillaTransformerConfig.from_preset(recipe.model_preset, **recipe.model_overrides)
        except (ValueError, TypeError) as error:
            raise ValueError(f"--model-override: {error}") from None

    def _check_evaluation(self, recipe: TrainingPreset) -> None:
        """Evaluation settings that need a dev set, a beam, or checkpoints at dev evaluations."""
        if self.patience is not None and self.dev is None:
            raise ValueError(
                "patience counts dev evaluations without a better score, but the run has none: pass --dev, "
                "or leave out --patience."
            )
        if self.patience is not None and recipe.save_steps % recipe.eval_steps != 0:
            raise ValueError(
                f"patience keeps the best dev evaluation's checkpoint, so checkpoints must fall on dev "
                f"evaluations, but --save-steps {recipe.save_steps} is not a multiple of --eval-steps "
                f"{recipe.eval_steps}: give e.g. --eval-steps {recipe.save_steps}."
            )
        if self.eval_bleu and self.dev is None:
            raise ValueError(
                "eval_bleu scores the dev set during training, but the run has none: pass --dev."
            )
        if self.tune_length_penalty and self.dev is None:
            raise ValueError(
                "tune_length_penalty chooses alpha on the dev set, but the run has none: pass --dev, or "
                "leave out --tune-length-penalty."
            )
        if self.tune_length_penalty and self.num_beams == 1:
            raise ValueError(
                "tune_length_penalty chooses alpha for beam search, but num_beams is 1 (greedy, where a "
                "length penalty changes nothing): give --num-beams 2 or more, or leave out "
                "--tune-length-penalty."
            )

    def _check_environment(self) -> None:
        """What the defaults and trackers need of this installation."""
        if self.train == DEFAULT_TRAIN and not MULTI30K.is_dir():
            raise ValueError(
                f"--train: the default, the repository's Multi30k, is not at {MULTI30K} (an installed "
                "package has no data/ folder); give --train, or run from a checkout."
            )
        if self.report_to not in ("none", "all") and self.report_to not in installed_trackers():
            raise ValueError(
                f"--report-to {self.report_to}: its package is not installed; install it (e.g. pip install "
                f"{self.report_to.replace('_', '-')}), or pick another tracker."
            )

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
        check_settings(recipe)
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


class TokenBudgetSeq2SeqTrainer(NoStepPastTheEnd, LabelSmoothedSeq2SeqTrainer):
    """The label-smoothed Seq2SeqTrainer whose training batches hold about `max_tokens` source and target
    tokens each (Section 5.1) instead of a fixed number of sentences; every process gets its own share.
    The target tokens trained on are counted on `clock` as the batches reach the training loop, so
    data-loading workers may collate them."""

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

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Logs as the Trainer does, except that a resumed run's `train_loss` is the mean over the whole run
        (`resume.whole_run_loss`), not over the steps since the resume only."""
        if "train_loss" in logs and self._initial_global_step > 0:
            logs["train_loss"] = whole_run_loss(
                self.state.log_history, logs["train_loss"], self._initial_global_step, self.state.global_step
            )
        super().log(logs, start_time)


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
        model = load_pretrained(VanillaTransformerForConditionalGeneration, settings.init_from)
        if legacy_label_smoothing(model.config) is not None:
            # Read into the recipe (`_with_recorded_label_smoothing`); the results record it.
            delattr(model.config, LEGACY_LABEL_SMOOTHING)
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


def _start_run(settings: TrainingSettings) -> _Run:
    """The run about to start: its progress lines shown, and the checkpoint it resumes from, refused when
    the run recorded another recipe."""
    recipe = settings.recipe()
    output_dir = Path(settings.output_dir)
    state = PartialState(cpu=not torch.cuda.is_available())
    show_progress_lines(state.is_main_process)
    checkpoint = find_resume_checkpoint(output_dir, settings.resume, state)
    recipe = _with_recorded_label_smoothing(settings, recipe, checkpoint)
    if checkpoint is not None:
        check_same_recipe(output_dir, _recipe_record(settings, recipe, state))
    return _Run(settings, recipe, output_dir, state, checkpoint, _mixed_precision(settings, recipe))


def _with_recorded_label_smoothing(
    settings: TrainingSettings, recipe: TrainingPreset, checkpoint: Path | None
) -> TrainingPreset:
    """The recipe, with the label smoothing that the model resumed or fine-tuned from records in its config
    (saved by an earlier version of the package, whose models kept it there) unless --label-smoothing is
    given."""
    origin = checkpoint if checkpoint is not None else settings.init_from
    if settings.label_smoothing is not None or origin is None:
        return recipe
    with loading(str(origin)):
        recorded = legacy_label_smoothing(VanillaTransformerConfig.from_pretrained(origin))
    if recorded is None:
        return recipe
    logger.info(f"Label smoothing {recorded}, as {origin}'s config records (--label-smoothing sets another).")
    return replace(recipe, label_smoothing=recorded)


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


def _build_trainer(
    run: _Run,
    data: _Data,
    tokenizer: PreTrainedTokenizerBase,
    model: VanillaTransformerForConditionalGeneration,
) -> TokenBudgetSeq2SeqTrainer:
    """Trainer stage: the Trainer's arguments, the paper's optimizer and schedule, the clock, the dev-loss
    lines and the progress bar."""
    settings, recipe = run.settings, run.recipe
    micro_batch_tokens, accumulation = _batch_layout(recipe, run.state.num_processes)
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
        compute_metrics=partial(_dev_bleu, tokenizer) if settings.eval_bleu else None,
        # After the clock, which may ask for a save: the loss is logged at every checkpoint.
        callbacks=[DevLossCallback(), clock, LossLoggedAtCheckpoints()]
        + ([DevEarlyStopping(settings.patience)] if settings.patience is not None else []),
        max_tokens=micro_batch_tokens,
        clock=clock,
        label_smoothing=recipe.label_smoothing,
        compiled_loss=_compiled_loss(recipe),
    )
    if recipe.compile:
        trainer.add_callback(CompileCache(run.output_dir))
    use_progress_bar(trainer, clock)
    return trainer


def _compiled_loss(recipe: TrainingPreset) -> CompiledTrainingLoss | None:
    """The compiled forward and loss of a run with --compile (`compilation`), else None (eager)."""
    return CompiledTrainingLoss(recipe.label_smoothing, recipe.max_length) if recipe.compile else None


def _collator(
    recipe: TrainingPreset,
    tokenizer: PreTrainedTokenizerBase,
    model: VanillaTransformerForConditionalGeneration,
) -> DataCollatorForSeq2Seq | BucketPadding:
    """The pairs padded into batches: to each batch's longest, or up to its length's bucket."""
    collator = DataCollatorForSeq2Seq(tokenizer, model=model)
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
        f"process(es)), warmup {recipe.warmup_steps}, {_precision_words(run.precision, recipe)}, "
        f"output {run.output_dir}"
    )
    on_cpu_in_bf16 = run.precision == "bf16" and not torch.cuda.is_available()
    with cpu_bf16_training(model) if on_cpu_in_bf16 else nullcontext():
        trainer.train(resume_from_checkpoint=str(run.checkpoint) if run.checkpoint else None)


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
    return _score_and_save(run, data, model, tokenizer, results)


def _score_and_save(
    run: _Run,
    data: _Data,
    model: VanillaTransformerForConditionalGeneration,
    tokenizer: PreTrainedTokenizerBase,
    results: dict[str, Any],
) -> dict[str, Any]:
    """The final model's dev and test BLEU (its length penalty chosen on the dev set where the recipe says
    so), saved with its tokenizer, generation config and `results`, which it returns with the scores."""
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
    )
    # The length penalty chosen on the dev set, for every later translation with the model.
    model.generation_config.save_pretrained(final_dir)
    (final_dir / RESULTS_FILE).write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    logger.info(format_summary(results))
    return results


def run_training(settings: TrainingSettings) -> dict[str, Any]:
    """Train, average, evaluate and save; returns (and writes to results.json) the run's figures."""
    run = _start_run(settings)
    data = _load_data(run)
    tokenizer, model = _tokenizer_and_model(run, data)
    _tokenize_data(run, data, tokenizer)
    trainer = _build_trainer(run, data, tokenizer, model)
    _train(run, trainer)
    return _finish(run, data, trainer, tokenizer)


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
