"""`vanilla-transformer push`, hf_vanilla_transformer.hub and .model_card against
the test Hub server (tests/hub_server.py).

The server stands in for the real Hub. Clients read HF_ENDPOINT and the other Hub settings at import time,
so every push and pull runs in a subprocess: the real CLI pushes, then separate interpreters load the
repo with the package, offline from the filled cache, and with the package unimportable (remote code).
"""

import hashlib
import importlib.metadata
import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from conftest import REPO_ROOT, tiny_model
from hub_server import READ_TOKEN, WRITE_TOKEN, HubError, HubServer, hub_env, start_hub_server
from huggingface_hub import ModelCard, metadata_load
from huggingface_hub.repocard_data import model_index_to_eval_results
from huggingface_hub.utils import HFValidationError
from packaging.requirements import Requirement
from test_export import SENTENCES as REVERSE_SENTENCES
from test_export import needs_ctranslate2, train_reverse_model
from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer, GenerationConfig, pipeline

from hf_vanilla_transformer import VanillaTransformerConfig
from hf_vanilla_transformer.commands import command_module
from hf_vanilla_transformer.common.tokenization import train_shared_bpe_tokenizer
from hf_vanilla_transformer.hub.model_card import (
    CARD_TEMPLATE,
    CTRANSLATE2_DIR,
    NOT_MEASURED,
    CardFacts,
    RunRecords,
    read_run_records,
    render_model_card,
    transformers_requirement,
)
from hf_vanilla_transformer.hub.publishing import push_model
from hf_vanilla_transformer.inference.translator import load_translator
from hf_vanilla_transformer.translation_pipeline import TASK
from hf_vanilla_transformer.vanilla_transformer.generation_vanilla_transformer import paper_generation_config

REPO_ID = "org/vanilla"
SENTENCES = [
    "a dog runs in the park .",
    "ein hund rennt im park .",
    "a cat sleeps on the sofa .",
    "eine katze schläft auf dem sofa .",
]
INPUTS = ["a dog sleeps .", "the cat runs in the park ."]
# The `custom_pipelines` entry of a pushed config.json: the repo's copy of the translation pipeline.
REPO_PIPELINE = {
    "translation": {
        "impl": "translation_pipeline.TranslationPipeline",
        "pt": ["AutoModelForSeq2SeqLM"],
        "type": "text",
    }
}
# An untrained model rarely ends a sentence: without a cap, beam search runs to input length + 50.
MAX_NEW_TOKENS = 8
CLIENT_ARGS = {"repo": REPO_ID, "inputs": INPUTS, "max_new_tokens": MAX_NEW_TOKENS}
RESULTS = {
    "bleu": 12.3456,
    "bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.5.1",
    "test_set": "data/multi30k/test_2016_flickr",
    "steps": 1234,
    "train_pairs": 29000,
    "train_seconds": 5400.0,
    "target_tokens_per_second": 4321.5,
    "averaged_checkpoints": ["checkpoint-1000", "checkpoint-1234"],
    "dataset": "bentrevett/multi30k",
    "src_lang": "en",
    "tgt_lang": "de",
    "dev_bleu": 13.5,
    "dev_loss": 3.21,
    "label_smoothing": 0.1,
}
# The branch's model folder has no results.json, only the Trainer's state.
TRAINER_STATE = {
    "global_step": 77,
    "log_history": [{"loss": 4.0, "step": 50}, {"eval_loss": 3.5, "step": 77}, {"train_loss": 3.9}],
}
# Branch weights are split into several shards (the model has about 120 kB of weights).
BRANCH_SHARD_SIZE = "50KB"
MAIN_FILES = {
    ".gitattributes",
    "README.md",
    "config.json",
    "configuration_vanilla_transformer.py",
    "generation_config.json",
    "model.safetensors",
    "modeling_vanilla_transformer.py",
    "generation_vanilla_transformer.py",
    "tokenizer.json",
    "tokenizer_config.json",
    "translation_pipeline.py",
}


def client_env(hub: HubServer, hf_home: Path, offline: bool = False) -> dict[str, str]:
    # One thread each: the models are tiny and clients run side by side.
    return hub_env(hub, hf_home, offline) | {"OMP_NUM_THREADS": "1"}


