"""Training recipes: the settings of how a model is trained, declared once in `TrainingPreset` with the
paper's values (Section 5) as defaults, and the named presets, each a few keyword overrides of them: the
paper's base and big models for GPUs, and recipes sized for a CPU (chosen by measurement:
benchmarks/RESULTS.md).

`TrainingSettings` (training.py) takes every recipe setting too, None meaning the preset's; the `train`
command's flags and checks are generated from the same fields (`settings_schema`).
"""

from dataclasses import dataclass, field
from typing import Any

from ..common.cli import non_negative_float, non_negative_int, positive_float, positive_int, probability
from ..common.settings_schema import setting

# The --help sections of the `train` command's flags.
DATA = "data"
MODEL = "model and vocabulary"
TRAINING = "training (default: the preset's)"
EVALUATION = "evaluation"


@dataclass(frozen=True)
class TrainingPreset:
    """One training recipe: the model (a config preset plus overrides) and how to train it. The defaults are
    the paper's base model on 8 GPUs (Section 5); a preset overrides some of them by keyword."""

    model_preset: str = "base"  # a `VanillaTransformerConfig.from_preset` name
    model_overrides: dict[str, Any] = field(default_factory=dict)  # config fields set on top of model_preset
    max_steps: int = setting(100_000, "optimizer updates at most", check=positive_int, group=TRAINING)
    tokens_per_step: int = setting(
        25_000, "source/target tokens per optimizer step, all devices", check=positive_int, group=TRAINING
    )
    # With many devices each takes its share of a step, so a micro-batch may hold fewer.
    max_tokens: int = setting(
        12_500, "source/target tokens at most, per device and micro-batch", check=positive_int, group=TRAINING
    )
    warmup_steps: int = setting(
        4000, "warm-up of the learning rate (Eq. 3)", check=positive_int, group=TRAINING
    )
    vocab_size: int = setting(
        37_000, "size of the BPE vocabulary to train (default: the preset's)", check=positive_int, group=MODEL
    )
    save_steps: int = setting(1000, "updates between checkpoints", check=positive_int, group=TRAINING)
    keep_checkpoints: int = setting(5, "checkpoints kept on disk", check=positive_int, group=TRAINING)
    average_checkpoints: int = setting(
        5, "average the last K checkpoints (1: none)", check=positive_int, group=TRAINING
    )
    eval_steps: int = setting(
        1000, "updates between dev loss evaluations", check=positive_int, group=TRAINING
    )
    label_smoothing: float = setting(
        0.1,
        "eps_ls of Section 5.4: train against targets that put this much probability evenly on the whole "
        "vocabulary; 0: the plain cross-entropy",
        check=probability,
        group=TRAINING,
    )
    lr_scale: float = setting(
        1.0, "factor on the learning rate of Eq. 3", check=positive_float, group=TRAINING
    )
    weight_decay: float = setting(
        0.0,
        "decoupled weight decay on the weight matrices (AdamW); 0: the paper's Adam",
        check=non_negative_float,
        group=TRAINING,
    )
    # A share of max_steps: a run with other max_steps keeps the same share (`TrainingSettings.recipe`).
    cooldown_steps: int = setting(
        0,
        "take the learning rate of the last this many updates linearly towards 0 (not reached if "
        "--max-minutes stops the run first); 0: the paper's Eq. 3 to the end",
        check=non_negative_int,
        group=TRAINING,
    )
    subword_dropout: float = setting(
        0.0,
        "BPE-dropout (Provilkov et al., 2020): resegment the training pairs each epoch, dropping each merge "
        "with this probability; 0: the paper's deterministic BPE",
        check=probability,
        group=TRAINING,
    )
    max_length: int = setting(
        256, "longest pair side in tokens (default: the preset's)", check=positive_int, group=DATA
    )
    length_buckets: bool = setting(
        False,
        "pad each batch's source and target up to a few bucket lengths (multiples of 8, 16, 32, 64), so that "
        "a compiled step sees a handful of shapes; --no-length-buckets: pad to the longest (default: the "
        "preset's)",
        group=TRAINING,
    )
    # Off in every preset: packing is measured on a CPU only, where it leaves 0.7-1.8% of the positions padded
    # on newstest-length batches (benchmarks/RESULTS.md, "Packed batches"); its speed on a GPU is unmeasured.
    packed_row_length: int | None = setting(
        None,
        "pack each batch's pairs end to end into rows of this many tokens, positions restarting and "
        "attention kept within each pair (`training/packing`): every batch has one shape, so a compiled step "
        "compiles once, and only the rows' tails are padding; replaces --length-buckets (default: off, each "
        "batch padded to its longest pair: packing's speed on a GPU is not yet measured)",
        check=positive_int,
        group=TRAINING,
    )
    # Off in every preset. On a CPU the compiled step is slower than the eager one. On a GPU it was faster on
    # fixed 400 x 64-token batches (1.63x on an H100), but on newstest-length batches its first compile
    # gave no step in 190 s on an H200 and its speed is unmeasured (benchmarks/RESULTS.md).
    compile: bool = setting(
        False,
        "compile the training step (forward and loss; each layer class once; any batch shape, or with "
        "--packed-row-length the one shape); --no-compile: eager (default: off: on real batches on a GPU its "
        "speed is not yet measured, and its first compile there has taken minutes)",
        group=TRAINING,
    )
    max_minutes: float | None = setting(
        None, "stop after this much training time", check=positive_float, group=TRAINING
    )
    # Half precision where it is fast: bf16 where the CPU or GPU computes it natively, fp16 with loss scaling
    # on GPUs without bf16 (V100, T4); an explicit --bf16 applies everywhere.
    bf16: bool = setting(False, "bf16 autocast; --no-bf16: float32 throughout", group=TRAINING)
    # One beam search over the dev set for each alpha tried; without it the model keeps the paper's 0.6.
    tune_length_penalty: bool = setting(
        True,
        "choose the final model's length penalty on the dev set (Section 6.1) and save it in its generation "
        "config; --no-tune-length-penalty: keep the paper's 0.6 (default: the preset's)",
        group=EVALUATION,
    )


