"""CTranslate2 on the GPU: `translate --device cuda --compute-type ...` and `load_translator(device=...)`.

Without a CUDA device CTranslate2 can see (every CPU-only machine, CI's too), `--device cuda` and compute
types the CPU lacks are refused in one line with exit status 2; where it sees one, float16 and int8_float16
on the GPU translate as float32 on the CPU does, nearly always.
"""

import ctypes
from pathlib import Path

import pytest
from conftest import tiny_model
from test_export import SENTENCES, SPECIALS, train_reverse_model

from hf_vanilla_transformer import paper_generation_config
from hf_vanilla_transformer.commands import PROG, main
from hf_vanilla_transformer.conversion import tokenizer_from_fairseq_dictionary
from hf_vanilla_transformer.inference.engines.ctranslate2 import check_ctranslate2_device
from hf_vanilla_transformer.inference.engines.exporting import export
from hf_vanilla_transformer.inference.engines.names import CTRANSLATE2_COMPUTE_TYPES
from hf_vanilla_transformer.inference.translator import load_model, load_translator

ctranslate2 = pytest.importorskip("ctranslate2", reason="not installed (pip install -e '.[export]')")

CUDA_DEVICES = ctranslate2.get_cuda_device_count()
needs_no_cuda = pytest.mark.skipif(CUDA_DEVICES > 0, reason="CTranslate2 finds a CUDA device here")
needs_cuda = pytest.mark.skipif(CUDA_DEVICES == 0, reason="CTranslate2 finds no CUDA device here")
CPU_TYPES = ctranslate2.get_supported_compute_types("cpu")
# The GPU's compute types that this CPU lacks (all of them, on the CPUs CTranslate2's wheels are built for).
GPU_ONLY_TYPES = [kind for kind in ("float16", "int8_float16", "bfloat16") if kind not in CPU_TYPES]
SOURCE = "t5 t9 t13\n\nt7 t3 t21 t8\n"
MISSING_CUBLAS = "Library libcublas.so.12 is not found or cannot be loaded"


def cublas_12_loads() -> bool:
    """Whether CUDA 12's cuBLAS, which CTranslate2's PyPI wheels load at their first GPU product, is here."""
    try:
        ctypes.CDLL("libcublas.so.12")
    except OSError:
        return False
    return True


@pytest.fixture(scope="module")
def ct2_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random model with the paper's decoding settings, exported for CTranslate2 in float32."""
    folder = tmp_path_factory.mktemp("ct2-device")
    model = tiny_model(seed=4)
    model.generation_config = paper_generation_config(model.config)
    model.save_pretrained(folder / "model")
    words = [f"t{i}" for i in range(model.config.vocab_size - len(SPECIALS))]
    tokenizer_from_fairseq_dictionary(SPECIALS + words).save_pretrained(folder / "model")
    return export(folder / "model", "ctranslate2", folder / "ct2")


@pytest.fixture
def source(tmp_path: Path) -> Path:
    (tmp_path / "source.txt").write_text(SOURCE, encoding="utf-8")
    return tmp_path / "source.txt"


def _one_line_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The one line that `vanilla-transformer ARGV` refuses with, exit status 2, after the progress bar
    where the refusal comes from the first batch."""
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "Traceback" not in error, error
    line = error.strip().splitlines()[-1]
    prefix = f"{PROG} translate: error: "
    assert prefix in line, error
    return line[line.index(prefix) :]


@needs_no_cuda
def test_device_cuda_without_a_cuda_device_is_refused_in_one_line(
    ct2_export: Path, source: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Through `main`, with what reaches the file descriptors captured (CTranslate2's own messages too):
    exit status 2, one line on stderr that names the problem and the fix, nothing on stdout."""
    with pytest.raises(SystemExit) as exit_info:
        main(["translate", "--model", str(ct2_export), "--device", "cuda", "--input", str(source)])
    output = capfd.readouterr()
    assert exit_info.value.code == 2, output.err
    (line,) = output.err.splitlines()
    version = ctranslate2.__version__
    assert line.startswith(f"{PROG} translate: error: CTranslate2 {version} finds no CUDA device here"), line
    assert "decode on the CPU (device cpu)" in line, line
    assert not output.out


@needs_no_cuda
def test_the_python_api_refuses_cuda_without_a_cuda_device(ct2_export: Path) -> None:
    with pytest.raises(ValueError, match="finds no CUDA device here"):
        load_translator(ct2_export, device="cuda", compute_type="float16")


