"""The benchmark scripts run end to end (--quick, tiny dims) and their correctness checks pass; on a
machine without a GPU, `--device cuda` is a one-line error.

Timings are not asserted: they mean nothing on a shared test machine at tiny dims.
"""

import json
import math
import os
import random
import re
import subprocess
import sys

import forked_processes
import pytest
import torch
from conftest import MEASURED_ONEDNN_MINIMA, REPO_ROOT

from hf_vanilla_transformer.common import cpu_speedups

SCRIPTS = REPO_ROOT / "benchmarks"
ENV = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")


def run_script(script: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python benchmarks/SCRIPT ARGS` in the repository, in a process of its own forked from an interpreter
    that has imported torch and transformers once (`forked_processes`)."""
    command = [sys.executable, str(SCRIPTS / script), *args]
    return forked_processes.run(
        command, capture_output=True, text=True, env=ENV, cwd=REPO_ROOT, timeout=timeout
    )


def script_ran(script: str, *args: str, timeout: float = 600) -> None:
    done = run_script(script, *args, timeout=timeout)
    assert done.returncode == 0, f"{script} {' '.join(args)}: status {done.returncode}\n{done.stderr[-3000:]}"


def run(script: str, tmp_path, *extra: str) -> dict:
    output = tmp_path / f"{script}.json"
    script_ran(script, "--quick", "--output", str(output), *extra)
    return json.loads(output.read_text())


CUDA_SCRIPTS = ("bench_train.py", "bench_generate.py", "bench_compile.py", "profile_step.py")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error of a machine without a CUDA GPU")
@pytest.mark.parametrize("script", CUDA_SCRIPTS)
def test_device_cuda_without_a_gpu_is_a_one_line_error(script):
    refusal = run_script(script, "--device", "cuda")
    assert refusal.returncode == 2
    assert refusal.stderr.endswith("finds no GPU\n") and refusal.stderr.count("\n") == 1, refusal.stderr


def write_newstest(folder, pairs: int) -> None:
    """Stand-ins for the newstest2013 and 2014 files: sentences of 1 to 40 words, `pairs` in each year."""
    folder.mkdir()
    generator = random.Random(0)
    words = [f"w{i}" for i in range(300)]
    for name in ("newstest2013", "newstest2014"):
        for language in ("en", "de"):
            lines = (" ".join(generator.choices(words, k=generator.randint(1, 40))) for _ in range(pairs))
            (folder / f"{name}.{language}").write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.mark.slow
def test_bench_train_quick_times_token_budget_batches_of_real_lengths(tmp_path):
    write_newstest(tmp_path / "wmt14", pairs=100)
    result = run("bench_train.py", tmp_path, "--data", str(tmp_path / "wmt14"))
    assert result["data"]["pairs"] == 200 and result["data"]["batches_per_round"] == 3
    size = result["sizes"]["tiny"]
    # Budgets of 1000 padded tokens a side; the real target tokens, which tokens/s counts, are fewer.
    assert size["steps_per_round"] == 3 and 0 < size["target_tokens_per_step"] <= 1000
    assert all(row["tokens_per_s"] > 0 for row in size["rows"])
    # Compiled modes train on the lengths `train --compile` pads to (multiples of 8): more products.
    assert size["flops_per_step_compiled"] > size["flops_per_step"] > 0


def test_bench_train_data_without_the_files_is_skipped_with_the_reason(tmp_path):
    result = run("bench_train.py", tmp_path, "--data", str(tmp_path / "absent"))
    assert "lacks newstest2013.en, newstest2013.de" in result["skipped"] and "sizes" not in result


@pytest.mark.slow
def test_bench_generate_quick_outputs_identical(tmp_path):
    result = run("bench_generate.py", tmp_path, "--int8")
    assert result["outputs_identical_fp32"] is True
    searches = result["sizes"]["tiny"]["searches"]
    assert set(searches) == {"beam4", "greedy"}
    for search in searches.values():
        assert search["outputs_identical_fp32"] is True
        engines = search["engines"]
        assert engines["ours"]["identical_sentences"] == 1.0
        assert all(row["tokens_per_s"] > 0 for row in engines.values())


@pytest.mark.slow
def test_bench_train_quick_runs_and_loss_curves_match(tmp_path):
    result = run("bench_train.py", tmp_path, "--loss-curve", "1")
    rows = result["sizes"]["tiny"]["rows"]
    assert {(r["model"], r["mode"]) for r in rows} >= {("marian", "fp32-eager"), ("ours", "fp32-eager")}
    assert all(r["tokens_per_s"] > 0 for r in rows)
    summary = result["loss_curve"]["summary"]
    # Same weights, batches and dropout masks: fp32 losses agree to rounding.
    assert summary["ours fp32-eager"]["max_abs_diff_vs_marian"] < 1e-3
    assert result["loss_curve"]["finite"]


@pytest.mark.slow
@pytest.mark.skipif(not cpu_speedups._X86_ONEDNN, reason="oneDNN's float32 path is taken on x86 CPUs only")
def test_bench_onednn_quick_measures_every_variant_with_identical_tokens(tmp_path):
    result = run("bench_onednn.py", tmp_path)
    assert result["shipped_minima"] == MEASURED_ONEDNN_MINIMA
    assert {row["shape"] for row in result["layers"]} == {"64x64", "64x128", "128x64", "64x1000"}
    for row in result["layers"]:
        assert row["training_onednn_speedup"] > 0 and row["inference_onednn_speedup"] > 0
    tiny = result["sizes"]["tiny"]
    assert tiny["generate_beam4"]["outputs_identical"] is True
    for speedups in (tiny["training"], tiny["generate_beam4"]["speedups"]):
        assert set(speedups) == {"default-gemm", "gated", "onednn-everywhere"}
        assert speedups["default-gemm"] == 1.0 and all(value > 0 for value in speedups.values())


@pytest.mark.slow
def test_bench_data_quick_prepares_then_reads_the_cache(tmp_path):
    result = run("bench_data.py", tmp_path, "--num-proc", "1")
    size = result["sizes"]["5000"]
    assert size["bpe"]["vocab_size"] == 500
    first, cached = size["num_proc_1"]["first"], size["num_proc_1"]["cached"]
    assert first["pairs"] == cached["pairs"] == 5000
    assert first["batches"] == cached["batches"] > 0
    assert first["peak_rss_mib"] > 0 and first["cache_mib"] > 0


@pytest.mark.slow
def test_bench_ct2_backends_quick_times_both_backends_on_full_length_outputs(tmp_path):
    pytest.importorskip("ctranslate2", reason="CTranslate2 is not installed (pip install -e .[export])")
    result = run("bench_ct2_backends.py", tmp_path)
    rows = result["sizes"]["tiny"]["rows"]
    assert set(rows) == {
        f"{quantization}/{search}/{backend}"
        for quantization in ("float32", "int8")
        for search in ("beam4", "greedy")
        for backend in ("oneDNN", "MKL")
    }
    for row in rows.values():
        # The end token's -1e4 bias went through the export: every output runs to --new-tokens.
        assert row["full_length"] is True
        assert row["tokens_per_s"] > 0 and row["speedup_vs_onednn"] > 0
        assert 0.0 <= row["identical_to_onednn"] <= 1.0


def test_bench_loss_quick_gives_torchs_loss_and_gradient(tmp_path):
    """The chunked loss against torch's cross_entropy on bf16 logits: the same loss to float rounding, the
    same gradient to bf16 rounding (values below 1, so within bf16's 2^-8 relative step)."""
    result = run("bench_loss.py", tmp_path)
    assert set(result["losses"]) == {"torch", "chunked"}
    chunked = result["losses"]["chunked"]
    assert chunked["loss_rel_diff"] < 1e-5
    assert chunked["grad_max_abs_diff"] <= 2**-8
    assert all(row["ms"] > 0 for row in result["losses"].values())


def test_bench_stream_quick_translates_every_line_and_samples_memory(tmp_path):
    result = run("bench_stream.py", tmp_path)
    assert [r["lines"] for r in result["runs"]] == [2000, 8000]
    for measured in result["runs"]:
        assert measured["one_output_line_per_input_line"] and measured["output_lines"] == measured["lines"]
        assert 0 < measured["rss_mib_at_10_percent"] <= measured["peak_rss_mib"]


def test_bench_compile_padding_to_buckets_pads_at_least_as_much_as_to_the_longest(tmp_path):
    """A batch's longest, rounded up to a multiple of 8 (a compiled run's), then to its bucket (a multiple
    of 8 or more): each pads at least as much as the one before."""
    write_newstest(tmp_path / "wmt14", pairs=100)
    output = tmp_path / "compile.json"
    script_ran("bench_compile.py", "--only", "padding", "--data", str(tmp_path / "wmt14"),
               "--bpe-vocab", "400", "--data-copies", "2", "--max-tokens", "600", "--output", str(output),
               timeout=300)  # fmt: skip
    padding = json.loads(output.read_text())["padding"]
    shares = [padding[f"padding_share_{kind}"] for kind in ("longest", "compiled", "buckets")]
    assert 0 < shares[0] < shares[1] <= shares[2] < 1, shares


@pytest.mark.parametrize(
    ("flags", "refusal"),
    [
        (["--compile-mode", "reduce-overhead"], "give --speed --compile"),
        pytest.param(
            ["--speed", "--packed-attention", "flex_attention"],
            "trains on CUDA only: give --device cuda",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="the error of a machine without CUDA"),
        ),
    ],
)
def test_bench_packing_refuses_options_it_cannot_run_in_one_line(flags, refusal):
    refused = run_script("bench_packing.py", *flags)
    assert refused.returncode == 2 and refusal in refused.stderr.splitlines()[-1], refused.stderr


def test_bench_packing_counts_padding_and_the_blocks_flex_attention_computes(tmp_path):
    """Packed rows pad less than the token-budget batches; flex attention's block masks leave out more of
    the blocks the longer the rows, and never compute more than all of them."""
    write_newstest(tmp_path / "wmt14", pairs=100)
    output = tmp_path / "packing.json"
    script_ran("bench_packing.py", "--data", str(tmp_path / "wmt14"), "--bpe-vocab", "400", "--data-copies",
               "2", "--max-tokens", "1024", "--row-lengths", "128", "512", "--output", str(output),
               timeout=300)  # fmt: skip
    result = json.loads(output.read_text())
    short, long = (result["packed"][length] for length in ("128", "512"))
    assert 0 <= long["padding_share"] < result["padded"]["padding_share_compiled"]
    assert 0 < long["flex_blocks_share"] < short["flex_blocks_share"] <= 1, (short, long)


@pytest.mark.slow
def test_bench_packing_speed_trains_padded_and_packed_batches_of_the_same_pairs(tmp_path):
    """Eager steps of a tiny model on token-budget batches padded to their longest and on packed batches:
    both epochs hold every pair once, and a pass over a whole epoch trains on the same real target tokens
    either way, in fewer, fuller steps of one shape when packed."""
    write_newstest(tmp_path / "wmt14", pairs=30)
    result = run(
        "bench_packing.py",
        tmp_path,
        "--speed",
        "--data",
        str(tmp_path / "wmt14"),
        "--max-batches",
        "8",
    )
    speed = result["speed"]
    data, variants = speed["data"], speed["variants"]
    assert data["epochs_cover_every_pair_once"] and data["pairs"] == 60
    epoch_tokens = data["epochs"]["padded"]["real_target_tokens"]
    assert data["epochs"]["packed"]["real_target_tokens"] == epoch_tokens > 0
    assert set(variants) == {"padded-eager", "packed-eager"}
    padded, packed = variants["padded-eager"], variants["packed-eager"]
    for figures in (padded, packed):
        assert figures["whole_epoch"] and 2 <= figures["steps_per_pass"] <= 8
        assert figures["real_target_tokens_per_pass"] == epoch_tokens
        assert figures["tokens_per_s"] > 0 and math.isfinite(figures["loss"])
    assert packed["batch_shapes"] == 1 and packed["steps_per_pass"] <= padded["steps_per_pass"]
    assert packed["real_target_tokens_per_step"] >= padded["real_target_tokens_per_step"]
    assert 0 <= packed["padded_share"] < padded["padded_share"] < 1
    assert speed["packed_over_padded_eager"] > 0


def test_profile_step_counts_both_models_kernels(tmp_path):
    """Greedy decoding of the same weights, profiled: both models run the same products, each a step."""
    output = tmp_path / "profile.json"
    script_ran("profile_step.py", "--size", "tiny", "--what", "greedy", "--batch", "2", "--length",
               "4", "--warmup", "1", "--steps", "1", "--output", str(output), timeout=300)  # fmt: skip
    models = json.loads(output.read_text())["models"]
    for model in ("marian", "ours"):
        assert models[model]["kernels_per_step"] > 0 and models[model]["device_ms_per_step"] > 0
    products = [
        sum(kernel["calls"] for name, kernel in models[model]["kernels"].items() if name == "aten::linear")
        for model in ("marian", "ours")
    ]
    assert products[0] == products[1] > 0, products


def test_gpu_check_runs_the_chosen_steps_each_under_its_limit(tmp_path):
    """`gpu_check.sh` with STEPS runs those steps only, each under `timeout` with its own limit cut to the
    budget left, and goes on past a step that fails (an interpreter that records its calls stands in); a
    folder without the newstest files fails the check with the missing file named."""
    calls = tmp_path / "calls.txt"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\necho "$*" >> {calls}\ncase "$*" in *bench_generate*) exit 3;; esac\n')
    python.chmod(0o755)
    data = tmp_path / "wmt14"
    data.mkdir()
    for name in ("newstest2013.en", "newstest2013.de", "newstest2014.en", "newstest2014.de"):
        (data / name).write_text("a line\n")
    env = {**ENV, "PYTHON": str(python), "OUT": str(tmp_path / "out"), "WMT14_DIR": str(data)}

    def check(steps: str) -> subprocess.CompletedProcess:
        script = ["bash", str(SCRIPTS / "gpu_check.sh")]
        return subprocess.run(script, env=env | {"STEPS": steps}, capture_output=True, text=True, timeout=60)

    done = check("tests generate compile")
    ran = calls.read_text().splitlines()
    assert [line.split()[0] for line in ran[:3]] == [
        "-m",
        "benchmarks/bench_compile.py",
        "benchmarks/bench_generate.py",
    ]
    assert ran[3] == f"benchmarks/gpu_targets.py {tmp_path / 'out'}"
    assert re.search(r"=== compile: at \d+s, limit 270s", done.stdout), done.stdout
    assert "failed or skipped: generate (exit 3)" in done.stdout and done.returncode == 1
    assert (tmp_path / "out" / "gpu_check.log").read_text() == done.stdout

    # Without the newstest files the steps that read them would measure nothing: the check says so and fails.
    (data / "newstest2014.de").unlink()
    done = check("tests")
    assert f"{data}/newstest2014.de is missing" in done.stdout
    assert f"failed or skipped: data ({data}/newstest2014.de missing)" in done.stdout and done.returncode == 1
