"""OpenAI's Responses API (`POST /v1/responses`) on the chat path: Codex CLI, the Agents SDK, the openai SDK.

A Responses request is translated into a Chat Completions body and served by `ChatService`, so a
response is a recorded turn like any chat completion: the engine's token ids and log-probs, the
same session inference, the same judging. The turn's id is the response's id (`resp_...`).

- **Input items** become chat messages: a `message` item keeps its role (`developer` becomes
  `system`); `function_call` items join the assistant message before them as its tool calls (an
  agent that keeps its own history echoes the answer's calls this way, and an echoed answer is how
  its session is found); a `function_call_output` is a `tool` message. There are no `reasoning`
  items: these models write none, so no answer of this server gives a client one to echo.
- **`instructions`** are the first system message. With `previous_response_id` the conversation is
  the stored turn's messages and answer, then the new input; the new `instructions` replace the
  stored conversation's leading system message, and when a follow-up sends none the stored one stays
  (OpenAI's service drops them; every agent tested sends them on each call, and keeping them is
  what a client that omits them means).
- **`store: false`** is answered and not recorded, so nothing of it is trained on and it cannot be
  continued with `previous_response_id`, unless the request carries `X-Clawrl-Record: true`: Codex
  CLI sends `store: false` on every request whatever its user wants, and that header, set once in its
  provider configuration, is how its user opts in (`recorded`).
- **Honoured under a grammar** (`clawrl.serve.contract`, with `--engine hf` or `vllm`; `openai` refuses
  them with a 400): `tool_choice` that forces a call (`required`, a named function), `text.format`
  JSON outputs (`json_object`, `json_schema`), and a function tool's `strict: true` (a call the
  model chooses to make has arguments valid under the tool's `parameters`).
- **Refused with a 400, not ignored** (the schema leaves them out, so the OpenAPI document says so):
  hosted tools (web or file search, a computer), image, file and audio inputs, `background`, and
  `truncation: "auto"` (an over-long conversation is refused, not cut).
- **Accepted, changing nothing**: `reasoning` (no setting of these models), `include`,
  `parallel_tool_calls` (the model may write several calls either way), and `metadata`.

A stream sends the Responses event types (`response.created` ... `response.completed`), each with a
`sequence_number`; the turn is recorded before `response.completed` (or `response.incomplete`)
goes out, the same durability rule as a chat stream's finish chunk.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from clawrl.config import ServeConfig
from clawrl.errors import APIError, describe_validation_error
from clawrl.serve import openapi
from clawrl.serve.auth import Caller, KeyChecker, reaches
from clawrl.serve.bodies import read_json
from clawrl.serve.completions import ChatService, Generation
from clawrl.serve.metrics import ServeMetrics
from clawrl.serve.responses_schemas import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    MessageItem,
    NamedFunction,
    ResponsesRequest,
    TextFormat,
)
from clawrl.serve.sessions import TRUE_WORDS
from clawrl.types import Message, Turn

log = logging.getLogger(__name__)

ROUTE: dict[str, Any] = {
    "summary": "Create a model response (OpenAI Responses API)",
    "description": "Translated onto the chat path: recorded as a turn (unless `store` is false), sessions and "
    "judging as for chat completions. With `stream`, server-sent events of the Responses types.",
    "responses": {
        200: {"description": "The response object, or (with `stream`) its events.",
              "content": {"application/json": {"schema": {"type": "object"}}, "text/event-stream": {"schema": {"type": "string"}}}},
        **openapi.errors(400, 401, 404, 413, why={
            400: "The request is malformed, or asks for what this server cannot honour (the message says which).",
            404: "No such model, or no stored response `previous_response_id`."}),
    },  # fmt: skip
    "openapi_extra": openapi.request_body(ResponsesRequest),
}


def add_routes(app: FastAPI, service: ChatService, config: ServeConfig, metrics: ServeMetrics, keys: KeyChecker) -> None:
    """`POST /v1/responses`; `keys` says whose each request is."""

    @app.post("/v1/responses", **ROUTE)
    async def create_response(request: Request) -> Response:
        headers = {key.lower(): value for key, value in request.headers.items()}
        caller = await keys.caller(headers)
        started = time.perf_counter()
        parsed = _parse(await read_json(request, config.max_body_bytes))
        previous = await _previous_turn(service, parsed.previous_response_id, caller)
        prepared = await service.prepare(chat_body(parsed, previous), headers, id_prefix="resp_",
                                         recorded=recorded(parsed, headers), caller=caller)  # fmt: skip
        generation = await service.start(prepared)
        created_at = int(time.time())
        await service.identify(generation)  # the headers name the session
        if parsed.stream:
            return StreamingResponse(
                response_events(service, generation, parsed, created_at),
                media_type="text/event-stream",
                headers={**service.headers(generation), "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        metrics.active.inc()
        try:
            turn = await service.finished(generation)
        finally:
            metrics.active.dec()
            metrics.latency.labels("false").observe(time.perf_counter() - started)
        return JSONResponse(response_object(parsed, turn, created_at), headers=service.headers(generation))


def _parse(body: dict[str, Any]) -> ResponsesRequest:
    try:
        parsed = ResponsesRequest.model_validate(body)
    except ValidationError as error:
        message, param = describe_validation_error(error)
        raise APIError(400, message, "invalid_value", param) from None
    return parsed


def recorded(request: ResponsesRequest, headers: dict[str, str]) -> bool:
    """Whether to record the turn: `store`, unless the client's owner opted in with `X-Clawrl-Record: true`.

    Codex CLI sends `store: false` on every request to any provider but Azure, as a protocol
    setting rather than a choice of its user, and no setting of its own changes that; its provider
    configuration can add a header, so the header is how a Codex user says "record my turns".
    """
    return request.store or headers.get("x-clawrl-record", "").strip().lower() in TRUE_WORDS


async def _previous_turn(service: ChatService, response_id: str | None, caller: Caller) -> Turn | None:
    """The stored turn `previous_response_id` names: the caller's own (another user's is not found)."""
    if response_id is None:
        return None
    turns = service.store.turns
    turn = await asyncio.to_thread(turns.turn, response_id)
    if turn is None or not await asyncio.to_thread(reaches, turns, caller, turn.session_id):
        raise APIError(404, f"Previous response with id '{response_id}' not found (a response made with 'store': false "
                            "is never stored).", "previous_response_not_found", "previous_response_id")  # fmt: skip
    return turn


# --- the request, as a chat completion --------------------------------------------------------------


def chat_body(request: ResponsesRequest, previous: Turn | None) -> dict[str, Any]:
    """The Chat Completions body that serves `request` (after `previous`, its `previous_response_id`)."""
    messages: list[Message] = [{"role": "system", "content": request.instructions}] if request.instructions else []
    if previous is not None:
        earlier = list(previous.messages)
        if request.instructions and earlier and earlier[0]["role"] in ("system", "developer"):
            earlier = earlier[1:]  # the new instructions take its place
        messages += [*earlier, _answer_message(previous)]
    messages += input_messages(request.input)
    body: dict[str, Any] = {"model": request.model, "messages": messages, "stream": False, "train": request.train}
    optional = {"max_tokens": request.max_output_tokens, "temperature": request.temperature, "top_p": request.top_p,
                "user": request.user, "tool_choice": _chat_tool_choice(request.tool_choice),
                "response_format": _chat_response_format(request.text.format if request.text else None)}  # fmt: skip
    body.update({key: value for key, value in optional.items() if value is not None})
    if request.tools:
        body["tools"] = [_chat_tool(tool) for tool in request.tools]
    return body


def _chat_tool_choice(choice: str | NamedFunction | None) -> str | dict[str, Any] | None:
    if isinstance(choice, NamedFunction):
        return {"type": "function", "function": {"name": choice.name}}
    return choice


def _chat_response_format(format_: TextFormat | None) -> dict[str, Any] | None:
    if format_ is None or format_.type != "json_schema":
        return None if format_ is None else {"type": format_.type}
    return {"type": "json_schema", "json_schema": {"name": format_.name or "output", "schema": format_.schema_}}


def _chat_tool(tool: FunctionTool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name, "parameters": tool.parameters or {"type": "object", "properties": {}}}
    if tool.description:
        function["description"] = tool.description
    if tool.strict:
        function["strict"] = True
    return {"type": "function", "function": function}


def _answer_message(turn: Turn) -> Message:
    """A recorded answer as the assistant message a client would echo (text and tool calls)."""
    message: Message = {"role": "assistant", "content": turn.response_text if (turn.response_text or not turn.tool_calls) else None}
    if turn.tool_calls:
        message["tool_calls"] = turn.tool_calls
    return message


def input_messages(items: str | list[Any]) -> list[Message]:
    """The input items as chat messages (a string is one user message)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[Message] = []
    for item in items:
        if isinstance(item, MessageItem):
            messages.append(_message(item))
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)  # calls of one answer follow its text
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            assert isinstance(item, FunctionCallOutputItem)
            output = item.output if isinstance(item.output, str) else "".join(part.words for part in item.output)
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": output})
    return messages


