"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a transformers model.

The file reads top to bottom as the paper builds the model, in transformers' Marian/BART layout (names,
outputs, caches, attention interface), so the library's generation, Trainer and loading code treat it as
one of their own:

- `embeddings_vanilla_transformer`: the embeddings multiplied by sqrt(d_model) (Section 3.4) and the
  positional encodings (Section 3.5).
- `eager_attention_forward` / `VanillaTransformerAttention`: Eq. 1 and multi-head attention, Section 3.2.
- `VanillaTransformerFeedForward`: the position-wise feed-forward network, Eq. 2 (Section 3.3).
- `VanillaTransformerEncoderLayer` / `VanillaTransformerDecoderLayer`: Section 3.1, post-LN residual
  blocks LayerNorm(x + Dropout(Sublayer(x))) (Section 5.4).
- `VanillaTransformerEncoder` / `VanillaTransformerDecoder`: the stacks, Section 3.1.
- `VanillaTransformerForConditionalGeneration`: the shared pre-softmax projection (Section 3.4); its
  loss is the plain cross-entropy, and the paper's label smoothing (Section 5.4) is training's
  (`vanilla-transformer train --label-smoothing`). Its decoding rules (Section 6.1) are in
  `generation_vanilla_transformer`.

Every projection is an `nn.Linear` module call: `cpu_speedups.CPULinear` is an `nn.Linear` whose
float32 products on x86 CPUs go through oneDNN, and `cpu_speedups.ATTENTION_FUNCTIONS` (imported here as
`ALL_ATTENTION_FUNCTIONS`) is the model's own attention interface. That module says what each speed-up
does, where it applies and how to turn it off. This file is copied next to saved weights for
`trust_remote_code=True` users, so it imports the package only relatively.
"""

import inspect
import math
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn
from transformers import initialization as init
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
from transformers.modeling_utils import PreTrainedModel
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple, is_torchdynamo_compiling
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_vanilla_transformer import VanillaTransformerConfig
from .cpu_speedups import ATTENTION_FUNCTIONS as ALL_ATTENTION_FUNCTIONS  # see VanillaTransformerAttention
from .cpu_speedups import CPULinear, reorder_self_attention_layer, weights_fixed_for_decoding
from .embeddings_vanilla_transformer import (
    VanillaTransformerPositionalEncoding,
    VanillaTransformerScaledWordEmbedding,
    sinusoidal_position_encoding,
)
from .generation_vanilla_transformer import PaperDecodingMixin


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
    """Scaled dot-product attention, Eq. 1: softmax(Q K^T / sqrt(d_k)) V.

    A CPU decoding step computes the same formula as `cpu_speedups._single_query_attention`; tests in
    tests/test_cpu_speedups.py hold the two, and SDPA, together (`test_single_query_attention_*`)."""
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value).transpose(1, 2).contiguous()
    return attn_output, attn_weights


class VanillaTransformerAttention(nn.Module):
    """Multi-head attention, Section 3.2.2: Concat(head_1, ..., head_h) W^O with
    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V), h heads of size d_k (queries, keys) and d_v (values).

    Used three ways (Section 3.2.3): encoder self-attention, masked decoder self-attention and
    encoder-decoder attention, whose keys and values are computed once per input and cached.
    """

    def __init__(
        self,
        config: VanillaTransformerConfig,
        num_heads: int,
        head_dims: tuple[int, int],
        is_causal: bool = False,
        layer_idx: int | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.num_heads = num_heads
        self.d_k, self.d_v = head_dims
        self.dropout = config.attention_dropout
        self.scaling = self.d_k**-0.5
        # SDPA treats a missing mask as causal unless told otherwise, so every instance says which it is.
        self.is_causal = is_causal
        self.layer_idx = layer_idx
        self.q_proj = CPULinear(config.d_model, num_heads * self.d_k)
        self.k_proj = CPULinear(config.d_model, num_heads * self.d_k)
        self.v_proj = CPULinear(config.d_model, num_heads * self.d_v)
        self.out_proj = CPULinear(num_heads * self.d_v, config.d_model)

    def _split_heads(self, states: torch.Tensor, head_dim: int) -> torch.Tensor:
        return states.view(*states.shape[:-1], self.num_heads, head_dim).transpose(1, 2)

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        cache: Cache | None = None,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
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

        # The model's own AttentionInterface: transformers' functions, with SDPA's CPU decoding steps as two
        # plain matmuls (cpu_speedups); transformers' global table is left as it is.
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


class VanillaTransformerFeedForward(nn.Module):
    """Position-wise feed-forward network, Eq. 2: FFN(x) = max(0, x W1 + b1) W2 + b2."""

    def __init__(self, config: VanillaTransformerConfig, ffn_dim: int) -> None:
        super().__init__()
        self.fc1 = CPULinear(config.d_model, ffn_dim)
        self.fc2 = CPULinear(ffn_dim, config.d_model)
        self.activation_fn = ACT2FN[config.activation_function]
        self.activation_dropout = nn.Dropout(config.activation_dropout)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation_dropout(self.activation_fn(self.fc1(hidden_states))))


def residual_dropout_norm(
    sublayer_output: torch.Tensor, residual: torch.Tensor, norm: nn.LayerNorm, dropout: nn.Dropout
) -> torch.Tensor:
    """LayerNorm(x + Dropout(Sublayer(x))): the post-LN residual connection of Sections 3.1 and 5.4."""
    return norm(residual + dropout(sublayer_output))


class VanillaTransformerEncoderLayer(GradientCheckpointingLayer):
    """One encoder layer, Section 3.1: self-attention, then the feed-forward network, each wrapped
    in a post-LN residual connection."""

    def __init__(self, config: VanillaTransformerConfig, layer_idx: int | None = None) -> None:
        super().__init__()
        self.dropout = nn.Dropout(config.dropout)
        self.self_attn = VanillaTransformerAttention(
            config, config.encoder_attention_heads, config.encoder_head_dims, layer_idx=layer_idx
        )
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = VanillaTransformerFeedForward(config, config.encoder_ffn_dim)
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

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


class VanillaTransformerDecoderLayer(GradientCheckpointingLayer):
    """One decoder layer, Section 3.1: masked self-attention, encoder-decoder attention, then the
    feed-forward network, each wrapped in a post-LN residual connection."""

    def __init__(self, config: VanillaTransformerConfig, layer_idx: int | None = None) -> None:
        super().__init__()
        self.dropout = nn.Dropout(config.dropout)
        heads, head_dims = config.decoder_attention_heads, config.decoder_head_dims
        self.self_attn = VanillaTransformerAttention(
            config, heads, head_dims, is_causal=True, layer_idx=layer_idx
        )
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.encoder_attn = VanillaTransformerAttention(config, heads, head_dims, layer_idx=layer_idx)
        self.encoder_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = VanillaTransformerFeedForward(config, config.decoder_ffn_dim)
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

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


class VanillaTransformerPreTrainedModel(PreTrainedModel):
    config: VanillaTransformerConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["VanillaTransformerEncoderLayer", "VanillaTransformerDecoderLayer"]
    _supports_flash_attn = True
    _supports_sdpa = True
    _supports_flex_attn = True
    _can_compile_fullgraph = True

    def _flash_attn_can_dispatch(self, *args: Any, **kwargs: Any) -> bool:
        """FlashAttention needs one head size for queries, keys and values."""
        heads = {self.config.encoder_head_dims, self.config.decoder_head_dims}
        if any(d_k != d_v for d_k, d_v in heads):
            raise ValueError(
                f"FlashAttention needs d_k == d_v, but this model has (d_k, d_v) = {sorted(heads)}. Use "
                "attn_implementation='sdpa' or 'eager'."
            )
        return super()._flash_attn_can_dispatch(*args, **kwargs)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Xavier-uniform projections with zero biases and N(0, d_model^-0.5) embeddings.

        The paper does not state its initialisation; this is what its tensor2tensor code and fairseq
        use. The normal's std makes the sqrt(d_model)-scaled embeddings (Section 3.4) unit-variance.
        """
        std = self.config.init_std or self.config.d_model**-0.5
        if isinstance(module, nn.Linear):
            init.xavier_uniform_(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, VanillaTransformerPositionalEncoding):
            if module.learned:
                init.normal_(module.weight, mean=0.0, std=std)
            else:
                init.copy_(module.weight, module.sinusoid_table(module.weight.shape[0]))
        elif isinstance(module, VanillaTransformerForConditionalGeneration) and self.config.output_bias:
            init.zeros_(module.final_logits_bias)

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
    return math.sqrt(config.d_model) if config.scale_embedding else 1.0


