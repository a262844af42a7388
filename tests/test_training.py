"""The training script end to end on a tiny model: train, checkpoints, averaging, translate, BLEU;
kill-and-resume equivalence; bad input."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import forked_processes
import pytest
import torch
from conftest import REPO_ROOT, accelerate_cpu_launcher, run_in_process
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.common import cpu_speedups
from hf_vanilla_transformer.evaluation.metrics import corpus_bleu
from hf_vanilla_transformer.evaluation.tuning import DEFAULT_LENGTH_PENALTIES
from hf_vanilla_transformer.inference.translation import translate
from hf_vanilla_transformer.training import pipeline as training
from hf_vanilla_transformer.training.pipeline import run_training
from hf_vanilla_transformer.training.presets import TRAINING_PRESETS
from hf_vanilla_transformer.training.settings import TrainingSettings
from hf_vanilla_transformer.training.subword_dropout import SubwordDropoutDataset

TINY = ["--model-override", "d_model=32", "--model-override", "N=1", "--model-override", "h=2",
        "--model-override", "d_ff=64", "--vocab-size", "300", "--max-tokens", "256",
        "--tokens-per-step", "256", "--warmup-steps", "5", "--max-eval-sentences", "8",
        "--eval-batch-size", "8"]  # fmt: skip


def write_corpus(folder: Path) -> Path:
    """A slice of the shipped Multi30k in `folder`: 300 training pairs, 20 dev and 20 test pairs."""
    for split, count in (("train", 300), ("val", 20), ("test_2016_flickr", 20)):
        for lang in ("en", "de"):
            lines = (REPO_ROOT / "data" / "multi30k" / f"{split}.{lang}").read_text().split("\n")[:count]
            (folder / f"{split}.{lang}").write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def data_flags(corpus: Path) -> list[str]:
    return [
        "--train",
        str(corpus / "train"),
        "--dev",
        str(corpus / "val"),
        "--test",
        str(corpus / "test_2016_flickr"),
    ]


def run_subcommand(name: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return forked_processes.run(
        [sys.executable, "-m", "hf_vanilla_transformer", name, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        **kwargs,
    )


def losses(trainer_state: Path) -> dict[int, float]:
    history = json.loads(trainer_state.read_text())["log_history"]
    return {entry["step"]: entry["loss"] for entry in history if "loss" in entry}


def test_train_average_translate_and_score(corpus, tmp_path, capsys, monkeypatch):
    """Training runs as the console's `python -m` runs it, in a process of its own; the commands that use
    its model run through `main`, in this one."""
    out = tmp_path / "run"
    result = run_subcommand(
        "train", "--output-dir", str(out), "--preset", "cpu-demo", *data_flags(corpus), *TINY,
        "--max-steps", "6", "--save-steps", "2", "--eval-steps", "3", "--average-checkpoints", "3",
        "--keep-checkpoints", "3",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    # The run's progress and summary are logged (on stderr, as transformers logs).
    assert "test BLEU" in result.stderr and "model saved in" in result.stderr
    assert "step 3: dev loss" in result.stderr and "dev BLEU" in result.stderr
    results = json.loads((out / "model" / "results.json").read_text())
    assert results["steps"] == 6
    assert results["averaged_checkpoints"] == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    assert 0 <= results["bleu"] <= 100 and results["bleu_signature"].startswith("nrefs:1")
    assert (
        len(results["samples"]) == 5
        and {"dev_loss", "dev_bleu", "target_tokens_per_second"} <= results.keys()
    )

    model = AutoModelForSeq2SeqLM.from_pretrained(out / "model")
    assert isinstance(model, VanillaTransformerForConditionalGeneration)
    assert model.generation_config.length_penalty_type == "gnmt" and model.generation_config.num_beams == 4

    two_lines = "A dog runs.\nTwo men talk.\n"
    status, translated, error = run_in_process(
        capsys, monkeypatch, "translate", "--model", str(out / "model"), stdin=two_lines
    )
    assert status is None, error[-2000:]
    assert len(translated.split("\n")) == 3  # two lines and the final newline
    status, quantized, error = run_in_process(
        capsys, monkeypatch, "translate", "--model", str(out / "model"), "--int8", stdin=two_lines
    )
    assert status is None, error[-2000:]
    assert len(quantized.split("\n")) == 3

    hyp = tmp_path / "hyp.de"
    status, _, error = run_in_process(
        capsys, monkeypatch, "translate", "--model", str(out / "model"), "--input", str(corpus / "val.en"),
        "--output", str(hyp),
    )  # fmt: skip
    assert status is None, error[-2000:]
    status, scored, error = run_in_process(
        capsys, monkeypatch, "evaluate", "--hypotheses", str(hyp), "--references", str(corpus / "val.de"),
        "--json",
    )  # fmt: skip
    assert status is None, error[-2000:]
    assert 0 <= json.loads(scored)["bleu"]["score"] <= 100

    status, _, error = run_in_process(
        capsys,
        monkeypatch,
        "average",
        "--run-dir",
        str(out),
        "--last",
        "2",
        "--output",
        str(tmp_path / "avg"),
    )
    assert status is None, error[-2000:]
    two_last = [load_file(out / f"checkpoint-{step}" / "model.safetensors") for step in (4, 6)]
    mean = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "avg").state_dict()
    for key in two_last[0]:
        torch.testing.assert_close(mean[key], (two_last[0][key] + two_last[1][key]) / 2)


@pytest.mark.parametrize("recipe", [[], ["--subword-dropout", "0.1"]], ids=["bpe", "bpe-dropout"])
def test_killed_and_resumed_run_matches_an_uninterrupted_one(
    corpus, tmp_path, recipe, capsys, monkeypatch, shipped_onednn_sizes
):
    """The run killed is a process of its own, killed by SIGKILL; the uninterrupted run, the refusal to
    train over its checkpoints and the resumed run go through `main`, in this process, with the products
    the killed process computed with (`shipped_onednn_sizes`)."""
    flags = [*data_flags(corpus), *TINY, "--preset", "cpu-demo", "--max-steps", "12", "--save-steps", "3",
             "--keep-checkpoints", "10", "--eval-steps", "100", "--test", "none",
             "--dev", "none", *recipe]  # fmt: skip
    straight = tmp_path / "straight"
    status, _, error = run_in_process(capsys, monkeypatch, "train", "--output-dir", str(straight), *flags)
    assert status is None, error[-3000:]
    expected = losses(straight / "checkpoint-12" / "trainer_state.json")
    assert sorted(expected) == list(range(1, 13))

    killed = tmp_path / "killed"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    process = forked_processes.popen(
        [sys.executable, "-m", "hf_vanilla_transformer", "train", "--output-dir", str(killed), *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    deadline = time.time() + 300
    while not (killed / "checkpoint-6" / "trainer_state.json").exists():
        assert process.poll() is None and time.time() < deadline, "the run ended before it could be killed"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait(60)
    assert not (killed / "checkpoint-12").exists()

    status, _, refused = run_in_process(capsys, monkeypatch, "train", "--output-dir", str(killed), *flags)
    assert status == 2 and "Pass --resume" in refused
    assert refused.strip().splitlines()[-1].startswith("vanilla-transformer train: error:"), refused[-2000:]
    assert "Traceback" not in refused

    status, _, error = run_in_process(
        capsys, monkeypatch, "train", "--output-dir", str(killed), *flags, "--resume"
    )
    assert status is None, error[-3000:]
    actual = losses(killed / "checkpoint-12" / "trainer_state.json")
    assert sorted(actual) == list(range(1, 13))
    for step in range(7, 13):
        assert actual[step] == pytest.approx(expected[step], rel=1e-5), step


def test_resume_refuses_a_different_model_or_recipe(corpus, tmp_path, capsys, monkeypatch):
    """Through `main`, as test_killed_and_resumed_run_matches_an_uninterrupted_one meets the refusal of a
    folder of checkpoints, exit status 2."""
    flags = [*data_flags(corpus), *TINY, "--preset", "cpu-demo", "--max-steps", "2", "--save-steps", "2",
             "--test", "none", "--dev", "none"]  # fmt: skip
    status, _, error = run_in_process(capsys, monkeypatch, "train", "--output-dir", str(tmp_path), *flags)
    assert status is None, error[-3000:]
    resume = ["train", "--output-dir", str(tmp_path), *flags, "--resume"]
    status, _, changed = run_in_process(capsys, monkeypatch, *resume, "--model-override", "d_ff=128")
    assert status == 2 and "Traceback" not in changed
    assert "encoder_ffn_dim: 64 in the checkpoint, 128 now" in changed
    # Another preset or warm-up would carry on with other batches and another schedule.
    status, _, other_preset = run_in_process(capsys, monkeypatch, *resume, "--preset", "cpu")
    assert status == 2 and "Traceback" not in other_preset
    assert "preset: 'cpu-demo' in the run, 'cpu' now" in other_preset
    assert "--preset cpu-demo" in other_preset
    status, _, other_warmup = run_in_process(capsys, monkeypatch, *resume, "--warmup-steps", "6")
    assert status not in (None, 0) and "warmup_steps: 5 in the run, 6 now" in other_warmup
    # Going on for longer is what resuming is for.
    status, _, error = run_in_process(capsys, monkeypatch, *resume, "--max-steps", "3")
    assert status is None, error[-3000:]
    assert json.loads((tmp_path / "model" / "results.json").read_text())["steps"] == 3


def settings(corpus: Path, out: Path, **overrides) -> TrainingSettings:
    values = dict(
        output_dir=str(out), train=str(corpus / "train"), dev=None, test=None, preset="cpu-demo",
        max_steps=1, vocab_size=300, model_overrides={"d_model": 32, "N": 1, "h": 2, "d_ff": 64},
    )  # fmt: skip
    values.update(overrides)
    if values.get("tokenizer") or values.get("init_from"):
        del values["vocab_size"]  # a given tokenizer brings its own vocabulary (a size is refused)
    return TrainingSettings(**values)


def test_bad_input_gets_clear_errors(corpus, tmp_path):
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        run_training(settings(corpus, tmp_path / "a", resume=True))
    with pytest.raises(ValueError, match="Unknown training preset 'huge'"):
        run_training(settings(corpus, tmp_path / "b", preset="huge"))
    with pytest.raises(FileNotFoundError, match="missing.en"):
        run_training(settings(corpus, tmp_path / "c", train=str(tmp_path / "missing")))
    with pytest.raises(ValueError, match="max_tokens|budget"):
        run_training(settings(corpus, tmp_path / "d", max_tokens=4))
    mismatched = tmp_path / "mismatched"
    (tmp_path / "mismatched.en").write_text("one\ntwo\nthree\n")
    (tmp_path / "mismatched.de").write_text("eins\nzwei\n")
    with pytest.raises(ValueError, match="3.*2|2.*3"):
        run_training(settings(corpus, tmp_path / "e", train=str(mismatched)))
    with pytest.raises(ValueError, match="language"):
        run_training(settings(corpus, tmp_path / "f", src_lang="en/de"))
    with pytest.raises(ValueError, match=r"\['pad_token_id'\] are set by the run"):
        run_training(settings(corpus, tmp_path / "g", model_overrides={"d_model": 32, "pad_token_id": 5}))


def test_bf16_on_a_cpu_trains_with_eager_attention_and_fast_dropout_masks(corpus, tmp_path, monkeypatch):
    seen = []
    original = training.cpu_bf16_training

    @contextmanager
    def recording(model):
        with original(model):
            fast_masks = any(isinstance(m, cpu_speedups.FastMaskDropout) for m in model.modules())
            seen.append((model.config._attn_implementation, fast_masks))
            yield
        assert not any(isinstance(m, cpu_speedups.FastMaskDropout) for m in model.modules())

    monkeypatch.setattr(training, "cpu_bf16_training", recording)
    results = run_training(settings(corpus, tmp_path, bf16=True))
    assert results["mixed_precision"] == "bf16" and seen == [("eager", True)]
    # How the run drew its dropout masks is not part of the model it publishes.
    saved = json.loads((Path(results["model_dir"]) / "config.json").read_text())
    assert "fast_dropout_masks" not in saved
    assert run_training(settings(corpus, tmp_path / "fp32", bf16=False))["mixed_precision"] == "no"
    assert len(seen) == 1  # not in float32


def test_two_process_launch(corpus, tmp_path):
    """`accelerate launch --multi_gpu --num_processes 2` runs two CPU processes (gloo) with one
    token budget each; the global batch is then made of both processes' micro-batches."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [*accelerate_cpu_launcher(2), "-m", "hf_vanilla_transformer", "train", "--output-dir", str(tmp_path),
         *data_flags(corpus), *TINY, "--preset", "cpu-demo", "--max-steps", "4", "--save-steps", "2",
         "--tokens-per-step", "512"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "256 per micro-batch x 1 accumulation x 2 process(es)" in result.stderr
    results = json.loads((tmp_path / "model" / "results.json").read_text())
    assert results["steps"] == 4 and {"dev_loss", "dev_bleu", "bleu"} <= results.keys()


