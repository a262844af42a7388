"""Packed training batches (`hf_vanilla_transformer.training.packing`): the layout of the rows, the errors
for pairs that do not fit, the batches of the sampler, and above all that a packed batch trains as the
ordinary padded batch of the same pairs does: the padded forward (each pair in a row of its own) is the
truth for every pair's log-likelihood, label-smoothed loss and gradients. Then the packed training step
compiled once for every batch: one graph, no recompilation, no graph break."""

import itertools
import json
import math
import random

import pytest
import torch
from conftest import tiny_model
from datasets import Dataset
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from torch._dynamo.utils import counters
from torch.utils.data import DataLoader
from transformers import DataCollatorForSeq2Seq, PreTrainedTokenizerFast

from hf_vanilla_transformer.training.compilation import CompiledTrainingLoss
from hf_vanilla_transformer.training.loss import label_smoothed_cross_entropy
from hf_vanilla_transformer.training.packing import (
    PADDING_SEGMENT,
    SEGMENT_KEYS,
    PackedBatchSampler,
    PackingCollator,
    balanced_row_lengths,
    pack_pairs,
    packed_attention_masks,
    place_pairs,
    with_packed_masks,
)

BOS, PAD = 0, 1
VOCAB = 64
NO_DROPOUT = {"P_drop": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0}
MASK_KEYS = ("attention_mask", "decoder_attention_mask", "cross_attention_mask")


def random_pairs(count: int, seed: int = 0, longest: int = 20) -> list[tuple[list[int], list[int]]]:
    """Pairs of 1 to `longest` random tokens a side (no padding or start token among them)."""
    rng = random.Random(seed)

    def sentence() -> list[int]:
        return [rng.randrange(3, VOCAB) for _ in range(rng.randint(1, longest))]

    return [(sentence(), sentence()) for _ in range(count)]


def padded_batch(pairs) -> dict[str, torch.Tensor]:
    """The ordinary batch of `pairs`: one pair a row, padded on the right to the longest of each side."""
    source = torch.full((len(pairs), max(len(s) for s, _ in pairs)), PAD)
    labels = torch.full((len(pairs), max(len(t) for _, t in pairs)), -100)
    for row, (s, t) in enumerate(pairs):
        source[row, : len(s)] = torch.tensor(s)
        labels[row, : len(t)] = torch.tensor(t)
    return {"input_ids": source, "attention_mask": (source != PAD).long(), "labels": labels}


