"""Long segments as bounded work items, for engines that decode whole batches (CTranslate2, ONNX Runtime):
a segment that no sentence splitter can split (5,000 emoji, Chinese without punctuation) would hold such an
engine's batch, and every request behind it, for as long as it decodes. `pieces` cuts it into pieces of a
bounded number of tokens, each translated as a segment of its own, and `join_pieces` puts their
translations back together as `sentence_splitting.join_sentences` joins a paragraph's sentences.

A piece is a cut of the text, not a sentence: its translation is the model's translation of that span, and
the joined translation differs from translating the segment whole, which is what a model whose positions
are fewer than the segment's tokens cannot do anyway (it reads the first positions only).
"""

from collections.abc import Callable

from .hypotheses import Translation
from .sentence_splitting import join_sentences


def pieces(text: str, count_tokens: Callable[[str], int], max_tokens: int) -> list[str]:
    """`text` cut into pieces of at most `max_tokens` tokens each (`count_tokens` counts a piece's tokens as
    the model reads it, its end token included), in order, stripped. Each cut is at the white space
    nearest the middle of a piece that is too long, where its middle half has any, else at its middle
    character; a piece of one character is never cut further. `text` itself where it fits."""
    check_max_tokens(max_tokens)
    text = text.strip()
    if len(text) <= 1 or count_tokens(text) <= max_tokens:
        return [text] if text else []
    middle = _cut(text)
    return pieces(text[:middle], count_tokens, max_tokens) + pieces(text[middle:], count_tokens, max_tokens)


def check_max_tokens(max_tokens: int) -> None:
    """Refuse a bound on a piece's tokens that leaves no room for a token beside the end token."""
    if max_tokens < 2:
        raise ValueError(
            f"max_segment_tokens {max_tokens}: a piece needs room for a token and the end token; give 2 or "
            "more (0: never cut)."
        )


def _cut(text: str) -> int:
    """Where to cut `text` in two: the white space nearest its middle within its middle half, else the
    middle character."""
    middle = len(text) // 2
    quarter = max(1, len(text) // 4)
    for distance in range(quarter):
        for position in (middle - distance, middle + distance):
            if 0 < position < len(text) and text[position].isspace():
                return position
    return middle


def join_pieces(source: str, parts: list[Translation]) -> Translation:
    """The translation of the segment `source` from its pieces' translations `parts`, in order: for each
    rank that every piece has, the pieces' hypotheses of that rank joined as `join_sentences` joins
    sentences (texts by a space, tokens, log-probabilities and scores, alignments renumbered)."""
    truncated = any(part.truncated for part in parts)
    parts = [part for part in parts if part.hypotheses]  # a piece with nothing to translate adds nothing
    if not parts:
        return Translation(source, [], truncated)
    ranks = min(len(part.hypotheses) for part in parts)
    joined = [
        join_sentences(
            source, [Translation(part.source, [part.hypotheses[rank]], part.truncated) for part in parts]
        )
        for rank in range(ranks)
    ]
    return Translation(source, [translation.hypotheses[0] for translation in joined], truncated)


__all__ = ["check_max_tokens", "join_pieces", "pieces"]
