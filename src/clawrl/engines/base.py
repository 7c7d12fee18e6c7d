"""The engine protocol: what serving, judging and training need from a model runtime.

Every engine speaks token ids, never text. The server renders the chat template once, hands the
exact prompt ids to `generate`, and records the exact ids and log-probs that come back; the
trainer later uses those ids unchanged (DESIGN §4: never re-tokenize).
"""

from __future__ import annotations

import asyncio
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from clawrl.types import SHARED_LINEAGE, ScoredResponse
# raised by `Engine.generate` for a lineage the engine does not hold; defined with the table that knows
from clawrl.versions.table import LineageNotLoadedError as LineageNotLoadedError


@dataclass
class SamplingParams:
    """How to sample one response. Stop strings are applied by the caller on decoded text."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    seed: int | None = None
    top_logprobs: int = 0  # how many alternatives to report per position (0 = none)
    # an llguidance grammar the response must follow (`model.constraints`): JSON outputs, forced tool
    # calls; the engine samples from the model's distribution masked to it, and reports that one's log-probs
    grammar: str | None = None


def validate_sampling(sampling: SamplingParams) -> None:
    """Reject parameters the sampler cannot honour, before anything is queued."""
    if sampling.temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {sampling.temperature}")
    if not 0 < sampling.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {sampling.top_p}")
    if sampling.max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {sampling.max_tokens}")
    if sampling.top_logprobs < 0:
        raise ValueError(f"top_logprobs must be >= 0, got {sampling.top_logprobs}")


def validated_token_ids(ids: Sequence[int], vocab_size: int, what: str) -> list[int]:
    """A private copy of `ids` (the caller may reuse its list), refused if any is outside the vocabulary."""
    copied = [int(i) for i in ids]
    if any(not 0 <= i < vocab_size for i in copied):
        raise ValueError(f"the {what} has token ids outside the vocabulary [0, {vocab_size})")
    return copied


class EngineClosedError(RuntimeError):
    """The engine was closed (or never started) while a request or task needed it."""


@dataclass
class TokenStep:
    """One generated token, as the engine sampled it."""

    token_id: int
    logprob: float
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)  # (token id, log-prob), best first
    finish_reason: str | None = None  # set on the last step: "stop" (end-of-turn token) or "length"


class GenerationStream:
    """An in-flight generation: async-iterate it for `TokenStep`s; `cancel()` frees the engine slot.

    `policy_version` is fixed when the request is admitted, so a weight swap during the request
    never changes which policy produced its tokens.
    """

    def __init__(self, policy_version: int) -> None:
        self.policy_version = policy_version
        self.finish_reason: str | None = None
        self._items: deque[TokenStep | BaseException | None] = deque()
        self._arrived = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._wake_lock = threading.Lock()
        self._wake_pending = False
        self._held = False
        self.first_step_at: float | None = None  # `time.perf_counter()` when the engine produced the first step
        self.cancelled = False
        self._on_cancel: Callable[[], None] | None = None

    # --- producer side (may be called from an engine thread) -------------------------------
    def push(self, step: TokenStep) -> None:
        self._put(step)

    def fail(self, error: BaseException) -> None:
        self._put(error)

    def finish(self) -> None:
        self._put(None)

    def _put(self, item: TokenStep | BaseException | None) -> None:
        """Hand `item` to the consumer; one wake-up of its loop covers every item put before it runs.

        Waking an event loop from another thread writes to the loop's self-pipe and hands the GIL to
        the loop's thread: once per token it took a sixth of the hf engine thread's time. Raises
        RuntimeError once the consumer's loop is closed, as `call_soon_threadsafe` does, so the
        engine stops generating.
        """
        if isinstance(item, TokenStep) and self.first_step_at is None:
            self.first_step_at = time.perf_counter()
        self._items.append(item)
        if self._held and isinstance(item, TokenStep) and item.finish_reason is None:
            return  # `hold_until_done`: the last step, `finish` or `fail` wakes the consumer
        if self._loop.is_closed():
            raise RuntimeError("Event loop is closed")
        if threading.get_ident() == self._loop_thread:  # a producer on the loop itself (the remote engine)
            self._arrived.set()
            return
        with self._wake_lock:
            if self._wake_pending:
                return
            self._wake_pending = True
        try:
            self._loop.call_soon_threadsafe(self._wake)
        except RuntimeError:
            with self._wake_lock:
                self._wake_pending = False
            raise

    def _wake(self) -> None:
        with self._wake_lock:
            self._wake_pending = False
        self._arrived.set()

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """Have `cancel()` call `callback` too: for an engine that must act at once (hang up on a
        remote server) rather than notice the flag at its next step."""
        self._on_cancel = callback

    # --- consumer side ------------------------------------------------------------------------
    def hold_until_done(self) -> None:
        """Deliver the steps only when the generation ends: for a consumer that needs none of them
        before (a non-streamed answer with no stop string to watch for). The engine's thread then
        never wakes the consumer's loop mid-generation, and keeps the GIL while it generates."""
        self._held = True

    @property
    def held(self) -> bool:
        """Whether `hold_until_done` was asked: the steps then arrive all at once, at the end."""
        return self._held

    def cancel(self) -> None:
        self.cancelled = True
        if self._on_cancel is not None:
            self._on_cancel()

    def __aiter__(self) -> AsyncIterator[TokenStep]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[TokenStep]:
        while True:
            while not self._items:  # a wake-up scheduled after this clear sets it again
                self._arrived.clear()
                await self._arrived.wait()
            item = self._items.popleft()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            if item.finish_reason is not None:
                self.finish_reason = item.finish_reason
            yield item