CPU_SHAPE = {"d_model": 256, "N": 3, "h": 4, "d_ff": 1024}
CPU_MODEL = {**CPU_SHAPE, "dropout": 0.2, "attention_dropout": 0.1, "activation_dropout": 0.1}
DEMO_MODEL = {**CPU_SHAPE, "d_ff": 512}

# Each preset: the paper's recipe with the overrides shown, one a line with the reason for it. The CPU
# presets' values were chosen by dev-set measurements recorded in benchmarks/RESULTS.md.
TRAINING_PRESETS: dict[str, TrainingPreset] = {
    # Section 5: 100k steps of ~25000 + 25000 tokens on 8 GPUs, the last 5 checkpoints averaged. A micro-batch
    # of 12500 tokens (the paper's step in two on one GPU, 3125 on eight) needs about 10 GB in half
    # precision, activations and 12500 x 37000 logits, so it fits a 16 GB V100 or T4.
    "base": TrainingPreset(
        bf16=True,  # half precision where the GPU computes it fast
    ),
    # Section 6.1. Twice base's width needs about 20 GB for the same 12500 tokens: on a 16-24 GB GPU pass
    # --max-tokens 6250 (the step stays 25000 through accumulation).
    "big": TrainingPreset(
        model_preset="big",  # d_model 1024, d_ff 4096, h 16, dropout 0.3
        max_steps=300_000,  # Section 6.1: 300k steps
        keep_checkpoints=20,  # kept to be averaged
        average_checkpoints=20,  # Section 6.1: the last 20 checkpoints averaged
        bf16=True,  # half precision where the GPU computes it fast
    ),
    # A 2-core CPU: about 55 minutes of training on a 2-core Zen 4 in bf16, 95 on a Zen 2 in float32.
    "cpu": TrainingPreset(
        model_overrides=CPU_MODEL,  # narrower, shallower; more dropout: best on dev
        label_smoothing=0.2,  # best on dev with that dropout
        max_steps=6000,  # about an hour on two cores
        tokens_per_step=2048,  # twice the updates of 4096-token batches learn faster from the same tokens
        max_tokens=2048,  # one micro-batch a step
        warmup_steps=1000,  # a sixth of the run
        vocab_size=8000,  # 10000 gained nothing on dev and costs more time a step
        save_steps=500,  # the averaged checkpoints span the last third of training
        keep_checkpoints=5,  # kept to be averaged
        average_checkpoints=5,  # Section 6.1's averaging
        eval_steps=500,  # a dev loss with every checkpoint
        lr_scale=0.7,  # with the cool-down, above Eq. 3 at full scale on dev
        weight_decay=0.3,  # dev BLEU 39.00, against 38.61 with 0.1, 38.59 with 0.5 and 37.38 with none
        cooldown_steps=2000,  # dev BLEU 39.78 against 39.55 with Eq. 3 to the end, and above 3000 steps
        bf16=True,  # where the CPU computes bf16 natively
    ),
    # The README's demo: a fixed amount of work, so that what it learns does not depend on the machine.
    "cpu-demo": TrainingPreset(
        model_overrides=DEMO_MODEL,  # a narrower feed-forward layer makes a step cheaper
        max_steps=1700,  # a demo of about 15 minutes on two cores
        tokens_per_step=1024,  # twice the updates of 2048-token batches, at the same cost per token
        max_tokens=1024,  # one micro-batch a step
        warmup_steps=300,  # with lr_scale 0.3: a peak learning rate of 1.1e-3
        vocab_size=5000,  # a cheaper output layer
        save_steps=100,  # early weights move too fast to average a wider span
        keep_checkpoints=2,  # kept to be averaged
        average_checkpoints=2,  # the last two checkpoints averaged
        eval_steps=500,  # few dev evaluations in a short run
        lr_scale=0.3,  # peak 1.1e-3: above 0.2 and 0.45 on dev; 1 decoded in runaway repetition
        bf16=True,  # where the CPU computes bf16 natively
        tune_length_penalty=False,  # the paper's alpha: choosing it would add 2 minutes of beam search
    ),
}
