"""Chat completions: validate, render, generate, record, answer.

The order matters for durability: the turn is committed to the store before the answer is
acknowledged (for a stream, before the chunk that carries `finish_reason`), so every answer a
client has seen fully is in the store. Everything else here (judging, training) happens elsewhere.
"""

from __future__ import annotations

import asyncio
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
from clawrl.engines.base import Engine, GenerationStream, SamplingParams, TokenStep
from clawrl.errors import APIError, describe_validation_error, error_body
from clawrl.messages import conversation_hashes, recorded_fingerprint
from clawrl.model.chat import ResponseDecoder, parse_tool_calls, render_prompt
from clawrl.serve import schemas
from clawrl.serve.metrics import ServeMetrics
from clawrl.serve.sessions import (
    SessionIdentity,
    explicit_session,
    resolve_session,
    session_done,
    turn_kind,
)
from clawrl.store import Store
from clawrl.types import FinishReason, NextState, Turn

log = logging.getLogger(__name__)


# What a header value carries as is: printable ASCII but `%` (and space, which HTTP trims at the ends)
_HEADER_SAFE = "".join(chr(code) for code in range(0x21, 0x7F) if chr(code) != "%")


def header_value(text: str) -> str:
    """`text` percent-encoded (UTF-8) where a header could not carry it as is: a session id may be
    any string (the body's `session_id`, `user:` and the OpenAI `user` field), but a header value
    is latin-1 at best and never a control character (Starlette raised on "é" or "☕": a 500)."""
    return urllib.parse.quote(text, safe=_HEADER_SAFE)


@dataclass
class PreparedRequest:
    """A validated request, rendered to token ids and placed in its session.

    `turn` is the turn it will record, complete but for the answer: `finish` fills that in.
    """

    request: schemas.ChatCompletionRequest
    turn: Turn
    identity: SessionIdentity
    session_done: bool
    sampling: SamplingParams
    stop: list[str]
    started_at: float = field(default_factory=time.perf_counter)


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


