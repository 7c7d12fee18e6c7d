"""A replica in a Ray actor: `--placement ray` (DESIGN §10; the issue "Many machines").

With `--placement ray --replicas N`, each replica's engine lives in a Ray actor that Ray places on
a node with the resources asked for (`--replica-cpus`, `--replica-gpus`: one GPU each on a GPU
cluster), and the server keeps the API, the store and the router (`engines/replicas.py`) over
`RayReplica`s, which speak the engine protocol to their actors. Without `RAY_ADDRESS` the server
starts a Ray cluster on this machine; with it, it joins that cluster. Ray is an optional extra
(`pip install 'clawrl[ray]'`): nothing imports it unless the placement asks for it.

What crosses to the actor: token ids and sampling settings in, one `(token id, log-prob, top
log-probs, finish reason)` per token out (a Ray streaming generator), preceded by the version the
actor's engine admitted the request with, which the stream takes before its first token. A
version's weights travel through Ray's object store (`--weights-transfer object-store`, the
default; `engines/ray_weights.py`): the server reads and checks the version once for all replicas,
each actor writes and checks a copy of its own on its node and loads that, so the replicas' nodes
share no disk with the server. With `--weights-transfer shared-path` the actor loads the path the
store records instead, which must then be on a filesystem every replica's node mounts.

An actor that dies marks its replica dead (`died`); the router takes it out and its supervisor
(`engines/replica_restarts.py`) has `restart` start a new actor with the same settings, which the
router catches up with the versions served before it is back in rotation. A call to the old actor
that fails after that concerns the old actor alone: each call remembers the actor it went to.

What it does not do: per-user adapters (`--adapters per-user`) through actors: the actor's engine
evicts adapters on its own, and this side learns of it only at its next load. (The trainer and the
judges run in actors of their own: `cli/ray_trainer.py`, `cli/ray_judges.py`.)
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayError
from transformers import AutoConfig, AutoTokenizer

from clawrl.config import EngineConfig
from clawrl.engines.ray_weights import LocalCopies, Shipment, VersionShipper
from clawrl.engines.base import (
    Engine,
    EngineClosedError,
    GenerationStream,
    LineageNotLoadedError,
    SamplingParams,
    TokenStep,
    validate_sampling,
    validated_token_ids,
)
from clawrl.types import SHARED_LINEAGE, ScoredResponse

EngineFactory = Callable[[EngineConfig, "str | None"], Engine]


def connect_ray() -> None:
    """Join the cluster at RAY_ADDRESS, or start one on this machine; once per process. The actors'
    logs (their engines' warnings) come to this process's stderr."""
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS") or None, include_dashboard=False)


class EngineActor:
    """The actor's side: one engine on its node, driven by `RayReplica`."""

    def __init__(self, make_engine: EngineFactory, config: EngineConfig, model_path: str | None) -> None:
        self.engine = make_engine(config, model_path)
        self.copies: LocalCopies | None = None  # made with the first version that comes through the object store

    async def start(self) -> dict[str, Any]:
        await self.engine.start()
        return {
            "max_context_tokens": self.engine.max_context_tokens,
            "constrained_decoding": self.engine.constrained_decoding,
            "versions": self.versions(),
        }

    def versions(self) -> dict[str, Any]:
        """What the engine holds: the shared lineage's current version, every version held, and
        the directories on this node it loaded them from (those that came through the object store)."""
        copies = {version: str(path) for version, path in self.copies.dirs.items()} if self.copies else {}
        return {"current": {SHARED_LINEAGE: self.engine.policy_version}, "held": self.engine.held_versions(), "copies": copies}

    async def generate(self, prompt_token_ids: list[int], sampling: dict[str, Any], lineage: str) -> AsyncIterator[Any]:
        """The version the request was admitted with, then one tuple per token."""
        stream = self.engine.generate(prompt_token_ids, SamplingParams(**sampling), lineage)
        yield stream.policy_version
        try:
            async for step in stream:
                yield step.token_id, step.logprob, step.top_logprobs, step.finish_reason
        finally:
            stream.cancel()  # the caller hung up (or the stream ended: then it frees nothing)

    async def score(self, prompt: list[int], response: list[int], top_k: int, version: int | None) -> ScoredResponse:
        return await self.engine.score(prompt, response, top_k, version)

    async def load_version(self, version: int, source: str | Shipment, lineage: str) -> dict[str, Any]:
        """Load from a path (the base, or `--weights-transfer shared-path`) or from a shipment, through
        this actor's own checked copy; then drop the copies of versions the engine let go."""
        if isinstance(source, str):
            path = Path(source)
        else:
            self.copies = self.copies or LocalCopies()
            path = await self.copies.materialize(source)
        try:
            await self.engine.load_version(version, path, lineage)
        finally:
            if self.copies is not None:
                self.copies.keep_only(self.engine.held_versions())
        return self.versions()

    async def close(self) -> None:
        await self.engine.close()
        if self.copies is not None:
            self.copies.remove_all()


class RayReplica(Engine):
    """The server's side of one replica actor; see the module docstring."""

    def __init__(self, make_engine: EngineFactory, config: EngineConfig, model_path: str | None = None,
                 shipper: VersionShipper | None = None) -> None:  # fmt: skip
        """`shipper`, one for all replicas, sends versions through the object store; None: by path."""
        source = str(model_path if model_path is not None else config.model)
        self.model_name = config.model
        self.tokenizer = AutoTokenizer.from_pretrained(source)
        self._vocab_size: int = AutoConfig.from_pretrained(source).get_text_config().vocab_size
        self.max_context_tokens = 0  # the actor's engine's, once started
        self._actor_class = ray.remote(EngineActor).options(num_cpus=config.replica_cpus, num_gpus=config.replica_gpus)
        self._actor_args = (make_engine, config, model_path)
        self._actor = self._actor_class.remote(*self._actor_args)
        self._shipper = shipper
        self._versions: dict[str, Any] = {"current": {SHARED_LINEAGE: 0}, "held": [0], "copies": {}}
        self._dead: str | None = None  # why the actor is gone: it died (a RayActorError's name), or "closed"
        self._started = False

    @property
    def actor(self) -> Any:
        """The Ray actor handle (to kill it in a test, or to inspect it)."""
        return self._actor

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        info = await self._actor.start.remote()
        self.max_context_tokens = info["max_context_tokens"]
        self.constrained_decoding = info["constrained_decoding"]
        self._versions = info["versions"]
        self._started = True

    @property
    def died(self) -> bool:
        """Whether the actor died (killed, out of memory, its node lost), rather than was closed: the
        router's supervisor (`engines/replica_restarts.py`) starts a new one then."""
        return self._dead not in (None, "closed")

    async def restart(self) -> None:
        """A new actor in place of the dead one, with the same settings, started: it serves the base
        model until versions are loaded on it. Raises (RayError) when it cannot start."""
        ray.kill(self._actor, no_restart=True)  # whatever is left of the old one: its resources are the new one's
        self._started = False
        self._actor = self._actor_class.remote(*self._actor_args)
        self._dead = None
        self._versions = {"current": {SHARED_LINEAGE: 0}, "held": [0], "copies": {}}
        try:
            await self.start()
        except RayError as error:
            raise self._failed(error, self._actor) from None

    async def close(self) -> None:
        if self._dead is None:
            try:
                await self._actor.close.remote()
            except RayError:
                pass  # already gone
        ray.kill(self._actor)
        self._dead = "closed"

    def not_ready(self) -> str | None:
        if self._dead is not None:
            return f"the replica actor is gone ({self._dead})"
        return None if self._started else "the replica actor has not started"

    # --- versions ---------------------------------------------------------------------------

    @property
    def policy_version(self) -> int:
        return self._versions["current"][SHARED_LINEAGE]

    def lineage_version(self, lineage: str) -> int | None:
        return self._versions["current"].get(lineage)

    def held_versions(self) -> list[int]:
        return list(self._versions["held"])

    @property
    def local_copies(self) -> dict[int, str]:
        """Per version held, the directory on the actor's node it was loaded from (object store only)."""
        return dict(self._versions["copies"])

    async def load_version(self, version: int, path: Path, lineage: str = SHARED_LINEAGE) -> None:
        """By path, or (with a shipper) through the object store: ChecksumError, before the actor is
        asked anything, for a version whose files are not as its manifest says."""
        if lineage != SHARED_LINEAGE:
            raise ValueError("--placement ray serves the shared lineage only (not --adapters per-user)")
        actor = self._actor
        if self._shipper is None or version == 0:  # the base is in the actor already: its path is not read
            self._versions = await self._call(actor.load_version.remote(version, str(path), lineage), actor)
            return
        async with self._shipper.shipment(version, path) as shipment:
            self._versions = await self._call(actor.load_version.remote(version, shipment, lineage), actor)

    # --- requests ---------------------------------------------------------------------------

    def generate(self, prompt_token_ids: list[int], sampling: SamplingParams,
                 lineage: str = SHARED_LINEAGE) -> GenerationStream:  # fmt: skip
        """Checked here (bad input never reaches the actor), then streamed from the actor."""
        if self._dead is not None or not self._started:
            raise EngineClosedError(self.not_ready() or "the replica actor is not running")
        validate_sampling(sampling)
        prompt = validated_token_ids(prompt_token_ids, self._vocab_size, "prompt")
        if not 0 < len(prompt) < self.max_context_tokens:
            raise ValueError(f"the prompt must have 1 to {self.max_context_tokens - 1} tokens, got {len(prompt)}")
        version = self.lineage_version(lineage)
        if version is None:
            raise LineageNotLoadedError(f"no version of lineage {lineage!r} is loaded")
        stream = GenerationStream(version)
        refs = self._actor.generate.options(num_returns="streaming").remote(prompt, dataclasses.asdict(sampling), lineage)
        task = asyncio.get_running_loop().create_task(self._relay(refs, stream, self._actor))
        stream.on_cancel(task.cancel)
        return stream

    async def _relay(self, refs: Any, stream: GenerationStream, actor: Any) -> None:
        admitted = False
        try:
            async for ref in refs:
                item = await ref
                if not admitted:  # the version the actor's engine admitted the request with
                    stream.policy_version, admitted = item, True
                    continue
                token_id, logprob, top_logprobs, finish_reason = item
                stream.push(TokenStep(token_id, logprob, [tuple(pair) for pair in top_logprobs], finish_reason))
            stream.finish()
        except asyncio.CancelledError:
            ray.cancel(refs)
            stream.fail(EngineClosedError("the request was cancelled"))
            raise
        except ValueError as error:  # raised by the actor's engine: the request's own fault
            stream.fail(error)
        except Exception as error:  # noqa: BLE001 - the actor died or failed: the router retries elsewhere
            stream.fail(self._failed(error, actor))

    async def score(
        self, prompt_token_ids: list[int], response_token_ids: list[int], top_k: int = 0, version: int | None = None
    ) -> ScoredResponse:
        actor = self._actor
        return await self._call(actor.score.remote(prompt_token_ids, response_token_ids, top_k, version), actor)

    async def _call(self, ref: Any, actor: Any) -> Any:
        """Await a call to `actor`; its death becomes EngineClosedError, its ValueError stays one."""
        try:
            return await ref
        except ValueError:
            raise
        except RayError as error:
            raise self._failed(error, actor) from None

    def _failed(self, error: BaseException, actor: Any) -> EngineClosedError:
        """The error a failed call to `actor` ends with; the replica is dead if that actor died and
        is still this replica's (a call to the actor before a restart fails late, after it)."""
        if isinstance(error, ray.exceptions.RayActorError) and actor is self._actor:
            self._dead = f"{type(error).__name__}"
        return EngineClosedError(f"replica actor failed: {type(error).__name__}: {str(error)[:200]}")
