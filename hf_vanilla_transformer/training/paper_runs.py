"""The paper's WMT 2014 runs of Table 2 (Vaswani et al., 2017): English-German with the base and the big
model, and English-French with the big model, each the `train` pipeline (`pipeline.run_training`) with the
settings the paper gives for it.

Every run takes its data from `datasets` (`wmt/wmt14`: training pairs, newstest2013 as the validation split
and newstest2014 as the test split) unless local files are given in their place; trains a shared BPE
vocabulary (Section 5.1) and the preset's model for its steps (Section 5.3; 100k for base, 300k for big);
averages the last 5 (base) or 20 (big) checkpoints (Section 6.1); chooses the length penalty for beam
search with beam 4 on newstest2013, as the paper chose alpha on the development set; and scores
newstest2014 with sacreBLEU and the paper's way (`evaluation.metrics.paper_bleu`: tokenized, German
compounds split). `PaperRun.values` gives a run's settings; `table2_comparison` sets its scores beside the
paper's.
"""

from dataclasses import dataclass, field
from typing import Any

# The `datasets` name of WMT 2014, whose configs are language pairs ("de-en", "fr-en").
WMT14 = "wmt/wmt14"


@dataclass(frozen=True)
class PaperRun:
    """One row of Table 2: the preset, the language pair, the `datasets` config that holds it, the paper's
    newstest2014 BLEU, and the settings of the run that differ from its preset (`train` setting names;
    model overrides as `KEY=VALUE` words, as `--model-override` takes them)."""

    title: str
    preset: str
    src_lang: str
    tgt_lang: str
    dataset_config: str
    paper_bleu: float
    settings: dict[str, Any] = field(default_factory=dict)
    model_overrides: tuple[str, ...] = ()

    def values(self, given: dict[str, Any]) -> dict[str, Any]:
        """The run's `train` settings: those `given` (None: not given) on top of the run's own. The run's
        model overrides come first, so that one given for the same key wins."""
        defaults = {
            "preset": self.preset,
            "train": WMT14,
            "dev": WMT14,
            "test": WMT14,
            "src_lang": self.src_lang,
            "tgt_lang": self.tgt_lang,
            "dataset_config": self.dataset_config,
            **self.settings,
        }
        values = {**given, **{key: value for key, value in defaults.items() if given.get(key) is None}}
        values["model_overrides"] = [*self.model_overrides, *(given.get("model_overrides") or [])]
        return values


PAPER_RUNS: dict[str, PaperRun] = {
    # Table 2: 27.3 BLEU; 100k steps, the last 5 checkpoints averaged (the `base` preset).
    "en-de-base": PaperRun("WMT14 English-German, Transformer (base)", "base", "en", "de", "de-en", 27.3),
    # Table 2: 28.4 BLEU; 300k steps, the last 20 checkpoints averaged (the `big` preset).
    "en-de-big": PaperRun("WMT14 English-German, Transformer (big)", "big", "en", "de", "de-en", 28.4),
    # Table 2: 41.8 BLEU. Section 5.1: a 32000-token vocabulary for English-French; Section 6.1: dropout 0.1
    # instead of big's 0.3.
    "en-fr-big": PaperRun(
        "WMT14 English-French, Transformer (big)",
        "big",
        "en",
        "fr",
        "fr-en",
        41.8,
        settings={"vocab_size": 32_000},
        model_overrides=("P_drop=0.1",),
    ),
}


def table2_comparison(run: PaperRun, results: dict[str, Any]) -> str:
    """A run's test scores (`pipeline.run_training`'s results) beside the paper's Table 2 figure."""
    lines = [f"{run.title}: Table 2 reports {run.paper_bleu} BLEU on newstest2014 (tokenized)."]
    if "bleu" not in results:
        lines.append("This run had no test set, so it has no score to compare.")
        return "\n".join(lines)
    lines += [
        f"This run, on {results['test_sentences']} sentences of {results['test_set']}:",
        f"  the paper's way (tokenized BLEU, as tensor2tensor's get_ende_bleu.sh): "
        f"{results['paper_bleu']:.2f}  {results['paper_bleu_signature']}",
        f"  sacreBLEU (detokenized; not comparable with Table 2): {results['bleu']:.2f}  "
        f"{results['bleu_signature']}",
        f"  beam {results['num_beams']}, length penalty {results['length_penalty']:g}"
        + (" chosen on the dev set" if "dev_bleu_by_length_penalty" in results else "")
        + f"; {len(results['averaged_checkpoints'])} checkpoints averaged",
    ]
    return "\n".join(lines)
