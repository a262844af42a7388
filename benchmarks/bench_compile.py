"""What compiling the training step costs and gives: cold compile time with the layers compiled once per class
(regional) against the whole model inlined into one graph, warm starts (on the same machine, and on another
from the run folder's compile cache), the compiled step's speed against the eager step, and the padding of
`train`'s batches with and without length buckets.

    python benchmarks/bench_compile.py                     # cpu-demo dimensions, every measurement
    python benchmarks/bench_compile.py --size base --steps 3
    python benchmarks/bench_compile.py --only padding      # seconds: no model
    python benchmarks/bench_compile.py --device cuda --size base --batch 400 --length 64

Each compile measurement runs in a process of its own with an empty `TORCHINDUCTOR_CACHE_DIR` (cold), so that
nothing compiled before is found. Two warm starts follow the cold regional run, each in a fresh process:
"warm-machine" keeps the cold run's `TORCHINDUCTOR_CACHE_DIR`, as a second run or a resumed one on the same
machine finds torch's own cache; "warm-run-folder" gets another empty cache directory and first loads the
compile cache the cold regional run saved in its folder (`training.compilation.CompileCache`), as a run
resumed on another machine does (on a CPU its C++ kernels are compiled again: torch's saved cache holds their
source, not the built libraries). A step is `CompiledTrainingLoss` (forward, label-smoothed loss) and its
backward on random batches whose number of pairs and lengths change from step to step (the shapes `train
--length-buckets` makes), then an Adam step; the first step's time is the compile time (it includes one step's
work, which the eager step's time shows), the median of the next `--steps` the step time; `graphs` counts the
graphs Dynamo compiled in the process (1 when no batch recompiled).

`--only padding`: the newstest2013/2014 pairs' lengths (`bench_train.newstest_lengths`, BPE as there), packed
by `TokenBudgetBatchSampler` into `--max-tokens` batches, and the share of padded positions in them, padded to
each batch's longest (`train`'s default), to the next multiple of 8 (`train --compile`'s, as
`compilation.SEQUENCE_MULTIPLE` says) and to the length buckets (`train --length-buckets`).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    SIZES,
    add_device_option,
    format_table,
    machine_line,
    parse_device_args,
    write_result,
)
from bench_train import DEFAULT_DATA, NEWSTEST, newstest_lengths  # noqa: E402

from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.training.batching import TokenBudgetBatchSampler
from hf_vanilla_transformer.training.compilation import (
    CompileCache,
    CompiledTrainingLoss,
    compiled_length,
    forward_and_loss,
)
from hf_vanilla_transformer.training.length_buckets import bucket_length

MODES = ("cold-regional", "warm-machine", "warm-run-folder", "eager", "cold-whole")
# The modes that run in the cold regional run's Inductor cache directory, kept for them.
SAME_MACHINE = ("cold-regional", "warm-machine")
PAD = 1


def batches(size, batch: int, length: int, count: int, device: str) -> list[dict[str, torch.Tensor]]:
    """`count` batches of random ids, each of a different bucket shape around `batch` x `length` (pairs
    and lengths change together, as in token-budget batches), with some padding."""
    generator = torch.Generator().manual_seed(0)
    made = []
    for index in range(count):
        scale = (1, 2, 1.5)[index % 3]
        pairs, tokens = max(2, int(batch / scale)), bucket_length(max(2, int(length * scale)))
        ids = torch.randint(3, size.vocab, (pairs, tokens), generator=generator)
        mask = torch.ones_like(ids)
        mask[0, tokens // 2 :] = 0
        labels = torch.randint(3, size.vocab, (pairs, tokens), generator=generator)
        labels[1, tokens // 2 :] = -100
        made.append({"input_ids": ids.masked_fill(mask == 0, PAD), "attention_mask": mask, "labels": labels})
    return [{k: v.to(device) for k, v in b.items()} for b in made]


def probe(args: argparse.Namespace) -> dict:
    """One mode's steps in this process: the first step's seconds and the later steps' median."""
    size = SIZES[args.size]
    torch.manual_seed(0)
    config = VanillaTransformerConfig.from_preset(
        "base", vocab_size=size.vocab, d_model=size.d_model, N=size.layers, h=size.heads, d_ff=size.ffn,
        pad_token_id=PAD, bos_token_id=0, eos_token_id=2, decoder_start_token_id=0,
    )  # fmt: skip
    model = VanillaTransformerForConditionalGeneration(config).to(args.device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, fused=args.device == "cuda" or None)
    cache = CompileCache(args.cache_folder)
    if args.probe == "warm-run-folder":
        cache.load()
    compiled = None
    if args.probe != "eager":
        compiled = CompiledTrainingLoss(0.1, regional=args.probe != "cold-whole")
    autocast = torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.bf16)
    times = []
    with compiled.regions(model) if compiled else nullcontext():
        for batch in batches(size, args.batch, args.length, args.steps + 1, args.device):
            decoder_input_ids = model.prepare_decoder_input_ids_from_labels(batch["labels"])
            inputs = {**batch, "decoder_input_ids": decoder_input_ids}
            if args.device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            with autocast:
                if compiled is None:
                    loss = forward_and_loss(model, inputs, 0.1, None)
                else:
                    loss = compiled(model, inputs, None)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if args.device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    if args.probe == "cold-regional":
        cache.save()
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]  # more than 1: a batch recompiled
    return {
        "first_step_s": times[0],
        "step_s": statistics.median(times[1:]),
        "loss": float(loss),
        "graphs": graphs,
    }


