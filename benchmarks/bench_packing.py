"""Padding and speed of packed training batches against `train`'s padded ones, on the newstest2013/2014
pairs' lengths.

    python benchmarks/bench_packing.py                                    # the share of padded positions
    python benchmarks/bench_packing.py --row-lengths 128 256 --max-tokens 25000 --data-copies 100
    python benchmarks/bench_packing.py --speed                            # eager steps, cpu-demo model
    python benchmarks/bench_packing.py --speed --compile --warm-start     # and compiled: cold and warm
    python benchmarks/bench_packing.py --speed --compile --device cuda --bf16 --size base

Padding (the default): the share of padded positions in token-budget batches (Section 5.1) padded to each
batch's longest (`train`'s default), to the next multiple of 8 (`train --compile`'s) and to the length
buckets (`train --length-buckets`), against packed batches of one static shape (`training.packing`). The
first three are `bench_compile.py --only padding`'s figures, computed by its own function over the same
lengths (`bench_train.newstest_lengths`: one BPE vocabulary trained on the pairs' text) and the same
`TokenBudgetBatchSampler` batches, so the numbers compare. Packed batches hold as many positions a side as
a token-budget batch may: `--max-tokens // row_length` rows of `row_length` tokens on the side with more
tokens, the other side's rows in proportion (`packing.balanced_row_lengths`), filled by
`PackedBatchSampler`; every batch of the epoch counts, the last, part-empty one too. `--data-copies`
copies of the pairs stand in for a corpus the size of the paper's, as in bench_compile.py. For packed
batches, also the share of the attention's blocks of 128 x 128 that flex attention computes with their
block masks (`packing.packed_block_masks`, `--model-override attn_implementation=flex_attention`) in the
epoch's first `BLOCK_SAMPLE` batches, where dense masks compute every block.

`--speed`: training steps of a model of `--size` (a training preset's model: cpu-demo, base, big; or tiny,
for the tests) on batches of those pairs' lengths, under a BPE vocabulary of `--bpe-vocab` tokens (by
default the cpu-demo preset's 5000 for cpu-demo, and for base and big the 32000 of `bench_train.py --data`,
whose padded figures these then compare with), with random token ids (fixed seed; each pair its own ids,
each side ending in the end token). Pairs with a side longer than `--max-length` are left out, as `train`
leaves them out. A step is the one `train` runs: forward and label-smoothed loss
(`compilation.forward_and_loss`, the preset's epsilon), backward, and the paper's Adam
(`schedule.build_paper_optimizer`, fused), under bf16 autocast with `--bf16` (float32 otherwise). The
variants, each with its own copy of one initial model:

- padded-eager: `TokenBudgetBatchSampler` batches of `--max-tokens` padded tokens a side, collated by
  `DataCollatorForSeq2Seq` to each batch's longest, as `train` batches them;
- packed-eager: `PackedBatchSampler` batches collated by `PackingCollator`, as `train --packed-row-length`
  batches them: rows of `--packed-row-length` tokens on the side with more tokens, the other side's in
  proportion (`balanced_row_lengths`), as many rows as `--max-tokens` holds, carrying their segment ids
  to the device, where each step builds their masks (`with_packed_masks`, timed with the step): dense
  4-D masks for SDPA, or with `--packed-attention flex_attention` (CUDA only) flex attention's block
  masks, which skip the blocks where no pair meets another;
- with `--compile`, padded-compiled: the padded batches rounded up to multiples of 8
  (`compilation.SEQUENCE_MULTIPLE`) through `CompiledTrainingLoss(epsilon)`, whose batch dimensions are
  dynamic, as `train --compile` runs; and packed-compiled: the packed batches through
  `CompiledTrainingLoss(epsilon, static_shapes=True)`, as `train --compile --packed-row-length` runs. The
  layers are compiled once per class where the model's stacks are deep enough, as in `train`. With
  `--compile-mode reduce-overhead` the packed step is compiled in that mode of `torch.compile`, which on a
  GPU replays it as CUDA graphs (`train` does not use it).

Each variant trains on the first `--max-batches` batches of its sampler's epoch (seed 0): one first step,
`--warmup` untimed passes over the batches, then `--repeats` timed passes, the variants in alternating
order every round. Tokens per second count the real target tokens, not padding, over a pass's median time
(and over the fastest pass: `tokens_per_s_best`, the pass that other jobs on a shared machine slowed
least); a ratio is the median over rounds of the per-round ratio of the two variants' tokens per second.
Batches are collated and moved to the device before timing (the collators' time per batch is reported
apart). The two samplers' epochs cover the same pairs, each once (`epochs` in the output); where
`--max-batches` takes whole epochs, both variants train on the same pairs in a pass.

The compiled variants run before the eager ones, in a child process whose Inductor and Triton caches start
empty, in its run folder as `train --inductor-cache-in-run-folder` keeps them. Nothing compiled before is
found: packed-compiled first, whose first step's time is its cold compile (the step's own work included), then
its passes alone, then padded-compiled's first step (compiled after the packed step in the same process: not a
cold start) and the rounds of both. `graphs` counts the graphs Dynamo compiled for a variant
(`torch._dynamo.utils.counters`; 1: nothing recompiled). The child saves what it compiled for the packed step
right after that step (`torch.compiler.save_cache_artifacts`, through `compilation.CompileCache`, as a run
saves its own), and `--warm-start` then times the first packed compiled step in three more fresh processes:
after `torch.compiler.load_cache_artifacts` of that file in empty caches, as a run resumed on another machine
starts (`warm_start`); loading nothing, in the cold child's Inductor cache, as a run resumed on the same
machine starts (`warm_start_same_machine`); and from the run folder moved elsewhere, loading that file in the
folder's own Inductor cache, as a run resumed there with `--inductor-cache-in-run-folder` starts
(`warm_start_run_folder_kernels`). The two that stand for another machine get an empty temporary folder
(`TMPDIR`) as well: Inductor keeps its precompiled C++ header there, whatever its cache folder. None follows a
cold child that failed. The figures are written to `--output` after every phase, so that a run cut short keeps
what it measured.

`--compiled packed` leaves padded-compiled out: at base size `bench_train.py --data --presets base --modes
bf16-compile` times the same step on the same padded batches (its first `--max-steps` batches of the same
epoch: the same lengths, sampler and seed).

With `--device cuda` (without a GPU the script exits with status 2) the defaults not given become 16
batches, one warm-up pass and 2 timed rounds, and a step's time is taken between CUDA synchronizations.
`--quick` (what the tests run): the tiny model, one copy of the pairs, a 400-token BPE, batches of 600
tokens, rows of 128, 3 batches and one timed pass.
"""

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer, models
from torch._dynamo.utils import counters
from transformers import DataCollatorForSeq2Seq, PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    add_device_option,
    format_table,
    machine_line,
    parse_device_args,
    timed,
    write_result,
)
from bench_compile import padding  # noqa: E402
from bench_train import DEFAULT_DATA, NEWSTEST, newstest_lengths  # noqa: E402

