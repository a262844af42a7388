"""The model against the paper's formulas and against itself under padding, caching and precision."""

import math

import pytest
import torch
from conftest import tiny_model
from transformers import AutoModelForSeq2SeqLM, CompileConfig

from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration, sinusoidal_position_encoding
from hf_vanilla_transformer.vanilla_transformer.modeling_vanilla_transformer import OUTPUT_CACHE_FIELD

BOS, PAD, EOS = 0, 1, 2


def random_batch(batch: int = 3, src_len: int = 9, tgt_len: int = 7, vocab: int = 64, seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (batch, src_len), generator=generator)
    tgt = torch.randint(4, vocab, (batch, tgt_len), generator=generator)
    return src, tgt


def pad(rows: list[torch.Tensor], side: str = "right") -> tuple[torch.Tensor, torch.Tensor, list[slice]]:
    """The rows padded to one width on `side`, their attention mask, and where each row's tokens are."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    spans = [slice(0, len(r)) if side == "right" else slice(width - len(r), width) for r in rows]
    for i, (row, span) in enumerate(zip(rows, spans)):
        ids[i, span] = row
        mask[i, span] = 1
    return ids, mask, spans


# Section 3.5 -----------------------------------------------------------------------------------------


def test_sinusoidal_encoding_is_the_papers_formula():
    table = sinusoidal_position_encoding(50, 128)
    for pos in (0, 1, 7, 49):
        for i in range(64):
            angle = pos / 10000 ** (2 * i / 128)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_marian_layout_matches_transformers_marian():
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    marian = MarianSinusoidalPositionalEmbedding(40, 32).create_weight()
    torch.testing.assert_close(
        sinusoidal_position_encoding(40, 32, layout="marian"), marian, rtol=0, atol=1e-6
    )


def test_positions_past_the_table_are_computed_exactly():
    short, long = tiny_model(max_position_embeddings=8), tiny_model(max_position_embeddings=64)
    src, tgt = random_batch(src_len=20, tgt_len=15)
    with torch.no_grad():
        a = short(input_ids=src, decoder_input_ids=tgt).logits
        b = long(input_ids=src, decoder_input_ids=tgt).logits
    torch.testing.assert_close(a, b)


def test_learned_positions_past_the_table_raise():
    model = tiny_model(position_embedding_type="learned", max_position_embeddings=8)
    src, tgt = random_batch(src_len=12)
    with pytest.raises(ValueError, match="Position 11 is past the 8 learned position embeddings"):
        model(input_ids=src, decoder_input_ids=tgt)


def test_a_static_cache_decodes_past_the_table_as_a_dynamic_one_does():
    model = tiny_model(max_position_embeddings=8)
    src, _ = random_batch(batch=2, src_len=5)
    kwargs = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False)
    dynamic = model.generate(input_ids=src, **kwargs)
    static = model.generate(input_ids=src, cache_implementation="static", **kwargs)
    assert dynamic.shape[1] == 13
    assert torch.equal(dynamic, static)


def test_a_static_cache_longer_than_learned_positions_is_refused():
    model = tiny_model(position_embedding_type="learned", max_position_embeddings=8)
    src, _ = random_batch(batch=1, src_len=5)
    with pytest.raises(ValueError, match="learned position embeddings.*static cache's max_cache_len"):
        model.generate(input_ids=src, max_new_tokens=12, do_sample=False, cache_implementation="static")


@pytest.mark.parametrize("shape", [(0, 5), (2, 0)])
def test_empty_input_is_refused_in_one_line(shape):
    with pytest.raises(ValueError, match=r"Empty input of shape .* pass at least one sequence"):
        tiny_model()(input_ids=torch.full(shape, 5), decoder_input_ids=torch.zeros(1, 1, dtype=torch.long))


def test_a_config_asking_for_tuples_gets_tuples_of_the_same_outputs():
    model = tiny_model()
    src, tgt = random_batch()
    with torch.no_grad():
        logits = model(input_ids=src, decoder_input_ids=tgt).logits
        decoder_states = model.model(input_ids=src, decoder_input_ids=tgt).last_hidden_state
        greedy = model.generate(input_ids=src, max_new_tokens=5, do_sample=False)
        model.config.return_dict = False
        as_tuple = model(input_ids=src, decoder_input_ids=tgt)
        bare = model.model(input_ids=src, decoder_input_ids=tgt)
        explicit = model(input_ids=src, decoder_input_ids=tgt, return_dict=True)
    assert isinstance(as_tuple, tuple) and isinstance(bare, tuple)
    torch.testing.assert_close(as_tuple[0], logits, rtol=0, atol=0)
    torch.testing.assert_close(bare[0], decoder_states, rtol=0, atol=0)
    torch.testing.assert_close(explicit.logits, logits, rtol=0, atol=0)
    assert torch.equal(model.generate(input_ids=src, max_new_tokens=5, do_sample=False), greedy)


def test_sinusoids_survive_from_pretrained(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path)
    loaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path)
    torch.testing.assert_close(
        loaded.model.encoder.embed_positions.weight, sinusoidal_position_encoding(64, 32), rtol=0, atol=0
    )


# Section 3.4: embeddings ---------------------------------------------------------------------------


def test_one_matrix_for_source_target_and_softmax(tmp_path):
    model = tiny_model()
    shared = model.model.shared.weight
    assert model.model.encoder.embed_tokens.weight is shared
    assert model.model.decoder.embed_tokens.weight is shared
    assert model.lm_head.weight is shared
    model.save_pretrained(tmp_path)
    loaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path)
    assert loaded.lm_head.weight is loaded.model.shared.weight


def test_embeddings_are_scaled_by_sqrt_d_model():
    model = tiny_model(P_drop=0.0)
    src, _ = random_batch()
    encoder = model.model.encoder
    captured = {}
    hook = encoder.layers[0].register_forward_pre_hook(lambda m, args: captured.update(x=args[0]))
    with torch.no_grad():
        encoder(input_ids=src)
    hook.remove()
    expected = model.model.shared.weight[src] * math.sqrt(32) + sinusoidal_position_encoding(src.shape[1], 32)
    torch.testing.assert_close(captured["x"], expected)


# Section 3.1 / 3.2: masks, padding, causality --------------------------------------------------------


# Positions count from each sequence's first token, so padding on either side leaves the tokens' encodings as
# they are alone (fairseq pads sources on the left).
@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_batch_equals_each_input_alone(side):
    model = tiny_model()
    generator = torch.Generator().manual_seed(3)
    sources = [torch.randint(4, 64, (n,), generator=generator) for n in (9, 4, 6)]
    targets = [torch.randint(4, 64, (n,), generator=generator) for n in (3, 7, 5)]
    src, src_mask, src_spans = pad(sources, side)
    tgt, tgt_mask, tgt_spans = pad(targets, side)
    with torch.no_grad():
        batched = model(
            input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask
        )
        for i, (s, t) in enumerate(zip(sources, targets)):
            alone = model(input_ids=s[None], decoder_input_ids=t[None])
            torch.testing.assert_close(
                batched.encoder_last_hidden_state[i, src_spans[i]],
                alone.encoder_last_hidden_state[0],
                atol=1e-5,
                rtol=0,
            )
            torch.testing.assert_close(batched.logits[i, tgt_spans[i]], alone.logits[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("num_beams", [1, 4])
def test_padded_generation_equals_each_input_alone(num_beams, side):
    model = tiny_model()
    generator = torch.Generator().manual_seed(4)
    sources = [torch.randint(4, 64, (n,), generator=generator) for n in (9, 3, 6)]
    src, mask, _ = pad(sources, side)
    kwargs = dict(max_new_tokens=8, num_beams=num_beams, do_sample=False, early_stopping=True)
    batched = model.generate(input_ids=src, attention_mask=mask, **kwargs)
    for i, s in enumerate(sources):
        alone = model.generate(input_ids=s[None], **kwargs)[0]
        row = batched[i, : len(alone)]
        assert torch.equal(row, alone), (i, row, alone)
        assert (batched[i, len(alone) :] == PAD).all()


def test_decoder_is_causal():
    model = tiny_model()
    src, tgt = random_batch()
    changed = tgt.clone()
    changed[:, 4:] = torch.randint(4, 64, changed[:, 4:].shape)
    with torch.no_grad():
        a = model(input_ids=src, decoder_input_ids=tgt).logits
        b = model(input_ids=src, decoder_input_ids=changed).logits
    torch.testing.assert_close(a[:, :4], b[:, :4], atol=1e-6, rtol=0)
    assert not torch.allclose(a[:, 4:], b[:, 4:])


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fully_padded_row_gives_no_nan(attn, dtype):
    model = tiny_model(attn_implementation=attn).to(dtype)
    src, tgt = random_batch()
    mask = torch.ones_like(src)
    mask[1] = 0
    with torch.no_grad():
        out = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt)
    assert torch.isfinite(out.logits).all()


def test_eager_and_sdpa_agree():
    src, tgt = random_batch()
    mask = torch.ones_like(src)
    mask[0, 5:] = 0
    with torch.no_grad():
        eager = tiny_model(attn_implementation="eager")(
            input_ids=src, attention_mask=mask, decoder_input_ids=tgt
        )
        sdpa = tiny_model(attn_implementation="sdpa")(
            input_ids=src, attention_mask=mask, decoder_input_ids=tgt
        )
    torch.testing.assert_close(eager.logits, sdpa.logits, atol=1e-5, rtol=1e-5)


def test_output_attentions_are_probabilities_that_respect_masks():
    model = tiny_model(attn_implementation="eager")
    src, tgt = random_batch()
    mask = torch.ones_like(src)
    mask[0, 6:] = 0
    with torch.no_grad():
        out = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt, output_attentions=True)
    assert len(out.encoder_attentions) == len(out.decoder_attentions) == len(out.cross_attentions) == 2
    enc, dec, cross = out.encoder_attentions[0], out.decoder_attentions[0], out.cross_attentions[0]
    assert enc.shape == (3, 4, 9, 9) and dec.shape == (3, 4, 7, 7) and cross.shape == (3, 4, 7, 9)
    for weights in (enc, dec, cross):
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
    assert (enc[0, :, :, 6:] == 0).all() and (cross[0, :, :, 6:] == 0).all()
    assert (dec.triu(diagonal=1) == 0).all()


def test_bf16_autocast_forward_and_backward_are_finite():
    model = tiny_model().train()
    src, tgt = random_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=src, labels=tgt).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


# Generation and the KV cache -----------------------------------------------------------------------


# `past_key_values`, the name before transformers 5.24, still works, with transformers' deprecation warning.
@pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")
@pytest.mark.parametrize("cache_keyword", ["cache", "past_key_values"])
def test_incremental_decoding_equals_full_forward(cache_keyword):
    model = tiny_model()
    src, tgt = random_batch()
    with torch.no_grad():
        full = model(input_ids=src, decoder_input_ids=tgt).logits
        encoder_outputs = model.get_encoder()(input_ids=src)
        past, steps = None, []
        for t in range(tgt.shape[1]):
            out = model(
                encoder_outputs=encoder_outputs,
                decoder_input_ids=tgt[:, t : t + 1],
                use_cache=True,
                **{cache_keyword: past},
            )
            past = getattr(out, OUTPUT_CACHE_FIELD)
            steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)


def test_cross_attention_keys_are_computed_once():
    model = tiny_model()
    src, tgt = random_batch()
    calls = []
    hook = model.model.decoder.layers[0].encoder_attn.k_proj.register_forward_hook(lambda *a: calls.append(1))
    model.generate(input_ids=src, max_new_tokens=6, min_new_tokens=6, num_beams=1)
    hook.remove()
    assert len(calls) == 1


@pytest.mark.parametrize("num_beams", [1, 4])
def test_generation_with_cache_equals_without(num_beams):
    model = tiny_model()
    src, _ = random_batch()
    kwargs = dict(max_new_tokens=10, num_beams=num_beams, do_sample=False)
    cached = model.generate(input_ids=src, use_cache=True, **kwargs)
    uncached = model.generate(input_ids=src, use_cache=False, **kwargs)
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("num_beams", [1, 4])
def test_static_cache_equals_dynamic(num_beams):
    model = tiny_model()
    src, _ = random_batch()
    mask = torch.ones_like(src)
    mask[2, 6:] = 0
    kwargs = dict(attention_mask=mask, max_new_tokens=10, num_beams=num_beams, do_sample=False)
    dynamic = model.generate(input_ids=src, **kwargs)
    static = model.generate(input_ids=src, cache_implementation="static", **kwargs)
    assert torch.equal(dynamic, static)


def test_generate_compiles_the_static_cache_decoding_step_in_one_graph_with_the_same_tokens():
    """On a GPU, generate() with a static cache compiles the decoding step with fullgraph=True (CUDA
    graphs): the same path, forced on the CPU with a backend that compiles nothing, must trace the step
    without a graph break and decode the dynamic cache's tokens."""
    torch._dynamo.reset()
    model = tiny_model(seed=2)
    src, _ = random_batch()
    mask = torch.ones_like(src)
    mask[1, 5:] = 0
    kwargs = dict(attention_mask=mask, max_new_tokens=10, min_new_tokens=10, do_sample=False)
    expected = model.generate(input_ids=src, **kwargs)
    compile_config = CompileConfig(fullgraph=True, backend="aot_eager", dynamic=False)
    compile_config._compile_all_devices = True  # transformers' switch for compiling off CUDA
    torch._dynamo.utils.counters.clear()
    compiled = model.generate(
        input_ids=src, cache_implementation="static", compile_config=compile_config, **kwargs
    )
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # the compiled step ran
    assert not torch._dynamo.utils.counters["graph_break"]
    assert torch.equal(compiled, expected)


