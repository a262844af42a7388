"""The share of padded positions in training batches of the newstest2013/2014 pairs' lengths: token-budget
batches (Section 5.1) padded to each batch's longest (`train`'s default), to the next multiple of 8 (`train
--compile`'s) and to the length buckets (`train --length-buckets`), against packed batches of one static
shape (`training.packing`).

    python benchmarks/bench_packing.py                           # newstest from ../shared/data/wmt14
    python benchmarks/bench_packing.py --row-lengths 128 256 --max-tokens 25000 --data-copies 100

The first three are `bench_compile.py --only padding`'s figures, computed by its own function over the
same lengths (`bench_train.newstest_lengths`: one BPE vocabulary trained on the pairs' text) and the same
`TokenBudgetBatchSampler` batches, so the numbers compare. Packed batches hold as many positions a side as
a token-budget batch may: `--max-tokens // row_length` rows of `row_length` tokens on the side with more
tokens, the other side's rows in proportion (`packing.balanced_row_lengths`), filled by
`PackedBatchSampler`; every batch of the epoch counts, the last, part-empty one too. `--data-copies`
copies of the pairs stand in for a corpus the size of the paper's, as in bench_compile.py.
"""

import argparse
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import format_table, write_result  # noqa: E402
from bench_compile import padding  # noqa: E402
from bench_train import DEFAULT_DATA, NEWSTEST, newstest_lengths  # noqa: E402

from hf_vanilla_transformer.training.batching import TokenBudgetBatchSampler  # noqa: E402
from hf_vanilla_transformer.training.packing import PackedBatchSampler, balanced_row_lengths  # noqa: E402

# The CPU flags that decide the speed of a training step here (bf16 and matrix units).
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_line() -> str:
    """The CPU's model name and which of `CPU_FLAGS` it has, from /proc/cpuinfo."""
    model, flags = "unknown CPU", set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    present = " ".join(f"{flag}={'yes' if flag in flags else 'no'}" for flag in CPU_FLAGS)
    return f"{model} ({present})"


def packed(src: list[int], tgt: list[int], row_length: int, max_tokens: int) -> dict:
    """The epoch of `PackedBatchSampler` batches whose longer rows are `row_length` tokens: its share of
    padded positions, batches, shape and the seconds the sampler took to pack it."""
    source_length, target_length = balanced_row_lengths(src, tgt, row_length)
    rows = max_tokens // max(source_length, target_length)
    started = time.perf_counter()
    batches = list(PackedBatchSampler(src, tgt, rows, source_length, target_length, seed=0))
    seconds = time.perf_counter() - started
    real = sum(src) + sum(tgt)
    return {
        "padding_share": 1 - real / (len(batches) * rows * (source_length + target_length)),
        "batches": len(batches),
        "shape": f"{rows}x{source_length} / {rows}x{target_length}",
        "sampler_s": seconds,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="folder of the newstest2013/2014 files")
    parser.add_argument("--bpe-vocab", type=int, default=32000)
    parser.add_argument("--max-tokens", type=int, default=25000, help="tokens a batch a side (Section 5.1)")
    parser.add_argument("--data-copies", type=int, default=100)
    parser.add_argument("--row-lengths", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--output", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)

    result: dict = {"command": shlex.join(["python", *sys.argv]), "cpu": cpu_line(), "args": vars(args)}
    print(f"command: {result['command']}\ncpu: {result['cpu']}")
    files = [Path(args.data) / f"{name}.{side}" for name in NEWSTEST for side in ("en", "de")]
    missing = [file.name for file in files if not file.is_file()]
    if missing:
        result["skipped"] = f"no newstest lengths: {args.data} lacks {', '.join(missing)} (give --data DIR)"
        print(f"skipped: {result['skipped']}")
        return result

    padded = padding(args)
    src, tgt, _ = newstest_lengths(Path(args.data), args.bpe_vocab)
    src, tgt = src * args.data_copies, tgt * args.data_copies
    token_budget_batches = len(TokenBudgetBatchSampler(src, tgt, max_tokens=args.max_tokens, seed=0))
    result["padded"] = padded | {"batches": token_budget_batches}
    result["packed"] = {length: packed(src, tgt, length, args.max_tokens) for length in args.row_lengths}

    varied = f"varies (<= {args.max_tokens} a side)"
    rows = [
        ["(a) padded to each batch's longest", padded["padding_share_longest"], token_budget_batches, varied],
        ["(b) rounded up to multiples of 8", padded["padding_share_compiled"], token_budget_batches, varied],
        ["    length buckets", padded["padding_share_buckets"], token_budget_batches, varied],
    ]
    rows += [
        [f"(c) packed, rows of {length}", figures["padding_share"], figures["batches"], figures["shape"]]
        for length, figures in result["packed"].items()
    ]
    print(
        f"{len(src)} pairs ({args.data_copies} copies of newstest2013+2014), {sum(src)} + {sum(tgt)} tokens"
    )
    print(
        format_table(
            ["batches", "positions padded", "batches an epoch", "shape (source / target)"],
            [[name, f"{share:.2%}", str(count), shape] for name, share, count, shape in rows],
        )
    )
    for length, figures in result["packed"].items():
        print(f"packing with rows of {length}: the sampler took {figures['sampler_s']:.1f} s for the epoch")
    if args.output:
        write_result(result, args.output)
    return result


if __name__ == "__main__":
    main()
