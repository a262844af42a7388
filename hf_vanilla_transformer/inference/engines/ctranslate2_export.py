"""The CTranslate2 export: a `TransformerSpec` built directly from the config and weights (no detour through
another model class). Post-LN layers, queries/keys/values fused as CTranslate2 wants them, the exact
positional table of the model (the paper's interleaved sinusoids, Marian's or fairseq's layout with fairseq's
offset, or learned positions) and the logits bias where the model has one. A config the spec cannot
represent is refused, naming the field (`ctranslate2_refusals`)."""

from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from ... import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from ..alignment import alignment_layer
from .export_common import ExportError, ExportSource, _prepare_output, _save_companions, require_packages
from .names import CTRANSLATE2_QUANTIZATIONS
from .shortlist import VMAP_FILE, Shortlist

# CTranslate2's activation (ctranslate2.specs.Activation member) for each of ours: GELU is the erf form in
# both, swish and silu are x * sigmoid(x).
_CTRANSLATE2_ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "swish": "SWISH", "silu": "SWISH"}


def ctranslate2_refusals(config: VanillaTransformerConfig) -> list[str]:
    """Why CTranslate2's TransformerSpec cannot hold a model with this config, one reason per field; empty
    if it can. The spec holds post-LN layers, any head count per stack, one head size for queries, keys and
    values, biases on every projection (the logits bias included), a scale on the embeddings, a position
    table of any layout, and one end token."""
    reasons = []
    for stack, (d_k, d_v) in (("encoder", config.encoder_head_dims), ("decoder", config.decoder_head_dims)):
        if d_k != d_v:
            reasons.append(
                f"d_k ({d_k}) differs from d_v ({d_v}) in the {stack}: CTranslate2's attention has one "
                "head size for keys and values (export to ONNX instead)"
            )
            break
    if config.activation_function not in _CTRANSLATE2_ACTIVATIONS:
        reasons.append(f"activation_function {config.activation_function!r} has no CTranslate2 counterpart")
    if isinstance(config.eos_token_id, list) and len(config.eos_token_id) > 1:
        reasons.append(f"eos_token_id {config.eos_token_id}: a CTranslate2 model has one end token")
    if config.decoder_start_token_id is None:
        reasons.append("decoder_start_token_id is None: CTranslate2 needs the token the decoder starts from")
    return reasons


def ctranslate2_vocabulary(tokenizer: PreTrainedTokenizerBase, size: int, side: str) -> list[str]:
    """The `size` token strings of the embedding rows, in id order, as CTranslate2 names them. Rows the
    tokenizer has no token for get placeholder names; every name must be unique."""
    if len(tokenizer) > size:
        raise ExportError(
            f"The {side} tokenizer has {len(tokenizer)} tokens but the embeddings have {size} rows: "
            "the tokenizer does not belong to this model."
        )
    tokens = tokenizer.convert_ids_to_tokens(list(range(size)))
    tokens = [token if token is not None else f"<unused_{index}>" for index, token in enumerate(tokens)]
    seen: dict[str, int] = {}
    for index, token in enumerate(tokens):
        if token in seen:
            raise ExportError(
                f"The {side} vocabulary names ids {seen[token]} and {index} both {token!r}: CTranslate2 "
                "reads tokens by name, so each must be unique."
            )
        seen[token] = index
    return tokens


def _copy(tensor: torch.Tensor) -> torch.Tensor:
    """A float32 copy: quantizing a spec rewrites its tensors in place, and the model must stay as it is."""
    return tensor.detach().to(torch.float32, copy=True)


def _set_linear(spec: Any, *modules: nn.Linear) -> None:
    """One CTranslate2 linear layer from one or more of ours, stacked along the outputs (fused q/k/v)."""
    spec.weight = torch.cat([_copy(module.weight) for module in modules])
    if modules[0].bias is not None:
        spec.bias = torch.cat([_copy(module.bias) for module in modules])


