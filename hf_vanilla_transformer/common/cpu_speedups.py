"""CPU speed-ups that this package's tools apply to a loaded model, each computing the same numbers as the
plain torch code it stands in for (up to float rounding), and each reached through a module's own `forward`
or a registered transformers interface. The model itself is plain transformers code; a user who calls
`model.generate()` directly gets it as it is.

- `CPULinear`: an `nn.Linear` whose large float32 products on AMD CPUs run through oneDNN rather than
  torch's default GEMM (MKL, which takes its AVX2 path there); small ones, where the default GEMM was
  faster, stay with it, and so do Intel CPUs, where MKL takes its AVX-512 path. Within one decoding call
  (`weights_fixed_for_decoding`), weights are packed once into oneDNN's blocked layout.
- `CPU_DECODING_ATTENTION`: an attention implementation registered with transformers'
  `AttentionInterface`, SDPA except that a decoding step (one query row, no gradient) on a CPU runs as two
  plain matmuls, where SDPA's kernels cost more than the products.
- `FreePositionCacheLayer`: beam search's cache reordering writes into a buffer one position longer, which
  the next decoding step fills instead of concatenating (`CPUDecodingCache`).
- `FastMaskDropout` / `fast_dropout_masks`: dropout masks drawn 32 bits per element, for bf16 training
  on CPUs, swapped in for the length of a training run.

`cpu_decoding(model)` and `cpu_training(model)` put them in place for a block and take them out after;
`prepare_for_cpu_decoding(model)` puts them in place for good, for a model loaded only to translate. Each
applies only where it was measured to help (CPU, dtype, not under torch.compile or torch.func), and none
changes saved weights or the config. `ENABLED` turns them all off: set the environment variable
`VANILLA_TRANSFORMER_CPU_SPEEDUPS=0` before import, or `hf_vanilla_transformer.common.cpu_speedups.ENABLED =
False` at run time. Nothing here patches torch or transformers: wrappers (accelerate's offload hooks, PEFT
adapters, quantizers) see ordinary `nn.Linear` and `nn.Dropout` modules and run them as such.
"""

import os
import platform
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn
from torch.nn import functional as F
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.cache_utils import DynamicCache, DynamicLayer, EncoderDecoderCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask
from transformers.utils import is_torchdynamo_compiling

from .hardware import CPUFeatures, cpu_features

ENABLED = os.environ.get("VANILLA_TRANSFORMER_CPU_SPEEDUPS", "1").strip().lower() not in ("0", "false", "no")

_X86_ONEDNN = torch.backends.mkldnn.is_available() and platform.machine().lower() in ("x86_64", "amd64")


def onednn_float32_linear_pays(features: CPUFeatures) -> bool:
    """Whether `CPULinear` takes oneDNN for float32 products on a CPU with these features: on AMD CPUs,
    where torch's default GEMM (MKL) takes its AVX2 path whatever the CPU has and oneDNN was measured
    faster (benchmarks/RESULTS.md, Zen 2 to Zen 5). On Intel CPUs MKL takes its AVX-512 or AMX path, and
    nothing measured there says oneDNN's would be faster, so they keep torch's default."""
    return _X86_ONEDNN and features.is_amd


_ONEDNN_FLOAT32_LINEAR = onednn_float32_linear_pays(cpu_features())


def eager_cpu(tensor: torch.Tensor) -> bool:
    """A tensor on the CPU outside torch.compile's tracing and torch.func's transforms, with speed-ups on.
    Asked of every product of a decoding step, so the cheapest test, and the one that settles it on a GPU,
    comes first."""
    return (
        tensor.is_cpu
        and ENABLED
        and not is_torchdynamo_compiling()
        and not torch._C._are_functorch_transforms_active()
    )


