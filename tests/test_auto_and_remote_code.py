"""Save, reload through the Auto classes, and load without the package (remote code)."""

import json
import os
import subprocess
import sys
import textwrap

import torch
from conftest import tiny_model
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, GenerationConfig

from hf_vanilla_transformer import (
    VanillaTransformerConfig,
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerModel,
)


def test_save_load_round_trip_is_bit_exact(tmp_path):
    model = tiny_model()
    model.generation_config = GenerationConfig(
        num_beams=4,
        length_penalty=0.6,
        max_new_tokens=20,
        bos_token_id=0,
        eos_token_id=2,
        pad_token_id=1,
        decoder_start_token_id=0,
    )
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    assert not list(tmp_path.glob("*.bin")) and not list(tmp_path.glob("*.pt"))
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    assert type(loaded) is VanillaTransformerForConditionalGeneration
    original, reloaded = model.state_dict(), loaded.state_dict()
    assert original.keys() == reloaded.keys()
    for key in original:
        assert torch.equal(original[key], reloaded[key]), key
    assert loaded.generation_config.num_beams == 4 and loaded.generation_config.length_penalty == 0.6
    # The shared matrix is stored once.
    assert list(load_file(tmp_path / "model.safetensors")).count("model.shared.weight") == 1


def test_auto_classes_resolve_our_classes(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path)
    assert isinstance(AutoConfig.from_pretrained(tmp_path), VanillaTransformerConfig)
    base = AutoModel.from_pretrained(tmp_path)
    assert type(base) is VanillaTransformerModel
    torch.testing.assert_close(base.shared.weight, model.model.shared.weight, rtol=0, atol=0)
    config = AutoConfig.for_model(
        "vanilla_transformer", vocab_size=50, d_model=16, encoder_attention_heads=2, decoder_attention_heads=2
    )
    assert type(AutoModelForSeq2SeqLM.from_config(config)) is VanillaTransformerForConditionalGeneration


def test_saved_folder_carries_its_code(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["auto_map"]["AutoModelForSeq2SeqLM"] == (
        "modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration"
    )
    modeling = (tmp_path / "modeling_vanilla_transformer.py").read_text()
    assert "from .configuration_vanilla_transformer import" in modeling
    assert "hf_vanilla_transformer" not in modeling.replace("hf_vanilla_transformer/", "")


def test_remote_code_loads_without_the_package(tmp_path, shipped_onednn_sizes):
    model = tiny_model()
    model.save_pretrained(tmp_path / "model")
    src = torch.tensor([[5, 9, 13, 7, 3]])
    with torch.no_grad():
        expected_logits = model(input_ids=src, decoder_input_ids=torch.tensor([[0, 5, 9]])).logits
    expected_ids = model.generate(input_ids=src, num_beams=3, max_new_tokens=6)
    torch.save({"logits": expected_logits, "ids": expected_ids}, tmp_path / "expected.pt")

    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["hf_vanilla_transformer"] = None  # the package cannot be imported
        import torch
        from transformers import AutoModelForSeq2SeqLM
        try:
            AutoModelForSeq2SeqLM.from_pretrained({str(tmp_path / "model")!r})
        except ValueError as error:
            print("refused without trust_remote_code:", type(error).__name__)
        model = AutoModelForSeq2SeqLM.from_pretrained({str(tmp_path / "model")!r}, trust_remote_code=True)
        assert "hf_vanilla_transformer" not in type(model).__module__, type(model).__module__
        expected = torch.load({str(tmp_path / "expected.pt")!r})
        src = torch.tensor([[5, 9, 13, 7, 3]])
        with torch.no_grad():
            logits = model(input_ids=src, decoder_input_ids=torch.tensor([[0, 5, 9]])).logits
        assert torch.equal(logits, expected["logits"])
        assert torch.equal(model.generate(input_ids=src, num_beams=3, max_new_tokens=6), expected["ids"])
        from transformers import AutoModel
        bare = AutoModel.from_pretrained({str(tmp_path / "model")!r}, trust_remote_code=True)
        assert type(bare).__name__ == "VanillaTransformerModel", type(bare)
        assert torch.equal(bare.shared.weight, model.model.shared.weight)
        print("remote code OK", type(model).__module__)
        """
    )
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "remote code OK transformers_modules" in result.stdout