def test_time_budget_stops_with_a_checkpoint(corpus, tmp_path):
    results = run_training(settings(corpus, tmp_path, max_steps=10_000, max_minutes=0.001, save_steps=10_000))
    assert 1 <= results["steps"] < 10_000
    assert (tmp_path / f"checkpoint-{results['steps']}" / "trainer_state.json").exists()


def test_a_presets_cooldown_keeps_its_share_of_the_steps():
    """The cpu preset cools down over its last 2000 of 6000 steps: a run of fewer steps keeps the last third,
    and an explicit cooldown_steps wins."""
    cpu = TRAINING_PRESETS["cpu"]
    assert (cpu.max_steps, cpu.cooldown_steps) == (6000, 2000)
    assert TrainingSettings(output_dir="x", preset="cpu").recipe().cooldown_steps == 2000
    assert TrainingSettings(output_dir="x", preset="cpu", max_steps=600).recipe().cooldown_steps == 200
    assert TrainingSettings(output_dir="x", preset="cpu", max_steps=1).recipe().cooldown_steps == 0
    explicit = TrainingSettings(output_dir="x", preset="cpu", max_steps=600, cooldown_steps=50)
    assert explicit.recipe().cooldown_steps == 50
    assert TrainingSettings(output_dir="x", preset="base", max_steps=600).recipe().cooldown_steps == 0