# ---------------------------------------------------------------------------------------------------------
# Linear layers


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x W^T + b through oneDNN, for x of any leading shape. The result is returned as torch's matmul
    returns N-d products (`_unsafe_view`), not as an autograd view of its rows: an in-place op on such a
    view (a logits bias, say) would make autograd rebuild the whole base tensor in the backward pass."""
    out = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), weight, bias, "none", [], "")
    return torch.ops.aten._unsafe_view(out, (*x.shape[:-1], out.shape[-1]))


class _OneDNNLinearFunction(torch.autograd.Function):
    """x W^T + b with oneDNN products forward and backward (torch has no oneDNN float32 autograd path).
    The backward is written in differentiable ops, so double backward works."""

    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return _onednn_linear(x, weight, bias)

    @staticmethod
    def setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
        x, weight, bias = inputs
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        if torch.is_grad_enabled():  # double backward: plain differentiable products
            grad_x = grad @ weight
            grad_rows = grad.reshape(-1, grad.shape[-1])
            grad_weight = grad_rows.t() @ x.reshape(-1, x.shape[-1])
            return grad_x, grad_weight, grad_rows.sum(0) if ctx.has_bias else None
        grad = grad.contiguous()
        grad_x = _onednn_linear(grad, weight.t().contiguous(), None) if ctx.needs_input_grad[0] else None
        grad_rows = grad.view(-1, grad.shape[-1])
        grad_weight = grad_rows.t().mm(x.reshape(-1, x.shape[-1])) if ctx.needs_input_grad[1] else None
        grad_bias = grad_rows.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias


# Within one generate() call: for each CPULinear, a weak reference to the weight it saw and that weight in
# oneDNN's blocked layout. Held by the call's context, never by a module, so two threads decoding with one
# model each keep their own, and nothing outlives the call.
_PACKED_WEIGHTS: ContextVar[dict[int, tuple[weakref.ref, torch.Tensor, nn.Module]] | None] = ContextVar(
    "_PACKED_WEIGHTS", default=None
)


# Within a running batch's decoding (`weights_fixed_for_decoding(sentences_apart=True)`): whether a decoding
# step's attention runs over each run of rows' own span of keys (`_single_query_attention`).
_SENTENCES_APART: ContextVar[bool] = ContextVar("_SENTENCES_APART", default=False)


@contextmanager
def weights_fixed_for_decoding(sentences_apart: bool = False) -> Iterator[None]:
    """Within one generate() call (or one running batch of the server's iteration scheduler) the
    parameters are fixed, so a float32 `CPULinear` that goes through oneDNN packs its weight once, at its
    first use, and reuses the packed copy. Nothing outlives the call: fused optimizers update parameters in
    place without bumping their version counters, so no cache key could tell that a copy kept across calls
    was stale. A weight that is a new tensor at every use (accelerate's offload loads it afresh) is packed
    for that use alone.

    With `sentences_apart`, a decoding step's attention takes each sentence's keys without the batch's
    padding (`_single_query_attention`), so that each sentence comes out bit for bit as decoded alone: the
    server's running batch asks for this; within generate() a padded batch's sums may round otherwise, at
    less cost (7% of `translate`'s speed on the demo model)."""
    tokens = _PACKED_WEIGHTS.set({}), _SENTENCES_APART.set(sentences_apart)
    try:
        yield
    finally:
        _SENTENCES_APART.reset(tokens[1])
        _PACKED_WEIGHTS.reset(tokens[0])


# oneDNN's blocked layout is chosen for a number of rows; any hint from 2 up gave the same products.
_PACKING_ROWS_HINT = 64


def _decoding_weight(module: nn.Module, weight: torch.Tensor) -> torch.Tensor:
    """The weight in oneDNN's blocked layout within a generate() call, for every product whatever its rows;
    elsewhere the weight itself. With one layout for every row count, a row's product is the same number
    whatever rows share the step (1 to 257 rows, on one and two threads, checked by
    tests/test_cpu_speedups.py): a sentence decoded beside others in the server's running batch then gets
    the same numbers as decoded alone, where unpacked products of one row (a matrix-vector product) round
    differently from those of two or more."""
    store = _PACKED_WEIGHTS.get()
    if store is None:
        return weight
    seen = store.get(id(module))
    if seen is not None and seen[0]() is weight:
        return seen[1]
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, _PACKING_ROWS_HINT)
    store[id(module)] = (weakref.ref(weight), packed, module)
    return packed


def onednn_float32_minima(features: CPUFeatures) -> tuple[int, int]:
    """(rows, weight elements): the smallest training product and the smallest inference weight that
    `CPULinear` sends through oneDNN on a CPU with these features, where oneDNN's float32 products were
    measured faster than torch's default GEMM, product by product and in whole training steps and
    generate() calls (benchmarks/bench_onednn.py, benchmarks/RESULTS.md):

    - AMD Zen 5 (family 26), whose AVX-512 units are full width: every product without gradients (1.5x-2.8x
      from 128 rows up) and training products from 1024 rows (1.3x-2.7x; at 128 rows some ran at 0.5x).
    - Elsewhere (measured on AVX2-only Zen 2 and Zen 3): training products of at least 3072 rows (a d_model
      256 model's step over 1024 tokens ran 9% slower through oneDNN, over 4096 tokens 11% faster), and
      weights of at least 2^18 elements (512 x 512, 256 x 1024) without gradients, as smaller ones ran up
      to 23% slower and a d_model 256 model decoded 9% slower with every product through oneDNN.
    """
    if features.is_amd and features.family == 26 and "avx512f" in features.flags:
        return 1024, 0
    return 3072, 2**18


_ONEDNN_MIN_TRAINING_ROWS, _ONEDNN_MIN_INFERENCE_WEIGHT = onednn_float32_minima(cpu_features())


class CPULinear(nn.Linear):
    """`nn.Linear`, whose float32 products on AMD CPUs (`onednn_float32_linear_pays`) run through oneDNN
    rather than torch's default GEMM where that was measured to be faster: training products of many rows,
    and products with large weights in decoding (`onednn_float32_minima`, per CPU kind; the same float32
    arithmetic, summed in another order).
    Everywhere else, and under autocast or torch.compile, it is what `nn.Linear.forward` is, `F.linear`,
    called here without the extra frame (decoding makes several dozen such calls a step). Wrappers see an
    `nn.Linear`: accelerate's offload hooks load the weight before this forward runs, and PEFT wraps it as
    it wraps any linear layer. A weight or input with its own `__torch_function__` (a tensor subclass:
    torchao's quantized weights, DTensor) goes to `F.linear`, where its own implementation runs.

    torch.ao's `quantize_dynamic` matches module types exactly and skips subclasses:
    `hf_vanilla_transformer.inference.translation.quantize_int8` quantizes these layers.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.weight, self.bias
        if not (
            _ONEDNN_FLOAT32_LINEAR
            and eager_cpu(x)
            and x.dtype == weight.dtype == torch.float32
            and weight.is_cpu
            and not torch.is_autocast_enabled("cpu")
            and not torch.overrides.has_torch_function((x, weight) if bias is None else (x, weight, bias))
        ):
            return F.linear(x, weight, bias)
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias)):
            rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
            if rows < _ONEDNN_MIN_TRAINING_ROWS:
                return F.linear(x, weight, bias)
            return _OneDNNLinearFunction.apply(x, weight, bias)
        if weight.numel() < _ONEDNN_MIN_INFERENCE_WEIGHT:
            return F.linear(x, weight, bias)
        return _onednn_linear(x, _decoding_weight(self, weight), bias)


def _swap_linear_layers(model: nn.Module, old: type[nn.Linear], new: type[nn.Linear]) -> nn.Module:
    """`model`, changed in place: each module of exactly type `old` replaced by a `new` holding the same
    parameters."""
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if type(child) is old:
                swapped = new(child.in_features, child.out_features, child.bias is not None, device="meta")
                swapped.weight, swapped.bias = child.weight, child.bias
                swapped.train(child.training)
                setattr(parent, name, swapped)
    return model


def with_nn_linear_layers(model: nn.Module) -> nn.Module:
    """`model`, changed in place: each `CPULinear` replaced by an `nn.Linear` holding the same parameters,
    for tools that match module types exactly (torch.ao's `quantize_dynamic`)."""
    return _swap_linear_layers(model, CPULinear, nn.Linear)


def with_cpu_linear_layers(model: nn.Module) -> nn.Module:
    """`model`, changed in place: each `nn.Linear` replaced by a `CPULinear` holding the same parameters.
    Subclasses (PEFT's adapters, quantized layers) keep their own."""
    return _swap_linear_layers(model, nn.Linear, CPULinear)


def prepare_for_cpu_decoding(model: nn.Module) -> nn.Module:
    """`model`, changed in place for decoding on a CPU: `CPULinear` layers, and SDPA's decoding steps as plain
    matmuls (`CPU_DECODING_ATTENTION`) where the model attends with SDPA. Nothing changes on another device,
    with the speed-ups off, or in the weights and saved config."""
    weight = next(model.parameters(), None)  # an exported engine's stand-in model has none
    if not ENABLED or weight is None or weight.device.type != "cpu":
        return model
    with_cpu_linear_layers(model)
    config = getattr(model, "config", None)
    if config is not None and config._attn_implementation == "sdpa":
        model.set_attn_implementation(CPU_DECODING_ATTENTION)
    return model


def _linear_layers(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    return [
        (parent, name, child)
        for parent in list(model.modules())
        for name, child in parent.named_children()
        if type(child) is nn.Linear
    ]


@contextmanager
def cpu_decoding(model: nn.Module) -> Iterator[None]:
    """Within the block, `model` as `prepare_for_cpu_decoding` makes it, its weights packed once per use
    (`weights_fixed_for_decoding`); on the way out it is the model it was, as a run saves it."""
    originals, attention = _linear_layers(model), model.config._attn_implementation
    prepare_for_cpu_decoding(model)
    try:
        with weights_fixed_for_decoding():
            yield
    finally:
        for parent, name, child in originals:
            setattr(parent, name, child)
        if model.config._attn_implementation != attention:
            model.set_attn_implementation(attention)


@contextmanager
def cpu_training(model: nn.Module) -> Iterator[None]:
    """Within the block, the model's linear layers are `CPULinear` (oneDNN's float32 products for the large
    training products of AMD CPUs); on the way out they are the model's own again."""
    originals = _linear_layers(model)
    if ENABLED:
        with_cpu_linear_layers(model)
    try:
        yield
    finally:
        for parent, name, child in originals:
            setattr(parent, name, child)


# ---------------------------------------------------------------------------------------------------------
# Attention


def _single_query_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scaling: float
) -> torch.Tensor:
    """Eq. 1 for one query row as two plain matmuls, taking SDPA's masks (boolean, True = attend): the
    model's `eager_attention_forward` for a decoding step, as tests/test_cpu_speedups.py checks
    (`test_single_query_attention_equals_the_models_eager_attention`, `..._equals_sdpa`).

    In a running batch (`weights_fixed_for_decoding(sentences_apart=True)`), where the batch's padding
    leaves each row one unbroken span of keys (padding on the left of the self-attention cache, on the right
    of the source), each run of rows with the same span is computed over that span alone: its sums then run
    over the same numbers in the same order as for the sentence decoded by itself, not over a padded length
    that rounds them differently."""
    spans = _key_spans(mask, query.shape[0], key.shape[0]) if _SENTENCES_APART.get() else None
    if spans is None:
        return _attention(query, key, value, mask, scaling)
    out = query.new_empty(query.shape[0], query.shape[2], query.shape[1], value.shape[-1])
    for rows, columns in spans:
        out[rows] = _attention(query[rows], key[rows, :, columns], value[rows, :, columns], None, scaling)
    return out


def _attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scaling: float
) -> torch.Tensor:
    scores = torch.matmul(query, key.transpose(2, 3)).mul_(scaling)
    if mask is not None and mask.dtype == torch.bool:
        scores.masked_fill_(~mask, torch.finfo(scores.dtype).min)
    elif mask is not None:
        scores.add_(mask)
    return torch.matmul(scores.softmax(dim=-1), value).transpose(1, 2).contiguous()


def _key_spans(mask: torch.Tensor | None, rows: int, key_rows: int) -> list[tuple[slice, slice]] | None:
    """(rows, keys) slices: runs of consecutive rows whose boolean `mask` keeps the same unbroken span of
    keys; None where the mask is not a per-row boolean mask of such spans (no mask, a float mask, a mask per
    head, a row with a gap or with no key), which `_attention` then takes as it is."""
    if mask is None or mask.dtype != torch.bool or mask.shape[0] != rows or key_rows != rows:
        return None
    if mask.shape[1] != 1 or mask.shape[2] != 1:
        return None
    keep = mask[:, 0, 0, :]
    columns = keep.shape[-1]
    counts = keep.sum(dim=1)
    firsts = keep.to(torch.uint8).argmax(dim=1)
    ends = columns - keep.flip(1).to(torch.uint8).argmax(dim=1)
    if bool(((counts == 0) | (ends - firsts != counts)).any()):
        return None
    spans: list[tuple[slice, slice]] = []
    start = 0
    bounds = list(zip(firsts.tolist(), ends.tolist()))
    for row in range(1, rows + 1):
        if row == rows or bounds[row] != bounds[start]:
            first, end = bounds[start]
            spans.append((slice(start, row), slice(first, end)))
            start = row
    return spans


def sdpa_with_cpu_decoding_steps(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention, except for a float32 decoding step on a CPU (one query row, no
    gradient, no attention dropout), where SDPA's kernels cost more than two plain matmuls. Half-precision
    steps stay with SDPA, which accumulates the scores and the softmax in float32. Like SDPA it returns no
    attention weights."""
    if (
        query.shape[2] == 1
        and query.dtype == torch.float32
        and dropout == 0.0
        and not torch.is_grad_enabled()
        and eager_cpu(query)
    ):
        scale = query.shape[-1] ** -0.5 if scaling is None else scaling
        return _single_query_attention(query, key, value, attention_mask, scale), None
    return sdpa_attention_forward(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
    )


# Registered under a name of its own, with SDPA's masks: transformers' "sdpa" stays what it is for every
# model.
CPU_DECODING_ATTENTION = "sdpa_cpu_decoding"
AttentionInterface.register(CPU_DECODING_ATTENTION, sdpa_with_cpu_decoding_steps)
AttentionMaskInterface.register(CPU_DECODING_ATTENTION, sdpa_mask)


# ---------------------------------------------------------------------------------------------------------
# Beam search cache


class FreePositionCacheLayer(DynamicLayer):
    """A self-attention cache layer reordered for beam search into buffers one position longer: its keys
    and values are views of the reordered positions, and the next decoding step's `update` writes the new
    position into the free slot instead of concatenating (`DynamicLayer.update` would copy the whole
    reordered cache a second time at every step)."""

    @classmethod
    def reordered(cls, layer: DynamicLayer, beam_idx: torch.LongTensor) -> "FreePositionCacheLayer":
        """`layer` with its batch rows reordered by `beam_idx`, as `layer.reorder_cache(beam_idx)` does."""
        return cls.holding(
            rows_with_free_position(layer.keys, beam_idx), rows_with_free_position(layer.values, beam_idx)
        )

    @classmethod
    def holding(cls, keys: torch.Tensor, values: torch.Tensor) -> "FreePositionCacheLayer":
        """A layer holding `keys` and `values` themselves, not copies. Where they are the views that
        `rows_with_free_position` returns, the next decoding step's `update` writes into the free slot."""
        layer = cls()
        layer.device, layer.is_initialized = keys.device, True
        layer.keys, layer.values = keys, values
        if keys._base is not None and values._base is not None:
            layer._free_buffers = (keys._base, values._base)
        return layer

    def _holds_prefixes_of(self, buffers: tuple[torch.Tensor, torch.Tensor]) -> bool:
        """Whether the keys and values are still the views `reordered` made (not cropped or replaced)."""
        return all(
            states._base is buffer
            and states.data_ptr() == buffer.data_ptr()
            and states.shape[-2] == buffer.shape[-2] - 1
            for states, buffer in zip((self.keys, self.values), buffers)
        )

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        buffers, self._free_buffers = getattr(self, "_free_buffers", None), None
        if buffers is None or key_states.shape[-2] != 1 or not self._holds_prefixes_of(buffers):
            return super().update(key_states, value_states, *args, **kwargs)
        key_buffer, value_buffer = buffers
        key_buffer[:, :, -1:].copy_(key_states)
        value_buffer[:, :, -1:].copy_(value_states)
        self.keys, self.values = key_buffer, value_buffer
        return self.keys, self.values


def rows_with_free_position(states: torch.Tensor, rows: torch.LongTensor) -> torch.Tensor:
    """`states` [batch, heads, positions, d_k] at the batch `rows`, as `index_select` gives them, but the
    first positions of a buffer one position longer, for `FreePositionCacheLayer.holding` to write the next
    position into."""
    batch, heads, length, dim = states.shape
    buffer = states.new_empty(len(rows), heads, length + 1, dim)
    torch.index_select(states, 0, rows.to(states.device), out=buffer[:, :, :length])
    return buffer[:, :, :length]


def reorder_self_attention_layer(layer: DynamicLayer, beam_idx: torch.LongTensor) -> DynamicLayer:
    """Beam search's reordering of one self-attention cache layer: into a `FreePositionCacheLayer` for a
    dynamic layer on a CPU, in place by the layer's own `reorder_cache` otherwise. Returns the layer to
    keep."""
    if isinstance(layer, DynamicLayer) and layer.get_seq_length() > 0 and eager_cpu(layer.keys):
        if type(layer) in (DynamicLayer, FreePositionCacheLayer):
            return FreePositionCacheLayer.reordered(layer, beam_idx)
    layer.reorder_cache(beam_idx)
    return layer


# ---------------------------------------------------------------------------------------------------------
# Dropout masks


class _FastMaskDropoutFunction(torch.autograd.Function):
    """Inverted dropout, x * mask / (1 - p), with the mask drawn 32 bits per element: each 64-bit draw of
    torch's generator (`random_` over the full int64 range) gives two elements, where torch's
    `bernoulli_` draws per element. An element is kept when its 32 bits, read as a signed integer, are at
    least -2^31 + round(p 2^32), so with probability 1 - p to within 2^-32."""

    @staticmethod
    def forward(x: torch.Tensor, p: float) -> torch.Tensor:
        count = x.numel()
        draws = torch.empty((count + 1) // 2, dtype=torch.int64, device=x.device).random_(-(2**63), None)
        bits = draws.view(torch.int32)[:count].view(x.shape)
        keep = bits >= min(-(2**31) + round(p * 2**32), 2**31 - 1)
        return torch.where(keep, x / (1.0 - p), 0.0), keep

    @staticmethod
    def setup_context(ctx, inputs: tuple, output: tuple) -> None:
        _, p = inputs
        ctx.save_for_backward(output[1])
        ctx.mark_non_differentiable(output[1])
        ctx.scale = 1.0 / (1.0 - p)

    @staticmethod
    def backward(ctx, grad: torch.Tensor, _keep_grad: None) -> tuple[torch.Tensor, None]:
        (keep,) = ctx.saved_tensors
        return torch.where(keep, grad * ctx.scale, 0.0), None


class FastMaskDropout(nn.Dropout):
    """`nn.Dropout` with masks drawn two elements per 64-bit draw of torch's generator on CPUs (faster per
    mask than `bernoulli_`). Same keep probability and still reproducible from torch's seed,
    but the masks differ from `nn.functional.dropout`'s for that seed. Elsewhere, `nn.Dropout` itself."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and 0.0 < self.p < 1.0 and eager_cpu(x):
            return _FastMaskDropoutFunction.apply(x, self.p)[0]
        return super().forward(x)


@contextmanager
def fast_dropout_masks(model: nn.Module) -> Iterator[None]:
    """Within the block, the model's `nn.Dropout` modules draw their masks as `FastMaskDropout` does (in a
    bf16 training step on a CPU, torch's per-element masks take a noticeable share of the time). The
    modules are put back on the way out, so a saved or published model never depends on this."""
    swapped = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if type(child) is nn.Dropout:
                replacement = FastMaskDropout(child.p, child.inplace)
                replacement.train(child.training)
                setattr(parent, name, replacement)
                swapped.append((parent, name, child, replacement))
    try:
        yield
    finally:
        for parent, name, original, replacement in swapped:
            original.train(replacement.training)
            setattr(parent, name, original)


class CPUDecodingCache(EncoderDecoderCache):
    """transformers' encoder-decoder cache, whose beam-search reordering (`reorder_cache`, which
    `generate()` calls at every step) moves the self-attention cache into `FreePositionCacheLayer`s on a CPU
    and leaves the cross-attention cache alone: beam search only permutes the beams of each input among
    themselves, and all beams of an input hold the same encoder output, so those keys and values need no
    reordering (saving 2 x layers copies a step)."""

    @classmethod
    def for_model(cls, model: nn.Module) -> "CPUDecodingCache":
        return cls(DynamicCache(config=model.config), DynamicCache(config=model.config))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        cache = self.self_attention_cache
        if getattr(cache, "offloading", False) or not isinstance(getattr(cache, "layers", None), list):
            cache.reorder_cache(beam_idx)
            return
        cache.layers = [reorder_self_attention_layer(layer, beam_idx) for layer in cache.layers]
