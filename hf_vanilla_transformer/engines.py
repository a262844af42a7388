"""One way to translate with this package's models on three engines: PyTorch, CTranslate2 and ONNX Runtime.

`load_translator(path, engine)` reads a model folder or Hub id ("torch") or a folder written by
`export.export_ctranslate2` / `export.export_onnx` (the engine is read from its `EXPORT_INFO_FILE` when not
given), and `Translator.translate(sentences)` translates them with `translation.translate`: the same
length-sorted batches, blank-line handling, target tokenizer and detokenization on every engine. What differs
is the `generate()` behind it:

- "torch": the model's own `generate()`.
- "onnx": `OnnxSeq2SeqLM`, a transformers model whose forward runs the exported graphs, so that
  transformers' `generate()` with the paper's decoding rules (`PaperDecodingMixin`) runs unchanged on top:
  the same greedy and beam search, GNMT length penalty and input + 50 limit as the PyTorch model.
- "ctranslate2": `CTranslate2Seq2SeqLM`, whose `generate()` runs CTranslate2's own search with the nearest
  settings (`ctranslate2_options`; docs/export.md has the details):
  - beam search stops once beam-size hypotheses have finished, as transformers' `early_stopping=True`
    (the paper's setting) does; other `early_stopping` values have no CTranslate2 counterpart;
  - CTranslate2 divides scores by |Y|^alpha only; the beam-size hypotheses it returns are re-ranked by the
    requested penalty, the GNMT ((5 + |Y|) / 6)^alpha or transformers' |Y|^alpha, with |Y| counted as
    transformers counts it (`CTranslate2Options.rank`);
  - `max_decoding_length` is one number per call, so the inputs of each length go in a call of their own
    with input length + 50 tokens; CTranslate2 keeps the last of them where transformers forces the end
    token after it, so the tokens are the same.
  The two searches can still part where hypotheses reach the length limit, or where more than beam-size
  hypotheses finish in the last step and the best by the requested penalty is not among CTranslate2's
  beam-size best. An export with a vocabulary shortlist (`export.build_shortlist`) decodes over the
  shortlisted target tokens only, unless `use_vmap=False`.

The exports' position tables have `max_position_embeddings` rows: inputs longer than that are refused on
both exported engines; CTranslate2 stops outputs at the table's end, ONNX raises there.

CTranslate2 decodes on the CPU or, with `device="cuda"`, on an NVIDIA GPU (`check_ctranslate2_device` says
what it refuses); ONNX Runtime on the CPU only.
"""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForSeq2SeqLM,
    GenerationConfig,
    GenerationMixin,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.cache_utils import EncoderDecoderCache
from transformers.modeling_outputs import ModelOutput, Seq2SeqLMOutput

from .configuration_vanilla_transformer import VanillaTransformerConfig
from .export import (
    CTRANSLATE2_QUANTIZATIONS,
    ONNX_DECODER_FILE,
    ONNX_ENCODER_FILE,
    VMAP_FILE,
    read_export_info,
    require_packages,
)
from .generation_vanilla_transformer import PaperDecodingMixin, gnmt_length_penalty
from .model_location import check_location, loading
from .translation import load_tokenizers, translate

ENGINES = ("torch", "ctranslate2", "onnx")
CTRANSLATE2_DEVICES = ("cpu", "cuda")
# "default" keeps the export's weight type, converted where the device cannot compute in it (an
# int8_float16 export runs as int8_float32 on the CPU, say); "auto" takes the fastest type the device has.
# The others are CTranslate2's weight types, which the weights are converted to when the model loads.
CTRANSLATE2_COMPUTE_TYPES = ("default", "auto", *CTRANSLATE2_QUANTIZATIONS)
# CTranslate2 stops at the first finished best hypothesis when its length penalty is 0, where transformers
# waits for beam-size finished hypotheses; this penalty keeps transformers' rule and ranks as the raw scores.
_CT2_NEUTRAL_PENALTY = 1e-9
# Generation-config fields the CTranslate2 engine reads (the rest must be at their defaults), and those it
# leaves aside: token ids the export holds already, and early_stopping / forced_eos_token_id, for which
# CTranslate2 has one behaviour (stop once beam-size hypotheses finished; end at the length limit).
_CT2_SETTINGS = (
    "num_beams",
    "length_penalty",
    "length_penalty_type",
    "max_length_offset",
    "max_new_tokens",
    "max_length",
    "bad_words_ids",
    "min_new_tokens",
)
_CT2_DESCRIPTIVE = (
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "decoder_start_token_id",
    "forced_eos_token_id",
    "_from_model_config",
    "early_stopping",
    "transformers_version",
)


