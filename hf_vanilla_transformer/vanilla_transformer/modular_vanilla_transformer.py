# Copyright 2026 The hf-vanilla-transformer Authors. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""The Transformer of "Attention Is All You Need" in transformers' modular form: the source from which
transformers' `utils/modular_model_converter.py` generates `modeling_vanilla_transformer.py`.

A class whose Marian or BART counterpart has the same role and the same base subclasses that counterpart,
and overrides every member the counterpart defines, since the converter copies into the generated file
whatever a subclass leaves to its parent. The converter's conventions used here:

- `Base.method(self, ...)` is generated as `super().method(...)`; a bare `super().method(...)` statement
  would be replaced by the counterpart's code.
- `name = AttributeError()` drops a class attribute of the counterpart, and a method whose body only raises
  `AttributeError` drops the counterpart's method.
- `@no_inherit_decorator` keeps the counterpart's decorators off a method that has none.
- `transformers.initialization` is imported as a module: the converter refuses `from transformers import`.

Counterparts subclassed:

- `VanillaTransformerScaledWordEmbedding`: `BartScaledWordEmbedding`.
- `VanillaTransformerAttention`: `MarianAttention`.
- `VanillaTransformerEncoderLayer` / `VanillaTransformerDecoderLayer`: `MarianEncoderLayer` /
  `MarianDecoderLayer`.
- `VanillaTransformerPreTrainedModel`: `BartPreTrainedModel`, whose class attributes come in this class's
  order.
- `VanillaTransformerEncoder` / `VanillaTransformerDecoder`: `MarianEncoder` / `MarianDecoder`.
- `VanillaTransformerModel`: `BartModel`, whose methods are this class's.

Defined without a counterpart base:

- `VanillaTransformerPositionalEncoding`: Marian's sinusoidal positions are an `nn.Embedding` and the
  converter keeps a parent's bases; this is an `nn.Module` holding learned positions or a computed buffer.
- `VanillaTransformerForConditionalGeneration`: under Marian's or BART's class the converter would put
  `PaperDecodingMixin` in place of `GenerationMixin` (a base with the same suffix), leaving no `generate()`.
- `VanillaTransformerFeedForward` and the module-level functions: Marian and BART have no feed-forward
  module, and a function is either imported from them (the converter copies it) or defined here.

Nothing imports this file at run time.
"""

import dataclasses
import functools
import inspect
import math
import os
from collections.abc import Callable

import torch
import transformers.initialization as init
from torch import nn
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.models.bart.modeling_bart import BartModel, BartPreTrainedModel, BartScaledWordEmbedding
from transformers.models.marian.modeling_marian import (
    MarianAttention,
    MarianDecoder,
    MarianDecoderLayer,
    MarianEncoder,
    MarianEncoderLayer,
)
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, auto_docstring, can_return_tuple, is_torchdynamo_compiling
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import merge_with_config_defaults, no_inherit_decorator
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_vanilla_transformer import VanillaTransformerConfig
from .generation_vanilla_transformer import PaperDecodingMixin

# transformers 5.24 renamed `past_key_values` to `cache` in the mask functions' arguments, the output classes'
# fields and generate()'s model inputs; releases before take and return `past_key_values`. Each name is read
# from the public interface it belongs to, once.
MASK_CACHE_ARGUMENT = next(
    name for name in ("cache", "past_key_values") if name in inspect.signature(create_causal_mask).parameters
)
OUTPUT_CACHE_FIELD = next(
    field.name for field in dataclasses.fields(Seq2SeqLMOutput) if field.name in ("cache", "past_key_values")
)


def accepts_past_key_values(forward: Callable) -> Callable:
    """Let `forward(cache=...)` also be called with `past_key_values=`: a deprecated alias (with transformers'
    warning) from transformers 5.24, where generate() passes `cache`; before 5.24, the name generate() passes,
    taken silently."""
    if OUTPUT_CACHE_FIELD == "cache":
        return deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")(forward)

    @functools.wraps(forward)
    def wrapper(*args, **kwargs):
        if "past_key_values" in kwargs:
            past_key_values = kwargs.pop("past_key_values")
            if kwargs.get("cache") is None:
                kwargs["cache"] = past_key_values
        return forward(*args, **kwargs)

    return wrapper


class VanillaTransformerScaledWordEmbedding(BartScaledWordEmbedding):
    """Token embeddings multiplied by sqrt(d_model) (Section 3.4). The scale is part of the module, so
    `inputs_embeds` built with `get_input_embeddings()` (PEFT prompt tuning, `generate(inputs_embeds=)`)
    equal what the model makes from the same ids."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int, embed_scale: float) -> None:
        nn.Embedding.__init__(self, num_embeddings, embedding_dim, padding_idx)
        self.embed_scale = embed_scale

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return nn.Embedding.forward(self, input_ids) * self.embed_scale


