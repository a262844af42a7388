"""Token-budget batching (Section 5.1), alone and under accelerate's multi-process sharding."""

import random

import datasets
import pytest
from accelerate.data_loader import BatchSamplerShard, prepare_data_loader, skip_first_batches
from torch.utils.data import DataLoader

from hf_vanilla_transformer.training.batching import TokenBudgetBatchSampler, bypass_accelerate_sharding


def random_lengths(n: int, seed: int = 0) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    src = [rng.randint(1, 60) for _ in range(n)]
    tgt = [max(1, s + rng.randint(-10, 10)) for s in src]
    return src, tgt


def assert_within_budget(batches, src, tgt, max_tokens):
    for batch in batches:
        assert batch, "empty batch"
        assert len(batch) * max(src[i] for i in batch) <= max_tokens
        assert len(batch) * max(tgt[i] for i in batch) <= max_tokens


def test_budget_respected_and_every_example_once():
    src, tgt = random_lengths(500)
    sampler = TokenBudgetBatchSampler(src, tgt, max_tokens=200, seed=3)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        assert_within_budget(batches, src, tgt, 200)
        assert sorted(i for batch in batches for i in batch) == list(range(500))


def test_batches_group_similar_lengths():
    src, tgt = random_lengths(500)
    batches = list(TokenBudgetBatchSampler(src, tgt, max_tokens=200))
    padded = sum(len(b) * max(src[i] for i in b) for b in batches)
    # Sorting by length keeps padding small; random batches of the same sizes would pad far more.
    assert padded < 1.1 * sum(src)


def test_deterministic_per_seed_and_epoch_and_different_across_epochs():
    src, tgt = random_lengths(300)

    def epoch_batches(seed, epoch):
        sampler = TokenBudgetBatchSampler(src, tgt, max_tokens=150, seed=seed)
        sampler.set_epoch(epoch)
        return list(sampler)

    assert epoch_batches(0, 0) == epoch_batches(0, 0)
    assert epoch_batches(0, 1) == epoch_batches(0, 1)
    assert epoch_batches(0, 0) != epoch_batches(0, 1)
    assert epoch_batches(0, 0) != epoch_batches(1, 0)


def test_no_shuffle_yields_length_order():
    src, tgt = random_lengths(100)
    batches = list(TokenBudgetBatchSampler(src, tgt, max_tokens=150, shuffle=False))
    order = [i for batch in batches for i in batch]
    assert order == sorted(range(100), key=lambda i: (src[i], tgt[i]))


@pytest.mark.parametrize("n", [301, 500, 777])
def test_two_replicas_split_the_epoch_exactly(n):
    src, tgt = random_lengths(n, seed=n)
    single = TokenBudgetBatchSampler(src, tgt, max_tokens=200, seed=5)
    replicas = [
        TokenBudgetBatchSampler(src, tgt, max_tokens=200, seed=5, num_replicas=2, rank=rank)
        for rank in (0, 1)
    ]
    for epoch in range(2):
        for sampler in replicas:
            sampler.set_epoch(epoch)
        shares = [list(sampler) for sampler in replicas]
        assert len(shares[0]) == len(shares[1]) == len(replicas[0]) == len(replicas[1])
        seen = [i for share in shares for batch in share for i in batch]
        assert sorted(seen) == list(range(n)), "every example exactly once across both processes"
        for share in shares:
            assert_within_budget(share, src, tgt, 200)
    # An odd number of batches is evened out by splitting, never by repeating or dropping examples.
    assert 2 * len(replicas[0]) in (len(single), len(single) + 1)


def test_odd_batch_count_is_split_for_two_replicas():
    # Three batches of 4 under a budget of 40 tokens: one must be split so each process gets 2.
    lengths = [10] * 12
    single = TokenBudgetBatchSampler(lengths, lengths, max_tokens=40, shuffle=False)
    assert [len(b) for b in single] == [4, 4, 4]
    shares = [
        list(TokenBudgetBatchSampler(lengths, lengths, max_tokens=40, shuffle=False, num_replicas=2, rank=r))
        for r in (0, 1)
    ]
    assert [len(share) for share in shares] == [2, 2]
    assert sorted(len(b) for share in shares for b in share) == [2, 2, 4, 4]


