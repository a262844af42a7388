"""BLEU and speed of a trained model on every export engine, with and without a vocabulary shortlist.

    python benchmarks/bench_engines_bleu.py runs/multi30k/model data/multi30k/test_2016_flickr
    python benchmarks/bench_engines_bleu.py MODEL TEST_PREFIX --shortlist-from data/multi30k/train \\
        --shortlist-sizes 50 100 --repeats 3

The model translates TEST_PREFIX.<src-lang> with its own decoding settings (for this package's models the
paper's: beam 4, GNMT length penalty 0.6, input + 50) on each engine: PyTorch float32, CTranslate2 float32
and int8, ONNX Runtime, and CTranslate2 float32 and int8 with a shortlist built from the training data
(`shortlist.build_shortlist`, `--shortlist-size` target tokens per source token, 100 always allowed) for each
of `--shortlist-sizes`. sacreBLEU against TEST_PREFIX.<tgt-lang>, and the share of translations identical
to PyTorch's, come from the first, untimed pass. Then each of `--repeats` rounds translates the test set
once per engine, in alternating order, so that other load on the machine hits every engine alike; a
speed-up is the median over rounds of the per-round ratio of times. Every engine gets `--threads` threads.
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import CTRANSLATE2_WEIGHTS, format_table, machine_line, paired_ratios, write_result  # noqa: E402

from hf_vanilla_transformer.common.text_lines import read_lines
from hf_vanilla_transformer.evaluation.metrics import corpus_bleu  # noqa: E402
from hf_vanilla_transformer.inference.engines.ctranslate2_export import export_ctranslate2
from hf_vanilla_transformer.inference.engines.export_common import load_for_export
from hf_vanilla_transformer.inference.engines.onnx_graphs import export_onnx
from hf_vanilla_transformer.inference.engines.shortlist import build_shortlist
from hf_vanilla_transformer.inference.translator import Translator, load_translator


def build_engines(args: argparse.Namespace, workdir: Path) -> tuple[dict[str, Translator], dict]:
    """The translators to compare, by name, and for each shortlist size the mean number of target tokens
    it allows per test sentence."""
    source = load_for_export(args.model)
    threads = args.threads
    engines = {
        "torch-float32": load_translator(args.model),
        "onnx-float32": load_translator(export_onnx(source, workdir / "onnx"), threads=threads),
    }
    shortlisted = {}
    tests = [source.tokenizer.tokenize(text) for text in read_lines(f"{args.test}.{args.src_lang}")]
    shortlist_sizes = {}
    for size in args.shortlist_sizes:
        shortlist = build_shortlist(
            read_lines(f"{args.shortlist_from}.{args.src_lang}"),
            read_lines(f"{args.shortlist_from}.{args.tgt_lang}"),
            source.tokenizer,
            source.target_tokenizer,
            size=size,
        )
        shortlist_sizes[size] = statistics.mean(len(shortlist.allowed(tokens)) for tokens in tests)
        for quantization in CTRANSLATE2_WEIGHTS:
            folder = export_ctranslate2(
                source, workdir / f"ct2-{quantization}-{size}", quantization=quantization, shortlist=shortlist
            )
            # Every export of one weight type holds the same model: the first, without its shortlist, is
            # the reference of the shortlists' speed-ups.
            if f"ct2-{quantization}" not in engines:
                engines[f"ct2-{quantization}"] = load_translator(folder, threads=threads, use_vmap=False)
            shortlisted[f"ct2-{quantization}-shortlist{size}"] = load_translator(folder, threads=threads)
    return {**engines, **shortlisted}, shortlist_sizes


def timed_translation(translator: Translator, sentences: list[str]) -> tuple[float, list[str]]:
    start = time.perf_counter()
    outputs = translator.translate(sentences, progress=False)
    return time.perf_counter() - start, outputs


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model", help="a trained model folder (save_pretrained, with its tokenizer)")
    parser.add_argument("test", help="test data prefix: PREFIX.<src-lang> and PREFIX.<tgt-lang>")
    parser.add_argument("--shortlist-from", default="data/multi30k/train", help="training data prefix")
    parser.add_argument("--shortlist-sizes", type=int, nargs="+", default=[100])
    parser.add_argument("--src-lang", default="en")
    parser.add_argument("--tgt-lang", default="de")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="threads of every engine (torch included)")
    parser.add_argument("--output", default="benchmarks/results/results_engines_bleu.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    sentences = list(read_lines(f"{args.test}.{args.src_lang}"))
    references = list(read_lines(f"{args.test}.{args.tgt_lang}"))

    with tempfile.TemporaryDirectory() as tmp:
        engines, shortlist_sizes = build_engines(args, Path(tmp))
        first = {name: timed_translation(engine, sentences) for name, engine in engines.items()}
        times: dict[str, list[float]] = {name: [] for name in engines}
        for round_ in range(args.repeats):
            order = list(engines) if round_ % 2 == 0 else list(engines)[::-1]
            for name in order:
                times[name].append(timed_translation(engines[name], sentences)[0])
            print(f"  round {round_ + 1}/{args.repeats} done", file=sys.stderr)

    reference = first["torch-float32"][1]
    vs_torch = paired_ratios(times, "torch-float32")
    rows = {}
    for name, (_, outputs) in first.items():
        bleu = corpus_bleu(outputs, references)
        rows[name] = {
            "bleu": bleu.score,
            "signature": bleu.signature,
            "identical_to_torch": sum(a == b for a, b in zip(outputs, reference)) / len(reference),
            "seconds": times[name],
            "sentences_per_s": len(sentences) / statistics.median(times[name]),
            "speedup_vs_torch": vs_torch[name],
            # The same export and weight type decoding over the full vocabulary.
            "speedup_vs_no_shortlist": paired_ratios(times, name.split("-shortlist")[0])[name],
        }
    result = {
        "machine": machine_line(),
        "args": vars(args),
        "sentences": len(sentences),
        "shortlist_mean_allowed_tokens": shortlist_sizes,
        "engines": rows,
    }
    header = ["engine", "BLEU", "identical to torch", "sentences/s", "x torch", "x no shortlist"]
    table = [
        [
            name,
            f"{row['bleu']:.2f}",
            f"{100 * row['identical_to_torch']:.1f}%",
            f"{row['sentences_per_s']:.1f}",
            f"{row['speedup_vs_torch']:.2f}",
            f"{row['speedup_vs_no_shortlist']:.2f}",
        ]
        for name, row in rows.items()
    ]
    print(format_table(header, table))
    print(f"target tokens allowed per test sentence, by shortlist size: {shortlist_sizes}")
    write_result(result, args.output)
    return result


if __name__ == "__main__":
    main()
