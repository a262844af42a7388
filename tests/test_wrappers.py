"""The model under the wrappers our users apply, against itself without them: accelerate's CPU and disk
offload, PEFT (LoRA, inputs_embeds), torch.compile with fullgraph=True, and threads sharing one model."""

import inspect
import threading

import pytest
import torch
from conftest import tiny_model
from transformers.cache_utils import DynamicCache
from transformers.generation import GenerationMixin

from hf_vanilla_transformer.training import loss as training_loss
from hf_vanilla_transformer.vanilla_transformer.generation_vanilla_transformer import PaperDecodingMixin


def random_batch(batch: int = 3, src_len: int = 9, tgt_len: int = 7, vocab: int = 64, seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (batch, src_len), generator=generator)
    tgt = torch.randint(4, vocab, (batch, tgt_len), generator=generator)
    return src, tgt


@pytest.mark.parametrize("offload", ["cpu", "disk"])
def test_accelerate_offload_gives_the_same_logits_and_beams(offload, tmp_path):
    from accelerate import cpu_offload, disk_offload

    src, tgt = random_batch()
    mask = torch.ones_like(src)
    mask[2, 5:] = 0
    reference = tiny_model(seed=4, output_bias=True)
    reference.final_logits_bias.normal_(generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = reference(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
    expected_beams = reference.generate(src, attention_mask=mask, num_beams=4, max_new_tokens=8)

    model = tiny_model(seed=4, output_bias=True)
    model.load_state_dict(reference.state_dict())
    if offload == "cpu":
        cpu_offload(model, execution_device=torch.device("cpu"))
    else:
        disk_offload(model, str(tmp_path / "offload"), execution_device=torch.device("cpu"))
    assert any(p.device.type == "meta" for p in model.parameters())  # the weights really are offloaded
    with torch.no_grad():
        logits = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
    beams = model.generate(src, attention_mask=mask, num_beams=4, max_new_tokens=8)
    assert torch.equal(beams, expected_beams)


@pytest.mark.parametrize("shared", [True, False])
def test_inputs_embeds_equal_input_ids_for_encoder_and_decoder(shared):
    overrides = {} if shared else dict(share_encoder_decoder_embeddings=False, decoder_vocab_size=48)
    model = tiny_model(seed=2, **overrides)
    src, tgt = random_batch(vocab=48)
    with torch.no_grad():
        expected = model(input_ids=src, decoder_input_ids=tgt).logits
        logits = model(
            inputs_embeds=model.get_input_embeddings()(src),
            decoder_inputs_embeds=model.get_decoder().embed_tokens(tgt),
        ).logits
    torch.testing.assert_close(logits, expected)
    embedded = model.generate(inputs_embeds=model.get_input_embeddings()(src), num_beams=2, max_new_tokens=6)
    assert torch.equal(embedded, model.generate(src, num_beams=2, max_new_tokens=6))


def test_torch_compile_fullgraph_training_forward_equals_eager(monkeypatch):
    """The model compiled whole, its own loss and the training loss over its logits: the same losses and
    gradients as eager. The chunked CPU loss runs outside the graph, never traced into it."""
    traced = []
    chunked_forward = training_loss._SmoothedCrossEntropySum.forward

    def recording_forward(*args):
        traced.append(torch.compiler.is_compiling())
        return chunked_forward(*args)

    monkeypatch.setattr(training_loss._SmoothedCrossEntropySum, "forward", staticmethod(recording_forward))
    torch._dynamo.reset()
    model = tiny_model(P_drop=0.0).train()
    src, tgt = random_batch(batch=2)
    compiled = torch.compile(model, fullgraph=True)
    results = []
    for module in (model, compiled):
        model.zero_grad()
        out = module(input_ids=src, labels=tgt)
        smoothed = training_loss.label_smoothed_cross_entropy(out.logits, tgt, 0.1)
        (out.loss + smoothed).backward()
        results.append((out.loss, smoothed, [p.grad.clone() for p in model.parameters()]))
    (eager_loss, eager_smoothed, eager_grads), (loss, smoothed, grads) = results
    torch.testing.assert_close(loss, eager_loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(smoothed, eager_smoothed, atol=1e-5, rtol=1e-5)
    for grad, expected in zip(grads, eager_grads):
        torch.testing.assert_close(grad, expected, atol=1e-5, rtol=1e-4)
    assert traced == [False, False]


def test_torch_compile_fullgraph_cached_decoding_step_equals_eager():
    torch._dynamo.reset()
    model = tiny_model(seed=1)
    src, tgt = random_batch(batch=2)
    with torch.no_grad():
        encoder_outputs = model.get_encoder()(input_ids=src)
        first = model(encoder_outputs=encoder_outputs, decoder_input_ids=tgt[:, :4], use_cache=True)
        step = dict(encoder_outputs=encoder_outputs, decoder_input_ids=tgt[:, 4:5], use_cache=True)
        cache = first.cache
        expected = model(cache=cache, **step).logits
        cache.crop(-1)
        compiled = torch.compile(model, fullgraph=True)
        logits = compiled(cache=cache, **step).logits
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)


def test_peft_lora_trains_and_the_merged_model_equals_the_adapter():
    peft = pytest.importorskip("peft", reason="PEFT is a test extra")
    model = tiny_model(seed=3, P_drop=0.0)
    lora = peft.get_peft_model(
        model,
        peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "out_proj"]),
    )
    layer = lora.base_model.model.model.encoder.layers[0].self_attn
    assert all(hasattr(getattr(layer, name), "lora_A") for name in ("q_proj", "k_proj", "v_proj", "out_proj"))
    src, tgt = random_batch()
    optimizer = torch.optim.Adam([p for p in lora.parameters() if p.requires_grad], lr=1e-2)
    lora.train()
    losses = []
    for _ in range(8):
        optimizer.zero_grad()
        loss = lora(input_ids=src, labels=tgt).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    lora.eval()
    with torch.no_grad():
        adapted = lora(input_ids=src, decoder_input_ids=tgt).logits
        merged = lora.merge_and_unload()
        torch.testing.assert_close(
            merged(input_ids=src, decoder_input_ids=tgt).logits, adapted, atol=1e-5, rtol=1e-4
        )


