"""What every converter shares: the error a checkpoint that cannot be converted exactly raises, the report
of which source keys became which of ours, the strict load that names every missing, unknown or misshapen
key, and the logits check against the source implementation."""

import re
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import VanillaTransformerForConditionalGeneration
from ..common.model_location import TARGET_TOKENIZER_DIR, TOKENIZER_FILES, remove_model_descriptions

# The BPE files fairseq's hub loader picks up next to a translation model.
FAIRSEQ_BPE_FILES = ("bpecodes", "code", "sentencepiece.bpe.model")
# What Marian's tokenizer needs, as opus-mt ships it.
MARIAN_TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json")
# Every file or folder a converter's tokenizer may leave in the output folder: what transformers' tokenizers
# save (Marian's with a separate target vocabulary too), fairseq's BPE codes, and the target tokenizer of
# separate fairseq vocabularies.
CONVERTED_TOKENIZER_FILES = (
    *TOKENIZER_FILES,
    "special_tokens_map.json",
    "added_tokens.json",
    *MARIAN_TOKENIZER_FILES,
    "target_vocab.json",
    *FAIRSEQ_BPE_FILES,
    TARGET_TOKENIZER_DIR,
)


class ConversionError(ValueError):
    """A checkpoint that cannot be converted exactly; the message names the file, key or setting."""


@dataclass
class ConversionReport:
    """What a conversion did: source key patterns and the keys they became (layer numbers shown as N),
    and notes the user must read (tokenizer limits, dtype changes, checks run)."""

    source: str
    output: str = ""
    mapped: Counter = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)

    def record(self, source_key: str, target: str) -> None:
        self.mapped[(_key_pattern(source_key), _key_pattern(target))] += 1

    def format(self) -> str:
        """The summary printed by `vanilla-transformer convert`: a table, then the notes."""
        rows = [("source key", "converted key", "count")]
        rows += [(source, target, str(count)) for (source, target), count in self.mapped.items()]
        width_source = max(len(row[0]) for row in rows)
        width_target = max(len(row[1]) for row in rows)
        lines = [f"Converted {self.source}" + (f" -> {self.output}" if self.output else ""), ""]
        lines += [f"{s:<{width_source}}  {t:<{width_target}}  {n:>5}" for s, t, n in rows]
        if self.notes:
            lines += ["", "Notes:", *(f"- {note}" for note in self.notes)]
        return "\n".join(lines)


def _key_pattern(key: str) -> str:
    return re.sub(r"(?<=layers\.)\d+", "N", key)


def load_converted_state(
    model: VanillaTransformerForConditionalGeneration, state: dict[str, torch.Tensor], source: str
) -> None:
    """Load `state` into `model`, failing with the offending names if anything is missing, unexpected,
    of the wrong shape or not finite. Tied copies of the shared embedding may be absent from `state`."""
    expected = model.state_dict()
    tied = set(model.get_expanded_tied_weights_keys(all_submodels=True))
    missing = sorted(k for k in expected if k not in state and k not in tied)
    unexpected = sorted(k for k in state if k not in expected)
    wrong_shape = sorted(
        f"{k}: {tuple(state[k].shape)} in {source}, {tuple(expected[k].shape)} expected"
        for k in state
        if k in expected and state[k].shape != expected[k].shape
    )
    non_finite = sorted(k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all())
    problems = [
        (f"missing from {source}", missing),
        (f"not recognised in {source}", unexpected),
        ("shape mismatch", wrong_shape),
        ("NaN or infinite values", non_finite),
    ]
    report = [
        f"{label}: {', '.join(names[:10])}{' ...' if len(names) > 10 else ''}"
        for label, names in problems
        if names
    ]
    if report:
        raise ConversionError(f"Cannot convert {source}: " + "; ".join(report))
    model.load_state_dict(state, strict=False)
    model.tie_weights()


def save_converted_model(model: VanillaTransformerForConditionalGeneration, out: Path) -> None:
    """`save_pretrained` into `out`, dropping what belonged to an earlier model there: what described it
    (`results.json` and the like), whose figures are not the converted model's, and its tokenizer
    (`CONVERTED_TOKENIZER_FILES`), which would otherwise be loaded with the converted model where the
    conversion brings none."""
    for name in CONVERTED_TOKENIZER_FILES:
        earlier = out / name
        if earlier.is_dir():
            shutil.rmtree(earlier)
        else:
            earlier.unlink(missing_ok=True)
    model.save_pretrained(out)
    remove_model_descriptions(out)


@torch.no_grad()
def max_logits_difference(
    reference: torch.nn.Module, converted: VanillaTransformerForConditionalGeneration, seed: int = 0
) -> float:
    """Largest absolute logit difference between two seq2seq models on a fixed random, right-padded batch."""
    config = converted.config
    generator = torch.Generator().manual_seed(seed)
    source = torch.randint(0, config.vocab_size, (2, 9), generator=generator)
    target = torch.randint(0, config.target_vocab_size, (2, 7), generator=generator)
    # Padding ids inside the text would be masked differently by different implementations.
    source[source == config.pad_token_id] = config.eos_token_id
    target[target == config.pad_token_id] = config.eos_token_id
    target[:, 0] = config.decoder_start_token_id
    mask = torch.ones_like(source)
    mask[1, 6:] = 0
    source[1, 6:] = config.pad_token_id
    inputs = dict(input_ids=source, attention_mask=mask, decoder_input_ids=target)
    expected = reference(**inputs).logits
    actual = converted(**inputs).logits
    return (actual.float() - expected.float()).abs().max().item()
