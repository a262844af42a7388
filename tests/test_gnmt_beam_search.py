"""The GNMT-penalised beam search of Section 6.1 (`gnmt_beam_search`, run by `generate()` for
`length_penalty_type="gnmt"`), each check against a truth of its own rather than against the search itself:

- alpha = 0, where lp(Y) = ((5 + |Y|) / 6)^0 = 1 = |Y|^0: transformers' own beam search with
  `length_penalty=0.0`, token for token, for every option the search handles;
- alpha != 0: an exhaustive search on a 5-token vocabulary with a beam wide enough to hold every hypothesis,
  where beam search with `early_stopping="never"` must find the best ones exactly;
- alpha != 0: each returned score is log P(Y|X) (recomputed by a forward pass over the returned tokens)
  divided by ((5 + |Y|) / 6)^alpha, and each input's hypotheses come best first.
"""

import itertools

import pytest
import torch
import transformers
from packaging import version
from transformers.generation import GenerationMixin

from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

BOS, PAD, EOS = 0, 1, 2


def gnmt_penalty(length: int, alpha: float) -> float:
    """lp(Y) = ((5 + |Y|) / 6)^alpha (Section 6.1, after Wu et al., 2016), written here afresh."""
    return ((5 + length) / 6) ** alpha


def random_model(
    seed: int, vocab_size: int = 40, eos_bias: float = 2.0
) -> VanillaTransformerForConditionalGeneration:
    """A tiny random model with peaked distributions (weights x 2) whose outputs end at varied lengths."""
    torch.manual_seed(seed)
    config = VanillaTransformerConfig(
        vocab_size=vocab_size, d_model=16, N=2, h=2, d_ff=32, dropout=0.0, output_bias=True
    )
    model = VanillaTransformerForConditionalGeneration(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(2.0)
        model.final_logits_bias[0, EOS] = eos_bias
    return model


def padded_sources(seed: int, batch_size: int = 3, length: int = 7, vocab_size: int = 40):
    """Random source ids, row i padded after length - 2i tokens, and their attention mask."""
    source = torch.randint(4, vocab_size, (batch_size, length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(source)
    for row in range(batch_size):
        mask[row, max(1, length - 2 * row) :] = 0
    source[mask == 0] = PAD
    return source, mask


def generated_lengths(sequences: torch.Tensor) -> list[int]:
    """|Y| of each returned hypothesis: its tokens after the start token, up to and with its end token."""
    lengths = []
    for row in sequences[:, 1:].tolist():
        lengths.append(row.index(EOS) + 1 if EOS in row else len(row))
    return lengths


@torch.no_grad()
def log_probabilities(model, source, mask, hypotheses: list[list[int]]) -> list[float]:
    """log P(Y|X) of each hypothesis (a list of generated tokens) by one teacher-forced forward pass per
    hypothesis length, without a cache, in float64."""
    totals = [0.0] * len(hypotheses)
    for length in sorted({len(tokens) for tokens in hypotheses}):
        rows = [i for i, tokens in enumerate(hypotheses) if len(tokens) == length]
        targets = torch.tensor([hypotheses[i] for i in rows])
        decoder_input_ids = torch.cat([torch.full((len(rows), 1), BOS), targets[:, :-1]], dim=1)
        logits = model(
            input_ids=source[rows],
            attention_mask=mask[rows],
            decoder_input_ids=decoder_input_ids,
            use_cache=False,
        ).logits
        token_log_probs = logits.double().log_softmax(-1).gather(-1, targets[:, :, None]).squeeze(-1)
        for i, total in zip(rows, token_log_probs.sum(-1).tolist()):
            totals[i] = total
    return totals


AGREEING_OPTIONS = [
    dict(num_beams=2, early_stopping=True, num_return_sequences=1, max_new_tokens=12),
    dict(num_beams=3, early_stopping=False, num_return_sequences=3, max_new_tokens=3),
    dict(num_beams=4, early_stopping="never", num_return_sequences=2, max_new_tokens=15),
    dict(num_beams=5, early_stopping=True, num_return_sequences=5, max_length_offset=2),
    dict(num_beams=3, early_stopping=False, num_return_sequences=2, max_new_tokens=10, eos_token_id=[EOS, 3]),
    dict(num_beams=4, early_stopping="never", num_return_sequences=4, max_length=9, use_cache=False),
    dict(num_beams=3, early_stopping=True, num_return_sequences=3, max_new_tokens=10, no_repeat_ngram_size=2),
    dict(num_beams=4, early_stopping=False, num_return_sequences=2, max_new_tokens=10, min_new_tokens=3),
    dict(num_beams=3, early_stopping=True, num_return_sequences=2, max_new_tokens=8, do_sample=True, top_k=5),
]


@pytest.mark.parametrize(
    "options", AGREEING_OPTIONS, ids=lambda options: "-".join(map(str, options.values()))
)
@pytest.mark.parametrize("seed", [0, 1])
def test_with_alpha_zero_it_is_transformers_beam_search(seed, options):
    if options.get("do_sample") and version.parse(transformers.__version__) < version.parse("5.24"):
        pytest.skip("beam sampling: transformers sorts the sampled candidates from 5.24 on, as ours does")
    model = random_model(seed, eos_bias=1.0 + 2 * seed)
    source, mask = padded_sources(seed)
    outputs = {}
    for penalty_type in ("gnmt", "transformers"):
        torch.manual_seed(7)  # the draws of beam sampling
        outputs[penalty_type] = model.generate(
            source,
            attention_mask=mask,
            length_penalty=0.0,
            length_penalty_type=penalty_type,
            return_dict_in_generate=True,
            output_scores=True,
            **options,
        )
    ours, theirs = outputs["gnmt"], outputs["transformers"]
    assert type(ours) is type(theirs)
    assert torch.equal(ours.sequences, theirs.sequences)
    assert torch.equal(ours.beam_indices, theirs.beam_indices)
    torch.testing.assert_close(ours.sequences_scores, theirs.sequences_scores, rtol=0, atol=1e-6)
    assert len(ours.scores) == len(theirs.scores)
    for step_ours, step_theirs in zip(ours.scores, theirs.scores):
        assert torch.equal(step_ours, step_theirs)


def test_without_a_dictionary_it_returns_the_same_sequences():
    model = random_model(3)
    source, mask = padded_sources(3, batch_size=4)
    options = dict(num_beams=3, num_return_sequences=2, max_new_tokens=10, length_penalty=0.0)
    ours = model.generate(source, attention_mask=mask, length_penalty_type="gnmt", **options)
    theirs = model.generate(source, attention_mask=mask, length_penalty_type="transformers", **options)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("alpha", [0.6, 1.0, -0.5, 0.0])
def test_a_beam_holding_every_hypothesis_finds_the_best_ones_exactly(alpha):
    """Vocabulary of 5, up to 3 new tokens: 85 hypotheses (1 + 4 + 16 ending with the end token, 64 cut at
    the limit). With 80 beams, every step's continuations all fit among the best num_beams, so beam search
    is exhaustive, and with `early_stopping="never"` it stops only once nothing can beat its finished ones."""
    model = random_model(5, vocab_size=5, eos_bias=0.5)
    source, mask = torch.tensor([[3, 4, 4, 3, 4]]), torch.ones(1, 5, dtype=torch.long)
    returned = 12
    out = model.generate(
        source,
        attention_mask=mask,
        num_beams=80,
        num_return_sequences=returned,
        max_new_tokens=3,
        length_penalty=alpha,
        length_penalty_type="gnmt",
        early_stopping="never",
        return_dict_in_generate=True,
        output_scores=True,
    )
    others = [token for token in range(5) if token != EOS]
    hypotheses = [[EOS]]
    hypotheses += [[a, EOS] for a in others]
    hypotheses += [[a, b, EOS] for a, b in itertools.product(others, repeat=2)]
    hypotheses += [list(tokens) for tokens in itertools.product(others, repeat=3)]
    assert len(hypotheses) == 85
    totals = log_probabilities(model, source.expand(85, -1), mask.expand(85, -1), hypotheses)
    scores = [total / gnmt_penalty(len(tokens), alpha) for total, tokens in zip(totals, hypotheses)]
    best = sorted(range(85), key=lambda i: -scores[i])[:returned]
    assert len({len(hypotheses[i]) for i in best}) > 1, "the test needs the best ones to differ in length"
    found = [
        row[1:][:length] for row, length in zip(out.sequences.tolist(), generated_lengths(out.sequences))
    ]
    assert found == [hypotheses[i] for i in best]
    torch.testing.assert_close(
        out.sequences_scores.double(),
        torch.tensor([scores[i] for i in best], dtype=torch.float64),
        rtol=0,
        atol=1e-5,
    )


@pytest.mark.parametrize("early_stopping", [True, False, "never"])
@pytest.mark.parametrize("alpha", [0.6, 1.0, -0.5])
def test_scores_are_log_probability_over_the_gnmt_penalty(alpha, early_stopping):
    model = random_model(3, eos_bias=4.0)
    source, mask = padded_sources(3, batch_size=4)
    beams = 4
    out = model.generate(
        source,
        attention_mask=mask,
        num_beams=beams,
        num_return_sequences=beams,
        max_new_tokens=12,
        length_penalty=alpha,
        length_penalty_type="gnmt",
        early_stopping=early_stopping,
        return_dict_in_generate=True,
        output_scores=True,
    )
    lengths = generated_lengths(out.sequences)
    assert len(set(lengths)) > 1, "the test needs hypotheses of different lengths"
    hypotheses = [row[1 : 1 + length] for row, length in zip(out.sequences.tolist(), lengths)]
    rows = torch.arange(source.shape[0]).repeat_interleave(beams)
    totals = log_probabilities(model, source[rows], mask[rows], hypotheses)
    expected = [total / gnmt_penalty(length, alpha) for total, length in zip(totals, lengths)]
    torch.testing.assert_close(
        out.sequences_scores.double(), torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-5
    )
    ranked = out.sequences_scores.view(-1, beams)
    assert (ranked[:, :-1] >= ranked[:, 1:]).all()
    # Rows end with their end token (or at the limit), then padding.
    for row, length in zip(out.sequences[:, 1:].tolist(), lengths):
        assert all(token == PAD for token in row[length:])


def test_it_needs_none_of_transformers_beam_search_internals(monkeypatch):
    model = random_model(4)
    source, mask = padded_sources(4)
    options = dict(num_beams=3, max_new_tokens=8, length_penalty=0.6, length_penalty_type="gnmt")
    expected = model.generate(source, attention_mask=mask, **options)

    def refuse(*args, **kwargs):
        raise AssertionError("transformers' beam-search internals were used")

    for name in (
        "_beam_search",
        "_prefill",
        "_update_model_kwargs_for_generation",
        "_get_top_k_continuations",
        "_get_running_beams_for_next_iteration",
        "_update_finished_beams",
        "_check_early_stop_heuristic",
        "_beam_search_has_unfinished_sequences",
        "_reorder_cache",
    ):
        monkeypatch.setattr(GenerationMixin, name, refuse, raising=False)
        monkeypatch.setattr(type(model), name, refuse, raising=False)
    assert torch.equal(model.generate(source, attention_mask=mask, **options), expected)


def test_greedy_search_and_a_call_s_own_decoding_loop_stay_transformers(monkeypatch):
    model = random_model(6)
    source, mask = padded_sources(6)
    greedy = dict(num_beams=1, max_new_tokens=6, length_penalty_type="gnmt")
    assert torch.equal(
        model.generate(source, attention_mask=mask, **greedy),
        model.generate(source, attention_mask=mask, **{**greedy, "length_penalty_type": "transformers"}),
    )
    calls = []

    def own_loop(model, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs):
        calls.append(generation_config.num_beams)
        return input_ids

    out = model.generate(
        source, attention_mask=mask, num_beams=2, length_penalty_type="gnmt", custom_generate=own_loop
    )
    assert calls == [2] and out.shape == (2 * source.shape[0], 1)
