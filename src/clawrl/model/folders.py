"""Folders built once and shared by every process of a host (the tiny models, converted weights)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def build_once(target: Path, write: Callable[[Path], object]) -> Path:
    """`target`, written first by `write(staging)` when it is missing.

    The folder is written beside `target` and renamed into place, so a reader never sees half of
    it; when several processes build at once, the first rename wins and the others discard their copy.
    """
    target = Path(target)
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        write(staging)
        staging.chmod(0o755)  # mkdtemp makes it owner-only; a shared folder should read like any other
        os.rename(staging, target)
    except OSError:
        # renaming onto an existing, non-empty folder fails: another process won the race
        if not target.is_dir():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