def token_log_likelihoods(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log p(label) at every position, 0 where the label is -100."""
    log_probs = logits.log_softmax(-1).gather(-1, labels.clamp_min(0)[..., None])[..., 0]
    return torch.where(labels != -100, log_probs, 0.0)


def per_pair_log_likelihoods(model, pairs, rows: int, length: int, dtype=torch.float32):
    """(packed, padded): each pair's summed target log-likelihood from a packed forward and from the padded
    one, summed in float64 so that only the forwards differ."""
    packed = pack_pairs(pairs, rows, length, length, PAD, model.config.decoder_start_token_id)
    inputs = packed.model_inputs(dtype)
    with torch.no_grad():
        tokens = token_log_likelihoods(model(**inputs).logits, inputs["labels"])
        padded_tokens = token_log_likelihoods(
            model(**padded_batch(pairs)).logits, padded_batch(pairs)["labels"]
        )
    return summed_per_pair(tokens, packed, len(pairs)), padded_tokens.double().sum(-1)


def summed_per_pair(tokens: torch.Tensor, packed, pairs: int) -> torch.Tensor:
    """The packed target tokens' values summed per pair, in float64, the padding left out."""
    real = packed.target_segments != PADDING_SEGMENT
    return torch.zeros(pairs, dtype=torch.float64).index_add_(
        0, packed.target_segments[real], tokens[real].double()
    )


def test_pairs_lie_end_to_end_with_their_own_positions():
    pairs = [([5, 6, 7], [8, 9]), ([10, 11], [12, 13, 14, 15]), ([16], [17])]
    batch = pack_pairs(pairs, rows=2, source_length=4, target_length=5, pad_id=PAD, decoder_start_id=BOS)
    # The largest share of a row first: pair 1's target (4 of 5), then pair 0 (3 of 4), then pair 2.
    assert batch.input_ids.tolist() == [[10, 11, 16, PAD], [5, 6, 7, PAD]]
    assert batch.position_ids.tolist() == [[0, 1, 0, 0], [0, 1, 2, 0]]
    assert batch.source_segments.tolist() == [[1, 1, 2, -1], [0, 0, 0, -1]]
    assert batch.labels.tolist() == [[12, 13, 14, 15, 17], [8, 9, -100, -100, -100]]
    # Each target shifted right by one from the start token (Section 3.1), within its own pair.
    assert batch.decoder_input_ids.tolist() == [[BOS, 12, 13, 14, BOS], [BOS, 8, PAD, PAD, PAD]]
    assert batch.decoder_position_ids.tolist() == [[0, 1, 2, 3, 0], [0, 1, 0, 0, 0]]
    assert batch.target_segments.tolist() == [[1, 1, 1, 1, 2], [0, 0, -1, -1, -1]]
    assert batch.padded_fraction == pytest.approx(5 / 18)


def test_packing_is_deterministic_and_pads_only_row_tails():
    pairs = random_pairs(40)
    first, second = (pack_pairs(pairs, 8, 64, 64, PAD, BOS) for _ in range(2))
    for name in ("input_ids", "source_segments", "decoder_input_ids", "labels"):
        assert torch.equal(getattr(first, name), getattr(second, name))
    for segments in (first.source_segments, first.target_segments):
        padding = segments == PADDING_SEGMENT
        # Once a row's padding starts, it goes on to the end of the row.
        assert torch.equal(padding, padding.cummax(-1).values)
    for index, (source, target) in enumerate(pairs):
        assert first.input_ids[first.source_segments == index].tolist() == source
        assert first.position_ids[first.source_segments == index].tolist() == list(range(len(source)))
        assert first.labels[first.target_segments == index].tolist() == target
        assert first.decoder_input_ids[first.target_segments == index].tolist() == [BOS, *target[:-1]]
        # The two sides of a pair share their row.
        source_rows, target_rows = (
            (segments == index).nonzero()[:, 0].unique()
            for segments in (first.source_segments, first.target_segments)
        )
        assert len(source_rows) == 1 and torch.equal(source_rows, target_rows)


def test_a_pair_longer_than_a_row_is_named_with_the_fix():
    with pytest.raises(ValueError, match=r"Pair 1 has 3 source and 9 target tokens.*at least 4 and 9"):
        place_pairs([(2, 2), (3, 9)], rows=4, source_length=4, target_length=8)
    with pytest.raises(ValueError, match="at least one token on each side"):
        place_pairs([(2, 0)], rows=4, source_length=4, target_length=8)


def test_pairs_beyond_the_rows_are_refused_with_the_shortfall():
    with pytest.raises(ValueError, match=r"3 pairs of 9 source and 6 target tokens do not fit in 2 rows"):
        place_pairs([(3, 2)] * 3, rows=2, source_length=4, target_length=8)


def test_masks_keep_attention_within_each_pair():
    """Two pairs and padding in one row: source tokens 0-1 and target tokens 0-2 are pair 0's, source 2 and
    target 3 pair 1's, the last source token padding."""
    source = torch.tensor([[0, 0, 1, -1]])
    target = torch.tensor([[0, 0, 0, 1]])
    encoder, decoder, cross = (mask[0, 0] == 0 for mask in packed_attention_masks(source, target))
    assert encoder.int().tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [1, 1, 1, 1]]
    assert decoder.int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 1]]
    assert cross.int().tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0]]
    assert packed_attention_masks(source, target, torch.bfloat16)[0].dtype == torch.bfloat16


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_packed_log_likelihood_of_every_pair_equals_the_padded_one(attention, positions):
    """Pairs of 1 to 20 tokens, 4 to 7 of them a row: each pair's summed log-likelihood is the one it has
    alone in a padded batch, to float32 rounding."""
    model = tiny_model(vocab_size=VOCAB, pad_token_id=PAD, position_embedding_type=positions, **NO_DROPOUT)
    model.set_attn_implementation(attention)
    packed, padded = per_pair_log_likelihoods(model, random_pairs(30, seed=1), rows=6, length=64)
    torch.testing.assert_close(packed, padded, rtol=1e-5, atol=1e-5)