from hf_vanilla_transformer import (  # noqa: E402
    VanillaTransformerConfig,
    VanillaTransformerForConditionalGeneration,
)
from hf_vanilla_transformer.training.batching import TokenBudgetBatchSampler  # noqa: E402
from hf_vanilla_transformer.training.compilation import (  # noqa: E402
    COMPILE_CACHE_FILE,
    SEQUENCE_MULTIPLE,
    CompileCache,
    CompiledTrainingLoss,
    forward_and_loss,
    run_folder_inductor_cache,
)
from hf_vanilla_transformer.training.packing import (  # noqa: E402
    SEGMENT_KEYS,
    PackedBatchSampler,
    PackingCollator,
    balanced_row_lengths,
    pack_pairs,
    packed_block_masks,
    with_packed_masks,
)
from hf_vanilla_transformer.training.presets import TRAINING_PRESETS  # noqa: E402
from hf_vanilla_transformer.training.schedule import build_paper_optimizer  # noqa: E402

# The batches of an epoch whose flex attention blocks are counted (`flex_blocks_share`): a sample.
BLOCK_SAMPLE = 20
# The CPU flags that decide the speed of a training step here (bf16 and matrix units).
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
# --speed's model sizes: the training presets' models, and a tiny one for the tests (cpu-demo's recipe).
TINY_MODEL = {"d_model": 64, "N": 2, "h": 4, "d_ff": 128}
# Per size where not given: the model's vocabulary (the presets'), the BPE vocabulary of the lengths (the
# cpu-demo preset's own; for base and big bench_train.py --data's, so that the padded figures compare) and
# the tokens a micro-batch holds a side (the paper's 25000 for base and big, Section 5.1; the cpu-demo
# preset's micro-batch).
SIZE_DEFAULTS = {
    "tiny": {"vocab": 1000, "bpe_vocab": 1000, "max_tokens": 600},
    "cpu-demo": {
        "vocab": TRAINING_PRESETS["cpu-demo"].vocab_size,
        "bpe_vocab": TRAINING_PRESETS["cpu-demo"].vocab_size,
        "max_tokens": TRAINING_PRESETS["cpu-demo"].max_tokens,
    },
    "base": {"vocab": TRAINING_PRESETS["base"].vocab_size, "bpe_vocab": 32000, "max_tokens": 25000},
    "big": {"vocab": TRAINING_PRESETS["big"].vocab_size, "bpe_vocab": 32000, "max_tokens": 25000},
}
# What --device cuda and --quick change, for the options not given.
CUDA_DEFAULTS = {"max_batches": 16, "warmup": 1, "repeats": 2}
QUICK_DEFAULTS = {
    "size": "tiny",
    "bpe_vocab": 400,
    "data_copies": 1,
    "max_tokens": 600,
    "row_lengths": [128],
    "packed_row_length": 128,
    "max_length": 128,
    "max_batches": 3,
    "warmup": 0,
    "repeats": 1,
}
# The special tokens, in the config's order (<s> 0, <pad> 1, </s> 2): random ids are drawn above them.
SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>")
FIRST_ORDINARY = len(SPECIAL_TOKENS)
PADDED, PACKED = "padded", "packed"
# The targets on a CPU for the first compiled packed step: cold, and warm (each of `WARM_STARTS`).
CPU_COLD_COMPILE_TARGET_S = {"cpu-demo": 40, "base": 60}
CPU_WARM_START_TARGET_S = 5
# The warm starts measured (`--warm-start`), each checked against `CPU_WARM_START_TARGET_S`: what `figures`
# calls it, and the resumed run it stands for.
WARM_STARTS = {
    "warm_start": "warm start from the run folder's compile cache alone, as on another machine",
    "warm_start_run_folder_kernels": "warm start from the run folder moved elsewhere with its Inductor "
    "cache (--inductor-cache-in-run-folder), as on another machine with the same CPU",
    "warm_start_same_machine": "warm start in the cold run's Inductor cache, as on the same machine",
}


