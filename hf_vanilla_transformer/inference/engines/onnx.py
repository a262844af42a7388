"""The ONNX Runtime engine: `export_onnx`'s two graphs (`encoder.onnx`, `decoder.onnx`) behind
`OnnxSeq2SeqLM`, a transformers model whose forward runs them, so that transformers' `generate()` with the
paper's decoding rules (`PaperDecodingMixin`) runs unchanged on top: the same greedy and beam search, GNMT
length penalty and input + 50 limit as the PyTorch model. CPU only. The graphs' input names
(`ONNX_ENCODER_INPUTS`, `ONNX_DECODER_INPUTS`) are the exporter's own. Inputs longer than the export's
position table (`max_position_embeddings` rows) are refused, and decoding past its end raises.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from transformers import GenerationConfig, GenerationMixin, PreTrainedModel
from transformers.cache_utils import EncoderDecoderCache
from transformers.modeling_outputs import ModelOutput, Seq2SeqLMOutput

from ... import VanillaTransformerConfig
from ...vanilla_transformer.generation_vanilla_transformer import PaperDecodingMixin
from ...vanilla_transformer.modeling_vanilla_transformer import OUTPUT_CACHE_FIELD, accepts_past_key_values
from .base import Engine, LoadOptions
from .export_common import ExportSource, check_source_lengths, damaged_export, export_info, require_packages
from .onnx_graphs import (
    ONNX_DECODER_FILE,
    ONNX_DECODER_INPUTS,
    ONNX_ENCODER_FILE,
    ONNX_ENCODER_INPUTS,
    export_onnx,
)

# The decoder input holding the new target tokens: one a step when generate() decodes.
_NEW_TOKEN_IDS = ONNX_DECODER_INPUTS[0]


@dataclass
class OnnxEncoderOutput(ModelOutput):
    """The encoder graph's outputs. transformers' beam search repeats every tensor field per beam."""

    last_hidden_state: torch.Tensor | None = None
    cross_keys: torch.Tensor | None = None
    cross_values: torch.Tensor | None = None


class _OnnxEncoder(torch.nn.Module):
    """`encoder.onnx` as the encoder `generate()` calls once per batch."""

    main_input_name = "input_ids"

    def __init__(self, session: Any, positions: int) -> None:
        super().__init__()
        self.session = session
        self.positions = positions

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs: Any
    ) -> OnnxEncoderOutput:
        check_source_lengths([input_ids.shape[1]], self.positions)
        feed = zip(ONNX_ENCODER_INPUTS, (input_ids, attention_mask.to(torch.long)), strict=True)
        outputs = self.session.run(None, {name: value.numpy() for name, value in feed})
        return OnnxEncoderOutput(*(torch.from_numpy(output) for output in outputs))


def _check_dynamic_new_tokens(folder: Path, decoder_session: Any) -> None:
    """Refuse a decoder graph whose number of new tokens tracing fixed to the example's (torch.export
    specializes a dimension that the traced code reads as a Python int): generate() feeds one token a step."""
    for graph_input in decoder_session.get_inputs():
        if graph_input.name == _NEW_TOKEN_IDS and isinstance(graph_input.shape[1], int):
            raise ValueError(
                f"The ONNX export in {folder} decodes exactly {graph_input.shape[1]} tokens a step, not one "
                "at a time: export the model again (vanilla-transformer export --to onnx --force)."
            )


class OnnxSeq2SeqLM(PaperDecodingMixin, PreTrainedModel, GenerationMixin):
    """An ONNX export as a transformers model: `forward` runs `decoder.onnx` with the self-attention keys and
    values of the earlier steps from transformers' cache (one cache layer holding all layers, stacked), so
    that `generate()` (greedy, beam search, the paper's rules) runs on it as on the PyTorch model. CPU only;
    it has no parameters to train."""

    config_class = VanillaTransformerConfig
    main_input_name = "input_ids"
    _supports_sdpa = True

    def __init__(self, folder: str | Path, *, threads: int = 0) -> None:
        require_packages("onnxruntime")
        import onnxruntime

        folder = Path(folder)
        positions = export_info(folder, "onnx")["positions"]
        super().__init__(VanillaTransformerConfig.from_pretrained(folder))
        self.generation_config = GenerationConfig.from_pretrained(folder)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads

        def session(name: str) -> Any:
            try:
                return onnxruntime.InferenceSession(
                    str(folder / name), options, providers=["CPUExecutionProvider"]
                )
            # onnxruntime's own errors (Fail, NoSuchFile, ...) derive from Exception.
            except Exception as error:
                raise damaged_export(folder, error) from error

        self.positions = positions
        self.encoder = _OnnxEncoder(session(ONNX_ENCODER_FILE), self.positions)
        self.decoder_session = session(ONNX_DECODER_FILE)
        self.decoder_inputs = {graph_input.name for graph_input in self.decoder_session.get_inputs()}
        _check_dynamic_new_tokens(folder, self.decoder_session)
        self.post_init()

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    def get_encoder(self) -> _OnnxEncoder:
        return self.encoder

    def _empty_past(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        config = self.config
        d_k, d_v = config.decoder_head_dims
        shape = (batch, config.decoder_layers, config.decoder_attention_heads, 0)
        return torch.zeros(*shape, d_k), torch.zeros(*shape, d_v)

    @accepts_past_key_values
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        encoder_outputs: OnnxEncoderOutput | None = None,
        cache: EncoderDecoderCache | None = None,
        **kwargs: Any,
    ) -> Seq2SeqLMOutput:
        """Logits for `decoder_input_ids` after the cached steps; the new steps' keys and values are added to
        `cache`'s self-attention cache."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if encoder_outputs is None:
            encoder_outputs = self.encoder(input_ids, attention_mask)
        self_attention_cache = cache.self_attention_cache if cache is not None else None
        if self_attention_cache is not None and self_attention_cache.get_seq_length() > 0:
            past_layer = self_attention_cache.layers[0]
            past_keys, past_values = past_layer.keys, past_layer.values
        else:
            past_keys, past_values = self._empty_past(decoder_input_ids.shape[0])
        end = past_keys.shape[3] + decoder_input_ids.shape[1]
        if end > self.positions:
            raise ValueError(
                f"Decoding position {end - 1} is past the {self.positions} positions of this export: lower "
                "max_new_tokens or max_length_offset, or translate with the PyTorch model."
            )
        values = (
            decoder_input_ids,
            encoder_outputs.last_hidden_state,
            attention_mask.to(torch.long),
            past_keys,
            past_values,
            encoder_outputs.cross_keys,
            encoder_outputs.cross_values,
        )
        # An input the graph does not read (tracing drops unused ones) is left out of the feed.
        feed = {
            name: value.contiguous().numpy()
            for name, value in zip(ONNX_DECODER_INPUTS, values, strict=True)
            if name in self.decoder_inputs
        }
        logits, new_keys, new_values = (
            torch.from_numpy(output) for output in self.decoder_session.run(None, feed)
        )
        if self_attention_cache is not None:
            self_attention_cache.update(new_keys, new_values, 0)
        return Seq2SeqLMOutput(logits=logits, **{OUTPUT_CACHE_FIELD: cache})


class OnnxEngine(Engine):
    """ONNX Runtime: exported by `export_onnx`, decoded by `OnnxSeq2SeqLM` on the CPU with transformers'
    `generate()`."""

    name: ClassVar[str] = "onnx"
    title: ClassVar[str] = "ONNX Runtime"
    devices: ClassVar[tuple[str, ...]] = ("cpu",)
    exportable: ClassVar[bool] = True

    def load(self, name_or_path: str | Path, options: LoadOptions) -> OnnxSeq2SeqLM:
        if options.device != "cpu":
            raise ValueError(
                f"The ONNX engine decodes on the CPU here, not on {options.device}: export for CTranslate2 "
                "to decode on a GPU."
            )
        return OnnxSeq2SeqLM(name_or_path, threads=options.threads)

    def select_device(self, device: str, compute_type: str = "default") -> str:
        return "cpu"

    def export(self, source: ExportSource, out: str | Path, *, force: bool = False, **options: Any) -> Path:
        """`export_onnx` (which takes no options)."""
        return export_onnx(source, out, force)


__all__ = [
    "ONNX_DECODER_FILE",
    "ONNX_DECODER_INPUTS",
    "ONNX_ENCODER_FILE",
    "ONNX_ENCODER_INPUTS",
    "OnnxEncoderOutput",
    "OnnxEngine",
    "OnnxSeq2SeqLM",
]
