"""The label-smoothed loss of Section 5.4 over a training step's logits: torch's `cross_entropy` on float32
logits (what training runs on GPUs and under torch.compile) against `loss`' chunked loss, which
keeps no float32 copy of the logits and writes the gradient directly.

    python benchmarks/bench_loss.py --device cuda             # 25,600 tokens x 32,000 (the paper's step)
    python benchmarks/bench_loss.py --quick                   # tiny, on the CPU: what the tests run

For each: forward and backward time (median of the repeats, after a warm-up), the memory the pair takes
beyond the logits themselves (CUDA: peak allocated; CPU: not measured), and the largest differences
of the loss and the gradient from torch's, which must be float rounding only.
"""

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_line, timed, write_result  # noqa: E402

from hf_vanilla_transformer.training.loss import chunked_label_smoothed_cross_entropy_sum  # noqa: E402


def torch_loss(logits: torch.Tensor, labels: torch.Tensor, epsilon: float) -> torch.Tensor:
    """The training loss off the CPU: `loss.label_smoothed_cross_entropy`."""
    return nn.functional.cross_entropy(
        logits.float(), labels, ignore_index=-100, label_smoothing=epsilon, reduction="sum"
    )


LOSSES: dict[str, Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]] = {
    "torch": torch_loss,
    "chunked": chunked_label_smoothed_cross_entropy_sum,
}


def measure(
    loss_fn: Callable, logits: torch.Tensor, labels: torch.Tensor, epsilon: float, repeats: int
) -> dict[str, object]:
    """Median seconds of forward + backward, peak extra memory, and the loss and gradient of the last run."""
    device = logits.device
    times, last = [], {}

    def forward_backward() -> None:
        last["leaf"] = logits.detach().requires_grad_()
        last["loss"] = loss_fn(last["leaf"], labels, epsilon)
        last["loss"].backward()

    for _ in range(repeats + 1):  # the first is a warm-up
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        times.append(timed(forward_backward, device.type))
    extra = torch.cuda.max_memory_allocated(device) - base if device.type == "cuda" else None
    return {
        "seconds": statistics.median(times[1:]),
        "peak_extra_bytes": extra,
        "loss": last["loss"].detach(),
        "grad": last["leaf"].grad,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tokens", type=int, default=25_600)
    parser.add_argument("--vocab", type=int, default=32_000)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--epsilon", type=float, default=0.1)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="512 tokens x 1000, 2 repeats, on the CPU")
    parser.add_argument("--output", default="benchmarks/results/results_loss.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.tokens, args.vocab, args.repeats = 512, 1000, 2
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.exit(
            2, f"{parser.prog}: error: --device {args.device}: no CUDA GPU is visible; use --device cpu\n"
        )
    generator = torch.Generator(device).manual_seed(0)
    logits = torch.randn(args.tokens, args.vocab, device=device, generator=generator).mul_(3)
    logits = logits.to(getattr(torch, args.dtype))
    labels = torch.randint(0, args.vocab, (args.tokens,), device=device, generator=generator)
    labels[::7] = -100  # padding, as in real batches
    runs = {name: measure(fn, logits, labels, args.epsilon, args.repeats) for name, fn in LOSSES.items()}
    reference = runs["torch"]
    rows = {}
    for name, run in runs.items():
        rows[name] = {
            "ms": round(run["seconds"] * 1e3, 3),
            "speedup_vs_torch": round(reference["seconds"] / run["seconds"], 3),
            "peak_extra_mb": None
            if run["peak_extra_bytes"] is None
            else round(run["peak_extra_bytes"] / 2**20),
            "loss_rel_diff": float((run["loss"] - reference["loss"]).abs() / reference["loss"].abs()),
            "grad_max_abs_diff": float((run["grad"].float() - reference["grad"].float()).abs().max()),
        }
        print(f"{name:8s} {rows[name]}")
    result = {
        "benchmark": "label-smoothed loss, forward + backward",
        "command": "python benchmarks/bench_loss.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine_line(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "shape": [args.tokens, args.vocab],
        "dtype": args.dtype,
        "losses": rows,
    }
    write_result(result, args.output)
    return result


if __name__ == "__main__":
    main()