def test_beam_search_options():
    model = tiny_model()
    src, _ = random_batch()
    out = model.generate(
        input_ids=src,
        num_beams=4,
        num_return_sequences=3,
        length_penalty=0.6,
        early_stopping=True,
        max_new_tokens=8,
        return_dict_in_generate=True,
        output_scores=True,
    )
    assert out.sequences.shape[0] == 9
    assert (out.sequences[:, 0] == BOS).all()
    # The beams of one input are returned best first.
    scores = out.sequences_scores.view(3, 3)
    assert (scores[:, :-1] >= scores[:, 1:]).all()


# The loss (label smoothing is training's: test_loss.py), and under gradient accumulation ----------------


def test_model_loss_is_the_cross_entropy_of_the_labels_shifted_right():
    model = tiny_model()
    src, tgt = random_batch()
    tgt[1, 4:] = -100
    with torch.no_grad():
        out = model(input_ids=src, labels=tgt)
        decoder_input_ids = torch.cat([torch.full((3, 1), BOS), tgt[:, :-1]], dim=1).masked_fill(
            torch.cat([torch.zeros(3, 1, dtype=torch.bool), tgt[:, :-1] == -100], dim=1), PAD
        )
        logits = model(input_ids=src, decoder_input_ids=decoder_input_ids).logits
    torch.testing.assert_close(out.logits, logits)
    expected = torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), tgt.view(-1))
    torch.testing.assert_close(out.loss, expected)


