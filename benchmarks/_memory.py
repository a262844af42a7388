"""Peak memory while a block of code runs, sampled by a thread (the kernel keeps no peak for a time span),
or on a GPU read from torch's allocator, which keeps one.

`PeakRSS` measures one process's growth over its own start, as training a step needs, and `CudaPeak` the
same on a GPU (`step_memory` picks the one for a device); `MemoryPeaks` the peaks of a process and of its
children (e.g. `Dataset.map`'s workers), resident and anonymous.
"""

import ctypes
import os
import threading
import time
from typing import Self

import psutil
import torch


class SampledPeaks:
    """Calls `sample()` every `interval` seconds on a thread while the block runs, and once at its end."""

    def __init__(self, interval: float) -> None:
        self.interval = interval

    def sample(self) -> None:
        raise NotImplementedError

    def _sample_until_stopped(self) -> None:
        while not self._stop.is_set():
            self.sample()
            time.sleep(self.interval)

    def __enter__(self) -> Self:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_until_stopped, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


class PeakRSS(SampledPeaks):
    """Peak resident memory of this process while the block runs, relative to the start.

    Both models of a comparison live in one process, so the absolute RSS counts both; the growth during one
    training step (activations, gradients, temporaries) is what differs between them. `malloc_trim` first
    returns freed pages to the OS, so that the baseline is not inflated by the previous model's step.
    """

    def __init__(self, interval: float = 0.002) -> None:
        super().__init__(interval)
        self.peak_delta = 0
        self.start_rss = 0

    @staticmethod
    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def sample(self) -> None:
        self.peak = max(self.peak, self.rss())

    def __enter__(self) -> Self:
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except OSError:
            pass
        self.start_rss = self.peak = self.rss()
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self.peak_delta = self.peak - self.start_rss


class CudaPeak:
    """Peak GPU memory held by tensors while the block runs (`torch.cuda.max_memory_allocated` after
    `reset_peak_memory_stats`): `peak`, everything allocated, the models and optimizer states resident
    before the block included, and `peak_delta`, its growth over the start, as `PeakRSS` measures."""

    def __init__(self) -> None:
        self.peak_delta = 0
        self.peak = 0

    def __enter__(self) -> Self:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self.start = torch.cuda.memory_allocated()
        return self

    def __exit__(self, *exc: object) -> None:
        torch.cuda.synchronize()
        self.peak = torch.cuda.max_memory_allocated()
        self.peak_delta = self.peak - self.start


def step_memory(device: str) -> PeakRSS | CudaPeak:
    """The measure of a training step's memory on `device`: resident growth on a CPU, allocated on a GPU."""
    return PeakRSS() if device == "cpu" else CudaPeak()


def _memory(pid: int) -> tuple[int, int]:
    """Resident and anonymous resident (not backed by a file) memory of a process, in bytes."""
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            fields[name] = value
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["RssAnon"].split()[0]) * 1024


class MemoryPeaks(SampledPeaks):
    """Peak resident and anonymous memory of this process ("main") and of the largest of its children
    ("workers", e.g. map's processes)."""

    def __init__(self, interval: float = 0.05) -> None:
        super().__init__(interval)
        self.rss = {"main": 0, "workers": 0}
        self.anonymous = {"main": 0, "workers": 0}

    def sample(self) -> None:
        main = psutil.Process()
        for process in [main, *main.children(recursive=True)]:
            try:
                rss, anonymous = _memory(process.pid)
            except (OSError, KeyError):  # the process ended while being read
                continue
            role = "main" if process.pid == main.pid else "workers"
            self.rss[role] = max(self.rss[role], rss)
            self.anonymous[role] = max(self.anonymous[role], anonymous)
