"""The paper's optimizer and learning-rate schedule (Vaswani et al., 2017, Section 5.3).

Step convention: the paper's ``step_num`` counts optimizer updates from 1. ``LambdaLR`` counts from 0 (its
counter is 0 during the first update and becomes k after ``scheduler.step()`` has been called k times), so
the schedule built here evaluates the formula at ``counter + 1``: the k-th update uses ``noam_lr(k)``, and
the peak ``noam_lr(warmup_steps)`` is used by update number ``warmup_steps``.

``transformers.Trainer``'s ``lr_scheduler_type="inverse_sqrt"`` with ``warmup_steps=W`` and
``learning_rate=scale * d_model**-0.5 * W**-0.5`` evaluates Eq. 3 at ``counter`` instead: the same curve one
update late, with lr 0 for the first update.

``cooldown_steps`` (not in the paper, 0 by default) scales the last updates of a run of ``total_steps``
down linearly towards 0, as warm-up-stable-decay schedules do (Hu et al., 2024; Hägele et al., 2024): Eq. 3
ends a short run at a learning rate still well above zero, and the cool-down settles the weights within
the run's budget.
"""

import math
from functools import partial

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR


def noam_lr(step: int, d_model: int, warmup_steps: int = 4000, scale: float = 1.0) -> float:
    """Learning rate of Section 5.3, Eq. 3: ``scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)``.

    ``step`` is the paper's 1-based ``step_num`` (the number of the optimizer update being made). The rate
    grows linearly for the first ``warmup_steps`` updates, peaks at ``step == warmup_steps`` and then
    decays with the inverse square root of the step.
    """
    if step < 1:
        raise ValueError(f"step must be >= 1 (the paper counts updates from 1), got {step}.")
    if d_model < 1:
        raise ValueError(f"d_model must be a positive integer, got {d_model}.")
    if warmup_steps < 1:
        raise ValueError(f"warmup_steps must be >= 1 (Eq. 3 divides by it), got {warmup_steps}.")
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def cooldown_factor(step: int, total_steps: int, cooldown_steps: int) -> float:
    """Factor on the learning rate of update ``step`` (1-based) of ``total_steps``: 1 until the last
    ``C = cooldown_steps`` updates, which it scales by C/C, (C-1)/C, ..., 1/C, so that the last update still
    moves the weights; 0 after the last update."""
    if cooldown_steps < 0 or cooldown_steps > total_steps:
        raise ValueError(
            f"cooldown_steps must be between 0 and the run's {total_steps} steps, got {cooldown_steps}."
        )
    if cooldown_steps == 0:
        return 1.0
    return min(1.0, max(0.0, (total_steps - step + 1) / cooldown_steps))


def _noam_factor(
    counter: int,
    d_model: int,
    warmup_steps: int,
    scale: float,
    base_lr: float,
    total_steps: int,
    cooldown_steps: int,
) -> float:
    # LambdaLR multiplies the factor by the group's initial lr; dividing by it makes the optimizer's own lr
    # irrelevant, so the effective lr is exactly Eq. 3 (times the cool-down).
    step = counter + 1
    return (
        noam_lr(step, d_model, warmup_steps, scale)
        * cooldown_factor(step, total_steps, cooldown_steps)
        / base_lr
    )


def get_noam_schedule(
    optimizer: torch.optim.Optimizer,
    d_model: int,
    warmup_steps: int = 4000,
    scale: float = 1.0,
    *,
    total_steps: int = 0,
    cooldown_steps: int = 0,
) -> LambdaLR:
    """LambdaLR following Section 5.3, Eq. 3, whatever lr the optimizer was built with.

    After creation every param group's lr is ``noam_lr(1, ...)``; after the k-th ``scheduler.step()`` it is
    ``noam_lr(k + 1, ...)`` (see the module docstring for the step convention). Call ``scheduler.step()``
    once after every ``optimizer.step()``, as ``transformers.Trainer`` does. With ``cooldown_steps``, the
    last that many of ``total_steps`` updates are also scaled by ``cooldown_factor``.
    """
    noam_lr(1, d_model, warmup_steps, scale)  # validates the arguments before the optimizer is touched
    cooldown_factor(1, total_steps, cooldown_steps)
    factors = []
    for index, group in enumerate(optimizer.param_groups):
        # LambdaLR scales "initial_lr" when it is already set (e.g. by an earlier scheduler), else "lr".
        base_lr = group.get("initial_lr", group["lr"])
        if not base_lr > 0:
            raise ValueError(
                f"param group {index} has lr {base_lr}; the Noam schedule rescales the optimizer's lr and "
                "needs it to be positive (any positive value works, e.g. build_paper_optimizer's default)."
            )
        factors.append(
            partial(
                _noam_factor,
                d_model=d_model,
                warmup_steps=warmup_steps,
                scale=scale,
                base_lr=base_lr,
                total_steps=total_steps,
                cooldown_steps=cooldown_steps,
            )
        )
    return LambdaLR(optimizer, lr_lambda=factors)


def build_paper_optimizer(
    model: nn.Module,
    lr: float = 1.0,
    betas: tuple[float, float] = (0.9, 0.98),
    eps: float = 1e-9,
    weight_decay: float = 0.0,
) -> torch.optim.Adam | torch.optim.AdamW:
    """Adam with beta1 = 0.9, beta2 = 0.98 and epsilon = 1e-9 (Section 5.3), over the trainable parameters.

    ``lr`` is only a placeholder: ``get_noam_schedule`` replaces it with Eq. 3 as soon as it is created. Pass
    both to ``Trainer(optimizers=(optimizer, scheduler))``.

    ``weight_decay`` is not part of the paper's recipe (0, the default, is its plain Adam). Above 0 the
    optimizer is AdamW (Loshchilov and Hutter, 2019): every update also shrinks each weight matrix
    (projections and the shared embedding) by ``lr * weight_decay``, so the decay follows Eq. 3's schedule;
    biases and layer-norm gains and shifts are not decayed.
    """
    parameters = [p for p in model.parameters() if p.requires_grad]
    if not parameters:
        raise ValueError("The model has no trainable parameters (every parameter has requires_grad=False).")
    if not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"lr must be a positive finite number, got {lr}.")
    if not math.isfinite(weight_decay) or weight_decay < 0:
        raise ValueError(f"weight_decay must be a finite number of 0 or more, got {weight_decay}.")
    # One fused kernel for all parameters rather than a handful of whole-tensor passes over each, with the
    # same update rule. It needs every parameter on one CPU or CUDA device.
    devices = {p.device for p in parameters}
    fused = len(devices) == 1 and next(iter(devices)).type in ("cpu", "cuda")
    if weight_decay == 0:
        return torch.optim.Adam(parameters, lr=lr, betas=betas, eps=eps, fused=fused)
    groups = [
        {"params": [p for p in parameters if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in parameters if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        [group for group in groups if group["params"]], lr=lr, betas=betas, eps=eps, fused=fused
    )