def test_ignored_labels_become_padding_in_decoder_inputs():
    model = tiny_model()
    labels = torch.tensor([[5, 6, EOS, -100, -100]])
    assert model.prepare_decoder_input_ids_from_labels(labels).tolist() == [[BOS, 5, 6, EOS, PAD]]


def test_gradient_accumulation_equals_one_big_batch():
    model = tiny_model(P_drop=0.0).train()
    src, tgt = random_batch(batch=4)
    tgt[0, 4:] = -100
    tgt[3, 2:] = -100

    model.zero_grad()
    model(input_ids=src, labels=tgt).loss.backward()
    big = [p.grad.clone() for p in model.parameters()]

    model.zero_grad()
    items = (tgt != -100).sum()
    for half in (slice(0, 2), slice(2, 4)):
        model(input_ids=src[half], labels=tgt[half], num_items_in_batch=items).loss.backward()
    for g_big, p in zip(big, model.parameters()):
        torch.testing.assert_close(p.grad, g_big, atol=1e-6, rtol=1e-5)


def checkpointing_enable(model) -> None:
    """Gradient checkpointing on, under the name of the transformers release installed (before 5.23:
    `gradient_checkpointing_enable`)."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()


# With dropout, the recomputation must draw the same masks: checkpointing restores torch's RNG state.
@pytest.mark.parametrize("overrides", [{"P_drop": 0.0}, {"P_drop": 0.3}])
def test_gradient_checkpointing_gives_the_same_gradients(overrides):
    src, tgt = random_batch()
    grads, ffn_calls = [], []
    for checkpointing in (False, True):
        model = tiny_model(**overrides).train()
        if checkpointing:
            checkpointing_enable(model)
        calls: list[int] = []
        model.model.encoder.layers[0].ffn.register_forward_hook(lambda *a, calls=calls: calls.append(1))
        torch.manual_seed(7)
        model(input_ids=src, labels=tgt).loss.backward()
        grads.append([p.grad for p in model.parameters()])
        ffn_calls.append(len(calls))
    assert ffn_calls == [1, 2]  # checkpointing recomputes the layer in the backward pass
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def test_a_model_on_sdpa_returns_attention_weights_for_no_step():
    """SDPA gives no weights, so the decoding steps' matmul path must not give some of them either."""
    model = tiny_model(seed=1)
    model.set_attn_implementation("sdpa")
    src, _ = random_batch()
    out = model.generate(
        input_ids=src, max_new_tokens=3, output_attentions=True, return_dict_in_generate=True
    )
    steps = [*out.decoder_attentions, *out.cross_attentions]
    assert len(steps) == 6 and all(weights is None for step in steps for weights in step)


