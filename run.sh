#!/usr/bin/env bash
# The two set-up commands of the README, on a fresh machine:
#   bash run.sh demo   train a small model on the shipped Multi30k, translate the test set, report BLEU
#   bash run.sh test   run the test suite, one pytest worker per core (-n 0 after it: one process)
# (`bash run.sh install [test]` prepares the environment of either and runs nothing.)
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
    # What the environment was installed from; when none of it changed since, there is nothing to do.
    local stamp="$VENV/.run-sh-installed" inputs
    inputs="torch==$TORCH_VERSION ${TORCH_INDEX_URL} .$extras $(cat pyproject.toml constraints.txt | sha256sum)"
    if [ -x "$VENV/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$inputs" ]; then
        return 0
    fi
    if [ ! -x "$VENV/bin/python" ]; then
        python3 -m venv "$VENV"
    fi
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile \
        ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==$TORCH_VERSION"
    # uv resolves and installs the rest in parallel, in seconds where pip takes most of a minute. It reads
    # no pip configuration, so where it cannot reach an index (a mirror set up for pip alone, say) pip does
    # the same install. torch is named again so that neither replaces the build installed above.
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile -c constraints.txt uv
    if ! "$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" \
        -c constraints.txt -e ".$extras" "torch==$TORCH_VERSION"; then
        echo "uv could not install the package; installing it with pip" >&2
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile \
            -c constraints.txt -e ".$extras" "torch==$TORCH_VERSION"
    fi
    # The demo's environment: bytecode for the installed modules on every core (pip would compile them one at
    # a time, uv not at all), so that a command's first start does not compile what it imports, even where
    # PYTHONDONTWRITEBYTECODE keeps it from saving that work. Not for the packages' own test folders, which
    # nothing imports, nor for transformers' hundreds of model folders but `auto`, of which a run imports a
    # few. Like pip, compileall skips modules written for newer Pythons (torch ships a few). The tests'
    # environment is not compiled: its processes write the bytecode of what they import (see `test`).
    if [ "$extras" != "[test]" ]; then
        local site_packages
        site_packages=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        "$VENV/bin/python" -m compileall -q -j 0 \
            -x '/site-packages/([^/]+/(.*/)?tests?|transformers/models/(?!auto/)[^/]+)/' "$site_packages" \
            > /dev/null || true
    fi
    echo "$inputs" > "$stamp"
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
        # A test file's tests share one worker, and with them the models its fixtures train once. The suite
        # starts hundreds of interpreters: the first to import a module writes its bytecode for the rest,
        # whatever PYTHONDONTWRITEBYTECODE says (compiling all of site-packages beforehand took longer).
        env -u PYTHONDONTWRITEBYTECODE "$VENV/bin/python" -m pytest -q -n auto --dist loadfile "$@"
        ;;
    install)
        # The environment alone: `install` the demo's, `install test` the tests'.
        setup "${2:+[$2]}"
        ;;
    *)
        echo "usage: bash run.sh demo|test [extra arguments] | install [test]" >&2
        exit 2
        ;;
esac