def cpu_line() -> str:
    """The CPU's model name and which of `CPU_FLAGS` it has, from /proc/cpuinfo."""
    model, flags = "unknown CPU", set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    present = " ".join(f"{flag}={'yes' if flag in flags else 'no'}" for flag in CPU_FLAGS)
    return f"{model} ({present})"


def packed(src: list[int], tgt: list[int], row_length: int, max_tokens: int) -> dict:
    """The epoch of `PackedBatchSampler` batches whose longer rows are `row_length` tokens: its share of
    padded positions, batches, shape and the seconds the sampler took to pack it."""
    source_length, target_length = balanced_row_lengths(src, tgt, row_length)
    rows = max_tokens // max(source_length, target_length)
    started = time.perf_counter()
    batches = list(PackedBatchSampler(src, tgt, rows, source_length, target_length, seed=0))
    seconds = time.perf_counter() - started
    real = sum(src) + sum(tgt)
    return {
        "padding_share": 1 - real / (len(batches) * rows * (source_length + target_length)),
        "batches": len(batches),
        "shape": f"{rows}x{source_length} / {rows}x{target_length}",
        "sampler_s": seconds,
        "flex_blocks_share": flex_blocks_share(
            src, tgt, batches[:BLOCK_SAMPLE], rows, source_length, target_length
        ),
    }


def flex_blocks_share(
    src: list[int],
    tgt: list[int],
    batches: list[list[int]],
    rows: int,
    source_length: int,
    target_length: int,
) -> float:
    """The share of the attention's blocks of 128 x 128 (encoder self-, decoder self- and encoder-decoder
    attention together) that flex attention computes with `packed_block_masks` over `batches`, where the
    dense masks compute them all."""
    computed = total = 0
    for indices in batches:
        pairs = [([FIRST_ORDINARY] * src[index], [FIRST_ORDINARY] * tgt[index]) for index in indices]
        batch = pack_pairs(pairs, rows, source_length, target_length, 0, 0)
        for mask in packed_block_masks(batch.source_segments, batch.target_segments):
            blocks = mask.to_dense()
            computed, total = computed + int(blocks.sum()), total + blocks.numel()
    return computed / total


def padding_shares(args: argparse.Namespace, result: dict) -> None:
    """The default mode: the shares of padded positions, printed and put in `result`."""
    padded = padding(args)
    src, tgt, _ = newstest_lengths(Path(args.data), args.bpe_vocab)
    src, tgt = src * args.data_copies, tgt * args.data_copies
    token_budget_batches = len(TokenBudgetBatchSampler(src, tgt, max_tokens=args.max_tokens, seed=0))
    result["padded"] = padded | {"batches": token_budget_batches}
    result["packed"] = {length: packed(src, tgt, length, args.max_tokens) for length in args.row_lengths}

    varied = f"varies (<= {args.max_tokens} a side)"
    rows = [
        [name, padded[key], token_budget_batches, varied, ""]
        for name, key in (
            ("(a) padded to each batch's longest", "padding_share_longest"),
            ("(b) rounded up to multiples of 8", "padding_share_compiled"),
            ("    length buckets", "padding_share_buckets"),
        )
    ]
    rows += [
        [
            f"(c) packed, rows of {length}",
            figures["padding_share"],
            figures["batches"],
            figures["shape"],
            f"{figures['flex_blocks_share']:.1%}",
        ]
        for length, figures in result["packed"].items()
    ]
    print(
        f"{len(src)} pairs ({args.data_copies} copies of newstest2013+2014), {sum(src)} + {sum(tgt)} tokens"
    )
    print(
        format_table(
            [
                "batches",
                "positions padded",
                "batches an epoch",
                "shape (source / target)",
                f"flex attention blocks computed (first {BLOCK_SAMPLE} batches)",
            ],
            [[name, f"{share:.2%}", str(count), shape, blocks] for name, share, count, shape, blocks in rows],
        )
    )
    for length, figures in result["packed"].items():
        print(f"packing with rows of {length}: the sampler took {figures['sampler_s']:.1f} s for the epoch")


# --speed: the batches.

# A batch of pairs as (pair index, source length, target length): what a child process needs to build it.
Triples = list[tuple[int, int, int]]


