"""Converting checkpoints of other implementations of the same architecture into this package's format.

Marian (the opus-mt family in transformers' `MarianMTModel`) is the paper's post-LN Transformer with
three differences this package has options for: the sinusoids laid out as [sin half | cos half]
(`sinusoidal_layout="marian"`), a logits bias (`output_bias=True`) and, in opus-mt checkpoints, the
swish activation. With those set, its weights load one to one.
"""

import re

import torch
from transformers import MarianConfig, MarianMTModel

from .configuration_vanilla_transformer import VanillaTransformerConfig
from .modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration

# Marian's layer-level feed-forward names, and where this package keeps them (one FFN module, Eq. 2).
_MARIAN_KEY_RENAMES = ((re.compile(r"\.(fc1|fc2)\."), r".ffn.\1."),)
# Computed, never loaded: the sinusoid tables.
_MARIAN_IGNORED_KEYS = re.compile(r"\.embed_positions\.weight$")


def config_from_marian(marian: MarianConfig) -> VanillaTransformerConfig:
    """The configuration that reproduces a MarianConfig exactly."""
    return VanillaTransformerConfig(
        vocab_size=marian.vocab_size,
        decoder_vocab_size=marian.decoder_vocab_size,
        d_model=marian.d_model,
        encoder_layers=marian.encoder_layers,
        decoder_layers=marian.decoder_layers,
        encoder_attention_heads=marian.encoder_attention_heads,
        decoder_attention_heads=marian.decoder_attention_heads,
        encoder_ffn_dim=marian.encoder_ffn_dim,
        decoder_ffn_dim=marian.decoder_ffn_dim,
        dropout=float(marian.dropout),
        attention_dropout=float(marian.attention_dropout),
        activation_dropout=float(marian.activation_dropout),
        activation_function=marian.activation_function,
        max_position_embeddings=marian.max_position_embeddings,
        sinusoidal_layout="marian",
        scale_embedding=marian.scale_embedding,
        share_encoder_decoder_embeddings=marian.share_encoder_decoder_embeddings,
        tie_word_embeddings=marian.tie_word_embeddings,
        output_bias=True,
        pad_token_id=marian.pad_token_id,
        bos_token_id=marian.bos_token_id,
        eos_token_id=marian.eos_token_id,
        decoder_start_token_id=marian.decoder_start_token_id,
    )


def state_dict_from_marian(marian_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename a MarianMTModel state dict to this package's parameter names."""
    converted = {}
    for key, tensor in marian_state.items():
        if _MARIAN_IGNORED_KEYS.search(key):
            continue
        for pattern, replacement in _MARIAN_KEY_RENAMES:
            key = pattern.sub(replacement, key)
        converted[key] = tensor
    return converted


def load_converted_state(
    model: VanillaTransformerForConditionalGeneration, state: dict[str, torch.Tensor], source: str
) -> None:
    """Load `state` into `model`, failing with the offending names if anything is missing, unexpected
    or of the wrong shape. Tied copies of the shared embedding may be absent from `state`."""
    expected = model.state_dict()
    tied = set(model.get_expanded_tied_weights_keys(all_submodels=True))
    missing = sorted(k for k in expected if k not in state and k not in tied)
    unexpected = sorted(k for k in state if k not in expected)
    wrong_shape = sorted(
        f"{k}: {tuple(state[k].shape)} in {source}, {tuple(expected[k].shape)} expected"
        for k in state
        if k in expected and state[k].shape != expected[k].shape
    )
    problems = [
        (f"missing from {source}", missing),
        (f"not recognised in {source}", unexpected),
        ("shape mismatch", wrong_shape),
    ]
    report = [
        f"{label}: {', '.join(names[:10])}{' ...' if len(names) > 10 else ''}"
        for label, names in problems
        if names
    ]
    if report:
        raise ValueError(f"Cannot convert {source}: " + "; ".join(report))
    model.load_state_dict(state, strict=False)
    model.tie_weights()


def convert_marian(marian: MarianMTModel) -> VanillaTransformerForConditionalGeneration:
    """A VanillaTransformerForConditionalGeneration that computes exactly what `marian` computes."""
    config = config_from_marian(marian.config)
    model = VanillaTransformerForConditionalGeneration(config)
    load_converted_state(model, state_dict_from_marian(marian.state_dict()), "the Marian checkpoint")
    model.generation_config = marian.generation_config
    return model.to(marian.dtype).eval()
