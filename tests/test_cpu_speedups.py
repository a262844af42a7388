"""The CPU speed-ups (`cpu_speedups`) against the plain torch code they stand in for: the same outputs,
losses and gradients up to float rounding, applied only where they are meant to apply, and off with
`cpu_speedups.ENABLED = False`."""

import math
import threading

import pytest
import torch
from conftest import MEASURED_ONEDNN_MINIMA, grad_fn_names, tiny_model
from torch import nn
from transformers.cache_utils import DynamicLayer

from hf_vanilla_transformer.common import cpu_speedups
from hf_vanilla_transformer.training.loss import label_smoothed_cross_entropy
from hf_vanilla_transformer.vanilla_transformer.modeling_vanilla_transformer import eager_attention_forward

ONEDNN = pytest.mark.skipif(not cpu_speedups._X86_ONEDNN, reason="the oneDNN path is taken on x86 CPUs only")


def random_batch(batch: int = 3, src_len: int = 9, tgt_len: int = 7, vocab: int = 64, seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (batch, src_len), generator=generator)
    tgt = torch.randint(4, vocab, (batch, tgt_len), generator=generator)
    return src, tgt


def training_step(monkeypatch, enabled: bool, **overrides):
    """Loss, gradients and autograd node names of one training step of the same model and dropout masks,
    with the label-smoothed training loss."""
    monkeypatch.setattr(cpu_speedups, "ENABLED", enabled)
    src, tgt = random_batch()
    model = tiny_model(seed=3, **overrides).train()
    if model.config.output_bias:
        model.final_logits_bias.normal_(generator=torch.Generator().manual_seed(5))
    torch.manual_seed(7)
    with cpu_speedups.cpu_training(model):
        decoder_input_ids = model.prepare_decoder_input_ids_from_labels(tgt)
        logits = model(input_ids=src, decoder_input_ids=decoder_input_ids).logits
        loss = label_smoothed_cross_entropy(logits, tgt, 0.1)  # the training loss, as `train` computes it
        loss.backward()
    return loss, {name: p.grad for name, p in model.named_parameters()}, grad_fn_names(loss)


@pytest.mark.parametrize("output_bias", [False, True])
def test_training_step_with_and_without_speedups(monkeypatch, output_bias):
    loss, grads, names = training_step(monkeypatch, True, output_bias=output_bias)
    expected_loss, expected_grads, expected_names = training_step(monkeypatch, False, output_bias=output_bias)
    assert "_SmoothedCrossEntropySumBackward" in names
    assert not any(name.startswith(("_SmoothedCrossEntropy", "_OneDNN")) for name in expected_names)
    if cpu_speedups._X86_ONEDNN:
        assert "_OneDNNLinearFunctionBackward" in names
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("num_beams", [1, 4])
def test_generation_with_and_without_speedups(monkeypatch, num_beams):
    """fp32 greedy and beam search give the same tokens and scores with the speed-ups and without."""
    src, _ = random_batch(batch=5)
    mask = torch.ones_like(src)
    mask[1, 4:] = 0
    kwargs = dict(input_ids=src, attention_mask=mask, max_new_tokens=12, num_beams=num_beams)
    kwargs.update(output_scores=True, return_dict_in_generate=True)
    model = tiny_model(seed=2, attn_implementation="sdpa")
    monkeypatch.setattr(cpu_speedups, "ENABLED", False)
    plain = model.generate(**kwargs)
    monkeypatch.setattr(cpu_speedups, "ENABLED", True)
    with cpu_speedups.cpu_decoding(model):
        cache = {"cache": cpu_speedups.CPUDecodingCache.for_model(model)} if num_beams > 1 else {}
        fast = model.generate(**kwargs, **cache)
    assert torch.equal(fast.sequences, plain.sequences)
    for ours, theirs in zip(fast.scores, plain.scores):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


