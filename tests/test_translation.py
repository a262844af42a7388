"""translation.py: int8 dynamic quantization for CPU decoding."""

import pytest
import torch
from conftest import tiny_model
from torch import nn

from hf_vanilla_transformer.inference.translation import quantize_int8
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