@pytest.mark.skipif(not GPU_ONLY_TYPES, reason="this CPU computes in every GPU type")
@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_a_compute_type_the_cpu_lacks_is_refused_in_one_line(
    ct2_export: Path, source: Path, capsys: pytest.CaptureFixture[str], device: str
) -> None:
    """auto keeps an export on the CPU; there float16 and int8_float16 are refused, not quietly computed
    in float32, with the types the CPU has and the way to the GPU."""
    for compute_type in GPU_ONLY_TYPES:
        error = _one_line_error(
            capsys, "translate", "--model", str(ct2_export), "--input", str(source), "--device", device,
            "--compute-type", compute_type,
        )  # fmt: skip
        assert f"cannot compute in {compute_type} on the cpu here" in error
        assert all(kind in error for kind in CPU_TYPES) and "device cuda" in error
    with pytest.raises(ValueError, match=f"cannot compute in {GPU_ONLY_TYPES[0]} on the cpu"):
        check_ctranslate2_device("cpu", GPU_ONLY_TYPES[0])


def test_devices_and_flags_an_engine_cannot_use_are_refused(
    ct2_export: Path, source: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # A folder that is not an export translates with the PyTorch model, which has no compute types.
    error = _one_line_error(capsys, "translate", "--model", str(tmp_path), "--compute-type", "int8")
    assert "--compute-type sets CTranslate2's compute type, and the torch engine translates here" in error
    error = _one_line_error(capsys, "translate", "--model", str(ct2_export), "--int8", "--input", str(source))
    assert "--compute-type int8 (CPU) or int8_float16 (GPU)" in error
    with pytest.raises(ValueError, match="CTranslate2 decodes on cpu or cuda, not 'cuda:1'"):
        check_ctranslate2_device("cuda:1")
    with pytest.raises(ValueError, match="The ONNX engine decodes on the CPU here, not on cuda"):
        load_model(tmp_path, "onnx", device="cuda")


def test_the_cpus_compute_types_translate_every_line(
    ct2_export: Path, source: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`default` and `auto` always load; so does every type the CPU has, int8 among them."""
    for compute_type in ("default", "auto", *sorted(set(CPU_TYPES) & set(CTRANSLATE2_COMPUTE_TYPES))):
        output = tmp_path / f"{compute_type}.hyp"
        main(["translate", "--model", str(ct2_export), "--input", str(source), "--output", str(output)]
             + ["--compute-type", compute_type])  # fmt: skip
        lines = output.read_text(encoding="utf-8").split("\n")
        assert len(lines) == 4 and lines[0] and not lines[1] and lines[2], (compute_type, lines)


def test_a_gpu_without_cuda_12s_cublas_is_refused_in_one_line(
    ct2_export: Path, source: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """CTranslate2's PyPI wheels load libcublas.so.12 at the first product, which a machine with CUDA 13's
    libraries alone lacks: the first batch is refused in one line with the package that brings it."""

    class TranslatorWithoutCublas(ctranslate2.Translator):
        def translate_batch(self, *args, **kwargs):
            raise RuntimeError(MISSING_CUBLAS)

    monkeypatch.setattr(ctranslate2, "Translator", TranslatorWithoutCublas)
    error = _one_line_error(capsys, "translate", "--model", str(ct2_export), "--input", str(source))
    assert f"CTranslate2 cannot decode on the GPU here ({MISSING_CUBLAS})" in error
    assert "pip install nvidia-cublas-cu12" in error and "LD_LIBRARY_PATH" in error


@pytest.mark.skipif(not cublas_12_loads(), reason="CUDA 12's cuBLAS (libcublas.so.12) is not installed")
@needs_cuda
@pytest.mark.slow
def test_float16_and_int8_float16_on_the_gpu_translate_as_float32_on_the_cpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A model trained to reverse word sequences (tests/test_export.py), whose outputs vary as a real
    model's do: the GPU's float32 gives the CPU's translations, float16 and int8_float16 nearly all of
    them (on an H100 with driver 580: 24 and 21 of 24); the command gives the Python API's."""
    folder = export(train_reverse_model(tmp_path / "model", "paper"), "ctranslate2", tmp_path / "ct2")
    expected = load_translator(folder).translate(SENTENCES)
    assert len(set(expected)) > len(SENTENCES) // 2
    for compute_type, least in (("float32", 1.0), ("float16", 0.9), ("int8_float16", 0.75)):
        translator = load_translator(folder, device="cuda", compute_type=compute_type)
        assert translator.model.translator.device == "cuda"
        assert translator.model.translator.compute_type == compute_type
        outputs = translator.translate(SENTENCES)
        assert all(text.strip() or not source for text, source in zip(outputs, SENTENCES)), compute_type
        same = sum(a == b for a, b in zip(outputs, expected))
        print(f"{compute_type} on the GPU: {same} of {len(SENTENCES)} as float32 on the CPU")
        assert same >= least * len(SENTENCES), (compute_type, same)
    (tmp_path / "source.txt").write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    main(["translate", "--model", str(folder), "--input", str(tmp_path / "source.txt"), "--output",
          str(tmp_path / "gpu.hyp"), "--device", "cuda", "--compute-type", "int8_float16"])  # fmt: skip
    assert (tmp_path / "gpu.hyp").read_text(encoding="utf-8").split("\n")[:-1] == outputs
