"""The package's translation pipeline drives the model end to end without changing transformers' own
pipeline tables."""

import json
import subprocess
import sys

import torch
from conftest import REPO_ROOT, tiny_config
from transformers import pipeline

from hf_vanilla_transformer import TranslationPipeline, VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.common.tokenization import train_shared_bpe_tokenizer
from hf_vanilla_transformer.translation_pipeline import TASK


def test_translation_pipeline(tmp_path):
    sentences = [
        "a dog runs in the park .",
        "ein hund rennt im park .",
        "a cat sleeps .",
        "eine katze schläft .",
    ]
    tokenizer = train_shared_bpe_tokenizer(sentences * 5, vocab_size=80, min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(tiny_config(vocab_size=len(tokenizer))).eval()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    translator = pipeline(TASK, model=str(tmp_path), tokenizer=str(tmp_path))
    assert isinstance(translator, TranslationPipeline)
    assert isinstance(translator.model, VanillaTransformerForConditionalGeneration)
    result = translator(["a dog runs .", "a cat sleeps ."], max_new_tokens=5, num_beams=2)
    inputs = tokenizer(["a dog runs .", "a cat sleeps ."], return_tensors="pt", padding=True)
    expected = tokenizer.batch_decode(
        model.generate(**inputs, max_new_tokens=5, num_beams=2), skip_special_tokens=True
    )
    assert [r["translation_text"] for r in result] == [e.strip() for e in expected]


# Prints transformers' pipeline tables, after importing the package when sys.argv[1] is "package".
PIPELINE_TABLES = """
import json, sys
if sys.argv[1] == "package":
    import hf_vanilla_transformer
    hf_vanilla_transformer.register_auto_classes()
from transformers.pipelines import PIPELINE_REGISTRY, REMOVED_TASKS

def name(obj):  # transformers names some classes by a string already
    return obj if isinstance(obj, str) else f"{obj.__module__}.{obj.__qualname__}"

tasks = {
    task: {**info, "impl": name(info["impl"]), "pt": [name(model) for model in info["pt"]]}
    for task, info in PIPELINE_REGISTRY.supported_tasks.items()
}
print(json.dumps({"removed": REMOVED_TASKS, "aliases": PIPELINE_REGISTRY.task_aliases, "tasks": tasks}))
"""


def pipeline_tables(mode: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", PIPELINE_TABLES, mode],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_importing_the_package_only_adds_its_task_to_the_pipeline_registry():
    # Compared with a fresh interpreter that imports transformers only.
    plain, with_package = pipeline_tables("transformers only"), pipeline_tables("package")
    assert with_package["removed"] == plain["removed"]
    assert "translation" in with_package["removed"]
    assert with_package["aliases"] == plain["aliases"]
    added = with_package["tasks"].pop(TASK)
    assert with_package["tasks"] == plain["tasks"]
    assert added == {
        "impl": "hf_vanilla_transformer.translation_pipeline.TranslationPipeline",
        "pt": ["transformers.models.auto.modeling_auto.AutoModelForSeq2SeqLM"],
        "type": "text",
    }
