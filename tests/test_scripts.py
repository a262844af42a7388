"""Each script of scripts/ run through its `main`, as `python scripts/NAME.py ARGS` runs it, on a tiny slice
of real data with a tiny model, so that none of them rots: the Table 2 runs, the translation example's
fine-tuning, the Multi30k CPU demo and the Korean chatbot; and each refusing bad input in one line."""

import importlib.util
import json
import os
from pathlib import Path
from types import ModuleType

import pytest
import torch
from conftest import REPO_ROOT, SHARED_DATA
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM

from hf_vanilla_transformer import (
    VanillaTransformerConfig,
    VanillaTransformerForConditionalGeneration,
    paper_generation_config,
)
from hf_vanilla_transformer.common.tokenization import train_shared_bpe_tokenizer
from hf_vanilla_transformer.evaluation.metrics import MOSES, corpus_bleu, moses_available, tokenized_bleu
from hf_vanilla_transformer.evaluation.tuning import DEFAULT_LENGTH_PENALTIES
from hf_vanilla_transformer.training.chatbot import answer, load_chatbot

SCRIPTS = REPO_ROOT / "scripts"
MULTI30K = REPO_ROOT / "data" / "multi30k"
WMT14 = SHARED_DATA / "wmt14"
needs_wmt14 = pytest.mark.skipif(not WMT14.is_dir(), reason=f"no WMT14 test sets at {WMT14}")

# A model and batches small enough for a run of a few seconds on two cores.
TINY = ["--model-override", "d_model=32", "N=1", "h=2", "d_ff=64", "--vocab-size", "300",
        "--max-tokens", "256", "--tokens-per-step", "256", "--warmup-steps", "5", "--eval-batch-size", "8",
        "--max-steps", "2", "--save-steps", "1", "--no-bf16", "--no-compile"]  # fmt: skip


