"""What a finished training run reports (Section 6.1): its final model's BLEU on the dev and test sets with
the paper's beam search, the length penalty chosen on the dev set where the recipe asks for it (the paper's
alpha was "chosen after experimentation on the development set"), the test BLEU computed the paper's way
too, the first test translations, the summary box printed at the end, and what `results.json` records of it
all, with no local path that would mean nothing elsewhere (`results_record`)."""

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging

from ..evaluation.metrics import BleuResult, corpus_bleu, paper_bleu
from ..evaluation.tuning import DEFAULT_LENGTH_PENALTIES, DecodingChoice, search_decoding
from ..inference.translator import Translator

SAMPLES = 5

logger = logging.get_logger(__name__)

# Source sentences and their references, line for line.
Texts = tuple[Sequence[str], Sequence[str]]


def _scored(
    translator: Translator, texts: Texts, num_beams: int, batch_size: int
) -> tuple[BleuResult, list[str]]:
    sources, references = texts
    hypotheses = translator.translate(sources, batch_size=batch_size, progress=True, num_beams=num_beams)
    return corpus_bleu(hypotheses, references), hypotheses


def _log_bleu(name: str, bleu: BleuResult, sentences: int, decoding: DecodingChoice) -> None:
    logger.info(f"{name} BLEU {bleu.score:.2f} ({sentences} sentences, {decoding}) {bleu.signature}")


def final_scores(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    dev: Texts | None,
    test: Texts | None,
    *,
    test_set: str | None,
    num_beams: int,
    batch_size: int,
    tune_length_penalty: bool,
    target_language: str | None = None,
) -> dict[str, Any]:
    """Translate the dev and test sets (either may be None) with `model`'s generation config and beam size
    `num_beams`, and score them with sacreBLEU; `test_set` names the test set in the results. Given the
    `target_language`, the test translations are also scored the paper's way (`metrics.paper_bleu`:
    tokenized, German compounds split), as `paper_bleu` and `paper_bleu_signature`.

    With `tune_length_penalty` (and a dev set), the dev set is translated once per length penalty of
    `tuning.DEFAULT_LENGTH_PENALTIES` and the best is written into `model.generation_config`, so that the
    test set, and every later translation with the model once saved, decode with it. The test set plays no
    part in the choice; the dev BLEU reported is the best alpha's, so it is no longer a score on unseen data.
    """
    translator = Translator(model=model, tokenizer=tokenizer, target_tokenizer=None, engine="torch")
    results: dict[str, Any] = {"num_beams": num_beams}
    if dev is not None:
        # Without tuning, a search over the model's own alpha alone: one dev pass, scored the same way.
        alphas = (
            DEFAULT_LENGTH_PENALTIES if tune_length_penalty else (model.generation_config.length_penalty,)
        )
        search = search_decoding(translator, *dev, [num_beams], alphas, batch_size=batch_size, progress=True)
        for choice, bleu in search.bleu.items():
            _log_bleu("dev", bleu, len(dev[0]), choice)
        if search.best.length_penalty is not None:
            model.generation_config.length_penalty = search.best.length_penalty
        if tune_length_penalty:
            results["dev_bleu_by_length_penalty"] = {
                f"{choice.length_penalty:g}": bleu.score for choice, bleu in search.bleu.items()
            }
            logger.info(f"Length penalty {search.best.length_penalty:g} chosen on the dev set.")
        bleu = search.bleu[search.best]
        results.update(dev_bleu=bleu.score, dev_bleu_signature=bleu.signature)
    results["length_penalty"] = model.generation_config.length_penalty
    if test is not None:
        bleu, hypotheses = _scored(translator, test, num_beams, batch_size)
        decoding = DecodingChoice.of(num_beams, model.generation_config.length_penalty)
        _log_bleu("test", bleu, len(test[0]), decoding)
        results.update(test_set=test_set, test_sentences=len(test[0]), bleu=bleu.score)
        results["bleu_signature"] = bleu.signature
        if target_language is not None:
            tokenized = paper_bleu(hypotheses, test[1], target_language)
            results.update(paper_bleu=tokenized.score, paper_bleu_signature=tokenized.signature)
            logger.info(f"test BLEU the paper's way {tokenized.score:.2f} {tokenized.signature}")
        results["samples"] = [
            {"source": source, "reference": reference, "translation": hypothesis}
            for source, reference, hypothesis in zip(*test, hypotheses[:SAMPLES])
        ]
    return results


