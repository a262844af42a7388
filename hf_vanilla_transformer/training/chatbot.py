"""The Keras "Transformer Korean chatbot" tutorial, rebuilt on this package and `Seq2SeqTrainer`.

The tutorial trains a small Transformer on the Korean chit-chat corpus ChatbotData.csv (songys/Chatbot_data,
shipped inside the package in `chatbot_ko/`, which the repository's `data/chatbot_ko/` links to). Its steps
and where they live here:

1. Preprocessing: spaces around ? . ! , so that punctuation becomes its own token (`preprocess_sentence`).
2. Vocabulary: a subword vocabulary of about 2^13 tokens plus start and end tokens. Here a BPE vocabulary
   from `train_shared_bpe_tokenizer`, whose `<s>` and `</s>` play those roles.
3. MAX_LENGTH 40, counted with the start and end tokens, and post-padding. Here pairs with a side longer
   than 40 are dropped with a printed count, and each batch is padded on the right to its longest pair
   rather than every pair to 40, which gives the same loss for less computation.
4. The model: NUM_LAYERS 2, D_MODEL 256, NUM_HEADS 8, DFF 512, DROPOUT 0.1, the paper's architecture.
5. Training: Adam(0.9, 0.98, 1e-9) with the paper's learning-rate schedule, warmup 4000 (Section 5.3),
   batch 64, a loss and a token accuracy that ignore padding.
6. Inference: greedy decoding from the start token until the end token or MAX_LENGTH (`answer`).

Choices made here: the loss is a mean over real target tokens (padding left out of both the sum and the
count); 500 pairs are held out by default; accuracy is measured, with dropout off, both on a sample of the
training pairs (comparable to the accuracy the tutorial prints while training) and on the held-out pairs.
A checkpoint is saved at the end of every epoch, so that a run of the tutorial's 50 epochs (hours on a CPU)
can be resumed where it stopped; `chatbot_settings.json` records the settings it must be resumed with.
"""

import csv
import hashlib
import json
import random
import re
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch
from accelerate import PartialState
from datasets import Dataset
from transformers import (
    AutoModelForSeq2SeqLM,
    DataCollatorForSeq2Seq,
    EvalPrediction,
    GenerationConfig,
    PreTrainedTokenizerBase,
    Seq2SeqTrainer,
    set_seed,
)
from transformers.utils import logging

from .. import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from ..common.model_location import TRAINER_STATE_FILE, loading
from ..common.model_weights import load_pretrained
from ..common.text_lines import count_lines
from ..common.tokenization import load_tokenizer, train_shared_bpe_tokenizer
from .chatbot_settings import DEFAULT_DATA, SAMPLE_QUESTIONS, ChatbotSettings
from .loss import LabelSmoothedSeq2SeqTrainer
from .progress import TrainingClock, show_progress_lines, use_progress_bar
from .resume import (
    ResumeRule,
    check_same_model,
    check_unchanged,
    find_resume_checkpoint,
    read_run_record,
    write_run_record,
)
from .schedule import build_paper_optimizer, get_noam_schedule
from .trainer import training_arguments

logger = logging.get_logger(__name__)

# Accuracy on training pairs is measured on a fixed random sample of this many pairs, to keep evaluation
# as cheap as the held-out one.
TRAIN_SAMPLE_SIZE = 500

# Written into the output folder when a run starts: a resumed run must use the same settings.
SETTINGS_FILE = "chatbot_settings.json"
# Settings a resumed run may change: how long it goes on, how often it logs, how many checkpoints it keeps.
_MAY_CHANGE_ON_RESUME = frozenset(("epochs", "max_steps", "logging_steps", "keep_checkpoints"))
# What SETTINGS_FILE records of the corpus besides the settings (checked apart from them).
_CORPUS_KEYS = frozenset(("data", "data_sha256"))

_PUNCTUATION = re.compile(r"([?.!,])")
_SPACE_BEFORE_PUNCTUATION = re.compile(r" ([?.!,])")
_WHITESPACE = re.compile(r"\s+")


