"""Training throughput: our model against transformers' MarianMTModel with the same weights and batches.

    python benchmarks/bench_train.py                        # base and small, every mode (~12 min)
    python benchmarks/bench_train.py --sizes small --repeats 5
    python benchmarks/bench_train.py --quick                # tiny dims, seconds: what the tests run
    python benchmarks/bench_train.py --device cuda          # base, 400 x 64 tokens, bf16 eager and compiled
    python benchmarks/bench_train.py --device cuda --data --modes bf16-eager     # newstest-length batches
    python benchmarks/bench_train.py --device cuda --data --presets base big --modes bf16-eager

One step = forward with labels, backward, Adam step. Marian's loss is its model's own; ours is the loss
`train` computes (`loss.label_smoothed_cross_entropy` over the logits, with `--label-smoothing`, 0 by
default so that both compute the same cross-entropy). Compiled, Marian is `torch.compile(model)` with its
loss inside, and ours the step `train --compile` runs (`training.compilation.CompiledTrainingLoss`: forward
and loss as one compiled function, layers compiled once per class). `ours-no-speedups` is ours with
`cpu_speedups.ENABLED = False` (eager modes). Each round times every (model, precision, mode)
variant once, in alternating order; a ratio is the median over rounds of the per-round ratio. Peak memory
is the growth of resident memory during one more, untimed, step (pass over the batches, with --data) of
each variant (measuring it hands freed memory back to the OS first, which would add page faults to a timed
step). MFU is model FLOPs (matmuls, 3x forward for training) per second over the GEMM peaks measured at
the start of the same run (on a CPU again every round, the best kept).

On a GPU (`--device cuda`; without one the script exits with status 2), the defaults become the base
size, batches of 400 x 64 source and 64 target tokens (25,600 a side: the paper's step), the modes
bf16-eager and bf16-compile (bf16 autocast) and two warm-up rounds, in which compilation happens. Both
models train with the fused Adam. A step is timed between CUDA events with the GPU synchronized before and
after; MFU is against an 8192^3 product's bf16 (or fp32) GEMM peak, timed the same way on the same GPU;
memory is `torch.cuda.max_memory_allocated` during one more step: `peak_step_memory_mb` its growth over the
memory allocated before the step, `peak_memory_allocated_mb` the peak itself, which counts everything
resident, the other model and its optimizer state included. In eager modes `ours-chunked-loss` is ours
with the chunked label-smoothed loss (`chunked_loss_on_every_device`), a lever measured there.
`ours-no-speedups` is left out and the fast
modes are off unless asked for (the speed-ups change nothing on a GPU; `cpu_bf16_training` is made for
CPUs). A variant that fails on the GPU (out of memory, a failed compilation) is kept with its error, and
the others go on.

`--data [DIR]`: real-length batches instead of one fixed batch. The En-De newstest2013 and newstest2014
pairs in DIR (by default ../shared/data/wmt14 beside the checkout; without them the run is skipped with a
message) are tokenized with a BPE vocabulary of `--bpe-vocab` tokens trained on that text (Section 5.1),
and their lengths packed by the package's `TokenBudgetBatchSampler` into batches of up to `--max-tokens`
padded tokens a side (25000: the paper's step), in its shuffled epoch order; the pairs are repeated
`--data-copies` times first, so that batches are as tightly packed as on a corpus of the paper's size
with the same lengths. Each batch holds random ids of its pairs' lengths, padded to its longest as `train`
pads them (in compiled modes to multiples of 8, as `train --compile` does). A round times one pass over
the first `--max-steps` batches; tokens/s counts the real target tokens, not padding, and MFU the padded
products.
`--presets base big`: ours only, the paper's base and big models (`VanillaTransformerConfig.from_preset`,
vocabulary `--preset-vocab`), in place of the Marian comparison at `--sizes`; each row also projects the
hours of the paper's run at the measured throughput: 100k steps (base) or 300k steps (big) of 25000 target
tokens.

`--loss-curve N` also trains both models from the same weights on the same batches of a copy task for N
steps (at small dims unless --loss-curve-size says otherwise), ours in fp32 and in the fastest mode, and
reports how far the loss curves are apart.
"""