def speed_data(args: argparse.Namespace) -> dict:
    """The newstest pairs' lengths under a BPE vocabulary of `--bpe-vocab`, pairs longer than
    `--max-length` on a side left out, `--data-copies` times; both samplers' epochs over them, and the first
    `--max-batches` batches of each, which the variants train on."""
    src, tgt, bpe_size = newstest_lengths(Path(args.data), args.bpe_vocab)
    kept = [i for i in range(len(src)) if max(src[i], tgt[i]) <= args.max_length]
    left_out = len(src) - len(kept)
    src, tgt = [src[i] for i in kept] * args.data_copies, [tgt[i] for i in kept] * args.data_copies
    epochs, sampler_s = {}, {}
    started = time.perf_counter()
    epochs[PADDED] = list(TokenBudgetBatchSampler(src, tgt, max_tokens=args.max_tokens, seed=0))
    sampler_s[PADDED] = time.perf_counter() - started
    # The packed batches' shape as `train --packed-row-length` sizes it (TokenBudgetSeq2SeqTrainer._packing).
    source_length, target_length = balanced_row_lengths(src, tgt, args.packed_row_length)
    rows = max(1, args.max_tokens // max(source_length, target_length))
    started = time.perf_counter()
    epochs[PACKED] = list(PackedBatchSampler(src, tgt, rows, source_length, target_length, seed=0))
    sampler_s[PACKED] = time.perf_counter() - started
    covered = {kind: sorted(i for batch in epoch for i in batch) for kind, epoch in epochs.items()}
    summary = {
        "folder": args.data,
        "pairs": len(kept),
        "pairs_left_out": left_out,
        "copies": args.data_copies,
        "bpe_vocab_size": bpe_size,
        "max_tokens": args.max_tokens,
        "packed_shape": {"rows": rows, "source_length": source_length, "target_length": target_length},
        "epochs": {
            kind: {
                "batches": len(epoch),
                "pairs": len(covered[kind]),
                "real_target_tokens": sum(tgt[i] for i in covered[kind]),
                "sampler_s": sampler_s[kind],
            }
            for kind, epoch in epochs.items()
        },
        "epochs_cover_every_pair_once": covered[PADDED] == covered[PACKED] == list(range(len(src))),
    }
    return {
        "summary": summary,
        "batches": {
            kind: [[(i, src[i], tgt[i]) for i in batch] for batch in epoch[: args.max_batches]]
            for kind, epoch in epochs.items()
        },
        "whole_epoch": {kind: args.max_batches >= len(epoch) for kind, epoch in epochs.items()},
        "packed_shape": [rows, source_length, target_length],
    }


def model_config(size: str, vocab: int) -> VanillaTransformerConfig:
    """The model of a training preset (its model preset and overrides), or the tiny test model."""
    if size == "tiny":
        return VanillaTransformerConfig.from_preset("base", vocab_size=vocab, **TINY_MODEL)
    preset = TRAINING_PRESETS[size]
    return VanillaTransformerConfig.from_preset(
        preset.model_preset, vocab_size=vocab, **preset.model_overrides
    )


def label_smoothing(size: str) -> float:
    return TRAINING_PRESETS["cpu-demo" if size == "tiny" else size].label_smoothing


def special_tokens_tokenizer(config: VanillaTransformerConfig) -> PreTrainedTokenizerFast:
    """A tokenizer of the special tokens only, with the config's pad id: all `DataCollatorForSeq2Seq` reads
    of a tokenizer is how to pad."""
    vocabulary = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocabulary, unk_token="<unk>")),
        bos_token="<s>",
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
    )
    # Padding ids that are already tokens is what the collator is for: no advice to tokenize while padding.
    tokenizer.deprecation_warnings["Asking-to-pad-a-fast-tokenizer"] = True
    if tokenizer.pad_token_id != config.pad_token_id or tokenizer.eos_token_id != config.eos_token_id:
        raise SystemExit(f"the config's special ids differ from {SPECIAL_TOKENS}")
    return tokenizer


def features(batch: Triples, config: VanillaTransformerConfig) -> list[dict[str, list[int]]]:
    """The tokenized pairs of `batch` as `data.tokenize_pairs` makes them: random ordinary ids of the pairs'
    lengths, drawn from the pair's index (the same ids in every variant and process), each side ending in
    the end token."""
    made = []
    for index, source_length, target_length in batch:
        ids = np.random.default_rng([0, index]).integers(
            FIRST_ORDINARY, config.vocab_size, source_length + target_length
        )
        source, target = ids[:source_length].tolist(), ids[source_length:].tolist()
        source[-1] = target[-1] = config.eos_token_id
        made.append({"input_ids": source, "attention_mask": [1] * source_length, "labels": target})
    return made


def collated(
    kind: str, batches: list[Triples], model: torch.nn.Module, compiled: bool, shape: list[int], device: str
) -> tuple[list[dict[str, torch.Tensor]], float]:
    """`batches` collated as `train` collates them (padded: to the longest, rounded up to multiples of
    `SEQUENCE_MULTIPLE` when compiled; packed: `PackingCollator` of `shape`), on `device`, and the
    collator's seconds per batch."""
    config = model.config
    if kind == PADDED:
        multiple = SEQUENCE_MULTIPLE if compiled else None
        collate = DataCollatorForSeq2Seq(
            special_tokens_tokenizer(config), model=model, pad_to_multiple_of=multiple
        )
    else:
        collate = PackingCollator(
            *shape, config.pad_token_id, config.decoder_start_token_id, with_masks=False
        )
    inputs = [features(batch, config) for batch in batches]
    started = time.perf_counter()
    made = [dict(collate(batch)) for batch in inputs]
    seconds = (time.perf_counter() - started) / max(1, len(made))
    return [{key: value.to(device) for key, value in batch.items()} for batch in made], seconds


# --speed: the steps.


def graph_count() -> int:
    """The graphs Dynamo has compiled in this process."""
    return counters["stats"]["unique_graphs"]


def cache_counts() -> dict[str, int]:
    """How often this process found a compiled graph in torch's caches (Inductor's FX graph cache and
    AOTAutograd's cache) and how often it compiled one."""
    return {
        f"{group}.{name}": count
        for group in ("inductor", "aot_autograd")
        for name, count in counters[group].items()
        if "cache" in name
    }


