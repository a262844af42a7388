"""Training throughput: our model against transformers' MarianMTModel with the same weights and batches.

    python benchmarks/bench_train.py                        # base and small, every mode (~12 min)
    python benchmarks/bench_train.py --sizes small --repeats 5
    python benchmarks/bench_train.py --quick                # tiny dims, seconds: what the tests run

One step = forward with labels, backward, Adam step. `ours-no-speedups` is ours with
`cpu_speedups.ENABLED = False` (eager modes). Each round times every (model, precision, mode)
variant once, in alternating order; a ratio is the median over rounds of the per-round ratio. Peak memory
is the growth of resident memory during one more, untimed, step of each variant (measuring it hands freed
memory back to the OS first, which would add page faults to a timed step). MFU is model FLOPs (matmuls,
3x forward for training) per second over the GEMM peaks measured at the start of the same run.

`--loss-curve N` also trains both models from the same weights on the same batches of a copy task for N
steps (at small dims unless --loss-curve-size says otherwise), ours in fp32 and in the fastest mode, and
reports how far the loss curves are apart.
"""

import argparse
import copy
import math
import statistics
import sys
from contextlib import ExitStack, nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    EOS,
    FIRST_ORDINARY,
    SIZES,
    Size,
    benchmark_parser,
    format_table,
    gemm_peaks,
    machine_line,
    model_pair,
    size_dict,
    timed,
    write_result,
)
from _memory import PeakRSS  # noqa: E402

from hf_vanilla_transformer import cpu_speedups  # noqa: E402
from hf_vanilla_transformer.schedule import build_paper_optimizer  # noqa: E402
from hf_vanilla_transformer.training import cpu_bf16_training  # noqa: E402

# One process compiles several models and modes: more than torch's default of 8 graphs per function.
torch._dynamo.config.recompile_limit = 64
torch._dynamo.config.accumulated_recompile_limit = 512

MODES = ("fp32-eager", "bf16-eager", "fp32-compile", "bf16-compile")
# Ours only, against Marian's fp32-eager: bf16 autocast as scripts/train.py runs it on a CPU
# (`cpu_bf16_training`: eager attention and fast dropout masks) with the fused Adam.
FAST_MODES = ("bf16-eager-attn_eager", "bf16-compile-attn_eager")


def forward_flops(size: Size, batch: int, src_len: int, tgt_len: int) -> int:
    """Multiply-add FLOPs (2 per MAC) of one forward pass, counting full (unmasked) attention."""
    d, ff = size.d_model, size.ffn
    src, tgt = batch * src_len, batch * tgt_len
    encoder = size.layers * (src * (8 * d * d + 4 * d * ff) + 4 * batch * src_len * src_len * d)
    decoder_self = tgt * 8 * d * d + 4 * batch * tgt_len * tgt_len * d
    decoder_cross = tgt * 4 * d * d + src * 4 * d * d + 4 * batch * tgt_len * src_len * d
    decoder = size.layers * (decoder_self + decoder_cross + tgt * 4 * d * ff)
    return encoder + decoder + tgt * 2 * d * size.vocab


def random_batch(size: Size, batch: int, src_len: int, tgt_len: int, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(FIRST_ORDINARY, size.vocab - 1, (batch, src_len), generator=generator)
    labels = torch.randint(FIRST_ORDINARY, size.vocab - 1, (batch, tgt_len), generator=generator)
    src[:, -1] = labels[:, -1] = EOS
    return {"input_ids": src, "attention_mask": torch.ones_like(src), "labels": labels}


def autocast(precision: str):
    return torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else nullcontext()


class Trainee:
    """One model, its optimizer, and a compiled wrapper sharing its parameters."""

    def __init__(
        self,
        model: torch.nn.Module,
        lr: float = 1e-4,
        optimizer: torch.optim.Optimizer | None = None,
        cpu_speedups_on: bool = True,
    ) -> None:
        self.model = model.train()
        self.cpu_speedups_on = cpu_speedups_on
        self.optimizer = optimizer or torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.98), eps=1e-9)
        self.compiled: torch.nn.Module | None = None

    def step(self, batch: dict[str, torch.Tensor], precision: str, compile_: bool) -> float:
        if compile_ and self.compiled is None:
            self.compiled = torch.compile(self.model)
        module = self.compiled if compile_ else self.model
        with cpu_speedups.switched(self.cpu_speedups_on):
            with autocast(precision):
                loss = module(**batch).loss
            loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item()


