"""One way to translate with this package's models on three engines, one module each, all behind one
interface (`Engine`) and found by name in one registry (`ENGINE_REGISTRY`, `get_engine`):

- `torch`: the model as `save_pretrained` wrote it (folder or Hub id), with its own `generate()`.
- `ctranslate2`: a folder written by `export_ctranslate2`, decoded by `CTranslate2Seq2SeqLM` with
  CTranslate2's own search at the nearest settings (`ctranslate2_options`), on the CPU or an NVIDIA GPU.
- `onnx`: a folder written by `export_onnx`, decoded by `OnnxSeq2SeqLM`, a transformers model whose
  forward runs the exported graphs, so that transformers' `generate()` with the paper's decoding rules runs
  unchanged on top; on the CPU.

Each exported engine has its exporter beside its runtime: `ctranslate2_export` writes the CTranslate2
`TransformerSpec` built from the config and weights (optionally with a vocabulary shortlist), `onnx_graphs`
the encoder and the decoder with past keys and values, through the model's own forward; `export_common`
holds what both share (loading, output folders, the export info). `export(model, to, out)` writes a model
for an engine of `EXPORT_TARGETS`. `inference.load_translator(path, engine)` reads any of them (the engine
is read from its `EXPORT_INFO_FILE` when not given, `detect_engine`).

The exports' position tables have `max_position_embeddings` rows: inputs longer than that are refused on
both exported engines; CTranslate2 stops outputs at the table's end, ONNX raises there. docs/export.md says
what each engine reproduces of the PyTorch model's decoding.

Modules: `base` (the `Engine` interface and what the exported engines share), `torch`, `ctranslate2` and
`ctranslate2_export`, `onnx` and `onnx_graphs` (one engine each), `export_common`, `registry` and
`exporting`.
"""

from typing import TYPE_CHECKING

from ...lazy_exports import lazy_exports

if TYPE_CHECKING:
    from .base import Engine, LoadOptions, detect_engine
    from .ctranslate2 import (
        CTranslate2Engine,
        CTranslate2Options,
        CTranslate2Seq2SeqLM,
        check_ctranslate2_device,
        ctranslate2_options,
    )
    from .ctranslate2_export import (
        ctranslate2_refusals,
        ctranslate2_spec,
        ctranslate2_vocabulary,
        export_ctranslate2,
    )
    from .export_common import ExportError, ExportSource, export_info, load_for_export, require_packages
    from .exporting import export
    from .names import (
        CTRANSLATE2_COMPUTE_TYPES,
        CTRANSLATE2_DEVICES,
        CTRANSLATE2_QUANTIZATIONS,
        DEFAULT_SHORTLIST_SIZE,
        ENGINES,
        EXPORT_TARGETS,
    )
    from .onnx import OnnxEncoderOutput, OnnxEngine, OnnxSeq2SeqLM
    from .onnx_graphs import (
        ONNX_DECODER_FILE,
        ONNX_DECODER_INPUTS,
        ONNX_ENCODER_FILE,
        ONNX_ENCODER_INPUTS,
        OnnxDecoderGraph,
        OnnxEncoderGraph,
        export_onnx,
    )
    from .registry import ENGINE_REGISTRY, get_engine
    from .torch import TorchEngine

__all__ = [
    "CTRANSLATE2_COMPUTE_TYPES",
    "CTRANSLATE2_DEVICES",
    "CTRANSLATE2_QUANTIZATIONS",
    "DEFAULT_SHORTLIST_SIZE",
    "ENGINES",
    "ENGINE_REGISTRY",
    "EXPORT_TARGETS",
    "ONNX_DECODER_FILE",
    "ONNX_DECODER_INPUTS",
    "ONNX_ENCODER_FILE",
    "ONNX_ENCODER_INPUTS",
    "CTranslate2Engine",
    "CTranslate2Options",
    "CTranslate2Seq2SeqLM",
    "Engine",
    "ExportError",
    "ExportSource",
    "LoadOptions",
    "OnnxDecoderGraph",
    "OnnxEncoderGraph",
    "OnnxEncoderOutput",
    "OnnxEngine",
    "OnnxSeq2SeqLM",
    "TorchEngine",
    "check_ctranslate2_device",
    "ctranslate2_options",
    "ctranslate2_refusals",
    "ctranslate2_spec",
    "ctranslate2_vocabulary",
    "detect_engine",
    "export",
    "export_ctranslate2",
    "export_info",
    "export_onnx",
    "get_engine",
    "load_for_export",
    "require_packages",
]

__getattr__, __dir__ = lazy_exports(__name__, __file__)