def sinusoidal_position_encoding(
    num_positions: int, dim: int, layout: str = "paper", offset: int = 0
) -> torch.Tensor:
    """The positional encodings of Section 3.5, one row per position, computed in float64.

    PE(pos, 2i) = sin(pos / 10000^(2i / d_model)) and PE(pos, 2i + 1) = cos(pos / 10000^(2i / d_model)).
    `layout="marian"` puts the same sines in the first half and cosines in the second; `"fairseq"` does
    the same with fairseq's frequencies exp(-i ln(10000) / (d/2 - 1)). `offset` is the first position.
    """
    return _sinusoids(torch.arange(offset, offset + num_positions, dtype=torch.float64), dim, layout)


def _sinusoids(positions: torch.Tensor, dim: int, layout: str) -> torch.Tensor:
    """`sinusoidal_position_encoding` of the float64 `positions` (of any shape, the encodings along a new
    last dimension), on their device, as float32."""
    if layout == "fairseq":
        half = dim // 2
        exponents = torch.arange(half, dtype=torch.float64, device=positions.device)
        inverse_frequencies = torch.exp(exponents * -(math.log(10000) / (half - 1)))
    else:
        two_i = torch.arange(0, dim, 2, dtype=torch.float64, device=positions.device)
        inverse_frequencies = 10000.0 ** (-two_i / dim)
    angles = positions[..., None] * inverse_frequencies
    if layout == "paper":
        # shape, not len(): under torch.export len() would fix the number of positions to the example's.
        table = torch.empty(*positions.shape, dim, dtype=torch.float64, device=positions.device)
        table[..., 0::2] = torch.sin(angles)
        table[..., 1::2] = torch.cos(angles)[..., : dim // 2]
    else:
        table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)
    return table.float()