def test_cooldown_steps_reach_the_trainers_updates(corpus, tmp_path):
    """With cooldown_steps C of T updates, the Trainer makes its last C updates at Eq. 3 times (T-k+1)/C:
    the last at 1/C of Eq. 3. The Trainer logs with each update the learning rate that update used."""
    total, cooldown, warmup, scale = 6, 3, 2, 0.3  # the cpu-demo preset's lr_scale
    run_training(
        settings(
            corpus, tmp_path, max_steps=total, cooldown_steps=cooldown, warmup_steps=warmup, save_steps=total
        )
    )
    history = json.loads((tmp_path / f"checkpoint-{total}" / "trainer_state.json").read_text())["log_history"]
    logged = {entry["step"]: entry["learning_rate"] for entry in history if "learning_rate" in entry}

    def expected(update: int) -> float:
        eq_3 = scale * 32**-0.5 * min(update**-0.5, update * warmup**-1.5)
        return eq_3 * max(0.0, min(1.0, (total - update + 1) / cooldown))

    assert logged == pytest.approx({update: expected(update) for update in range(1, total + 1)}, rel=1e-6)
    assert logged[total] == pytest.approx(logged[total - 2] / 3 * (total - 2) ** 0.5 / total**0.5, rel=1e-6)


def test_subword_dropout_resegments_the_training_pairs_each_epoch(corpus, tmp_path, monkeypatch):
    """Every epoch of a run trains on a new BPE-dropout segmentation of the same pairs: the Trainer's
    set_epoch reaches the dataset."""
    seen: dict[tuple[int, int], list[int]] = {}
    getitem = SubwordDropoutDataset.__getitem__

    def recording(dataset, index):
        example = getitem(dataset, index)
        seen[dataset.epoch, index] = example["labels"]
        return example

    monkeypatch.setattr(SubwordDropoutDataset, "__getitem__", recording)
    # 300 pairs of some 30 + 30 tokens in this small vocabulary: a few steps an epoch.
    run_training(
        settings(corpus, tmp_path, max_steps=5, tokens_per_step=8192, max_tokens=8192, subword_dropout=0.1)
    )
    epochs = {epoch for epoch, _ in seen}
    assert len(epochs) >= 2
    first, second = sorted(epochs)[:2]
    both = [index for epoch, index in seen if epoch == first and (second, index) in seen]
    assert len(both) > 200
    assert sum(seen[first, index] != seen[second, index] for index in both) > 0.8 * len(both)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tokenizer")
    assert all(
        tokenizer.decode(seen[first, index]) == tokenizer.decode(seen[second, index]) for index in both
    )


