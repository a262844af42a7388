"""Reading and tokenizing parallel data (Vaswani et al., 2017, Section 5.1: WMT 2014 English-German and
English-French sentence pairs).

Every reader returns a ``datasets.Dataset`` with two string columns, ``src`` and ``tgt``, backed by a
memory-mapped Arrow file: a corpus the size of WMT 2014 costs disk space, not process memory, and every
process of a multi-GPU run shares the same pages. Local files (two line-aligned text files, TSV or JSON
Lines, each optionally gzip-compressed as ``*.gz``) are converted once, streamed in chunks, into
``<HF_DATASETS_CACHE>/parallel_pairs/<fingerprint>/``; the fingerprint covers the paths, sizes and
modification times of the files and the reading options, so a later call reads the cached file instead.
Pairs with an empty side are dropped with a printed count (on every call, the count being cached too).

``tokenize_pairs`` tokenizes with ``Dataset.map``: batched, in ``num_proc`` processes for large corpora,
cached next to the input's Arrow file, with token ids stored as int32. ``load_parallel_data`` and
``tokenize_pairs`` run on the main process first (``accelerate.PartialState.main_process_first``), so under
``accelerate launch`` / ``torchrun`` one process prepares the data and the others read its cache.

Text files are split on "\\n" only (a trailing "\\r" is removed): ``str.splitlines`` would also split on
U+2028, U+0085 and form feeds, which occur inside WMT sentences and would misalign the two sides.
"""

import gzip
import itertools
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import BinaryIO, Literal

import datasets
import pyarrow.compute as pc
from accelerate import PartialState
from datasets.arrow_writer import ArrowWriter
from datasets.fingerprint import Hasher
from transformers import PreTrainedTokenizerBase

from ..common.text_lines import line_chunks

# Letters and digits, in parts joined by "_" or "-": "en", "pt_BR", "eng_Latn", "zh-Hans". The code becomes a
# file suffix ("train.eng_Latn"), so dots, slashes and spaces are refused.
_LANGUAGE_CODE = re.compile(r"[A-Za-z0-9]+(?:[_-][A-Za-z0-9]+)*")

_PAIR_FEATURES = datasets.Features({"src": datasets.Value("string"), "tgt": datasets.Value("string")})
# Lines read and written per Arrow record batch: large enough to amortize Python overhead, small enough to
# keep memory flat.
_CHUNK_LINES = 10_000
# Part of every cache fingerprint: changing how files are read must change this, or old caches are reused.
_READER_VERSION = "1"
_PAIRS_FILE = "pairs.arrow"
_STATS_FILE = "stats.json"

# Tokenization is parallelized from this many pairs on; below it, starting the processes costs more.
_PARALLEL_MIN_PAIRS = 100_000
_TOKENIZED_FEATURES = {
    # Vocabularies are far below 2**31; int32 halves the cache and the pages each process maps.
    "input_ids": datasets.List(datasets.Value("int32")),
    "attention_mask": datasets.List(datasets.Value("int8")),
    "labels": datasets.List(datasets.Value("int32")),
}
_TRUNCATED = "_truncated"

LinesChunk = tuple[int, list[str]]
PairsChunk = tuple[list[str], list[str]]


def validate_language_code(code: str) -> str:
    """Check a language code such as Section 5.1's ``en``/``de``/``fr``, or ``pt_BR``, ``eng_Latn``,
    ``zh-Hans``: letters and digits, in parts joined by ``_`` or ``-`` (it is used as a file suffix)."""
    if not isinstance(code, str) or not _LANGUAGE_CODE.fullmatch(code):
        raise ValueError(
            f"Invalid language code {code!r}: use letters and digits, in parts joined by '_' or '-' (it is "
            "used as a file suffix), e.g. 'en', 'pt_BR', 'eng_Latn' or 'zh-Hans'."
        )
    return code


def _report(message: str) -> None:
    print(message, file=sys.stderr)


def _main_process_first() -> AbstractContextManager:
    """Run the block on the main process, then on the others, which then find its cache."""
    return PartialState().main_process_first()


def _check_file(path: Path) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"Data file {path} does not exist; check the path.")


def _open_binary(path: Path) -> BinaryIO:
    return gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb")


