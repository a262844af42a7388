"""CTranslate2's two CPU matrix-product backends, oneDNN and Intel MKL, on our model's export.

CTranslate2 chooses its CPU backend once per process: Intel MKL on Intel CPUs, oneDNN on the others (AMD);
the environment variable CT2_USE_MKL=1 or 0 overrides the choice. This benchmark translates the same batch
with our model exported to CTranslate2 (float32 and int8, `ctranslate2_export.export_ctranslate2`, through
`engines.CTranslate2Seq2SeqLM`) under each backend, each in a fresh process, and gives each backend's speed
relative to oneDNN's: the median over rounds of t(oneDNN) / t(backend), with the backends in alternating
order from round to round. Batch, lengths and forced output lengths are `bench_generate.py`'s.

    python benchmarks/bench_ct2_backends.py --sizes base --repeats 3
    python benchmarks/bench_ct2_backends.py --quick        # tiny dims, seconds: what the tests run
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    CTRANSLATE2_WEIGHTS,
    SIZES,
    benchmark_parser,
    format_table,
    machine_line,
    model_pair,
    names_tokenizer,
    timed,
    write_result,
)
from bench_generate import SEARCHES, hf_generate, sequences_of, source_batch, suppress_end_token  # noqa: E402

from hf_vanilla_transformer.inference.engines.ctranslate2 import CTranslate2Seq2SeqLM
from hf_vanilla_transformer.inference.engines.ctranslate2_export import export_ctranslate2
from hf_vanilla_transformer.inference.engines.export_common import ExportSource

BACKENDS = {"oneDNN": "0", "MKL": "1"}  # the value of CT2_USE_MKL


def time_exports(folder: Path, searches: list[str], new_tokens: int, threads: int) -> dict:
    """In this process's backend: one warm-up and one timed translation of the batch for each export and
    search; the seconds and the outputs."""
    inputs = torch.load(folder / "batch.pt")
    result = {}
    for quantization in CTRANSLATE2_WEIGHTS:
        engine = CTranslate2Seq2SeqLM(folder / quantization, threads=threads)
        for search in searches:
            decode = lambda e=engine, b=SEARCHES[search]: hf_generate(e, inputs, b, new_tokens)  # noqa: E731
            output = decode()  # also the warm-up: decoding is deterministic, the timed run gives the same
            result[f"{quantization}/{search}"] = {"seconds": timed(decode), "outputs": sequences_of(output)}
    return result


def run_backend(script_args: list[str], backend: str) -> dict:
    """`time_exports` in a fresh interpreter with CTranslate2 set to `backend`."""
    env = dict(os.environ, CT2_USE_MKL=BACKENDS[backend], PYTHONWARNINGS="ignore")
    done = subprocess.run(
        [sys.executable, __file__, *script_args], env=env, check=True, capture_output=True, text=True
    )
    return json.loads(done.stdout.splitlines()[-1])


def bench_size(name: str, args: argparse.Namespace, workdir: Path) -> dict:
    size = SIZES[name]
    _, ours = model_pair(size, seed=0)
    ours.eval()
    suppress_end_token(ours)
    folder = workdir / name
    source = ExportSource(ours, names_tokenizer(size.vocab), name="ours, random weights")
    for quantization in CTRANSLATE2_WEIGHTS:
        export_ctranslate2(source, folder / quantization, quantization=quantization)
    torch.save(source_batch(size, args.batch, args.src_len), folder / "batch.pt")
    threads = args.threads or torch.get_num_threads()
    worker = ["--worker", str(folder), "--new-tokens", str(args.new_tokens), "--threads", str(threads)]
    worker += ["--searches", *args.searches]

    runs: dict[str, list[dict]] = {backend: [] for backend in BACKENDS}
    for round_ in range(args.repeats):
        for backend in list(BACKENDS) if round_ % 2 == 0 else list(BACKENDS)[::-1]:
            runs[backend].append(run_backend(worker, backend))
        print(f"  [{name}] round {round_ + 1}/{args.repeats} done", file=sys.stderr)

    rows = {}
    tokens = args.batch * args.new_tokens
    for key in runs["oneDNN"][0]:
        reference = [run[key] for run in runs["oneDNN"]]
        for backend, backend_runs in runs.items():
            measured = [run[key] for run in backend_runs]
            outputs = measured[0]["outputs"]
            rows[f"{key}/{backend}"] = {
                "seconds": [m["seconds"] for m in measured],
                "tokens_per_s": tokens / statistics.median(m["seconds"] for m in measured),
                "speedup_vs_onednn": statistics.median(
                    r["seconds"] / m["seconds"] for r, m in zip(reference, measured)
                ),
                "identical_to_onednn": statistics.mean(
                    a == b for a, b in zip(reference[0]["outputs"], outputs)
                ),
                "full_length": all(len(sequence) == args.new_tokens for sequence in outputs),
            }
    return {"batch": args.batch, "src_len": args.src_len, "new_tokens": args.new_tokens, "rows": rows}


def main(argv: list[str] | None = None) -> dict:
    parser = benchmark_parser(__doc__, batch=32)
    parser.add_argument("--searches", nargs="+", default=list(SEARCHES), choices=list(SEARCHES))
    parser.add_argument("--src-len", type=int, default=24)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--output", default="benchmarks/results/results_ct2_backends.json")
    # One backend's timings, in the process that `run_backend` starts for it.
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        result = time_exports(Path(args.worker), args.searches, args.new_tokens, args.threads)
        print(json.dumps(result))
        return result
    if args.quick:
        args.sizes, args.batch, args.src_len, args.new_tokens, args.repeats = ["tiny"], 4, 8, 8, 1

    machine = machine_line()
    vendor = machine["vendor"]
    result: dict = {
        "machine": machine,
        "default_backend": "MKL" if vendor == "GenuineIntel" else "oneDNN",
        "args": vars(args),
        "sizes": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.sizes:
            result["sizes"][name] = bench_size(name, args, Path(tmp))

    header = ["size", "export/search/backend", "tok/s", "x oneDNN", "identical to oneDNN"]
    rows = [
        [
            name,
            key,
            f"{row['tokens_per_s']:.0f}",
            f"{row['speedup_vs_onednn']:.2f}",
            f"{row['identical_to_onednn']:.0%}",
        ]
        for name, data in result["sizes"].items()
        for key, row in data["rows"].items()
    ]
    print(format_table(header, rows))
    print(f"CTranslate2's default backend on this CPU ({vendor}): {result['default_backend']}")
    write_result(result, args.output)
    return result


if __name__ == "__main__":
    main()