class _VanillaTransformerStack(VanillaTransformerPreTrainedModel):
    """What the encoder and decoder stacks share: N identical layers over the token embeddings scaled
    by sqrt(d_model) (Section 3.4) plus the positional encodings, with dropout on the sum (Section 5.4)."""

    def __init__(
        self, config: VanillaTransformerConfig, vocab_size: int, layer_class: type[nn.Module], num_layers: int
    ) -> None:
        super().__init__(config)
        self.dropout = nn.Dropout(config.dropout)
        self.embed_tokens = VanillaTransformerScaledWordEmbedding(
            vocab_size, config.d_model, config.pad_token_id, _embedding_scale(config)
        )
        self.embed_positions = VanillaTransformerPositionalEncoding(config)
        self.layers = nn.ModuleList([layer_class(config, layer_idx=i) for i in range(num_layers)])
        self.gradient_checkpointing = False
        self.post_init()

    def add_positions(
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor | None,
        cache_length: int | torch.Tensor = 0,
    ) -> torch.Tensor:
        """The scaled embeddings plus the encodings of their positions, after dropout. Positions count from
        each sequence's first token, so that a sequence padded on the left (fairseq's habit, or a tokenizer
        with `padding_side="left"`) is encoded as it is alone; `attention_mask` (batch, cache + tokens) shows
        the padding. An empty batch, or sequences of no tokens, are refused here: attention cannot reshape
        zero elements."""
        if inputs_embeds.shape[0] == 0 or inputs_embeds.shape[1] == 0:
            raise ValueError(
                f"Empty input of shape {tuple(inputs_embeds.shape[:2])} (batch, tokens): pass at least one "
                "sequence of at least one token."
            )
        left_padding = None
        if attention_mask is not None and attention_mask.dim() == 2:
            left_padding = (attention_mask.cumsum(-1) == 0).sum(-1)
        positions = self.embed_positions(inputs_embeds.shape[1], cache_length, left_padding)
        # The table is float32 whatever dtype the model was loaded in: the sum takes the embeddings' dtype.
        positions = positions.to(device=inputs_embeds.device, dtype=inputs_embeds.dtype)
        return self.dropout(inputs_embeds + positions)