@dataclass
class ChatbotTrainingResult:
    """What `train_chatbot` returns: the trained model, its tokenizer and the measured numbers."""

    model: VanillaTransformerForConditionalGeneration
    tokenizer: PreTrainedTokenizerBase
    output_dir: Path
    metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0


def preprocess_sentence(sentence: str) -> str:
    """Tutorial step 1: put spaces around ? . ! , ("12시 땡!" -> "12시 땡 !").

    Runs of spaces are collapsed too (the tutorial leaves them), since a doubled space would become a
    token of its own under the Metaspace pre-tokenizer.
    """
    return _WHITESPACE.sub(" ", _PUNCTUATION.sub(r" \1 ", sentence)).strip()


def postprocess_answer(text: str) -> str:
    """Undo `preprocess_sentence` for display: "하루가 또 가네요 ." -> "하루가 또 가네요."."""
    return _SPACE_BEFORE_PUNCTUATION.sub(r"\1", text).strip()


def load_chatbot_pairs(
    path: str | Path = DEFAULT_DATA, limit: int | None = None
) -> tuple[list[str], list[str]]:
    """Read the Q and A columns of ChatbotData.csv (CRLF line endings, header Q,A,label), preprocessed. A
    row whose Q or A is missing or empty is refused with its line number."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"No chatbot corpus at {path}. The package ships it as chatbot_ko/ChatbotData.csv; "
            "pass its path (or another CSV with columns Q and A)."
        )
    # The one line reader checks the text first, so that text that is not UTF-8 is named by its line.
    count_lines(path)
    questions, answers = [], []
    # newline="" lets the csv module handle the CRLF line endings (and any newline inside a quoted field).
    with path.open(encoding="utf-8", newline="") as handle:
        try:
            # csv.reader rather than DictReader: it yields blank lines too, so a row's first line is known.
            reader = csv.reader(handle)
            header = next(reader, None)
            if header is None or not {"Q", "A"} <= set(header):
                raise ValueError(f"{path} must have a header with columns Q and A, got {header}.")
            columns = {"Q": header.index("Q"), "A": header.index("A")}
            first_line = reader.line_num + 1
            for row in reader:
                if limit is not None and len(questions) >= limit:
                    break
                if row:  # a blank line holds no row
                    question, answer = _corpus_pair(row, columns, path, first_line, reader.line_num)
                    questions.append(question)
                    answers.append(answer)
                first_line = reader.line_num + 1
        except csv.Error as error:
            # Mostly "field larger than field limit": a quote left open runs on through the rest of the file.
            raise ValueError(
                f"{path} line {first_line} cannot be read as CSV ({error}): is a quote left open?"
            ) from None
    if not questions:
        raise ValueError(f"{path} holds no question-answer pairs.")
    return questions, answers


def _corpus_pair(
    row: list[str], columns: dict[str, int], path: Path, first_line: int, last_line: int
) -> tuple[str, str]:
    """The preprocessed Q and A of a corpus row that starts at `first_line` and ends at `last_line`
    (`columns`: where each is in the row). A missing or empty one is refused: a pair without its question
    or its answer cannot be trained on, and leaving it out unsaid would train on less than the file holds."""
    texts = []
    for name, column in columns.items():
        text = preprocess_sentence(row[column]) if column < len(row) else None
        if not text:
            problem = f"no {name} field" if text is None else f"an empty {name} field"
            # A quote left open makes one field of everything up to the next quote, often the end of the file.
            runs_on = (
                f" (it runs on to line {last_line}: is a quote left open?)" if last_line > first_line else ""
            )
            raise ValueError(
                f"{path} line {first_line} has {problem}{runs_on}: every row needs a Q and an A."
            )
        texts.append(text)
    question, answer = texts
    return question, answer


def chatbot_generation_config(
    config: VanillaTransformerConfig, max_length: int, num_beams: int = 1
) -> GenerationConfig:
    """Tutorial step 6: greedy decoding (num_beams=1) from `<s>` until `</s>`, at most `max_length`
    decoder tokens (the start token included, as the tutorial counts)."""
    return GenerationConfig(
        num_beams=num_beams,
        do_sample=False,
        max_length=max_length,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        decoder_start_token_id=config.decoder_start_token_id,
    )


def build_chatbot_model(
    settings: ChatbotSettings, tokenizer: PreTrainedTokenizerBase
) -> VanillaTransformerForConditionalGeneration:
    """Tutorial step 4: the paper's base architecture at the tutorial's size, with its generation config."""
    config = VanillaTransformerConfig.from_preset(
        "base",
        vocab_size=len(tokenizer),
        N=settings.num_layers,
        d_model=settings.d_model,
        h=settings.num_heads,
        d_ff=settings.dff,
        P_drop=settings.dropout,
        max_position_embeddings=settings.max_length,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.bos_token_id,
    )
    model = VanillaTransformerForConditionalGeneration(config)
    model.generation_config = chatbot_generation_config(config, settings.max_length)
    return model


def _tokenize_and_filter(
    tokenizer: PreTrainedTokenizerBase, questions: list[str], answers: list[str], max_length: int
) -> Dataset:
    """Tutorial step 3. The tokenizer appends `</s>`; the decoder's `<s>` is added by the model when it
    shifts the labels, so a side fits when its ids plus that one start token are at most `max_length`."""
    # Overlong pairs are dropped below, so tokenizers' warning about them would only mislead.
    sources = tokenizer(questions, verbose=False)["input_ids"]
    targets = tokenizer(answers, verbose=False)["input_ids"]
    kept = [i for i, (s, t) in enumerate(zip(sources, targets)) if max(len(s), len(t)) + 1 <= max_length]
    print(
        f"Kept {len(kept):,} of {len(sources):,} pairs; dropped {len(sources) - len(kept):,} with a side "
        f"longer than MAX_LENGTH={max_length} tokens (start and end tokens included)."
    )
    if not kept:
        raise ValueError(
            f"No question-answer pair fits in max_length={max_length} tokens (start and end tokens "
            "included): raise max_length."
        )
    return Dataset.from_dict({"input_ids": [sources[i] for i in kept], "labels": [targets[i] for i in kept]})


def _hold_out(pairs: Dataset, settings: ChatbotSettings) -> tuple[Dataset, Dataset | None]:
    """The training pairs and the `ChatbotSettings.eval_size` held out from them (None when 0), drawn with the
    run's seed: `evaluate_held_out` draws the same ones again from a saved run's settings."""
    if settings.eval_size >= len(pairs):
        raise ValueError(f"eval_size={settings.eval_size} leaves no training pairs out of {len(pairs)}.")
    if settings.eval_size == 0:
        return pairs, None
    split = pairs.train_test_split(test_size=settings.eval_size, seed=settings.seed)
    return split["train"], split["test"]


def preprocess_logits_for_metrics(logits: torch.Tensor | tuple, labels: torch.Tensor) -> torch.Tensor:
    """Keep only the arg-max token of each position, so evaluation never stores vocabulary-sized logits."""
    if isinstance(logits, tuple):  # (logits, encoder_last_hidden_state)
        logits = logits[0]
    return logits.argmax(dim=-1)


def masked_token_accuracy(prediction: EvalPrediction) -> dict[str, float]:
    """Tutorial step 5's accuracy: the share of target tokens predicted right, padding (-100) excluded."""
    predictions, labels = np.asarray(prediction.predictions), np.asarray(prediction.label_ids)
    mask = labels != -100
    return {"accuracy": float((predictions[mask] == labels[mask]).mean())}


