"""`python -m MODULE ARGS`, `python -c CODE ARGS` and `python SCRIPT ARGS` as processes of their own, forked
from an interpreter that has imported the heavy third-party modules (torch, transformers, accelerate,
datasets, the server's) once: each new interpreter would pay those imports again, seconds of CPU a command.

`run` and `popen` take the arguments of `subprocess.run` and `subprocess.Popen` that the tests use. The child
is a real process: its own process id, signals, exit status, standard streams (pipes, files or /dev/null,
passed to it as file descriptors), working directory and `sys.argv`; it ends as that interpreter would (the
status SystemExit carries, 1 after an uncaught exception with its traceback on standard error, by the
signal that killed it), its own environment. What it does not redo is what a fresh interpreter does before
`-m`: those imports, and the reading of the environment they do. So each environment (but for variables
that only name the test, `PER_COMMAND_VARIABLES`) gets a forking interpreter of its own, started with it;
and one whose imports write anything to standard error is not used (a fresh interpreter would show that to
the command's reader): the command then starts a new interpreter.

Tests of how a process starts (imports, start-up time, the installed entry points) start new interpreters
with `subprocess` instead. Where CUDA is available every command starts a new interpreter: CUDA does not
survive a fork.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

# Imported once by each forking interpreter. Not the package itself: each command imports it as a new
# interpreter would, with its lazy names and registration.
PREIMPORTED = [
    "torch",
    "transformers",
    "transformers.modeling_utils",
    "transformers.generation",
    "transformers.trainer",
    "transformers.trainer_seq2seq",
    "accelerate",
    "datasets",
    "tokenizers",
    "safetensors.torch",
    "sacrebleu",
    "huggingface_hub",
    "fastapi",
    "uvicorn",
    "httpx",
]

# The forking interpreter: argv[1] its socket's path, argv[2] the modules to import (JSON). For each
# connection it reads a job ({"argv", "module", "code", "env", "cwd"}, the child's stdin, stdout and stderr
# as file descriptors), forks, answers the child's process id, and once the child has ended its exit status
# (as `subprocess` reports it), on that connection. Single-threaded, so that no lock is held at a fork. It
# exits when its parent does. The imported objects are frozen out of the garbage collector's sight: a
# collection walking them would write to every page the children share with it.
FORKING_INTERPRETER = r"""
import gc, json, os, runpy, select, socket, sys

listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(sys.argv[1])
listener.listen(64)
for module in json.loads(sys.argv[2]):
    __import__(module)
gc.freeze()
parent, waiting = os.getppid(), {}
sys.stderr.flush()
sys.stdout.write("ready\n")
sys.stdout.flush()
while os.getppid() == parent:
    readable, _, _ = select.select([listener], [], [], 0.02)
    if readable:
        connection, _ = listener.accept()
        message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
        job = json.loads(message)
        sys.stdout.flush()
        sys.stderr.flush()
        child = os.fork()
        if child == 0:
            listener.close()
            connection.close()
            for other in waiting.values():
                other.close()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            for fd in set(fds) - {0, 1, 2}:
                os.close(fd)
            os.environ.clear()
            os.environ.update(job["env"])
            os.chdir(job["cwd"])
            sys.argv = list(job["argv"])
            if job["code"] is not None:
                sys.path[0] = ""
                code = compile(job["code"], "<string>", "exec")
                exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
            elif job["module"]:
                runpy.run_module(job["module"], run_name="__main__", alter_sys=True)
            else:
                sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
                runpy.run_path(sys.argv[0], run_name="__main__")
            sys.exit(0)
        for fd in fds:
            os.close(fd)
        connection.sendall(f"{child}\n".encode())
        waiting[child] = connection
    while waiting:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            break
        connection = waiting.pop(pid)
        connection.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
        connection.close()
