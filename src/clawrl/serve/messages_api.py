"""Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`) on the chat path.

A request is translated into a Chat Completions body and goes through `ChatService` as a chat
request does, so its turn is rendered, recorded, put in its session and judged exactly alike;
only the wire format differs. The translation (`chat_body`):

* `system` becomes a leading system message; the text blocks of one message are joined with a
  blank line into the chat message's content;
* an assistant's `tool_use` blocks become its `tool_calls` (`input` as JSON text); a user's
  `tool_result` blocks become `tool` messages, in order, before that user message's own text;
* `tools` become function tools (`strict` kept), `tool_choice` `auto`/`none` the chat's, `any` its
  `required` and `tool` a named function; `output_config.format` becomes a `json_schema`
  `response_format`; `metadata.user_id` becomes the chat's `user`, which names the session
  (serve/sessions.py, `explicit_session`). The contract these state is the chat path's, held by the
  same grammars (serve/contract.py).

What cannot be honoured is refused with a 400 rather than ignored (messages_schemas.py says
which). Durability is the chat path's (completions.py): the turn is committed before the answer
is acknowledged; for a stream, before the held-back tail, the tool calls, `message_delta` and
`message_stop`. Every refusal of these routes is Anthropic's error object, authentication
(`x-api-key`, or `Authorization: Bearer`), size limits and malformed JSON included. Any
`anthropic-version` header is accepted: the wire format is the one of `2023-06-01`, which every
later version keeps.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from jinja2 import TemplateError
from pydantic import BaseModel, ValidationError
from pydantic.json_schema import models_json_schema

from clawrl.config import ServeConfig
from clawrl.errors import APIError, describe_validation_error
from clawrl.model.chat import ResponseDecoder, render_prompt
from clawrl.serve import openapi, schemas
from clawrl.serve.auth import KeyChecker
from clawrl.serve.bodies import read_json
from clawrl.serve.completions import ChatService, Generation
from clawrl.serve.messages_schemas import (
    STREAM_EVENTS,
    AnthropicAssistantMessageParam,
    AnthropicContentBlock,
    AnthropicContentBlockDeltaEvent,
    AnthropicContentBlockStartEvent,
    AnthropicContentBlockStopEvent,
    AnthropicCountTokensRequest,
    AnthropicDeltaUsage,
    AnthropicErrorDetail,
    AnthropicErrorResponse,
    AnthropicInputJsonDelta,
    AnthropicMessage,
    AnthropicMessageDelta,
    AnthropicMessageDeltaEvent,
    AnthropicMessageStartEvent,
    AnthropicMessageStopEvent,
    AnthropicMessagesRequest,
    AnthropicOutputConfigParam,
    AnthropicPingEvent,
    AnthropicSystemMessageParam,
    AnthropicTextBlock,
    AnthropicTextBlockParam,
    AnthropicTextDelta,
    AnthropicTokenCount,
    AnthropicToolChoiceParam,
    AnthropicToolParam,
    AnthropicToolResultBlockParam,
    AnthropicToolUseBlock,
    AnthropicUsage,
    AnthropicUserMessageParam,
    StopReason,
)
from clawrl.serve.metrics import ServeMetrics, timed_stream
from clawrl.types import Message, Turn

log = logging.getLogger(__name__)

MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"

Model = TypeVar("Model", bound=BaseModel)


def add_routes(app: FastAPI, service: ChatService, config: ServeConfig, metrics: ServeMetrics, keys: KeyChecker) -> None:
    """`POST /v1/messages` and `POST /v1/messages/count_tokens`, documented in `GET /openapi.json`;
    `keys` says whose each request is."""
    served_name = config.served_model_name or service.engine.model_name

    @app.post(MESSAGES_PATH, **MESSAGES_DOC)
    async def create_message(request: Request) -> Response:
        try:
            return await _create_message(request, service, config, metrics, keys)
        except APIError as error:
            return error_response(error)
        except Exception:  # noqa: BLE001 - answered in this API's error shape, not the app's OpenAI one
            log.exception("unexpected error while serving a message")
            return error_response(APIError(500, "internal error; see the server log", "internal_error"))

    @app.post(COUNT_TOKENS_PATH, **COUNT_TOKENS_DOC)
    async def count_tokens(request: Request) -> Response:
        try:
            return await _count_tokens(request, service, config, served_name, keys)
        except APIError as error:
            return error_response(error)
        except Exception:  # noqa: BLE001 - as above
            log.exception("unexpected error while counting tokens")
            return error_response(APIError(500, "internal error; see the server log", "internal_error"))

    _document(app, served_name, api_key=config.api_key is not None)


# --- the routes --------------------------------------------------------------------------------------


async def _create_message(request: Request, service: ChatService, config: ServeConfig, metrics: ServeMetrics,
                          keys: KeyChecker) -> Response:  # fmt: skip
    headers = {key.lower(): value for key, value in request.headers.items()}
    caller = await keys.caller(headers)
    started = time.perf_counter()
    item = _parse(AnthropicMessagesRequest, await read_json(request, config.max_body_bytes))
    prepared = await service.prepare(messages_chat_body(item), headers, id_prefix="msg_", caller=caller)
    generation = await service.start(prepared)  # the session lookup runs on beside it
    if item.stream:
        await service.identify(generation)  # the headers name the session
        return StreamingResponse(
            timed_stream(_stream(service, generation, item.model), metrics, started),
            media_type="text/event-stream",
            headers={**service.headers(generation), "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    metrics.active.inc()
    try:
        turn = await service.finished(generation)  # recorded (and its session known) once it returns
    finally:
        metrics.active.dec()
        metrics.latency.labels("false").observe(time.perf_counter() - started)
    stop_reason, stop_sequence = _stop(generation, turn)
    answer = AnthropicMessage(
        id=turn.id,
        model=item.model,
        content=answer_content(turn),
        stop_reason=stop_reason,
        stop_sequence=stop_sequence,
        usage=AnthropicUsage(input_tokens=len(turn.prompt_token_ids), output_tokens=len(turn.response_token_ids)),
    )
    return JSONResponse(answer.model_dump(), headers=service.headers(generation))


async def _count_tokens(request: Request, service: ChatService, config: ServeConfig, served_name: str,
                       keys: KeyChecker) -> Response:  # fmt: skip
    """The prompt `/v1/messages` would render for this request, counted; nothing is generated or recorded."""
    await keys.caller({key.lower(): value for key, value in request.headers.items()})
    item = _parse(AnthropicCountTokensRequest, await read_json(request, config.max_body_bytes))
    if item.model not in service.model_names:
        raise APIError(404, f"The model '{item.model}' does not exist; this server serves {served_name!r}.", "model_not_found", "model")
    body = chat_body(item)
    body.pop("tool_choice", None)  # renders no token of the prompt (and a forced call with no tools counts alike)
    messages, tools = _chat_prompt(body)
    try:
        prompt = await asyncio.to_thread(render_prompt, service.engine.tokenizer, messages, tools)
    except TemplateError as error:  # as `ChatService.prepare` refuses them
        raise APIError(400, f"The model's chat template refused these messages: {error}", "invalid_messages", "messages") from None
    return JSONResponse(AnthropicTokenCount(input_tokens=len(prompt)).model_dump())


def _chat_prompt(body: dict[str, Any]) -> tuple[list[Message], list[dict[str, Any]] | None]:
    """The messages and tools of a chat body, normalised as `ChatService.prepare` renders them."""
    try:
        request = schemas.ChatCompletionRequest.model_validate(body)
    except ValidationError as error:  # not expected: the Anthropic schema is the stricter one
        message, param = describe_validation_error(error)
        raise APIError(400, message, "invalid_value", param) from None
    messages = [message.model_dump(exclude_none=True) for message in request.messages]
    tools = [tool.model_dump(exclude_none=True) for tool in request.tools] if request.tools else None
    return messages, tools


# --- parsing and errors ---------------------------------------------------------------------------


def _parse(model: type[Model], body: dict[str, Any]) -> Model:
    try:
        return model.model_validate(body)
    except ValidationError as error:
        message, param = _describe(error)
        raise APIError(400, message, "invalid_value", param) from None


# The tags of the discriminated unions (a message's role, a block's type), which pydantic puts in an
# error's location between a list index and the member's field ("messages.0.user.content.1.tool_result.
# tool_use_id"); a field named like one ("system.0.text") ends the path instead
_UNION_TAGS = {"user", "assistant", "text", "tool_use", "tool_result"}


def _describe(error: ValidationError) -> tuple[str, str | None]:
    """`describe_validation_error`, with the union tags taken out of the parameter's path."""
    message, param = describe_validation_error(error)
    if param is None:
        return message, None
    parts = param.split(".")
    kept = [part for index, part in enumerate(parts)
            if not (part in _UNION_TAGS and 0 < index < len(parts) - 1 and parts[index - 1].isdigit())]  # fmt: skip
    cleaned = ".".join(kept)
    return (cleaned + message[len(param) :] if message.startswith(param) else message), cleaned


