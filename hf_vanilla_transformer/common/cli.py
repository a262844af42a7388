"""What the commands of `vanilla-transformer` (`hf_vanilla_transformer.commands`) share: a parser that reports
a bad argument in one line (quoting an error's `first_line`), a help layout that shows defaults, argument
types that refuse values no run could use, and how a text file of segments is read."""

import argparse
import errno
import io
import math
import os
import select
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn, TextIO, TypeVar

from . import text_lines

# What a file argument takes for the standard input or output.
STANDARD_STREAM = "-"


def first_line(error: BaseException | str) -> str:
    """The first line of an error's message (of `error` itself, given as text), which a one-line refusal
    quotes; the error's type where its message is blank."""
    text, blank = (error, "") if isinstance(error, str) else (str(error), type(error).__name__)
    return (text.strip().splitlines() or [blank])[0]


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's own line breaks and adds each option's default to its help, except where
    there is none to show (None, an empty list, a switch) or the help names it already."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help_text = action.help or ""
        default = action.default
        shown = not isinstance(default, bool) and default not in (None, [], argparse.SUPPRESS)
        if shown and action.option_strings and "%(default)" not in help_text and "(default:" not in help_text:
            help_text += " (default: %(default)s)"
        return help_text


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose errors are one line, `PROG: error: MESSAGE`, with exit status 2: the usage
    block argparse prints first would bury the message (`--help` still shows it)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


# This package's own source files: an error raised in one of them is a refusal written for the user.
PACKAGE_DIR = Path(__file__).resolve().parents[1]


@contextmanager
def refusals_in_one_line(parser: ArgumentParser) -> Iterator[None]:
    """Report what this package refuses (a ValueError, or a file missing or in the way, raised by its own
    code: a folder of checkpoints without --resume, a resume with another recipe, missing data) as the
    parser's one-line error with exit status 2. The same errors raised inside another library are not
    refusals written for the user, and keep their traceback."""
    try:
        yield
    except (FileNotFoundError, FileExistsError, ValueError) as error:
        origin = Path(traceback.extract_tb(error.__traceback__)[-1].filename).resolve()
        if not origin.is_relative_to(PACKAGE_DIR):
            raise
        parser.error(str(error))


# Exit statuses for outputs that break mid-run: a disk that fills is an environment error (1; a usage
# error is 2), and a reader that goes away ends the command as SIGPIPE ends a Unix tool (128 + 13).
EXIT_OUTPUT_FAILED = 1
EXIT_READER_GONE = 128 + 13
FULL_DISK = (errno.ENOSPC, errno.EDQUOT)


def _stdout_descriptor() -> int | None:
    """Standard output's file descriptor; None where it was replaced by a stream without one."""
    try:
        return sys.stdout.fileno()
    except (AttributeError, ValueError, io.UnsupportedOperation):
        return None


def _stdout_reader_gone() -> bool:
    """Whether standard output is a pipe whose reader has closed it (`... | head -1` once head has its
    lines)."""
    descriptor = _stdout_descriptor()
    if descriptor is None or not hasattr(select, "poll"):
        return False
    poller = select.poll()
    poller.register(descriptor, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def _discard_stdout() -> None:
    """Send what is left in standard output's buffer nowhere: Python flushes it at exit, and would report
    a failure to write it once more."""
    descriptor = _stdout_descriptor()
    if descriptor is not None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, descriptor)
        os.close(devnull)


def run_command(
    run: Callable[[argparse.Namespace, ArgumentParser], int | None],
    parser: ArgumentParser,
    argv: list[str] | None = None,
) -> int | None:
    """Parse `argv` (None: the command line) with `parser` and `run` the command; returns its exit status
    (None: success).

    A file or folder this user may not read or write (a PermissionError, raised by this package or by a
    library it calls: `mkdir`, `save_pretrained`, a tokenizer's save) is the parser's one-line error,
    whichever step meets it: the fix lies with the user's files, never with the code. A disk that fills
    while the command writes is one line on standard error and exit status 1; a standard output whose
    reader goes away (`| head`) ends the command silently with status 141, as it ends a Unix tool."""
    args = parser.parse_args(argv)
    try:
        status = run(args, parser)
        sys.stdout.flush()  # what is still buffered fails here, not unreported at exit
        return status
    except PermissionError as error:
        path = error.filename if error.filename is not None else "a file"
        parser.error(
            f"permission denied on {path}: choose a path this user may read and write, or change its "
            "permissions."
        )
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise
        _discard_stdout()
        return EXIT_READER_GONE
    except OSError as error:
        if error.errno not in FULL_DISK:
            raise
        where = error.filename if error.filename is not None else "the output"
        print(
            f"{parser.prog}: error: cannot write {where}: {os.strerror(error.errno)}; free some space, or "
            "write the output to another disk.",
            file=sys.stderr,
        )
        _discard_stdout()
        return EXIT_OUTPUT_FAILED