@ONEDNN
@pytest.mark.parametrize("bias", [True, False])
def test_cpu_linear_matches_nn_linear_forward_backward_and_double_backward(bias):
    generator = torch.Generator().manual_seed(0)
    fast = cpu_speedups.CPULinear(16, 24, bias=bias)
    plain = nn.Linear(16, 24, bias=bias)
    plain.load_state_dict(fast.state_dict())
    x = torch.randn(3, 5, 16, generator=generator, requires_grad=True)
    x_plain = x.detach().clone().requires_grad_()
    out, expected = fast(x), plain(x_plain)
    assert "_OneDNNLinearFunctionBackward" in grad_fn_names(out)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    # A gradient penalty needs the gradient's own graph (double backward).
    grads = torch.autograd.grad(out.square().sum(), [x, fast.weight], create_graph=True)
    grads_plain = torch.autograd.grad(expected.square().sum(), [x_plain, plain.weight], create_graph=True)
    for ours, theirs in zip(grads, grads_plain):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    sum(g.square().sum() for g in grads).backward()
    sum(g.square().sum() for g in grads_plain).backward()
    torch.testing.assert_close(fast.weight.grad, plain.weight.grad, rtol=1e-4, atol=1e-3)


@ONEDNN
def test_cpu_linear_is_nn_linear_under_autocast_compile_and_when_off(monkeypatch):
    layer = cpu_speedups.CPULinear(8, 4)
    x = torch.randn(2, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(x).dtype == torch.bfloat16
    monkeypatch.setattr(cpu_speedups, "ENABLED", False)
    assert "_OneDNNLinearFunctionBackward" not in grad_fn_names(layer(x))


# The sizes `onednn_float32_minima` gives each CPU kind: AVX2-only AMD CPUs and Zen 4, and Zen 5.
MINIMA_BY_KIND = {"AVX2 and Zen 4": (3072, 2**18), "Zen 5": (1024, 0)}


def test_this_cpu_ships_one_of_the_measured_sizes():
    assert tuple(MEASURED_ONEDNN_MINIMA.values()) in MINIMA_BY_KIND.values()


@ONEDNN
@pytest.mark.parametrize("minima", MINIMA_BY_KIND.values(), ids=MINIMA_BY_KIND.keys())
def test_cpu_linear_takes_onednn_only_from_the_measured_sizes(monkeypatch, minima):
    """Training products of fewer rows, and inference products with smaller weights, ran faster through
    torch's default GEMM: they stay `nn.Linear.forward`."""
    min_rows, min_weight = minima
    monkeypatch.setattr(cpu_speedups, "_ONEDNN_MIN_TRAINING_ROWS", min_rows)
    monkeypatch.setattr(cpu_speedups, "_ONEDNN_MIN_INFERENCE_WEIGHT", min_weight)
    layer = cpu_speedups.CPULinear(8, 4)
    for rows, expected in ((min_rows - 1, False), (min_rows, True)):
        x = torch.randn(rows, 8, requires_grad=True)
        out = layer(x)
        assert ("_OneDNNLinearFunctionBackward" in grad_fn_names(out)) is expected, rows
        torch.testing.assert_close(out, nn.functional.linear(x, layer.weight, layer.bias))

    onednn_calls = []
    real_onednn_linear = cpu_speedups._onednn_linear
    monkeypatch.setattr(
        cpu_speedups, "_onednn_linear", lambda *args: onednn_calls.append(args) or real_onednn_linear(*args)
    )
    width = 64
    for out_features, expected in ((min_weight // width - 1, 0), (max(1, min_weight // width), 1)):
        if out_features < 1:
            continue  # every weight takes oneDNN
        layer = cpu_speedups.CPULinear(width, out_features).eval()
        x = torch.randn(5, width)
        with torch.no_grad():
            torch.testing.assert_close(layer(x), nn.functional.linear(x, layer.weight, layer.bias))
        assert len(onednn_calls) == expected, out_features
        onednn_calls.clear()


class DoubledWeight(torch.Tensor):
    """A weight tensor subclass with its own linear product, x (2W)^T, as quantizers and DTensor have
    their own."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is nn.functional.linear:
            x, weight, *rest = args
            return nn.functional.linear(x, weight.as_subclass(torch.Tensor) * 2, *rest, **kwargs)
        return super().__torch_function__(func, types, args, kwargs)


@ONEDNN
def test_cpu_linear_leaves_a_tensor_subclass_weight_its_own_product():
    layer, plain = cpu_speedups.CPULinear(8, 4), nn.Linear(8, 4)
    weight = torch.randn(4, 8).as_subclass(DoubledWeight)
    for module in (layer, plain):
        del module.weight
        module.weight = weight
    x = torch.randn(3, 8)
    with torch.no_grad():
        plain.bias.copy_(layer.bias)
        expected = x @ (2 * weight.as_subclass(torch.Tensor)).T + layer.bias
        torch.testing.assert_close(plain(x), expected)
        torch.testing.assert_close(layer(x), expected)


@ONEDNN
def test_decoding_packs_a_weight_at_its_first_use_for_every_row_count_and_keeps_nothing():
    generator = torch.Generator().manual_seed(0)
    layer = cpu_speedups.CPULinear(16, 24).eval()
    x = torch.randn(4, 7, 16, generator=generator)
    with torch.no_grad():
        expected = nn.functional.linear(x, layer.weight, layer.bias)
        with pytest.raises(RuntimeError, match="stop"), cpu_speedups.weights_fixed_for_decoding():
            outputs = [layer(x)]
            store = cpu_speedups._PACKED_WEIGHTS.get()
            reference, packed, _ = store[id(layer)]
            assert reference() is layer.weight and packed.layout == torch._mkldnn
            outputs += [layer(x[:1, :1]), layer(x.repeat(8, 1, 1))]  # one row, 224 rows: the same copy
            assert store[id(layer)][1] is packed
            raise RuntimeError("stop")  # the copies go, however the call ends
        assert cpu_speedups._PACKED_WEIGHTS.get() is None
    for out, reference_out in zip(outputs, (expected, expected[:1, :1], expected.repeat(8, 1, 1))):
        torch.testing.assert_close(out, reference_out, rtol=1e-5, atol=1e-5)


@ONEDNN
@pytest.mark.parametrize("threads", [1, 2])
def test_a_rows_product_in_decoding_is_the_same_number_whatever_rows_share_it(threads):
    """The server's running batch decodes a sentence beside a changing number of others: each of its rows
    must come out of a product bit for bit as it does alone (one row) or beside any other rows."""
    generator = torch.Generator().manual_seed(0)
    layer = cpu_speedups.CPULinear(96, 200).eval()
    row = torch.randn(96, generator=generator)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad(), cpu_speedups.weights_fixed_for_decoding():
            alone = layer(row[None])[0]
            for rows in (2, 3, 4, 5, 7, 8, 33, 64, 65, 128, 257):
                for position in {0, rows // 2, rows - 1}:
                    x = torch.randn(rows, 96, generator=generator)
                    x[position] = row
                    assert torch.equal(layer(x)[position], alone), (rows, position)
    finally:
        torch.set_num_threads(previous_threads)


@ONEDNN
def test_a_weight_loaded_afresh_at_every_call_is_packed_for_that_use_and_never_kept():
    """accelerate's offload sets a new weight tensor before each forward: nothing may hold it."""
    layer = cpu_speedups.CPULinear(16, 24).eval()
    x = torch.randn(4, 7, 16)
    with torch.no_grad(), cpu_speedups.weights_fixed_for_decoding():
        packed_copies = []
        for _ in range(3):
            layer.weight = nn.Parameter(layer.weight.detach().clone())
            torch.testing.assert_close(layer(x), nn.functional.linear(x, layer.weight, layer.bias))
            reference, packed, _ = cpu_speedups._PACKED_WEIGHTS.get()[id(layer)]
            assert reference() is layer.weight and all(packed is not copy for copy in packed_copies)
            packed_copies.append(packed)
        old = reference()
        layer.weight = nn.Parameter(layer.weight.detach().clone())
        del old
        assert reference() is None  # only a weak reference was held


def test_two_threads_decoding_with_one_model_keep_their_own_copies():
    model = tiny_model(seed=2)
    src, _ = random_batch(batch=4)
    expected = model.generate(src, num_beams=4, max_new_tokens=8)
    results, errors = [], []

    def decode():
        try:
            for _ in range(3):
                results.append(model.generate(src, num_beams=4, max_new_tokens=8))
        except Exception as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=decode) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
        assert not thread.is_alive(), "a decoding thread did not finish"
    assert not errors and len(results) == 6
    assert all(torch.equal(result, expected) for result in results)


def test_single_query_attention_equals_sdpa():
    """A decoding step's attention (one query row, SDPA's boolean masks) computed with plain matmuls."""
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(3, 4, 1, 8, generator=generator)
    key, value = torch.randn(2, 3, 4, 11, 8, generator=generator)
    mask = torch.ones(3, 1, 1, 11, dtype=torch.bool)
    mask[0, ..., 7:] = False
    module = nn.Module().eval()
    module.is_causal = False
    with torch.no_grad():
        for attention_mask in (mask, None):
            out, weights = cpu_speedups.sdpa_with_cpu_decoding_steps(
                module, query, key, value, attention_mask, scaling=8**-0.5
            )
            expected = nn.functional.scaled_dot_product_attention(query, key, value, attention_mask)
            assert weights is None
            torch.testing.assert_close(out, expected.transpose(1, 2))


def test_a_running_batchs_attention_takes_each_sentence_without_the_padding():
    """In a running batch (`sentences_apart`), rows padded on the left (self-attention) or on the right
    (source) get bit for bit what they get over their own keys alone; a mask with a gap is taken as it is."""
    generator = torch.Generator().manual_seed(2)
    query = torch.randn(6, 4, 1, 8, generator=generator)
    key, value = torch.randn(2, 6, 4, 13, 8, generator=generator)
    spans = [(0, 13), (0, 13), (3, 13), (3, 13), (0, 5), (2, 9)]
    mask = torch.zeros(6, 1, 1, 13, dtype=torch.bool)
    for row, (first, end) in enumerate(spans):
        mask[row, ..., first:end] = True
    with torch.no_grad(), cpu_speedups.weights_fixed_for_decoding(sentences_apart=True):
        out = cpu_speedups._single_query_attention(query, key, value, mask, 8**-0.5)
        for row, (first, end) in enumerate(spans):
            rows = slice(row, row + 1)
            alone = cpu_speedups._single_query_attention(
                query[rows],
                key[rows, :, first:end].contiguous(),
                value[rows, :, first:end].contiguous(),
                None,
                8**-0.5,
            )
            assert torch.equal(out[rows], alone), row
        gap = mask.clone()
        gap[0, ..., 6] = False
        torch.testing.assert_close(
            cpu_speedups._single_query_attention(query, key, value, gap, 8**-0.5),
            cpu_speedups._attention(query, key, value, gap, 8**-0.5),
        )
    with torch.no_grad():  # within generate(): the padded batch as it is, equal up to rounding
        torch.testing.assert_close(
            cpu_speedups._single_query_attention(query, key, value, mask, 8**-0.5), out
        )


def test_single_query_attention_equals_the_models_eager_attention():
    """The decoding step's two matmuls against the model's own Eq. 1 (`eager_attention_forward`), which
    takes the mask as an additive float mask."""
    generator = torch.Generator().manual_seed(1)
    query = torch.randn(2, 4, 1, 8, generator=generator)
    key, value = torch.randn(2, 2, 4, 9, 8, generator=generator)
    keep = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    keep[1, ..., 5:] = False
    additive = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
    module = nn.Module().eval()
    expected, _ = eager_attention_forward(module, query, key, value, additive, scaling=8**-0.5)
    fast = cpu_speedups._single_query_attention(query, key, value, keep, 8**-0.5)
    torch.testing.assert_close(fast, expected)


def test_decoding_step_attention_keeps_dropout_and_half_precision_with_sdpa(monkeypatch):
    """Attention dropout (a model in training mode under no_grad) and bf16 steps go to SDPA itself."""
    calls = []
    monkeypatch.setattr(cpu_speedups, "sdpa_attention_forward", lambda *args, **kwargs: calls.append(kwargs))
    monkeypatch.setattr(cpu_speedups, "_single_query_attention", lambda *args: "fast")
    query, key, value = torch.randn(3, 1, 2, 1, 8)
    module = nn.Module()
    with torch.no_grad():
        assert cpu_speedups.sdpa_with_cpu_decoding_steps(module, query, key, value, None)[0] == "fast"
        cpu_speedups.sdpa_with_cpu_decoding_steps(module, query, key, value, None, dropout=0.5)
        half = (tensor.bfloat16() for tensor in (query, key, value))
        cpu_speedups.sdpa_with_cpu_decoding_steps(module, *half, None)
    assert [call["dropout"] for call in calls] == [0.5, 0.0]


def test_cpu_decoding_attention_is_registered_under_its_own_name_and_sdpa_stays_transformers():
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    name = cpu_speedups.CPU_DECODING_ATTENTION
    assert ALL_ATTENTION_FUNCTIONS[name] is cpu_speedups.sdpa_with_cpu_decoding_steps
    assert ALL_MASK_ATTENTION_FUNCTIONS[name] is sdpa_mask
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is not cpu_speedups.sdpa_with_cpu_decoding_steps


def test_a_model_prepared_for_cpu_decoding_and_within_cpu_decoding_then_as_it_was():
    """`cpu_decoding` puts CPULinear layers and the CPU decoding attention in place for the block only;
    `prepare_for_cpu_decoding` for good. The weights are the model's own either way."""
    model = tiny_model(attn_implementation="sdpa")
    weights = {name: p for name, p in model.named_parameters()}
    with cpu_speedups.cpu_decoding(model):
        assert model.config._attn_implementation == cpu_speedups.CPU_DECODING_ATTENTION
        assert type(model.lm_head) is cpu_speedups.CPULinear
        assert type(model.model.encoder.layers[0].self_attn.q_proj) is cpu_speedups.CPULinear
        assert {name: p for name, p in model.named_parameters()} == weights
    assert model.config._attn_implementation == "sdpa"
    assert not any(type(module) is cpu_speedups.CPULinear for module in model.modules())
    cpu_speedups.prepare_for_cpu_decoding(model)
    assert type(model.lm_head) is cpu_speedups.CPULinear
    assert model.config._attn_implementation == cpu_speedups.CPU_DECODING_ATTENTION
    assert {name: p for name, p in model.named_parameters()} == weights


def test_beam_reordering_fills_a_free_position_and_equals_plain_reordering(monkeypatch):
    """Beam search reorders the self-attention cache into buffers with one free position, which the next
    step fills instead of concatenating: same scores and sequences as transformers' own reordering."""
    model = tiny_model(seed=2)
    src, _ = random_batch()
    kwargs = dict(max_new_tokens=10, num_beams=4, num_return_sequences=4, output_scores=True)
    kwargs["return_dict_in_generate"] = True
    concatenations: list[int] = []
    original_update = DynamicLayer.update

    def counted_update(self, key_states, *args, **kw):
        if type(self) is DynamicLayer or getattr(self, "_free_buffers", None) is None:
            concatenations.append(1)
        return original_update(self, key_states, *args, **kw)

    monkeypatch.setattr(DynamicLayer, "update", counted_update)
    filled = model.generate(input_ids=src, cache=cpu_speedups.CPUDecodingCache.for_model(model), **kwargs)
    layers = model.config.decoder_layers
    # Only the first step concatenates: into each self-attention and each cross-attention layer.
    assert len(concatenations) == 2 * layers
    plain = model.generate(input_ids=src, **kwargs)
    # transformers' way: the first step as above, then 9 more steps concatenating into self-attention.
    assert len(concatenations) == 2 * layers + (2 * layers + 9 * layers)
    assert torch.equal(filled.sequences, plain.sequences)
    torch.testing.assert_close(filled.sequences_scores, plain.sequences_scores)


@pytest.mark.parametrize("enabled", [True, False])
def test_labels_of_another_length_than_the_decoder_inputs_are_refused_in_one_line(monkeypatch, enabled):
    monkeypatch.setattr(cpu_speedups, "ENABLED", enabled)
    src, tgt = random_batch()
    model = tiny_model().train()
    message = r"labels have shape \(3, 8\) but the decoder gave logits for \(3, 7\) positions"
    with pytest.raises(ValueError, match=message):
        model(input_ids=src, decoder_input_ids=tgt, labels=torch.cat([tgt, tgt[:, :1]], dim=1))


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_fast_dropout_masks_keep_one_minus_p_and_scale_like_dropout(p):
    """Inverted dropout (Section 5.4): kept elements are x / (1 - p), dropped ones 0, the gradient is the
    same mask; each element is kept with probability 1 - p, independently of its neighbour drawn from the
    same 64-bit integer; the masks follow torch's seed."""
    dropout = cpu_speedups.FastMaskDropout(p).train()
    x = torch.randn(63, 33, 97, requires_grad=True)  # an odd element count: half of the last draw unused
    torch.manual_seed(1)
    out = dropout(x)
    kept = out != 0
    count = x.numel()
    assert abs(kept.double().mean().item() - (1 - p)) < 5 * math.sqrt(p * (1 - p) / count)
    pairs = kept.flatten()[: count - 1].view(-1, 2)  # the two halves of each draw
    both = pairs.all(dim=1).double().mean().item()
    assert abs(both - (1 - p) ** 2) < 5 * math.sqrt((1 - p) ** 2 * (1 - (1 - p) ** 2) / pairs.shape[0])
    torch.testing.assert_close(out[kept], x[kept] / (1 - p))
    out.backward(torch.ones_like(out))
    torch.testing.assert_close(x.grad, kept.float() / (1 - p))
    torch.manual_seed(1)
    assert torch.equal(dropout(x), out)
    assert not torch.equal(dropout(x), out)
    assert torch.equal(dropout.eval()(x), x)


def test_fast_dropout_masks_apply_within_the_block_only_and_survive_checkpointing():
    src, tgt = random_batch()
    model = tiny_model(seed=3, dropout=0.3).train()
    before = {name: type(module) for name, module in model.named_modules()}
    torch.manual_seed(7)
    plain = model(input_ids=src, labels=tgt).loss
    with cpu_speedups.fast_dropout_masks(model):
        assert any(isinstance(m, cpu_speedups.FastMaskDropout) for m in model.modules())
        torch.manual_seed(7)
        fast = model(input_ids=src, labels=tgt).loss
        grads = []
        for checkpointing in (False, True):
            if checkpointing:
                model.activation_checkpointing_enable()
            model.zero_grad()
            torch.manual_seed(7)
            model(input_ids=src, labels=tgt).loss.backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        model.activation_checkpointing_disable()
    assert fast != plain  # other masks for the same seed: the fast path was taken
    for a, b in zip(*grads):  # the recomputation drew the same masks
        torch.testing.assert_close(a, b)
    assert {name: type(module) for name, module in model.named_modules()} == before
    assert "FastMaskDropout" not in str(model)


def test_a_reordered_cache_layer_that_is_cropped_concatenates_again():
    """A returned cache may be cropped or re-indexed by its user: the free position is then not used."""
    generator = torch.Generator().manual_seed(0)
    layer = DynamicLayer()
    layer.update(*torch.randn(2, 4, 2, 5, 3, generator=generator))
    beam_idx = torch.tensor([3, 0, 0, 1])
    reordered = cpu_speedups.FreePositionCacheLayer.reordered(layer, beam_idx)
    torch.testing.assert_close(reordered.keys, layer.keys[beam_idx])
    reordered.crop(-2)
    new_key, new_value = torch.randn(2, 4, 2, 1, 3, generator=generator)
    keys, values = reordered.update(new_key, new_value)
    torch.testing.assert_close(keys, torch.cat([layer.keys[beam_idx][:, :, :3], new_key], dim=-2))
    torch.testing.assert_close(values, torch.cat([layer.values[beam_idx][:, :, :3], new_value], dim=-2))
