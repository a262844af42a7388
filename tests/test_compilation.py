"""The compiled training step (`training.compilation`): no graph breaks, no recompilation over real batch
lengths beyond the buckets', the same losses as eager training, and the compile cache in the run's folder.

Dynamo's graph breaks and recompilations are its own, whatever backend compiles the graphs, so these tests
compile with the "aot_eager" backend (which also traces the backward and the nested regions) or "eager",
which take a minute at most rather than Inductor's many. Only what Inductor's caches keep is tested with
Inductor, on the tiny model."""

import os
import random
import shutil
import sys
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from types import MethodType

import forked_processes
import pytest
import torch
from conftest import tiny_model
from datasets import Dataset
from test_trainer import reverse_task, word_tokenizer
from test_training import TINY, corpus, data_flags, settings  # noqa: F401  (the corpus fixture)
from torch._dynamo.utils import counters
from tqdm.auto import tqdm
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainingArguments

from hf_vanilla_transformer.commands import main
from hf_vanilla_transformer.common.hardware import cpu_features
from hf_vanilla_transformer.training import pipeline, progress
from hf_vanilla_transformer.training.batching import TokenBudgetBatchSampler
from hf_vanilla_transformer.training.compilation import (
    COMPILE_CACHE_FILE,
    INDUCTOR_CACHE_FOLDER,
    REGION_CLASSES,
    SEQUENCE_MULTIPLE,
    CompileCache,
    CompiledTrainingLoss,
    compiled_regions,
    forward_and_loss,
    inductor_cache_dir,
    regional_compilation_pays,
    with_dynamic_batch_dimensions,
)
from hf_vanilla_transformer.training.length_buckets import bucket_length, pad_to_buckets
from hf_vanilla_transformer.training.loss import LabelSmoothedSeq2SeqTrainer, label_smoothed_cross_entropy
from hf_vanilla_transformer.training.pipeline import run_training
from hf_vanilla_transformer.training.presets import TRAINING_PRESETS

NEWSTEST = Path(__file__).resolve().parents[2] / "shared" / "data" / "wmt14"
PAD = 1
NO_DROPOUT = {"P_drop": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Every test counts its own compilations."""
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def newstest_like_lengths() -> tuple[list[int], list[int], str]:
    """Source and target lengths of about 6000 pairs: newstest2013 and 2014's, in words times 1.3 (about
    their subword count), where the data is at hand; else lengths drawn from a similar spread."""
    files = [
        NEWSTEST / f"{name}.{side}" for name in ("newstest2013", "newstest2014") for side in ("en", "de")
    ]
    if all(file.is_file() for file in files):
        sides = [[], []]
        for file in files:
            side = sides[file.suffix == ".de"]
            side += [
                max(1, round(1.3 * len(line.split()))) + 1 for line in file.read_text("utf-8").splitlines()
            ]
        return sides[0], sides[1], "newstest2013/2014"
    rng = random.Random(0)
    src = [min(200, max(2, round(rng.lognormvariate(3.2, 0.5)))) for _ in range(6000)]
    return src, [max(2, round(length * rng.uniform(0.8, 1.3))) for length in src], "synthetic"


def batches_of(
    lengths: tuple[list[int], list[int]], max_tokens: int, count: int, buckets: bool = True
) -> list[dict]:
    """The first `count` token-budget batches (Section 5.1) of pairs of those lengths, random ids, padded to
    their buckets as `train --length-buckets` pads them (`buckets`), else to their longest as `train`
    does."""
    src, tgt = lengths
    rng = torch.Generator().manual_seed(0)
    batches = []
    for indices in list(TokenBudgetBatchSampler(src, tgt, max_tokens=max_tokens, seed=0))[:count]:
        batch = {}
        for key, side in (("input_ids", src), ("labels", tgt)):
            ids = torch.full((len(indices), max(side[i] for i in indices)), PAD)
            for row, i in enumerate(indices):
                ids[row, : side[i]] = torch.randint(3, 64, (side[i],), generator=rng)
            batch[key] = ids
        batch["attention_mask"] = (batch["input_ids"] != PAD).long()
        batch["labels"] = batch["labels"].masked_fill(batch["labels"] == PAD, -100)
        batches.append(pad_to_buckets(batch, PAD) if buckets else batch)
    return batches


def with_decoder_inputs(model, batch: dict) -> dict:
    return {**batch, "decoder_input_ids": model.prepare_decoder_input_ids_from_labels(batch["labels"])}


def test_no_graph_break_and_no_recompilation_over_newstest_length_batches():
    """The compiled step (model, loss, backward) in one graph; 100 newstest-length batches after the first
    compile at most one more per bucket shape (in fact none: the batch dimensions are dynamic), and 20 more
    batches padded only to their longest none either."""
    src, tgt, origin = newstest_like_lengths()
    batches = batches_of((src, tgt), max_tokens=600, count=101)
    shapes = {(b["input_ids"].shape[1], b["labels"].shape[1]) for b in batches}
    assert len({b["input_ids"].shape[0] for b in batches}) > 10, "token-budget batches vary in pairs"
    assert all(length == bucket_length(length) for shape in shapes for length in shape)
    unbucketed = batches_of((src[::-1], tgt[::-1]), max_tokens=600, count=20, buckets=False)
    assert any(b["input_ids"].shape[1] != bucket_length(b["input_ids"].shape[1]) for b in unbucketed)
    batches += unbucketed
    model = tiny_model(vocab_size=64, max_position_embeddings=256, pad_token_id=PAD).train()
    step = CompiledTrainingLoss(0.1, backend="aot_eager")
    with compiled_regions(model):
        for index, batch in enumerate(batches):
            step(model, with_decoder_inputs(model, batch), None).backward()
            if index == 0:
                first_compiles = counters["stats"]["unique_graphs"]
    assert dict(counters["graph_break"]) == {}, origin
    assert first_compiles == 1
    recompiles = counters["stats"]["unique_graphs"] - first_compiles
    assert recompiles <= len(shapes), (origin, recompiles, len(shapes))
    # A batch of one pair is the only shape that a dynamic dimension cannot cover.
    assert recompiles <= any(b["input_ids"].shape[0] == 1 for b in batches), (origin, recompiles)


class GuardsOnLengthAlignment(torch.nn.Module):
    """A model whose compiled code holds only for sources of a length that is a multiple of 8 or not, as
    Inductor's CUDA attention kernels with a padding mask guard theirs: in the end the same logits."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, **inputs):
        outputs = self.model(**inputs)
        aligned = inputs["input_ids"].shape[1] % SEQUENCE_MULTIPLE == 0
        outputs.logits = outputs.logits + 0.0 if aligned else outputs.logits * 1.0
        return outputs