def _set_layer_norm(spec: Any, norm: nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _copy(norm.weight), _copy(norm.bias)


def _set_stack(spec: Any, stack: nn.Module) -> None:
    """Embeddings, their sqrt(d_model) scale and the model's own position table (its exact sinusoids in
    the config's layout, offset included, or the learned rows)."""
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = _copy(stack.embed_tokens.weight)
    spec.scale_embeddings = float(stack.embed_tokens.embed_scale)
    spec.position_encodings.encodings = _copy(stack.embed_positions.weight)


def ctranslate2_spec(
    model: VanillaTransformerForConditionalGeneration,
    source_tokens: list[str],
    target_tokens: list[str],
    unk_token: str | None = None,
) -> Any:
    """The CTranslate2 TransformerSpec that computes what `model` computes (float32 weights, copied), with
    the token names of the embedding rows (`ctranslate2_vocabulary`) and the tokenizer's unknown token."""
    from ctranslate2.specs import Activation, TransformerDecoderSpec, TransformerEncoderSpec, TransformerSpec

    config = model.config
    reasons = ctranslate2_refusals(config)
    if reasons:
        raise ExportError("Cannot export to CTranslate2: " + "; ".join(reasons) + ".")
    activation = getattr(Activation, _CTRANSLATE2_ACTIVATIONS[config.activation_function])
    encoder_spec = TransformerEncoderSpec(
        config.encoder_layers,
        config.encoder_attention_heads,
        pre_norm=False,
        activation=activation,
        head_dim=config.encoder_head_dims[0],
    )
    decoder_spec = TransformerDecoderSpec(
        config.decoder_layers,
        config.decoder_attention_heads,
        pre_norm=False,
        activation=activation,
        head_dim=config.decoder_head_dims[0],
        # The attention CTranslate2 returns for alignments: `alignment.alignment_layer`'s, all heads averaged.
        alignment_layer=alignment_layer(config.decoder_layers),
        alignment_heads=config.decoder_attention_heads,
    )
    encoder, decoder = model.get_encoder(), model.get_decoder()
    _set_stack(encoder_spec, encoder)
    _set_stack(decoder_spec, decoder)
    for layer_spec, layer in zip(encoder_spec.layer, encoder.layers, strict=True):
        attention = layer.self_attn
        _set_linear(layer_spec.self_attention.linear[0], attention.q_proj, attention.k_proj, attention.v_proj)
        _set_linear(layer_spec.self_attention.linear[1], attention.out_proj)
        _set_layer_norm(layer_spec.self_attention.layer_norm, layer.self_attn_layer_norm)
        _set_feed_forward(layer_spec.ffn, layer)
    for layer_spec, layer in zip(decoder_spec.layer, decoder.layers, strict=True):
        attention, cross = layer.self_attn, layer.encoder_attn
        _set_linear(layer_spec.self_attention.linear[0], attention.q_proj, attention.k_proj, attention.v_proj)
        _set_linear(layer_spec.self_attention.linear[1], attention.out_proj)
        _set_layer_norm(layer_spec.self_attention.layer_norm, layer.self_attn_layer_norm)
        _set_linear(layer_spec.attention.linear[0], cross.q_proj)
        _set_linear(layer_spec.attention.linear[1], cross.k_proj, cross.v_proj)
        _set_linear(layer_spec.attention.linear[2], cross.out_proj)
        _set_layer_norm(layer_spec.attention.layer_norm, layer.encoder_attn_layer_norm)
        _set_feed_forward(layer_spec.ffn, layer)
    _set_linear(decoder_spec.projection, model.lm_head)
    if config.output_bias:
        decoder_spec.projection.bias = _copy(model.final_logits_bias[0])

    spec = TransformerSpec(encoder_spec, decoder_spec)
    spec.config.layer_norm_epsilon = config.layer_norm_eps
    eos = config.eos_token_id[0] if isinstance(config.eos_token_id, list) else config.eos_token_id
    special = {
        # CTranslate2 appends its unknown token to a vocabulary that lacks it, which would no longer fit the
        # embeddings. Our engines only pass tokens from the vocabulary, so any of its tokens can stand in.
        "unk_token": unk_token if unk_token in source_tokens else source_tokens[0],
        "bos_token": target_tokens[config.bos_token_id if config.bos_token_id is not None else eos],
        "eos_token": target_tokens[eos],
        "decoder_start_token": target_tokens[config.decoder_start_token_id],
    }
    for key, token in special.items():
        setattr(spec.config, key, token)
    spec.register_source_vocabulary(source_tokens)
    spec.register_target_vocabulary(target_tokens)
    return spec


def _set_feed_forward(spec: Any, layer: nn.Module) -> None:
    _set_linear(spec.linear_0, layer.ffn.fc1)
    _set_linear(spec.linear_1, layer.ffn.fc2)
    _set_layer_norm(spec.layer_norm, layer.final_layer_norm)


def export_ctranslate2(
    source: ExportSource,
    out: str | Path,
    quantization: str | None = None,
    force: bool = False,
    shortlist: "Shortlist | None" = None,
) -> Path:
    """Write `source` as a CTranslate2 model folder (model.bin, config.json and vocabularies, in
    CTranslate2's format) plus tokenizers, generation config and `EXPORT_INFO_FILE`, and `shortlist` as its
    vocabulary mapping (`VMAP_FILE`), which the CTranslate2 engine then uses.

    `quantization` is one of `CTRANSLATE2_QUANTIZATIONS` (None: float32). Raises ExportError for a config
    CTranslate2 cannot represent (`ctranslate2_refusals`), mismatched tokenizers, a shortlist naming tokens
    outside the vocabularies, or an occupied `out`.
    """
    require_packages("ctranslate2")
    from ctranslate2.converters import Converter

    if quantization not in (None, *CTRANSLATE2_QUANTIZATIONS):
        raise ExportError(
            f"Unknown quantization {quantization!r}: choose one of {list(CTRANSLATE2_QUANTIZATIONS)}."
        )
    config = source.config
    source_tokens = ctranslate2_vocabulary(source.tokenizer, config.vocab_size, "source")
    target_tokenizer = source.target_tokenizer or source.tokenizer
    target_tokens = ctranslate2_vocabulary(target_tokenizer, config.target_vocab_size, "target")
    spec = ctranslate2_spec(source.model, source_tokens, target_tokens, source.tokenizer.unk_token)
    if shortlist is not None:
        shortlist.check(source_tokens, target_tokens)

    class _SpecConverter(Converter):
        """CTranslate2's converter (validation, quantization, saving) over a spec built here."""

        def _load(self) -> Any:
            return spec

    out = Path(out)
    _prepare_output(out, source, force)
    _SpecConverter().convert(str(out), quantization=quantization, force=True)
    shortlist_info = None
    if shortlist is not None:
        shortlist.write(out / VMAP_FILE)
        shortlist_info = {"always": len(shortlist.always), "source_tokens": len(shortlist.candidates)}
    _save_companions(
        source,
        out,
        "ctranslate2",
        quantization=quantization or "float32",
        shortlist=shortlist_info,
        alignment={"layer": alignment_layer(config.decoder_layers), "heads": config.decoder_attention_heads},
    )
    return out
