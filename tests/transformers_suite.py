"""transformers' own common model tests, taken from the source distribution of the installed version.

`ModelTesterMixin` (tests/test_modeling_common.py) and `ConfigTester` (tests/test_configuration_common.py)
are what every model inside transformers passes. They are not installed with the wheel, so this module
downloads the sdist of the installed version by package name (`pip download --no-binary :all:`) once into
a cache folder and imports its tests/ folder as the package `transformers_tests`. Nothing of it is kept in
this repository.

The sdist lacks three modules that those files import: `tests/generation/test_utils.py`
(`GenerationTesterMixin`), `tests/exporters/test_export.py` (`ExportTesterMixin`, the base class of
`ModelTesterMixin`) and `tests/utils/test_configuration_utils.py` (`config_common_kwargs`). Where a
module is missing it is stood in for: `GenerationTesterMixin` by `generation_checks`, this repository's
own checks of `generate()`, `ExportTesterMixin` by an empty base (its `torch.export` tests are not run),
and `config_common_kwargs` by a non-default value for every field that `PreTrainedConfig` itself
declares. `TRANSFORMERS_TESTS_DIR` names a full checkout's tests/ folder instead, whose own modules then
take precedence.

Without the network and without a cached copy the tests are skipped with the reason, except under CI
(`CI` set), where that is a failure.
"""

import dataclasses
import importlib
import os
import subprocess
import sys
import tarfile
import tempfile
import types
from pathlib import Path

import pytest
import transformers
from filelock import FileLock

PACKAGE = "transformers_tests"
CACHE = Path(
    os.environ.get(
        "TRANSFORMERS_TESTS_CACHE", Path.home() / ".cache" / "hf_vanilla_transformer" / "transformers"
    )
)


def _download_tests(version: str, destination: Path) -> None:
    """Unpack the sdist's tests/*.py of transformers `version` into `destination`."""
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
             "--no-deps", "--no-binary", ":all:", "--dest", scratch, f"transformers=={version}"],
            check=True, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        (sdist,) = Path(scratch).glob("transformers-*.tar.gz")
        prefix = f"transformers-{version}/tests/"
        staging = destination.with_name(destination.name + ".partial")
        staging.mkdir(parents=True, exist_ok=True)
        with tarfile.open(sdist) as archive:
            for member in archive.getmembers():
                name = member.name
                if member.isfile() and name.startswith(prefix) and "/" not in name[len(prefix) :]:
                    (staging / name[len(prefix) :]).write_bytes(archive.extractfile(member).read())
        if not (staging / "test_modeling_common.py").exists():
            raise RuntimeError(f"the sdist of transformers {version} holds no tests/test_modeling_common.py")
        (staging / "__init__.py").touch()
        staging.rename(destination)


def _tests_folder() -> Path:
    given = os.environ.get("TRANSFORMERS_TESTS_DIR")
    if given:
        # Linked under the package's name, so that its relative imports and the stand-ins agree.
        link = CACHE / "checkout" / PACKAGE
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() and link.resolve() != Path(given).resolve():
            link.unlink()
        if not link.is_symlink():
            link.symlink_to(Path(given).resolve(), target_is_directory=True)
        return link
    version = transformers.__version__
    folder = CACHE / version / PACKAGE
    if not (folder / "test_modeling_common.py").exists():
        folder.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(folder.parent / "download.lock")):
            if not (folder / "test_modeling_common.py").exists():
                try:
                    _download_tests(version, folder)
                except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as error:
                    detail = getattr(error, "stderr", None) or error
                    reason = f"transformers {version}'s tests could not be downloaded: {str(detail)[-300:]}"
                    if os.environ.get("CI"):
                        raise RuntimeError(reason) from error
                    pytest.skip(reason, allow_module_level=True)
    return folder


def _config_common_kwargs() -> dict:
    """A value other than the default for each public field of `PreTrainedConfig` itself, plus the token ids
    and the tie that every config takes: what ConfigTester checks a config passes through unchanged."""
    by_name = {
        "architectures": ["VanillaTransformerForConditionalGeneration"],
        "output_hidden_states": True,
        "return_dict": False,
        "dtype": "float16",
        "chunk_size_feed_forward": 5,
        "is_encoder_decoder": True,
        "id2label": {0: "LABEL_A", 1: "LABEL_B", 2: "LABEL_C"},
        "label2id": {"LABEL_A": 0, "LABEL_B": 1, "LABEL_C": 2},
        "problem_type": "regression",
        "transformers_version": "0.0.1",
    }
    base_fields = {field.name for field in dataclasses.fields(transformers.PreTrainedConfig)}
    missing = base_fields - set(by_name)
    if missing:
        raise RuntimeError(f"PreTrainedConfig has fields this stand-in gives no value: {sorted(missing)}")
    return {
        **by_name,
        "tie_word_embeddings": False,
        "pad_token_id": 5,
        "bos_token_id": 6,
        "eos_token_id": 7,
        "decoder_start_token_id": 8,
    }


def _stand_in(name: str, **attributes) -> None:
    """Register module `PACKAGE.name` with `attributes` unless the tests folder has that module."""
    full_name = f"{PACKAGE}.{name}"
    try:
        importlib.import_module(full_name)
        return
    except ModuleNotFoundError as error:
        if not full_name.startswith(str(error.name)):
            raise
    parent = full_name.rsplit(".", 1)[0]
    if parent not in sys.modules:
        sys.modules[parent] = types.ModuleType(parent)
        sys.modules[parent].__path__ = []
    module = types.ModuleType(full_name)
    module.__dict__.update(attributes)
    sys.modules[full_name] = module


def load() -> types.SimpleNamespace:
    """transformers' `ModelTesterMixin`, `ConfigTester`, `ids_tensor` and the `GenerationTesterMixin` in use,
    with `generation_is_transformers` saying whose it is."""
    folder = _tests_folder()
    if str(folder.parent) not in sys.path:
        sys.path.insert(0, str(folder.parent))
    from generation_checks import PaperGenerationChecks

    _stand_in("exporters.test_export", ExportTesterMixin=type("ExportTesterMixin", (), {}))
    _stand_in("generation.test_utils", GenerationTesterMixin=PaperGenerationChecks)
    _stand_in("utils.test_configuration_utils", config_common_kwargs=_config_common_kwargs())
    modeling = importlib.import_module(f"{PACKAGE}.test_modeling_common")
    configuration = importlib.import_module(f"{PACKAGE}.test_configuration_common")
    generation = importlib.import_module(f"{PACKAGE}.generation.test_utils")
    return types.SimpleNamespace(
        ModelTesterMixin=modeling.ModelTesterMixin,
        ConfigTester=configuration.ConfigTester,
        ids_tensor=modeling.ids_tensor,
        GenerationTesterMixin=generation.GenerationTesterMixin,
        generation_is_transformers=generation.GenerationTesterMixin is not PaperGenerationChecks,
    )
