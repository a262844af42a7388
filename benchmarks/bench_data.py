"""Data preparation at corpus scale: reading, BPE training and tokenization of Section 5.1's sentence pairs.

    python benchmarks/bench_data.py                        # 1M pairs (~10 min on 2 busy cores)
    python benchmarks/bench_data.py --pairs 1000000 4500000
    python benchmarks/bench_data.py --quick                # 5k pairs, seconds: what the tests run

The corpus is the shipped Multi30k training set (29k pairs) repeated up to `--pairs` lines, each repetition
in its own shuffled order and numbered (its number appended to both sides), written as `train.en` /
`train.de` in a temporary folder. WMT 2014 English-German is 4.5M pairs.

For each size: the shared BPE vocabulary is trained from the Arrow columns (`train_shared_bpe_tokenizer` on
the dataset), then preparation (`load_parallel_data` + `tokenize_pairs` + `TokenBudgetBatchSampler`) runs
in a fresh process with an empty `HF_DATASETS_CACHE`, once per `--num-proc`, and again in a second fresh
process that finds the cache. Each process reports its peak resident memory (`ru_maxrss`, memory-mapped
file pages included) and the peak of its anonymous memory (`RssAnon`: what it holds beyond the
memory-mapped files, whose pages the kernel can drop and processes share), and the same two figures,
sampled, for the largest of its `map` workers.
"""

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MULTI30K = REPO / "data" / "multi30k"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _memory import MemoryPeaks  # noqa: E402


def write_corpus(folder: Path, pairs: int, seed: int = 0) -> Path:
    """Write `pairs` lines of repeated, shuffled and numbered Multi30k to folder/train.{en,de}."""
    english = (MULTI30K / "train.en").read_text(encoding="utf-8").split("\n")[:-1]
    german = (MULTI30K / "train.de").read_text(encoding="utf-8").split("\n")[:-1]
    rng = random.Random(seed)
    order = list(range(len(english)))
    with (
        open(folder / "train.en", "w", encoding="utf-8") as en,
        open(folder / "train.de", "w", encoding="utf-8") as de,
    ):
        for repetition, start in enumerate(range(0, pairs, len(order))):
            rng.shuffle(order)
            chosen = order[: pairs - start]
            en.write("".join(f"{english[i]} {repetition}\n" for i in chosen))
            de.write("".join(f"{german[i]} {repetition}\n" for i in chosen))
    return folder / "train"


def prepare(prefix: str, tokenizer_dir: str, num_proc: int, max_length: int, max_tokens: int) -> dict:
    """One preparation as training does it, in this process; returns its times and memory."""
    from hf_vanilla_transformer.common.tokenization import load_tokenizer
    from hf_vanilla_transformer.training.batching import TokenBudgetBatchSampler
    from hf_vanilla_transformer.training.data import load_parallel_data, tokenize_pairs

    tokenizer = load_tokenizer(tokenizer_dir)
    with MemoryPeaks() as memory:
        start = time.perf_counter()
        pairs = load_parallel_data(prefix, src_lang="en", tgt_lang="de")
        read = time.perf_counter()
        tokenized = tokenize_pairs(pairs, tokenizer, max_length, max_length, num_proc=num_proc)
        tokenize = time.perf_counter()
        sampler = TokenBudgetBatchSampler.from_dataset(tokenized, max_tokens)
        end = time.perf_counter()
    return {
        "pairs": len(pairs),
        "tokenized_pairs": len(tokenized),
        "batches": len(sampler),
        "read_s": round(read - start, 2),
        "tokenize_s": round(tokenize - read, 2),
        "sampler_s": round(end - tokenize, 2),
        "total_s": round(end - start, 2),
        "pairs_per_s": round(len(pairs) / (end - start)),
        # ru_maxrss (KiB on Linux) is exact for this process; the workers' figures are sampled.
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "peak_anonymous_mib": round(memory.anonymous["main"] / 2**20),
        "workers_peak_rss_mib": round(memory.rss["workers"] / 2**20),
        "workers_peak_anonymous_mib": round(memory.anonymous["workers"] / 2**20),
        "cache_mib": round(sum(os.path.getsize(f["filename"]) for f in tokenized.cache_files) / 2**20),
    }


