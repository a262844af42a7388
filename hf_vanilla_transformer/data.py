"""Reading and tokenizing parallel data (Vaswani et al., 2017, Section 5.1: WMT 2014 English-German and
English-French sentence pairs).

Every reader returns a ``datasets.Dataset`` with two string columns, ``src`` and ``tgt``: that is what
``Dataset.map`` tokenizes (in parallel, cached) and what ``Seq2SeqTrainer`` consumes. Pairs with an empty side
are dropped with a printed count; nothing is dropped silently.

Text files are split on "\\n" only (a trailing "\\r" is removed): ``str.splitlines`` would also split on
U+2028, U+0085 and form feeds, which occur inside WMT sentences and would misalign the two sides.
"""

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import datasets
import pyarrow.compute as pc
from transformers import PreTrainedTokenizerBase

# ISO 639-1/639-3 language, optionally an ISO 3166 region: "en", "haw", "pt_BR".
_LANGUAGE_CODE = re.compile(r"[a-z]{2,3}(_[A-Z]{2})?")


def validate_language_code(code: str) -> str:
    """Check a language code such as Section 5.1's ``en``/``de``/``fr``: 2-3 lowercase letters, optionally
    ``_`` and a 2-letter region (``pt_BR``)."""
    if not isinstance(code, str) or not _LANGUAGE_CODE.fullmatch(code):
        raise ValueError(
            f"Invalid language code {code!r}: expected 2-3 lowercase letters, optionally followed by '_' and "
            "an uppercase region, e.g. 'en', 'de' or 'pt_BR'."
        )
    return code


def _report(message: str) -> None:
    print(message, file=sys.stderr)


