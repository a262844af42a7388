"""Corpus sacreBLEU (Post, 2018) as an `evaluate` metric, for the BLEU scores of Section 6.1.

Self-contained so that `evaluate.load` can copy and import it on its own: load it by path,
`evaluate.load(hf_vanilla_transformer.evaluation.metrics.SACREBLEU_METRIC)`, which needs no network.
"""

import datasets
import evaluate
from sacrebleu.metrics import BLEU

_CITATION = """\
@inproceedings{post-2018-call,
    title = "A Call for Clarity in Reporting {BLEU} Scores",
    author = "Post, Matt",
    booktitle = "Proceedings of the Third Conference on Machine Translation: Research Papers",
    year = "2018",
    publisher = "Association for Computational Linguistics",
    url = "https://www.aclweb.org/anthology/W18-6319",
    pages = "186--191",
}
"""

_DESCRIPTION = """\
Detokenized corpus BLEU computed by sacreBLEU against one reference per segment. sacreBLEU tokenizes
hypotheses and references itself, and the signature it returns records every setting of the score.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: detokenized system outputs, one string per segment.
    references: detokenized references, one string per segment, aligned with `predictions`.
    tokenize: sacreBLEU tokenizer, "13a" (its default and WMT's), "intl", "zh", "ko-mecab", ...
    lowercase: case-insensitive BLEU; the signature then says "case:lc".
Returns:
    score: BLEU on a 0-100 scale.
    signature: sacreBLEU's signature of the settings, e.g. "nrefs:1|case:mixed|eff:no|tok:13a|...".
    precisions: modified n-gram precisions (0-100) for n = 1..4.
    bp: brevity penalty.
    sys_len: total hypothesis length in tokens.
    ref_len: total reference length in tokens.
Example:
    >>> bleu = evaluate.load(SACREBLEU_METRIC)
    >>> bleu.compute(predictions=["a cat sat on the mat"], references=["a cat sat on the mat"])["score"]
    100.00000000000004
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class SacreBleu(evaluate.Metric):
    """Corpus sacreBLEU with a single reference per segment."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Value("string")}
            ),
            codebase_urls=["https://github.com/mjpost/sacrebleu"],
            reference_urls=["https://aclanthology.org/W18-6319"],
        )

    def _compute(
        self, predictions: list[str], references: list[str], tokenize: str = "13a", lowercase: bool = False
    ) -> dict:
        bleu = BLEU(tokenize=tokenize, lowercase=lowercase)
        score = bleu.corpus_score(predictions, [references])
        return {
            "score": score.score,
            "signature": str(bleu.get_signature()),
            "precisions": list(score.precisions),
            "bp": score.bp,
            "sys_len": score.sys_len,
            "ref_len": score.ref_len,
        }
