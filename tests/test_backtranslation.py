"""Training on real and back-translated pairs (docs/backtranslation.md): the tag in front of every synthetic
source is one token of the vocabulary and nowhere else, the training set is the real and the synthetic
pairs, the dev set stays real, and bad synthetic data or a resume with other synthetic data is refused."""

import json
from pathlib import Path

import pytest
from conftest import REPO_ROOT
from transformers import AutoTokenizer

from hf_vanilla_transformer.commands import train as train_command
from hf_vanilla_transformer.common.tokenization import SPECIAL_TOKENS, train_shared_bpe_tokenizer
from hf_vanilla_transformer.training import pipeline as training
from hf_vanilla_transformer.training.data import read_text_pair
from hf_vanilla_transformer.training.pipeline import run_training
from hf_vanilla_transformer.training.settings import TrainingSettings

REAL, SYNTHETIC, DEV = 120, 80, 10
TAG = "<BT>"
TINY = dict(
    preset="cpu-demo", max_steps=1, save_steps=1, vocab_size=300, max_tokens=512, tokens_per_step=512,
    model_overrides={"d_model": 32, "N": 1, "h": 2, "d_ff": 64}, max_eval_sentences=2, eval_batch_size=2,
)  # fmt: skip


def multi30k_lines(language: str, start: int, stop: int) -> list[str]:
    return (REPO_ROOT / "data" / "multi30k" / f"train.{language}").read_text().split("\n")[start:stop]