def test_flex_attention_with_block_masks_gives_every_pair_its_padded_log_likelihood(fresh_dynamo):
    """A model whose attention is flex attention takes the packed rows' block masks
    (`with_packed_masks(..., attn_implementation="flex_attention")`) through its mask functions, and each
    pair's log-likelihood is the one it has alone in a padded batch under SDPA. Dynamo's eager backend runs
    flex attention's reference kernel, which a CPU can run without Inductor's flex kernels; it reads the
    mask function, not the block lists, so the lists are checked apart: every key a real query may attend
    to lies in a listed block."""
    model = tiny_model(vocab_size=VOCAB, pad_token_id=PAD, **NO_DROPOUT).eval()
    pairs = random_pairs(30, seed=1)
    packed = pack_pairs(pairs, 2, 512, 512, PAD, model.config.decoder_start_token_id)
    inputs = with_packed_masks(packed.segment_inputs(), attn_implementation="flex_attention")
    assert {type(inputs[key]).__name__ for key in MASK_KEYS} == {"BlockMask"}
    dense = packed_attention_masks(packed.source_segments, packed.target_segments)
    real_queries = (packed.source_segments, packed.target_segments, packed.target_segments)
    for key, additive, queries in zip(MASK_KEYS, dense, real_queries, strict=True):
        blocks = inputs[key].to_dense()  # rows of 4 blocks of 128: other pairs' blocks and padding's skipped
        assert 0 < blocks.sum() <= blocks.numel() / 4, key
        # Every key a real query may attend to lies in a block the mask lists: skipping the rest loses none.
        listed = blocks.repeat_interleave(128, -2).repeat_interleave(128, -1)[..., : additive.shape[-2], :]
        allowed = (additive == 0) & (queries != PADDING_SEGMENT)[:, None, :, None]
        assert allowed.sum() > 0 and not (allowed & (listed[..., : additive.shape[-1]] == 0)).any(), key
    model.set_attn_implementation("flex_attention")
    with torch.no_grad():
        logits = torch.compile(model, backend="eager", fullgraph=True)(**inputs).logits
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        padded = token_log_likelihoods(model(**padded_batch(pairs)).logits, padded_batch(pairs)["labels"])
    per_pair = summed_per_pair(token_log_likelihoods(logits, inputs["labels"]), packed, len(pairs))
    torch.testing.assert_close(per_pair, padded.double().sum(-1), rtol=1e-5, atol=1e-5)


def test_packed_forward_is_the_padded_one_exactly_in_float64():
    """In float64 the two forwards differ by rounding only: masked keys get exactly zero weight."""
    model = tiny_model(vocab_size=VOCAB, pad_token_id=PAD, **NO_DROPOUT).double()
    packed, padded = per_pair_log_likelihoods(model, random_pairs(30, seed=2), 6, 64, torch.float64)
    torch.testing.assert_close(packed, padded, rtol=0, atol=1e-10)


@pytest.mark.parametrize("grad", [False, True], ids=["torch's cross_entropy", "chunked on a CPU"])
def test_label_smoothed_loss_and_gradients_equal_the_padded_ones(grad):
    """The trainer's loss (Section 5.4, `loss.label_smoothed_cross_entropy`, both its implementations)
    summed over the labelled tokens, and the gradients of the weights, packed as padded."""
    pairs = random_pairs(24, seed=3)
    model = tiny_model(vocab_size=VOCAB, pad_token_id=PAD, **NO_DROPOUT).train()
    inputs = pack_pairs(pairs, 5, 64, 64, PAD, model.config.decoder_start_token_id).model_inputs()
    totals, gradients = [], []
    for batch in (inputs, padded_batch(pairs)):
        model.zero_grad()
        with torch.set_grad_enabled(grad):
            logits = model(**batch).logits
            total = label_smoothed_cross_entropy(logits, batch["labels"], 0.1, num_items_in_batch=1)
        totals.append(total.detach())
        if grad:
            total.backward()
            gradients.append({name: p.grad.clone() for name, p in model.named_parameters()})
    assert inputs["labels"].ne(-100).sum() == padded_batch(pairs)["labels"].ne(-100).sum()
    torch.testing.assert_close(totals[0], totals[1], rtol=1e-5, atol=1e-5)
    if grad:
        for name, packed_gradient in gradients[0].items():
            torch.testing.assert_close(packed_gradient, gradients[1][name], rtol=1e-4, atol=1e-5, msg=name)


