"""The `hf` engine: transformers in-process, on a CPU or one CUDA device, with continuous batching.

Threading model
---------------
All model work (prefill, decode, scoring, installing versions) happens on ONE dedicated worker
thread; only reading a full-weight version from disk runs beside it.
The asyncio side only enqueues work and awaits results, so the event loop that serves HTTP never
runs a forward pass; torch releases the GIL inside its kernels, so the loop stays responsive while
the worker computes. Owning the model from a single thread also means no lock is needed around
PEFT's adapter switching or the KV caches: nothing else ever touches them.

Batching
--------
Requests decode together. Each worker iteration:

1. runs queued tasks (`score`, adapter/weight installs) between decode steps;
2. admits waiting requests while fewer than `max_batch_size` rows are active: each new prompt is
   prefilled on its own (no padding waste on long prompts), its first token sampled, and its KV
   cache merged into the running batch of its model by left-padding the shorter caches with zero
   columns: one batch for the base model and every LoRA version on it, one per full-weight copy;
3. runs ONE decode forward per batch (normally one batch; two for a while after a full-weight
   swap), with a 2-D attention mask that hides each row's padding columns and per-row position ids
   that count only real tokens, so RoPE sees exactly the positions a solo decode would. Rows of
   different LoRA versions (different users' adapters, or the versions before and after a swap)
   decode in the same forward: PEFT's mixed-adapter batch applies each row's adapter to its row
   (`adapter_names`, "__base__" for the base model's rows);
4. drops finished and cancelled rows from the cache, and trims the leading columns that have
   become padding for every remaining row.

Padding only ever sits to the left of a row's real tokens, so relative distances between real
tokens are those of a solo decode (sliding-window masks stay correct too; their caches are simply
not truncated, since rows are kept in full-attention `DynamicLayer`s).

Prefix caching
--------------
A prompt that starts like a recent prompt of the same policy version prefills only the rest
(`clawrl.engines.prefix_cache`: by exact token ids, per loaded policy, never across versions,
bounded by `prefix_cache_gib`). Agents re-send a long system prompt and the whole history on every
turn, so a later turn prefills little more than its new message.

Log-probs
---------
Every reported log-prob (`TokenStep.logprob`, `TokenStep.top_logprobs`, `score`) is taken from the
RAW model distribution, `log_softmax(logits)` at temperature 1, before temperature and top-p
reshape it for sampling. That is the distribution the trainer recomputes for the same tokens
(pi_behaviour in the importance ratio, DESIGN §6), so the two are directly comparable; `score`
and the trainer share the very function that computes it (`clawrl.model.scoring`).

Policy versions
---------------
Every request is pinned to the current version of its lineage when it was submitted
(`GenerationStream.policy_version`; the shared lineage, or a user's with per-user adapters) and all
its tokens come from that version. LoRA versions are PEFT adapters named `v{N}` on the base model;
a prefill or a scoring pass switches its adapter on (or adapters off, for version 0), a decode step
names each row's. Full-weight versions are separate model copies. A version is released once it
is neither a lineage's current one nor used by any queued or running request, and beyond
`max_loaded_adapters` the least recently used lineages' versions are released too once unused;
version 0, the base model, stays loaded as the frame LoRA adapters attach to and the frozen
reference policy.

The parts: this file is the scheduler (the worker loop, admission, decode steps, tasks);
`hf_batch.py` the batches and their KV cache, `hf_sampling.py` the token choice,
`hf_adapters.py` the policies and their adapters, `versions/table.py` which versions are held,
and `model/scoring.py` the teacher-forced scoring.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
from transformers import AutoConfig, AutoTokenizer, DynamicCache, PreTrainedModel

from clawrl.allocator import return_freed_memory
from clawrl.config import EngineConfig
from clawrl.engines.base import (
    Engine,
    EngineClosedError,
    GenerationStream,
    SamplingParams,
    validate_sampling,
    validated_token_ids,
)
from clawrl.engines.hf_adapters import Adapters, Policy
from clawrl.engines.hf_batch import Batch, Request, Row
from clawrl.engines.hf_sampling import new_generator, sample_steps
from clawrl.engines.prefix_cache import PrefixCache
from clawrl.model.constraints import Constraint, GrammarVocabulary
from clawrl.model.cuda_share import export_weights, withdraw_export
from clawrl.model.device import resolve_device, resolve_dtype
from clawrl.model.scoring import score_response
from clawrl.model.weights import load_causal_lm, shared_weights
from clawrl.types import SHARED_LINEAGE, ScoredResponse
from clawrl.versions.table import VersionTable

logger = logging.getLogger(__name__)

T = TypeVar("T")
_PREFILL_CHUNK = 1024  # tokens per forward when a prompt's prefill continues a cached prefix


@dataclass
class _Task:
    """A function to run on the worker thread between decode steps, with its result future."""

    fn: Callable[[], Any]
    future: concurrent.futures.Future[Any] = field(default_factory=concurrent.futures.Future)

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return  # the awaiting coroutine was cancelled
        try:
            result = self.fn()
        except BaseException as exc:  # noqa: BLE001 - delivered to the caller, who decides
            self.future.set_exception(exc)
        else:
            self.future.set_result(result)


def _deliver(stream: GenerationStream, call: Callable[..., None], *args: Any) -> bool:
    """Call a stream producer method; False when the consumer's event loop is gone."""
    try:
        call(*args)
    except RuntimeError:  # "Event loop is closed": nobody will ever read this stream
        stream.cancelled = True
        return False
    return True