def script(name: str) -> ModuleType:
    """scripts/NAME.py imported as a module, as `python` runs it but without running its `main`."""
    spec = importlib.util.spec_from_file_location(f"scripts_{name}", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(name: str, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int | None, str, str]:
    """scripts/NAME.py's `main(ARGV)`: its exit status (None: success), standard output and error."""
    capsys.readouterr()  # what the test printed before
    try:
        status = script(name).main(list(argv))
    except SystemExit as exited:
        status = exited.code
    output = capsys.readouterr()
    return status, output.out, output.err


def write_lines(path: Path, lines: list[str]) -> None:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")


def lines_of(path: Path, start: int, stop: int) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[start:stop]


def slice_pairs(folder: Path, name: str, source: Path, target: Path, start: int, stop: int) -> str:
    """Lines start..stop of two line-aligned files written as `folder/name.en` and the target's language;
    returns the prefix."""
    for path in (source, target):
        write_lines(folder / f"{name}{path.suffix}", lines_of(path, start, stop))
    return str(folder / name)


def strings_in(value) -> list[str]:
    """Every string inside a JSON value."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for item in value.values() for text in strings_in(item)]
    if isinstance(value, list):
        return [text for item in value for text in strings_in(item)]
    return []


def assert_no_local_path(record: dict, run_dir: Path) -> None:
    """No string of a results.json is an absolute path, or holds one of this machine's folders."""
    for text in strings_in(record):
        assert not os.path.isabs(text), text
        assert str(run_dir.parent) not in text, text


def test_multi30k_cpu_demo_trains_the_demo_recipe(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    train, dev, test = (
        slice_pairs(corpus, split, MULTI30K / f"{split}.en", MULTI30K / f"{split}.de", 0, count)
        for split, count in (("train", 40), ("val", 4), ("test_2016_flickr", 5))
    )
    out = tmp_path / "demo"
    status, _, error = run_script(
        "multi30k_cpu_demo", capsys, "--output-dir", str(out), "--train", train, "--dev", dev, "--test", test,
        *TINY, "--max-eval-sentences", "4",
    )  # fmt: skip
    assert status is None, error[-3000:]
    record = json.loads((out / "model" / "results.json").read_text())
    # The demo's preset, which averages the last two checkpoints.
    assert record["preset"] == "cpu-demo" and record["steps"] == 2
    assert record["averaged_checkpoints"] == ["checkpoint-1", "checkpoint-2"]
    assert record["test_sentences"] == 4 and 0 <= record["bleu"] <= 100
    # The data are named relative to the run, and resolve from it to the files trained and tested on.
    assert_no_local_path(record, out)
    assert (out / record["dataset"]).resolve() == Path(train).resolve()
    assert (out / record["test_set"]).resolve() == Path(test).resolve()
    assert (out / record["model_dir"]).resolve() == (out / "model").resolve()


def table2_run(tmp_path: Path, capsys, paper_run: str) -> tuple[Path, dict, str]:
    """A Table 2 row trained for two steps on 40 EN-DE pairs of newstest2013, its length penalty chosen on 4
    more and 5 sentences of newstest2014 scored: the run folder, its results.json and the script's output."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    dev_source, dev_target = WMT14 / "newstest2013.en", WMT14 / "newstest2013.de"
    train = slice_pairs(corpus, "train", dev_source, dev_target, 0, 40)
    dev = slice_pairs(corpus, "dev", dev_source, dev_target, 40, 44)
    test = slice_pairs(corpus, "test", WMT14 / "newstest2014.en", WMT14 / "newstest2014.de", 0, 5)
    out = tmp_path / paper_run
    status, printed, error = run_script(
        "wmt14_table2", capsys, paper_run, "--output-dir", str(out), "--train", train, "--dev", dev,
        "--test", test, *TINY,
    )  # fmt: skip
    assert status is None, error[-3000:]
    return out, json.loads((out / "model" / "results.json").read_text()), printed


@needs_wmt14
def test_wmt14_en_de_base_row_averages_tunes_alpha_on_dev_and_scores_the_papers_way(tmp_path, capsys):
    out, record, printed = table2_run(tmp_path, capsys, "en-de-base")
    assert "Table 2 reports 27.3 BLEU" in printed and f"{record['paper_bleu']:.2f}" in printed
    assert record["preset"] == "base" and record["averaged_checkpoints"] == ["checkpoint-1", "checkpoint-2"]
    # Beam 4, alpha chosen among the tuning grid on the dev set.
    assert record["num_beams"] == 4
    assert set(record["dev_bleu_by_length_penalty"]) == {f"{alpha:g}" for alpha in DEFAULT_LENGTH_PENALTIES}
    best = max(record["dev_bleu_by_length_penalty"].values())
    assert record["dev_bleu_by_length_penalty"][f"{record['length_penalty']:g}"] == best
    # The five test translations are all in the samples: score them again, Moses-tokenized, compounds split.
    samples = record["samples"]
    assert len(samples) == record["test_sentences"] == 5
    translations, references = [s["translation"] for s in samples], [s["reference"] for s in samples]
    tokenize = MOSES if moses_available() else "13a"
    expected = tokenized_bleu(translations, references, compound_split=True, tokenize=tokenize, language="de")
    assert record["paper_bleu"] == pytest.approx(expected.score)
    assert record["paper_bleu_signature"].startswith(f"tokenized|pretok:{tokenize}")
    assert "compound:atat" in record["paper_bleu_signature"]
    assert record["bleu"] == pytest.approx(corpus_bleu(translations, references).score)
    assert_no_local_path(record, out)


@needs_wmt14
def test_wmt14_en_de_big_row_trains_the_big_model(tmp_path, capsys):
    out, record, printed = table2_run(tmp_path, capsys, "en-de-big")
    assert "Table 2 reports 28.4 BLEU" in printed
    assert record["preset"] == "big" and record["averaged_checkpoints"] == ["checkpoint-1", "checkpoint-2"]
    config = VanillaTransformerConfig.from_pretrained(out / "model")
    assert config.dropout == 0.3  # Table 3's big model; the tiny shape comes from the overrides
    assert_no_local_path(record, out)


@pytest.mark.parametrize(
    ("paper_run", "preset", "averaged", "pair", "target", "vocabulary", "dropout"),
    [
        ("en-de-base", "base", 5, "de-en", "de", 37_000, 0.1),
        ("en-de-big", "big", 20, "de-en", "de", 37_000, 0.3),
        ("en-fr-big", "big", 20, "fr-en", "fr", 32_000, 0.1),
    ],
)
def test_table2_rows_default_to_the_papers_settings_and_wmt14_from_datasets(
    tmp_path, paper_run, preset, averaged, pair, target, vocabulary, dropout
):
    """The paper's settings: Section 5.1 (vocabularies), 5.3 (steps), 5.4 and 6.1 (dropout, averaging),
    6.1 (beam 4, alpha on the development set, newstest2013; newstest2014 the test set)."""
    table2 = script("wmt14_table2")
    parser = table2.build_parser()
    _, settings = table2.settings_of(parser.parse_args([paper_run, "--output-dir", str(tmp_path)]), parser)
    recipe = settings.recipe()
    assert settings.preset == preset and recipe.average_checkpoints == recipe.keep_checkpoints == averaged
    assert recipe.max_steps == (100_000 if preset == "base" else 300_000)
    assert settings.train == settings.dev == settings.test == "wmt/wmt14" and settings.dataset_config == pair
    assert (settings.train_split, settings.dev_split, settings.test_split) == ("train", "validation", "test")
    assert (settings.src_lang, settings.tgt_lang) == ("en", target)
    assert settings.num_beams == 4 and recipe.tune_length_penalty and recipe.vocab_size == vocabulary
    config = VanillaTransformerConfig.from_preset(recipe.model_preset, **recipe.model_overrides)
    assert config.dropout == dropout
    # A flag given wins over the row's own setting.
    given = ["--model-override", "P_drop=0.2", "--vocab-size", "8000"]
    _, settings = table2.settings_of(
        parser.parse_args([paper_run, "--output-dir", str(tmp_path), *given]), parser
    )
    recipe = settings.recipe()
    assert VanillaTransformerConfig.from_preset(recipe.model_preset, **recipe.model_overrides).dropout == 0.2
    assert recipe.vocab_size == 8000


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["en-de-huge", "--output-dir", "x"], "invalid choice: 'en-de-huge'"),
        (["en-de-base", "--output-dir", "x", "--max-steps", "0"], "--max-steps"),
        (["en-de-base"], "--output-dir"),
    ],
)
def test_table2_refuses_bad_input_in_one_line(capsys, argv, message):
    status, _, error = run_script("wmt14_table2", capsys, *argv)
    assert status == 2 and message in error and len(error.strip().splitlines()) == 1, error


def tiny_pretrained(folder: Path, pairs: list[tuple[str, str]]) -> Path:
    """A freshly initialised tiny model with a BPE vocabulary of `pairs`, saved as a model folder."""
    tokenizer = train_shared_bpe_tokenizer([text for pair in pairs for text in pair], vocab_size=300)
    config = VanillaTransformerConfig.from_preset(
        "base", vocab_size=len(tokenizer), d_model=32, N=1, h=2, d_ff=64, max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.bos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(config)
    model.generation_config = paper_generation_config(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def translation_jsonl(path: Path, pairs: list[tuple[str, str]]) -> str:
    """`pairs` in the translation example's JSON Lines layout."""
    write_lines(path, [json.dumps({"translation": {"en": en, "de": de}}) for en, de in pairs])
    return str(path)


def test_run_translation_fine_tunes_evaluates_and_predicts_like_the_transformers_example(tmp_path, capsys):
    english, german = lines_of(MULTI30K / "train.en", 0, 40), lines_of(MULTI30K / "train.de", 0, 40)
    pairs = list(zip(english, german, strict=True))
    pretrained = tiny_pretrained(tmp_path / "pretrained", pairs)
    train = translation_jsonl(tmp_path / "train.json", pairs[:24])
    validation = translation_jsonl(tmp_path / "dev.json", pairs[24:30])
    test = translation_jsonl(tmp_path / "test.json", pairs[30:36])
    out = tmp_path / "fine-tuned"
    status, _, error = run_script(
        "run_translation", capsys, "--model_name_or_path", str(pretrained), "--source_lang", "en",
        "--target_lang", "de", "--train_file", train, "--validation_file", validation, "--test_file", test,
        "--do_train", "--do_eval", "--do_predict", "--predict_with_generate", "--num_beams", "2",
        "--max_source_length", "64", "--max_target_length", "64", "--output_dir", str(out),
        "--max_steps", "2", "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8",
        "--label_smoothing_factor", "0.1", "--save_strategy", "no", "--report_to", "none", "--use_cpu",
        "--max_predict_samples", "5",
    )  # fmt: skip
    assert status is None, error[-3000:]
    results = json.loads((out / "all_results.json").read_text())
    assert results["train_samples"] == 24 and results["eval_samples"] == 6 and results["predict_samples"] == 5
    predictions = (out / "generated_predictions.txt").read_text(encoding="utf-8").split("\n")
    assert len(predictions) == 6 and predictions[-1] == ""  # five lines, each ended
    assert results["predict_bleu"] == pytest.approx(corpus_bleu(predictions[:5], german[30:35]).score)
    assert 0 <= results["eval_bleu"] <= 100
    # Two updates moved the weights saved in the output folder away from the pretrained ones.
    before, after = load_file(pretrained / "model.safetensors"), load_file(out / "model.safetensors")
    assert any(not torch.equal(before[name], after[name]) for name in before)
    assert isinstance(AutoModelForSeq2SeqLM.from_pretrained(out), VanillaTransformerForConditionalGeneration)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model_name_or_path", "m", "--target_lang", "de", "--output_dir", "o"], "--source_lang"),
        (["--model_name_or_path", "m", "--source_lang", "en", "--target_lang", "de", "--output_dir", "o"],
         "Give --dataset_name, or a --train_file"),
        (["--model_name_or_path", "m", "--source_lang", "en", "--target_lang", "de", "--output_dir", "o",
          "--train_file", "t.json"], "Nothing to do"),
    ],
)  # fmt: skip
def test_run_translation_refuses_bad_input_in_one_line(capsys, argv, message):
    status, _, error = run_script("run_translation", capsys, *argv)
    assert status == 2 and message in error and len(error.strip().splitlines()) == 1, error