def test_subword_dropout_reaches_data_loading_workers_epoch_by_epoch(corpus, tmp_path):
    """Workers load each epoch's own segmentation: a run that loads its data in a worker process trains on
    the same batches, step for step, as one that loads them itself."""
    runs = {}
    for workers in (0, 1):
        run = settings(
            corpus, tmp_path / str(workers), max_steps=5, save_steps=5, tokens_per_step=8192, max_tokens=8192,
            subword_dropout=0.1, dataloader_workers=workers,
        )  # fmt: skip
        run_training(run)
        runs[workers] = losses(tmp_path / str(workers) / "checkpoint-5" / "trainer_state.json")
    assert sorted(runs[0]) == list(range(1, 6))
    assert runs[1] == pytest.approx(runs[0], rel=1e-6)


def test_fine_tuning_starts_from_the_pretrained_model_and_its_tokenizer(corpus, tmp_path):
    pretrained = tmp_path / "pretrained"
    run_training(settings(corpus, pretrained, max_steps=3, average_checkpoints=1))
    start = AutoModelForSeq2SeqLM.from_pretrained(pretrained / "model")

    # No model settings of its own: the architecture and the vocabulary come from the pretrained model.
    tuned_dir = tmp_path / "tuned"
    run_training(
        settings(
            corpus, tuned_dir, init_from=str(pretrained / "model"), model_overrides={}, max_steps=2, seed=5
        )
    )
    tuned = AutoModelForSeq2SeqLM.from_pretrained(tuned_dir / "model")
    assert tuned.config.to_diff_dict() | {"_name_or_path": None} == start.config.to_diff_dict() | {
        "_name_or_path": None
    }
    assert AutoTokenizer.from_pretrained(tuned_dir / "model").get_vocab() == (
        AutoTokenizer.from_pretrained(pretrained / "model").get_vocab()
    )
    # Two updates move the pretrained weights a little; a fresh initialisation would be far from them.
    start_weights, tuned_weights = start.state_dict(), tuned.state_dict()
    fresh = VanillaTransformerForConditionalGeneration(start.config).state_dict()
    moved = sum((tuned_weights[k] - start_weights[k]).abs().sum() for k in start_weights)
    distance_to_fresh = sum((fresh[k] - start_weights[k]).abs().sum() for k in start_weights)
    assert 0 < moved < 0.2 * distance_to_fresh

    with pytest.raises(ValueError, match="cannot change"):
        run_training(settings(corpus, tmp_path / "x", init_from=str(pretrained / "model")))


