"""Training recipes: the paper's (Section 5) for GPUs, and recipes sized for a CPU.

A preset names a model (a config preset plus overrides) and how to train it; `TrainingSettings` applies
command-line flags on top.
"""

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TrainingPreset:
    """One training recipe: the model (a config preset plus overrides) and how to train it."""

    model_preset: str
    model_overrides: dict[str, Any]
    max_steps: int
    tokens_per_step: int  # source (and target) tokens per optimizer step, over all devices
    max_tokens: int  # per device and micro-batch
    warmup_steps: int
    vocab_size: int
    save_steps: int
    keep_checkpoints: int
    average_checkpoints: int
    eval_steps: int
    lr_scale: float = 1.0
    max_length: int = 256
    max_minutes: float | None = None  # stop (and save) after this much training time
    bf16: bool = False  # bf16 autocast where the CPU or GPU computes bf16 natively


CPU_MODEL = {"d_model": 256, "N": 3, "h": 4, "d_ff": 1024}

TRAINING_PRESETS: dict[str, TrainingPreset] = {
    # Section 5: 100k steps of ~25000 + 25000 tokens on 8 GPUs; the last 5 checkpoints averaged.
    "base": TrainingPreset("base", {}, 100_000, 25_000, 3125, 4000, 37_000, 1000, 5, 5, 1000),
    # Section 6.1: 300k steps; the last 20 checkpoints averaged.
    "big": TrainingPreset("big", {}, 300_000, 25_000, 3125, 4000, 37_000, 1000, 20, 20, 1000),
    # A 2-core CPU: a narrower, shallower model and smaller batches, the same recipe otherwise.
    # One hour of training at most, then the last 5 checkpoints averaged; bf16 where the CPU has it.
    "cpu": TrainingPreset(
        "base", CPU_MODEL, 20_000, 4096, 4096, 1000, 8000, 500, 5, 5, 500, max_minutes=60, bf16=True
    ),
    # The README's demo: the cpu model for seven minutes on the shipped Multi30k, then evaluation. Half
    # the cpu preset's batch and a shorter warm-up: in so few minutes, more updates learn more.
    "cpu-demo": TrainingPreset(
        "base", CPU_MODEL, 5000, 2048, 2048, 300, 8000, 200, 3, 3, 200, max_minutes=7, bf16=True
    ),
}
