"""A policy version through Ray's object store: read and checked once, copied onto each replica's node.

Under `--placement ray --weights-transfer object-store` (the default) the replicas' nodes need no
disk in common with the server. The server reads a version's directory once (`VersionShipper`),
checking every weights file against the version's manifest as it reads it, and puts the files into
Ray's object store in pieces of at most `--weights-bucket-mib` (a LoRA adapter is a few small
pieces, a full model many), so that neither the server nor an actor ever holds more than one piece
of a file in memory and no object is huge. The replicas that load the version at once (the router
loads it on all side by side) share that one shipment. Each actor (`LocalCopies`) writes the
pieces into a directory of its own on its node, checks the copy against the manifest again (what
the object store handed over must be what was read), and loads that copy through its engine's
ordinary `load_version`; a copy is removed once its engine no longer holds the version.

Why pieces of files rather than tensors: the copy is then the version's own files, byte for byte,
so the engine (hf or vLLM) loads it exactly as it would load the directory the trainer wrote, and
the manifest's digests check it. A version that fails a check is refused before any actor sees it
(`ChecksumError`): the follower then keeps serving the version it has.

The shipment lives while a load uses it: the server's references to its pieces are dropped when
the last replica's load of it ends, and Ray frees them then. A replica that loads the version later
(a rollback, a retry) gets a new shipment, read and checked again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray

from clawrl.versions.files import MANIFEST, ChecksumError, Manifest, verified_blocks, verify_version

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Shipment:
    """One version in the object store: what an actor needs to write its own copy of it."""

    version: int
    manifest: bytes  # manifest.json as read (small: it travels inside the call)
    manifest_sha256: str
    files: list[tuple[str, list[Any]]]  # each weights file with the ObjectRefs of its pieces, in order
    size: int  # bytes in the object store

    @property
    def pieces(self) -> int:
        return sum(len(refs) for _, refs in self.files)


@dataclass
class _Shared:
    """A shipment being made or made, and how many loads are using it."""

    task: asyncio.Future[Shipment]
    users: int = 0


class VersionShipper:
    """The server's side, one for all replicas: a version read, checked and put once per load."""

    def __init__(self, bucket_mib: float) -> None:
        self.bucket_bytes = max(1, int(bucket_mib * (1 << 20)))
        self._shared: dict[tuple[int, str], _Shared] = {}

    @asynccontextmanager
    async def shipment(self, version: int, path: Path) -> AsyncIterator[Shipment]:
        """The version's shipment while the caller loads it: made by the first caller (in a thread:
        reading a model takes seconds), shared with those that ask while it is in use, forgotten
        when the last of them is done. ChecksumError (or OSError) for a version that fails its check."""
        key = (version, str(path))
        shared = self._shared.get(key)
        if shared is None:
            shared = self._shared[key] = _Shared(asyncio.ensure_future(asyncio.to_thread(self.ship, version, Path(path))))
        shared.users += 1
        try:
            yield await asyncio.shield(shared.task)  # one caller cancelled leaves the others theirs
        finally:
            shared.users -= 1
            if shared.users == 0 and self._shared.get(key) is shared:
                del self._shared[key]

    def ship(self, version: int, path: Path) -> Shipment:
        """Read the version directory once and put its weights files into the object store, each
        checked against the manifest as it is read; ChecksumError (nothing kept) when one is not
        as the manifest says, or the manifest is not this version's."""
        started = time.monotonic()
        try:
            body = (path / MANIFEST).read_bytes()
            manifest = Manifest(**json.loads(body))
        except (OSError, ValueError, TypeError) as error:
            raise ChecksumError(f"{path} has no readable {MANIFEST}: {error}") from None
        if manifest.version != version:
            raise ChecksumError(f"{path / MANIFEST} is version {manifest.version}'s, not version {version}'s")
        files: list[tuple[str, list[Any]]] = []
        size = 0
        for name, sha256 in sorted(manifest.weights.items()):
            if Path(name).name != name or name in ("", ".", "..", MANIFEST):
                raise ChecksumError(f"{path / MANIFEST} names {name!r}, which is not a file of the version")
            refs = []
            for block in verified_blocks(path / name, sha256, self.bucket_bytes):
                refs.append(ray.put(np.frombuffer(block, dtype=np.uint8)))  # an array: an actor reads it in place
                size += len(block)
            files.append((name, refs))
        shipment = Shipment(version, body, hashlib.sha256(body).hexdigest(), files, size)
        log.info("policy v%d in the object store: %d files, %.1f MiB in %d pieces, %.2f s", version, len(files),
                 size / (1 << 20), shipment.pieces, time.monotonic() - started)  # fmt: skip
        return shipment


class LocalCopies:
    """The actor's side: versions written from their shipments into a directory of this actor's
    own (a temporary directory on its node), checked, and removed when the engine lets them go."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="clawrl-replica-"))
        self.dirs: dict[int, Path] = {}

    async def materialize(self, shipment: Shipment) -> Path:
        """The version's directory on this node, written piece by piece and checked against its
        manifest; ChecksumError (the partial copy removed) when it does not match."""
        held = self.dirs.get(shipment.version)
        if held is not None:  # loaded before and still held (a rollback to it): that copy serves
            return held
        directory = self.root / f"v{shipment.version}"
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir()
        try:
            await asyncio.to_thread((directory / MANIFEST).write_bytes, shipment.manifest)
            for name, refs in shipment.files:
                with (directory / name).open("wb") as handle:
                    for ref in refs:  # one piece in memory at a time (read in place from the node's store)
                        await asyncio.to_thread(handle.write, await ref)
            await asyncio.to_thread(verify_version, directory, shipment.manifest_sha256)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        self.dirs[shipment.version] = directory
        return directory

    def keep_only(self, held: Collection[int]) -> None:
        """Remove the copies of versions the engine no longer holds."""
        for version in [version for version in self.dirs if version not in held]:
            shutil.rmtree(self.dirs.pop(version), ignore_errors=True)

    def remove_all(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self.dirs.clear()
