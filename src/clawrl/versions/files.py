"""Policy version directories: RUN_DIR/policy/LINEAGE/vN/, written atomically, verified before use.

A version directory holds the weights serving loads (a PEFT LoRA adapter, or a full model, as
safetensors), the trainer's state to resume from (`trainer_state.pt`: optimizer, RNG, step) and
`manifest.json`: parent version, step, the turn ids of the samples it was trained on, the step's
metrics, and the sha256 of every other file. The store keeps the sha256 of the manifest itself, so
one digest in the store pins every byte of the version.

Writing goes to a temporary directory that is renamed into place when complete (and fsynced), so
a reader never sees half a version. The rename happens BEFORE the version is registered in the
store; a trainer killed between the two leaves a directory with no row, which
`discard_unregistered` removes on the next start.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from clawrl.types import SHARED_LINEAGE

MANIFEST = "manifest.json"
TRAINER_STATE = "trainer_state.pt"
_VERSION_PREFIX = "v"
_TEMP_PREFIX = ".tmp-"


class ChecksumError(RuntimeError):
    """A version directory does not match the digest registered for it."""


@dataclass
class Manifest:
    version: int
    parent: int
    step: int
    kind: str  # lora | full
    sample_ids: list[str]  # turn ids of the samples this step trained on, in order
    metrics: dict[str, Any]
    created_at: float = field(default_factory=time.time)
    lineage: str = SHARED_LINEAGE  # manifests written before lineages had none: they were the shared one
    weights: dict[str, str] = field(default_factory=dict)  # file name -> sha256: what serving loads
    trainer_state: dict[str, str] = field(default_factory=dict)  # file name -> sha256: what resuming loads


def lineage_root(run_dir: Path, lineage: str) -> Path:
    """`RUN_DIR/policy/<lineage>`; ValueError for a name that is not one plain path component, so that
    no lineage's files (written, verified or discarded) are ever another's or outside `policy/`."""
    if not lineage or lineage in (".", "..") or any(separator in lineage for separator in ("/", "\\", "\0")):
        raise ValueError(f"{lineage!r} is not a lineage name")
    return Path(run_dir) / "policy" / lineage


def version_dir(run_dir: Path, lineage: str, version: int) -> Path:
    return lineage_root(run_dir, lineage) / f"{_VERSION_PREFIX}{version}"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    for block in _blocks(path, 1 << 20):
        digest.update(block)
    return digest.hexdigest()


def verified_blocks(path: Path, sha256: str, block_bytes: int) -> Iterator[bytes]:
    """The file's bytes, `block_bytes` at a time, read once; ChecksumError after the last block
    when they do not match `sha256` (or at once when the file is missing), so that a reader that
    sends the blocks on as it reads them (`engines/ray_weights.py`) drops what it sent on failure."""
    if not Path(path).is_file():
        raise ChecksumError(f"{path} is missing")
    digest = hashlib.sha256()
    for block in _blocks(path, block_bytes):
        digest.update(block)
        yield block
    if digest.hexdigest() != sha256:
        raise ChecksumError(f"{path} does not match its manifest")


def _blocks(path: Path, block_bytes: int) -> Iterator[bytes]:
    with Path(path).open("rb") as handle:
        yield from iter(lambda: handle.read(block_bytes), b"")


def write_version(
    run_dir: Path,
    manifest: Manifest,
    save_weights: Callable[[Path], None],
    save_trainer_state: Callable[[Path], None],
) -> tuple[Path, str]:
    """Write version `manifest.version` and return its directory and the manifest's sha256.

    `save_weights(dir)` writes the weights files into `dir` (e.g. `model.save_pretrained`);
    `save_trainer_state(path)` writes the resume state to `path`.
    """
    root = lineage_root(run_dir, manifest.lineage)
    root.mkdir(parents=True, exist_ok=True)
    temp = root / f"{_TEMP_PREFIX}{_VERSION_PREFIX}{manifest.version}-{uuid.uuid4().hex[:8]}"
    temp.mkdir()
    save_weights(temp)
    manifest.weights = {path.name: file_sha256(path) for path in sorted(temp.iterdir()) if path.is_file()}
    save_trainer_state(temp / TRAINER_STATE)
    manifest.trainer_state = {TRAINER_STATE: file_sha256(temp / TRAINER_STATE)}
    body = json.dumps(asdict(manifest), indent=2, sort_keys=True).encode()
    (temp / MANIFEST).write_bytes(body)
    for path in temp.iterdir():
        _fsync(path)
    _fsync(temp)
    final = version_dir(run_dir, manifest.lineage, manifest.version)
    if final.exists():  # left by a trainer killed before registering it: never registered, never served
        shutil.rmtree(final)
    os.rename(temp, final)
    _fsync(root)
    return final, hashlib.sha256(body).hexdigest()


def verify_version(path: Path, sha256: str, *, trainer_state: bool = False) -> Manifest:
    """The version's manifest, after checking it against `sha256` and its weights (and, when asked,
    its trainer state) against the manifest. Raises ChecksumError on any mismatch."""
    manifest_path = Path(path) / MANIFEST
    if not manifest_path.is_file():
        raise ChecksumError(f"{path} has no {MANIFEST}")
    body = manifest_path.read_bytes()
    if hashlib.sha256(body).hexdigest() != sha256:
        raise ChecksumError(f"{manifest_path} does not match the registered sha256")
    manifest = Manifest(**json.loads(body))
    files = {**manifest.weights, **(manifest.trainer_state if trainer_state else {})}
    for name, expected in files.items():
        target = Path(path) / name
        if not target.is_file() or file_sha256(target) != expected:
            raise ChecksumError(f"{target} is missing or does not match its manifest")
    return manifest


def discard_unregistered(run_dir: Path, lineage: str, registered: set[int]) -> list[Path]:
    """Remove the lineage's temporary directories and the version directories not in `registered`:
    those the store has no row for, and (the trainer passes only the unpruned) those it pruned."""
    root = lineage_root(run_dir, lineage)
    removed = []
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        name = path.name
        number = name[len(_VERSION_PREFIX) :]
        orphan = name.startswith(_TEMP_PREFIX) or (
            name.startswith(_VERSION_PREFIX) and number.isdigit() and int(number) not in registered
        )
        if orphan and path.is_dir():
            shutil.rmtree(path)
            removed.append(path)
    return removed


def _fsync(path: Path) -> None:
    """Flush a file or directory entry to disk, so a registered version survives a power cut."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