# Anthropic's error types by status (https://docs.anthropic.com/en/api/errors)
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def error_body(status: int, message: str) -> AnthropicErrorResponse:
    kind = _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return AnthropicErrorResponse(error=AnthropicErrorDetail(type=kind, message=message))  # type: ignore[arg-type]


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error_body(error.status, error.message).model_dump(), status_code=error.status, headers=error.headers)


# --- the translation ---------------------------------------------------------------------------------


def chat_body(request: AnthropicCountTokensRequest) -> dict[str, Any]:
    """The Chat Completions body that renders the same prompt: messages, tools and tool choice."""
    messages: list[Message] = []
    system = _system_text(request.system)
    if system:  # an empty system prompt is none: chat templates put their default one in its place
        messages.append({"role": "system", "content": system})
    for message in request.messages:
        if isinstance(message, AnthropicUserMessageParam):
            messages.extend(_user_messages(message))
        elif isinstance(message, AnthropicSystemMessageParam):
            messages.append({"role": "system", "content": _system_text(message.content)})
        else:
            messages.append(_assistant_message(message))
    body: dict[str, Any] = {"model": request.model, "messages": messages}
    if request.tools:
        body["tools"] = [_chat_tool(tool) for tool in request.tools]
    if request.tool_choice is not None:
        body["tool_choice"] = _chat_tool_choice(request.tool_choice)
    return body


