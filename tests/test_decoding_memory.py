"""A beam wider than the vocabulary, or a batch whose beam search needs more memory than the machine has
free, is refused in one line before it decodes; the memory estimate follows what decoding really takes."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO_ROOT, tiny_model

from hf_vanilla_transformer.commands import main
from hf_vanilla_transformer.common.tokenization import train_shared_bpe_tokenizer
from hf_vanilla_transformer.inference import decoding_memory

SENTENCES = ["A dog runs in the park.", "Two men talk.", "A girl reads a book.", "The dog sleeps."]
# Builds a tiny model of argv's vocabulary whose end token is never chosen (every beam runs to the length
# limit), then, in one forked child per beam width in argv, decodes a batch of argv's size, source length
# and output limit, and prints the growth of the child's peak resident memory that decoding caused, in
# bytes, and the estimate's. The children share the parent's imports and model, so the interpreter starts
# once; each reads its own high-water mark, which starts at what the parent held when it forked.
MEASURE = """
import os
import sys
import traceback

import torch


def peak_resident_bytes() -> int:
    # This process's own high-water mark (VmHWM): getrusage's ru_maxrss keeps, across exec, the peak of the
    # process that forked it (a pytest worker), which can hide the peak of decoding altogether.
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))


def warm_up() -> None:
    # The libraries' first use of their kernels, and the child's first touch of the parent's code pages,
    # which decoding itself does not grow.
    with torch.inference_mode(), decoding_context(model):
        model.generate(input_ids=ids[:1, :4], attention_mask=torch.ones_like(ids[:1, :4]), num_beams=2,
                       max_new_tokens=3, **decoding_cache(model, 2, {}))


def measure(beams: int) -> None:
    warm_up()
    model.generation_config = paper_generation_config(model.config, num_beams=beams, max_length_offset=offset)
    before = peak_resident_bytes()
    # Decoded as `translate` decodes on a CPU, which is what the estimate is for.
    with torch.inference_mode(), decoding_context(model):
        cache = decoding_cache(model, beams, {})
        output = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **cache)
    grown = peak_resident_bytes() - before
    assert output.shape[1] == source + offset + 2, output.shape  # every beam ran to the limit
    estimate = beam_search_bytes(model.config, batch_size=batch, beams=beams, source_length=source,
                                 output_length=output.shape[1])
    print(grown, estimate, flush=True)


sys.path.insert(0, sys.argv[5])
from conftest import tiny_model

from hf_vanilla_transformer import paper_generation_config
from hf_vanilla_transformer.inference.decoding_memory import beam_search_bytes
from hf_vanilla_transformer.inference.translation import decoding_cache, decoding_context

torch.set_num_threads(1)
vocab, batch, source, offset = map(int, sys.argv[1:5])
model = tiny_model(vocab_size=vocab, d_model=64, N=2, h=4, d_ff=128, max_position_embeddings=512,
                   output_bias=True, eos_token_id=2, pad_token_id=1, bos_token_id=0, decoder_start_token_id=0)
with torch.no_grad():
    model.final_logits_bias[0, 2] = -1e4
ids = torch.randint(3, vocab, (batch, source))
warm_up()
for beams in map(int, sys.argv[6:]):
    child = os.fork()
    if child == 0:
        try:
            measure(beams)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(child, 0)
    if status != 0:
        sys.exit(f"decoding with a beam of {beams} failed")