def prepare_in_fresh_process(
    args: argparse.Namespace, prefix: Path, tokenizer_dir: Path, cache: Path, num_proc: int
):
    command = [sys.executable, __file__, "--child", str(prefix), str(tokenizer_dir), str(num_proc)]
    command += ["--max-length", str(args.max_length), "--max-tokens", str(args.max_tokens)]
    env = dict(os.environ, HF_DATASETS_CACHE=str(cache), HF_HUB_OFFLINE="1")
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        raise RuntimeError(f"Preparation with num_proc={num_proc} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_size(args: argparse.Namespace, pairs: int, folder: Path) -> dict:
    import datasets

    from hf_vanilla_transformer.common.tokenization import train_shared_bpe_tokenizer
    from hf_vanilla_transformer.training.data import load_parallel_data

    start = time.perf_counter()
    prefix = write_corpus(folder, pairs)
    result = {
        "corpus_write_s": round(time.perf_counter() - start, 1),
        "corpus_mib": round(sum(p.stat().st_size for p in folder.glob("train.*")) / 2**20),
    }
    print(f"{pairs} pairs: corpus of {result['corpus_mib']} MiB written", flush=True)

    datasets.config.HF_DATASETS_CACHE = str(folder / "bpe_cache")
    texts = load_parallel_data(prefix, src_lang="en", tgt_lang="de")
    start = time.perf_counter()
    tokenizer = train_shared_bpe_tokenizer(texts, vocab_size=args.vocab_size, show_progress=False)
    seconds = time.perf_counter() - start
    tokenizer_dir = folder / "tokenizer"
    tokenizer.save_pretrained(tokenizer_dir)
    result["bpe"] = {
        "vocab_size": len(tokenizer),
        "seconds": round(seconds, 1),
        "sentences_per_s": round(2 * pairs / seconds),
    }
    # The cost per sentence of iterating a column row by row, as a generator over dataset["src"] does.
    sample = texts.select(range(min(len(texts), 100_000)))
    start = time.perf_counter()
    for _ in sample["src"]:
        pass
    result["row_by_row_sentences_per_s"] = round(len(sample) / (time.perf_counter() - start))
    print(f"  BPE {result['bpe']}, row by row {result['row_by_row_sentences_per_s']} sentences/s", flush=True)

    for num_proc in args.num_proc:
        cache = folder / f"cache_num_proc_{num_proc}"
        runs = {}
        for run in ("first", "cached"):
            runs[run] = prepare_in_fresh_process(args, prefix, tokenizer_dir, cache, num_proc)
            print(f"  num_proc={num_proc} {run}: {runs[run]}", flush=True)
        result[f"num_proc_{num_proc}"] = runs
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--num-proc", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--quick", action="store_true", help="5k pairs: a smoke test")
    parser.add_argument(
        "--output", default=str(Path(__file__).resolve().parent / "results" / "results_data.json")
    )
    parser.add_argument(
        "--child", nargs=3, metavar=("PREFIX", "TOKENIZER", "NUM_PROC"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.child:
        prefix, tokenizer_dir, num_proc = args.child
        print(json.dumps(prepare(prefix, tokenizer_dir, int(num_proc), args.max_length, args.max_tokens)))
        return
    if args.quick:
        args.pairs, args.vocab_size = [5_000], 500

    from _common import machine_line, write_result

    result = {"machine": machine_line(), "command": " ".join(["python", *sys.argv]), "sizes": {}}
    for pairs in args.pairs:
        with tempfile.TemporaryDirectory(prefix="bench_data_") as folder:
            result["sizes"][str(pairs)] = bench_size(args, pairs, Path(folder))
    write_result(result, args.output)


if __name__ == "__main__":
    main()
