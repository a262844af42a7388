"""torch.compile gives the same numbers, and pipeline("translation") drives the model end to end."""

import torch
from conftest import tiny_config, tiny_model
from transformers import pipeline

from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer import modeling_vanilla_transformer as modeling
from hf_vanilla_transformer.tokenization import train_shared_bpe_tokenizer


def test_torch_compile_matches_eager(monkeypatch):
    # Compiled, the loss must be torch's own: tracing the chunk loop unrolls it into the graph (minutes of
    # compiling at real batch sizes). The chunked loss records whether it ran while being traced.
    traced = []
    chunked_forward = modeling._SmoothedCrossEntropySum.forward

    def recording_forward(ctx, *args):
        traced.append(torch.compiler.is_compiling())
        return chunked_forward(ctx, *args)

    monkeypatch.setattr(modeling._SmoothedCrossEntropySum, "forward", staticmethod(recording_forward))
    model = tiny_model(P_drop=0.0).train()
    src = torch.randint(4, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    tgt = torch.randint(4, 64, (2, 6), generator=torch.Generator().manual_seed(1))
    eager_loss = model(input_ids=src, labels=tgt).loss
    eager_loss.backward()
    eager_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled = torch.compile(model)
    compiled_loss = compiled(input_ids=src, labels=tgt).loss
    compiled_loss.backward()
    torch.testing.assert_close(compiled_loss, eager_loss, atol=1e-5, rtol=1e-5)
    for p, g in zip(model.parameters(), eager_grads):
        torch.testing.assert_close(p.grad, g, atol=1e-5, rtol=1e-4)
    assert traced == [False]  # the eager step's loss only


def test_translation_pipeline(tmp_path):
    sentences = [
        "a dog runs in the park .",
        "ein hund rennt im park .",
        "a cat sleeps .",
        "eine katze schläft .",
    ]
    tokenizer = train_shared_bpe_tokenizer(sentences * 5, vocab_size=80, min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(tiny_config(vocab_size=len(tokenizer))).eval()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    translator = pipeline("translation", model=str(tmp_path), tokenizer=str(tmp_path))
    assert isinstance(translator.model, VanillaTransformerForConditionalGeneration)
    result = translator(["a dog runs .", "a cat sleeps ."], max_new_tokens=5, num_beams=2)
    inputs = tokenizer(["a dog runs .", "a cat sleeps ."], return_tensors="pt", padding=True)
    expected = tokenizer.batch_decode(
        model.generate(**inputs, max_new_tokens=5, num_beams=2), skip_special_tokens=True
    )
    assert [r["translation_text"] for r in result] == [e.strip() for e in expected]
