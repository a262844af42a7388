"""Exporting a trained model for inference engines other than PyTorch: CTranslate2 and ONNX Runtime.

Both exports write a self-contained folder: the model in the engine's format, the tokenizer (and a
`target_tokenizer/` where source and target vocabularies are separate), the model's generation config
(the paper's decoding: beam 4, GNMT length penalty 0.6, input length + 50) and `EXPORT_INFO_FILE`, which
says which engine reads the folder. `engines.load_translator` reads such folders.

- `export_ctranslate2`: the CTranslate2 `TransformerSpec` built directly from the config and weights (no
  detour through another model class): post-LN layers, queries/keys/values fused as CTranslate2 wants
  them, the exact positional table of the model (the paper's interleaved sinusoids, Marian's or fairseq's
  layout with fairseq's offset, or learned positions) and the logits bias where the model has one. A
  config the spec cannot represent is refused, naming the field (`ctranslate2_refusals`). Optionally with a
  vocabulary shortlist (`build_shortlist`, from the training data) as CTranslate2's vocabulary mapping
  (`VMAP_FILE`), which restricts each translation's output vocabulary to the likely target tokens.
- `export_onnx`: two graphs, `encoder.onnx` (source ids and mask -> encoder states and every decoder
  layer's cross-attention keys and values, computed once per input) and `decoder.onnx` (the new target
  ids, the encoder states and mask, the self-attention keys and values of the earlier steps and the
  cross-attention ones -> logits and the new steps' keys and values), exported with `torch.onnx.export`
  through the model's own forward, so that the graphs compute what `generate()` computes.

Both tables of positions have `max_position_embeddings` rows (the config's), where the PyTorch model
computes sinusoids for any position: the engines refuse longer inputs and stop outputs at the table's end.
"""

import importlib.util
import itertools
import json
import shutil
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id
from torch import nn
from transformers import AutoModelForSeq2SeqLM, PreTrainedTokenizerBase
from transformers.cache_utils import EncoderDecoderCache

from .configuration_vanilla_transformer import VanillaTransformerConfig
from .modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from .translation import load_tokenizers
from .translation_pipeline import TARGET_TOKENIZER_DIR

EXPORT_TARGETS = ("ctranslate2", "onnx")
# Written into every exported folder: which engine reads it, and what was exported.
EXPORT_INFO_FILE = "vanilla_transformer_export.json"
# CTranslate2's weight types (ctranslate2.specs.model_spec.ACCEPTED_MODEL_TYPES); float32 is the default.
CTRANSLATE2_QUANTIZATIONS = (
    "float32",
    "int8",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "int16",
    "float16",
    "bfloat16",
)
# CTranslate2's vocabulary mapping file, read when translating with use_vmap=True.
VMAP_FILE = "vmap.txt"
ONNX_ENCODER_FILE = "encoder.onnx"
ONNX_DECODER_FILE = "decoder.onnx"
# Graph input and output names (the decoder's inputs are OnnxDecoderGraph.forward's arguments). Keys and
# values are stacked over layers: [batch, layers, heads, time, d].
ONNX_ENCODER_INPUTS = ("input_ids", "attention_mask")
ONNX_ENCODER_OUTPUTS = ("encoder_hidden_states", "cross_keys", "cross_values")
ONNX_DECODER_OUTPUTS = ("logits", "new_keys", "new_values")
# CTranslate2's activation (ctranslate2.specs.Activation member) for each of ours: GELU is the erf form in
# both, swish and silu are x * sigmoid(x).
_CTRANSLATE2_ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "swish": "SWISH", "silu": "SWISH"}
# The packages each export needs, and running an ONNX export.
_REQUIREMENTS = {
    "ctranslate2": ("ctranslate2",),
    "onnx": ("onnx", "onnxscript", "onnxruntime"),
    "onnxruntime": ("onnxruntime",),
}


class ExportError(ValueError):
    """A model, folder or setting that cannot be exported; the message names it and says what to do."""


