"""What results.json records of a run (`run_report.results_record`): its data and model folder relative to
the run folder, `datasets` names as they are, never an absolute path of this machine."""

import os

from hf_vanilla_transformer.training.run_report import results_record, run_relative_name


def test_local_data_is_named_relative_to_the_run(tmp_path):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "train.en").write_text("a\n")
    run = tmp_path / "runs" / "first"
    (run / "data").mkdir(parents=True)
    (run / "data" / "test.tsv").write_text("a\tb\n")
    # A prefix of train.en beside the run's folder, two folders up; a file inside the run.
    assert run_relative_name(str(tmp_path / "corpus" / "train"), run) == "../../corpus/train"
    assert run_relative_name(str(run / "data" / "test.tsv"), run) == "./data/test.tsv"


def test_relative_paths_are_read_from_the_current_folder_and_datasets_names_stay(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus").mkdir()
    assert run_relative_name("corpus/train", "runs/first") == "../../corpus/train"
    assert run_relative_name("wmt/wmt14", "runs/first") == "wmt/wmt14"
    assert run_relative_name("wmt14", "runs/first") == "wmt14"


def test_results_record_holds_no_absolute_path(tmp_path):
    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    (tmp_path / "val.en").write_text("a\n")
    results = {
        "dataset": "bentrevett/multi30k",
        "test_set": str(tmp_path / "val"),
        "model_dir": str(run / "model"),
        "bleu": 12.5,
        "samples": [{"source": "a", "reference": "b", "translation": "c"}],
    }
    record = results_record(results, run)
    assert record == {**results, "test_set": "../val", "model_dir": "./model"}
    assert not any(os.path.isabs(value) for value in record.values() if isinstance(value, str))
    assert results["model_dir"] == str(run / "model")  # the run's own figures are left as they were
    unnamed = {"dataset": "wmt14", "test_set": None}
    assert results_record(unnamed, run) == unnamed
