"""Scoring translations against references: sacreBLEU's BLEU, chrF and TER with their signatures and the
paper's tokenized BLEU (`metrics`, with the `evaluate` metric `sacrebleu_metric`), and the length penalty
chosen on a dev set as the paper chose it (`tuning`, Section 6.1)."""