@dataclass
class ExportSource:
    """A float32 model in evaluation mode and the tokenizers that go with it."""

    model: VanillaTransformerForConditionalGeneration
    tokenizer: PreTrainedTokenizerBase
    target_tokenizer: PreTrainedTokenizerBase | None = None
    name: str = ""

    @property
    def config(self) -> VanillaTransformerConfig:
        return self.model.config


def require_packages(target: str) -> None:
    """Raise ExportError, with the install command, if a package `target` needs is missing."""
    missing = [name for name in _REQUIREMENTS[target] if importlib.util.find_spec(name) is None]
    if missing:
        raise ExportError(f"Missing {', '.join(missing)} (for {target}): pip install {' '.join(missing)}")


def load_for_export(name_or_path: str | Path) -> ExportSource:
    """The model and tokenizers of a `save_pretrained` folder or Hub id, in float32, ready to export."""
    name = str(name_or_path)
    missing = (
        f"{name}: no such folder. Give a folder written by save_pretrained (with config.json) or a Hub id"
    )
    if not Path(name).exists():
        try:
            validate_repo_id(name)
        except HFValidationError:
            raise ExportError(missing + ".") from None
    try:
        model = AutoModelForSeq2SeqLM.from_pretrained(name, dtype=torch.float32)
        tokenizer, target_tokenizer = load_tokenizers(name)
    except (OSError, ValueError) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        if not Path(name).exists():
            raise ExportError(f"{missing} that can be downloaded here ({reason}).") from error
        raise ExportError(
            f"Cannot load {name} ({reason}). It needs its config, weights and tokenizer."
        ) from error
    if not isinstance(model, VanillaTransformerForConditionalGeneration):
        raise ExportError(
            f"{name} holds a {type(model).__name__}; the exporters read this package's "
            "VanillaTransformerForConditionalGeneration (convert other checkpoints with "
            "scripts/convert_checkpoint.py first)."
        )
    return ExportSource(model.eval(), tokenizer, target_tokenizer, name)