def _read_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yield (1-based line number, line without its line ending) of a UTF-8 text file."""
    if not path.is_file():
        raise FileNotFoundError(f"Data file {path} does not exist; check the path.")
    if path.stat().st_size == 0:
        raise ValueError(f"Data file {path} is empty; it must hold one sentence (pair) per line.")
    # Binary iteration splits on b"\n" only (see the module docstring).
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"{path}, line {number}: not valid UTF-8 ({error}); re-encode the file."
                ) from None
            if number == 1:
                # Editors on Windows often start UTF-8 files with a byte-order mark; strip() keeps it.
                line = line.removeprefix("\ufeff")
            yield number, line.rstrip("\n").rstrip("\r")


def _pairs_to_dataset(sources: list[str], targets: list[str], origin: str) -> datasets.Dataset:
    """Strip whitespace, drop pairs with an empty side (reporting how many) and build the dataset."""
    kept_sources, kept_targets = [], []
    for source, target in zip(sources, targets, strict=True):
        source, target = source.strip(), target.strip()
        if source and target:
            kept_sources.append(source)
            kept_targets.append(target)
    dropped = len(sources) - len(kept_sources)
    if dropped:
        _report(f"Dropped {dropped} of {len(sources)} pairs from {origin}: empty source or target line.")
    if not kept_sources:
        raise ValueError(f"{origin} contains no sentence pair with both sides non-empty.")
    return datasets.Dataset.from_dict({"src": kept_sources, "tgt": kept_targets})


def read_text_pair(src_path: str | Path, tgt_path: str | Path) -> datasets.Dataset:
    """Read two line-aligned plain-text files, one sentence per line (the WMT format of Section 5.1)."""
    src_path, tgt_path = Path(src_path), Path(tgt_path)
    sources = [line for _, line in _read_lines(src_path)]
    targets = [line for _, line in _read_lines(tgt_path)]
    if len(sources) != len(targets):
        raise ValueError(
            f"The parallel files are not line-aligned: {src_path} has {len(sources)} lines but {tgt_path} "
            f"has {len(targets)}. Each line of one file must translate the same line of the other."
        )
    return _pairs_to_dataset(sources, targets, f"{src_path} / {tgt_path}")


def read_tsv(path: str | Path) -> datasets.Dataset:
    """Read a TSV file with one ``source<TAB>target`` sentence pair (Section 5.1) per line."""
    path = Path(path)
    sources, targets = [], []
    for number, line in _read_lines(path):
        fields = line.split("\t")
        if len(fields) != 2:
            raise ValueError(
                f"{path}, line {number}: expected 2 tab-separated fields (source, target), found "
                f"{len(fields)}. Remove extra tabs or columns."
            )
        sources.append(fields[0])
        targets.append(fields[1])
    return _pairs_to_dataset(sources, targets, str(path))


def read_jsonl(
    path: str | Path,
    src_key: str = "src",
    tgt_key: str = "tgt",
    src_lang: str | None = None,
    tgt_lang: str | None = None,
) -> datasets.Dataset:
    """Read sentence pairs (Section 5.1) from JSON Lines, one object per line.

    Objects are ``{src_key: ..., tgt_key: ...}`` or, when both languages are given, may use the ``datasets``
    translation layout ``{"translation": {"en": ..., "de": ...}}``.
    """
    path = Path(path)
    use_translation = src_lang is not None and tgt_lang is not None
    if use_translation:
        validate_language_code(src_lang)
        validate_language_code(tgt_lang)
    sources, targets = [], []
    for number, line in _read_lines(path):
        if not line.strip():
            sources.append("")
            targets.append("")
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}, line {number}: invalid JSON ({error.msg}).") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}, line {number}: expected a JSON object, found {type(record).__name__}.")
        if use_translation and isinstance(record.get("translation"), dict):
            record, keys, where = record["translation"], (src_lang, tgt_lang), "language"
        else:
            keys, where = (src_key, tgt_key), "key"
        for key in keys:
            if key not in record:
                hint = (
                    "Pass languages that the file contains."
                    if where == "language"
                    else "Pass the right src_key/tgt_key, or both languages for the 'translation' layout."
                )
                raise ValueError(
                    f"{path}, line {number}: no {where} {key!r}; available: {sorted(record)}. {hint}"
                )
            if not isinstance(record[key], str):
                raise ValueError(
                    f"{path}, line {number}: {where} {key!r} holds {type(record[key]).__name__}, "
                    "not a string."
                )
        sources.append(record[keys[0]])
        targets.append(record[keys[1]])
    return _pairs_to_dataset(sources, targets, str(path))


def load_hub_pairs(
    name: str, config: str, src_lang: str, tgt_lang: str, split: str = "train"
) -> datasets.Dataset:
    """Load a ``datasets`` translation dataset such as Section 5.1's wmt14 / de-en (needs network or a cache).

    The config name of translation datasets lists its two languages ("de-en"); both requested languages must
    be among them, which is checked before anything is downloaded.
    """
    validate_language_code(src_lang)
    validate_language_code(tgt_lang)
    if src_lang == tgt_lang:
        raise ValueError(f"Source and target language are both {src_lang!r}; pass two different languages.")
    config_languages = config.split("-")
    for language in (src_lang, tgt_lang):
        if language not in config_languages:
            raise ValueError(
                f"Language {language!r} is not part of {name} config {config!r} (languages: "
                f"{', '.join(config_languages)}). Pick a config that contains both {src_lang} and {tgt_lang}."
            )
    try:
        dataset = datasets.load_dataset(name, config, split=split)
    except ConnectionError as error:
        raise ConnectionError(
            f"Could not load {name} ({config}, split {split!r}): {error}. Without network access, download "
            "the data elsewhere and pass local files (two text files, TSV or JSONL)."
        ) from error
    if "translation" not in dataset.column_names:
        raise ValueError(
            f"{name} ({config}) has columns {dataset.column_names}, not the 'translation' column of a "
            "translation dataset; export it to TSV or JSONL and read that instead."
        )
    feature = dataset.features["translation"]
    if isinstance(feature, datasets.Translation):
        for language in (src_lang, tgt_lang):
            if language not in feature.languages:
                raise ValueError(
                    f"Language {language!r} is not in {name} ({config}); it has {feature.languages}."
                )
    before = len(dataset)
    dataset = dataset.map(
        lambda batch: {
            "src": [pair[src_lang].strip() for pair in batch["translation"]],
            "tgt": [pair[tgt_lang].strip() for pair in batch["translation"]],
        },
        batched=True,
        remove_columns=dataset.column_names,
    )
    dataset = dataset.filter(
        lambda batch: [bool(s and t) for s, t in zip(batch["src"], batch["tgt"], strict=True)], batched=True
    )
    if len(dataset) < before:
        _report(
            f"Dropped {before - len(dataset)} of {before} pairs from {name} ({config}, {split}): empty side."
        )
    if len(dataset) == 0:
        raise ValueError(
            f"{name} ({config}, split {split!r}) contains no sentence pair with both sides non-empty."
        )
    return dataset


def load_parallel_data(
    source: str | Path,
    target: str | Path | None = None,
    *,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
    src_key: str = "src",
    tgt_key: str = "tgt",
    config: str | None = None,
    split: str = "train",
) -> datasets.Dataset:
    """Read the parallel data of Section 5.1 from whatever ``source`` names, as ``src``/``tgt`` columns.

    - ``source`` and ``target``: two line-aligned text files;
    - ``source`` a ``.tsv`` / ``.jsonl`` file: see ``read_tsv`` / ``read_jsonl``;
    - ``source`` a prefix such that ``{source}.{src_lang}`` and ``{source}.{tgt_lang}`` exist
      (``data/multi30k/train`` with ``en``/``de``): those two text files;
    - otherwise, with ``config``: a ``datasets`` name such as ``wmt14`` with config ``de-en``.
    """
    for language in (src_lang, tgt_lang):
        if language is not None:
            validate_language_code(language)
    if target is not None:
        return read_text_pair(source, target)
    path = Path(source)
    if path.is_file():
        if path.suffix == ".tsv":
            return read_tsv(path)
        if path.suffix == ".jsonl":
            return read_jsonl(path, src_key, tgt_key, src_lang, tgt_lang)
        raise ValueError(
            f"{path} is a single file but neither .tsv nor .jsonl; for plain text pass the target-side file "
            "too, or a prefix P such that P.<src_lang> and P.<tgt_lang> exist."
        )
    if src_lang is not None and tgt_lang is not None:
        src_file, tgt_file = Path(f"{source}.{src_lang}"), Path(f"{source}.{tgt_lang}")
        if src_file.is_file() or tgt_file.is_file():
            return read_text_pair(src_file, tgt_file)
    if config is not None:
        if src_lang is None or tgt_lang is None:
            raise ValueError(f"Loading {source} ({config}) needs both src_lang and tgt_lang.")
        return load_hub_pairs(str(source), config, src_lang, tgt_lang, split)
    raise FileNotFoundError(
        f"{source} is not a file"
        + (f", nor are {source}.{src_lang} / {source}.{tgt_lang}" if src_lang and tgt_lang else "")
        + ". Pass an existing .tsv/.jsonl file, two text files, a prefix with both languages, or a datasets "
        "name with its config (e.g. wmt14 with config de-en)."
    )


def tokenize_pairs(
    dataset: datasets.Dataset,
    tokenizer: PreTrainedTokenizerBase,
    max_source_length: int,
    max_target_length: int,
    long_pairs: Literal["filter", "truncate"] = "filter",
    num_proc: int | None = None,
) -> datasets.Dataset:
    """Tokenize ``src`` into ``input_ids``/``attention_mask`` and ``tgt`` into ``labels`` (Section 5.1).

    Lengths include the ``</s>`` that the tokenizer's post-processor appends. Pairs longer than the limits
    are dropped (``long_pairs="filter"``) or cut to the limits keeping the final ``</s>``
    (``"truncate"``); either way their number is printed. The text columns are removed, so the result can
    go straight to ``DataCollatorForSeq2Seq`` and ``TokenBudgetBatchSampler.from_dataset``.
    """
    if long_pairs not in ("filter", "truncate"):
        raise ValueError(f"long_pairs must be 'filter' or 'truncate', got {long_pairs!r}.")
    if max_source_length < 1 or max_target_length < 1:
        raise ValueError(
            f"max_source_length and max_target_length must be positive, got {max_source_length} and "
            f"{max_target_length}."
        )
    missing = {"src", "tgt"} - set(dataset.column_names)
    if missing:
        raise ValueError(
            f"The dataset lacks column(s) {sorted(missing)} (it has {dataset.column_names}); build it with "
            "load_parallel_data or name the columns 'src' and 'tgt'."
        )

    def encode(batch: dict[str, list[str]]) -> dict[str, list]:
        source = tokenizer(batch["src"])
        target = tokenizer(text_target=batch["tgt"])["input_ids"]
        too_long = [
            len(src_ids) > max_source_length or len(tgt_ids) > max_target_length
            for src_ids, tgt_ids in zip(source["input_ids"], target, strict=True)
        ]
        if long_pairs == "truncate" and any(too_long):
            # The tokenizer truncates before its post-processor adds </s>, so the cut keeps the end token.
            source = tokenizer(batch["src"], truncation=True, max_length=max_source_length)
            target = tokenizer(text_target=batch["tgt"], truncation=True, max_length=max_target_length)[
                "input_ids"
            ]
        return {
            "input_ids": source["input_ids"],
            "attention_mask": source["attention_mask"],
            "labels": target,
            "_too_long": too_long,
        }

    tokenized = dataset.map(
        encode, batched=True, remove_columns=dataset.column_names, num_proc=num_proc, desc="Tokenizing pairs"
    )
    # Counted from the column rather than inside map(), whose workers (num_proc) cannot share a counter.
    too_long = pc.sum(tokenized.with_format("arrow")["_too_long"]).as_py() or 0
    limits = f"{max_source_length} source / {max_target_length} target tokens"
    if long_pairs == "filter" and too_long:
        tokenized = tokenized.filter(
            lambda flags: [not flag for flag in flags],
            input_columns="_too_long",
            batched=True,
            num_proc=num_proc,
        )
        _report(
            f"Filtered out {too_long} of {len(dataset)} pairs longer than {limits}; raise the limits or use "
            "long_pairs='truncate' to keep them."
        )
    elif too_long:
        _report(f"Truncated {too_long} of {len(dataset)} pairs longer than {limits}.")
    if len(tokenized) == 0:
        raise ValueError(f"Every pair is longer than {limits}; raise max_source_length / max_target_length.")
    return tokenized.remove_columns("_too_long")
