"""Loading a model folder that lacks its tokenizer's files: the file missing, and the folder, named in one
line, in Python and by `vanilla-transformer translate`."""

from pathlib import Path

import pytest
from conftest import tiny_model

from hf_vanilla_transformer.commands import main as command_main
from hf_vanilla_transformer.common.model_location import (
    TOKENIZER_FILES,
    check_holds_tokenizer,
    missing_tokenizer_files,
)
from hf_vanilla_transformer.common.tokenization import load_tokenizer
from hf_vanilla_transformer.conversion import tokenizer_from_fairseq_dictionary
from hf_vanilla_transformer.hub.publishing import stage_repo
from hf_vanilla_transformer.inference.translator import load_translator
from hf_vanilla_transformer.translation_pipeline import TARGET_TOKENIZER_DIR

SYMBOLS = ["<s>", "<pad>", "</s>", "<unk>"] + [f"t{i}" for i in range(60)]


def model_folder(folder: Path, *, target_tokenizer: bool = False) -> Path:
    tiny_model().save_pretrained(folder)
    tokenizer = tokenizer_from_fairseq_dictionary(SYMBOLS)
    tokenizer.save_pretrained(folder)
    if target_tokenizer:
        tokenizer.save_pretrained(folder / TARGET_TOKENIZER_DIR)
    return folder


@pytest.mark.parametrize("removed", [("tokenizer.json",), TOKENIZER_FILES])
def test_a_missing_tokenizer_file_is_named_with_its_folder(tmp_path, capsys, removed):
    folder = model_folder(tmp_path / "model")
    for name in removed:
        (folder / name).unlink()
    named = f"^{folder} has no {' and no '.join(removed)}, which its tokenizer loads from: copy"
    with pytest.raises(ValueError, match=named):
        load_translator(folder)
    if "tokenizer_config.json" not in removed:  # load_tokenizer says itself that the folder holds none
        with pytest.raises(ValueError, match=named):
            load_tokenizer(folder)

    (tmp_path / "in.txt").write_text("t1 t2\n")
    with pytest.raises(SystemExit) as exit_info:
        command_main(["translate", "--model", str(folder), "--input", str(tmp_path / "in.txt")])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    last_line = error.strip().splitlines()[-1].split("\r")[-1]
    assert "Traceback" not in error and last_line.startswith(
        f"vanilla-transformer translate: error: {folder} has no {removed[0]}"
    ), error
    assert "tokenizer.save_pretrained" in last_line


def test_a_target_tokenizer_missing_its_file_is_named(tmp_path):
    folder = model_folder(tmp_path / "model", target_tokenizer=True)
    (folder / TARGET_TOKENIZER_DIR / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match=f"^{folder / TARGET_TOKENIZER_DIR} has no tokenizer.json, which"):
        load_translator(folder)


@pytest.mark.parametrize("present", [(), ("tokenizer_config.json",), ("tokenizer.json",), TOKENIZER_FILES])
def test_one_answer_to_whether_a_folder_holds_a_tokenizer(tmp_path, present):
    """A folder holds a tokenizer when it holds either file (a Marian tokenizer has tokenizer_config.json
    and its own vocabulary files only), and loading a tokenizer and publishing a model give the same
    answer, in the same words."""
    folder = tmp_path / "model"
    tiny_model().save_pretrained(folder)
    for name in present:
        (folder / name).write_text("{}", encoding="utf-8")
    assert missing_tokenizer_files(folder) == [name for name in TOKENIZER_FILES if name not in present]
    if present:
        check_holds_tokenizer(folder)
        return
    refusals = []
    for refuse in (
        check_holds_tokenizer,
        load_tokenizer,
        lambda f: stage_repo(f, tmp_path / "repo", "org/name"),
    ):
        with pytest.raises(ValueError) as refusal:
            refuse(folder)
        refusals.append(str(refusal.value))
    assert refusals == [f"{folder} holds no tokenizer ({' or '.join(TOKENIZER_FILES)}): save it next to the "
                        f"weights with tokenizer.save_pretrained('{folder}')."] * 3  # fmt: skip
