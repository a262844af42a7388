"""A vocabulary shortlist for CTranslate2's vocabulary mapping (`VMAP_FILE`): from line-aligned training
data, the target tokens each source token is likely to need, so that a translation decodes over those
alone."""

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from .export_common import ExportError
from .names import DEFAULT_SHORTLIST_SIZE

# CTranslate2's vocabulary mapping file, read when translating with use_vmap=True.
VMAP_FILE = "vmap.txt"
# Target tokens allowed per source token where the caller does not say.


@dataclass(frozen=True)
class Shortlist:
    """Which target tokens a translation may use, as CTranslate2's vocabulary mapping (`VMAP_FILE`) holds
    it: the tokens always allowed, and for each source token the target tokens its presence in the input
    adds. CTranslate2 also always allows its unknown, start and end tokens."""

    always: list[str]
    candidates: dict[str, list[str]]

    def allowed(self, source_tokens: Iterable[str]) -> set[str]:
        """The target tokens this shortlist allows for inputs made of `source_tokens` (CTranslate2 takes
        the union over the inputs of one `translate_batch` call)."""
        allowed = set(self.always)
        for token in source_tokens:
            allowed.update(self.candidates.get(token, ()))
        return allowed

    def check(self, source_tokens: list[str], target_tokens: list[str]) -> None:
        """Raise ExportError for a token outside the vocabularies (CTranslate2 would read it as the unknown
        token) or one holding whitespace (which the file format cannot hold)."""
        vocabularies = {"source": set(source_tokens), "target": set(target_tokens)}
        sides = [("source", list(self.candidates)), ("target", self.always)]
        sides += [("target", targets) for targets in self.candidates.values()]
        for side, tokens in sides:
            for token in tokens:
                if token not in vocabularies[side] or _has_whitespace(token):
                    raise ExportError(
                        f"The shortlist names {side} token {token!r}, which is not in the {side} vocabulary "
                        "or holds whitespace: build it with the model's tokenizers (build_shortlist)."
                    )

    def write(self, path: str | Path) -> None:
        """Write the mapping in CTranslate2's format: one line per source token, `source<TAB>target target
        ...`; the line with an empty source holds the tokens always allowed."""
        lines = ["\t" + " ".join(self.always)]
        lines += [f"{source}\t{' '.join(targets)}" for source, targets in self.candidates.items()]
        Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def _has_whitespace(token: str) -> bool:
    return any(character.isspace() for character in token)


def _ordinary_tokens(tokenizer: PreTrainedTokenizerBase) -> tuple[list[str], torch.Tensor]:
    """The tokenizer's token names by id, and which of them a shortlist may hold: not special, no
    whitespace."""
    names = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    special = set(tokenizer.all_special_ids)
    usable = [index not in special and not _has_whitespace(name) for index, name in enumerate(names)]
    return names, torch.tensor(usable)


def _sentence_counts(ids: list[list[int]], size: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each sentence's distinct token ids, and in how many sentences each token occurs."""
    distinct = [torch.tensor(sorted(set(row)), dtype=torch.long) for row in ids]
    return distinct, torch.bincount(torch.cat(distinct), minlength=size)


def build_shortlist(
    source_texts: Iterable[str],
    target_texts: Iterable[str],
    tokenizer: PreTrainedTokenizerBase,
    target_tokenizer: PreTrainedTokenizerBase | None = None,
    *,
    size: int = DEFAULT_SHORTLIST_SIZE,
    frequent: int = 100,
    chunk: int = 10_000,
) -> Shortlist:
    """A `Shortlist` learned from line-aligned parallel text (the training data, say).

    For each source token, the `size` target tokens that co-occur with it most informatively, ranked by
    local mutual information c(s, t) * log(N c(s, t) / (c(s) c(t))) (c counts the sentence pairs holding
    the tokens, N the pairs) and kept only where they co-occur more often than chance: raw counts would rank
    the commonest target tokens first for every source token, and PMI alone favours pairs seen once. The
    `frequent` commonest target tokens are always allowed. Special tokens and tokens holding whitespace are
    left out. The pairs are read `chunk` at a time.
    """
    target_tokenizer = target_tokenizer or tokenizer
    source_names, source_usable = _ordinary_tokens(tokenizer)
    target_names, target_usable = _ordinary_tokens(target_tokenizer)
    target_size = len(target_names)
    keys = torch.zeros(0, dtype=torch.long)
    counts = torch.zeros(0, dtype=torch.long)
    source_counts = torch.zeros(len(source_names), dtype=torch.long)
    target_counts = torch.zeros(target_size, dtype=torch.long)
    target_frequency = torch.zeros(target_size, dtype=torch.long)
    pairs = 0
    texts = _aligned(source_texts, target_texts)
    while batch := list(itertools.islice(texts, chunk)):
        source_ids = tokenizer([source for source, _ in batch], add_special_tokens=False)["input_ids"]
        target_ids = target_tokenizer([target for _, target in batch], add_special_tokens=False)["input_ids"]
        source_sets, in_sources = _sentence_counts(source_ids, len(source_names))
        target_sets, in_targets = _sentence_counts(target_ids, target_size)
        source_counts += in_sources
        target_counts += in_targets
        target_frequency += torch.bincount(
            torch.tensor([i for row in target_ids for i in row], dtype=torch.long), minlength=target_size
        )
        # One key per (source token, target token) of each sentence pair: s * |target vocabulary| + t.
        new = [(s[:, None] * target_size + t[None, :]).flatten() for s, t in zip(source_sets, target_sets)]
        weights = torch.cat([counts, torch.ones(sum(map(len, new)), dtype=torch.long)])
        keys, inverse = torch.unique(torch.cat([keys, *new]), return_inverse=True)
        counts = torch.zeros(len(keys), dtype=torch.long).index_add_(0, inverse, weights)
        pairs += len(batch)
    if not pairs:
        raise ExportError("No sentence pairs to build a shortlist from.")

    sources, targets = keys // target_size, keys % target_size
    together = counts.double()
    score = together * torch.log(pairs * together / (source_counts[sources] * target_counts[targets]))
    kept = (score > 0) & source_usable[sources] & target_usable[targets]
    sources, targets, score = sources[kept], targets[kept], score[kept]
    # Best first within each source token: sort by score, then (stably) by source token.
    order = torch.argsort(score, descending=True, stable=True)
    order = order[torch.argsort(sources[order], stable=True)]
    sources, targets = sources[order], targets[order]
    rank = torch.arange(len(sources)) - torch.searchsorted(sources, sources)
    candidates: dict[str, list[str]] = {}
    for source, target in zip(sources[rank < size].tolist(), targets[rank < size].tolist()):
        candidates.setdefault(source_names[source], []).append(target_names[target])
    by_frequency = torch.argsort(target_frequency, descending=True, stable=True)
    usable = by_frequency[target_usable[by_frequency] & (target_frequency[by_frequency] > 0)]
    return Shortlist([target_names[i] for i in usable[:frequent].tolist()], candidates)


def _aligned(source_texts: Iterable[str], target_texts: Iterable[str]) -> Iterator[tuple[str, str]]:
    """The pairs of line-aligned texts; a one-line ValueError where one side ends before the other."""
    end = object()
    for number, (source, target) in enumerate(
        itertools.zip_longest(source_texts, target_texts, fillvalue=end)
    ):
        if source is end or target is end:
            shorter = "source" if source is end else "target"
            raise ValueError(
                f"The shortlist's {shorter} text ends after {number} lines, before the other side: give "
                "line-aligned parallel text."
            )
        yield source, target