class ChatService:
    def __init__(self, engine: Engine, store: Store, config: ServeConfig, metrics: ServeMetrics, model_names: set[str]) -> None:
        self.engine, self.store, self.config, self.metrics = engine, store, config, metrics
        self.model_names = model_names
        self.side_regex = re.compile(config.side_turn_system_regex) if config.side_turn_system_regex else None
        self._background: set[asyncio.Task[None]] = set()

    # --- preparing ----------------------------------------------------------------------------
    async def prepare(self, body: Any, headers: dict[str, str]) -> PreparedRequest:
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
        explicit = explicit_session(headers, request.session_id, request.user)
        try:
            prompt_token_ids = await asyncio.to_thread(render_prompt, self.engine.tokenizer, messages, tools)
        except TemplateError as error:  # e.g. a template that insists on alternating user/assistant turns
            raise APIError(400, f"The model's chat template refused these messages: {error}", "invalid_messages", "messages") from None
        max_tokens = self._response_budget(request, len(prompt_token_ids))
        identity = await asyncio.to_thread(resolve_session, self.store, explicit, messages, kind)
        self.metrics.sessions.labels(identity.id_source).inc()
        sampling = SamplingParams(
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            max_tokens=max_tokens,
            seed=request.seed,
            top_logprobs=request.top_logprobs or 0,
        )
        stop = request.stop or []
        turn = Turn(
            id=f"chatcmpl-{uuid.uuid4().hex}",
            session_id=identity.session_id,
            kind=kind,
            model=self.engine.model_name,
            policy_version=self.engine.policy_version,  # fixed when generation starts
            messages=messages,
            tools=tools,
            sampling={
                "temperature": sampling.temperature,
                "top_p": sampling.top_p,
                "max_tokens": sampling.max_tokens,
                "stop": stop,
                "seed": sampling.seed,
            },
            prompt_token_ids=prompt_token_ids,
            response_token_ids=[],
            response_logprobs=[],
            response_text="",
            tool_calls=None,
            finish_reason="stop",
            message_hashes=conversation_hashes(messages),
        )
        return PreparedRequest(request, turn, identity, session_done(headers, request.session_done), sampling, stop)

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
    def start(self, prepared: PreparedRequest) -> Generation:
        """Hand the prompt to the engine; the policy version is fixed from here on."""
        turn = prepared.turn
        self.metrics.prompt_tokens.inc(len(turn.prompt_token_ids))
        parse_tools = bool(turn.tools) and prepared.request.tool_choice != "none"
        decoder = ResponseDecoder(self.engine.tokenizer, prepared.stop, parse_tools)
        return Generation(prepared, self.engine.generate(turn.prompt_token_ids, prepared.sampling), decoder)

    async def _deltas(self, generation: Generation) -> AsyncIterator[tuple[str, list[TokenStep]]]:
        """Yield (text delta, token steps since the last delta); set `generation.result` before the tail."""
        prepared, stream, decoder = generation.prepared, generation.stream, generation.decoder
        pending: list[TokenStep] = []
        try:
            async for step in stream:
                if not generation.steps:
                    self.metrics.time_to_first_token.observe(time.perf_counter() - prepared.started_at)
                generation.steps.append(step)
                pending.append(step)
                if delta := decoder.add(step.token_id):
                    yield delta, pending
                    pending = []
                if decoder.stopped:
                    break
        finally:
            stream.cancel()  # a no-op once finished; frees the engine slot on stop strings and hang-ups
        self.metrics.generated_tokens.inc(len(generation.steps))
        content, tool_calls = parse_tool_calls(decoder.text) if decoder.parse_tools else (decoder.text, [])
        finish_reason = "tool_calls" if tool_calls else ("stop" if decoder.stopped else stream.finish_reason or "stop")
        generation.result = finish(generation, content, tool_calls, finish_reason)
        tail = content[decoder.emitted :]  # held back at the end: a partial stop string that never completed
        if tail or pending:
            yield tail, pending

    # --- recording ------------------------------------------------------------------------------
    async def record(self, prepared: PreparedRequest, turn: Turn) -> None:
        """Commit the finished turn (and the next state its request carries); returns once it is durable.

        The write goes on even if the caller is cancelled while it waits (a client hanging up just
        as its stream ends): cancelling a thread-pool call that has not started yet would drop it.
        """
        await asyncio.shield(self._in_background(self._write(prepared, turn)))

    async def _write(self, prepared: PreparedRequest, turn: Turn) -> None:
        identity = prepared.identity
        continues = None
        if identity.continues_turn_id is not None and identity.next_state is not None:
            continues = NextState(identity.continues_turn_id, identity.next_state, source_turn_id=turn.id)
        await asyncio.to_thread(self.store.record_turn, turn, identity.id_source, continues, prepared.session_done)
        self.metrics.turns.labels(turn.kind).inc()
        if continues is not None:
            self.metrics.next_states.inc()

    def _record_cancelled(self, generation: Generation) -> None:
        """A client hung up mid-stream: keep what was generated, marked so it is never trained on."""
        result = finish(generation, generation.decoder.text, [], "cancelled")
        self._in_background(self._write(generation.prepared, result))

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
        turn = generation.prepared.turn
        return {
            "X-Clawrl-Turn": turn.id,
            "X-Clawrl-Session": header_value(turn.session_id),
            "X-Clawrl-Policy-Version": str(generation.stream.policy_version),
            "X-Clawrl-Turn-Kind": turn.kind,
        }

    async def complete(self, generation: Generation) -> schemas.ChatCompletion:
        prepared = generation.prepared
        async for _delta, _steps in self._deltas(generation):
            pass
        result = generation.result
        assert result is not None
        await self.record(prepared, result)
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
            async for delta, steps in self._deltas(generation):
                if generation.result is not None:  # the tail: sent after the turn is recorded
                    tail, tail_steps = delta, steps
                    continue
                yield chunk(schemas.Delta(content=delta), steps)
            result = generation.result
            assert result is not None
            await self.record(prepared, result)
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
                self._record_cancelled(generation)
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
