"""Marian (the opus-mt family in transformers' `MarianMTModel`) into this package's format.

Marian is the paper's post-LN Transformer with three differences this package has options for: the
sinusoids laid out as [sin half | cos half] (`sinusoidal_layout="marian"`), a logits bias
(`output_bias=True`) and, in opus-mt checkpoints, the swish activation. With those set, its weights load one
to one, and a converted folder is checked against Marian's own logits.
"""

import json
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import MarianConfig, MarianMTModel, MarianTokenizer
from transformers.utils import is_sentencepiece_available

from .. import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from .common import (
    MARIAN_TOKENIZER_FILES,
    ConversionError,
    ConversionReport,
    load_converted_state,
    max_logits_difference,
    save_converted_model,
)

# Marian's layer-level feed-forward names, and where this package keeps them (one FFN module, Eq. 2).
_MARIAN_KEY_RENAMES = ((re.compile(r"\.(fc1|fc2)\."), r".ffn.\1."),)
# Computed, never loaded: the sinusoid tables.
_MARIAN_IGNORED_KEYS = re.compile(r"\.embed_positions\.weight$")
# A converted model must reproduce its source's logits to this absolute tolerance (float32).
LOGITS_TOLERANCE = 1e-4


def config_from_marian(marian: MarianConfig) -> VanillaTransformerConfig:
    """The configuration that reproduces a MarianConfig exactly."""
    return VanillaTransformerConfig(
        vocab_size=marian.vocab_size,
        decoder_vocab_size=marian.decoder_vocab_size,
        d_model=marian.d_model,
        encoder_layers=marian.encoder_layers,
        decoder_layers=marian.decoder_layers,
        encoder_attention_heads=marian.encoder_attention_heads,
        decoder_attention_heads=marian.decoder_attention_heads,
        encoder_ffn_dim=marian.encoder_ffn_dim,
        decoder_ffn_dim=marian.decoder_ffn_dim,
        dropout=float(marian.dropout),
        attention_dropout=float(marian.attention_dropout),
        activation_dropout=float(marian.activation_dropout),
        activation_function=marian.activation_function,
        max_position_embeddings=marian.max_position_embeddings,
        sinusoidal_layout="marian",
        scale_embedding=marian.scale_embedding,
        share_encoder_decoder_embeddings=marian.share_encoder_decoder_embeddings,
        tie_word_embeddings=marian.tie_word_embeddings,
        output_bias=True,
        pad_token_id=marian.pad_token_id,
        bos_token_id=marian.bos_token_id,
        eos_token_id=marian.eos_token_id,
        decoder_start_token_id=marian.decoder_start_token_id,
    )


def _marian_key(key: str) -> str | None:
    """This package's name for a MarianMTModel state-dict key; None for the computed sinusoid tables."""
    if _MARIAN_IGNORED_KEYS.search(key):
        return None
    for pattern, replacement in _MARIAN_KEY_RENAMES:
        key = pattern.sub(replacement, key)
    return key