def bench_size(name: str, size: Size, args: argparse.Namespace, peaks: dict[str, float]) -> dict:
    with ExitStack() as stack:
        return _bench_size(name, size, args, peaks, stack)


def _bench_size(
    name: str, size: Size, args: argparse.Namespace, peaks: dict[str, float], stack: ExitStack
) -> dict:
    torch._dynamo.reset()
    marian, ours = model_pair(size, seed=0, dropout=0.1, attn=args.attn)
    ours.config.label_smoothing = args.label_smoothing  # Marian's loss has none: like for like
    trainees = {"marian": Trainee(marian), "ours": Trainee(ours)}
    modes = [m for m in MODES if m in args.modes]
    variants = [(model, mode) for mode in modes for model in ("marian", "ours")]
    eager_modes = [mode for mode in modes if mode.endswith("eager")]
    if eager_modes:
        trainees["ours-no-speedups"] = Trainee(copy.deepcopy(ours), cpu_speedups_on=False)
        variants += [("ours-no-speedups", mode) for mode in eager_modes]
    fast_modes = [m for m in FAST_MODES if m in args.fast_modes]
    if fast_modes:
        fast = copy.deepcopy(ours)
        stack.enter_context(cpu_bf16_training(fast))
        # The fastest mode we offer trains with the library's optimizer (fused Adam).
        trainees["ours-fast"] = Trainee(fast, optimizer=build_paper_optimizer(fast, lr=1e-4))
        variants += [("ours-fast", mode) for mode in fast_modes]
    batch = random_batch(size, args.batch, args.src_len, args.tgt_len, seed=0)
    tokens = args.batch * args.tgt_len
    flops = 3 * forward_flops(size, args.batch, args.src_len, args.tgt_len)

    def step(model: str, mode: str) -> float:
        precision, how = mode.split("-")[:2]
        return trainees[model].step(batch, precision, how == "compile")

    times: dict[tuple[str, str], list[float]] = {v: [] for v in variants}
    memory: dict[tuple[str, str], list[int]] = {v: [] for v in variants}
    for round_ in range(args.warmup + args.repeats):
        # The peak is re-measured every round and the best kept, so that MFU is not flattered by a peak
        # measured in a busy minute.
        for key, value in gemm_peaks(repeats=1 if args.quick else 2).items():
            peaks[key] = max(peaks[key], value)
        order = variants if round_ % 2 == 0 else variants[::-1]
        for model, mode in order:
            t = timed(lambda: step(model, mode))  # noqa: B023
            if round_ >= args.warmup:
                times[(model, mode)].append(t)
        print(f"  [{name}] round {round_ + 1}/{args.warmup + args.repeats} done", file=sys.stderr)
    # Memory in steps of its own: PeakRSS first hands freed memory back to the OS (malloc_trim), and a
    # timed step would then pay page faults on all of it, which a training loop does not.
    for model, mode in variants:
        with PeakRSS() as rss:
            step(model, mode)
        memory[(model, mode)].append(rss.peak_delta)

    reference = times[("marian", "fp32-eager")] if "fp32-eager" in modes else None
    rows = []
    for model, mode in variants:
        precision = mode.split("-")[0]
        peak = peaks["bf16"] if precision == "bf16" else peaks["fp32_default"]
        t = times[(model, mode)]
        median = statistics.median(t)
        row = {
            "model": model,
            "mode": mode,
            "step_seconds": t,
            "tokens_per_s": tokens / median,
            "mfu": flops / median / (peak * 1e9),
            "mfu_peak": "bf16" if precision == "bf16" else "fp32_default",
            "peak_step_memory_mb": statistics.median(memory[(model, mode)]) / 2**20,
        }
        if model in ("ours", "ours-no-speedups"):
            marian_t = times[("marian", mode)]
            row["speedup_vs_marian_same_mode"] = statistics.median(m / o for m, o in zip(marian_t, t))
        if reference is not None:
            row["speedup_vs_marian_fp32_eager"] = statistics.median(r / o for r, o in zip(reference, t))
        rows.append(row)
    return {
        "size": size_dict(size),
        "batch": args.batch,
        "src_len": args.src_len,
        "tgt_len": args.tgt_len,
        "flops_per_step": flops,
        "rows": rows,
    }


