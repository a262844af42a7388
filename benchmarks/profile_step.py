"""Kernel by kernel: ours against transformers' MarianMTModel with the same weights on the same batch,
under `torch.profiler`: a compiled training step (`--what train`: Marian `torch.compile`d with its loss
inside, ours as `train --compile` runs it, `bench_train.Trainee`), or a greedy `generate()` call
(`--what greedy`, eager).

    python benchmarks/profile_step.py                                  # base dims, CPU, 16 x 32 tokens
    python benchmarks/profile_step.py --device cuda --batch 400 --length 64 --bf16
    python benchmarks/profile_step.py --device cuda --what greedy --batch 64 --bf16

For each model: the device time per step (CUDA kernels on a GPU; on a CPU the operators' and Inductor's
C++ kernels' own time), the kernels (or operators) launched per step, the host time per step, and the
`--top` kernels by time, each with its calls and milliseconds per step; then the kernels whose time per step
differs most between the two. Compilation and warm-up happen in `--warmup` untimed steps first; `--steps`
steps are profiled. Results go to `--output` as JSON.
"""

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    SIZES,
    add_device_option,
    format_table,
    machine_line,
    model_pair,
    parse_device_args,
    write_result,
)
from bench_train import Trainee, padded_batch  # noqa: E402


def kernel_times(prof: profile, device: str, steps: int) -> dict[str, dict[str, float]]:
    """Per kernel name: calls and milliseconds per step. On a GPU the CUDA kernels (and copies); on a CPU
    every operator's own time (self time), which counts Inductor's C++ kernels where they are profiled."""
    table: dict[str, dict[str, float]] = defaultdict(lambda: {"calls": 0.0, "ms": 0.0})
    for event in prof.key_averages():
        if device == "cuda":
            milliseconds = event.self_device_time_total / 1000
            if event.device_type != torch.autograd.DeviceType.CUDA or milliseconds == 0:
                continue
        else:
            milliseconds = event.self_cpu_time_total / 1000
        table[event.key]["calls"] += event.count / steps
        table[event.key]["ms"] += milliseconds / steps
    return dict(table)


def profiled(run, device: str, steps: int, warmup: int) -> dict:
    """`run()` `warmup` times untimed, then `steps` times under the profiler: its kernels per step and
    its host (wall) time per step."""
    for _ in range(warmup):
        run()
    if device == "cuda":
        torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            run()
        if device == "cuda":
            torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / steps
    kernels = kernel_times(prof, device, steps)
    return {
        "wall_ms_per_step": wall * 1000,
        "device_ms_per_step": sum(k["ms"] for k in kernels.values()),
        "kernels_per_step": sum(k["calls"] for k in kernels.values()),
        "kernels": kernels,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_device_option(parser)
    parser.add_argument("--what", choices=("train", "greedy"), default="train")
    parser.add_argument("--size", default="base", choices=sorted(SIZES))
    parser.add_argument("--batch", type=int, default=16, help="pairs (train) or sources (greedy)")
    parser.add_argument("--length", type=int, default=32, help="tokens a side (greedy: new tokens too)")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (train) or bf16 weights (greedy)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation among them)")
    parser.add_argument("--steps", type=int, default=2, help="profiled steps")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--output", default="benchmarks/results/results_profile_step.json")
    args = parse_device_args(parser, argv, {})
    if args.device == "cpu":
        # Inductor's C++ kernels then show in the profile under their own names.
        torch._inductor.config.cpp.enable_kernel_profile = True
    size = SIZES[args.size]
    marian, ours = model_pair(size, seed=0, dropout=0.1 if args.what == "train" else 0.0)
    batch = padded_batch(size, ([args.length] * args.batch, [args.length] * args.batch), seed=0)
    batch = {key: value.to(args.device) for key, value in batch.items()}
    results: dict[str, dict] = {}
    if args.what == "train":
        precision = "bf16" if args.bf16 else "fp32"
        trainees = {
            "marian": Trainee(marian, device=args.device),
            "ours": Trainee(ours, device=args.device, label_smoothing=0.0),
        }
        for name, trainee in trainees.items():
            results[name] = profiled(
                lambda trainee=trainee: trainee.step(batch, precision, True),
                args.device,
                args.steps,
                args.warmup,
            )
            print(f"  {name}: profiled", file=sys.stderr)
    else:
        dtype = torch.bfloat16 if args.bf16 else torch.float32
        options = dict(num_beams=1, do_sample=False, max_new_tokens=args.length, min_new_tokens=args.length)
        for name, model in (("marian", marian), ("ours", ours)):
            model = model.to(args.device, dtype).eval()

            def decode(model=model) -> None:
                with torch.no_grad():
                    model.generate(batch["input_ids"], attention_mask=batch["attention_mask"], **options)

            results[name] = profiled(decode, args.device, args.steps, args.warmup)
            print(f"  {name}: profiled", file=sys.stderr)

    for name, result in results.items():
        device_ms, host_ms = result["device_ms_per_step"], result["wall_ms_per_step"]
        kernels = result["kernels_per_step"]
        print(f"{name}: device {device_ms:.2f} ms, host {host_ms:.2f} ms, {kernels:.0f} kernels a step")
        top = sorted(result["kernels"].items(), key=lambda item: -item[1]["ms"])[: args.top]
        rows = [[key[:90], f"{k['calls']:.0f}", f"{k['ms']:.3f}"] for key, k in top]
        print(format_table(["kernel", "calls/step", "ms/step"], rows))
    names = set(results["marian"]["kernels"]) | set(results["ours"]["kernels"])
    empty = {"calls": 0.0, "ms": 0.0}
    differences = sorted(
        names,
        key=lambda key: (
            -abs(
                results["ours"]["kernels"].get(key, empty)["ms"]
                - results["marian"]["kernels"].get(key, empty)["ms"]
            )
        ),
    )[: args.top]
    rows = []
    for key in differences:
        theirs, mine = (
            results["marian"]["kernels"].get(key, empty),
            results["ours"]["kernels"].get(key, empty),
        )
        rows.append(
            [
                key[:80],
                f"{theirs['calls']:.0f}",
                f"{theirs['ms']:.3f}",
                f"{mine['calls']:.0f}",
                f"{mine['ms']:.3f}",
            ]
        )
    print("largest differences, per step:")
    print(format_table(["kernel", "Marian calls", "Marian ms", "ours calls", "ours ms"], rows))
    result = {"machine": machine_line(), "args": vars(args), "models": results}
    write_result(result, args.output)
    return result


if __name__ == "__main__":
    main()
