"""The one way this package reads text files of one segment (sentence, template line, ...) a line.

- The text is UTF-8; a leading byte-order mark, which Windows editors write, is dropped: kept, it would be
  part of the first segment.
- Only "\\n" ends a line, and a "\\r" before it is dropped, so that "\\n" and "\\r\\n" files read the same.
  `str.splitlines` would also split at U+2028, U+0085 and form feeds, which occur inside WMT sentences and
  would misalign line-aligned files.
- The final line end does not start another segment: "a\\nb\\n" and "a\\nb" both hold two.
- Text that is not UTF-8 is a `NotUTF8Error` (a ValueError) naming the file, the line and the byte.

`line_chunks` reads a binary stream in chunks of lines (corpora far larger than memory), `split_lines` the
lines of a text given as a string (a form field), `iter_lines` a file line by line, `read_lines` a whole file
as a list, `count_lines` checks a file and counts its lines without keeping them, and `arriving_chunks` reads
a stream, a pipe say, in chunks of the lines that have arrived.
"""

import io
import itertools
import queue
import threading
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import BinaryIO

# Lines decoded at a time by `iter_lines` and `read_lines`.
_CHUNK_LINES = 10_000
_BYTE_ORDER_MARK = "\ufeff"


class NotUTF8Error(ValueError):
    """Text that is not UTF-8: `name` (the file), the 1-based `line` and the 0-based `byte` (counted from the
    start of the file) where decoding failed, and the decoder's `reason`."""

    def __init__(self, name: str, line: int, byte: int, reason: str) -> None:
        self.name, self.line, self.byte, self.reason = name, line, byte, reason
        super().__init__(
            f"{name}, line {line}: not valid UTF-8 ({reason} at byte {byte}); re-encode it, e.g. "
            "iconv -f latin1 -t utf-8."
        )


def line_chunks(stream: BinaryIO, name: str, size: int = _CHUNK_LINES) -> Iterator[tuple[int, list[str]]]:
    """(1-based number of the first line, lines) chunks of up to `size` lines of the binary `stream`, whose
    `name` the errors give (see the module docstring for what a line is)."""
    first, offset = 1, 0
    # Binary iteration splits on b"\n" only; a chunk therefore never splits a character.
    while raw := list(itertools.islice(stream, size)):
        joined = b"".join(raw)
        try:
            text = joined.decode("utf-8")
        except UnicodeDecodeError as error:
            line = first + joined.count(b"\n", 0, error.start)
            raise NotUTF8Error(name, line, offset + error.start, error.reason) from None
        lines = text.split("\n")
        if raw[-1].endswith(b"\n"):
            lines.pop()
        lines = [line.removesuffix("\r") for line in lines]
        if first == 1:
            lines[0] = lines[0].removeprefix(_BYTE_ORDER_MARK)
        yield first, lines
        first += len(lines)
        offset += len(joined)


def split_lines(text: str) -> list[str]:
    """The lines of `text`, a string such as a form field (browsers send "\\r\\n"): split at "\\n" only, a
    "\\r" before it dropped, as in files. Unlike a file's, every "\\n" starts a line, so that a text that
    ends with a line break keeps it once its lines are translated and joined again."""
    return [line.removesuffix("\r") for line in text.split("\n")]


def iter_lines(source: str | Path | bytes, name: str | None = None) -> Iterator[str]:
    """The lines of the file at `source`, or of `source` given as bytes, one at a time; the errors name
    `name` (default: the path, or "the text")."""
    if name is None:
        name = "the text" if isinstance(source, bytes) else str(source)
    with nullcontext(io.BytesIO(source)) if isinstance(source, bytes) else open(source, "rb") as stream:
        for _, lines in line_chunks(stream, name):
            yield from lines


def read_lines(source: str | Path | bytes, name: str | None = None) -> list[str]:
    """All the lines of the file at `source`, or of `source` given as bytes (see `iter_lines`)."""
    return list(iter_lines(source, name))


def count_lines(source: str | Path, name: str | None = None) -> int:
    """The number of lines of the file at `source`, after checking that it is all UTF-8 (`NotUTF8Error`
    otherwise), with memory bounded by one chunk."""
    with open(source, "rb") as stream:
        return sum(len(lines) for _, lines in line_chunks(stream, name or str(source)))


def arriving_chunks(
    stream: BinaryIO, name: str, max_lines: int, max_wait: float
) -> Iterator[tuple[int, list[str]]]:
    """(1-based number of the first line, lines) chunks of the binary `stream` as its lines arrive: a chunk
    ends at `max_lines` lines, or once `max_wait` seconds pass with no new line after at least one arrived,
    so that a pipe fed a line at a time gets each answered at once, and a file is read in full chunks.
    A thread reads ahead at most `max_lines` lines, so memory stays bounded whatever the stream's length.
    Lines are read as `line_chunks` reads them; text that is not UTF-8 raises `NotUTF8Error` when its
    chunk is reached."""
    arrived: queue.Queue = queue.Queue(maxsize=max_lines)
    finished = object()

    def read() -> None:
        try:
            for first, lines in line_chunks(stream, name, size=1):
                arrived.put((first, lines[0]))
        except NotUTF8Error as error:
            arrived.put(error)
        arrived.put(finished)

    threading.Thread(target=read, daemon=True, name=f"reading {name}").start()
    first, lines = 1, []
    while True:
        try:
            item = arrived.get(timeout=max_wait) if lines else arrived.get()
        except queue.Empty:
            yield first, lines
            first, lines = first + len(lines), []
            continue
        if isinstance(item, NotUTF8Error):
            if lines:
                yield first, lines
            raise item
        if item is finished:
            if lines:
                yield first, lines
            return
        lines.append(item[1])
        if len(lines) == max_lines:
            yield first, lines
            first, lines = first + len(lines), []


__all__ = [
    "NotUTF8Error",
    "arriving_chunks",
    "count_lines",
    "iter_lines",
    "line_chunks",
    "read_lines",
    "split_lines",
]
