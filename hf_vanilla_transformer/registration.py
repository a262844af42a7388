"""The model's entries in transformers' public registries: AutoConfig, AutoModel, AutoModelForSeq2SeqLM and
the pipeline registry (task "seq2seq-translation"), and the marks that make `save_pretrained` write the
model's code next to its weights, so that people without the package load such folders or Hub repos with
`trust_remote_code=True`.

Registering imports torch and the model's code, so it happens when something needs it, not when the package
is imported: when one of the package's model names is first used (`from hf_vanilla_transformer import
VanillaTransformerConfig` registers the config, a model class registers the models and the pipeline), when
the package's own tools load a model or a tokenizer, or when a user calls `register_auto_classes()` before
loading a folder with transformers' Auto classes.
"""

from functools import cache


@cache
def register_config() -> None:
    """Register the config with AutoConfig, and mark it so that `save_pretrained` writes its code."""
    from transformers import AutoConfig

    from .vanilla_transformer.configuration_vanilla_transformer import VanillaTransformerConfig

    AutoConfig.register(VanillaTransformerConfig.model_type, VanillaTransformerConfig, exist_ok=True)
    VanillaTransformerConfig.register_for_auto_class()


@cache
def register_auto_classes() -> None:
    """Register the config, both models and the translation pipeline with transformers, so that
    `AutoConfig`, `AutoModel`, `AutoModelForSeq2SeqLM`, `AutoTokenizer` and
    `pipeline("seq2seq-translation", ...)` load this package's folders without remote code. Idempotent."""
    from transformers import AutoModel, AutoModelForSeq2SeqLM

    from .translation_pipeline import register_translation_pipeline
    from .vanilla_transformer.configuration_vanilla_transformer import VanillaTransformerConfig
    from .vanilla_transformer.modeling_vanilla_transformer import (
        VanillaTransformerForConditionalGeneration,
        VanillaTransformerModel,
    )

    register_config()
    AutoModel.register(VanillaTransformerConfig, VanillaTransformerModel, exist_ok=True)
    AutoModelForSeq2SeqLM.register(
        VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, exist_ok=True
    )
    VanillaTransformerModel.register_for_auto_class("AutoModel")
    VanillaTransformerForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")
    register_translation_pipeline()