def test_the_model_takes_default_positions_and_masks_as_before():
    """Positions given as the ones the model counts itself, and no cross-attention mask: the same logits."""
    model = tiny_model(vocab_size=VOCAB, pad_token_id=PAD)
    batch = padded_batch(random_pairs(5, seed=4))
    batch["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(batch["labels"])
    source, target = batch["input_ids"].shape[1], batch["labels"].shape[1]
    with torch.no_grad():
        default = model(**batch).logits
        given = model(
            **batch,
            position_ids=torch.arange(source).expand(5, -1),
            decoder_position_ids=torch.arange(target).expand(5, -1),
            cross_attention_mask=None,
        ).logits
    assert torch.equal(default, given)


def test_the_collator_gives_the_padded_collators_loss():
    """`PackingCollator` in place of transformers' `DataCollatorForSeq2Seq`: the model's own loss (the mean
    cross-entropy over the labelled tokens) is the same."""
    pairs = random_pairs(16, seed=5)
    features = [{"input_ids": s, "attention_mask": [1] * len(s), "labels": t} for s, t in pairs]
    model = tiny_model(vocab_size=VOCAB, pad_token_id=PAD)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel({"<s>": BOS, "<pad>": PAD}, unk_token="<pad>")),
        pad_token="<pad>",
    )
    padded = DataCollatorForSeq2Seq(tokenizer, model=model)(features)
    packed = PackingCollator(4, 64, 64, PAD, model.config.decoder_start_token_id)(features)
    assert packed["input_ids"].shape == (4, 64) and packed["labels"].shape == (4, 64)
    with torch.no_grad():
        torch.testing.assert_close(model(**packed).loss, model(**padded).loss, rtol=1e-5, atol=1e-6)


def test_a_batch_carrying_segment_ids_gets_the_same_masks_where_it_is():
    """The collator's batch without masks (`with_masks=False`: the segment ids instead, a fraction of the
    size) becomes, through `with_packed_masks`, the batch the collator makes with masks, tensor for tensor;
    the masks are built on the segment ids' device and in the dtype asked for."""
    pairs = random_pairs(16, seed=7)
    features = [{"input_ids": s, "labels": t} for s, t in pairs]
    with_masks = PackingCollator(4, 64, 64, PAD, BOS)(features)
    carrying_segments = PackingCollator(4, 64, 64, PAD, BOS, with_masks=False)(features)
    assert set(SEGMENT_KEYS) <= set(carrying_segments)
    assert not set(MASK_KEYS) & set(carrying_segments)
    masked = with_packed_masks(carrying_segments)
    assert set(masked) == set(with_masks)
    for key, tensor in with_masks.items():
        assert torch.equal(masked[key], tensor), key
    in_bf16 = with_packed_masks(carrying_segments, torch.bfloat16)
    assert in_bf16["cross_attention_mask"].dtype == torch.bfloat16
    size = sum(tensor.numel() * tensor.element_size() for tensor in carrying_segments.values())
    assert size < sum(tensor.numel() * tensor.element_size() for tensor in with_masks.values()) / 4


def sampler_lengths(count: int, seed: int = 0) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    src = [min(60, max(1, round(rng.lognormvariate(3.0, 0.5)))) for _ in range(count)]
    return src, [max(1, min(64, round(length * rng.uniform(0.8, 1.3)))) for length in src]


def test_the_sampler_fills_the_rows_and_takes_every_pair_once():
    """Pairs of 1 to 64 tokens (about 20) into 16 rows of 120 source and 128 target tokens: every batch
    packs, every pair is taken once, and all batches but the epoch's last have the fuller side of their
    rows at least 97% full."""
    src, tgt = sampler_lengths(3000)
    source_length, target_length = balanced_row_lengths(src, tgt, 128)
    assert (source_length, target_length) == (120, 128)
    sampler = PackedBatchSampler(src, tgt, 16, source_length, target_length, seed=0)
    batches = list(sampler)
    assert len(batches) == len(sampler)
    assert sorted(i for batch in batches for i in batch) == list(range(3000))
    fuller_side_padding = []
    for batch in batches:
        place_pairs([(src[i], tgt[i]) for i in batch], 16, source_length, target_length)  # raises if no fit
        source_padding = 1 - sum(src[i] for i in batch) / (16 * source_length)
        target_padding = 1 - sum(tgt[i] for i in batch) / (16 * target_length)
        fuller_side_padding.append(min(source_padding, target_padding))
    assert max(fuller_side_padding[:-1]) < 0.03, fuller_side_padding


