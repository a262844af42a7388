"""The paper's learning-rate schedule and optimizer (Section 5.3, Eq. 3)."""

import math

import pytest
import torch
from torch import nn

from hf_vanilla_transformer.training.schedule import (
    build_paper_optimizer,
    cooldown_factor,
    get_noam_schedule,
    noam_lr,
)


def formula(step: int, d_model: int, warmup: int, scale: float = 1.0) -> float:
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


@pytest.mark.parametrize("step", [1, 2, 100, 3999, 4000, 4001, 10_000, 100_000])
def test_noam_lr_matches_eq_3(step):
    assert noam_lr(step, 512, 4000) == pytest.approx(formula(step, 512, 4000), rel=1e-12)
    assert noam_lr(step, 1024, 4000, scale=2.0) == pytest.approx(formula(step, 1024, 4000, 2.0), rel=1e-12)


def test_noam_lr_peaks_at_warmup():
    peak = noam_lr(4000, 512, 4000)
    assert peak == pytest.approx(512**-0.5 * 4000**-0.5, rel=1e-12)
    assert peak == pytest.approx(6.9877e-4, rel=1e-4)
    assert noam_lr(3999, 512, 4000) < peak > noam_lr(4001, 512, 4000)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(step=0, d_model=512), "step must be >= 1"),
        (dict(step=1, d_model=0), "d_model"),
        (dict(step=1, d_model=512, warmup_steps=0), "warmup_steps"),
    ],
)
def test_noam_lr_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        noam_lr(**kwargs)


@pytest.mark.parametrize("optimizer_lr", [1.0, 5e-5])
def test_schedule_sets_eq_3_before_every_update(optimizer_lr):
    model = nn.Linear(3, 2)
    optimizer = build_paper_optimizer(model, lr=optimizer_lr)
    scheduler = get_noam_schedule(optimizer, d_model=16, warmup_steps=5, scale=0.5)
    for update in range(1, 13):
        expected = formula(update, 16, 5, 0.5)
        assert optimizer.param_groups[0]["lr"] == pytest.approx(expected, rel=1e-12)
        assert scheduler.get_last_lr()[0] == pytest.approx(expected, rel=1e-12)
        model(torch.ones(1, 3)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()


def test_cooldown_takes_the_last_updates_linearly_towards_zero():
    """Eq. 3 until the last C updates, then Eq. 3 times C/C, (C-1)/C, ..., 1/C: the last update still moves
    the weights, and a scheduler step after it sets lr 0."""
    total, cooldown = 12, 4
    model = nn.Linear(3, 2)
    optimizer = build_paper_optimizer(model)
    scheduler = get_noam_schedule(
        optimizer, d_model=16, warmup_steps=5, scale=0.5, total_steps=total, cooldown_steps=cooldown
    )
    used = []
    for _ in range(total):
        used.append(optimizer.param_groups[0]["lr"])
        model(torch.ones(1, 3)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
    factors = [1.0] * (total - cooldown) + [4 / 4, 3 / 4, 2 / 4, 1 / 4]
    expected = [formula(update, 16, 5, 0.5) * factors[update - 1] for update in range(1, total + 1)]
    assert used == pytest.approx(expected, rel=1e-12)
    assert optimizer.param_groups[0]["lr"] == 0.0


def test_without_cooldown_the_schedule_is_eq_3_to_the_end():
    assert [cooldown_factor(step, 10, 0) for step in range(1, 12)] == [1.0] * 11


@pytest.mark.parametrize("cooldown_steps", [-1, 11])
def test_cooldown_longer_than_the_run_or_negative_is_refused(cooldown_steps):
    optimizer = build_paper_optimizer(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="cooldown_steps must be between 0 and the run's 10 steps"):
        get_noam_schedule(
            optimizer, d_model=16, warmup_steps=5, total_steps=10, cooldown_steps=cooldown_steps
        )


def test_schedule_state_round_trips():
    model = nn.Linear(3, 2)
    optimizer = build_paper_optimizer(model)
    scheduler = get_noam_schedule(optimizer, d_model=16, warmup_steps=5)
    for _ in range(7):
        optimizer.step()
        scheduler.step()
    restored_optimizer = build_paper_optimizer(model)
    restored = get_noam_schedule(restored_optimizer, d_model=16, warmup_steps=5)
    restored_optimizer.load_state_dict(optimizer.state_dict())
    restored.load_state_dict(scheduler.state_dict())
    restored_optimizer.step()
    restored.step()
    assert restored_optimizer.param_groups[0]["lr"] == pytest.approx(formula(9, 16, 5), rel=1e-12)


def test_paper_optimizer_hyperparameters():
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2))
    model[0].weight.requires_grad_(False)
    optimizer = build_paper_optimizer(model)
    assert isinstance(optimizer, torch.optim.Adam)
    group = optimizer.param_groups[0]
    assert group["betas"] == (0.9, 0.98)
    assert group["eps"] == 1e-9
    assert group["weight_decay"] == 0
    assert len(group["params"]) == 3  # the frozen weight is left out