def test_inference_sees_updates_that_leave_version_counters_alone():
    """Fused optimizers update parameters in place without bumping their `_version`: no stacked Q/K/V
    weights (or anything else) may be kept from one inference call to the next."""
    src, tgt = random_batch()
    model = tiny_model().eval()
    with torch.no_grad():
        model(input_ids=src, decoder_input_ids=tgt)
    model.generate(src, num_beams=2, max_new_tokens=5)
    model.train()
    model(input_ids=src, labels=tgt).loss.backward()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1, fused=True)
    versions = [p._version for p in model.parameters()]
    optimizer.step()
    assert versions == [p._version for p in model.parameters()]  # the case this test is about
    model.eval()
    fresh = tiny_model().eval()
    fresh.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(
            model(input_ids=src, decoder_input_ids=tgt).logits,
            fresh(input_ids=src, decoder_input_ids=tgt).logits,
        )
    assert torch.equal(
        model.generate(src, num_beams=2, max_new_tokens=5), fresh.generate(src, num_beams=2, max_new_tokens=5)
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_loaded_in_half_precision_it_computes_in_it_and_agrees_with_float32(tmp_path, dtype):
    """`from_pretrained(dtype=...)`, as models are loaded on GPUs: every tensor of the forward pass in that
    dtype (the positional table is float32 until it is added), and the logits and greedy translations of the
    float32 model within the dtype's rounding: at each step the token chosen in half precision is one whose
    float32 logit is within that rounding of the float32 model's best."""
    model = tiny_model(seed=4)
    model.save_pretrained(tmp_path)
    half = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, dtype=dtype)
    assert {p.dtype for p in half.parameters()} == {dtype}
    src, tgt = random_batch()
    with torch.no_grad():
        expected = model(input_ids=src, decoder_input_ids=tgt)
        out = half(input_ids=src, decoder_input_ids=tgt)
    assert out.logits.dtype == out.encoder_last_hidden_state.dtype == dtype
    # Rounding of the dtype through a few layers: 8 units in the last place of the logits' scale.
    tolerance = 8 * torch.finfo(dtype).eps * expected.logits.abs().max()
    torch.testing.assert_close(out.logits.float(), expected.logits, atol=tolerance, rtol=0)

    generated = half.generate(src, max_new_tokens=6, num_beams=1, do_sample=False)
    with torch.no_grad():
        reference = model(input_ids=src, decoder_input_ids=generated[:, :-1]).logits
    chosen = reference.gather(-1, generated[:, 1:, None]).squeeze(-1)
    finished = (generated[:, :-1] == EOS).cumsum(-1) > 0  # steps after the end token are padding
    assert ((reference.max(-1).values - chosen <= 2 * tolerance) | finished).all()
