"""The engines package's interface and registry: every engine is found by name, says what it supports, and
is reached through the registry alone; the old import paths of what moved still work, with a warning."""

import inspect
from pathlib import Path

import pytest
import torch
from conftest import tiny_model
from transformers import GenerationConfig

from hf_vanilla_transformer.inference import engines
from hf_vanilla_transformer.inference.engines.base import Engine
from hf_vanilla_transformer.inference.engines.ctranslate2 import ctranslate2_options
from hf_vanilla_transformer.inference.engines.export_common import ExportError
from hf_vanilla_transformer.inference.engines.exporting import export
from hf_vanilla_transformer.inference.engines.onnx_graphs import (
    ONNX_DECODER_INPUTS,
    ONNX_ENCODER_INPUTS,
    OnnxDecoderGraph,
    OnnxEncoderGraph,
)
from hf_vanilla_transformer.inference.engines.registry import (
    ENGINE_REGISTRY,
    ENGINES,
    EXPORT_TARGETS,
    get_engine,
)

PACKAGE = Path(engines.__file__).resolve().parent.parent


def test_the_registry_holds_every_engine_under_its_own_name():
    assert ENGINES == ("torch", "ctranslate2", "onnx") == tuple(ENGINE_REGISTRY)
    for name, engine in ENGINE_REGISTRY.items():
        assert isinstance(engine, Engine)
        assert engine.name == name and get_engine(name) is engine
        assert engine.devices and set(engine.devices) <= {"cpu", "cuda"}
    assert EXPORT_TARGETS == ("ctranslate2", "onnx")
    assert EXPORT_TARGETS == tuple(name for name, engine in ENGINE_REGISTRY.items() if engine.exportable)
    with pytest.raises(
        ValueError, match=r"Unknown engine 'tpu': choose one of \['torch', 'ctranslate2', 'onnx'\]\."
    ):
        get_engine("tpu")


def test_the_engines_say_what_they_support():
    torch_engine, ct2, onnx = (get_engine(name) for name in ENGINES)
    assert (torch_engine.alignments, ct2.alignments, onnx.alignments) == (True, True, False)
    assert ct2.compute_types and not torch_engine.compute_types and not onnx.compute_types
    assert torch_engine.dynamic_int8 and not ct2.dynamic_int8 and not onnx.dynamic_int8
    assert onnx.device_names() == "the CPU" and ct2.device_names() == "the CPU or the GPU"


def test_n_best_and_scores_are_what_generate_gives():
    model = tiny_model().eval()
    source = torch.tensor([[5, 6, 7, 2]])
    output = model.generate(
        source,
        num_beams=2,
        num_return_sequences=2,
        output_scores=True,
        return_dict_in_generate=True,
        max_new_tokens=4,
    )
    assert output.sequences.shape[0] == 2 and output.sequences_scores.shape == (2,)
    # CTranslate2's generate() returns n best and samples as transformers' does; scores come from its own
    # forced decoding (token_log_probs), not from generate().
    assert ctranslate2_options(GenerationConfig(), {"num_return_sequences": 2}, ["a"]).num_hypotheses == 2
    sampling = ctranslate2_options(GenerationConfig(), {"do_sample": True, "top_k": 0, "top_p": 0.9}, ["a"])
    assert (sampling.sampling, sampling.sampling_topk, sampling.sampling_topp) == (True, 0, 0.9)
    with pytest.raises(ValueError, match="The CTranslate2 engine cannot apply"):
        ctranslate2_options(GenerationConfig(), {"output_scores": True}, ["a", "b"])


def test_select_device():
    assert get_engine("onnx").select_device("auto") == "cpu"
    assert get_engine("torch").select_device("cpu") == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"^--device cuda: torch .* finds no CUDA device here"):
            get_engine("torch").select_device("cuda")


def test_export_refuses_before_loading_the_model(tmp_path):
    model = tmp_path / "no-such-model"
    with pytest.raises(ExportError, match=r"Unknown export target 'torch': choose one of"):
        export(model, "torch", tmp_path / "out")
    with pytest.raises(
        ExportError, match=r"^quantization \(--quantization\) applies to CTranslate2 exports only"
    ):
        export(model, "onnx", tmp_path / "out", quantization="int8")
    with pytest.raises(ExportError, match=r"^shortlist \(--shortlist-from\) applies to CTranslate2 exports"):
        export(model, "onnx", tmp_path / "out", shortlist_from=("a.en", "a.de"))
    with pytest.raises(ExportError, match="nothing to export"):
        get_engine("torch").export(None, tmp_path / "out")


def test_the_onnx_graph_inputs_are_named_once():
    for graph, names in ((OnnxEncoderGraph, ONNX_ENCODER_INPUTS), (OnnxDecoderGraph, ONNX_DECODER_INPUTS)):
        assert tuple(inspect.signature(graph.forward).parameters)[1:] == names
    assert engines.onnx.ONNX_DECODER_INPUTS is ONNX_DECODER_INPUTS
