"""Runaway repetition ("blauen blauen blauen ...") under the paper's beam search (Section 6.1), checked on
a model that has learned a task whose right answer is known: copying its input. A trained copier's beam
output must repeat no token in a row beyond the reference, and stop where the reference stops. A copy
error that puts one word in another's place is not a repetition: which positions a barely trained copier
gets wrong depends on the CPU's rounding, so only the share of exact copies is asked of it."""

import pytest
import torch
from conftest import tiny_model

from hf_vanilla_transformer.training.loss import label_smoothed_cross_entropy
from hf_vanilla_transformer.training.schedule import build_paper_optimizer, get_noam_schedule
from hf_vanilla_transformer.vanilla_transformer.generation_vanilla_transformer import paper_generation_config

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


def insertions(output: list[int], reference: list[int]) -> list[int]:
    """The positions of `output` that a minimal edit alignment (Levenshtein: matches, substitutions,
    insertions, deletions, each edit costing 1) against `reference` marks as inserted."""
    rows, cols = len(output) + 1, len(reference) + 1
    cost = [[i + j if i * j == 0 else 0 for j in range(cols)] for i in range(rows)]
    for i in range(1, rows):
        for j in range(1, cols):
            cost[i][j] = min(
                cost[i - 1][j - 1] + (output[i - 1] != reference[j - 1]),
                cost[i - 1][j] + 1,
                cost[i][j - 1] + 1,
            )
    inserted, i, j = [], len(output), len(reference)
    while i > 0:
        if j > 0 and cost[i][j] == cost[i - 1][j - 1] + (output[i - 1] != reference[j - 1]):
            i, j = i - 1, j - 1
        elif j > 0 and cost[i][j] == cost[i][j - 1] + 1:
            j -= 1
        else:
            i -= 1
            inserted.append(i)
    return sorted(inserted)


def repetitions(output: list[int], reference: list[int]) -> list[int]:
    """The inserted positions of `output` (against `reference`) whose token is the one beside it: a token
    repeated in a row beyond the reference."""
    return [
        i
        for i in insertions(output, reference)
        if output[i] in (output[i - 1] if i > 0 else None, output[i + 1] if i + 1 < len(output) else None)
    ]


@pytest.mark.parametrize(
    ("output", "reference", "repeated"),
    [
        ([7, 9, 9, 9], [7, 9], 2),  # "blauen blauen blauen"
        ([9, 9, 7], [9, 7], 1),
        ([7, 9, 9], [7, 9, 9], 0),  # the reference repeats it too
        ([7, 12, 8], [7, 40, 8], 0),  # a substitution
        ([7, 7, 8], [7, 40, 8], 0),  # a substitution that happens to equal its neighbour
        ([7, 5, 8], [7, 8], 0),  # an inserted word that repeats nothing
        ([7, 8], [7, 5, 8], 0),  # a dropped word
    ],
)
def test_repetition_counts_tokens_repeated_in_a_row_beyond_the_reference(output, reference, repeated):
    assert len(repetitions(output, reference)) == repeated


def padded(sequences: list[list[int]], fill: int) -> torch.Tensor:
    longest = max(len(s) for s in sequences)
    return torch.tensor([s + [fill] * (longest - len(s)) for s in sequences])


@pytest.fixture(scope="module")
def copier():
    """A tiny post-LN Transformer trained with the paper's optimizer, schedule and label smoothing to copy its
    input."""
    model = tiny_model(seed=0, P_drop=0.0)
    model.train()
    optimizer = build_paper_optimizer(model)
    schedule = get_noam_schedule(optimizer, model.config.d_model, warmup_steps=100)
    generator = torch.Generator().manual_seed(0)
    for _ in range(500):
        sequences = copy_batch(generator, 64)
        inputs = padded([s + [EOS] for s in sequences], PAD)
        labels = padded([s + [EOS] for s in sequences], -100)
        decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
        logits = model(
            input_ids=inputs, attention_mask=(inputs != PAD).long(), decoder_input_ids=decoder_input_ids
        ).logits
        loss = label_smoothed_cross_entropy(logits, labels, 0.1)  # Section 5.4's label smoothing
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
        repeated = repetitions(output, reference)
        assert not repeated, f"tokens repeated beyond the reference {reference} at {repeated} of {output}"
        assert len(output) <= len(reference), f"ran past the reference's end: {output} for {reference}"
        exact += output == reference
    # The check above is only meaningful for a model that learned the task.
    assert exact >= 0.9 * len(held_out), f"the copier copies only {exact}/{len(held_out)} exactly"
