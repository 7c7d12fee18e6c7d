"""Chat completions: validate, render, generate, record, answer.

The order matters for durability: the turn is committed to the store before the answer is
acknowledged (for a stream, before the chunk that carries `finish_reason`), so every answer a
client has seen fully is in the store. Everything else here (judging, training) happens elsewhere.

What is not part of that order runs beside generation rather than before it: the session lookup
(store reads) starts when the prompt is rendered and is awaited only where its result is needed,
at the record (and, for a stream, before the headers, which name the session). Turns that finish
while another turn's commit is under way share the next commit (`TurnCommits`, group commit):
one transaction and one fsync for all of them, each answer still waiting for the commit that
holds its turn.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import logging
import re
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any

from jinja2 import TemplateError
from pydantic import ValidationError

from clawrl.config import ServeConfig
from clawrl.engines.base import Engine, GenerationStream, LineageNotLoadedError, SamplingParams, TokenStep
from clawrl.errors import APIError, describe_validation_error, error_body
from clawrl.messages import conversation_hashes, recorded_fingerprint
from clawrl.model.chat import ResponseDecoder, parse_tool_calls, render_prompt
from clawrl.model.notes import with_notes
from clawrl.serve import schemas
from clawrl.serve.auth import ADMIN, Caller
from clawrl.serve.contract import request_grammar
from clawrl.serve.metrics import ServeMetrics
from clawrl.serve.privacy import notes_asked, opt_out, stored
from clawrl.serve.sessions import (
    SessionIdentity,
    explicit_session,
    resolve_session,
    session_done,
    turn_kind,
)
from clawrl.store import Store
from clawrl.store.turns import TurnWrite
from clawrl.types import DEFAULT_USER, FinishReason, MemoryNote, NextState, Turn, TurnKind, TurnSampling
from clawrl.versions.follower import PolicyFollower

log = logging.getLogger(__name__)


# What a header value carries as is: printable ASCII but `%` (and space, which HTTP trims at the ends)
_LINEAGE_LOAD_TRIES = 5  # loads of a user's adapter for one request before its eviction is a 503
_HEADER_SAFE = "".join(chr(code) for code in range(0x21, 0x7F) if chr(code) != "%")


def header_value(text: str) -> str:
    """`text` percent-encoded (UTF-8) where a header could not carry it as is: a session id may be
    any string (the body's `session_id`, `user:` and the OpenAI `user` field), but a header value
    is latin-1 at best and never a control character (Starlette raised on "é" or "☕": a 500)."""
    return urllib.parse.quote(text, safe=_HEADER_SAFE)


@dataclass
class PreparedRequest:
    """A validated request, rendered to token ids, its session being looked up.

    `turn` is the turn it will record, complete but for the answer (`finish` fills that in) and,
    until `ChatService.identify` has awaited `resolving`, its session (`identity` is None and the
    turn's `session_id` empty until then).
    """

    request: schemas.ChatCompletionRequest
    turn: Turn
    resolving: asyncio.Future[SessionIdentity]  # the session lookup, running beside generation
    session_done: bool
    sampling: SamplingParams
    stop: list[str]
    started_at: float = field(default_factory=time.perf_counter)
    identity: SessionIdentity | None = None
    recorded: bool = True  # False for a request not to be stored (`store: false`, or a --no-store user's: `privacy.stored`)
    user_id: str = DEFAULT_USER  # whose turn it is (the caller's): a session it starts is theirs


@dataclass
class Generation:
    """A turn being generated: the engine stream, its decoder, and what has come out so far."""

    prepared: PreparedRequest
    stream: GenerationStream
    decoder: ResponseDecoder
    steps: list[TokenStep] = field(default_factory=list)
    result: Turn | None = None  # the finished turn, once generation has ended


def finish(generation: Generation, text: str, tool_calls: list[dict[str, Any]], finish_reason: FinishReason) -> Turn:
    """The prepared turn with its answer: the engine's exact ids and log-probs, as the store keeps it."""
    received = finish_reason != "cancelled"
    return dataclasses.replace(
        generation.prepared.turn,
        policy_version=generation.stream.policy_version,
        response_token_ids=[step.token_id for step in generation.steps],
        response_logprobs=[step.logprob for step in generation.steps],
        response_text=text,
        tool_calls=tool_calls or None,
        finish_reason=finish_reason,
        # no client can echo an answer it never received in full
        answer_fingerprint=recorded_fingerprint(text, tool_calls, generation.prepared.turn.message_hashes) if received else None,
        latency_s=time.perf_counter() - generation.prepared.started_at,
    )


class TurnCommits:
    """Group commit: every finished turn waits for the commit that makes it durable, and the turns
    that finish while a commit is under way go together into the next one (one transaction, one
    fsync: `TurnStore.record_turns`). A turn that finds no commit under way starts one at once, so a
    lone request waits no longer than its own write; under concurrent requests the commits no
    longer queue one behind the other (32 answers finishing on the same engine step wrote one after
    the other, each paying for its own fsync).

    A batch that fails is written again turn by turn, so that one bad turn fails only its own
    request.
    """

    MAX_BATCH = 64  # turns per transaction, so that one commit never holds the store for long

    def __init__(self, store: Store) -> None:
        self.store = store
        self.batch_sizes: collections.Counter[int] = collections.Counter()  # turns in a commit -> commits of that size
        self._waiting: list[tuple[TurnWrite, asyncio.Future[int]]] = []
        self._committer: asyncio.Task[None] | None = None

    async def record(self, write: TurnWrite) -> int:
        """Returns the turn's index in its session once the turn is committed (raises if it could not be)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        self._waiting.append((write, future))
        if self._committer is None:
            self._committer = loop.create_task(self._commit_waiting())
        return await future

    async def _commit_waiting(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting[: self.MAX_BATCH], self._waiting[self.MAX_BATCH :]
                try:
                    outcomes = await asyncio.to_thread(self._commit, [write for write, _ in batch])
                except asyncio.CancelledError:  # the loop is going away (the server drains its writes first)
                    for _, future in batch + self._waiting:
                        future.cancel()
                    self._waiting = []
                    raise
                except Exception as error:  # noqa: BLE001 - every waiter of the batch must hear of it
                    outcomes = [error] * len(batch)
                for (_, future), outcome in zip(batch, outcomes, strict=True):
                    if future.done():
                        continue
                    if isinstance(outcome, BaseException):
                        future.set_exception(outcome)
                    else:
                        future.set_result(outcome)
        finally:
            self._committer = None

    def _commit(self, writes: list[TurnWrite]) -> list[int | Exception]:
        """In a worker thread: the batch in one transaction, else each turn in its own."""
        self.batch_sizes[len(writes)] += 1
        try:
            return list(self.store.turns.record_turns(writes))
        except Exception as error:
            if len(writes) == 1:
                return [error]
        outcomes: list[int | Exception] = []
        for write in writes:
            try:
                outcomes.append(self.store.turns.record_turns([write])[0])
            except Exception as error:  # noqa: BLE001 - handed to the request it belongs to
                outcomes.append(error)
        return outcomes


class ChatService:
    def __init__(self, engine: Engine, store: Store, config: ServeConfig, metrics: ServeMetrics, model_names: set[str],
                 policy: PolicyFollower) -> None:  # fmt: skip
        """`policy` says which lineage answers each caller and has the engine hold it."""
        self.engine, self.store, self.config, self.metrics, self.policy = engine, store, config, metrics, policy
        self.model_names = model_names
        self.side_regex = re.compile(config.side_turn_system_regex) if config.side_turn_system_regex else None
        self._background: set[asyncio.Task[None]] = set()
        self.commits = TurnCommits(store)

    # --- preparing ----------------------------------------------------------------------------
    async def prepare(self, body: Any, headers: dict[str, str], id_prefix: str = "chatcmpl-", recorded: bool = True,
                      caller: Caller = ADMIN) -> PreparedRequest:  # fmt: skip
        """Validate a Chat Completions body, render it and start its session lookup.

        The other wire APIs (Responses, Messages) translate their bodies into this one; `id_prefix`
        names the turn as their ids do, and `recorded=False` answers without storing anything (as
        does the body's `store: false`, or a caller set --no-store). The turn is `caller`'s, in one of
        their sessions, and says whether it may be trained on (`privacy.opt_out`).
        """
        try:
            request = schemas.ChatCompletionRequest.model_validate(body)
        except ValidationError as error:
            message, param = describe_validation_error(error)
            raise APIError(400, message, "invalid_value", param) from None
        if request.model not in self.model_names:
            raise APIError(404, f"The model '{request.model}' does not exist; this server serves {sorted(self.model_names)[0]!r}.", "model_not_found", "model")
        messages = [message.model_dump(exclude_none=True) for message in request.messages]
        tools = [tool.model_dump(exclude_none=True) for tool in request.tools] if request.tools else None
        kind = turn_kind(headers, request.turn_type, messages, self.side_regex)
        opted_out = opt_out(headers, request.train, caller)
        explicit = explicit_session(headers, request.session_id, request.user, caller)
        notes = await self._memory_notes(notes_asked(headers, request.memory, kind), caller.user_id)
        try:
            prompt_token_ids = await asyncio.to_thread(render_prompt, self.engine.tokenizer, with_notes(messages, notes), tools)
        except TemplateError as error:  # e.g. a template that insists on alternating user/assistant turns
            raise APIError(400, f"The model's chat template refused these messages: {error}", "invalid_messages", "messages") from None
        max_tokens = self._response_budget(request, len(prompt_token_ids))
        grammar = request_grammar(request, tools, self.engine.tokenizer, self.engine.constrained_decoding)
        # Store reads that generation does not need: they run while the engine works (`identify`)
        resolving = asyncio.ensure_future(asyncio.to_thread(resolve_session, self.store, explicit, messages, kind, request.stop, caller.user_id))
        resolving.add_done_callback(self._count_session)
        sampling = SamplingParams(
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            max_tokens=max_tokens,
            seed=request.seed,
            top_logprobs=request.top_logprobs or 0,
            grammar=grammar,
        )
        stop = request.stop or []
        turn = Turn(
            id=f"{id_prefix}{uuid.uuid4().hex}",
            session_id="",  # known once `identify` has the lookup's answer
            kind=kind,
            model=self.engine.model_name,
            policy_version=self.engine.policy_version,  # fixed when generation starts
            messages=messages,
            tools=tools,
            sampling=TurnSampling(sampling.temperature, sampling.top_p, sampling.max_tokens, stop, sampling.seed, grammar),
            prompt_token_ids=prompt_token_ids,
            response_token_ids=[],
            response_logprobs=[],
            response_text="",
            tool_calls=None,
            finish_reason="stop",
            message_hashes=conversation_hashes(messages),
            opt_out=opted_out,
            memory_note_ids=[note.id for note in notes] or None,
        )
        return PreparedRequest(request, turn, resolving, session_done(headers, request.session_done), sampling, stop,
                               recorded=stored(recorded, request.store, caller), user_id=caller.user_id)

    async def _memory_notes(self, asked: bool, user_id: str) -> list[MemoryNote]:
        """The notes a turn's prompt carries: its user's, with --memory on, where asked (`privacy.notes_asked`:
        main turns by default; a side turn, a title or a summary, is answered as the client asked)."""
        limit = self.config.memory_limit
        if limit is None or not asked:
            return []
        return await asyncio.to_thread(self.store.memory.injected, user_id, limit)

    async def identify(self, generation: Generation) -> SessionIdentity:
        """The request's session, once its lookup (started by `prepare`) has answered; the turn
        gets its session id. A lookup that failed ends the generation too (and raises)."""
        prepared = generation.prepared
        if prepared.identity is None:
            try:
                # shielded: a caller cancelled while it waits must not cancel the lookup that
                # another caller (the record of a hung-up stream) still needs
                identity = await asyncio.shield(prepared.resolving)
            except Exception:
                generation.stream.cancel()
                raise
            if prepared.identity is None:  # not filled in by another caller meanwhile
                prepared.identity = identity
                prepared.turn = dataclasses.replace(prepared.turn, session_id=identity.session_id)
        return prepared.identity

    def _count_session(self, resolving: asyncio.Future[SessionIdentity]) -> None:
        """Count the lookup's answer; an error is marked seen (when the request failed first, nobody awaits it)."""
        if not resolving.cancelled() and resolving.exception() is None:
            self.metrics.sessions.labels(resolving.result().id_source).inc()

    def _response_budget(self, request: schemas.ChatCompletionRequest, prompt_length: int) -> int:
        window = self.engine.max_context_tokens
        room = window - prompt_length
        requested = request.max_completion_tokens or request.max_tokens
        if room < 1 or (requested is not None and requested > room):
            asked = f" and {requested} for the response" if requested is not None else ""
            raise APIError(
                400,
                f"This model's maximum context length is {window} tokens; the messages take {prompt_length} tokens{asked}. "
                "Shorten the messages or lower max_tokens.",
                "context_length_exceeded",
                "messages",
            )
        return requested if requested is not None else min(self.config.default_max_tokens, room)

    # --- generating -----------------------------------------------------------------------------
    async def start(self, prepared: PreparedRequest) -> Generation:
        """Hand the prompt to the engine, for the caller's lineage; the policy version is fixed from here on."""
        turn = prepared.turn
        stream = await self._generate(turn.prompt_token_ids, prepared.sampling, self.policy.lineage_for(prepared.user_id))
        self.metrics.prompt_tokens.inc(len(turn.prompt_token_ids))
        parse_tools = bool(turn.tools) and prepared.request.tool_choice != "none"
        decoder = ResponseDecoder(self.engine.tokenizer, prepared.stop, parse_tools)
        return Generation(prepared, stream, decoder)

    async def _generate(self, prompt_token_ids: list[int], sampling: SamplingParams, lineage: str) -> GenerationStream:
        """The engine's stream for `lineage`, loading its adapter first where the engine does not hold it.
        Between the load and the submit, other users' loads may have evicted it again: then again, and
        past `_LINEAGE_LOAD_TRIES` a 503 to retry later (never another version's answer)."""
        for _ in range(_LINEAGE_LOAD_TRIES):
            await self.policy.ready(lineage)
            try:
                return self.engine.generate(prompt_token_ids, sampling, lineage)
            except LineageNotLoadedError:
                log.info("the adapter of %s was evicted before its request started; loading it again", lineage)
        raise APIError(503, "More users' adapters are wanted at once than the server holds (--max-loaded-adapters); "
                       "retry shortly.", "server_busy", headers={"Retry-After": "1"})

    async def deltas(self, generation: Generation) -> AsyncIterator[tuple[str, list[TokenStep]]]:
        """Yield (text delta, token steps since the last delta); set `generation.result` before the tail."""
        prepared, stream, decoder = generation.prepared, generation.stream, generation.decoder
        pending: list[TokenStep] = []
        undecoded: list[int] = []
        try:
            async for step in stream:
                if not generation.steps and stream.first_step_at is not None:
                    self.metrics.time_to_first_token.observe(stream.first_step_at - prepared.started_at)
                generation.steps.append(step)
                pending.append(step)
                undecoded.append(step.token_id)
                if stream.held and step.finish_reason is None:
                    continue  # a held answer arrives whole: decode it once at its end, not token by token
                delta, undecoded = decoder.extend(undecoded), []
                if delta:
                    yield delta, pending
                    pending = []
                if decoder.stopped:
                    break
        finally:
            stream.cancel()  # a no-op once finished; frees the engine slot on stop strings and hang-ups
        decoder.extend(undecoded)  # a held answer that ended without a finishing step
        self.metrics.generated_tokens.inc(len(generation.steps))
        content, tool_calls = parse_tool_calls(decoder.text) if decoder.parse_tools else (decoder.text, [])
        finish_reason = "tool_calls" if tool_calls else ("stop" if decoder.stopped else stream.finish_reason or "stop")
        generation.result = finish(generation, content, tool_calls, finish_reason)
        tail = content[decoder.emitted :]  # held back at the end: a partial stop string that never completed
        if tail or pending:
            yield tail, pending

    # --- recording ------------------------------------------------------------------------------
    async def record(self, generation: Generation, turn: Turn) -> None:
        """Commit the finished turn (and the next state its request carries); returns once it is durable.

        The write goes on even if the caller is cancelled while it waits (a client hanging up just
        as its stream ends): cancelling a thread-pool call that has not started yet would drop it.
        A request not to be stored is not; its session is still looked up, for the headers that name it.
        """
        if generation.prepared.recorded:
            await asyncio.shield(self._in_background(self._write(generation, turn)))
        else:
            await self.identify(generation)

    async def _write(self, generation: Generation, turn: Turn) -> None:
        identity = await self.identify(generation)
        turn = dataclasses.replace(turn, session_id=identity.session_id)  # `finish` may have come first
        continues = None
        if identity.continues_turn_id is not None and identity.next_state is not None:
            continues = NextState(identity.continues_turn_id, identity.next_state, source_turn_id=turn.id)
        prepared = generation.prepared
        await self.commits.record(TurnWrite(turn, identity.id_source, continues, prepared.session_done, user_id=prepared.user_id))
        self.metrics.turns.labels(turn.kind).inc()
        if continues is not None:
            self.metrics.next_states.inc()

    def record_cancelled(self, generation: Generation) -> None:
        """A client hung up mid-stream: keep what was generated, marked so it is never trained on."""
        if not generation.prepared.recorded:
            return
        result = finish(generation, generation.decoder.text, [], "cancelled")
        self._in_background(self._write(generation, result))

    def _in_background(self, write: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run a write as a task of its own, which `drain()` waits for at shutdown."""
        task = asyncio.get_running_loop().create_task(write)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def drain(self) -> None:
        """Wait for background writes (used at shutdown)."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    # --- answering ------------------------------------------------------------------------------
    def headers(self, generation: Generation) -> dict[str, str]:
        """The response's headers; the session must be known (`identify`)."""
        turn = generation.prepared.turn
        assert generation.prepared.identity is not None, "headers before the session is known"
        return {
            "X-Clawrl-Turn": turn.id,
            "X-Clawrl-Session": header_value(turn.session_id),
            "X-Clawrl-Policy-Version": str(generation.stream.policy_version),
            "X-Clawrl-Policy-Lineage": self.policy.lineage_for(generation.prepared.user_id),
            "X-Clawrl-Turn-Kind": turn.kind,
        }

    async def finished(self, generation: Generation) -> Turn:
        """The whole answer, recorded (a non-streamed request of any wire API)."""
        if not generation.prepared.stop:  # nothing to stop early for: take the answer whole
            generation.stream.hold_until_done()
        async for _delta, _steps in self.deltas(generation):
            pass
        result = generation.result
        assert result is not None
        await self.record(generation, result)
        return result

    async def complete(self, generation: Generation) -> schemas.ChatCompletion:
        prepared = generation.prepared
        result = await self.finished(generation)
        logprobs = schemas.Logprobs(content=self._logprob_entries(generation.steps, prepared)) if prepared.request.logprobs else None
        return schemas.ChatCompletion(
            id=result.id,
            created=int(time.time()),
            model=prepared.request.model,
            choices=[
                schemas.Choice(
                    message=schemas.ResponseMessage(
                        content=result.response_text if (result.response_text or not result.tool_calls) else None,
                        tool_calls=result.tool_calls,
                    ),
                    logprobs=logprobs,
                    finish_reason=result.finish_reason,
                )
            ],
            usage=self._usage(result),
        )

    async def stream(self, generation: Generation) -> AsyncIterator[str]:
        """Server-sent events in OpenAI's chunk format, ending with `data: [DONE]`."""
        prepared = generation.prepared
        request, turn_id = prepared.request, prepared.turn.id
        created = int(time.time())

        def chunk(delta: schemas.Delta, steps: list[TokenStep] | None = None, finish_reason: str | None = None) -> str:
            logprobs = None
            if request.logprobs and steps:
                logprobs = schemas.Logprobs(content=self._logprob_entries(steps, prepared))
            body = schemas.ChatCompletionChunk(
                id=turn_id,
                created=created,
                model=request.model,
                choices=[schemas.ChunkChoice(delta=delta, logprobs=logprobs, finish_reason=finish_reason)],
            )
            return f"data: {body.model_dump_json(exclude_none=True)}\n\n"

        try:
            yield chunk(schemas.Delta(role="assistant", content=""))
            tail, tail_steps = "", []
            async for delta, steps in self.deltas(generation):
                if generation.result is not None:  # the tail: sent after the turn is recorded
                    tail, tail_steps = delta, steps
                    continue
                yield chunk(schemas.Delta(content=delta), steps)
            result = generation.result
            assert result is not None
            await self.record(generation, result)
            if tail or tail_steps:
                yield chunk(schemas.Delta(content=tail or None), tail_steps)
            if result.tool_calls:
                calls = [{"index": i, **call} for i, call in enumerate(result.tool_calls)]
                yield chunk(schemas.Delta(tool_calls=calls))
            yield chunk(schemas.Delta(), finish_reason=result.finish_reason)
            if request.stream_options and request.stream_options.include_usage:
                usage = schemas.ChatCompletionChunk(
                    id=turn_id, created=created, model=request.model, choices=[], usage=self._usage(result)
                )
                yield f"data: {usage.model_dump_json()}\n\n"
            yield "data: [DONE]\n\n"
        except (asyncio.CancelledError, GeneratorExit):
            if generation.result is None:
                self.record_cancelled(generation)
            raise
        except Exception as error:  # the engine failed mid-stream: say so in-band, then end the stream
            log.exception("generation failed mid-stream")
            yield f"data: {json.dumps(error_body(500, f'generation failed: {error}', 'engine_error'))}\n\n"
            yield "data: [DONE]\n\n"

    def _usage(self, turn: Turn) -> schemas.Usage:
        prompt, completion = len(turn.prompt_token_ids), len(turn.response_token_ids)
        return schemas.Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)

    def _logprob_entries(self, steps: list[TokenStep], prepared: PreparedRequest) -> list[schemas.TokenLogprob]:
        decode = self.engine.tokenizer.decode

        def entry(token_id: int, logprob: float) -> schemas.TopLogprob:
            text = decode([token_id])
            return schemas.TopLogprob(token=text, logprob=logprob, bytes=list(text.encode("utf-8")))

        return [
            schemas.TokenLogprob(
                **entry(step.token_id, step.logprob).model_dump(),
                top_logprobs=[entry(token_id, logprob) for token_id, logprob in step.top_logprobs[: prepared.sampling.top_logprobs]],
            )
            for step in steps
        ]
