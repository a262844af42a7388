"""The package's one line reader (`text_lines`), and its callers: the commands' input files (`cli`) and the
parallel data (`data`) read a file into the same lines."""

import gzip
import io
import re

import pytest

from hf_vanilla_transformer.common import cli
from hf_vanilla_transformer.common.text_lines import (
    NotUTF8Error,
    iter_lines,
    line_chunks,
    read_lines,
    split_lines,
)
from hf_vanilla_transformer.training import data

TEXT = "\ufeffone\u2028still one\r\ntwo\n\nfour\r\n"
LINES = ["one\u2028still one", "two", "", "four"]


@pytest.mark.parametrize(
    ("text", "lines"),
    [
        (TEXT, LINES),
        (TEXT.replace("\r\n", "\n"), LINES),
        ("a\nb", ["a", "b"]),
        ("a\nb\n", ["a", "b"]),
        ("\n", [""]),
        ("", []),
        ("tab\there\x0cform feed\x85next line\n", ["tab\there\x0cform feed\x85next line"]),
        ("a\ufeff\n\ufeffb\n", ["a\ufeff", "\ufeffb"]),  # only the mark that starts the file is dropped
    ],
)
def test_lines(tmp_path, text, lines):
    path = tmp_path / "text.txt"
    path.write_bytes(text.encode("utf-8"))
    assert read_lines(path) == list(iter_lines(path)) == read_lines(text.encode("utf-8")) == lines


def test_chunks_number_their_first_line():
    stream = io.BytesIO("\ufeffa\r\nb\nc\nd\ne".encode())
    assert list(line_chunks(stream, "text", size=2)) == [(1, ["a", "b"]), (3, ["c", "d"]), (5, ["e"])]


def test_text_that_is_not_utf8_names_the_file_the_line_and_the_byte(tmp_path):
    path = tmp_path / "latin1.en"
    path.write_bytes(b"ok\nfine\nd\xe9j\xe0\n")
    for size in (1, 2, 10):
        with path.open("rb") as stream, pytest.raises(NotUTF8Error) as error:
            list(line_chunks(stream, str(path), size=size))
        assert (error.value.name, error.value.line, error.value.byte) == (str(path), 3, 9)
    expected = f"{path}, line 3: not valid UTF-8 (invalid continuation byte at byte 9)"
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}"):
        read_lines(path)


def test_every_caller_reads_the_same_lines(tmp_path):
    path = tmp_path / "text.en"
    path.write_bytes(TEXT.encode("utf-8"))
    gz = tmp_path / "text.en.gz"
    gz.write_bytes(gzip.compress(TEXT.encode("utf-8")))
    assert cli.input_lines(str(path), "--input", cli.ArgumentParser()) == LINES
    for file in (path, gz):
        assert [line for _, lines in data._read_lines(file) for line in lines] == LINES


def test_a_form_text_splits_as_a_file_reads_but_keeps_its_last_line_break(tmp_path):
    """A form's text splits where a file's lines end, each line as the file reader gives it; a final line
    break starts one more, empty line, so that translating line by line and joining keeps it."""
    text = TEXT.removeprefix("\ufeff")
    assert split_lines(text) == [*read_lines(text.encode("utf-8")), ""]
    assert "\n".join(split_lines(text)) == text.replace("\r\n", "\n")
    assert split_lines("no break") == read_lines(b"no break")
