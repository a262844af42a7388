"""Long segments cut into bounded work items (`inference.long_segments`): every piece within the bound,
nothing lost or reordered, cuts at white space where there is any; and the pieces' translations joined
rank by rank as a paragraph's sentences are."""

import pytest

from hf_vanilla_transformer.inference.hypotheses import Hypothesis, Translation
from hf_vanilla_transformer.inference.long_segments import join_pieces, pieces


def words_and_end(text: str) -> int:
    """Tokens of a word-level model: one a word, and the end token."""
    return len(text.split()) + 1


def characters_and_end(text: str) -> int:
    """Tokens of a model that reads one token a character (emoji, CJK), and the end token."""
    return len(text) + 1


@pytest.mark.parametrize("limit", [2, 3, 8, 50])
def test_a_text_of_words_is_cut_at_white_space_within_the_bound(limit: int) -> None:
    text = " ".join(f"word{index}" for index in range(97))
    cut = pieces(text, words_and_end, limit)
    assert all(words_and_end(piece) <= limit for piece in cut)
    assert " ".join(cut) == text  # every cut at a space: no word split, none lost
    assert len(cut) < 2 * 97 / (limit - 1) + 1  # pieces are not needlessly small


@pytest.mark.parametrize("limit", [2, 5, 64])
def test_a_text_without_white_space_is_cut_between_characters(limit: int) -> None:
    text = "\N{GRINNING FACE}\N{SNOWMAN}" * 150
    cut = pieces(text, characters_and_end, limit)
    assert all(characters_and_end(piece) <= limit for piece in cut)
    assert "".join(cut) == text


def test_a_text_that_fits_is_one_piece_and_a_blank_one_none() -> None:
    assert pieces("  a short one ", words_and_end, 8) == ["a short one"]
    assert pieces("   ", words_and_end, 8) == []
    with pytest.raises(ValueError, match="max_segment_tokens 1"):
        pieces("a b c", words_and_end, 1)


def test_pieces_are_joined_rank_by_rank_with_their_scores() -> None:
    parts = [
        Translation(
            "a b", [Hypothesis("A B", ["A", "B"], -1.0, -0.5), Hypothesis("A C", ["A", "C"], -2.0, -1.0)]
        ),
        Translation("", []),  # a piece with nothing to translate adds nothing
        Translation("c", [Hypothesis("C", ["C"], -0.5, -0.25), Hypothesis("D", ["D"], -0.75, -0.5)], True),
    ]
    joined = join_pieces("a b c", parts)
    assert [h.text for h in joined.hypotheses] == ["A B C", "A C D"]
    assert [h.tokens for h in joined.hypotheses] == [["A", "B", "C"], ["A", "C", "D"]]
    assert [h.log_prob for h in joined.hypotheses] == [-1.5, -2.75]
    assert [h.score for h in joined.hypotheses] == [-0.75, -1.5]
    assert joined.source == "a b c" and joined.truncated
    assert join_pieces("x", [Translation("x", [])]).hypotheses == []
