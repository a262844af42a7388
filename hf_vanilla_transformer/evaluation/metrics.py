"""BLEU for translation quality (Vaswani et al., 2017, Section 6.1, Table 2), and sacreBLEU's chrF and TER
beside it.

Two BLEU scores, which are NOT comparable with each other:

* `corpus_bleu`: detokenized sacreBLEU (Post, 2018), the standard today. Hypotheses and references are
  plain text; sacreBLEU tokenizes both itself (13a by default) and the returned signature records every
  setting, so the number is reproducible. It is computed by the package's `evaluate` metric
  (`SACREBLEU_METRIC`), loaded by path so that it works offline.
* `tokenized_bleu`: an approximation of the tokenized BLEU behind the paper's 27.3 / 28.4 (EN-DE), the
  recipe an author gave in tensor2tensor issue #61 and `get_ende_bleu.sh`: Moses-tokenize, split hyphenated
  compounds into `rich ##AT##-##AT## text`, then `multi-bleu.perl`. A correctly translated compound then
  matches three tokens instead of one; tensor2tensor issue #317 reports about +0.7 to +1 BLEU from the
  splitting on newstest2014. Use it only to compare with papers that report tokenized BLEU.
* `paper_bleu`: that recipe for a given target language, with Moses' own tokenizer rules (sacremoses, the
  Python port of `tokenizer.perl`) where sacremoses is installed, and compound splitting for German only,
  as `get_ende_bleu.sh` applies it to its German output.

Two more of sacreBLEU's corpus metrics, on the same detokenized text and with its signatures:

* `corpus_chrf`: chrF (Popovic, 2015), the F-score of character n-grams, or chrF++ (Popovic, 2017) with word
  bigrams as well; it credits partly right word forms, which matters for a morphologically rich target such
  as German.
* `corpus_ter`: TER (Snover et al., 2006), the edits per 100 reference words that turn the hypothesis into
  the reference (lower is better), case-insensitive by default as in sacreBLEU.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import cache, partial
from pathlib import Path

import evaluate
from sacrebleu.metrics import BLEU, CHRF, TER
from sacrebleu.metrics.base import Metric, Score

SACREBLEU_METRIC = str(Path(__file__).with_name("sacrebleu_metric.py"))
"""Path of the package's corpus sacreBLEU metric, for `evaluate.load(SACREBLEU_METRIC)`: loaded by path, it
needs no network."""

# tensor2tensor's get_ende_bleu.sh: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'. Matches do not overlap,
# exactly as in perl, so "a-b-c" becomes "a ##AT##-##AT## b-c".
_COMPOUND_HYPHEN = re.compile(r"(\S)-(\S)")

# What `tokenized_bleu` takes for Moses' tokenizer (`tokenizer.perl`) instead of a sacreBLEU tokenizer.
MOSES = "moses"
# The target languages whose compounds `paper_bleu` splits: `get_ende_bleu.sh` is written for German output.
COMPOUND_SPLIT_LANGUAGES = frozenset({"de"})


@dataclass(frozen=True)
class BleuResult:
    """A corpus BLEU score with the settings that produced it.

    Attributes:
        score: BLEU on a 0-100 scale.
        signature: sacreBLEU signature; for `tokenized_bleu` prefixed with the pre-tokenization applied.
        precisions: modified n-gram precisions (0-100) for n = 1..4.
        brevity_penalty: the brevity penalty factor.
        hyp_len: total hypothesis length in tokens.
        ref_len: total reference length in tokens.
    """

    score: float
    signature: str
    precisions: tuple[float, ...]
    brevity_penalty: float
    hyp_len: int
    ref_len: int

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def __str__(self) -> str:
        precisions = "/".join(f"{p:.1f}" for p in self.precisions)
        return (
            f"BLEU = {self.score:.2f} {precisions} (BP = {self.brevity_penalty:.3f} "
            f"hyp_len = {self.hyp_len} ref_len = {self.ref_len})"
        )


def _validated(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[list[str], list[str]]:
    """Return both sides as lists after checking they are non-empty, aligned sequences of strings."""
    for name, lines in (("hypotheses", hypotheses), ("references", references)):
        # Iterating a single string would score it character by character.
        if isinstance(lines, str):
            raise TypeError(f"{name} must be a sequence of strings, one per segment, not a single str.")
    hyps, refs = list(hypotheses), list(references)
    if not hyps or not refs:
        raise ValueError(f"Empty input: {len(hyps)} hypotheses and {len(refs)} references.")
    if len(hyps) != len(refs):
        raise ValueError(
            f"Got {len(hyps)} hypotheses but {len(refs)} references; they must be aligned one to one."
        )
    for name, lines in (("hypotheses", hyps), ("references", refs)):
        bad = next((i for i, line in enumerate(lines) if not isinstance(line, str)), None)
        if bad is not None:
            raise TypeError(f"{name}[{bad}] is {type(lines[bad]).__name__}, expected str.")
    return hyps, refs


def _result(score: dict[str, object], signature: str) -> BleuResult:
    """A `BleuResult` from the figures of a sacreBLEU score (the `SacreBleu` metric's output names)."""
    return BleuResult(
        score=score["score"],
        signature=signature,
        precisions=tuple(score["precisions"]),
        brevity_penalty=score["bp"],
        hyp_len=score["sys_len"],
        ref_len=score["ref_len"],
    )


@cache
def _sacrebleu_metric() -> evaluate.EvaluationModule:
    # Loading copies and imports the module once; keep_in_memory spares every score a cache file on disk.
    return evaluate.load(SACREBLEU_METRIC, keep_in_memory=True)


def corpus_bleu(
    hypotheses: Sequence[str], references: Sequence[str], *, tokenize: str = "13a", lowercase: bool = False
) -> BleuResult:
    """Detokenized corpus BLEU with sacreBLEU against a single reference per segment.

    Args:
        hypotheses: detokenized system outputs, one per segment.
        references: detokenized references, aligned with `hypotheses`.
        tokenize: sacreBLEU tokenizer ("13a" is its default and WMT's; "intl", "zh", "ko-mecab", ...).
        lowercase: case-insensitive BLEU, for comparison with results reported on lowercased text; the
            signature then says `case:lc`.

    Raises:
        ValueError: empty input or different numbers of hypotheses and references.
        TypeError: a single string or a non-string segment was given.
    """
    hyps, refs = _validated(hypotheses, references)
    score = _sacrebleu_metric().compute(
        predictions=hyps, references=refs, tokenize=tokenize, lowercase=lowercase
    )
    return _result(score, score["signature"])


def split_compounds(tokenized: str) -> str:
    """Rewrite `rich-text` as `rich ##AT##-##AT## text`, as tensor2tensor's `get_ende_bleu.sh` does."""
    return _COMPOUND_HYPHEN.sub(r"\1 ##AT##-##AT## \2", tokenized)


def moses_available() -> bool:
    """Whether sacremoses, which `tokenize=MOSES` needs, is installed."""
    return importlib.util.find_spec("sacremoses") is not None


def moses_tokenize(line: str, language: str) -> str:
    """`line` tokenized as `tokenizer.perl -l LANGUAGE` tokenizes it with its defaults (sacremoses): the
    language's non-breaking prefixes, no aggressive hyphen splitting, and `&`, `|`, `<`, `>`, `'`, `"`, `[`
    and `]` escaped as HTML entities.

    Raises:
        ImportError: sacremoses is not installed.
    """
    return _moses_tokenizer(language)(line)


@cache
def _moses_tokenizer(language: str) -> Callable[[str], str]:
    try:
        from sacremoses import MosesTokenizer
    except ImportError:
        raise ImportError(
            "Moses tokenization needs sacremoses: pip install sacremoses (or use tokenize='13a')."
        ) from None
    return partial(MosesTokenizer(lang=language).tokenize, return_str=True, escape=True)


def _pretokenizer(tokenize: str, language: str | None) -> tuple[Callable[[str], str], str]:
    """The pre-tokenization of `tokenized_bleu` and its name in the signature."""
    if tokenize != MOSES:
        return BLEU(tokenize=tokenize).tokenizer, tokenize
    if language is None:
        raise ValueError("Moses tokenization follows the text's language: give language='de', 'fr', ...")
    return _moses_tokenizer(language), f"{MOSES}-{language}"


def tokenized_bleu(
    hypotheses: Sequence[str],
    references: Sequence[str],
    compound_split: bool = True,
    *,
    tokenize: str = "13a",
    lowercase: bool = False,
    language: str | None = None,
) -> BleuResult:
    """Paper-style tokenized BLEU (Section 6.1), approximating tensor2tensor's `get_ende_bleu.sh`.

    Exactly what it does, on both hypotheses and references:

    1. tokenizes each line with sacreBLEU's `tokenize` tokenizer ("13a", the mteval-v13a rules, or
       "intl"), standing in for Moses' `tokenizer.perl -l de`; the two differ on apostrophes, HTML
       escaping, non-breaking prefixes and a few symbols. `tokenize=MOSES` applies Moses' own rules for
       `language` instead (`moses_tokenize`). Moses' `replace-unicode-punctuation.perl` is not applied;
    2. if `compound_split`, applies `split_compounds`: every `-` with a non-space character on both sides
       becomes ` ##AT##-##AT## `;
    3. computes corpus BLEU on whitespace-split tokens without smoothing, as `multi-bleu.perl` does
       (sacreBLEU with `tokenize="none"`, `smooth_method="none"`): case-sensitive, or with `lowercase`
       case-insensitive, as `multi-bleu.perl -lc`.

    The score is not comparable with sacreBLEU's detokenized `corpus_bleu`: it depends on the tokenizer
    and on compound splitting, which usually inflates it. The signature begins with
    `tokenized|pretok:...|compound:...` so the two cannot be confused.

    Args:
        hypotheses: detokenized system outputs, one per segment.
        references: detokenized references, aligned with `hypotheses`.
        compound_split: apply the `##AT##` compound splitting of step 2.
        tokenize: sacreBLEU tokenizer used for step 1, or `MOSES`.
        lowercase: case-insensitive BLEU in step 3.
        language: the language of the text, which Moses' rules follow (with `tokenize=MOSES` only).

    Raises:
        ValueError: empty input, different numbers of hypotheses and references, or `MOSES` without a
            language.
        TypeError: a single string or a non-string segment was given.
        ImportError: `MOSES` without sacremoses installed.
    """
    hyps, refs = _validated(hypotheses, references)
    pretokenizer, pretokenized_by = _pretokenizer(tokenize, language)

    def prepare(line: str) -> str:
        tokens = pretokenizer(line)
        return split_compounds(tokens) if compound_split else tokens

    # force=True: the input is tokenized on purpose, so sacreBLEU's "forgot to detokenize?" warning is noise.
    metric = BLEU(tokenize="none", smooth_method="none", force=True, lowercase=lowercase)
    score = metric.corpus_score([prepare(h) for h in hyps], [[prepare(r) for r in refs]])
    signature = (
        f"tokenized|pretok:{pretokenized_by}|compound:{'atat' if compound_split else 'no'}|"
        f"{metric.get_signature()}"
    )
    # A BLEUScore's attributes have the names of the metric's figures.
    return _result(vars(score), signature)


def paper_bleu(hypotheses: Sequence[str], references: Sequence[str], target_language: str) -> BleuResult:
    """The paper's BLEU (Section 6.1, Table 2) as tensor2tensor's `get_ende_bleu.sh` computes it: both sides
    tokenized by Moses' rules for `target_language` (`moses_tokenize`; sacreBLEU's 13a where sacremoses is
    not installed, which the signature then says), hyphenated compounds split into `##AT##-##AT##` for a
    German target (`COMPOUND_SPLIT_LANGUAGES`), and case-sensitive `multi-bleu.perl` BLEU on the tokens
    (`tokenized_bleu`). Not comparable with sacreBLEU's `corpus_bleu`.

    Raises:
        ValueError: empty input or different numbers of hypotheses and references.
        TypeError: a single string or a non-string segment was given.
    """
    return tokenized_bleu(
        hypotheses,
        references,
        compound_split=target_language in COMPOUND_SPLIT_LANGUAGES,
        tokenize=MOSES if moses_available() else "13a",
        language=target_language,
    )


@dataclass(frozen=True)
class MetricResult:
    """A corpus score of one of sacreBLEU's other metrics (chrF, chrF++, TER) with its signature.

    Attributes:
        name: the score's name as sacreBLEU prints it: "chrF2", "chrF2++" or "TER".
        score: on a 0-100 scale; higher is better for chrF, lower for TER (edits per 100 reference words).
        signature: sacreBLEU's signature of the settings, e.g. "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|...".
    """

    name: str
    score: float
    signature: str

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.name} = {self.score:.2f}"


