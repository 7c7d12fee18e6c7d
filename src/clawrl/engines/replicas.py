"""Several engines behind one: a router with prefix affinity, failover and versions on every replica.

`--replicas N` serves from N copies of the model (DESIGN §10; the issue "Many machines"). The
server, the store and the follower see one engine; this one picks a replica for each request:

* **Affinity by prefix.** A session's next request repeats its conversation so far, so the replica
  that answered the last one holds that prompt's prefix in its cache (the hf engine's prefix cache,
  vLLM's). The router remembers, per replica, the hashes of the prompts it sent there, a block of
  `AFFINITY_BLOCK_TOKENS` tokens at a time (each block's hash chained to the one before, so equal
  hashes mean equal prefixes), and sends a request to the replica that holds the longest prefix of
  it; a request that shares no block with any (a new session) goes to the replica with the fewest
  requests in flight (then the one given the fewest so far). No session id is needed: the engine protocol stays token ids only, and a
  side request that quotes a conversation lands where its prefix is too.
* **Failover.** A replica that fails a request before the first token (it closed, its server is
  gone) is taken out of rotation and the request is started again on another one; a request that
  had produced tokens ends with the error (its tokens were streamed already). Bad input (a
  `ValueError`) is the request's fault, the same on every replica, and goes back to the caller.
* **One version set.** `load_version` loads a version on every replica in rotation, side by side,
  and returns once all have it, so the time from publish to served is that of the slowest replica;
  a replica that fails the load is taken out. A lineage's version is the router's only when every
  replica in rotation has it current: the follower loads it again otherwise.

* **Coming back.** A replica taken out because its process died (a Ray actor: `--placement ray`)
  is started again by `engines/replica_restarts.py`, then `readmit` loads on it every lineage's
  version the replicas in rotation serve, and puts it back only once it holds them all with no
  load under way: a version published while it was coming back is loaded on it first, and no
  request reaches it before it serves the current set.

Where the replicas run: engines in this process (`--placement local`), or each in a Ray actor
placed on the cluster (`--placement ray`, `engines/ray_replica.py`). An in-process replica or a
server at `--engine-url` taken out is not brought back (restart the server).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

from clawrl.engines.base import (
    Engine,
    EngineClosedError,
    GenerationStream,
    LineageNotLoadedError,
    SamplingParams,
)
from clawrl.engines.replica_restarts import ReplicaRestarts
from clawrl.types import SHARED_LINEAGE, ScoredResponse

logger = logging.getLogger(__name__)

# A prefix is matched a block at a time: a shorter block finds more of a prompt, a longer one costs
# less to hash (a 20K-token prompt is 312 blocks of 64, about a millisecond)
AFFINITY_BLOCK_TOKENS = 64
# How many prefix blocks the router remembers per replica, least recently used forgotten first
# (about a replica's prefix cache: 16K blocks of 64 tokens is a million tokens)
AFFINITY_BLOCKS_KEPT = 16_384


def prefix_block_hashes(prompt_token_ids: Sequence[int], block_tokens: int = AFFINITY_BLOCK_TOKENS) -> list[int]:
    """The chained hash of each whole block of the prompt: the k-th is equal for two prompts only
    when their first k blocks are (up to hash collisions, which cost a cache miss, never an answer)."""
    hashes, previous = [], 0
    for start in range(0, len(prompt_token_ids) - block_tokens + 1, block_tokens):
        previous = hash((previous, *prompt_token_ids[start : start + block_tokens]))
        hashes.append(previous)
    return hashes


class _Replica:
    """One engine in rotation, what it has been sent and how busy it is."""

    def __init__(self, index: int, engine: Engine) -> None:
        self.index = index
        self.engine = engine
        self.in_flight = 0
        self.requests = 0  # every request started here, for /metrics and tests
        self.incarnation = 0  # how many times it came back into rotation: a request of an earlier one fails late
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def matched_blocks(self, hashes: list[int]) -> int:
        """How many leading blocks of a prompt (its `prefix_block_hashes`) this replica was sent."""
        matched = 0
        for block in hashes:  # chained: the first miss ends the shared prefix
            if block not in self._blocks:
                break
            matched += 1
        return matched

    def remember(self, hashes: list[int]) -> None:
        for block in hashes:
            self._blocks.pop(block, None)
            self._blocks[block] = None
        while len(self._blocks) > AFFINITY_BLOCKS_KEPT:
            self._blocks.popitem(last=False)

    def forget(self) -> None:
        """Forget every prefix sent here: a restarted replica's cache is empty."""
        self._blocks.clear()


