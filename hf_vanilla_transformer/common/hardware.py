"""What the processor computes natively, for the choices that depend on it.

A choice of precision or kernel is made from what the hardware computes, not from what a library can
emulate: oneDNN reports bf16 as supported on every AVX-512 CPU (`torch.ops.mkldnn._is_mkldnn_bf16_supported`),
but without AVX-512 BF16 or AMX it emulates the products, and on a Xeon Cascade Lake a bf16 product of
1024 x 256 by 256 x 1024 took 2.2 times its float32 time. So the CPU's own feature flags decide:

| CPU kind | examples | flags | bf16 autocast |
|---|---|---|---|
| `avx2` | AMD Zen 2, Zen 3 | avx2, no avx512f | no |
| `avx512` | Intel Skylake-SP, Cascade Lake, Ice Lake | avx512f, no avx512_bf16 | no |
| `avx512_bf16` | AMD Zen 4, Zen 5; Intel Cooper Lake | avx512_bf16 | yes |
| `amx` | Intel Sapphire Rapids and later | amx_bf16 | yes |

On Linux the flags are read from `/proc/cpuinfo`, as `lscpu` shows them (a virtual machine lists what its
hypervisor passes through); elsewhere from the CPUID probes torch ships (`torch.cpu`). On a GPU, bf16 where
it is native (Ampere and newer), else fp16 with loss scaling (V100, T4).

This module is copied next to saved weights for `trust_remote_code=True` users (`cpu_speedups` imports
it), so it imports nothing from the package.
"""

import functools
import hashlib
import platform
from dataclasses import dataclass
from pathlib import Path

import torch

CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class CPUFeatures:
    """A CPU's vendor, family number and feature flags, in `/proc/cpuinfo`'s names (`avx512_bf16`,
    `amx_bf16`, ...). AMD's families: 23 Zen 2, 25 Zen 3 and Zen 4, 26 Zen 5."""

    vendor: str
    flags: frozenset[str]
    family: int = 0

    @classmethod
    def parse(cls, cpuinfo: str) -> "CPUFeatures":
        """The features of the first processor listed in the text of `/proc/cpuinfo`."""
        fields: dict[str, str] = {}
        for line in cpuinfo.splitlines():
            if not line.strip() and fields:
                break  # the first processor's block ends; the others repeat it
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
        family = fields.get("cpu family", "")
        return cls(
            fields.get("vendor_id", ""),
            frozenset(fields.get("flags", "").split()),
            int(family) if family.isdigit() else 0,
        )

    @classmethod
    def from_torch_probes(cls) -> "CPUFeatures":
        """The features that torch's CPUID probes report, for systems without `/proc/cpuinfo`."""
        probes = {
            "avx2": torch.cpu._is_avx2_supported,
            "avx512f": torch.cpu._is_avx512_supported,
            "avx512_bf16": torch.cpu._is_avx512_bf16_supported,
            "amx_bf16": torch.cpu._is_amx_tile_supported,
        }
        return cls("", frozenset(flag for flag, probe in probes.items() if probe()))

    @property
    def kind(self) -> str:
        """One of `amx`, `avx512_bf16`, `avx512`, `avx2`, `other` (the table in the module docstring)."""
        if "amx_bf16" in self.flags:
            return "amx"
        if "avx512_bf16" in self.flags:
            return "avx512_bf16"
        if "avx512f" in self.flags:
            return "avx512"
        return "avx2" if "avx2" in self.flags else "other"

    @property
    def native_bf16(self) -> bool:
        """Whether bf16 matrix products run in hardware (AVX-512 BF16 or AMX), not emulated."""
        return self.kind in ("amx", "avx512_bf16")

    @property
    def is_amd(self) -> bool:
        return self.vendor == "AuthenticAMD"

    @property
    def fingerprint(self) -> str:
        """A name for the instruction sets code built for this CPU may use (`-march=native`): its kind and a
        hash of its vendor, family and flags. CPUs that differ in any flag get different names."""
        described = " ".join([self.vendor, str(self.family), *sorted(self.flags)])
        return f"{self.kind}-{hashlib.sha256(described.encode()).hexdigest()[:12]}"


@functools.cache
def cpu_features() -> CPUFeatures:
    """This machine's CPU features, read once."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return CPUFeatures("", frozenset())
    try:
        return CPUFeatures.parse(CPUINFO.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return CPUFeatures.from_torch_probes()


def bf16_is_native(device: torch.device | str | None = None) -> bool:
    """Whether bf16 matrix products run natively on `device` (the default: the GPU if there is one)."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    return device.type == "cpu" and cpu_features().native_bf16
