"""Converting checkpoints of other implementations of the same architecture into this package's format.

Marian (the opus-mt family in transformers' `MarianMTModel`) is the paper's post-LN Transformer with
three differences this package has options for: the sinusoids laid out as [sin half | cos half]
(`sinusoidal_layout="marian"`), a logits bias (`output_bias=True`) and, in opus-mt checkpoints, the
swish activation. With those set, its weights load one to one.

fairseq's `transformer` architectures (`transformer_wmt_en_de`, `transformer_vaswani_wmt_en_de_big`, ...)
are the paper's post-LN Transformer with fairseq's sinusoids (`sinusoidal_layout="fairseq"`: other
frequencies, positions counted from pad + 1), a decoder that starts from `</s>`, and shared or separate
source/target vocabularies. Their pre-LN variants and BART-style additions compute something else and are
refused, not approximated.

Every converter checks names and shapes against the model it builds (`load_converted_state`). The folder
converters behind `vanilla-transformer convert`, `convert_marian_folder` and `convert_fairseq_checkpoint`,
write a `save_pretrained` folder and return a `ConversionReport` of which source keys became which of ours.
One module per source (`marian`, `fairseq`) and one for what they share (`common`).
"""

from typing import TYPE_CHECKING

from ..lazy_exports import lazy_exports

if TYPE_CHECKING:
    from .common import ConversionError, ConversionReport, load_converted_state, max_logits_difference
    from .fairseq import (
        FAIRSEQ_BPE_FILES,
        bpe_file_name,
        config_from_fairseq,
        convert_fairseq_checkpoint,
        fairseq_model_args,
        load_fairseq_checkpoint,
        read_fairseq_dictionary,
        state_dict_from_fairseq,
        tokenizer_from_fairseq_dictionary,
    )
    from .marian import config_from_marian, convert_marian, convert_marian_folder, state_dict_from_marian

__all__ = [
    "FAIRSEQ_BPE_FILES",
    "ConversionError",
    "ConversionReport",
    "bpe_file_name",
    "config_from_fairseq",
    "config_from_marian",
    "convert_fairseq_checkpoint",
    "convert_marian",
    "convert_marian_folder",
    "fairseq_model_args",
    "load_converted_state",
    "load_fairseq_checkpoint",
    "max_logits_difference",
    "read_fairseq_dictionary",
    "state_dict_from_fairseq",
    "state_dict_from_marian",
    "tokenizer_from_fairseq_dictionary",
]

__getattr__, __dir__ = lazy_exports(__name__, __file__)
