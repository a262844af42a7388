"""Choosing the length penalty on a dev set (Section 6.1): the alpha whose translations score best is the
one chosen and saved, and a later load of the model decodes with it."""

from pathlib import Path

import pytest
from conftest import tiny_model
from transformers import GenerationConfig

from hf_vanilla_transformer.commands.tune import main as tune_main
from hf_vanilla_transformer.engines import load_translator
from hf_vanilla_transformer.evaluation import corpus_bleu
from hf_vanilla_transformer.tokenization import train_shared_bpe_tokenizer
from hf_vanilla_transformer.tuning import save_length_penalty, search_length_penalty

REFERENCES = [
    "Ein Hund rennt durch den grünen Park am Morgen .",
    "Zwei Männer sprechen vor einem alten Haus miteinander .",
    "Ein Mädchen liest ein dickes Buch auf der Bank .",
]


class ShortBelowOne:
    """Translates to the reference itself when alpha is at least 1, and to its first half below: a model
    whose outputs grow with the length penalty. Records the alphas it was asked for, and the beam sizes."""

    def __init__(self) -> None:
        self.asked: list[float] = []
        self.beams: list[int | None] = []

    def translate(self, sentences, **generate_kwargs):
        alpha = generate_kwargs["length_penalty"]
        self.asked.append(alpha)
        self.beams.append(generate_kwargs.get("num_beams"))
        halves = [" ".join(r.split()[: len(r.split()) // 2]) for r in REFERENCES]
        return list(REFERENCES) if alpha >= 1 else halves


def test_the_best_scoring_alpha_is_chosen_first_tried_on_ties():
    translator = ShortBelowOne()
    search = search_length_penalty(translator, ["a", "b", "c"], REFERENCES, [0.6, 1.5, 1.0, 0.6])
    assert translator.asked == [0.6, 1.5, 1.0]  # each alpha translated once, in the order given
    assert search.bleu[1.5].score == search.bleu[1.0].score == pytest.approx(100)
    assert search.bleu[0.6].score < 50 and search.bleu[0.6].brevity_penalty < 1
    assert search.best == 1.5


def test_other_decoding_settings_reach_every_translation():
    translator = ShortBelowOne()
    search_length_penalty(translator, ["a", "b", "c"], REFERENCES, [0.6, 1.0], num_beams=5)
    assert translator.beams == [5, 5]
    with pytest.raises(ValueError, match="sets length_penalty itself"):
        search_length_penalty(translator, ["a", "b", "c"], REFERENCES, [0.6], length_penalty=2.0)


@pytest.mark.parametrize(
    ("alphas", "sources", "message"),
    [
        ([], ["a", "b", "c"], "at least one"),
        ([0.6, -1], ["a", "b", "c"], "0 or more"),
        ([1], ["a"], "line-aligned"),
    ],
)
def test_bad_searches_are_refused(alphas, sources, message):
    with pytest.raises(ValueError, match=message):
        search_length_penalty(ShortBelowOne(), sources, REFERENCES, alphas)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    tokenizer = train_shared_bpe_tokenizer(
        REFERENCES * 5, vocab_size=90, min_frequency=1, show_progress=False
    )
    ids = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id}
    ids |= {"bos_token_id": tokenizer.bos_token_id, "decoder_start_token_id": tokenizer.bos_token_id}
    model = tiny_model(vocab_size=len(tokenizer), **ids)
    model.generation_config.num_beams = 2  # the length penalty ranks beam hypotheses only
    model.generation_config.max_new_tokens = 6
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    return tmp_path / "model"


def test_save_changes_only_the_length_penalty(model_dir):
    before = GenerationConfig.from_pretrained(model_dir).to_dict()
    save_length_penalty(model_dir, 1.3)
    after = GenerationConfig.from_pretrained(model_dir).to_dict()
    assert after.pop("length_penalty") == 1.3 and before.pop("length_penalty") != 1.3
    assert after == before
    with pytest.raises(FileNotFoundError, match="local model folder"):
        save_length_penalty(model_dir.parent / "missing", 1.0)


def tune_args(model_dir: Path, folder: Path, sources: list[str], references: list[str]) -> list[str]:
    """The command's arguments for a dev set of these lines, written into `folder`."""
    (folder / "dev.en").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (folder / "dev.de").write_text("\n".join(references) + "\n", encoding="utf-8")
    return [
        "--model",
        str(model_dir),
        "--source",
        str(folder / "dev.en"),
        "--reference",
        str(folder / "dev.de"),
    ]


def test_the_command_scores_real_translations_and_saves_the_best(model_dir, tmp_path, capsys):
    sources = ["A dog runs.", "Two men talk.", "A girl reads."]
    args = tune_args(model_dir, tmp_path, sources, REFERENCES)
    tune_main([*args, "--length-penalties", "2.0", "0.6", "--save"])
    printed = capsys.readouterr().out
    # The same search through the library; every translation names its alpha, so the saved one is moot.
    translator = load_translator(model_dir, "torch")
    search = search_length_penalty(translator, sources, REFERENCES, [2.0, 0.6])
    for alpha in (2.0, 0.6):
        hypotheses = translator.translate(sources, length_penalty=alpha)
        assert search.bleu[alpha] == corpus_bleu(hypotheses, REFERENCES)
        assert f"length penalty {alpha:g}: {search.bleu[alpha]}" in printed
    assert GenerationConfig.from_pretrained(model_dir).length_penalty == search.best
    assert f"best on this dev set: length penalty {search.best:g}" in printed


def test_a_greedy_model_is_refused(model_dir, tmp_path):
    config = GenerationConfig.from_pretrained(model_dir)
    config.num_beams = 1
    config.save_pretrained(model_dir)
    with pytest.raises(SystemExit) as exit_info:
        tune_main(tune_args(model_dir, tmp_path, ["A dog runs."], ["Ein Hund rennt."]))
    assert exit_info.value.code == 2