def padding(args: argparse.Namespace) -> dict:
    """The share of padded positions (both sides) in `train`'s batches of the newstest pairs' lengths."""
    src, tgt, _ = newstest_lengths(Path(args.data), args.bpe_vocab)
    src, tgt = src * args.data_copies, tgt * args.data_copies
    real = padded = multiple = bucketed = 0
    for batch in TokenBudgetBatchSampler(src, tgt, max_tokens=args.max_tokens, seed=0):
        for side in (src, tgt):
            lengths = [side[i] for i in batch]
            real += sum(lengths)
            padded += len(lengths) * max(lengths)
            multiple += len(lengths) * compiled_length(max(lengths))
            bucketed += len(lengths) * bucket_length(max(lengths))
    return {
        "padding_share_longest": 1 - real / padded,
        "padding_share_compiled": 1 - real / multiple,
        "padding_share_buckets": 1 - real / bucketed,
    }


def run_mode(mode: str, args: argparse.Namespace, cache_folder: str, machine_cache: str) -> dict:
    """`probe` of `mode` in a child process, with `machine_cache` as its Inductor cache directory for the
    `SAME_MACHINE` modes, else an empty one of its own."""
    with tempfile.TemporaryDirectory() as empty_cache:
        command = [sys.executable, __file__, "--probe", mode, "--cache-folder", cache_folder]
        command += ["--size", args.size, "--batch", str(args.batch), "--length", str(args.length)]
        command += ["--steps", str(args.steps), "--device", args.device] + (["--bf16"] if args.bf16 else [])
        inductor_cache = machine_cache if mode in SAME_MACHINE else empty_cache
        environment = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": inductor_cache}
        started = time.perf_counter()
        done = subprocess.run(command, env=environment, capture_output=True, text=True)
        if done.returncode != 0:
            return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"}
        return json.loads(done.stdout.strip().splitlines()[-1]) | {"process_s": time.perf_counter() - started}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_device_option(parser)
    parser.add_argument("--size", default="demo", choices=sorted(SIZES))
    parser.add_argument("--batch", type=int, default=16, help="pairs of the middle-sized batches")
    parser.add_argument("--length", type=int, default=32, help="tokens of the middle-sized batches")
    parser.add_argument("--steps", type=int, default=3, help="timed steps after the first")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast")
    parser.add_argument("--only", nargs="+", default=[*MODES, "padding"], choices=[*MODES, "padding"])
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="padding: folder of the newstest files")
    parser.add_argument("--bpe-vocab", type=int, default=32000)
    parser.add_argument("--max-tokens", type=int, default=25000)
    parser.add_argument("--data-copies", type=int, default=100)
    parser.add_argument("--output", default="benchmarks/results/results_compile.json")
    parser.add_argument("--probe", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--cache-folder", help=argparse.SUPPRESS)
    args = parse_device_args(parser, argv, {})
    if args.probe:
        print(json.dumps(probe(args)))
        return {}

    result: dict = {"machine": machine_line(), "args": vars(args), "modes": {}}
    # Where the cold regional run leaves its compile cache, and torch's own cache of that machine.
    with tempfile.TemporaryDirectory() as run_folder, tempfile.TemporaryDirectory() as machine_cache:
        for mode in (m for m in MODES if m in args.only):
            result["modes"][mode] = run_mode(mode, args, run_folder, machine_cache)
            print(f"  {mode}: {result['modes'][mode]}", file=sys.stderr)
            write_result(result, args.output)  # each mode's figures kept, should a later one be cut off
    rows = [
        [mode, *(f"{r[key]:.2f}" if key in r else r.get("error", "") for key in ("first_step_s", "step_s"))]
        for mode, r in result["modes"].items()
    ]
    if rows:
        print(format_table(["mode", "first step s (compile)", "step s"], rows))
    if "padding" in args.only:
        files = [Path(args.data) / f"{name}.{side}" for name in NEWSTEST for side in ("en", "de")]
        if all(file.is_file() for file in files):
            result["padding"] = padding(args)
            print(f"padding share: {result['padding']}")
        else:
            result["padding"] = {"skipped": f"no newstest2013/2014 files in {args.data}"}
    write_result(result, args.output)
    return result


if __name__ == "__main__":
    main()