def drawn_lengths(planned: list[int], epoch: int, spread: int) -> list[int]:
    rng = random.Random(epoch)
    return [max(1, length + rng.randint(-spread, spread)) for length in planned]


@pytest.mark.parametrize("spread", [0, 2, 8])
@pytest.mark.parametrize("replicas", [1, 2])
def test_lengths_that_change_each_epoch_fill_the_planned_batches(spread, replicas):
    """Pairs resegmented each epoch: every epoch packs its own lengths into the planned number of batches
    (the same on every process), every pair once, within the budget or (when the epoch runs long) the least
    stretch of it, by 1% steps, that fits."""
    src, tgt = random_lengths(500)

    def epoch_lengths(epoch: int) -> tuple[list[int], list[int]]:
        return drawn_lengths(src, epoch, spread), drawn_lengths(tgt, epoch + 1000, spread)

    samplers = [
        TokenBudgetBatchSampler(
            src, tgt, max_tokens=200, seed=3, num_replicas=replicas, rank=rank, epoch_lengths=epoch_lengths
        )
        for rank in range(replicas)
    ]
    for epoch in range(4):
        shares = []
        for sampler in samplers:
            sampler.set_epoch(epoch)
            shares.append(list(sampler))
        assert [len(share) for share in shares] == [len(samplers[0])] * replicas
        batches = [batch for share in shares for batch in share]
        assert sorted(i for batch in batches for i in batch) == list(range(500))
        epoch_src, epoch_tgt = epoch_lengths(epoch)
        padded = max(
            len(b) * max(max(epoch_src[i] for i in b), max(epoch_tgt[i] for i in b)) for b in batches
        )
        assert padded <= 200 * 1.01 ** (len(batches) - 1)  # a loose bound: the stretch is a few steps at most
        if spread == 0:
            assert_within_budget(batches, src, tgt, 200)
    if spread == 0:
        plain = TokenBudgetBatchSampler(src, tgt, max_tokens=200, seed=3)
        plain.set_epoch(3)
        samplers[0].set_epoch(3)
        assert replicas > 1 or list(plain) == list(samplers[0])


def test_too_long_example_is_named():
    with pytest.raises(ValueError) as error:
        TokenBudgetBatchSampler([5, 30, 7], [5, 8, 7], max_tokens=20)
    message = str(error.value)
    assert "Example 1" in message and "source length of 30" in message and "max_tokens=20" in message
    assert "--max-tokens" in message and "filter" in message


def test_bad_arguments():
    with pytest.raises(ValueError, match="src_lengths has 2 entries but tgt_lengths has 3"):
        TokenBudgetBatchSampler([1, 2], [1, 2, 3], max_tokens=10)
    with pytest.raises(ValueError, match="empty dataset"):
        TokenBudgetBatchSampler([], [], max_tokens=10)
    with pytest.raises(ValueError, match="max_tokens must be a positive"):
        TokenBudgetBatchSampler([1], [1], max_tokens=0)
    with pytest.raises(ValueError, match=r"rank must be in \[0, 1\], got 2"):
        TokenBudgetBatchSampler([1], [1], max_tokens=10, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="same number of batches"):
        TokenBudgetBatchSampler([8, 8, 8], [8, 8, 8], max_tokens=10, num_replicas=2, rank=0)


def test_from_dataset_reads_token_lengths():
    dataset = datasets.Dataset.from_dict(
        {"input_ids": [[1] * n for n in (3, 5, 2, 9)], "labels": [[1] * n for n in (4, 1, 6, 2)]}
    ).select([3, 1, 0])  # an indices mapping must be honoured
    sampler = TokenBudgetBatchSampler.from_dataset(dataset, max_tokens=100, shuffle=False)
    assert sampler.src_lengths.tolist() == [9, 5, 3]
    assert sampler.tgt_lengths.tolist() == [2, 1, 4]


