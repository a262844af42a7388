"""The package answers at once: `import hf_vanilla_transformer` and every command's `--help` import neither
torch nor transformers; each name of a lazy namespace resolves to what its module defines; and the model is
registered with transformers when one of the package's names is first used, or when asked."""

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import hf_vanilla_transformer
from hf_vanilla_transformer.commands import COMMANDS
from hf_vanilla_transformer.lazy_exports import exported_names

PACKAGE = Path(hf_vanilla_transformer.__file__).resolve().parent
HEAVY = ("torch", "transformers", "datasets", "accelerate", "numpy", "tokenizers", "sacrebleu", "matplotlib")
# The packages whose names are imported on first use.
LAZY_PACKAGES = [
    "hf_vanilla_transformer",
    "hf_vanilla_transformer.conversion",
    "hf_vanilla_transformer.inference",
    "hf_vanilla_transformer.inference.engines",
    "hf_vanilla_transformer.serving",
]


def run_python(code: str, *args: str) -> dict:
    """Run `code` with `args` in a fresh interpreter and return the JSON it prints last."""
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300, cwd=PACKAGE.parent
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


HELP_EVERYWHERE = """
import contextlib, io, json, sys
import hf_vanilla_transformer
after_import = sorted(name for name in {heavy} if name in sys.modules)
from hf_vanilla_transformer.commands import COMMANDS, main
helps = {{}}
for argv in [["--help"], *([name, "--help"] for name in COMMANDS),
             *(["chatbot", action, "--help"] for action in ("train", "evaluate", "chat"))]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main(argv)
        except SystemExit as stop:
            assert stop.code == 0, (argv, stop.code)
    helps[" ".join(argv)] = out.getvalue()
print(json.dumps({{"after_import": after_import, "helps": helps,
                  "after_help": sorted(name for name in {heavy} if name in sys.modules)}}))
"""


def test_import_and_every_help_load_no_heavy_library():
    found = run_python(HELP_EVERYWHERE.format(heavy=HEAVY))
    assert found["after_import"] == []
    assert found["after_help"] == []
    assert set(found["helps"]) == {
        "--help",
        *(f"{name} --help" for name in COMMANDS),
        *(f"chatbot {action} --help" for action in ("train", "evaluate", "chat")),
    }
    for argv, text in found["helps"].items():
        assert text.startswith("usage: vanilla-transformer"), argv
    assert all(name in found["helps"]["--help"] for name in COMMANDS)


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_every_lazy_name_is_what_its_module_defines(package):
    namespace = importlib.import_module(package)
    init_file = Path(namespace.__file__)
    names = exported_names(init_file)
    assert sorted(names) == sorted(namespace.__all__)
    assert set(names) <= set(dir(namespace))
    for name, module in names.items():
        defined = getattr(importlib.import_module(module, package), name)
        assert getattr(namespace, name) is defined, name
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        namespace.no_such_name  # noqa: B018


def test_the_lazy_names_are_read_from_the_type_checking_block(tmp_path):
    init = tmp_path / "__init__.py"
    init.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from .a import b, c as d\n"
        "    from ..up.e import f\n"
        "from .g import h\n"
    )
    assert exported_names(init) == {"b": ".a", "d": ".a", "f": "..up.e"}
    assert "TYPE_CHECKING" in ast.unparse(ast.parse(init.read_text()))


REGISTRATION_STEPS = """
import json
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM
from transformers.pipelines import PIPELINE_REGISTRY
import hf_vanilla_transformer

TINY = dict(encoder_layers=1, decoder_layers=1, hidden_size=8, encoder_ffn_dim=8, decoder_ffn_dim=8,
            encoder_attention_heads=2, decoder_attention_heads=2, vocab_size=12, decoder_vocab_size=12)

def built(build):
    try:
        return type(build()).__name__
    except ValueError:  # transformers' answer for a model type or config class it does not know
        return None

def state():
    config = built(lambda: AutoConfig.for_model("vanilla_transformer", **TINY))
    models = {}
    if config is not None:
        tiny = AutoConfig.for_model("vanilla_transformer", **TINY)
        for auto in (AutoModel, AutoModelForSeq2SeqLM):
            models[auto.__name__] = built(lambda: auto.from_config(tiny))
    return {"config": config, "models": models,
            "pipeline": "seq2seq-translation" in PIPELINE_REGISTRY.get_supported_tasks()}

steps = {"import": state()}
from hf_vanilla_transformer import VanillaTransformerConfig
steps["config"] = state()
hf_vanilla_transformer.register_auto_classes()
steps["register"] = state()
print(json.dumps(steps))
"""


