"""The Keras chatbot tutorial on this package: preprocessing, data, a short training run, answers and CLI."""

import csv
import io
import json
import math
import shutil
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from hf_vanilla_transformer.commands import command_module
from hf_vanilla_transformer.training.chatbot import (
    DEFAULT_DATA,
    SETTINGS_FILE,
    ChatbotSettings,
    _tokenize_and_filter,
    answer,
    chat_session,
    evaluate_held_out,
    load_chatbot_pairs,
    postprocess_answer,
    preprocess_sentence,
    train_chatbot,
)

# A slice of the corpus and a model small enough to train in seconds. 40 updates on 32 pairs (warmup 10)
# memorise enough to answer with words; fewer leave a model that emits only the word-start mark "▁".
TINY = ChatbotSettings(
    vocab_size=1000,
    num_layers=1,
    d_model=32,
    num_heads=4,
    dff=64,
    warmup_steps=10,
    batch_size=16,
    max_steps=40,
    eval_size=8,
    limit=40,
    logging_steps=10,
)


def _load_script(name: str):
    return command_module(name)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return train_chatbot(tmp_path_factory.mktemp("chatbot"), settings=TINY, show_progress=False)


def test_preprocessing_spaces_punctuation_like_the_tutorial():
    assert preprocess_sentence("12시 땡!") == "12시 땡 !"
    assert preprocess_sentence(" 뭐해?? 나, 심심해. ") == "뭐해 ? ? 나 , 심심해 ."
    assert postprocess_answer("하루가 또 가네요 .") == "하루가 또 가네요."


def test_shipped_corpus_reads_all_rows():
    questions, answers = load_chatbot_pairs(DEFAULT_DATA)
    assert len(questions) == len(answers) == 11_823
    assert (questions[0], answers[0]) == ("12시 땡 !", "하루가 또 가네요 .")
    assert (DEFAULT_DATA.parent / "LICENSE").read_text().strip().startswith("The MIT License")


def test_training_reports_masked_accuracy_and_saves_a_loadable_folder(trained):
    metrics = trained.metrics
    assert metrics["train_steps"] == TINY.max_steps
    assert math.isfinite(metrics["train_loss"])
    for split in ("train_sample", "held_out"):
        assert 0.0 <= metrics[f"eval_{split}_accuracy"] <= 1.0
    model = AutoModelForSeq2SeqLM.from_pretrained(trained.output_dir)
    tokenizer = AutoTokenizer.from_pretrained(trained.output_dir)
    assert type(model) is type(trained.model)
    assert tokenizer.get_vocab() == trained.tokenizer.get_vocab()
    assert model.generation_config.num_beams == 1 and not model.generation_config.do_sample
    assert model.generation_config.max_length == TINY.max_length


def test_overlong_pairs_are_dropped_with_a_printed_count(trained, capsys):
    questions = ["짧다", "이 질문은 여덟 개의 토큰보다 훨씬 더 많은 토큰으로 나뉘는 긴 문장이다"]
    pairs = _tokenize_and_filter(trained.tokenizer, questions, ["응", "응"], max_length=8)
    assert len(pairs) == 1 and len(pairs[0]["input_ids"]) + 1 <= 8
    assert "Kept 1 of 2 pairs; dropped 1" in capsys.readouterr().out


def test_answers_greedy_and_with_beams(trained):
    greedy = answer(trained.model, trained.tokenizer, "영화 볼래?")
    assert isinstance(greedy, str) and greedy.strip()
    assert answer(trained.model, trained.tokenizer, "영화 볼래?", num_beams=3).strip()


def test_cli_ask_prints_the_library_answer(trained, capsys):
    expected = answer(trained.model, trained.tokenizer, "영화 볼래?")
    capsys.readouterr()
    _load_script("chatbot").main(["chat", "--model", str(trained.output_dir), "--ask", "영화 볼래?"])
    assert capsys.readouterr().out.strip() == expected


