"""fairseq translation checkpoints into this package's format.

fairseq's `transformer` architectures (`transformer_wmt_en_de`, `transformer_vaswani_wmt_en_de_big`, ...)
are the paper's post-LN Transformer with fairseq's sinusoids (`sinusoidal_layout="fairseq"`: other
frequencies, positions counted from pad + 1), a decoder that starts from `</s>`, and shared or separate
source/target vocabularies. Their pre-LN variants and BART-style additions compute something else and are
refused, not approximated. Checkpoints are read without running their pickled code.
"""

import _compat_pickle
import argparse
import pickle
import pickletools
import re
import zipfile
from pathlib import Path
from typing import Any, ClassVar

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from .. import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from ..common.model_location import TARGET_TOKENIZER_DIR
from ..common.text_lines import iter_lines
from ..common.tokenization import BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, SPECIAL_TOKENS, UNK_TOKEN, wrap_tokenizer
from ..vanilla_transformer.generation_vanilla_transformer import paper_generation_config
from .common import (
    FAIRSEQ_BPE_FILES,
    ConversionError,
    ConversionReport,
    load_converted_state,
    save_converted_model,
)

# fairseq's `base_architecture` values, which it also applies to checkpoints whose args predate a field.
_FAIRSEQ_DEFAULTS: dict[str, Any] = {
    "encoder_embed_dim": 512,
    "encoder_ffn_embed_dim": 2048,
    "encoder_layers": 6,
    "encoder_attention_heads": 8,
    "decoder_layers": 6,
    "decoder_attention_heads": 8,
    "encoder_normalize_before": False,
    "decoder_normalize_before": False,
    "encoder_learned_pos": False,
    "decoder_learned_pos": False,
    "activation_fn": "relu",
    "dropout": 0.1,
    "attention_dropout": 0.0,
    "share_decoder_input_output_embed": False,
    "share_all_embeddings": False,
    "no_token_positional_embeddings": False,
    "adaptive_input": False,
    "adaptive_softmax_cutoff": None,
    "no_cross_attention": False,
    "cross_self_attention": False,
    "no_scale_embedding": False,
    "layernorm_embedding": False,
    "max_source_positions": 1024,
    "max_target_positions": 1024,
}
# fairseq's activation names with an exact counterpart here ("gelu" is the erf form in both).
_FAIRSEQ_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish"}
# Globals torch's weights-only unpickler resolves itself; every other global gets an inert stand-in.
_RESOLVED_BY_TORCH = {"collections.OrderedDict", "_codecs.encode", "argparse.Namespace"}
_INTERPOLATION = re.compile(r"\$\{([\w.]+)\}")


class _OpaquePickledObject:
    """Inert stand-in for an object whose class the checkpoint names (numpy scalars, omegaconf nodes,
    anything else): it keeps the arguments and state it was pickled with and runs none of that class's
    code, so nothing a checkpoint names can execute."""

    pickled_name: ClassVar[str] = ""

    def __new__(cls, *args: Any, **kwargs: Any) -> "_OpaquePickledObject":
        instance = super().__new__(cls)
        instance.args = args
        instance.state = None
        return instance

    def __setstate__(self, state: Any) -> None:
        self.state = state


def _pickle_globals(path: Path) -> set[str]:
    """Every `module.name` global the checkpoint's pickle refers to, read by disassembly, not unpickling."""
    names = set()
    with open(path, "rb") as handle:
        if zipfile.is_zipfile(handle):
            with zipfile.ZipFile(handle) as archive:
                pickles = [name for name in archive.namelist() if name.endswith("data.pkl")]
                if not pickles:
                    raise ValueError("a zip archive without data.pkl")
                with archive.open(pickles[0]) as stream:
                    operations = list(pickletools.genops(stream))
        else:
            # torch's legacy format: magic number, protocol, system info, then the object, each a pickle.
            handle.seek(0)
            operations = [op for _ in range(4) for op in pickletools.genops(handle)]
    for opcode, argument, _ in operations:
        if opcode.name == "GLOBAL":
            module, name = argument.split(" ", 1)
            # Protocol-2 pickles name Python 2 modules; the unpickler maps them, so the stand-ins must too.
            if (module, name) in _compat_pickle.NAME_MAPPING:
                module, name = _compat_pickle.NAME_MAPPING[(module, name)]
            module = _compat_pickle.IMPORT_MAPPING.get(module, module)
            names.add(f"{module}.{name}")
    return names