def _read_lines(path: Path) -> Iterator[LinesChunk]:
    """Yield (1-based number of the first line, lines) chunks of a UTF-8 text file, gzip-compressed if its
    name ends in ``.gz`` (`text_lines.line_chunks`: lines lose their "\\r\\n" or "\\n", the first line its
    byte-order mark)."""
    _check_file(path)
    count = 0
    with _open_binary(path) as handle:
        for first, lines in line_chunks(handle, str(path), _CHUNK_LINES):
            yield first, lines
            count += len(lines)
    if count == 0:
        raise ValueError(f"Data file {path} is empty; it must hold one sentence (pair) per line.")


def _cached_pairs(
    files: list[Path], options: dict, read: Callable[[], Iterator[PairsChunk]], cache_dir: str | Path | None
) -> datasets.Dataset:
    """The pairs that ``read`` yields for ``files``, stripped, without pairs with an empty side, as a
    memory-mapped dataset; written once to a cache directory named by the files' fingerprint."""
    for path in files:
        _check_file(path)
    origin = " / ".join(str(path) for path in files)
    identity = [(str(path.resolve()), path.stat().st_size, path.stat().st_mtime_ns) for path in files]
    fingerprint = Hasher.hash([_READER_VERSION, identity, options])
    root = Path(cache_dir if cache_dir is not None else datasets.config.HF_DATASETS_CACHE) / "parallel_pairs"
    directory = root / fingerprint
    if not (directory / _STATS_FILE).is_file():
        root.mkdir(parents=True, exist_ok=True)
        # Written aside and renamed into place, so that an interrupted run leaves no half-written cache.
        staging = Path(tempfile.mkdtemp(prefix=f"{fingerprint}.incomplete-", dir=root))
        try:
            read_count = 0
            with ArrowWriter(features=_PAIR_FEATURES, path=str(staging / _PAIRS_FILE)) as writer:
                for sources, targets in read():
                    read_count += len(sources)
                    pairs = [(s.strip(), t.strip()) for s, t in zip(sources, targets, strict=True)]
                    kept = [pair for pair in pairs if pair[0] and pair[1]]
                    writer.write_batch({"src": [s for s, _ in kept], "tgt": [t for _, t in kept]})
                kept_count, _ = writer.finalize()
            (staging / _STATS_FILE).write_text(json.dumps({"read": read_count, "kept": kept_count}))
            try:
                staging.rename(directory)
            except OSError:
                if not (directory / _STATS_FILE).is_file():
                    raise
                # Another process wrote the same cache in the meantime; its copy is identical.
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    counts = json.loads((directory / _STATS_FILE).read_text())
    if counts["kept"] == 0:
        raise ValueError(f"{origin} contains no sentence pair with both sides non-empty.")
    if counts["kept"] < counts["read"]:
        _report(
            f"Dropped {counts['read'] - counts['kept']} of {counts['read']} pairs from {origin}: empty "
            "source or target line."
        )
    return datasets.Dataset.from_file(str(directory / _PAIRS_FILE))


def read_text_pair(
    src_path: str | Path, tgt_path: str | Path, *, cache_dir: str | Path | None = None
) -> datasets.Dataset:
    """Read two line-aligned plain-text files, one sentence per line (the WMT format of Section 5.1), either
    of them gzip-compressed if its name ends in ``.gz``.

    ``cache_dir`` holds the converted Arrow file; by default the ``datasets`` cache (``HF_DATASETS_CACHE``).
    """
    src_path, tgt_path = Path(src_path), Path(tgt_path)

    def read() -> Iterator[PairsChunk]:
        src_count = tgt_count = 0
        # Chunks hold the same number of lines, so they stay aligned until the shorter file ends; the longer
        # one is then read to the end only to count its lines for the error.
        for src_chunk, tgt_chunk in itertools.zip_longest(
            _read_lines(src_path), _read_lines(tgt_path), fillvalue=(0, [])
        ):
            src_count += len(src_chunk[1])
            tgt_count += len(tgt_chunk[1])
            if src_count == tgt_count:
                yield src_chunk[1], tgt_chunk[1]
        if src_count != tgt_count:
            raise ValueError(
                f"The parallel files are not line-aligned: {src_path} has {src_count} lines but {tgt_path} "
                f"has {tgt_count}. Each line of one file must translate the same line of the other."
            )

    return _cached_pairs([src_path, tgt_path], {"format": "text"}, read, cache_dir)


