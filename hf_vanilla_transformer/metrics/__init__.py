"""`evaluate` metric modules shipped with the package, loaded by path so that they work offline."""

from pathlib import Path

SACREBLEU_METRIC = str(Path(__file__).with_name("sacrebleu_metric.py"))
"""Path of the corpus sacreBLEU metric, for `evaluate.load(SACREBLEU_METRIC)`."""

__all__ = ["SACREBLEU_METRIC"]