class ReplicatedEngine(Engine):
    """Engines of one model behind the engine protocol; see the module docstring."""

    def __init__(self, replicas: Sequence[Engine], restarts: int = 0) -> None:
        """`restarts`: quick failures in a row after which a replica whose process died is given up
        on (`--replica-restarts`; 0, or a replica in this process: it stays out)."""
        if not replicas:
            raise ValueError("a replicated engine needs at least one replica")
        first = replicas[0]
        self.model_name = first.model_name
        self.tokenizer = first.tokenizer
        self._replicas = [_Replica(index, engine) for index, engine in enumerate(replicas)]
        self._out: list[_Replica] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._serving: dict[str, tuple[int, Path]] = {}  # per lineage, the version last loaded on the replicas in rotation
        self._loads = 0  # `load_version` calls under way
        self._no_loads = asyncio.Event()
        self._no_loads.set()
        self.restarts = ReplicaRestarts(self.readmit, restarts)

    # --- what the replicas have in common ---------------------------------------------------

    @property
    def max_context_tokens(self) -> int:  # type: ignore[override]
        return min(replica.engine.max_context_tokens for replica in self._all())

    @property
    def constrained_decoding(self) -> bool:  # type: ignore[override]
        return all(replica.engine.constrained_decoding for replica in self._all())

    @property
    def policy_version(self) -> int:
        """The shared lineage's version on every replica; while a load is under way and the replicas
        differ, the one they all served before it (a version is reported only once all serve it)."""
        agreed = self._lineage_version(SHARED_LINEAGE)
        return agreed if agreed is not None else self._serving.get(SHARED_LINEAGE, (0, None))[0]

    def lineage_version(self, lineage: str) -> int | None:
        return self._lineage_version(lineage)

    def held_versions(self) -> list[int]:
        return sorted({version for replica in self._all() for version in replica.engine.held_versions()})

    @property
    def replicas(self) -> list[Engine]:
        """Every replica's engine, in rotation or not, by index."""
        return [replica.engine for replica in self._all()]

    def replica_requests(self) -> list[tuple[int, bool, int]]:
        """(replica index, in rotation, requests started there) for each replica."""
        return [(replica.index, replica in self._replicas, replica.requests) for replica in self._all()]

    def replica_status(self) -> list[dict[str, int | bool]]:
        """What /healthz and /metrics say of each replica: in rotation, requests started there, the
        times it came back after its process died, whether it was given up on."""
        return [{"replica": index, "in_rotation": rotating, "requests": requests, **self.restarts.status(index)}
                for index, rotating, requests in self.replica_requests()]  # fmt: skip

    def _all(self) -> list[_Replica]:
        return sorted(self._replicas + self._out, key=lambda replica: replica.index)

    def _lineage_version(self, lineage: str) -> int | None:
        versions = {replica.engine.lineage_version(lineage) for replica in self._replicas}
        return versions.pop() if len(versions) == 1 else None

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the replicas one after another: loading a model is not safe to run twice at once in
        one process (transformers' loader shares state; two loads side by side left one model's tied
        output layer uninitialised)."""
        for replica in self._replicas:
            await replica.engine.start()

    async def close(self) -> None:
        self.restarts.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*(replica.engine.close() for replica in self._all()), return_exceptions=True)

    def not_ready(self) -> str | None:
        reasons = [replica.engine.not_ready() for replica in self._replicas]
        if self._replicas and any(reason is None for reason in reasons):
            return None
        return "no replica is in rotation" if not self._replicas else f"no replica is ready ({reasons[0]})"

    def take_out(self, replica_index: int, why: str) -> None:
        """Stop sending new requests to a replica (it failed; or an operator's choice)."""
        for replica in self._replicas:
            if replica.index == replica_index:
                self._replicas.remove(replica)
                self._out.append(replica)
                logger.warning("replica %d taken out of rotation (%d left): %s", replica_index, len(self._replicas), why)
                self.restarts.taken_out(replica_index, replica.engine)

    async def readmit(self, replica_index: int) -> None:
        """Load on a replica that is out (restarted: it serves the base) each lineage's version the
        replicas in rotation serve, then put it back into rotation. The set is read again after the
        loads, with no load under way: one that ran meanwhile (a version published while this one
        caught up) is loaded here too before it is admitted, and one that starts after it includes it."""
        replica = next(replica for replica in self._out if replica.index == replica_index)
        while True:
            await self._no_loads.wait()
            wanted = dict(self._serving)
            for lineage, (version, path) in wanted.items():
                if replica.engine.lineage_version(lineage) != version:
                    await replica.engine.load_version(version, path, lineage)
            if self._loads == 0 and self._serving == wanted:  # no await from here to the admission
                break
        self._out.remove(replica)
        replica.forget()
        replica.incarnation += 1
        self._replicas.append(replica)
        logger.info("replica %d back in rotation (%d in rotation), serving %s", replica_index, len(self._replicas),
                    ", ".join(f"v{version} to {lineage}" for lineage, (version, _) in sorted(wanted.items())) or "the base")  # fmt: skip

    # --- requests ---------------------------------------------------------------------------

    def generate(self, prompt_token_ids: list[int], sampling: SamplingParams,
                 lineage: str = SHARED_LINEAGE) -> GenerationStream:  # fmt: skip
        """Start on the replica with the longest cached prefix of the prompt (the least busy when
        none has any); a replica that fails before the first token hands the request to another."""
        hashes = prefix_block_hashes(prompt_token_ids)
        replica, inner = self._start_on_some_replica(prompt_token_ids, sampling, lineage, hashes, tried=set())
        stream = GenerationStream(inner.policy_version)
        task = asyncio.get_running_loop().create_task(self._relay(prompt_token_ids, sampling, lineage, hashes, replica, inner, stream))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        stream.on_cancel(task.cancel)
        return stream

    def _pick(self, hashes: list[int], tried: set[int]) -> _Replica:
        candidates = [replica for replica in self._replicas if replica.index not in tried]
        if not candidates:
            raise EngineClosedError("no replica is in rotation to answer the request")
        # the longest cached prefix; then the least busy; then the one given the fewest requests (new sessions spread)
        return max(candidates, key=lambda replica: (replica.matched_blocks(hashes), -replica.in_flight, -replica.requests, -replica.index))

    def _start_on_some_replica(
        self, prompt: list[int], sampling: SamplingParams, lineage: str, hashes: list[int], tried: set[int]
    ) -> tuple[_Replica, GenerationStream]:
        """Start the request on the best replica not yet tried; one that raises (closed, or its
        lineage evicted there alone) is passed over. ValueError (bad input) goes to the caller."""
        while True:
            replica = self._pick(hashes, tried)
            tried.add(replica.index)
            try:
                inner = replica.engine.generate(prompt, sampling, lineage)
            except EngineClosedError as error:
                self.take_out(replica.index, str(error))
                continue
            except LineageNotLoadedError:
                if not any(r.engine.lineage_version(lineage) is not None for r in self._replicas if r.index not in tried):
                    raise
                continue
            replica.in_flight += 1
            replica.requests += 1
            replica.remember(hashes)
            return replica, inner

    async def _relay(
        self, prompt: list[int], sampling: SamplingParams, lineage: str, hashes: list[int],
        replica: _Replica, inner: GenerationStream, stream: GenerationStream,
    ) -> None:  # fmt: skip
        """Pass the replica's steps on; a replica that fails before its first one is taken out and
        the request starts again on another, until none is left."""
        tried = {replica.index}
        while True:
            incarnation = replica.incarnation  # started in this incarnation: it cannot have come back since
            try:
                failure = await self._pass_on(inner, stream)
            finally:
                replica.in_flight -= 1
            if failure is None:
                return
            if replica.incarnation == incarnation:  # else it died before a restart, and is back since
                self.take_out(replica.index, failure)
            try:
                replica, inner = self._start_on_some_replica(prompt, sampling, lineage, hashes, tried)
            except Exception as no_other:  # noqa: BLE001 - none left (or the lineage nowhere): the consumer gets why
                stream.fail(no_other)
                return

    @staticmethod
    async def _pass_on(inner: GenerationStream, stream: GenerationStream) -> str | None:
        """Relay `inner` into `stream`. None once `stream` has ended (finished, or failed for its
        consumer); else why the replica failed before producing a step, for a retry elsewhere."""
        produced = False
        try:
            async for step in inner:
                if not produced:  # a replica in an actor learns its request's version with the first step
                    stream.policy_version, produced = inner.policy_version, True
                stream.push(step)
            stream.finish()
        except asyncio.CancelledError:
            inner.cancel()
            stream.fail(EngineClosedError("the request was cancelled"))
            raise
        except ValueError as error:  # the request's own fault: every replica would say so
            stream.fail(error)
        except Exception as error:  # noqa: BLE001 - a replica's failure: a retry, or the consumer's error
            if not produced:
                return f"{type(error).__name__}: {error}"
            stream.fail(error)
        return None

    async def score(
        self, prompt_token_ids: list[int], response_token_ids: list[int], top_k: int = 0, version: int | None = None
    ) -> ScoredResponse:
        """Scored on the least busy replica that holds the version."""
        number = self.policy_version if version is None else version
        holding = [replica for replica in self._replicas if number in replica.engine.held_versions()]
        if not holding:
            raise ValueError(f"policy version {number} is not loaded")
        replica = min(holding, key=lambda candidate: candidate.in_flight)
        return await replica.engine.score(prompt_token_ids, response_token_ids, top_k, number)

    async def load_version(self, version: int, path: Path, lineage: str = SHARED_LINEAGE) -> None:
        """Load `version` on every replica in rotation at once; a replica that fails is taken out.
        The version is then the one a replica coming back loads for the lineage (`readmit`)."""
        replicas = list(self._replicas)
        if not replicas:
            raise EngineClosedError("no replica is in rotation to load the version on")
        self._loads += 1
        self._no_loads.clear()
        try:
            results = await asyncio.gather(*(replica.engine.load_version(version, path, lineage) for replica in replicas), return_exceptions=True)
            failed = [(replica, result) for replica, result in zip(replicas, results, strict=True) if isinstance(result, BaseException)]
            if len(failed) == len(replicas):
                raise failed[0][1]  # the version's own fault (or every replica's): the follower reports it
            self._serving[lineage] = (version, path)
        finally:
            self._loads -= 1
            if not self._loads:
                self._no_loads.set()
        for replica, error in failed:
            self.take_out(replica.index, f"could not load version {version}: {type(error).__name__}: {error}")
