"""The CTranslate2 engine: `export_ctranslate2`'s folders (optionally with a vocabulary shortlist), decoded by
`CTranslate2Seq2SeqLM` on the CPU or, with `device="cuda"`, on an NVIDIA GPU (`check_ctranslate2_device`
says what it refuses). Its `generate()` runs CTranslate2's own search with the nearest settings
(`ctranslate2_options`; docs/export.md has the details):

- beam search stops once beam-size hypotheses have finished, as transformers' `early_stopping=True` (the
  paper's setting) does; other `early_stopping` values have no CTranslate2 counterpart;
- CTranslate2 divides scores by |Y|^alpha only; the beam-size hypotheses it returns are re-ranked by the
  requested penalty, the GNMT ((5 + |Y|) / 6)^alpha or transformers' |Y|^alpha, with |Y| counted as
  transformers counts it (`CTranslate2Options.rank`);
- `max_decoding_length` is one number per call: a batch is decoded with its longest input's limit (input
  length + 50 tokens), and the inputs whose outputs reach their own limit are decoded again with it, in one
  call per limit; CTranslate2 keeps the last token where transformers forces the end token after it, so the
  tokens are the same.

The two searches can still part where hypotheses reach the length limit, or where more than beam-size
hypotheses finish in the last step and the best by the requested penalty is not among CTranslate2's
beam-size best. An export with a vocabulary shortlist (`shortlist.build_shortlist`) decodes over the
shortlisted target tokens only, unless `use_vmap=False`. Outputs stop at the end of the export's position
table (`max_position_embeddings` rows); longer inputs are refused.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from transformers import GenerationConfig

from ...common.cli import first_line
from ...common.text_lines import iter_lines
from ...vanilla_transformer.generation_vanilla_transformer import length_penalty, output_length_offset
from .base import Engine, LoadOptions
from .ctranslate2_export import export_ctranslate2
from .export_common import (
    ExportError,
    ExportSource,
    check_source_lengths,
    damaged_export,
    export_info,
    require_packages,
)
from .names import CTRANSLATE2_COMPUTE_TYPES, CTRANSLATE2_DEVICES, DEFAULT_SHORTLIST_SIZE
from .shortlist import VMAP_FILE, build_shortlist

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
    "num_return_sequences",
    "do_sample",
    "top_k",
    "top_p",
    "temperature",
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
        f"CTranslate2 cannot decode on the GPU here ({first_line(error)}): install CUDA 12's cuBLAS "
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
    # Outputs per input (transformers' num_return_sequences): the best of the beam, or samples.
    num_hypotheses: int = 1
    # Random sampling (transformers' do_sample with top_k, top_p, temperature); CTranslate2 samples from the
    # whole distribution with sampling_topk 0, as transformers does with top_k 0.
    sampling: bool = False
    sampling_topk: int = 0
    sampling_topp: float = 1.0
    sampling_temperature: float = 1.0

    def search_options(self) -> dict[str, Any]:
        """`translate_batch`'s search settings: beam search keeping beam-size hypotheses (re-ranked by
        `rank`), or sampling with one beam."""
        if self.sampling:
            return dict(
                beam_size=1,
                num_hypotheses=self.num_hypotheses,
                sampling_topk=self.sampling_topk,
                sampling_topp=self.sampling_topp,
                sampling_temperature=self.sampling_temperature,
            )
        return dict(beam_size=self.beam_size, num_hypotheses=max(self.beam_size, self.num_hypotheses))

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
        return total / length_penalty(length, self.alpha, "gnmt" if self.gnmt_penalty else None)

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
    offset = output_length_offset(generation_config, overrides)
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
        num_hypotheses=settings.get("num_return_sequences") or 1,
        sampling=bool(settings.get("do_sample")),
        sampling_topk=settings.get("top_k", defaults["top_k"]) or 0,
        sampling_topp=float(settings.get("top_p", defaults["top_p"]) or 1.0),
        sampling_temperature=float(settings.get("temperature", defaults["temperature"]) or 1.0),
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
            raise damaged_export(folder, error) from error
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
        paper's length rule, the batch goes in one call with its longest limit, and the inputs whose outputs
        reach their own limit again with theirs."""
        rows = self._source_rows(input_ids, attention_mask)
        positions = self.info["positions"]
        check_source_lengths([len(row) for row in rows], positions)
        options = ctranslate2_options(self.generation_config, overrides, self.target_tokens)
        limits = [options.max_decoding_length(len(row), positions) for row in rows]
        outputs: list[list[list[int]]] = [[] for _ in rows]
        # One call with the batch's longest limit: an output that ends before its own limit is what a call
        # with that limit gives (the search never reached it). The others are decoded again, each input
        # with its own limit, in one call per limit.
        pending = {max(limits): list(range(len(rows)))}
        while pending:
            max_length, members = pending.popitem()
            results = self._run(
                self.translator.translate_batch,
                [[self.source_tokens[i] for i in rows[member]] for member in members],
                **options.search_options(),
                length_penalty=options.ctranslate2_length_penalty,
                max_decoding_length=max_length,
                min_decoding_length=options.min_new_tokens,
                max_input_length=0,
                suppress_sequences=options.suppress_sequences,
                use_vmap=self.use_vmap,
                return_scores=True,
                return_end_token=True,
            )
            for member, result in zip(members, results):
                if limits[member] < max_length and max(map(len, result.hypotheses)) >= limits[member]:
                    pending.setdefault(limits[member], []).append(member)
                    continue
                scored = list(zip(result.hypotheses, result.scores))
                if not options.sampling:
                    scored.sort(key=lambda pair: -options.rank(pair[0], pair[1], self.end_token))
                kept = [tokens for tokens, _ in scored[: options.num_hypotheses]]
                outputs[member] = [[self.target_ids[token] for token in tokens] for tokens in kept]
        flat = [ids for hypotheses in outputs for ids in hypotheses]
        generated = torch.full((len(flat), 1 + max(map(len, flat))), self.info["pad_token_id"])
        generated[:, 0] = self.info["decoder_start_token_id"]
        for row, ids in enumerate(flat):
            generated[row, 1 : 1 + len(ids)] = torch.tensor(ids, dtype=torch.long)
        return generated

    def token_log_probs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, outputs: list[list[int]]
    ) -> list[list[float]]:
        """log p(y_t | y_<t, x) of each token of each output (its end token included), by CTranslate2's
        forced decoding (`score_batch`); as `scoring.token_log_probs`."""
        sources = [
            [self.source_tokens[i] for i in row] for row in self._source_rows(input_ids, attention_mask)
        ]
        end = self.target_ids[self.end_token]
        # score_batch scores the target and then the end token, which it appends itself.
        targets = [ids[:-1] if ids[-1:] == [end] else ids for ids in outputs]
        results = self._run(
            self.translator.score_batch,
            sources,
            [[self.target_tokens[i] for i in ids] for ids in targets],
            max_input_length=0,
        )
        return [result.log_probs[: len(ids)] for result, ids in zip(results, outputs)]

    def cross_attention(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, sequences: torch.Tensor
    ) -> torch.Tensor:
        """The encoder-decoder attention behind the outputs `sequences` (decoder start token first, as
        `generate()` returns them), as `alignment.cross_attention` gives it: [batch, target, source], row t
        for the step that produced `sequences[:, t + 1]`. CTranslate2 decodes each output as a forced
        prefix and returns the attention of the layer and heads its export chose (`alignment` in the
        export info: `alignment.alignment_layer`'s, heads averaged)."""
        if "alignment" not in self.info:
            raise ValueError(
                "This CTranslate2 export returns the attention of one head, not the alignment layer's "
                "average: export the model again (vanilla-transformer export --to ctranslate2) to align."
            )
        sources = [
            [self.source_tokens[i] for i in row] for row in self._source_rows(input_ids, attention_mask)
        ]
        end, pad = self.target_ids[self.end_token], self.info["pad_token_id"]
        prefixes = []
        for row in sequences[:, 1:].tolist():
            row = row[: row.index(end)] if end in row else [token for token in row if token != pad]
            prefixes.append([self.target_tokens[i] for i in row])
        results = self._run(
            self.translator.translate_batch,
            sources,
            target_prefix=prefixes,
            beam_size=1,
            max_decoding_length=1 + max(map(len, prefixes)),
            max_input_length=0,
            use_vmap=False,
            return_attention=True,
        )
        attention = torch.zeros(len(sources), sequences.shape[1] - 1, input_ids.shape[1])
        for row, (result, source) in enumerate(zip(results, sources)):
            weights = torch.tensor(result.attention[0], dtype=torch.float32)
            rows = min(weights.shape[0], attention.shape[1])
            attention[row, :rows, : len(source)] = weights[:rows, : len(source)]
        return attention

    def _source_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> list[list[int]]:
        """Each input's token ids without its padding, which the mask (else the padding id) marks."""
        if attention_mask is None:
            attention_mask = input_ids.ne(self.info["pad_token_id"])
        return [ids[mask.bool()].tolist() for ids, mask in zip(input_ids, attention_mask)]

    @staticmethod
    def _run(method: Callable[..., list[Any]], *args: Any, **kwargs: Any) -> list[Any]:
        """A CTranslate2 `method` call, with a missing CUDA library said in one line."""
        try:
            return method(*args, **kwargs)
        except RuntimeError as error:
            if _CT2_MISSING_LIBRARY not in str(error):
                raise
            raise _missing_cuda_library(error) from error