def read_tsv(path: str | Path, *, cache_dir: str | Path | None = None) -> datasets.Dataset:
    """Read a TSV file (gzip-compressed if named ``*.gz``) with one ``source<TAB>target`` sentence pair
    (Section 5.1) per line. ``cache_dir``: see ``read_text_pair``."""
    path = Path(path)

    def read() -> Iterator[PairsChunk]:
        for first, lines in _read_lines(path):
            rows = [line.split("\t") for line in lines]
            for offset, fields in enumerate(rows):
                if len(fields) != 2:
                    raise ValueError(
                        f"{path}, line {first + offset}: expected 2 tab-separated fields (source, target), "
                        f"found {len(fields)}. Remove extra tabs or columns."
                    )
            yield [fields[0] for fields in rows], [fields[1] for fields in rows]

    return _cached_pairs([path], {"format": "tsv"}, read, cache_dir)


def read_jsonl(
    path: str | Path,
    src_key: str = "src",
    tgt_key: str = "tgt",
    src_lang: str | None = None,
    tgt_lang: str | None = None,
    *,
    cache_dir: str | Path | None = None,
) -> datasets.Dataset:
    """Read sentence pairs (Section 5.1) from JSON Lines (gzip-compressed if named ``*.gz``), one object per
    line.

    Objects are ``{src_key: ..., tgt_key: ...}`` or, when both languages are given, may use the ``datasets``
    translation layout ``{"translation": {"en": ..., "de": ...}}``. ``cache_dir``: see ``read_text_pair``.
    """
    path = Path(path)
    use_translation = src_lang is not None and tgt_lang is not None
    if use_translation:
        validate_language_code(src_lang)
        validate_language_code(tgt_lang)

    def parse(number: int, line: str) -> tuple[str, str]:
        if not line.strip():
            return "", ""
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
        return record[keys[0]], record[keys[1]]

    def read() -> Iterator[PairsChunk]:
        for first, lines in _read_lines(path):
            pairs = [parse(number, line) for number, line in enumerate(lines, start=first)]
            yield [source for source, _ in pairs], [target for _, target in pairs]

    options = {"format": "jsonl", "keys": [src_key, tgt_key], "languages": [src_lang, tgt_lang]}
    return _cached_pairs([path], options, read, cache_dir)


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
    cache_dir: str | Path | None = None,
) -> datasets.Dataset:
    """Read the parallel data of Section 5.1 from whatever ``source`` names, as ``src``/``tgt`` columns.

    - ``source`` and ``target``: two line-aligned text files;
    - ``source`` a ``.tsv`` / ``.jsonl`` file: see ``read_tsv`` / ``read_jsonl``;
    - ``source`` a prefix such that ``{source}.{src_lang}`` and ``{source}.{tgt_lang}`` exist
      (``data/multi30k/train`` with ``en``/``de``): those two text files;
    - otherwise, with ``config``: a ``datasets`` name such as ``wmt14`` with config ``de-en``.

    Every file may be gzip-compressed with ``.gz`` appended to its name (``train.en.gz``, ``pairs.tsv.gz``).
    Local files are converted once into ``cache_dir`` (see ``read_text_pair``); with several processes, the
    main process reads first and the others load its cache.
    """
    for language in (src_lang, tgt_lang):
        if language is not None:
            validate_language_code(language)
    with _main_process_first():
        if target is not None:
            return read_text_pair(source, target, cache_dir=cache_dir)
        path = Path(source)
        if path.is_file():
            suffix = Path(path.name.removesuffix(".gz")).suffix
            if suffix == ".tsv":
                return read_tsv(path, cache_dir=cache_dir)
            if suffix == ".jsonl":
                return read_jsonl(path, src_key, tgt_key, src_lang, tgt_lang, cache_dir=cache_dir)
            raise ValueError(
                f"{path} is a single file but neither .tsv nor .jsonl (optionally .gz); for plain text pass "
                "the target-side file too, or a prefix P such that P.<src_lang> and P.<tgt_lang> exist."
            )
        if src_lang is not None and tgt_lang is not None:
            src_file, tgt_file = (
                _plain_or_gzip(Path(f"{source}.{language}")) for language in (src_lang, tgt_lang)
            )
            if src_file.is_file() or tgt_file.is_file():
                return read_text_pair(src_file, tgt_file, cache_dir=cache_dir)
        if config is not None:
            if src_lang is None or tgt_lang is None:
                raise ValueError(f"Loading {source} ({config}) needs both src_lang and tgt_lang.")
            return load_hub_pairs(str(source), config, src_lang, tgt_lang, split)
    raise FileNotFoundError(
        f"{source} is not a file"
        + (f", nor are {source}.{src_lang} / {source}.{tgt_lang}" if src_lang and tgt_lang else "")
        + " (or their .gz). Pass an existing .tsv/.jsonl file, two text files, a prefix with both languages, "
        "or a datasets name with its config (e.g. wmt14 with config de-en)."
    )