def test_cli_train_saves_a_model_and_prints_the_final_numbers(tmp_path, capsys):
    flags = ["--limit", "40", "--eval-size", "8", "--max-steps", "2", "--vocab-size", "1000"]
    flags += ["--num-layers", "1", "--d-model", "32", "--num-heads", "4", "--dff", "64"]
    _load_script("chatbot").main(["train", "--output-dir", str(tmp_path), *flags])
    out = capsys.readouterr().out
    assert "Final after 2 updates" in out and "held-out loss" in out and "Q: 영화 볼래?" in out
    assert (tmp_path / "generation_config.json").is_file() and (tmp_path / "tokenizer.json").is_file()


def test_chat_session_answers_until_quit(trained):
    out = io.StringIO()
    chat_session(trained.model, trained.tokenizer, ["영화 볼래?\n", "\n", "quit\n", "never read\n"], out)
    lines = out.getvalue().splitlines()
    assert lines[1] == "> " + answer(trained.model, trained.tokenizer, "영화 볼래?")
    assert out.getvalue().count("> ") == 3


def _stopped_and_resumed(tmp_path, settings: ChatbotSettings, stop: int, end: int):
    """The weights of `settings` trained for `end` updates straight, and stopped at `stop` then resumed."""
    straight = train_chatbot(
        tmp_path / "straight", settings=replace(settings, max_steps=end), show_progress=False
    )
    stopped = train_chatbot(
        tmp_path / "resumed", settings=replace(settings, max_steps=stop), show_progress=False
    )
    assert stopped.metrics["train_steps"] == stop
    resumed = train_chatbot(
        tmp_path / "resumed", settings=replace(settings, max_steps=end), show_progress=False, resume=True
    )
    assert resumed.metrics["train_steps"] == end
    assert resumed.tokenizer.get_vocab() == straight.tokenizer.get_vocab()
    return straight.model.state_dict(), resumed.model.state_dict()


# 32 training pairs in batches of 16: two updates an epoch.
def test_a_run_resumed_from_an_epoch_checkpoint_ends_with_the_weights_of_an_uninterrupted_one(tmp_path):
    # Weights, optimizer, schedule, data order and the random state of dropout all carry over.
    expected, resumed = _stopped_and_resumed(tmp_path, TINY, stop=4, end=6)
    assert sorted(path.name for path in (tmp_path / "resumed").glob("checkpoint-*")) == [
        "checkpoint-4",
        "checkpoint-6",
    ]
    for name, tensor in resumed.items():
        assert torch.equal(tensor, expected[name]), name


def test_a_run_stopped_within_an_epoch_resumes_on_the_batches_it_had_not_seen(tmp_path):
    # Update 3 is halfway through the second epoch. Without dropout the resumed run is the uninterrupted
    # one exactly; with dropout its masks differ, since the Trainer's evaluation at the stop draws from
    # the random state that the checkpoint saves.
    expected, resumed = _stopped_and_resumed(tmp_path, replace(TINY, dropout=0.0), stop=3, end=6)
    for name, tensor in resumed.items():
        assert torch.equal(tensor, expected[name]), name


def test_cli_refuses_to_train_over_a_run_or_to_resume_it_with_other_settings(tmp_path, capsys):
    flags = ["--limit", "40", "--eval-size", "8", "--max-steps", "2", "--vocab-size", "1000"]
    flags += ["--num-layers", "1", "--d-model", "32", "--num-heads", "4", "--dff", "64"]
    chatbot = _load_script("chatbot")
    chatbot.main(["train", "--output-dir", str(tmp_path), *flags])
    assert json.loads((tmp_path / SETTINGS_FILE).read_text())["d_model"] == 32
    capsys.readouterr()

    def refused(*argv: str) -> str:
        with pytest.raises(SystemExit) as exited:
            chatbot.main(["train", "--output-dir", str(tmp_path), *argv])
        err = capsys.readouterr().err
        assert exited.value.code == 2 and len(err.strip().splitlines()) == 1, err
        return err

    assert "already holds checkpoints. Pass --resume" in refused(*flags)
    assert "d_model: 32 in the run, 64 now" in refused(*flags, "--d-model", "64", "--resume")
    # Going on for longer is what resuming is for.
    chatbot.main(["train", "--output-dir", str(tmp_path), *flags, "--resume", "--max-steps", "4"])
    assert "Final after 4 updates" in capsys.readouterr().out
    # A trained chatbot whose checkpoints are gone is not overwritten either.
    for checkpoint in tmp_path.glob("checkpoint-*"):
        shutil.rmtree(checkpoint)
    assert "already holds a trained chatbot" in refused(*flags)
    assert "no complete checkpoint" in refused(*flags, "--resume")


