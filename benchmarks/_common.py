"""Shared pieces of the benchmarks: model sizes, the Marian/ours model pair, GEMM peaks, paired timing,
and the `--device` option of the benchmarks that also run on a CUDA GPU.

Every comparison is a paired ratio measured in one process, with the two models run back to back in
alternating order: on a machine shared with other jobs, absolute times drift by 2x between minutes,
but the ratio of two runs a few seconds apart does not.
"""

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from tokenizers import Tokenizer, models
from transformers import MarianConfig, MarianMTModel, PreTrainedTokenizerFast

from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.common import cpu_speedups
from hf_vanilla_transformer.conversion import convert_marian


@contextmanager
def cpu_speedups_switched(enabled: bool) -> Iterator[None]:
    """`cpu_speedups.ENABLED` set to `enabled` within the block and restored after it. The switch is
    process-wide: for comparisons in one process, not for a server whose threads should decode alike."""
    previous, cpu_speedups.ENABLED = cpu_speedups.ENABLED, enabled
    try:
        yield
    finally:
        cpu_speedups.ENABLED = previous


# The repository's root, and the CTranslate2 weight types the engine benchmarks compare.
REPOSITORY = Path(__file__).resolve().parent.parent
CTRANSLATE2_WEIGHTS = ("float32", "int8")


