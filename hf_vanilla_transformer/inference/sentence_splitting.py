"""Translating paragraphs: each input line split into sentences, the sentences translated, and each line's
translations put back together.

A model trained on single sentences translates a paragraph given as one input badly: past the first
sentence or two the output drops or repeats text. `split_sentences` splits with pysbd (Sadvilkar and
Neumann, 2020), a rule-based sentence boundary detector with abbreviation and number rules for 22 languages,
and `join_sentences` makes one `Translation` of the line from its sentences' translations: the texts joined
by a space, the log-probabilities and scores added, and the word alignments renumbered to the line's words;
`joined_n_best` joins the n best of each sentence rank by rank, as LibreTranslate's alternatives are made.
"""

from collections.abc import Iterable
from dataclasses import replace

import pysbd

from .blank import is_blank
from .hypotheses import Hypothesis, Translation

SPLITTER_LANGUAGES = tuple(sorted(pysbd.languages.LANGUAGE_CODES))


def check_language(language: str) -> None:
    """Refuse a language the splitter has no rules for."""
    if language not in SPLITTER_LANGUAGES:
        raise ValueError(
            f"Sentence splitting knows no language {language!r}: choose the input's language among "
            f"{', '.join(SPLITTER_LANGUAGES)} (ISO 639-1 codes)."
        )


def check_n_best(n_best: int) -> None:
    """Refuse more than one hypothesis for a text split into sentences: its translation is one `Translation`
    joined from each sentence's best (`join_sentences`), with tokens, scores and alignments, which the
    sentences' n-best lists do not combine into. Texts alone combine: LibreTranslate's alternatives are
    joined rank by rank (`joined_n_best`)."""
    if n_best != 1:
        raise ValueError(
            f"n_best {n_best} with sentence splitting: a text split into sentences is translated as its "
            "sentences' best translations joined, one hypothesis; ask for n_best 1, or translate single "
            "sentences."
        )


def split_sentences(text: str, language: str = "en") -> list[str]:
    """The sentences of `text` in order, stripped, blank ones (`blank.is_blank`) left out. A fresh segmenter
    each call: pysbd's keeps the text it works on, so one shared by concurrent calls would mix them."""
    check_language(language)
    segmenter = pysbd.Segmenter(language=language, clean=False)
    return [sentence.strip() for sentence in segmenter.segment(text) if not is_blank(sentence)]


def join_sentences(source: str, parts: list[Translation]) -> Translation:
    """The translation of the line `source` from the best translations of its sentences `parts`, in order:
    texts joined by a space, tokens concatenated, log-probabilities and scores added (None where a part has
    none), word alignments renumbered by the words before each part, and the attention matrices placed on
    the diagonal of the line's (a target word attends to the words of its own sentence only)."""
    best = [part.hypotheses[0] for part in parts]
    text = _joined_text(hypothesis.text for hypothesis in best)
    tokens = [token for hypothesis in best for token in hypothesis.tokens]
    log_prob = _total([hypothesis.log_prob for hypothesis in best])
    score = _total([hypothesis.score for hypothesis in best])
    joined = Hypothesis(text=text, tokens=tokens, log_prob=log_prob, score=score)
    if best and all(hypothesis.alignment is not None for hypothesis in best):
        joined = _joined_alignment(joined, best)
    return Translation(source, [joined], truncated=any(part.truncated for part in parts))


def joined_n_best(lines: list[list[Translation]], n_best: int) -> list[str]:
    """The `n_best` translations of a text, best first, from the n-best translations of the sentences of
    each of its `lines`, as argos-translate (LibreTranslate's engine) joins them: the k-th joins every
    sentence's k-th best, the sentences of a line by a space and the lines by a line break."""
    return [
        "\n".join(_joined_text(sentence.hypotheses[rank].text for sentence in line) for line in lines)
        for rank in range(n_best)
    ]


def _joined_text(sentences: Iterable[str]) -> str:
    """A line's translation from its sentences' translations: joined by a space, empty ones left out."""
    return " ".join(text for text in sentences if text)


def _total(values: list[float | None]) -> float | None:
    return None if any(value is None for value in values) else sum(values)


def _joined_alignment(joined: Hypothesis, parts: list[Hypothesis]) -> Hypothesis:
    source_words = [word for part in parts for word in part.source_words]
    target_words = [word for part in parts for word in part.target_words]
    pairs, rows = [], []
    source_offset = target_offset = 0
    for part in parts:
        for pair in part.alignment.split():
            source, target = map(int, pair.split("-"))
            pairs.append(f"{source + source_offset}-{target + target_offset}")
        for row in part.attention:
            rows.append(
                [0.0] * source_offset
                + row
                + [0.0] * (len(source_words) - source_offset - len(part.source_words))
            )
        source_offset += len(part.source_words)
        target_offset += len(part.target_words)
    return replace(
        joined,
        alignment=" ".join(pairs),
        source_words=source_words,
        target_words=target_words,
        attention=rows,
    )


__all__ = [
    "SPLITTER_LANGUAGES",
    "check_language",
    "check_n_best",
    "join_sentences",
    "joined_n_best",
    "split_sentences",
]
