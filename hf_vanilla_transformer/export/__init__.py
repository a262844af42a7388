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

Modules: `common` (loading, output folders, export info), `ctranslate2_export`, `shortlist`, `onnx_graphs`.
Each engine of `engines` owns its exporter: `engines.export` loads a model and exports it for one by name.
"""

import importlib
import warnings
from typing import Any

from ..model_location import EXPORT_INFO_FILE, read_export_info
from .common import (
    ExportError,
    ExportSource,
    load_for_export,
    require_packages,
)
from .ctranslate2_export import (
    CTRANSLATE2_QUANTIZATIONS,
    ctranslate2_refusals,
    ctranslate2_spec,
    export_ctranslate2,
    vocabulary_tokens,
)
from .onnx_graphs import (
    ONNX_DECODER_FILE,
    ONNX_DECODER_INPUTS,
    ONNX_ENCODER_FILE,
    ONNX_ENCODER_INPUTS,
    OnnxDecoderGraph,
    OnnxEncoderGraph,
    export_onnx,
)
from .shortlist import DEFAULT_SHORTLIST_SIZE, VMAP_FILE, Shortlist, build_shortlist, read_lines

# Names that moved to `engines`, which dispatches to the engine an export is for: the old paths still work,
# with a DeprecationWarning (`__getattr__`).
_MOVED_TO_ENGINES = ("EXPORT_TARGETS", "export")


def __getattr__(name: str) -> Any:
    if name not in _MOVED_TO_ENGINES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"hf_vanilla_transformer.export.{name} moved: import it from hf_vanilla_transformer.engines.",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module("hf_vanilla_transformer.engines"), name)


__all__ = [
    "ONNX_DECODER_FILE",
    "ONNX_DECODER_INPUTS",
    "ONNX_ENCODER_FILE",
    "ONNX_ENCODER_INPUTS",
    "CTRANSLATE2_QUANTIZATIONS",
    "DEFAULT_SHORTLIST_SIZE",
    "EXPORT_INFO_FILE",
    "ExportError",
    "ExportSource",
    "OnnxDecoderGraph",
    "OnnxEncoderGraph",
    "Shortlist",
    "VMAP_FILE",
    "build_shortlist",
    "ctranslate2_refusals",
    "ctranslate2_spec",
    "export_ctranslate2",
    "export_onnx",
    "load_for_export",
    "read_export_info",
    "read_lines",
    "require_packages",
    "vocabulary_tokens",
]
