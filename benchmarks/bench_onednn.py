"""Where oneDNN's float32 products pay on this CPU: `cpu_speedups.CPULinear` against torch's default GEMM.

`CPULinear` sends a float32 product through oneDNN in training from `_ONEDNN_MIN_TRAINING_ROWS` rows, and
without gradients for weights of at least `_ONEDNN_MIN_INFERENCE_WEIGHT` elements; smaller products go
through torch's default GEMM (MKL). This benchmark measures the ground for those two sizes:

- layer by layer: one product, forward and backward (training) or forward only (inference), through
  oneDNN and through the default GEMM, for the projections of the demo, cpu and base models;
- whole models with random weights: training steps (forward with labels, backward, Adam) over batches of
  `--demo-tokens` and `--cpu-tokens` tokens, and `generate()` with beam 4, with the sizes as shipped
  ("gated"), with oneDNN for every product, and with the default GEMM for every product.

Each round runs the variants back to back; a speed-up is the median over rounds of t(default GEMM) /
t(variant), > 1 when the variant is faster. The three variants' generated tokens must be identical.

    python benchmarks/bench_onednn.py                 # about 10 minutes on 2 cores
    python benchmarks/bench_onednn.py --quick         # tiny dims, seconds: what the tests run
"""

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    SIZES,
    Size,
    benchmark_parser,
    format_table,
    machine_line,
    paired_ratios,
    size_dict,
    timed,
    write_result,
)

from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.common import cpu_speedups
from hf_vanilla_transformer.training.schedule import build_paper_optimizer  # noqa: E402

SHIPPED = {
    "_ONEDNN_MIN_TRAINING_ROWS": cpu_speedups._ONEDNN_MIN_TRAINING_ROWS,
    "_ONEDNN_MIN_INFERENCE_WEIGHT": cpu_speedups._ONEDNN_MIN_INFERENCE_WEIGHT,
}
VARIANTS = ("default-gemm", "gated", "onednn-everywhere")


@contextmanager
def variant(name: str) -> Iterator[None]:
    """`CPULinear` as shipped ("gated"), with oneDNN for every float32 product, or for none; the other
    speed-ups stay on in all three."""
    minima = {
        "default-gemm": {key: sys.maxsize for key in SHIPPED},
        "gated": SHIPPED,
        "onednn-everywhere": {key: 0 for key in SHIPPED},
    }[name]
    saved = {key: getattr(cpu_speedups, key) for key in SHIPPED}
    for key, value in minima.items():
        setattr(cpu_speedups, key, value)
    try:
        yield
    finally:
        for key, value in saved.items():
            setattr(cpu_speedups, key, value)


def _repeated(fn: Callable[[], object], times: int) -> None:
    for _ in range(times):
        fn()


