"""What every benchmark records about the machine it ran on, beside its figures, and how much memory a step took."""

from __future__ import annotations

import ctypes
import os
import platform
import threading
import time
from pathlib import Path
from typing import Any

import torch


def machine(**extra: Any) -> dict[str, Any]:
    """Platform, CPU, Python and torch versions, and the GPU when there is one; `extra` adds fields."""
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        **extra,
    }


class PeakMemory:
    """The most memory a block added above what was in use when it began, in MiB.

    On CUDA, the caching allocator's peak. On the CPU there is no allocator counter, so a thread
    reads the process's resident size every 2 ms, and glibc is told to map every allocation of
    64 KiB or more on its own (`mallopt(M_MMAP_THRESHOLD)`): without that, its threshold rises
    after large frees to 32 MiB, memory freed by one step is kept and reused by the next, and a
    step's working set no longer shows in the resident size (the second side measured 0).
    """

    def __init__(self, device: str) -> None:
        self.device, self.peak_mib = device, 0.0
        self._running = False
        if not device.startswith("cuda"):
            _map_large_allocations()

    def __enter__(self) -> PeakMemory:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._start = torch.cuda.memory_allocated()
            return self
        self._start, self._peak, self._running = _resident_bytes(), 0, True
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        return self

    def _sample(self) -> None:
        while self._running:
            self._peak = max(self._peak, _resident_bytes())
            time.sleep(0.002)

    def __exit__(self, *_exc: object) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            self.peak_mib = (torch.cuda.max_memory_allocated() - self._start) / 2**20
            return
        self._running = False
        self._sampler.join()
        self.peak_mib = max(0, max(self._peak, _resident_bytes()) - self._start) / 2**20


def _resident_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _map_large_allocations() -> None:
    """glibc: allocations of 64 KiB and more are mapped, and unmapped when freed (a fixed threshold)."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 64 * 1024)
    except OSError:  # not glibc: the resident size still shows what a step adds beyond what was freed
        pass


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
