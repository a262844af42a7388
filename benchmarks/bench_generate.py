"""Decoding throughput: our model against transformers' MarianMTModel (and CTranslate2) on the same weights.

    python benchmarks/bench_generate.py                     # base and small, beam 4 and greedy (~10 min)
    python benchmarks/bench_generate.py --sizes base --searches beam4 --repeats 5
    python benchmarks/bench_generate.py --quick             # tiny dims, seconds: what the tests run
    python benchmarks/bench_generate.py --device cuda       # base, batch 64, float32 and bf16 (~1 min)
    python benchmarks/bench_generate.py --device cuda --cache static --searches greedy --dtypes bf16

Ours is converted from a random MarianMTModel (`convert_marian`), so both hold the same weights; before
any timing, both decode the benchmark batch in fp32 and their outputs must be identical token for token
(the run stops otherwise). Every output is forced to `--new-tokens` tokens, so that all engines do the same
work. `--force eos-bias` (the default) gives the end token a logit bias of -1e4 in the shared weights, so no
hypothesis ends and decoding runs to `max_new_tokens`, as in a translation without length constraints;
`--force min-tokens` passes `min_new_tokens` instead, which adds transformers' two minimum-length logits
processors (each copies the [beams x vocabulary] scores twice per step) to the work of both HF models.
Ours decodes as the package's tools decode it (`cpu_speedups.cpu_decoding`: the CPU speed-ups of
`common.cpu_speedups` in place on a CPU); `ours-no-speedups` is ours with `cpu_speedups.ENABLED = False`,
the model as `generate()` runs it.
Each round runs every engine once in alternating order; a speed-up is the median over rounds of
t(Marian) / t(engine). Throughput counts generated tokens of the returned sequences.

Exported engines, where installed (`pip install -e .[export]`): ours exported by this package's exporters
(`ctranslate2_export.export_ctranslate2` in float32 and int8, translated through
`engines.CTranslate2Seq2SeqLM`; `onnx_graphs.export_onnx`, through `engines.OnnxSeq2SeqLM`), and the Marian
model converted by CTranslate2's own Marian converter (`ct2-marian-*`). CTranslate2 and ONNX Runtime get as
many threads as torch. A missing engine skips its columns with the reason in `notes`. Their outputs are
compared with Marian's but not required to match (other kernels; int8 weights). `--int8` adds ours with
torch's dynamic int8 quantization of the linear layers, with its agreement with the fp32 outputs as token
accuracy and BLEU.

`--dtypes float32 bf16` decodes with the models' weights in each dtype (float32 first; the exported
engines and int8 in float32 only); a bf16 search is named `beam4-bf16`, and its outputs are compared with
Marian's but not required to match. `--cache static` passes `cache_implementation="static"` to `generate`
for Marian and ours (on a GPU transformers then compiles their decoding steps, in the untimed first run).

On a GPU (`--device cuda`; without one the script exits with status 2), the defaults become the base
size, batch 64 and both dtypes, and only Marian and ours run (CTranslate2, ONNX Runtime and int8 are the
CPU's engines; the CPU speed-ups change nothing on a GPU). Every run is timed between CUDA events with the
GPU synchronized before and after. There a failed check (outputs that differ in float32, outputs shorter
than `--new-tokens`) is kept in `notes` instead of stopping the run, and an engine that fails (out of
memory, a failed compilation) is kept with its error while the others go on.
"""

import argparse
import copy
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402

from hf_vanilla_transformer.common import cpu_speedups
from hf_vanilla_transformer.inference.engines.ctranslate2 import CTranslate2Seq2SeqLM
from hf_vanilla_transformer.inference.engines.ctranslate2_export import export_ctranslate2
from hf_vanilla_transformer.inference.engines.export_common import ExportError, ExportSource
from hf_vanilla_transformer.inference.engines.onnx import OnnxSeq2SeqLM
from hf_vanilla_transformer.inference.engines.onnx_graphs import export_onnx
from hf_vanilla_transformer.inference.translation import (  # noqa: E402
    decoding_cache,
    quantize_int8,
)

SEARCHES = {"beam4": 4, "greedy": 1}
DTYPES = {"float32": torch.float32, "bf16": torch.bfloat16}
# What --device cuda changes, for the options not given (see the module docstring).
CUDA_DEFAULTS = {"sizes": ["base"], "batch": 64, "dtypes": list(DTYPES)}


