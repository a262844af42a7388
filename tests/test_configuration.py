"""The config: the paper's presets (Table 3), parameter counts, and validation of bad values."""

import json

import pytest
from conftest import tiny_config

from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration


def count_parameters(config: VanillaTransformerConfig) -> int:
    import torch

    with torch.device("meta"):
        model = VanillaTransformerForConditionalGeneration(config)
    return sum(p.numel() for p in model.parameters())


def expected_parameters(vocab: int, d: int, d_ff: int, layers: int) -> int:
    """Count by hand from Section 3: shared embedding, 4 projections per attention, FFN, LayerNorms."""
    attention = 4 * (d * d + d)
    ffn = d * d_ff + d_ff + d_ff * d + d
    norm = 2 * d
    encoder_layer = attention + ffn + 2 * norm
    decoder_layer = 2 * attention + ffn + 3 * norm
    return vocab * d + layers * (encoder_layer + decoder_layer)


@pytest.mark.parametrize(
    ("preset", "d", "d_ff", "heads", "dropout", "millions"),
    [("base", 512, 2048, 8, 0.1, 63.1), ("big", 1024, 4096, 16, 0.3, 214.2)],
)
def test_presets_match_table_3(preset, d, d_ff, heads, dropout, millions):
    config = VanillaTransformerConfig.from_preset(preset, vocab_size=37000)
    assert (config.d_model, config.encoder_ffn_dim, config.encoder_attention_heads) == (d, d_ff, heads)
    assert (config.encoder_layers, config.decoder_layers, config.dropout) == (6, 6, dropout)
    assert config.label_smoothing == 0.1 and config.position_embedding_type == "sinusoidal"
    n = count_parameters(config)
    assert n == expected_parameters(37000, d, d_ff, 6)
    assert round(n / 1e6, 1) == millions


def test_paper_symbols_set_both_stacks():
    config = VanillaTransformerConfig.from_preset("base", N=2, h=4, d_ff=128, P_drop=0.2, eps_ls=0.0, d_k=16)
    assert (config.encoder_layers, config.decoder_layers) == (2, 2)
    assert (config.encoder_attention_heads, config.decoder_attention_heads) == (4, 4)
    assert (config.encoder_ffn_dim, config.decoder_ffn_dim) == (128, 128)
    assert (config.dropout, config.label_smoothing) == (0.2, 0.0)
    assert config.encoder_head_dims == (16, 128)


def test_table_3_row_a_head_sizes_change_projection_shapes():
    config = tiny_config(h=8, d_k=16, d_v=8)
    model = VanillaTransformerForConditionalGeneration(config)
    attn = model.model.encoder.layers[0].self_attn
    assert attn.q_proj.weight.shape == (8 * 16, 32)
    assert attn.v_proj.weight.shape == (8 * 8, 32)
    assert attn.out_proj.weight.shape == (32, 8 * 8)


def test_round_trip_through_json(tmp_path):
    config = tiny_config(position_embedding_type="learned", d_k=4)
    config.save_pretrained(tmp_path)
    again = VanillaTransformerConfig.from_pretrained(tmp_path)
    assert again.to_dict() == config.to_dict()
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "vanilla_transformer"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"d_model": 30, "h": 4}, "d_model"),
        ({"d_model": 0}, "d_model"),
        ({"vocab_size": -5}, "vocab_size"),
        ({"N": 0}, "encoder_layers"),
        ({"d_ff": 0}, "encoder_ffn_dim"),
        ({"d_k": 0}, "d_k"),
        ({"P_drop": 1.0}, "dropout"),
        ({"attention_dropout": -0.1}, "attention_dropout"),
        ({"eps_ls": 1.5}, "label_smoothing"),
        ({"pad_token_id": 64}, "pad_token_id"),
        ({"eos_token_id": -1}, "eos_token_id"),
        ({"decoder_start_token_id": 1000}, "decoder_start_token_id"),
        ({"activation_function": "tanh"}, "activation_function"),
        ({"position_embedding_type": "rotary"}, "position_embedding_type"),
        ({"sinusoidal_layout": "weird"}, "sinusoidal_layout"),
        ({"decoder_vocab_size": 70}, "decoder_vocab_size"),
        ({"d_k": True}, "d_k"),
        ({"layer_norm_eps": "1e-5"}, "layer_norm_eps"),
        ({"init_std": float("nan")}, "init_std"),
        ({"pad_token_id": None}, "pad_token_id"),
        ({"decoder_start_token_id": None}, "decoder_start_token_id"),
        ({"sinusoidal_layout": "fairseq", "d_model": 2, "h": 1}, "fairseq"),
        (
            {"share_encoder_decoder_embeddings": False, "vocab_size": 1, "decoder_vocab_size": 64},
            "pad_token_id",
        ),
    ],
)
def test_invalid_values_raise_and_name_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        tiny_config(**overrides)


def test_the_constructor_takes_the_paper_symbols_as_from_preset_does():
    config = VanillaTransformerConfig(vocab_size=50, d_model=16, N=1, h=2, d_ff=32, P_drop=0.2, eps_ls=0.0)
    assert (config.encoder_layers, config.decoder_layers) == (1, 1)
    assert (config.encoder_attention_heads, config.decoder_attention_heads) == (2, 2)
    assert (config.encoder_ffn_dim, config.decoder_ffn_dim) == (32, 32)
    assert (config.dropout, config.label_smoothing) == (0.2, 0.0)
    assert not hasattr(config, "N") and "N" not in config.to_dict()
    with pytest.raises(ValueError, match="N=2 and encoder_layers=3 disagree"):
        VanillaTransformerConfig(N=2, encoder_layers=3)


def test_from_preset_applies_a_symbol_and_its_fields_in_the_order_given():
    refined = VanillaTransformerConfig.from_preset("base", N=4, decoder_layers=2)
    assert (refined.encoder_layers, refined.decoder_layers) == (4, 2)
    replaced = VanillaTransformerConfig.from_preset("base", decoder_layers=2, N=4)
    assert (replaced.encoder_layers, replaced.decoder_layers) == (4, 4)


def test_a_config_changed_after_it_was_made_is_checked_again_by_the_model():
    config = tiny_config()
    config.encoder_attention_heads = 3
    with pytest.raises(ValueError, match="not divisible by encoder_attention_heads"):
        VanillaTransformerForConditionalGeneration(config)


def test_d_model_not_divisible_is_fine_with_explicit_head_sizes():
    config = tiny_config(d_model=30, h=4, d_k=8, d_v=8)
    assert config.encoder_head_dims == (8, 8)


def test_unknown_preset():
    with pytest.raises(ValueError, match="Unknown preset 'huge'.*base.*big"):
        VanillaTransformerConfig.from_preset("huge")


def test_sharing_without_tying_is_refused():
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        VanillaTransformerForConditionalGeneration(tiny_config(tie_word_embeddings=False))


def test_misspelled_override_is_refused():
    with pytest.raises(ValueError, match=r"Unknown setting\(s\) \['d_fff'\]"):
        VanillaTransformerConfig.from_preset("base", d_fff=128)
