"""The ONNX export: two graphs, `encoder.onnx` (source ids and mask -> encoder states and every decoder
layer's cross-attention keys and values, computed once per input) and `decoder.onnx` (the new target ids,
the encoder states and mask, the self-attention keys and values of the earlier steps and the cross-attention
ones -> logits and the new steps' keys and values), exported with `torch.onnx.export` through the model's
own forward, so that the graphs compute what `generate()` computes."""

import warnings
from pathlib import Path

import torch
from torch import nn
from transformers.cache_utils import EncoderDecoderCache

from ... import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from .export_common import ExportSource, _prepare_output, _save_companions, require_packages

ONNX_ENCODER_FILE = "encoder.onnx"
ONNX_DECODER_FILE = "decoder.onnx"
# Graph input and output names, which the exporter gives the graphs and the ONNX engine feeds and reads
# (the inputs are OnnxEncoderGraph.forward's and OnnxDecoderGraph.forward's arguments, in order). Keys and
# values are stacked over layers: [batch, layers, heads, time, d].
ONNX_ENCODER_INPUTS = ("input_ids", "attention_mask")
ONNX_DECODER_INPUTS = (
    "decoder_input_ids",
    "encoder_hidden_states",
    "encoder_attention_mask",
    "past_keys",
    "past_values",
    "cross_keys",
    "cross_values",
)
ONNX_ENCODER_OUTPUTS = ("encoder_hidden_states", "cross_keys", "cross_values")
ONNX_DECODER_OUTPUTS = ("logits", "new_keys", "new_values")


class OnnxEncoderGraph(nn.Module):
    """What `encoder.onnx` computes: the encoder states, and from them each decoder layer's cross-attention
    keys and values (Section 3.2.3: computed once per input), stacked over layers."""

    def __init__(self, model: VanillaTransformerForConditionalGeneration) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        states = self.model.get_encoder()(
            input_ids=input_ids, attention_mask=attention_mask
        ).last_hidden_state
        keys, values = [], []
        for layer in self.model.get_decoder().layers:
            attention = layer.encoder_attn
            keys.append(attention._split_heads(attention.k_proj(states), attention.d_k))
            values.append(attention._split_heads(attention.v_proj(states), attention.d_v))
        return states, torch.stack(keys, dim=1), torch.stack(values, dim=1)


class OnnxDecoderGraph(nn.Module):
    """What `decoder.onnx` computes: one call of the model's decoder and output projection over new target
    tokens, given the keys and values of the earlier steps (possibly none) and of the encoder states, as
    `generate()` runs it with its cache. Returns the logits and the new tokens' self-attention keys and
    values, stacked over layers."""

    def __init__(self, model: VanillaTransformerForConditionalGeneration) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        decoder_input_ids: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: torch.Tensor,
        past_keys: torch.Tensor,
        past_values: torch.Tensor,
        cross_keys: torch.Tensor,
        cross_values: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        past_length = past_keys.shape[3]
        layers = zip(
            past_keys.unbind(1),
            past_values.unbind(1),
            cross_keys.unbind(1),
            cross_values.unbind(1),
            strict=True,
        )
        cache = EncoderDecoderCache(list(layers))
        logits = self.model(
            encoder_outputs=(encoder_hidden_states,),
            attention_mask=encoder_attention_mask,
            decoder_input_ids=decoder_input_ids,
            cache=cache,
            use_cache=True,
        ).logits
        self_attention = cache.self_attention_cache.layers
        new_keys = torch.stack([layer.keys[:, :, past_length:] for layer in self_attention], dim=1)
        new_values = torch.stack([layer.values[:, :, past_length:] for layer in self_attention], dim=1)
        return logits, new_keys, new_values


def _onnx_example_inputs(config: VanillaTransformerConfig) -> tuple[dict, dict]:
    """Example inputs for tracing each graph. Every dimension that varies gets an example size of at least 2:
    torch.export fixes dimensions of size 0 or 1."""
    batch, source, past, new = 2, 5, 3, 2
    layers, heads = config.decoder_layers, config.decoder_attention_heads
    d_k, d_v = config.decoder_head_dims
    source_ids = torch.zeros(batch, source, dtype=torch.long)
    source_mask = torch.ones(batch, source, dtype=torch.long)
    encoder = dict(zip(ONNX_ENCODER_INPUTS, (source_ids, source_mask), strict=True))
    decoder_values = (
        torch.full((batch, new), config.decoder_start_token_id),
        torch.zeros(batch, source, config.d_model),
        source_mask,
        torch.zeros(batch, layers, heads, past, d_k),
        torch.zeros(batch, layers, heads, past, d_v),
        torch.zeros(batch, layers, heads, source, d_k),
        torch.zeros(batch, layers, heads, source, d_v),
    )
    decoder = dict(zip(ONNX_DECODER_INPUTS, decoder_values, strict=True))
    return encoder, decoder


def export_onnx(source: ExportSource, out: str | Path, force: bool = False, opset: int | None = None) -> Path:
    """Write `source` as `encoder.onnx` and `decoder.onnx` (see `OnnxEncoderGraph`, `OnnxDecoderGraph`) with
    its config, tokenizers, generation config and `EXPORT_INFO_FILE`. Batch, source length, past length and
    new-token count are dynamic; the decoder takes a past of length 0 at the first step."""
    require_packages("onnx")
    from torch.export import Dim

    out = Path(out)
    _prepare_output(out, source, force)
    model = source.model
    encoder_inputs, decoder_inputs = _onnx_example_inputs(source.config)
    batch, length, past, new = Dim("batch"), Dim("source_length"), Dim("past_length"), Dim("new_tokens")
    source_axes = {0: batch, 1: length}
    encoder_shapes = dict.fromkeys(ONNX_ENCODER_INPUTS, source_axes)
    decoder_axes = (
        {0: batch, 1: new},
        source_axes,
        source_axes,
        {0: batch, 3: past},
        {0: batch, 3: past},
        {0: batch, 3: length},
        {0: batch, 3: length},
    )
    decoder_shapes = dict(zip(ONNX_DECODER_INPUTS, decoder_axes, strict=True))
    graphs = (
        (OnnxEncoderGraph, encoder_inputs, encoder_shapes, ONNX_ENCODER_OUTPUTS, ONNX_ENCODER_FILE),
        (OnnxDecoderGraph, decoder_inputs, decoder_shapes, ONNX_DECODER_OUTPUTS, ONNX_DECODER_FILE),
    )
    with torch.no_grad(), warnings.catch_warnings():
        # Notes from torch's exporter that change nothing: axes sharing one Dim keep one name, and a pytree
        # deprecation inside torch itself.
        warnings.filterwarnings(
            "ignore", message=r"# The axis name: .* will not be used", category=UserWarning
        )
        warnings.filterwarnings(
            "ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning
        )
        for graph, inputs, shapes, outputs, file_name in graphs:
            torch.onnx.export(
                graph(model).eval(),
                (),
                out / file_name,
                kwargs=inputs,
                input_names=list(inputs),
                output_names=list(outputs),
                dynamic_shapes=shapes,
                opset_version=opset,
                dynamo=True,
                verbose=False,
            )
    model.config.save_pretrained(out)
    _save_companions(source, out, "onnx")
    return out
