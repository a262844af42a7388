"""What a translation is besides its text: the n best hypotheses of one input, each with the log-probability
the model gives it, the score the beam search ranked it by, its subword tokens, and where asked its word
alignment to the input and the cross-attention behind it.

- `log_prob` is log P(y | x) = sum over t of log p(y_t | y_<t, x), the end token included: the total that
  `score` and forced decoding compute for the same output.
- `score` is what the beam search ranked by: `log_prob` divided by the length penalty of Section 6.1
  (Wu et al., 2016's ((5 + |Y|) / 6)^alpha, or transformers' |Y|^alpha), `log_prob` itself for greedy
  search and sampling.
- `alignment` is the Pharaoh format of Moses, fast_align and Marian: "i-j" pairs, i a 0-based source word
  and j a 0-based target word, words split at whitespace.
"""

import json
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Hypothesis:
    """One output for one input: its detokenized `text`, its target subword `tokens` (the end token left
    out), `log_prob` and `score` (see the module docstring), and with alignments asked for the `alignment`
    string, the `source_words` and `target_words` it numbers, and `attention`, one row per target word of
    its weights over the source words (each row sums to 1)."""

    text: str
    tokens: list[str] = field(default_factory=list)
    log_prob: float | None = None
    score: float | None = None
    alignment: str | None = None
    source_words: list[str] | None = None
    target_words: list[str] | None = None
    attention: list[list[float]] | None = None

    def to_dict(self) -> dict:
        """The JSON object of one hypothesis: text, score, log_prob, tokens, and alignment where there is
        one (the attention matrix stays out of the default output; `attention_dict` gives it)."""
        data = {"text": self.text, "score": self.score, "log_prob": self.log_prob, "tokens": self.tokens}
        if self.alignment is not None:
            data["alignment"] = self.alignment
        return data

    def attention_dict(self) -> dict | None:
        """The word-level attention as JSON: source words, target words, and the target-by-source weights."""
        if self.attention is None:
            return None
        return {
            "source_words": self.source_words,
            "target_words": self.target_words,
            "weights": self.attention,
        }


@dataclass(frozen=True)
class Translation:
    """The translations of one input `source`: its `hypotheses`, best first, and whether the input was
    `truncated` to the model's positions before it was translated (the output then covers its start only)."""

    source: str
    hypotheses: list[Hypothesis]
    truncated: bool = False

    @property
    def text(self) -> str:
        """The best hypothesis' text ("" for a blank input)."""
        return self.hypotheses[0].text if self.hypotheses else ""

    def to_dict(self) -> dict:
        """The JSON object of one input: `translations`, and `truncated` where it was."""
        data: dict = {"translations": [hypothesis.to_dict() for hypothesis in self.hypotheses]}
        if self.truncated:
            data["truncated"] = True
        return data


# How `translate` writes translations: the best one a line ("text"; with alignments, Marian's
# "translation ||| alignment"), Moses' n-best list ("tsv": "index ||| hypothesis ||| score ||| log_prob",
# then " ||| alignment" where asked; index 0-based), or one JSON object a line ("jsonl",
# `Translation.to_dict`).
OUTPUT_FORMATS = ("text", "tsv", "jsonl")


def format_translation(translation: Translation, index: int, output_format: str) -> str:
    """The lines, each ending in a newline, that `output_format` writes for the `index`-th input's
    `translation`."""
    if output_format == "jsonl":
        return json.dumps(translation.to_dict(), ensure_ascii=False) + "\n"
    if output_format == "text":
        best = translation.hypotheses[0]
        return best.text + (f" ||| {best.alignment}" if best.alignment is not None else "") + "\n"
    lines = []
    for hypothesis in translation.hypotheses:
        fields = [str(index), hypothesis.text, _number(hypothesis.score), _number(hypothesis.log_prob)]
        if hypothesis.alignment is not None:
            fields.append(hypothesis.alignment)
        lines.append(" ||| ".join(fields) + "\n")
    return "".join(lines)


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:.6f}"


__all__ = ["OUTPUT_FORMATS", "Hypothesis", "Translation", "format_translation"]