def test_names_register_the_model_when_first_used():
    steps = run_python(REGISTRATION_STEPS)
    assert steps["import"] == {"config": None, "models": {}, "pipeline": False}
    assert steps["config"]["config"] == "VanillaTransformerConfig"
    assert steps["config"]["models"] == {"AutoModel": None, "AutoModelForSeq2SeqLM": None}
    assert steps["register"] == {
        "config": "VanillaTransformerConfig",
        "models": {
            "AutoModel": "VanillaTransformerModel",
            "AutoModelForSeq2SeqLM": "VanillaTransformerForConditionalGeneration",
        },
        "pipeline": True,
    }


def test_a_model_class_name_registers_everything(tmp_path):
    steps = run_python(
        "import json, os, sys\n"
        "from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration as model_class\n"
        "from transformers import AutoConfig, AutoModelForSeq2SeqLM\n"
        "config = AutoConfig.for_model('vanilla_transformer', encoder_layers=1, decoder_layers=1,\n"
        "    hidden_size=8, encoder_ffn_dim=8, decoder_ffn_dim=8, encoder_attention_heads=2,\n"
        "    decoder_attention_heads=2, vocab_size=12, decoder_vocab_size=12)\n"
        "model = AutoModelForSeq2SeqLM.from_config(config)\n"
        "model.save_pretrained(sys.argv[1])\n"
        "saved = json.load(open(os.path.join(sys.argv[1], 'config.json')))\n"
        "print(json.dumps({'model': type(model).__name__, 'auto_map': saved['auto_map'],\n"
        "                  'files': sorted(os.listdir(sys.argv[1]))}))",
        str(tmp_path),
    )
    assert steps["model"] == "VanillaTransformerForConditionalGeneration"
    # Registered for the Auto classes, the saved folder carries the model's code for trust_remote_code=True.
    assert set(steps["auto_map"]) == {"AutoConfig", "AutoModel", "AutoModelForSeq2SeqLM"}
    assert {"configuration_vanilla_transformer.py", "modeling_vanilla_transformer.py"} <= set(steps["files"])


TOKENIZER_QUESTION = """
import builtins, json, sys
asked = []
builtins.input = lambda prompt="": asked.append(prompt) or "n"
from transformers import AutoTokenizer

found = {}
for how in ("plain", "trust_remote_code=False", "registered"):
    asked.clear()
    if how == "registered":
        import hf_vanilla_transformer
        hf_vanilla_transformer.register_auto_classes()
    kwargs = {"trust_remote_code": False} if how == "trust_remote_code=False" else {}
    tokenizer = AutoTokenizer.from_pretrained(sys.argv[1], **kwargs)
    found[how] = {"asked": bool(asked), "pad": tokenizer.pad_token}
print(json.dumps(found))
"""


def test_the_tokenizer_of_a_saved_folder_loads_without_the_custom_code_question(tmp_path):
    """transformers asks whether to run the folder's code when its config's type is unknown (docs/hub.md):
    `trust_remote_code=False`, or the package's registration, loads the tokenizer without asking."""
    run_python(
        "import json, sys\n"
        "from hf_vanilla_transformer import VanillaTransformerConfig\n"
        "from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration as model_class\n"
        "from hf_vanilla_transformer.common.tokenization import train_shared_bpe_tokenizer\n"
        "text = ['a b c d', 'e f g h'] * 20\n"
        "tokenizer = train_shared_bpe_tokenizer(text, vocab_size=40, min_frequency=1)\n"
        "config = VanillaTransformerConfig.from_preset('base', vocab_size=len(tokenizer), N=1, d_model=8,\n"
        "    d_ff=8, h=2)\n"
        "model_class(config).save_pretrained(sys.argv[1])\n"
        "tokenizer.save_pretrained(sys.argv[1])\n"
        "print(json.dumps({}))",
        str(tmp_path),
    )
    found = run_python(TOKENIZER_QUESTION, str(tmp_path))
    assert found == {
        "plain": {"asked": True, "pad": "<pad>"},
        "trust_remote_code=False": {"asked": False, "pad": "<pad>"},
        "registered": {"asked": False, "pad": "<pad>"},
    }