def _scored_by(metric: Metric, hypotheses: Sequence[str], references: Sequence[str]) -> MetricResult:
    """`metric`'s corpus score of the checked input against a single reference per segment."""
    hyps, refs = _validated(hypotheses, references)
    score: Score = metric.corpus_score(hyps, [refs])
    return MetricResult(name=score.name, score=score.score, signature=str(metric.get_signature()))


def corpus_chrf(
    hypotheses: Sequence[str], references: Sequence[str], *, word_order: int = 0, lowercase: bool = False
) -> MetricResult:
    """Corpus chrF with sacreBLEU's defaults (character n-grams up to 6, beta 2, whitespace ignored) against
    a single reference per segment.

    Args:
        hypotheses: detokenized system outputs, one per segment.
        references: detokenized references, aligned with `hypotheses`.
        word_order: word n-grams counted as well: 0 for chrF, 2 for chrF++.
        lowercase: case-insensitive chrF; the signature then says `case:lc`.

    Raises:
        ValueError: empty input or different numbers of hypotheses and references.
        TypeError: a single string or a non-string segment was given.
    """
    return _scored_by(CHRF(word_order=word_order, lowercase=lowercase), hypotheses, references)


def corpus_ter(
    hypotheses: Sequence[str], references: Sequence[str], *, case_sensitive: bool = False
) -> MetricResult:
    """Corpus TER with sacreBLEU's defaults (tercom's tokenization and shifts, case-insensitive) against a
    single reference per segment: the edits, shifts included, per 100 reference words.

    Args:
        hypotheses: detokenized system outputs, one per segment.
        references: detokenized references, aligned with `hypotheses`.
        case_sensitive: count a change of case as an edit; the signature then says `case:mixed`.

    Raises:
        ValueError: empty input or different numbers of hypotheses and references.
        TypeError: a single string or a non-string segment was given.
    """
    return _scored_by(TER(case_sensitive=case_sensitive), hypotheses, references)
