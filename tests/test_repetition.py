"""Runaway repetition ("blauen blauen blauen ...") under the paper's beam search (Section 6.1), checked on
a model that has learned a task whose right answer is known: copying its input. A trained copier's beam
output must hold no token more often than the reference does, and stop where the reference stops."""

from collections import Counter

import pytest
import torch
from conftest import tiny_model

from hf_vanilla_transformer.generation_vanilla_transformer import paper_generation_config
from hf_vanilla_transformer.schedule import build_paper_optimizer, get_noam_schedule

PAD, EOS = 1, 2
FIRST_WORD, VOCAB = 4, 64


def copy_batch(generator: torch.Generator, size: int, lengths: tuple[int, int] = (3, 12)) -> list[list[int]]:
    """Random sequences of word ids; tokens may repeat within a sequence, as words do in sentences."""
    low, high = lengths
    return [
        torch.randint(
            FIRST_WORD,
            VOCAB,
            (int(torch.randint(low, high + 1, (1,), generator=generator)),),
            generator=generator,
        ).tolist()
        for _ in range(size)
    ]


def padded(sequences: list[list[int]], fill: int) -> torch.Tensor:
    longest = max(len(s) for s in sequences)
    return torch.tensor([s + [fill] * (longest - len(s)) for s in sequences])


@pytest.fixture(scope="module")
def copier():
    """A tiny post-LN Transformer trained with the paper's optimizer and schedule to copy its input."""
    model = tiny_model(seed=0, P_drop=0.0)
    model.train()
    optimizer = build_paper_optimizer(model)
    schedule = get_noam_schedule(optimizer, model.config.d_model, warmup_steps=100)
    generator = torch.Generator().manual_seed(0)
    for _ in range(500):
        sequences = copy_batch(generator, 64)
        inputs = padded([s + [EOS] for s in sequences], PAD)
        labels = padded([s + [EOS] for s in sequences], -100)
        loss = model(input_ids=inputs, attention_mask=(inputs != PAD).long(), labels=labels).loss
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
    model.eval()
    model.generation_config = paper_generation_config(model.config)
    return model


def test_trained_copier_beam_output_repeats_no_token_beyond_the_reference(copier):
    held_out = copy_batch(torch.Generator().manual_seed(1), 48)
    inputs = padded([s + [EOS] for s in held_out], PAD)
    with torch.no_grad():
        generated = copier.generate(input_ids=inputs, attention_mask=(inputs != PAD).long())
    assert copier.generation_config.num_beams == 4
    exact = 0
    for reference, row in zip(held_out, generated.tolist()):
        output = row[1:]  # after the decoder start token
        output = output[: output.index(EOS)] if EOS in output else output
        excess = Counter(output) - Counter(reference)
        assert not excess, f"tokens repeated beyond the reference {reference}: {dict(excess)} in {output}"
        assert len(output) <= len(reference), f"ran past the reference's end: {output} for {reference}"
        exact += output == reference
    # The check above is only meaningful for a model that learned the task.
    assert exact >= 0.9 * len(held_out), f"the copier copies only {exact}/{len(held_out)} exactly"