def source_batch(size: common.Size, batch: int, length: int, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(common.FIRST_ORDINARY, size.vocab - 1, (batch, length), generator=generator)
    ids[:, -1] = common.EOS
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def hf_generate(
    model: torch.nn.Module,
    inputs: dict,
    beams: int,
    new_tokens: int,
    min_tokens: bool = False,
    cache_implementation: str | None = None,
    **kwargs: object,
) -> torch.Tensor:
    return model.generate(
        **inputs,
        **kwargs,
        num_beams=beams,
        do_sample=False,
        max_new_tokens=new_tokens,
        **({"min_new_tokens": new_tokens} if min_tokens else {}),
        **({"early_stopping": True, "length_penalty": 1.0} if beams > 1 else {}),
        **({"cache_implementation": cache_implementation} if cache_implementation else {}),
    )


def tools_generate(
    model: torch.nn.Module,
    inputs: dict,
    beams: int,
    new_tokens: int,
    min_tokens: bool = False,
    cache: str | None = None,
) -> torch.Tensor:
    """`hf_generate` as this package's tools (`translate`, `serve`, `Translator`) decode on a CPU: with the
    CPU speed-ups in place (`cpu_speedups.cpu_decoding`, `translation.decoding_cache`)."""
    chosen = {"cache_implementation": cache} if cache else {}
    with cpu_speedups.cpu_decoding(model):
        extra = decoding_cache(model, beams, chosen)
        return hf_generate(model, inputs, beams, new_tokens, min_tokens, cache, **extra)


def without_cpu_speedups(decode: Callable[[], torch.Tensor]) -> torch.Tensor:
    """`decode()` with `cpu_speedups.ENABLED` off: the same model as plain torch and transformers code."""
    with common.cpu_speedups_switched(False):
        return decode()


def suppress_end_token(*models: torch.nn.Module) -> None:
    """Forces full-length outputs through the weights: the end token's logit bias becomes -1e4."""
    with torch.no_grad():
        for model in models:
            model.final_logits_bias[0, common.EOS] = -1e4


class CTranslate2Engine:
    """The Marian model converted by CTranslate2's own Marian loader, with token names as vocabulary."""

    def __init__(self, marian: torch.nn.Module, compute_type: str, workdir: Path) -> None:
        import ctranslate2
        from ctranslate2.converters import Converter
        from ctranslate2.converters.transformers import MarianMTLoader

        names = common.token_names(marian.config.vocab_size)

        class Vocabulary:  # what the loader reads from a tokenizer
            eos_token, unk_token = "</s>", "<unk>"

            @staticmethod
            def get_vocab() -> dict[str, int]:
                return {name: i for i, name in enumerate(names)}

        # A copy: quantizing the spec rewrites the weight tensors it was given in place.
        spec = MarianMTLoader()(copy.deepcopy(marian).float().eval(), Vocabulary)

        class FromSpec(Converter):
            def _load(self):  # noqa: ANN202
                return spec

        path = workdir / f"marian-{compute_type}"
        quantization = None if compute_type == "float32" else compute_type
        FromSpec().convert(str(path), quantization=quantization, force=True)
        self.names = names
        self.index = {name: i for i, name in enumerate(names)}
        self.translator = ctranslate2.Translator(
            str(path), device="cpu", compute_type=compute_type, intra_threads=torch.get_num_threads()
        )

    def generate(self, inputs: dict, beams: int, new_tokens: int, min_tokens: bool) -> list[list[int]]:
        tokens = [[self.names[i] for i in row] for row in inputs["input_ids"].tolist()]
        results = self.translator.translate_batch(
            tokens,
            beam_size=beams,
            min_decoding_length=new_tokens if min_tokens else 0,
            max_decoding_length=new_tokens,
            length_penalty=1.0,
            max_batch_size=0,
        )
        return [[self.index[t] for t in r.hypotheses[0]] for r in results]


def sequences_of(output: torch.Tensor | list[list[int]]) -> list[list[int]]:
    """Generated ids without the decoder start token (HF includes it, CTranslate2 does not)."""
    if isinstance(output, torch.Tensor):
        return output[:, 1:].tolist()
    return output


def agreement(a: list[list[int]], b: list[list[int]]) -> dict[str, float]:
    """Share of identical sentences and of identical tokens, and BLEU of `b` against `a` as reference."""
    same_sentences = sum(x == y for x, y in zip(a, b)) / len(a)
    pairs = [(s, t) for x, y in zip(a, b) for s, t in zip(x, y)]
    same_tokens = sum(s == t for s, t in pairs) / max(1, len(pairs))
    result = {"identical_sentences": same_sentences, "identical_tokens": same_tokens}
    try:
        import sacrebleu

        hyps = [" ".join(map(str, y)) for y in b]
        refs = [[" ".join(map(str, x)) for x in a]]
        result["bleu_vs_reference"] = sacrebleu.corpus_bleu(hyps, refs, tokenize="none").score
    except ImportError:
        pass
    return result


@dataclass
class EngineSetup:
    """What the engines of one model size are made from: ours (float32), the source batch they decode,
    the run's options, the folder for exports, and the run's `notes`, where an engine left out says why."""

    ours: torch.nn.Module
    size: common.Size
    inputs: dict
    args: argparse.Namespace
    workdir: Path
    notes: list[str]

    def skip(self, reason: str) -> None:
        """Note (and print) why an engine is left out."""
        self.notes.append(reason)
        print(reason, file=sys.stderr)

    def decoding(self, model: object) -> Callable[[int], object]:
        """The timed call of `model`: `generate()` on the batch with a given beam size."""
        min_tokens = self.args.force == "min-tokens"
        return lambda beams: hf_generate(model, self.inputs, beams, self.args.new_tokens, min_tokens)

    def export_source(self) -> ExportSource:
        return ExportSource(self.ours, common.names_tokenizer(self.size.vocab), name="ours, random weights")


def exported_engines(setup: EngineSetup) -> dict[str, torch.nn.Module | CTranslate2Seq2SeqLM]:
    """Ours exported to CTranslate2 (float32, int8) and ONNX, loaded with torch's thread count; an export
    that cannot be made (engine not installed) is left out, with the reason added to `notes`."""
    source = setup.export_source()
    threads = torch.get_num_threads()
    loaders = {}
    if not setup.args.no_ctranslate2:
        for quantization in ("float32", "int8"):
            loaders[f"ours-ct2-{quantization}"] = lambda out, q=quantization: CTranslate2Seq2SeqLM(
                export_ctranslate2(source, out, quantization=q), threads=threads
            )
    if not setup.args.no_onnx:
        loaders["ours-onnx"] = lambda out: OnnxSeq2SeqLM(export_onnx(source, out), threads=threads)
    engines = {}
    for engine, load in loaders.items():
        try:
            engines[engine] = load(setup.workdir / engine)
        except ExportError as error:
            setup.skip(f"{engine} skipped: {error}")
    return engines


def gpu_ctranslate2_engines(setup: EngineSetup) -> dict[str, Callable[[int], object]]:
    """Ours exported to CTranslate2 from the float32 weights and decoded on the GPU in float16 and
    int8_float16, as `translate --engine ctranslate2 --device cuda --compute-type ...` decodes; an engine
    CTranslate2 cannot load here is left out, with the reason added to `notes`."""
    if setup.args.no_ctranslate2:
        return {}
    engines: dict[str, Callable[[int], object]] = {}
    try:
        folder = export_ctranslate2(setup.export_source(), setup.workdir / "ours-ct2", quantization="float32")
        for compute_type in ("float16", "int8_float16"):
            model = CTranslate2Seq2SeqLM(folder, device="cuda", compute_type=compute_type)
            engines[f"ours-ct2-{compute_type}"] = setup.decoding(model)
    except (ExportError, ValueError, RuntimeError) as error:
        setup.skip(f"CTranslate2 on the GPU skipped: {error}")
    return engines


def check(passed: bool, message: str, device: str, notes: list[str]) -> None:
    """On a CPU a failed check ends the run, as it always did; on a GPU, whose minutes are scarce, the
    message is kept in `notes` and the run goes on."""
    if passed:
        return
    if device == "cpu":
        raise SystemExit(message)
    notes.append(message)
    print(message, file=sys.stderr)


def cpu_engines(marian: torch.nn.Module, setup: EngineSetup) -> dict[str, Callable[[int], object]]:
    """The engines that decode on the CPU only, from the float32 weights: ours with int8 linear layers
    (`--int8`), the Marian model in CTranslate2, and ours exported to CTranslate2 and ONNX."""
    args, inputs = setup.args, setup.inputs
    min_tokens = args.force == "min-tokens"
    engines: dict[str, Callable[[int], object]] = {}
    if args.int8:
        engines["ours-int8"] = setup.decoding(quantize_int8(setup.ours))
    if not args.no_ctranslate2:
        try:
            for compute_type in ("float32", "int8"):
                engine = CTranslate2Engine(marian, compute_type, setup.workdir)
                engines[f"ct2-marian-{compute_type}"] = (
                    lambda beams, e=engine: e.generate(inputs, beams, args.new_tokens, min_tokens)  # noqa: B008
                )
        except ImportError:
            setup.skip("CTranslate2 is not installed: its columns are skipped (pip install ctranslate2).")
    for engine, model in exported_engines(setup).items():
        engines[engine] = setup.decoding(model)
    return engines


def bench_search(
    label: str,
    beams: int,
    engines: dict[str, Callable[[int], object]],
    float32: bool,
    args: argparse.Namespace,
) -> dict:
    """One search with every engine: a first, untimed run of each (the warm-up, and the outputs that are
    compared with Marian's), then `--repeats` timed rounds in alternating order."""
    notes: list[str] = []
    errors: dict[str, str] = {}
    outputs = {}
    for engine, fn in engines.items():
        output = common.attempt(args.device, engine, partial(fn, beams), errors)
        if output is not None:
            outputs[engine] = sequences_of(output)
    if "marian" not in outputs:
        return {"engines": {engine: {"error": error} for engine, error in errors.items()}, "notes": notes}
    reference = outputs["marian"]
    full_length = all(len(sequence) == args.new_tokens for sequence in reference)
    check(
        full_length,
        f"[{label}] Marian's outputs are not all {args.new_tokens} tokens long.",
        args.device,
        notes,
    )
    identical = all(
        outputs.get(engine) == reference for engine in engines if engine in ("ours", "ours-no-speedups")
    )
    if float32:
        check(identical, f"[{label}] ours and Marian decode differently in fp32.", args.device, notes)
    checks = {engine: agreement(reference, out) for engine, out in outputs.items() if engine != "marian"}
    if "ours-int8" in outputs and "ours" in outputs:
        checks["ours-int8"] = agreement(outputs["ours"], outputs["ours-int8"])

    times: dict[str, list[float]] = {engine: [] for engine in outputs}
    for round_ in range(args.repeats):
        order = list(times) if round_ % 2 == 0 else list(times)[::-1]
        for engine in (e for e in order if e not in errors):
            t = common.attempt(
                args.device,
                engine,
                partial(common.timed, partial(engines[engine], beams), args.device),
                errors,
            )
            if t is not None:
                times[engine].append(t)
        print(f"  [{label}] round {round_ + 1}/{args.repeats} done", file=sys.stderr)
    tokens = args.batch * args.new_tokens
    rows: dict[str, dict] = {engine: {"error": error} for engine, error in errors.items()}
    for engine, t in times.items():
        if engine in errors:
            continue
        rows[engine] = {
            "seconds": t,
            "tokens_per_s": tokens / statistics.median(t),
            **checks.get(engine, {}),
        }
        if "marian" not in errors:
            rows[engine]["speedup_vs_marian"] = statistics.median(m / e for m, e in zip(times["marian"], t))
    result = {"outputs_identical": identical, "full_length": full_length, "engines": rows, "notes": notes}
    return {"outputs_identical_fp32": identical, **result} if float32 else result


def bench_size(name: str, size: common.Size, args: argparse.Namespace, workdir: Path) -> dict:
    marian, ours = common.model_pair(size, seed=0, dropout=0.1, attn=args.attn)
    marian.eval()
    ours.eval()
    min_tokens = args.force == "min-tokens"
    if not min_tokens:
        suppress_end_token(marian, ours)
    inputs = {
        key: value.to(args.device) for key, value in source_batch(size, args.batch, args.src_len).items()
    }
    notes = []
    setup = EngineSetup(ours, size, inputs, args, workdir / name, notes)
    if args.device == "cpu":
        extra = cpu_engines(marian, setup)
    else:
        extra = gpu_ctranslate2_engines(setup)
        notes.append("ONNX Runtime and torch's int8 decode on the CPU: not run on the GPU.")
    searches = {}
    # float32 first: the models are cast in place, and bf16 weights would not give the float32 ones back.
    for dtype in sorted(args.dtypes, key=lambda d: d != "float32"):
        marian.to(device=args.device, dtype=DTYPES[dtype])
        ours.to(device=args.device, dtype=DTYPES[dtype])
        engines: dict[str, Callable[[int], object]] = {
            "marian": lambda beams: hf_generate(
                marian, inputs, beams, args.new_tokens, min_tokens, args.cache
            ),
            "ours": lambda beams: tools_generate(
                ours, inputs, beams, args.new_tokens, min_tokens, args.cache
            ),
        }
        if args.device == "cpu":
            engines["ours-no-speedups"] = lambda beams: without_cpu_speedups(
                lambda: tools_generate(ours, inputs, beams, args.new_tokens, min_tokens, args.cache)
            )
        if dtype == "float32" or args.device != "cpu":  # CTranslate2 on the GPU: beside each dtype
            engines |= extra
        for search in args.searches:
            key = search if dtype == "float32" else f"{search}-{dtype}"
            searches[key] = {
                "dtype": dtype,
                **bench_search(f"{name} {key}", SEARCHES[search], engines, dtype == "float32", args),
            }
    return {
        "size": common.size_dict(size),
        "batch": args.batch,
        "src_len": args.src_len,
        "new_tokens": args.new_tokens,
        "searches": searches,
        "notes": notes,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = common.benchmark_parser(__doc__, batch=32)
    common.add_device_option(parser)
    parser.add_argument("--searches", nargs="+", default=list(SEARCHES), choices=list(SEARCHES))
    parser.add_argument("--dtypes", nargs="+", default=["float32"], choices=list(DTYPES), help="weights")
    parser.add_argument(
        "--cache",
        default=None,
        choices=["static"],
        help="static: generate(cache_implementation='static') for Marian and ours (default: dynamic)",
    )
    parser.add_argument("--src-len", type=int, default=24)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument(
        "--force",
        default="eos-bias",
        choices=["eos-bias", "min-tokens"],
        help="how outputs are forced to --new-tokens tokens (see above)",
    )
    parser.add_argument("--int8", action="store_true", help="also ours with dynamic int8 linear layers")
    parser.add_argument("--no-ctranslate2", action="store_true", help="no CTranslate2 columns")
    parser.add_argument("--no-onnx", action="store_true", help="no ONNX Runtime column")
    parser.add_argument("--output", default="benchmarks/results/results_generate.json")
    args = common.parse_device_args(parser, argv, CUDA_DEFAULTS)
    if args.quick:
        args.sizes, args.batch, args.src_len, args.new_tokens, args.repeats = ["tiny"], 4, 8, 8, 1
    if args.threads:
        torch.set_num_threads(args.threads)

    result: dict = {"machine": common.machine_line(), "args": vars(args), "sizes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.sizes:
            result["sizes"][name] = bench_size(name, common.SIZES[name], args, Path(tmp))

    header = ["size", "search", "engine", "tok/s", "x Marian", "identical sentences", "BLEU vs ref"]
    rows = []
    for name, data in result["sizes"].items():
        for search, s in data["searches"].items():
            for engine, row in s["engines"].items():
                if "error" in row:
                    rows.append([name, search, engine, f"failed: {row['error']}", "", "", ""])
                    continue
                rows.append(
                    [
                        name,
                        search,
                        engine,
                        f"{row['tokens_per_s']:.0f}",
                        f"{row['speedup_vs_marian']:.2f}" if "speedup_vs_marian" in row else "",
                        f"{100 * row['identical_sentences']:.0f}%"
                        if "identical_sentences" in row
                        else "(ref)",
                        f"{row['bleu_vs_reference']:.1f}" if "bleu_vs_reference" in row else "",
                    ]
                )
    print(common.format_table(header, rows))
    fp32 = [s for d in result["sizes"].values() for s in d["searches"].values() if s["dtype"] == "float32"]
    # A float32 search where Marian failed has no verdict: it counts as not identical.
    ok = all(s.get("outputs_identical_fp32", False) for s in fp32) if fp32 else None
    result["outputs_identical_fp32"] = ok
    print(f"ours and Marian outputs identical in fp32: {ok}")
    common.write_result(result, args.output)
    return result


if __name__ == "__main__":
    main()