import argparse
import copy
import math
import statistics
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    EOS,
    FIRST_ORDINARY,
    GEMM_SHAPES,
    SIZES,
    Size,
    add_device_option,
    attempt,
    benchmark_parser,
    cpu_speedups_switched,
    format_table,
    gemm_peaks,
    machine_line,
    model_pair,
    parse_device_args,
    size_dict,
    timed,
    write_result,
)
from _memory import step_memory  # noqa: E402

from hf_vanilla_transformer import (
    VanillaTransformerConfig,
    VanillaTransformerForConditionalGeneration,
)
from hf_vanilla_transformer.common.tokenization import train_shared_bpe_tokenizer  # noqa: E402
from hf_vanilla_transformer.training import loss as training_loss
from hf_vanilla_transformer.training.batching import TokenBudgetBatchSampler  # noqa: E402
from hf_vanilla_transformer.training.compilation import (  # noqa: E402
    CompiledTrainingLoss,
    compiled_length,
    compiled_regions,
    forward_and_loss,
)
from hf_vanilla_transformer.training.length_buckets import pad_to_buckets  # noqa: E402
from hf_vanilla_transformer.training.schedule import build_paper_optimizer  # noqa: E402
from hf_vanilla_transformer.training.trainer import cpu_bf16_training  # noqa: E402

# One process compiles several models and modes: more than torch's default of 8 graphs per function.
torch._dynamo.config.recompile_limit = 64
torch._dynamo.config.accumulated_recompile_limit = 512

MODES = ("fp32-eager", "bf16-eager", "fp32-compile", "bf16-compile")
# Ours only, against Marian's fp32-eager: bf16 autocast as `vanilla-transformer train` runs it on a CPU
# (`cpu_bf16_training`: eager attention and fast dropout masks) with the fused Adam.
FAST_MODES = ("bf16-eager-attn_eager", "bf16-compile-attn_eager")
# What --device cuda changes, for the options not given (see the module docstring).
CUDA_DEFAULTS = {
    "sizes": ["base"],
    "batch": 400,
    "src_len": 64,
    "tgt_len": 64,
    "modes": ["bf16-eager", "bf16-compile"],
    "fast_modes": [],
    "fastest": "bf16-eager",
    "warmup": 2,
}
# The paper's training runs (Section 5.2): steps of about 25000 source and 25000 target tokens.
PAPER_STEPS = {"base": 100_000, "big": 300_000}
PAPER_STEP_TOKENS = 25_000
NEWSTEST = ("newstest2013", "newstest2014")
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "wmt14"
# (source lengths, target lengths) of the pairs of one batch.
Shape = tuple[list[int], list[int]]


def forward_flops(size: Size, batch: int, src_len: int, tgt_len: int) -> int:
    """Multiply-add FLOPs (2 per MAC) of one forward pass, counting full (unmasked) attention."""
    d, ff = size.d_model, size.ffn
    src, tgt = batch * src_len, batch * tgt_len
    encoder = size.layers * (src * (8 * d * d + 4 * d * ff) + 4 * batch * src_len * src_len * d)
    decoder_self = tgt * 8 * d * d + 4 * batch * tgt_len * tgt_len * d
    decoder_cross = tgt * 4 * d * d + src * 4 * d * d + 4 * batch * tgt_len * src_len * d
    decoder = size.layers * (decoder_self + decoder_cross + tgt * 4 * d * ff)
    return encoder + decoder + tgt * 2 * d * size.vocab


