"""What a `train` run is given: `TrainingSettings`, every setting declared once here or (the recipe's) in
`presets.TrainingPreset`, with its help text and check. The `train` command's flags are generated from these
fields (`common/settings_schema`), and a value no run could use is refused when the settings are made."""

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ..common.cli import non_negative_int, positive_int, random_seed
from ..common.settings_schema import check_settings, optional_copy, setting
from .backtranslation import DEFAULT_TAG, check_synthetic_settings, tag_token
from .presets import DATA, EVALUATION, MODEL, TRAINING, TRAINING_PRESETS, TrainingPreset

# Data-loading worker processes per device when not given: enough to collate the next batches while the GPU
# computes. On a CPU the workers would take cores from the computation itself.
GPU_DATALOADER_WORKERS = 2

# The shipped Multi30k (data/ of the repository; an installed package has none): the default training data,
# and its dev and test sets, taken only when the run trains on it.
MULTI30K = Path(__file__).resolve().parents[2] / "data" / "multi30k"
DEFAULT_TRAIN = str(MULTI30K / "train")
DEFAULT_EVALUATION = {"dev": str(MULTI30K / "val"), "test": str(MULTI30K / "test_2016_flickr")}
# The default of `dev` and `test`: Multi30k's when training on the default data, else none.
AUTO = "auto"
# What `dev`, `test` (and their flags) take for no such set.
NONE = "none"
# What `report_to` takes: transformers' experiment trackers (`INTEGRATION_TO_CALLBACK` of its
# integration_utils, the same from 5.4 to 5.24; named here so that the parser imports no transformers), "all"
# (every one installed) or "none".
TRACKERS = (
    "azure_ml",
    "clearml",
    "codecarbon",
    "comet_ml",
    "dagshub",
    "dvclive",
    "flyte",
    "kubeflow",
    "mlflow",
    "neptune",
    "swanlab",
    "tensorboard",
    "trackio",
    "wandb",
)
REPORT_TO = ("none", "all", *TRACKERS)

# The recipe settings a run may change, each None (the preset's) unless given: `TrainingPreset`'s fields.
RecipeOverrides = optional_copy(TrainingPreset, "RecipeOverrides")


def installed_trackers() -> set[str]:
    """The experiment trackers of `REPORT_TO` whose packages are installed."""
    from transformers.integrations.integration_utils import (
        get_available_reporting_integrations,
        is_flytekit_available,
    )

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
    inductor_cache_in_run_folder: bool = setting(
        False,
        "with --compile: keep Inductor's cache, the built kernels with it, in OUTPUT/inductor_cache (a "
        "folder a CPU), so that the run resumed from its folder with this flag, on another machine with the "
        "same CPU or after /tmp was emptied, builds no kernel again (default: off: torch's own cache, or "
        "TORCHINDUCTOR_CACHE_DIR's, where a new run on this machine finds what another one compiled)",
        group=TRAINING,
    )
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
        self._check_packing(recipe)
        self._check_compilation(recipe)
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
        """The model overrides must make a valid config, trainable on this machine, and cannot change a
        model to fine-tune."""
        if self.init_from is not None and self.model_overrides:
            raise ValueError(
                f"--model-override ({', '.join(self.model_overrides)}) cannot change {self.init_from}: a "
                "fine-tuned model keeps the architecture it starts from."
            )
        import torch

        from .. import VanillaTransformerConfig

        try:
            config = VanillaTransformerConfig.from_preset(recipe.model_preset, **recipe.model_overrides)
        except (ValueError, TypeError) as error:
            raise ValueError(f"--model-override: {error}") from None
        if config._attn_implementation != "flex_attention":
            return
        if not torch.cuda.is_available():
            raise ValueError(
                "attn_implementation=flex_attention trains on a GPU only: torch's flex attention has no "
                "backward pass on a CPU. Leave the override out here (SDPA attention), or train on CUDA."
            )
        if config.attention_dropout > 0:
            raise ValueError(
                "attn_implementation=flex_attention takes no attention dropout in training, and this run's "
                f"model has attention_dropout={config.attention_dropout} (from its preset or an override): "
                "add --model-override attention_dropout=0, or leave flex attention out."
            )

    def _check_compilation(self, recipe: TrainingPreset) -> None:
        """The run folder's Inductor cache holds what a compiled step builds: no use to an eager run."""
        if self.inductor_cache_in_run_folder and not recipe.compile:
            raise ValueError(
                "--inductor-cache-in-run-folder keeps what --compile builds, and this run trains eagerly: "
                "give --compile as well, or leave the flag out."
            )

    def _check_packing(self, recipe: TrainingPreset) -> None:
        """Packed rows must hold the longest pair side, take pairs of fixed lengths, and an attention that
        reads their 4-D masks."""
        if recipe.packed_row_length is None:
            return
        if recipe.packed_row_length < recipe.max_length:
            raise ValueError(
                f"--packed-row-length {recipe.packed_row_length} is shorter than --max-length "
                f"{recipe.max_length}, the longest pair side a row must hold: give at least "
                f"{recipe.max_length}."
            )
        if recipe.subword_dropout > 0:
            raise ValueError(
                "--packed-row-length packs pairs of fixed lengths, and --subword-dropout resegments them "
                "each epoch: leave one of them out."
            )
        attention = str(recipe.model_overrides.get("attn_implementation", ""))
        if attention.startswith("flash"):
            raise ValueError(
                f"--packed-row-length keeps attention within each pair with 4-D masks, which {attention} "
                "ignores: use attn_implementation=sdpa, eager or flex_attention."
            )

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
            import torch

            return GPU_DATALOADER_WORKERS if torch.cuda.is_available() else 0
        if self.dataloader_workers < 0:
            raise ValueError(
                f"dataloader_workers must be 0 (load in the training process) or more, got "
                f"{self.dataloader_workers}."
            )
        return self.dataloader_workers


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