def _chat_tool(tool: AnthropicToolParam) -> dict[str, Any]:
    function = {"name": tool.name, "description": tool.description, "parameters": tool.input_schema}
    return {"type": "function", "function": function | ({"strict": True} if tool.strict else {})}


def _chat_tool_choice(choice: AnthropicToolChoiceParam) -> str | dict[str, Any]:
    if choice.type == "tool":
        return {"type": "function", "function": {"name": choice.name}}
    return "required" if choice.type == "any" else choice.type


def messages_chat_body(request: AnthropicMessagesRequest) -> dict[str, Any]:
    """`chat_body` with the sampling settings, the answer's format and the session fields of a `/v1/messages` request."""
    optional = {
        "response_format": _chat_response_format(request.output_config),
        "stop": request.stop_sequences,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "user": request.metadata.user_id if request.metadata is not None else None,
        "session_id": request.session_id,
        "turn_type": request.turn_type,
    }
    body = chat_body(request) | {"max_tokens": request.max_tokens, "session_done": request.session_done,
                                 "store": request.store, "train": request.train}
    return body | {key: value for key, value in optional.items() if value is not None}


def _chat_response_format(config: AnthropicOutputConfigParam | None) -> dict[str, Any] | None:
    if config is None or config.format is None:
        return None
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": config.format.schema_}}


def _joined(blocks: list[AnthropicTextBlockParam]) -> str:
    """Text blocks as one chat content: a blank line between them, as they read as paragraphs."""
    return "\n\n".join(block.text for block in blocks if block.text)


def _system_text(system: str | list[AnthropicTextBlockParam] | None) -> str:
    if system is None or isinstance(system, str):
        return system or ""
    return _joined(system)