def test_a_guard_on_the_lengths_compiles_once_per_side_of_it():
    """A compiled graph that guards on its lengths' alignment (CUDA's attention kernels do) compiles, and
    batches padded to multiples of `SEQUENCE_MULTIPLE`, as a compiled run pads them, share one graph."""
    model = GuardsOnLengthAlignment(tiny_model(vocab_size=64, pad_token_id=PAD).train())
    step = CompiledTrainingLoss(0.1, backend="eager")
    aligned = [(pairs, length) for pairs, length in ((4, 16), (7, 24), (3, 40), (9, 8))]
    for pairs, length in aligned:
        batch = batches_of(([length] * pairs, [length] * pairs), max_tokens=10_000, count=1)[0]
        step(model, with_decoder_inputs(model.model, batch), None)
    assert counters["stats"]["unique_graphs"] == 1
    unaligned = batches_of(([13] * 5, [13] * 5), max_tokens=10_000, count=1, buckets=False)[0]
    step(model, with_decoder_inputs(model.model, unaligned), None)
    assert counters["stats"]["unique_graphs"] == 2


def test_the_training_loss_builds_no_cache_of_keys_and_values():
    """A teacher-forced training step keeps no decoding cache: building one copies every layer's keys and
    values (twice more in the backward), for nothing."""
    model = tiny_model(vocab_size=64, pad_token_id=PAD).train()
    assert model.config.use_cache
    caches = []
    model.register_forward_hook(lambda module, args, output: caches.append(output.cache))
    batch = batches_of(([9] * 4, [7] * 4), max_tokens=100, count=1)[0]
    forward_and_loss(model, with_decoder_inputs(model, batch), 0.1, None).backward()
    assert caches == [None]


def test_the_callers_tensors_stay_unmarked():
    """The dynamic marks go on new tensors over the batch's memory, not on the caller's, which other
    compiled code (a model compiled beside it) may take with shapes of its own."""
    batch = batches_of(([9] * 4, [7] * 4), max_tokens=100, count=1)[0]
    marked = with_dynamic_batch_dimensions(batch)
    for key, tensor in batch.items():
        assert marked[key].data_ptr() == tensor.data_ptr() and torch.equal(marked[key], tensor)
        assert hasattr(marked[key], "_dynamo_weak_dynamic_indices")
        assert not hasattr(tensor, "_dynamo_weak_dynamic_indices")


