"""transformers' own common tests for our two model classes, as tests/models/marian/test_modeling_marian.py
runs them for Marian: `ModelTesterMixin`, `ConfigTester` and a `GenerationTesterMixin`, with Marian's
skips only (`transformers_suite` says where each comes from).

`PipelineTesterMixin` does not apply: its tests load tiny checkpoints of each architecture from the Hub,
and its module reads tests/utils/tiny_model_summary.json, which the sdist does not hold. The package's own
pipeline is tested in test_compile_and_pipeline.py.
"""

import tempfile
import unittest

import pytest
import torch
import transformers_suite
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
    MODEL_MAPPING_NAMES,
)
from transformers.testing_utils import torch_device

from hf_vanilla_transformer import (
    VanillaTransformerConfig,
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerModel,
)
from hf_vanilla_transformer.vanilla_transformer.modeling_vanilla_transformer import (
    OUTPUT_CACHE_FIELD,
    VanillaTransformerDecoder,
    VanillaTransformerEncoder,
)

suite = transformers_suite.load()
ids_tensor = suite.ids_tensor
MODEL_TYPE = VanillaTransformerConfig.model_type


@pytest.fixture(autouse=True, scope="module")
def names_in_the_auto_tables():
    """transformers' common tests tell a base model from one with a language-modeling head by the class
    names in the Auto classes' tables (a base model is not trained; a head gets labels). Our classes stand
    there for this module's tests, as every in-tree model's names do; `AutoModel.register` keeps them in
    another table, which the tests do not read."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(MODEL_MAPPING_NAMES, MODEL_TYPE, VanillaTransformerModel.__name__)
        patch.setitem(
            MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
            MODEL_TYPE,
            VanillaTransformerForConditionalGeneration.__name__,
        )
        yield


class VanillaTransformerModelTester:
    """Marian's tester's sizes: 2+2 layers, d_model 16, 4 heads, d_ff 4, GELU, dropout 0.1."""

    def __init__(
        self,
        parent: unittest.TestCase,
        batch_size: int = 13,
        seq_length: int = 7,
        is_training: bool = True,
        vocab_size: int = 99,
        hidden_size: int = 16,
        num_hidden_layers: int = 2,
        num_attention_heads: int = 4,
        intermediate_size: int = 4,
        max_position_embeddings: int = 100,
        eos_token_id: int = 2,
        pad_token_id: int = 1,
        bos_token_id: int = 0,
        decoder_start_token_id: int = 3,
    ) -> None:
        self.parent = parent
        self.batch_size = batch_size
        self.seq_length = seq_length
        self.is_training = is_training
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.max_position_embeddings = max_position_embeddings
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.bos_token_id = bos_token_id
        self.decoder_start_token_id = decoder_start_token_id

    def get_config(self) -> VanillaTransformerConfig:
        return VanillaTransformerConfig(
            vocab_size=self.vocab_size,
            d_model=self.hidden_size,
            encoder_layers=self.num_hidden_layers,
            decoder_layers=self.num_hidden_layers,
            encoder_attention_heads=self.num_attention_heads,
            decoder_attention_heads=self.num_attention_heads,
            encoder_ffn_dim=self.intermediate_size,
            decoder_ffn_dim=self.intermediate_size,
            activation_function="gelu",
            dropout=0.1,
            attention_dropout=0.1,
            max_position_embeddings=self.max_position_embeddings,
            eos_token_id=self.eos_token_id,
            bos_token_id=self.bos_token_id,
            pad_token_id=self.pad_token_id,
            decoder_start_token_id=self.decoder_start_token_id,
        )

    def prepare_config_and_inputs(self) -> tuple[VanillaTransformerConfig, dict]:
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size).clamp(3)
        input_ids[:, -1] = self.eos_token_id
        decoder_input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        attention_mask = input_ids.ne(self.pad_token_id)
        inputs = {
            "input_ids": input_ids,
            "decoder_input_ids": decoder_input_ids,
            "attention_mask": attention_mask,
            "decoder_attention_mask": attention_mask,
        }
        return self.get_config(), inputs

    def prepare_config_and_inputs_for_common(self) -> tuple[VanillaTransformerConfig, dict]:
        return self.prepare_config_and_inputs()

    def create_and_check_decoder_model_past_large_inputs(
        self, config: VanillaTransformerConfig, inputs: dict
    ) -> None:
        """The decoder alone, without encoder states: three new tokens on a cache give what the whole
        sequence gives."""
        decoder = VanillaTransformerModel(config).get_decoder().to(torch_device).eval()
        input_ids, attention_mask = inputs["input_ids"], inputs["attention_mask"]
        first = decoder(input_ids, attention_mask=attention_mask, use_cache=True)
        cache = getattr(first, OUTPUT_CACHE_FIELD)
        self.parent.assertEqual(cache.get_seq_length(), input_ids.shape[1])

        next_tokens = ids_tensor((self.batch_size, 3), config.vocab_size)
        next_attention = ids_tensor((self.batch_size, 3), 2)
        whole_ids = torch.cat([input_ids, next_tokens], dim=-1)
        whole_attention = torch.cat([attention_mask, next_attention], dim=-1)
        without_cache = decoder(whole_ids, attention_mask=whole_attention).last_hidden_state
        with_cache = decoder(next_tokens, attention_mask=whole_attention, cache=cache).last_hidden_state
        self.parent.assertEqual(with_cache.shape[1], next_tokens.shape[1])
        self.parent.assertEqual(cache.get_seq_length(), whole_ids.shape[1])
        torch.testing.assert_close(with_cache, without_cache[:, -3:], atol=1e-3, rtol=0)

    def check_encoder_decoder_model_standalone(self, config: VanillaTransformerConfig, inputs: dict) -> None:
        """The encoder and decoder saved and loaded on their own give what they gave inside the model."""
        model = VanillaTransformerModel(config).to(torch_device).eval()
        outputs = model(**inputs)
        with tempfile.TemporaryDirectory() as folder:
            model.get_encoder().save_pretrained(folder)
            encoder = VanillaTransformerEncoder.from_pretrained(folder).to(torch_device)
        encoded = encoder(inputs["input_ids"], attention_mask=inputs["attention_mask"])[0]
        torch.testing.assert_close(encoded, outputs.encoder_last_hidden_state, atol=1e-3, rtol=0)
        with tempfile.TemporaryDirectory() as folder:
            model.get_decoder().save_pretrained(folder)
            decoder = VanillaTransformerDecoder.from_pretrained(folder).to(torch_device)
        decoded = decoder(
            input_ids=inputs["decoder_input_ids"],
            attention_mask=inputs["decoder_attention_mask"],
            encoder_hidden_states=outputs.encoder_last_hidden_state,
            encoder_attention_mask=inputs["attention_mask"],
        )[0]
        torch.testing.assert_close(decoded, outputs.last_hidden_state, atol=1e-3, rtol=0)


class VanillaTransformerModelTest(suite.ModelTesterMixin, suite.GenerationTesterMixin, unittest.TestCase):
    all_model_classes = (VanillaTransformerModel, VanillaTransformerForConditionalGeneration)
    is_encoder_decoder = True
    fx_compatible = False
    test_missing_keys = False

    def setUp(self) -> None:
        self.model_tester = VanillaTransformerModelTester(self)
        self.config_tester = suite.ConfigTester(self, config_class=VanillaTransformerConfig)

    def test_config(self) -> None:
        self.config_tester.run_common_tests()

    def test_save_load_strict(self) -> None:
        config, _ = self.model_tester.prepare_config_and_inputs()
        for model_class in self.all_model_classes:
            model = model_class(config)
            with tempfile.TemporaryDirectory() as folder:
                model.save_pretrained(folder)
                _, info = model_class.from_pretrained(folder, output_loading_info=True)
            self.assertEqual(info["missing_keys"], set())

    def test_decoder_model_past_with_large_inputs(self) -> None:
        self.model_tester.create_and_check_decoder_model_past_large_inputs(
            *self.model_tester.prepare_config_and_inputs()
        )

    def test_encoder_decoder_model_standalone(self) -> None:
        self.model_tester.check_encoder_decoder_model_standalone(
            *self.model_tester.prepare_config_and_inputs_for_common()
        )

    def test_share_encoder_decoder_embeddings(self) -> None:
        config, _ = self.model_tester.prepare_config_and_inputs()
        for model_class in self.all_model_classes:
            model = model_class(config)
            self.assertIs(model.get_encoder().embed_tokens.weight, model.get_decoder().embed_tokens.weight)

        config.share_encoder_decoder_embeddings = False
        for model_class in self.all_model_classes:
            model = model_class(config)
            self.assertIsNot(model.get_encoder().embed_tokens.weight, model.get_decoder().embed_tokens.weight)

        config, _ = self.model_tester.prepare_config_and_inputs()
        for model_class in self.all_model_classes:
            with tempfile.TemporaryDirectory() as folder:
                model_class(config).save_pretrained(folder)
                model = model_class.from_pretrained(folder, share_encoder_decoder_embeddings=False)
            self.assertIsNot(model.get_encoder().embed_tokens.weight, model.get_decoder().embed_tokens.weight)

    def test_resize_decoder_token_embeddings(self) -> None:
        config, _ = self.model_tester.prepare_config_and_inputs()
        for model_class in self.all_model_classes:
            with self.assertRaises(ValueError):
                model_class(config).resize_decoder_token_embeddings(config.vocab_size + 1)

        config.share_encoder_decoder_embeddings = False
        for model_class in self.all_model_classes:
            model = model_class(config)
            model.resize_decoder_token_embeddings(config.vocab_size + 1)
            self.assertEqual(
                model.get_decoder().embed_tokens.weight.shape, (config.vocab_size + 1, config.d_model)
            )

        config, _ = self.model_tester.prepare_config_and_inputs()
        config.share_encoder_decoder_embeddings = False
        model = VanillaTransformerForConditionalGeneration(config)
        model.resize_decoder_token_embeddings(config.vocab_size + 1)
        self.assertEqual(model.lm_head.weight.shape, (config.vocab_size + 1, config.d_model))