def _user_messages(message: AnthropicUserMessageParam) -> list[Message]:
    """A user message: its tool results as `tool` messages (they answer the previous assistant's calls,
    so they come first), then its text, if it has any (or nothing else)."""
    if isinstance(message.content, str):
        return [{"role": "user", "content": message.content}]
    results = [block for block in message.content if isinstance(block, AnthropicToolResultBlockParam)]
    texts = [block for block in message.content if isinstance(block, AnthropicTextBlockParam)]
    translated: list[Message] = [
        {"role": "tool", "tool_call_id": result.tool_use_id, "content": _tool_result_text(result)} for result in results
    ]
    if texts or not results:
        translated.append({"role": "user", "content": _joined(texts)})
    return translated


def _tool_result_text(result: AnthropicToolResultBlockParam) -> str:
    """The result's text; a failed tool's is marked, since a chat `tool` message has no error flag."""
    text = result.content if isinstance(result.content, str) else _joined(result.content)
    if result.is_error:
        return f"Error: {text}" if text else "Error"
    return text


def _assistant_message(message: AnthropicAssistantMessageParam) -> Message:
    """An earlier answer: its text, and its tool calls as the chat API's (arguments as JSON text)."""
    if isinstance(message.content, str):
        return {"role": "assistant", "content": message.content}
    texts = [block for block in message.content if isinstance(block, AnthropicTextBlockParam)]
    calls = [
        {"id": block.id, "type": "function", "function": {"name": block.name, "arguments": json.dumps(block.input)}}
        for block in message.content
        if not isinstance(block, AnthropicTextBlockParam)
    ]
    translated: Message = {"role": "assistant", "content": _joined(texts)}
    if calls:
        translated["tool_calls"] = calls
    return translated


# --- the answer ----------------------------------------------------------------------------------------


def answer_content(turn: Turn) -> list[AnthropicContentBlock]:
    """The recorded answer as content blocks: its text (if any), then one `tool_use` per tool call."""
    blocks: list[AnthropicContentBlock] = [AnthropicTextBlock(text=turn.response_text)] if turn.response_text else []
    for call in turn.tool_calls or []:
        blocks.append(AnthropicToolUseBlock(id=call["id"], name=call["function"]["name"], input=_tool_input(call)))
    return blocks


def _tool_input(call: dict[str, Any]) -> dict[str, Any]:
    """A tool call's arguments as the object `input` must be; arguments the model wrote as something
    other than a JSON object become `{}` (the recorded turn keeps what it wrote)."""
    arguments = call["function"].get("arguments", "{}")
    try:
        value = json.loads(arguments) if isinstance(arguments, str) else arguments
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _stop(generation: Generation, turn: Turn) -> tuple[StopReason, str | None]:
    """Why the answer ended, and the stop sequence that ended it (when one did)."""
    if turn.tool_calls:
        return "tool_use", None
    if turn.finish_reason == "length":
        return "max_tokens", None
    if generation.decoder.stopped:
        return "stop_sequence", _matched_stop(generation.decoder)
    return "end_turn", None


def _matched_stop(decoder: ResponseDecoder) -> str | None:
    """The stop sequence the decoder cut the answer at: the one found first in the generated text
    (the decoder cuts at the earliest; on a tie, any of them is right)."""
    generated = decoder.tokenizer.decode(decoder.token_ids, skip_special_tokens=True)
    found = [(generated.find(stop), index, stop) for index, stop in enumerate(decoder.stop) if stop in generated]
    return min(found)[2] if found else None


# --- the stream ------------------------------------------------------------------------------------------


def _event(data: BaseModel) -> str:
    """One server-sent event, named by its data's `type` as Anthropic's stream does."""
    return f"event: {data.type}\ndata: {data.model_dump_json()}\n\n"  # type: ignore[attr-defined]


