#!/usr/bin/env bash
# The benchmarks' check on a CUDA GPU, prepared to run once in under 10 minutes (BUDGET_S): the GPU's
# name and the versions, tests/test_cuda.py, then bench_train.py, bench_packing.py, bench_compile.py,
# bench_generate.py and profile_step.py with --device cuda, the figures most needed first (the base
# preset on newstest-length batches, eager, then packed and compiled), each under `timeout` and never past
# the budget, so that one slow step cannot eat the others' time; a step that fails or times out is
# reported and the next one runs. It ends with the targets table (benchmarks/gpu_targets.py),
# "unmeasured" where a step gave no figure.
#
#   bash benchmarks/gpu_check.sh          # from anywhere; it runs in the repository root
#
# Environment:
#   OUT        folder for the results: gpu_check.log and one JSON per benchmark step, 12 of them (default
#              runs/gpu_check)
#   WMT14_DIR  folder with newstest2013.en/.de and newstest2014.en/.de, relative to the repository root
#              or absolute (default ../shared/data/wmt14); without them the newstest-length steps measure
#              nothing, and the check says so and fails
#   PYTHON     the interpreter (default python3); hf_vanilla_transformer must import with the PYTHONPATH
#              given, to which the repository root is appended
#   WHEELS     a folder of wheels installed first (pip --no-index into a temporary folder put first on
#              PYTHONPATH), for a machine that cannot reach a package index, relative to the repository
#              root or absolute (default: none)
#   BUDGET_S   seconds for the steps (default 540: with the table and nvidia-smi, under 10 minutes)
#   STEPS      the names of the steps to run, separated by spaces (default: every step, in the script's
#              order). The steps' limits add up to about 29 minutes, most of it for cold compiles, so the
#              budget decides how far down the list one call gets; a later call can take the rest with
#              STEPS="train_presets_compiled compile generate generate_static" and the like.
#
# Exit status: 0 when every step passed, 1 otherwise (see the summary at the end of the log).

set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu_check}
WMT14_DIR=${WMT14_DIR:-../shared/data/wmt14}
PYTHON=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-540}
STEPS=${STEPS:-}
if [[ -n ${WHEELS:-} ]]; then
    site=$(mktemp -d)
    trap 'rm -rf "$site"' EXIT
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$WHEELS"/*.whl || exit 1
    PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
mkdir -p "$OUT"

failed=()

# step NAME LIMIT_S COMMAND...: COMMAND under `timeout`, for at most LIMIT_S seconds and no longer than
# the budget has left; skipped when less than 30 seconds are left, and not run when STEPS leaves it out.
step() {
    local name=$1 limit=$2 start=$SECONDS status
    shift 2
    if [[ -n $STEPS && " $STEPS " != *" $name "* ]]; then
        return
    fi
    local left=$((BUDGET_S - SECONDS))
    if ((left < 30)); then
        echo "=== $name: skipped, ${left}s of the ${BUDGET_S}s budget left"
        failed+=("$name (skipped)")
        return
    fi
    ((limit > left)) && limit=$left
    echo "=== $name: at ${SECONDS}s, limit ${limit}s: $*"
    timeout --kill-after=10 "$limit" "$@"
    status=$?
    echo "=== $name: exit status $status after $((SECONDS - start))s"
    ((status == 124 || status == 137)) && echo "=== $name: timed out"
    ((status == 0)) || failed+=("$name (exit $status)")
}

