"""translation.py: int8 dynamic quantization for CPU decoding."""

import pytest
import torch
from conftest import tiny_model
from torch import nn

from hf_vanilla_transformer.tokenization import train_shared_bpe_tokenizer
from hf_vanilla_transformer.translation import quantize_int8, translate
from hf_vanilla_transformer.translation_pipeline import TARGET_TOKENIZER_DIR, find_target_tokenizer


def test_int8_copy_quantizes_every_projection_and_stays_close():
    model = tiny_model().eval()
    before = {name: p.clone() for name, p in model.state_dict().items()}
    quantized = quantize_int8(model)
    assert not [name for name, m in quantized.named_modules() if isinstance(m, nn.Linear)]
    assert isinstance(quantized.lm_head, torch.ao.nn.quantized.dynamic.Linear)
    for name, value in model.state_dict().items():  # the original is untouched
        assert torch.equal(value, before[name]), name

    src = torch.randint(4, 64, (3, 9), generator=torch.Generator().manual_seed(0))
    decoder_input_ids = torch.randint(4, 64, (3, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = model(input_ids=src, decoder_input_ids=decoder_input_ids).logits
        approximate = quantized(input_ids=src, decoder_input_ids=decoder_input_ids).logits
    # int8 weights (per-tensor scales) and inputs: a few percent of the logits' spread, not more.
    assert (approximate - reference).abs().max() < 0.05 * (reference.max() - reference.min())
    assert quantized.generate(src, num_beams=2, max_new_tokens=5).shape[0] == 3


def test_int8_needs_float32_weights_on_the_cpu():
    with pytest.raises(ValueError, match="float32"):
        quantize_int8(tiny_model().to(torch.bfloat16))


def test_a_model_built_in_memory_has_no_target_tokenizer(tmp_path, monkeypatch):
    """An in-memory model's name_or_path is "": the working directory is not its folder."""
    (tmp_path / TARGET_TOKENIZER_DIR).mkdir()
    monkeypatch.chdir(tmp_path)
    assert tiny_model().name_or_path == ""
    assert find_target_tokenizer("") is None


@pytest.mark.parametrize("where", ["call", "generation config"])
def test_several_hypotheses_per_sentence_are_refused_not_paired_with_other_sentences(where):
    """With num_return_sequences 3, generate() returns 3 rows per sentence; pairing rows with sentences
    would give sentence 1 sentence 0's second hypothesis. translate() refuses instead."""
    sentences = ["a b c", "d e", "f"]
    tokenizer = train_shared_bpe_tokenizer(sentences * 20, vocab_size=40, min_frequency=1)
    model = tiny_model(vocab_size=len(tokenizer))
    kwargs = {"num_beams": 3, "max_new_tokens": 4}
    if where == "call":
        kwargs["num_return_sequences"] = 3
    else:
        model.generation_config.num_return_sequences = 3
        model.generation_config.num_beams = 3
    with pytest.raises(ValueError, match="num_return_sequences is 3"):
        translate(model, tokenizer, sentences, progress=False, **kwargs)
    kwargs.pop("num_return_sequences", None)
    model.generation_config.num_return_sequences = 1
    assert len(translate(model, tokenizer, sentences, progress=False, **kwargs)) == len(sentences)