def write_lines(path: Path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Real pairs (train.en/de), dev pairs (dev.en/de), and synthetic pairs: German sentences (mono.de)
    with English sources standing for their machine translations (mono.synthetic.en), from other lines."""
    folder = tmp_path_factory.mktemp("corpus")
    for language in ("en", "de"):
        write_lines(folder / f"train.{language}", multi30k_lines(language, 0, REAL))
        write_lines(folder / f"dev.{language}", multi30k_lines(language, REAL, REAL + DEV))
    write_lines(folder / "mono.synthetic.en", multi30k_lines("en", 1000, 1000 + SYNTHETIC))
    write_lines(folder / "mono.de", multi30k_lines("de", 1000, 1000 + SYNTHETIC))
    return folder


def settings(corpus: Path, out: Path, **overrides) -> TrainingSettings:
    values = dict(
        output_dir=str(out), train=str(corpus / "train"), dev=str(corpus / "dev"), test=None,
        synthetic_source=str(corpus / "mono.synthetic.en"), synthetic_target=str(corpus / "mono.de"), **TINY,
    )  # fmt: skip
    return TrainingSettings(**{**values, **overrides})


def train_and_watch(run: TrainingSettings, monkeypatch: pytest.MonkeyPatch) -> training.Seq2SeqTrainer:
    """Run the training that `run` says; returns its Trainer, which holds the datasets it trained and
    evaluated on."""
    trainers = []
    build = training._build_trainer

    def watched(*args):
        trainers.append(build(*args))
        return trainers[-1]

    monkeypatch.setattr(training, "_build_trainer", watched)
    run_training(run)
    return trainers[0]


def test_synthetic_sources_carry_the_tag_as_one_token_and_nothing_else_does(corpus, tmp_path, monkeypatch):
    trainer = train_and_watch(settings(corpus, tmp_path), monkeypatch)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "model")
    tag_id = tokenizer.convert_tokens_to_ids(TAG)
    assert TAG in tokenizer.all_special_tokens and tag_id != tokenizer.unk_token_id
    # The tag is a token of the vocabulary of the size asked for, which the model's embeddings cover.
    assert len(tokenizer) == 300 == trainer.model.config.vocab_size

    rows = trainer.train_dataset
    assert len(rows) == REAL + SYNTHETIC
    real = read_text_pair(corpus / "train.en", corpus / "train.de").to_dict()
    synthetic = read_text_pair(corpus / "mono.synthetic.en", corpus / "mono.de").to_dict()
    # The real pairs as the tokenizer encodes them, then each synthetic pair with the tag in front of its
    # source: the untagged source's own tokens follow the tag unchanged.
    expected_sources = [tokenizer(text)["input_ids"] for text in real["src"]]
    expected_sources += [[tag_id, *tokenizer(text)["input_ids"]] for text in synthetic["src"]]
    expected_targets = [tokenizer(text_target=text)["input_ids"] for text in real["tgt"] + synthetic["tgt"]]
    rows = rows.to_dict()
    assert rows["input_ids"] == expected_sources
    assert rows["labels"] == expected_targets
    assert all(tag_id not in labels for labels in rows["labels"])
    assert all(tag_id not in source for source in rows["input_ids"][:REAL])

    # The dev set is the real dev set, untagged; the vocabulary is learned on the real pairs only.
    assert len(trainer.eval_dataset) == DEV
    assert all(tag_id not in source for source in trainer.eval_dataset["input_ids"])
    on_real_pairs = train_shared_bpe_tokenizer(
        read_text_pair(corpus / "train.en", corpus / "train.de"),
        vocab_size=300,
        extra_special_tokens=[TAG],
        show_progress=False,
    )
    assert tokenizer.get_vocab() == on_real_pairs.get_vocab()
    assert json.loads((tmp_path / "model" / "results.json").read_text())["train_pairs"] == REAL + SYNTHETIC


def test_untagged_synthetic_pairs_keep_the_vocabulary_of_the_real_pairs(corpus, tmp_path, monkeypatch):
    trainer = train_and_watch(settings(corpus, tmp_path, synthetic_tag="none"), monkeypatch)
    tokenizer = trainer.processing_class
    assert TAG not in tokenizer.get_vocab() and set(tokenizer.all_special_tokens) == set(SPECIAL_TOKENS)
    real = read_text_pair(corpus / "train.en", corpus / "train.de")
    on_real_pairs = train_shared_bpe_tokenizer(real, vocab_size=300, show_progress=False)
    assert tokenizer.get_vocab() == on_real_pairs.get_vocab()
    synthetic = read_text_pair(corpus / "mono.synthetic.en", corpus / "mono.de")
    assert list(trainer.train_dataset["input_ids"])[REAL:] == [
        tokenizer(text)["input_ids"] for text in synthetic["src"]
    ]


def test_bpe_dropout_resegments_the_sources_but_keeps_the_tag_whole(corpus, tmp_path, monkeypatch):
    trainer = train_and_watch(settings(corpus, tmp_path, subword_dropout=0.5), monkeypatch)
    dataset, tokenizer = trainer.train_dataset, trainer.processing_class
    tag_id = tokenizer.convert_tokens_to_ids(TAG)
    synthetic = read_text_pair(corpus / "mono.synthetic.en", corpus / "mono.de").to_dict()
    resegmented = 0
    for epoch in (0, 1):
        dataset.set_epoch(epoch)
        for index in range(REAL + SYNTHETIC):
            source, labels = dataset[index]["input_ids"], dataset[index]["labels"]
            assert tag_id not in labels
            if index < REAL:
                assert tag_id not in source
                continue
            assert source[0] == tag_id and tag_id not in source[1:]
            # The rest is the untagged source, in other pieces.
            text = synthetic["src"][index - REAL]
            assert tokenizer.decode(source[1:], skip_special_tokens=True) == text
            resegmented += source[1:] != tokenizer(text)["input_ids"]
    assert resegmented > SYNTHETIC


def test_a_resume_with_other_synthetic_data_is_refused(corpus, tmp_path):
    files = {"synthetic_source": tmp_path / "mono.synthetic.en", "synthetic_target": tmp_path / "mono.de"}
    for name, path in files.items():
        path.write_text(Path(getattr(settings(corpus, tmp_path), name)).read_text())
    paths = {name: str(path) for name, path in files.items()}
    run_training(settings(corpus, tmp_path / "run", dev=None, **paths))
    other = write_lines(tmp_path / "other.synthetic.en", multi30k_lines("en", 2000, 2000 + SYNTHETIC))
    for changed, words in (
        ({"synthetic_source": other}, "synthetic_files"),
        ({"synthetic_source": None, "synthetic_target": None}, "synthetic_files"),
        ({"synthetic_tag": "<bt>"}, "synthetic_tag: '<BT>' in the run, '<bt>' now"),
    ):
        with pytest.raises(ValueError, match=f"Cannot resume .*{words}"):
            run_training(settings(corpus, tmp_path / "run", dev=None, resume=True, **{**paths, **changed}))
    # The same files written anew hold other pairs.
    for path in files.values():
        path.write_text(path.read_text() + "One more.\n")
    with pytest.raises(ValueError, match="Cannot resume .*synthetic_bytes"):
        run_training(settings(corpus, tmp_path / "run", dev=None, resume=True, **paths))


def train_cli(corpus: Path, out: Path, *flags: str, train: str = "train") -> list[str]:
    return ["--output-dir", str(out), "--train", str(corpus / train), "--dev", "none", "--test", "none",
            "--preset", "cpu-demo", "--max-steps", "1", "--vocab-size", "300",
            "--model-override", "d_model=32", "N=1", "h=2", "d_ff=64", *flags]  # fmt: skip


def refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one-line error of `vanilla-transformer train ARGV`, which must exit with status 2."""
    with pytest.raises(SystemExit) as exit_info:
        train_command.main(argv)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{train_command.build_parser().prog}: error:"), lines
    return lines[0]


def test_bad_synthetic_data_is_refused_in_one_line(corpus, tmp_path, capsys):
    short = write_lines(tmp_path / "short.de", multi30k_lines("de", 1000, 1000 + SYNTHETIC - 1))
    pair = ("--synthetic-source", str(corpus / "mono.synthetic.en"), "--synthetic-target")
    message = refusal(train_cli(corpus, tmp_path / "a", *pair, short), capsys)
    assert f"has {SYNTHETIC} lines but" in message and f"has {SYNTHETIC - 1}" in message

    latin1 = tmp_path / "latin1.de"
    latin1.write_bytes("Ein Mädchen.\n".encode("latin-1") * SYNTHETIC)
    message = refusal(train_cli(corpus, tmp_path / "b", *pair, str(latin1)), capsys)
    assert "not valid UTF-8" in message and "line 1" in message

    message = refusal(train_cli(corpus, tmp_path / "c", *pair[:2]), capsys)
    assert "give --synthetic-target too" in message
    for tag in ("<s>", "two words"):
        assert "--synthetic-tag" in refusal(train_cli(corpus, tmp_path / "d", "--synthetic-tag", tag), capsys)
    for folder in ("a", "b", "c", "d"):
        assert not (tmp_path / folder / "training_recipe.json").exists()


def test_a_tag_the_text_holds_or_the_tokenizer_lacks_is_refused(corpus, tmp_path, capsys):
    write_lines(tmp_path / "tagged.en", [f"{TAG} {line}" for line in multi30k_lines("en", 0, REAL)])
    write_lines(tmp_path / "tagged.de", multi30k_lines("de", 0, REAL))
    synthetic = (
        "--synthetic-source",
        str(corpus / "mono.synthetic.en"),
        "--synthetic-target",
        str(corpus / "mono.de"),
    )
    message = refusal(train_cli(tmp_path, tmp_path / "a", *synthetic, train="tagged"), capsys)
    assert "source sentence of the training pairs (--train) holds the tag <BT>" in message

    untagged = tmp_path / "untagged-tokenizer"
    real = read_text_pair(corpus / "train.en", corpus / "train.de")
    train_shared_bpe_tokenizer(real, vocab_size=300, show_progress=False).save_pretrained(untagged)
    with pytest.raises(ValueError, match="has no special token <BT>"):
        run_training(settings(corpus, tmp_path / "b", tokenizer=str(untagged), vocab_size=None))
    assert not (tmp_path / "b" / "training_recipe.json").exists()