def test_fine_tuning_a_model_saved_with_label_smoothing_in_its_config_trains_with_it(corpus, tmp_path):
    """Configs saved by earlier versions of the package carry their run's label smoothing: fine-tuning
    takes it as the recipe's, unless --label-smoothing says otherwise, and the fine-tuned model's config is
    left without it."""
    pretrained = tmp_path / "pretrained"
    run_training(settings(corpus, pretrained, max_steps=1, average_checkpoints=1, label_smoothing=0.1))
    config_file = pretrained / "model" / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "label_smoothing": 0.3}))
    for given, expected in ((None, 0.3), (0.0, 0.0)):
        tuned = tmp_path / f"tuned-{given}"
        run_training(
            settings(
                corpus, tuned, init_from=str(pretrained / "model"), model_overrides={}, label_smoothing=given
            )
        )
        assert json.loads((tuned / "model" / "results.json").read_text())["label_smoothing"] == expected
        assert "label_smoothing" not in json.loads((tuned / "model" / "config.json").read_text())


def test_dev_bleu_at_every_dev_evaluation(corpus, tmp_path, caplog):
    """eval_bleu: every dev evaluation during training also translates the dev set and scores it with the
    package's sacreBLEU metric; the Trainer records it as eval_bleu next to eval_loss."""
    run = settings(
        corpus, tmp_path, dev=str(corpus / "val"), max_steps=2, eval_steps=1, save_steps=2, eval_bleu=True,
        max_eval_sentences=4,
    )  # fmt: skip
    with caplog.at_level("INFO", logger="hf_vanilla_transformer"):
        run_training(run)
    history = json.loads((tmp_path / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
    scores = {entry["step"]: entry["eval_bleu"] for entry in history if "eval_loss" in entry}
    assert sorted(scores) == [1, 2] and all(0 <= score <= 100 for score in scores.values())
    assert "step 1: dev loss" in caplog.text and ", dev BLEU" in caplog.text


def test_length_penalty_chosen_on_dev_is_saved_and_decodes_the_test_set(corpus, tmp_path):
    """The `cpu` preset chooses alpha on the dev set (Section 6.1): the dev set is translated at each alpha,
    the best is written into the saved model's generation config, and the test set is translated with it.
    Every recorded score is checked against translations made afresh with the saved model."""
    # Trained on its dev set, which it partly learns by heart in 100 steps, so that alphas score differently;
    # the same set as the test set, so that the test score shows which alpha decoded it. Float32 on any CPU;
    # the paper's dropout, label smoothing, Adam and Eq. 3 to the end, and 4096-token batches, under which the
    # tiny model learns by heart fastest.
    val = str(corpus / "val")
    tiny = {"d_model": 32, "N": 1, "h": 2, "d_ff": 64, "dropout": 0.1}
    tiny.update(attention_dropout=0.0, activation_dropout=0.0)
    run = settings(
        corpus, tmp_path, preset="cpu", train=val, dev=val, test=val, max_steps=100, warmup_steps=20,
        label_smoothing=0.1,
        lr_scale=0.3, vocab_size=200, bf16=False, max_eval_sentences=12, model_overrides=tiny,
        weight_decay=0.0, cooldown_steps=0, tokens_per_step=4096, max_tokens=4096,
    )  # fmt: skip
    run_training(run)
    results = json.loads((tmp_path / "model" / "results.json").read_text())
    by_alpha = results["dev_bleu_by_length_penalty"]
    assert list(by_alpha) == [f"{alpha:g}" for alpha in DEFAULT_LENGTH_PENALTIES]
    best = max(DEFAULT_LENGTH_PENALTIES, key=lambda alpha: by_alpha[f"{alpha:g}"])
    # Only a choice other than the paper's 0.6 shows that the chosen alpha is saved and used.
    assert best != 0.6 and by_alpha[f"{best:g}"] > by_alpha["0.6"], by_alpha
    assert results["length_penalty"] == best and results["dev_bleu"] == by_alpha[f"{best:g}"]
    assert results["bleu"] == by_alpha[f"{best:g}"] and results["num_beams"] == 4

    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "model")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "model")
    assert model.generation_config.length_penalty == best and model.generation_config.num_beams == 4
    sources, references = ((corpus / f"val.{lang}").read_text().splitlines()[:12] for lang in ("en", "de"))
    for alpha in DEFAULT_LENGTH_PENALTIES:
        hypotheses = translate(model, tokenizer, sources, progress=False, length_penalty=alpha)
        assert corpus_bleu(hypotheses, references).score == by_alpha[f"{alpha:g}"], alpha
    hypotheses = translate(model, tokenizer, sources, progress=False)  # the saved generation config
    assert corpus_bleu(hypotheses, references).score == results["bleu"]
    assert [sample["translation"] for sample in results["samples"]] == hypotheses[:5]