class VanillaTransformerPositionalEncoding(nn.Module):
    """Positions for the embeddings: the fixed sinusoids of Section 3.5, or learned ones (Table 3, row E).

    The sinusoid table is a computed, non-persistent buffer: nothing is saved, and `_init_weights`
    rebuilds it after `from_pretrained` builds the model on the meta device.
    """

    def __init__(self, config: VanillaTransformerConfig) -> None:
        super().__init__()
        # CODEPATH: Table 3 row E checkpoints learn their positions; every other checkpoint uses sinusoids.
        self.learned = config.position_embedding_type == "learned"
        # CODEPATH: fairseq and opus-mt checkpoints converted by this package keep their own sinusoid layout.
        self.layout = config.sinusoidal_layout
        self.offset = config.pad_token_id + 1 if self.layout == "fairseq" else 0
        self.dim = config.hidden_size
        if self.learned:
            self.weight = nn.Parameter(torch.empty(config.max_position_embeddings, config.hidden_size))
        else:
            self.weight = nn.Buffer(self.sinusoid_table(config.max_position_embeddings), persistent=False)

    def sinusoid_table(self, num_positions: int) -> torch.Tensor:
        return sinusoidal_position_encoding(num_positions, self.dim, self.layout, self.offset)

    def check_length(self, num_positions: int) -> None:
        """Refuse more positions than learned embeddings encode; the sinusoids extend to any length."""
        if self.learned and num_positions > self.weight.shape[0]:
            raise ValueError(
                f"Position {num_positions - 1} is past the {self.weight.shape[0]} learned position "
                "embeddings (max_position_embeddings). Truncate inputs, and a static cache's max_cache_len, "
                "to that many tokens, or use position_embedding_type='sinusoidal', whose table extends."
            )

    def forward(
        self,
        seq_length: int,
        cache_length: int | torch.Tensor = 0,
        left_padding: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The encodings of positions cache_length, ..., cache_length + seq_length - 1, of shape (seq_length,
        d_model); with `left_padding` (each sequence's count of padding tokens before its first token) one
        row of them per sequence, each counted from its first token; with `position_ids` (batch, seq_length)
        the encodings of those positions, each below cache_length + seq_length (several sequences packed
        into one row, each counting from 0). Lengths come from shapes; a static cache gives its length as a
        tensor, whose value is not read back from the device (the decoder checks the cache's capacity
        against learned positions instead)."""
        table = self.weight
        if position_ids is None:
            position_ids = torch.arange(seq_length, device=table.device) + cache_length
            if left_padding is not None:
                position_ids = (position_ids - left_padding.to(table.device)[:, None]).clamp_min(0)
        else:
            position_ids = position_ids.to(table.device)
        if isinstance(cache_length, int):
            self.check_length(cache_length + seq_length)
            if cache_length + seq_length > table.shape[0]:
                # The sinusoids are defined for every position, so longer inputs stay exact.
                table = self.sinusoid_table(cache_length + seq_length).to(
                    device=table.device, dtype=table.dtype
                )
        elif not self.learned:
            # Positions known only on the device may lie past the table: computed from the same formula.
            return _sinusoids(position_ids.double() + self.offset, self.dim, self.layout).to(table.dtype)
        return nn.functional.embedding(position_ids, table)


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Unpack[TransformersKwargs],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention, Eq. 1: softmax(Q K^T / sqrt(d_k)) V."""
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value).transpose(1, 2).contiguous()
    return attn_output, attn_weights


class VanillaTransformerAttention(MarianAttention):
    """Multi-head attention, Section 3.2.2: Concat(head_1, ..., head_h) W^O with
    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V), h heads of size d_k (queries, keys) and d_v (values).

    Used three ways (Section 3.2.3): encoder self-attention, masked decoder self-attention and
    encoder-decoder attention, whose keys and values are computed once per input and cached.
    """

    def __init__(
        self,
        config: VanillaTransformerConfig,
        is_decoder: bool = False,
        is_causal: bool = False,
        layer_idx: int | None = None,
    ) -> None:
        nn.Module.__init__(self)
        self.config = config
        self.num_heads = config.decoder_attention_heads if is_decoder else config.encoder_attention_heads
        # d_k and d_v default to d_model / h (Section 3.2.2); Table 3's rows A and B set them apart.
        self.d_k = config.d_k or config.hidden_size // self.num_heads
        self.d_v = config.d_v or config.hidden_size // self.num_heads
        self.dropout = config.attention_dropout
        self.scaling = self.d_k**-0.5
        # SDPA treats a missing mask as causal unless told otherwise, so every instance says which it is.
        self.is_causal = is_causal
        self.layer_idx = layer_idx
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.d_k)
        self.k_proj = nn.Linear(config.hidden_size, self.num_heads * self.d_k)
        self.v_proj = nn.Linear(config.hidden_size, self.num_heads * self.d_v)
        self.out_proj = nn.Linear(self.num_heads * self.d_v, config.hidden_size)

    @no_inherit_decorator
    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        cache: Cache | None = None,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """MultiHead(Q, K, V) of Section 3.2.2: the queries from `hidden_states`, the keys and values from
        `key_value_states` (encoder-decoder attention) or `hidden_states` (self-attention), extended by or
        read from `cache` when decoding."""
        is_cross_attention = key_value_states is not None
        query_states = self._split_heads(self.q_proj(hidden_states), self.d_k)

        layer_cache, cross_kv_ready = cache, False
        if isinstance(cache, EncoderDecoderCache):
            if is_cross_attention:
                layer_cache = cache.cross_attention_cache
                cross_kv_ready = cache.is_updated.get(self.layer_idx, False)
            else:
                layer_cache = cache.self_attention_cache

        if cross_kv_ready:
            key_states = layer_cache.layers[self.layer_idx].keys
            value_states = layer_cache.layers[self.layer_idx].values
        else:
            source = key_value_states if is_cross_attention else hidden_states
            key_states = self._split_heads(self.k_proj(source), self.d_k)
            value_states = self._split_heads(self.v_proj(source), self.d_v)
            if layer_cache is not None:
                key_states, value_states = layer_cache.update(key_states, value_states, self.layer_idx)
                if is_cross_attention:
                    cache.is_updated[self.layer_idx] = True

        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        attn_output, attn_weights = attention_interface(
            self,
            query_states,
            key_states,
            value_states,
            attention_mask,
            dropout=self.dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        attn_output = attn_output.reshape(*hidden_states.shape[:-1], -1).contiguous()
        return self.out_proj(attn_output), attn_weights

    def _split_heads(self, states: torch.Tensor, head_dim: int) -> torch.Tensor:
        return states.view(*states.shape[:-1], self.num_heads, head_dim).transpose(1, 2)


class VanillaTransformerFeedForward(nn.Module):
    """Position-wise feed-forward network, Eq. 2: FFN(x) = max(0, x W1 + b1) W2 + b2."""

    def __init__(self, config: VanillaTransformerConfig, ffn_dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, config.hidden_size)
        self.activation_fn = ACT2FN[config.activation_function]
        self.activation_dropout = nn.Dropout(config.activation_dropout)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation_dropout(self.activation_fn(self.fc1(hidden_states))))


def residual_dropout_norm(
    sublayer_output: torch.Tensor, residual: torch.Tensor, norm: nn.LayerNorm, dropout: nn.Dropout
) -> torch.Tensor:
    """LayerNorm(x + Dropout(Sublayer(x))): the post-LN residual connection of Sections 3.1 and 5.4."""
    return norm(residual + dropout(sublayer_output))


