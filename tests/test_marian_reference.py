"""transformers' MarianMTModel is an independent implementation of the same post-LN architecture:
with the same weights our model must compute the same logits and the same beam-search outputs."""

import pytest
import torch
from conftest import TINY_REFERENCE_DIMS
from transformers import MarianConfig, MarianMTModel

from hf_vanilla_transformer.conversion import convert_marian


def random_marian(activation: str = "swish", seed: int = 0) -> MarianMTModel:
    config = MarianConfig(
        vocab_size=96,
        **TINY_REFERENCE_DIMS,
        activation_function=activation,
        scale_embedding=True,
        pad_token_id=95,
        eos_token_id=0,
        decoder_start_token_id=95,
        forced_eos_token_id=0,
    )
    torch.manual_seed(seed)
    marian = MarianMTModel(config).eval()
    with torch.no_grad():  # a non-zero logits bias, so that the test sees it
        marian.final_logits_bias.normal_()
    return marian


@pytest.mark.parametrize("activation", ["swish", "relu", "gelu"])
def test_logits_match_marian(activation):
    marian = random_marian(activation)
    ours = convert_marian(marian)
    generator = torch.Generator().manual_seed(1)
    src = torch.randint(1, 95, (3, 11), generator=generator)
    tgt = torch.randint(1, 95, (3, 8), generator=generator)
    mask = torch.ones_like(src)
    mask[1, 7:] = 0
    with torch.no_grad():
        expected = marian(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
        actual = ours(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
    assert (actual - expected).abs().max().item() <= 1e-4


@pytest.mark.parametrize("num_beams", [1, 4])
def test_generation_matches_marian(num_beams):
    marian = random_marian()
    ours = convert_marian(marian)
    generator = torch.Generator().manual_seed(2)
    src = torch.randint(1, 95, (4, 9), generator=generator)
    mask = torch.ones_like(src)
    mask[0, 5:] = 0
    src[0, 5:] = 95
    kwargs = dict(attention_mask=mask, num_beams=num_beams, max_new_tokens=12, do_sample=False)
    assert torch.equal(ours.generate(input_ids=src, **kwargs), marian.generate(input_ids=src, **kwargs))


def test_wrong_architecture_is_refused():
    from hf_vanilla_transformer.conversion import load_converted_state, state_dict_from_marian

    marian = random_marian()
    ours = convert_marian(marian)
    state = state_dict_from_marian(marian.state_dict())
    state["model.encoder.layers.0.ffn.fc1.weight"] = torch.zeros(5, 5)
    del state["model.decoder.layers.1.final_layer_norm.bias"]
    state["model.encoder.layernorm_embedding.weight"] = torch.zeros(32)
    with pytest.raises(ValueError) as error:
        load_converted_state(ours, state, "test.ckpt")
    message = str(error.value)
    assert "missing from test.ckpt: model.decoder.layers.1.final_layer_norm.bias" in message
    assert "not recognised in test.ckpt: model.encoder.layernorm_embedding.weight" in message
    assert "model.encoder.layers.0.ffn.fc1.weight: (5, 5) in test.ckpt, (64, 32) expected" in message