def _corpus_record(data_path: str | Path) -> dict[str, str]:
    """Which corpus a run reads: its path, and a digest of its contents that a moved copy still matches."""
    path = Path(data_path).resolve()
    return {"data": str(path), "data_sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def _check_same_corpus(recorded: dict[str, Any], corpus: dict[str, str], what: str) -> None:
    """Refuse another corpus (a `_corpus_record`) than the run's: other pairs would be held out, and batches
    skipped wrongly."""
    if "data_sha256" in recorded and recorded["data_sha256"] != corpus["data_sha256"]:
        raise ValueError(
            f"Cannot {what} on {corpus['data']}: the run was trained on {recorded['data']}, whose contents "
            f"differ. Give --data {recorded['data']} (or a copy of it)."
        )


# Resuming a chatbot run may change only how long it goes on, how often it logs and how many checkpoints it
# keeps; the corpus it recorded is checked apart, by its contents.
_RESUME_RULE = ResumeRule(_MAY_CHANGE_ON_RESUME, "other settings", "flags (", _CORPUS_KEYS)


def _record_or_check_settings(
    output_dir: Path, settings: ChatbotSettings, data_path: str | Path, resuming: bool
) -> None:
    """Record a new run's settings and corpus in `SETTINGS_FILE`; refuse to resume a run with other settings
    than it recorded (beyond how long it goes on) or on another corpus, since they would shape other
    batches, another vocabulary or another schedule than those it was trained with."""
    corpus = _corpus_record(data_path)
    current = {**asdict(settings), **corpus}
    recorded = read_run_record(output_dir, SETTINGS_FILE) if resuming else None
    if recorded is not None:
        _check_same_corpus(recorded, corpus, f"resume {output_dir}")
        check_unchanged(output_dir, recorded, current, _RESUME_RULE)
        return
    if resuming:
        logger.warning(
            f"{output_dir / SETTINGS_FILE} is missing: the resumed run's settings are recorded as given now."
        )
    write_run_record(output_dir, SETTINGS_FILE, current, PartialState())


def _start_chatbot_run(output_dir: Path, resume: bool) -> Path | None:
    """The checkpoint a run resumes from (None for a new one), with its progress lines shown on stdout; a
    folder that holds checkpoints (without `resume`) or a trained chatbot is refused."""
    state = PartialState()
    show_progress_lines(state.is_main_process, sys.stdout)
    checkpoint = find_resume_checkpoint(output_dir, resume, state)
    if checkpoint is None and (output_dir / "model.safetensors").is_file():
        raise FileExistsError(
            f"{output_dir} already holds a trained chatbot. Choose another --output-dir, or delete it first."
        )
    return checkpoint


def _read_corpus(
    output_dir: Path, data_path: str | Path, settings: ChatbotSettings, checkpoint: Path | None
) -> tuple[list[str], list[str]]:
    """Data stage, first half: the corpus's questions and answers, and the run's settings recorded (or, when
    resuming, checked against the record) once the corpus is known to read: a refused run leaves no
    settings behind."""
    questions, answers = load_chatbot_pairs(data_path, settings.limit)
    logger.info(f"Read {len(questions):,} question-answer pairs from {data_path}.")
    _record_or_check_settings(output_dir, settings, data_path, resuming=checkpoint is not None)
    return questions, answers


def _chatbot_tokenizer(
    questions: list[str],
    answers: list[str],
    settings: ChatbotSettings,
    checkpoint: Path | None,
    show_progress: bool,
) -> PreTrainedTokenizerBase:
    """Tokenizer stage: a new vocabulary trained on the corpus, or the run's own when resuming."""
    if checkpoint is None:
        tokenizer = train_shared_bpe_tokenizer(
            questions + answers,
            vocab_size=settings.vocab_size,
            model_max_length=settings.max_length,
            show_progress=show_progress,
        )
    else:
        tokenizer = load_tokenizer(checkpoint)
    logger.info(f"Subword vocabulary: {len(tokenizer):,} tokens (<s>, <pad>, </s>, <unk> included).")
    return tokenizer


def _chatbot_datasets(
    tokenizer: PreTrainedTokenizerBase, questions: list[str], answers: list[str], settings: ChatbotSettings
) -> tuple[Dataset, dict[str, Dataset]]:
    """Data stage, second half: the training pairs tokenized, and the evaluation sets: the held-out pairs
    (where any) and a fixed sample of the training pairs."""
    pairs, held_out = _hold_out(
        _tokenize_and_filter(tokenizer, questions, answers, settings.max_length), settings
    )
    eval_datasets = {} if held_out is None else {"held_out": held_out}
    sample = random.Random(settings.seed).sample(range(len(pairs)), min(TRAIN_SAMPLE_SIZE, len(pairs)))
    eval_datasets["train_sample"] = pairs.select(sample)
    return pairs, eval_datasets


def _chatbot_trainer(
    output_dir: Path,
    settings: ChatbotSettings,
    model: VanillaTransformerForConditionalGeneration,
    tokenizer: PreTrainedTokenizerBase,
    datasets: tuple[Dataset, dict[str, Dataset]],
    show_progress: bool,
) -> Seq2SeqTrainer:
    """Trainer stage: the shared training arguments with the tutorial's epochs (a checkpoint and an
    evaluation at the end of each), its batches of `batch_size` pairs, the paper's optimizer and schedule,
    and the runs' progress bar."""
    optimizer = build_paper_optimizer(model)
    scheduler = get_noam_schedule(optimizer, settings.d_model, settings.warmup_steps)
    args = training_arguments(
        output_dir,
        seed=settings.seed,
        eval_batch_size=settings.batch_size,
        keep_checkpoints=settings.keep_checkpoints,
        logging_steps=settings.logging_steps,
        report_to="none",
        per_device_train_batch_size=settings.batch_size,
        num_train_epochs=settings.epochs,
        max_steps=settings.max_steps,
        eval_strategy="epoch",
        logging_strategy="steps",
        save_strategy="epoch",
        # Pinned memory speeds up copies to a GPU; without one, pinning only prints a warning.
        dataloader_pin_memory=torch.cuda.is_available(),
        disable_tqdm=not show_progress,
    )
    train_dataset, eval_datasets = datasets
    trainer = LabelSmoothedSeq2SeqTrainer(
        model=model,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_datasets,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        processing_class=tokenizer,
        compute_metrics=masked_token_accuracy,
        preprocess_logits_for_metrics=preprocess_logits_for_metrics,
        optimizers=(optimizer, scheduler),
        label_smoothing=settings.label_smoothing,
    )
    use_progress_bar(trainer, TrainingClock())
    return trainer


def _train_and_save(
    trainer: Seq2SeqTrainer, checkpoint: Path | None, output_dir: Path
) -> tuple[dict[str, float], float]:
    """Finish stage: train (from `checkpoint` when resuming), save the chatbot in `output_dir`, and return
    the run's metrics (see `train_chatbot`) and its seconds of training."""
    steps_before = 0
    if checkpoint is not None:
        steps_before = json.loads((checkpoint / TRAINER_STATE_FILE).read_text())["global_step"]
    start = time.perf_counter()
    train_output = trainer.train(resume_from_checkpoint=None if checkpoint is None else str(checkpoint))
    seconds = time.perf_counter() - start
    metrics = {
        "train_steps": float(train_output.global_step),
        "updates_this_run": float(train_output.global_step - steps_before),
    }
    if steps_before < train_output.global_step:
        metrics["train_loss"] = train_output.training_loss
    # The Trainer also evaluates when max_steps cuts an epoch short: the last entries are the final weights.
    for entry in trainer.state.log_history:
        metrics.update({key: value for key, value in entry.items() if key.startswith("eval_")})
        if "loss" in entry:
            metrics["last_logged_loss"] = entry["loss"]
    trainer.save_model(str(output_dir))
    logger.info(f"Saved the chatbot to {output_dir} after {seconds:.0f} s of training.")
    return metrics, seconds


def train_chatbot(
    output_dir: str | Path,
    data_path: str | Path = DEFAULT_DATA,
    settings: ChatbotSettings | None = None,
    show_progress: bool = True,
    resume: bool = False,
) -> ChatbotTrainingResult:
    """Run the tutorial end to end and save a folder that `AutoModelForSeq2SeqLM`, `AutoTokenizer` and
    `load_chatbot` read: weights, config, tokenizer and a greedy generation config.

    Metrics (the Trainer prints them as it goes): `train_steps`, the updates of the whole run, and
    `updates_this_run`, those since it was resumed (all of them when it was not); `train_loss`, the mean
    training loss of this run's updates (absent when there were none); `last_logged_loss`, that of the last
    `logging_steps` updates; and, from the evaluation at the end of the last epoch,
    `eval_train_sample_loss` / `eval_train_sample_accuracy` on up to 500 training pairs and, when
    `ChatbotSettings.eval_size` > 0, `eval_held_out_loss` / `eval_held_out_accuracy` on unseen pairs.

    With `resume`, training goes on from the last complete checkpoint in `output_dir` (its weights,
    optimizer, schedule, data order and random state), with the run's own vocabulary; without it, a folder
    that holds checkpoints or a trained chatbot is refused rather than overwritten. A checkpoint from the
    end of an epoch resumes exactly; one where `max_steps` stopped the run within an epoch resumes on the
    right batches, but with other dropout masks: the Trainer evaluates at the stop, which draws from the
    random state the checkpoint saves.
    """
    settings = settings or ChatbotSettings()
    output_dir = Path(output_dir)
    checkpoint = _start_chatbot_run(output_dir, resume)
    set_seed(settings.seed)
    questions, answers = _read_corpus(output_dir, data_path, settings, checkpoint)
    tokenizer = _chatbot_tokenizer(questions, answers, settings, checkpoint, show_progress)
    datasets = _chatbot_datasets(tokenizer, questions, answers, settings)
    model = build_chatbot_model(settings, tokenizer)
    if checkpoint is not None:
        check_same_model(checkpoint, model.config)
    trainer = _chatbot_trainer(output_dir, settings, model, tokenizer, datasets, show_progress)
    metrics, seconds = _train_and_save(trainer, checkpoint, output_dir)
    return ChatbotTrainingResult(model.eval(), tokenizer, output_dir, metrics, seconds)


def load_chatbot(
    path: str | Path, **model_kwargs
) -> tuple[VanillaTransformerForConditionalGeneration, PreTrainedTokenizerBase]:
    """Load a folder written by `train_chatbot` with the Auto classes (extra kwargs go to the model)."""
    with loading(path):
        model = load_pretrained(AutoModelForSeq2SeqLM, path, **model_kwargs).eval()
        return model, load_tokenizer(path)


def _read_record(path: str | Path) -> dict[str, Any]:
    """What `SETTINGS_FILE` records of the run in `path`. Evaluating and chatting both go through here, so
    that a folder that is no chatbot run's (a translation model, a checkpoint) is refused alike."""
    recorded = read_run_record(Path(path), SETTINGS_FILE)
    if recorded is None:
        raise FileNotFoundError(
            f"{path} has no {SETTINGS_FILE}: give a folder that `vanilla-transformer chatbot train` wrote "
            "(its checkpoint-* subfolders have none)."
        )
    return recorded


def read_chatbot_settings(path: str | Path) -> ChatbotSettings:
    """The settings a chatbot folder was trained with, from its `SETTINGS_FILE`."""
    return _settings_from_record(_read_record(path), path)


def _settings_from_record(recorded: dict[str, Any], path: str | Path) -> ChatbotSettings:
    names = {setting.name for setting in fields(ChatbotSettings)}
    missing = sorted(names - recorded.keys())
    if missing:
        raise ValueError(
            f"{Path(path) / SETTINGS_FILE} lacks {', '.join(missing)}: it is not a chatbot run's."
        )
    return ChatbotSettings(**{name: recorded[name] for name in names})


@dataclass
class HeldOutEvaluation:
    """A trained chatbot on the pairs its run held out: teacher-forced loss and token accuracy (padding left
    out, as in training) and a few of its greedy answers beside the corpus's own."""

    pairs: int
    loss: float
    accuracy: float
    # (question, the corpus's answer, the chatbot's answer); the first two as the vocabulary reads them,
    # NFKC-normalized ("ㅠㅠ" becomes conjoining jamo), since they are decoded from the tokenized pairs.
    examples: list[tuple[str, str, str]]


@torch.no_grad()
def evaluate_held_out(
    path: str | Path, data_path: str | Path | None = None, num_examples: int = 5
) -> HeldOutEvaluation:
    """Draw again the pairs that the run in `path` held out (its recorded settings, its vocabulary, its
    corpus: `data_path`, by default the one it recorded) and measure the chatbot on them: questions it never
    saw in training. The loss is per target token (the Trainer's evaluation averages per-batch means)."""
    recorded = _read_record(path)
    settings = _settings_from_record(recorded, path)
    if data_path is None:
        data_path = recorded.get("data", DEFAULT_DATA)
    _check_same_corpus(recorded, _corpus_record(data_path), f"evaluate {path}")
    if settings.eval_size == 0:
        raise ValueError(f"{path} was trained on every pair (eval_size 0): it held none out to evaluate on.")
    if not (Path(path) / "config.json").is_file():
        raise FileNotFoundError(
            f"{path} holds no trained chatbot yet (the run stopped before its end?): finish it with "
            f"`vanilla-transformer chatbot train --output-dir {path} --resume`."
        )
    model, tokenizer = load_chatbot(path)
    questions, answers = load_chatbot_pairs(data_path, settings.limit)
    _, held_out = _hold_out(
        _tokenize_and_filter(tokenizer, questions, answers, settings.max_length), settings
    )
    collator = DataCollatorForSeq2Seq(tokenizer, model=model)
    loss_sum, correct, tokens = 0.0, 0, 0
    for start in range(0, len(held_out), settings.batch_size):
        batch = collator([held_out[i] for i in range(start, min(start + settings.batch_size, len(held_out)))])
        output = model(**batch.to(model.device))
        real = batch["labels"] != -100
        count = int(real.sum())
        # The model's loss is a mean over the batch's real target tokens; weighted back into a sum here.
        loss_sum += output.loss.item() * count
        correct += int((output.logits.argmax(-1) == batch["labels"])[real].sum())
        tokens += count
    examples = []
    for pair in held_out.select(range(min(num_examples, len(held_out)))):
        question = tokenizer.decode(pair["input_ids"], skip_special_tokens=True)
        reference = tokenizer.decode(pair["labels"], skip_special_tokens=True)
        examples.append(
            (postprocess_answer(question), postprocess_answer(reference), answer(model, tokenizer, question))
        )
    return HeldOutEvaluation(len(held_out), loss_sum / tokens, correct / tokens, examples)


@torch.no_grad()
def answer(
    model: VanillaTransformerForConditionalGeneration,
    tokenizer: PreTrainedTokenizerBase,
    question: str,
    num_beams: int = 1,
) -> str:
    """Tutorial step 6 (`predict`): preprocess the question like the training data, decode (greedy unless
    `num_beams` > 1, up to the saved generation config's max_length) and return the answer text."""
    inputs = tokenizer(preprocess_sentence(question), return_tensors="pt", truncation=True)
    output = model.generate(**inputs.to(model.device), num_beams=num_beams)
    return postprocess_answer(tokenizer.decode(output[0], skip_special_tokens=True))


def chat_session(
    model: VanillaTransformerForConditionalGeneration,
    tokenizer: PreTrainedTokenizerBase,
    lines: Iterable[str] | None = None,
    out: TextIO | None = None,
    num_beams: int = 1,
) -> None:
    """Answer each line of `lines` (default: standard input) on `out` (default: standard output) until end
    of input or a line `quit`."""
    # Looked up at call time, not bound as defaults, so redirected streams (tests, notebooks) are honoured.
    lines = sys.stdin if lines is None else lines
    out = sys.stdout if out is None else out
    print("Type a question (empty line skipped; 'quit' or Ctrl-D to leave).", file=out)
    print("> ", end="", file=out, flush=True)
    for line in lines:
        question = line.strip()
        if question == "quit":
            break
        if question:
            print(answer(model, tokenizer, question, num_beams), file=out)
        print("> ", end="", file=out, flush=True)
    print(file=out)


__all__ = [
    "DEFAULT_DATA",
    "SAMPLE_QUESTIONS",
    "SETTINGS_FILE",
    "ChatbotSettings",
    "ChatbotTrainingResult",
    "HeldOutEvaluation",
    "answer",
    "build_chatbot_model",
    "chat_session",
    "chatbot_generation_config",
    "evaluate_held_out",
    "load_chatbot",
    "load_chatbot_pairs",
    "masked_token_accuracy",
    "postprocess_answer",
    "preprocess_sentence",
    "read_chatbot_settings",
    "train_chatbot",
]
