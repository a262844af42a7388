"""One way to translate with this package's models on three engines, one module each, all behind one
interface (`Engine`) and found by name in one registry (`ENGINE_REGISTRY`, `get_engine`):

- `torch`: the model as `save_pretrained` wrote it (folder or Hub id), with its own `generate()`.
- `ctranslate2`: a folder written by `export.export_ctranslate2`, decoded by `CTranslate2Seq2SeqLM` with
  CTranslate2's own search at the nearest settings (`ctranslate2_options`), on the CPU or an NVIDIA GPU.
- `onnx`: a folder written by `export.export_onnx`, decoded by `OnnxSeq2SeqLM`, a transformers model whose
  forward runs the exported graphs, so that transformers' `generate()` with the paper's decoding rules runs
  unchanged on top; on the CPU.

`load_translator(path, engine)` reads a model folder, Hub id or exported folder (the engine is read from its
`EXPORT_INFO_FILE` when not given, `detect_engine`), and `Translator.translate(sentences)` translates them
with `translation.translate`: the same length-sorted batches, blank-line handling, target tokenizer and
detokenization on every engine. `export(model, to, out)` writes a model for an engine of `EXPORT_TARGETS`.

The exports' position tables have `max_position_embeddings` rows: inputs longer than that are refused on
both exported engines; CTranslate2 stops outputs at the table's end, ONNX raises there. docs/export.md says
what each engine reproduces of the PyTorch model's decoding.

Modules: `base` (the `Engine` interface and what the exported engines share), `torch`, `ctranslate2`,
`onnx` (one engine each), `registry`, `exporting` and `translator`.
"""

from .base import Engine, LoadOptions, detect_engine, export_info
from .ctranslate2 import (
    CTRANSLATE2_COMPUTE_TYPES,
    CTRANSLATE2_DEVICES,
    CTranslate2Engine,
    CTranslate2Options,
    CTranslate2Seq2SeqLM,
    check_ctranslate2_device,
    ctranslate2_options,
)
from .exporting import export
from .onnx import OnnxEncoderOutput, OnnxEngine, OnnxSeq2SeqLM
from .registry import ENGINE_REGISTRY, ENGINES, EXPORT_TARGETS, get_engine
from .torch import TorchEngine
from .translator import Translator, load_model, load_translator

__all__ = [
    "CTRANSLATE2_COMPUTE_TYPES",
    "CTRANSLATE2_DEVICES",
    "ENGINES",
    "ENGINE_REGISTRY",
    "EXPORT_TARGETS",
    "CTranslate2Engine",
    "CTranslate2Options",
    "CTranslate2Seq2SeqLM",
    "Engine",
    "LoadOptions",
    "OnnxEncoderOutput",
    "OnnxEngine",
    "OnnxSeq2SeqLM",
    "TorchEngine",
    "Translator",
    "check_ctranslate2_device",
    "ctranslate2_options",
    "detect_engine",
    "export",
    "export_info",
    "get_engine",
    "load_model",
    "load_translator",
]