def test_without_tuning_the_paper_length_penalty_stays(corpus, tmp_path):
    run = settings(
        corpus, tmp_path, preset="cpu", dev=str(corpus / "val"), max_eval_sentences=4,
        tune_length_penalty=False, bf16=False,
    )  # fmt: skip
    results = run_training(run)
    assert results["length_penalty"] == 0.6 and "dev_bleu_by_length_penalty" not in results
    assert AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "model").generation_config.length_penalty == 0.6


def test_a_tuning_preset_without_a_dev_set_or_beam_keeps_the_paper_alpha(corpus, tmp_path):
    """The preset's tuning applies where it can: a run without a dev set, or a greedy one, just skips it."""
    no_dev = run_training(settings(corpus, tmp_path / "a", preset="cpu", dev=None, bf16=False))
    assert no_dev["length_penalty"] == 0.6
    greedy = settings(
        corpus, tmp_path / "b", preset="cpu", dev=str(corpus / "val"), num_beams=1, max_eval_sentences=4,
        bf16=False,
    )  # fmt: skip
    results = run_training(greedy)
    assert "dev_bleu_by_length_penalty" not in results and results["num_beams"] == 1
    # A greedy evaluation leaves the saved model the paper's beam search.
    assert AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "b" / "model").generation_config.num_beams == 4


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"dev": None}, "chooses alpha on the dev set, but the run has none"),
        ({"num_beams": 1}, "num_beams is 1"),
    ],
)
def test_tuning_refuses_runs_it_cannot_tune(corpus, tmp_path, overrides, message):
    values = {"dev": str(corpus / "val"), "tune_length_penalty": True, **overrides}
    with pytest.raises(ValueError, match=message):  # refused as the settings are made
        run_training(settings(corpus, tmp_path, **values))
    assert not (tmp_path / "model").exists()