def may_write(path: Path) -> bool:
    """Whether this process may write `path`: the file or folder itself where it exists, else the nearest
    folder above it that does, where it (and any folders between) would be created."""
    path = path.resolve()
    if path.exists():
        return os.access(path, os.W_OK)
    folder = path.parent
    while not folder.exists():
        folder = folder.parent
    return folder.is_dir() and os.access(folder, os.W_OK)


def check_writable(path: str | Path, flag: str, parser: ArgumentParser, kind: str = "folder") -> None:
    """The parser's one-line error if this user may not write `path`, which `flag` names (a `kind`, "file"
    or "folder"): checked before the work, which may take hours, not when its result is written."""
    if not may_write(Path(path)):
        parser.error(f"{flag} {path}: permission denied; give a {kind} this user may write.")


def input_lines(path: str, flag: str, parser: ArgumentParser, stdin: TextIO | None = None) -> list[str]:
    """The segments of the file that `flag` names, or of `stdin` where `path` is "-"; a missing file or
    text that is not UTF-8 is the parser's one-line error."""
    if path == "-" and stdin is not None:
        raw = getattr(stdin, "buffer", None)
        if raw is None:  # a text stream without bytes underneath (io.StringIO)
            return text_lines.read_lines(stdin.read().encode("utf-8"), "standard input")
        try:
            return text_lines.read_lines(raw.read(), "standard input")
        except text_lines.NotUTF8Error as error:
            parser.error(str(error))
    if Path(path).is_dir():
        parser.error(f"{flag} {path} is a folder: give a text file with one sentence a line.")
    if not Path(path).is_file():
        parser.error(f"{flag} {path}: no such file; give a text file with one sentence a line.")
    try:
        return text_lines.read_lines(path)
    except text_lines.NotUTF8Error as error:
        parser.error(f"{flag} {error}")


Number = TypeVar("Number", int, float)


def _number(
    text: str, kind: Callable[[str], Number], accept: Callable[[Number], bool], wanted: str
) -> Number:
    """`text` read as `kind`, if it is finite and `accept` takes it; else argparse's error naming `wanted`."""
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or (isinstance(value, float) and not math.isfinite(value)) or not accept(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer of at least 1."""
    return _number(text, int, lambda value: value >= 1, "a positive integer (1 or more)")


def non_negative_int(text: str) -> int:
    """argparse type: an integer of at least 0."""
    return _number(text, int, lambda value: value >= 0, "an integer of 0 or more")


def random_seed(text: str) -> int:
    """argparse type: a random seed, an integer from 0 to 2**32 - 1 (what numpy and torch both take)."""
    return _number(text, int, lambda value: 0 <= value < 2**32, "a seed from 0 to 2**32 - 1")


def finite_float(text: str) -> float:
    """argparse type: a finite number (no nan or inf)."""
    return _number(text, float, lambda value: True, "a finite number")


def non_negative_float(text: str) -> float:
    """argparse type: a finite number of at least 0."""
    return _number(text, float, lambda value: value >= 0, "a number of 0 or more")


def positive_float(text: str) -> float:
    """argparse type: a finite number above 0."""
    return _number(text, float, lambda value: value > 0, "a number above 0")


def probability(text: str) -> float:
    """argparse type: a number in [0, 1), as dropout rates and label smoothing take."""
    return _number(text, float, lambda value: 0 <= value < 1, "a number in [0, 1)")


__all__ = [
    "ArgumentParser",
    "HelpFormatter",
    "finite_float",
    "input_lines",
    "non_negative_float",
    "non_negative_int",
    "positive_float",
    "positive_int",
    "probability",
    "random_seed",
    "refusals_in_one_line",
]
