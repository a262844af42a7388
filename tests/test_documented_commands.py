"""What the README, docs/, benchmarks/RESULTS.md and the model cards show runs as shown: every command uses
options that its command has, and the README's Python example runs from start to end. A renamed or removed
flag or function is found here, not by a reader whose copied code fails."""

import argparse
import os
import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from conftest import REPO_ROOT, run_scripts_in_one_interpreter

from hf_vanilla_transformer.commands import COMMANDS, command_module

DOCUMENTS = sorted(
    path
    for path in REPO_ROOT.rglob("*.md")
    if not {".venv", "runs", "build", ".git", "node_modules"} & set(path.relative_to(REPO_ROOT).parts)
)
COMMAND_START = re.compile(
    r"(?:vanilla-transformer|python -m hf_vanilla_transformer) (?P<command>[a-z]+)"
    r"|python (?P<script>benchmarks/[a-z_]+\.py)"
)
# What ends a command inside a line of shell: a pipe, a list, a redirection or a comment.
SHELL_END = re.compile(r"\s(?:\||;|&&|>|<|#)\s|`")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`([^`]+)`")
INDENTED_BLOCK = re.compile(r"(?:^    .*(?:\n|$))+", re.MULTILINE)


def code_segments(text: str) -> list[str]:
    """The shell text of a Markdown document: fenced blocks, indented blocks and inline code spans, with
    backslash-continued lines joined and an inline span's line breaks read as spaces."""
    segments = [block for block in FENCE.findall(text)]
    prose = FENCE.sub("", text)
    segments += INDENTED_BLOCK.findall(prose)
    segments += [span.replace("\n", " ") for span in INLINE_CODE.findall(prose)]
    return [segment.replace("\\\n", " ") for segment in segments]


def commands_in(segment: str) -> list[tuple[str, str]]:
    """(program, command text) for every command in a segment of shell text; a command runs to the end
    of its line, to a pipe, list, redirection or comment, or to the next command."""
    found = []
    for line in segment.splitlines():
        starts = list(COMMAND_START.finditer(line))
        ends = [following.start() for following in starts[1:]] + [len(line)]
        for start, end in zip(starts, ends, strict=False):  # no command in the line: no end either
            program = start.group("command") or start.group("script")
            found.append((program, SHELL_END.split(line[start.end() : end])[0]))
    return found


def documented_commands() -> list[tuple[str, str, str]]:
    """(document, program, command text) for every command shown in the documents."""
    return [
        (str(document.relative_to(REPO_ROOT)), program, text)
        for document in DOCUMENTS
        for segment in code_segments(document.read_text(encoding="utf-8"))
        for program, text in commands_in(segment)
    ]


def flags_in(text: str) -> set[str]:
    """The long options a command text uses (placeholders and optional brackets around them allowed)."""
    words = shlex.split(text.replace("[", " ").replace("]", " "), posix=True)
    return {word.split("=")[0] for word in words if re.fullmatch(r"--[a-z][a-z0-9-]*(=.*)?", word)}


def parser_options(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of an argparse parser and of its subcommands' parsers."""
    options = {option for action in parser._actions for option in action.option_strings}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                options |= parser_options(subparser)
    return options


@cache
def helps_of_scripts() -> dict[str, str]:
    """The `--help` of every script of its own (benchmarks/) that the documents show, by its path."""
    scripts = sorted({program for _, program, _ in COMMANDS_SHOWN} - set(COMMANDS))
    ran = run_scripts_in_one_interpreter([REPO_ROOT / script for script in scripts], "--help")
    for path, run in ran.items():
        assert run["status"] in (0, None), f"{path} --help: {run['status']}: {run['stderr'][-2000:]}"
    return {script: ran[REPO_ROOT / script]["stdout"] for script in scripts}


@cache
def known_options(program: str) -> frozenset[str]:
    """The options that `program` (a subcommand, or a script of benchmarks/) accepts."""
    if program in COMMANDS:
        return frozenset(parser_options(command_module(program).build_parser()))
    # Scripts of their own: ask them, as a reader would.
    return frozenset(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", helps_of_scripts()[program]))


COMMANDS_SHOWN = documented_commands()


def test_the_documents_show_commands() -> None:
    programs = {program for _, program, _ in COMMANDS_SHOWN}
    assert {"train", "translate", "export", "push", "chatbot"} <= programs, programs


@pytest.mark.parametrize("program", sorted({program for _, program, _ in COMMANDS_SHOWN}))
def test_every_documented_flag_exists(program: str) -> None:
    unknown = sorted(
        f"{document}: {flag} in `{' '.join(text.split())}`"
        for document, shown, text in COMMANDS_SHOWN
        if shown == program
        for flag in flags_in(text) - known_options(program) - {"--help"}
    )
    assert unknown == [], "\n".join(unknown)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("--model runs/demo/model --input test.en", {"--model", "--input"}),
        (
            "--model DIR [--src-lang en --tgt-lang de] [--shortlist-size 100]",
            {"--model", "--src-lang", "--tgt-lang", "--shortlist-size"},
        ),
        ("--model-override d_model=128 --bf16=true", {"--model-override", "--bf16"}),
    ],
)
def test_flags_are_read_from_command_text(text: str, expected: set[str]) -> None:
    assert flags_in(text) == expected


def test_a_command_ends_at_a_pipe_and_a_new_command_starts_its_own() -> None:
    segment = (
        "echo x | vanilla-transformer translate --model m > out.de && vanilla-transformer evaluate "
        "--hypotheses out.de  # --not-a-flag\npython benchmarks/bench_data.py --quick"
    )
    shown = [(program, flags_in(text)) for program, text in commands_in(segment)]
    assert shown == [
        ("translate", {"--model"}),
        ("evaluate", {"--hypotheses"}),
        ("benchmarks/bench_data.py", {"--quick"}),
    ]


def test_code_is_read_from_blocks_and_inline_spans_with_continued_lines() -> None:
    text = (
        "Run\n\n    vanilla-transformer train \\\n        --preset cpu\n\n"
        "then `vanilla-transformer\naverage --last 5`.\n"
    )
    segments = code_segments(text)
    shown = [(program, flags_in(text)) for segment in segments for program, text in commands_in(segment)]
    assert shown == [("train", {"--preset"}), ("average", {"--last"})]


def test_the_readme_python_example_runs(tmp_path: Path) -> None:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    example = re.search(r"^```python\n(.*?)^```", readme, re.MULTILINE | re.DOTALL).group(1)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", example], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "my-transformer" / "config.json").is_file()
    printed = result.stdout.strip().splitlines()[-1]  # after the tokenizer trainer's own output
    assert printed == "['Ein Hund rennt.']", result.stdout  # the example's training pair, learned