def test_the_sampler_is_deterministic_per_seed_and_epoch():
    src, tgt = sampler_lengths(500)

    def epoch(seed: int, number: int) -> list[list[int]]:
        sampler = PackedBatchSampler(src, tgt, 8, 64, 64, seed=seed)
        sampler.set_epoch(number)
        return list(sampler)

    assert epoch(0, 0) == epoch(0, 0)
    assert epoch(0, 0) != epoch(0, 1) and epoch(0, 0) != epoch(1, 0)


@pytest.mark.parametrize("replicas", [2, 3])
def test_replicas_take_as_many_disjoint_batches(replicas):
    src, tgt = sampler_lengths(1000)
    shares = [
        list(PackedBatchSampler(src, tgt, 8, 64, 64, num_replicas=replicas, rank=r)) for r in range(replicas)
    ]
    assert len({len(share) for share in shares}) == 1
    taken = [i for share in shares for batch in share for i in batch]
    assert len(taken) == len(set(taken))


def test_the_sampler_reads_a_datasets_lengths_and_refuses_a_long_pair():
    dataset = Dataset.from_dict({"input_ids": [[5] * 3, [5] * 7], "labels": [[6] * 4, [6] * 2]})
    sampler = PackedBatchSampler.from_dataset(dataset, rows=2, source_length=8, target_length=8)
    assert sampler.src_lengths.tolist() == [3, 7] and sampler.tgt_lengths.tolist() == [4, 2]
    with pytest.raises(ValueError, match="Pair 1 has 7 source"):
        PackedBatchSampler.from_dataset(dataset, rows=2, source_length=6, target_length=8)


def test_balanced_row_lengths_follow_the_sides_totals():
    assert balanced_row_lengths([90] * 10, [100] * 10, 128) == (112, 128)  # 115.2: the nearest multiple of 8
    assert balanced_row_lengths([100] * 10, [50] * 10, 128) == (128, 64)
    assert balanced_row_lengths([50, *[1] * 9], [100] * 10, 128) == (56, 128)  # the longest source: 50


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def test_the_packed_training_step_compiles_once_for_every_batch(fresh_dynamo):
    """The training step as `train --compile --packed-row-length` runs it (`CompiledTrainingLoss` with static
    shapes: forward, label-smoothed loss, backward) over 100 packed batches of newstest-length pairs: one
    graph, no recompilation, no graph break. "aot_eager" traces the backward as Inductor would, without its
    code generation (Dynamo's graphs are its own, whatever the backend)."""
    from test_compilation import newstest_like_lengths

    src, tgt, origin = newstest_like_lengths()
    rng = random.Random(0)
    dataset = Dataset.from_dict(
        {
            "input_ids": [rng.choices(range(3, VOCAB), k=length) for length in src],
            "labels": [rng.choices(range(3, VOCAB), k=length) for length in tgt],
        }
    )
    source_length, target_length = balanced_row_lengths(src, tgt, 256)
    sampler = PackedBatchSampler.from_dataset(dataset, 4, source_length, target_length)
    collator = PackingCollator(4, source_length, target_length, PAD, BOS)
    batches = list(itertools.islice(DataLoader(dataset, batch_sampler=sampler, collate_fn=collator), 100))
    assert len(batches) == 100, origin
    assert len({len(indices) for indices in itertools.islice(sampler, 100)}) > 1, "pairs a batch vary"
    assert len({tuple((key, value.shape) for key, value in batch.items()) for batch in batches}) == 1
    model = tiny_model(vocab_size=VOCAB, pad_token_id=PAD, max_position_embeddings=256).train()
    step = CompiledTrainingLoss(0.1, backend="aot_eager", static_shapes=True)
    with step.regions(model):
        for batch in batches:
            step(model, batch, None).backward()
    assert counters["stats"]["unique_graphs"] == 1, origin
    assert counters["frames"]["total"] == 1, origin  # compiled once: no recompilation
    assert dict(counters["graph_break"]) == {}, origin


