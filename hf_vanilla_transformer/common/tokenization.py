"""Shared source-target byte-pair-encoding vocabulary (Vaswani et al., 2017, Section 5.1).

The paper encodes WMT 2014 English-German with "byte-pair encoding, which has a shared source-target
vocabulary of about 37000 tokens". `train_shared_bpe_tokenizer` learns one such vocabulary over source and
target text together with the `tokenizers` library and wraps it as a `PreTrainedTokenizerFast`, so the
same tokenizer encodes the encoder input and the labels and `save_pretrained` / `AutoTokenizer` need no
custom class.

Pipeline: NFKC normalization, then `Metaspace` pre-tokenization (SentencePiece style: each space becomes
"▁" and starts a word), a BPE model, and a post-processor that appends `</s>` to every sequence. The
decoder of the model starts from `<s>` (its `decoder_start_token_id`); the tokenizer never inserts it.
Because spaces are kept as "▁", decoding gives back the normalized text: `decode(encode(s),
skip_special_tokens=True) == s` for ordinary sentences, except that NFKC rewrites compatibility characters
(non-breaking space, "…", full-width forms) and a leading space is dropped.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from ..registration import register_auto_classes
from .model_location import check_holds_tokenizer, loading
from .text_lines import iter_lines

if TYPE_CHECKING:
    from datasets import Dataset

PAD_TOKEN = "<pad>"
UNK_TOKEN = "<unk>"
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
# The trainer assigns ids in list order: fairseq's dictionary order <s>=0, <pad>=1, </s>=2, <unk>=3 (the
# config's defaults), which also keeps the padding id non-zero: transformers' beam search pads finished
# hypotheses with `pad_token_id or eos_token_id`, so a padding id of 0 would pad with end tokens.
SPECIAL_TOKENS = (BOS_TOKEN, PAD_TOKEN, EOS_TOKEN, UNK_TOKEN)
# The roles of `SPECIAL_TOKENS`, as `PreTrainedTokenizerFast` takes them.
SPECIAL_TOKEN_ROLES = {
    "bos_token": BOS_TOKEN,
    "pad_token": PAD_TOKEN,
    "eos_token": EOS_TOKEN,
    "unk_token": UNK_TOKEN,
}

TextSource = str | os.PathLike
# Texts handed to the trainer at a time: it counts the words of a batch in parallel, and one call per batch
# instead of per sentence keeps Python out of the way.
_BATCH_SIZE = 10_000


def _iter_texts(sources: Iterable[TextSource]) -> Iterator[str]:
    """Yield non-empty strings, reading `os.PathLike` items as files of one sentence a line (`text_lines`)."""
    for position, source in enumerate(sources):
        if isinstance(source, os.PathLike):
            yield from (text for text in iter_lines(source) if text.strip())
            continue
        if not isinstance(source, str):
            raise TypeError(
                f"Expected str texts or os.PathLike files, got {type(source).__name__} at item {position}."
            )
        # A file name passed as a plain string would silently become a one-word training text.
        if position == 0 and "\n" not in source and len(source) < 4096 and os.path.isfile(source):
            raise ValueError(
                f"The first text {source!r} names an existing file. Texts are taken literally; "
                f"pass pathlib.Path({source!r}) to train on the file's lines."
            )
        if source.strip():
            yield source


def _text_batches(texts_or_files: Iterable[TextSource] | os.PathLike | Dataset) -> Iterator[list[str]]:
    """Yield non-empty lists of non-blank training texts; a dataset's string columns are read in Arrow
    batches."""
    # Imported here: `datasets` takes a second to import, which encoding with a tokenizer does not need.
    import datasets

    if isinstance(texts_or_files, datasets.Dataset):
        columns = [
            name
            for name, feature in texts_or_files.features.items()
            if isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")
        ]
        if not columns:
            raise ValueError(
                f"The dataset has no string column to train on (features: {texts_or_files.features}); pass "
                "one with text columns, such as the src/tgt columns of load_parallel_data."
            )
        tables = texts_or_files.select_columns(columns).with_format("arrow").iter(batch_size=_BATCH_SIZE)
        batches = (
            [text for text in table.column(name).to_pylist() if text and text.strip()]
            for table in tables
            for name in columns
        )
    else:
        sources = [texts_or_files] if isinstance(texts_or_files, os.PathLike) else texts_or_files
        texts = _iter_texts(sources)
        batches = iter(lambda: list(itertools.islice(texts, _BATCH_SIZE)), [])
    return (batch for batch in batches if batch)


def train_shared_bpe_tokenizer(
    texts_or_files: Iterable[TextSource] | os.PathLike | Dataset,
    vocab_size: int = 37000,
    min_frequency: int = 2,
    *,
    limit_alphabet: int | None = None,
    model_max_length: int = 1024,
    show_progress: bool = True,
    extra_special_tokens: Sequence[str] = (),
) -> PreTrainedTokenizerFast:
    """Learn one BPE vocabulary shared by source and target language (Section 5.1).

    Args:
        texts_or_files: the training text of both languages. Either a `datasets.Dataset`, whose string
            columns (the `src` and `tgt` of `load_parallel_data`) are all read, in Arrow batches; or an
            iterable (list, generator) whose items are sentences (`str`) or files (`os.PathLike`, e.g.
            `pathlib.Path`, read as UTF-8 with one sentence per line); or a single path. Plain strings are
            always text, never file names. Empty lines are skipped. Iterating a `datasets` column
            (`dataset["src"]`) decodes it row by row in Python, which takes minutes on millions of
            sentences: pass the dataset itself.
        vocab_size: size of the final vocabulary, special tokens and alphabet included. The paper uses
            about 37000 for English-German.
        min_frequency: a pair must occur at least this often to be merged.
        limit_alphabet: keep only this many of the most frequent characters; rarer characters become
            `<unk>`. `None` keeps every character seen, so all of the training text round-trips.
        model_max_length: longest input, in tokens, the tokenizer reports to `transformers`; matches the
            default `max_position_embeddings` of `VanillaTransformerConfig`.
        show_progress: show the trainer's progress bars.
        extra_special_tokens: further tokens of the vocabulary, ids 4, 5, ... in this order, each matched
            whole wherever it occurs in a text and never split into subwords (such as the `<BT>` tag of
            `backtranslation`); they are special tokens, which decoding with `skip_special_tokens` drops.

    Returns:
        A `PreTrainedTokenizerFast` with `<s>`=0, `<pad>`=1, `</s>`=2, `<unk>`=3 (and the extra special
        tokens), which appends `</s>` to every sequence and pads on the right.

    Raises:
        TypeError: `texts_or_files` is a single `str`, or an item is neither `str` nor `os.PathLike`.
        ValueError: there is no non-empty text, a dataset has no string column, `vocab_size` cannot
            hold the special tokens and the alphabet (the message gives the minimum), or an extra special
            token repeats a special token.
    """
    if isinstance(texts_or_files, str):
        raise TypeError(
            "texts_or_files is a single str; pass a list of sentences, or pathlib.Path(...) for a file."
        )
    repeated = [token for token in extra_special_tokens if token in SPECIAL_TOKENS]
    if repeated or len(set(extra_special_tokens)) < len(extra_special_tokens):
        raise ValueError(
            f"extra_special_tokens {list(extra_special_tokens)} repeat a token (the special tokens are "
            f"{', '.join(SPECIAL_TOKENS)}): give each extra token once, none of those."
        )
    batches = _text_batches(texts_or_files)
    first = next(batches, None)
    if first is None:
        raise ValueError("No training text: texts_or_files is empty or contains only blank lines.")

    tokenizer = Tokenizer(models.BPE(unk_token=UNK_TOKEN))
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    # BpeTrainer rejects limit_alphabet=None; leaving it out is what keeps every character.
    alphabet_option = {} if limit_alphabet is None else {"limit_alphabet": limit_alphabet}
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[*SPECIAL_TOKENS, *extra_special_tokens],
        show_progress=show_progress,
        **alphabet_option,
    )
    tokenizer.train_from_iterator(itertools.chain([first], batches), trainer=trainer)
    # The trainer never drops characters to honour vocab_size; it silently returns a larger vocabulary.
    minimum = tokenizer.get_vocab_size()
    specials = len(SPECIAL_TOKENS) + len(extra_special_tokens)
    if minimum > vocab_size:
        raise ValueError(
            f"vocab_size={vocab_size} cannot hold the {specials} special tokens and the alphabet "
            f"of {minimum - specials} characters (Metaspace's '▁' included); the minimum is "
            f"{minimum}. Raise vocab_size or set limit_alphabet."
        )

    return wrap_tokenizer(
        tokenizer,
        model_max_length,
        # Only where there are some: a tokenizer without any saves the same files as before they existed.
        **({"extra_special_tokens": list(extra_special_tokens)} if extra_special_tokens else {}),
    )


def wrap_tokenizer(tokenizer: Tokenizer, model_max_length: int, **kwargs) -> PreTrainedTokenizerFast:
    """`tokenizer`, whose vocabulary holds `SPECIAL_TOKENS`, as a `PreTrainedTokenizerFast` with their roles,
    padding on the right, and a post-processor that appends `</s>` to every sequence (as fairseq's
    `Dictionary.encode_line` does)."""
    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS_TOKEN}",
        pair=f"$A {EOS_TOKEN} $B:1 {EOS_TOKEN}:1",
        special_tokens=[(EOS_TOKEN, eos_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        **SPECIAL_TOKEN_ROLES,
        model_max_length=model_max_length,
        padding_side="right",
        # Metaspace and the BPE decoders already restore spacing; the WordPiece-era clean-up would only warn.
        clean_up_tokenization_spaces=False,
        **kwargs,
    )


def load_tokenizer(name_or_path: str | os.PathLike, **kwargs) -> PreTrainedTokenizerBase:
    """Load a tokenizer with `AutoTokenizer` and check it defines pad and eos tokens.

    Padding and the loss mask use pad, and generation stops at eos. The decoder's start token is the
    model config's `decoder_start_token_id` (the `<s>` of tokenizers trained here; Marian's use pad), so
    a bos token is not required. Ids are not required to be 0-3: converted checkpoints carry their own.

    Args:
        name_or_path: a directory written by `save_pretrained`, or a Hub id (offline: only if cached).
        **kwargs: passed to `AutoTokenizer.from_pretrained`.

    Raises:
        ValueError: a special token is unset or missing from the vocabulary.
    """
    if Path(name_or_path).is_dir():
        check_holds_tokenizer(name_or_path)
    # AutoTokenizer reads the folder's config.json: registered, the model's type needs no remote code.
    register_auto_classes()
    with loading(name_or_path, model=False):
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    vocab = tokenizer.get_vocab()
    problems = []
    for role in ("pad_token", "eos_token"):
        token = getattr(tokenizer, role)
        if token is None:
            problems.append(f"{role} is not set")
        elif str(token) not in vocab:
            problems.append(f"{role}={str(token)!r} is not in the vocabulary")
    if problems:
        raise ValueError(
            f"Tokenizer at {str(name_or_path)!r} cannot be used with this model: {'; '.join(problems)}. "
            f"Train one with train_shared_bpe_tokenizer (which defines {', '.join(SPECIAL_TOKENS)}) or set "
            "the missing tokens with tokenizer.add_special_tokens({...})."
        )
    return tokenizer