"""


class _Interpreter:
    """One forking interpreter, started in the environment `env`."""

    def __init__(self, env: dict[str, str]) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="forks-"))
        self.socket_path = str(self.folder / "socket")
        self.errors = self.folder / "imports.err"
        with self.errors.open("wb") as errors:
            self.process = subprocess.Popen(
                [sys.executable, "-c", FORKING_INTERPRETER, self.socket_path, json.dumps(PREIMPORTED)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=errors,
                env=env,
            )
        ready = self.process.stdout.readline() == b"ready\n"
        # Whatever the imports said would have reached the command's standard error.
        self.usable = ready and self.errors.stat().st_size == 0

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(60)


_interpreters: dict[tuple[tuple[str, str], ...], _Interpreter] = {}
_lock = threading.Lock()
# Variables that change from test to test and that no import reads: each child gets them, but they do not
# call for an interpreter of their own.
PER_COMMAND_VARIABLES = {"PYTEST_CURRENT_TEST"}


def _interpreter(env: dict[str, str]) -> _Interpreter | None:
    if torch.cuda.is_available():
        return None
    key = tuple(sorted((name, value) for name, value in env.items() if name not in PER_COMMAND_VARIABLES))
    with _lock:
        if key not in _interpreters:
            _interpreters[key] = _Interpreter(dict(env))
        interpreter = _interpreters[key]
    return interpreter if interpreter.usable and interpreter.process.poll() is None else None


@atexit.register
def _close_interpreters() -> None:
    for interpreter in _interpreters.values():
        interpreter.close()


def _what_to_run(args: Sequence[str]) -> dict[str, Any] | None:
    """The job of `python -m MODULE ARGS`, `python -c CODE ARGS` or `python SCRIPT ARGS`: its module, code
    and `sys.argv`; None for other commands (other executables, interpreter options), which start as they
    are."""
    args = [str(arg) for arg in args]
    if len(args) < 2 or args[0] != sys.executable:
        return None
    if args[1] in ("-m", "-c") and len(args) > 2:
        module, code = (args[2], None) if args[1] == "-m" else (None, args[2])
        return {"module": module, "code": code, "argv": [args[2] if module else "-c", *args[3:]]}
    if args[1].startswith("-"):
        return None
    return {"module": None, "code": None, "argv": args[1:]}


class ForkedProcess:
    """The parts of `subprocess.Popen` the tests use, for a forked child. A standard input left unset is
    /dev/null, not this process's: a pytest-xdist worker reads its instructions from its standard input."""

    def __init__(
        self,
        args: Sequence[str],
        interpreter: _Interpreter,
        job: dict[str, Any],
        cwd: str | os.PathLike | None,
        stdin: Any,
        stdout: Any,
        stderr: Any,
        text: bool,
    ) -> None:
        self.args = list(args)
        self.returncode: int | None = None
        self.stdin: Any = None
        self.stdout: Any = None
        self.stderr: Any = None
        child_fds, close_after = [], []

        def stream(spec: Any, index: int) -> None:
            if spec == subprocess.PIPE:
                read_end, write_end = os.pipe()
                child, ours, mode = (read_end, write_end, "w") if index == 0 else (write_end, read_end, "r")
                close_after.append(child)
                handle = open(ours, mode + ("" if text else "b"))
                setattr(self, ("stdin", "stdout", "stderr")[index], handle)
                child_fds.append(child)
            elif spec == subprocess.STDOUT:
                child_fds.append(child_fds[1])
            elif spec == subprocess.DEVNULL or (spec is None and index == 0):
                fd = os.open(os.devnull, os.O_RDWR)
                close_after.append(fd)
                child_fds.append(fd)
            elif spec is None:
                child_fds.append(index)
            else:
                child_fds.append(spec if isinstance(spec, int) else spec.fileno())

        for index, spec in enumerate((stdin, stdout, stderr)):
            stream(spec, index)
        job = {**job, "cwd": str(cwd or os.getcwd())}
        self.connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.connection.connect(interpreter.socket_path)
        socket.send_fds(self.connection, [json.dumps(job).encode()], child_fds)
        for fd in close_after:
            os.close(fd)
        self.unread = b""
        self.pid = int(self._line(None))

    def _line(self, timeout: float | None) -> bytes | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.unread:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.connection], [], [], left)
            if not ready:
                return None
            data = self.connection.recv(4096)
            if not data:
                raise RuntimeError(f"the forking interpreter went away while running {self.args}")
            self.unread += data
        line, self.unread = self.unread.split(b"\n", 1)
        return line

    def poll(self) -> int | None:
        if self.returncode is None:
            line = self._line(0)
            if line is not None:
                self.returncode = int(line)
                self.connection.close()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            line = self._line(timeout)
            if line is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = int(line)
            self.connection.close()
        return self.returncode

    def send_signal(self, number: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, number)

    def terminate(self) -> None:
        self.send_signal(15)

    def kill(self) -> None:
        self.send_signal(9)

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]:
        """Writes `input` to standard input and closes it, reads standard output and error to their ends,
        and waits for the process, as `Popen.communicate` does."""
        outputs: dict[str, Any] = {}

        def read(name: str) -> None:
            outputs[name] = getattr(self, name).read()

        readers = [threading.Thread(target=read, args=(name,), daemon=True)
                   for name in ("stdout", "stderr") if getattr(self, name) is not None]  # fmt: skip
        for reader in readers:
            reader.start()
        if self.stdin is not None:
            try:
                if input:
                    self.stdin.write(input)
                self.stdin.close()
            except BrokenPipeError:
                pass
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        for name in ("stdout", "stderr"):
            if getattr(self, name) is not None:
                getattr(self, name).close()
        return outputs.get("stdout"), outputs.get("stderr")

    def __enter__(self) -> ForkedProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for handle in (self.stdin, self.stdout, self.stderr):
            if handle is not None and not handle.closed:
                handle.close()
        self.wait()


def popen(
    args: Sequence[str],
    *,
    stdin: Any = None,
    stdout: Any = None,
    stderr: Any = None,
    text: bool = False,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
) -> ForkedProcess | subprocess.Popen:
    """`subprocess.Popen(args, ...)`, forked where `args` runs this interpreter on a module or a script."""
    job = _what_to_run(args)
    env = dict(os.environ if env is None else env)
    interpreter = _interpreter(env) if job else None
    if interpreter is None:
        return subprocess.Popen(args, stdin=stdin, stdout=stdout, stderr=stderr, text=text, env=env, cwd=cwd)
    return ForkedProcess(args, interpreter, {**job, "env": env}, cwd, stdin, stdout, stderr, text)


def run(
    args: Sequence[str],
    *,
    input: Any = None,
    capture_output: bool = False,
    stdin: Any = None,
    stdout: Any = None,
    stderr: Any = None,
    text: bool = False,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess:
    """`subprocess.run(args, ...)`, forked where `args` runs this interpreter on a module or a script; the
    process is killed when `timeout` passes, and TimeoutExpired raised."""
    if capture_output:
        stdout = stderr = subprocess.PIPE
    if input is not None:
        stdin = subprocess.PIPE
    process = popen(args, stdin=stdin, stdout=stdout, stderr=stderr, text=text, env=env, cwd=cwd)
    try:
        output, errors = process.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, output, errors)