@pytest.mark.parametrize(
    "attention",
    [
        None,
        pytest.param(
            "flex_attention",
            marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="flex attention trains on CUDA"),
        ),
    ],
)
def test_a_packed_run_trains_on_batches_of_one_shape(attention, tmp_path, monkeypatch):
    """`train --packed-row-length`: every batch of one shape, carrying its segment ids to the training
    step, whose loss gets the masks the model's attention takes (flex attention's block masks with
    attn_implementation=flex_attention, on CUDA)."""
    from test_training import TINY, data_flags, write_corpus

    from hf_vanilla_transformer.commands import main
    from hf_vanilla_transformer.training import trainer
    from hf_vanilla_transformer.training.trainer import TokenBudgetSeq2SeqTrainer

    corpus = write_corpus(tmp_path)
    shapes, labelled, mask_types = set(), [], set()
    take = TokenBudgetSeq2SeqTrainer.get_batch_samples

    def recorded(self, iterator, count, device):
        batches, items = take(self, iterator, count, device)
        for batch in batches:
            shapes.add(tuple((key, tuple(value.shape)) for key, value in sorted(batch.items())))
            labelled.append(int((batch["labels"] != -100).sum()))
        return batches, items

    def masks_recorded(*args, **kwargs):
        inputs = with_packed_masks(*args, **kwargs)
        mask_types.update(type(inputs[key]).__name__ for key in MASK_KEYS)
        return inputs

    monkeypatch.setattr(TokenBudgetSeq2SeqTrainer, "get_batch_samples", recorded)
    monkeypatch.setattr(trainer, "with_packed_masks", masks_recorded)
    out = tmp_path / "run"
    flags = [
        "--max-steps",
        "4",
        "--max-length",
        "64",
        "--packed-row-length",
        "64",
        "--no-tune-length-penalty",
    ]
    if attention:
        flags += ["--model-override", f"attn_implementation={attention}"]
    main(["train", "--output-dir", str(out), "--preset", "cpu-demo", *data_flags(corpus), *TINY, *flags])
    assert mask_types == ({"BlockMask"} if attention == "flex_attention" else {"Tensor"})
    assert len(shapes) == 1  # one shape for the whole run
    (layout,) = shapes
    keys = dict(layout)
    rows, source_length = keys["input_ids"]
    assert (
        rows == 256 // 64 and source_length <= 64
    )  # --max-tokens 256 of TINY, rows of 64 on the longer side
    # The batches reach the training step with their segment ids; its loss builds the masks from them.
    assert {"position_ids", "decoder_position_ids", *SEGMENT_KEYS} <= set(keys)
    assert "cross_attention_mask" not in keys
    # Rows hold several pairs each: far more labelled tokens than one pair per row would give.
    assert min(labelled) > rows * 20
    (checkpoint,) = out.glob("checkpoint-*")
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert all(math.isfinite(entry["loss"]) for entry in state["log_history"] if "loss" in entry)


def test_flex_attention_with_attention_dropout_is_refused_where_it_would_train(monkeypatch, capsys):
    """On a GPU (here as `torch.cuda.is_available` says), flex attention with the cpu preset's attention
    dropout would fail at the first step in transformers' flex attention: refused in one line first."""
    from hf_vanilla_transformer.commands import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    flags = ["--preset", "cpu", "--model-override", "attn_implementation=flex_attention"]
    with pytest.raises(SystemExit) as stop:
        main(["train", "--output-dir", "out", *flags])
    assert stop.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "attention_dropout=0.1" in error[0] and "attention_dropout=0," in error[0]


@pytest.mark.parametrize(
    ("flags", "refusal"),
    [
        (["--packed-row-length", "32"], "--packed-row-length 32 is shorter than --max-length 64"),
        (["--packed-row-length", "64", "--subword-dropout", "0.1"], "--subword-dropout resegments them"),
        (
            ["--packed-row-length", "64", "--model-override", "attn_implementation=flash_attention_2"],
            "flash_attention_2 ignores",
        ),
        pytest.param(
            ["--packed-row-length", "64", "--model-override", "attn_implementation=flex_attention"],
            "flex attention has no backward pass on a CPU",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="flex attention trains on CUDA"),
        ),
    ],
)
def test_packing_refuses_what_it_cannot_pack(flags, refusal, capsys):
    from hf_vanilla_transformer.commands import main

    with pytest.raises(SystemExit) as stop:
        main(["train", "--output-dir", "out", "--max-length", "64", *flags])
    assert stop.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and refusal in error[0]