def test_past_the_recompile_limit_the_step_fails_rather_than_running_eagerly():
    model = tiny_model(vocab_size=64, pad_token_id=PAD).train()
    step = CompiledTrainingLoss(0.1, backend="eager")
    batch = batches_of(([9] * 40, [9] * 40), max_tokens=100, count=1)[0]
    with torch._dynamo.config.patch(recompile_limit=1):
        step(model, with_decoder_inputs(model, batch), None)
        model.eval()  # dropout off: a guard that the compiled graph fails
        with pytest.raises(torch._dynamo.exc.FailOnRecompileLimitHit):
            step(model, with_decoder_inputs(model, batch), None)


@pytest.mark.parametrize("layers, regional", [(3, False), (5, False), (6, True), (8, True)])
def test_layers_are_compiled_once_per_class_in_deep_stacks_only(layers, regional):
    """Regional compilation where it was measured to compile faster (6 layers a stack), the whole model
    inlined below; a choice given to CompiledTrainingLoss overrides the rule."""
    model = tiny_model(N=layers)
    assert regional_compilation_pays(model) is regional
    for choice, marked in ((None, regional), (True, True), (False, False)):
        with CompiledTrainingLoss(0.1, backend="eager", regional=choice).regions(model):
            assert all(("forward" in vars(layer)) is marked for layer in model.model.encoder.layers)
            assert all(("forward" in vars(layer)) is marked for layer in model.model.decoder.layers)


def test_a_run_compiles_its_step_only_when_asked(corpus, tmp_path):  # noqa: F811
    """No preset compiles its training step, on a CPU (where the compiled step is slower) or on a GPU (where
    its speed on real batches is unmeasured and its first compile has taken minutes): the paper's base
    preset trains eagerly unless --compile asks, and --no-compile is followed."""
    assert not any(preset.compile for preset in TRAINING_PRESETS.values())
    for requested, expected in ((None, False), (True, True), (False, False)):
        chosen = settings(corpus, tmp_path / str(requested), preset="base", compile=requested)
        assert pipeline._start_run(chosen).recipe.compile is expected


def test_regions_are_marked_while_training_only():
    model = tiny_model()
    layers = [module for module in model.modules() if isinstance(module, REGION_CLASSES)]
    assert len(layers) == 4
    with compiled_regions(model):
        assert all("forward" in vars(layer) for layer in layers)
        marked = {type(layer): vars(layer)["forward"].__func__ for layer in layers}
        assert len(set(marked.values())) == 2  # one marked forward per class, shared by its layers
    assert not any("forward" in vars(layer) for layer in layers)


@pytest.mark.parametrize("regional", [False, True])
def test_compiled_steps_train_as_eager_steps(regional):
    """Three SGD steps of a tiny model (no dropout, whose masks compiled code draws its own way): the same
    losses and weights, eager against compiled (forward, label-smoothed loss and backward by AOTAutograd)."""
    batches = batches_of(newstest_like_lengths()[:2], max_tokens=300, count=3)
    results = []
    for compiled in (False, True):
        model = tiny_model(vocab_size=64, max_position_embeddings=256, pad_token_id=PAD, **NO_DROPOUT).train()
        # SGD: Adam would turn rounding-level differences of near-zero gradients into whole steps.
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        step = CompiledTrainingLoss(0.1, backend="aot_eager") if compiled else None
        losses = []
        with compiled_regions(model) if compiled and regional else nullcontext():
            for batch in batches:
                inputs = with_decoder_inputs(model, batch)
                if step is None:
                    logits = model(**{k: v for k, v in inputs.items() if k != "labels"}).logits
                    loss = label_smoothed_cross_entropy(logits, inputs["labels"], 0.1)
                else:
                    loss = step(model, inputs, None)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                losses.append(loss.detach())
        results.append((torch.stack(losses), [p.detach().clone() for p in model.parameters()]))
    (eager_losses, eager_weights), (compiled_losses, compiled_weights) = results
    torch.testing.assert_close(compiled_losses, eager_losses, rtol=1e-5, atol=1e-6)
    for compiled_weight, eager_weight in zip(compiled_weights, eager_weights):
        torch.testing.assert_close(compiled_weight, eager_weight, rtol=1e-4, atol=1e-5)