class VanillaTransformerEncoderLayer(MarianEncoderLayer):
    """One encoder layer, Section 3.1: self-attention, then the feed-forward network, each wrapped
    in a post-LN residual connection."""

    def __init__(self, config: VanillaTransformerConfig, layer_idx: int | None = None) -> None:
        GradientCheckpointingLayer.__init__(self)
        self.dropout = nn.Dropout(config.dropout)
        self.self_attn = VanillaTransformerAttention(config, layer_idx=layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ffn = VanillaTransformerFeedForward(config, config.encoder_ffn_dim)
        self.final_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        attended, _ = self.self_attn(hidden_states, attention_mask=attention_mask, **kwargs)
        hidden_states = residual_dropout_norm(
            attended, hidden_states, self.self_attn_layer_norm, self.dropout
        )
        return residual_dropout_norm(
            self.ffn(hidden_states), hidden_states, self.final_layer_norm, self.dropout
        )


class VanillaTransformerDecoderLayer(MarianDecoderLayer):
    """One decoder layer, Section 3.1: masked self-attention, encoder-decoder attention, then the
    feed-forward network, each wrapped in a post-LN residual connection."""

    def __init__(self, config: VanillaTransformerConfig, layer_idx: int | None = None) -> None:
        GradientCheckpointingLayer.__init__(self)
        self.dropout = nn.Dropout(config.dropout)
        self.self_attn = VanillaTransformerAttention(
            config, is_decoder=True, is_causal=True, layer_idx=layer_idx
        )
        self.self_attn_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.encoder_attn = VanillaTransformerAttention(config, is_decoder=True, layer_idx=layer_idx)
        self.encoder_attn_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ffn = VanillaTransformerFeedForward(config, config.decoder_ffn_dim)
        self.final_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    @no_inherit_decorator
    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = True,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        attended, _ = self.self_attn(hidden_states, cache=cache, attention_mask=attention_mask, **kwargs)
        hidden_states = residual_dropout_norm(
            attended, hidden_states, self.self_attn_layer_norm, self.dropout
        )
        if encoder_hidden_states is not None:
            # The decoder run alone (as a language model) has no encoder states to attend to.
            attended, _ = self.encoder_attn(
                hidden_states,
                key_value_states=encoder_hidden_states,
                attention_mask=encoder_attention_mask,
                cache=cache,
                **kwargs,
            )
            hidden_states = residual_dropout_norm(
                attended, hidden_states, self.encoder_attn_layer_norm, self.dropout
            )
        return residual_dropout_norm(
            self.ffn(hidden_states), hidden_states, self.final_layer_norm, self.dropout
        )


@auto_docstring
class VanillaTransformerPreTrainedModel(BartPreTrainedModel):
    config: VanillaTransformerConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _keys_to_ignore_on_load_unexpected = AttributeError()
    _no_split_modules = ["VanillaTransformerEncoderLayer", "VanillaTransformerDecoderLayer"]
    _supports_flash_attn = True
    _supports_sdpa = True
    _supports_flex_attn = True
    _can_compile_fullgraph = True

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Xavier-uniform projections with zero biases and N(0, d_model^-0.5) embeddings; the rest (layer
        norms) as transformers initialises them.

        The paper does not state its initialisation; this is what its tensor2tensor code and fairseq
        use. The normal's std makes the sqrt(d_model)-scaled embeddings (Section 3.4) unit-variance.
        """
        std = self.config.init_std or self.config.hidden_size**-0.5
        if isinstance(module, nn.Linear):
            init.xavier_uniform_(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
            # The slice below loses the loaded-weight flag that init's functions check, so it is checked here.
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, VanillaTransformerPositionalEncoding):
            if module.learned:
                init.normal_(module.weight, mean=0.0, std=std)
            else:
                init.copy_(module.weight, module.sinusoid_table(module.weight.shape[0]))
        elif isinstance(module, VanillaTransformerForConditionalGeneration):
            # CODEPATH: opus-mt checkpoints carry Marian's logits bias; the paper's models have none.
            if module.config.output_bias:
                init.zeros_(module.final_logits_bias)
        else:
            PreTrainedModel._init_weights(self, module)

    def dummy_inputs(self) -> dict[str, torch.Tensor]:
        raise AttributeError("VanillaTransformerPreTrainedModel has no dummy_inputs")

    def _resize_token_embeddings(
        self, new_num_tokens: int | None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Embedding:
        """The source embeddings, and with one vocabulary for source and target (Section 3.4) the whole
        target side too: the decoder's embeddings where they are a matrix of their own, the output
        projection and the logits bias. With separate vocabularies, the source side only:
        `resize_decoder_token_embeddings` resizes the target side."""
        old = self.get_input_embeddings()
        resized = self._get_resized_embeddings(old, new_num_tokens, pad_to_multiple_of, mean_resizing)
        resized.requires_grad_(old.weight.requires_grad)
        self.set_input_embeddings(resized)
        # CODEPATH: the paper's and opus-mt checkpoints share one vocabulary; fairseq's separate-vocabulary
        # checkpoints resize their target side with resize_decoder_token_embeddings.
        if self.config.share_encoder_decoder_embeddings:
            self._resize_target_side(resized.weight.shape[0], mean_resizing)
        return resized

    def resize_decoder_token_embeddings(
        self, new_num_tokens: int, mean_resizing: bool = True
    ) -> nn.Embedding:
        """Resize the target vocabulary of a model with separate vocabularies (fairseq's): the decoder's
        embeddings, the output projection and the logits bias, as Marian's method of the same name does."""
        if self.config.share_encoder_decoder_embeddings:
            raise ValueError(
                "This model shares one vocabulary between source and target: resize it with "
                "resize_token_embeddings. resize_decoder_token_embeddings is for separate vocabularies."
            )
        self._resize_target_side(new_num_tokens, mean_resizing)
        self.tie_weights()
        return self.get_decoder().embed_tokens

    def _resize_target_side(self, size: int, mean_resizing: bool) -> None:
        decoder = self.get_decoder()
        if decoder.embed_tokens.weight.shape[0] != size:
            decoder.embed_tokens = self._get_resized_embeddings(
                decoder.embed_tokens, size, mean_resizing=mean_resizing
            )
        self._resize_output_side(size, mean_resizing)
        self.config.decoder_vocab_size = size

    def _resize_output_side(self, size: int, mean_resizing: bool) -> None:
        """The output projection and the logits bias: the bare encoder-decoder has neither."""


def _embedding_scale(config: VanillaTransformerConfig) -> float:
    # CODEPATH: the paper's checkpoints scale by sqrt(d_model) (Section 3.4); converted unscaled ones do not.
    return math.sqrt(config.hidden_size) if config.scale_embedding else 1.0


def add_positions(
    inputs_embeds: torch.Tensor,
    embed_positions: VanillaTransformerPositionalEncoding,
    dropout: nn.Dropout,
    attention_mask: torch.Tensor | None,
    cache_length: int | torch.Tensor = 0,
    position_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """The scaled embeddings plus the encodings of their positions, after dropout (Sections 3.4, 3.5 and
    5.4). Positions count from each sequence's first token, so that a sequence padded on the left (fairseq's
    habit, or a tokenizer with `padding_side="left"`) is encoded as it is alone; `attention_mask` (batch,
    cache + tokens) shows the padding. `position_ids` (batch, tokens), where given, are the positions
    instead: packed rows, whose sequences each count from 0. An empty batch, or sequences of no tokens, are
    refused here: attention cannot reshape zero elements."""
    if inputs_embeds.shape[0] == 0 or inputs_embeds.shape[1] == 0:
        raise ValueError(
            f"Empty input of shape {tuple(inputs_embeds.shape[:2])} (batch, tokens): pass at least one "
            "sequence of at least one token."
        )
    left_padding = None
    if position_ids is None and attention_mask is not None and attention_mask.dim() == 2:
        left_padding = (attention_mask.cumsum(-1) == 0).sum(-1)
    positions = embed_positions(inputs_embeds.shape[1], cache_length, left_padding, position_ids)
    # The table is float32 whatever dtype the model was loaded in: the sum takes the embeddings' dtype.
    positions = positions.to(device=inputs_embeds.device, dtype=inputs_embeds.dtype)
    return dropout(inputs_embeds + positions)


class VanillaTransformerEncoder(MarianEncoder):
    """The encoder stack: N identical layers over the token embeddings scaled by sqrt(d_model) (Section 3.4)
    plus the positional encodings, with dropout on the sum (Section 5.4)."""

    _can_record_outputs = {
        "hidden_states": VanillaTransformerEncoderLayer,
        "attentions": VanillaTransformerAttention,
    }

    def __init__(self, config: VanillaTransformerConfig) -> None:
        PreTrainedModel.__init__(self, config)
        self.dropout = nn.Dropout(config.dropout)
        self.embed_tokens = VanillaTransformerScaledWordEmbedding(
            config.vocab_size, config.hidden_size, config.pad_token_id, _embedding_scale(config)
        )
        self.embed_positions = VanillaTransformerPositionalEncoding(config)
        self.layers = nn.ModuleList(
            [VanillaTransformerEncoderLayer(config, layer_idx=i) for i in range(config.encoder_layers)]
        )
        self.gradient_checkpointing = False
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    @auto_docstring
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutput:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds to the encoder.")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        hidden_states = add_positions(
            inputs_embeds, self.embed_positions, self.dropout, attention_mask, position_ids=position_ids
        )
        attention_mask = create_bidirectional_mask(
            config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask
        )
        for encoder_layer in self.layers:
            hidden_states = encoder_layer(hidden_states, attention_mask, **kwargs)
        return BaseModelOutput(last_hidden_state=hidden_states)


class VanillaTransformerDecoder(MarianDecoder):
    """The decoder stack: N identical layers, masked so that position i attends only to positions
    before it (Section 3.1), over the scaled target embeddings plus positions."""

    _can_record_outputs = {
        "hidden_states": VanillaTransformerDecoderLayer,
        "attentions": OutputRecorder(VanillaTransformerAttention, index=1, layer_name="self_attn"),
        "cross_attentions": OutputRecorder(VanillaTransformerAttention, index=1, layer_name="encoder_attn"),
    }

    def __init__(self, config: VanillaTransformerConfig) -> None:
        PreTrainedModel.__init__(self, config)
        self.dropout = nn.Dropout(config.dropout)
        self.embed_tokens = VanillaTransformerScaledWordEmbedding(
            config.target_vocab_size, config.hidden_size, config.pad_token_id, _embedding_scale(config)
        )
        self.embed_positions = VanillaTransformerPositionalEncoding(config)
        self.layers = nn.ModuleList(
            [VanillaTransformerDecoderLayer(config, layer_idx=i) for i in range(config.decoder_layers)]
        )
        self.gradient_checkpointing = False
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    @accepts_past_key_values
    @auto_docstring
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        position_ids: torch.LongTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        r"""
        cache (`Cache`, *optional*):
            The keys and values of earlier decoding steps, as the model returned them with `use_cache=True`
            (documented here for transformers before 5.24, whose docstrings name it `past_key_values`).
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of decoder_input_ids or decoder_inputs_embeds to the decoder.")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)

        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        elif cache is not None and not isinstance(cache, EncoderDecoderCache):
            # A decoder-only cache holds the self-attention states; the cross-attention states need their own.
            cache = EncoderDecoderCache(cache, DynamicCache(config=self.config))
        batch_size, seq_length = inputs_embeds.shape[:2]
        cache_length = cache.get_seq_length() if cache is not None else 0
        if isinstance(cache_length, torch.Tensor):
            # `get_max_length` from transformers 5.13; `get_max_cache_shape` until 5.19.
            get_max_length = getattr(cache, "get_max_length", None) or cache.get_max_cache_shape
            self.embed_positions.check_length(get_max_length())

        given_mask = attention_mask
        if attention_mask is None and not is_torchdynamo_compiling():
            attention_mask = torch.ones(batch_size, cache_length + seq_length, device=inputs_embeds.device)
        causal_mask = create_causal_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            **{MASK_CACHE_ARGUMENT: cache.self_attention_cache if cache is not None else None},
        )
        encoder_attention_mask = create_bidirectional_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
        )

        hidden_states = add_positions(
            inputs_embeds, self.embed_positions, self.dropout, given_mask, cache_length, position_ids
        )
        for decoder_layer in self.layers:
            hidden_states = decoder_layer(
                hidden_states,
                causal_mask,
                encoder_hidden_states,  # positional, so that gradient checkpointing passes it through
                encoder_attention_mask=encoder_attention_mask,
                cache=cache,
                use_cache=use_cache,
                **kwargs,
            )
        return BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=hidden_states, **{OUTPUT_CACHE_FIELD: cache}
        )


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Decoder inputs from labels: the outputs "shifted right by one position" (Section 3.1), starting
    from the decoder start token, with the -100 of ignored label positions replaced by padding."""
    shifted = labels.new_full(labels.shape, pad_token_id)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


@auto_docstring
class VanillaTransformerModel(BartModel):
    _tied_weights_keys = AttributeError()

    def __init__(self, config: VanillaTransformerConfig) -> None:
        r"""The encoder-decoder of Figure 1, without the output projection."""
        PreTrainedModel.__init__(self, config)
        config.check_values()  # again: fields may have been changed since the config was made
        # CODEPATH: the paper's and opus-mt checkpoints share one embedding matrix (Section 3.4); fairseq's
        # separate-vocabulary checkpoints and untied ones keep their own.
        if config.ties_embeddings:
            self.shared = VanillaTransformerScaledWordEmbedding(
                config.vocab_size, config.hidden_size, config.pad_token_id, _embedding_scale(config)
            )
            self._tied_weights_keys = {
                "encoder.embed_tokens.weight": "shared.weight",
                "decoder.embed_tokens.weight": "shared.weight",
            }
        self.encoder = VanillaTransformerEncoder(config)
        self.decoder = VanillaTransformerDecoder(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.encoder.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        # CODEPATH: checkpoints with one shared matrix replace it on both sides; others the source side only.
        if self.config.ties_embeddings:
            self.shared = value
            self.decoder.embed_tokens = value
        self.encoder.embed_tokens = value

    @can_return_tuple
    @accepts_past_key_values
    @auto_docstring
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple[torch.Tensor] | BaseModelOutput | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        position_ids: torch.LongTensor | None = None,
        decoder_position_ids: torch.LongTensor | None = None,
        cross_attention_mask: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqModelOutput:
        r"""
        cache (`Cache`, *optional*):
            The keys and values of earlier decoding steps, as the model returned them with `use_cache=True`
            (documented here for transformers before 5.24, whose docstrings name it `past_key_values`).
        position_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
            The position of each source token (Section 3.5), where rows hold several sources packed one after
            the other, each counting from 0. By default tokens count from each row's first unpadded token.
        decoder_position_ids (`torch.LongTensor` of shape `(batch_size, target_sequence_length)`, *optional*):
            The position of each decoder input token, as `position_ids` for the source.
        cross_attention_mask (`torch.Tensor`, *optional*):
            The encoder-decoder attention's own 4-D mask, of shape `(batch_size, 1, target_sequence_length,
            sequence_length)`, for rows whose targets may attend to only part of their source row (packed
            pairs); by default the encoder-decoder attention takes `attention_mask`.
        """
        if encoder_outputs is None:
            # return_dict=True in the inner calls: a config with return_dict=False asks for a tuple from
            # the outermost call only, which can_return_tuple makes from this output.
            encoder_outputs = self.encoder(
                input_ids=input_ids,
                attention_mask=attention_mask,
                inputs_embeds=inputs_embeds,
                position_ids=position_ids,
                return_dict=True,
                **kwargs,
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(
                last_hidden_state=encoder_outputs[0],
                hidden_states=encoder_outputs[1] if len(encoder_outputs) > 1 else None,
                attentions=encoder_outputs[2] if len(encoder_outputs) > 2 else None,
            )
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask if cross_attention_mask is None else cross_attention_mask,
            cache=cache,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            position_ids=decoder_position_ids,
            return_dict=True,
            **kwargs,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            **{OUTPUT_CACHE_FIELD: getattr(decoder_outputs, OUTPUT_CACHE_FIELD)},
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


def cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch: int | torch.Tensor | None = None
) -> torch.Tensor:
    """The negative log-likelihood of the labels per labelled token, in float32; positions labelled -100
    are ignored. The sum is divided by `num_items_in_batch` when the Trainer passes it, so that gradient
    accumulation over micro-batches equals one big batch; otherwise by this batch's count of labels.

    The paper trains with label smoothing (Section 5.4): a choice of training, which `train` makes
    (`vanilla-transformer train --label-smoothing`, or `Seq2SeqTrainer`'s `label_smoothing_factor`), never the
    model's loss.
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(
            f"labels have shape {tuple(labels.shape)} but the decoder gave logits for "
            f"{tuple(logits.shape[:-1])} positions: pass labels of the same shape as decoder_input_ids, or "
            "leave decoder_input_ids out (they are then the labels shifted right)."
        )
    loss = nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=-100, reduction="sum"
    )
    if num_items_in_batch is None:
        num_items_in_batch = (labels != -100).sum()
    if isinstance(num_items_in_batch, torch.Tensor):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss / num_items_in_batch


@auto_docstring(
    custom_intro="""
    The full model of Figure 1: the encoder-decoder, then the linear pre-softmax projection that shares its
    weight matrix with the embeddings (Section 3.4). `generate()` takes the paper's decoding rules.
    """
)
class VanillaTransformerForConditionalGeneration(
    VanillaTransformerPreTrainedModel, PaperDecodingMixin, GenerationMixin
):
    def __init__(self, config: VanillaTransformerConfig) -> None:
        super().__init__(config)
        self.model = VanillaTransformerModel(config)
        # CODEPATH: the paper's and opus-mt checkpoints tie the projection to the one shared matrix; fairseq's
        # separate-vocabulary checkpoints tie it to the decoder's embeddings; untied ones keep three matrices.
        if config.ties_embeddings:
            self._tied_weights_keys = {
                "lm_head.weight": "model.shared.weight",
                "model.encoder.embed_tokens.weight": "model.shared.weight",
                "model.decoder.embed_tokens.weight": "model.shared.weight",
            }
        elif config.tie_word_embeddings:
            self._tied_weights_keys = {"lm_head.weight": "model.decoder.embed_tokens.weight"}
        self.lm_head = nn.Linear(config.hidden_size, config.target_vocab_size, bias=False)
        # CODEPATH: opus-mt checkpoints carry Marian's final_logits_bias; the paper's models have none.
        if config.output_bias:
            self.final_logits_bias = nn.Buffer(torch.zeros(1, config.target_vocab_size))
        self.post_init()

    def get_encoder(self) -> VanillaTransformerEncoder:
        return self.model.encoder

    def get_decoder(self) -> VanillaTransformerDecoder:
        return self.model.decoder

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.lm_head = new_embeddings

    @can_return_tuple
    @accepts_past_key_values
    @auto_docstring
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple[torch.Tensor] | BaseModelOutput | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        decoder_position_ids: torch.LongTensor | None = None,
        cross_attention_mask: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqLMOutput:
        r"""
        cache (`Cache`, *optional*):
            The keys and values of earlier decoding steps, as the model returned them with `use_cache=True`
            (documented here for transformers before 5.24, whose docstrings name it `past_key_values`).
        labels (`torch.LongTensor` of shape `(batch_size, target_sequence_length)`, *optional*):
            Target token ids, -100 where no loss is wanted. The decoder inputs default to the labels shifted
            right (Section 3.1).
        num_items_in_batch (`int` or `torch.Tensor`, *optional*):
            The number of labelled tokens in the whole accumulated batch, which the Trainer passes so that the
            loss is a mean over it rather than over this micro-batch.
        position_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
            The position of each source token (Section 3.5), where rows hold several sources packed one after
            the other, each counting from 0. By default tokens count from each row's first unpadded token.
        decoder_position_ids (`torch.LongTensor` of shape `(batch_size, target_sequence_length)`, *optional*):
            The position of each decoder input token, as `position_ids` for the source.
        cross_attention_mask (`torch.Tensor`, *optional*):
            The encoder-decoder attention's own 4-D mask, of shape `(batch_size, 1, target_sequence_length,
            sequence_length)`, for rows whose targets may attend to only part of their source row (packed
            pairs); by default the encoder-decoder attention takes `attention_mask`.
        """
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)

        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            encoder_outputs=encoder_outputs,
            decoder_attention_mask=decoder_attention_mask,
            cache=cache,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            position_ids=position_ids,
            decoder_position_ids=decoder_position_ids,
            cross_attention_mask=cross_attention_mask,
            return_dict=True,
            **kwargs,
        )
        logits = self.lm_head(outputs.last_hidden_state)
        # CODEPATH: opus-mt checkpoints carry Marian's final_logits_bias; the paper's models have none.
        if self.config.output_bias:
            # In place: the logits are the model's largest tensor (tokens x vocabulary), and a second one
            # would be fresh memory at every step.
            logits += self.final_logits_bias.to(logits.dtype)

        loss = None
        if labels is not None:
            loss = cross_entropy(logits, labels.to(logits.device), num_items_in_batch)
        return Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            **{OUTPUT_CACHE_FIELD: getattr(outputs, OUTPUT_CACHE_FIELD)},
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )

    def save_pretrained(self, save_directory: str | os.PathLike, *args, **kwargs) -> None:
        """`PreTrainedModel.save_pretrained`. A folder saved with its code (for `trust_remote_code=True`)
        names the bare encoder-decoder for AutoModel too, so that both Auto classes load it without the
        package, as they load transformers' own seq2seq models."""
        if self._auto_class is not None:
            module = VanillaTransformerModel.__module__.rsplit(".", 1)[-1]
            bare = f"{module}.{VanillaTransformerModel.__name__}"
            self.config.auto_map = {**(getattr(self.config, "auto_map", None) or {}), "AutoModel": bare}
        super().save_pretrained(save_directory, *args, **kwargs)

    def _resize_output_side(self, size: int, mean_resizing: bool) -> None:
        # CODEPATH: tied checkpoints take the embeddings' new matrix in tie_weights; untied ones resize.
        if self.config.tie_word_embeddings:
            self.lm_head.out_features = size
        else:
            self.set_output_embeddings(
                self._get_resized_lm_head(self.lm_head, size, mean_resizing=mean_resizing)
            )
        # CODEPATH: opus-mt checkpoints carry Marian's final_logits_bias; the paper's models have none.
        if self.config.output_bias:
            old = self.final_logits_bias
            bias = old.new_zeros(1, size)
            bias[:, : min(size, old.shape[1])] = old[:, :size]
            self.final_logits_bias = bias

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)


__all__ = [
    "VanillaTransformerForConditionalGeneration",
    "VanillaTransformerModel",
    "VanillaTransformerPreTrainedModel",
]
