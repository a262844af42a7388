"""The paper's BLEU (`metrics.paper_bleu`, tensor2tensor's get_ende_bleu.sh): Moses tokenization, German
compounds split into ##AT##-##AT##, multi-bleu.perl's BLEU, on examples worked out by hand from those
definitions."""

import math

import pytest

from hf_vanilla_transformer.evaluation import metrics
from hf_vanilla_transformer.evaluation.metrics import moses_tokenize, paper_bleu, tokenized_bleu

needs_moses = pytest.mark.skipif(not metrics.moses_available(), reason="sacremoses is not installed")


@needs_moses
@pytest.mark.parametrize(
    ("line", "language", "tokens"),
    [
        # Punctuation split off; " escaped as tokenizer.perl escapes it.
        ('Er sagte: "Nein, danke!"', "de", "Er sagte : &quot; Nein , danke ! &quot;"),
        # A comma between digits stays; "Mio" is a German non-breaking prefix; the final period is split.
        ("Es kostet 1,5 Mio. Euro.", "de", "Es kostet 1,5 Mio. Euro ."),
        # English splits "n't" as "n 't" and escapes the apostrophe; hyphens are not split (no -a).
        ("I don't know well-known rules.", "en", "I don &apos;t know well-known rules ."),
    ],
)
def test_moses_tokenization_follows_tokenizer_perl_defaults(line, language, tokens):
    assert moses_tokenize(line, language) == tokens


def test_german_compounds_are_split_and_count_as_three_tokens():
    """'a b-c d' against 'a b-c e' splits into 5 tokens a side: 4/5 unigrams, 3/4 bigrams, 2/3 trigrams and
    1/2 four-grams match, equal lengths: BLEU = 100 (4/5 * 3/4 * 2/3 * 1/2) ** (1/4). Unsplit, 3 tokens a
    side leave no four-gram, and multi-bleu.perl's unsmoothed BLEU is 0."""
    assert paper_bleu(["a b-c d"], ["a b-c e"], "de").score == pytest.approx(100 * 0.2**0.25)
    assert paper_bleu(["a b-c d"], ["a b-c e"], "fr").score == 0.0


def test_brevity_penalty_as_multi_bleu():
    """Four of six reference tokens, all matching: every precision 1, BP = exp(1 - 6/4)."""
    assert paper_bleu(["a b c d"], ["a b c d e f"], "de").score == pytest.approx(100 * math.exp(-0.5))


@needs_moses
def test_moses_keeps_what_13a_splits():
    """Moses keeps the German abbreviation 'Mio.' one token, 13a splits its period: against 'Mio .' the
    hypothesis matches 4/5 unigrams, 2/4 bigrams, 1/3 trigrams and no four-gram under Moses (BLEU 0), and
    every n-gram under 13a (BLEU 100)."""
    hypothesis, reference = ["Es kostet 1,5 Mio. Euro"], ["Es kostet 1,5 Mio . Euro"]
    result = paper_bleu(hypothesis, reference, "de")
    assert result.score == 0.0 and result.precisions[:3] == pytest.approx((80.0, 50.0, 100 / 3))
    assert result.signature.startswith("tokenized|pretok:moses-de|compound:atat|")
    assert tokenized_bleu(hypothesis, reference, tokenize="13a").score == pytest.approx(100.0)


def test_without_sacremoses_13a_stands_in_and_the_signature_says_so(monkeypatch):
    monkeypatch.setattr(metrics, "moses_available", lambda: False)
    result = paper_bleu(["a b-c d"], ["a b-c e"], "de")
    assert result.signature.startswith("tokenized|pretok:13a|compound:atat|")
    assert result.score == pytest.approx(100 * 0.2**0.25)


def test_moses_tokenization_needs_a_language():
    with pytest.raises(ValueError, match="language"):
        tokenized_bleu(["a"], ["a"], tokenize=metrics.MOSES)
