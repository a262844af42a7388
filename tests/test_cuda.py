"""The model on a CUDA GPU: the same logits and beam-search outputs as transformers' Marian there, and the
same loss and gradients as on the CPU. Skipped where torch finds no CUDA device."""

import pytest
import torch
from conftest import tiny_model
from test_marian_reference import random_marian

from hf_vanilla_transformer.conversion import convert_marian
from hf_vanilla_transformer.training import loss as training_loss

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def full_float32_products():
    """TF32 rounds float32 products to 10 mantissa bits; comparisons at 1e-4 need IEEE float32. A GPU
    training run in the same process switches TF32 on, so the setting is restored after each test."""
    previous = torch.backends.fp32_precision
    torch.backends.fp32_precision = "ieee"
    yield
    torch.backends.fp32_precision = previous


def source_batch(seed: int, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 60, shape, generator=generator)
    mask = torch.ones_like(src)
    mask[0, shape[1] // 2 :] = 0
    return src, mask


@pytest.mark.parametrize("activation", ["relu", "swish"])
def test_logits_match_marian_on_cuda(activation):
    marian = random_marian(activation)
    ours = convert_marian(marian).to(CUDA)
    marian = marian.to(CUDA)
    src, mask = source_batch(1, (3, 11))
    tgt = torch.randint(1, 95, (3, 8), generator=torch.Generator().manual_seed(2))
    inputs = dict(input_ids=src.to(CUDA), attention_mask=mask.to(CUDA), decoder_input_ids=tgt.to(CUDA))
    with torch.no_grad():
        expected = marian(**inputs).logits
        actual = ours(**inputs).logits
    assert actual.device.type == "cuda"
    assert (actual - expected).abs().max().item() <= 1e-4


@pytest.mark.parametrize("num_beams", [1, 4])
def test_generation_matches_marian_on_cuda(num_beams):
    marian = random_marian()
    ours = convert_marian(marian).to(CUDA)
    marian = marian.to(CUDA)
    src, mask = source_batch(3, (4, 9))
    src[0, 4:] = 95
    kwargs = dict(
        input_ids=src.to(CUDA), attention_mask=mask.to(CUDA), num_beams=num_beams, max_new_tokens=12
    )
    assert torch.equal(ours.generate(**kwargs, do_sample=False), marian.generate(**kwargs, do_sample=False))


def loss_and_gradients(model, src, mask, labels):
    model.zero_grad()
    loss = model(input_ids=src, attention_mask=mask, labels=labels).loss
    loss.backward()
    return loss.detach(), {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def test_training_loss_and_gradients_on_cuda_match_the_cpu():
    """The label-smoothed loss (Section 5.4) and its gradient, with padded labels: the CPU computes them
    through its own speed-ups, the GPU through plain torch; both must agree."""
    model = tiny_model(seed=0, P_drop=0.0).train()
    src, mask = source_batch(4, (4, 10))
    labels = torch.randint(4, 60, (4, 7), generator=torch.Generator().manual_seed(5))
    labels[1, 4:] = -100
    cpu_loss, cpu_grads = loss_and_gradients(model, src, mask, labels)
    cuda_loss, cuda_grads = loss_and_gradients(model.to(CUDA), src.to(CUDA), mask.to(CUDA), labels.to(CUDA))
    assert abs(cuda_loss.item() - cpu_loss.item()) <= 1e-5
    for name, grad in cpu_grads.items():
        assert (cuda_grads[name].cpu() - grad).abs().max().item() <= 1e-5, name


def test_bf16_autocast_on_cuda_keeps_the_float32_loss():
    """bf16 autocast, as GPU training runs it, changes the loss only by rounding, with a finite gradient."""
    model = tiny_model(seed=0, P_drop=0.0).to(CUDA).train()
    src, mask = source_batch(6, (8, 12))
    labels = torch.randint(4, 60, (8, 9), generator=torch.Generator().manual_seed(7))
    batch = dict(input_ids=src.to(CUDA), attention_mask=mask.to(CUDA), labels=labels.to(CUDA))
    full = model(**batch).loss
    with torch.autocast("cuda", dtype=torch.bfloat16):
        half = model(**batch).loss
    half.backward()
    assert half.dtype == torch.float32
    assert abs(half.item() - full.item()) <= 2e-2 * full.item()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_loss_on_cuda_equals_torch_cross_entropy(monkeypatch, dtype):
    """The chunked label-smoothed loss on a GPU (as benchmarks/bench_loss.py measures it there), chunk
    boundaries included: the same loss and gradient as torch's cross_entropy on float32 logits."""
    vocab = 50
    monkeypatch.setitem(training_loss._CROSS_ENTROPY_CHUNK_BYTES, "cuda", 3 * 4 * vocab)
    generator = torch.Generator(CUDA).manual_seed(0)
    logits = torch.randn(10, vocab, device=CUDA, generator=generator).to(dtype).requires_grad_()
    labels = torch.randint(0, vocab, (10,), device=CUDA, generator=generator)
    labels[2:4] = -100
    loss = training_loss.chunked_label_smoothed_cross_entropy_sum(logits, labels, 0.1)
    loss.backward()
    reference_logits = logits.detach().float().requires_grad_()
    reference = torch.nn.functional.cross_entropy(
        reference_logits, labels, ignore_index=-100, label_smoothing=0.1, reduction="sum"
    )
    reference.backward()
    torch.testing.assert_close(loss, reference)
    torch.testing.assert_close(logits.grad, reference_logits.grad.to(dtype))


def test_packed_flex_attention_trains_as_padded_sdpa_on_cuda():
    """Packed rows with flex attention's block masks (`train --packed-row-length` with
    attn_implementation=flex_attention): the label-smoothed loss and every gradient those of the same pairs
    padded one a row under SDPA."""
    from test_packing import NO_DROPOUT, PAD, VOCAB, padded_batch, random_pairs

    from hf_vanilla_transformer.training.packing import pack_pairs, with_packed_masks

    pairs = random_pairs(24, seed=3)
    # Heads of 16: Inductor's flex attention kernels take no narrower ones.
    model = tiny_model(vocab_size=VOCAB, pad_token_id=PAD, h=2, max_position_embeddings=256, **NO_DROPOUT)
    model = model.to(CUDA).train()
    segments = pack_pairs(pairs, 5, 128, 128, PAD, model.config.decoder_start_token_id).segment_inputs()
    on_cuda = {key: value.to(CUDA) for key, value in segments.items()}
    packed = with_packed_masks(on_cuda, attn_implementation="flex_attention")
    padded = {key: value.to(CUDA) for key, value in padded_batch(pairs).items()}
    results = []
    for attention, batch in (("flex_attention", packed), ("sdpa", padded)):
        model.set_attn_implementation(attention)
        model.zero_grad()
        logits = model(**batch).logits
        total = training_loss.label_smoothed_cross_entropy(logits, batch["labels"], 0.1, num_items_in_batch=1)
        total.backward()
        results.append((total.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}))
    (packed_total, packed_grads), (padded_total, padded_grads) = results
    torch.testing.assert_close(packed_total, padded_total, rtol=1e-5, atol=1e-5)
    for name, gradient in packed_grads.items():
        torch.testing.assert_close(gradient, padded_grads[name], rtol=1e-4, atol=1e-5, msg=name)


def test_packed_step_replayed_as_cuda_graphs_trains_as_the_eager_one():
    """The packed compiled step in torch.compile's reduce-overhead mode (CUDA graphs, as
    `bench_packing.py --compile-mode reduce-overhead` measures it): over three steps with the same batches
    and Adam, the same losses as the eager step's."""
    from test_packing import NO_DROPOUT, PAD, VOCAB, random_pairs

    from hf_vanilla_transformer.training.compilation import CompiledTrainingLoss, forward_and_loss
    from hf_vanilla_transformer.training.packing import pack_pairs

    packed = [pack_pairs(random_pairs(20, seed=seed), 4, 128, 128, PAD, 0) for seed in range(3)]
    batches = [{key: value.to(CUDA) for key, value in batch.model_inputs().items()} for batch in packed]
    compiled = CompiledTrainingLoss(0.1, static_shapes=True, mode="reduce-overhead")

    def eager(model, batch):
        return forward_and_loss(model, batch, 0.1, None)

    losses = []
    for step in (eager, lambda model, batch: compiled(model, batch, None)):
        model = tiny_model(vocab_size=VOCAB, pad_token_id=PAD, max_position_embeddings=256, **NO_DROPOUT)
        model = model.to(CUDA).train()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        run = []
        for batch in batches:
            loss = step(model, batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            run.append(loss.detach().clone())
        losses.append(torch.stack(run))
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=1e-4)