def test_from_arrow_file_is_exact_for_two_replicas(tmp_path):
    src, tgt = random_lengths(301, seed=7)
    features = datasets.Features(
        {name: datasets.List(datasets.Value("int32")) for name in ("input_ids", "labels")}
    )
    rows = {"input_ids": [[5] * n for n in src], "labels": [[6] * n for n in tgt]}
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(tmp_path / "tokenized")
    dataset = datasets.load_from_disk(tmp_path / "tokenized")  # memory-mapped, as tokenize_pairs gives
    replicas = [
        TokenBudgetBatchSampler.from_dataset(dataset, 200, seed=5, num_replicas=2, rank=rank)
        for rank in (0, 1)
    ]
    assert replicas[0].src_lengths.tolist() == src and replicas[0].tgt_lengths.tolist() == tgt
    for epoch in range(2):
        for sampler in replicas:
            sampler.set_epoch(epoch)
        shares = [list(sampler) for sampler in replicas]
        assert len(shares[0]) == len(shares[1]) == len(replicas[0])
        assert sorted(i for share in shares for batch in share for i in batch) == list(range(301))
    shuffled = dataset.shuffle(seed=0)
    sampler = TokenBudgetBatchSampler.from_dataset(shuffled, 200)
    assert sampler.src_lengths.tolist() == [len(row) for row in shuffled["input_ids"]]
    with pytest.raises(ValueError, match="no column 'labels'"):
        TokenBudgetBatchSampler.from_dataset(dataset.remove_columns("labels"), 200)


def test_works_as_dataloader_batch_sampler():
    src, tgt = random_lengths(60)
    sampler = TokenBudgetBatchSampler(src, tgt, max_tokens=120)
    loader = DataLoader(list(range(60)), batch_sampler=sampler, collate_fn=list)
    assert len(loader) == len(sampler)
    assert sorted(i for batch in loader for i in batch) == list(range(60))


def prepared_loaders(src, tgt, max_tokens, seed=0):
    """What Accelerator.prepare does on each of two processes, simulated in this one."""
    loaders, samplers = [], []
    for rank in (0, 1):
        sampler = TokenBudgetBatchSampler(src, tgt, max_tokens, seed=seed, num_replicas=2, rank=rank)
        loader = DataLoader(list(range(len(src))), batch_sampler=sampler, collate_fn=list)
        loader = prepare_data_loader(loader, num_processes=2, process_index=rank)
        assert isinstance(loader.batch_sampler, BatchSamplerShard)
        bypass_accelerate_sharding(loader, sampler)
        loaders.append(loader)
        samplers.append(sampler)
    return loaders, samplers


def test_accelerate_sharding_bypassed_keeps_exact_split():
    src, tgt = random_lengths(301, seed=1)
    loaders, samplers = prepared_loaders(src, tgt, 200)
    for epoch in range(2):
        shares = []
        for loader, sampler in zip(loaders, samplers, strict=True):
            loader.set_epoch(epoch)
            # Trainer._run_epoch also reaches through the wrapper explicitly.
            loader.batch_sampler.batch_sampler.set_epoch(epoch)
            assert sampler.epoch == epoch
            shares.append(list(loader))
            assert len(loader) == len(sampler) == len(shares[-1])
        seen = [i for share in shares for batch in share for i in batch]
        assert sorted(seen) == list(range(301))


def test_resumed_epoch_reaches_sampler_through_skip_wrapper():
    src, tgt = random_lengths(200, seed=2)
    loaders, samplers = prepared_loaders(src, tgt, 200, seed=4)
    expected = []
    for loader in loaders:
        loader.set_epoch(3)
        expected.append(list(loader)[2:])
    for loader, sampler, rest in zip(loaders, samplers, expected, strict=True):
        sampler.set_epoch(0)  # a fresh process after a restart
        skipped = skip_first_batches(loader, 2)
        # What Trainer._run_epoch does when it resumes mid-epoch:
        skipped.set_epoch(3)
        underlying = getattr(skipped.batch_sampler, "batch_sampler", None)
        if hasattr(underlying, "set_epoch"):
            underlying.set_epoch(3)
        assert sampler.epoch == 3
        assert list(skipped) == rest


def test_bypass_rejects_foreign_dataloader():
    sampler = TokenBudgetBatchSampler([1, 2], [1, 2], max_tokens=10)
    other = DataLoader(list(range(4)), batch_size=2)
    with pytest.raises(ValueError, match="neither the TokenBudgetBatchSampler"):
        bypass_accelerate_sharding(other, sampler)
    single = DataLoader(list(range(2)), batch_sampler=sampler)
    bypass_accelerate_sharding(single, sampler)  # one process: nothing to do