def load_fairseq_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a fairseq checkpoint without running any code it names.

    fairseq pickles an `argparse.Namespace` ('args'), in some versions omegaconf objects ('cfg'), numpy
    scalars and its own classes next to the tensors. `torch.load(weights_only=True)` refuses all of them,
    and `weights_only=False` would run whatever the pickle says. So the pickle's globals are listed by
    disassembly first; `argparse.Namespace` is allowed as itself (it only stores attributes), tensors are
    rebuilt by torch, and every other global is allowed only as an inert `_OpaquePickledObject` stand-in,
    all within `torch.serialization.safe_globals` so the allowlist does not outlive the call. torch still
    blocks `os`, `sys` and the like outright.

    Raises:
        ConversionError: the file is missing, not a torch checkpoint, or not a dict with 'model'.
    """
    path = Path(path)
    if not path.is_file():
        raise ConversionError(f"fairseq checkpoint {path} not found.")
    try:
        names = _pickle_globals(path)
        stand_ins = [
            (type(name, (_OpaquePickledObject,), {"pickled_name": name}), name)
            for name in sorted(names)
            if not name.startswith("torch.") and name not in _RESOLVED_BY_TORCH
        ]
        with torch.serialization.safe_globals([argparse.Namespace, *stand_ins]):
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, ValueError, RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile) as error:
        raise ConversionError(f"Cannot read {path} as a fairseq checkpoint: {error}") from error
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("model"), dict):
        raise ConversionError(
            f"{path} is not a fairseq checkpoint: expected a dict with the state dict under 'model'."
        )
    return checkpoint


def _plain(value: Any) -> Any:
    """`value` as plain Python: Namespaces and omegaconf containers (as pickled stand-ins) become dicts
    and lists, omegaconf value nodes their values; other stand-ins stay opaque."""
    if isinstance(value, argparse.Namespace):
        value = vars(value)
    if isinstance(value, _OpaquePickledObject) and isinstance(value.state, dict):
        module = value.pickled_name.rpartition(".")[0]
        if value.pickled_name.endswith(("DictConfig", "ListConfig")):
            value = value.state.get("_content")
        elif module == "omegaconf.nodes":
            value = value.state.get("_val")
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _resolve(value: Any, root: dict[str, Any]) -> Any:
    """An omegaconf interpolation `${a.b}` replaced by entry a.b of `root`; anything else unchanged."""
    match = _INTERPOLATION.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        return value
    node: Any = root
    for part in match.group(1).split("."):
        if not isinstance(node, dict) or part not in node:
            return value
        node = node[part]
    return _resolve(node, root)


def fairseq_model_args(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The model's hyperparameters under fairseq's flat argparse names (`encoder_embed_dim`, ...).

    From 'args' (an argparse Namespace, fairseq up to 0.10) or else 'cfg' (newer fairseq: a dict, or
    pickled omegaconf containers): its 'model' section, with `encoder`/`decoder` sub-sections flattened
    (`encoder.embed_dim` -> `encoder_embed_dim`), interpolations resolved, and `source_lang` /
    `target_lang` taken from its 'task' section.
    """
    if checkpoint.get("args") is not None:
        values = _plain(checkpoint["args"])
        if not isinstance(values, dict):
            raise ConversionError(f"The checkpoint's 'args' is a {type(checkpoint['args']).__name__}.")
        return values
    cfg = _plain(checkpoint.get("cfg"))
    if not isinstance(cfg, dict) or not isinstance(cfg.get("model"), dict):
        raise ConversionError(
            "The checkpoint has neither 'args' nor a 'cfg' with a 'model' section: "
            "cannot tell its architecture."
        )
    values = {}
    for key, value in cfg["model"].items():
        if key in ("encoder", "decoder") and isinstance(value, dict):
            values.update({f"{key}_{name}": item for name, item in value.items()})
        else:
            values[key] = value
    task = cfg.get("task") if isinstance(cfg.get("task"), dict) else {}
    for key in ("source_lang", "target_lang"):
        values.setdefault(key, task.get(key))
    return {key: _resolve(value, cfg) for key, value in values.items()}


