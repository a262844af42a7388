"""pipeline("translation") drives the model end to end."""

import torch
from conftest import tiny_config
from transformers import pipeline

from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.tokenization import train_shared_bpe_tokenizer


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