def test_threads_with_different_length_penalties_each_get_their_own():
    model = tiny_model(seed=5)
    src, _ = random_batch(batch=4, seed=3)
    kwargs = dict(num_beams=4, num_return_sequences=4, length_penalty=2.0, max_new_tokens=10)
    kwargs.update(output_scores=True, return_dict_in_generate=True)
    alone = {
        kind: model.generate(src, length_penalty_type=kind, **kwargs) for kind in ("gnmt", "transformers")
    }
    assert not torch.allclose(alone["gnmt"].sequences_scores, alone["transformers"].sequences_scores)
    barrier, failures = threading.Barrier(2, timeout=120), []

    def decode(kind: str) -> None:
        try:
            for _ in range(4):
                barrier.wait()
                out = model.generate(src, length_penalty_type=kind, **kwargs)
                if not torch.equal(out.sequences, alone[kind].sequences) or not torch.allclose(
                    out.sequences_scores, alone[kind].sequences_scores
                ):
                    failures.append(kind)
        except Exception as error:
            failures.append(f"{kind}: {error!r}")
            barrier.abort()  # the other thread stops waiting for this one

    threads = [threading.Thread(target=decode, args=(kind,)) for kind in ("gnmt", "transformers")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
        assert not thread.is_alive(), "a decoding thread did not finish"
    assert failures == []


def test_generate_keeps_transformers_positional_parameters():
    ours = list(inspect.signature(PaperDecodingMixin.generate).parameters.values())
    theirs = list(inspect.signature(GenerationMixin.generate).parameters.values())
    positional = [p.name for p in ours if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert positional == [p.name for p in theirs[: len(positional)]]
    keyword_only = {p.name for p in ours if p.kind == p.KEYWORD_ONLY}
    assert keyword_only == {"length_penalty_type", "max_length_offset"}


def test_a_plain_dynamic_cache_is_used_for_self_attention():
    model = tiny_model(seed=1)
    src, tgt = random_batch()
    with torch.no_grad():
        expected = model(input_ids=src, decoder_input_ids=tgt).logits
        cache = DynamicCache()
        first = model(input_ids=src, decoder_input_ids=tgt[:, :5], cache=cache, use_cache=True)
        second = model(input_ids=src, decoder_input_ids=tgt[:, 5:], cache=first.cache, use_cache=True)
    assert cache.get_seq_length() == tgt.shape[1]
    torch.testing.assert_close(
        torch.cat([first.logits, second.logits], dim=1), expected, atol=1e-5, rtol=1e-5
    )


def test_attention_implementation_can_be_set():
    model = tiny_model()
    model.set_attn_implementation("eager")
    assert model.config._attn_implementation == "eager"