def _plain_or_gzip(path: Path) -> Path:
    """``path``, or its gzip-compressed ``path.gz`` when only that exists."""
    compressed = path.with_name(f"{path.name}.gz")
    return compressed if not path.is_file() and compressed.is_file() else path


def _default_num_proc(pairs: int) -> int:
    return min(4, os.cpu_count() or 1) if pairs >= _PARALLEL_MIN_PAIRS else 1


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
    go straight to ``DataCollatorForSeq2Seq`` (which pads into int64 tensors) and
    ``TokenBudgetBatchSampler.from_dataset``. Ids are stored as int32 and the mask as int8.

    ``Dataset.map`` runs batched in ``num_proc`` processes (default: up to 4 from 100,000 pairs on, else 1)
    and, for a dataset backed by Arrow files (``load_parallel_data``), caches its result next to them: the
    same dataset, tokenizer and settings are tokenized once, on the main process first when there are
    several (later calls read the cache whatever their ``num_proc``).
    """
    if long_pairs not in ("filter", "truncate"):
        raise ValueError(f"long_pairs must be 'filter' or 'truncate', got {long_pairs!r}.")
    if max_source_length < 1 or max_target_length < 1:
        raise ValueError(
            f"max_source_length and max_target_length must be positive, got {max_source_length} and "
            f"{max_target_length}."
        )
    if num_proc is not None and num_proc < 1:
        raise ValueError(
            f"num_proc must be a positive number of processes or None (automatic), got {num_proc}."
        )
    missing = {"src", "tgt"} - set(dataset.column_names)
    if missing:
        raise ValueError(
            f"The dataset lacks column(s) {sorted(missing)} (it has {dataset.column_names}); build it with "
            "load_parallel_data or name the columns 'src' and 'tgt'."
        )
    truncate = long_pairs == "truncate"

    def encode(batch: dict[str, list[str]]) -> dict[str, list]:
        source = tokenizer(batch["src"])
        target = tokenizer(text_target=batch["tgt"])["input_ids"]
        too_long = [
            len(src_ids) > max_source_length or len(tgt_ids) > max_target_length
            for src_ids, tgt_ids in zip(source["input_ids"], target, strict=True)
        ]
        if truncate and any(too_long):
            # The tokenizer truncates before its post-processor adds </s>, so the cut keeps the end token.
            source = tokenizer(batch["src"], truncation=True, max_length=max_source_length)
            target = tokenizer(text_target=batch["tgt"], truncation=True, max_length=max_target_length)[
                "input_ids"
            ]
        columns = {
            "input_ids": source["input_ids"],
            "attention_mask": source["attention_mask"],
            "labels": target,
        }
        if truncate:
            return {**columns, _TRUNCATED: too_long}
        # All input columns are removed, so a batched map may return fewer rows than it got: dropping the long
        # pairs here leaves no indices mapping for later steps to read through.
        keep = [not long for long in too_long]
        return {name: list(itertools.compress(values, keep)) for name, values in columns.items()}

    features = dict(_TOKENIZED_FEATURES, **({_TRUNCATED: datasets.Value("bool")} if truncate else {}))
    num_proc = num_proc or _default_num_proc(len(dataset))
    with _main_process_first():
        tokenized = dataset.map(
            encode,
            batched=True,
            remove_columns=dataset.column_names,
            features=datasets.Features(features),
            # map() starts a pool for any num_proc that is not None, even 1.
            num_proc=num_proc if num_proc > 1 else None,
            desc="Tokenizing pairs",
        )
    limits = f"{max_source_length} source / {max_target_length} target tokens"
    if truncate:
        # Counted from the column rather than inside map(), whose workers (num_proc) cannot share a counter.
        too_long = pc.sum(tokenized.with_format("arrow")[_TRUNCATED]).as_py() or 0
        tokenized = tokenized.remove_columns(_TRUNCATED)
        if too_long:
            _report(f"Truncated {too_long} of {len(dataset)} pairs longer than {limits}.")
    elif len(tokenized) < len(dataset):
        _report(
            f"Filtered out {len(dataset) - len(tokenized)} of {len(dataset)} pairs longer than {limits}; "
            "raise the limits or use long_pairs='truncate' to keep them."
        )
    if len(tokenized) == 0:
        raise ValueError(f"Every pair is longer than {limits}; raise max_source_length / max_target_length.")
    return tokenized