def padded_batch(size: Size, shape: Shape, seed: int) -> dict[str, torch.Tensor]:
    """Random ordinary ids in pairs of the lengths of `shape`, each sentence ending in the end token, padded
    to the longest of its side: the pad id (the last) under attention mask 0, and labels -100 (no loss)."""
    generator = torch.Generator().manual_seed(seed)
    src_lengths, tgt_lengths = (torch.tensor(lengths) for lengths in shape)
    rows = torch.arange(len(src_lengths))
    src = torch.randint(
        FIRST_ORDINARY, size.vocab - 1, (len(rows), int(src_lengths.max())), generator=generator
    )
    labels = torch.randint(
        FIRST_ORDINARY, size.vocab - 1, (len(rows), int(tgt_lengths.max())), generator=generator
    )
    src[rows, src_lengths - 1] = labels[rows, tgt_lengths - 1] = EOS
    src_real = torch.arange(src.shape[1]) < src_lengths[:, None]
    tgt_real = torch.arange(labels.shape[1]) < tgt_lengths[:, None]
    return {
        "input_ids": src.masked_fill(~src_real, size.vocab - 1),
        "attention_mask": src_real.long(),
        "labels": labels.masked_fill(~tgt_real, -100),
    }


def newstest_lengths(folder: Path, bpe_vocab: int) -> tuple[list[int], list[int], int]:
    """Lengths in tokens, end token included, of the English and the German side of the newstest2013 and
    newstest2014 pairs in `folder`, under one BPE vocabulary of up to `bpe_vocab` tokens trained on their
    text (Section 5.1), and the vocabulary's size."""
    english, german = (
        [
            line
            for name in NEWSTEST
            for line in (folder / f"{name}.{language}").read_text("utf-8").splitlines()
        ]
        for language in ("en", "de")
    )
    if len(english) != len(german):
        raise SystemExit(f"{folder}: {len(english)} English lines but {len(german)} German lines.")
    tokenizer = train_shared_bpe_tokenizer(english + german, vocab_size=bpe_vocab, show_progress=False)
    src, tgt = ([len(ids) for ids in tokenizer(text)["input_ids"]] for text in (english, german))
    return src, tgt, len(tokenizer)


def batch_shapes(args: argparse.Namespace, result: dict) -> list[Shape] | None:
    """The shapes of the batches that a round trains on: `--batch` pairs of `--src-len` and `--tgt-len`
    tokens, or with `--data` the newstest pairs' token-budget batches, described in `result["data"]`.
    None, with the reason in `result["skipped"]`, where `--data` names a folder without the files."""
    if args.data is None:
        return [([args.src_len] * args.batch, [args.tgt_len] * args.batch)]
    folder = Path(args.data)
    missing = [f"{name}.{language}" for name in NEWSTEST for language in ("en", "de")]
    missing = [name for name in missing if not (folder / name).is_file()]
    if missing:
        result["skipped"] = f"no real-length batches: {folder} lacks {', '.join(missing)} (give --data DIR)"
        print(f"skipped: {result['skipped']}", file=sys.stderr)
        return None
    src, tgt, vocabulary = newstest_lengths(folder, args.bpe_vocab)
    # Copies of the pairs stand in for a corpus as large as the paper's (4.5M pairs) with their lengths:
    # there, a token-budget batch holds pairs of nearly the same lengths, which 6003 pairs cannot fill.
    src, tgt = src * args.data_copies, tgt * args.data_copies
    sampler = TokenBudgetBatchSampler(src, tgt, max_tokens=args.max_tokens, seed=0)
    epoch = list(sampler)
    shapes = [([src[i] for i in batch], [tgt[i] for i in batch]) for batch in epoch[: args.max_steps]]
    result["data"] = {
        "folder": str(folder),
        "pairs": len(src) // args.data_copies,
        "copies": args.data_copies,
        "bpe_vocab_size": vocabulary,
        "mean_source_tokens": statistics.mean(src),
        "mean_target_tokens": statistics.mean(tgt),
        "max_tokens": args.max_tokens,
        "batches_per_epoch": len(epoch),
        "batches_per_round": len(shapes),
        "pairs_per_batch": [len(s) for s, _ in shapes],
        "target_padding_share": 1 - sum(sum(t) for _, t in shapes) / sum(len(t) * max(t) for _, t in shapes),
    }
    return shapes


def autocast(precision: str, device: str):
    return torch.autocast(device, dtype=torch.bfloat16) if precision == "bf16" else nullcontext()