# --- the engine -------------------------------------------------------------------------------


class HFEngine(Engine):
    """Transformers in-process engine (DESIGN §7, `hf`); see the module docstring for the design.

    The tokenizer and context size are available right after construction; weights are loaded by
    `start()`. `generate` may be called from any running event loop; results are delivered to the
    loop that called it.
    """

    constrained_decoding = True

    def __init__(self, config: EngineConfig, model_path: str | Path | None = None) -> None:
        """`model_path` overrides `config.model` as the place to load from (used for `tiny`)."""
        self._source = str(model_path if model_path is not None else config.model)
        self.model_name = config.model
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.max_batch_size = config.max_batch_size
        self.max_loaded_adapters = config.max_loaded_adapters
        self.cpu_threads = config.cpu_threads
        self._cache_dir, self._share_weights = config.cache_dir, config.share_weights
        self._quantize = config.quantize
        self.tokenizer = AutoTokenizer.from_pretrained(self._source)
        text_config = AutoConfig.from_pretrained(self._source).get_text_config()
        self._vocab_size: int = text_config.vocab_size
        context = config.max_context_tokens or getattr(text_config, "max_position_embeddings", None)
        if context is None:
            raise ValueError(f"{self._source} does not declare its context size; set max_context_tokens")
        self.max_context_tokens = int(context)

        # Written by the worker thread only (after start()).
        self._adapters: Adapters | None = None  # the base model and its LoRA adapters, once started
        self._versions: VersionTable[Policy] = VersionTable()  # version 0 once started
        self._batches: dict[int, Batch] = {}  # by frame: 0 for the base model and its adapters, N for full-weight vN
        self._end_ids: frozenset[int] = frozenset()
        self._prefix_cache = PrefixCache(int(config.prefix_cache_gib * 2**30))

        # Shared with the asyncio side, guarded by _cond: the inbox and the lifecycle flags.
        # the current version is also only changed under _cond, so a request always gets a version
        # that the worker still has loaded (see _retire_unused_versions).
        self._cond = threading.Condition()
        self._pending: deque[Request] = deque()
        self._tasks: deque[_Task] = deque()
        self._stopping = False
        self._thread: threading.Thread | None = None

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the weights (off the event loop) and start the worker thread. Idempotent."""
        if self._thread is not None:
            return
        if self.device.type == "cpu" and self.cpu_threads:
            torch.set_num_threads(self.cpu_threads)
        # on a CPU, the trainer process maps the same weights (`shared_weights`): one copy on the host
        source = await asyncio.to_thread(shared_weights, self._source, self.dtype, self.device, self._cache_dir,
                                         self._share_weights)  # fmt: skip
        base = await asyncio.to_thread(self._load_model, source)
        if self.device.type == "cuda" and self._share_weights:
            # a LoRA trainer started by this server maps these weights instead of loading a copy
            await asyncio.to_thread(export_weights, base, self._cache_dir, self._quantize != "none")
        self._adapters = Adapters(base, self.device)
        self._versions.install(0, Policy(base))
        self._end_ids = self._end_of_turn_ids(base)
        self._thread = threading.Thread(target=self._run, name="clawrl-hf-engine", daemon=True)
        self._thread.start()

    def not_ready(self) -> str | None:
        if self._thread is None or self._stopping:
            return "the engine is not running"
        return None if self._thread.is_alive() else "the engine's decode thread has stopped"

    async def close(self) -> None:
        """Stop the worker; streams and tasks still in flight fail with `EngineClosedError`."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        if self.device.type == "cuda" and self._share_weights:
            withdraw_export(self._cache_dir)

    def _load_model(self, source: str | Path) -> PreTrainedModel:
        # a full-weight version may load beside the decode thread: the decoder code it runs casts
        # explicitly (masks, RoPE, norms), so `load_causal_lm`'s brief default dtype does not reach it
        return load_causal_lm(source, self.dtype, self.device, self._quantize).eval()

    def _end_of_turn_ids(self, model: PreTrainedModel) -> frozenset[int]:
        """The tokenizer's eos plus every eos id of the generation config (e.g. <|im_end|>, <|endoftext|>)."""
        ids = {self.tokenizer.eos_token_id}
        configured = model.generation_config.eos_token_id if model.generation_config is not None else None
        ids.update(configured if isinstance(configured, list) else [configured])
        return frozenset(i for i in ids if i is not None)

    def _check_running(self) -> None:
        if self._thread is None or self._stopping:
            raise EngineClosedError("the engine is not running (call start(), and not after close())")

    # --- public API -------------------------------------------------------------------------

    @property
    def policy_version(self) -> int:
        """The version new requests get; requests in flight keep the one they were admitted with."""
        return self._versions.current

    @property
    def base_model(self) -> PreTrainedModel | None:
        """The loaded base model, None before `start()`: version 0 and every LoRA version run their
        forward passes through it (a full-weight version has its own model). Read-only; for tests and
        diagnostics, e.g. a forward hook that sees each pass's batch. The worker thread owns the
        model: do not run it from other threads."""
        return self._adapters.base if self._adapters is not None else None

    @property
    def prefix_cache_stats(self) -> dict[str, int]:
        """The prefix cache so far: prompts that reused a cached prefix (`hits`), prompt tokens not
        prefilled thanks to it (`reused_tokens`), and what it holds now (`entries`, `bytes`)."""
        cache = self._prefix_cache
        return {"hits": cache.hits, "reused_tokens": cache.reused_tokens, "entries": len(cache), "bytes": cache.nbytes}

    def lineage_version(self, lineage: str) -> int | None:
        with self._cond:
            return self._versions.current_of(lineage)

    def held_versions(self) -> list[int]:
        with self._cond:
            return [version for version, _ in self._versions.items()]

    def generate(self, prompt_token_ids: list[int], sampling: SamplingParams,
                 lineage: str = SHARED_LINEAGE) -> GenerationStream:  # fmt: skip
        """Queue a generation with `lineage`'s current version and return its stream at once; see
        `TokenStep` for what it yields.

        The stream's last step has finish_reason "stop" (an end-of-turn token, included as that
        step) or "length" (`max_tokens`, or the context limit, reached). Raises ValueError for
        inputs the model cannot take, LineageNotLoadedError for a lineage the engine does not hold.
        """
        self._check_running()
        validate_sampling(sampling)
        prompt = validated_token_ids(prompt_token_ids, self._vocab_size, "prompt")
        if not 0 < len(prompt) < self.max_context_tokens:
            raise ValueError(f"the prompt must have 1 to {self.max_context_tokens - 1} tokens, got {len(prompt)}")
        room = self.max_context_tokens - len(prompt)
        constraint = None
        if sampling.grammar is not None:  # built here: a grammar that cannot be used fails the caller, not the batch
            constraint = Constraint(sampling.grammar, GrammarVocabulary.of(self.tokenizer, self._vocab_size))
        with self._cond:
            stream = GenerationStream(self._versions.use(lineage))
            self._pending.append(Request(prompt, sampling, stream, min(sampling.max_tokens, room), constraint))
            self._cond.notify()
        return stream

    async def score(
        self,
        prompt_token_ids: list[int],
        response_token_ids: list[int],
        top_k: int = 0,
        version: int | None = None,
    ) -> ScoredResponse:
        """Teacher-forced raw log-probs of the response, under `version` (None = the current one).

        One forward pass on the worker thread. A specific version must still be loaded: 0 (the
        base), the current one, or one that requests in flight still use.
        """
        self._check_running()
        prompt = validated_token_ids(prompt_token_ids, self._vocab_size, "prompt")
        response = validated_token_ids(response_token_ids, self._vocab_size, "response")
        if not prompt:
            raise ValueError("the prompt must not be empty")
        if len(prompt) + len(response) > self.max_context_tokens:
            raise ValueError(f"prompt + response exceed the context of {self.max_context_tokens} tokens")
        if top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {top_k}")
        return await self._call(lambda: self._score(prompt, response, top_k, version))

    async def load_version(self, version: int, path: Path, lineage: str = SHARED_LINEAGE) -> None:
        """Make `version` the one `lineage`'s new requests get; requests in flight keep theirs.

        A directory with `adapter_config.json` is a PEFT LoRA adapter for the base model; anything
        else is a full set of weights, loaded as a second model copy off the worker thread, so
        decoding goes on while it loads. Loading a version that is still loaded just makes it
        current again; version 0, the base model, always is (its `path` is not read). Calls should
        not overlap: when they do, the last one to finish wins.
        """
        self._check_running()
        path = Path(path)
        if version == 0:
            await self._call(lambda: self._make_current(0, lineage))
        elif (path / "adapter_config.json").is_file():
            await self._call(lambda: self._load_adapter(version, path, lineage))
        else:
            model = await asyncio.to_thread(self._load_model, path)
            await self._call(lambda: self._install(version, Policy(model), lineage))

    async def _call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the worker thread between decode steps and await its result."""
        task = _Task(fn)
        with self._cond:
            if self._stopping:
                raise EngineClosedError("the engine is closed")
            self._tasks.append(task)
            self._cond.notify()
        return await asyncio.wrap_future(task.future)

    # --- worker thread ----------------------------------------------------------------------

    def _run(self) -> None:
        """The worker loop: tasks, admissions, one decode step per batch; until close()."""
        try:
            while (work := self._next_work()) is not None:
                tasks, admitted = work
                for task in tasks:
                    task.run()
                decoding = bool(admitted or self._batches)
                with torch.inference_mode():
                    self._admit(admitted)
                    for batch in list(self._batches.values()):
                        self._decode_step(batch)
                self._retire_unused_versions()
                if decoding and not (self._batches or self._pending):
                    return_freed_memory()  # idle now: the finished requests' keys and values go back to the host
        finally:
            self._shutdown()

    def _active_rows(self) -> int:
        return sum(len(batch.rows) for batch in self._batches.values())

    def _next_work(self) -> tuple[list[_Task], list[Request]] | None:
        """Block until there is something to do; take all tasks and the requests that fit."""
        with self._cond:
            while not (self._stopping or self._tasks or self._pending or self._batches):
                self._cond.wait()
            if self._stopping:
                return None
            tasks = list(self._tasks)
            self._tasks.clear()
            room = self.max_batch_size - self._active_rows()
            admitted = [self._pending.popleft() for _ in range(min(room, len(self._pending)))]
            return tasks, admitted

    def _admit(self, requests: list[Request]) -> None:
        """Prefill each new request alone, then merge the survivors into their version's batch."""
        joining: dict[int, list[tuple[Row, DynamicCache]]] = {}
        for request in requests:
            if request.stream.cancelled:
                _deliver(request.stream, request.stream.finish)
                continue
            try:
                prefilled = self._prefill(request)
            except Exception as exc:  # noqa: BLE001 - e.g. out of memory: fail this request only
                logger.warning("prefill failed: %r", exc)
                _deliver(request.stream, request.stream.fail, exc)
                continue
            if prefilled is not None:
                joining.setdefault(self._frame(request.version), []).append(prefilled)
        for frame, rows in joining.items():
            batch = self._batches.setdefault(frame, Batch(frame))
            try:
                batch.add(rows)
            except Exception as exc:  # noqa: BLE001 - the merged state is unusable: fail its rows
                for row, _ in rows:
                    _deliver(row.request.stream, row.request.stream.fail, exc)
                self._fail_batch(batch, exc)

    def _prefill(self, request: Request) -> tuple[Row, DynamicCache] | None:
        """Run the prompt (what the prefix cache does not hold of it), emit the first token; return
        the row and its cache unless already done."""
        row = Row(request, new_generator(request.sampling, self.device))
        model = self._model_for(request.version)
        policy = self._versions.get(request.version).key
        cached, reused = self._prefix_cache.lookup(policy, request.prompt_ids)
        cache = cached or DynamicCache()  # no config: plain full-attention layers, which merge by padding
        rest = request.prompt_ids[reused:]
        # After a cached prefix, attention takes an explicit mask of (new tokens x all tokens):
        # prefilled in chunks, it stays small (without a prefix, attention is causal without a mask).
        chunk = _PREFILL_CHUNK if cached is not None else len(rest)
        for start in range(0, len(rest), chunk):
            logits = model(
                input_ids=torch.tensor([rest[start : start + chunk]], device=self.device),
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            ).logits[:, -1]
        self._prefix_cache.store(policy, request.prompt_ids, cache)
        done = self._advance([row], logits)[0]
        return None if done else (row, cache)

    def _decode_step(self, batch: Batch) -> None:
        """One forward for all rows of `batch`; emit a token per row; drop rows that are done."""
        cancelled = [row.request.stream for row in batch.rows if row.request.stream.cancelled]
        for stream in cancelled:
            _deliver(stream, stream.finish)  # ends the consumer's iteration, should it still be reading
        if cancelled:
            batch.keep([i for i, row in enumerate(batch.rows) if not row.request.stream.cancelled])
        if not batch.rows:
            del self._batches[batch.frame]
            return
        try:
            logits = self._decode_forward(batch).logits[:, -1]
            done = self._advance(batch.rows, logits)
            batch.keep([i for i, finished in enumerate(done) if not finished])
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory: fail this batch only
            self._fail_batch(batch, exc)
            return
        if not batch.rows:
            del self._batches[batch.frame]

    def _decode_forward(self, batch: Batch) -> Any:
        """The decode forward of `batch`: its model with the one adapter all its rows use switched on,
        or, when its rows use several, PEFT's mixed-adapter forward naming each row's."""
        versions = [row.request.version for row in batch.rows]
        inputs = batch.decode_inputs(self.device)
        if len(set(versions)) == 1:
            return self._model_for(versions[0])(**inputs)
        assert self._adapters is not None
        adapter_names = [self._versions.get(version).adapter for version in versions]
        return self._adapters.mixed_forward(adapter_names, inputs)

    def _advance(self, rows: list[Row], logits: torch.Tensor) -> list[bool]:
        """Sample each row's next token and push it; True for rows that are finished (or unread)."""
        constraints = [row.request.constraint for row in rows]
        allowed = [constraint.allowed_words() if constraint is not None else None for constraint in constraints]
        steps = sample_steps(logits, [(row.request.sampling, row.generator) for row in rows], allowed)
        done = []
        for row, step, constraint in zip(rows, steps, constraints):
            if constraint is not None:
                constraint.accept(step.token_id)
            row.generated += 1
            row.next_token = step.token_id
            if step.token_id in self._end_ids:
                step.finish_reason = "stop"
            elif row.generated >= row.request.max_new_tokens:
                step.finish_reason = "length"
            stream = row.request.stream
            delivered = _deliver(stream, stream.push, step)
            if delivered and step.finish_reason is not None:
                _deliver(stream, stream.finish)
            done.append(step.finish_reason is not None or not delivered)
        return done

    def _fail_batch(self, batch: Batch, exc: BaseException) -> None:
        logger.warning("decode step failed for %d rows of frame %d: %r", len(batch.rows), batch.frame, exc)
        for row in batch.rows:
            _deliver(row.request.stream, row.request.stream.fail, exc)
        self._batches.pop(batch.frame, None)

    def _score(self, prompt: list[int], response: list[int], top_k: int, version: int | None) -> ScoredResponse:
        with torch.inference_mode():
            model = self._model_for(self._versions.current if version is None else version)
            return score_response(model, prompt, response, top_k)

    # --- policy versions (worker thread) ----------------------------------------------------

    def _model_for(self, version: int) -> PreTrainedModel:
        """The model serving `version`, with the right LoRA adapter switched on."""
        assert self._adapters is not None
        return self._adapters.model_for(self._versions.get(version))  # ValueError when it is not loaded

    def _frame(self, version: int) -> int:
        """The batch `version`'s rows decode in: 0 for the base model and its adapters, else its own."""
        assert self._adapters is not None
        return 0 if self._versions.get(version).model is self._adapters.base else version

    def _load_adapter(self, version: int, path: Path, lineage: str) -> None:
        """Attach the LoRA adapter at `path` to the base model and make `version` the lineage's current one."""
        if version in self._versions:
            self._make_current(version, lineage)
            return
        assert self._adapters is not None
        self._install(version, self._adapters.attach(version, path), lineage)

    def _install(self, version: int, policy: Policy, lineage: str) -> None:
        """Register `policy` for `version` (an already loaded one wins) and point the lineage's new requests at it."""
        with self._cond:
            self._versions.install(version, policy, lineage)

    def _make_current(self, version: int, lineage: str) -> None:
        with self._cond:
            self._versions.make_current(version, lineage)

    def _retire_unused_versions(self) -> None:
        """Release versions that are no lineage's current one and that no queued or running request
        uses (the scheduler's batches and queue are the pins), then the least recently used
        lineages' beyond `max_loaded_adapters`."""
        running = {row.request.version for batch in self._batches.values() for row in batch.rows}
        with self._cond:
            in_use = running | {request.version for request in self._pending}
            retired = self._versions.retire_unused(in_use, self.max_loaded_adapters)
        for version, policy in retired:
            self._prefix_cache.forget(policy.key)
            if policy.adapter is not None:
                try:
                    self._adapters.delete(policy.adapter)
                except Exception:  # noqa: BLE001 - a leaked adapter costs memory, not correctness
                    logger.exception("could not delete adapter %s", policy.adapter)
            logger.info("released policy version %d", version)

    def _shutdown(self) -> None:
        """Fail everything still in flight: running rows, queued requests, queued tasks."""
        closed = EngineClosedError("the engine was closed")
        with self._cond:
            self._stopping = True
            pending, tasks = list(self._pending), list(self._tasks)
            self._pending.clear()
            self._tasks.clear()
        streams = [row.request.stream for batch in self._batches.values() for row in batch.rows]
        streams += [request.stream for request in pending]
        for stream in streams:
            _deliver(stream, stream.fail, closed)
        for task in tasks:
            if task.future.set_running_or_notify_cancel():
                task.future.set_exception(closed)
        self._batches.clear()