def _message(item: MessageItem) -> Message:
    role = "system" if item.role in ("system", "developer") else item.role
    if isinstance(item.content, str):
        return {"role": role, "content": item.content}
    texts = [part.words for part in item.content]
    if role == "assistant":  # an echoed answer: its text as the answer was recorded, so its session is found
        return {"role": role, "content": "".join(texts)}
    return {"role": role, "content": [{"type": "text", "text": text} for text in texts]}


# --- the answer --------------------------------------------------------------------------------------


def output_items(turn: Turn) -> list[dict[str, Any]]:
    """The answer as Responses output items: a message with its text, then one item per tool call."""
    items = [_message_item(turn, turn.response_text, "completed")] if (turn.response_text or not turn.tool_calls) else []
    items += [_call_item(call, "completed") for call in turn.tool_calls or []]
    return items


def _message_item(turn: Turn, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": []}]
    return {"type": "message", "id": "msg_" + turn.id.removeprefix("resp_"), "status": status, "role": "assistant", "content": content}


def _call_item(call: dict[str, Any], status: str, arguments: str | None = None) -> dict[str, Any]:
    function = call["function"]
    return {"type": "function_call", "id": "fc_" + call["id"].removeprefix("call_"), "call_id": call["id"],
            "name": function["name"], "arguments": function["arguments"] if arguments is None else arguments, "status": status}  # fmt: skip


def response_object(request: ResponsesRequest, turn: Turn | None, created_at: int, prepared_id: str | None = None) -> dict[str, Any]:
    """The response object: finished when `turn` is given, else in progress (a stream's first events)."""
    incomplete = turn is not None and turn.finish_reason == "length"
    status = "in_progress" if turn is None else ("incomplete" if incomplete else "completed")
    usage = None
    if turn is not None:
        prompt, answer = len(turn.prompt_token_ids), len(turn.response_token_ids)
        usage = {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": answer,
                 "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + answer}  # fmt: skip
    return {
        "id": turn.id if turn is not None else prepared_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "model": request.model,
        "output": output_items(turn) if turn is not None else [],
        "parallel_tool_calls": True if request.parallel_tool_calls is None else request.parallel_tool_calls,
        "previous_response_id": request.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "store": request.store,
        "temperature": request.temperature,
        "text": {"format": _echoed_format(request.text.format if request.text else None)},
        "tool_choice": _echoed_tool_choice(request.tool_choice),
        "tools": [tool.model_dump(exclude_none=True) for tool in request.tools or []],
        "top_p": request.top_p,
        "truncation": "disabled",
        "usage": usage,
        "user": request.user,
        "metadata": request.metadata or {},
    }


def _echoed_format(format_: TextFormat | None) -> dict[str, Any]:
    if format_ is None:
        return {"type": "text"}
    return format_.model_dump(by_alias=True, exclude_none=True)


def _echoed_tool_choice(choice: str | NamedFunction | None) -> str | dict[str, Any]:
    return choice.model_dump(exclude_none=True) if isinstance(choice, NamedFunction) else (choice or "auto")


async def response_events(service: ChatService, generation: Generation, request: ResponsesRequest, created_at: int) -> AsyncIterator[str]:
    """The stream: Responses events, the text as it comes, the turn recorded before the last event."""
    numbers = itertools.count()
    turn_id = generation.prepared.turn.id

    def event(kind: str, **fields: Any) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': next(numbers), **fields})}\n\n"

    in_progress = response_object(request, None, created_at, prepared_id=turn_id)
    message = _message_item(generation.prepared.turn, None, "in_progress")
    text_where = {"item_id": message["id"], "output_index": 0, "content_index": 0}
    started = False

    def start_text() -> list[str]:
        part = {"type": "output_text", "text": "", "annotations": []}
        return [event("response.output_item.added", output_index=0, item=message),
                event("response.content_part.added", **text_where, part=part)]  # fmt: skip

    try:
        yield event("response.created", response=in_progress)
        yield event("response.in_progress", response=in_progress)
        tail = ""
        async for delta, _steps in service.deltas(generation):
            if generation.result is not None:  # the tail: sent after the turn is recorded
                tail = delta
                continue
            if delta:
                if not started:
                    started = True
                    for line in start_text():
                        yield line
                yield event("response.output_text.delta", **text_where, delta=delta)
        turn = generation.result
        assert turn is not None
        await service.record(generation, turn)
        for line in _closing_events(event, start_text, turn, started, tail, text_where):
            yield line
        final = response_object(request, turn, created_at)
        yield event("response.incomplete" if final["status"] == "incomplete" else "response.completed", response=final)
    except (asyncio.CancelledError, GeneratorExit):
        if generation.result is None:
            service.record_cancelled(generation)
        raise
    except Exception as error:  # the engine failed mid-stream: said in-band, as OpenAI's service does
        log.exception("generation failed mid-stream")
        yield event("error", code="engine_error", message=f"generation failed: {error}", param=None)


def _closing_events(event: Any, start_text: Any, turn: Turn, started: bool, tail: str, text_where: dict[str, Any]) -> list[str]:
    """What follows the streamed text once the turn is recorded: the text's last piece and its done
    events, then each tool call as an item of its own."""
    lines = []
    has_text = bool(turn.response_text) or not turn.tool_calls
    if has_text:
        if not started:
            lines += start_text()
        if tail:
            lines.append(event("response.output_text.delta", **text_where, delta=tail))
        part = {"type": "output_text", "text": turn.response_text, "annotations": []}
        lines += [event("response.output_text.done", **text_where, text=turn.response_text),
                  event("response.content_part.done", **text_where, part=part),
                  event("response.output_item.done", output_index=0, item=_message_item(turn, turn.response_text, "completed"))]  # fmt: skip
    for offset, call in enumerate(turn.tool_calls or []):
        index = offset + int(has_text)
        item = _call_item(call, "completed")
        where = {"item_id": item["id"], "output_index": index}
        lines += [event("response.output_item.added", output_index=index, item=_call_item(call, "in_progress", arguments="")),
                  event("response.function_call_arguments.delta", **where, delta=item["arguments"]),
                  event("response.function_call_arguments.done", **where, arguments=item["arguments"]),
                  event("response.output_item.done", output_index=index, item=item)]  # fmt: skip
    return lines
