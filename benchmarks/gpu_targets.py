"""The GPU targets table of the compiled-training work, filled from the JSON files that gpu_check.sh's steps
wrote to one folder; a figure whose step failed, timed out or did not run reads "unmeasured".

    python benchmarks/gpu_targets.py runs/gpu_check
"""

import json
import sys
from pathlib import Path

UNMEASURED = "unmeasured"


def read(folder: Path, name: str) -> dict:
    path = folder / name
    return json.loads(path.read_text()) if path.is_file() else {}


def train_row(result: dict, group: str, name: str, model: str, mode: str) -> dict:
    rows = result.get(group, {}).get(name, {}).get("rows", [])
    return next((row for row in rows if row["model"] == model and row["mode"] == mode), {})


def engine_result(result: dict, search: str, engine: str) -> dict:
    """One engine's figures for one search at base size in a bench_generate.py result."""
    searches = result.get("sizes", {}).get("base", {}).get("searches", {})
    return searches.get(search, {}).get("engines", {}).get(engine, {})


def speedup(result: dict, search: str) -> str:
    ours = engine_result(result, search, "ours").get("speedup_vs_marian")
    return f"{ours:.2f}x" if ours is not None else UNMEASURED


def ratio(numerator: float | None, denominator: float | None) -> str:
    return f"{numerator / denominator:.2f}x" if numerator and denominator else UNMEASURED


def tokens_per_s(result: dict, search: str, engine: str) -> float | None:
    return engine_result(result, search, engine).get("tokens_per_s")


def packed_speed(folder: Path, name: str = "train_packed.json") -> dict:
    """bench_packing.py --speed's figures at base size (gpu_check.sh's train_packed step, or the step whose
    result file is `name`), or nothing."""
    speed = read(folder, name).get("speed", {})
    return speed if speed.get("size") == "base" else {}