def read_export_info(folder: str | Path) -> dict[str, Any] | None:
    """The `EXPORT_INFO_FILE` of an exported folder, or None for any other folder or Hub id."""
    path = Path(folder) / EXPORT_INFO_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _prepare_output(out: Path, source: ExportSource, force: bool) -> None:
    """Make `out` an empty folder: refuse a non-empty one unless `force`, and never one holding the model."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file: give a folder.")
    if out.is_dir() and any(out.iterdir()):
        if (
            source.name
            and Path(source.name).exists()
            and Path(source.name).resolve().is_relative_to(out.resolve())
        ):
            raise ExportError(f"--out {out} holds the model being exported: give another folder.")
        if not force:
            raise ExportError(
                f"--out {out} exists and is not empty: give a new folder, or --force to replace it."
            )
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


def _save_companions(source: ExportSource, out: Path, engine: str, **details: Any) -> None:
    """What every exported folder holds besides the model: tokenizers, generation config, export info."""
    source.tokenizer.save_pretrained(out)
    if source.target_tokenizer is not None:
        source.target_tokenizer.save_pretrained(out / TARGET_TOKENIZER_DIR)
    source.model.generation_config.save_pretrained(out)
    info = {
        "engine": engine,
        "source": source.name,
        "positions": source.config.max_position_embeddings,
        "decoder_start_token_id": source.config.decoder_start_token_id,
        "pad_token_id": source.config.pad_token_id,
        "eos_token_id": source.config.eos_token_id,
        **details,
    }
    (out / EXPORT_INFO_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------------------
# CTranslate2


def ctranslate2_refusals(config: VanillaTransformerConfig) -> list[str]:
    """Why CTranslate2's TransformerSpec cannot hold a model with this config, one reason per field; empty
    if it can. The spec holds post-LN layers, any head count per stack, one head size for queries, keys and
    values, biases on every projection (the logits bias included), a scale on the embeddings, a position
    table of any layout, and one end token."""
    reasons = []
    for stack, (d_k, d_v) in (("encoder", config.encoder_head_dims), ("decoder", config.decoder_head_dims)):
        if d_k != d_v:
            reasons.append(
                f"d_k ({d_k}) differs from d_v ({d_v}) in the {stack}: CTranslate2's attention has one "
                "head size for keys and values (export to ONNX instead)"
            )
            break
    if config.activation_function not in _CTRANSLATE2_ACTIVATIONS:
        reasons.append(f"activation_function {config.activation_function!r} has no CTranslate2 counterpart")
    if isinstance(config.eos_token_id, list) and len(config.eos_token_id) > 1:
        reasons.append(f"eos_token_id {config.eos_token_id}: a CTranslate2 model has one end token")
    if config.decoder_start_token_id is None:
        reasons.append("decoder_start_token_id is None: CTranslate2 needs the token the decoder starts from")
    return reasons


def vocabulary_tokens(tokenizer: PreTrainedTokenizerBase, size: int, side: str) -> list[str]:
    """The `size` token strings of the embedding rows, in id order, as CTranslate2 names them. Rows the
    tokenizer has no token for get placeholder names; every name must be unique."""
    if len(tokenizer) > size:
        raise ExportError(
            f"The {side} tokenizer has {len(tokenizer)} tokens but the embeddings have {size} rows: "
            "the tokenizer does not belong to this model."
        )
    tokens = tokenizer.convert_ids_to_tokens(list(range(size)))
    tokens = [token if token is not None else f"<unused_{index}>" for index, token in enumerate(tokens)]
    seen: dict[str, int] = {}
    for index, token in enumerate(tokens):
        if token in seen:
            raise ExportError(
                f"The {side} vocabulary names ids {seen[token]} and {index} both {token!r}: CTranslate2 "
                "reads tokens by name, so each must be unique."
            )
        seen[token] = index
    return tokens


def _copy(tensor: torch.Tensor) -> torch.Tensor:
    """A float32 copy: quantizing a spec rewrites its tensors in place, and the model must stay as it is."""
    return tensor.detach().to(torch.float32, copy=True)


def _set_linear(spec: Any, *modules: nn.Linear) -> None:
    """One CTranslate2 linear layer from one or more of ours, stacked along the outputs (fused q/k/v)."""
    spec.weight = torch.cat([_copy(module.weight) for module in modules])
    if modules[0].bias is not None:
        spec.bias = torch.cat([_copy(module.bias) for module in modules])


def _set_layer_norm(spec: Any, norm: nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _copy(norm.weight), _copy(norm.bias)


def _set_stack(spec: Any, stack: nn.Module) -> None:
    """Embeddings, their sqrt(d_model) scale and the model's own position table (its exact sinusoids in
    the config's layout, offset included, or the learned rows)."""
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = _copy(stack.embed_tokens.weight)
    spec.scale_embeddings = float(stack.embed_tokens.embed_scale)
    spec.position_encodings.encodings = _copy(stack.embed_positions.weight)