def detect_engine(name_or_path: str | Path) -> str:
    """The engine that reads a folder: the one its export info names, else "torch" (model folder, Hub id)."""
    info = read_export_info(name_or_path)
    return info["engine"] if info else "torch"


def export_info(name_or_path: str | Path, engine: str) -> dict[str, Any]:
    """The export info of a folder exported for `engine`; ValueError saying what the folder is otherwise."""
    info = read_export_info(name_or_path)
    if info is None or info["engine"] != engine:
        found = f"a {info['engine']} export" if info else "not an exported folder"
        raise ValueError(
            f"{name_or_path} is {found}: export it first "
            f"(vanilla-transformer export --to {engine}), or pick the engine that reads it."
        )
    return info


def _first_line(error: Exception) -> str:
    """The first line of an engine's error message, or the error's type where it has none."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _damaged_export(folder: Path, error: Exception) -> ValueError:
    """The one-line error for an export whose engine cannot read its files."""
    return ValueError(
        f"Cannot load the export in {folder} ({_first_line(error)}): a file is missing or damaged; export "
        "the model again (vanilla-transformer export)."
    )


def _check_source_lengths(lengths: list[int], positions: int) -> None:
    longest = max(lengths, default=0)
    if longest > positions:
        raise ValueError(
            f"An input of {longest} tokens is longer than the {positions} positions of this export "
            "(max_position_embeddings): split or truncate it, or translate with the PyTorch model."
        )


# ---------------------------------------------------------------------------------------------------------
# CTranslate2


def check_ctranslate2_device(device: str, compute_type: str = "default") -> None:
    """Refuse, in a ValueError of one line that says the fix, what CTranslate2 cannot decode with here:
    a device other than "cpu" or "cuda", "cuda" where CTranslate2 sees no CUDA device
    (`ctranslate2.get_cuda_device_count()`), or a `compute_type` the device does not compute in
    (`ctranslate2.get_supported_compute_types`: float16, bfloat16 and int8_float16 are GPU types). "default"
    and "auto" are always taken: "default" keeps the export's weight type where the device computes in it,
    and is converted (with CTranslate2's warning) where it does not: a float16 export to float32 on a CPU."""
    require_packages("ctranslate2")
    import ctranslate2

    if device not in CTRANSLATE2_DEVICES:
        raise ValueError(f"CTranslate2 decodes on {' or '.join(CTRANSLATE2_DEVICES)}, not {device!r}.")
    if device == "cuda" and ctranslate2.get_cuda_device_count() == 0:
        raise ValueError(
            f"CTranslate2 {ctranslate2.__version__} finds no CUDA device here (no NVIDIA GPU, or a driver "
            "older than its CUDA 12 build needs): decode on the CPU (device cpu), or on a machine with one."
        )
    supported = ctranslate2.get_supported_compute_types(device)
    if compute_type not in ("default", "auto", *supported):
        raise ValueError(
            f"CTranslate2 cannot compute in {compute_type} on the {device} here: choose one of "
            f"{sorted(supported)}, or default (the export's own type)"
            + (", or decode on the GPU (device cuda)." if device == "cpu" else ".")
        )


# How CTranslate2 reports a CUDA library it loads on first use (cuBLAS at the first product) and cannot find.
_CT2_MISSING_LIBRARY = "is not found or cannot be loaded"


def _missing_cuda_library(error: RuntimeError) -> ValueError:
    """The one-line error for a GPU that CTranslate2 sees but lacks a CUDA library for: its PyPI wheels are
    CUDA 12 builds that load CUDA 12's cuBLAS (libcublas.so.12), which a CUDA 13 machine may not have."""
    return ValueError(
        f"CTranslate2 cannot decode on the GPU here ({_first_line(error)}): install CUDA 12's cuBLAS "
        "(pip install nvidia-cublas-cu12) and add its nvidia/cublas/lib folder to LD_LIBRARY_PATH, or "
        "decode on the CPU (device cpu)."
    )


@dataclass(frozen=True)
class CTranslate2Options:
    """The settings of CTranslate2's search nearest to one `generate()` call, and how to rank its finished
    hypotheses as transformers does."""

    beam_size: int
    alpha: float
    gnmt_penalty: bool
    # Outputs stop after this many tokens (the end token counted) ...
    max_new_tokens: int | None = None
    # ... or, for the paper's rule, after the input length + this many (the end token not counted).
    length_offset: int | None = None
    suppress_sequences: list[list[str]] | None = None
    # No end token before this many new tokens (transformers' min_new_tokens, CTranslate2's
    # min_decoding_length; CTranslate2's own default of 1 is not transformers').
    min_new_tokens: int = 0

    def max_decoding_length(self, source_length: int, positions: int) -> int:
        """CTranslate2's `max_decoding_length` for inputs of `source_length` tokens: with the paper's rule,
        input + offset tokens, the last of which CTranslate2 keeps where transformers would force the end
        token after it; never past the `positions` of the export's table."""
        length = source_length + self.length_offset if self.length_offset is not None else self.max_new_tokens
        return max(1, min(length, positions))

    def rank(self, tokens: list[str], score: float, end_token: str) -> float:
        """transformers' score of a finished hypothesis from CTranslate2's: CTranslate2 divides the sum of
        log-probabilities by |Y|^length_penalty (|Y| counting the end token); this divides it by the GNMT or
        transformers' penalty of transformers' |Y|, which counts the end token the paper's rule forces."""
        length = len(tokens)
        total = score * length**self.ctranslate2_length_penalty
        if self.length_offset is not None and tokens[-1:] != [end_token]:
            length += 1
        penalty = gnmt_length_penalty(length, self.alpha) if self.gnmt_penalty else length**self.alpha
        return total / penalty

    @property
    def ctranslate2_length_penalty(self) -> float:
        return self.alpha or _CT2_NEUTRAL_PENALTY


def ctranslate2_options(
    generation_config: GenerationConfig, overrides: dict[str, Any], target_tokens: list[str]
) -> CTranslate2Options:
    """The CTranslate2 search nearest to `generate()` with `generation_config` updated by `overrides`
    (see the module docstring); ValueError for a setting CTranslate2 has no counterpart for."""
    # What generate() falls back to for fields the config leaves unset (transformers' own table).
    defaults = {**GenerationConfig().to_dict(), **GenerationConfig._get_default_generation_params()}
    settings = {key: value for key, value in generation_config.to_dict().items() if value is not None}
    settings.update(overrides)
    # A setting left at its default, or off (False, 0, None, empty) where the default is off too, is fine.
    refused = {
        key
        for key, value in settings.items()
        if key not in (*_CT2_SETTINGS, *_CT2_DESCRIPTIVE)
        and value != defaults.get(key)
        and (value or defaults.get(key))
    }
    if refused:
        raise ValueError(
            f"The CTranslate2 engine cannot apply {sorted(refused)}: it takes {list(_CT2_SETTINGS)}. "
            "Translate with the PyTorch or ONNX engine for the others."
        )
    # As PaperDecodingMixin.generate: max_new_tokens or max_length given to the call win over the offset.
    explicit_length = "max_new_tokens" in overrides or "max_length" in overrides
    offset = None if explicit_length else settings.get("max_length_offset")
    if "max_new_tokens" in settings and "max_length" not in overrides:
        max_new_tokens = settings["max_new_tokens"]
    elif "max_length" in settings:
        max_new_tokens = settings["max_length"] - 1  # transformers counts the decoder start token in it
    else:
        max_new_tokens = defaults["max_length"]  # transformers' default: that many new tokens
    bad_words = settings.get("bad_words_ids") or []
    return CTranslate2Options(
        beam_size=settings.get("num_beams", defaults["num_beams"]),
        alpha=float(settings.get("length_penalty", defaults["length_penalty"])),
        gnmt_penalty=settings.get("length_penalty_type") == "gnmt",
        max_new_tokens=max_new_tokens,
        length_offset=offset,
        suppress_sequences=[[target_tokens[i] for i in ids] for ids in bad_words] or None,
        min_new_tokens=settings.get("min_new_tokens") or 0,
    )


class CTranslate2Seq2SeqLM:
    """A CTranslate2 export behind the `generate(input_ids, attention_mask, **overrides)` that
    `translation.translate` calls: token ids in, the decoder start token and the output ids (with the end
    token where the output has one, then padding) out, as transformers returns them.

    `device` is "cpu" or "cuda", `compute_type` one of `CTRANSLATE2_COMPUTE_TYPES`: "default" keeps the
    export's weight type; float16 and int8_float16 (say) compute on the GPU only (`check_ctranslate2_device`).
    `use_vmap`: decode over the export's vocabulary shortlist (`VMAP_FILE`) only; None (the default) does
    where the export has one. Each `translate_batch` call allows the shortlisted tokens of all its inputs.
    """

    def __init__(
        self,
        folder: str | Path,
        *,
        device: str = "cpu",
        compute_type: str = "default",
        threads: int = 0,
        use_vmap: bool | None = None,
    ) -> None:
        check_ctranslate2_device(device, compute_type)
        import ctranslate2

        folder = Path(folder)
        self.info = export_info(folder, "ctranslate2")
        has_vmap = (folder / VMAP_FILE).is_file()
        if use_vmap and not has_vmap:
            raise ValueError(
                f"{folder} has no vocabulary shortlist ({VMAP_FILE}): export it with one (--shortlist-from), "
                "or leave use_vmap unset."
            )
        self.use_vmap = has_vmap if use_vmap is None else use_vmap
        try:
            self.translator = ctranslate2.Translator(
                str(folder), device=device, compute_type=compute_type, intra_threads=threads
            )
        except RuntimeError as error:
            raise _damaged_export(folder, error) from error
        self.generation_config = GenerationConfig.from_pretrained(folder)
        vocabularies = {
            name: json.loads((folder / f"{name}_vocabulary.json").read_text(encoding="utf-8"))
            for name in ("shared", "source", "target")
            if (folder / f"{name}_vocabulary.json").is_file()
        }
        self.source_tokens = vocabularies.get("source", vocabularies.get("shared"))
        self.target_tokens = vocabularies.get("target", vocabularies.get("shared"))
        self.target_ids = {token: index for index, token in enumerate(self.target_tokens)}
        eos = self.info["eos_token_id"]
        self.end_token = self.target_tokens[eos[0] if isinstance(eos, list) else eos]
        # Where `translation.translate` puts the token ids, which CTranslate2 reads as tokens on any device.
        self.device = torch.device("cpu")

    def eval(self) -> "CTranslate2Seq2SeqLM":
        return self

    def generate(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **overrides: Any
    ) -> torch.LongTensor:
        """Translate a batch of token ids with CTranslate2's search (`ctranslate2_options`). With the
        paper's length rule, inputs of each length go in one call, with their own limit."""
        if attention_mask is None:
            attention_mask = input_ids.ne(self.info["pad_token_id"])
        rows = [ids[mask.bool()].tolist() for ids, mask in zip(input_ids, attention_mask)]
        positions = self.info["positions"]
        _check_source_lengths([len(row) for row in rows], positions)
        options = ctranslate2_options(self.generation_config, overrides, self.target_tokens)
        groups: dict[int, list[int]] = {}
        for index, row in enumerate(rows):
            groups.setdefault(options.max_decoding_length(len(row), positions), []).append(index)
        outputs: list[list[int]] = [[] for _ in rows]
        for max_length, members in groups.items():
            try:
                results = self.translator.translate_batch(
                    [[self.source_tokens[i] for i in rows[member]] for member in members],
                    beam_size=options.beam_size,
                    num_hypotheses=options.beam_size,
                    length_penalty=options.ctranslate2_length_penalty,
                    max_decoding_length=max_length,
                    min_decoding_length=options.min_new_tokens,
                    max_input_length=0,
                    suppress_sequences=options.suppress_sequences,
                    use_vmap=self.use_vmap,
                    return_scores=True,
                    return_end_token=True,
                )
            except RuntimeError as error:
                if _CT2_MISSING_LIBRARY not in str(error):
                    raise
                raise _missing_cuda_library(error) from error
            for member, result in zip(members, results):
                scored = zip(result.hypotheses, result.scores)
                best = max(scored, key=lambda pair: options.rank(pair[0], pair[1], self.end_token))[0]
                outputs[member] = [self.target_ids[token] for token in best]
        generated = torch.full((len(rows), 1 + max(map(len, outputs))), self.info["pad_token_id"])
        generated[:, 0] = self.info["decoder_start_token_id"]
        for row, ids in enumerate(outputs):
            generated[row, 1 : 1 + len(ids)] = torch.tensor(ids, dtype=torch.long)
        return generated


# ---------------------------------------------------------------------------------------------------------
# ONNX


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
        _check_source_lengths([input_ids.shape[1]], self.positions)
        outputs = self.session.run(
            None, {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.to(torch.long).numpy()}
        )
        return OnnxEncoderOutput(*(torch.from_numpy(output) for output in outputs))


def _check_dynamic_new_tokens(folder: Path, decoder_session: Any) -> None:
    """Refuse a decoder graph whose number of new tokens tracing fixed to the example's (torch.export
    specializes a dimension that the traced code reads as a Python int): generate() feeds one token a step."""
    for graph_input in decoder_session.get_inputs():
        if graph_input.name == "decoder_input_ids" and isinstance(graph_input.shape[1], int):
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
            except (
                Exception
            ) as error:  # onnxruntime's own errors (Fail, NoSuchFile, ...) derive from Exception
                raise _damaged_export(folder, error) from error

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
        feed = {
            "decoder_input_ids": decoder_input_ids,
            "encoder_hidden_states": encoder_outputs.last_hidden_state,
            "encoder_attention_mask": attention_mask.to(torch.long),
            "past_keys": past_keys,
            "past_values": past_values,
            "cross_keys": encoder_outputs.cross_keys,
            "cross_values": encoder_outputs.cross_values,
        }
        feed = {
            name: value.contiguous().numpy() for name, value in feed.items() if name in self.decoder_inputs
        }
        logits, new_keys, new_values = (
            torch.from_numpy(output) for output in self.decoder_session.run(None, feed)
        )
        if self_attention_cache is not None:
            self_attention_cache.update(new_keys, new_values, 0)
        return Seq2SeqLMOutput(logits=logits, cache=cache)


# ---------------------------------------------------------------------------------------------------------
# One interface


def load_model(
    name_or_path: str | Path,
    engine: str | None = None,
    *,
    device: str = "cpu",
    threads: int = 0,
    compute_type: str = "default",
    use_vmap: bool | None = None,
) -> Any:
    """What `translation.translate` decodes with on `engine` (default: `detect_engine`): the PyTorch model,
    an `OnnxSeq2SeqLM` or a `CTranslate2Seq2SeqLM`. `device` is where it decodes: a torch device for the
    PyTorch model, "cpu" or "cuda" for CTranslate2, "cpu" for ONNX Runtime. `threads` (0: the engine's
    default) applies to the exported engines; `compute_type` (e.g. "int8" on an int8 export, "float16" or
    "int8_float16" on the GPU; "default" keeps the export's own) and `use_vmap` (the export's vocabulary
    shortlist: None uses it where there is one, False turns it off) to CTranslate2."""
    engine = engine or detect_engine(name_or_path)
    if engine not in ENGINES:
        raise ValueError(f"Unknown engine {engine!r}: choose one of {list(ENGINES)}.")
    if engine == "ctranslate2":
        return CTranslate2Seq2SeqLM(
            name_or_path, device=device, compute_type=compute_type, threads=threads, use_vmap=use_vmap
        )
    if engine == "onnx":
        if device != "cpu":
            raise ValueError(
                f"The ONNX engine decodes on the CPU here, not on {device}: export for CTranslate2 to decode "
                "on a GPU."
            )
        return OnnxSeq2SeqLM(name_or_path, threads=threads)
    check_location(name_or_path)
    return AutoModelForSeq2SeqLM.from_pretrained(name_or_path).to(device)


@dataclass
class Translator:
    """A model on one engine with its tokenizers; `translate` turns sentences into translations."""

    model: Any
    tokenizer: PreTrainedTokenizerBase
    target_tokenizer: PreTrainedTokenizerBase | None
    engine: str

    def translate(
        self,
        sentences: Sequence[str],
        *,
        batch_size: int = 64,
        progress: bool = False,
        **generate_kwargs: Any,
    ) -> list[str]:
        """`translation.translate` on this engine: the model's decoding settings unless `generate_kwargs`
        override them (num_beams, length_penalty, length_penalty_type, max_length_offset, ...)."""
        return translate(
            self.model,
            self.tokenizer,
            sentences,
            target_tokenizer=self.target_tokenizer,
            batch_size=batch_size,
            progress=progress,
            **generate_kwargs,
        )


def load_translator(name_or_path: str | Path, engine: str | None = None, **options: Any) -> Translator:
    """A `Translator` for a model folder, Hub id or exported folder (`load_model` takes `options`)."""
    engine = engine or detect_engine(name_or_path)
    # An exported folder holds its engine's files and export info, not necessarily a config.json.
    with loading(name_or_path, model=engine == "torch"):
        model = load_model(name_or_path, engine, **options)
        tokenizer, target_tokenizer = load_tokenizers(name_or_path)
    return Translator(model, tokenizer, target_tokenizer, engine)


__all__ = [
    "CTRANSLATE2_COMPUTE_TYPES",
    "CTRANSLATE2_DEVICES",
    "ENGINES",
    "CTranslate2Options",
    "CTranslate2Seq2SeqLM",
    "OnnxEncoderOutput",
    "OnnxSeq2SeqLM",
    "Translator",
    "check_ctranslate2_device",
    "ctranslate2_options",
    "detect_engine",
    "export_info",
    "load_model",
    "load_translator",
]