async def _stream(service: ChatService, generation: Generation, model: str) -> AsyncGenerator[str, None]:
    """Anthropic's stream events. The text block opens with the first text, so an answer that is only
    tool calls has no empty text block (as the non-streamed answer has none)."""
    turn = generation.prepared.turn
    start = AnthropicMessage(id=turn.id, model=model, content=[], stop_reason=None, stop_sequence=None,
                             usage=AnthropicUsage(input_tokens=len(turn.prompt_token_ids), output_tokens=0))  # fmt: skip
    text_open = False

    def text(delta: str) -> list[str]:
        nonlocal text_open
        events = [] if text_open else [_event(AnthropicContentBlockStartEvent(index=0, content_block=AnthropicTextBlock(text="")))]
        text_open = True
        return [*events, _event(AnthropicContentBlockDeltaEvent(index=0, delta=AnthropicTextDelta(text=delta)))]

    try:
        yield _event(AnthropicMessageStartEvent(message=start))
        yield _event(AnthropicPingEvent())
        tail = ""
        async for delta, _steps in service.deltas(generation):
            if generation.result is not None:  # the tail: sent after the turn is recorded
                tail = delta
                continue
            if delta:
                for event in text(delta):
                    yield event
        result = generation.result
        assert result is not None
        await service.record(generation, result)
        for event in text(tail) if tail else []:
            yield event
        index = 0
        if text_open:
            yield _event(AnthropicContentBlockStopEvent(index=0))
            index = 1
        for block in answer_content(result):
            if isinstance(block, AnthropicToolUseBlock):
                for event in _tool_use_events(block, index):
                    yield event
                index += 1
        stop_reason, stop_sequence = _stop(generation, result)
        yield _event(AnthropicMessageDeltaEvent(delta=AnthropicMessageDelta(stop_reason=stop_reason, stop_sequence=stop_sequence),
                                                usage=AnthropicDeltaUsage(output_tokens=len(result.response_token_ids))))  # fmt: skip
        yield _event(AnthropicMessageStopEvent())
    except (asyncio.CancelledError, GeneratorExit):
        if generation.result is None:  # a hang-up: keep what was generated, as the chat stream does
            service.record_cancelled(generation)
        raise
    except Exception as error:  # the engine failed mid-stream: say so in-band, then end the stream
        log.exception("generation failed mid-stream")
        yield _event(error_body(500, f"generation failed: {error}"))


def _tool_use_events(block: AnthropicToolUseBlock, index: int) -> list[str]:
    """A tool call as Anthropic streams one: the block with an empty input, the input as one JSON delta
    (the whole call is known only once generation has ended), the block's end."""
    return [
        _event(AnthropicContentBlockStartEvent(index=index, content_block=block.model_copy(update={"input": {}}))),
        _event(AnthropicContentBlockDeltaEvent(index=index, delta=AnthropicInputJsonDelta(partial_json=json.dumps(block.input)))),
        _event(AnthropicContentBlockStopEvent(index=index)),
    ]


# --- the OpenAPI document ----------------------------------------------------------------------------------

_ERRORS = {
    400: "The request is malformed, invalid, or asks for what this server cannot do (the message says which field and why).",
    401: "Missing or invalid API key (when the server has one): send `x-api-key: <key>` or `Authorization: Bearer <key>`.",
    404: "The `model` is not the one this server serves.",
    413: "The body is over the server's size limit (`--max-body-bytes`).",
}


def _errors() -> dict[int | str, dict[str, Any]]:
    return {status: {"model": AnthropicErrorResponse, "description": why} for status, why in _ERRORS.items()}


# One server-sent event of a stream (read by tools such as schemathesis as one event of the
# sequential media type, as the chat route's `STREAM_EVENT`): its name, and its data as JSON
STREAM_EVENT: dict[str, Any] = {
    "anyOf": [
        {
            "type": "object",
            "required": ["event", "data"],
            "properties": {
                "event": {"const": name},
                "data": {"type": "string", "contentMediaType": "application/json", "contentSchema": openapi.ref(model)},
            },
        }
        for name, model in STREAM_EVENTS
    ]
}

_CHAT_DOC = openapi.CHAT_COMPLETIONS
_HEADER_PARAMETERS = [
    *copy.deepcopy(_CHAT_DOC["openapi_extra"]["parameters"]),
    {"name": "anthropic-version", "in": "header", "required": False, "schema": {"type": "string"},
     "description": "Accepted whatever its value: the wire format is the one of `2023-06-01`, which later versions keep."},
]  # fmt: skip