@dataclass
class Variant:
    """One way of training (model, optimizer, loss function, collated batches) and what was measured."""

    name: str
    model: torch.nn.Module
    loss: Callable[[torch.nn.Module, dict[str, torch.Tensor]], torch.Tensor]
    batches: list[dict[str, torch.Tensor]]
    collate_s: float
    whole_epoch: bool
    device: str
    bf16: bool
    optimizer: torch.optim.Optimizer = field(init=False)
    times: list[float] = field(default_factory=list)
    first_step_s: float | None = None
    graphs_first_step: int = 0
    graphs: int = 0
    last_loss: torch.Tensor | None = None

    def __post_init__(self) -> None:
        self.optimizer = build_paper_optimizer(self.model, lr=1e-4)

    def step(self, batch: dict[str, torch.Tensor]) -> None:
        if SEGMENT_KEYS[0] in batch:  # packed: its masks built on the device, as `train` builds them
            batch = with_packed_masks(batch, attn_implementation=self.model.config._attn_implementation)
        autocast = torch.autocast(self.device, dtype=torch.bfloat16) if self.bf16 else nullcontext()
        with autocast:
            loss = self.loss(self.model, batch)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        # A copy: under CUDA graphs the next replay overwrites the step's output.
        self.last_loss = loss.detach().clone()

    def first_step(self) -> None:
        """The first step (a compiled variant's compilation), timed on its own."""
        before = graph_count()
        self.first_step_s = timed(lambda: self.step(self.batches[0]), self.device)
        self.graphs_first_step = graph_count() - before
        self.graphs += self.graphs_first_step

    def train_pass(self) -> float:
        """The seconds of one pass over the batches."""
        before = graph_count()
        seconds = timed(lambda: [self.step(batch) for batch in self.batches], self.device)
        self.graphs += graph_count() - before
        return seconds

    def tokens(self, side: str, real: bool) -> int:
        """The batches' real (non-pad) or all positions on a side (source or target)."""
        key, pad = ("labels", -100) if side == "target" else ("input_ids", self.model.config.pad_token_id)
        return sum(int((batch[key] != pad).sum()) if real else batch[key].numel() for batch in self.batches)

    def figures(self) -> dict[str, Any]:
        steps = len(self.batches)
        real = {side: self.tokens(side, real=True) for side in ("source", "target")}
        positions = {side: self.tokens(side, real=False) for side in ("source", "target")}
        shapes = {(tuple(b["input_ids"].shape), tuple(b["labels"].shape)) for b in self.batches}
        figures: dict[str, Any] = {
            "steps_per_pass": steps,
            "whole_epoch": self.whole_epoch,
            "real_target_tokens_per_pass": real["target"],
            "real_source_tokens_per_pass": real["source"],
            "real_target_tokens_per_step": real["target"] / steps,
            "padded_share": 1 - sum(real.values()) / sum(positions.values()),
            "padded_share_target": 1 - real["target"] / positions["target"],
            "batch_shapes": len(shapes),
            "collate_s_per_batch": self.collate_s,
            "first_step_s": self.first_step_s,
            "graphs_first_step": self.graphs_first_step,
            "graphs": self.graphs,
            "pass_seconds": self.times,
        }
        if self.times:
            median = statistics.median(self.times)
            figures |= {
                "step_s": median / steps,
                "tokens_per_s": real["target"] / median,
                # The fastest pass: on a machine shared with other jobs, the one they slowed down least.
                "tokens_per_s_best": real["target"] / min(self.times),
            }
        if self.last_loss is not None:
            figures["loss"] = float(self.last_loss)
        return figures


def rounds(variants: list[Variant], warmup: int, repeats: int) -> list[dict[str, float]]:
    """`warmup` untimed passes of every variant, then `repeats` timed ones, in alternating order; the timed
    passes' seconds by variant, one dict a round."""
    timed_rounds = []
    for round_ in range(warmup + repeats):
        order = variants if round_ % 2 == 0 else variants[::-1]
        seconds = {variant.name: variant.train_pass() for variant in order}
        if round_ >= warmup:
            for variant in variants:
                variant.times.append(seconds[variant.name])
            timed_rounds.append(seconds)
        print(
            f"  [{', '.join(v.name for v in variants)}] round {round_ + 1}/{warmup + repeats}",
            file=sys.stderr,
        )
    return timed_rounds


def paired_ratio(
    timed_rounds: list[dict[str, float]], variants: dict[str, Variant], packed_: str, padded_: str
) -> float | None:
    """The median over rounds of packed's tokens per second over padded's, or None without rounds."""
    if not timed_rounds:
        return None
    tokens = {name: variants[name].tokens("target", real=True) for name in (packed_, padded_)}
    return statistics.median(
        (tokens[packed_] / seconds[packed_]) / (tokens[padded_] / seconds[padded_])
        for seconds in timed_rounds
    )


def new_model(args: argparse.Namespace) -> torch.nn.Module:
    """The model of `--size` with the same initial weights every time, training on `--device`."""
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(model_config(args.size, args.vocab))
    return model.to(args.device).train()


def variant(name: str, args: argparse.Namespace, data: dict, stack: ExitStack) -> Variant:
    """The variant `name` (padded-eager, packed-eager, padded-compiled, packed-compiled) over `data`'s
    batches; a compiled variant's layers stay marked as compile regions for the life of `stack`."""
    kind, how = name.split("-")
    model = new_model(args)
    if kind == PACKED:
        model.set_attn_implementation(args.packed_attention)
    epsilon = label_smoothing(args.size)
    if how == "compiled":
        mode = args.compile_mode if kind == PACKED else None
        compiled = CompiledTrainingLoss(epsilon, static_shapes=kind == PACKED, mode=mode)
        stack.enter_context(compiled.regions(model))

        def loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
            return compiled(model, batch, None)
    else:

        def loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
            return forward_and_loss(model, batch, epsilon, None)

    batches, collate_s = collated(
        kind, data["batches"][kind], model, how == "compiled", data["packed_shape"], args.device
    )
    return Variant(name, model, loss, batches, collate_s, data["whole_epoch"][kind], args.device, args.bf16)


def prepare_device(args: argparse.Namespace) -> None:
    if args.device == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32, as `train` sets on GPUs that have it


def write_json(value: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(value, indent=1))