def test_evaluation_draws_again_the_pairs_the_run_held_out(trained, capsys):
    evaluation = evaluate_held_out(trained.output_dir, num_examples=3)
    assert evaluation.pairs == TINY.eval_size
    # The Trainer measured the held-out accuracy at the end of training on the split it drew; the same
    # figure from the saved folder means the same pairs, tokenized the same way.
    assert evaluation.accuracy == pytest.approx(trained.metrics["eval_held_out_accuracy"], abs=1e-9)
    questions, answers = load_chatbot_pairs(DEFAULT_DATA, TINY.limit)
    # Shown as the vocabulary reads them: NFKC-normalized, as the tokenizer does before splitting.
    normalize = trained.tokenizer.backend_tokenizer.normalizer.normalize_str
    corpus = {
        postprocess_answer(normalize(q)): postprocess_answer(normalize(a)) for q, a in zip(questions, answers)
    }
    assert len(evaluation.examples) == 3
    for question, reference, reply in evaluation.examples:
        assert corpus[question] == reference
        assert reply == answer(trained.model, trained.tokenizer, question)

    capsys.readouterr()
    _load_script("chatbot").main(["evaluate", "--model", str(trained.output_dir), "--examples", "2"])
    out = capsys.readouterr().out
    assert f"Held-out pairs: {TINY.eval_size}" in out and out.count("A (chatbot): ") == 2
    with pytest.raises(SystemExit) as exited:
        _load_script("chatbot").main(["evaluate", "--model", str(trained.output_dir / "checkpoint-40")])
    assert exited.value.code == 2 and "chatbot_settings.json" in capsys.readouterr().err


def _corpus_copy(path, first_row: int):
    """40 rows of the shipped corpus from `first_row` on, as a CSV of its own."""
    with DEFAULT_DATA.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.reader(handle))
    with path.open("w", encoding="utf-8", newline="") as handle:
        csv.writer(handle).writerows([rows[0], *rows[1 + first_row : 41 + first_row]])
    return path


def test_a_run_keeps_to_its_corpus_when_resumed_and_evaluated(tmp_path, capsys):
    chatbot = _load_script("chatbot")
    own = _corpus_copy(tmp_path / "own.csv", first_row=200)
    flags = [
        "--limit",
        "40",
        "--eval-size",
        "8",
        "--max-steps",
        "2",
        "--vocab-size",
        "1000",
        "--num-layers",
        "1",
    ]
    flags += ["--d-model", "32", "--num-heads", "4", "--dff", "64", "--output-dir", str(tmp_path / "run")]
    chatbot.main(["train", "--data", str(own), *flags])
    capsys.readouterr()

    # The held-out pairs are drawn again from the corpus the run recorded, whatever the default.
    evaluation = evaluate_held_out(tmp_path / "run", num_examples=8)
    questions, _ = load_chatbot_pairs(own)
    assert {question for question, _, _ in evaluation.examples} <= {postprocess_answer(q) for q in questions}

    for command in (
        ["train", *flags, "--resume"],
        ["evaluate", "--model", str(tmp_path / "run"), "--data", str(DEFAULT_DATA)],
    ):
        with pytest.raises(SystemExit) as exited:
            chatbot.main(command)
        err = capsys.readouterr().err
        assert exited.value.code == 2 and f"trained on {own.resolve()}, whose contents differ" in err, err
    # A moved copy of the same corpus is the same corpus.
    moved = shutil.copy(own, tmp_path / "moved.csv")
    chatbot.main(["train", "--data", str(moved), *flags, "--resume", "--max-steps", "3"])
    assert "Final after 3 updates" in capsys.readouterr().out