def read_fairseq_dictionary(path: str | Path) -> list[str]:
    """The symbols of a fairseq dictionary file in id order: `<s>`, `<pad>`, `</s>`, `<unk>` (ids 0-3),
    then one per line of `token count [#fairseq:overwrite]`, as fairseq's `Dictionary.add_from_file` reads
    them. A repeated token, which fairseq accepts only with the overwrite flag and then gives a second id,
    is refused: a vocabulary maps each token to one id."""
    path = Path(path)
    if not path.is_file():
        raise ConversionError(
            f"Dictionary {path} not found: --data-dir must hold fairseq's dict.<source>.txt and "
            "dict.<target>.txt (the files the checkpoint was trained with)."
        )
    symbols = list(SPECIAL_TOKENS)
    seen = set(symbols)
    for number, line in enumerate(iter_lines(path), start=1):
        fields = line.rstrip().rsplit(" ", 1)
        if len(fields) == 2 and fields[1] == "#fairseq:overwrite":
            fields = fields[0].rsplit(" ", 1)
        if len(fields) != 2 or not fields[1].lstrip("-").isdigit():
            raise ConversionError(f"{path}, line {number}: expected '<token> <count> [flags]', got {line!r}.")
        token = fields[0]
        if token in seen:
            raise ConversionError(f"{path}, line {number}: token {token!r} appears twice.")
        seen.add(token)
        symbols.append(token)
    return symbols


def _fairseq_refusals(args: dict[str, Any], keys: set[str]) -> list[str]:
    """Why this checkpoint is not the paper's post-LN Transformer, one reason per feature; empty if it is."""
    reasons = []
    pre_ln = [
        f"{side}_normalize_before=True" for side in ("encoder", "decoder") if args[f"{side}_normalize_before"]
    ]
    pre_ln += [
        f"{key} present" for key in ("encoder.layer_norm.weight", "decoder.layer_norm.weight") if key in keys
    ]
    if pre_ln:
        reasons.append(
            f"pre-LN layers ({', '.join(pre_ln)}); this package implements the paper's post-LN residual "
            "blocks LayerNorm(x + Sublayer(x)), and pre-LN weights would compute something else"
        )
    if args["layernorm_embedding"] or any("layernorm_embedding" in key for key in keys):
        reasons.append("a LayerNorm after the embeddings (layernorm_embedding, as in BART)")
    learned = [f"{side}_learned_pos=True" for side in ("encoder", "decoder") if args[f"{side}_learned_pos"]]
    learned += [f"{key} present" for key in sorted(keys) if key.endswith("embed_positions.weight")]
    if learned:
        reasons.append(f"learned positional embeddings ({', '.join(learned)})")
    flags = {
        "no_token_positional_embeddings": "no positional encodings",
        "adaptive_input": "adaptive input embeddings",
        "adaptive_softmax_cutoff": "an adaptive softmax",
        "cross_self_attention": "cross+self-attention",
        "no_cross_attention": "a decoder without encoder-decoder attention",
    }
    reasons += [f"{description} ({name}={args[name]!r})" for name, description in flags.items() if args[name]]
    if args["activation_fn"] not in _FAIRSEQ_ACTIVATIONS:
        reasons.append(f"activation_fn={args['activation_fn']!r} (supported: {sorted(_FAIRSEQ_ACTIVATIONS)})")
    dims = {name: args[name] for name in ("decoder_embed_dim", "decoder_input_dim", "decoder_output_dim")}
    if any(value != args["encoder_embed_dim"] for value in dims.values()):
        reasons.append(f"model widths that differ (encoder_embed_dim={args['encoder_embed_dim']}, {dims})")
    if "encoder.embed_tokens.weight" not in keys:
        reasons.append("no encoder.embed_tokens.weight: not an encoder-decoder translation model")
    return reasons


