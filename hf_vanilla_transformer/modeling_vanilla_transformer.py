"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a transformers model.

Each paper concept has one home here:

- `sinusoidal_position_encoding` / `VanillaTransformerPositionalEncoding`: Section 3.5.
- `VanillaTransformerAttention`: scaled dot-product and multi-head attention, Section 3.2 (Eq. 1).
- `VanillaTransformerEncoderLayer` / `VanillaTransformerDecoderLayer`: Section 3.1, post-LN residual
  blocks LayerNorm(x + Dropout(Sublayer(x))) and the position-wise feed-forward network (Eq. 2).
- `VanillaTransformerEncoder` / `VanillaTransformerDecoder`: the stacks with scaled embeddings
  (Section 3.4) and embedding dropout (Section 5.4).
- `VanillaTransformerForConditionalGeneration`: the shared pre-softmax projection (Section 3.4),
  label smoothing (Section 5.4) and beam search with the GNMT length penalty (Section 6.1).

The file follows transformers' Marian/BART layout (names, outputs, caches, attention interface) so the
library's generation, Trainer and loading code treat it as one of their own. It is copied next to saved
weights for `trust_remote_code=True` users, so it imports the package only relatively.
"""

import math
import platform
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer, EncoderDecoderCache
from transformers.generation import GenerationConfig, GenerationMixin, LogitsProcessor, LogitsProcessorList
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple, is_torchdynamo_compiling
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_vanilla_transformer import VanillaTransformerConfig


def sinusoidal_position_encoding(
    num_positions: int, dim: int, layout: str = "paper", offset: int = 0
) -> torch.Tensor:
    """The positional encodings of Section 3.5, one row per position, computed in float64.

    PE(pos, 2i) = sin(pos / 10000^(2i / d_model)) and PE(pos, 2i + 1) = cos(pos / 10000^(2i / d_model)).
    `layout="marian"` puts the same sines in the first half and cosines in the second; `"fairseq"` does
    the same with fairseq's frequencies exp(-i ln(10000) / (d/2 - 1)). `offset` is the first position.
    """
    positions = torch.arange(offset, offset + num_positions, dtype=torch.float64)[:, None]
    if layout == "fairseq":
        half = dim // 2
        inverse_frequencies = torch.exp(
            torch.arange(half, dtype=torch.float64) * -(math.log(10000) / (half - 1))
        )
    else:
        two_i = torch.arange(0, dim, 2, dtype=torch.float64)
        inverse_frequencies = 10000.0 ** (-two_i / dim)
    angles = positions * inverse_frequencies
    if layout == "paper":
        table = torch.empty(num_positions, dim, dtype=torch.float64)
        table[:, 0::2] = torch.sin(angles)
        table[:, 1::2] = torch.cos(angles)[:, : dim // 2]
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
        self.learned = config.position_embedding_type == "learned"
        self.layout = config.sinusoidal_layout
        self.offset = config.pad_token_id + 1 if self.layout == "fairseq" else 0
        self.dim = config.d_model
        if self.learned:
            self.weight = nn.Parameter(torch.empty(config.max_position_embeddings, config.d_model))
        else:
            self.register_buffer(
                "weight", self.sinusoid_table(config.max_position_embeddings), persistent=False
            )

    def sinusoid_table(self, num_positions: int) -> torch.Tensor:
        return sinusoidal_position_encoding(num_positions, self.dim, self.layout, self.offset)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        table = self.weight
        if not is_torchdynamo_compiling():
            needed = int(position_ids.max()) + 1
            if needed > table.shape[0]:
                if self.learned:
                    raise ValueError(
                        f"Position {needed - 1} is past the {table.shape[0]} learned position embeddings "
                        "(max_position_embeddings). Truncate inputs to that many tokens, or use "
                        "position_embedding_type='sinusoidal', which extends to any length."
                    )
                # The sinusoids are defined for every position, so longer inputs stay exact.
                table = self.sinusoid_table(needed).to(device=table.device, dtype=table.dtype)
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


def single_query_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    **kwargs: Unpack[TransformersKwargs],
) -> tuple[torch.Tensor, None]:
    """Eq. 1 for a decoding step (one query position) when the model runs SDPA on a CPU: there SDPA's
    kernels cost 2-4x what the two plain matmuls do for a single query row. Takes SDPA's masks
    (boolean, True = attend, or None) and, like SDPA, returns no attention weights: a model on SDPA gives
    none for any step (use eager attention for them)."""
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        blocked = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device)
        attention_mask = blocked.masked_fill_(~attention_mask, torch.finfo(query.dtype).min)
    attn_output, _ = eager_attention_forward(module, query, key, value, attention_mask, scaling)
    return attn_output, None


def _is_plain_linear(module: nn.Module) -> bool:
    """An nn.Linear that computes exactly x W^T + b: not replaced by a subclass and without hooks."""
    return type(module) is nn.Linear and not module._forward_hooks and not module._forward_pre_hooks


# Float32 on x86 CPUs runs the projections through oneDNN rather than torch's default GEMM (MKL), which on
# AMD CPUs takes its AVX2 path: decoding 1.1x-2x faster, a float32 training step ~1.1x at base size
# (benchmarks/RESULTS.md). Same float32 arithmetic, summed in another order. False turns it off.
ONEDNN_FP32 = torch.backends.mkldnn.is_available() and platform.machine().lower() in ("x86_64", "amd64")


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x W^T + b through oneDNN, for x of any leading shape. The result is returned as torch's matmul
    returns N-d products (`_unsafe_view`): the same storage, but not an autograd view of the rows, since
    an in-place op on a view (the logits bias, say) makes autograd rebuild the whole base tensor in the
    backward pass (zero-filled, then copied), which took 1.7 s of a 13.8 s float32 step at base size."""
    out = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), weight, bias, "none", [], "")
    return torch.ops.aten._unsafe_view(out, (*x.shape[:-1], out.shape[-1]))