# --speed: the child processes of the compiled variants.


def child_compiled(spec: dict) -> None:
    """packed-compiled's cold compile (its cache saved) and its passes, then, where `--compiled` has it,
    padded-compiled's first step and the rounds of both; the figures written to the spec's result file
    after every phase."""
    args, data = argparse.Namespace(**spec["args"]), spec["data"]
    prepare_device(args)
    result: dict[str, Any] = {"variants": {}}
    with ExitStack() as stack:
        variants: dict[str, Variant] = {}

        def save(phase: str) -> None:
            result["phase"] = phase
            result["variants"] = {name: v.figures() for name, v in variants.items()}
            result["graph_breaks"] = sum(counters["graph_break"].values())
            result["caches"] = cache_counts()
            write_json(result, spec["result"])

        variants["packed-compiled"] = variant("packed-compiled", args, data, stack)
        variants["packed-compiled"].first_step()
        CompileCache(spec["run_folder"]).save()
        save("packed-compiled first step")
        rounds([variants["packed-compiled"]], args.warmup, args.repeats)
        save("packed-compiled passes")
        if PADDED not in args.compiled:
            save("done")
            return
        variants["padded-compiled"] = variant("padded-compiled", args, data, stack)
        variants["padded-compiled"].first_step()
        save("padded-compiled first step")
        rounds([variants["padded-compiled"]], args.warmup, 0)
        timed_rounds = rounds(list(variants.values()), 0, args.repeats)
        result["packed_over_padded"] = paired_ratio(
            timed_rounds, variants, "packed-compiled", "padded-compiled"
        )
        save("done")


def child_warm(spec: dict, from_run_folder: bool) -> None:
    """The first packed compiled step after loading the compile cache that the cold child saved in the run
    folder (`from_run_folder`), or without it, in the cold child's own Inductor cache directory."""
    args, data = argparse.Namespace(**spec["args"]), spec["data"]
    prepare_device(args)
    started = time.perf_counter()
    loaded = CompileCache(spec["run_folder"]).load() if from_run_folder else None
    result: dict[str, Any] = {"loaded": loaded, "load_s": time.perf_counter() - started}
    with ExitStack() as stack:
        packed_ = variant("packed-compiled", args, data, stack)
        packed_.first_step()
        result |= {"first_step_s": packed_.first_step_s, "graphs": packed_.graphs, "caches": cache_counts()}
        write_json(result, spec["result"])
        before = graph_count()
        result["step_s"] = timed(lambda: packed_.step(packed_.batches[-1]), args.device)
        result["graphs"] += graph_count() - before
    write_json(result, spec["result"])


def run_child(
    mode: str,
    spec: dict,
    folder: Path,
    into: dict,
    caches: Path | None = None,
    name: str | None = None,
    temporary: Path | None = None,
) -> None:
    """The child process `mode` (see `CHILDREN`) with the Inductor and Triton caches in `caches`, by default
    empty ones of its own, and `temporary` as its temporary folder (`TMPDIR`; None: this process's); what it
    wrote put in `into`, also where it failed or was interrupted. Its files in `folder` are named `name` (by
    default the mode's)."""
    name = name or mode
    spec = spec | {"result": str(folder / f"{name}.json")}
    spec_path = folder / f"{name}-spec.json"
    write_json(spec, spec_path)
    caches = caches or Path(tempfile.mkdtemp(prefix=f"inductor-{mode}-", dir=folder))
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(caches), "TRITON_CACHE_DIR": str(caches / "triton")}
    if temporary is not None:
        temporary.mkdir(parents=True, exist_ok=True)
        env["TMPDIR"] = str(temporary)
    started = time.perf_counter()
    status = None
    try:
        status = subprocess.run(
            [sys.executable, __file__, "--child", mode, "--spec", str(spec_path)], env=env
        ).returncode
    finally:
        result = Path(spec["result"])
        into.update(json.loads(result.read_text()) if result.is_file() else {})
        into["process_s"] = time.perf_counter() - started
        if status != 0:
            into["error"] = "interrupted" if status is None else f"exit status {status} (its output is above)"


# The child processes: the compiled variants from a cold start; the first packed compiled step warm, from the
# run folder's compile cache (in empty caches, or in the Inductor cache of the run folder moved elsewhere),
# and in the cold child's Inductor cache without it.
CHILDREN: dict[str, Callable[[dict], None]] = {
    "compiled": child_compiled,
    "warm": partial(child_warm, from_run_folder=True),
    "warm-machine": partial(child_warm, from_run_folder=False),
}


# --speed: the parent.


def speed(args: argparse.Namespace, result: dict, save: Callable[[], None]) -> None:
    """The variants' speeds (see the module docstring), put in `result["speed"]`, saved after each phase."""
    prepare_device(args)
    print(f"--speed: preparing the batches (BPE of {args.bpe_vocab} on {args.data})", file=sys.stderr)
    data = speed_data(args)
    config = model_config(args.size, args.vocab)
    parameters = sum(p.numel() for p in VanillaTransformerForConditionalGeneration(config).parameters())
    figures: dict[str, Any] = {
        "size": args.size,
        "model": {
            "d_model": config.d_model,
            "layers": config.encoder_layers,
            "heads": config.encoder_attention_heads,
            "ffn": config.encoder_ffn_dim,
            "vocab": config.vocab_size,
            "parameters": parameters,
        },
        "label_smoothing": label_smoothing(args.size),
        "device": args.device,
        "precision": "bf16 autocast" if args.bf16 else "float32",
        "packed_attention": args.packed_attention,
        "packed_compile_mode": args.compile_mode,
        "data": data["summary"],
        "variants": {},
    }
    result["speed"] = figures
    save()
    if args.compile:
        compiled_variants(args, data, figures, save)
    with ExitStack() as stack:
        eager = {name: variant(name, args, data, stack) for name in ("padded-eager", "packed-eager")}
        for variant_ in eager.values():
            variant_.first_step()
        timed_rounds = rounds(list(eager.values()), args.warmup, args.repeats)
        figures["variants"] = {name: v.figures() for name, v in eager.items()} | figures["variants"]
        figures["packed_over_padded_eager"] = paired_ratio(
            timed_rounds, eager, "packed-eager", "padded-eager"
        )
    save()