def config_from_fairseq(
    args: dict[str, Any], source_vocab_size: int, target_vocab_size: int, state_keys: set[str], source: str
) -> VanillaTransformerConfig:
    """The configuration that reproduces a fairseq `transformer` checkpoint, from its model args (fairseq's
    flat names, as `fairseq_model_args` returns them) and dictionary sizes.

    Raises:
        ConversionError: listing every feature of the checkpoint that this package does not implement
            (pre-LN, learned positions, layernorm_embedding, adaptive softmax, ...).
    """
    args = {**_FAIRSEQ_DEFAULTS, **{key: value for key, value in args.items() if value is not None}}
    for key in ("decoder_embed_dim", "decoder_ffn_embed_dim"):
        args.setdefault(key, args[key.replace("decoder", "encoder")])
    for key in ("decoder_input_dim", "decoder_output_dim"):
        args.setdefault(key, args["decoder_embed_dim"])
    # fairseq before 2019 called the dropout after the feed-forward ReLU relu_dropout.
    args.setdefault("activation_dropout", args.get("relu_dropout", 0.0))
    arch = args.get("arch") or args.get("_name") or "unknown"
    reasons = _fairseq_refusals(args, state_keys)
    if reasons:
        raise ConversionError(
            f"Cannot convert {source} (arch {arch!r}): it has " + "; ".join(reasons) + ". Only fairseq "
            "`transformer` models in the paper's form (post-LN, sinusoidal positions; e.g. "
            "transformer_wmt_en_de, transformer_vaswani_wmt_en_de_big) convert exactly."
        )
    shared = bool(args["share_all_embeddings"])
    try:
        return VanillaTransformerConfig(
            vocab_size=source_vocab_size,
            decoder_vocab_size=target_vocab_size,
            d_model=args["encoder_embed_dim"],
            encoder_layers=args["encoder_layers"],
            decoder_layers=args["decoder_layers"],
            encoder_attention_heads=args["encoder_attention_heads"],
            decoder_attention_heads=args["decoder_attention_heads"],
            encoder_ffn_dim=args["encoder_ffn_embed_dim"],
            decoder_ffn_dim=args["decoder_ffn_embed_dim"],
            dropout=float(args["dropout"]),
            attention_dropout=float(args["attention_dropout"]),
            activation_dropout=float(args["activation_dropout"]),
            activation_function=_FAIRSEQ_ACTIVATIONS[args["activation_fn"]],
            max_position_embeddings=max(args["max_source_positions"], args["max_target_positions"]),
            sinusoidal_layout="fairseq",
            scale_embedding=not args["no_scale_embedding"],
            share_encoder_decoder_embeddings=shared,
            tie_word_embeddings=shared or bool(args["share_decoder_input_output_embed"]),
            output_bias=False,
            bos_token_id=SPECIAL_TOKENS.index(BOS_TOKEN),
            pad_token_id=SPECIAL_TOKENS.index(PAD_TOKEN),
            eos_token_id=SPECIAL_TOKENS.index(EOS_TOKEN),
            # fairseq feeds the decoder </s> as its first input (prev_output_tokens), not <s>.
            decoder_start_token_id=SPECIAL_TOKENS.index(EOS_TOKEN),
        )
    except ValueError as error:
        raise ConversionError(f"Cannot convert {source} (arch {arch!r}): {error}") from error


_FAIRSEQ_IGNORED = re.compile(r"^(encoder|decoder)\.(version|embed_positions\._float_tensor)$")
_FAIRSEQ_IN_PROJ = re.compile(r"^(.+\.(?:self_attn|encoder_attn))\.in_proj_(weight|bias)$")
# Pre-2019 fairseq numbered each layer's LayerNorms; its own upgrade_state_dict_named renames them so.
_FAIRSEQ_LAYER_NORMS = {
    "encoder": ("self_attn_layer_norm", "final_layer_norm"),
    "decoder": ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"),
}
_FAIRSEQ_OLD_LAYER_NORM = re.compile(r"^(encoder|decoder)(\.layers\.\d+\.)layer_norms\.(\d+)\.")