def benchmark_parser(doc: str | None, batch: int) -> argparse.ArgumentParser:
    """The options both benchmarks take; each adds its own."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["base", "small"], choices=sorted(SIZES))
    parser.add_argument("--batch", type=int, default=batch)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="tiny dims, one repeat: a smoke test")
    return parser


def add_device_option(parser: argparse.ArgumentParser) -> None:
    """`--device`, for the benchmarks that also run on a CUDA GPU (read them with `parse_device_args`)."""
    parser.add_argument(
        "--device",
        default="cpu",
        choices=["cpu", "cuda"],
        help="cuda: the first CUDA GPU, with the defaults for a GPU that the script's docstring gives",
    )


def parse_device_args(
    parser: argparse.ArgumentParser, argv: list[str] | None, cuda_defaults: dict[str, Any]
) -> argparse.Namespace:
    """The arguments; with `--device cuda`, the options not given on the command line take their values
    from `cuda_defaults`. Without a CUDA GPU, `--device cuda` exits with status 2 and a one-line error."""
    args = parser.parse_args(argv)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            parser.exit(
                2, f"{parser.prog}: error: --device cuda, but torch {torch.__version__} finds no GPU\n"
            )
        parser.set_defaults(**cuda_defaults)
        args = parser.parse_args(argv)
    return args


@dataclass(frozen=True)
class Size:
    d_model: int
    layers: int
    heads: int
    ffn: int
    vocab: int


EOS, UNK = 0, 1
# Token ids that random inputs and labels are drawn from: no special tokens.
FIRST_ORDINARY = 2

SIZES = {
    # The paper's base model (Table 3) with a 32k vocabulary, as in the baseline.
    "base": Size(512, 6, 8, 2048, 32000),
    # The model of the `cpu` training preset (hf_vanilla_transformer.training.presets), with its 8000-token
    # vocabulary.
    "small": Size(256, 3, 4, 1024, 8000),
    # The model of the `cpu-demo` preset, the README's demo, with its 5000-token vocabulary.
    "demo": Size(256, 3, 4, 512, 5000),
    # For --quick runs and the test suite: seconds, not minutes.
    "tiny": Size(64, 2, 4, 128, 1000),
}


def token_names(vocab: int) -> list[str]:
    """Names for the ids of the benchmark models' vocabulary, in opus-mt's layout (see `marian_config`):
    engines that read tokens by name (CTranslate2) get these."""
    return ["</s>", "<unk>", *(f"t{i}" for i in range(FIRST_ORDINARY, vocab - 1)), "<pad>"]


def names_tokenizer(vocab: int) -> PreTrainedTokenizerFast:
    """A tokenizer over `token_names(vocab)`, one name per id: what the exporters read the vocabulary from."""
    names = token_names(vocab)
    word_level = models.WordLevel({name: index for index, name in enumerate(names)}, unk_token="<unk>")
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(word_level), unk_token="<unk>", eos_token="</s>", pad_token="<pad>"
    )


def marian_config(size: Size, dropout: float = 0.1) -> MarianConfig:
    return MarianConfig(
        vocab_size=size.vocab,
        decoder_vocab_size=size.vocab,
        d_model=size.d_model,
        encoder_layers=size.layers,
        decoder_layers=size.layers,
        encoder_attention_heads=size.heads,
        decoder_attention_heads=size.heads,
        encoder_ffn_dim=size.ffn,
        decoder_ffn_dim=size.ffn,
        activation_function="relu",  # Eq. 2 of the paper
        dropout=dropout,
        attention_dropout=0.0,
        activation_dropout=0.0,
        max_position_embeddings=512,
        init_std=size.d_model**-0.5,  # our initialisation (and the paper's codebases'): logits of unit scale
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        # opus-mt's convention, which CTranslate2's Marian converter assumes: </s> = 0, <unk> = 1, and the
        # decoder starts from <pad>, the last token, whose embedding is zero.
        eos_token_id=EOS,
        bos_token_id=None,
        pad_token_id=size.vocab - 1,
        decoder_start_token_id=size.vocab - 1,
        forced_eos_token_id=None,
    )


def model_pair(
    size: Size, seed: int = 0, dropout: float = 0.1, attn: str = "sdpa"
) -> tuple[MarianMTModel, VanillaTransformerForConditionalGeneration]:
    """A randomly initialised MarianMTModel and our model converted from it: the same weights."""
    torch.manual_seed(seed)
    marian = MarianMTModel(marian_config(size, dropout))
    with torch.no_grad():
        marian.final_logits_bias.normal_(std=0.01)  # non-zero, so that both models must apply it
        # <pad> is never an output (CTranslate2's Marian converter drops it from the vocabulary).
        marian.final_logits_bias[0, -1] = -1e4
        marian.model.shared.weight[-1].zero_()
    ours = convert_marian(marian)
    marian.set_attn_implementation(attn)
    ours.set_attn_implementation(attn)
    return marian, ours


def paired_ratios(times: dict[str, list[float]], reference: str) -> dict[str, float]:
    """Median over repeats of t(reference) / t(other): > 1 means `other` is faster."""
    return {
        name: statistics.median(r / t for r, t in zip(times[reference], values))
        for name, values in times.items()
    }


def timed(fn: Callable[[], object], device: str = "cpu") -> float:
    """Seconds that `fn()` takes. On a GPU, between two CUDA events recorded before and after it, with the
    GPU synchronized first and last: the time until its last kernel has finished, not only launched."""
    if device == "cpu":
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) / 1000


T = TypeVar("T")


def attempt(device: str, label: str, fn: Callable[[], T], errors: dict[str, str]) -> T | None:
    """`fn()`. On a GPU, an exception (out of memory, a failed compilation) is printed with its traceback,
    kept as `errors[label]`, and None returned, so that one failing variant does not end a run on a machine
    lent for minutes; on the CPU it propagates, as it always did."""
    if device == "cpu":
        return fn()
    try:
        return fn()
    except Exception as error:
        traceback.print_exc()
        errors[label] = f"{type(error).__name__}: {error}".splitlines()[0]
        print(f"  {label} failed: {errors[label]}", file=sys.stderr)
    gc.collect()  # the failed variant's tensors went with the traceback: hand their memory back
    torch.cuda.empty_cache()
    return None


def repeated(fn: Callable[[], object], calls: int) -> None:
    for _ in range(calls):
        fn()


# (m, k, n) of the products that GEMM peaks are measured on: on a CPU, the shape of a base model's linear
# layers at a few thousand tokens; on a GPU, a product big enough to reach the tensor cores' peak.
GEMM_SHAPES = {"cpu": (4096, 512, 2048), "cuda": (8192, 8192, 8192)}


def gemm_peaks(repeats: int = 5, device: str = "cpu") -> dict[str, float]:
    """Best-of GFLOP/s of one (m x k) @ (k x n) product of `GEMM_SHAPES[device]`: fp32 through torch's
    default (MKL on a CPU; cuBLAS at torch's float32 matmul precision on a GPU) and bf16 (oneDNN with
    AVX-512 BF16 where the CPU has it); on a CPU also fp32 through oneDNN. MFU is quoted against these.
    On a GPU each measurement times 10 products back to back between CUDA events."""
    m, k, n = GEMM_SHAPES[device]
    x, w = torch.randn(m, k, device=device), torch.randn(n, k, device=device)
    xb, wb = x.bfloat16(), w.bfloat16()
    paths: dict[str, Callable[[], object]] = {"fp32_default": lambda: torch.nn.functional.linear(x, w)}
    if device == "cpu":
        paths["fp32_onednn"] = lambda: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
    paths["bf16"] = lambda: torch.nn.functional.linear(xb, wb)
    calls = 1 if device == "cpu" else 10
    flops = 2 * m * k * n * calls
    best = {name: 0.0 for name in paths}
    for fn in paths.values():
        fn()
    for _ in range(repeats):
        for name, fn in paths.items():
            seconds = timed(lambda fn=fn: repeated(fn, calls), device)
            best[name] = max(best[name], flops / seconds / 1e9)
    return best


def machine_line() -> dict[str, str]:
    model, vendor, lscpu = platform.processor(), "unknown", ""
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        # Newer lscpu versions indent the fields under "Vendor ID".
        fields = {
            key.strip(): value.strip()
            for key, _, value in (line.partition(":") for line in lscpu.splitlines())
        }
        model = fields["Model name"]
        vendor = fields.get("Vendor ID", vendor)
    except (OSError, subprocess.CalledProcessError, KeyError):
        pass
    import transformers

    flags = set(lscpu.split())
    gpu = {"gpu": torch.cuda.get_device_name()} if torch.cuda.is_available() else {}
    return {
        **gpu,
        "cpu": model,
        "vendor": vendor,
        "avx512_bf16": str("avx512_bf16" in flags),
        "avx2": str("avx2" in flags),
        "cores": str(os.cpu_count()),
        "torch_threads": str(torch.get_num_threads()),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "load_average": " ".join(f"{v:.1f}" for v in os.getloadavg()),
    }


def size_dict(size: Size) -> dict[str, int]:
    return asdict(size)


def format_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [" | ".join(str(c).ljust(w) for c, w in zip(header, widths))]
    lines.append("-|-".join("-" * w for w in widths))
    lines += [" | ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def write_result(result: dict, output: str) -> None:
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    Path(output).write_text(json.dumps(result, indent=1))
    print(f"wrote {output}")