@contextmanager
def chunked_loss_on_every_device() -> Iterator[None]:
    """A lever measured on GPUs (`ours-chunked-loss`): the chunked label-smoothed loss of `cpu_speedups`,
    which keeps no float32 copy of the logits, taken in eager training off the CPU too. The model reads
    its gate through the loss module, which the block swaps and restores."""
    original = training_loss.chunked_loss_applies
    training_loss.chunked_loss_applies = lambda logits: (
        logits.requires_grad and torch.is_grad_enabled() and not torch.compiler.is_compiling()
    )
    try:
        yield
    finally:
        training_loss.chunked_loss_applies = original


class Trainee:
    """One model on `device`, its optimizer, and a compiled wrapper sharing its parameters. The default
    optimizer is the paper's Adam: torch's default implementation on a CPU, the fused one on a GPU.
    `label_smoothing` None: the model's own loss (Marian's); a number: the training loss of `train`, over
    the logits of the decoder inputs the data collator makes."""

    def __init__(
        self,
        model: torch.nn.Module,
        lr: float = 1e-4,
        optimizer: torch.optim.Optimizer | None = None,
        cpu_speedups_on: bool = True,
        device: str = "cpu",
        chunked_loss: bool = False,
        label_smoothing: float | None = None,
    ) -> None:
        self.model = model.to(device).train()
        self.label_smoothing = label_smoothing
        self.device = device
        self.cpu_speedups_on = cpu_speedups_on
        self.chunked_loss = chunked_loss
        self.optimizer = optimizer or torch.optim.Adam(
            model.parameters(), lr=lr, betas=(0.9, 0.98), eps=1e-9, fused=True if device == "cuda" else None
        )
        self.compiled: torch.nn.Module | CompiledTrainingLoss | None = None
        self.regions = ExitStack()

    def step(self, batch: dict[str, torch.Tensor], precision: str, compile_: bool) -> float:
        try:
            lever = chunked_loss_on_every_device() if self.chunked_loss else nullcontext()
            with cpu_speedups_switched(self.cpu_speedups_on), lever:
                with autocast(precision, self.device):
                    loss = self.compiled_loss(batch) if compile_ else self.loss(batch)
                loss.backward()
            self.optimizer.step()
        finally:  # also after a failed step (out of memory), whose gradients would hold on to memory
            self.optimizer.zero_grad(set_to_none=True)
        return loss.item()

    def teacher_forced(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`batch` with the decoder inputs `train`'s data collator makes from the labels."""
        return {
            **batch,
            "decoder_input_ids": self.model.prepare_decoder_input_ids_from_labels(batch["labels"]),
        }

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.label_smoothing is None:
            return self.model(**batch).loss
        return forward_and_loss(self.model, self.teacher_forced(batch), self.label_smoothing, None)

    def compiled_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The loss through compiled code. Marian's: `torch.compile` of the model, its loss inside. Ours:
        the step `train --compile` runs (`CompiledTrainingLoss`: the forward and the label-smoothed loss as
        one function, the layers compiled once per class, batch dimensions dynamic); the layers stay marked
        for the trainee's life, so that every call finds the same regions."""
        if self.label_smoothing is None:
            if self.compiled is None:
                self.compiled = torch.compile(self.model)
            return self.compiled(**batch).loss
        if self.compiled is None:
            self.compiled = CompiledTrainingLoss(self.label_smoothing)
            self.regions.enter_context(compiled_regions(self.model))
        return self.compiled(self.model, self.teacher_forced(batch), None)


def bench_variants(
    label: str,
    trainees: dict[str, Trainee],
    variants: list[tuple[str, str]],
    shapes: list[Shape],
    size: Size,
    args: argparse.Namespace,
    peaks: dict[str, float],
) -> dict:
    """Times each (model, mode) variant on a pass over the batches of `shapes`, every round, in alternating
    order, after `--warmup` untimed rounds; then measures its memory over one more pass."""
    device = args.device

    def padded(batch: dict[str, torch.Tensor], compiled: bool) -> dict[str, torch.Tensor]:
        """The batch as a step of `train` trains on it: padded to its longest, or up to its buckets, and
        compiled, to lengths that are multiples of SEQUENCE_MULTIPLE (as the buckets are already)."""
        if args.length_buckets:
            batch = pad_to_buckets(dict(batch), size.vocab - 1)
        elif compiled:
            batch = pad_to_buckets(dict(batch), size.vocab - 1, round_up=compiled_length)
        return {key: value.to(device) for key, value in batch.items()}

    unpadded = [padded_batch(size, shape, seed) for seed, shape in enumerate(shapes)]
    batches = {compiled: [padded(batch, compiled) for batch in unpadded] for compiled in (False, True)}
    tokens = sum(int((batch["labels"] != -100).sum()) for batch in batches[False])
    flops = {
        compiled: sum(
            3 * forward_flops(size, *batch["input_ids"].shape, batch["labels"].shape[1])
            for batch in batches[compiled]
        )
        for compiled in (False, True)
    }

    def train_pass(model: str, mode: str) -> None:
        precision, how = mode.split("-")[:2]
        for batch in batches[how == "compile"]:
            trainees[model].step(batch, precision, how == "compile")

    def name(variant: tuple[str, str]) -> str:
        return f"{label}: {variant[0]} {variant[1]}"

    errors: dict[str, str] = {}
    times: dict[tuple[str, str], list[float]] = {v: [] for v in variants}
    for round_ in range(args.warmup + args.repeats):
        # On a CPU the peak is re-measured every round and the best kept, so that MFU is not flattered by a
        # peak measured in a busy minute; a GPU runs one job at a time.
        if device == "cpu":
            for key, value in gemm_peaks(repeats=1 if args.quick else 2).items():
                peaks[key] = max(peaks[key], value)
        order = variants if round_ % 2 == 0 else variants[::-1]
        for variant in (v for v in order if name(v) not in errors):
            t = attempt(device, name(variant), partial(timed, partial(train_pass, *variant), device), errors)
            if t is not None and round_ >= args.warmup:
                times[variant].append(t)
        print(f"  [{label}] round {round_ + 1}/{args.warmup + args.repeats} done", file=sys.stderr)
    # Memory in passes of its own: PeakRSS first hands freed memory back to the OS (malloc_trim), and a
    # timed step would then pay page faults on all of it, which a training loop does not.
    memory = {}
    for variant in (v for v in variants if name(v) not in errors):
        memory[variant] = step_memory(device)
        with memory[variant]:
            attempt(device, name(variant), partial(train_pass, *variant), errors)

    def speedup(reference: tuple[str, str], t: list[float]) -> float | None:
        if reference not in times or name(reference) in errors:
            return None
        return statistics.median(r / o for r, o in zip(times[reference], t))

    rows = []
    for variant in variants:
        model, mode = variant
        if name(variant) in errors:
            rows.append({"model": model, "mode": mode, "error": errors[name(variant)]})
            continue
        peak = "bf16" if mode.startswith("bf16") else "fp32_default"
        t = times[variant]
        median = statistics.median(t)
        row = {
            "model": model,
            "mode": mode,
            "step_seconds": [seconds / len(unpadded) for seconds in t],
            "tokens_per_s": tokens / median,
            "mfu": flops["compile" in mode] / median / (peaks[peak] * 1e9),
            "mfu_peak": peak,
            "peak_step_memory_mb": memory[variant].peak_delta / 2**20,
        }
        if device == "cuda":
            row["peak_memory_allocated_mb"] = memory[variant].peak / 2**20
        same_mode = speedup(("marian", mode), t) if model != "marian" else None
        fp32_eager = speedup(("marian", "fp32-eager"), t)
        row |= {"speedup_vs_marian_same_mode": same_mode} if same_mode is not None else {}
        row |= {"speedup_vs_marian_fp32_eager": fp32_eager} if fp32_eager is not None else {}
        rows.append(row)
    return {
        "steps_per_round": len(unpadded),
        "target_tokens_per_step": tokens / len(unpadded),
        "flops_per_step": flops[False] / len(unpadded),
        "flops_per_step_compiled": flops[True] / len(unpadded),
        "rows": rows,
    }


def bench_size(name: str, size: Size, shapes: list[Shape], args: argparse.Namespace, peaks: dict) -> dict:
    """Ours against Marian, same weights, at `size`; on a CPU also ours without its CPU speed-ups and in
    the fast modes."""
    with ExitStack() as stack:
        torch._dynamo.reset()
        marian, ours = model_pair(size, seed=0, dropout=0.1, attn=args.attn)
        smoothing = args.label_smoothing  # 0 by default: Marian's loss has none, like for like
        trainees = {
            "marian": Trainee(marian, device=args.device),
            "ours": Trainee(ours, device=args.device, label_smoothing=smoothing),
        }
        modes = [m for m in MODES if m in args.modes]
        variants = [(model, mode) for mode in modes for model in ("marian", "ours")]
        eager_modes = [mode for mode in modes if mode.endswith("eager")]
        if eager_modes and args.device == "cpu":
            trainees["ours-no-speedups"] = Trainee(
                copy.deepcopy(ours), cpu_speedups_on=False, label_smoothing=smoothing
            )
            variants += [("ours-no-speedups", mode) for mode in eager_modes]
        if eager_modes and args.device == "cuda":
            chunked = Trainee(
                copy.deepcopy(ours), device=args.device, chunked_loss=True, label_smoothing=smoothing
            )
            trainees["ours-chunked-loss"] = chunked
            variants += [("ours-chunked-loss", mode) for mode in eager_modes]
        fast_modes = [m for m in FAST_MODES if m in args.fast_modes]
        if fast_modes:
            fast = copy.deepcopy(ours)
            stack.enter_context(cpu_bf16_training(fast))
            # The fastest mode we offer trains with the library's optimizer (fused Adam).
            optimizer = build_paper_optimizer(fast, lr=1e-4)
            trainees["ours-fast"] = Trainee(
                fast, optimizer=optimizer, device=args.device, label_smoothing=smoothing
            )
            variants += [("ours-fast", mode) for mode in fast_modes]
        result = bench_variants(name, trainees, variants, shapes, size, args, peaks)
    if args.data is None:
        result |= {"batch": args.batch, "src_len": args.src_len, "tgt_len": args.tgt_len}
    return {"size": size_dict(size), **result}


def bench_preset(name: str, shapes: list[Shape], args: argparse.Namespace, peaks: dict) -> dict:
    """Ours alone as the paper's `name` model, with the hours its paper's run would take at each mode's
    throughput."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    config = VanillaTransformerConfig.from_preset(name, vocab_size=args.preset_vocab)
    model = VanillaTransformerForConditionalGeneration(config)
    model.set_attn_implementation(args.attn)
    size = Size(
        config.d_model,
        config.encoder_layers,
        config.encoder_attention_heads,
        config.encoder_ffn_dim,
        config.vocab_size,
    )
    variants = [("ours", mode) for mode in MODES if mode in args.modes]
    result = bench_variants(
        f"preset {name}",
        {"ours": Trainee(model, device=args.device, label_smoothing=args.label_smoothing)},
        variants,
        shapes,
        size,
        args,
        peaks,
    )
    for row in result["rows"]:
        if "tokens_per_s" in row:
            row["paper_run_hours"] = PAPER_STEPS[name] * PAPER_STEP_TOKENS / row["tokens_per_s"] / 3600
    return {"size": size_dict(size), "paper_steps": PAPER_STEPS[name], **result}


def copy_task_batch(size: Size, batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    """A learnable task, so that the loss curve goes somewhere: the target is the source reversed."""
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(FIRST_ORDINARY, min(size.vocab - 1, 500), (batch, length), generator=generator)
    labels = torch.cat([src.flip(1), torch.full((batch, 1), EOS)], dim=1)
    return {"input_ids": src, "attention_mask": torch.ones_like(src), "labels": labels}


def loss_curves(
    size: Size, steps: int, batch: int, length: int, fastest: str, attn: str, device: str
) -> dict:
    """Marian and ours from the same weights, same batches and same dropout seeds."""
    curves: dict[str, list[float]] = {}
    for label, which, mode in (
        ("marian fp32-eager", "marian", "fp32-eager"),
        ("ours fp32-eager", "ours", "fp32-eager"),
        (f"ours {fastest}", "ours", fastest),
    ):
        torch._dynamo.reset()
        marian, ours = model_pair(size, seed=0, dropout=0.1, attn=attn)
        trainee = Trainee(
            marian if which == "marian" else ours,
            lr=5e-4,
            device=device,
            label_smoothing=None if which == "marian" else 0.0,
        )
        precision, how = mode.split("-")[:2]
        losses = []
        with cpu_bf16_training(ours) if mode.endswith("attn_eager") else nullcontext():
            for step in range(steps):
                torch.manual_seed(1000 + step)  # the same dropout masks for both models
                inputs = {k: v.to(device) for k, v in copy_task_batch(size, batch, length, step).items()}
                losses.append(trainee.step(inputs, precision, how == "compile"))
        curves[label] = losses
        print(f"  loss curve {label}: first {losses[0]:.4f} last {losses[-1]:.4f}", file=sys.stderr)

    reference = curves["marian fp32-eager"]
    tail = max(1, steps // 10)
    summary = {}
    for label, losses in curves.items():
        diffs = [abs(a - b) for a, b in zip(losses, reference)]
        summary[label] = {
            "first": losses[0],
            "last": losses[-1],
            f"mean_last_{tail}": statistics.mean(losses[-tail:]),
            "max_abs_diff_vs_marian": max(diffs),
            "mean_abs_diff_vs_marian": statistics.mean(diffs),
        }
    return {
        "steps": steps,
        "batch": batch,
        "length": length,
        "size": size_dict(size),
        "summary": summary,
        "curves": curves,
    }


# The columns of the results table: header, the rows' key that it shows, and how.
COLUMNS: list[tuple[str, str, Callable[[Any], str]]] = [
    ("tok/s", "tokens_per_s", "{:.0f}".format),
    ("step s", "step_seconds", lambda seconds: f"{statistics.median(seconds):.4f}"),
    ("x Marian same mode", "speedup_vs_marian_same_mode", "{:.2f}".format),
    ("x Marian fp32 eager", "speedup_vs_marian_fp32_eager", "{:.2f}".format),
    ("MFU", "mfu", "{:.1%}".format),
    ("step mem MB", "peak_step_memory_mb", "{:.0f}".format),
    ("peak allocated MB", "peak_memory_allocated_mb", "{:.0f}".format),
    ("paper run h", "paper_run_hours", "{:.1f}".format),
]


def results_table(groups: dict[str, dict]) -> str:
    """One line per variant of each size or preset, in the columns that some row fills (tok/s always); a
    failed variant shows its error."""
    rows = [(name, row) for name, data in groups.items() for row in data["rows"]]
    columns = [c for c in COLUMNS if c[1] == "tokens_per_s" or any(c[1] in row for _, row in rows)]
    lines = []
    for name, row in rows:
        if "error" in row:
            cells = [f"failed: {row['error']}"] + [""] * (len(columns) - 1)
        else:
            cells = [show(row[key]) if key in row else "" for _, key, show in columns]
        lines.append([name, row["model"], row["mode"], *cells])
    return format_table(["size", "model", "mode", *(header for header, _, _ in columns)], lines)


def main(argv: list[str] | None = None) -> dict:
    parser = benchmark_parser(__doc__, batch=128)
    add_device_option(parser)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--fast-modes", nargs="*", default=list(FAST_MODES), choices=FAST_MODES)
    parser.add_argument("--src-len", type=int, default=32)
    parser.add_argument("--tgt-len", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds (compilation happens here)")
    parser.add_argument("--label-smoothing", type=float, default=0.0, help="ours; Marian's loss has none")
    parser.add_argument(
        "--data",
        nargs="?",
        const=str(DEFAULT_DATA),
        default=None,
        metavar="DIR",
        help="real-length batches of the newstest2013/2014 En-De files in DIR (see above)",
    )
    parser.add_argument("--bpe-vocab", type=int, default=32000, help="--data: BPE vocabulary of the lengths")
    parser.add_argument(
        "--max-tokens", type=int, default=25000, help="--data: padded tokens a batch and side"
    )
    parser.add_argument(
        "--data-copies", type=int, default=100, help="--data: copies of the pairs (see above)"
    )
    parser.add_argument("--max-steps", type=int, default=32, help="--data: batches a round")
    parser.add_argument(
        "--length-buckets",
        action="store_true",
        help="pad each batch up to its lengths' buckets, as train --length-buckets does",
    )
    parser.add_argument("--presets", nargs="+", default=[], choices=sorted(PAPER_STEPS), help="ours only")
    parser.add_argument(
        "--preset-vocab", type=int, default=37000, help="--presets: vocabulary (paper: 37000)"
    )
    parser.add_argument("--loss-curve", type=int, default=0, metavar="STEPS")
    parser.add_argument("--loss-curve-size", default="small", choices=sorted(SIZES))
    parser.add_argument("--fastest", default="bf16-eager-attn_eager", choices=MODES + FAST_MODES)
    parser.add_argument("--output", default="benchmarks/results/results_train.json")
    args = parse_device_args(parser, argv, CUDA_DEFAULTS)
    if args.quick:
        args.sizes, args.batch, args.src_len, args.tgt_len = ["tiny"], 8, 12, 12
        args.repeats, args.warmup, args.modes = 1, 1, ["fp32-eager", "bf16-eager"]
        args.fast_modes = ["bf16-eager-attn_eager"] if args.device == "cpu" else []
        args.max_tokens, args.max_steps = 1000, 3
        args.loss_curve, args.loss_curve_size = args.loss_curve and 20, "tiny"
        if "compile" in args.fastest:  # compiling takes longer than the whole quick run
            args.fastest = args.fastest.replace("compile", "eager")
    if args.threads:
        torch.set_num_threads(args.threads)

    result: dict = {"machine": machine_line(), "args": vars(args)}
    shapes = batch_shapes(args, result)
    if shapes is None:
        write_result(result, args.output)
        return result
    peaks = gemm_peaks(repeats=2 if args.quick else 5, device=args.device)
    result["gemm_peak_gflops"] = peaks
    shape = "x".join(map(str, GEMM_SHAPES[args.device]))
    print(f"GEMM peak GFLOP/s ({shape}): {', '.join(f'{k} {v:.0f}' for k, v in peaks.items())}")
    if args.presets:
        result["presets"] = {name: bench_preset(name, shapes, args, peaks) for name in args.presets}
    else:
        result["sizes"] = {name: bench_size(name, SIZES[name], shapes, args, peaks) for name in args.sizes}
    print(f"GEMM peak GFLOP/s, best of the run: {', '.join(f'{k} {v:.0f}' for k, v in peaks.items())}")
    groups = (
        result["sizes"] if "sizes" in result else {f"preset {k}": v for k, v in result["presets"].items()}
    )
    print(results_table(groups))

    if args.loss_curve:
        curve = loss_curves(
            SIZES[args.loss_curve_size],
            args.loss_curve,
            32 if not args.quick else 4,
            16,
            args.fastest,
            args.attn,
            args.device,
        )
        result["loss_curve"] = curve
        print(
            format_table(
                ["loss curve", "first", "last", "max |diff| vs Marian", "mean |diff| vs Marian"],
                [
                    [
                        k,
                        f"{v['first']:.4f}",
                        f"{v['last']:.4f}",
                        f"{v['max_abs_diff_vs_marian']:.4f}",
                        f"{v['mean_abs_diff_vs_marian']:.4f}",
                    ]
                    for k, v in curve["summary"].items()
                ],
            )
        )
        finite = all(math.isfinite(x) for c in curve["curves"].values() for x in c)
        result["loss_curve"]["finite"] = finite

    write_result(result, args.output)
    return result


if __name__ == "__main__":
    main()
