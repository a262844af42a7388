"""The precision and kernel choices made from the CPU's feature flags (`hardware`), on each CPU kind users
train on, with the flags faked as `/proc/cpuinfo` lists them, and on this machine against torch's own
CPUID probes."""

from dataclasses import replace

import pytest
import torch

from hf_vanilla_transformer.common import cpu_speedups, hardware
from hf_vanilla_transformer.common.hardware import CPUFeatures
from hf_vanilla_transformer.training import trainer
from hf_vanilla_transformer.training.presets import TRAINING_PRESETS
from hf_vanilla_transformer.training.settings import TrainingSettings

BASE_FLAGS = "fpu vme sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma"


def cpuinfo(vendor: str, flags: str, family: int = 6, processors: int = 2) -> str:
    """The text of /proc/cpuinfo for a machine of `processors` identical logical CPUs."""
    return "\n".join(
        f"processor\t: {n}\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel name\t: test\n"
        f"flags\t\t: {BASE_FLAGS} {flags}\n"
        for n in range(processors)
    )


AMD, INTEL = "AuthenticAMD", "GenuineIntel"
SHIPPED_MINIMA, ZEN5_MINIMA = (3072, 2**18), (1024, 0)
# (name, vendor, family, the flags that matter, kind, native bf16, oneDNN float32 linear and its minima)
CPU_KINDS = [
    ("AMD Zen 2", AMD, 23, "avx2", "avx2", False, SHIPPED_MINIMA),
    ("AMD Zen 3", AMD, 25, "avx2", "avx2", False, SHIPPED_MINIMA),
    ("Intel Skylake-SP / Cascade Lake", INTEL, 6, "avx2 avx512f avx512bw avx512_vnni", "avx512", False, None),
    ("Intel Ice Lake", INTEL, 6, "avx2 avx512f avx512_vnni avx512_vbmi2", "avx512", False, None),
    ("AMD Zen 4", AMD, 25, "avx2 avx512f avx512_vnni avx512_bf16", "avx512_bf16", True, SHIPPED_MINIMA),
    ("AMD Zen 5", AMD, 26, "avx2 avx512f avx512_vnni avx512_bf16", "avx512_bf16", True, ZEN5_MINIMA),
    ("Intel Cooper Lake", INTEL, 6, "avx2 avx512f avx512_bf16", "avx512_bf16", True, None),
    (
        "Intel Sapphire Rapids",
        INTEL,
        6,
        "avx2 avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8",
        "amx",
        True,
        None,
    ),
]
KIND_FIELDS = ("name", "vendor", "family", "flags", "kind", "native_bf16", "onednn")


@pytest.mark.parametrize(KIND_FIELDS, CPU_KINDS)
def test_each_cpu_kind_is_read_from_its_flags(name, vendor, family, flags, kind, native_bf16, onednn):
    features = CPUFeatures.parse(cpuinfo(vendor, flags, family))
    assert (features.kind, features.family) == (kind, family), name
    assert features.native_bf16 is native_bf16, name
    pays = cpu_speedups.onednn_float32_linear_pays(features)
    assert pays is (onednn is not None and cpu_speedups._X86_ONEDNN), name
    if onednn is not None:
        assert cpu_speedups.onednn_float32_minima(features) == onednn, name


@pytest.mark.parametrize(KIND_FIELDS, CPU_KINDS)
def test_a_preset_trains_in_bf16_only_where_the_cpu_computes_it(
    monkeypatch, tmp_path, name, vendor, family, flags, kind, native_bf16, onednn
):
    """The `cpu` preset asks for bf16; a CPU without AVX-512 BF16 or AMX trains in float32 even though
    oneDNN says it supports bf16 there (by emulation), and the log says why."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    for module in (hardware, trainer):
        monkeypatch.setattr(module, "cpu_features", lambda: CPUFeatures.parse(cpuinfo(vendor, flags, family)))
    recipe, run = TRAINING_PRESETS["cpu"], TrainingSettings(output_dir=tmp_path)
    assert recipe.bf16
    precision = trainer.mixed_precision(run, recipe)
    assert precision == ("bf16" if native_bf16 else "no"), name
    words = trainer.precision_words(precision, recipe)
    assert words == "bf16" if native_bf16 else words == f"float32 (this {kind} CPU computes no bf16 natively)"
    # An explicit choice wins on every kind.
    assert trainer.mixed_precision(replace(run, bf16=True), recipe) == "bf16"
    assert trainer.mixed_precision(replace(run, bf16=False), recipe) == "no"


def test_only_the_first_processor_is_read():
    """Logical CPUs repeat the same block; a later block's fields never overwrite the first's."""
    text = (
        cpuinfo("GenuineIntel", "avx2 avx512f")
        + "\n\nprocessor\t: 9\nvendor_id\t: Other\nflags\t\t: amx_bf16\n"
    )
    features = CPUFeatures.parse(text)
    assert features.vendor == "GenuineIntel" and features.kind == "avx512"


def test_cpus_that_differ_in_any_flag_have_different_fingerprints():
    """Code built with `-march=native` may use every flag the CPU has: one more or one less is another CPU."""
    zen4 = CPUFeatures.parse(cpuinfo(AMD, "avx2 avx512f avx512_bf16", family=25))
    assert (
        CPUFeatures.parse(cpuinfo(AMD, "avx512_bf16 avx512f avx2", family=25)).fingerprint == zen4.fingerprint
    )
    others = [
        CPUFeatures.parse(cpuinfo(AMD, "avx2 avx512f avx512_bf16 avx512_fp16", family=25)),
        CPUFeatures.parse(cpuinfo(AMD, "avx2 avx512f", family=25)),
        CPUFeatures.parse(cpuinfo(AMD, "avx2 avx512f avx512_bf16", family=26)),
        CPUFeatures.parse(cpuinfo(INTEL, "avx2 avx512f avx512_bf16", family=25)),
    ]
    assert len({zen4.fingerprint, *(other.fingerprint for other in others)}) == 5
    assert zen4.fingerprint.startswith("avx512_bf16-")


def test_a_cpu_without_avx2_is_another_kind():
    assert CPUFeatures.parse(cpuinfo(INTEL, "")).kind == "other"
    assert CPUFeatures.parse("").kind == "other" and not CPUFeatures.parse("").native_bf16


@pytest.mark.skipif(not hardware.CPUINFO.is_file(), reason="needs /proc/cpuinfo (Linux)")
def test_this_machines_flags_agree_with_torchs_cpuid_probes():
    """Two independent readings of this CPU: the kernel's flag list and torch's own CPUID probes."""
    listed, probed = hardware.cpu_features(), CPUFeatures.from_torch_probes()
    if not cpu_speedups._X86_ONEDNN:
        pytest.skip("the probes are x86 CPUID")
    assert listed.kind == probed.kind
    assert listed.native_bf16 is probed.native_bf16 is hardware.bf16_is_native("cpu")


def test_gpu_precision_follows_the_gpu(monkeypatch):
    """On a GPU: bf16 where it computes bf16 natively (Ampere and newer), not where it emulates it."""
    seen = []

    def is_bf16_supported(including_emulation: bool = True) -> bool:
        seen.append(including_emulation)
        return False

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    assert hardware.bf16_is_native("cuda") is False and seen == [False]
