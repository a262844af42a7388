"""hf-vanilla-transformer: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a
first-class Hugging Face transformers model.

The package is lazy, as transformers' own top level is: `import hf_vanilla_transformer` imports neither torch
nor transformers, and each name below is imported on first use. A name registers the model with transformers
as it is first resolved (`registration`): the config with AutoConfig; every other name the config and both
models with AutoConfig, AutoModel and AutoModelForSeq2SeqLM, and the translation pipeline under the task
"seq2seq-translation". Before loading one of this package's folders with transformers' Auto classes alone,
call `hf_vanilla_transformer.register_auto_classes()`.
"""

from typing import TYPE_CHECKING

from .lazy_exports import lazy_exports

__version__ = "0.1.0"

if TYPE_CHECKING:
    from .registration import register_auto_classes
    from .translation_pipeline import TranslationPipeline
    from .vanilla_transformer.configuration_vanilla_transformer import VanillaTransformerConfig
    from .vanilla_transformer.generation_vanilla_transformer import (
        gnmt_length_penalty,
        paper_generation_config,
    )
    from .vanilla_transformer.modeling_vanilla_transformer import (
        VanillaTransformerForConditionalGeneration,
        VanillaTransformerModel,
        VanillaTransformerPreTrainedModel,
        sinusoidal_position_encoding,
    )

__all__ = [
    "TranslationPipeline",
    "VanillaTransformerConfig",
    "VanillaTransformerForConditionalGeneration",
    "VanillaTransformerModel",
    "VanillaTransformerPreTrainedModel",
    "gnmt_length_penalty",
    "paper_generation_config",
    "register_auto_classes",
    "sinusoidal_position_encoding",
]


def _register(name: str) -> None:
    """Register what `name` needs registered before it is first used."""
    if name == "register_auto_classes":
        return
    from . import registration

    if name == "VanillaTransformerConfig":
        registration.register_config()
    else:
        registration.register_auto_classes()


__getattr__, __dir__ = lazy_exports(__name__, __file__, before_import=_register)