class Engine(ABC):
    """A model runtime. Implementations: `hf` (in-process transformers), `openai` (a remote
    OpenAI-compatible server that speaks token ids) and `vllm` (that, with vLLM run by clawrl)."""

    model_name: str
    tokenizer: PreTrainedTokenizerBase
    max_context_tokens: int  # prompt + response must fit in this many tokens
    constrained_decoding: bool = False  # honours `SamplingParams.grammar` (else a request with one is refused)

    @property
    @abstractmethod
    def policy_version(self) -> int:
        """The version new requests are served with (the current one of the engine's `VersionTable`)."""

    async def start(self) -> None:
        """Load weights and start background workers. Called once before serving."""

    async def close(self) -> None:
        """Stop background workers; in-flight streams end with an error."""

    def not_ready(self) -> str | None:
        """Why a new request could not be answered now, or None: what `/readyz` reports about the model."""
        return None

    @abstractmethod
    def lineage_version(self, lineage: str) -> int | None:
        """The version `lineage`'s new requests get, None when the engine does not hold the lineage
        (never loaded, or evicted beyond `--max-loaded-adapters`). The shared lineage is always held."""

    @abstractmethod
    def held_versions(self) -> list[int]:
        """The versions held now (the base, every lineage's current one, those requests still use)."""

    @abstractmethod
    def generate(self, prompt_token_ids: list[int], sampling: SamplingParams,
                 lineage: str = SHARED_LINEAGE) -> GenerationStream:  # fmt: skip
        """Start generating with `lineage`'s current version; returns immediately. The stream yields one
        `TokenStep` per token. Raises LineageNotLoadedError when the engine does not hold the lineage."""

    @abstractmethod
    async def score(
        self,
        prompt_token_ids: list[int],
        response_token_ids: list[int],
        top_k: int = 0,
        version: int | None = None,
    ) -> ScoredResponse:
        """Teacher-forced log-probs of `response_token_ids` after `prompt_token_ids`.

        `version` picks the policy version to score under; None means the current one.
        """

    @abstractmethod
    async def load_version(self, version: int, path: Path, lineage: str = SHARED_LINEAGE) -> None:
        """Make `version` (weights or adapter under `path`; 0 is the base model, `path` unread) the one
        `lineage`'s new requests get, without pausing."""