"""


def measured_and_estimated(tmp_path: Path, *sizes: int, beams: tuple[int, int]) -> list[tuple[int, int]]:
    """For each of `beams`, the growth of peak resident memory decoding with that beam caused and its
    estimate, for a model and batch of `sizes` (vocabulary, batch, source length, output limit offset)."""
    script = tmp_path / "measure.py"
    script.write_text(MEASURE)
    # glibc serves an allocation over its mmap threshold with a mapping of its own, which it unmaps when
    # the allocation is freed; below it, from the heap, which keeps what is freed. The threshold starts at
    # 128 KiB and rises with every mapped block freed, up to 32 MiB: the tensors of the decodes the
    # estimate guards (gigabytes) are all mapped, while those of these test-sized decodes (tens of MiB)
    # would come more and more from the heap, whose freed blocks hold the peak up. A threshold set
    # here does not rise, so these decodes map their tensors as the large ones do, and the peak they
    # reach grows with the beam as theirs does (measured: the same ratios of growth to estimate at the
    # test's sizes and at four times them).
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": str(128 * 2**10)}
    arguments = [*map(str, sizes), str(REPO_ROOT / "tests"), *map(str, beams)]
    result = subprocess.run(
        [sys.executable, str(script), *arguments], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return [tuple(map(int, line.split())) for line in result.stdout.splitlines()]


@pytest.mark.parametrize(
    "sizes, beams",
    [
        ((8000, 1, 10, 4), (500, 1000)),  # the step's scores over the vocabulary dominate
        ((200, 16, 40, 40), (25, 50)),  # the key and value cache dominates
    ],
)
def test_the_estimate_follows_the_memory_decoding_takes(tmp_path: Path, sizes: tuple, beams: tuple) -> None:
    """What the estimate adds from one beam to a beam twice as wide is what the process's peak resident
    memory adds, within a quarter: the memory that does not grow with the beam (the libraries' first use
    of their kernels) cancels out.

    Each case adds over 100 MiB, far above the allocator's noise (with its mmap threshold fixed, as
    `measured_and_estimated` explains), and one term of the estimate makes nearly all of it, so that a
    wrong count of that term's copies moves the ratio out of bounds. Where
    the cache dominates, the batch is wide and the output short (80 tokens over 40 source tokens): the
    cache's bytes grow with rows x length but its step-by-step concatenation costs rows x length
    squared, so a short output keeps the measured quantity and decodes in a fraction of the time.
    (Measured: the step's scores make the first case's ratio about 1.15, the cache the second's about
    0.85, at these sizes as at four times them.)"""
    if not Path("/proc/self/status").exists():
        pytest.skip("reads the peak resident memory from /proc/self/status (Linux)")
    (grown_small, estimate_small), (grown_large, estimate_large) = measured_and_estimated(
        tmp_path, *sizes, beams=beams
    )
    assert estimate_large - estimate_small > 100 * 2**20
    ratio = (grown_large - grown_small) / (estimate_large - estimate_small)
    assert 0.75 < ratio < 1.25, (grown_small, grown_large, estimate_small, estimate_large)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("model")
    tokenizer = train_shared_bpe_tokenizer(SENTENCES * 5, vocab_size=64, min_frequency=1, show_progress=False)
    ids = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id}
    ids |= {"bos_token_id": tokenizer.bos_token_id, "decoder_start_token_id": tokenizer.bos_token_id}
    model = tiny_model(vocab_size=64, **ids)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def refusal(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one-line error `vanilla-transformer ARGV` ends with, exit status 2."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    error = capsys.readouterr().err
    last = error.strip().splitlines()[-1]  # after the model's loading progress bars
    assert exited.value.code == 2 and "Traceback" not in error and last.startswith("vanilla-transformer"), (
        error
    )
    return last


def test_a_beam_wider_than_the_vocabulary_is_refused(model_dir, tmp_path, capsys) -> None:
    source = tmp_path / "source.txt"
    source.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    argv = ["translate", "--model", str(model_dir), "--input", str(source), "--num-beams"]
    error = refusal(capsys, [*argv, "100000"])
    assert "num_beams 100000 is more than the model's 64 target tokens" in error
    assert main(["translate", "--model", str(model_dir), "--input", str(source), "--num-beams", "64"]) is None


def test_a_batch_the_machine_cannot_hold_is_refused(model_dir, tmp_path, capsys) -> None:
    """An output limit of a billion tokens needs far more memory than any machine has."""
    source = tmp_path / "source.txt"
    source.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    error = refusal(
        capsys,
        ["translate", "--model", str(model_dir), "--input", str(source), "--max-length-offset", "1000000000"],
    )
    assert re.search(
        r"with a beam of \d+ would need about [\d.]+ GiB, and cpu has [\d.]+ GiB to spare", error
    )


def test_the_batch_size_a_refusal_names_fits(model_dir, tmp_path, capsys, monkeypatch) -> None:
    """On a machine with little free memory (here 8 MiB), the refusal names the largest batch that fits,
    and that batch translates."""
    monkeypatch.setattr(decoding_memory, "free_memory_bytes", lambda device: 8 * 2**20)
    source = tmp_path / "source.txt"
    source.write_text("\n".join(SENTENCES * 10) + "\n", encoding="utf-8")
    argv = ["translate", "--model", str(model_dir), "--input", str(source), "--num-beams", "32"]
    error = refusal(capsys, [*argv, "--batch-size", "40"])
    fitting = int(re.search(r"lower the batch size to (\d+) sentences", error)[1])
    assert 1 <= fitting < 40
    assert main([*argv, "--batch-size", str(fitting)]) is None
    assert len(capsys.readouterr().out.splitlines()) == 40
    refusal(capsys, [*argv, "--batch-size", str(fitting + 1)])


def test_the_gpus_free_memory_is_what_cuda_reports() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    free, _ = torch.cuda.mem_get_info()
    assert abs(decoding_memory.free_memory_bytes("cuda") - free) < 64 * 2**20