def median_ratio(fns: dict[str, Callable[[], object]], repeats: int, inner: int) -> dict[str, float]:
    """Speed-ups over the first entry: rounds of `inner` calls of each, back to back."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(timed(partial(_repeated, fn, inner)))
    reference = next(iter(fns))
    return {name: round(ratio, 3) for name, ratio in paired_ratios(times, reference).items()}


def _training_product(product: Callable, x: torch.Tensor, layer: nn.Linear) -> None:
    product(x, layer.weight, layer.bias).sum().backward()


def _inference_product(product: Callable, x: torch.Tensor, layer: nn.Linear) -> None:
    with torch.no_grad():
        product(x, layer.weight, layer.bias)


def layer_rows(shapes: list[tuple[int, int]], rows: list[int], repeats: int, inner: int) -> list[dict]:
    """One product per shape and row count, oneDNN against the default GEMM, in training and inference."""
    onednn = {"training": cpu_speedups._OneDNNLinearFunction.apply, "inference": cpu_speedups._onednn_linear}
    workloads = {"training": _training_product, "inference": _inference_product}
    results = []
    for in_features, out_features in shapes:
        layer = nn.Linear(in_features, out_features)
        for count in rows:
            x = torch.randn(count, in_features, requires_grad=True)
            row = {"shape": f"{in_features}x{out_features}", "weight_elements": in_features * out_features}
            row["rows"] = count
            for name, workload in workloads.items():
                ratios = median_ratio(
                    {
                        "default": partial(workload, nn.functional.linear, x, layer),
                        "onednn": partial(workload, onednn[name], x, layer),
                    },
                    repeats,
                    inner,
                )
                row[f"{name}_onednn_speedup"] = ratios["onednn"]
            results.append(row)
            print(
                f"  {in_features:>5} -> {out_features:<5} rows {count:>5}: oneDNN "
                f"x{row['training_onednn_speedup']:.2f} training, x{row['inference_onednn_speedup']:.2f} "
                "inference",
                flush=True,
            )
    return results


def model_of(size: Size) -> VanillaTransformerForConditionalGeneration:
    torch.manual_seed(0)
    config = VanillaTransformerConfig.from_preset(
        "base", vocab_size=size.vocab, d_model=size.d_model, N=size.layers, h=size.heads, d_ff=size.ffn
    )
    # The linear layers as the package's tools run them on a CPU (`cpu_speedups.CPULinear`).
    return cpu_speedups.with_cpu_linear_layers(VanillaTransformerForConditionalGeneration(config))


def training_steps(size: Size, tokens: int, src_len: int, repeats: int, inner: int) -> dict[str, float]:
    """Training steps over batches of about `tokens` source and target tokens, lengths varying by step."""
    model = model_of(size).train()
    optimizer = build_paper_optimizer(model, lr=1e-4)
    generator = torch.Generator().manual_seed(1)
    sentences = max(1, tokens // src_len)
    step_count = [0]

    def step() -> None:
        length = max(2, src_len + step_count[0] % 5 - 2)
        step_count[0] += 1
        src = torch.randint(2, size.vocab, (sentences, length), generator=generator)
        labels = torch.randint(2, size.vocab, (sentences, length + 1), generator=generator)
        model(input_ids=src, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def run(name: str) -> Callable[[], None]:
        def steps() -> None:
            with variant(name):
                step()

        return steps

    return median_ratio({name: run(name) for name in VARIANTS}, repeats, inner)


def generation(size: Size, batch: int, src_len: int, new_tokens: int, repeats: int) -> dict:
    """generate() with beam 4 and `new_tokens` forced tokens; the variants' tokens must be identical."""
    model = model_of(size).eval()
    src = torch.randint(2, size.vocab, (batch, src_len), generator=torch.Generator().manual_seed(2))
    outputs: dict[str, torch.Tensor] = {}

    def run(name: str) -> Callable[[], None]:
        def decode() -> None:
            with variant(name), torch.inference_mode(), cpu_speedups.weights_fixed_for_decoding():
                outputs[name] = model.generate(
                    input_ids=src, num_beams=4, max_new_tokens=new_tokens, min_new_tokens=new_tokens
                )

        return decode

    ratios = median_ratio({name: run(name) for name in VARIANTS}, repeats, 1)
    identical = all(torch.equal(outputs[name], outputs["default-gemm"]) for name in VARIANTS)
    if not identical:
        raise SystemExit("generate() gave other tokens with oneDNN than without: the speed-up is not exact.")
    return {"speedups": ratios, "outputs_identical": identical}


def main() -> None:
    parser = benchmark_parser(__doc__, batch=64)
    parser.set_defaults(sizes=["demo", "small"])
    parser.add_argument("--demo-tokens", type=int, default=1024, help="tokens per training batch, demo size")
    parser.add_argument("--cpu-tokens", type=int, default=4096, help="tokens per training batch, cpu size")
    parser.add_argument("--output", default="benchmarks/results/results_onednn.json")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if not cpu_speedups._X86_ONEDNN:
        raise SystemExit("oneDNN's float32 path is taken on x86 CPUs only: nothing to measure on this one.")
    if args.quick:
        args.sizes, args.repeats, args.batch = ["tiny"], 1, 4
        args.demo_tokens = args.cpu_tokens = 64
    inner = 1 if args.quick else 3
    result: dict = {"machine": machine_line(), "args": vars(args), "shipped_minima": SHIPPED, "sizes": {}}

    print("one product, oneDNN against the default GEMM (speed-up of oneDNN):")
    shapes: list[tuple[int, int]] = []
    for size in (SIZES[name] for name in args.sizes):
        for shape in ((size.d_model, size.d_model), (size.d_model, size.ffn), (size.ffn, size.d_model)):
            shapes += [shape] if shape not in shapes else []
        shapes.append((size.d_model, size.vocab))
    layer_row_counts = [64] if args.quick else [128, 1024, 2048, 3072, 4096]
    result["layers"] = layer_rows(shapes, layer_row_counts, args.repeats, inner)

    rows = []
    for name in args.sizes:
        size = SIZES[name]
        tokens = args.demo_tokens if name == "demo" else args.cpu_tokens
        steps = training_steps(size, tokens, 16, args.repeats, inner)
        decoding = generation(size, args.batch, 16, 4 if args.quick else 24, args.repeats)
        result["sizes"][name] = {
            "size": size_dict(size),
            "training_tokens": tokens,
            "training": steps,
            "generate_beam4": decoding,
        }
        for workload, ratios in (
            (f"training step, {tokens} tokens", steps),
            (f"generate() beam 4, batch {args.batch}", decoding["speedups"]),
        ):
            rows.append([name, workload, *(f"{ratios[v]:.2f}x" for v in VARIANTS)])
    print(format_table(["size", "workload", *VARIANTS], rows))
    write_result(result, args.output)


if __name__ == "__main__":
    main()