def copy_task_batch(size: Size, batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    """A learnable task, so that the loss curve goes somewhere: the target is the source reversed."""
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(FIRST_ORDINARY, min(size.vocab - 1, 500), (batch, length), generator=generator)
    labels = torch.cat([src.flip(1), torch.full((batch, 1), EOS)], dim=1)
    return {"input_ids": src, "attention_mask": torch.ones_like(src), "labels": labels}


def loss_curves(size: Size, steps: int, batch: int, length: int, fastest: str, attn: str) -> dict:
    """Marian and ours from the same weights, same batches and same dropout seeds."""
    curves: dict[str, list[float]] = {}
    for label, which, mode in (
        ("marian fp32-eager", "marian", "fp32-eager"),
        ("ours fp32-eager", "ours", "fp32-eager"),
        (f"ours {fastest}", "ours", fastest),
    ):
        torch._dynamo.reset()
        marian, ours = model_pair(size, seed=0, dropout=0.1, attn=attn)
        ours.config.label_smoothing = 0.0
        trainee = Trainee(marian if which == "marian" else ours, lr=5e-4)
        precision, how = mode.split("-")[:2]
        losses = []
        with cpu_bf16_training(ours) if mode.endswith("attn_eager") else nullcontext():
            for step in range(steps):
                torch.manual_seed(1000 + step)  # the same dropout masks for both models
                losses.append(
                    trainee.step(copy_task_batch(size, batch, length, step), precision, how == "compile")
                )
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


def main(argv: list[str] | None = None) -> dict:
    parser = benchmark_parser(__doc__, batch=128)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--fast-modes", nargs="*", default=list(FAST_MODES), choices=FAST_MODES)
    parser.add_argument("--src-len", type=int, default=32)
    parser.add_argument("--tgt-len", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds (compilation happens here)")
    parser.add_argument("--label-smoothing", type=float, default=0.0, help="ours; Marian's loss has none")
    parser.add_argument("--loss-curve", type=int, default=0, metavar="STEPS")
    parser.add_argument("--loss-curve-size", default="small", choices=sorted(SIZES))
    parser.add_argument("--fastest", default="bf16-eager-attn_eager", choices=MODES + FAST_MODES)
    parser.add_argument("--output", default="benchmarks/results_train.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.batch, args.src_len, args.tgt_len = ["tiny"], 8, 12, 12
        args.repeats, args.warmup, args.modes = 1, 1, ["fp32-eager", "bf16-eager"]
        args.fast_modes = ["bf16-eager-attn_eager"]
        args.loss_curve, args.loss_curve_size = args.loss_curve and 20, "tiny"
        if "compile" in args.fastest:  # compiling takes longer than the whole quick run
            args.fastest = args.fastest.replace("compile", "eager")
    if args.threads:
        torch.set_num_threads(args.threads)

    result: dict = {"machine": machine_line(), "args": vars(args)}
    peaks = gemm_peaks(repeats=2 if args.quick else 5)
    result["gemm_peak_gflops"] = peaks
    print(f"GEMM peak GFLOP/s (4096x512x2048): {', '.join(f'{k} {v:.0f}' for k, v in peaks.items())}")
    result["sizes"] = {}
    for name in args.sizes:
        result["sizes"][name] = bench_size(name, SIZES[name], args, peaks)
    print(f"GEMM peak GFLOP/s, best of the run: {', '.join(f'{k} {v:.0f}' for k, v in peaks.items())}")

    header = [
        "size",
        "model",
        "mode",
        "tok/s",
        "x Marian same mode",
        "x Marian fp32 eager",
        "MFU",
        "step mem MB",
    ]
    rows = []
    for name, data in result["sizes"].items():
        for row in data["rows"]:
            rows.append(
                [
                    name,
                    row["model"],
                    row["mode"],
                    f"{row['tokens_per_s']:.0f}",
                    f"{row['speedup_vs_marian_same_mode']:.2f}"
                    if "speedup_vs_marian_same_mode" in row
                    else "",
                    f"{row['speedup_vs_marian_fp32_eager']:.2f}"
                    if "speedup_vs_marian_fp32_eager" in row
                    else "",
                    f"{100 * row['mfu']:.1f}% ({row['mfu_peak']})",
                    f"{row['peak_step_memory_mb']:.0f}",
                ]
            )
    print(format_table(header, rows))

    if args.loss_curve:
        curve = loss_curves(
            SIZES[args.loss_curve_size],
            args.loss_curve,
            32 if not args.quick else 4,
            16,
            args.fastest,
            args.attn,
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
