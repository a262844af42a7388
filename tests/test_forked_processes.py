"""`forked_processes` against `subprocess`: the same command gives the same exit status, output, errors,
environment, working directory and death by a signal, forked or started anew."""

import os
import signal
import subprocess
import sys
import time

import forked_processes
import pytest

SCRIPTS = {
    "exit status": "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)",
    "uncaught exception": "raise ValueError('wrong value')",
    "arguments, environment and folder": (
        "import os, sys; print(sys.argv[1:], os.environ['FORKED_TEST_VALUE'], os.path.basename(os.getcwd()))"
    ),
    "standard input": "import sys; print(sys.stdin.read().upper())",
    "errors into the output": "import sys; print('a', flush=True); print('b', file=sys.stderr)",
}


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1] if text.strip() else ""


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_a_forked_command_ends_as_a_new_interpreter_running_it_does(name, tmp_path):
    (tmp_path / "folder").mkdir()
    options = dict(
        input="two words\n",
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if name == "errors into the output" else subprocess.PIPE,
        text=True,
        env={**os.environ, "FORKED_TEST_VALUE": "seen"},
        cwd=tmp_path / "folder",
        timeout=120,
    )
    command = [sys.executable, "-c", SCRIPTS[name], "first", "second"]
    fresh = subprocess.run(command, **options)
    forked = forked_processes.run(command, **options)
    assert forked.returncode == fresh.returncode
    assert forked.stdout == fresh.stdout
    assert last_line(forked.stderr or "") == last_line(fresh.stderr or "")


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_a_signal_ends_a_forked_command_as_it_ends_a_new_interpreter(number):
    sleeper = [sys.executable, "-c", "import sys, time; print('up', flush=True); time.sleep(120)"]
    codes = []
    for start in (subprocess.Popen, forked_processes.popen):
        process = start(sleeper, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert process.stdout.readline() == b"up\n"
        process.send_signal(number)
        codes.append(process.wait(60))
        process.stdout.close()
    assert codes == [-number, -number]


def test_a_forked_command_is_a_process_of_its_own():
    process = forked_processes.popen(
        [sys.executable, "-c", "import os; print(os.getpid())"], stdout=subprocess.PIPE, text=True
    )
    started = time.monotonic()
    output, _ = process.communicate(timeout=60)
    assert int(output) == process.pid != os.getpid()
    assert process.returncode == 0 and time.monotonic() - started < 60