def state_dict_from_marian(marian_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename a MarianMTModel state dict to this package's parameter names."""
    converted = {}
    for key, tensor in marian_state.items():
        ours = _marian_key(key)
        if ours is not None:
            converted[ours] = tensor
    return converted


def convert_marian(marian: MarianMTModel) -> VanillaTransformerForConditionalGeneration:
    """A VanillaTransformerForConditionalGeneration that computes exactly what `marian` computes."""
    config = config_from_marian(marian.config)
    model = VanillaTransformerForConditionalGeneration(config)
    load_converted_state(model, state_dict_from_marian(marian.state_dict()), "the Marian checkpoint")
    model.generation_config = marian.generation_config
    return model.to(marian.dtype).eval()


def _weight_files(folder: Path) -> str:
    names = sorted(p.name for p in folder.iterdir() if p.suffix in (".safetensors", ".bin"))
    return ", ".join(names) or "no weight file"


def convert_marian_folder(src: str | Path, out: str | Path) -> ConversionReport:
    """Convert a MarianMTModel folder (an opus-mt download or a `save_pretrained` output) into `out`.

    The model is loaded in float32, converted with `convert_marian`, checked to give the same logits as
    Marian (within `LOGITS_TOLERANCE`) and saved with Marian's own generation config. Marian's tokenizer
    files (source.spm, target.spm, vocab.json) are loaded with `MarianTokenizer` and saved again, which
    writes `"tokenizer_class": "MarianTokenizer"` into tokenizer_config.json: opus-mt repos omit it and let
    `model_type: marian` choose the class, which the converted config no longer says. Using it needs the
    `sentencepiece` package.

    Raises:
        ConversionError: `src` is not a readable Marian folder, its weights do not fit, the converted model
            disagrees with Marian, or the tokenizer cannot be loaded or has more ids than the embeddings.
    """
    src, out = Path(src), Path(out)
    config_path = src / "config.json"
    if not config_path.is_file():
        raise ConversionError(f"{src} has no config.json: expected a MarianMTModel folder (save_pretrained).")
    model_type = json.loads(config_path.read_text(encoding="utf-8")).get("model_type")
    if model_type != "marian":
        raise ConversionError(f"{config_path} has model_type {model_type!r}; --from marian needs 'marian'.")
    try:
        marian = MarianMTModel.from_pretrained(src, dtype=torch.float32).eval()
    except (OSError, ValueError, RuntimeError, SafetensorError) as error:
        raise ConversionError(
            f"Cannot read the Marian weights in {src} ({_weight_files(src)}): {error}"
        ) from error
    report = ConversionReport(source=f"Marian model {src}", output=str(out))
    for key in marian.state_dict():
        ours = _marian_key(key)
        report.record(key, ours or "(ignored: sinusoids are computed)")
    model = convert_marian(marian)
    difference = max_logits_difference(marian, model)
    if not difference <= LOGITS_TOLERANCE:
        raise ConversionError(
            f"The converted model's logits differ from Marian's by {difference:.2e} (> {LOGITS_TOLERANCE}): "
            f"{src} uses a Marian feature this package does not reproduce."
        )
    report.notes.append(
        f"Checked: largest logit difference to Marian on a random batch {difference:.1e} "
        f"(tolerance {LOGITS_TOLERANCE})."
    )
    tokenizer = _marian_tokenizer(src, model.config)
    save_converted_model(model, out)
    if tokenizer is None:
        report.notes.append(
            f"No Marian tokenizer files ({', '.join(MARIAN_TOKENIZER_FILES)}) in {src}: no tokenizer saved."
        )
    else:
        tokenizer.save_pretrained(out)
        report.notes.append(
            "Tokenizer: Marian's SentencePiece tokenizer (needs `pip install sentencepiece`)."
        )
    report.notes.append("Generation config: Marian's own (beam size, length limits), unchanged.")
    return report


def _marian_tokenizer(src: Path, config: VanillaTransformerConfig) -> MarianTokenizer | None:
    if not any((src / name).is_file() for name in MARIAN_TOKENIZER_FILES):
        return None
    if not is_sentencepiece_available():
        raise ConversionError(
            f"{src} has a Marian SentencePiece tokenizer, which needs the sentencepiece package: "
            "pip install sentencepiece"
        )
    try:
        tokenizer = MarianTokenizer.from_pretrained(src)
    except (OSError, ValueError, KeyError, AssertionError, RuntimeError) as error:
        raise ConversionError(f"Cannot load the Marian tokenizer in {src}: {error!r}") from error
    sizes = [("vocab.json", len(tokenizer.encoder), config.vocab_size)]
    if tokenizer.separate_vocabs:
        sizes.append(("target_vocab.json", len(tokenizer.target_encoder), config.decoder_vocab_size))
    for name, size, rows in sizes:
        if size > rows:
            raise ConversionError(
                f"{src / name} has {size} tokens but the model's embeddings have {rows} rows: "
                "the tokenizer does not belong to this model."
            )
    return tokenizer