def rows(folder: Path) -> list[tuple[str, str, str, str]]:
    """(what, measured, milestone, goal) for each target."""
    compile_ = read(folder, "compile.json").get("modes", {})
    compile_whole = read(folder, "compile_whole.json").get("modes", {})
    compiled = read(folder, "train_compile.json")
    presets = read(folder, "train_presets.json")
    presets_compiled = read(folder, "train_presets_compiled.json")
    generate = read(folder, "generate.json")
    generate_static = read(folder, "generate_static.json")
    packed = packed_speed(folder)
    packed_compiled = packed.get("variants", {}).get("packed-compiled", {})
    packed_tokens = packed_compiled.get("tokens_per_s")
    packed_compile = packed_compiled.get("first_step_s")
    shape = packed.get("data", {}).get("packed_shape", {})
    rows_of = f" (rows {shape['source_length']} / {shape['target_length']} tokens)" if shape else ""
    packed_eager = packed.get("packed_over_padded_eager")
    # Paired rounds where the run compiled both; else against train_presets_compiled's step, same batches.
    packed_compiled_ratio = packed.get("packed_over_padded_compiled")
    flex = packed_speed(folder, "train_packed_flex.json")
    flex_over_padded = flex.get("packed_over_padded_eager")
    flex_shape = flex.get("data", {}).get("packed_shape", {})
    flex_rows = "rows"
    if flex_shape:
        flex_rows = f"rows {flex_shape['source_length']} / {flex_shape['target_length']}"
    graphs = packed_speed(folder, "train_packed_graphs.json").get("variants", {}).get("packed-compiled", {})

    def seconds(modes: dict, mode: str, key: str) -> str:
        value = modes.get(mode, {}).get(key)
        return f"{value:.1f} s" if value is not None else UNMEASURED

    base_eager = train_row(presets, "presets", "base", "ours", "bf16-eager").get("tokens_per_s")
    base_compiled = train_row(presets_compiled, "presets", "base", "ours", "bf16-compile").get("tokens_per_s")
    eager_step = compile_.get("eager", {}).get("step_s")
    compiled_step = compile_.get("cold-regional", {}).get("step_s")
    step_ratio = ratio(eager_step, compiled_step)
    ours = train_row(compiled, "sizes", "base", "ours", "bf16-compile").get("speedup_vs_marian_same_mode")
    return [
        (
            "base preset, newstest-length batches: compiled as train --compile runs it / eager (tok/s)",
            " / ".join(f"{value:,.0f}" if value else UNMEASURED for value in (base_compiled, base_eager)),
            ">= 540k",
            ">= 700k",
        ),
        (
            "base, the same pairs packed into rows of one shape, compiled without dynamic dimensions (tok/s)",
            f"{packed_tokens:,.0f}{rows_of}" if packed_tokens else UNMEASURED,
            ">= 600k",
            ">= 700k",
        ),
        (
            "packed against padded batches, base, target tokens a second: eager / compiled",
            (f"{packed_eager:.2f}x" if packed_eager else UNMEASURED)
            + " / "
            + (
                f"{packed_compiled_ratio:.2f}x"
                if packed_compiled_ratio
                else ratio(packed_tokens, base_compiled)
            ),
            "",
            "",
        ),
        (
            f"packed, eager, {flex_rows} with flex attention's block masks, against padded batches, base, "
            "target tokens a second (train_packed_flex)",
            f"{flex_over_padded:.2f}x" if flex_over_padded else UNMEASURED,
            "",
            "",
        ),
        (
            "packed compiled step replayed as CUDA graphs (reduce-overhead) against without, base, tok/s",
            ratio(graphs.get("tokens_per_s"), packed_tokens),
            "",
            "",
        ),
        (
            "cold compile of the base packed training step (first step, empty compiler caches; graphs: 1 is "
            "no recompilation)",
            f"{packed_compile:.1f} s, graphs: {packed_compiled.get('graphs')}"
            if packed_compile is not None
            else UNMEASURED,
            "<= 60 s",
            "<= 20 s",
        ),
        ("compiled step against eager, base, 400 x 64-token buckets", step_ratio, "", ""),
        (
            "graphs compiled over those changing bucket shapes (1: no recompilation)",
            str(compile_.get("cold-regional", {}).get("graphs", UNMEASURED)),
            "",
            "1",
        ),
        (
            "cold compile of the training step, regional / whole (first step)",
            f"{seconds(compile_, 'cold-regional', 'first_step_s')} / "
            f"{seconds(compile_whole, 'cold-whole', 'first_step_s')}",
            "<= 60 s",
            "<= 20 s",
        ),
        (
            "warm start, same machine / from the run folder's compile cache on another (first step)",
            f"{seconds(compile_, 'warm-machine', 'first_step_s')} / "
            f"{seconds(compile_, 'warm-run-folder', 'first_step_s')}",
            "",
            "<= 5 s",
        ),
        (
            "ours as train --compile runs it, against Marian torch.compile'd, fixed 400 x 64 batches",
            f"{ours:.2f}x" if ours is not None else UNMEASURED,
            ">= 1.1x",
            ">= 1.3x",
        ),
        (
            "beam 4 / greedy, bf16, batch 64, against Marian",
            f"{speedup(generate, 'beam4-bf16')} / {speedup(generate, 'greedy-bf16')}",
            ">= 1.3x / >= 1.5x",
            ">= 1.5x / >= 2x",
        ),
        (
            "ours in bf16 against ours in float32, batch 64, same run: beam 4 / greedy",
            " / ".join(
                ratio(tokens_per_s(generate, f"{name}-bf16", "ours"), tokens_per_s(generate, name, "ours"))
                for name in ("beam4", "greedy")
            ),
            "",
            "",
        ),
        (
            "greedy, bf16, batch 64, static cache and compiled step: against Marian the same / against "
            "Marian's dynamic cache (another run)",
            f"{speedup(generate_static, 'greedy-bf16')} / "
            + ratio(
                tokens_per_s(generate_static, "greedy-bf16", "ours"),
                tokens_per_s(generate, "greedy-bf16", "marian"),
            ),
            ">= 1.5x (against Marian's default)",
            ">= 2x",
        ),
    ]


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/gpu_check")
    device = next(
        (
            machine
            for name in ("train_presets.json", "train_packed.json", "train_compile.json", "generate.json")
            if (machine := read(folder, name).get("machine", {}))
        ),
        {},
    )
    print(f"Targets ({folder}; machine: {device.get('gpu', device) if device else UNMEASURED})")
    print("| what | measured | milestone | goal |")
    print("|---|---|---|---|")
    for what, measured, milestone, goal in rows(folder):
        print(f"| {what} | {measured} | {milestone} | {goal} |")


if __name__ == "__main__":
    main()