def test_paper_optimizer_errors():
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        build_paper_optimizer(frozen)
    with pytest.raises(ValueError, match="lr must be a positive"):
        build_paper_optimizer(nn.Linear(2, 2), lr=math.nan)


def test_schedule_rejects_zero_base_lr():
    optimizer = torch.optim.Adam(nn.Linear(2, 2).parameters(), lr=0.0)
    with pytest.raises(ValueError, match="param group 0 has lr 0.0"):
        get_noam_schedule(optimizer, d_model=16, warmup_steps=5)


def test_paper_optimizer_updates_follow_adam():
    """The (fused) optimizer's updates equal Adam's rule written out (Kingma and Ba, Algorithm 1) with the
    paper's beta1 = 0.9, beta2 = 0.98, epsilon = 1e-9."""
    torch.manual_seed(0)
    parameter = nn.Parameter(torch.randn(5, dtype=torch.float64))
    optimizer = build_paper_optimizer(nn.ParameterList([parameter]), lr=0.01)
    expected = parameter.detach().clone()
    m = torch.zeros_like(expected)
    v = torch.zeros_like(expected)
    for t in range(1, 5):
        grad = torch.randn(5, dtype=torch.float64)
        parameter.grad = grad.clone()
        optimizer.step()
        m = 0.9 * m + 0.1 * grad
        v = 0.98 * v + 0.02 * grad**2
        m_hat, v_hat = m / (1 - 0.9**t), v / (1 - 0.98**t)
        expected -= 0.01 * m_hat / (v_hat.sqrt() + 1e-9)
        torch.testing.assert_close(parameter.detach(), expected, rtol=1e-12, atol=1e-12)


def test_without_weight_decay_the_optimizer_is_the_papers_adam():
    assert type(build_paper_optimizer(nn.Linear(3, 2))) is torch.optim.Adam


def test_weight_decay_shrinks_weight_matrices_by_lr_times_decay_and_nothing_else():
    """Decoupled weight decay (Loshchilov and Hutter, 2019, Algorithm 2): with zero gradients Adam's own step
    is 0, so an update multiplies every weight matrix by exactly 1 - lr * weight_decay, at Eq. 3's lr of that
    update, and leaves biases and layer-norm parameters as they are."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(7, 4), nn.Linear(4, 4), nn.LayerNorm(4)).double()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = build_paper_optimizer(model, weight_decay=0.1)
    scheduler = get_noam_schedule(optimizer, d_model=4, warmup_steps=3, scale=2.0)
    shrink = 1.0
    for step in (1, 2, 3):
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        optimizer.step()
        scheduler.step()
        shrink *= 1 - formula(step, 4, 3, 2.0) * 0.1
    for name, p in model.named_parameters():
        expected = before[name] * shrink if p.dim() >= 2 else before[name]
        torch.testing.assert_close(p.detach(), expected, rtol=1e-12, atol=0)
    assert shrink < 0.9  # the decay is large enough for the check to tell decayed weights from kept ones


@pytest.mark.parametrize("weight_decay", [-0.1, math.nan, math.inf])
def test_paper_optimizer_rejects_bad_weight_decay(weight_decay):
    with pytest.raises(ValueError, match="weight_decay must be a finite number of 0 or more"):
        build_paper_optimizer(nn.Linear(2, 2), weight_decay=weight_decay)
