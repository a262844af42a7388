"""The config: the paper's presets (Table 3), parameter counts, and validation of bad values."""

import json

import pytest
import torch
from conftest import tiny_config
from huggingface_hub.errors import StrictDataclassError
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging

from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.training.legacy import legacy_label_smoothing


def count_parameters(config: VanillaTransformerConfig) -> int:
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
    assert config.position_embedding_type == "sinusoidal"
    n = count_parameters(config)
    assert n == expected_parameters(37000, d, d_ff, 6)
    assert round(n / 1e6, 1) == millions


def test_paper_symbols_set_both_stacks():
    config = VanillaTransformerConfig.from_preset("base", N=2, h=4, d_ff=128, P_drop=0.2, d_k=16)
    assert (config.encoder_layers, config.decoder_layers) == (2, 2)
    assert (config.encoder_attention_heads, config.decoder_attention_heads) == (4, 4)
    assert (config.encoder_ffn_dim, config.decoder_ffn_dim) == (128, 128)
    assert config.dropout == 0.2
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
        ({"pad_token_id": 64}, "pad_token_id"),
        ({"eos_token_id": -1}, "eos_token_id"),
        ({"decoder_start_token_id": 1000}, "decoder_start_token_id"),
        ({"activation_function": "tanh"}, "activation_function"),
        ({"position_embedding_type": "rotary"}, "position_embedding_type"),
        ({"sinusoidal_layout": "weird"}, "sinusoidal_layout"),
        ({"share_encoder_decoder_embeddings": False, "decoder_vocab_size": -3}, "decoder_vocab_size"),
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
    # A value of the wrong type is refused by the @strict dataclass, as transformers' own configs refuse it.
    with pytest.raises((ValueError, StrictDataclassError), match=field):
        tiny_config(**overrides)


def test_the_constructor_takes_the_paper_symbols_as_from_preset_does():
    config = VanillaTransformerConfig(vocab_size=50, d_model=16, N=1, h=2, d_ff=32, P_drop=0.2)
    assert (config.encoder_layers, config.decoder_layers) == (1, 1)
    assert (config.encoder_attention_heads, config.decoder_attention_heads) == (2, 2)
    assert (config.encoder_ffn_dim, config.decoder_ffn_dim) == (32, 32)
    assert config.dropout == 0.2
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


def test_untied_sharing_gives_three_matrices_over_one_vocabulary():
    """tie_word_embeddings=False unties every matrix in transformers 5, as in Marian: source, target and
    the projection each have their own, all of the one shared vocabulary."""
    model = VanillaTransformerForConditionalGeneration(
        tiny_config(tie_word_embeddings=False, decoder_vocab_size=7)
    )
    weights = [
        model.get_encoder().embed_tokens.weight,
        model.get_decoder().embed_tokens.weight,
        model.lm_head.weight,
    ]
    assert len({id(weight) for weight in weights}) == 3
    assert all(weight.shape == (64, 32) for weight in weights)


def test_the_target_vocabulary_follows_a_shared_vocabulary_changed_after_the_config_was_made():
    config = tiny_config()
    config.vocab_size = 40
    model = VanillaTransformerForConditionalGeneration(config)
    assert config.target_vocab_size == 40
    assert model.lm_head.weight.shape[0] == model.get_decoder().embed_tokens.weight.shape[0] == 40


def test_label_smoothing_is_refused_as_a_model_setting_with_where_it_goes():
    for name in ("eps_ls", "label_smoothing"):
        with pytest.raises(ValueError, match="setting of training.*--label-smoothing"):
            VanillaTransformerConfig.from_preset("base", **{name: 0.1})


def test_a_config_saved_with_label_smoothing_loads_and_keeps_it_for_training(tmp_path, caplog):
    """Configs saved by earlier versions of the package carry their run's label smoothing: they load,
    with one warning, and `legacy_label_smoothing` gives training the value."""
    tiny_config().save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert "label_smoothing" not in saved
    (tmp_path / "config.json").write_text(json.dumps({**saved, "label_smoothing": 0.2}))
    logging.warning_once.cache_clear()
    logger = logging.get_logger(
        "hf_vanilla_transformer.vanilla_transformer.configuration_vanilla_transformer"
    )
    with CaptureLogger(logger) as log:
        config = VanillaTransformerConfig.from_pretrained(tmp_path)
    assert log.out.count("label_smoothing=0.2") == 1
    assert legacy_label_smoothing(config) == 0.2
    assert legacy_label_smoothing(tiny_config()) is None
    model = VanillaTransformerForConditionalGeneration(config)
    src = torch.randint(4, 64, (2, 5))
    labels = torch.randint(4, 64, (2, 4))
    out = model(input_ids=src, labels=labels)
    expected = torch.nn.functional.cross_entropy(out.logits.view(-1, 64), labels.view(-1))
    torch.testing.assert_close(out.loss, expected)


def test_misspelled_override_is_refused():
    with pytest.raises(ValueError, match=r"Unknown setting\(s\) \['d_fff'\]"):
        VanillaTransformerConfig.from_preset("base", d_fff=128)