class CTranslate2Engine(Engine):
    """CTranslate2: exported by `export_ctranslate2` (with `quantization` and a vocabulary shortlist built
    from line-aligned training files, `shortlist_from`), decoded by `CTranslate2Seq2SeqLM`."""

    name: ClassVar[str] = "ctranslate2"
    title: ClassVar[str] = "CTranslate2"
    devices: ClassVar[tuple[str, ...]] = CTRANSLATE2_DEVICES
    compute_types: ClassVar[tuple[str, ...]] = CTRANSLATE2_COMPUTE_TYPES
    alignments: ClassVar[bool] = True
    exportable: ClassVar[bool] = True
    export_options: ClassVar[tuple[str, ...]] = ("quantization", "shortlist_from", "shortlist_size")

    def load(self, name_or_path: str | Path, options: LoadOptions) -> CTranslate2Seq2SeqLM:
        return CTranslate2Seq2SeqLM(
            name_or_path,
            device=options.device,
            compute_type=options.compute_type,
            threads=options.threads,
            use_vmap=options.use_vmap,
        )

    def select_device(self, device: str, compute_type: str = "default") -> str:
        """The CPU for "auto" (an export decodes on the GPU only when asked to), after
        `check_ctranslate2_device`."""
        device = "cpu" if device == "auto" else device
        check_ctranslate2_device(device, compute_type)
        return device

    def export(
        self,
        source: ExportSource,
        out: str | Path,
        *,
        force: bool = False,
        quantization: str | None = None,
        shortlist_from: tuple[str | Path, str | Path] | None = None,
        shortlist_size: int = DEFAULT_SHORTLIST_SIZE,
    ) -> Path:
        """`export_ctranslate2`, with a shortlist of `shortlist_size` target tokens per source token built
        from the line-aligned source and target files `shortlist_from`."""
        shortlist = None
        if shortlist_from is not None:
            source_file, target_file = shortlist_from
            try:
                shortlist = build_shortlist(
                    iter_lines(source_file),
                    iter_lines(target_file),
                    source.tokenizer,
                    source.target_tokenizer,
                    size=shortlist_size,
                )
            except ValueError as error:  # files of different lengths, or not UTF-8
                raise ExportError(str(error)) from None
        return export_ctranslate2(source, out, quantization, force, shortlist)


__all__ = [
    "CTranslate2Engine",
    "CTranslate2Options",
    "CTranslate2Seq2SeqLM",
    "check_ctranslate2_device",
    "ctranslate2_options",
]