def compiled_variants(args: argparse.Namespace, data: dict, figures: dict, save: Callable[[], None]) -> None:
    """The compiled variants in a child process, then the warm starts (`--warm-start`), each in its own."""
    spec = {
        "args": vars(args),
        "data": {key: data[key] for key in ("batches", "whole_epoch", "packed_shape")},
    }
    with tempfile.TemporaryDirectory(prefix="bench-packing-") as folder:
        run_folder = Path(folder) / "run"
        spec["run_folder"] = str(run_folder)
        compiled: dict[str, Any] = {}
        # The cold child's Inductor cache in its run folder, as `--inductor-cache-in-run-folder` keeps it.
        caches = run_folder_inductor_cache(run_folder)
        try:
            run_child("compiled", spec, Path(folder), compiled, caches)
        finally:
            figures["variants"] |= compiled.pop("variants", {})
            figures["packed_over_padded_compiled"] = compiled.pop("packed_over_padded", None)
            figures["compiled_process"] = compiled
            save()
        if args.warm_start:
            warm_starts(Path(folder), spec, caches, "error" in compiled, figures, save)


def warm_starts(
    folder: Path, spec: dict, caches: Path, cold_failed: bool, figures: dict, save: Callable[[], None]
) -> None:
    """The warm starts of `WARM_STARTS` after the cold child's run in `folder` with its Inductor cache in
    `caches`, each child in its own process, the figures put in `figures` and saved after each; none where
    the cold child failed, whose caches they would start from."""
    run_folder = Path(spec["run_folder"])
    if cold_failed or not (run_folder / COMPILE_CACHE_FILE).is_file():
        for key in WARM_STARTS:
            figures[key] = {"error": "no warm start: the cold child failed"}
        save()
        return
    elsewhere = folder / "run-elsewhere"
    # (figure, child, its run folder, its Inductor cache: None for an empty one, whether it stands for another
    # machine); the run folder is moved elsewhere before the last, as a resumed run finds it there.
    starts = (
        ("warm_start", "warm", run_folder, None, True),
        ("warm_start_same_machine", "warm-machine", run_folder, caches, False),
        ("warm_start_run_folder_kernels", "warm", elsewhere, run_folder_inductor_cache(elsewhere), True),
    )
    for key, mode, start_folder, start_caches, another_machine in starts:
        if start_folder == elsewhere:
            shutil.move(run_folder, elsewhere)
        # Another machine lacks what the cold child left in the temporary folder (Inductor's precompiled C++
        # header, in `/tmp` whatever its cache folder).
        temporary = folder / f"tmp-{key}" if another_machine else None
        figures[key] = {}
        try:
            spec_ = spec | {"run_folder": str(start_folder)}
            run_child(mode, spec_, folder, figures[key], start_caches, name=key, temporary=temporary)
        finally:
            save()


def targets(figures: dict, size: str) -> list[dict[str, Any]]:
    """The CPU targets of the first compiled packed step, cold and (where measured) warm: measured, target,
    met."""
    rows = []
    if size in CPU_COLD_COMPILE_TARGET_S:
        cold = figures.get("variants", {}).get("packed-compiled", {}).get("first_step_s")
        what = f"cold compile of the {size} packed step"
        rows.append({"what": what, "measured_s": cold, "target_s": CPU_COLD_COMPILE_TARGET_S[size]})
    for key, what in WARM_STARTS.items():
        if key in figures:
            warm = figures[key].get("first_step_s")
            rows.append({"what": what, "measured_s": warm, "target_s": CPU_WARM_START_TARGET_S})
    for row in rows:
        row["met"] = None if row["measured_s"] is None else row["measured_s"] <= row["target_s"]
    return rows