def run_python(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, f"{args[0]} failed:\n{result.stderr[-6000:]}"
    return result


def start_client(env: dict[str, str], script: str, **args: Any) -> subprocess.Popen:
    """Start `script` in a fresh interpreter (args as JSON in sys.argv[1]); `client_result` waits for it."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), json.dumps(args)],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def client_result(client: subprocess.Popen) -> Any:
    """The JSON document the client prints last."""
    stdout, stderr = client.communicate(timeout=300)
    assert client.returncode == 0, f"client failed:\n{stderr[-6000:]}"
    return json.loads(stdout.strip().splitlines()[-1])


def state_digest(state_dict: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for key, tensor in sorted(state_dict.items()):
        digest.update(key.encode() + tensor.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def local_translations(model_dir: Path, generation_config: GenerationConfig) -> list[str]:
    translator = pipeline(TASK, model=str(model_dir))
    translator.model.generation_config = generation_config
    return [result["translation_text"] for result in translator(INPUTS, max_new_tokens=MAX_NEW_TOKENS)]


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubServer]:
    with start_hub_server(tmp_path_factory.mktemp("hub")) as server:
        yield server


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two saved tiny models with one tokenizer, and what the pushed repo must reproduce for each.

    main: its own generation config (beam 3, which the push keeps) and results.json. branch: other
    weights, no decoding choices saved (the push adds the paper's) and only trainer_state.json.
    """
    root = tmp_path_factory.mktemp("models")
    tokenizer = train_shared_bpe_tokenizer(SENTENCES * 5, vocab_size=80, min_frequency=1, show_progress=False)
    expected: dict[str, Any] = {}
    for name, seed in (("main", 0), ("branch", 1)):
        model = tiny_model(seed, vocab_size=len(tokenizer))
        if name == "main":
            model.generation_config = paper_generation_config(model.config, num_beams=3)
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
        generation_config = (
            model.generation_config if name == "main" else paper_generation_config(model.config)
        )
        expected[name] = {
            "digest": state_digest(model.state_dict()),
            "base_digest": state_digest(model.model.state_dict()),
            "translations": local_translations(root / name, generation_config),
            "num_beams": generation_config.num_beams,
            "parameters": model.num_parameters(),
        }
    (root / "main" / "results.json").write_text(json.dumps(RESULTS))
    (root / "branch" / "trainer_state.json").write_text(json.dumps(TRAINER_STATE))
    return {"root": root, "expected": expected, "ids": tokenizer(INPUTS)["input_ids"]}


@pytest.fixture(scope="module")
def pushed(hub: HubServer, model_dirs: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Push main with the CLI into a new private repo, then the branch model to branch `branch`, sharded,
    with a card template of its own and `--token` (the environment's token may only read)."""
    env = client_env(hub, tmp_path_factory.mktemp("hf_home_push"))
    root = model_dirs["root"]
    push = ("-m", "hf_vanilla_transformer", "push")
    main_args = ["--model-dir", str(root / "main"), "--repo-id", REPO_ID, "--private"]
    main_output = run_python(env, *push, *main_args).stdout
    requests_after_main = list(hub.requests)
    card = root / "custom_card.md"
    card.write_text(CARD_TEMPLATE.read_text().replace("\n# Transformer", "\n# Custom Transformer", 1))
    branch_args = ["--revision", "branch", "--max-shard-size", BRANCH_SHARD_SIZE, "--card", str(card)]
    branch_args += ["--token", WRITE_TOKEN]
    read_only_env = env | {"HF_TOKEN": READ_TOKEN}
    run_python(read_only_env, *push, "--model-dir", str(root / "branch"), "--repo-id", REPO_ID, *branch_args)
    storage = hub.storage
    repo = storage.repo("model", REPO_ID)
    return {
        "output": main_output,
        "requests": requests_after_main,
        "private": repo.private,
        "main": storage.resolve(repo, "main"),
        "branch": storage.resolve(repo, "branch"),
        "initial": next(commit for commit in repo.commits.values() if commit.parent is None),
    }


def repo_file(hub: HubServer, commit: Any, path: str) -> bytes:
    return hub.storage.blob_path(commit.files[path].sha256).read_bytes()


# Loads main and branch with the Auto classes and the translation pipeline; `state_digest` as above.
PACKAGE_CLIENT = """
    import hashlib, json, sys, tempfile
    from pathlib import Path
    import hf_vanilla_transformer
    from hf_vanilla_transformer.translation_pipeline import TASK

    hf_vanilla_transformer.register_auto_classes()
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline
    from transformers.utils import cached_file

    args = json.loads(sys.argv[1])

    def state_digest(state_dict):
        digest = hashlib.sha256()
        for key, tensor in sorted(state_dict.items()):
            digest.update(key.encode() + tensor.detach().contiguous().numpy().tobytes())
        return digest.hexdigest()

    loaded = {}
    for name, revision in (("main", None), ("branch", "branch")):
        model = AutoModelForSeq2SeqLM.from_pretrained(args["repo"], revision=revision)
        translator = pipeline(TASK, model=args["repo"], revision=revision)
        translations = translator(args["inputs"], max_new_tokens=args["max_new_tokens"])
        with tempfile.TemporaryDirectory() as folder:
            model.save_pretrained(folder)
            resaved = json.loads((Path(folder) / "config.json").read_text())
        pushed = json.loads(Path(cached_file(args["repo"], "config.json", revision=revision)).read_text())
        loaded[name] = {
            "module": type(model).__module__,
            "pipeline": type(translator).__module__,
            "digest": state_digest(model.state_dict()),
            "translations": [r["translation_text"] for r in translations],
            "num_beams": model.generation_config.num_beams,
            "custom_pipelines": getattr(model.config, "custom_pipelines", None),
            "resaved_as_pushed": resaved == pushed,
        }
    tokenizer = AutoTokenizer.from_pretrained(args["repo"])
    print(json.dumps({"loaded": loaded, "ids": tokenizer(args["inputs"])["input_ids"]}))
"""

REMOTE_CLIENT = """
    import sys
    sys.modules["hf_vanilla_transformer"] = None  # the package cannot be imported
    import hashlib, json
    from transformers import AutoModel, AutoModelForSeq2SeqLM, pipeline

    args = json.loads(sys.argv[1])

    def state_digest(state_dict):
        digest = hashlib.sha256()
        for key, tensor in sorted(state_dict.items()):
            digest.update(key.encode() + tensor.detach().contiguous().numpy().tobytes())
        return digest.hexdigest()

    try:
        pipeline("translation", model=args["repo"], trust_remote_code=False)
        refused = None
    except (KeyError, ValueError) as error:
        refused = type(error).__name__
    loaded = {}
    for name, revision in (("main", None), ("branch", "branch")):
        model = AutoModelForSeq2SeqLM.from_pretrained(args["repo"], revision=revision, trust_remote_code=True)
        base = AutoModel.from_pretrained(args["repo"], revision=revision, trust_remote_code=True)
        translator = pipeline("translation", model=args["repo"], revision=revision, trust_remote_code=True)
        translations = translator(args["inputs"], max_new_tokens=args["max_new_tokens"])
        loaded[name] = {
            "modules": [type(model).__module__, type(base).__module__, type(translator).__module__],
            "digest": state_digest(model.state_dict()),
            "base_digest": state_digest(base.state_dict()),
            "translations": [r["translation_text"] for r in translations],
        }
    print(json.dumps({"loaded": loaded, "refused": refused}))
"""


@pytest.fixture(scope="module")
def clients(hub: HubServer, pushed: dict, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What a package user and a user without the package load; run side by side to save time."""
    package_home = tmp_path_factory.mktemp("hf_home_package")
    package = start_client(client_env(hub, package_home), PACKAGE_CLIENT, **CLIENT_ARGS)
    remote_env = client_env(hub, tmp_path_factory.mktemp("hf_home_remote"))
    remote = start_client(remote_env, REMOTE_CLIENT, **CLIENT_ARGS)
    return {"package": client_result(package), "remote": client_result(remote), "package_home": package_home}


def test_push_uploads_every_file_in_one_commit(hub: HubServer, pushed: dict) -> None:
    main = pushed["main"]
    assert pushed["private"]
    assert set(main.files) == MAIN_FILES
    assert main.parent == pushed["initial"].oid
    assert main.oid in pushed["output"]
    branch = pushed["branch"]
    assert branch.parent == main.oid
    shards = {name for name in branch.files if name.endswith(".safetensors")}
    assert len(shards) > 1 and "model.safetensors.index.json" in branch.files
    # The branch started as a copy of main: the push removed main's single weights file with the shards'
    # commit, or it would shadow them.
    assert set(branch.files) == MAIN_FILES - {"model.safetensors"} | shards | {"model.safetensors.index.json"}


def test_weights_take_the_lfs_upload_path(pushed: dict) -> None:
    assert pushed["main"].files["model.safetensors"].lfs
    assert not pushed["main"].files["config.json"].lfs
    requests = [(request.method, request.path) for request in pushed["requests"]]
    assert ("POST", f"/{REPO_ID}.git/info/lfs/objects/batch") in requests
    assert any(method == "PUT" and path.startswith("/lfs-upload/") for method, path in requests)


def test_pushed_config_carries_auto_map_and_the_translation_pipeline(hub: HubServer, pushed: dict) -> None:
    config = json.loads(repo_file(hub, pushed["main"], "config.json"))
    assert config["auto_map"] == {
        "AutoConfig": "configuration_vanilla_transformer.VanillaTransformerConfig",
        "AutoModel": "modeling_vanilla_transformer.VanillaTransformerModel",
        "AutoModelForSeq2SeqLM": "modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration",
    }
    assert config["custom_pipelines"] == REPO_PIPELINE


def test_generation_config_is_the_model_dirs_own_or_the_papers(hub: HubServer, pushed: dict) -> None:
    main = json.loads(repo_file(hub, pushed["main"], "generation_config.json"))
    branch = json.loads(repo_file(hub, pushed["branch"], "generation_config.json"))
    assert main["num_beams"] == 3
    assert branch["num_beams"] == 4
    for saved in (main, branch):
        assert saved["length_penalty"] == 0.6
        assert saved["length_penalty_type"] == "gnmt"
        assert saved["max_length_offset"] == 50


def test_model_card_metadata_holds_the_measured_figures(
    hub: HubServer, pushed: dict, model_dirs: dict[str, Any], tmp_path: Path
) -> None:
    (tmp_path / "README.md").write_bytes(repo_file(hub, pushed["main"], "README.md"))
    metadata = metadata_load(tmp_path / "README.md")
    for key in ("language", "license", "library_name", "pipeline_tag", "tags", "datasets", "metrics"):
        assert metadata[key], key
    assert metadata["language"] == ["en", "de"]
    assert metadata["datasets"] == ["bentrevett/multi30k"]
    assert metadata["pipeline_tag"] == "translation"
    assert metadata["metrics"] == ["sacrebleu"]
    # huggingface_hub's own parser reads the model-index the Hub shows as evaluation results.
    model_name, (result,) = model_index_to_eval_results(metadata["model-index"])
    assert model_name == REPO_ID.split("/")[-1]
    assert (result.task_type, result.dataset_name) == ("translation", RESULTS["test_set"])
    assert (result.metric_type, result.metric_name) == ("sacrebleu", "BLEU")
    assert result.metric_value == round(RESULTS["bleu"], 2)
    assert result.metric_config == RESULTS["bleu_signature"]
    card = ModelCard.load(tmp_path / "README.md")
    assert card.data.eval_results == [result]
    for figure in ("12.35", "1,234", "29,000", "1.5 h", "4,322", "checkpoint-1234", f'model="{REPO_ID}"'):
        assert figure in card.text, figure
    assert f"signature `{RESULTS['bleu_signature']}`" in card.text
    assert f"| parameters | {model_dirs['expected']['main']['parameters']:,} |" in card.text
    assert "| label smoothing | 0.1 | ε_ls |" in card.text
    assert f"| {NOT_MEASURED} |" not in card.text
    # Users without the package run the repo's copied code: the card names the transformers versions it
    # needs, and the ones installed here satisfy them.
    needed = Requirement(re.search(r"with\s+`(transformers[<>=~!][^`]*)`", card.text).group(1))
    assert needed.specifier and needed.specifier.contains(transformers.__version__)


def test_card_names_plain_transformers_when_the_package_is_not_installed(monkeypatch) -> None:
    def not_installed(name: str) -> None:
        raise importlib.metadata.PackageNotFoundError(name)

    assert transformers_requirement().startswith("transformers>=")
    monkeypatch.setattr(importlib.metadata, "requires", not_installed)
    assert transformers_requirement() == "transformers"


def test_card_of_a_run_without_results_says_not_measured(
    hub: HubServer, pushed: dict, tmp_path: Path
) -> None:
    card = ModelCard(repo_file(hub, pushed["branch"], "README.md").decode())
    assert card.text.startswith("\n# Custom Transformer (base)")  # the branch push's own template
    assert card.data.eval_results is None and "model-index" not in card.data.to_dict()
    assert card.data.language is None and card.data.datasets is None
    assert "| test BLEU | not measured |" in card.text
    assert "| optimizer steps | 77 |" in card.text
    assert "| validation loss | 3.5000 |" in card.text


def test_package_users_load_by_repo_id_and_revision(clients: dict, model_dirs: dict[str, Any]) -> None:
    package_client = clients["package"]
    for name in ("main", "branch"):
        loaded, expected = package_client["loaded"][name], model_dirs["expected"][name]
        assert loaded["module"] == "hf_vanilla_transformer.vanilla_transformer.modeling_vanilla_transformer"
        assert loaded["pipeline"] == "hf_vanilla_transformer.translation_pipeline"
        assert loaded["digest"] == expected["digest"]
        assert loaded["num_beams"] == expected["num_beams"]
        assert loaded["translations"] == expected["translations"]
        # The registered task serves, with no trust_remote_code, while the config keeps the repo's entry
        # for users without the package: loading and saving again gives the pushed config.json.
        assert loaded["custom_pipelines"] == REPO_PIPELINE
        assert loaded["resaved_as_pushed"]
    assert model_dirs["expected"]["main"]["digest"] != model_dirs["expected"]["branch"]["digest"]
    assert package_client["ids"] == model_dirs["ids"]


def test_filled_cache_serves_package_users_offline(hub: HubServer, clients: dict) -> None:
    requests_before = len(hub.requests)
    env = client_env(hub, clients["package_home"], offline=True)
    offline = client_result(start_client(env, PACKAGE_CLIENT, **CLIENT_ARGS))
    assert offline == clients["package"]
    assert len(hub.requests) == requests_before


def test_remote_code_serves_users_without_the_package(clients: dict, model_dirs: dict[str, Any]) -> None:
    result = clients["remote"]
    assert result["refused"] == "ValueError"
    for name in ("main", "branch"):
        loaded, expected = result["loaded"][name], model_dirs["expected"][name]
        assert all(module.startswith("transformers_modules.") for module in loaded["modules"]), loaded
        assert loaded["digest"] == expected["digest"]
        assert loaded["base_digest"] == expected["base_digest"]
        assert loaded["translations"] == expected["translations"]


# Bad input fails before anything is sent (this process runs with HF_HUB_OFFLINE=1, see conftest.py).


def test_missing_model_dir_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        push_model(tmp_path / "absent", REPO_ID)


def test_model_dir_without_tokenizer_is_a_clear_error(tmp_path: Path) -> None:
    tiny_model().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"no tokenizer .*tokenizer\.save_pretrained"):
        push_model(tmp_path, REPO_ID)


def test_invalid_repo_id_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(HFValidationError, match="Repo id must"):
        push_model(tmp_path, "org/name/extra")


def test_cli_reports_bad_input_as_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    main = command_module("push").main
    with pytest.raises(SystemExit) as exit_info:
        main(["--model-dir", str(tmp_path / "absent"), "--repo-id", "bad//id"])
    assert exit_info.value.code == 2
    assert "Repo id must" in capsys.readouterr().err


# Card templates a user may get wrong, each with what its one-line refusal says after `--card FILE`.
CARD_METADATA_LINES = "---\n{{ card_data }}\n---\n"
BROKEN_CARD_TEMPLATES = {
    "syntax error": (
        "{% if %}\n",
        " line 4: template syntax error (Expected an expression, got 'end of statement block'); "
        "fix the template.",
    ),
    "unknown filter": (
        "BLEU {{ bleu | rounded }}\n",
        " line 4: template syntax error (No filter named 'rounded'.); fix the template.",
    ),
    "error while rendering": (
        "BLEU {{ bleu }}\n\n{{ 1 / 0 }}\n",
        " line 6: rendering the template failed (ZeroDivisionError: division by zero); fix the template.",
    ),
    "attribute a figure lacks": (
        "BLEU {{ bleu.value }}\n",
        " line 4: rendering the template failed (UndefinedError: 'str object' has no attribute 'value'); "
        "fix the template.",
    ),
    "unknown variable": (
        "BLEU {{ blue }}\n",
        ": unknown model card variables ['blue']; known: ['averaging', ",
    ),
}


@pytest.fixture(scope="module")
def card_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model_dir = tmp_path_factory.mktemp("card_model")
    tokenizer = train_shared_bpe_tokenizer(SENTENCES, vocab_size=40, min_frequency=1, show_progress=False)
    tiny_model(vocab_size=len(tokenizer)).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return model_dir


def push_refusal(model_dir: Path, card: Path, capsys: pytest.CaptureFixture) -> str:
    """The message of the error line `push --card CARD` ends with (after the progress bars of loading the
    model). The Hub is out of reach (HF_HUB_OFFLINE=1): a refusal that names the card comes before any Hub
    call."""
    main = command_module("push").main
    with pytest.raises(SystemExit) as exit_info:
        main(["--model-dir", str(model_dir), "--repo-id", REPO_ID, "--card", str(card)])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "Traceback" not in error
    program, separator, message = error.splitlines()[-1].partition(": error: ")
    assert separator and " " not in program, error
    return message


@pytest.mark.parametrize("case", BROKEN_CARD_TEMPLATES, ids=list(BROKEN_CARD_TEMPLATES))
def test_broken_card_template_is_refused_in_one_line_naming_the_file(
    case: str, card_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    body, message = BROKEN_CARD_TEMPLATES[case]
    card = tmp_path / "bad.md"
    card.write_text(CARD_METADATA_LINES + body, encoding="utf-8")
    line = push_refusal(card_model_dir, card, capsys)
    assert line.startswith(f"--card {card}{message}"), line


def test_card_template_not_utf8_is_refused_naming_the_file_and_the_fix(
    card_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    card = tmp_path / "latin1.md"
    card.write_bytes((CARD_METADATA_LINES + "Trained déjà.\n").encode("latin-1"))
    line = push_refusal(card_model_dir, card, capsys)
    byte = len(CARD_METADATA_LINES + "Trained d")
    number = CARD_METADATA_LINES.count("\n") + 1
    assert line == (
        f"--card {card}, line {number}: not valid UTF-8 (invalid continuation byte at byte {byte}); "
        "re-encode it, e.g. iconv -f latin1 -t utf-8."
    )


@pytest.mark.parametrize("token", ["hf_unknown", READ_TOKEN])
def test_cli_reports_a_refused_token_in_one_line(hub: HubServer, tmp_path: Path, token: str) -> None:
    """401 (unknown token) and 403 (read-only token): one line saying how to log in, exit status 2."""
    model_dir = tmp_path / "model"
    tokenizer = train_shared_bpe_tokenizer(SENTENCES, vocab_size=40, min_frequency=1, show_progress=False)
    tiny_model(vocab_size=len(tokenizer)).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hf_vanilla_transformer",
            "push",
            "--model-dir",
            str(model_dir),
            "--repo-id",
            "org/refused",
            "--token",
            token,
        ],
        cwd=REPO_ROOT,
        env=client_env(hub, tmp_path / "hf_home"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    status = "401 Unauthorized" if token == "hf_unknown" else "403 Forbidden"
    assert line.startswith(
        f"vanilla-transformer push: error: the Hub refused the token ({status}) for org/refused"
    )
    assert "hf auth login" in line and "--token" in line
    assert not result.stdout
    with pytest.raises(HubError, match="not found"):
        hub.storage.repo("model", "org/refused")


# Card rendering without a Hub.


def test_template_renders_for_both_paper_sizes_with_no_variable_left() -> None:
    base = VanillaTransformerConfig(
        vocab_size=64, d_model=32, encoder_attention_heads=4, decoder_attention_heads=4
    )
    big = VanillaTransformerConfig.from_preset("big", vocab_size=64)
    template = CARD_TEMPLATE.read_text()
    cards = {
        name: render_model_card(
            template, CardFacts(REPO_ID, config, paper_generation_config(config), 1000, RunRecords())
        )
        for name, config in (("base", base), ("big", big))
    }
    for name, card in cards.items():
        assert "{{" not in card.text and "{%" not in card.text
        assert card.text.startswith(f"\n# Transformer ({name}), {NOT_MEASURED} → {NOT_MEASURED}\n")
        assert card.data.license and card.data.pipeline_tag == "translation"
        assert "of at most the input length + 50 tokens." in card.text
        assert f'pipeline("{TASK}", model="{REPO_ID}")' in card.text
        assert f'pipeline("translation", model="{REPO_ID}", trust_remote_code=True)' in card.text
    # The paper's own figures for each size (Sections 5.2, 6.1, Table 2).
    assert "100,000 steps" in cards["base"].text and "last 5 checkpoints" in cards["base"].text
    assert "(27.3 for this model size" in cards["base"].text and "dropout 0.3" not in cards["base"].text
    assert "300,000 steps" in cards["big"].text and "last 20 checkpoints" in cards["big"].text
    assert "(28.4 for this model size" in cards["big"].text and "dropout 0.3" in cards["big"].text
    # A converted Marian model keeps transformers' fixed bound.
    marian_like = GenerationConfig(num_beams=4, max_length=512)
    card = render_model_card(template, CardFacts(REPO_ID, base, marian_like, 1000, RunRecords()))
    assert "of at most 512 tokens." in card.text


def test_unknown_template_variable_or_missing_metadata_is_an_error() -> None:
    config = VanillaTransformerConfig(vocab_size=64)
    with pytest.raises(ValueError, match=r"\['blue'\]"):
        render_model_card(
            "---\n{{ card_data }}\n---\nBLEU {{ blue }}, code {'a': 1}",
            CardFacts(REPO_ID, config, GenerationConfig(), 1, RunRecords()),
        )
    with pytest.raises(ValueError, match="card_data"):
        render_model_card("BLEU {{ bleu }}", CardFacts(REPO_ID, config, GenerationConfig(), 1, RunRecords()))


def test_records_naming_local_data_leave_datasets_out() -> None:
    config = VanillaTransformerConfig(vocab_size=64)
    template = "---\n{{ card_data }}\n---\nData: {{ dataset }}\n"
    records = RunRecords(dataset="data/multi30k/train", bleu=1.0, test_set="data/multi30k/test_2016_flickr")
    card = render_model_card(template, CardFacts(REPO_ID, config, GenerationConfig(), 1000, records))
    assert card.data.datasets is None
    assert card.text == "Data: data/multi30k/train"
    dataset = card.data.to_dict()["model-index"][0]["results"][0]["dataset"]
    assert dataset == {"name": "data/multi30k/test_2016_flickr", "type": "test_2016_flickr"}


def test_results_json_wins_over_trainer_state(tmp_path: Path) -> None:
    (tmp_path / "results.json").write_text(json.dumps({"steps": 10, "bleu": 5.0}))
    (tmp_path / "trainer_state.json").write_text(json.dumps(TRAINER_STATE))
    records = read_run_records(tmp_path)
    assert (records.steps, records.bleu, records.dev_loss, records.dev_bleu) == (10, 5.0, 3.5, None)


def test_config_with_the_repo_pipeline_saves_again_unchanged(tmp_path: Path) -> None:
    # The package registers its own task and leaves the repo's entry alone: a package user who loads a pushed
    # config and saves it writes the same config.json.
    other = {"other": {"impl": "other.OtherPipeline", "pt": [], "type": "text"}}
    config = VanillaTransformerConfig(vocab_size=64, custom_pipelines=REPO_PIPELINE | other)
    config.save_pretrained(tmp_path / "first")
    first = (tmp_path / "first" / "config.json").read_bytes()
    assert json.loads(first)["custom_pipelines"] == REPO_PIPELINE | other
    for load in (VanillaTransformerConfig.from_pretrained, AutoConfig.from_pretrained):
        load(tmp_path / "first").save_pretrained(tmp_path / load.__qualname__)
        assert (tmp_path / load.__qualname__ / "config.json").read_bytes() == first, load.__qualname__


def test_staging_carries_a_converted_fairseq_models_bpe_codes_and_target_vocabulary(tmp_path: Path) -> None:
    from conftest import tiny_model

    from hf_vanilla_transformer.common.tokenization import train_shared_bpe_tokenizer
    from hf_vanilla_transformer.hub.publishing import stage_repo

    model_dir = tmp_path / "converted"
    tokenizer = train_shared_bpe_tokenizer(
        ["a b c", "d e f"] * 5, vocab_size=40, min_frequency=1, show_progress=False
    )
    tiny_model(vocab_size=len(tokenizer)).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir / "target_tokenizer")
    (model_dir / "bpecodes").write_text("a b\n")
    stage_repo(model_dir, tmp_path / "staged", "org/converted")
    assert (tmp_path / "staged" / "bpecodes").read_text() == "a b\n"
    assert (tmp_path / "staged" / "target_tokenizer" / "tokenizer.json").is_file()


# Loads the separate-vocabulary repo through the translation pipeline, with the package or (remote) without.
SEPARATE_VOCABULARY_CLIENT = """
    import json, sys
    args = json.loads(sys.argv[1])
    from transformers import pipeline

    if args["remote"]:
        sys.modules["hf_vanilla_transformer"] = None  # the package cannot be imported
        translator = pipeline("translation", model=args["repo"], trust_remote_code=True)
    else:
        import hf_vanilla_transformer
        from hf_vanilla_transformer.translation_pipeline import TASK

        hf_vanilla_transformer.register_auto_classes()  # the package registers its pipeline
        translator = pipeline(TASK, model=args["repo"])
    translations = translator(args["inputs"], max_new_tokens=args["max_new_tokens"])
    print(json.dumps([r["translation_text"] for r in translations]))
"""


def test_separate_vocabularies_translate_from_the_hub_with_the_target_tokenizer(
    hub: HubServer, tmp_path: Path
) -> None:
    """A converted fairseq model with two dictionaries: pushed, then loaded by repo id, its pipeline must
    decode target ids with `target_tokenizer/` from the repo, with the package and with remote code."""
    source = train_shared_bpe_tokenizer(
        SENTENCES[::2] * 5, vocab_size=60, min_frequency=1, show_progress=False
    )
    target = train_shared_bpe_tokenizer(
        SENTENCES[1::2] * 5, vocab_size=50, min_frequency=1, show_progress=False
    )
    model = tiny_model(
        seed=6,  # a seed whose untrained outputs decode to non-empty, different texts
        vocab_size=len(source),
        decoder_vocab_size=len(target),
        share_encoder_decoder_embeddings=False,
    )
    model.generation_config = paper_generation_config(model.config, num_beams=2)
    model_dir = tmp_path / "separate"
    model.save_pretrained(model_dir)
    source.save_pretrained(model_dir)
    target.save_pretrained(model_dir / "target_tokenizer")
    batch = source(INPUTS, return_tensors="pt", padding=True)
    generated = model.generate(**batch, max_new_tokens=MAX_NEW_TOKENS)
    expected = [text.strip() for text in target.batch_decode(generated, skip_special_tokens=True)]
    assert all(expected) and len(set(expected)) == len(expected)
    assert expected != [text.strip() for text in source.batch_decode(generated, skip_special_tokens=True)]

    repo = "org/separate"
    push_env = client_env(hub, tmp_path / "hf_home_push")
    run_python(
        push_env,
        "-m",
        "hf_vanilla_transformer",
        "push",
        "--model-dir",
        str(model_dir),
        "--repo-id",
        repo,
    )
    args = {"repo": repo, "inputs": INPUTS, "max_new_tokens": MAX_NEW_TOKENS}
    clients = {
        remote: start_client(
            client_env(hub, tmp_path / f"hf_home_{remote}"), SEPARATE_VOCABULARY_CLIENT, remote=remote, **args
        )
        for remote in (False, True)
    }
    for remote, client in clients.items():
        assert [text.strip() for text in client_result(client)] == expected, f"remote code: {remote}"


# Downloads the CTranslate2 export of a repo as the model card shows, and translates greedily with it, with
# CTranslate2 alone and with the package's CTranslate2 engine.
CTRANSLATE2_CLIENT = """
    import json, sys
    import ctranslate2
    from huggingface_hub import snapshot_download
    from transformers import AutoTokenizer
    from hf_vanilla_transformer.inference.translator import load_translator

    args = json.loads(sys.argv[1])
    folder = snapshot_download(args["repo"], allow_patterns="ctranslate2/*") + "/ctranslate2"
    translator = ctranslate2.Translator(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    sources = [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(args["inputs"])["input_ids"]]
    results = translator.translate_batch(sources, beam_size=1)
    engine = load_translator(folder)
    print(json.dumps({
        "ids": [tokenizer.convert_tokens_to_ids(result.hypotheses[0]) for result in results],
        "engine": engine.engine,
        "translations": engine.translate(args["inputs"], num_beams=1),
    }))
"""


@needs_ctranslate2
def test_push_with_ctranslate2_uploads_an_export_that_decodes_as_the_model(
    hub: HubServer, tmp_path: Path
) -> None:
    """`vanilla-transformer push --with-ctranslate2` on a trained tiny model: the repo's ctranslate2/ folder
    loads in CTranslate2 and decodes greedily as the PyTorch model, and the card says how; a later push
    without the export removes it, since it holds the earlier weights."""
    model_dir = train_reverse_model(tmp_path / "model", "paper")
    inputs = [sentence for sentence in REVERSE_SENTENCES if sentence][:8]
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    expected_ids = []
    for sentence in inputs:
        generated = model.generate(**tokenizer([sentence], return_tensors="pt"), num_beams=1)[0, 1:].tolist()
        expected_ids.append(generated[:-1] if generated[-1] == tokenizer.eos_token_id else generated)
    expected_translations = load_translator(model_dir).translate(inputs, num_beams=1)
    # A model that writes one output for everything could not tell the engines apart.
    assert len({tuple(ids) for ids in expected_ids}) > len(inputs) // 2

    repo = "org/with-ctranslate2"
    env = client_env(hub, tmp_path / "hf_home_push")
    push = ["-m", "hf_vanilla_transformer", "push", "--model-dir", str(model_dir), "--repo-id", repo]
    run_python(env, *push, "--with-ctranslate2")
    commit = hub.storage.resolve(hub.storage.repo("model", repo), "main")
    exported = {path for path in commit.files if path.startswith(f"{CTRANSLATE2_DIR}/")}
    assert {
        f"{CTRANSLATE2_DIR}/{name}" for name in ("model.bin", "config.json", "tokenizer.json")
    } <= exported
    card = ModelCard(repo_file(hub, commit, "README.md").decode())
    assert "### With CTranslate2" in card.text and "(float32 weights)" in card.text
    assert f'snapshot_download("{repo}", allow_patterns="{CTRANSLATE2_DIR}/*")' in card.text
    assert "translate --model FOLDER --engine ctranslate2" in card.text

    client = start_client(
        client_env(hub, tmp_path / "hf_home_client"), CTRANSLATE2_CLIENT, repo=repo, inputs=inputs
    )
    result = client_result(client)
    assert result["ids"] == expected_ids
    assert result["engine"] == "ctranslate2"
    assert result["translations"] == expected_translations

    run_python(env, *push)
    commit = hub.storage.resolve(hub.storage.repo("model", repo), "main")
    assert not [path for path in commit.files if path.startswith(f"{CTRANSLATE2_DIR}/")]
    assert "CTranslate2" not in repo_file(hub, commit, "README.md").decode()


def test_card_says_the_length_penalty_was_chosen_on_the_validation_set(tmp_path: Path) -> None:
    (tmp_path / "results.json").write_text(
        json.dumps({"dev_bleu": 26.6, "dev_bleu_by_length_penalty": {"0.6": 25.21, "1.2": 26.6}})
    )
    tuned = read_run_records(tmp_path)
    config = VanillaTransformerConfig(
        vocab_size=64, d_model=32, encoder_attention_heads=4, decoder_attention_heads=4
    )
    template = CARD_TEMPLATE.read_text()
    card = render_model_card(
        template, CardFacts(REPO_ID, config, paper_generation_config(config, length_penalty=1.2), 1000, tuned)
    )
    assert 'length penalty α = 1.2 in the "gnmt" form' in card.text
    assert "chosen on the validation set, whose BLEU at α = 0.6 / 1.2 was 25.21 / 26.60;" in card.text
    untuned = render_model_card(
        template,
        CardFacts(REPO_ID, config, paper_generation_config(config), 1000, RunRecords(dev_bleu=25.21)),
    )
    assert "α = 0.6 in the" in untuned.text and "chosen on the validation set" not in untuned.text


@pytest.mark.parametrize(
    ("overrides", "expected", "absent"),
    [
        (
            {},
            [
                "sinusoidal positional encodings",
                "one shared source/target vocabulary",
                "| vocabulary | 64, shared |",
            ],
            ["learned positional", "separate source"],
        ),
        (
            {
                "position_embedding_type": "learned",
                "share_encoder_decoder_embeddings": False,
                "decoder_vocab_size": 48,
            },
            [
                "learned positional embeddings",
                "separate source and target vocabularies, where the target "
                "embedding matrix is also the pre-softmax projection",
                "| vocabulary | 64 source / 48 target |",
            ],
            ["sinusoidal", "shared source/target"],
        ),
    ],
)
def test_card_describes_the_models_own_positions_and_vocabularies(
    overrides: dict[str, Any], expected: list[str], absent: list[str]
) -> None:
    config = VanillaTransformerConfig(
        vocab_size=64, d_model=32, encoder_attention_heads=4, decoder_attention_heads=4, **overrides
    )
    card = render_model_card(
        CARD_TEMPLATE.read_text(),
        CardFacts(REPO_ID, config, paper_generation_config(config), 1000, RunRecords()),
    )
    for text in expected:
        assert text in card.text, text
    for text in absent:
        assert text not in card.text, text