def ctranslate2_spec(
    model: VanillaTransformerForConditionalGeneration,
    source_tokens: list[str],
    target_tokens: list[str],
    unk_token: str | None = None,
) -> Any:
    """The CTranslate2 TransformerSpec that computes what `model` computes (float32 weights, copied), with
    the token names of the embedding rows (`vocabulary_tokens`) and the tokenizer's unknown token."""
    from ctranslate2.specs import Activation, TransformerDecoderSpec, TransformerEncoderSpec, TransformerSpec

    config = model.config
    reasons = ctranslate2_refusals(config)
    if reasons:
        raise ExportError("Cannot export to CTranslate2: " + "; ".join(reasons) + ".")
    activation = getattr(Activation, _CTRANSLATE2_ACTIVATIONS[config.activation_function])
    encoder_spec = TransformerEncoderSpec(
        config.encoder_layers,
        config.encoder_attention_heads,
        pre_norm=False,
        activation=activation,
        head_dim=config.encoder_head_dims[0],
    )
    decoder_spec = TransformerDecoderSpec(
        config.decoder_layers,
        config.decoder_attention_heads,
        pre_norm=False,
        activation=activation,
        head_dim=config.decoder_head_dims[0],
    )
    encoder, decoder = model.get_encoder(), model.get_decoder()
    _set_stack(encoder_spec, encoder)
    _set_stack(decoder_spec, decoder)
    for layer_spec, layer in zip(encoder_spec.layer, encoder.layers, strict=True):
        attention = layer.self_attn
        _set_linear(layer_spec.self_attention.linear[0], attention.q_proj, attention.k_proj, attention.v_proj)
        _set_linear(layer_spec.self_attention.linear[1], attention.out_proj)
        _set_layer_norm(layer_spec.self_attention.layer_norm, layer.self_attn_layer_norm)
        _set_feed_forward(layer_spec.ffn, layer)
    for layer_spec, layer in zip(decoder_spec.layer, decoder.layers, strict=True):
        attention, cross = layer.self_attn, layer.encoder_attn
        _set_linear(layer_spec.self_attention.linear[0], attention.q_proj, attention.k_proj, attention.v_proj)
        _set_linear(layer_spec.self_attention.linear[1], attention.out_proj)
        _set_layer_norm(layer_spec.self_attention.layer_norm, layer.self_attn_layer_norm)
        _set_linear(layer_spec.attention.linear[0], cross.q_proj)
        _set_linear(layer_spec.attention.linear[1], cross.k_proj, cross.v_proj)
        _set_linear(layer_spec.attention.linear[2], cross.out_proj)
        _set_layer_norm(layer_spec.attention.layer_norm, layer.encoder_attn_layer_norm)
        _set_feed_forward(layer_spec.ffn, layer)
    _set_linear(decoder_spec.projection, model.lm_head)
    if config.output_bias:
        decoder_spec.projection.bias = _copy(model.final_logits_bias[0])

    spec = TransformerSpec(encoder_spec, decoder_spec)
    spec.config.layer_norm_epsilon = config.layer_norm_eps
    eos = config.eos_token_id[0] if isinstance(config.eos_token_id, list) else config.eos_token_id
    special = {
        # CTranslate2 appends its unknown token to a vocabulary that lacks it, which would no longer fit the
        # embeddings. Our engines only pass tokens from the vocabulary, so any of its tokens can stand in.
        "unk_token": unk_token if unk_token in source_tokens else source_tokens[0],
        "bos_token": target_tokens[config.bos_token_id if config.bos_token_id is not None else eos],
        "eos_token": target_tokens[eos],
        "decoder_start_token": target_tokens[config.decoder_start_token_id],
    }
    for key, token in special.items():
        setattr(spec.config, key, token)
    spec.register_source_vocabulary(source_tokens)
    spec.register_target_vocabulary(target_tokens)
    return spec


def _set_feed_forward(spec: Any, layer: nn.Module) -> None:
    _set_linear(spec.linear_0, layer.ffn.fc1)
    _set_linear(spec.linear_1, layer.ffn.fc2)
    _set_layer_norm(spec.layer_norm, layer.final_layer_norm)


