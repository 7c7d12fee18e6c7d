"""What every benchmark records about the machine it ran on, beside its figures."""

from __future__ import annotations

import os
import platform
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
