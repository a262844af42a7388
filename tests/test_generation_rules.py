"""The paper's decoding rules (Section 6.1): the GNMT length penalty and output length = input + 50."""

import pytest
import torch
from conftest import tiny_model
from transformers import GenerationConfig

from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.vanilla_transformer.generation_vanilla_transformer import (
    gnmt_length_penalty,
    paper_generation_config,
)

BOS, PAD, EOS = 0, 1, 2


def model_with_eos_bias(bias: float) -> VanillaTransformerForConditionalGeneration:
    model = tiny_model(output_bias=True)
    with torch.no_grad():
        model.final_logits_bias[0, EOS] = bias
    return model


def sequence_log_probs(model, src: torch.Tensor, sequences: torch.Tensor) -> tuple[list[float], list[int]]:
    """Teacher-forced sum of log-probabilities of each generated sequence, and its length |Y|."""
    totals, lengths = [], []
    for i, seq in enumerate(sequences):
        tokens = seq[1:]
        if (tokens == EOS).any():
            tokens = tokens[: int((tokens == EOS).nonzero()[0]) + 1]
        with torch.no_grad():
            logits = model(input_ids=src[i : i + 1], decoder_input_ids=seq[None, : len(tokens)]).logits[0]
        log_probs = torch.log_softmax(logits.double(), dim=-1)
        totals.append(log_probs.gather(1, tokens[:, None]).sum().item())
        lengths.append(len(tokens))
    return totals, lengths


@pytest.mark.parametrize(
    ("penalty_type", "penalty"),
    [("gnmt", lambda n, a: gnmt_length_penalty(n, a)), ("transformers", lambda n, a: n**a)],
)
def test_beam_scores_are_log_probability_over_the_penalty(penalty_type, penalty):
    model = model_with_eos_bias(3.0)
    src = torch.randint(4, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    out = model.generate(
        input_ids=src,
        num_beams=4,
        num_return_sequences=4,
        length_penalty=0.6,
        length_penalty_type=penalty_type,
        max_new_tokens=12,
        early_stopping=True,
        return_dict_in_generate=True,
        output_scores=True,
    )
    totals, lengths = sequence_log_probs(model, src.repeat_interleave(4, dim=0), out.sequences)
    assert len(set(lengths)) > 1, "the test needs hypotheses of different lengths"
    expected = [total / penalty(n, 0.6) for total, n in zip(totals, lengths)]
    torch.testing.assert_close(
        out.sequences_scores.double(), torch.tensor(expected, dtype=torch.float64), atol=1e-4, rtol=0
    )
    ranked = out.sequences_scores.view(2, 4)
    assert (ranked[:, :-1] >= ranked[:, 1:]).all()


def test_gnmt_penalty_values():
    assert gnmt_length_penalty(1, 0.6) == 1.0
    assert gnmt_length_penalty(7, 0.6) == pytest.approx(2.0**0.6)
    assert gnmt_length_penalty(10, 0.0) == 1.0


@pytest.mark.parametrize("num_beams", [1, 4])
def test_outputs_stop_at_input_length_plus_offset(num_beams):
    model = model_with_eos_bias(-100.0)  # the end token is never chosen freely
    src = torch.randint(4, 64, (3, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(src)
    mask[1, 3:] = 0
    mask[2, 6:] = 0
    src[mask == 0] = PAD
    out = model.generate(input_ids=src, attention_mask=mask, num_beams=num_beams, max_length_offset=2)
    for row, source_length in zip(out, mask.sum(1).tolist()):
        tokens = row[1:][row[1:] != PAD].tolist()
        assert tokens[-1] == EOS and EOS not in tokens[:-1]
        assert len(tokens) - 1 == source_length + 2


def test_explicit_max_new_tokens_wins_over_the_offset_rule():
    model = model_with_eos_bias(-100.0)
    src = torch.randint(4, 64, (1, 8), generator=torch.Generator().manual_seed(1))
    out = model.generate(input_ids=src, max_length_offset=50, max_new_tokens=5)
    assert out.shape[1] == 1 + 5


def test_paper_generation_config_round_trips_and_drives_generate(tmp_path):
    model = model_with_eos_bias(-100.0)
    model.generation_config = paper_generation_config(model.config, max_length_offset=1)
    model.save_pretrained(tmp_path)
    loaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path)
    config = loaded.generation_config
    assert (config.num_beams, config.length_penalty, config.early_stopping) == (4, 0.6, True)
    assert (config.length_penalty_type, config.max_length_offset) == ("gnmt", 1)
    src = torch.randint(4, 64, (1, 6), generator=torch.Generator().manual_seed(2))
    assert loaded.generate(input_ids=src).shape[1] == 1 + 6 + 1 + 1  # start, input + 1 tokens, end


def test_unknown_length_penalty_type():
    model = tiny_model()
    with pytest.raises(ValueError, match="Unknown length_penalty_type 'linear'"):
        model.generate(input_ids=torch.tensor([[5, 6, 3]]), length_penalty_type="linear", num_beams=2)


def test_generation_config_objects_are_accepted():
    model = model_with_eos_bias(-100.0)
    src = torch.tensor([[5, 6, 7, 3]])
    config = GenerationConfig(
        num_beams=2, max_length_offset=3, length_penalty_type="gnmt", decoder_start_token_id=BOS
    )
    assert model.generate(input_ids=src, generation_config=config).shape[1] == 1 + 4 + 3 + 1


def test_max_new_tokens_in_the_generation_config_wins_over_the_offset_rule(recwarn):
    model = model_with_eos_bias(-100.0)
    src = torch.randint(4, 64, (1, 8), generator=torch.Generator().manual_seed(1))
    config = paper_generation_config(model.config, max_new_tokens=3)
    assert model.generate(input_ids=src, generation_config=config).shape[1] == 1 + 3
    model.generation_config = paper_generation_config(model.config, max_new_tokens=4)
    assert model.generate(input_ids=src).shape[1] == 1 + 4
    # The offset rule's own limit goes into a copy of the call's config, never beside it (deprecated).
    model.generation_config = paper_generation_config(model.config, max_length_offset=2)
    config = paper_generation_config(model.config, max_length_offset=2)
    assert model.generate(input_ids=src, generation_config=config).shape[1] == 1 + 8 + 2 + 1
    assert config.max_new_tokens is None
    assert not [w for w in recwarn if "generation_config" in str(w.message)]


def test_the_offset_rule_takes_the_lengths_from_the_attention_mask_without_input_ids():
    model = model_with_eos_bias(-100.0)
    model.generation_config = paper_generation_config(model.config, max_length_offset=2, num_beams=1)
    src = torch.randint(4, 64, (2, 6), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(src)
    mask[1, 4:] = 0
    from_ids = model.generate(input_ids=src, attention_mask=mask)
    encoder_outputs = model.get_encoder()(input_ids=src, attention_mask=mask)
    from_encoder = model.generate(encoder_outputs=encoder_outputs, attention_mask=mask)
    assert torch.equal(from_ids, from_encoder)
    with pytest.raises(ValueError, match="pass the source input_ids or its attention_mask, or set the"):
        model.generate(encoder_outputs=encoder_outputs)


def test_learned_positions_cap_the_offset_rule_at_the_position_table():
    model = tiny_model(position_embedding_type="learned", max_position_embeddings=10, output_bias=True)
    with torch.no_grad():
        model.final_logits_bias[0, EOS] = -100.0
    src = torch.randint(4, 64, (1, 8), generator=torch.Generator().manual_seed(1))
    out = model.generate(input_ids=src, max_length_offset=50, num_beams=2)
    assert out.shape[1] == 1 + 10