class VanillaTransformerEncoder(_VanillaTransformerStack):
    """The encoder stack: N identical layers over the scaled embeddings plus positions (Section 3.1)."""

    _can_record_outputs = {
        "hidden_states": VanillaTransformerEncoderLayer,
        "attentions": VanillaTransformerAttention,
    }

    def __init__(self, config: VanillaTransformerConfig) -> None:
        super().__init__(config, config.vocab_size, VanillaTransformerEncoderLayer, config.encoder_layers)

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutput:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds to the encoder.")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        hidden_states = self.add_positions(inputs_embeds, attention_mask)
        attention_mask = create_bidirectional_mask(
            config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask
        )
        for encoder_layer in self.layers:
            hidden_states = encoder_layer(hidden_states, attention_mask, **kwargs)
        return BaseModelOutput(last_hidden_state=hidden_states)


class VanillaTransformerDecoder(_VanillaTransformerStack):
    """The decoder stack: N identical layers, masked so that position i attends only to positions
    before it (Section 3.1), over the scaled target embeddings plus positions."""

    _can_record_outputs = {
        "hidden_states": VanillaTransformerDecoderLayer,
        "attentions": OutputRecorder(VanillaTransformerAttention, index=1, layer_name="self_attn"),
        "cross_attentions": OutputRecorder(VanillaTransformerAttention, index=1, layer_name="encoder_attn"),
    }

    def __init__(self, config: VanillaTransformerConfig) -> None:
        super().__init__(
            config, config.target_vocab_size, VanillaTransformerDecoderLayer, config.decoder_layers
        )

    @merge_with_config_defaults
    @capture_outputs
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPastAndCrossAttentions:
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
            self.embed_positions.check_length(cache.get_max_length())

        given_mask = attention_mask
        if attention_mask is None and not is_torchdynamo_compiling():
            attention_mask = torch.ones(batch_size, cache_length + seq_length, device=inputs_embeds.device)
        causal_mask = create_causal_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            cache=cache.self_attention_cache if cache is not None else None,
        )
        encoder_attention_mask = create_bidirectional_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
        )

        hidden_states = self.add_positions(inputs_embeds, given_mask, cache_length)
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
        return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=hidden_states, cache=cache)


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Decoder inputs from labels: the outputs "shifted right by one position" (Section 3.1), starting
    from the decoder start token, with the -100 of ignored label positions replaced by padding."""
    shifted = labels.new_full(labels.shape, pad_token_id)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


class VanillaTransformerModel(VanillaTransformerPreTrainedModel):
    """The encoder-decoder of Figure 1, without the output projection."""

    def __init__(self, config: VanillaTransformerConfig) -> None:
        super().__init__(config)
        config.check_values()  # again: fields may have been changed since the config was made
        if config.ties_embeddings:
            # One matrix for source and target tokens (Section 3.4).
            self.shared = VanillaTransformerScaledWordEmbedding(
                config.vocab_size, config.d_model, config.pad_token_id, _embedding_scale(config)
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
        if self.config.ties_embeddings:
            self.shared = value
            self.decoder.embed_tokens = value
        self.encoder.embed_tokens = value

    @can_return_tuple
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
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
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqModelOutput:
        if encoder_outputs is None:
            # return_dict=True in the inner calls: a config with return_dict=False asks for a tuple from
            # the outermost call only, which can_return_tuple makes from this output.
            encoder_outputs = self.encoder(
                input_ids=input_ids,
                attention_mask=attention_mask,
                inputs_embeds=inputs_embeds,
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
            encoder_attention_mask=attention_mask,
            cache=cache,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            return_dict=True,
            **kwargs,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            cache=decoder_outputs.cache,
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


class VanillaTransformerForConditionalGeneration(
    VanillaTransformerPreTrainedModel, PaperDecodingMixin, GenerationMixin
):
    """The full model of Figure 1: encoder-decoder, then the linear pre-softmax projection that shares
    its weight matrix with the embeddings (Section 3.4). `generate()` takes the paper's decoding rules
    (`generation_vanilla_transformer.PaperDecodingMixin`)."""

    def __init__(self, config: VanillaTransformerConfig) -> None:
        super().__init__(config)
        self.model = VanillaTransformerModel(config)
        if config.ties_embeddings:
            self._tied_weights_keys = {
                "lm_head.weight": "model.shared.weight",
                "model.encoder.embed_tokens.weight": "model.shared.weight",
                "model.decoder.embed_tokens.weight": "model.shared.weight",
            }
        elif config.tie_word_embeddings:
            self._tied_weights_keys = {"lm_head.weight": "model.decoder.embed_tokens.weight"}
        self.lm_head = CPULinear(config.d_model, config.target_vocab_size, bias=False)
        if config.output_bias:
            self.register_buffer("final_logits_bias", torch.zeros(1, config.target_vocab_size))
        self.post_init()

    def get_encoder(self) -> VanillaTransformerEncoder:
        return self.model.encoder

    def get_decoder(self) -> VanillaTransformerDecoder:
        return self.model.decoder

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        if type(new_embeddings) is nn.Linear:
            # transformers' resizing makes an nn.Linear: the same module keeps the projection's CPU path
            # (CPULinear adds no state, only its forward).
            new_embeddings.__class__ = CPULinear
        self.lm_head = new_embeddings

    @can_return_tuple
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
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
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqLMOutput:
        r"""labels: target token ids, -100 where no loss is wanted. Decoder inputs default to the labels
        shifted right. num_items_in_batch: passed by Trainer so the loss is a mean over the whole
        accumulated batch."""
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
            return_dict=True,
            **kwargs,
        )
        logits = self.lm_head(outputs.last_hidden_state)
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
            cache=outputs.cache,
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
        if self.config.tie_word_embeddings:
            self.lm_head.out_features = size  # its weight becomes the embeddings' in tie_weights
        else:
            self.set_output_embeddings(
                self._get_resized_lm_head(self.lm_head, size, mean_resizing=mean_resizing)
            )
        if self.config.output_bias:
            old = self.final_logits_bias
            bias = old.new_zeros(1, size)
            bias[:, : min(size, old.shape[1])] = old[:, :size]
            self.final_logits_bias = bias

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def _decoding_context(self, sentences_apart: bool = False) -> AbstractContextManager[None]:
        return weights_fixed_for_decoding(sentences_apart)

    def _reorder_cache(self, cache: Cache, beam_idx: torch.LongTensor) -> Cache:
        """Beam search's per-step reordering of the cache. It only permutes the beams of each input among
        themselves, and all beams of an input hold the same encoder output, so the cross-attention keys
        and values need no reordering: only the self-attention cache is (saving 2 x layers copies/step)."""
        self_attention_cache = cache
        if isinstance(cache, EncoderDecoderCache):
            self_attention_cache = cache.self_attention_cache
        if getattr(self_attention_cache, "offloading", False):
            self_attention_cache.reorder_cache(beam_idx)
        else:
            self_attention_cache.layers = [
                reorder_self_attention_layer(layer, beam_idx) for layer in self_attention_cache.layers
            ]
        return cache


# generate() reads the forward's signature at every decoding step of a model registered for the Auto classes
# (`prepare_inputs_for_generation`), and `inspect` derives it anew through the decorators each time unless
# the function carries it: computed once here, the same signature.
VanillaTransformerForConditionalGeneration.forward.__signature__ = inspect.signature(
    VanillaTransformerForConditionalGeneration.forward
)

__all__ = [
    "VanillaTransformerForConditionalGeneration",
    "VanillaTransformerModel",
    "VanillaTransformerPreTrainedModel",
    "sinusoidal_position_encoding",
]
