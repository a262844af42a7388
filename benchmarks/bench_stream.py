"""Memory of `vanilla-transformer translate` on files of growing length: the command reads and writes in
chunks, so its peak resident memory should stay the same whatever the file's length.

For each length in `--lines`, a file of that many lines (the source file's lines, repeated) is translated by
the command in a process of its own; a thread samples the process' resident memory (VmRSS) every 0.2 s and
the output's line count alongside, so that the log shows memory against progress. Reported per length:
seconds, lines a second, peak and final resident memory, the memory when 10% and 50% of the lines were
written, and that the output has one line per input line.

    python benchmarks/bench_stream.py --model runs/demo/ct2-int8 --lines 100000 1000000 --num-beams 1
    python benchmarks/bench_stream.py --quick      # a smoke test: 2000 and 8000 lines of a tiny export
    python benchmarks/bench_stream.py --quick --lines 10000 1000000   # the tiny export on long files
"""

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _common import machine_line, write_result
from _memory import _memory

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = REPO_ROOT.parent / "shared" / "data" / "multi30k" / "test_2016_flickr.en"


def repeated_file(source: Path, lines: int, folder: Path) -> Path:
    """A file of `lines` lines: the non-empty lines of `source`, repeated in order."""
    text = [line for line in source.read_text(encoding="utf-8").split("\n") if line.strip()]
    path = folder / f"input-{lines}.txt"
    with path.open("w", encoding="utf-8") as out:
        for index in range(lines):
            out.write(text[index % len(text)] + "\n")
    return path


def count_lines(path: Path) -> int:
    with path.open("rb") as stream:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: stream.read(1 << 20), b""))


def measure(command: list[str], output: Path, lines: int, interval: float = 0.2) -> dict:
    """Run `command`, sampling its resident memory and `output`'s line count until it ends."""
    samples: list[tuple[float, int, int]] = []
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:
                rss, _ = _memory(process.pid)
            except (FileNotFoundError, ProcessLookupError, KeyError):
                break
            written = count_lines(output) if output.exists() else 0
            samples.append((time.perf_counter() - start, rss, written))
            stop.wait(interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, stderr = process.communicate()
    seconds = time.perf_counter() - start
    stop.set()
    sampler.join()
    if process.returncode != 0:
        raise SystemExit(f"translate failed ({process.returncode}): {stderr.decode()[-2000:]}")

    def rss_when(fraction: float) -> float | None:
        reached = [rss for _, rss, written in samples if written >= fraction * lines]
        return round(reached[0] / 2**20, 1) if reached else None

    written = count_lines(output)
    return {
        "lines": lines,
        "seconds": round(seconds, 1),
        "lines_per_second": round(lines / seconds, 1),
        "peak_rss_mib": round(max(rss for _, rss, _ in samples) / 2**20, 1),
        "rss_mib_at_10_percent": rss_when(0.1),
        "rss_mib_at_50_percent": rss_when(0.5),
        "rss_mib_last_sample": round(samples[-1][1] / 2**20, 1),
        "output_lines": written,
        "one_output_line_per_input_line": written == lines,
    }


def quick_export(folder: Path) -> Path:
    """A tiny random model exported for CTranslate2 (the smoke test's model)."""
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    from conftest import tiny_model

    from hf_vanilla_transformer.common.tokenization import train_shared_bpe_tokenizer
    from hf_vanilla_transformer.inference.engines.exporting import export

    text = DEFAULT_SOURCE.read_text(encoding="utf-8").split("\n") if DEFAULT_SOURCE.exists() else []
    tokenizer = train_shared_bpe_tokenizer(
        text or ["a dog runs in the park"] * 10, vocab_size=300, min_frequency=1, show_progress=False
    )
    model = tiny_model(vocab_size=len(tokenizer))
    model.generation_config.max_new_tokens = 8
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    return export(folder / "model", "ctranslate2", folder / "ct2")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", help="model folder or export the command translates with")
    parser.add_argument(
        "--lines", type=int, nargs="+", help="file lengths (default: 100000 1000000; 2000 8000 with --quick)"
    )
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="the lines repeated")
    parser.add_argument("--num-beams", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--compute-type", default=None)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="a tiny export and short files: a smoke test")
    parser.add_argument("--output", default="benchmarks/results/results_stream.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        model = str(quick_export(folder)) if args.quick else args.model
        if model is None:
            parser.error("give --model (a model folder or export), or --quick")
        lengths = args.lines or ([2000, 8000] if args.quick else [100_000, 1_000_000])
        runs = []
        for lines in lengths:
            source = repeated_file(args.source, lines, folder)
            output = folder / f"output-{lines}.txt"
            command = [sys.executable, "-m", "hf_vanilla_transformer", "translate", "--model", model]
            command += ["--input", str(source), "--output", str(output), "--num-beams", str(args.num_beams)]
            command += ["--batch-size", str(args.batch_size), "--device", args.device]
            if args.compute_type:
                command += ["--compute-type", args.compute_type]
            if args.threads:
                command += ["--threads", str(args.threads)]
            run = measure(command, output, lines)
            print(json.dumps(run))
            runs.append(run)
            source.unlink()
            output.unlink()
    result = {
        "machine": machine_line(),
        "command": " ".join(["python", "benchmarks/bench_stream.py", *(argv or sys.argv[1:])]),
        "model": "tiny random export" if args.quick else args.model,
        "num_beams": args.num_beams,
        "device": args.device,
        "runs": runs,
        "peak_rss_growth_mib": round(runs[-1]["peak_rss_mib"] - runs[0]["peak_rss_mib"], 1),
    }
    write_result(result, args.output)


if __name__ == "__main__":
    main()