def test_resuming_a_finished_run_trains_nothing_and_says_so(tmp_path):
    run = tmp_path / "run"
    train_chatbot(run, settings=replace(TINY, max_steps=2), show_progress=False)
    again = train_chatbot(run, settings=replace(TINY, max_steps=2), show_progress=False, resume=True)
    assert again.metrics["train_steps"] == 2 and again.metrics["updates_this_run"] == 0
    assert "train_loss" not in again.metrics and "eval_held_out_accuracy" in again.metrics
    # A run whose settings file was lost gets one again from the settings it is resumed with.
    (run / SETTINGS_FILE).unlink()
    train_chatbot(run, settings=replace(TINY, max_steps=3), show_progress=False, resume=True)
    assert json.loads((run / SETTINGS_FILE).read_text())["max_steps"] == 3


def test_evaluating_a_run_that_has_not_finished_is_refused_in_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    train_chatbot(run, settings=replace(TINY, max_steps=2), show_progress=False)
    for name in ("config.json", "model.safetensors"):
        (run / name).unlink()
    with pytest.raises(SystemExit) as exited:
        _load_script("chatbot").main(["evaluate", "--model", str(run)])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "holds no trained chatbot yet" in err and "--resume" in err


def test_a_corpus_that_is_not_utf8_is_refused_in_one_line_and_leaves_no_settings(tmp_path, capsys):
    corpus = tmp_path / "latin1.csv"
    corpus.write_bytes("Q,A,label\nÇa va?,Très bien.,0\n".encode("latin-1"))
    output = tmp_path / "run"
    with pytest.raises(SystemExit) as exited:
        _load_script("chatbot").main(["train", "--data", str(corpus), "--output-dir", str(output)])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{corpus}, line 2: not valid UTF-8" in err
    assert not (output / SETTINGS_FILE).exists()


# A quote left open makes one field of the rest of the file; past csv's field size limit (131,072
# characters) the csv module itself refuses the row.
LONG_REST = "뭐해?,쉬어요.,0\r\n" * 20_000


@pytest.mark.parametrize(
    ("bad_row", "problem"),
    [
        ("질문만 있어\r\n", "line 3 has no A field: every row needs a Q and an A."),
        ('"unterminated,x\r\n', "line 3 has no A field (it runs on to line 4: is a quote left open?)"),
        ('"unterminated,x\r\n' + LONG_REST, "line 3 cannot be read as CSV (field larger than field limit"),
        (",대답만 있어\r\n", "line 3 has an empty Q field: every row needs a Q and an A."),
        ("질문,   \r\n", "line 3 has an empty A field: every row needs a Q and an A."),
    ],
    ids=["no A", "open quote", "open quote in a long file", "empty Q", "blank A"],
)
def test_a_row_without_its_question_or_answer_is_refused_in_one_line_naming_it(
    tmp_path, capsys, bad_row: str, problem: str
):
    corpus = tmp_path / "corpus.csv"
    corpus.write_text(
        f"Q,A,label\r\n12시 땡!,하루가 또 가네요.,0\r\n{bad_row}뭐해?,쉬어요.,0\r\n", encoding="utf-8"
    )
    output = tmp_path / "run"
    with pytest.raises(SystemExit) as exited:
        _load_script("chatbot").main(["train", "--data", str(corpus), "--output-dir", str(output)])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{corpus} {problem}" in err
    assert not (output / SETTINGS_FILE).exists()


@pytest.mark.parametrize("question", ["", "   "], ids=["empty", "spaces"])
def test_cli_refuses_an_empty_question_in_one_line(trained, capsys, question: str):
    with pytest.raises(SystemExit) as exited:
        _load_script("chatbot").main(["chat", "--model", str(trained.output_dir), "--ask", question])
    captured = capsys.readouterr()
    assert exited.value.code == 2 and captured.out == "", captured.out
    assert len(captured.err.strip().splitlines()) == 1, captured.err
    assert captured.err.strip().endswith("--ask is empty: give a question.")


def test_progress_lines_go_to_the_package_logger(tmp_path, caplog):
    with caplog.at_level("INFO", logger="hf_vanilla_transformer"):
        train_chatbot(tmp_path / "run", settings=replace(TINY, max_steps=1), show_progress=False)
    assert "Read 40 question-answer pairs" in caplog.text and "Subword vocabulary: " in caplog.text
    assert f"Saved the chatbot to {tmp_path / 'run'}" in caplog.text