def _fairseq_key(key: str, shared_embeddings: bool) -> str:
    """This package's name for a fairseq state-dict key (after any in_proj split)."""
    if key in ("decoder.output_projection.weight", "decoder.embed_out"):
        return "lm_head.weight"
    if key == "encoder.embed_tokens.weight" and shared_embeddings:
        return "model.shared.weight"
    old_norm = _FAIRSEQ_OLD_LAYER_NORM.match(key)
    if old_norm:
        side, layer, index = old_norm.groups()
        names = _FAIRSEQ_LAYER_NORMS[side]
        if int(index) >= len(names):
            raise ConversionError(f"Unknown fairseq LayerNorm {key}: {side} layers have {len(names)}.")
        key = f"{side}{layer}{names[int(index)]}." + key[old_norm.end() :]
    key = re.sub(r"\.(fc1|fc2)\.", r".ffn.\1.", key)
    return f"model.{key}"


def state_dict_from_fairseq(
    fairseq_state: dict[str, torch.Tensor],
    config: VanillaTransformerConfig,
    report: ConversionReport | None = None,
) -> dict[str, torch.Tensor]:
    """Rename a fairseq transformer state dict to this package's parameter names.

    Splits the old fused `in_proj_weight` / `in_proj_bias` into q, k, v (in that order, as fairseq's
    MultiheadAttention.upgrade_state_dict_named does), renames old `layer_norms.N`, maps
    `decoder.output_projection.weight` or the older `decoder.embed_out` to `lm_head.weight`, drops
    fairseq's bookkeeping (`*.version`, `embed_positions._float_tensor`), and checks that the embeddings
    the config ties are equal in the checkpoint.
    """
    converted: dict[str, torch.Tensor] = {}
    sources: dict[str, str] = {}
    for key, tensor in fairseq_state.items():
        if not isinstance(tensor, torch.Tensor):
            raise ConversionError(f"State dict entry {key} is a {type(tensor).__name__}, not a tensor.")
        if _FAIRSEQ_IGNORED.match(key):
            if report:
                report.record(key, "(ignored: fairseq bookkeeping / computed sinusoids)")
            continue
        in_proj = _FAIRSEQ_IN_PROJ.match(key)
        if in_proj:
            prefix, kind = in_proj.groups()
            if tensor.shape[0] % 3:
                raise ConversionError(f"{key} has {tensor.shape[0]} rows, not a multiple of 3 (q, k, v).")
            for name, part in zip(("q", "k", "v"), tensor.chunk(3, dim=0), strict=True):
                ours = _fairseq_key(f"{prefix}.{name}_proj.{kind}", config.share_encoder_decoder_embeddings)
                converted[ours], sources[ours] = part, key
            if report:
                report.record(key, ours.replace(".v_proj.", ".{q,k,v}_proj.") + " (split)")
            continue
        ours = _fairseq_key(key, config.share_encoder_decoder_embeddings)
        if ours in converted:
            raise ConversionError(f"{key} and {sources[ours]} both map to {ours}.")
        converted[ours], sources[ours] = tensor, key
        if report:
            report.record(key, ours)
    _check_ties(converted, sources, config)
    return converted


def _check_ties(
    state: dict[str, torch.Tensor], sources: dict[str, str], config: VanillaTransformerConfig
) -> None:
    """Tied embeddings are stored under every name; loading unequal copies would silently keep one."""
    groups = []
    if config.share_encoder_decoder_embeddings:
        groups.append(["model.shared.weight", "model.decoder.embed_tokens.weight", "lm_head.weight"])
    elif config.tie_word_embeddings:
        groups.append(["model.decoder.embed_tokens.weight", "lm_head.weight"])
    for group in groups:
        present = [key for key in group if key in state]
        for key in present[1:]:
            if state[key].shape != state[present[0]].shape or not torch.equal(state[key], state[present[0]]):
                raise ConversionError(
                    f"{sources[key]} differs from {sources[present[0]]}, but the checkpoint's args share "
                    "them (share_all_embeddings / share_decoder_input_output_embed)."
                )


