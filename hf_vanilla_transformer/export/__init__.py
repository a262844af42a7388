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

Modules: `common` (loading, output folders, export info), `ctranslate2_export`, `shortlist`, `onnx_graphs`;
`export` below picks one from a target name.
"""

from pathlib import Path

from .common import (
    EXPORT_INFO_FILE,
    EXPORT_TARGETS,
    ExportError,
    ExportSource,
    load_for_export,
    read_export_info,
    require_packages,
)
from .ctranslate2_export import (
    CTRANSLATE2_QUANTIZATIONS,
    ctranslate2_refusals,
    ctranslate2_spec,
    export_ctranslate2,
    vocabulary_tokens,
)
from .onnx_graphs import ONNX_DECODER_FILE, ONNX_ENCODER_FILE, OnnxDecoderGraph, OnnxEncoderGraph, export_onnx
from .shortlist import DEFAULT_SHORTLIST_SIZE, VMAP_FILE, Shortlist, build_shortlist, read_lines


def export(
    model: str | Path,
    to: str,
    out: str | Path,
    quantization: str | None = None,
    force: bool = False,
    shortlist_from: tuple[str | Path, str | Path] | None = None,
    shortlist_size: int = DEFAULT_SHORTLIST_SIZE,
) -> Path:
    """Load a model folder or Hub id and export it `to` "ctranslate2" or "onnx" (see those exporters).
    `shortlist_from` (CTranslate2 only): line-aligned source and target files to `build_shortlist` from,
    with `shortlist_size` target tokens per source token."""
    if to not in EXPORT_TARGETS:
        raise ExportError(f"Unknown export target {to!r}: choose one of {list(EXPORT_TARGETS)}.")
    for name, value in (
        ("quantization (--quantization)", quantization),
        ("shortlist (--shortlist-from)", shortlist_from),
    ):
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
        try:
            shortlist = build_shortlist(
                read_lines(source_file),
                read_lines(target_file),
                source.tokenizer,
                source.target_tokenizer,
                size=shortlist_size,
            )
        except ValueError as error:  # files of different lengths, or not UTF-8
            raise ExportError(str(error)) from None
    return export_ctranslate2(source, out, quantization, force, shortlist)


__all__ = [
    "ONNX_DECODER_FILE",
    "ONNX_ENCODER_FILE",
    "CTRANSLATE2_QUANTIZATIONS",
    "DEFAULT_SHORTLIST_SIZE",
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
    "require_packages",
    "vocabulary_tokens",
]