def test_a_compiled_trainer_trains_as_an_eager_one(tmp_path):
    """The Trainer's training steps through the compiled forward and loss (and its evaluation eager):
    the same logged losses as without, and the layers' marks gone after training."""
    tokenizer = word_tokenizer()
    pairs = reverse_task(64, seed=1)
    dataset = Dataset.from_dict({"src": [s for s, _ in pairs], "tgt": [t for _, t in pairs]}).map(
        lambda row: tokenizer(row["src"], text_target=row["tgt"]), remove_columns=["src", "tgt"]
    )
    losses = []
    for compiled in (False, True):
        model = tiny_model(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **NO_DROPOUT)
        arguments = Seq2SeqTrainingArguments(
            output_dir=str(tmp_path / str(compiled)), max_steps=3, per_device_train_batch_size=16,
            logging_steps=1, report_to="none", use_cpu=True, save_strategy="no", eval_strategy="steps",
            eval_steps=3, logging_nan_inf_filter=not compiled,
        )  # fmt: skip
        trainer = LabelSmoothedSeq2SeqTrainer(
            model=model.train(),
            args=arguments,
            train_dataset=dataset,
            eval_dataset=dataset.select(range(8)),
            data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
            label_smoothing=0.1,
            # Regional, as the paper's deeper models are compiled: the layers marked within training.
            compiled_loss=CompiledTrainingLoss(0.1, backend="aot_eager", regional=True) if compiled else None,
        )
        trainer.train()
        history = trainer.state.log_history
        losses.append([entry["loss"] for entry in history if "loss" in entry])
        losses.append([entry["eval_loss"] for entry in history if "eval_loss" in entry])
        assert not any(
            "forward" in vars(layer) for layer in model.modules() if isinstance(layer, REGION_CLASSES)
        )
    assert len(losses[0]) == 3 and len(losses[1]) == 1
    assert losses[2] == pytest.approx(losses[0], rel=1e-4)
    assert losses[3] == pytest.approx(losses[1], rel=1e-4)


def test_the_compile_cache_carries_what_was_compiled(tmp_path):
    """Inductor's code for a small function saved in a run's folder, and loaded from it."""
    cache = CompileCache(tmp_path)
    assert not cache.load()
    torch.compile(lambda x: torch.sin(x) * 2 + 1)(torch.randn(8))
    cache.save()
    assert (tmp_path / "compile_cache.bin").stat().st_size > 0
    info = torch.compiler.load_cache_artifacts((tmp_path / "compile_cache.bin").read_bytes())
    assert info is not None and info.inductor_artifacts
    assert cache.load()
    (tmp_path / "compile_cache.bin").write_bytes(b"not a cache")
    assert not cache.load()  # a warning, and the run compiles anew


class DescribedBar(tqdm):
    """A tqdm bar that remembers the descriptions it showed."""

    descriptions: list[str] = []

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        DescribedBar.descriptions.append(desc)
        super().set_description(desc, refresh)


def test_train_compile_shows_the_compile_and_saves_its_cache(corpus, tmp_path, monkeypatch, caplog):  # noqa: F811
    """`train --compile` end to end (Inductor swapped for aot_eager, for speed): the bar says it compiles
    until the first step ends, a line gives that step's time, and the run's folder keeps what was compiled
    when there is any."""
    monkeypatch.setattr(progress, "tqdm", DescribedBar)
    lengths = []

    class ShapeRecordingLoss(CompiledTrainingLoss):
        def __call__(self, model, inputs, num_items_in_batch):
            lengths.extend((inputs["input_ids"].shape[1], inputs["labels"].shape[1]))
            return super().__call__(model, inputs, num_items_in_batch)

    monkeypatch.setattr(pipeline, "CompiledTrainingLoss", partial(ShapeRecordingLoss, backend="aot_eager"))
    DescribedBar.descriptions = []
    with caplog.at_level("INFO", logger="hf_vanilla_transformer"):
        results = run_training(settings(corpus, tmp_path, compile=True, max_steps=2, save_steps=2))
    assert results["steps"] == 2 and results["train_loss"] > 0
    assert lengths and all(length % SEQUENCE_MULTIPLE == 0 for length in lengths), lengths
    assert DescribedBar.descriptions[:2] == ["compiling the training step", ""]
    assert "The first step, compiling the training step, took" in caplog.text
    saved = torch.compiler.save_cache_artifacts()
    assert (tmp_path / COMPILE_CACHE_FILE).is_file() == (saved is not None)


def built_kernels(folder: Path) -> dict[str, int]:
    """The C++ kernels Inductor built in its cache `folder`: each library's path in it, and when it was
    written."""
    return {str(path.relative_to(folder)): path.stat().st_mtime_ns for path in folder.rglob("*.so")}