def _bpe_style(symbols: list[str]) -> tuple[decoders.Decoder | None, str]:
    """A decoder that joins the dictionary's subword pieces back into words, and what it expects as input."""
    if any(symbol.endswith("@@") for symbol in symbols):
        decoder = decoders.Sequence(
            [
                decoders.Replace(Regex("$"), " "),  # a space after every piece ...
                decoders.Replace("@@ ", ""),  # ... except after "@@" continuation pieces
                decoders.Fuse(),
                # The last space goes by a regex: tokenizers' Strip panics on an empty output (say, a
                # translation that is only </s>).
                decoders.Replace(Regex(" $"), ""),
            ]
        )
        return decoder, "subword-nmt/fastBPE pieces ('@@ ' continuation marks)"
    if any(symbol.startswith("\u2581") for symbol in symbols):
        return decoders.Metaspace(), "SentencePiece pieces ('\u2581' word starts)"
    return None, "whole words"


def tokenizer_from_fairseq_dictionary(
    symbols: list[str], model_max_length: int = 1024
) -> PreTrainedTokenizerFast:
    """A `PreTrainedTokenizerFast` over a fairseq dictionary: input is text already split into the
    dictionary's pieces by spaces (after Moses tokenization and BPE, as fairseq-preprocess saw it).

    It maps each piece to its fairseq id (`<unk>` for unknown ones) and appends `</s>`, exactly as fairseq's
    `Dictionary.encode_line`; decoding joins BPE pieces back into (Moses-tokenized) words. It does not
    tokenize or apply BPE itself: Moses tokenization cannot be reproduced with the `tokenizers` library.
    """
    vocab = {symbol: index for index, symbol in enumerate(symbols)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK_TOKEN))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    decoder, _ = _bpe_style(symbols)
    if decoder is not None:
        tokenizer.decoder = decoder
    return wrap_tokenizer(tokenizer, model_max_length)


def bpe_file_name(codes: Path) -> str:
    """The name a copy of the BPE codes `codes` takes in a converted folder: one of `FAIRSEQ_BPE_FILES`, which
    fairseq's hub loader and `publishing.stage_repo` look for; a SentencePiece model (`.model`) is
    "sentencepiece.bpe.model", other codes (subword-nmt, fastBPE) "bpecodes"."""
    if codes.name in FAIRSEQ_BPE_FILES:
        return codes.name
    return "sentencepiece.bpe.model" if codes.suffix == ".model" else "bpecodes"


