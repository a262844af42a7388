"""Growing or shrinking the shared vocabulary keeps the model whole and loadable."""

import torch
from conftest import tiny_model

from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration


def test_resized_model_saves_loads_and_runs(tmp_path):
    for output_bias in (False, True):
        model = tiny_model(output_bias=output_bias)
        model.resize_token_embeddings(70)
        assert model.config.vocab_size == model.config.decoder_vocab_size == 70
        assert model.lm_head.weight is model.model.shared.weight
        logits = model(input_ids=torch.tensor([[5, 69, 2]]), decoder_input_ids=torch.tensor([[0, 69]])).logits
        assert logits.shape[-1] == 70
        model.save_pretrained(tmp_path / str(output_bias))
        loaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path / str(output_bias))
        again = loaded(input_ids=torch.tensor([[5, 69, 2]]), decoder_input_ids=torch.tensor([[0, 69]])).logits
        torch.testing.assert_close(again, logits)
