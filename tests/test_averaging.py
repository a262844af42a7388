"""Checkpoint averaging (Section 6.1)."""

import json

import pytest
import torch
from conftest import tiny_model
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import MarianConfig, MarianMTModel

from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.commands import main as command_main
from hf_vanilla_transformer.common.model_location import MODEL_DESCRIPTION_FILES
from hf_vanilla_transformer.training.averaging import average_checkpoints, last_checkpoints

MARIAN = dict(
    vocab_size=50,
    d_model=16,
    encoder_layers=1,
    decoder_layers=1,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=32,
    decoder_ffn_dim=32,
    max_position_embeddings=32,
    pad_token_id=0,
    decoder_start_token_id=0,
    eos_token_id=3,
)


def save_marian(path, seed, **save_kwargs):
    torch.manual_seed(seed)
    MarianMTModel(MarianConfig(**MARIAN)).save_pretrained(path, **save_kwargs)
    return path


def saved_tensors(checkpoint):
    tensors = {}
    for file in sorted(checkpoint.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def expected_mean(checkpoints):
    state_dicts = [saved_tensors(c) for c in checkpoints]
    return {
        name: torch.stack([sd[name].double() for sd in state_dicts]).mean(0).to(tensor.dtype)
        for name, tensor in state_dicts[-1].items()
    }


def test_marian_average_equals_parameter_mean(tmp_path):
    checkpoints = [save_marian(tmp_path / f"checkpoint-{n}", seed=n) for n in (1, 2, 3)]
    last = checkpoints[-1]
    (last / "tokenizer.json").write_text("{}")
    (last / "custom_code.py").write_text("# remote code\n")
    (last / "trainer_state.json").write_text("{}")
    torch.save({"state": {}}, last / "optimizer.pt")

    output = average_checkpoints(checkpoints, tmp_path / "averaged")

    averaged = saved_tensors(output)
    expected = expected_mean(checkpoints)
    assert averaged.keys() == expected.keys()
    assert "lm_head.weight" not in averaged, "tied duplicates stay out, as in the inputs"
    for name, tensor in expected.items():
        assert torch.equal(averaged[name], tensor), name
    assert not torch.equal(averaged["model.shared.weight"], saved_tensors(last)["model.shared.weight"])
    names = {p.name for p in output.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json", "custom_code.py"} <= names
    assert not {"trainer_state.json", "optimizer.pt"} & names
    with safe_open(output / "model.safetensors", framework="pt") as handle:
        assert handle.metadata() == {"format": "pt"}

    model = MarianMTModel.from_pretrained(output)
    assert torch.equal(model.model.shared.weight, expected["model.shared.weight"])
    assert torch.equal(model.lm_head.weight, expected["model.shared.weight"])


def test_sharded_checkpoints_keep_their_layout(tmp_path):
    checkpoints = [save_marian(tmp_path / f"c{n}", seed=n, max_shard_size="20KB") for n in (1, 2)]
    assert (checkpoints[0] / "model.safetensors.index.json").is_file()
    output = average_checkpoints(checkpoints, tmp_path / "avg")
    assert sorted(p.name for p in output.glob("*.safetensors")) == sorted(
        p.name for p in checkpoints[-1].glob("*.safetensors")
    )
    index = json.loads((output / "model.safetensors.index.json").read_text())
    assert index == json.loads((checkpoints[-1] / "model.safetensors.index.json").read_text())
    averaged, expected = saved_tensors(output), expected_mean(checkpoints)
    assert all(torch.equal(averaged[name], expected[name]) for name in expected)
    MarianMTModel.from_pretrained(output)


def test_package_model_round_trips(tmp_path):
    checkpoints = []
    for seed in (0, 1):
        tiny_model(seed=seed).save_pretrained(tmp_path / f"checkpoint-{seed}")
        checkpoints.append(tmp_path / f"checkpoint-{seed}")
    output = average_checkpoints(checkpoints, tmp_path / "avg")
    assert sorted(p.name for p in output.glob("*.py")) == sorted(p.name for p in checkpoints[-1].glob("*.py"))
    model = VanillaTransformerForConditionalGeneration.from_pretrained(output)
    expected = expected_mean(checkpoints)
    state = model.state_dict()
    for name, tensor in expected.items():
        assert torch.equal(state[name], tensor), name


def write_checkpoint(path, tensors):
    path.mkdir(parents=True)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    (path / "config.json").write_text("{}")
    return path


def test_float16_and_integer_tensors(tmp_path):
    steps = torch.tensor([7, 8])
    halves = [torch.tensor([0.1, 0.2, 65000.0], dtype=torch.float16) * k for k in (1, 0.5, 0.25)]
    checkpoints = [
        write_checkpoint(tmp_path / f"c{i}", {"w": half, "steps": steps.clone()})
        for i, half in enumerate(halves)
    ]
    averaged = load_file(average_checkpoints(checkpoints, tmp_path / "avg") / "model.safetensors")
    assert averaged["w"].dtype == torch.float16
    assert torch.equal(averaged["w"], torch.stack([h.double() for h in halves]).mean(0).half())
    assert torch.isfinite(averaged["w"]).all(), "the sum is taken in float64, so it cannot overflow"
    assert torch.equal(averaged["steps"], steps)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_checkpoint_with_non_finite_weights_is_refused_and_the_earlier_average_kept(tmp_path, bad):
    a = write_checkpoint(tmp_path / "a", {"w": torch.ones(3)})
    b = write_checkpoint(tmp_path / "b", {"w": torch.tensor([1.0, bad, 2.0])})
    c = write_checkpoint(tmp_path / "c", {"w": torch.zeros(3)})
    earlier = average_checkpoints([a, c], tmp_path / "avg")
    with pytest.raises(ValueError, match=f"{b} holds NaN or infinite values in 'w'"):
        average_checkpoints([a, b], tmp_path / "avg", overwrite=True)
    assert torch.equal(load_file(earlier / "model.safetensors")["w"], torch.full((3,), 0.5))


def test_differing_integer_tensor_is_refused(tmp_path):
    a = write_checkpoint(tmp_path / "a", {"w": torch.ones(2), "ids": torch.tensor([1, 2])})
    b = write_checkpoint(tmp_path / "b", {"w": torch.ones(2), "ids": torch.tensor([1, 3])})
    with pytest.raises(ValueError, match="Non-floating-point tensor 'ids'.*differs"):
        average_checkpoints([a, b], tmp_path / "avg")


def test_mismatched_keys_are_refused(tmp_path):
    a = write_checkpoint(tmp_path / "a", {"w": torch.ones(2), "extra": torch.ones(1)})
    b = write_checkpoint(tmp_path / "b", {"w": torch.ones(2), "bias": torch.ones(1)})
    with pytest.raises(
        ValueError, match=r"does not have the same tensors.*missing \['bias'\], extra \['extra'\]"
    ):
        average_checkpoints([a, b], tmp_path / "avg")


def test_mismatched_shapes_and_dtypes_are_refused(tmp_path):
    a = write_checkpoint(tmp_path / "a", {"w": torch.ones(2, 3)})
    b = write_checkpoint(tmp_path / "b", {"w": torch.ones(3, 2)})
    c = write_checkpoint(tmp_path / "c", {"w": torch.ones(3, 2, dtype=torch.float16)})
    with pytest.raises(ValueError, match=r"Tensor 'w' is F32 \[2, 3\] in .*a but F32 \[3, 2\] in .*b"):
        average_checkpoints([a, b], tmp_path / "avg")
    with pytest.raises(ValueError, match=r"Tensor 'w' is F32 \[3, 2\] in .*b but F16 \[3, 2\]"):
        average_checkpoints([b, c], tmp_path / "avg")


def test_bad_inputs(tmp_path):
    a = write_checkpoint(tmp_path / "a", {"w": torch.ones(2)})
    with pytest.raises(ValueError, match="No checkpoints"):
        average_checkpoints([], tmp_path / "avg")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        average_checkpoints([a, tmp_path / "missing"], tmp_path / "avg")
    with pytest.raises(ValueError, match="listed twice"):
        average_checkpoints([a, tmp_path / "a"], tmp_path / "avg")
    with pytest.raises(ValueError, match="is one of the input checkpoints"):
        average_checkpoints([a], a)
    (tmp_path / "bin_only").mkdir()
    (tmp_path / "bin_only" / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="Only safetensors checkpoints"):
        average_checkpoints([a, tmp_path / "bin_only"], tmp_path / "avg")


def test_last_checkpoints_sorts_numerically(tmp_path):
    for name in ("checkpoint-900", "checkpoint-10000", "checkpoint-1000", "checkpoint-5-tmp", "runs"):
        (tmp_path / name).mkdir()
    (tmp_path / "checkpoint-20000").write_text("a file, not a checkpoint")
    assert [p.name for p in last_checkpoints(tmp_path, 2)] == ["checkpoint-1000", "checkpoint-10000"]
    assert [p.name for p in last_checkpoints(tmp_path, 3)][0] == "checkpoint-900"
    with pytest.raises(
        ValueError, match=r"last 5 checkpoints but .* has 3 checkpoint-N folders \(checkpoint-900"
    ):
        last_checkpoints(tmp_path, 5)
    with pytest.raises(ValueError, match="k must be >= 1"):
        last_checkpoints(tmp_path, 0)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        last_checkpoints(tmp_path / "nowhere", 1)


def test_a_folder_holding_a_model_is_kept_unless_overwritten_and_then_holds_the_average_only(tmp_path):
    checkpoints = [save_marian(tmp_path / f"checkpoint-{n}", seed=n) for n in (1, 2)]
    # An earlier, sharded model in the output folder: its shards and index would load in place of a single
    # averaged file left beside them.
    earlier = save_marian(tmp_path / "model", seed=9, max_shard_size="20KB")
    assert (earlier / "model.safetensors.index.json").is_file()
    before = {path.name: path.read_bytes() for path in earlier.iterdir()}
    with pytest.raises(FileExistsError, match="is not empty"):
        average_checkpoints(checkpoints, earlier)
    assert {path.name: path.read_bytes() for path in earlier.iterdir()} == before

    # What described the earlier model (its run's BLEU, its step count) does not describe the average.
    for name in MODEL_DESCRIPTION_FILES:
        (earlier / name).write_text("{}")
        (checkpoints[-1] / name).write_text("{}")
    average_checkpoints(checkpoints, earlier, overwrite=True)
    assert sorted(path.name for path in earlier.glob("*.safetensors*")) == ["model.safetensors"]
    assert not [name for name in MODEL_DESCRIPTION_FILES if (earlier / name).exists()]
    loaded = MarianMTModel.from_pretrained(earlier).state_dict()
    for name, tensor in expected_mean(checkpoints).items():
        torch.testing.assert_close(loaded[name], tensor)


def test_a_checkpoint_whose_weights_are_cut_short_is_refused_in_one_line(tmp_path, capsys):
    """A weights file cut to half its bytes (a full disk, an interrupted copy) is named, in the library and
    as `vanilla-transformer average`'s one-line error, and nothing is written."""
    good, damaged = (write_checkpoint(tmp_path / name, {"w": torch.ones(64)}) for name in ("good", "damaged"))
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(
        ValueError, match=f"^{weights} is damaged \\(.*\\): copy or save that checkpoint again"
    ):
        average_checkpoints([good, damaged], tmp_path / "avg")
    assert not (tmp_path / "avg").exists()

    with pytest.raises(SystemExit) as exit_info:
        command_main(["average", "--checkpoints", str(good), str(damaged), "--output", str(tmp_path / "avg")])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith(f"vanilla-transformer average: error: {weights} is damaged"), error
    assert len(error.splitlines()) == 1 and "leave it out" in error