def convert_fairseq_checkpoint(
    checkpoint_path: str | Path,
    data_dir: str | Path,
    out: str | Path,
    source_lang: str | None = None,
    target_lang: str | None = None,
    bpe_codes: str | Path | None = None,
) -> ConversionReport:
    """Convert a fairseq `transformer` checkpoint and its dictionaries into a save_pretrained folder.

    Writes the model (float32 safetensors, config, `paper_generation_config`), the source-side tokenizer
    (`tokenizer_from_fairseq_dictionary`), a `target_tokenizer/` subfolder when the target dictionary
    differs, and a copy of the BPE codes (`bpe_codes`, else the first of `FAIRSEQ_BPE_FILES` in
    `data_dir`, the names fairseq's own hub loader looks for), under the name `bpe_file_name` gives it.

    Args:
        checkpoint_path: fairseq's `model.pt` / `checkpoint_best.pt` (read by `load_fairseq_checkpoint`).
        data_dir: the folder with `dict.{source_lang}.txt` and `dict.{target_lang}.txt`.
        out: the output folder.
        source_lang / target_lang: default to the checkpoint's own (args.source_lang / task.source_lang).
        bpe_codes: the BPE codes or SentencePiece model to copy next to the model.

    Raises:
        ConversionError: naming the missing file, the mismatching size or key, or the unsupported feature.
    """
    checkpoint_path, data_dir, out = Path(checkpoint_path), Path(data_dir), Path(out)
    candidates = [Path(bpe_codes)] if bpe_codes else [data_dir / name for name in FAIRSEQ_BPE_FILES]
    codes = next((path for path in candidates if path.is_file()), None)
    if bpe_codes and codes is None:
        raise ConversionError(f"BPE codes {bpe_codes} not found.")
    # Read now: they may lie in `out`, where saving the model removes an earlier model's BPE codes.
    codes_bytes = codes.read_bytes() if codes is not None else b""
    checkpoint = load_fairseq_checkpoint(checkpoint_path)
    args = fairseq_model_args(checkpoint)
    state = checkpoint["model"]
    languages = {
        "source": source_lang or args.get("source_lang"),
        "target": target_lang or args.get("target_lang"),
    }
    for side, language in languages.items():
        if not language:
            raise ConversionError(
                f"{checkpoint_path} does not record its {side} language: pass --{side}-lang "
                f"(the XX of dict.XX.txt in {data_dir})."
            )
    dictionaries = {side: data_dir / f"dict.{language}.txt" for side, language in languages.items()}
    symbols = {side: read_fairseq_dictionary(path) for side, path in dictionaries.items()}
    for side, key in (("source", "encoder.embed_tokens.weight"), ("target", "decoder.embed_tokens.weight")):
        if key in state and state[key].shape[0] != len(symbols[side]):
            raise ConversionError(
                f"{dictionaries[side]} defines {len(symbols[side])} symbols ({len(SPECIAL_TOKENS)} "
                f"special + {len(symbols[side]) - len(SPECIAL_TOKENS)} lines) but {key} in "
                f"{checkpoint_path.name} has {state[key].shape[0]} rows: the dictionary does not belong to "
                "this checkpoint."
            )
    source = f"fairseq checkpoint {checkpoint_path}"
    config = config_from_fairseq(args, len(symbols["source"]), len(symbols["target"]), set(state), source)
    if config.share_encoder_decoder_embeddings and symbols["source"] != symbols["target"]:
        raise ConversionError(
            f"{checkpoint_path} shares all embeddings, but {dictionaries['source']} and "
            f"{dictionaries['target']} differ: they must be the joined dictionary it was trained with."
        )

    report = ConversionReport(source=source, output=str(out))
    model = VanillaTransformerForConditionalGeneration(config)
    load_converted_state(model, state_dict_from_fairseq(state, config, report), source)
    model.generation_config = paper_generation_config(config)
    save_converted_model(model, out)

    dtypes = sorted(
        {str(tensor.dtype).removeprefix("torch.") for tensor in state.values() if tensor.is_floating_point()}
    )
    vocabulary = "shared" if config.share_encoder_decoder_embeddings else "separate source/target"
    report.notes.append(
        f"Model: {args.get('arch') or args.get('_name')}, d_model {config.d_model}, "
        f"{config.encoder_layers}+{config.decoder_layers} layers, {config.encoder_attention_heads} heads, "
        f"d_ff {config.encoder_ffn_dim}, {vocabulary} vocabularies of {config.vocab_size}/"
        f"{config.decoder_vocab_size}; weights {'/'.join(dtypes)} in the checkpoint, saved as float32."
    )
    report.notes.append(
        "Generation config: the paper's decoding (beam 4, GNMT length penalty 0.6, input + 50)."
    )
    _save_fairseq_tokenizers(symbols, config, out, report)
    if codes is not None:
        copy = out / bpe_file_name(codes)
        copy.write_bytes(codes_bytes)
        report.notes.append(f"BPE codes: {codes} copied to {copy}.")
    else:
        report.notes.append(
            f"No BPE codes ({', '.join(FAIRSEQ_BPE_FILES)}) in {data_dir}: pass --bpe-codes to copy them."
        )
    return report


def _save_fairseq_tokenizers(
    symbols: dict[str, list[str]], config: VanillaTransformerConfig, out: Path, report: ConversionReport
) -> None:
    max_length = config.max_position_embeddings
    tokenizer_from_fairseq_dictionary(symbols["source"], max_length).save_pretrained(out)
    where = f"{out}"
    if symbols["target"] != symbols["source"]:
        tokenizer_from_fairseq_dictionary(symbols["target"], max_length).save_pretrained(
            out / TARGET_TOKENIZER_DIR
        )
        where += (
            f" (source side; target side in {out / TARGET_TOKENIZER_DIR}, for decoding outputs and labels)"
        )
    _, pieces = _bpe_style(symbols["source"])
    report.notes.append(
        f"Tokenizer in {where}: the fairseq dictionary as a word-level vocabulary over {pieces}. It does NOT "
        "tokenize raw text: first apply the preprocessing the model was trained with (Moses tokenization, "
        "then BPE with the copied codes; docs/converting.md has the exact steps for fairseq's WMT models), "
        "and Moses-detokenize what it decodes."
    )