def export_ctranslate2(
    source: ExportSource,
    out: str | Path,
    quantization: str | None = None,
    force: bool = False,
    shortlist: "Shortlist | None" = None,
) -> Path:
    """Write `source` as a CTranslate2 model folder (model.bin, config.json and vocabularies, in
    CTranslate2's format) plus tokenizers, generation config and `EXPORT_INFO_FILE`, and `shortlist` as its
    vocabulary mapping (`VMAP_FILE`), which the CTranslate2 engine then uses.

    `quantization` is one of `CTRANSLATE2_QUANTIZATIONS` (None: float32). Raises ExportError for a config
    CTranslate2 cannot represent (`ctranslate2_refusals`), mismatched tokenizers, a shortlist naming tokens
    outside the vocabularies, or an occupied `out`.
    """
    require_packages("ctranslate2")
    from ctranslate2.converters import Converter

    if quantization not in (None, *CTRANSLATE2_QUANTIZATIONS):
        raise ExportError(
            f"Unknown quantization {quantization!r}: choose one of {list(CTRANSLATE2_QUANTIZATIONS)}."
        )
    config = source.config
    source_tokens = vocabulary_tokens(source.tokenizer, config.vocab_size, "source")
    target_tokenizer = source.target_tokenizer or source.tokenizer
    target_tokens = vocabulary_tokens(target_tokenizer, config.decoder_vocab_size, "target")
    spec = ctranslate2_spec(source.model, source_tokens, target_tokens, source.tokenizer.unk_token)
    if shortlist is not None:
        shortlist.check(source_tokens, target_tokens)

    class _SpecConverter(Converter):
        """CTranslate2's converter (validation, quantization, saving) over a spec built here."""

        def _load(self) -> Any:
            return spec

    out = Path(out)
    _prepare_output(out, source, force)
    _SpecConverter().convert(str(out), quantization=quantization, force=True)
    shortlist_info = None
    if shortlist is not None:
        shortlist.write(out / VMAP_FILE)
        shortlist_info = {"always": len(shortlist.always), "source_tokens": len(shortlist.candidates)}
    _save_companions(
        source, out, "ctranslate2", quantization=quantization or "float32", shortlist=shortlist_info
    )
    return out


# ---------------------------------------------------------------------------------------------------------
# Vocabulary shortlist (CTranslate2's vocabulary mapping)


@dataclass(frozen=True)
class Shortlist:
    """Which target tokens a translation may use, as CTranslate2's vocabulary mapping (`VMAP_FILE`) holds
    it: the tokens always allowed, and for each source token the target tokens its presence in the input
    adds. CTranslate2 also always allows its unknown, start and end tokens."""

    always: list[str]
    candidates: dict[str, list[str]]

    def allowed(self, source_tokens: Iterable[str]) -> set[str]:
        """The target tokens this shortlist allows for inputs made of `source_tokens` (CTranslate2 takes
        the union over the inputs of one `translate_batch` call)."""
        allowed = set(self.always)
        for token in source_tokens:
            allowed.update(self.candidates.get(token, ()))
        return allowed

    def check(self, source_tokens: list[str], target_tokens: list[str]) -> None:
        """Raise ExportError for a token outside the vocabularies (CTranslate2 would read it as the unknown
        token) or one holding whitespace (which the file format cannot hold)."""
        vocabularies = {"source": set(source_tokens), "target": set(target_tokens)}
        sides = [("source", list(self.candidates)), ("target", self.always)]
        sides += [("target", targets) for targets in self.candidates.values()]
        for side, tokens in sides:
            for token in tokens:
                if token not in vocabularies[side] or _has_whitespace(token):
                    raise ExportError(
                        f"The shortlist names {side} token {token!r}, which is not in the {side} vocabulary "
                        "or holds whitespace: build it with the model's tokenizers (build_shortlist)."
                    )

    def write(self, path: str | Path) -> None:
        """Write the mapping in CTranslate2's format: one line per source token, `source<TAB>target target
        ...`; the line with an empty source holds the tokens always allowed."""
        lines = ["\t" + " ".join(self.always)]
        lines += [f"{source}\t{' '.join(targets)}" for source, targets in self.candidates.items()]
        Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def _has_whitespace(token: str) -> bool:
    return any(character.isspace() for character in token)


def _ordinary_tokens(tokenizer: PreTrainedTokenizerBase) -> tuple[list[str], torch.Tensor]:
    """The tokenizer's token names by id, and which of them a shortlist may hold: not special, no
    whitespace."""
    names = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    special = set(tokenizer.all_special_ids)
    usable = [index not in special and not _has_whitespace(name) for index, name in enumerate(names)]
    return names, torch.tensor(usable)