MESSAGES_DOC: dict[str, Any] = {
    "summary": "Create a message (Anthropic's Messages API)",
    "description": (
        "Anthropic's Messages API, answered through the chat path: recorded as a turn of a session for training, as "
        "`POST /v1/chat/completions` is. The session is the `X-Session-Id` header, else the body's `session_id`, else "
        "`metadata.user_id`, else inferred from the conversation. The last message must be the user's (no prefill). "
        "`tool_choice` `any` or `tool` (a forced call), strict tools and structured outputs (`output_config.format`) are "
        "decoded under a grammar (with `--engine hf` or `vllm`; `openai` refuses them). Refused (400): image and document "
        "blocks, server tools, extended thinking, `top_k`, and a forced call with an `output_config.format`."
    ),
    "responses": {
        200: {
            "model": AnthropicMessage,
            "description": "The answer: a message, or with `stream: true` Anthropic's server-sent events "
            "(`message_start`, `ping`, content blocks, `message_delta`, `message_stop`; `error` if generation fails).",
            "content": {"text/event-stream": {"schema": STREAM_EVENT}},
            "headers": copy.deepcopy(_CHAT_DOC["responses"][200]["headers"]),
        },
        **_errors(),
    },
    "openapi_extra": {**openapi.request_body(AnthropicMessagesRequest), "parameters": _HEADER_PARAMETERS},
}

COUNT_TOKENS_DOC: dict[str, Any] = {
    "summary": "Count a message request's prompt tokens",
    "description": "The length in tokens of the prompt `POST /v1/messages` would render for these messages, system "
    "prompt and tools. Nothing is generated or recorded.",
    "responses": {200: {"model": AnthropicTokenCount, "description": "The prompt's length."}, **_errors()},
    "openapi_extra": {
        **openapi.request_body(AnthropicCountTokensRequest),
        "parameters": [copy.deepcopy(_HEADER_PARAMETERS[-1])],
    },
}

# The request bodies (read by the routes themselves: validation mode) and a stream's events (no
# route returns them, so FastAPI does not document them)
_REQUEST_MODELS: tuple[type[BaseModel], ...] = (AnthropicMessagesRequest, AnthropicCountTokensRequest)


def component_schemas() -> dict[str, Any]:
    """The JSON schemas of the request models and the stream's events, named as components."""
    modes = [(model, "validation") for model in _REQUEST_MODELS] + [(model, "serialization") for _, model in STREAM_EVENTS]
    _, definitions = models_json_schema(modes, ref_template=openapi.REF)  # type: ignore[arg-type]
    return definitions.get("$defs", {})


def _document(app: FastAPI, served_model: str, api_key: bool) -> None:
    """Add these routes' schemas to the app's typed document (serve/openapi.py builds the rest): the
    components, the served model as the only `model`, and `x-api-key` beside the bearer token."""
    typed: Callable[[], dict[str, Any]] = app.openapi
    done = False

    def document() -> dict[str, Any]:
        nonlocal done
        doc = typed()
        if done:
            return doc
        components = doc.setdefault("components", {}).setdefault("schemas", {})
        for name, schema in component_schemas().items():
            if components.setdefault(name, schema) != schema:  # one name, two schemas: a reference would lie
                raise RuntimeError(f"two different JSON schemas are named {name!r} in the OpenAPI document")
        for model in _REQUEST_MODELS:
            components[model.__name__]["properties"]["model"].update(
                enum=[served_model], description="The model this server serves, as `GET /v1/models` names it."
            )
        if api_key:
            doc["components"].setdefault("securitySchemes", {})["apiKey"] = {"type": "apiKey", "in": "header", "name": "x-api-key"}
            for path in (MESSAGES_PATH, COUNT_TOKENS_PATH):
                doc["paths"][path]["post"]["security"] = [{"apiKey": []}, {"bearer": []}]
        done = True
        return doc

    app.openapi = document  # type: ignore[method-assign]
