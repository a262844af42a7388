"""hf-vanilla-transformer: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a
first-class Hugging Face transformers model.

Importing the package registers the model with AutoConfig, AutoModel and AutoModelForSeq2SeqLM,
registers the translation pipeline under the task "seq2seq-translation" (transformers 5 reserves
"translation" for models whose config names their own pipeline code), and marks the classes so that
`save_pretrained` writes their code next to the weights: people without the package load such folders
or Hub repos with `trust_remote_code=True`.
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from .translation_pipeline import TranslationPipeline, register_translation_pipeline
from .vanilla_transformer.configuration_vanilla_transformer import VanillaTransformerConfig
from .vanilla_transformer.generation_vanilla_transformer import gnmt_length_penalty, paper_generation_config
from .vanilla_transformer.modeling_vanilla_transformer import (
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerModel,
    VanillaTransformerPreTrainedModel,
    sinusoidal_position_encoding,
)

AutoConfig.register(VanillaTransformerConfig.model_type, VanillaTransformerConfig, exist_ok=True)
AutoModel.register(VanillaTransformerConfig, VanillaTransformerModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(
    VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, exist_ok=True
)

VanillaTransformerConfig.register_for_auto_class()
VanillaTransformerModel.register_for_auto_class("AutoModel")
VanillaTransformerForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")
register_translation_pipeline()

__version__ = "0.1.0"

__all__ = [
    "TranslationPipeline",
    "VanillaTransformerConfig",
    "VanillaTransformerForConditionalGeneration",
    "VanillaTransformerModel",
    "VanillaTransformerPreTrainedModel",
    "gnmt_length_penalty",
    "paper_generation_config",
    "sinusoidal_position_encoding",
]
