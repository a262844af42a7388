"""Growing or shrinking the vocabularies, shared or separate, keeps the model whole and loadable."""

import pytest
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


@pytest.mark.parametrize("tied", [True, False])
def test_separate_vocabularies_resize_each_side_on_its_own(tmp_path, tied):
    model = tiny_model(
        share_encoder_decoder_embeddings=False,
        tie_word_embeddings=tied,
        decoder_vocab_size=48,
        output_bias=True,
    )
    decoder_before = model.model.decoder.embed_tokens.weight.detach().clone()
    model.resize_token_embeddings(70)  # the source side alone
    assert (model.config.vocab_size, model.config.decoder_vocab_size) == (70, 48)
    assert model.model.encoder.embed_tokens.weight.shape[0] == 70
    assert torch.equal(model.model.decoder.embed_tokens.weight, decoder_before)
    assert model.lm_head.weight.shape[0] == model.final_logits_bias.shape[1] == 48

    model.resize_decoder_token_embeddings(52)
    assert (model.config.vocab_size, model.config.decoder_vocab_size) == (70, 52)
    assert model.model.decoder.embed_tokens.weight.shape[0] == model.lm_head.weight.shape[0] == 52
    assert model.lm_head.out_features == 52
    assert model.final_logits_bias.shape[1] == 52
    assert (model.lm_head.weight is model.model.decoder.embed_tokens.weight) == tied
    src, tgt = torch.tensor([[5, 69, 2]]), torch.tensor([[0, 51]])
    logits = model(input_ids=src, decoder_input_ids=tgt).logits
    assert logits.shape[-1] == 52
    model.save_pretrained(tmp_path)
    loaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path)
    torch.testing.assert_close(loaded(input_ids=src, decoder_input_ids=tgt).logits, logits)


def test_a_shared_vocabulary_has_no_separate_target_side_to_resize():
    with pytest.raises(ValueError, match="resize it with resize_token_embeddings"):
        tiny_model().resize_decoder_token_embeddings(70)