def format_summary(results: dict[str, Any]) -> str:
    """The end-of-run summary box of a run's results: speed, dev and test scores, a few samples."""
    loss = f"  |  train loss {results['train_loss']:.4f}" if results.get("train_loss") is not None else ""
    lines = [
        "",
        "=" * 72,
        f"steps {results['steps']}  |  {results['train_seconds']} s of training  |  "
        f"{results['target_tokens_per_second']} target tokens/s{loss}",
    ]
    if "early_stopping" in results:
        lines.append(early_stopping_summary(results["early_stopping"], results["steps"]))
    dev = [f"dev loss {results['dev_loss']}"] if "dev_loss" in results else []
    dev += [f"dev BLEU {results['dev_bleu']:.2f}"] if "dev_bleu" in results else []
    if "dev_bleu_by_length_penalty" in results:
        dev.append(f"length penalty {results['length_penalty']:g}, chosen on dev")
    if dev:
        lines.append("  |  ".join(dev))
    if "bleu" in results:
        lines.append(f"test BLEU {results['bleu']:.2f}  ({results['test_set']})  {results['bleu_signature']}")
    if "paper_bleu" in results:
        lines.append(
            f"test BLEU the paper's way {results['paper_bleu']:.2f}  {results['paper_bleu_signature']}"
        )
    for sample in results.get("samples", [])[:3]:
        lines += [
            f"  src: {sample['source']}",
            f"  ref: {sample['reference']}",
            f"  hyp: {sample['translation']}",
        ]
    lines += [f"model saved in {results['model_dir']}", "=" * 72]
    return "\n".join(lines)


def early_stopping_summary(record: dict[str, Any], steps: int) -> str:
    """One line on a run's early stopping (`early_stopping.early_stopping_record`): whether the patience ran
    out, and which step's checkpoint, the best, is the final model."""
    metric, patience = record["metric"], record["patience"]
    if record["best_step"] is None:
        return (
            f"no dev evaluation to stop early on (patience {patience}): the final model is the last weights"
        )
    score = record["best_score"]
    best = f"the final model is step {record['best_step']}'s checkpoint, the best {metric} {score:.4g}"
    if record["stopped_early"]:
        return f"stopped early at step {steps} ({patience} dev evaluations without a better {metric}): {best}"
    return f"never {patience} dev evaluations in a row without a better {metric}: {best}"


# The results that name data or folders: where local, `results_record` records them relative to the run.
DATA_KEYS = ("dataset", "test_set")
MODEL_DIR_KEY = "model_dir"


def is_local_path(name: str) -> bool:
    """Whether `name` is a local file, folder or file prefix (`corpus/train` for `corpus/train.en`) rather
    than a `datasets` name such as `wmt14` or `bentrevett/multi30k`: an absolute path, a path that exists,
    or one whose folder exists (where that is not the current folder)."""
    path = Path(name)
    return path.is_absolute() or path.exists() or (path.parent != Path(".") and path.parent.is_dir())


def run_relative_name(name: str, run_dir: str | Path) -> str:
    """`name` as `results.json` records it: a local path relative to the run folder `run_dir`, starting
    with `./` or `../` (so that it cannot be read as a `datasets` name), and a `datasets` name as it is.

    A path on another drive than the run (Windows) has no relative form: its last part alone is recorded."""
    if not is_local_path(name):
        return name
    path, run = Path(name).resolve(), Path(run_dir).resolve()
    try:
        relative = Path(os.path.relpath(path, run)).as_posix()
    except ValueError:
        return f"./{path.name}"
    return relative if relative.startswith("../") or relative == ".." else f"./{relative}"


def results_record(results: dict[str, Any], run_dir: str | Path) -> dict[str, Any]:
    """What `results.json` records of a run's `results`, which the model's folder carries wherever it is
    published: its training and test data (`DATA_KEYS`) and its model folder named relative to the run
    folder `run_dir` (`run_relative_name`), never by an absolute path of this machine."""
    record = dict(results)
    for key in (*DATA_KEYS, MODEL_DIR_KEY):
        if record.get(key) is not None:
            record[key] = run_relative_name(str(record[key]), run_dir)
    return record