def print_speed(figures: dict) -> None:
    def number(value: float | None, spec: str) -> str:
        return format(value, spec) if value is not None else "-"

    data = figures["data"]
    shape = data["packed_shape"]
    millions = figures["model"]["parameters"] / 1e6
    print(
        f"{figures['size']} model ({millions:.1f}M parameters), {figures['device']}, {figures['precision']}; "
        f"{data['pairs']} pairs x {data['copies']} copies, batches of {data['max_tokens']} tokens a side; "
        f"packed rows {shape['rows']} x {shape['source_length']} / {shape['target_length']}"
    )
    rows = [
        [
            name,
            str(v.get("steps_per_pass", "")),
            number(v.get("real_target_tokens_per_step"), ".0f"),
            number(v.get("padded_share"), ".2%"),
            number(v.get("step_s"), ".3f"),
            number(v.get("tokens_per_s"), ",.0f"),
            number(v.get("tokens_per_s_best"), ",.0f"),
            number(v.get("first_step_s"), ".2f"),
            str(v.get("graphs", "")) if name.endswith("compiled") else "",
        ]
        for name, v in figures["variants"].items()
    ]
    header = [
        "variant",
        "steps",
        "real target tok/step",
        "padded",
        "step s",
        "target tok/s",
        "best pass",
        "first step s",
        "graphs",
    ]
    print(format_table(header, rows))
    for how in ("eager", "compiled"):
        ratio = figures.get(f"packed_over_padded_{how}")
        if ratio is not None:
            print(f"packed / padded target tokens a second, {how}: {ratio:.2f}x (median of paired rounds)")
    if "error" in figures.get("compiled_process", {}):
        print(f"compiled variants: {figures['compiled_process']['error']}")
    for key, what in WARM_STARTS.items():
        warm = figures.get(key)
        if warm is not None:
            print(
                f"{what}: first packed compiled step {number(warm.get('first_step_s'), '.2f')} s, "
                f"graphs {warm.get('graphs')}" + (f" ({warm['error']})" if "error" in warm else "")
            )
    for row in figures.get("targets", []):
        measured = number(row["measured_s"], ".1f")
        print(f"target: {row['what']}: {measured} s (<= {row['target_s']} s: {row['met']})")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_device_option(parser)
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="folder of the newstest2013/2014 files")
    parser.add_argument(
        "--bpe-vocab", type=int, help="BPE vocabulary of the lengths (default 32000; --speed: the size's)"
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        help="tokens a batch a side (default 25000, Section 5.1; --speed: per micro-batch, the size's)",
    )
    parser.add_argument("--data-copies", type=int, default=100)
    parser.add_argument("--row-lengths", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--speed", action="store_true", help="time training steps, padded and packed")
    parser.add_argument("--size", default="cpu-demo", choices=sorted(SIZE_DEFAULTS), help="--speed's model")
    parser.add_argument("--vocab", type=int, help="--speed: the model's vocabulary (default: the preset's)")
    parser.add_argument("--packed-row-length", type=int, default=256, help="--speed: as train's flag")
    parser.add_argument("--max-length", type=int, default=256, help="--speed: longest pair side kept")
    parser.add_argument("--max-batches", type=int, default=8, help="--speed: batches a pass")
    parser.add_argument("--warmup", type=int, default=1, help="--speed: untimed passes")
    parser.add_argument("--repeats", type=int, default=3, help="--speed: timed passes")
    parser.add_argument("--bf16", action="store_true", help="--speed: bf16 autocast")
    parser.add_argument("--compile", action="store_true", help="--speed: also the compiled steps")
    parser.add_argument(
        "--compiled",
        nargs="+",
        choices=[PACKED, PADDED],
        default=[PACKED, PADDED],
        help="--compile: the compiled variants (packed always: it comes first)",
    )
    parser.add_argument("--warm-start", action="store_true", help="--speed --compile: and a warm start")
    parser.add_argument(
        "--packed-attention",
        choices=["sdpa", "flex_attention"],
        default="sdpa",
        help="--speed: the packed variants' attention: SDPA with dense 4-D masks, or flex attention with "
        "block masks (CUDA only: it has no backward pass on a CPU)",
    )
    parser.add_argument(
        "--compile-mode",
        choices=["reduce-overhead"],
        help="--compile: torch.compile's mode for the packed compiled step (reduce-overhead: CUDA graphs)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny model, small data: a smoke test")
    parser.add_argument("--output", help="also write the figures to this JSON file")
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parse_device_args(parser, argv, CUDA_DEFAULTS)
    if args.child:
        CHILDREN[args.child](json.loads(Path(args.spec).read_text()))
        return {}
    if args.quick:
        parser.set_defaults(**QUICK_DEFAULTS)
        args = parser.parse_args(argv)
    if (args.compile or args.warm_start) and not args.speed:
        parser.error("--compile and --warm-start time steps: give --speed")
    if args.warm_start and not args.compile:
        parser.error("--warm-start starts from what --compile's cold run saved: give --compile")
    if args.compile_mode and not args.compile:
        parser.error("--compile-mode is the compiled packed step's: give --speed --compile")
    if args.packed_attention == "flex_attention" and args.device != "cuda":
        parser.error("--packed-attention flex_attention trains on CUDA only: give --device cuda")
    if args.speed:
        defaults = SIZE_DEFAULTS[args.size]
        args.vocab = args.vocab or defaults["vocab"]
        args.max_tokens = args.max_tokens or defaults["max_tokens"]
        args.bpe_vocab = args.bpe_vocab or defaults["bpe_vocab"]
    else:
        args.max_tokens = args.max_tokens or 25000
        args.bpe_vocab = args.bpe_vocab or 32000

    result: dict = {
        "command": shlex.join(["python", *sys.argv]),
        "cpu": cpu_line(),
        "machine": machine_line(),
        "args": vars(args),
    }
    print(f"command: {result['command']}\ncpu: {result['cpu']}")
    files = [Path(args.data) / f"{name}.{side}" for name in NEWSTEST for side in ("en", "de")]
    missing = [file.name for file in files if not file.is_file()]
    if missing:
        result["skipped"] = f"no newstest lengths: {args.data} lacks {', '.join(missing)} (give --data DIR)"
        print(f"skipped: {result['skipped']}")
    elif not args.speed:
        padding_shares(args, result)
    else:

        def save() -> None:
            if args.output:
                write_json(result, args.output)

        # A stop by `timeout` ends the run through the blocks that save what it measured.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
        speed(args, result, save)
        if args.compile and args.device == "cpu":
            result["speed"]["targets"] = targets(result["speed"], args.size)
        print_speed(result["speed"])
    if args.output:
        write_result(result, args.output)
    return result


if __name__ == "__main__":
    main()
