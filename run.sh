#!/usr/bin/env bash
# The two set-up commands of the README, on a fresh machine:
#   bash run.sh demo   train a small model on the shipped Multi30k, translate the test set, report BLEU
#   bash run.sh test   run the test suite, one pytest worker per core (-n 0 after it: one process)
# Both create .venv (or reuse it) with PyTorch pinned first: an unpinned torch requirement would pull
# the newest release. PyPI's Linux torch is a multi-GB CUDA build; TORCH_INDEX_URL picks another index,
# e.g. https://download.pytorch.org/whl/cpu for the CPU build. The rest comes at the versions in
# constraints.txt, the ones the test suite passes with. The demo installs the package alone; the tests add
# the extras they check (export engines, PEFT, plots).
set -euo pipefail
cd "$(dirname "$0")"

VENV=${VENV:-.venv}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
TORCH_INDEX_URL=${TORCH_INDEX_URL:-}

setup() {
    local extras=$1
    if [ ! -x "$VENV/bin/python" ]; then
        python3 -m venv "$VENV"
    fi
    # pip would compile each installed module to bytecode one at a time; compileall then does the same work
    # on every core. Like pip, it skips modules written for newer Pythons (torch ships a few), and it leaves
    # modules already compiled alone.
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile \
        ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==$TORCH_VERSION"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile \
        -c constraints.txt -e ".$extras"
    local site_packages
    site_packages=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    "$VENV/bin/python" -m compileall -q -j 0 "$site_packages" > /dev/null || true
}

export HF_HUB_OFFLINE=1
export TOKENIZERS_PARALLELISM=false

case "${1:-}" in
    demo)
        setup ""
        shift
        "$VENV/bin/vanilla-transformer" train --preset cpu-demo --output-dir "${DEMO_DIR:-runs/demo}" "$@"
        ;;
    test)
        setup "[test]"
        shift
        # A test file's tests share one worker, and with them the models its fixtures train once.
        "$VENV/bin/python" -m pytest -q -n auto --dist loadfile "$@"
        ;;
    *)
        echo "usage: bash run.sh demo|test [extra arguments]" >&2
        exit 2
        ;;
esac
