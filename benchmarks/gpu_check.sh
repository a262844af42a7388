#!/usr/bin/env bash
# The benchmarks' check on a CUDA GPU, prepared to run once in at most 8 minutes (BUDGET_S): the GPU's
# name and the versions, the GPU tests, then bench_train.py and bench_generate.py with --device cuda,
# cheapest and most needed first, each under `timeout` and never past the budget, so that one slow step
# cannot eat the others' time; a step that fails or times out is reported and the next one runs.
#
#   bash benchmarks/gpu_check.sh          # from anywhere; it runs in the repository root
#
# Environment:
#   OUT        folder for the results: gpu_check.log and one JSON per benchmark, 8 files (default
#              runs/gpu_check)
#   WMT14_DIR  folder with newstest2013.en/.de and newstest2014.en/.de, relative to the repository root
#              or absolute (default ../shared/data/wmt14); without them the real-length steps are skipped
#   PYTHON     the interpreter (default python3); hf_vanilla_transformer must import with the PYTHONPATH
#              given, to which the repository root is appended
#   BUDGET_S   seconds for the whole check (default 480)
#
# Exit status: 0 when every step passed, 1 otherwise (see the summary at the end of the log).

set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu_check}
WMT14_DIR=${WMT14_DIR:-../shared/data/wmt14}
PYTHON=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-480}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
mkdir -p "$OUT"

failed=()

# step NAME LIMIT_S COMMAND...: COMMAND under `timeout`, for at most LIMIT_S seconds and no longer than
# the budget has left; skipped when less than 30 seconds are left.
step() {
    local name=$1 limit=$2 start=$SECONDS status
    shift 2
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
    echo "=== gpu_check: $(date -u +%FT%TZ), budget ${BUDGET_S}s, results in $OUT, WMT14_DIR=$WMT14_DIR"
    nvidia-smi -L
    nvidia-smi --query-gpu=name,memory.total,power.limit,clocks.max.sm,driver_version --format=csv
    step versions 60 "$PYTHON" -c "import platform, torch, transformers, hf_vanilla_transformer
print('python', platform.python_version(), '| torch', torch.__version__, '| CUDA', torch.version.cuda,
      '| transformers', transformers.__version__, '|', torch.cuda.get_device_name())"
    step test_cuda 120 "$PYTHON" -m pytest -q -p no:cacheprovider tests/test_cuda.py
    step loss 60 "$PYTHON" benchmarks/bench_loss.py --device cuda --output "$OUT/loss.json"
    step train_eager 90 "$PYTHON" benchmarks/bench_train.py --device cuda --modes bf16-eager --repeats 5 \
        --output "$OUT/train_eager.json"
    step train_stream 90 "$PYTHON" benchmarks/bench_train.py --device cuda --data "$WMT14_DIR" \
        --max-steps 16 --modes bf16-eager --warmup 1 --repeats 3 --output "$OUT/train_stream.json"
    step generate 120 "$PYTHON" benchmarks/bench_generate.py --device cuda --output "$OUT/generate.json"
    # Compiling both models' training steps takes minutes on a cold cache: last but one.
    step train_compile 240 "$PYTHON" benchmarks/bench_train.py --device cuda --modes bf16-compile \
        --repeats 3 --output "$OUT/train_compile.json"
    # The presets on real-length batches padded to bucket lengths, eager against compiled: what
    # train --length-buckets --compile would give them.
    step train_presets_compile 180 "$PYTHON" benchmarks/bench_train.py --device cuda --data "$WMT14_DIR" \
        --presets base big --max-steps 16 --length-buckets --modes bf16-eager bf16-compile --warmup 2 \
        --repeats 3 --output "$OUT/train_presets_compile.json"
    # generate() compiles the decoding steps with a static cache: with whatever time is left.
    step generate_static 120 "$PYTHON" benchmarks/bench_generate.py --device cuda --cache static \
        --searches greedy --dtypes bf16 --output "$OUT/generate_static.json"
    echo "=== gpu_check: done after ${SECONDS}s; failed or skipped: ${failed[*]:-none}"
    ((${#failed[@]} == 0))
}

main 2>&1 | tee "$OUT/gpu_check.log"
