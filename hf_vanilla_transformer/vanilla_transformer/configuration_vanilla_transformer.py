# Copyright 2026 The hf-vanilla-transformer Authors. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Configuration of the Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

The field names follow transformers' conventions (`hidden_size`, `encoder_layers`, `encoder_ffn_dim`, ...)
so that caches, generation and the Trainer find what they expect; `d_model` is an alias of `hidden_size`,
and the paper's own symbols (N, h, d_ff, P_drop) are accepted by the constructor and `from_preset`.

This module is copied next to saved weights for `trust_remote_code=True` users: it imports nothing
from the package around it.
"""

import dataclasses
import math
from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig
from transformers.utils import auto_docstring, logging

logger = logging.get_logger(__name__)

ACTIVATIONS = ("relu", "gelu", "swish", "silu")
POSITION_EMBEDDING_TYPES = ("sinusoidal", "learned")
# "paper": sin at even dims, cos at odd dims (Section 3.5). "marian": the same frequencies laid out
# as [sin half | cos half]. "fairseq": [sin half | cos half] with fairseq's frequencies
# exp(-i ln(10000) / (d/2 - 1)) and positions that start at pad_token_id + 1.
SINUSOIDAL_LAYOUTS = ("paper", "marian", "fairseq")

# Table 3 of the paper. "base": 65M parameters in the paper's count, "big": 213M.
PRESETS: dict[str, dict[str, Any]] = {
    "base": {
        "hidden_size": 512,
        "encoder_layers": 6,
        "decoder_layers": 6,
        "encoder_attention_heads": 8,
        "decoder_attention_heads": 8,
        "encoder_ffn_dim": 2048,
        "decoder_ffn_dim": 2048,
        "dropout": 0.1,
    },
    "big": {
        "hidden_size": 1024,
        "encoder_layers": 6,
        "decoder_layers": 6,
        "encoder_attention_heads": 16,
        "decoder_attention_heads": 16,
        "encoder_ffn_dim": 4096,
        "decoder_ffn_dim": 4096,
        "dropout": 0.3,
    },
}

# The paper's symbols (Table 3 column heads) and the config fields each one sets.
PAPER_SYMBOLS: dict[str, tuple[str, ...]] = {
    "N": ("encoder_layers", "decoder_layers"),
    "h": ("encoder_attention_heads", "decoder_attention_heads"),
    "d_ff": ("encoder_ffn_dim", "decoder_ffn_dim"),
    "P_drop": ("dropout",),
}

# The key under which configs saved by earlier versions of the package carry the label smoothing of their
# training run (Section 5.4's eps_ls), which is a setting of training: `training/legacy` reads it.
LEGACY_LABEL_SMOOTHING = "label_smoothing"


# Options that PreTrainedConfig takes besides its fields.
LOADING_OPTIONS = {"attn_implementation", "output_attentions", "torch_dtype"}


@auto_docstring(
    checkpoint="hf-vanilla-transformer/transformer-base-wmt14-en-de",
    custom_intro="""
    Configuration of [`VanillaTransformerModel`] and [`VanillaTransformerForConditionalGeneration`], the
    encoder-decoder of "Attention Is All You Need" (Vaswani et al., 2017).
    """,
)
@strict
class VanillaTransformerConfig(PreTrainedConfig):
    r"""
    decoder_vocab_size (`int`, *optional*):
        Target vocabulary size when source and target have separate vocabularies (fairseq's
        separate-vocabulary models); defaults to `vocab_size`, and is not read while
        `share_encoder_decoder_embeddings` is set.
    d_k (`int`, *optional*):
        Size of each head's queries and keys; defaults to hidden_size / h (Section 3.2.2; Table 3, rows A
        and B).
    d_v (`int`, *optional*):
        Size of each head's values; defaults to hidden_size / h (Table 3, row A).
    position_embedding_type (`str`, *optional*, defaults to `"sinusoidal"`):
        "sinusoidal" (Section 3.5) or "learned" (Table 3, row E).
    sinusoidal_layout (`str`, *optional*, defaults to `"paper"`):
        "paper" (interleaved sin/cos), "marian" (the same frequencies as [sin half | cos half]) or "fairseq"
        ([sin half | cos half] with fairseq's frequencies, positions from pad_token_id + 1), to load weights
        trained by those implementations exactly.
    share_encoder_decoder_embeddings (`bool`, *optional*, defaults to `True`):
        One vocabulary, and one embedding matrix, for source and target tokens (Section 3.4).
    output_bias (`bool`, *optional*, defaults to `False`):
        Add a learned bias to the logits (Marian's `final_logits_bias`); not in the paper.

    The defaults are the paper's base model (Table 3, row "base") with the shared En-De BPE vocabulary of
    37000 tokens (Section 5.1): `hidden_size` is d_model, `encoder_layers`/`decoder_layers` N,
    `encoder_attention_heads`/`decoder_attention_heads` h, `encoder_ffn_dim`/`decoder_ffn_dim` d_ff (Eq. 2)
    and `dropout` P_drop (Section 5.4). `attention_dropout` and `activation_dropout` are not in the paper
    (0 by default). `init_std` defaults to hidden_size^-0.5. `tie_word_embeddings` ties the target
    embedding to the pre-softmax projection (Section 3.4); in transformers 5 it turns every tie on or off.

    Examples:

    ```python
    >>> from transformers import AutoModelForSeq2SeqLM

    >>> # The paper's big model (Table 3) over a 32000-token vocabulary, with four layers a stack
    >>> configuration = VanillaTransformerConfig.from_preset("big", vocab_size=32000, N=4)
    >>> model = AutoModelForSeq2SeqLM.from_config(configuration)
    ```"""

    model_type = "vanilla_transformer"
    attribute_map = {
        "num_attention_heads": "encoder_attention_heads",
        "num_hidden_layers": "encoder_layers",
        "d_model": "hidden_size",
    }

    vocab_size: int = 37000
    decoder_vocab_size: int | None = None
    hidden_size: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    d_k: int | None = None
    d_v: int | None = None
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    dropout: float | int = 0.1
    attention_dropout: float | int = 0.0
    activation_dropout: float | int = 0.0
    activation_function: str = "relu"
    layer_norm_eps: float | int = 1e-5
    max_position_embeddings: int = 1024
    position_embedding_type: str = "sinusoidal"
    sinusoidal_layout: str = "paper"
    scale_embedding: bool = True
    share_encoder_decoder_embeddings: bool = True
    tie_word_embeddings: bool = True
    output_bias: bool = False
    init_std: float | int | None = None
    use_cache: bool = True
    is_encoder_decoder: bool = True
    # fairseq's dictionary order, which `train_shared_bpe_tokenizer` follows: <s>=0 <pad>=1 </s>=2 <unk>=3.
    pad_token_id: int | None = 1
    bos_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 2
    decoder_start_token_id: int | None = 0

    def __post_init__(self, **kwargs: Any) -> None:
        self._set_paper_symbols(kwargs)
        if LEGACY_LABEL_SMOOTHING in kwargs:
            logger.warning_once(
                f"This config carries {LEGACY_LABEL_SMOOTHING}={kwargs[LEGACY_LABEL_SMOOTHING]}, a setting "
                "of how it was trained: the model's loss is the plain cross-entropy, and "
                "`vanilla-transformer train` takes this value as its --label-smoothing default when it "
                "fine-tunes or resumes from this model."
            )
        self.decoder_vocab_size = self.decoder_vocab_size or self.vocab_size
        super().__post_init__(**kwargs)
        self.check_values()

    def _set_paper_symbols(self, kwargs: dict[str, Any]) -> None:
        """Take the paper's symbols out of the constructor's extra arguments and set the fields they stand
        for (N sets both stacks' layers, and so on). A field set as well, to a value other than its default
        and the symbol's, is a conflict; a field given its default cannot be told from one not given."""
        defaults = {field.name: field.default for field in dataclasses.fields(self)}
        for symbol, fields in PAPER_SYMBOLS.items():
            if symbol not in kwargs:
                continue
            value = kwargs.pop(symbol)
            for name in fields:
                given = getattr(self, name)
                if given != defaults[name] and given != value:
                    raise ValueError(f"{symbol}={value!r} and {name}={given!r} disagree: give one of them.")
                setattr(self, name, value)

    @property
    def target_vocab_size(self) -> int:
        """The decoder's vocabulary: `vocab_size` when source and target share one (Section 3.4), read
        whenever asked so that a changed `vocab_size` carries over, else `decoder_vocab_size`."""
        return self.vocab_size if self.share_encoder_decoder_embeddings else self.decoder_vocab_size

    @property
    def ties_embeddings(self) -> bool:
        """Whether source and target embeddings are one matrix: sharing asked for, and ties on at all
        (`tie_word_embeddings=False` unties every matrix in transformers 5, as in Marian)."""
        return self.share_encoder_decoder_embeddings and self.tie_word_embeddings

    @property
    def encoder_head_dims(self) -> tuple[int, int]:
        """(d_k, d_v) of the encoder's heads: d_model / h unless set (Section 3.2.2)."""
        return self._head_dims(self.encoder_attention_heads)

    @property
    def decoder_head_dims(self) -> tuple[int, int]:
        """(d_k, d_v) of the decoder's heads: d_model / h unless set (Section 3.2.2)."""
        return self._head_dims(self.decoder_attention_heads)

    def _head_dims(self, heads: int) -> tuple[int, int]:
        default = self.hidden_size // heads
        return (self.d_k or default, self.d_v or default)

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "VanillaTransformerConfig":
        """The paper's "base" or "big" model (Table 3), with any field or paper symbol overridden.

        Paper symbols set both stacks: `N=4` sets encoder_layers and decoder_layers, likewise `h`,
        `d_ff`; `P_drop` sets dropout. `d_k`, `d_v`, `d_model` (`hidden_size`),
        `position_embedding_type` are fields already. Overrides apply in the order given, so a field
        after its symbol refines it (`N=2, decoder_layers=3`), as a training preset's overrides are
        refined by the user's.

        >>> VanillaTransformerConfig.from_preset("big", vocab_size=32000, N=4).encoder_layers
        4
        """
        if name not in PRESETS:
            raise ValueError(f"Unknown preset {name!r}: choose one of {sorted(PRESETS)}.")
        values = dict(PRESETS[name])
        known = {f.name for f in dataclasses.fields(cls)} | set(cls.attribute_map) | set(PAPER_SYMBOLS)
        known |= LOADING_OPTIONS
        unknown = sorted(set(overrides) - known)
        if {LEGACY_LABEL_SMOOTHING, "eps_ls"} & set(unknown):
            raise ValueError(
                "Label smoothing (eps_ls) is a setting of training, not of the model: the model's loss is "
                "the plain cross-entropy. Give it to the Trainer (label_smoothing_factor) or to "
                "`vanilla-transformer train --label-smoothing`."
            )
        if unknown:
            raise ValueError(
                f"Unknown setting(s) {unknown} for from_preset: use config fields (e.g. d_model, "
                f"encoder_layers) or the paper's symbols {sorted(PAPER_SYMBOLS)}."
            )
        for key, value in overrides.items():
            for field in PAPER_SYMBOLS.get(key, (cls.attribute_map.get(key, key),)):
                values[field] = value
        return cls(**values)

    def check_values(self) -> None:
        """Reject values that would build a broken model, naming the field and how to fix it. Run when the
        config is made, and again by the model on a config changed since."""
        positive = (
            "vocab_size",
            "decoder_vocab_size",
            "d_model",
            "encoder_layers",
            "decoder_layers",
            "encoder_attention_heads",
            "decoder_attention_heads",
            "encoder_ffn_dim",
            "decoder_ffn_dim",
            "max_position_embeddings",
        )
        for name in positive:
            value = getattr(self, name)
            if not _integer(value) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        for name in ("d_k", "d_v"):
            value = getattr(self, name)
            if value is not None and (not _integer(value) or value <= 0):
                raise ValueError(f"{name} must be a positive integer or None (d_model / h), got {value!r}.")
        for name in ("encoder_attention_heads", "decoder_attention_heads"):
            heads = getattr(self, name)
            if (self.d_k is None or self.d_v is None) and self.d_model % heads:
                raise ValueError(
                    f"d_model ({self.d_model}) is not divisible by {name} ({heads}): d_k and d_v default to "
                    "d_model / h. Choose a head count that divides d_model, or set d_k and d_v explicitly."
                )
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value!r}.")
        if self.init_std is not None and not _positive_number(self.init_std):
            raise ValueError(
                f"init_std must be a positive number or None (d_model^-0.5), got {self.init_std!r}."
            )
        if not _positive_number(self.layer_norm_eps):
            raise ValueError(f"layer_norm_eps must be a positive number, got {self.layer_norm_eps!r}.")
        choices = {
            "activation_function": ACTIVATIONS,
            "position_embedding_type": POSITION_EMBEDDING_TYPES,
            "sinusoidal_layout": SINUSOIDAL_LAYOUTS,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"Unknown {name} {getattr(self, name)!r}: choose one of {list(allowed)}.")
        if self.sinusoidal_layout != "paper" and self.d_model % 2:
            raise ValueError(f"sinusoidal_layout {self.sinusoidal_layout!r} needs an even d_model.")
        if self.sinusoidal_layout == "fairseq" and self.d_model < 4:
            raise ValueError(
                f"sinusoidal_layout 'fairseq' needs d_model of at least 4 (its frequencies divide by "
                f"d_model / 2 - 1), got {self.d_model}."
            )
        eos_ids = self.eos_token_id if isinstance(self.eos_token_id, list) else [self.eos_token_id]
        token_ids = {
            "pad_token_id": [self.pad_token_id],
            "bos_token_id": [self.bos_token_id],
            "eos_token_id": eos_ids,
            "decoder_start_token_id": [self.decoder_start_token_id],
        }
        for name in ("pad_token_id", "decoder_start_token_id"):
            if not _integer(getattr(self, name)):
                raise ValueError(
                    f"{name} must be a token id, got {getattr(self, name)!r}: the model pads and shifts the "
                    "labels with it. Use the id your tokenizer gives that token."
                )
        for name, ids in token_ids.items():
            # The padding id indexes both embeddings; the others are target tokens only.
            size = self.target_vocab_size
            if name == "pad_token_id":
                size = min(size, self.vocab_size)
            for token_id in ids:
                if token_id is not None and not 0 <= token_id < size:
                    raise ValueError(
                        f"{name}={token_id} lies outside the vocabulary [0, {size}). "
                        "Use the ids your tokenizer gives its special tokens."
                    )


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_number(value: Any) -> bool:
    number = isinstance(value, float) or _integer(value)
    return number and math.isfinite(value) and value > 0


__all__ = ["VanillaTransformerConfig"]