main() {
    echo "=== gpu_check: $(date -u +%FT%TZ), budget ${BUDGET_S}s, results in $OUT, WMT14_DIR=$WMT14_DIR" \
        "${WHEELS:+| WHEELS=$WHEELS installed in $site}"
    nvidia-smi -L
    nvidia-smi --query-gpu=name,memory.total,power.limit,clocks.max.sm,driver_version --format=csv
    local file
    for file in newstest2013.en newstest2013.de newstest2014.en newstest2014.de; do
        if [[ ! -f $WMT14_DIR/$file ]]; then
            echo "=== $WMT14_DIR/$file is missing: the newstest-length steps measure nothing (set WMT14_DIR)"
            failed+=("data ($WMT14_DIR/$file missing)")
            break
        fi
    done
    step versions 40 "$PYTHON" -c "import platform, torch, transformers, hf_vanilla_transformer
print('python', platform.python_version(), '| torch', torch.__version__, '| CUDA', torch.version.cuda,
      '| transformers', transformers.__version__, '|', torch.cuda.get_device_name())"
    step tests 90 "$PYTHON" -m pytest -q -p no:cacheprovider tests/test_cuda.py
    # The base preset on newstest-length batches, eager: the baseline of the steps that follow.
    step train_presets 90 "$PYTHON" benchmarks/bench_train.py --device cuda --data "$WMT14_DIR" \
        --presets base --max-steps 16 --modes bf16-eager --warmup 1 --repeats 2 \
        --output "$OUT/train_presets.json"
    # The base model on the same newstest-length pairs packed into rows of one shape (train
    # --packed-row-length 256), eager against padded batches, and compiled without dynamic dimensions:
    # tokens a second and the cold compile of the packed step (its first step, in a process with empty
    # compiler caches). The padded compiled step is train_presets_compiled's (the same 16 batches):
    # compiling it again would not fit the limit.
    step train_packed 150 "$PYTHON" benchmarks/bench_packing.py --speed --compile --compiled packed \
        --device cuda --bf16 --size base --data "$WMT14_DIR" --output "$OUT/train_packed.json"
    # The packed compiled step replayed as CUDA graphs (torch.compile's reduce-overhead mode), against
    # train_packed's compiled step without them.
    step train_packed_graphs 150 "$PYTHON" benchmarks/bench_packing.py --speed --compile --compiled packed \
        --compile-mode reduce-overhead --device cuda --bf16 --size base --data "$WMT14_DIR" \
        --output "$OUT/train_packed_graphs.json"
    # Ours (the step train --compile runs) against Marian torch.compile'd, on the same fixed batches.
    step train_compile 200 "$PYTHON" benchmarks/bench_train.py --device cuda --modes bf16-compile \
        --repeats 2 --output "$OUT/train_compile.json"
    # The same pairs packed into rows of 1024 tokens with flex attention and its block masks, which skip
    # the blocks of a row where no pair meets another (about 28% of the blocks computed on these lengths,
    # RESULTS.md), against padded batches; eager (transformers compiles flex attention itself).
    step train_packed_flex 120 "$PYTHON" benchmarks/bench_packing.py --speed --packed-attention flex_attention \
        --packed-row-length 1024 --device cuda --bf16 --size base --data "$WMT14_DIR" \
        --output "$OUT/train_packed_flex.json"
    # The base preset on the same batches compiled as train --compile runs it on padded batches (lengths
    # padded to multiples of 8, dimensions dynamic, one cold compile in the warm-up round): a step of its
    # own, since that compile has taken minutes, and the eager figure above must not wait on it.
    step train_presets_compiled 200 "$PYTHON" benchmarks/bench_train.py --device cuda --data "$WMT14_DIR" \
        --presets base --max-steps 16 --modes bf16-compile --warmup 1 --repeats 2 \
        --output "$OUT/train_presets_compiled.json"
    # train --compile's step at base dimensions on bucket shapes that change every step: the cold compile
    # (regional), the warm starts on the same machine and from the run folder's cache, and the compiled step
    # against the eager one (5 timed steps: the last three repeat shapes already run, so the median is not a
    # first run).
    step compile 270 "$PYTHON" benchmarks/bench_compile.py --device cuda --size base --batch 400 --length 64 \
        --bf16 --steps 5 --only cold-regional warm-machine warm-run-folder eager --output "$OUT/compile.json"
    # Both dtypes in one run, so that bf16 is measured against float32 on the same card.
    step generate 60 "$PYTHON" benchmarks/bench_generate.py --device cuda --dtypes float32 bf16 \
        --output "$OUT/generate.json"
    # generate() with a static cache, whose decoding step transformers compiles on a GPU (CUDA graphs), for
    # both models: greedy only (beam search does not compile it).
    step generate_static 120 "$PYTHON" benchmarks/bench_generate.py --device cuda --dtypes bf16 \
        --searches greedy --cache static --output "$OUT/generate_static.json"
    # Where the time of a greedy decoding call and of a compiled training step goes, kernel by kernel.
    step profile_greedy 70 "$PYTHON" benchmarks/profile_step.py --device cuda --what greedy --batch 64 \
        --length 64 --bf16 --output "$OUT/profile_greedy.json"
    step profile_train 150 "$PYTHON" benchmarks/profile_step.py --device cuda --batch 400 --length 64 --bf16 \
        --output "$OUT/profile_train.json"
    # The whole model inlined into one graph, against the regional compile above: last, with what is left.
    step compile_whole 60 "$PYTHON" benchmarks/bench_compile.py --device cuda --size base --batch 400 \
        --length 64 --bf16 --steps 2 --only cold-whole --output "$OUT/compile_whole.json"
    echo "=== gpu_check: done after ${SECONDS}s; failed or skipped: ${failed[*]:-none}"
    "$PYTHON" benchmarks/gpu_targets.py "$OUT"
    ((${#failed[@]} == 0))
}

main 2>&1 | tee "$OUT/gpu_check.log"