def test_run_translation_refuses_a_missing_training_file_in_one_line(tmp_path, capsys):
    english, german = lines_of(MULTI30K / "train.en", 0, 8), lines_of(MULTI30K / "train.de", 0, 8)
    pretrained = tiny_pretrained(tmp_path / "pretrained", list(zip(english, german, strict=True)))
    missing = tmp_path / "missing.json"
    status, _, error = run_script(
        "run_translation", capsys, "--model_name_or_path", str(pretrained), "--source_lang", "en",
        "--target_lang", "de", "--train_file", str(missing), "--do_train", "--output_dir", str(tmp_path),
    )  # fmt: skip
    assert status == 2 and str(missing) in error and len(error.strip().splitlines()) == 1, error


def test_korean_chatbot_trains_and_answers(tmp_path, capsys):
    out = tmp_path / "chatbot"
    flags = ["--limit", "40", "--eval-size", "8", "--max-steps", "2", "--vocab-size", "1000", "--batch-size",
             "16", "--num-layers", "1", "--d-model", "32", "--num-heads", "4", "--dff", "64"]  # fmt: skip
    status, printed, error = run_script("korean_chatbot", capsys, "train", "--output-dir", str(out), *flags)
    assert status is None, error[-3000:]
    assert "Final after 2 updates" in printed
    status, printed, error = run_script(
        "korean_chatbot", capsys, "chat", "--model", str(out), "--ask", "영화 볼래?"
    )
    assert status is None, error[-3000:]
    model, tokenizer = load_chatbot(out)
    assert printed == answer(model, tokenizer, "영화 볼래?") + "\n"


def test_korean_chatbot_refuses_a_missing_model_in_one_line(tmp_path, capsys):
    status, _, error = run_script("korean_chatbot", capsys, "chat", "--model", str(tmp_path / "none"))
    assert status == 2 and "no such folder" in error and len(error.strip().splitlines()) == 1, error
