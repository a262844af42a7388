"""The README, docs/ and benchmarks/RESULTS.md describe the product, not how it came to be: no sessions,
numbered changes, issues or commit hashes (that history lives in git log)."""

import re
from pathlib import Path

import pytest
from conftest import REPO_ROOT

DOCUMENTS = sorted(
    [REPO_ROOT / "README.md", *(REPO_ROOT / "benchmarks").glob("*.md"), *(REPO_ROOT / "docs").rglob("*.md")]
)
HISTORY = {
    "a session": re.compile(r"\bsessions? (?:\d|[IVX]+\b)", re.IGNORECASE),
    "a numbered change": re.compile(r"\bchanges? #?\d+", re.IGNORECASE),
    "an issue or pull request": re.compile(r"\b(?:issues?|PR|pull request) ?#?\d+|#\d{2,}\b", re.IGNORECASE),
    "a commit hash": re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b"),
    "an earlier state": re.compile(
        r"\b(?:an earlier run|before this change|at the final code)\b", re.IGNORECASE
    ),
}


def history_mentions(text: str) -> list[str]:
    """'kind: matched text' for every mention of development history in `text`."""
    return [
        f"{kind}: {match.group(0)!r}" for kind, pattern in HISTORY.items() for match in pattern.finditer(text)
    ]


@pytest.mark.parametrize(
    "text",
    [
        "Run of session 6, final code.",
        "Session 5's figures",
        "change 14 made it faster",
        "Changes 12-13 cut memory",
        "the performance issue #3",
        "see issue 12",
        "Code: commit d288612 plus the preset",
        "the state at 4c5afd0e1b2c3d4e5f60718293a4b5c6d7e8f901",
        "an earlier run gave 4.75",
    ],
)
def test_history_is_recognised(text: str) -> None:
    assert history_mentions(text)


@pytest.mark.parametrize(
    "text",
    [
        "chat_session(model, tokenizer) answers until quit",
        "an interactive chat session: 'quit' or Ctrl-D ends it",
        "vanilla-transformer chatbot chat --model runs/chatbot_ko",
        "sacreBLEU signature nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0",
        "newstest2014, 4096 x 32000 logits, 1e-9, bf16, avx512_bf16",
        "test BLEU 37.35 on test_2016_flickr (1000 sentences)",
    ],
)
def test_product_text_is_not_taken_for_history(text: str) -> None:
    assert history_mentions(text) == []


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(REPO_ROOT)))
def test_documents_speak_of_the_product_only(document: Path) -> None:
    assert history_mentions(document.read_text(encoding="utf-8")) == []