def test_patience_stops_after_evaluations_without_a_better_dev_bleu_and_keeps_the_best(
    corpus, tmp_path, monkeypatch, caplog
):
    """--eval-bleu --patience 3, as fairseq's --best-checkpoint-metric bleu --patience 3: a scripted dev BLEU
    goes through the Trainer's real evaluation, early stopping and best-checkpoint path. The best score comes
    at the second evaluation (step 4); three evaluations without a better one follow (a tie is no better),
    so training stops at step 10 of 30, and the final model is checkpoint-4's weights, not an average."""
    scripted = iter([10.0, 30.0, 20.0, 25.0, 30.0, 99.0])
    monkeypatch.setattr(training, "dev_bleu", lambda tokenizer, prediction: {"bleu": next(scripted)})
    run = settings(
        corpus, tmp_path, dev=str(corpus / "val"), max_steps=30, eval_steps=2, save_steps=4, eval_bleu=True,
        patience=3, keep_checkpoints=2, average_checkpoints=2,
    )  # fmt: skip
    with caplog.at_level("INFO", logger="hf_vanilla_transformer"):
        results = run_training(run)

    assert results["steps"] == 10 and results["averaged_checkpoints"] == []
    assert results["early_stopping"] == {
        "metric": "dev BLEU", "patience": 3, "stopped_early": True, "best_step": 4, "best_score": 30.0,
    }  # fmt: skip
    history = json.loads((tmp_path / "checkpoint-8" / "trainer_state.json").read_text())["log_history"]
    scores = [(entry["step"], entry["eval_bleu"]) for entry in history if "eval_bleu" in entry]
    assert scores == [(2, 10.0), (4, 30.0), (6, 20.0), (8, 25.0)]
    # Checkpoint rotation (2 kept) keeps the best one; the final model holds its weights, not the last ones.
    best = load_file(tmp_path / "checkpoint-4" / "model.safetensors")
    final = load_file(tmp_path / "model" / "model.safetensors")
    assert final.keys() == best.keys()
    for key in best:
        torch.testing.assert_close(final[key], best[key], rtol=0, atol=0)
    later = load_file(tmp_path / "checkpoint-8" / "model.safetensors")
    assert any(not torch.equal(later[key], best[key]) for key in best)
    saved = json.loads((tmp_path / "model" / "results.json").read_text())
    assert saved["early_stopping"] == results["early_stopping"]
    assert "stopped early at step 10 (3 dev evaluations without a better dev BLEU)" in caplog.text
    assert "the final model is step 4's checkpoint, the best dev BLEU 30" in caplog.text


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"patience": 2}, "patience counts dev evaluations.*pass --dev"),
        ({"patience": 2, "dev": "val", "save_steps": 3, "eval_steps": 2}, "not a multiple of --eval-steps 2"),
        ({"patience": 0, "dev": "val"}, "patience"),
    ],
)
def test_patience_refuses_runs_it_cannot_serve(corpus, tmp_path, overrides, message):
    if "dev" in overrides:
        overrides["dev"] = str(corpus / overrides["dev"])
    with pytest.raises(ValueError, match=message):
        settings(corpus, tmp_path, **overrides)