@pytest.mark.slow
def test_a_compiled_run_resumed_from_its_folder_elsewhere_builds_no_kernel_again(corpus, tmp_path):  # noqa: F811
    """`train --compile --inductor-cache-in-run-folder` on a CPU, as a command of its own: the built C++
    kernels stay in the run's folder, in this CPU's own folder there, and not in the Inductor cache the
    environment names; the run resumed with the flag from that folder moved elsewhere (as on another
    machine, or after /tmp was emptied) compiles its step from them, building none again."""
    flags = [*data_flags(corpus), *TINY, "--preset", "cpu-demo", "--compile", "--no-bf16", "--dev", "none",
             "--test", "none", "--save-steps", "1", "--inductor-cache-in-run-folder"]  # fmt: skip
    machine_cache = tmp_path / "machine"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(machine_cache)

    def train_command(run: Path, *more: str) -> str:
        command = [sys.executable, "-m", "hf_vanilla_transformer", "train", "--output-dir", str(run), *flags]
        result = forked_processes.run([*command, *more], capture_output=True, text=True, env=env, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stderr

    train_command(tmp_path / "run", "--max-steps", "1")
    kernels = built_kernels(tmp_path / "run" / INDUCTOR_CACHE_FOLDER / cpu_features().fingerprint)
    assert kernels  # the cold compile built them in the run's folder
    moved = shutil.move(tmp_path / "run", tmp_path / "elsewhere")
    log = train_command(moved, "--max-steps", "2", "--resume")
    assert "The first step, compiling the training step, took" in log
    assert built_kernels(moved / INDUCTOR_CACHE_FOLDER / cpu_features().fingerprint) == kernels
    assert not built_kernels(machine_cache)


class StartOfRun(Exception):
    """Raised where a run would start training: the test has seen what it looks at."""


@pytest.mark.parametrize("asked", [True, False])
def test_a_run_keeps_inductors_cache_in_its_folder_only_where_asked(tmp_path, monkeypatch, asked):
    """`run_training` points Inductor's cache (`TORCHINDUCTOR_CACHE_DIR`) at this CPU's folder in the run's
    folder for the run where `--inductor-cache-in-run-folder` asks, over a folder the user chose, and sets
    the variable back once the run ends, also where it ends in an error."""
    seen = []

    def start_run(settings) -> None:
        seen.append(os.environ.get("TORCHINDUCTOR_CACHE_DIR"))
        raise StartOfRun

    monkeypatch.setattr(pipeline, "_start_run", start_run)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "chosen"))
    run = tmp_path / "run"
    flags = ["--inductor-cache-in-run-folder"] if asked else []
    with pytest.raises(StartOfRun):
        main(["train", "--preset", "cpu-demo", "--compile", *flags, "--output-dir", str(run)])
    in_run_folder = run / INDUCTOR_CACHE_FOLDER / cpu_features().fingerprint
    assert seen == [str(in_run_folder if asked else tmp_path / "chosen")]
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "chosen")


def test_the_run_folders_inductor_cache_is_refused_to_an_eager_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(
            ["train", "--preset", "cpu-demo", "--inductor-cache-in-run-folder", "--output-dir", str(tmp_path)]
        )
    assert exit_.value.code == 2
    assert "--inductor-cache-in-run-folder keeps what --compile builds" in capsys.readouterr().err


@pytest.mark.slow
def test_a_step_under_the_forwards_own_autocast_is_found_in_aotautograds_cache(tmp_path):
    """bf16 autocast put around the model's forward, as accelerate's mixed precision puts it, is traced into
    the compiled graph; a second compilation of the step (Dynamo reset, as in a new process) still finds its
    forward and backward in AOTAutograd's cache, and computes the same loss and gradients."""
    model = tiny_model(**NO_DROPOUT).train()
    model.forward = MethodType(torch.autocast("cpu", dtype=torch.bfloat16)(type(model).forward), model)
    batch = with_decoder_inputs(model, batches_of(([12, 9, 7], [10, 8, 11]), 64, 1)[0])
    results = []
    with inductor_cache_dir(tmp_path):  # empty: the first step is compiled, not found
        for _ in range(2):
            torch._dynamo.reset()
            counters.clear()
            loss = CompiledTrainingLoss(0.1, static_shapes=True)(model, batch, None)
            loss.backward()
            results.append((loss.detach(), [parameter.grad.clone() for parameter in model.parameters()]))
            model.zero_grad(set_to_none=True)
    assert counters["aot_autograd"]["autograd_cache_bypass"] == 0
    assert counters["aot_autograd"]["autograd_cache_hit"] == 1
    (loss, gradients), (cached_loss, cached_gradients) = results
    torch.testing.assert_close(cached_loss, loss, rtol=0, atol=0)
    for cached, fresh in zip(cached_gradients, gradients):
        torch.testing.assert_close(cached, fresh, rtol=0, atol=0)