# Inside a generate() call (`_weights_fixed_for_decoding`), the copies made from its fixed weights:
# ("packed", id(weight)) -> (weight, oneDNN-packed weight or None until its second use) and
# ("qkv", id(attention)) -> (attention, its stacked Q/K/V weight and bias). Each entry holds the object
# whose id is its key, so that no id is reused while the entry exists.
_FIXED_WEIGHT_COPIES: ContextVar[dict[tuple[str, int], tuple[object, object]] | None] = ContextVar(
    "_FIXED_WEIGHT_COPIES", default=None
)


def _decoding_weight(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """The weight in oneDNN's blocked layout, packed at its second use within a generate() call, for
    products of 4 to 64 rows: decoding steps use every decoder weight again, and there a packed weight
    made generate() 6-13% faster (greedy and beam 4 at 32 rows, base size). One row gains nothing, and at
    128 rows beam 4 was 5% slower packed, though each product alone is faster (benchmarks/RESULTS.md).
    The encoder's weights, used once, are never packed. Outside generate() the weight itself."""
    copies = _FIXED_WEIGHT_COPIES.get()
    if copies is None or not 4 <= rows <= 64:
        return weight
    key = ("packed", id(weight))
    if key not in copies:
        copies[key] = (weight, None)
        return weight
    packed = copies[key][1]
    if packed is None:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
        copies[key] = (weight, packed)
    return packed


class _OneDNNLinear(torch.autograd.Function):
    """x W^T + b with oneDNN products forward and backward (torch has no oneDNN float32 autograd path)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _onednn_linear(x, weight, bias)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        grad = grad.contiguous()
        grad_x = _onednn_linear(grad, weight.t().contiguous(), None) if ctx.needs_input_grad[0] else None
        grad_rows = grad.view(-1, grad.shape[-1])
        grad_weight = grad_rows.t().mm(x.reshape(-1, x.shape[-1])) if ctx.needs_input_grad[1] else None
        grad_bias = grad_rows.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x W^T + b, through oneDNN in float32 on x86 CPUs (see ONEDNN_FP32). Autocast and torch.compile
    make their own choices, so they take nn.functional.linear."""
    if (
        ONEDNN_FP32
        and x.dtype == weight.dtype == torch.float32
        and x.device.type == "cpu"
        and not torch.is_autocast_enabled("cpu")
        and not is_torchdynamo_compiling()
    ):
        needs_grad = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (x, weight, bias)
        )
        if needs_grad:
            return _OneDNNLinear.apply(x, weight, bias)
        return _onednn_linear(x, _decoding_weight(weight, x.numel() // x.shape[-1]), bias)
    return nn.functional.linear(x, weight, bias)


def project(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`module(x)` for the model's linear layers, taking `_linear`'s fast path when the module is a plain
    nn.Linear; quantized, adapted or hooked modules run as themselves."""
    return _linear(x, module.weight, module.bias) if _is_plain_linear(module) else module(x)


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
        self.q_proj = nn.Linear(config.d_model, num_heads * self.d_k)
        self.k_proj = nn.Linear(config.d_model, num_heads * self.d_k)
        self.v_proj = nn.Linear(config.d_model, num_heads * self.d_v)
        self.out_proj = nn.Linear(num_heads * self.d_v, config.d_model)

    def _split_heads(self, states: torch.Tensor, head_dim: int) -> torch.Tensor:
        return states.view(*states.shape[:-1], self.num_heads, head_dim).transpose(1, 2)

    def _project_qkv(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Q, K and V of self-attention: three projections of the same input."""
        projections = (self.q_proj, self.k_proj, self.v_proj)
        if not all(_is_plain_linear(p) for p in projections):
            # Wrapped or hooked projections (quantization, adapters, hooks) must run as themselves.
            return tuple(p(hidden_states) for p in projections)
        # One GEMM against the stacked weights instead of three: one pass over the input, and in decoding one
        # kernel call instead of three. Each output is the same dot product; the parameters stay three.
        weight, bias = self._stacked_qkv_parameters()
        fused = _linear(hidden_states, weight, bias)
        return fused.split([self.q_proj.out_features, self.k_proj.out_features, self.v_proj.out_features], -1)

    def _stacked_qkv_parameters(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The stacked weights and biases: made anew at every call (1.5 MB at base size, cheap next to the
        GEMM), so that gradients reach the separate parameters and every update is seen, except within
        one generate() call, where the parameters are fixed and decoding steps reuse them (see
        `_weights_fixed_for_decoding`)."""
        copies = _FIXED_WEIGHT_COPIES.get()
        if copies is None or torch.is_grad_enabled() or is_torchdynamo_compiling():
            return self._stack_qkv()
        key = ("qkv", id(self))
        if key not in copies:
            copies[key] = (self, self._stack_qkv())
        return copies[key][1]

    def _stack_qkv(self) -> tuple[torch.Tensor, torch.Tensor]:
        projections = (self.q_proj, self.k_proj, self.v_proj)
        return torch.cat([p.weight for p in projections]), torch.cat([p.bias for p in projections])

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        is_cross_attention = key_value_states is not None
        if is_cross_attention:
            query_states = self._split_heads(project(self.q_proj, hidden_states), self.d_k)
        else:
            query, key, value = self._project_qkv(hidden_states)
            query_states = self._split_heads(query, self.d_k)

        cache = past_key_values
        cross_kv_ready = False
        if isinstance(past_key_values, EncoderDecoderCache):
            if is_cross_attention:
                cache = past_key_values.cross_attention_cache
                cross_kv_ready = past_key_values.is_updated.get(self.layer_idx, False)
            else:
                cache = past_key_values.self_attention_cache

        if cross_kv_ready:
            key_states = cache.layers[self.layer_idx].keys
            value_states = cache.layers[self.layer_idx].values
        else:
            if is_cross_attention:
                key, value = project(self.k_proj, key_value_states), project(self.v_proj, key_value_states)
            key_states = self._split_heads(key, self.d_k)
            value_states = self._split_heads(value, self.d_v)
            if is_cross_attention and cache is not None:
                key_states, value_states = cache.update(key_states, value_states, self.layer_idx)
                past_key_values.is_updated[self.layer_idx] = True
            elif cache is not None:
                key_states, value_states = _update_cache(cache, key_states, value_states, self.layer_idx)

        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        if (
            attention_interface is ALL_ATTENTION_FUNCTIONS["sdpa"]
            and query_states.shape[2] == 1
            and query_states.device.type == "cpu"
            and not torch.is_grad_enabled()
        ):
            attention_interface = single_query_attention_forward
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
        return project(self.out_proj, attn_output), attn_weights


def _reorder_with_a_free_position(layer: DynamicLayer, beam_idx: torch.LongTensor) -> None:
    """Beam search's reordering of one self-attention cache layer, `keys[beam_idx]`, written into a buffer
    one position longer. The layer keeps views of the reordered positions, and the next decoding step
    fills the free one (`_update_cache`) instead of concatenating: `DynamicLayer`'s concatenation would
    copy the whole reordered cache a second time in every step."""
    reserved = []
    for states in (layer.keys, layer.values):
        batch, heads, length, dim = states.shape
        buffer = states.new_empty(batch, heads, length + 1, dim)
        view = buffer[:, :, :length]
        torch.index_select(states, 0, beam_idx.to(states.device), out=view)
        reserved += [view, buffer]
    layer.keys, layer.values = reserved[0], reserved[2]
    layer._free_position = tuple(reserved)


def _update_cache(
    cache: Cache, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`cache.update(key_states, value_states, layer_idx)`, filling the free position that
    `_reorder_with_a_free_position` left when the layer still holds its views and one position comes."""
    layer = cache.layers[layer_idx] if layer_idx < len(cache.layers) else None
    reserved = getattr(layer, "_free_position", None)
    if reserved is None:
        return cache.update(key_states, value_states, layer_idx)
    layer._free_position = None
    keys_view, keys_buffer, values_view, values_buffer = reserved
    if layer.keys is not keys_view or layer.values is not values_view or key_states.shape[-2] != 1:
        return cache.update(key_states, value_states, layer_idx)
    keys_buffer[:, :, -1:].copy_(key_states)
    values_buffer[:, :, -1:].copy_(value_states)
    layer.keys, layer.values = keys_buffer, values_buffer
    return keys_buffer, values_buffer


@contextmanager
def _weights_fixed_for_decoding() -> Iterator[None]:
    """Within one generate() call the parameters are fixed and every decoding step uses them again: each
    self-attention stacks its Q/K/V parameters once, and float32 oneDNN products keep packed weights
    (`_decoding_weight`), in `_FIXED_WEIGHT_COPIES`. Nothing outlives the call: fused optimizers update
    parameters in place without bumping their version counters, so no cache key could tell that a copy
    kept across calls was stale. The copies belong to this call's context, not to the modules, so another
    thread training or evaluating the same model meanwhile still stacks its weights afresh."""
    token = _FIXED_WEIGHT_COPIES.set({})
    try:
        yield
    finally:
        _FIXED_WEIGHT_COPIES.reset(token)


class _FastMaskDropout(torch.autograd.Function):
    """Inverted dropout, x * mask / (1 - p), with the mask drawn 32 bits per element: each 64-bit draw of
    torch's generator (`random_` over the full int64 range) gives two elements, where torch's
    `bernoulli_` draws per element. An element is kept when its 32 bits, read as a signed integer, are at
    least -2^31 + round(p 2^32), so with probability 1 - p to within 2^-32."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float) -> torch.Tensor:
        count = x.numel()
        draws = torch.empty((count + 1) // 2, dtype=torch.int64, device=x.device).random_(-(2**63), None)
        bits = draws.view(torch.int32)[:count].view(x.shape)
        keep = bits >= min(-(2**31) + round(p * 2**32), 2**31 - 1)
        ctx.save_for_backward(keep)
        ctx.scale = 1.0 / (1.0 - p)
        return torch.where(keep, x * ctx.scale, 0.0)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (keep,) = ctx.saved_tensors
        return torch.where(keep, grad * ctx.scale, 0.0), None


class VanillaTransformerDropout(nn.Module):
    """Dropout with rate p (Section 5.4), as nn.Dropout, reading `config.fast_dropout_masks` at each call:
    with it, masks on CPU come from `_FastMaskDropout`. torch.compile draws its own masks, so it always
    takes nn.functional.dropout."""

    def __init__(self, config: VanillaTransformerConfig, p: float) -> None:
        super().__init__()
        self.config = config
        self.p = p

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return hidden_states
        if (
            self.config.fast_dropout_masks
            and hidden_states.device.type == "cpu"
            and not is_torchdynamo_compiling()
        ):
            return _FastMaskDropout.apply(hidden_states, self.p)
        return nn.functional.dropout(hidden_states, p=self.p, training=True)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class VanillaTransformerFeedForward(nn.Module):
    """Position-wise feed-forward network, Eq. 2: FFN(x) = max(0, x W1 + b1) W2 + b2."""

    def __init__(self, config: VanillaTransformerConfig, ffn_dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, config.d_model)
        self.activation_fn = ACT2FN[config.activation_function]
        self.activation_dropout = VanillaTransformerDropout(config, config.activation_dropout)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = self.activation_dropout(self.activation_fn(project(self.fc1, hidden_states)))
        return project(self.fc2, hidden_states)


def residual_dropout_norm(
    sublayer_output: torch.Tensor, residual: torch.Tensor, norm: nn.LayerNorm, dropout: nn.Module
) -> torch.Tensor:
    """LayerNorm(x + Dropout(Sublayer(x))): the post-LN residual connection of Sections 3.1 and 5.4."""
    return norm(residual + dropout(sublayer_output))


class VanillaTransformerEncoderLayer(GradientCheckpointingLayer):
    """One encoder layer, Section 3.1: self-attention, then the feed-forward network, each wrapped
    in a post-LN residual connection."""

    def __init__(self, config: VanillaTransformerConfig, layer_idx: int | None = None) -> None:
        super().__init__()
        self.dropout = VanillaTransformerDropout(config, config.dropout)
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
        self.dropout = VanillaTransformerDropout(config, config.dropout)
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
        past_key_values: Cache | None = None,
        use_cache: bool | None = True,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        attended, _ = self.self_attn(
            hidden_states, past_key_values=past_key_values, attention_mask=attention_mask, **kwargs
        )
        hidden_states = residual_dropout_norm(
            attended, hidden_states, self.self_attn_layer_norm, self.dropout
        )
        attended, _ = self.encoder_attn(
            hidden_states,
            key_value_states=encoder_hidden_states,
            attention_mask=encoder_attention_mask,
            past_key_values=past_key_values,
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


class _VanillaTransformerStack(VanillaTransformerPreTrainedModel):
    """What the encoder and decoder stacks share: N identical layers over the token embeddings scaled
    by sqrt(d_model) (Section 3.4) plus the positional encodings, with dropout on the sum (Section 5.4)."""

    def __init__(
        self, config: VanillaTransformerConfig, vocab_size: int, layer_class: type[nn.Module], num_layers: int
    ) -> None:
        super().__init__(config)
        self.dropout = VanillaTransformerDropout(config, config.dropout)
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_tokens = nn.Embedding(vocab_size, config.d_model, config.pad_token_id)
        self.embed_positions = VanillaTransformerPositionalEncoding(config)
        self.layers = nn.ModuleList([layer_class(config, layer_idx=i) for i in range(num_layers)])
        self.gradient_checkpointing = False
        self.post_init()

    def add_positions(self, inputs_embeds: torch.Tensor, past_length: int = 0) -> torch.Tensor:
        """The scaled embeddings plus the encodings of their positions, after dropout."""
        position_ids = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past_length
        hidden_states = inputs_embeds + self.embed_positions(position_ids)
        return self.dropout(hidden_states)


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
            inputs_embeds = self.embed_tokens(input_ids) * self.embed_scale
        hidden_states = self.add_positions(inputs_embeds)
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
            config, config.decoder_vocab_size, VanillaTransformerDecoderLayer, config.decoder_layers
        )

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of decoder_input_ids or decoder_inputs_embeds to the decoder.")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids) * self.embed_scale

        if use_cache and past_key_values is None:
            past_key_values = EncoderDecoderCache(
                DynamicCache(config=self.config), DynamicCache(config=self.config)
            )
        batch_size, seq_length = inputs_embeds.shape[:2]
        past_length = past_key_values.get_seq_length() if past_key_values is not None else 0

        if attention_mask is None and not is_torchdynamo_compiling():
            attention_mask = torch.ones(batch_size, past_length + seq_length, device=inputs_embeds.device)
        self_attn_cache = (
            past_key_values.self_attention_cache
            if isinstance(past_key_values, EncoderDecoderCache)
            else past_key_values
        )
        causal_mask = create_causal_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            past_key_values=self_attn_cache,
        )
        encoder_attention_mask = create_bidirectional_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
        )

        hidden_states = self.add_positions(inputs_embeds, past_length)
        for decoder_layer in self.layers:
            hidden_states = decoder_layer(
                hidden_states,
                causal_mask,
                encoder_hidden_states,  # positional, so that gradient checkpointing passes it through
                encoder_attention_mask=encoder_attention_mask,
                past_key_values=past_key_values,
                use_cache=use_cache,
                **kwargs,
            )
        return BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=hidden_states, past_key_values=past_key_values
        )


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
        if config.share_encoder_decoder_embeddings:
            # One matrix for source and target tokens (Section 3.4).
            self.shared = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
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
        if self.config.share_encoder_decoder_embeddings:
            self.shared = value
            self.decoder.embed_tokens = value
        self.encoder.embed_tokens = value

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple[torch.Tensor] | BaseModelOutput | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqModelOutput:
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, **kwargs
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
            past_key_values=past_key_values,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            past_key_values=decoder_outputs.past_key_values,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


# Float32 chunks of 2 MB, 1 MB per core when two threads share the rows, so that a chunk's passes stay in
# the cores' L2 caches: 16 rows of a 32k vocabulary, 65 of an 8k one. Alone, forward and backward on
# 4096 x 32000 bf16 logits took 0.25-0.29 s in 16-row chunks against 0.34-0.40 s in 128-row chunks
# (L3-sized); on 2048 x 8000, 21 ms in 65-row chunks against 28 ms in 16-row ones.
_CROSS_ENTROPY_CHUNK_BYTES = 2 * 2**20


def _chunk_rows(vocab: int) -> int:
    return max(1, _CROSS_ENTROPY_CHUNK_BYTES // (4 * vocab))


class _SmoothedCrossEntropySum(torch.autograd.Function):
    """Sum over labelled positions of the label-smoothed cross-entropy, with its gradient written directly.

    Per position, with log-probabilities log p = log_softmax(z) of the V logits z and reference token y:
        loss = -(1 - eps) log p_y - eps mean_j log p_j
        d loss / d z = p - ((1 - eps) onehot(y) + eps / V)
    torch's cross_entropy gives the same numbers through a dense one-hot gradient and a smoothing term,
    each a pass over the tokens x vocabulary tensor, and keeps the log-probabilities alive until the
    backward pass. Here nothing of that size is kept, the backward recomputes p and makes the gradient in
    one pass, and rows go in chunks that stay in cache, in float32 whatever the logits' dtype.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, epsilon: float) -> torch.Tensor:
        labelled = labels != -100
        targets = labels.clamp_min(0)
        losses = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        step = _chunk_rows(logits.shape[-1])
        for start in range(0, logits.shape[0], step):
            rows = slice(start, start + step)
            log_probs = torch.log_softmax(logits[rows], dim=-1, dtype=torch.float32)
            nll = log_probs.gather(1, targets[rows, None]).squeeze(1).neg_()
            losses[rows] = nll.mul_(1 - epsilon).sub_(log_probs.mean(-1), alpha=epsilon)
        ctx.save_for_backward(logits, targets, labelled)
        ctx.epsilon = epsilon
        return torch.where(labelled, losses, 0.0).sum()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_total: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        logits, targets, labelled = ctx.saved_tensors
        epsilon, vocab = ctx.epsilon, logits.shape[-1]
        grad = torch.empty_like(logits)
        scale = grad_total.float() * labelled.float()
        step = _chunk_rows(vocab)
        for start in range(0, logits.shape[0], step):
            rows = slice(start, start + step)
            chunk = torch.softmax(logits[rows], dim=-1, dtype=torch.float32).sub_(epsilon / vocab)
            chunk.scatter_add_(1, targets[rows, None], chunk.new_full((chunk.shape[0], 1), epsilon - 1))
            torch.mul(chunk, scale[rows, None], out=grad[rows])
        return grad, None, None


def label_smoothed_cross_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    epsilon: float,
    num_items_in_batch: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """Cross-entropy against targets smoothed with epsilon (Section 5.4, after Szegedy et al. 2016).

    The target distribution puts 1 - epsilon on the reference token and spreads epsilon uniformly over
    the vocabulary. Positions labelled -100 are ignored. The sum is divided by `num_items_in_batch`
    when the Trainer passes it, so that gradient accumulation over micro-batches equals one big batch;
    otherwise by this batch's count of labelled tokens. Computed in float32 (see `_SmoothedCrossEntropySum`).

    Under torch.compile it is torch's own cross-entropy, the same formula: dynamo would unroll the chunk
    loop of `_SmoothedCrossEntropySum` into the graph (256 chunks at 4096 tokens; the first compiled step
    at base size took 368 s, against 19-23 s this way), while inductor fuses torch's loss and its
    gradient itself (compiled float32 steps at base size 4-11% faster than with the chunk loop traced).
    """
    logits, labels = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
    if is_torchdynamo_compiling():
        loss = nn.functional.cross_entropy(
            logits.float(), labels, ignore_index=-100, label_smoothing=epsilon, reduction="sum"
        )
    else:
        loss = _SmoothedCrossEntropySum.apply(logits, labels, float(epsilon))
    if num_items_in_batch is None:
        num_items_in_batch = (labels != -100).sum()
    if isinstance(num_items_in_batch, torch.Tensor):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss / num_items_in_batch


LENGTH_PENALTY_TYPES = ("gnmt", "transformers")


def gnmt_length_penalty(length: torch.Tensor | float, alpha: float) -> torch.Tensor | float:
    """lp(Y) = ((5 + |Y|) / 6)^alpha, the length penalty of Wu et al. (2016) used in Section 6.1."""
    return ((5 + length) / 6) ** alpha


class SourceLengthLimitLogitsProcessor(LogitsProcessor):
    """Section 6.1's "maximum output length of input length + 50": once hypothesis i has as many
    tokens as its own source's limit, only the end-of-sequence token may follow."""

    def __init__(self, limits: torch.Tensor, eos_token_id: int, prompt_length: int = 1) -> None:
        self.limits = limits
        self.eos_token_id = eos_token_id
        self.prompt_length = prompt_length

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        # generate() repeats each source num_beams (or num_return_sequences) times, consecutively.
        limits = self.limits.to(scores.device).repeat_interleave(input_ids.shape[0] // self.limits.shape[0])
        at_limit = (input_ids.shape[1] - self.prompt_length) >= limits
        forced = torch.full_like(scores, -float("inf"))
        forced[:, self.eos_token_id] = 0
        return torch.where(at_limit[:, None], forced, scores)


class VanillaTransformerForConditionalGeneration(VanillaTransformerPreTrainedModel, GenerationMixin):
    """The full model of Figure 1: encoder-decoder, then the linear pre-softmax projection that shares
    its weight matrix with the embeddings (Section 3.4)."""

    def __init__(self, config: VanillaTransformerConfig) -> None:
        super().__init__(config)
        if config.share_encoder_decoder_embeddings and not config.tie_word_embeddings:
            raise ValueError(
                "share_encoder_decoder_embeddings=True needs tie_word_embeddings=True: in transformers 5 "
                "the latter turns every tie on or off. Set both, or share_encoder_decoder_embeddings=False."
            )
        self.model = VanillaTransformerModel(config)
        if config.share_encoder_decoder_embeddings:
            self._tied_weights_keys = {
                "lm_head.weight": "model.shared.weight",
                "model.encoder.embed_tokens.weight": "model.shared.weight",
                "model.decoder.embed_tokens.weight": "model.shared.weight",
            }
        elif config.tie_word_embeddings:
            self._tied_weights_keys = {"lm_head.weight": "model.decoder.embed_tokens.weight"}
        self.lm_head = nn.Linear(config.d_model, config.decoder_vocab_size, bias=False)
        if config.output_bias:
            self.register_buffer("final_logits_bias", torch.zeros(1, config.decoder_vocab_size))
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
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple[torch.Tensor] | BaseModelOutput | None = None,
        past_key_values: Cache | None = None,
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
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        logits = project(self.lm_head, outputs.last_hidden_state)
        if self.config.output_bias:
            # In place: the logits are the largest tensor of the model (tokens x vocabulary), and the matmul
            # that made them does not need them for its backward pass.
            logits += self.final_logits_bias.to(logits.dtype)

        loss = None
        if labels is not None:
            loss = label_smoothed_cross_entropy(
                logits, labels.to(logits.device), self.config.label_smoothing, num_items_in_batch
            )
        return Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            past_key_values=outputs.past_key_values,
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )

    def resize_token_embeddings(
        self,
        new_num_tokens: int | None = None,
        pad_to_multiple_of: int | None = None,
        mean_resizing: bool = True,
    ) -> nn.Embedding:
        """Resize the shared vocabulary, and with it the target-side size and the logits bias."""
        embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        if not self.config.share_encoder_decoder_embeddings:
            return embeddings
        size = embeddings.weight.shape[0]
        self.config.decoder_vocab_size = size
        if self.config.output_bias:
            old = self.final_logits_bias
            bias = old.new_zeros(1, size)
            bias[:, : min(size, old.shape[1])] = old[:, :size]
            self.final_logits_bias = bias
        return embeddings

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    @torch.no_grad()
    def generate(
        self,
        inputs: torch.Tensor | None = None,
        generation_config: GenerationConfig | None = None,
        logits_processor: LogitsProcessorList | None = None,
        length_penalty_type: str | None = None,
        max_length_offset: int | None = None,
        **kwargs,
    ) -> torch.LongTensor:
        """`GenerationMixin.generate` plus the paper's decoding rules (Section 6.1), each selectable here or
        in the generation config (where `paper_generation_config()` puts them):

        - `length_penalty_type="gnmt"`: beam scores are divided by ((5 + |Y|) / 6)^length_penalty, the
          penalty of Wu et al. (2016), instead of transformers' |Y|^length_penalty ("transformers").
        - `max_length_offset=50`: each output stops at its own input length + 50 tokens (before the end
          token). Ignored when `max_new_tokens` or `max_length` is passed to this call.
        """
        config = generation_config or self.generation_config
        penalty_type = length_penalty_type or getattr(config, "length_penalty_type", None) or "transformers"
        if penalty_type not in LENGTH_PENALTY_TYPES:
            raise ValueError(
                f"Unknown length_penalty_type {penalty_type!r}: choose one of {LENGTH_PENALTY_TYPES}."
            )
        if max_length_offset is None:
            max_length_offset = getattr(config, "max_length_offset", None)
        if max_length_offset is not None and "max_new_tokens" not in kwargs and "max_length" not in kwargs:
            source = inputs if inputs is not None else kwargs.get("input_ids")
            if source is None:
                raise ValueError("max_length_offset needs the source input_ids, to know each input's length.")
            mask = kwargs.get("attention_mask")
            lengths = mask.sum(dim=1) if mask is not None else source.ne(self.config.pad_token_id).sum(dim=1)
            limits = lengths + max_length_offset
            eos = self.config.eos_token_id
            eos = eos[0] if isinstance(eos, list) else eos
            logits_processor = LogitsProcessorList(
                [*(logits_processor or []), SourceLengthLimitLogitsProcessor(limits, eos)]
            )
            kwargs["max_new_tokens"] = int(limits.max()) + 1
        self._gnmt_length_penalty = penalty_type == "gnmt"
        try:
            with _weights_fixed_for_decoding():
                return super().generate(
                    inputs, generation_config, logits_processor=logits_processor, **kwargs
                )
        finally:
            self._gnmt_length_penalty = False

    def _reorder_cache(self, past_key_values: Cache, beam_idx: torch.LongTensor) -> Cache:
        """Beam search's per-step reordering of the cache. It only permutes the beams of each input among
        themselves, and all beams of an input hold the same encoder output, so the cross-attention keys
        and values need no reordering: only the self-attention cache is (saving 2 x layers copies/step)."""
        cache = past_key_values
        if isinstance(past_key_values, EncoderDecoderCache):
            cache = past_key_values.self_attention_cache
        for layer in cache.layers:
            if type(layer) is DynamicLayer and not cache.offloading and layer.get_seq_length() > 0:
                _reorder_with_a_free_position(layer, beam_idx)
            else:
                layer.reorder_cache(beam_idx)
        return past_key_values

    # transformers' beam search divides a hypothesis' log-probability by length ** length_penalty, and
    # these two hooks are where it does. For the GNMT penalty they pass a length L' with
    # L' ** alpha == ((5 + L) / 6) ** alpha, so the rest of the search stays transformers' own.
    def _update_finished_beams(self, *, cur_len: int, decoder_prompt_len: int, **kwargs):
        if getattr(self, "_gnmt_length_penalty", False):
            cur_len = decoder_prompt_len - 1 + gnmt_length_penalty(cur_len + 1 - decoder_prompt_len, 1.0)
        return super()._update_finished_beams(
            cur_len=cur_len, decoder_prompt_len=decoder_prompt_len, **kwargs
        )

    def _check_early_stop_heuristic(
        self, *, cur_len: int, max_length: int, decoder_prompt_len: int, **kwargs
    ):
        if getattr(self, "_gnmt_length_penalty", False):
            cur_len = decoder_prompt_len + gnmt_length_penalty(cur_len - decoder_prompt_len, 1.0)
            max_length = decoder_prompt_len + gnmt_length_penalty(max_length - decoder_prompt_len, 1.0)
        return GenerationMixin._check_early_stop_heuristic(
            cur_len=cur_len, max_length=max_length, decoder_prompt_len=decoder_prompt_len, **kwargs
        )


def paper_generation_config(config: VanillaTransformerConfig, **overrides) -> GenerationConfig:
    """The decoding of Section 6.1: beam size 4, GNMT length penalty alpha = 0.6, outputs up to the
    input length + 50, stopping as soon as the beams are finished."""
    values = dict(
        num_beams=4,
        length_penalty=0.6,
        early_stopping=True,
        length_penalty_type="gnmt",
        max_length_offset=50,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        decoder_start_token_id=config.decoder_start_token_id,
    )
    values.update(overrides)
    return GenerationConfig(**values)


__all__ = [
    "VanillaTransformerForConditionalGeneration",
    "VanillaTransformerModel",
    "VanillaTransformerPreTrainedModel",
    "gnmt_length_penalty",
    "paper_generation_config",
    "sinusoidal_position_encoding",
]