def test_a_resumed_runs_train_loss_covers_the_whole_run(corpus, tmp_path):
    """A run killed after checkpoint-21 and resumed reports the mean loss over all its 40 steps, as the
    uninterrupted run does, not over the 19 steps after the resume. The loss is logged every 2 steps, so
    only the log at every checkpoint covers step 21."""
    run = settings(corpus, tmp_path / "straight", max_steps=40, save_steps=3, keep_checkpoints=20)
    straight = run_training(run)
    history = json.loads((tmp_path / "straight" / "checkpoint-40" / "trainer_state.json").read_text())
    logged = [entry for entry in history["log_history"] if "loss" in entry]
    assert logged[0]["step"] == 2 and 21 in [entry["step"] for entry in logged]

    killed = tmp_path / "killed"
    shutil.copytree(tmp_path / "straight", killed)
    shutil.rmtree(killed / "model")
    for checkpoint in killed.glob("checkpoint-*"):
        if int(checkpoint.name.split("-")[1]) > 21:
            shutil.rmtree(checkpoint)
    resumed = run_training(replace(run, output_dir=str(killed), resume=True))
    assert resumed["steps"] == 40
    assert resumed["train_loss"] == pytest.approx(straight["train_loss"], rel=1e-5)
    # Each logged loss is the mean over the steps since the log before: weighted by them, they make the
    # uninterrupted run's mean; the steps after 21 alone (the Trainer's figure after a resume) make another.
    steps = [0] + [entry["step"] for entry in logged]
    weighted = {
        entry["step"]: entry["loss"] * (entry["step"] - before) for before, entry in zip(steps, logged)
    }
    assert straight["train_loss"] == pytest.approx(sum(weighted.values()) / 40, rel=1e-6)
    after_resume = sum(value for step, value in weighted.items() if step > 21) / 19
    assert abs(resumed["train_loss"] - after_resume) > 1e-3