def _sentence_counts(ids: list[list[int]], size: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each sentence's distinct token ids, and in how many sentences each token occurs."""
    distinct = [torch.tensor(sorted(set(row)), dtype=torch.long) for row in ids]
    return distinct, torch.bincount(torch.cat(distinct), minlength=size)


def build_shortlist(
    source_texts: Iterable[str],
    target_texts: Iterable[str],
    tokenizer: PreTrainedTokenizerBase,
    target_tokenizer: PreTrainedTokenizerBase | None = None,
    *,
    size: int = 100,
    frequent: int = 100,
    chunk: int = 10_000,
) -> Shortlist:
    """A `Shortlist` learned from line-aligned parallel text (the training data, say).

    For each source token, the `size` target tokens that co-occur with it most informatively, ranked by
    local mutual information c(s, t) * log(N c(s, t) / (c(s) c(t))) (c counts the sentence pairs holding
    the tokens, N the pairs) and kept only where they co-occur more often than chance: raw counts would rank
    the commonest target tokens first for every source token, and PMI alone favours pairs seen once. The
    `frequent` commonest target tokens are always allowed. Special tokens and tokens holding whitespace are
    left out. The pairs are read `chunk` at a time.
    """
    target_tokenizer = target_tokenizer or tokenizer
    source_names, source_usable = _ordinary_tokens(tokenizer)
    target_names, target_usable = _ordinary_tokens(target_tokenizer)
    target_size = len(target_names)
    keys = torch.zeros(0, dtype=torch.long)
    counts = torch.zeros(0, dtype=torch.long)
    source_counts = torch.zeros(len(source_names), dtype=torch.long)
    target_counts = torch.zeros(target_size, dtype=torch.long)
    target_frequency = torch.zeros(target_size, dtype=torch.long)
    pairs = 0
    texts = zip(source_texts, target_texts, strict=True)
    while batch := list(itertools.islice(texts, chunk)):
        source_ids = tokenizer([source for source, _ in batch], add_special_tokens=False)["input_ids"]
        target_ids = target_tokenizer([target for _, target in batch], add_special_tokens=False)["input_ids"]
        source_sets, in_sources = _sentence_counts(source_ids, len(source_names))
        target_sets, in_targets = _sentence_counts(target_ids, target_size)
        source_counts += in_sources
        target_counts += in_targets
        target_frequency += torch.bincount(
            torch.tensor([i for row in target_ids for i in row], dtype=torch.long), minlength=target_size
        )
        # One key per (source token, target token) of each sentence pair: s * |target vocabulary| + t.
        new = [(s[:, None] * target_size + t[None, :]).flatten() for s, t in zip(source_sets, target_sets)]
        weights = torch.cat([counts, torch.ones(sum(map(len, new)), dtype=torch.long)])
        keys, inverse = torch.unique(torch.cat([keys, *new]), return_inverse=True)
        counts = torch.zeros(len(keys), dtype=torch.long).index_add_(0, inverse, weights)
        pairs += len(batch)
    if not pairs:
        raise ExportError("No sentence pairs to build a shortlist from.")

    sources, targets = keys // target_size, keys % target_size
    together = counts.double()
    score = together * torch.log(pairs * together / (source_counts[sources] * target_counts[targets]))
    kept = (score > 0) & source_usable[sources] & target_usable[targets]
    sources, targets, score = sources[kept], targets[kept], score[kept]
    # Best first within each source token: sort by score, then (stably) by source token.
    order = torch.argsort(score, descending=True, stable=True)
    order = order[torch.argsort(sources[order], stable=True)]
    sources, targets = sources[order], targets[order]
    rank = torch.arange(len(sources)) - torch.searchsorted(sources, sources)
    candidates: dict[str, list[str]] = {}
    for source, target in zip(sources[rank < size].tolist(), targets[rank < size].tolist()):
        candidates.setdefault(source_names[source], []).append(target_names[target])
    by_frequency = torch.argsort(target_frequency, descending=True, stable=True)
    usable = by_frequency[target_usable[by_frequency] & (target_frequency[by_frequency] > 0)]
    return Shortlist([target_names[i] for i in usable[:frequent].tolist()], candidates)


def read_lines(path: str | Path) -> Iterator[str]:
    """The lines of a UTF-8 text file, without their line ends, one at a time."""
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            yield line.rstrip("\r\n")


# ---------------------------------------------------------------------------------------------------------
# ONNX


class OnnxEncoderGraph(nn.Module):
    """What `encoder.onnx` computes: the encoder states, and from them each decoder layer's cross-attention
    keys and values (Section 3.2.3: computed once per input), stacked over layers."""

    def __init__(self, model: VanillaTransformerForConditionalGeneration) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        states = self.model.get_encoder()(
            input_ids=input_ids, attention_mask=attention_mask
        ).last_hidden_state
        keys, values = [], []
        for layer in self.model.get_decoder().layers:
            attention = layer.encoder_attn
            keys.append(attention._split_heads(attention.k_proj(states), attention.d_k))
            values.append(attention._split_heads(attention.v_proj(states), attention.d_v))
        return states, torch.stack(keys, dim=1), torch.stack(values, dim=1)


class OnnxDecoderGraph(nn.Module):
    """What `decoder.onnx` computes: one call of the model's decoder and output projection over new target
    tokens, given the keys and values of the earlier steps (possibly none) and of the encoder states, as
    `generate()` runs it with its cache. Returns the logits and the new tokens' self-attention keys and
    values, stacked over layers."""

    def __init__(self, model: VanillaTransformerForConditionalGeneration) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        decoder_input_ids: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: torch.Tensor,
        past_keys: torch.Tensor,
        past_values: torch.Tensor,
        cross_keys: torch.Tensor,
        cross_values: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        past_length = past_keys.shape[3]
        layers = zip(
            past_keys.unbind(1),
            past_values.unbind(1),
            cross_keys.unbind(1),
            cross_values.unbind(1),
            strict=True,
        )
        cache = EncoderDecoderCache(list(layers))
        logits = self.model(
            encoder_outputs=(encoder_hidden_states,),
            attention_mask=encoder_attention_mask,
            decoder_input_ids=decoder_input_ids,
            past_key_values=cache,
            use_cache=True,
        ).logits
        self_attention = cache.self_attention_cache.layers
        new_keys = torch.stack([layer.keys[:, :, past_length:] for layer in self_attention], dim=1)
        new_values = torch.stack([layer.values[:, :, past_length:] for layer in self_attention], dim=1)
        return logits, new_keys, new_values


def _onnx_example_inputs(config: VanillaTransformerConfig) -> tuple[dict, dict]:
    """Example inputs for tracing each graph. Every dimension that varies gets an example size of at least 2:
    torch.export fixes dimensions of size 0 or 1."""
    batch, source, past, new = 2, 5, 3, 2
    layers, heads = config.decoder_layers, config.decoder_attention_heads
    d_k, d_v = config.decoder_head_dims
    encoder = {
        "input_ids": torch.zeros(batch, source, dtype=torch.long),
        "attention_mask": torch.ones(batch, source, dtype=torch.long),
    }
    decoder = {
        "decoder_input_ids": torch.full((batch, new), config.decoder_start_token_id),
        "encoder_hidden_states": torch.zeros(batch, source, config.d_model),
        "encoder_attention_mask": torch.ones(batch, source, dtype=torch.long),
        "past_keys": torch.zeros(batch, layers, heads, past, d_k),
        "past_values": torch.zeros(batch, layers, heads, past, d_v),
        "cross_keys": torch.zeros(batch, layers, heads, source, d_k),
        "cross_values": torch.zeros(batch, layers, heads, source, d_v),
    }
    return encoder, decoder


def export_onnx(source: ExportSource, out: str | Path, force: bool = False, opset: int | None = None) -> Path:
    """Write `source` as `encoder.onnx` and `decoder.onnx` (see `OnnxEncoderGraph`, `OnnxDecoderGraph`) with
    its config, tokenizers, generation config and `EXPORT_INFO_FILE`. Batch, source length, past length and
    new-token count are dynamic; the decoder takes a past of length 0 at the first step."""
    require_packages("onnx")
    from torch.export import Dim

    out = Path(out)
    _prepare_output(out, source, force)
    model = source.model
    encoder_inputs, decoder_inputs = _onnx_example_inputs(source.config)
    batch, length, past, new = Dim("batch"), Dim("source_length"), Dim("past_length"), Dim("new_tokens")
    source_axes = {0: batch, 1: length}
    encoder_shapes = dict.fromkeys(ONNX_ENCODER_INPUTS, source_axes)
    decoder_shapes = {
        "decoder_input_ids": {0: batch, 1: new},
        "encoder_hidden_states": source_axes,
        "encoder_attention_mask": source_axes,
        "past_keys": {0: batch, 3: past},
        "past_values": {0: batch, 3: past},
        "cross_keys": {0: batch, 3: length},
        "cross_values": {0: batch, 3: length},
    }
    graphs = (
        (OnnxEncoderGraph, encoder_inputs, encoder_shapes, ONNX_ENCODER_OUTPUTS, ONNX_ENCODER_FILE),
        (OnnxDecoderGraph, decoder_inputs, decoder_shapes, ONNX_DECODER_OUTPUTS, ONNX_DECODER_FILE),
    )
    with torch.no_grad(), warnings.catch_warnings():
        # Notes from torch's exporter that change nothing: axes sharing one Dim keep one name, and a pytree
        # deprecation inside torch itself.
        warnings.filterwarnings(
            "ignore", message=r"# The axis name: .* will not be used", category=UserWarning
        )
        warnings.filterwarnings(
            "ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning
        )
        for graph, inputs, shapes, outputs, file_name in graphs:
            torch.onnx.export(
                graph(model).eval(),
                (),
                out / file_name,
                kwargs=inputs,
                input_names=list(inputs),
                output_names=list(outputs),
                dynamic_shapes=shapes,
                opset_version=opset,
                dynamo=True,
                verbose=False,
            )
    model.config.save_pretrained(out)
    _save_companions(source, out, "onnx")
    return out


def export(
    model: str | Path,
    to: str,
    out: str | Path,
    quantization: str | None = None,
    force: bool = False,
    shortlist_from: tuple[str | Path, str | Path] | None = None,
    shortlist_size: int = 100,
) -> Path:
    """Load a model folder or Hub id and export it `to` "ctranslate2" or "onnx" (see those exporters).
    `shortlist_from` (CTranslate2 only): line-aligned source and target files to `build_shortlist` from,
    with `shortlist_size` target tokens per source token."""
    if to not in EXPORT_TARGETS:
        raise ExportError(f"Unknown export target {to!r}: choose one of {list(EXPORT_TARGETS)}.")
    for name, value in (("quantization", quantization), ("shortlist", shortlist_from)):
        if value is not None and to != "ctranslate2":
            raise ExportError(f"{name} applies to CTranslate2 exports only (--to ctranslate2).")
    missing = [str(path) for path in shortlist_from or () if not Path(path).is_file()]
    if missing:
        raise ExportError(f"No such shortlist file: {', '.join(missing)}.")
    require_packages(to)
    source = load_for_export(model)
    if to == "onnx":
        return export_onnx(source, out, force)
    shortlist = None
    if shortlist_from is not None:
        source_file, target_file = shortlist_from
        shortlist = build_shortlist(
            read_lines(source_file),
            read_lines(target_file),
            source.tokenizer,
            source.target_tokenizer,
            size=shortlist_size,
        )
    return export_ctranslate2(source, out, quantization, force, shortlist)


__all__ = [
    "CTRANSLATE2_QUANTIZATIONS",
    "EXPORT_INFO_FILE",
    "EXPORT_TARGETS",
    "ExportError",
    "ExportSource",
    "OnnxDecoderGraph",
    "OnnxEncoderGraph",
    "Shortlist",
    "VMAP_FILE",
    "build_shortlist",
    "ctranslate2_refusals",
    "ctranslate2_spec",
    "export",
    "export_ctranslate2",
    "export_onnx",
    "load_for_export",
    "read_export_info",
    "read_lines",
    "vocabulary_tokens",
]
